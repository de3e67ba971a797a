//! The official text frontend's rules (`CosyVoiceFrontEnd.text_normalize` and
//! `cosyvoice/utils/frontend_utils.py`), without the FST text normaliser.
//!
//! * Text holding both `<|` and `|>` (or empty) bypasses everything and stays one segment.
//! * Otherwise it is trimmed, a [`Normalizer`] runs (identity by default; a wetext-like TN can plug
//!   in later), and the language is picked by [`contains_chinese`]:
//!   * zh: drop `\n`, [`replace_blank`], ²→平方 ³→立方, `.`→`。`, ` - `→`，`, drop （）【】 and
//!     backticks, `——`→space, a trailing run of `，,、` becomes `。`; split by characters;
//!   * en: [`spell_out_numbers`]; split by tokenizer length.
//! * [`split_paragraph`] cuts after end marks and greedily merges; segments made only of
//!   punctuation/symbols are dropped.

use std::sync::OnceLock;

use regex::Regex;

use crate::frontend::numbers::digits_to_words;

/// Which rule set the text gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Zh,
    En,
}

/// Text normalisation (numbers, dates, units … to words) run before the post rules.
/// The official frontend uses ttsfrd or wetext here; without either it does nothing.
pub trait Normalizer: Send + Sync {
    fn normalize(&self, text: &str, lang: Lang) -> String;
}

/// The normaliser the official code has when neither ttsfrd nor wetext is installed.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdentityNormalizer;

impl Normalizer for IdentityNormalizer {
    fn normalize(&self, text: &str, _lang: Lang) -> String {
        text.to_string()
    }
}

/// Sentence-splitting limits (the official call uses the defaults).
#[derive(Debug, Clone, Copy)]
pub struct SplitOptions {
    pub token_max_n: usize,
    pub token_min_n: usize,
    pub merge_len: usize,
    pub comma_split: bool,
}

impl Default for SplitOptions {
    fn default() -> Self {
        Self { token_max_n: 80, token_min_n: 60, merge_len: 20, comma_split: false }
    }
}

/// True when the text has a CJK unified ideograph (U+4E00..=U+9FFF).
pub fn contains_chinese(text: &str) -> bool {
    text.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
}

/// True when the text skips the frontend: it holds both `<|` and `|>` (a special-token markup).
pub fn bypasses_frontend(text: &str) -> bool {
    text.contains("<|") && text.contains("|>")
}

/// Drops each space unless both neighbours are non-space ASCII (keeps spaces between English
/// words inside Chinese text). Like the Python original, the left neighbour of index 0 is the
/// last character; a trailing space (impossible after trimming) is dropped.
pub fn replace_blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let keeps = |c: Option<&char>| c.is_some_and(|c| c.is_ascii() && *c != ' ');
    chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| {
            c != ' ' || (keeps(chars.get(i + 1)) && keeps(chars.get(if i == 0 { n - 1 } else { i - 1 })))
        })
        .map(|(_, &c)| c)
        .collect()
}

/// Characters Python's `str.isdigit` accepts that we handle: ASCII digits, plus superscript and
/// subscript digits (which inflect then drops, reading a run of only those as "zero").
fn is_python_digit(c: char) -> bool {
    c.is_ascii_digit() || matches!(c, '¹' | '²' | '³' | '⁰' | '⁴'..='⁹' | '₀'..='₉')
}

/// Replaces every digit run with its English words (`inflect.number_to_words`), e.g.
/// "Room 42B" → "Room forty-twoB". A CMU phoneme token (`[AH0]`, [`is_cmu_token`]) is kept whole:
/// its stress digit is part of a token of the model's vocabulary, not a number. The official
/// frontend spells it out too (`[AHzero]`), which loses the pronunciation a user (or the
/// lexicon, or SSML's `<phoneme>`) asked for; text without such tokens is read as officially.
pub fn spell_out_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut run = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '[' {
            if let Some(end) = rest.bytes().take(6).position(|b| b == b']').filter(|&end| is_cmu_token(&rest[..=end])) {
                if !run.is_empty() {
                    out.push_str(&digits_to_words(&run));
                    run.clear();
                }
                out.push_str(&rest[..=end]);
                rest = &rest[end + 1..];
                continue;
            }
        }
        rest = &rest[c.len_utf8()..];
        if is_python_digit(c) {
            run.push(c);
            continue;
        }
        if !run.is_empty() {
            out.push_str(&digits_to_words(&run));
            run.clear();
        }
        out.push(c);
    }
    if !run.is_empty() {
        out.push_str(&digits_to_words(&run));
    }
    out
}

