//! Markdown and chat text read as a person would (issue 32), before the official frontend's
//! normalisation and sentence splitting: the one text layer of every front end, for whole text
//! ([`to_speech`], `Synthesizer::plan_text`) and for text that arrives in pieces
//! ([`MarkdownStream`], `app::text_stream` and text-in streaming's normalising option). What is
//! spoken for what is in docs/text.md; in short:
//!
//! * emphasis, strike-through and heading marks are dropped, their words kept; a link is read as
//!   its text, an image as its description; inline code is read as written;
//! * a heading, a list item, a table row, a paragraph and a code block end a sentence: when the
//!   text goes on after one that does not end in an end mark, `.` (`。` after Chinese) is added, so
//!   that the splitter cuts there (the last block is left alone: the splitter ends the text anyway);
//! * a bullet's mark is dropped, an ordered item's number is kept as written ("1. Hello");
//! * a fenced code block becomes a short stand-in ("rust code block"), nothing, or its text
//!   ([`CodeBlocks`]); an indented block is read as text (plain text is indented too);
//! * a bare URL, e-mail address or file path is read out ("example dot com slash docs",
//!   "jane dot doe at example dot com", "slash etc slash hosts"; a URL's scheme, query and
//!   fragment are not said), so that number normalisation does not see character salad;
//! * phone numbers (off by default) and units after a number ("5 km" → "5 kilometers") are read
//!   in sentences without Chinese (`frontend::readings`);
//! * emoji are dropped, said by name or kept ([`Symbols`]);
//! * HTML tags are removed, except CosyVoice3's own (`<strong>`, `</strong>`, `<laughter>`,
//!   `</laughter>`); its bracket tags (`[breath]`, `[AA1]`, `[ni3]` …) are text to Markdown and
//!   pass untouched.
//!
//! Each category has its switch in [`MarkdownSettings`] (`urls`, `phone`, `units`, `symbols`);
//! with `enabled` off the caller does not run this layer at all.
//!
//! Text without any of this is given back as written (whitespace at its ends aside), so plain
//! text reaches the model exactly as before. Later text layers (pauses, SSML, a lexicon) belong
//! beside this module, not in it.
//!
//! Streaming: the text is rendered one top-level block at a time (each parsed on its own, in whole
//! text and in pieces alike), and a block is cut off only once the parse of the text so far shows
//! the next one starting on a later line, which no later text can undo; inside a paragraph's first
//! line, a sentence is let through early only while nothing before it could be Markdown. So a
//! construct split across pieces (`**` in one, the rest in the next; a code fence open over many
//! pieces) reads as it does whole. A link reference definition applies only in its own block.

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

pub use crate::config::{CodeBlocks, MarkdownSettings, Symbols};

use crate::frontend::readings;
use crate::frontend::text::contains_chinese;

/// `text` read as a person would ([`MarkdownSettings`] say how; `enabled` is not looked at: the
/// caller decides whether this runs).
pub fn to_speech(text: &str, settings: MarkdownSettings) -> String {
    let mut stream = MarkdownStream::new(settings);
    let mut spoken = stream.push(text);
    spoken.push_str(&stream.finish());
    spoken
}

/// Marks that end a sentence already: nothing is added after them.
const END_MARKS: &[char] = &['.', '!', '?', ';', ':', ',', '。', '！', '？', '；', '：', '，', '、', '…'];

/// Chinese sentence ends: a sentence may go out early after one (no blank follows them).
const CJK_SENTENCE_ENDS: &[char] = &['。', '！', '？', '；'];

/// Characters that could make a line Markdown: a sentence before the first of them may go out
/// before its paragraph is complete.
const MAY_BE_MARKUP: &[char] = &['*', '_', '`', '[', ']', '<', '>', '~', '\\', '&', '|', '\n', '\r'];

/// CosyVoice3's own tags that look like HTML: kept (the tokenizer's special tokens).
const COSYVOICE_TAGS: &[&str] = &["<strong>", "</strong>", "<laughter>", "</laughter>"];

/// Text arriving in pieces, read as [`to_speech`] reads it whole: what [`Self::push`] and
/// [`Self::finish`] return, put together, is `to_speech` of all the pieces put together.
#[derive(Debug)]
pub struct MarkdownStream {
    /// Text not rendered yet: it starts at a top-level block (or inside the first line of a
    /// paragraph whose start went out early).
    pending: String,
    renderer: Renderer,
}

