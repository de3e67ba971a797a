//! Structure-aware input generators for `tests/fuzz.rs`: text, JSON mutations, and mutators that
//! know the wav / flac / ogg / mp3 layouts (fields set to boundary values, checksums fixed up so
//! the damage reaches the decoder instead of being rejected at the checksum).
#![allow(dead_code)]

use serde_json::Value;

use super::support::Rng;

// ---------------------------------------------------------------------------------------------
// Text

/// Pieces text is built from: what the text frontend, the normaliser grammars and the tokenizer
/// treat specially (numbers in every shape, dates, money, units, end marks, quotes, markup,
/// special tokens), other scripts and odd Unicode.
pub const FRAGMENTS: &[&str] = &[
    // numbers and what the TN grammars tag
    "0", "7", "42", "2024", "3.5", "-3", "1/4", "12:30", "12:30:45", "2024-03-05", "2024/3/5",
    "2024年3月5日", "3月5日", "$1,234.56", "￥100", "100元", "50%", "3.5℃", "-2°C", "5km", "10kg",
    "3:2", "No.1", "1st", "2nd", "3rd", "1990s", "+86 138 0013 8000", "1e10", "0.0001", "000123",
    "１２３", "٣٤", "²", "³", "½", "Ⅻ", "10^3", "1,000,000", "99999999999999999999999999999999999999999",
    "5点30分", "下午3点", "第1", "1.2.3", "v2.0", "4x4", "3-2", "0:0", "24:60", "13/13/13",
    // Chinese text and marks
    "今天", "是", "天气", "你好", "一百", "二〇二四年", "儿", "。", "，", "、", "？", "！", "；", "：",
    "（", "）", "【", "】", "——", "“", "”", "《", "》", "…",
    // English text and marks
    "Hello", "world", "the", "Dr.", "Mr.", "St.", "a", "I", " ", "  ", "\n", "\t", "\r\n",
    "\u{3000}", "\u{a0}", ".", "?", "!", ";", ":", ",", "\"", "'", "-", " - ", "...", "`", "(", ")",
    "[", "]", "{", "}", "<", ">", "|", "\\", "/", "#", "&", "*", "@", "~", "_", "=", "+", "%", "$",
    // markup and special tokens
    "<|endofprompt|>", "<|", "|>", "<|im_start|>", "<|endoftext|>", "[breath]", "[laughter]", "[a]",
    "<strong>", "</strong>", "You are a helpful assistant.", "请用广东话表达。",
    // other scripts and odd Unicode
    "ひらがな", "カタカナ", "한국어", "Ελληνικά", "Привет", "مرحبا", "שלום", "ไทย", "😀",
    "👨\u{200d}👩\u{200d}👧", "é", "e\u{301}", "\u{200b}", "\u{feff}", "\u{202e}", "\u{0}", "\u{7f}",
    "\u{85}", "\u{2028}", "\u{fffd}", "\u{10ffff}", "ﬁ", "Å", "ß", "İ", "\u{1c}", "\u{e000}",
];

/// A random Unicode scalar value, biased to ASCII and CJK.
pub fn random_char(rng: &mut Rng) -> char {
    let cp = match rng.below(6) {
        0 | 1 => rng.range(0x20, 0x7e) as u32,
        2 => rng.range(0x4e00, 0x9fff) as u32,
        3 => rng.range(0, 0x7f) as u32,
        4 => rng.range(0x80, 0xffff) as u32,
        _ => rng.range(0, 0x10ffff) as u32,
    };
    char::from_u32(cp).unwrap_or('\u{fffd}')
}