/// True for a CMU phoneme token with a stress digit as the tokenizer spells it: `[`, one to
/// three capital letters, one digit 0–2, `]` (`[AH0]`, `[OW1]`, `[ER2]`).
pub fn is_cmu_token(text: &str) -> bool {
    let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else { return false };
    let bytes = inner.as_bytes();
    let (letters, stress) = bytes.split_at(bytes.len().saturating_sub(1));
    matches!(stress, [b'0'..=b'2']) && (1..=3).contains(&letters.len()) && letters.iter().all(u8::is_ascii_uppercase)
}

fn trailing_comma_run() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"[，,、]+$").expect("static regex"))
}

fn only_punctuation() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"^[\p{P}\p{S}]*$").expect("static regex"))
}

/// True for segments made only of punctuation and symbols (or empty); the frontend drops them.
/// Emoji are symbols (`\p{So}`), so emoji-only text counts.
pub fn is_only_punctuation(text: &str) -> bool {
    only_punctuation().is_match(text)
}

fn invisible() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"[\s\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}]+").expect("static regex")
    })
}

/// `text` without what cannot be seen or said: white space, control and format characters
/// (zero-width space U+200B, joiners U+200C/U+200D, word joiner U+2060, byte-order mark U+FEFF …)
/// and the other default-ignorable code points (variation selectors, Hangul fillers …). Empty
/// when the text has nothing visible.
pub fn strip_invisible(text: &str) -> String {
    invisible().replace_all(text, "").into_owned()
}

/// What of `text` is to be spoken: what follows its last `<|endofprompt|>` (what comes before is
/// a prompt or an instruction to the model), without special-token markup (`<|en|>`, …), which
/// the model reads as control tokens, not words.
pub fn spoken_part(text: &str) -> std::borrow::Cow<'_, str> {
    static MARKUP: OnceLock<Regex> = OnceLock::new();
    let after = text.rsplit(crate::frontend::tokenizer::ENDOFPROMPT).next().unwrap_or(text);
    let markup = MARKUP.get_or_init(|| Regex::new(r"<\|[^<>|]*\|>").expect("static regex"));
    markup.replace_all(after, "")
}

/// Whether `text` has something to say: a spoken part ([`spoken_part`]) with something visible
/// that is not only punctuation, symbols or emoji. The rule `request::check_speakable` words
/// as an error for each way it fails.
pub fn has_something_to_say(text: &str) -> bool {
    let spoken = strip_invisible(&spoken_part(text));
    !spoken.is_empty() && !is_only_punctuation(&spoken)
}

/// The Chinese post rules applied after normalisation (before splitting).
pub fn zh_post_rules(text: &str) -> String {
    let text = text.replace('\n', "");
    let text = replace_blank(&text);
    let text = text.replace('²', "平方").replace('³', "立方");
    let text = text.replace('.', "。").replace(" - ", "，");
    let text = text.replace(['（', '）', '【', '】', '`'], "").replace("——", " ");
    trailing_comma_run().replace(&text, "。").into_owned()
}

/// [`zh_post_rules`] for text whose numbers are as written: a `.` between two ASCII digits (a
/// decimal point, "3.5") stays.
fn zh_post_rules_keeping_decimals(text: &str) -> String {
    // A private-use stand-in for the decimal point, through the rules and back.
    const POINT: char = '\u{F8FF}';
    let chars: Vec<char> = text.chars().collect();
    let marked: String = chars
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let between_digits = i > 0 && chars[i - 1].is_ascii_digit() && chars.get(i + 1).is_some_and(char::is_ascii_digit);
            if c == '.' && between_digits {
                POINT
            } else {
                c
            }
        })
        .collect();
    zh_post_rules(&marked).replace(POINT, ".")
}

