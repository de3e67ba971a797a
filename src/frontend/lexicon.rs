//! The pronunciation lexicon (`text.lexicon`, docs/text.md): a user's TOML file of words and
//! what to say for them, as replacement text, CMU phonemes or pinyin. Phonemes and pinyin become
//! CosyVoice3's own phoneme tokens (`[K][OW1]`, `[h][áng]`), which its tokenizer matches whole and
//! the official frontend passes as written.
//!
//! ```toml
//! [words]
//! cosy = "cozy"                                  # replacement text
//! Nguyen = { cmu = "W IH1 N" }                   # CMU phonemes, stress digits as the tokenizer has them
//! "行" = { pinyin = "hang2" }                     # pinyin, tone digits (or marks: "háng")
//! US = { say = "United States", case = "exact" } # only "US", not "us"
//! ```
//!
//! Matching: whole words (a word edge that is a letter or digit may not touch another letter or
//! digit; Han characters have no word edges), case-insensitive unless `case = "exact"`, the
//! longest entry first where several start at one place, one pass (what an entry says is not
//! looked up again), and never inside CosyVoice3's markup (`[breath]`, `<strong>`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::error::{Error, Result};
use crate::frontend::tokenizer::{TextTokenizer, ENDOFPROMPT_ID};

/// What an entry says instead of its word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pronunciation {
    /// Text, read by the frontend as any text.
    Say(String),
    /// CMU phones, e.g. `["K", "OW1"]`.
    Cmu(Vec<String>),
    /// Pinyin syllables as written, e.g. `["hang2"]`.
    Pinyin(Vec<String>),
}

impl Pronunciation {
    /// The text said: the replacement, or the phoneme tokens (`[K][OW1]`, `[h][áng]`).
    pub fn spoken(&self) -> String {
        match self {
            Pronunciation::Say(text) => text.clone(),
            Pronunciation::Cmu(phones) => phones.iter().map(|p| format!("[{p}]")).collect(),
            Pronunciation::Pinyin(syllables) => syllables.iter().map(|s| pinyin_tokens(s)).collect(),
        }
    }
}

/// One word of the lexicon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub word: String,
    pub pronunciation: Pronunciation,
    /// `case = "exact"`: only the word as written matches.
    pub exact_case: bool,
    /// Line of the entry in its file (1-based), for messages.
    pub line: usize,
    /// The word in lower case (as matched without `exact_case`) and its length in characters.
    folded: String,
    chars: usize,
}

impl Entry {
    /// The text the entry puts in place of its word: the replacement, or the phoneme tokens.
    pub fn spoken(&self) -> String {
        self.pronunciation.spoken()
    }

    /// The phoneme tokens the entry uses (none for replacement text).
    pub fn tokens(&self) -> Vec<String> {
        match &self.pronunciation {
            Pronunciation::Say(_) => Vec::new(),
            _ => {
                let spoken = self.spoken();
                spoken.split_inclusive(']').map(str::to_string).collect()
            }
        }
    }
}

/// A loaded lexicon, entries longest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lexicon {
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LexiconFile {
    #[serde(default)]
    words: BTreeMap<String, Spanned<toml::Value>>,
}

const FIELDS: &str = "say, cmu, pinyin, case";