/// Text of at most `max_chars` characters from fragments, digit runs, repeats and random
/// characters.
pub fn text(rng: &mut Rng, max_chars: usize) -> String {
    let target = rng.len(max_chars);
    let mut s = String::new();
    let mut n = 0;
    while n < target {
        let piece: String = match rng.below(20) {
            0..=12 => rng.pick(FRAGMENTS).to_string(),
            13 | 14 => (0..rng.range(1, 4)).map(|_| random_char(rng)).collect(),
            15 | 16 => (0..rng.len(60).max(1)).map(|_| char::from(b'0' + rng.below(10) as u8)).collect(),
            17 => {
                let f = rng.pick(FRAGMENTS);
                f.repeat(rng.range(2, 40))
            }
            18 => rng.pick(&["。", ".", "!", "?", "，", ","]).repeat(rng.range(1, 10)),
            _ => rng.pick(&[" ", "\n", "\u{3000}"]).repeat(rng.range(1, 10)),
        };
        n += piece.chars().count();
        s.push_str(&piece);
    }
    s.chars().take(max_chars).collect()
}

/// Text for the normaliser: short (composition with the grammars costs about a millisecond per
/// character and grows faster than linearly with digit runs), digit-heavy, from the short
/// fragments, digit runs of up to 8 and random characters.
pub fn tn_text(rng: &mut Rng, max_chars: usize) -> String {
    let target = rng.range(1, max_chars);
    let mut s = String::new();
    let mut n = 0;
    while n < target {
        let piece: String = match rng.below(10) {
            0..=5 => {
                let f = rng.pick(FRAGMENTS);
                if f.chars().count() > 12 {
                    continue;
                }
                f.to_string()
            }
            6 | 7 => (0..rng.range(1, 8)).map(|_| char::from(b'0' + rng.below(10) as u8)).collect(),
            8 => rng.pick(&[".", ",", ":", "-", "/", " ", "%", "$", "年", "月", "日", "点"]).to_string(),
            _ => random_char(rng).to_string(),
        };
        n += piece.chars().count();
        s.push_str(&piece);
    }
    s.chars().take(max_chars).collect()
}

// ---------------------------------------------------------------------------------------------
// JSON

#[derive(Debug, Clone)]
pub enum Seg {
    Key(String),
    Idx(usize),
}

/// Every node's path (the root is the empty path).
pub fn json_paths(v: &Value) -> Vec<Vec<Seg>> {
    fn walk(v: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
        out.push(path.clone());
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    path.push(Seg::Key(k.clone()));
                    walk(c, path, out);
                    path.pop();
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    path.push(Seg::Idx(i));
                    walk(c, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

pub fn get<'a>(mut v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    for seg in path {
        v = match seg {
            Seg::Key(k) => v.get(k.as_str())?,
            Seg::Idx(i) => v.get(*i)?,
        };
    }
    Some(v)
}

pub fn get_mut<'a>(mut v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    for seg in path {
        v = match seg {
            Seg::Key(k) => v.get_mut(k.as_str())?,
            Seg::Idx(i) => v.get_mut(*i)?,
        };
    }
    Some(v)
}

/// A scalar (or empty container) that validation code should have to think about.
pub fn json_scalar(rng: &mut Rng) -> Value {
    match rng.below(22) {
        0 => Value::from(0),
        1 => Value::from(-1),
        2 => Value::from(1),
        3 => Value::from(u64::MAX),
        4 => Value::from(i64::MIN),
        5 => Value::from(u32::MAX as u64 + rng.below(3) as u64),
        6 => Value::from(1u64 << rng.below(64)),
        7 => Value::from(rng.interesting_u64()),
        8 => Value::from(-(rng.below(1000) as i64)),
        9 => Value::from(*rng.pick(&[0.5, -0.0, 1e308, -1e308, 1e-308, 2.5, 9007199254740993.0, -1.5, 0.1])),
        10 => Value::from(rng.range(0, 100_000) as u64),
        11 => Value::Bool(rng.chance(1, 2)),
        12 => Value::Null,
        13 => Value::Array(Vec::new()),
        14 => Value::Object(Default::default()),
        15 => Value::from(""),
        16 => Value::from(*rng.pick(&[
            "fp32", "fp16", "bf16", "int8", "float32", "int64", "bool", "F32", "I64", "x", "/", "..", "../../x",
            "/dev/zero", "manifest.json", "cosy-model", "cosy-voice", "1", "24000", "-1", "NaN", "llm", "dit",
        ])),
        17 => Value::from("x".repeat(rng.range(100, 5000))),
        18 => Value::from(text(rng, 40)),
        19 => Value::Array((0..rng.len(8)).map(|_| Value::from(rng.interesting_u64())).collect()),
        20 => Value::from(rng.range(0, 20) as f64 + 0.5),
        _ => Value::from(rng.below(10) as u64),
    }
}

