//! The rules of each kind of book on small inputs; whole books (EPUB files written by the test)
//! are in tests/frontend/book.rs.

use std::collections::HashSet;

use super::xhtml::{parts, Dom};
use super::*;

fn read(text: &str, name: &str) -> Result<Book> {
    parse_book(text.as_bytes(), name, &BookLimits::default())
}

fn titles(book: &Book) -> Vec<&str> {
    book.chapters.iter().map(|c| c.title.as_str()).collect()
}

fn message(e: Error) -> String {
    match e {
        Error::Input { code: InputCode::InvalidBook, message, .. } => message,
        other => panic!("not a book error: {other:?}"),
    }
}

fn blocks(markup: &str) -> Vec<String> {
    let mut all = parts(&Dom::parse(markup), &HashSet::new());
    assert_eq!(all.len(), 1);
    all.remove(0).blocks
}

#[test]
fn xhtml_blocks_leave_out_notes_pages_and_images() {
    let markup = r##"<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops">
<head><title>Ignored</title><style>p { color: red }</style></head>
<body>
  <h1>Chapter&nbsp;I</h1>
  <p>Alice was beginning&mdash;very tired<sup><a href="notes.xhtml#n1">1</a></sup> of sitting.<a epub:type="noteref" href="#n2">*</a></p>
  <span epub:type="pagebreak" id="p12" title="12"/>
  <p>She peeped <img src="x.png" alt="a picture"/>into the book<span role="doc-pagebreak">13</span> her sister was reading.</p>
  <aside epub:type="footnote" id="n2"><p>A note.</p></aside>
  <p>Down,<br/>down,<br/>down.</p>
</body></html>"##;
    assert_eq!(
        blocks(markup),
        [
            "Chapter I",
            "Alice was beginning—very tired of sitting.",
            "She peeped into the book her sister was reading.",
            "Down,",
            "down,",
            "down."
        ]
    );
}

#[test]
fn tag_soup_is_read_as_html() {
    // Not XML: unclosed <p> and <br>, an unquoted attribute.
    let markup = "<html><body><h2 class=x>One</h2><p>First &amp; best<p>Second&nbsp;line<br>third</body></html>";
    assert_eq!(blocks(markup), ["One", "First & best", "Second line", "third"]);
}

#[test]
fn anchors_cut_a_document_into_parts() {
    let markup = r#"<html xmlns="http://www.w3.org/1999/xhtml"><body>
        <p>Before.</p><h2 id="c1">One</h2><p>Text one.</p><div id="c2"><h2>Two</h2><p>Text two.</p></div></body></html>"#;
    let anchors: HashSet<&str> = ["c1", "c2"].into_iter().collect();
    let all = parts(&Dom::parse(markup), &anchors);
    let summary: Vec<(Option<&str>, Vec<&str>)> =
        all.iter().map(|p| (p.anchor.as_deref(), p.blocks.iter().map(String::as_str).collect())).collect();
    assert_eq!(
        summary,
        [
            (None, vec!["Before."]),
            (Some("c1"), vec!["One", "Text one."]),
            (Some("c2"), vec!["Two", "Text two."])
        ]
    );
    assert_eq!(all[2].first_heading.as_deref(), Some("Two"));
}

#[test]
fn markdown_chapters_are_the_repeated_top_level() {
    let text = "Some words first.\n\n# One\n\nText *one*.\n\n## A section\n\nMore.\n\n# Two\n\n```\n# not a heading\n```\n";
    let book = read(text, "notes.md").unwrap();
    assert_eq!(book.format, BookFormat::Markdown);
    assert_eq!(titles(&book), ["notes", "One", "Two"]);
    assert_eq!(book.chapters[0].text, "Some words first.");
    assert_eq!(book.chapters[1].text, "Text *one*.\n\n## A section\n\nMore.");
    assert_eq!(book.chapters[2].text, "```\n# not a heading\n```");

    // A single `#` over `##` chapters is the book's title; nothing before the first chapter.
    let book = read("# The Book\n\n## First\n\nA.\n\n## Second\n\nB.\n", "book.markdown").unwrap();
    assert_eq!(book.title.as_deref(), Some("The Book"));
    assert_eq!(titles(&book), ["First", "Second"]);
    assert_eq!(book.chapters[1].text, "B.");

    // No repeated level: one chapter.
    let book = read("# Only\n\nJust this.\n", "x.md").unwrap();
    assert_eq!(titles(&book), ["Only"]);
    assert_eq!(book.chapters[0].text, "Just this.");
}

#[test]
fn markdown_is_told_by_content_without_an_extension() {
    assert_eq!(read("# A\n\nx\n\n# B\n\ny\n", "book").unwrap().format, BookFormat::Markdown);
    assert_eq!(read("# A\n\nx\n", "book.txt").unwrap().format, BookFormat::Text);
    assert_eq!(read("#hashtag and prose.\n", "book").unwrap().format, BookFormat::Text);
}