impl MarkdownStream {
    pub fn new(settings: MarkdownSettings) -> MarkdownStream {
        MarkdownStream { pending: String::new(), renderer: Renderer::new(settings) }
    }

    /// A piece arrived: the text it settles, read (often empty).
    pub fn push(&mut self, piece: &str) -> String {
        self.pending.push_str(piece);
        // A block ends only once a line does (parsing again only then keeps a long block's cost
        // down); a sentence at the start of a paragraph may end at any piece.
        if piece.contains(['\n', '\r']) {
            let mut from = 0;
            for cut in block_cuts(&self.pending) {
                self.renderer.render(&self.pending[from..cut]);
                from = cut;
            }
            self.pending.drain(..from);
        }
        if let Some(cut) = early_sentence_end(&self.pending) {
            let sentence: String = self.pending.drain(..cut).collect();
            self.renderer.plain_text(&sentence);
        }
        self.renderer.take()
    }

    /// The input is done: the rest, read.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        let mut from = 0;
        for cut in block_cuts(&rest).into_iter().chain([rest.len()]) {
            self.renderer.render(&rest[from..cut]);
            from = cut;
        }
        self.renderer.take()
    }
}

fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(text, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH)
}

/// The line starts (byte offsets > 0) at which a top-level block (or an item of a top-level list)
/// after the first begins: text before one is complete (later text cannot change how it parses).
fn block_cuts(text: &str) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut depth = 0usize;
    // The top-level block is a list: each of its items is a block of its own (read alike on
    // its own: an ordered item's number is taken as written), so a long list is read item by item.
    let mut in_list = false;
    for (event, range) in parser(text).into_offset_iter() {
        let starts_block = match event {
            Event::Start(tag) => {
                depth += 1;
                if depth == 1 {
                    in_list = matches!(tag, Tag::List(_));
                }
                depth == 1 || (depth == 2 && in_list && matches!(tag, Tag::Item))
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                false
            }
            Event::Rule => depth == 0,
            _ => false,
        };
        if !starts_block {
            continue;
        }
        // The cut is the start of the block's line, so that its indentation parses as whole.
        let line_start = text[..range.start].rfind(['\n', '\r']).map_or(0, |i| i + 1);
        let cut = if text[line_start..range.start].trim().is_empty() { line_start } else { range.start };
        // Only once the block's first line is complete: how a line reads (a table row, a new
        // block, a paragraph's continuation) can change while it is still arriving.
        let line_complete = text[range.start..].contains(['\n', '\r']);
        if cut > 0 && line_complete && cuts.last().is_none_or(|&last| cut > last) {
            cuts.push(cut);
        }
    }
    cuts
}

/// Where a sentence at the start of `pending` (the first line of a paragraph) may go out early:
/// after a sentence end and the blank after it, when nothing before could be Markdown and the
/// text goes on with a letter (so the rest is still a paragraph's text when parsed on its own).
fn early_sentence_end(pending: &str) -> Option<usize> {
    if !pending.chars().next().is_some_and(char::is_alphabetic) {
        return None;
    }
    let line = &pending[..pending.find(MAY_BE_MARKUP).unwrap_or(pending.len())];
    let mut cut = None;
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let mut end = i + c.len_utf8();
        match c {
            c if CJK_SENTENCE_ENDS.contains(&c) => {}
            '.' | '!' | '?' | ';' if chars.peek().is_some_and(|(_, n)| n.is_whitespace()) => {
                while let Some((j, n)) = chars.peek().copied().filter(|(_, n)| n.is_whitespace()) {
                    end = j + n.len_utf8();
                    chars.next();
                }
            }
            _ => continue,
        }
        if line[end..].chars().next().is_some_and(char::is_alphabetic) {
            cut = Some(end);
        }
    }
    cut
}

