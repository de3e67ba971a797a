//! Fuzz harnesses for every input cosy reads from a user or a file: the text frontend, the wetext
//! normaliser, the tokenizer, prompt audio decoding, configuration (TOML, `COSY_*`, `--set`),
//! voice files, the model manifest and books (plain text, Markdown, EPUB).
//!
//! Each harness generates bounded inputs from a seeded RNG (mutations of valid inputs that know
//! the format, plus random ones) and requires, for every case: no panic (the library returns a
//! `Result`), an error message of one line, a time limit, and a bound on the bytes allocated
//! (a counting global allocator; an allocation past a hard cap aborts and names the case).
//! See docs/fuzzing.md for the settings (`COSY_FUZZ_CASES`, `COSY_FUZZ_SEED`, …) and the long runs.

#[path = "fuzz/gen.rs"]
mod gen;
#[path = "fuzz/support.rs"]
mod support;
#[path = "common/epub.rs"]
#[allow(dead_code)]
mod epub;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cosy::config::{Config, LoadOptions, KEYS};
use cosy::frontend::book::{parse_book, BookLimits};
use cosy::frontend::audio::{check_length, load_audio, to_rate, MAX_TOKENIZER_SECONDS};
use cosy::frontend::markdown::{to_speech, MarkdownStream};
use cosy::frontend::numbers::digits_to_words;
use cosy::frontend::prompt::{known_instruction, plan, PromptMode};
use cosy::frontend::text::{
    contains_chinese, is_only_punctuation, normalize, replace_blank, spell_out_numbers,
    split_paragraph, zh_post_rules, IdentityNormalizer, Lang, SplitOptions,
};
use cosy::frontend::tn::{TnLang, WetextNormalizer, WetextPair};
use cosy::frontend::tokenizer::TextTokenizer;
use cosy::model::ModelDir;
use cosy::pipeline::constants::ModelConstants;
use cosy::voice::{model_key, SavedVoice};
use cosy::vocab::STAGES;
use serde_json::Value;
use support::{mutate_bytes, run, Outcome, Rng, Spec};

#[global_allocator]
static ALLOC: support::CountingAlloc = support::CountingAlloc;

const MIB: usize = 1 << 20;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tokenizer() -> &'static TextTokenizer {
    static TOK: OnceLock<TextTokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        TextTokenizer::from_file(&root().join("tests/fixtures/tiny/tokenizer.json")).expect("fixture tokenizer loads")
    })
}