impl Lexicon {
    /// Reads and checks the lexicon file at `path`; a mistake is one line naming the file and line.
    pub fn load(path: &Path) -> Result<Lexicon> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Lexicon::parse(&text, &path.display().to_string())
    }

    /// Parses a lexicon's text; `name` (the file) starts every message.
    pub fn parse(text: &str, name: &str) -> Result<Lexicon> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let bad = |line: usize, msg: String| Error::Config(format!("lexicon {name} line {line}: {msg}"));
        let file: LexiconFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(s.start));
            bad(line, e.message().trim().to_string())
        })?;
        let mut entries = Vec::with_capacity(file.words.len());
        for (word, value) in file.words {
            let line = line_of(value.span().start);
            let entry = entry_of(word, value.into_inner(), line).map_err(|msg| bad(line, msg))?;
            entries.push(entry);
        }
        // Longest first, so "New York" wins over "New"; ties in file order.
        entries.sort_by(|a, b| b.chars.cmp(&a.chars).then(a.line.cmp(&b.line)));
        Ok(Lexicon { entries })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// This lexicon over `base` (a voice's over the global one): a word both have is said as this
    /// one says it, whatever its case rule; the rest of `base` stays. Longest first as ever; of one
    /// length, this lexicon's entries first.
    pub fn over(&self, base: &Lexicon) -> Lexicon {
        let mine: std::collections::HashSet<&str> = self.entries.iter().map(|e| e.folded.as_str()).collect();
        let mut entries: Vec<Entry> = self.entries.iter().chain(base.entries.iter().filter(|e| !mine.contains(e.folded.as_str()))).cloned().collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.chars));
        Lexicon { entries }
    }

    /// `text` with every lexicon word replaced by what its entry says.
    pub fn apply(&self, text: &str) -> String {
        if self.entries.is_empty() {
            return text.to_string();
        }
        let chars: Vec<char> = text.chars().collect();
        let mut out = String::with_capacity(text.len());
        let mut i = 0;
        while i < chars.len() {
            if let Some(end) = markup_end(&chars, i) {
                out.extend(&chars[i..end]);
                i = end;
                continue;
            }
            match self.entry_at(&chars, i) {
                Some(entry) => {
                    out.push_str(&entry.spoken());
                    i += entry.chars;
                }
                None => {
                    out.push(chars[i]);
                    i += 1;
                }
            }
        }
        out
    }

    /// The entry whose word starts at `chars[at]` as a whole word, longest first.
    fn entry_at(&self, chars: &[char], at: usize) -> Option<&Entry> {
        let before = at.checked_sub(1).map(|i| chars[i]);
        self.entries.iter().find(|e| {
            let end = at + e.chars;
            if end > chars.len() {
                return false;
            }
            let span = &chars[at..end];
            let same = if e.exact_case {
                span.iter().copied().eq(e.word.chars())
            } else {
                span.iter().flat_map(|c| c.to_lowercase()).eq(e.folded.chars())
            };
            same && edge_free(span.first().copied(), before) && edge_free(span.last().copied(), chars.get(end).copied())
        })
    }

    /// One line per entry whose phoneme tokens the tokenizer does not have.
    pub fn check(&self, tokenizer: &TextTokenizer) -> Vec<String> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by_key(|e| e.line);
        entries
            .into_iter()
            .filter_map(|e| {
                let missing: Vec<String> = e.tokens().into_iter().filter(|t| !is_special_token(tokenizer, t)).collect();
                (!missing.is_empty()).then(|| format!("line {}: {:?}: not in the tokenizer: {}", e.line, e.word, missing.join(" ")))
            })
            .collect()
    }
}

/// [`Lexicon::check`] of the lexicon file at `path` against the tokenizer of the model folder
/// `model_dir`.
pub fn check_file(path: &Path, model_dir: &Path) -> Result<Vec<String>> {
    let lexicon = Lexicon::load(path)?;
    let dir = crate::model::ModelDir::open(model_dir)?;
    let tokenizer = TextTokenizer::from_file(&dir.listed_file("tokenizer")?)?;
    Ok(lexicon.check(&tokenizer))
}

/// Whether `token` is one of the tokenizer's added tokens (CosyVoice3's specials).
fn is_special_token(tokenizer: &TextTokenizer, token: &str) -> bool {
    matches!(tokenizer.encode(token).as_deref(), Ok([id]) if *id >= ENDOFPROMPT_ID)
}

/// Whether a word edge `edge` may sit beside `neighbour`: a letter or digit (not Han) may not
/// touch another letter or digit.
fn edge_free(edge: Option<char>, neighbour: Option<char>) -> bool {
    let wordy = |c: char| c.is_alphanumeric() && !is_han(c);
    match (edge, neighbour) {
        (Some(e), Some(n)) => !(wordy(e) && (n.is_alphanumeric() || n == '_')),
        _ => true,
    }
}

fn is_han(c: char) -> bool {
    matches!(c as u32, 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FA1F)
}

/// End of CosyVoice3 markup starting at `chars[at]` (`[breath]`, `[AA1]`, `<strong>`,
/// `</laughter>`, `<|endofprompt|>`): a bracket closed within 32 characters without a blank.
fn markup_end(chars: &[char], at: usize) -> Option<usize> {
    let close = match chars[at] {
        '[' => ']',
        '<' => '>',
        _ => return None,
    };
    chars[at + 1..].iter().take(32).take_while(|c| !c.is_whitespace()).position(|&c| c == close).map(|p| at + p + 2)
}

