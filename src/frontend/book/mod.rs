//! Books read into chapters (issue 33, point 1): plain text, Markdown and EPUB 2/3, told apart by
//! their content (and the extension only where content cannot tell), each cut into chapters with
//! titles. Pure: no synthesis, nothing written. The rules, what is left out and the errors are in
//! docs/long-form.md ("Input"); in short:
//!
//! * EPUB ([`epub`]): META-INF/container.xml → the package document → spine order; chapter titles
//!   from the table of contents (EPUB 3 `nav`, EPUB 2 NCX); title, author and language from the
//!   package metadata; chapter text from the XHTML ([`xhtml`]) without images, note markers, notes
//!   and page numbers. Zip entries are read with bounds ([`BookLimits`]).
//! * Markdown ([`plain::markdown_chapters`]): chapters at the top heading level that occurs more
//!   than once (`#` or `##`); the chapter's text stays Markdown, for the Markdown layer
//!   (`frontend::markdown`) that reads every text later.
//! * Plain text ([`plain::text_chapters`]): a blank-line-and-title rule; no title found → one
//!   chapter titled by the file name.
//!
//! Every chapter's text is what to speak, its title not included: blocks (paragraphs, headings,
//! list items) separated by a blank line, so that each ends a sentence. A chapter with no text is
//! left out and named in [`Book::warnings`]; a book with no text at all is an error. Every refusal
//! is one [`Error::Input`] line ([`InputCode::InvalidBook`]) that names the file and the fix.

mod epub;
mod plain;
mod xhtml;

use std::io::Read;
use std::path::Path;

use crate::error::{Error, InputCode, Result};

/// A book: its metadata where the file has it, and its chapters in reading order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Book {
    pub title: Option<String>,
    pub author: Option<String>,
    /// The language as the book gives it (a BCP 47 tag such as `en` or `en-GB`).
    pub language: Option<String>,
    pub format: BookFormat,
    /// Never empty, and no chapter's text is empty.
    pub chapters: Vec<Chapter>,
    /// What was left out and why (an empty chapter), one line each, naming the file.
    pub warnings: Vec<String>,
}

/// One chapter: its title, and the text to speak (the title not included; blocks separated by a
/// blank line). A Markdown book's chapter text is Markdown; the others' is plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chapter {
    pub title: String,
    pub text: String,
}

/// What kind of file a book was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookFormat {
    Epub,
    Markdown,
    Text,
}

/// How much a book may make cosy read: the file itself, and inside an EPUB (a zip) each entry
/// unpacked and all entries together, so that a zip bomb is refused before it fills memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookLimits {
    /// The file's size in bytes.
    pub max_file_bytes: u64,
    /// One zip entry's unpacked size in bytes.
    pub max_entry_bytes: u64,
    /// All zip entries read, unpacked, together.
    pub max_total_bytes: u64,
    /// Entries in the zip.
    pub max_entries: usize,
}

impl Default for BookLimits {
    fn default() -> Self {
        BookLimits {
            max_file_bytes: 256 << 20,
            max_entry_bytes: 64 << 20,
            max_total_bytes: 512 << 20,
            max_entries: 20_000,
        }
    }
}

/// Reads the book at `path` (see the module's rules).
pub fn read_book(path: &Path, limits: &BookLimits) -> Result<Book> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if size > limits.max_file_bytes {
        return Err(too_large(&name, size, limits.max_file_bytes));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // A file that grows while it is read is still held to the limit.
    file.take(limits.max_file_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(too_large(&name, bytes.len() as u64, limits.max_file_bytes));
    }
    parse_book(&bytes, &name, limits)
}