fn refused(e: impl std::fmt::Display) -> Outcome {
    Outcome::Refused(e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Markdown and chat text (`frontend::markdown`): whole and in random pieces alike.

/// Pieces Markdown, chat text and CosyVoice3's markup are made of.
const MARKDOWN_PIECES: &[&str] = &[
    "**", "*", "_", "__", "`", "```", "```rust\n", "~~", "~~~", "# ", "## ", "- ", "* ", "+ ", "1. ", "2) ", "> ", "| ", " |", "|---|",
    "---", "===", "\n", "\n\n", "\r\n", "    ", "  ", " ", "[", "]", "](", ")", "(", "![", "<", ">", "<b>", "</b>", "<br>", "<div>",
    "<!--", "-->", "<strong>", "</strong>", "<laughter>", "[breath]", "[AA1]", "[ni3]", "<|endofprompt|>", "\\", "&amp;", "&",
    "https://example.com/a_b?x=1", "www.example.org", "docs.rs/ort", "jane.doe@example.com", "/etc/hosts", "~/notes", "./run.sh",
    "😀", "👍🏽", "❤️", "你好", "。", "，", "Hello", "world", "Mr.", "3.5", ". ", "! ", "? ", ": ", "x", "42",
    "5 km", "km/h", "°C", " MB", "+1 555-0123", "(415) 555-0198", "+44 20 7946 0958", "-",
];

#[test]
fn fuzz_markdown() {
    run(Spec { name: "fuzz_markdown", default_cases: 2_000, mem_bound: 16 * MIB }, |rng, _| {
        let longest = if rng.chance(1, 50) { 5000 } else { 300 };
        let target = rng.len(longest);
        let mut text = String::new();
        while text.chars().count() < target {
            if rng.chance(1, 8) {
                text.push_str(&gen::text(rng, 20));
            } else {
                let piece: &&str = rng.pick(MARKDOWN_PIECES);
                text.push_str(piece);
            }
        }
        let code_blocks = *rng.pick(&[cosy::config::CodeBlocks::StandIn, cosy::config::CodeBlocks::Skip, cosy::config::CodeBlocks::Read]);
        let symbols = *rng.pick(&[cosy::config::Symbols::Drop, cosy::config::Symbols::Name, cosy::config::Symbols::Keep]);
        let (phone, units, urls) = (rng.chance(1, 2), rng.chance(3, 4), rng.chance(3, 4));
        let settings = cosy::config::MarkdownSettings { code_blocks, symbols, phone, units, urls, ..cosy::config::MarkdownSettings::ON };
        let whole = to_speech(&text, settings);
        // The same text in random pieces (cut at character boundaries) reads the same.
        let mut stream = MarkdownStream::new(settings);
        let mut streamed = String::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut cut = rng.range(1, rest.len().min(40) + 1).min(rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            streamed.push_str(&stream.push(&rest[..cut]));
            rest = &rest[cut..];
        }
        streamed.push_str(&stream.finish());
        if streamed != whole {
            return Err(format!("pieces read otherwise than the whole: {text:?}\n whole    {whole:?}\n streamed {streamed:?}"));
        }
        Ok(Outcome::Accepted)
    });
}

// ---------------------------------------------------------------------------------------------
// Text frontend: prompt modes, the official rules, sentence splitting (tokenizer lengths).

#[test]
fn fuzz_text_frontend() {
    let tok = tokenizer();
    run(Spec { name: "fuzz_text_frontend", default_cases: 3_000, mem_bound: 16 * MIB }, |rng, _| {
        // Mostly short; now and then up to the default limits.max_text_chars.
        let max_chars = if rng.chance(1, 100) { 5000 } else { 400 };
        let text = gen::text(rng, max_chars);
        let mode = match rng.below(5) {
            0 => PromptMode::ZeroShot { transcript: gen::text(rng, 80) },
            1 => PromptMode::CrossLingual,
            2 => PromptMode::Instruct {
                instruction: if rng.chance(1, 2) { gen::text(rng, 40) } else { "请用广东话表达。".into() },
            },
            _ => PromptMode::Raw { prompt_text: gen::text(rng, 80), llm_prompt_speech: rng.chance(1, 2) },
        };
        let text_frontend = rng.chance(9, 10);
        let _ = known_instruction(&text);
        let _ = cosy::request::shorten(&text, rng.len(50));
        // What Pipeline::plan_text does: the checks, the prompt plan, then the frontend with
        // tokenizer lengths (sometimes character counts, which are cheaper).
        let use_tokens = rng.chance(1, 4);
        let count = |s: &str| if use_tokens { tok.count(s) } else { s.chars().count() };
        let plan_text = || -> cosy::Result<Vec<String>> {
            let text = text.trim_end_matches(['\n', '\r']);
            cosy::request::check_speakable(text)?;
            cosy::request::check_text_length(text, 5000)?;
            let p = plan(&mode, text, text_frontend);
            let segments = if p.text_frontend {
                normalize(&p.tts_text, true, &IdentityNormalizer, &count).segments
            } else {
                vec![p.tts_text.clone()]
            };
            let segments: Vec<String> = segments.into_iter().filter(|s| !s.trim().is_empty()).collect();
            if segments.is_empty() || is_only_punctuation(text.trim()) {
                return Err(cosy::Error::invalid("nothing speakable"));
            }
            let _ = normalize(&p.prompt_text, true, &IdentityNormalizer, &count).text;
            Ok(segments)
        };
        let outcome = match plan_text() {
            Ok(segments) => {
                if segments.iter().any(|s| s.trim().is_empty()) {
                    return Err(format!("a blank segment from {text:?}"));
                }
                Outcome::Accepted
            }
            Err(e) => refused(e),
        };
        // The pieces on their own, with any splitting options.
        let opts = SplitOptions {
            token_max_n: rng.len(200),
            token_min_n: rng.len(200),
            merge_len: rng.len(100),
            comma_split: rng.chance(1, 2),
        };
        let lang = if contains_chinese(&text) { Lang::Zh } else { Lang::En };
        let segs = split_paragraph(&text, if rng.chance(1, 5) { Lang::Zh } else { lang }, &count, opts);
        let _ = segs.iter().filter(|s| is_only_punctuation(s)).count();
        let _ = zh_post_rules(&text);
        let _ = replace_blank(&text);
        let _ = spell_out_numbers(&text);
        let digits: String = (0..rng.len(120)).map(|_| char::from(b'0' + rng.below(10) as u8)).collect();
        let _ = digits_to_words(&digits);
        Ok(outcome)
    });
}

// ---------------------------------------------------------------------------------------------
// wetext normalisation (tagger FST, token reorder, verbalizer FST), zh and en.

/// The wetext package folder (with `fsts/`): `COSY_WETEXT_DIR`, else the exporter venv's package.
fn wetext_package() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("COSY_WETEXT_DIR") {
        return Some(PathBuf::from(dir));
    }
    let python = std::env::var_os("COSY_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/cosy/venv")))?
        .join("bin/python");
    let out = std::process::Command::new(python)
        .args(["-c", "import wetext, os; print(os.path.dirname(wetext.__file__))"])
        .output()
        .ok()?;
    out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

#[test]
fn fuzz_tn_wetext() {
    let Some(package) = wetext_package() else {
        println!("skipping: wetext grammars not available (set COSY_WETEXT_DIR to the wetext package folder)");
        return;
    };
    let load = |lang: TnLang| {
        let dir = package.join("fsts").join(lang.as_str()).join("tn");
        WetextNormalizer::from_files(lang, &dir.join("tagger.fst"), &dir.join("verbalizer.fst"))
    };
    let pair = match (load(TnLang::Zh), load(TnLang::En)) {
        (Ok(zh), Ok(en)) => WetextPair { zh, en },
        (Err(e), _) | (_, Err(e)) => {
            println!("skipping: wetext grammars do not load: {e}");
            return;
        }
    };
    let count = |s: &str| s.chars().count();
    run(Spec { name: "fuzz_tn_wetext", default_cases: 300, mem_bound: 64 * MIB }, |rng, _| {
        let text = gen::tn_text(rng, 16);
        let lang = match rng.below(4) {
            0 => TnLang::Zh,
            1 => TnLang::En,
            _ => TnLang::for_text(&text),
        };
        let tn = if lang == TnLang::Zh { &pair.zh } else { &pair.en };
        let outcome = match tn.normalize(&text) {
            Ok(out) => {
                if !text.chars().any(|c| c.is_numeric()) && out != text {
                    return Err(format!("text without digits changed: {text:?} -> {out:?}"));
                }
                if out.len() > 64 * text.len() + 1024 {
                    return Err(format!("output of {} bytes for {} input bytes", out.len(), text.len()));
                }
                Outcome::Accepted
            }
            Err(e) => refused(e),
        };
        // The whole text frontend with the normaliser plugged in (falls back to the raw text).
        if rng.chance(1, 8) {
            let _ = normalize(&text, true, &pair, &count);
        }
        Ok(outcome)
    });
}