/// The reading of a text, block by block: what has been said so far and what is owed to the next
/// words (an end mark, the blank between).
#[derive(Debug)]
struct Renderer {
    settings: MarkdownSettings,
    /// Read text not taken yet; it never ends in white space (that is held back).
    out: String,
    /// White space after the last words, said only if more words come.
    held: String,
    /// The blank (or line breaks) between the last words and the next.
    gap: String,
    /// The sentence before ended without an end mark: this one is owed before the next words.
    mark_due: Option<char>,
    /// The last character said.
    last: Option<char>,
    /// Words since the last sentence end.
    in_unit: bool,
    /// A table cell ended: the next cell's words are joined with a comma.
    cell_ended: bool,
    /// An ordered item's number, said before its words.
    marker: Option<String>,
    /// Chinese was said: stand-ins are Chinese.
    chinese: bool,
    /// Text events not read yet (Markdown's parser cuts text at characters that may be markup).
    run: String,
    run_end: usize,
}

impl Renderer {
    fn new(settings: MarkdownSettings) -> Renderer {
        Renderer {
            settings,
            out: String::new(),
            held: String::new(),
            gap: String::new(),
            mark_due: None,
            last: None,
            in_unit: false,
            cell_ended: false,
            marker: None,
            chinese: false,
            run: String::new(),
            run_end: 0,
        }
    }

    fn take(&mut self) -> String {
        std::mem::take(&mut self.out)
    }

    /// Words to say, after what is owed.
    fn say(&mut self, words: &str) {
        if words.trim().is_empty() {
            self.held.push_str(&std::mem::take(&mut self.gap));
            self.held.push_str(words);
            return;
        }
        if let Some(mark) = self.mark_due.take() {
            self.out.push(mark);
        }
        if std::mem::take(&mut self.cell_ended) {
            self.held.clear();
            self.gap.clear();
            self.out.push_str(", ");
        }
        self.out.push_str(&std::mem::take(&mut self.held));
        self.out.push_str(&std::mem::take(&mut self.gap));
        if let Some(marker) = self.marker.take() {
            self.out.push_str(&marker);
        }
        let body = words.trim_end();
        self.out.push_str(body);
        self.held = words[body.len()..].to_string();
        self.last = body.chars().last();
        self.chinese |= contains_chinese(body);
        self.in_unit = true;
    }

    /// Source text between what is read: kept when blank, else only its line breaks.
    fn skip(&mut self, source: &str) {
        if source.chars().all(char::is_whitespace) {
            self.gap.push_str(source);
        } else {
            self.gap.extend(source.chars().filter(|c| matches!(c, '\n' | '\r')));
        }
    }

    fn flush_run(&mut self) {
        if !self.run.is_empty() {
            let run = std::mem::take(&mut self.run);
            let spoken = speak_text(&run, self.settings);
            self.say(&spoken);
        }
    }

    /// A sentence ends here (a block starts or ends).
    fn end_unit(&mut self) {
        self.flush_run();
        if std::mem::take(&mut self.in_unit) {
            self.mark_due = match self.last {
                Some(c) if END_MARKS.contains(&c) => None,
                Some(c) if contains_chinese(&c.to_string()) => Some('。'),
                _ => Some('.'),
            };
        }
        self.cell_ended = false;
        self.marker = None;
    }

    /// Plain text (no Markdown could be in it: [`early_sentence_end`]). Its paragraph goes on
    /// with a letter, so the blank at its end is said as it is: it goes out now.
    fn plain_text(&mut self, text: &str) {
        let spoken = speak_text(text, self.settings);
        self.say(&spoken);
        self.out.push_str(&std::mem::take(&mut self.held));
    }