#[test]
fn text_chapters_by_title_lines() {
    let text = "Alice's Adventures in Wonderland\r\nby Lewis Carroll\r\n\r\n\r\nCHAPTER I.\r\nDown the Rabbit-Hole\r\n\r\nAlice was beginning\r\nto get very tired.\r\n\r\n\r\nSo she was considering.\r\n\r\nChapter Two\r\n\r\nCurious.\r\n\r\n\r\n\r\nThe Last Part\r\n\r\nThe end.";
    let book = read(text, "alice.txt").unwrap();
    assert_eq!(book.format, BookFormat::Text);
    assert_eq!(titles(&book), ["alice", "CHAPTER I. Down the Rabbit-Hole", "Chapter Two", "The Last Part"]);
    // A paragraph's hard-wrapped lines are joined: a line end is not a sentence end.
    assert_eq!(book.chapters[0].text, "Alice's Adventures in Wonderland by Lewis Carroll");
    assert_eq!(book.chapters[1].text, "Alice was beginning to get very tired.\n\nSo she was considering.");
    assert_eq!(book.chapters[3].text, "The end.");
}

#[test]
fn text_without_titles_is_one_chapter_named_by_the_file() {
    let text = "Just a letter.\r\rWith old Mac line ends, and a short line\r\rthat ends.";
    let book = read(text, "/tmp/letter.txt").unwrap();
    assert_eq!(titles(&book), ["letter"]);
    assert_eq!(book.chapters[0].text, "Just a letter.\n\nWith old Mac line ends, and a short line\n\nthat ends.");
}

#[test]
fn empty_chapters_are_left_out_and_named() {
    let book = read("# One\n\n# Two\n\nText.\n", "b.md").unwrap();
    assert_eq!(titles(&book), ["Two"]);
    assert_eq!(book.warnings, ["b.md: chapter 1 \"One\" has no text to read: left out"]);
    let e = message(read("# One\n\n# Two\n", "b.md").unwrap_err());
    assert_eq!(e, "b.md has no text to read in any chapter; give a book with text");
    assert!(message(read("", "empty.txt").unwrap_err()).contains("has no text"));
}

#[test]
fn binary_and_non_utf8_files_are_refused() {
    let limits = BookLimits::default();
    let e = message(parse_book(b"\x7fELF\x02\x01\x01\0\0\0", "cosy", &limits).unwrap_err());
    assert_eq!(e, "cosy is a binary file, not text; cosy reads books in plain text, Markdown or EPUB");
    let e = message(parse_book(b"caf\xe9\nna\xefve", "latin1.txt", &limits).unwrap_err());
    assert_eq!(e, "latin1.txt is not valid UTF-8 (byte 3, line 1); save it as UTF-8 text");
    let e = message(parse_book(b"\xff\xfeh\0i\0", "wide.txt", &limits).unwrap_err());
    assert!(e.contains("UTF-16"), "{e}");
    let e = message(parse_book(b"%PDF-1.7\n", "book.pdf", &limits).unwrap_err());
    assert!(e.starts_with("book.pdf is a PDF"), "{e}");
    let e = message(parse_book(b"just text", "book.epub", &limits).unwrap_err());
    assert!(e.starts_with("book.epub is not an EPUB: it is not a zip archive"), "{e}");
    let small = BookLimits { max_file_bytes: 4, ..limits };
    assert!(message(parse_book(b"hello", "big.txt", &small).unwrap_err()).contains("more than the 4"));
}

#[test]
fn a_ten_megabyte_line_reads() {
    let line = "word ".repeat(2 << 20);
    for name in ["long.txt", "long.md"] {
        let book = read(&line, name).unwrap();
        assert_eq!(book.chapters.len(), 1);
        assert_eq!(book.chapters[0].text.len(), line.trim_end().len());
    }
    // And as one EPUB paragraph (XML, then HTML when the XML is broken).
    let markup = format!("<html><body><p>{line}</p></body></html>");
    assert_eq!(blocks(&markup)[0].len(), line.trim_end().len());
    let markup = format!("<html><body><p>{line}<br></body></html>");
    assert_eq!(blocks(&markup)[0].len(), line.trim_end().len());
}

#[test]
fn an_entity_bomb_is_not_expanded() {
    // "Billion laughs": roxmltree refuses entities nested past its depth; the HTML5 parser, which
    // the document then goes to, does not expand a DTD's entities at all.
    let mut dtd = String::from("<!DOCTYPE html [<!ENTITY lol \"lol\">");
    let mut previous = "lol".to_owned();
    for i in 1..10 {
        let name = format!("lol{i}");
        dtd.push_str(&format!("<!ENTITY {name} \"{}\">", format!("&{previous};").repeat(10)));
        previous = name;
    }
    let markup = format!("{dtd}]><html><body><p>&{previous};</p></body></html>");
    let spoken = blocks(&markup).concat();
    assert!(spoken.len() < 100, "{spoken}");
}