/// `split_paragraph`: cut after each end mark (a following `"` or `”` stays attached), then
/// merge greedily: the running segment is flushed when adding the next piece would exceed
/// `token_max_n` and it already exceeds `token_min_n`; a last piece shorter than `merge_len`
/// joins the previous segment. Length is characters for zh and `token_len` for en. A missing
/// final end mark (`。` zh, `.` en) is appended first.
pub fn split_paragraph(text: &str, lang: Lang, token_len: &dyn Fn(&str) -> usize, opts: SplitOptions) -> Vec<String> {
    let length = |s: &str| match lang {
        Lang::Zh => s.chars().count(),
        Lang::En => token_len(s),
    };
    let mut marks: Vec<char> = match lang {
        Lang::Zh => vec!['。', '？', '！', '；', '：', '、', '.', '?', '!', ';'],
        Lang::En => vec!['.', '?', '!', ';', ':'],
    };
    if opts.comma_split {
        marks.extend(['，', ',']);
    }
    let mut chars: Vec<char> = text.chars().collect();
    let Some(&last) = chars.last() else { return Vec::new() };
    if !marks.contains(&last) {
        chars.push(if lang == Lang::Zh { '。' } else { '.' });
    }

    let mut pieces: Vec<String> = Vec::new();
    let mut start = 0;
    for (i, &c) in chars.iter().enumerate() {
        if !marks.contains(&c) {
            continue;
        }
        if i > start {
            pieces.push(chars[start..=i].iter().collect());
        }
        // An empty piece (e.g. "!!") drops its mark, as the original does.
        match chars.get(i + 1) {
            Some(&q) if q == '"' || q == '”' => {
                // The original pops the previous piece to attach the quote; with none (text
                // starting with a mark and a quote) it would crash; we keep the quote alone.
                match pieces.last_mut() {
                    Some(p) => p.push(q),
                    None => pieces.push(q.to_string()),
                }
                start = i + 2;
            }
            _ => start = i + 1,
        }
    }

    let mut segments: Vec<String> = Vec::new();
    let mut current = String::new();
    for piece in pieces {
        let joined = format!("{current}{piece}");
        if length(&joined) > opts.token_max_n && length(&current) > opts.token_min_n {
            segments.push(std::mem::take(&mut current));
        }
        current.push_str(&piece);
    }
    if !current.is_empty() {
        match segments.last_mut() {
            Some(prev) if length(&current) < opts.merge_len => prev.push_str(&current),
            _ => segments.push(current),
        }
    }
    segments
}

/// Result of the text frontend on one input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The whole text after the rules (what `text_normalize(split=False)` returns).
    pub text: String,
    /// The sentence segments (what `text_normalize(split=True)` returns).
    pub segments: Vec<String>,
}

/// Runs the frontend on `text`. `enabled = false` (the official `text_frontend=False`), empty
/// text and `<|…|>` markup all return the text unchanged as a single segment.
/// Where the last settled sentence end in `text` is (the byte index just past it), for text that
/// is still arriving: `.`, `!`, `?`, `;` count once a blank follows them (a final `.` may yet be a
/// decimal point), `。！？；` and line breaks (`\n`, and a lone `\r` as [`split_lines`] takes it) at once.
pub fn settled_end(text: &str) -> Option<usize> {
    let mut end = None;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let after = i + c.len_utf8();
        match c {
            '。' | '！' | '？' | '；' | '\n' | '\r' => end = Some(after),
            '.' | '!' | '?' | ';' if chars.peek().is_some_and(|(_, n)| n.is_whitespace()) => end = Some(after),
            _ => {}
        }
    }
    end
}

/// Text that is still arriving, cut into settled sentences ([`settled_end`]): the one sentence
/// buffer of streamed text, inside [`crate::frontend::sentences::SentenceCutter`].
#[derive(Debug, Default)]
pub struct SentenceBuffer {
    text: String,
}

impl SentenceBuffer {
    /// Text that arrived.
    pub fn push(&mut self, piece: &str) {
        self.text.push_str(piece);
    }

    /// The text up to the last settled sentence end, taken out; `None` while nothing is settled.
    pub fn take_settled(&mut self) -> Option<String> {
        let end = settled_end(&self.text)?;
        Some(self.text.drain(..end).collect())
    }