// ---------------------------------------------------------------------------------------------
// Tokenizer: encode any text (specials, broken markup, odd Unicode), decode any ids.

#[test]
fn fuzz_tokenizer() {
    let tok = tokenizer();
    run(Spec { name: "fuzz_tokenizer", default_cases: 3_000, mem_bound: 16 * MIB }, |rng, _| {
        let text = gen::text(rng, 300);
        let ids = match tok.encode(&text) {
            Ok(ids) => ids,
            Err(e) => return Ok(refused(e)),
        };
        if ids.len() > 4 * text.len() + 4 {
            return Err(format!("{} ids for {} bytes", ids.len(), text.len()));
        }
        if tok.count(&text) != ids.len() {
            return Err("count differs from encode".into());
        }
        tok.decode(&ids).map_err(|e| format!("decoding the ids of an encoded text failed: {e}"))?;
        let random: Vec<u32> = (0..rng.len(64))
            .map(|_| match rng.below(4) {
                0 => rng.below(151_936) as u32,
                1 => 151_643 + rng.below(300) as u32,
                2 => rng.interesting_u64() as u32,
                _ => rng.below(1000) as u32,
            })
            .collect();
        Ok(match tok.decode(&random) {
            Ok(_) => Outcome::Accepted,
            Err(e) => refused(e),
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Prompt audio: random bytes and mutated wav / flac / ogg / mp3, then the resampling the
// pipeline does (16 kHz with the 30 s limit, 24 kHz).

/// Valid seed files: the format fixtures and small generated wavs of other layouts.
fn audio_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let dir = root().join("tests/fixtures/formats");
    let mut seeds: Vec<(&'static str, Vec<u8>)> = ["wav", "flac", "ogg", "mp3"]
        .into_iter()
        .map(|ext| (ext, std::fs::read(dir.join(format!("speechlike.{ext}"))).expect("format fixture")))
        .collect();
    let layouts: &[(u32, u16, u16, hound::SampleFormat, f64)] = &[
        (16_000, 1, 16, hound::SampleFormat::Int, 0.25),
        (48_000, 2, 24, hound::SampleFormat::Int, 0.1),
        (22_050, 1, 32, hound::SampleFormat::Float, 0.2),
        (44_100, 2, 8, hound::SampleFormat::Int, 0.1),
        (32_000, 3, 32, hound::SampleFormat::Int, 0.05),
    ];
    for &(rate, channels, bits, format, secs) in layouts {
        let spec = hound::WavSpec { channels, sample_rate: rate, bits_per_sample: bits, sample_format: format };
        let mut buf = Vec::new();
        {
            let mut w = hound::WavWriter::new(Cursor::new(&mut buf), spec).expect("wav writer");
            let frames = (rate as f64 * secs) as usize;
            for i in 0..frames {
                let x = 0.3 * (2.0 * std::f64::consts::PI * 220.0 * i as f64 / rate as f64).sin();
                for _ in 0..channels {
                    match (format, bits) {
                        (hound::SampleFormat::Float, _) => w.write_sample(x as f32).expect("sample"),
                        (_, 8) => w.write_sample((x * 127.0) as i8).expect("sample"),
                        (_, 16) => w.write_sample((x * 32767.0) as i16).expect("sample"),
                        (_, b) => w.write_sample((x * ((1i64 << (b - 1)) - 1) as f64) as i32).expect("sample"),
                    }
                }
            }
            w.finalize().expect("wav finalize");
        }
        seeds.push(("wav", buf));
    }
    seeds
}

#[test]
fn fuzz_audio_decode() {
    let seeds = audio_seeds();
    let tmp = support::case_dir();
    let exts = ["wav", "flac", "ogg", "mp3", "WAV", "txt", ""];
    run(Spec { name: "fuzz_audio_decode", default_cases: 1_000, mem_bound: 48 * MIB }, |rng, case| {
        let (kind, mut data) = if rng.chance(1, 10) {
            // Random bytes, sometimes behind a container magic.
            let magics: [&[u8]; 6] =
                [b"", b"RIFF\x00\x00\x00\x00WAVEfmt ", b"fLaC", b"OggS\x00\x02", b"ID3\x03\x00", b"\xff\xfb"];
            let mut d = rng.pick(&magics).to_vec();
            let n = rng.len(4096);
            d.extend(rng.bytes(n));
            ("", d)
        } else {
            let (kind, seed) = rng.pick(&seeds);
            let mut d = seed.clone();
            let structured = rng.chance(2, 3);
            if structured {
                for _ in 0..rng.range(1, 3) {
                    match *kind {
                        "wav" => gen::mutate_wav(rng, &mut d),
                        "flac" => gen::mutate_flac(rng, &mut d),
                        "ogg" => gen::mutate_ogg(rng, &mut d),
                        _ => gen::mutate_mp3(rng, &mut d),
                    }
                }
            }
            if !structured || rng.chance(1, 3) {
                let other = &rng.pick(&seeds).1;
                mutate_bytes(rng, &mut d, 6, 256 * 1024, Some(other));
            }
            (*kind, d)
        };
        data.truncate(256 * 1024);
        let ext = if rng.chance(3, 4) && !kind.is_empty() { kind } else { rng.pick(&exts) };
        let path = tmp.path().join(format!("case.{ext}"));
        std::fs::write(&path, &data).map_err(|e| format!("writing the case file: {e}"))?;
        support::keep("fuzz_audio_decode", case, ext, &data);
        let audio = match load_audio(&path) {
            Ok(a) => a,
            Err(e) => return Ok(refused(e)),
        };
        if audio.samples.is_empty() || audio.sample_rate < 16_000 || audio.samples.iter().any(|x| !x.is_finite()) {
            return Err(format!("accepted unusable audio: {} samples at {} Hz", audio.samples.len(), audio.sample_rate));
        }
        // What the pipeline does next: the length limits, both resamplings, the three features.
        if let Err(e) = check_length(&audio, &path, MAX_TOKENIZER_SECONDS) {
            return Ok(refused(e));
        }
        let wav16 = match to_rate(&audio, 16_000, Some(MAX_TOKENIZER_SECONDS), &path) {
            Ok(w) => w,
            Err(e) => return Ok(refused(e)),
        };
        if wav16.len() as f64 > MAX_TOKENIZER_SECONDS * 16_000.0 {
            return Err(format!("{} samples at 16 kHz passed the 30 s limit", wav16.len()));
        }
        let wav24 = match to_rate(&audio, 24_000, None, &path) {
            Ok(w) => w,
            Err(e) => return Ok(refused(e)),
        };
        if rng.chance(1, 4) {
            let _ = cosy::frontend::features::whisper_log_mel(&wav16);
            let _ = cosy::frontend::features::kaldi_fbank_cmn(&wav16);
            let _ = cosy::frontend::features::mel_24k(&wav24);
        }
        Ok(Outcome::Accepted)
    });
}

// ---------------------------------------------------------------------------------------------
// Configuration: TOML files, COSY_* environment, --set flags and the other global flags.

/// The library's keys (`stages.<llm|…>.x` for each stage key).
fn key_names() -> Vec<&'static str> {
    KEYS.iter().map(|k| k.about.name).collect()
}

/// The library's `COSY_*` variables and the key each sets.
fn env_vars() -> Vec<(&'static str, &'static str)> {
    KEYS.iter().filter_map(|k| k.about.env.map(|var| (var, k.about.name))).collect()
}

/// config.toml without the tables of the binary (`[server]`, `[wyoming]`, `[say]`), which only the
/// binary reads (its own tests check them): the library's loader refuses them as unknown keys.
fn library_part(shipped: &str) -> String {
    let mut keep = true;
    let mut out = Vec::new();
    for line in shipped.lines() {
        if line.starts_with('[') {
            keep = !(line.starts_with("[server]") || line.starts_with("[wyoming]") || line.starts_with("[say]"));
        }
        if keep {
            out.push(line);
        }
    }
    out.join("\n")
}

/// A stage key with a real or a made-up group.
fn config_key(rng: &mut Rng) -> String {
    let key = *rng.pick(&key_names());
    let key = if key.starts_with("stages.<") {
        let group = *rng.pick(&["llm", "flow", "dit", "hift", "frontend", "x", "", "LLM"]);
        let field = if key.ends_with("precision") { "precision" } else { *rng.pick(&["providers", "provider"]) };
        format!("stages.{group}.{field}")
    } else {
        key.to_string()
    };
    match rng.below(12) {
        0 => gen::text(rng, 20),
        1 => format!("{key}.x"),
        2 => key.split('.').next().unwrap_or("").to_string(),
        3 => key.to_uppercase(),
        4 => format!(" {key} "),
        _ => key,
    }
}

/// A value as text: valid ones for some key, boundaries, junk.
fn config_text_value(rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => rng.pick(&["cpu", "cuda,cpu", "tensorrt, cuda ,cpu", "trt", "cpu,cpu", "", " ", ","]).to_string(),
        1 => rng.pick(&["fp32", "FP16", "bf16", "int8", "fp8", "auto", "wetext", "none", "default"]).to_string(),
        2 => rng.pick(&["true", "false", "1", "0", "yes", "off", "TRUE", "maybe"]).to_string(),
        3 => rng.interesting_u64().to_string(),
        4 => format!("-{}", rng.interesting_u64()),
        5 => rng.pick(&["0.5", "1", "1.0", "0", "1e308", "1e309", "nan", "inf", "-0.0", "0.1", "1.5", "0x10"]).to_string(),
        6 => rng.pick(&["models/x", "/", "", "..", "/dev/null", "a\0b", "~"]).to_string(),
        7 => "9".repeat(rng.range(19, 400)),
        _ => gen::text(rng, 30),
    }
}

/// A TOML value for a key (any type).
fn toml_value(rng: &mut Rng, depth: usize) -> toml::Value {
    match rng.below(if depth > 2 { 6 } else { 8 }) {
        0 => {
            let r = rng.interesting_u64() as i64;
            toml::Value::Integer(*rng.pick(&[0, 1, -1, i64::MAX, i64::MIN, 24, 1025, 5000, r]))
        }
        1 => toml::Value::Float(*rng.pick(&[0.5, 1.0, 0.0, -0.0, f64::NAN, f64::INFINITY, 1e308, 1.5, 0.1])),
        2 => toml::Value::Boolean(rng.chance(1, 2)),
        3 | 4 => toml::Value::String(config_text_value(rng)),
        5 => toml::Value::Datetime("1979-05-27T07:32:00Z".parse().expect("datetime")),
        6 => toml::Value::Array((0..rng.len(5)).map(|_| toml_value(rng, depth + 1)).collect()),
        _ => {
            let mut t = toml::Table::new();
            for _ in 0..rng.len(4) {
                t.insert(gen::text(rng, 8), toml_value(rng, depth + 1));
            }
            toml::Value::Table(t)
        }
    }
}

/// Inserts `value` at the dotted path `parts`, making tables on the way (a non-table in the way
/// drops the value).
fn insert_dotted(table: &mut toml::Table, parts: &[&str], value: toml::Value) {
    match parts {
        [] => {}
        [last] => {
            table.insert(last.to_string(), value);
        }
        [first, rest @ ..] => {
            let entry = table.entry(first.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(inner) = entry {
                insert_dotted(inner, rest, value);
            }
        }
    }
}

/// A config file: a table of (mostly real) keys, the shipped config.toml with lines changed, or
/// either with its bytes mutated.
fn config_file_text(rng: &mut Rng, shipped: &str) -> Vec<u8> {
    let mut text = if rng.chance(1, 2) {
        let mut table = toml::Table::new();
        for _ in 0..rng.range(1, 8) {
            let key = config_key(rng);
            let value = toml_value(rng, 0);
            let parts: Vec<&str> = key.split('.').collect();
            insert_dotted(&mut table, &parts, value);
        }
        toml::to_string(&table).unwrap_or_default().into_bytes()
    } else {
        let mut lines: Vec<String> = shipped.lines().map(str::to_string).collect();
        for _ in 0..rng.range(1, 4) {
            let i = rng.below(lines.len().max(1));
            match rng.below(5) {
                0 => {
                    if let Some((k, _)) = lines.get(i).and_then(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v)) {
                        let v = toml_value(rng, 1).to_string();
                        lines[i] = format!("{k}= {v}");
                    }
                }
                1 if !lines.is_empty() => {
                    lines.remove(i);
                }
                2 if !lines.is_empty() => {
                    let l = lines[i].clone();
                    lines.insert(i, l);
                }
                3 => lines.insert(i.min(lines.len()), format!("[{}]", config_key(rng))),
                _ => lines.insert(i.min(lines.len()), format!("{} = {}", config_key(rng), toml_value(rng, 1))),
            }
        }
        lines.join("\n").into_bytes()
    };
    if rng.chance(1, 5) {
        mutate_bytes(rng, &mut text, 4, 64 * 1024, None);
    }
    text
}

#[test]
fn fuzz_config() {
    let shipped = library_part(&std::fs::read_to_string(root().join("config.toml")).unwrap_or_default());
    let tmp = support::case_dir();
    let file = tmp.path().join("config.toml");
    run(Spec { name: "fuzz_config", default_cases: 3_000, mem_bound: 16 * MIB }, |rng, case| {
        let text = config_file_text(rng, &shipped);
        std::fs::write(&file, &text).map_err(|e| format!("writing the case file: {e}"))?;
        support::keep("fuzz_config", case, "toml", &text);
        let env: Vec<(String, String)> = (0..rng.len(4))
            .map(|_| {
                let name = match rng.below(6) {
                    0 => format!("COSY_{}", gen::text(rng, 8)),
                    1 => "COSY_CONFIG".to_string(),
                    _ => rng.pick(&env_vars()).0.to_string(),
                };
                (name, config_text_value(rng))
            })
            .collect();
        let flags: Vec<(String, String)> = (0..rng.len(5)).map(|_| (config_key(rng), config_text_value(rng))).collect();
        // The command line's setting flags as the CLI passes them on (`--model`, `--provider`,
        // `--precision`, `--set KEY=VALUE`: the binary's unit test `cli::tests` checks that
        // mapping; a `--set` without '=' is refused there before anything is loaded).
        let from_command_line = rng.chance(1, 3);
        let flags: Vec<(String, String)> = flags
            .into_iter()
            .map(|(k, v)| match if from_command_line { rng.below(4) } else { 3 } {
                0 => ("model.dir".to_string(), v),
                1 => ("runtime.providers".to_string(), v),
                2 => ("runtime.precision".to_string(), v),
                _ => (k, v),
            })
            .collect();
        let opts = LoadOptions {
            config_file: rng.chance(4, 5).then(|| file.clone()),
            default_file: None,
            user_files: false,
            env,
            flags,
        };
        Ok(match Config::load(&opts) {
            Ok(_) => Outcome::Accepted,
            Err(e) => refused(e),
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Voice files: a valid voice, its safetensors header mutated as JSON (shapes, dtypes, offsets,
// metadata) and/or its bytes mutated.

fn valid_voice(rng: &mut Rng) -> SavedVoice {
    let l = rng.range(1, 40);
    let mels = if rng.chance(4, 5) { 80 } else { rng.range(1, 100) };
    SavedVoice {
        name: "fuzz".into(),
        transcript: gen::text(rng, 40),
        speech_token: (0..l).map(|_| rng.below(6561) as i64).collect(),
        // Within what a prompt mel may hold (`PROMPT_FEAT_RANGE`), so that the unmutated voice loads.
        prompt_feat: ndarray::Array2::from_shape_fn((2 * l, mels), |(i, j)| ((i * 31 + j) % 1700) as f32 * 0.01 - 5.0),
        embedding: (0..192).map(|i| i as f32 * 0.001).collect(),
        model_key: "0123456789abcdef".repeat(4),
        model: "models/x".into(),
        frontend_precision: "fp32".into(),
        source_wav: "me.wav".into(),
        created: "2024-01-01T00:00:00Z".into(),
        cosy_version: "0.1.0".into(),
    }
}

/// Splits a safetensors file into (header JSON, data).
fn split_safetensors(bytes: &[u8]) -> Option<(Value, Vec<u8>)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let header = bytes.get(8..8usize.checked_add(n)?)?;
    Some((serde_json::from_slice(header).ok()?, bytes[8 + n..].to_vec()))
}

fn voices_equal(a: &SavedVoice, b: &SavedVoice) -> bool {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    a.name == b.name
        && a.transcript == b.transcript
        && a.speech_token == b.speech_token
        && a.prompt_feat.dim() == b.prompt_feat.dim()
        && bits(a.prompt_feat.as_slice().unwrap_or(&[])) == bits(b.prompt_feat.as_slice().unwrap_or(&[]))
        && bits(&a.embedding) == bits(&b.embedding)
        && a.model_key == b.model_key
}

#[test]
fn fuzz_voice_file() {
    let path = Path::new("voices/fuzz.safetensors");
    run(Spec { name: "fuzz_voice_file", default_cases: 3_000, mem_bound: 16 * MIB }, |rng, case| {
        // Voice names (`--voice NAME`, `cosy voice add NAME`) become file names.
        let name = gen::text(rng, 70);
        if cosy::vocab::check_voice_name(&name).is_ok() && (name.contains(['/', '\\', '\0']) || name.starts_with('.')) {
            return Err(format!("voice name {name:?} accepted"));
        }
        let voice = valid_voice(rng);
        let mut bytes = voice.to_bytes().map_err(|e| format!("a valid voice does not serialise: {e}"))?;
        let how = rng.below(10);
        if how < 6 {
            if let Some((mut header, mut data)) = split_safetensors(&bytes) {
                for _ in 0..rng.range(1, 3) {
                    match rng.below(4) {
                        0 => {
                            // A tensor's dtype, shape or offsets.
                            let t = *rng.pick(&["speech_token", "prompt_feat", "embedding"]);
                            let field = *rng.pick(&["dtype", "shape", "data_offsets"]);
                            let v = match field {
                                "dtype" => Value::from(*rng.pick(&["I64", "F32", "F16", "BF16", "U8", "BOOL", "F64", "I8", "X", ""])),
                                _ => Value::Array(
                                    (0..rng.range(0, 3))
                                        .map(|_| {
                                            Value::from(match rng.below(4) {
                                                0 => rng.interesting_u64(),
                                                1 => rng.below(100) as u64,
                                                2 => data.len() as u64 + rng.below(16) as u64,
                                                _ => u64::MAX / 4,
                                            })
                                        })
                                        .collect(),
                                ),
                            };
                            if let Some(Value::Object(tensor)) = header.get_mut(t) {
                                tensor.insert(field.to_string(), v);
                            }
                        }
                        1 => gen::mutate_json(rng, &mut header, &["__metadata__"]),
                        2 => gen::mutate_json(rng, &mut header, &["speech_token", "prompt_feat", "embedding"]),
                        _ => {
                            // Data shorter or longer than the offsets say.
                            if rng.chance(1, 2) {
                                data.truncate(rng.below(data.len() + 1));
                            } else {
                                let n = rng.len(4096);
                                data.extend(rng.bytes(n));
                            }
                        }
                    }
                }
                let mut h = serde_json::to_vec(&header).unwrap_or_default();
                while rng.chance(1, 2) && h.len() % 8 != 0 {
                    h.push(b' ');
                }
                let claimed = if rng.chance(9, 10) { h.len() as u64 } else { rng.interesting_u64() };
                bytes = claimed.to_le_bytes().to_vec();
                bytes.extend_from_slice(&h);
                bytes.extend_from_slice(&data);
            }
        }
        if how >= 4 {
            mutate_bytes(rng, &mut bytes, 6, 256 * 1024, None);
        }
        support::keep("fuzz_voice_file", case, "safetensors", &bytes);
        let parsed = match SavedVoice::from_bytes(&bytes, path) {
            Ok(v) => v,
            Err(e) => return Ok(refused(e)),
        };
        // What was accepted must write back and read again the same.
        let again = parsed.to_bytes().map_err(|e| format!("an accepted voice does not serialise: {e}"))?;
        let reread = SavedVoice::from_bytes(&again, path).map_err(|e| format!("an accepted voice does not re-read: {e}"))?;
        if !voices_equal(&parsed, &reread) {
            return Err("an accepted voice changed on a write/read round trip".into());
        }
        Ok(match parsed.check_model(&voice.model_key, Path::new("models/x")) {
            Ok(()) => Outcome::Accepted,
            Err(e) => refused(e),
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Manifest: the fixture's manifest.json with its values and structure mutated (and sometimes its
// text), read by ModelDir::open, the typed constants, the voice model key and the file checks.

#[test]
fn fuzz_manifest() {
    let fixture = root().join("tests/fixtures/tiny/manifest.json");
    let original: Value = serde_json::from_str(&std::fs::read_to_string(&fixture).expect("fixture manifest")).expect("JSON");
    let tmp = support::case_dir();
    let dir = tmp.path();
    let prefer = ["config", "constants", "sine_noise", "files", "tn", "format", "format_version"];
    run(Spec { name: "fuzz_manifest", default_cases: 1_500, mem_bound: 32 * MIB }, |rng, case| {
        let mut m = original.clone();
        for _ in 0..rng.range(1, 4) {
            gen::mutate_json(rng, &mut m, &prefer);
        }
        let mut text = if rng.chance(1, 2) {
            serde_json::to_vec(&m).unwrap_or_default()
        } else {
            serde_json::to_vec_pretty(&m).unwrap_or_default()
        };
        if rng.chance(1, 6) {
            mutate_bytes(rng, &mut text, 3, 1 << 20, None);
        }
        std::fs::write(dir.join("manifest.json"), &text).map_err(|e| format!("writing the case file: {e}"))?;
        support::keep("fuzz_manifest", case, "json", &text);
        let md = match ModelDir::open(dir) {
            Ok(md) => md,
            Err(e) => return Ok(refused(e)),
        };
        let _ = md.missing_stages();
        let _ = md.listed_files();
        let _ = md.check_files(false);
        for stage in STAGES {
            if let Ok(g) = md.graph(stage) {
                let _ = g.has_fixed_shapes();
                for p in cosy::vocab::Precision::ALL {
                    let _ = g.variant(p);
                }
            }
        }
        if let Err(e) = model_key(&md) {
            return Ok(refused(e));
        }
        let c = match ModelConstants::from_manifest(&md) {
            Ok(c) => c,
            Err(e) => return Ok(refused(e)),
        };
        // What the pipeline computes from the constants before any graph runs.
        let _ = c.llm.length_bounds(rng.below(1000));
        let _ = c.llm.is_stop(rng.below(7000) as i64);
        let _ = cosy::flow::plan_stream(c.stream, rng.below(200), rng.below(2000));
        let _ = cosy::flow::cosine_t_span(c.cfm.n_timesteps);
        Ok(Outcome::Accepted)
    });
}

// ---------------------------------------------------------------------------------------------
// Regressions: the inputs the harnesses found, each fixed in the library.

/// A prompt wav as hound writes it.
fn wav_bytes(spec: hound::WavSpec, samples: &[f32]) -> Vec<u8> {
    let mut buf = Vec::new();
    {
        let mut w = hound::WavWriter::new(Cursor::new(&mut buf), spec).expect("wav writer");
        for &x in samples {
            match (spec.sample_format, spec.bits_per_sample) {
                (hound::SampleFormat::Float, _) => w.write_sample(x).expect("sample"),
                (_, 16) => w.write_sample((x * 32767.0) as i16).expect("sample"),
                (_, b) => w.write_sample((x * ((1i64 << (b - 1)) - 1) as f32) as i32).expect("sample"),
            }
        }
        w.finalize().expect("wav finalize");
    }
    buf
}

fn tone(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.3 * (i as f32 * 0.05).sin()).collect()
}

fn load_bytes(name: &str, bytes: &[u8]) -> cosy::Result<cosy::frontend::audio::Audio> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(name);
    std::fs::write(&path, bytes).expect("write");
    load_audio(&path)
}

#[test]
fn regression_float_wav_with_nan_is_refused() {
    // `f32::max` skips NaN, so the finite-peak check let NaN samples through.
    let spec = hound::WavSpec { channels: 1, sample_rate: 16_000, bits_per_sample: 32, sample_format: hound::SampleFormat::Float };
    let mut samples = tone(16_000);
    samples[1234] = f32::NAN;
    let err = load_bytes("nan.wav", &wav_bytes(spec, &samples)).expect_err("NaN samples are refused");
    assert!(err.to_string().contains("NaN"), "{err}");
}

#[test]
fn regression_extensible_wav_with_absurd_channel_count_is_an_error() {
    // WAVE_FORMAT_EXTENSIBLE, 24-bit stereo, with the channel count set to 6145: symphonia's
    // channel-mask repair shifts past 32 bits (a panic with overflow checks, as in a debug build).
    let spec = hound::WavSpec { channels: 2, sample_rate: 48_000, bits_per_sample: 24, sample_format: hound::SampleFormat::Int };
    let mut bytes = wav_bytes(spec, &tone(9_600));
    assert_eq!(&bytes[20..22], &[0xFE, 0xFF], "hound writes 24-bit as WAVE_FORMAT_EXTENSIBLE");
    bytes[22..24].copy_from_slice(&6145u16.to_le_bytes());
    let err = load_bytes("ext.wav", &bytes).expect_err("a damaged header is refused");
    assert!(!err.to_string().contains('\n'), "{err}");
}

#[test]
fn regression_vorbis_setup_header_assertion_is_an_error() {
    // One byte of the Vorbis setup header's first codebook changed (with the page CRC fixed):
    // symphonia's lookup-table assertion fired (in release builds too).
    let mut bytes = std::fs::read(root().join("tests/fixtures/formats/speechlike.ogg")).expect("fixture");
    assert_eq!(&bytes[58..62], b"OggS", "the second page holds the comment and setup headers");
    bytes[2597] = 1;
    gen::fix_ogg_crc(&mut bytes, 58);
    let err = load_bytes("setup.ogg", &bytes).expect_err("a damaged setup header is refused");
    let text = err.to_string();
    assert!(text.contains("setup.ogg") && text.contains("audio decoder") && !text.contains('\n'), "{text}");
}

#[test]
fn regression_config_messages_stay_on_one_line() {
    // A multi-line TOML string (or a key with a newline) was printed verbatim in the message.
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("config.toml");
    std::fs::write(&file, "[runtime]\nthreads = \"\"\"\nmany\nlines\"\"\"\n").expect("write");
    let opts = LoadOptions { config_file: Some(file.clone()), ..Default::default() };
    let text = Config::load(&opts).expect_err("a string is not a thread count").to_string();
    assert!(!text.contains('\n') && text.contains("runtime.threads") && text.contains("\\n"), "{text}");
    std::fs::write(&file, "[runtime]\n\"odd\\nkey\" = 1\n").expect("write");
    let text = Config::load(&opts).expect_err("unknown key").to_string();
    assert!(!text.contains('\n') && text.contains("odd\\nkey"), "{text}");
    let opts = LoadOptions { flags: vec![("text.\nnormalizer".into(), "x\ny".into())], ..Default::default() };
    let text = Config::load(&opts).expect_err("unknown key").to_string();
    assert!(!text.contains('\n'), "{text}");
}

#[test]
fn regression_stream_schedule_with_huge_hops_does_not_overflow() {
    // Manifest (and `--set`) values are unbounded: `hop * stream_scale_factor` and
    // `token_mel_ratio * tokens` overflowed.
    let base = cosy::flow::StreamParams::default();
    for params in [
        cosy::flow::StreamParams { stream_scale_factor: usize::MAX, ..base },
        cosy::flow::StreamParams { token_mel_ratio: usize::MAX / 3, ..base },
        cosy::flow::StreamParams { token_hop_len: usize::MAX, token_max_hop_len: usize::MAX, ..base },
        cosy::flow::StreamParams { pre_lookahead_len: usize::MAX, ..base },
    ] {
        let chunks = cosy::flow::plan_stream(params, 7, 2000).expect("a schedule");
        assert!(chunks.last().is_some_and(|c| c.finalize));
    }
}

/// No accepted empty value changes the mode (issue 18): an empty or blank value, for every key
/// (as `--set KEY=`) and every `COSY_*` variable, is either refused with one line naming the key
/// or variable, or means exactly the built-in default (the keys whose `""` is documented: the
/// model's value, inherit, the default cache or library). Never a third behaviour, such as an
/// empty path meaning the current folder.
#[test]
fn no_accepted_empty_value_changes_the_mode() {
    let default = Config::load(&LoadOptions::default()).expect("defaults");
    let groups = ["llm", "flow", "dit", "hift", "frontend"];
    let keys: Vec<String> = key_names()
        .iter()
        .flat_map(|k| match k.strip_prefix("stages.<llm|flow|dit|hift|frontend>.") {
            Some(rest) => groups.iter().map(|g| format!("stages.{g}.{rest}")).collect::<Vec<_>>(),
            None => vec![k.to_string()],
        })
        .collect();
    for value in ["", "  "] {
        for key in &keys {
            let opts = LoadOptions { flags: vec![(key.clone(), value.into())], ..Default::default() };
            match Config::load(&opts) {
                Ok(c) => assert_eq!(c, default, "--set {key}={value:?} was accepted and changed the configuration"),
                Err(e) => {
                    let m = e.to_string();
                    assert!(m.contains(key.as_str()) && !m.contains('\n'), "--set {key}={value:?}: {m}");
                }
            }
        }
        for (var, key) in env_vars() {
            let opts = LoadOptions { env: vec![(var.to_string(), value.into())], ..Default::default() };
            match Config::load(&opts) {
                Ok(c) => assert_eq!(c, default, "{var}={value:?} was accepted and changed the configuration"),
                Err(e) => {
                    let m = e.to_string();
                    assert!(m.contains(var) && m.contains(key) && !m.contains('\n'), "{var}={value:?}: {m}");
                }
            }
        }
        for var in ["COSY_CONFIG", "COSY_LOG"] {
            let opts = LoadOptions { env: vec![(var.to_string(), value.into())], ..Default::default() };
            let m = Config::load(&opts).expect_err(var).to_string();
            assert!(m.contains(var) && !m.contains('\n'), "{var}={value:?}: {m}");
        }
    }
}

/// Books (issue 33): EPUB 3 and EPUB 2 written by `common/epub.rs` with one of their files
/// mutated, or the zip's bytes; Markdown and plain text with headings and title lines; random
/// bytes. A book read has chapters, none empty.
#[test]
fn fuzz_book() {
    // Small bounds, so that a mutated deflate stream is refused well inside the memory bound.
    let limits = BookLimits { max_entry_bytes: 4 * MIB as u64, max_total_bytes: 16 * MIB as u64, ..BookLimits::default() };
    run(Spec { name: "fuzz_book", default_cases: 1_500, mem_bound: 64 * MIB }, |rng, _| {
        let chapters = epub::alice_chapters(rng.range(1, 4));
        let pairs = epub::as_pairs(&chapters);
        let (name, mut bytes) = match rng.below(4) {
            0 => {
                let mut book =
                    if rng.chance(1, 2) { epub::Epub::epub3("Alice", "Lewis Carroll", &pairs) } else { epub::Epub::epub2("Alice", "Lewis Carroll", &pairs) };
                if rng.chance(2, 3) {
                    let i = rng.below(book.files.len());
                    mutate_bytes(rng, &mut book.files[i].1, 8, 1 << 16, None);
                }
                ("book.epub", book.to_bytes())
            }
            how => {
                let mut text = String::new();
                for _ in 0..rng.range(1, 12) {
                    let line = match rng.below(6) {
                        0 => format!("{} {}", rng.pick(&["#", "##", "###"]), gen::text(rng, 30)),
                        1 => format!("{} {}", rng.pick(&["Chapter", "CHAPTER", "Part", "Prologue"]), rng.below(30)),
                        2 => String::new(),
                        _ => gen::text(rng, 200),
                    };
                    text.push_str(&line);
                    let line_end = *rng.pick(&["\n", "\n\n", "\r\n", "\r", "\n\n\n"]);
                    text.push_str(line_end);
                }
                let name = *rng.pick(&["book.md", "book.txt", "book"]);
                if how == 3 {
                    let n = rng.len(4096);
                    (name, rng.bytes(n))
                } else {
                    (name, text.into_bytes())
                }
            }
        };
        if rng.chance(1, 4) {
            mutate_bytes(rng, &mut bytes, 4, 1 << 17, None);
        }
        match parse_book(&bytes, name, &limits) {
            Ok(book) => {
                if book.chapters.is_empty() || book.chapters.iter().any(|c| c.text.trim().is_empty()) {
                    return Err(format!("{name}: a book read with no chapter or an empty one: {book:?}"));
                }
                Ok(Outcome::Accepted)
            }
            Err(e) => Ok(Outcome::Refused(e.to_string())),
        }
    });
}