    /// One top-level block (or the rest of a paragraph whose start went out early). `prev` is
    /// where the last words read end: what lies between them and the next is markup or blank.
    // long: one pass over a block's parser events, each arm small; to split into "which block
    // ends here" and "emit its text" next.
    fn render(&mut self, doc: &str) {
        if doc.is_empty() {
            return;
        }
        // A block follows: what the last one owes goes out now (a sentence buffer behind sees
        // its end without waiting for the next words).
        if let Some(mark) = self.mark_due.take() {
            self.out.push(mark);
        }
        self.out.push_str(&std::mem::take(&mut self.held));
        self.out.push_str(&std::mem::take(&mut self.gap));
        let mut prev = 0usize;
        let mut code: Option<(bool, String, String)> = None;
        let mut ordered: Vec<bool> = Vec::new();
        self.run_end = usize::MAX;
        for (event, range) in parser(doc).into_offset_iter() {
            let before = &doc[prev.min(range.start)..range.start];
            match event {
                Event::Text(t) => {
                    if let Some((_, _, body)) = code.as_mut() {
                        body.push_str(&t);
                    } else {
                        if range.start != self.run_end {
                            self.flush_run();
                            self.skip(before);
                        }
                        self.run.push_str(&t);
                        self.run_end = range.end;
                    }
                    prev = range.end;
                }
                Event::Code(t) => {
                    self.flush_run();
                    self.skip(before);
                    self.say(&t);
                    prev = range.end;
                }
                Event::InlineHtml(h) | Event::Html(h) => {
                    self.flush_run();
                    self.skip(before);
                    let spoken = speak_html(&h, self.settings);
                    self.say(&spoken);
                    prev = range.end;
                }
                Event::SoftBreak | Event::HardBreak => {
                    self.flush_run();
                    self.skip(before);
                    let source = &doc[range.clone()];
                    self.skip(if source.chars().all(char::is_whitespace) { source } else { "\n" });
                    prev = range.end;
                }
                Event::Rule => self.end_unit(),
                Event::Start(tag) => match tag {
                    Tag::CodeBlock(kind) => {
                        self.end_unit();
                        let (fenced, info) = match kind {
                            CodeBlockKind::Fenced(info) => (true, info.split_whitespace().next().unwrap_or("").to_string()),
                            CodeBlockKind::Indented => (false, String::new()),
                        };
                        // The blank before the block goes before what stands for it.
                        self.skip(before);
                        prev = range.start;
                        code = Some((fenced, info, String::new()));
                    }
                    Tag::List(first) => {
                        self.end_unit();
                        ordered.push(first.is_some());
                    }
                    Tag::Item => {
                        self.end_unit();
                        if ordered.last() == Some(&true) {
                            self.marker = Some(item_number(&doc[range.start..]));
                        }
                    }
                    // Inline marks: their words are read, the marks are not.
                    Tag::Emphasis | Tag::Strong | Tag::Strikethrough | Tag::Link { .. } | Tag::Image { .. } | Tag::TableCell => {}
                    _ => self.end_unit(),
                },
                Event::End(tag) => match tag {
                    TagEnd::CodeBlock => {
                        self.flush_run();
                        if let Some((fenced, info, body)) = code.take() {
                            self.code_block(fenced, &info, &body);
                        }
                        self.end_unit();
                    }
                    TagEnd::List(_) => {
                        ordered.pop();
                        self.end_unit();
                    }
                    TagEnd::TableCell => {
                        self.flush_run();
                        self.cell_ended = self.in_unit;
                    }
                    TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough | TagEnd::Link | TagEnd::Image => {}
                    _ => self.end_unit(),
                },
                _ => {}
            }
        }
        self.flush_run();
        self.run_end = usize::MAX;
        self.skip(&doc[prev.min(doc.len())..]);
    }

    fn code_block(&mut self, fenced: bool, info: &str, body: &str) {
        let settings = self.settings.code_blocks;
        match (fenced, settings) {
            (true, CodeBlocks::Skip) => {}
            (true, CodeBlocks::StandIn) => {
                let what = if self.chinese { "代码块" } else { "code block" };
                let language: String = info.chars().filter(|c| c.is_alphanumeric() || *c == '+' || *c == '#').collect();
                let stand_in = if language.is_empty() { what.to_string() } else { format!("{language} {what}") };
                self.say(&stand_in);
            }
            _ => self.say(body.trim_end()),
        }
    }
}

/// An ordered item's number as written, with its `.` or `)` and one blank: "1. ".
fn item_number(source: &str) -> String {
    let digits = source.len() - source.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let end = (digits + 1).min(source.len());
    format!("{} ", &source[..end])
}

/// HTML read: its text, without tags and comments, except CosyVoice3's own tags (kept as
/// written).
fn speak_html(html: &str, settings: MarkdownSettings) -> String {
    let mut spoken = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        spoken.push_str(&speak_text(&rest[..open], settings));
        let tag = &rest[open..];
        let close = if tag.starts_with("<!--") { tag.find("-->").map(|i| i + 3) } else { tag.find('>').map(|i| i + 1) };
        let Some(close) = close else {
            // Not a tag after all: "<" as written.
            rest = tag;
            break;
        };
        if COSYVOICE_TAGS.iter().any(|t| tag[..close].eq_ignore_ascii_case(t)) {
            spoken.push_str(&tag[..close]);
        }
        rest = &tag[close..];
    }
    spoken.push_str(&speak_text(rest, settings));
    spoken
}

