//! Chapters of a Markdown book and of a plain-text book (the rules: docs/long-form.md, "Input").

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use super::Chapter;

/// No extension to go by: Markdown when a line starts with an ATX heading (`# Title`, up to six
/// `#`), which plain prose does not do.
pub(super) fn looks_like_markdown(text: &str) -> bool {
    text.lines().any(|line| {
        let hashes = line.bytes().take_while(|&b| b == b'#').count();
        (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') && !line[hashes..].trim().is_empty()
    })
}

/// A Markdown book's chapters: at the top heading level that occurs more than once (`#`, else
/// `##`), each titled by its heading; the text before the first is a chapter of its own when it
/// has any. With chapters at `##`, a single `#` before them is the book's title (and titles the
/// text before the first chapter); with no such level the whole text is one chapter, titled by a
/// single `#` or the file's stem. The chapters' text stays Markdown (the heading line left out).
pub(super) fn markdown_chapters(text: &str, stem: &str) -> (Option<String>, Vec<Chapter>) {
    struct Heading {
        level: HeadingLevel,
        start: usize,
        end: usize,
        title: String,
    }
    let mut headings: Vec<Heading> = Vec::new();
    let mut open: Option<Heading> = None;
    for (event, range) in Parser::new_ext(text, Options::empty()).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { level, .. }) => {
                open = Some(Heading { level, start: range.start, end: range.end, title: String::new() })
            }
            Event::End(TagEnd::Heading(_)) => headings.extend(open.take()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(heading) = open.as_mut() {
                    heading.title.push_str(&t);
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if let Some(heading) = open.as_mut() {
                    heading.title.push(' ');
                }
            }
            _ => {}
        }
    }
    let count = |level| headings.iter().filter(|h| h.level == level).count();
    let level = [HeadingLevel::H1, HeadingLevel::H2].into_iter().find(|&l| count(l) > 1);
    let single_h1 = (count(HeadingLevel::H1) == 1)
        .then(|| headings.iter().find(|h| h.level == HeadingLevel::H1))
        .flatten();
    let Some(level) = level else {
        // One chapter: the whole text, less a single `#` heading that titles it.
        let (title, body) = match single_h1 {
            Some(h) => (super::collapse_whitespace(&h.title), format!("{}{}", &text[..h.start], &text[h.end..])),
            None => (stem.to_owned(), text.to_owned()),
        };
        return (single_h1.map(|_| title.clone()), vec![Chapter { title, text: tidy_markdown(&body) }]);
    };
    let chapter_headings: Vec<&Heading> = headings.iter().filter(|h| h.level == level).collect();
    // With chapters at `##`, a `#` before the first is the book's title, not part of its text.
    let book_title = single_h1.filter(|h| level == HeadingLevel::H2 && h.start < chapter_headings[0].start);
    let mut chapters = Vec::with_capacity(chapter_headings.len() + 1);
    let lead_start = book_title.map_or(0, |h| h.end);
    let lead = book_title.map_or("", |h| &text[..h.start]).to_owned() + &text[lead_start..chapter_headings[0].start];
    let lead = tidy_markdown(&lead);
    if !lead.is_empty() {
        let title = book_title.map_or_else(|| stem.to_owned(), |h| super::collapse_whitespace(&h.title));
        chapters.push(Chapter { title, text: lead });
    }
    for (i, heading) in chapter_headings.iter().enumerate() {
        let end = chapter_headings.get(i + 1).map_or(text.len(), |next| next.start);
        chapters.push(Chapter {
            title: super::collapse_whitespace(&heading.title),
            text: tidy_markdown(&text[heading.end..end]),
        });
    }
    (book_title.map(|h| super::collapse_whitespace(&h.title)), chapters)
}

/// Markdown text with its ends trimmed and blank-line runs made one blank line (outside that, as
/// written: the Markdown layer reads it).
fn tidy_markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.trim().split('\n') {
        if line.trim().is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
        }
        blank_run = 0;
        out.push_str(line.trim_end());
    }
    out
}

/// Words that open a chapter title when a number follows ("Chapter 1", "CHAPTER IV.", "Part Two").
const NUMBERED: &[&str] = &["chapter", "part", "book", "volume", "section", "letter"];

/// Titles that stand alone ("Prologue", "EPILOGUE.").
const ALONE: &[&str] = &[
    "prologue", "epilogue", "preface", "introduction", "foreword", "afterword", "interlude",
    "appendix", "conclusion",
];

const NUMBER_WORDS: &[&str] = &[
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
    "twenty", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "last", "the",
];

/// Titles are short: a longer line is never one (and is not looked at further).
const MAX_TITLE_CHARS: usize = 80;
/// A title found by the blank-line rule alone (no chapter word) is shorter still.
const MAX_BARE_TITLE_CHARS: usize = 60;