/// One structural mutation of `root` at a random node (or one under `prefer` when given and the
/// coin says so): replace, perturb a number, remove, add, resize an array, copy another node over
/// it, rename a key, wrap it.
pub fn mutate_json(rng: &mut Rng, root: &mut Value, prefer: &[&str]) {
    let paths = json_paths(root);
    let preferred: Vec<&Vec<Seg>> = paths
        .iter()
        .filter(|p| matches!(p.first(), Some(Seg::Key(k)) if prefer.contains(&k.as_str())))
        .collect();
    let path = if !preferred.is_empty() && rng.chance(2, 3) {
        (*rng.pick(&preferred)).clone()
    } else {
        rng.pick(&paths).clone()
    };
    let op = rng.below(10);
    let donor = if op == 5 { get(root, &paths[rng.below(paths.len())]).cloned().unwrap_or(Value::Null) } else { Value::Null };
    // Operations on the parent (remove, rename) need the parent and the last segment.
    if (op == 2 || op == 6) && !path.is_empty() {
        let (last, parent_path) = path.split_last().expect("not empty");
        let new_key = if rng.chance(1, 2) {
            json_paths(root)
                .iter()
                .filter_map(|p| match p.last() {
                    Some(Seg::Key(k)) => Some(k.clone()),
                    _ => None,
                })
                .nth(rng.below(64))
                .unwrap_or_else(|| "x".into())
        } else {
            text(rng, 12)
        };
        if let Some(parent) = get_mut(root, parent_path) {
            match (parent, last) {
                (Value::Object(m), Seg::Key(k)) => {
                    if let Some(v) = m.remove(k) {
                        if op == 6 {
                            m.insert(new_key, v);
                        }
                    }
                }
                (Value::Array(a), Seg::Idx(i)) if *i < a.len() => {
                    a.remove(*i);
                }
                _ => {}
            }
        }
        return;
    }
    let Some(node) = get_mut(root, &path) else { return };
    match op {
        0 => *node = json_scalar(rng),
        1 => {
            // Perturb a number; other nodes get a number.
            let n = node.as_f64().unwrap_or(1.0);
            *node = match rng.below(8) {
                0 => Value::from(0),
                1 => serde_json::Number::from_f64(-n).map(Value::Number).unwrap_or(Value::from(-1)),
                2 => serde_json::Number::from_f64(n + 1.0).map(Value::Number).unwrap_or(Value::from(1)),
                3 => serde_json::Number::from_f64(n * 1000.0).map(Value::Number).unwrap_or(Value::from(1000)),
                4 => serde_json::Number::from_f64(n + 0.5).map(Value::Number).unwrap_or(Value::from(0.5)),
                5 => Value::from(n.to_string()),
                6 => Value::from((n as i64).saturating_mul(1 << 20)),
                _ => serde_json::Number::from_f64(n - 1.0).map(Value::Number).unwrap_or(Value::from(-1)),
            };
        }
        3 => match node {
            Value::Object(m) => {
                m.insert(text(rng, 10), json_scalar(rng));
            }
            Value::Array(a) => a.push(if a.is_empty() || rng.chance(1, 2) { json_scalar(rng) } else { a[rng.below(a.len())].clone() }),
            other => *other = Value::Array(vec![other.clone(), json_scalar(rng)]),
        },
        4 => match node {
            Value::Array(a) if !a.is_empty() => match rng.below(3) {
                0 => a.truncate(rng.below(a.len())),
                1 => {
                    let v = a[rng.below(a.len())].clone();
                    let times = rng.range(1, 20);
                    a.extend(std::iter::repeat_n(v, times));
                }
                _ => a.clear(),
            },
            Value::Object(m) => m.clear(),
            other => *other = Value::Array(Vec::new()),
        },
        5 => *node = donor,
        7 => {
            let v = node.clone();
            *node = if rng.chance(1, 2) { Value::Array(vec![v]) } else { serde_json::json!({ "value": v }) };
        }
        8 => {
            // A string node gets a string value validation code matches on.
            *node = if node.is_string() { Value::from(text(rng, 20)) } else { json_scalar(rng) };
        }
        _ => *node = json_scalar(rng),
    }
}