fn entry_of(word: String, value: toml::Value, line: usize) -> std::result::Result<Entry, String> {
    if word.trim().is_empty() {
        return Err("an entry's word is empty".into());
    }
    if word.trim() != word {
        return Err(format!("{word:?}: a word may not start or end with a blank"));
    }
    let (pronunciation, exact_case) = match value {
        toml::Value::String(say) => (say_of(&word, say)?, false),
        toml::Value::Table(table) => {
            let mut found: Option<Pronunciation> = None;
            let mut exact_case = false;
            for (key, v) in table {
                let text = v.as_str().map(str::to_string).ok_or_else(|| format!("{word:?}: {key} must be a string"))?;
                let p = match key.as_str() {
                    "say" => say_of(&word, text)?,
                    "cmu" => Pronunciation::Cmu(syllables(&word, &key, &text)?),
                    "pinyin" => {
                        let syllables = syllables(&word, &key, &text)?;
                        if let Some(bad) = syllables.iter().find(|s| !is_pinyin_syllable(s)) {
                            return Err(format!("{word:?}: pinyin {bad:?}: a syllable is letters, then a tone digit 1-5 or none"));
                        }
                        Pronunciation::Pinyin(syllables)
                    }
                    "case" => {
                        exact_case = match text.as_str() {
                            "exact" => true,
                            "any" => false,
                            other => return Err(format!("{word:?}: case {other:?}: allowed: \"exact\", \"any\"")),
                        };
                        continue;
                    }
                    other => return Err(format!("{word:?}: unknown field {other:?} (allowed: {FIELDS})")),
                };
                if found.replace(p).is_some() {
                    return Err(format!("{word:?}: give one of say, cmu, pinyin"));
                }
            }
            (found.ok_or_else(|| format!("{word:?}: give one of say, cmu, pinyin"))?, exact_case)
        }
        _ => return Err(format!("{word:?}: give a string (what to say) or a table ({FIELDS})")),
    };
    let folded = word.chars().flat_map(char::to_lowercase).collect();
    let chars = word.chars().count();
    Ok(Entry { word, pronunciation, exact_case, line, folded, chars })
}

fn say_of(word: &str, say: String) -> std::result::Result<Pronunciation, String> {
    if say.trim().is_empty() {
        return Err(format!("{word:?}: say is empty"));
    }
    Ok(Pronunciation::Say(say))
}

fn syllables(word: &str, key: &str, text: &str) -> std::result::Result<Vec<String>, String> {
    let parts: Vec<String> = text.split_whitespace().map(|p| p.trim_matches(|c| c == '[' || c == ']').to_string()).collect();
    if parts.is_empty() || parts.iter().any(String::is_empty) {
        return Err(format!("{word:?}: {key} is empty"));
    }
    Ok(parts)
}

/// Letters (`ü` as `ü`, `v` or `u:`, vowels possibly tone-marked), then at most one tone digit 1-5.
pub(crate) fn is_pinyin_syllable(syllable: &str) -> bool {
    let body = syllable.strip_suffix(['1', '2', '3', '4', '5']).unwrap_or(syllable);
    !body.is_empty() && body.chars().all(|c| c.is_alphabetic() || c == ':')
}

/// Pinyin initials, longest first.
const INITIALS: &[&str] = &["zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z", "c", "s", "y", "w"];

/// One pinyin syllable as CosyVoice3's tokens: its initial and its final with the tone marked
/// (`hang2` → `[h][áng]`, `lv4` → `[l][ǜ]`; a syllable already marked is split as written; tone
/// 5 or none: no mark).
pub fn pinyin_tokens(syllable: &str) -> String {
    let lower = syllable.to_lowercase().replace('v', "ü").replace("u:", "ü");
    let (body, tone) = match lower.chars().last().and_then(|c| c.to_digit(10)) {
        Some(t) => (&lower[..lower.len() - 1], t),
        None => (lower.as_str(), 5),
    };
    let initial = INITIALS.iter().find(|i| body.starts_with(**i) && body.len() > i.len()).copied().unwrap_or("");
    let fin = mark_tone(&body[initial.len()..], tone);
    if initial.is_empty() {
        format!("[{fin}]")
    } else {
        format!("[{initial}][{fin}]")
    }
}

