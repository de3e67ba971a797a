//! EPUB books written by the tests themselves (issue 33): a valid EPUB 3 (container, package
//! document with its spine, navigation document) or EPUB 2 (NCX, XHTML 1.1 with HTML named
//! entities), with public-domain text from Lewis Carroll's Alice books. [`Epub`] holds the files
//! before they are zipped, so that a test can break one (drop the spine, add DRM) first.

use std::io::Write;
use std::path::Path;

/// The files of an EPUB, in the order they go into the zip (`mimetype` first, stored).
pub struct Epub {
    pub files: Vec<(String, Vec<u8>)>,
}

/// Writes an EPUB 3 book: one XHTML document per chapter (an `<h1>` with the title, a `<p>` per
/// paragraph of `text`, paragraphs separated by a blank line, and a page-break marker), in that
/// spine order, with a navigation document listing them.
pub fn write_epub3(path: &Path, title: &str, author: &str, chapters: &[(&str, &str)]) {
    Epub::epub3(title, author, chapters).write(path);
}

/// Writes an EPUB 2 book (NCX table of contents; `—`, `’` and no-break spaces written as
/// `&mdash;`, `&rsquo;` and `&nbsp;`, as older tools do).
pub fn write_epub2(path: &Path, title: &str, author: &str, chapters: &[(&str, &str)]) {
    Epub::epub2(title, author, chapters).write(path);
}

/// Where the chapters and the package document live in the books written here.
pub const OPF: &str = "OEBPS/content.opf";

/// The path of chapter `n` (from 1) inside the zip.
pub fn chapter_path(n: usize) -> String {
    format!("OEBPS/text/chapter-{n:03}.xhtml")
}

impl Epub {
    pub fn epub3(title: &str, author: &str, chapters: &[(&str, &str)]) -> Epub {
        let mut epub = Epub::with_chapters(chapters, |n, chapter_title, text| {
            let body = format!(
                "  <h1>{}</h1>\n{}  <span epub:type=\"pagebreak\" id=\"page{n}\" title=\"{n}\"/>\n",
                escape(chapter_title, false),
                paragraphs(text, false)
            );
            xhtml5(chapter_title, &body)
        });
        let metadata = format!(
            "    <dc:identifier id=\"uid\">urn:uuid:2f1e8c3a-cosy-test-book</dc:identifier>\n    <dc:title>{}</dc:title>\n    <dc:creator>{}</dc:creator>\n    <dc:language>en</dc:language>\n    <meta property=\"dcterms:modified\">2026-01-01T00:00:00Z</meta>\n",
            escape(title, false),
            escape(author, false)
        );
        let nav_item = "<item id=\"nav\" href=\"nav.xhtml\" media-type=\"application/xhtml+xml\" properties=\"nav\"/>";
        epub.set(OPF, package("3.0", &metadata, nav_item, "", chapters.len()));
        let nav: String = chapters
            .iter()
            .enumerate()
            .map(|(i, (chapter_title, _))| {
                format!("      <li><a href=\"text/chapter-{:03}.xhtml\">{}</a></li>\n", i + 1, escape(chapter_title, false))
            })
            .collect();
        epub.set(
            "OEBPS/nav.xhtml",
            xhtml5(
                "Contents",
                &format!("  <nav epub:type=\"toc\" id=\"toc\">\n    <h1>Contents</h1>\n    <ol>\n{nav}    </ol>\n  </nav>\n"),
            ),
        );
        epub
    }