// ---------------------------------------------------------------------------------------------
// Audio containers

fn set_le(data: &mut [u8], at: usize, width: usize, v: u64) {
    if at + width <= data.len() {
        data[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

fn set_be(data: &mut [u8], at: usize, width: usize, v: u64) {
    if at + width <= data.len() {
        data[at..at + width].copy_from_slice(&v.to_be_bytes()[8 - width..]);
    }
}

/// Sets `nbits` bits (big-endian bit order) starting at bit `bit` of `data`.
fn set_bits(data: &mut [u8], bit: usize, nbits: usize, v: u64) {
    for i in 0..nbits {
        let b = bit + i;
        if b / 8 >= data.len() {
            return;
        }
        let on = (v >> (nbits - 1 - i)) & 1 == 1;
        let mask = 0x80u8 >> (b % 8);
        if on {
            data[b / 8] |= mask;
        } else {
            data[b / 8] &= !mask;
        }
    }
}

/// A value for a field of `width` bytes: boundaries or one of `typical`.
fn field_value(rng: &mut Rng, width: usize, typical: &[u64]) -> u64 {
    let max = if width >= 8 { u64::MAX } else { (1u64 << (8 * width)) - 1 };
    match rng.below(4) {
        0 if !typical.is_empty() => *rng.pick(typical),
        1 => *rng.pick(&[0, 1, max, max - 1, max / 2, max / 2 + 1]),
        2 => rng.interesting_u64() & max,
        _ => rng.u64() & max,
    }
}

pub const RATES: &[u64] = &[
    0, 1, 8000, 11025, 15999, 16000, 16001, 22050, 24000, 32000, 44100, 44101, 48000, 88200, 96000, 192000,
    384000, 655350, 1_000_000, 0xFFFF_FFFF,
];

/// RIFF/WAVE: a header field (RIFF size, chunk sizes, every `fmt ` field) set to a boundary or
/// odd value, or a chunk inserted or duplicated before `data`.
pub fn mutate_wav(rng: &mut Rng, data: &mut Vec<u8>) {
    if data.len() < 12 || &data[..4] != b"RIFF" {
        return;
    }
    // (offset, width, typical values)
    let mut fields: Vec<(usize, usize, Vec<u64>)> = vec![(4, 4, vec![data.len() as u64 - 8, 0, 4])];
    let mut pos = 12;
    let mut data_chunk = None;
    while pos + 8 <= data.len() {
        let id = &data[pos..pos + 4];
        let size = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().expect("4 bytes")) as usize;
        fields.push((pos + 4, 4, vec![0, 1, size as u64 + 1, size as u64 * 2, 0x7FFF_FFFF]));
        if id == b"fmt " {
            let f = pos + 8;
            fields.push((f, 2, vec![1, 3, 0xFFFE, 2, 6, 7, 0x55, 0]));
            fields.push((f + 2, 2, vec![0, 1, 2, 3, 6, 8, 255, 65535]));
            fields.push((f + 4, 4, RATES.to_vec()));
            fields.push((f + 8, 4, vec![0, 1, 32000, 96000]));
            fields.push((f + 12, 2, vec![0, 1, 2, 3, 4, 6, 8, 65535]));
            fields.push((f + 14, 2, vec![0, 1, 4, 8, 12, 16, 20, 24, 32, 33, 64, 65535]));
            if size >= 40 {
                // WAVE_FORMAT_EXTENSIBLE: cbSize, valid bits, channel mask, sub-format GUID.
                fields.push((f + 16, 2, vec![0, 22, 65535]));
                fields.push((f + 18, 2, vec![0, 8, 16, 24, 32, 33]));
                fields.push((f + 20, 4, vec![0, 3, 0xFFFF_FFFF]));
                fields.push((f + 24, 2, vec![1, 3, 0]));
            }
        }
        if id == b"data" {
            data_chunk = Some(pos);
            break;
        }
        pos += 8 + size + (size & 1);
    }
    match rng.below(8) {
        0 if data_chunk.is_some() => {
            // A chunk before `data`: a repeated fmt, a fact with any count, junk of any size.
            let at = data_chunk.expect("checked");
            let junk_len = rng.len(64);
            let (id, body): (&[u8; 4], Vec<u8>) = match rng.below(4) {
                0 => (b"fact", rng.interesting_u64().to_le_bytes()[..4].to_vec()),
                1 => (b"fmt ", data.get(12 + 8..12 + 8 + 16).map(<[u8]>::to_vec).unwrap_or_default()),
                2 => (b"LIST", rng.bytes(junk_len)),
                _ => (b"JUNK", rng.bytes(junk_len)),
            };
            let mut chunk = id.to_vec();
            let claimed = if rng.chance(3, 4) { body.len() as u64 } else { field_value(rng, 4, &[]) };
            chunk.extend_from_slice(&(claimed as u32).to_le_bytes());
            chunk.extend_from_slice(&body);
            data.splice(at..at, chunk);
        }
        _ => {
            let n = rng.range(1, 3);
            for _ in 0..n {
                let (at, width, typical) = rng.pick(&fields).clone();
                let v = field_value(rng, width, &typical);
                set_le(data, at, width, v);
            }
        }
    }
}

fn crc8(data: &[u8]) -> u8 {
    let mut crc = 0u8;
    for &b in data {
        crc ^= b;
        for _ in 0..8 {
            crc = if crc & 0x80 != 0 { (crc << 1) ^ 0x07 } else { crc << 1 };
        }
    }
    crc
}

fn crc16_flac(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x8005 } else { crc << 1 };
        }
    }
    crc
}