/// A line that names a chapter by its words: "Chapter 1", "CHAPTER IV.", "Part Two: The Return",
/// "Prologue".
fn is_chapter_word_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or("").trim_end_matches(['.', ':']).to_lowercase();
    if ALONE.contains(&first.as_str()) {
        return true;
    }
    if !NUMBERED.contains(&first.as_str()) {
        return false;
    }
    let number = words.next().unwrap_or("").trim_end_matches(['.', ':', ',']).to_lowercase();
    !number.is_empty()
        && (number.bytes().all(|b| b.is_ascii_digit())
            || number.bytes().all(|b| b"ivxlcdm".contains(&b))
            || NUMBER_WORDS.contains(&number.as_str()))
}

/// A line that ends like a sentence or a clause: not a bare title.
fn ends_like_prose(line: &str) -> bool {
    let line = line.trim_end_matches(['"', '\'', '”', '’', ')', ']', '»']);
    line.ends_with(['.', ',', ';', ':', '!', '?', '…', '-', '—'])
}

/// A plain-text book's chapters, by the blank-line-and-title rule. A title is a line of at most 80
/// characters that is either
///
/// * a chapter word and its number ("Chapter 1", "CHAPTER IV.", "Part Two", or "Prologue" and the
///   like alone), at the start of the text or after a blank line, with a blank line (or the end)
///   after it, or one short subtitle line and then a blank line ("CHAPTER I." / "Down the
///   Rabbit-Hole": the title is "CHAPTER I. Down the Rabbit-Hole"); or
/// * any line of at most 60 characters with a letter, not ending like a sentence (`.`, `,`, `!`,
///   `?`, `:` …), with at least two blank lines before it and a blank line after it.
///
/// The text before the first title is a chapter of its own, titled by the file's stem, when it has
/// any; with no title found, the whole text is one chapter so titled. Chapter text: the lines as
/// written (trailing blanks trimmed), blank-line runs made one blank line.
pub(super) fn text_chapters(text: &str, stem: &str) -> Vec<Chapter> {
    let lines: Vec<&str> = text.split('\n').collect();
    let blank = |i: usize| lines.get(i).is_none_or(|l| l.trim().is_empty());
    let short = |line: &str, max: usize| line.len() <= 4 * max && line.trim().chars().count() <= max;
    let mut chapters: Vec<Chapter> = Vec::new();
    let mut title = stem.to_owned();
    let mut body_start = 0;
    let mut blank_before = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() {
            blank_before += 1;
            i += 1;
            continue;
        }
        let at_start = i == 0 || blank_before > 0;
        let mut heading_lines = 0;
        if at_start && short(line, MAX_TITLE_CHARS) && is_chapter_word_line(line) {
            if blank(i + 1) {
                heading_lines = 1;
            } else if short(lines[i + 1], MAX_TITLE_CHARS) && !ends_like_prose(lines[i + 1]) && blank(i + 2) {
                heading_lines = 2;
            }
        } else if i > 0
            && blank_before >= 2
            && short(line, MAX_BARE_TITLE_CHARS)
            && line.chars().any(char::is_alphabetic)
            && !ends_like_prose(line.trim())
            && blank(i + 1)
            && i + 1 < lines.len()
        {
            heading_lines = 1;
        }
        blank_before = 0;
        if heading_lines == 0 {
            i += 1;
            continue;
        }
        let body = tidy_text(&lines[body_start..i]);
        if !chapters.is_empty() || !body.is_empty() {
            chapters.push(Chapter { title, text: body });
        }
        title = super::collapse_whitespace(line);
        if heading_lines == 2 {
            let sep = if ends_like_prose(&title) { " " } else { ": " };
            title = format!("{title}{sep}{}", super::collapse_whitespace(lines[i + 1]));
        }
        i += heading_lines;
        body_start = i;
    }
    chapters.push(Chapter { title, text: tidy_text(&lines[body_start.min(lines.len())..]) });
    chapters
}

/// Lines trimmed, the lines of one paragraph joined (a text book's hard wrapping is not a sentence
/// end: a blank joins them, none after Chinese), blank-line runs made one blank line (a paragraph
/// end), the ends trimmed.
fn tidy_text(lines: &[&str]) -> String {
    let mut out = String::new();
    let mut blank_run = false;
    for line in lines {
        let line = line.trim_end();
        if line.trim().is_empty() {
            blank_run = !out.is_empty();
            continue;
        }
        if !out.is_empty() {
            let after_han = out.chars().last().is_some_and(|c| crate::frontend::text::contains_chinese(c.encode_utf8(&mut [0; 4])));
            out.push_str(if blank_run { "\n\n" } else if after_han { "" } else { " " });
        }
        blank_run = false;
        out.push_str(if out.is_empty() { line } else { line.trim_start() });
    }
    out
}