/// Plain text read: phone numbers and units read ([`readings::read`]), URLs, e-mail addresses
/// and paths read out, emoji dropped (or kept), as `settings` say. Works word by word (white space
/// as written; phone numbers and units sentence by sentence), so text cut at a blank reads as it
/// does whole.
pub fn speak_text(text: &str, settings: MarkdownSettings) -> String {
    let text = readings::read(text, settings.phone, settings.units);
    let text = text.as_ref();
    let mut out = String::with_capacity(text.len());
    // The blank before the word being read, and whether blanks are dropped (after a word that
    // was only emoji, at the start).
    let mut blank = String::new();
    let mut word = String::new();
    let mut drop_blank = false;
    let flush = |out: &mut String, blank: &mut String, word: &mut String, drop_blank: &mut bool| {
        let spoken = speak_word(word, settings.symbols, settings.urls);
        if spoken.is_empty() {
            // A word that was only emoji goes with the blank before it (or, first, after it).
            *drop_blank = out.is_empty();
            if !*drop_blank {
                blank.clear();
            }
            word.clear();
            return;
        } else {
            // An emoji before punctuation goes with the blank before it: "Done 👍!" → "Done!".
            let glued = spoken.len() < word.len() && spoken.starts_with(|c: char| c.is_ascii_punctuation());
            if !glued {
                out.push_str(blank);
            }
            out.push_str(&spoken);
            *drop_blank = false;
        }
        blank.clear();
        word.clear();
    };
    for c in text.chars() {
        if CJK_SENTENCE_ENDS.contains(&c) {
            // Chinese has no blanks: its sentence ends part words too (a sentence may go out
            // early after one, so the words must not run across it).
            if !word.is_empty() {
                flush(&mut out, &mut blank, &mut word, &mut drop_blank);
            }
            out.push_str(&std::mem::take(&mut blank));
            out.push(c);
            drop_blank = false;
        } else if c.is_whitespace() {
            if !word.is_empty() {
                flush(&mut out, &mut blank, &mut word, &mut drop_blank);
            }
            if !drop_blank {
                blank.push(c);
            }
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        flush(&mut out, &mut blank, &mut word, &mut drop_blank);
    }
    out.push_str(&blank);
    out
}

/// One word (no white space) read: its emoji as `symbols` say, and read out if it is an address
/// and `urls` is on.
fn speak_word(word: &str, symbols: Symbols, urls: bool) -> String {
    let word = match symbols {
        Symbols::Drop => word.chars().filter(|&c| !is_emoji(c)).collect(),
        Symbols::Name => name_emoji(word),
        Symbols::Keep => word.to_string(),
    };
    // Punctuation around the word is not part of an address: "(see example.com)."
    let core_start = word.find(|c: char| c.is_alphanumeric() || matches!(c, '/' | '~' | '.')).unwrap_or(word.len());
    let core_end = word.rfind(|c: char| c.is_alphanumeric() || c == '/').map_or(core_start, |i| i + word[i..].chars().next().map_or(1, char::len_utf8));
    if core_start >= core_end || !urls {
        return word;
    }
    let (lead, core, tail) = (&word[..core_start], &word[core_start..core_end], &word[core_end..]);
    let read = match url_address(core) {
        Some(address) => spell_address(address),
        None if is_email(core) || is_path(core) => spell_address(core),
        None => return word,
    };
    format!("{lead}{read}{tail}")
}

/// Top-level domains a bare "name.tld" is taken as an address for (others stay as written:
/// "Node.js", "config.toml").
const DOMAINS: &[&str] = &[
    "com", "org", "net", "io", "dev", "ai", "app", "rs", "co", "uk", "de", "fr", "cn", "jp", "edu", "gov", "info", "me", "tv", "us", "ca", "au",
    "ru", "nl", "eu", "ch", "se", "no", "es", "it", "gg", "xyz", "cc", "hk", "tw", "kr", "in", "br",
];

/// The address of a URL word to read (scheme, query and fragment dropped), if it is one.
fn url_address(word: &str) -> Option<&str> {
    let lower = word.to_ascii_lowercase();
    let scheme = ["https://", "http://", "ftp://"].iter().find(|s| lower.starts_with(*s)).map_or(0, |s| s.len());
    let rest = &word[scheme..];
    let rest = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    let rest = rest.trim_end_matches('/');
    let host = &rest[..rest.find('/').unwrap_or(rest.len())];
    let labels: Vec<&str> = host.split('.').collect();
    let host_ok = labels.len() >= 2
        && labels.iter().all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        && !host.chars().all(|c| c.is_ascii_digit() || c == '.');
    // A host that is no domain name still is one after a scheme ("http://localhost:8080").
    let with_scheme = scheme > 0 && !host.is_empty();
    if !host_ok && !with_scheme {
        return None;
    }
    let tld = labels.last().map(|l| l.to_ascii_lowercase()).unwrap_or_default();
    let known = scheme > 0 || lower.starts_with("www.") || DOMAINS.contains(&tld.as_str());
    known.then_some(rest)
}

fn is_email(word: &str) -> bool {
    let Some((local, domain)) = word.split_once('@') else { return false };
    !local.is_empty()
        && local.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
        && domain.contains('.')
        && domain.split('.').all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
}

fn is_path(word: &str) -> bool {
    let body = ["~/", "./", "../", "/"].iter().find(|p| word.starts_with(*p)).map(|p| &word[p.len()..]);
    body.is_some_and(|b| {
        b.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
            && !b.contains("//")
            && b.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '~'))
    })
}