/// Start offsets of FLAC frames (sync code 0xFFF8/0xFFF9 whose header CRC-8 checks).
fn flac_frames(data: &[u8], from: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = from;
    while i + 6 < data.len() {
        if data[i] == 0xFF && (data[i + 1] & 0xFE) == 0xF8 {
            if let Some(hlen) = flac_header_len(&data[i..]) {
                if i + hlen <= data.len() && crc8(&data[i..i + hlen - 1]) == data[i + hlen - 1] {
                    out.push((i, hlen));
                    i += hlen;
                    continue;
                }
            }
        }
        i += 1;
    }
    out
}

/// Length of a FLAC frame header including its CRC-8, from its fields.
fn flac_header_len(h: &[u8]) -> Option<usize> {
    if h.len() < 5 {
        return None;
    }
    let bs = h[2] >> 4;
    let sr = h[2] & 0x0F;
    let lead = h[4].leading_ones() as usize;
    let utf8 = match lead {
        0 => 1,
        2..=7 => lead,
        _ => return None,
    };
    let mut len = 4 + utf8;
    len += match bs {
        6 => 1,
        7 => 2,
        _ => 0,
    };
    len += match sr {
        12 => 1,
        13 | 14 => 2,
        _ => 0,
    };
    Some(len + 1)
}