    /// Settled text given back (it had nothing to say on its own): it opens the next sentence.
    pub fn give_back(&mut self, settled: String) {
        self.text.insert_str(0, &settled);
    }

    /// Everything left (at the end of the input), taken out.
    pub fn take_rest(&mut self) -> String {
        std::mem::take(&mut self.text)
    }
}

/// The UTF-8 byte-order mark some editors put at the start of a text file (U+FEFF).
pub const BOM: char = '\u{feff}';

/// A text file's or standard input's text without a byte-order mark at its start: it marks the
/// encoding and is not text (kept, it would become the first text tokens).
pub fn strip_bom(text: String) -> String {
    match text.strip_prefix(BOM) {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

/// Reads `reader` as it arrives and hands each piece of UTF-8 text to `on_piece` (text-in
/// streaming from a pipe): a piece is what one read returned, less an incomplete character at
/// its end (kept for the next). Invalid UTF-8 is an error naming `what` and the byte offset.
/// Returns the number of bytes read; stops early when `on_piece` fails.
pub fn read_pieces(mut reader: impl std::io::Read, what: &str, mut on_piece: impl FnMut(String) -> crate::Result<()>) -> crate::Result<u64> {
    let mut buf = vec![0u8; 4096];
    let mut carry: Vec<u8> = Vec::new();
    let mut offset = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(crate::Error::invalid(format!("{what}: cannot be read ({e})"))),
        };
        carry.extend_from_slice(&buf[..n]);
        let valid = match std::str::from_utf8(&carry) {
            Ok(_) => carry.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(e) => {
                return Err(crate::Error::invalid(format!(
                    "{what}: invalid UTF-8 at byte {}; send UTF-8 text",
                    offset + e.valid_up_to() as u64
                )))
            }
        };
        let rest = carry.split_off(valid);
        let mut piece = String::from_utf8(std::mem::replace(&mut carry, rest)).unwrap_or_default();
        if offset == 0 {
            // A byte-order mark opening the stream is not text ([`strip_bom`]); offsets still
            // count its bytes.
            if let Some(rest) = piece.strip_prefix(BOM) {
                offset += BOM.len_utf8() as u64;
                piece = rest.to_string();
            }
        }
        offset += piece.len() as u64;
        if !piece.is_empty() {
            on_piece(piece)?;
        }
    }
    if !carry.is_empty() {
        return Err(crate::Error::invalid(format!("{what}: the text ends inside a UTF-8 character (byte {offset}); send UTF-8 text")));
    }
    Ok(offset)
}

/// All of `reader`'s text, the same way as [`read_pieces`] reads it (a byte-order mark at its
/// start dropped; invalid UTF-8 an input error naming `what` and the byte offset): the one rule
/// for a whole text read from standard input or a file, so that both answer alike.
pub fn read_text(reader: impl std::io::Read, what: &str) -> crate::Result<String> {
    let mut text = String::new();
    read_pieces(reader, what, |piece| {
        text.push_str(&piece);
        Ok(())
    })?;
    Ok(text)
}