/// The final with the tone mark on its vowel: `a` or `e` if there, the `o` of `ou`, else the last
/// vowel.
fn mark_tone(fin: &str, tone: u32) -> String {
    if !(1..=4).contains(&tone) {
        return fin.to_string();
    }
    let vowels = ['a', 'e', 'i', 'o', 'u', 'ü'];
    let chars: Vec<char> = fin.chars().collect();
    let at = chars
        .iter()
        .position(|&c| c == 'a' || c == 'e')
        .or_else(|| fin.find("ou").map(|_| chars.iter().position(|&c| c == 'o').unwrap_or(0)))
        .or_else(|| chars.iter().rposition(|c| vowels.contains(c)));
    let Some(at) = at else { return fin.to_string() };
    let marked = |c: char| -> char {
        let row = match c {
            'a' => ['ā', 'á', 'ǎ', 'à'],
            'e' => ['ē', 'é', 'ě', 'è'],
            'i' => ['ī', 'í', 'ǐ', 'ì'],
            'o' => ['ō', 'ó', 'ǒ', 'ò'],
            'u' => ['ū', 'ú', 'ǔ', 'ù'],
            'ü' => ['ǖ', 'ǘ', 'ǚ', 'ǜ'],
            other => return other,
        };
        row[tone as usize - 1]
    };
    chars.iter().enumerate().map(|(i, &c)| if i == at { marked(c) } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voice_lexicon_wins_over_the_global_one() {
        let global = Lexicon::parse("[words]\ncosy = \"cozy\"\nNew = \"knew\"\nUS = { say = \"us all\", case = \"exact\" }\n", "global.toml").unwrap();
        let voice = Lexicon::parse("[words]\nCOSY = \"koh-see\"\nus = \"you ess\"\n", "anna.lexicon.toml").unwrap();
        let both = voice.over(&global);
        assert_eq!(both.apply("Cosy New US us"), "koh-see knew you ess you ess");
        assert_eq!(Lexicon::default().over(&global), global);
        assert_eq!(voice.over(&Lexicon::default()), voice);
    }

    fn lexicon(toml: &str) -> Lexicon {
        Lexicon::parse(toml, "test.toml").expect("lexicon parses")
    }

    #[test]
    fn whole_words_only() {
        let l = lexicon("[words]\ncosy = \"cozy\"\n");
        assert_eq!(l.apply("cosy, cosy's and cosyness; notcosy cosy_x cosy2 cosy"), "cozy, cozy's and cosyness; notcosy cosy_x cosy2 cozy");
    }

    #[test]
    fn case_insensitive_unless_exact() {
        let l = lexicon("[words]\ncosy = \"cozy\"\nUS = { say = \"United States\", case = \"exact\" }\n");
        assert_eq!(l.apply("Cosy COSY cosy"), "cozy cozy cozy");
        assert_eq!(l.apply("US and us"), "United States and us");
    }

    #[test]
    fn longest_entry_first_and_one_pass() {
        let l = lexicon("[words]\nNew = \"old\"\n\"New York\" = \"NYC New\"\nold = \"ancient\"\n");
        assert_eq!(l.apply("New York is New"), "NYC New is old");
    }

    #[test]
    fn phonemes_become_tokens() {
        let l = lexicon("[words]\nNguyen = { cmu = \"W IH1 N\" }\n\"行\" = { pinyin = \"hang2\" }\n\"绿\" = { pinyin = \"lv4\" }\n");
        assert_eq!(l.apply("Mr Nguyen, 银行 绿"), "Mr [W][IH1][N], 银[h][áng] [l][ǜ]");
        assert_eq!(pinyin_tokens("jiu3"), "[j][iǔ]");
        assert_eq!(pinyin_tokens("gou3"), "[g][ǒu]");
        assert_eq!(pinyin_tokens("hui4"), "[h][uì]");
        assert_eq!(pinyin_tokens("ma"), "[m][a]");
        assert_eq!(pinyin_tokens("ai4"), "[ài]");
        assert_eq!(pinyin_tokens("háng"), "[h][áng]");
    }

    #[test]
    fn markup_is_not_matched() {
        let l = lexicon("[words]\nbreath = \"air\"\nstrong = \"mighty\"\n");
        assert_eq!(l.apply("[breath] a breath, <strong>strong</strong>"), "[breath] a air, <strong>mighty</strong>");
    }

    #[test]
    fn bad_files_name_the_line() {
        let err = |toml: &str| Lexicon::parse(toml, "l.toml").expect_err("refused").to_string();
        assert_eq!(err("[words]\na = \"b\"\nx = { cmuu = \"K\" }\n"), "config: lexicon l.toml line 3: \"x\": unknown field \"cmuu\" (allowed: say, cmu, pinyin, case)");
        assert_eq!(err("[words]\n\"\" = \"b\"\n"), "config: lexicon l.toml line 2: an entry's word is empty");
        assert!(err("[words]\na = \n").starts_with("config: lexicon l.toml line 2: "), "{}", err("[words]\na = \n"));
        assert!(err("[word]\na = \"b\"\n").starts_with("config: lexicon l.toml line 1: unknown field `word`"), "{}", err("[word]\na = \"b\"\n"));
        assert_eq!(err("[words]\na = { pinyin = \"ma9\" }\n"), "config: lexicon l.toml line 2: \"a\": pinyin \"ma9\": a syllable is letters, then a tone digit 1-5 or none");
        assert_eq!(err("[words]\na = { say = \"b\", cmu = \"K\" }\n"), "config: lexicon l.toml line 2: \"a\": give one of say, cmu, pinyin");
        assert_eq!(err("[words]\na = { case = \"odd\", say = \"b\" }\n"), "config: lexicon l.toml line 2: \"a\": case \"odd\": allowed: \"exact\", \"any\"");
    }
}
