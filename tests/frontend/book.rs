//! Books read into chapters (issue 33): EPUB 3 and EPUB 2 written by the test, a Markdown book, a
//! text book, and every bad input, each refused with one line that names the file.

use std::path::{Path, PathBuf};

use cosy::error::{Error, InputCode};
use cosy::frontend::book::{parse_book, read_book, Book, BookFormat, BookLimits};

use crate::common::epub::{alice_chapters, as_pairs, chapter_path, write_epub3, Epub, ALICE_TITLES, OPF};

fn read(path: &Path) -> Book {
    read_book(path, &BookLimits::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one-line refusal of the book `bytes` (named `name`).
fn refusal(bytes: &[u8], name: &str, limits: &BookLimits) -> String {
    match parse_book(bytes, name, limits) {
        Err(Error::Input { code: InputCode::InvalidBook, message, .. }) => {
            assert!(!message.contains('\n'), "one line: {message}");
            assert!(message.starts_with(name), "names the file first: {message}");
            message
        }
        other => panic!("{name}: expected a book refusal, got {other:?}"),
    }
}

fn epub_refusal(epub: &Epub) -> String {
    refusal(&epub.to_bytes(), "broken.epub", &BookLimits::default())
}

fn temp(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

#[test]
fn epub3_of_24_chapters_reads_in_spine_order_with_its_titles() {
    let chapters = alice_chapters(24);
    let (_dir, path) = temp("alice.epub");
    write_epub3(&path, "Alice’s Adventures", "Lewis Carroll", &as_pairs(&chapters));
    let book = read(&path);
    assert_eq!(book.format, BookFormat::Epub);
    assert_eq!(book.title.as_deref(), Some("Alice’s Adventures"));
    assert_eq!(book.author.as_deref(), Some("Lewis Carroll"));
    assert_eq!(book.language.as_deref(), Some("en"));
    assert_eq!(book.chapters.len(), 24);
    for (chapter, (title, text)) in book.chapters.iter().zip(&chapters) {
        assert_eq!(&chapter.title, title);
        // The heading that repeats the title and the page-break marker are not read.
        assert_eq!(&chapter.text, text);
    }
    assert_eq!(book.chapters[23].title, ALICE_TITLES[23]);
    // The navigation document is in the manifest, not the spine: nothing to warn about.
    assert!(book.warnings.is_empty(), "{:?}", book.warnings);
}

#[test]
fn epub2_with_ncx_and_html_entities_reads() {
    let chapters = [
        ("Chapter I", "“Curiouser and curiouser!” cried Alice\u{a0}— she was so much surprised.\n\nIt’s the oldest rule in the book."),
        ("Chapter II", "Down,\u{a0}down, down."),
    ];
    let epub = Epub::epub2("Alice", "Lewis Carroll", &chapters);
    assert!(epub.text(&chapter_path(1)).contains("&nbsp;&mdash;"), "the test book uses HTML's names");
    let book = parse_book(&epub.to_bytes(), "alice2.epub", &BookLimits::default()).unwrap();
    assert_eq!(book.language.as_deref(), Some("en-GB"));
    let got: Vec<(&str, &str)> = book.chapters.iter().map(|c| (c.title.as_str(), c.text.as_str())).collect();
    assert_eq!(
        got,
        [
            ("Chapter I", "“Curiouser and curiouser!” cried Alice — she was so much surprised.\n\nIt’s the oldest rule in the book."),
            ("Chapter II", "Down, down, down."),
        ]
    );
}

#[test]
fn epub_toc_entries_into_one_document_cut_it_and_untitled_documents_join_the_chapter_before() {
    let chapters = alice_chapters(3);
    let mut epub = Epub::epub3("Alice", "Lewis Carroll", &as_pairs(&chapters));
    // Chapter 1's document holds a second chapter at an anchor; chapter 3 is not in the contents
    // (a chapter split over two files: it goes on chapter 2).
    let one = epub.text(&chapter_path(1)).replace(
        "  <span epub:type",
        "  <h2 id=\"later\">A Later Part</h2>\n  <p>More words.</p>\n  <span epub:type",
    );
    epub.set(&chapter_path(1), one);
    let nav = epub.text("OEBPS/nav.xhtml");
    let nav = nav
        .replace(
            "<li><a href=\"text/chapter-002.xhtml\">",
            "<li><a href=\"text/chapter-001.xhtml#later\">A Later Part</a></li>\n      <li><a href=\"text/chapter-002.xhtml\">",
        )
        .replace(&format!("      <li><a href=\"text/chapter-003.xhtml\">{}</a></li>\n", chapters[2].0), "");
    epub.set("OEBPS/nav.xhtml", nav);
    let book = parse_book(&epub.to_bytes(), "alice.epub", &BookLimits::default()).unwrap();
    let titles: Vec<&str> = book.chapters.iter().map(|c| c.title.as_str()).collect();
    assert_eq!(titles, [ALICE_TITLES[0], "A Later Part", ALICE_TITLES[1]]);
    assert_eq!(book.chapters[0].text, chapters[0].1);
    assert_eq!(book.chapters[1].text, "More words.");
    // Chapter 3's heading is read: it is not this chapter's title.
    assert_eq!(book.chapters[2].text, format!("{}\n\n{}\n\n{}", chapters[1].1, chapters[2].0, chapters[2].1));
}

#[test]
fn markdown_and_text_books_read_from_files() {
    let (dir, md) = temp("book.md");
    std::fs::write(
        &md,
        "# Alice\n\n## Down the Rabbit-Hole\n\nAlice was beginning to get *very* tired.\n\n## The Pool of Tears\n\n“Curiouser and curiouser!” cried Alice.\n",
    )
    .unwrap();
    let book = read(&md);
    assert_eq!(book.format, BookFormat::Markdown);
    assert_eq!(book.title.as_deref(), Some("Alice"));
    let got: Vec<(&str, &str)> = book.chapters.iter().map(|c| (c.title.as_str(), c.text.as_str())).collect();
    assert_eq!(
        got,
        [
            ("Down the Rabbit-Hole", "Alice was beginning to get *very* tired."),
            ("The Pool of Tears", "“Curiouser and curiouser!” cried Alice.")
        ]
    );

    // Told by content: an EPUB with another extension, Markdown with none.
    let epub = dir.path().join("alice.bin");
    write_epub3(&epub, "Alice", "Lewis Carroll", &[("One", "Text.")]);
    assert_eq!(read(&epub).format, BookFormat::Epub);
    let no_extension = dir.path().join("README");
    std::fs::copy(&md, &no_extension).unwrap();
    assert_eq!(read(&no_extension).format, BookFormat::Markdown);

    let txt = dir.path().join("alice.txt");
    std::fs::write(&txt, "CHAPTER I.\r\nDown the Rabbit-Hole\r\n\r\nAlice was beginning.\r\n\r\nCHAPTER II.\r\nThe Pool of Tears\r\n\r\nCuriouser.\r\n").unwrap();
    let book = read(&txt);
    assert_eq!(book.format, BookFormat::Text);
    let got: Vec<(&str, &str)> = book.chapters.iter().map(|c| (c.title.as_str(), c.text.as_str())).collect();
    assert_eq!(got, [("CHAPTER I. Down the Rabbit-Hole", "Alice was beginning."), ("CHAPTER II. The Pool of Tears", "Curiouser.")]);
}

#[test]
fn broken_epubs_are_refused_with_one_line_each() {
    let chapters = alice_chapters(2);
    let good = Epub::epub3("Alice", "Lewis Carroll", &as_pairs(&chapters));
    let limits = BookLimits::default();

    let mut truncated = good.to_bytes();
    truncated.truncate(truncated.len() / 2);
    let e = refusal(&truncated, "broken.epub", &limits);
    assert!(e.starts_with("broken.epub is not a readable EPUB: the zip archive is damaged"), "{e}");
    assert!(e.ends_with("export or download the book again"), "{e}");

    let mut not_epub = Epub { files: Vec::new() };
    not_epub.set("notes.txt", "hello");
    let e = refusal(&not_epub.to_bytes(), "notes.zip", &limits);
    assert!(e.contains("is a zip archive but not an EPUB"), "{e}");

    let e = epub_refusal(&good.clone_without("META-INF/container.xml"));
    assert!(e.contains("META-INF/container.xml is missing"), "{e}");

    let e = epub_refusal(&good.clone_without(OPF));
    assert!(e.contains("the package document OEBPS/content.opf named by META-INF/container.xml is missing"), "{e}");

    let mut no_spine = good.clone_without("");
    let opf = no_spine.text(OPF);
    let spine_start = opf.find("<spine").unwrap();
    let spine_end = opf.find("</spine>").unwrap() + "</spine>".len();
    no_spine.set(OPF, format!("{}{}", &opf[..spine_start], &opf[spine_end..]));
    let e = epub_refusal(&no_spine);
    assert!(e.contains("has no spine"), "{e}");

    let e = epub_refusal(&good.clone_without(&chapter_path(2)));
    assert!(e.contains("the spine names OEBPS/text/chapter-002.xhtml, which is not in the book"), "{e}");

    let mut unlisted = good.clone_without("");
    unlisted.set(OPF, unlisted.text(OPF).replace("<itemref idref=\"c2\"/>", "<itemref idref=\"c9\"/>"));
    let e = epub_refusal(&unlisted);
    assert!(e.contains("the spine names item \"c9\", which the manifest"), "{e}");

    let mut bad_xml = good.clone_without("");
    bad_xml.set(OPF, "<package><spine>");
    let e = epub_refusal(&bad_xml);
    assert!(e.contains("OEBPS/content.opf inside it is not well-formed XML"), "{e}");
}

/// META-INF/encryption.xml saying that `uri` is encrypted with `algorithm`.
fn encryption(algorithm: &str, uri: &str) -> String {
    format!(
        r#"<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" xmlns:enc="http://www.w3.org/2001/04/xmlenc#">
  <enc:EncryptedData>
    <enc:EncryptionMethod Algorithm="{algorithm}"/>
    <enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData>
  </enc:EncryptedData>
</encryption>"#
    )
}

#[test]
fn drm_protected_epubs_are_refused() {
    let good = Epub::epub3("Alice", "Lewis Carroll", &[("One", "Text.")]);
    let mut encrypted = good.clone_without("");
    encrypted.set(
        "META-INF/encryption.xml",
        encryption("http://www.w3.org/2001/04/xmlenc#aes128-cbc", "OEBPS/text/chapter-001.xhtml"),
    );
    let e = epub_refusal(&encrypted);
    assert_eq!(
        e,
        "broken.epub is DRM-protected (META-INF/encryption.xml encrypts OEBPS/text/chapter-001.xhtml); \
         cosy cannot read it: use a DRM-free copy of the book"
    );

    for marker in ["META-INF/rights.xml", "META-INF/sinf.xml"] {
        let mut marked = good.clone_without("");
        marked.set(marker, "<rights/>");
        assert!(epub_refusal(&marked).contains(&format!("is DRM-protected ({marker})")));
    }

    // A file named in another case than the package says is still found.
    let mut cased = good.clone_without("");
    let (_, chapter) = cased.files.iter().find(|(p, _)| *p == chapter_path(1)).cloned().unwrap();
    cased.remove(&chapter_path(1)).set(&chapter_path(1).to_uppercase(), chapter);
    let book = parse_book(&cased.to_bytes(), "cased.epub", &BookLimits::default()).unwrap();
    assert_eq!(book.chapters[0].text, "Text.");

    // Font obfuscation is not DRM.
    let mut fonts = good.clone_without("");
    fonts.set("META-INF/encryption.xml", encryption("http://www.idpf.org/2008/embedding", "OEBPS/fonts/a.otf"));
    assert!(parse_book(&fonts.to_bytes(), "fonts.epub", &BookLimits::default()).is_ok());
}

#[test]
fn empty_epub_chapters_are_left_out_with_a_warning_and_an_empty_book_is_refused() {
    let mut epub = Epub::epub3("Alice", "Lewis Carroll", &[("Cover", ""), ("One", "Text.")]);
    epub.set(&chapter_path(1), epub.text(&chapter_path(1)).replace("<h1>Cover</h1>", "<img src=\"cover.png\" alt=\"Cover\"/>"));
    let book = parse_book(&epub.to_bytes(), "alice.epub", &BookLimits::default()).unwrap();
    assert_eq!(book.chapters.len(), 1);
    assert_eq!(book.chapters[0].title, "One");
    assert_eq!(book.warnings, ["alice.epub: chapter 1 \"Cover\" has no text to read: left out"]);

    let empty = Epub::epub3("Nothing", "Nobody", &[("One", ""), ("Two", "")]);
    let e = epub_refusal(&empty);
    assert_eq!(e, "broken.epub has no text to read in any chapter; give a book with text");
}

#[test]
fn zip_bombs_are_refused_before_they_fill_memory() {
    let mut epub = Epub::epub3("Alice", "Lewis Carroll", &[("One", "Text.")]);
    // Two megabytes of spaces deflate to a few kilobytes.
    let bomb = epub.text(&chapter_path(1)).replace("<p>", &format!("<p>{}", " ".repeat(2 << 20)));
    epub.set(&chapter_path(1), bomb);
    let bytes = epub.to_bytes();
    assert!(bytes.len() < 64 << 10);
    let limits = BookLimits { max_entry_bytes: 1 << 20, ..BookLimits::default() };
    let e = refusal(&bytes, "bomb.epub", &limits);
    assert!(e.contains("OEBPS/text/chapter-001.xhtml inside it unpacks to more than cosy reads"), "{e}");
    assert!(e.contains("zip bomb"), "{e}");
    let limits = BookLimits { max_total_bytes: 1 << 20, ..BookLimits::default() };
    assert!(refusal(&bytes, "bomb.epub", &limits).contains("zip bomb"));
    let limits = BookLimits { max_entries: 3, ..BookLimits::default() };
    assert!(refusal(&bytes, "many.epub", &limits).contains("files inside, more than the 3"));
}

#[test]
fn binary_and_undecodable_files_are_refused_and_a_long_line_reads() {
    let (dir, exe) = temp("program");
    std::fs::write(&exe, b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0").unwrap();
    match read_book(&exe, &BookLimits::default()) {
        Err(Error::Input { message, .. }) => assert_eq!(
            message,
            format!("{} is a binary file, not text; cosy reads books in plain text, Markdown or EPUB", exe.display())
        ),
        other => panic!("{other:?}"),
    }
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"Chapter 1\n\nna\xefve\n").unwrap();
    match read_book(&latin1, &BookLimits::default()) {
        Err(Error::Input { message, .. }) => assert!(message.ends_with("is not valid UTF-8 (byte 13, line 3); save it as UTF-8 text"), "{message}"),
        other => panic!("{other:?}"),
    }
    let long = dir.path().join("long.txt");
    let line = "All work and no play. ".repeat(500_000);
    std::fs::write(&long, &line).unwrap();
    let book = read(&long);
    assert_eq!(book.chapters[0].title, "long");
    assert_eq!(book.chapters[0].text, line.trim_end());
    assert!(matches!(read_book(&dir.path().join("missing.txt"), &BookLimits::default()), Err(Error::Io { .. })));
}

impl Epub {
    /// A copy of the book without the file at `path` (none removed for "").
    fn clone_without(&self, path: &str) -> Epub {
        Epub { files: self.files.iter().filter(|(p, _)| p != path).cloned().collect() }
    }
}