/// The lines of `text`, each without its line end: `\n`, `\r\n` and a lone `\r` (old Mac files,
/// some terminals) all end a line, so that a file with CR line ends is one utterance per line
/// as any other.
pub fn split_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = (!text.is_empty()).then_some(text);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.find(['\n', '\r']) {
            Some(i) => {
                let skip = if r[i..].starts_with("\r\n") { 2 } else { 1 };
                let next = &r[i + skip..];
                rest = (!next.is_empty()).then_some(next);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

pub fn normalize(text: &str, enabled: bool, normalizer: &dyn Normalizer, token_len: &dyn Fn(&str) -> usize) -> Normalized {
    normalize_numbers(text, enabled, true, normalizer, token_len)
}

/// [`normalize`], with numbers spelt out or not (`text.numbers`). With `numbers` false the
/// digits reach the model as written: the normaliser (wetext, which acts only on text holding a
/// digit) is not run, English digit runs are not spelt out, and in Chinese text a `.` between
/// two digits stays (the post rule would make it `。`, a sentence end); the other post rules and
/// the sentence splitting are as official.
pub fn normalize_numbers(text: &str, enabled: bool, numbers: bool, normalizer: &dyn Normalizer, token_len: &dyn Fn(&str) -> usize) -> Normalized {
    if !enabled || text.is_empty() || bypasses_frontend(text) {
        return Normalized { text: text.to_string(), segments: vec![text.to_string()] };
    }
    let trimmed = text.trim();
    let (processed, lang) = match (contains_chinese(trimmed), numbers) {
        (true, true) => (zh_post_rules(&normalizer.normalize(trimmed, Lang::Zh)), Lang::Zh),
        (true, false) => (zh_post_rules_keeping_decimals(trimmed), Lang::Zh),
        (false, true) => (spell_out_numbers(&normalizer.normalize(trimmed, Lang::En)), Lang::En),
        (false, false) => (trimmed.to_string(), Lang::En),
    };
    let segments = split_paragraph(&processed, lang, token_len, SplitOptions::default())
        .into_iter()
        .filter(|s| !is_only_punctuation(s))
        .collect();
    Normalized { text: processed, segments }
}

/// The sentence segments of `text` (official `text_normalize(text, split=True)`).
pub fn normalize_and_split(
    text: &str,
    enabled: bool,
    normalizer: &dyn Normalizer,
    token_len: &dyn Fn(&str) -> usize,
) -> Vec<String> {
    normalize(text, enabled, normalizer, token_len).segments
}

#[cfg(test)]
mod piece_tests {
    use super::*;

    /// A reader that returns its chunks one read at a time.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);
    impl std::io::Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some(c) = self.0.pop_front() else { return Ok(0) };
            buf[..c.len()].copy_from_slice(&c);
            Ok(c.len())
        }
    }

    #[test]
    fn pieces_keep_split_characters_whole_and_refuse_invalid_utf8() {
        let text = "Hé 你好".as_bytes().to_vec();
        // Split inside "é" and inside "你".
        let chunks = Chunks(vec![text[..2].to_vec(), text[2..6].to_vec(), text[6..].to_vec()].into());
        let mut got = Vec::new();
        let n = read_pieces(chunks, "<stdin>", |p| {
            got.push(p);
            Ok(())
        })
        .expect("valid");
        assert_eq!(got.concat(), "Hé 你好");
        assert_eq!(got[0], "H", "the half character waits for the next read");
        assert_eq!(n, text.len() as u64);
        let bad = Chunks(vec![b"ok ".to_vec(), vec![0xff, b'x']].into());
        let err = read_pieces(bad, "<stdin>", |_| Ok(())).expect_err("invalid");
        assert!(err.to_string().contains("invalid UTF-8 at byte 3"), "{err}");
        let cut = Chunks(vec![vec![b'a', 0xe4, 0xbd]].into());
        assert!(read_pieces(cut, "<stdin>", |_| Ok(())).expect_err("cut").to_string().contains("inside a UTF-8 character"));
    }

    #[test]
    fn a_byte_order_mark_opening_the_stream_is_dropped() {
        // The mark split over two reads, then text; a mark later on is text and stays.
        let chunks = Chunks(vec![vec![0xef, 0xbb], vec![0xbf, b'H', b'i'], "\u{feff}!".as_bytes().to_vec()].into());
        let mut got = Vec::new();
        let n = read_pieces(chunks, "<stdin>", |p| {
            got.push(p);
            Ok(())
        })
        .expect("valid");
        assert_eq!(got.concat(), "Hi\u{feff}!");
        assert_eq!(n, 9, "every byte read is counted");
        assert_eq!(strip_bom("\u{feff}Hello".into()), "Hello");
        assert_eq!(strip_bom("Hel\u{feff}lo".into()), "Hel\u{feff}lo");
    }

    /// Digits are spelt out, but a CMU phoneme token's stress digit stays (the token is in the
    /// vocabulary; "[AHzero]" is not).
    #[test]
    fn cmu_tokens_keep_their_stress_digits() {
        assert_eq!(spell_out_numbers("Room 42B"), "Room forty-twoB");
        assert_eq!(spell_out_numbers("say [T][AH0][M][EY1][T][OW2] 2 times"), "say [T][AH0][M][EY1][T][OW2] two times");
        assert_eq!(spell_out_numbers("note [1] and [AH3] and [ah0] and [ABCD1]"), "note [one] and [AHthree] and [ahzero] and [ABCDone]");
        assert_eq!(spell_out_numbers("[AH0"), "[AHzero", "an unclosed bracket is text");
        assert!(is_cmu_token("[ER2]") && !is_cmu_token("[breath]") && !is_cmu_token("[]") && !is_cmu_token("[0]"));
    }

    /// Numbers off (`text.numbers = false`): the digits as written, the normaliser not run; in
    /// Chinese a decimal point stays a point, the other post rules and the splitting as official.
    #[test]
    fn numbers_off_leaves_the_digits_as_written() {
        struct Shouting;
        impl Normalizer for Shouting {
            fn normalize(&self, text: &str, _lang: Lang) -> String {
                text.to_uppercase()
            }
        }
        let count = |s: &str| s.split_whitespace().count();
        let en = "Room 42B costs 3.5 dollars.";
        assert_eq!(normalize(en, true, &Shouting, &count).text, "ROOM forty-twoB COSTS three.five DOLLARS.");
        assert_eq!(normalize_numbers(en, true, false, &Shouting, &count).text, en);
        let zh = "价格是3.5元. 共（2）件";
        assert_eq!(normalize_numbers(zh, true, false, &IdentityNormalizer, &count).text, "价格是3.5元。共2件");
        assert_eq!(normalize(zh, true, &IdentityNormalizer, &count).text, "价格是3。5元。共2件");
        assert_eq!(normalize_numbers(en, false, false, &Shouting, &count).text, en, "no frontend: as written");
    }

    #[test]
    fn settled_ends() {
        assert_eq!(settled_end("Hello world"), None);
        assert_eq!(settled_end("Hello world."), None, "a final '.' may still be a decimal point");
        assert_eq!(settled_end("Hello. Wor"), Some(6));
        assert_eq!(settled_end("It costs 3.5 dollars! And"), Some(21));
        assert_eq!(settled_end("你好。世界"), Some("你好。".len()));
        assert_eq!(settled_end("line one\nline"), Some(9));
        assert_eq!(settled_end("line one\rline"), Some(9), "a lone CR ends a line too");
    }

    /// `\n`, `\r\n` and a lone `\r` each end a line (issue 30: a file with CR line ends was
    /// one utterance).
    #[test]
    fn lines_end_at_lf_crlf_and_a_lone_cr() {
        fn lines(t: &str) -> Vec<&str> {
            split_lines(t).collect()
        }
        assert_eq!(lines("one\rtwo\rthree"), ["one", "two", "three"]);
        assert_eq!(lines("one\r\ntwo\nthree\r"), ["one", "two", "three"]);
        assert_eq!(lines("one\n\ntwo\n"), ["one", "", "two"]);
        assert_eq!(lines(""), Vec::<&str>::new());
        assert_eq!(lines("\n"), [""]);
        for t in ["a\nb\n", "a\r\nb", "x", "a\n\n\nb\n\n"] {
            assert_eq!(lines(t), t.lines().collect::<Vec<_>>(), "as str::lines where it has no lone CR: {t:?}");
        }
    }

    /// A whole text read at once says what [`read_pieces`] says of the same bytes.
    #[test]
    fn whole_texts_are_read_as_pieces_are() {
        assert_eq!(read_text(&b"\xef\xbb\xbfhello"[..], "<stdin>").unwrap(), "hello");
        let err = read_text(&b"ok\xff"[..], "--input x.txt").expect_err("not UTF-8");
        assert!(matches!(err, crate::Error::Input { .. }), "an input error: {err:?}");
        assert_eq!(err.to_string(), "--input x.txt: invalid UTF-8 at byte 2; send UTF-8 text");
    }

    #[test]
    fn a_sentence_buffer_gives_settled_text_and_the_rest() {
        let mut buffer = SentenceBuffer::default();
        buffer.push("One. Tw");
        assert_eq!(buffer.take_settled().as_deref(), Some("One."));
        assert_eq!(buffer.take_settled(), None);
        buffer.push("o! Three");
        assert_eq!(buffer.take_settled().as_deref(), Some(" Two!"));
        buffer.give_back("...".into());
        assert_eq!(buffer.take_rest(), "... Three");
        assert_eq!(buffer.take_rest(), "");
    }
}