    pub fn epub2(title: &str, author: &str, chapters: &[(&str, &str)]) -> Epub {
        let mut epub = Epub::with_chapters(chapters, |_, chapter_title, text| {
            format!(
                r#"<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">
<html xmlns="http://www.w3.org/1999/xhtml">
<head><title>{}</title></head>
<body>
  <h2>{}</h2>
{}</body>
</html>
"#,
                escape(chapter_title, false),
                escape(chapter_title, true),
                paragraphs(text, true)
            )
        });
        let metadata = format!(
            "    <dc:identifier id=\"uid\">cosy-test-book-2</dc:identifier>\n    <dc:title>{}</dc:title>\n    <dc:creator opf:role=\"aut\">{}</dc:creator>\n    <dc:language>en-GB</dc:language>\n",
            escape(title, false),
            escape(author, false)
        );
        let ncx_item = "<item id=\"ncx\" href=\"toc.ncx\" media-type=\"application/x-dtbncx+xml\"/>";
        epub.set(OPF, package("2.0", &metadata, ncx_item, " toc=\"ncx\"", chapters.len()));
        let points: String = chapters
            .iter()
            .enumerate()
            .map(|(i, (chapter_title, _))| {
                let n = i + 1;
                format!(
                    "    <navPoint id=\"p{n}\" playOrder=\"{n}\">\n      <navLabel><text>{}</text></navLabel>\n      <content src=\"text/chapter-{n:03}.xhtml\"/>\n    </navPoint>\n",
                    escape(chapter_title, false)
                )
            })
            .collect();
        epub.set(
            "OEBPS/toc.ncx",
            format!(
                r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE ncx PUBLIC "-//NISO//DTD ncx 2005-1//EN" "http://www.daisy.org/z3986/2005/ncx-2005-1.dtd">
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">
  <head><meta name="dtb:uid" content="cosy-test-book-2"/></head>
  <docTitle><text>{}</text></docTitle>
  <navMap>
{points}  </navMap>
</ncx>
"#,
                escape(title, false)
            ),
        );
        epub
    }

    /// The mimetype, the container and a document per chapter (`document(n, title, text)`, `n`
    /// from 1, at [`chapter_path`]).
    fn with_chapters(chapters: &[(&str, &str)], document: impl Fn(usize, &str, &str) -> String) -> Epub {
        let mut epub = Epub::common();
        for (i, (chapter_title, text)) in chapters.iter().enumerate() {
            epub.set(&chapter_path(i + 1), document(i + 1, chapter_title, text));
        }
        epub
    }

    /// The mimetype and the container, which every EPUB has.
    fn common() -> Epub {
        let mut epub = Epub { files: Vec::new() };
        epub.set("mimetype", "application/epub+zip");
        epub.set(
            "META-INF/container.xml",
            r#"<?xml version="1.0" encoding="UTF-8"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles>
    <rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>
  </rootfiles>
</container>
"#,
        );
        epub
    }

    /// Sets the file at `path` (replacing it, or added last).
    pub fn set(&mut self, path: &str, content: impl Into<Vec<u8>>) -> &mut Epub {
        let content = content.into();
        match self.files.iter_mut().find(|(p, _)| p == path) {
            Some(file) => file.1 = content,
            None => self.files.push((path.to_owned(), content)),
        }
        self
    }

    pub fn remove(&mut self, path: &str) -> &mut Epub {
        self.files.retain(|(p, _)| p != path);
        self
    }

    /// The file at `path` as text.
    pub fn text(&self, path: &str) -> String {
        let (_, content) = self.files.iter().find(|(p, _)| p == path).expect("no such file in the test book");
        String::from_utf8(content.clone()).expect("test book files are UTF-8")
    }

    /// The zip's bytes: `mimetype` stored, the rest deflated.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (path, content) in &self.files {
            let method = if path == "mimetype" { zip::CompressionMethod::Stored } else { zip::CompressionMethod::Deflated };
            let options = zip::write::SimpleFileOptions::default().compression_method(method);
            zip.start_file(path.as_str(), options).expect("zip entry");
            zip.write_all(content).expect("zip write");
        }
        zip.finish().expect("zip finish").into_inner()
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.to_bytes()).expect("write the test book");
    }
}