/// FLAC: a STREAMINFO field (block sizes, frame sizes, sample rate, channels, bits, total
/// samples) or a metadata block header, or one frame header's fields with its CRC-8 and the
/// frame's CRC-16 recomputed so the decoder sees the change.
pub fn mutate_flac(rng: &mut Rng, data: &mut [u8]) {
    if data.len() < 42 || &data[..4] != b"fLaC" {
        return;
    }
    if rng.chance(1, 2) {
        // STREAMINFO body starts at byte 8; bit offsets within the file.
        let fields: &[(usize, usize, &[u64])] = &[
            (8 * 8, 16, &[0, 1, 15, 16, 4096, 65535]),
            (10 * 8, 16, &[0, 1, 15, 16, 4096, 65535]),
            (12 * 8, 24, &[0, 1, 0xFFFFFF]),
            (15 * 8, 24, &[0, 1, 0xFFFFFF]),
            (18 * 8, 20, &[0, 1, 8000, 15999, 16000, 44100, 655350, 0xFFFFF]),
            (18 * 8 + 20, 3, &[0, 1, 7]),
            (18 * 8 + 23, 5, &[0, 3, 7, 15, 23, 31]),
            (18 * 8 + 28, 36, &[0, 1, 0xF_FFFF_FFFF, 1 << 35]),
            (4 * 8, 8, &[0x00, 0x80, 0x7F, 0x06, 0x84]),
            (5 * 8, 24, &[0, 1, 34, 33, 0xFFFFFF]),
        ];
        let (bit, nbits, typical) = *rng.pick(fields);
        let max = (1u64 << nbits) - 1;
        let v = if rng.chance(2, 3) { *rng.pick(typical) } else { rng.u64() & max };
        set_bits(data, bit, nbits, v);
        return;
    }
    let frames = flac_frames(data, 42);
    if frames.is_empty() {
        return;
    }
    let k = rng.below(frames.len());
    let (start, hlen) = frames[k];
    let end = frames.get(k + 1).map_or(data.len(), |f| f.0);
    // Fields of byte 2 (block size code, sample rate code) and byte 3 (channels, sample size).
    match rng.below(5) {
        0 => set_bits(&mut data[start..], 16, 4, rng.below(16) as u64),
        1 => set_bits(&mut data[start..], 20, 4, rng.below(16) as u64),
        2 => set_bits(&mut data[start..], 24, 4, rng.below(16) as u64),
        3 => set_bits(&mut data[start..], 28, 3, rng.below(8) as u64),
        _ => {
            // A byte inside the subframes.
            if end > start + hlen + 1 {
                let i = rng.range(start + hlen, end - 1);
                data[i] = rng.byte();
            }
        }
    }
    let new_hlen = flac_header_len(&data[start..]).unwrap_or(hlen);
    if start + new_hlen <= end {
        data[start + new_hlen - 1] = crc8(&data[start..start + new_hlen - 1]);
    }
    if end >= start + new_hlen + 2 {
        let crc = crc16_flac(&data[start..end - 2]);
        data[end - 2..end].copy_from_slice(&crc.to_be_bytes());
    }
}

fn ogg_crc(data: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in data {
        crc ^= (b as u32) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 { (crc << 1) ^ 0x04C1_1DB7 } else { crc << 1 };
        }
    }
    crc
}

/// Recomputes the CRC of the Ogg page starting at `page` (after its bytes were changed).
pub fn fix_ogg_crc(data: &mut [u8], page: usize) {
    let Some(&nseg) = data.get(page + 26) else { return };
    let nseg = nseg as usize;
    let body: usize = data.get(page + 27..page + 27 + nseg).map_or(0, |l| l.iter().map(|&x| x as usize).sum());
    let end = (page + 27 + nseg + body).min(data.len());
    set_le(data, page + 22, 4, 0);
    let crc = ogg_crc(&data[page..end]);
    set_le(data, page + 22, 4, crc as u64);
}