/// Reads a book from its bytes. `name` is the file's name as messages show it; its extension
/// helps only where the content cannot tell (Markdown or plain text), and its stem titles a text
/// with no chapter titles.
pub fn parse_book(bytes: &[u8], name: &str, limits: &BookLimits) -> Result<Book> {
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(too_large(name, bytes.len() as u64, limits.max_file_bytes));
    }
    let extension = Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        return epub::read(bytes, name, limits);
    }
    if extension == "epub" {
        return Err(book_error(
            name,
            "is not an EPUB: it is not a zip archive (damaged, or not an EPUB); export or download the book again",
        ));
    }
    let text = decode_text(bytes, name)?;
    let stem = Path::new(name).file_stem().and_then(|s| s.to_str()).unwrap_or(name);
    let markdown = match extension.as_str() {
        "md" | "markdown" | "mdown" | "mkd" => true,
        "txt" | "text" => false,
        _ => plain::looks_like_markdown(&text),
    };
    let (format, title, chapters) = if markdown {
        let (title, chapters) = plain::markdown_chapters(&text, stem);
        (BookFormat::Markdown, title, chapters)
    } else {
        (BookFormat::Text, None, plain::text_chapters(&text, stem))
    };
    let mut warnings = Vec::new();
    let chapters = keep_spoken(chapters, name, &mut warnings)?;
    Ok(Book { title, author: None, language: None, format, chapters, warnings })
}

/// The chapters with text; the others are named in `warnings`. No chapter with text at all is an
/// error.
fn keep_spoken(chapters: Vec<Chapter>, name: &str, warnings: &mut Vec<String>) -> Result<Vec<Chapter>> {
    let mut kept = Vec::with_capacity(chapters.len());
    for (index, chapter) in chapters.into_iter().enumerate() {
        if chapter.text.trim().is_empty() {
            warnings.push(format!(
                "{name}: chapter {} \"{}\" has no text to read: left out",
                index + 1,
                chapter.title
            ));
        } else {
            kept.push(chapter);
        }
    }
    if kept.is_empty() {
        return Err(book_error(name, "has no text to read in any chapter; give a book with text"));
    }
    Ok(kept)
}

/// The text of a Markdown or plain-text book: UTF-8 (a byte-order mark dropped), line endings made
/// `\n`. A binary file and text in another encoding are refused, each with its fix.
fn decode_text(bytes: &[u8], name: &str) -> Result<String> {
    const FORMATS: &str = "cosy reads books in plain text, Markdown or EPUB";
    if bytes.starts_with(b"%PDF") {
        return Err(book_error(name, format!("is a PDF, not text; {FORMATS}: convert it first")));
    }
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Err(book_error(name, "is UTF-16 text; save it as UTF-8"));
    }
    if looks_binary(bytes) {
        return Err(book_error(name, format!("is a binary file, not text; {FORMATS}")));
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let at = e.valid_up_to();
            let line = 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
            return Err(book_error(
                name,
                format!("is not valid UTF-8 (byte {at}, line {line}); save it as UTF-8 text"),
            ));
        }
    };
    Ok(normalise_line_ends(text))
}

/// A NUL byte, or more than one byte in a hundred a control character that text does not use,
/// in the first 64 KiB: a binary file, whatever its extension.
fn looks_binary(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(64 << 10)];
    if head.contains(&0) {
        return true;
    }
    let controls = head
        .iter()
        .filter(|&&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0C) || b == 0x7F)
        .count();
    controls * 100 > head.len()
}

/// CRLF and CR line ends as `\n`, in one pass.
fn normalise_line_ends(text: &str) -> String {
    if !text.contains('\r') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' {
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    out
}

/// A refusal about the book `name`: one line, the file first.
fn book_error(name: &str, what: impl std::fmt::Display) -> Error {
    Error::input(InputCode::InvalidBook, None, format!("{name} {what}"))
}

fn too_large(name: &str, size: u64, limit: u64) -> Error {
    book_error(name, format!("is {size} bytes, more than the {limit} a book may have; split it into parts"))
}

/// Whitespace runs (no-break spaces and line ends included) as one space, the ends trimmed.
fn collapse_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

#[cfg(test)]
mod tests;