/// The package document: `metadata` (its lines), the table of contents' manifest item
/// (`toc_item`), and `count` chapters (ids `c1`, `c2` …) in the manifest and the spine (whose
/// attributes are `spine_attrs`).
fn package(version: &str, metadata: &str, toc_item: &str, spine_attrs: &str, count: usize) -> String {
    let mut manifest = format!("    {toc_item}\n");
    let mut spine = String::new();
    for n in 1..=count {
        manifest.push_str(&format!(
            "    <item id=\"c{n}\" href=\"text/chapter-{n:03}.xhtml\" media-type=\"application/xhtml+xml\"/>\n"
        ));
        spine.push_str(&format!("    <itemref idref=\"c{n}\"/>\n"));
    }
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="{version}" unique-identifier="uid" xml:lang="en">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:opf="http://www.idpf.org/2007/opf">
{metadata}  </metadata>
  <manifest>
{manifest}  </manifest>
  <spine{spine_attrs}>
{spine}  </spine>
</package>
"#
    )
}

/// An XHTML5 content document (EPUB 3).
fn xhtml5(title: &str, body: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" lang="en" xml:lang="en">
<head><title>{}</title></head>
<body>
{body}</body>
</html>
"#,
        escape(title, false)
    )
}

/// A `<p>` for each paragraph of `text` (paragraphs separated by a blank line).
fn paragraphs(text: &str, named_entities: bool) -> String {
    text.split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| format!("  <p>{}</p>\n", escape(p.trim(), named_entities)))
        .collect()
}

/// Text escaped for XHTML; with `named_entities`, `—`, `’` and no-break spaces as HTML's names.
fn escape(text: &str, named_entities: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '—' if named_entities => out.push_str("&mdash;"),
            '’' if named_entities => out.push_str("&rsquo;"),
            '\u{a0}' if named_entities => out.push_str("&nbsp;"),
            c => out.push(c),
        }
    }
    out
}

/// The chapter titles of *Alice's Adventures in Wonderland* and *Through the Looking-Glass*
/// (Lewis Carroll, 1865 and 1871; public domain): 24 chapters.
pub const ALICE_TITLES: [&str; 24] = [
    "Down the Rabbit-Hole",
    "The Pool of Tears",
    "A Caucus-Race and a Long Tale",
    "The Rabbit Sends in a Little Bill",
    "Advice from a Caterpillar",
    "Pig and Pepper",
    "A Mad Tea-Party",
    "The Queen’s Croquet-Ground",
    "The Mock Turtle’s Story",
    "The Lobster Quadrille",
    "Who Stole the Tarts?",
    "Alice’s Evidence",
    "Looking-Glass House",
    "The Garden of Live Flowers",
    "Looking-Glass Insects",
    "Tweedledum and Tweedledee",
    "Wool and Water",
    "Humpty Dumpty",
    "The Lion and the Unicorn",
    "“It’s My Own Invention”",
    "Queen Alice",
    "Shaking",
    "Waking",
    "Which Dreamed It?",
];

/// Sentences from *Alice's Adventures in Wonderland* (public domain).
const ALICE_SENTENCES: [&str; 8] = [
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do.",
    "Once or twice she had peeped into the book her sister was reading, but it had no pictures or conversations in it.",
    "“And what is the use of a book,” thought Alice, “without pictures or conversations?”",
    "So she was considering in her own mind whether the pleasure of making a daisy-chain would be worth the trouble.",
    "Suddenly a White Rabbit with pink eyes ran close by her.",
    "Down, down, down. Would the fall never come to an end?",
    "“Curiouser and curiouser!” cried Alice.",
    "“Who are you?” said the Caterpillar.",
];

/// `count` chapters (at most 24) titled from [`ALICE_TITLES`], each of two paragraphs of Alice's
/// sentences, different for each chapter (the chapter's number is in its first sentence).
pub fn alice_chapters(count: usize) -> Vec<(String, String)> {
    (0..count.min(ALICE_TITLES.len()))
        .map(|i| {
            let s = |k: usize| ALICE_SENTENCES[(i + k) % ALICE_SENTENCES.len()];
            let text = format!("This is chapter {}. {} {}\n\n{} {}", i + 1, s(0), s(1), s(2), s(3));
            (ALICE_TITLES[i].to_owned(), text)
        })
        .collect()
}

/// [`alice_chapters`] as the `&[(&str, &str)]` the writers take.
pub fn as_pairs(chapters: &[(String, String)]) -> Vec<(&str, &str)> {
    chapters.iter().map(|(t, x)| (t.as_str(), x.as_str())).collect()
}