/// An address read out: its marks as words ("docs dot rs slash ort").
fn spell_address(address: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    for c in address.chars() {
        let said = match c {
            '.' => "dot",
            '/' => "slash",
            '@' => "at",
            '_' => "underscore",
            '-' => "dash",
            ':' => "colon",
            '~' => "tilde",
            '+' => "plus",
            c if c.is_alphanumeric() => {
                word.push(c);
                continue;
            }
            _ => "",
        };
        if !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        if !said.is_empty() {
            words.push(said.to_string());
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words.join(" ")
}

/// A word with its emoji said by name, each set apart by blanks ("Wow😀!" → "Wow grinning face !"
/// becomes "Wow grinning face!" once glued back): the longest known sequence at each emoji
/// (joined families, flags, keycaps), skin tones left out of the name; an emoji without a name is
/// dropped.
fn name_emoji(word: &str) -> String {
    if !word.chars().any(is_emoji) {
        return word.to_string();
    }
    let chars: Vec<char> = word.chars().collect();
    let mut out = String::with_capacity(word.len() * 4);
    let mut i = 0;
    while i < chars.len() {
        if !is_emoji(chars[i]) {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        // The longest sequence from here that is an emoji (at most 10 code points: families).
        let longest = (1..=(chars.len() - i).min(10)).rev().find_map(|n| {
            let sequence: String = chars[i..i + n].iter().filter(|c| !is_skin_tone(**c)).collect();
            emojis::get(&sequence).map(|e| (n, e.name()))
        });
        match longest {
            Some((n, name)) => {
                if !out.is_empty() && !out.ends_with(' ') {
                    out.push(' ');
                }
                out.push_str(name);
                i += n;
                if chars.get(i).is_some_and(|c| c.is_alphanumeric()) {
                    out.push(' ');
                }
            }
            None => i += 1,
        }
    }
    out
}

fn is_skin_tone(c: char) -> bool {
    ('\u{1F3FB}'..='\u{1F3FF}').contains(&c)
}

/// Emoji and the pictographs around them (with their joiners, variation selectors and keycaps).
fn is_emoji(c: char) -> bool {
    matches!(c,
        '\u{1F000}'..='\u{1FAFF}'
        | '\u{2600}'..='\u{27BF}'
        | '\u{2B00}'..='\u{2BFF}'
        | '\u{2300}'..='\u{23FF}'
        | '\u{FE0E}' | '\u{FE0F}' | '\u{200D}' | '\u{20E3}'
        | '\u{E0020}'..='\u{E007F}')
}

#[cfg(test)]
mod tests;