/// Ogg: a page header field (version, flags, granule position, serial, sequence, segment
/// count, a lacing value) or a payload byte, notably in the Vorbis identification header
/// (channels, rate, block sizes), with the page CRC recomputed.
pub fn mutate_ogg(rng: &mut Rng, data: &mut [u8]) {
    let mut pages = Vec::new();
    let mut i = 0;
    while i + 27 <= data.len() {
        if &data[i..i + 4] == b"OggS" {
            pages.push(i);
            let nseg = data[i + 26] as usize;
            let body: usize = data.get(i + 27..i + 27 + nseg).map_or(0, |l| l.iter().map(|&x| x as usize).sum());
            i += 27 + nseg + body;
        } else {
            i += 1;
        }
    }
    if pages.is_empty() {
        return;
    }
    // The first pages hold the Vorbis headers: favour them.
    let k = if rng.chance(1, 2) { rng.below(pages.len().min(3)) } else { rng.below(pages.len()) };
    let p = pages[k];
    let nseg = data[p + 26] as usize;
    let payload = p + 27 + nseg;
    match rng.below(9) {
        0 => data[p + 4] = *rng.pick(&[0u8, 1, 0xFF]),
        1 => data[p + 5] = rng.below(8) as u8,
        2 => {
            let r = rng.interesting_u64();
            set_le(data, p + 6, 8, *rng.pick(&[0u64, u64::MAX, 1 << 63, (1 << 63) - 1, r]))
        }
        3 => {
            let r = rng.interesting_u64();
            set_le(data, p + 14, 4, r)
        }
        4 => {
            let r = rng.interesting_u64();
            set_le(data, p + 18, 4, r)
        }
        5 if nseg > 0 => {
            let l = p + 27 + rng.below(nseg);
            let r = rng.byte();
            data[l] = *rng.pick(&[0u8, 1, 254, 255, r]);
        }
        6 if k == 0 && payload + 30 <= data.len() && &data[payload + 1..payload + 7] == b"vorbis" => {
            // Vorbis identification header: version @7, channels @11, rate @12, bitrates @16..28,
            // block sizes @28, framing @29.
            match rng.below(5) {
                0 => data[payload + 11] = *rng.pick(&[0u8, 1, 2, 3, 8, 255]),
                1 => {
                    let r = field_value(rng, 4, RATES);
                    set_le(data, payload + 12, 4, r)
                }
                2 => data[payload + 28] = rng.byte(),
                3 => {
                    let r = rng.interesting_u64();
                    set_le(data, payload + 7, 4, r)
                }
                _ => data[payload + 29] = rng.byte(),
            }
        }
        _ => {
            let end = data.len().min(payload + data.get(p + 27..payload).map_or(0, |l| l.iter().map(|&x| x as usize).sum::<usize>()));
            if end > payload {
                let i = rng.range(payload, end - 1);
                data[i] = if rng.chance(1, 2) { rng.byte() } else { data[i] ^ (1 << rng.below(8)) };
            }
        }
    }
    // Recompute the CRC over the page as its (possibly changed) lacing now defines it.
    fix_ogg_crc(data, p);
}

/// MP3: an ID3v2 header (size, flags, version) or a frame header field (version, layer,
/// protection, bitrate index, sample rate index, padding, channel mode), or the frame count
/// of a Xing/Info header.
pub fn mutate_mp3(rng: &mut Rng, data: &mut [u8]) {
    if data.len() >= 10 && &data[..3] == b"ID3" && rng.chance(1, 3) {
        match rng.below(3) {
            0 => {
                // Syncsafe size (7 bits per byte), sometimes not syncsafe at all.
                let v = rng.interesting_u64();
                for (j, b) in data[6..10].iter_mut().enumerate() {
                    *b = if rng.chance(1, 4) { (v >> (8 * j)) as u8 } else { ((v >> (7 * (3 - j))) & 0x7F) as u8 };
                }
            }
            1 => data[5] = rng.byte(),
            _ => data[3] = *rng.pick(&[2u8, 3, 4, 5, 0xFF]),
        }
        return;
    }
    let syncs: Vec<usize> = (0..data.len().saturating_sub(3))
        .filter(|&i| data[i] == 0xFF && data[i + 1] & 0xE0 == 0xE0)
        .take(64)
        .collect();
    if syncs.is_empty() {
        return;
    }
    let at = *rng.pick(&syncs);
    if rng.chance(1, 5) {
        if let Some(x) = data[at..].windows(4).take(64).position(|w| w == b"Xing" || w == b"Info") {
            // flags @4, frame count @8, byte count @12 (big-endian).
            let base = at + x;
            let off = *rng.pick(&[4usize, 8, 12]);
            let r = rng.interesting_u64();
            set_be(data, base + off, 4, r);
            return;
        }
    }
    let h = &mut data[at..];
    match rng.below(6) {
        0 => set_bits(h, 11, 2, rng.below(4) as u64),
        1 => set_bits(h, 13, 2, rng.below(4) as u64),
        2 => set_bits(h, 15, 1, rng.below(2) as u64),
        3 => set_bits(h, 16, 4, rng.below(16) as u64),
        4 => set_bits(h, 20, 2, rng.below(4) as u64),
        _ => set_bits(h, 24, 2, rng.below(4) as u64),
    }
}
