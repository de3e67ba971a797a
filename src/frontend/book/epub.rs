//! EPUB 2 and 3: the zip container, the package document (OPF), the spine, the table of contents
//! (EPUB 3 navigation document, EPUB 2 NCX) and the content documents ([`super::xhtml`]).
//!
//! Chapters: each table-of-contents entry starts one, titled by its label, in spine order (an
//! entry that points into a document at an `id` cuts the document there). A spine document no
//! entry points at goes on the chapter before it (a chapter split over files); before the first
//! entry, or in a book with no table of contents, it is a chapter of its own titled by its first
//! heading, its `<title>` or "Chapter N". Spine items marked `linear="no"` and items that are not
//! XHTML (an SVG cover) are not read.

use std::collections::{HashMap, HashSet};
use std::io::{Cursor, Read};

use super::xhtml::{self, Dom};
use super::{book_error, keep_spoken, Book, BookFormat, BookLimits, Chapter};
use crate::error::Result;

/// What to do about a damaged book, said after each structural refusal.
const FIX: &str = "export or download the book again";

const CONTAINER: &str = "META-INF/container.xml";

/// Font obfuscation (IDPF and Adobe): allowed in META-INF/encryption.xml, not DRM.
const FONT_OBFUSCATION: &[&str] = &["http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"];

/// The zip, read with the book's bounds.
struct Container<'a> {
    archive: zip::ZipArchive<Cursor<&'a [u8]>>,
    name: &'a str,
    limits: &'a BookLimits,
    read_total: u64,
}

impl<'a> Container<'a> {
    fn open(bytes: &'a [u8], name: &'a str, limits: &'a BookLimits) -> Result<Self> {
        let archive = zip::ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| book_error(name, format!("is not a readable EPUB: the zip archive is damaged ({e}); {FIX}")))?;
        if archive.len() > limits.max_entries {
            return Err(book_error(
                name,
                format!("has {} files inside, more than the {} a book may have", archive.len(), limits.max_entries),
            ));
        }
        Ok(Container { archive, name, limits, read_total: 0 })
    }

    /// The entry at `path` unpacked, or `None` when the zip has no such entry.
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>> {
        let name = self.name;
        let damaged = |e: &dyn std::fmt::Display| {
            book_error(name, format!("is not a readable EPUB: {path} inside it is damaged ({e}); {FIX}"))
        };
        // Books made on a file system that ignores case may name a file in another case.
        let Some(index) = self.archive.index_for_name(path).or_else(|| self.index_ignoring_case(path)) else {
            return Ok(None);
        };
        let mut entry = match self.archive.by_index(index) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::UnsupportedArchive(why)) if why.contains("assword") => {
                return Err(book_error(
                    name,
                    format!("is DRM-protected ({path} inside it is encrypted); cosy cannot read it: use a DRM-free copy"),
                ))
            }
            Err(e) => return Err(damaged(&e)),
        };
        let limit = self.limits.max_entry_bytes.min(self.limits.max_total_bytes.saturating_sub(self.read_total));
        let too_big = || {
            book_error(
                name,
                format!(
                    "is refused: {path} inside it unpacks to more than cosy reads (a file {} bytes, a book {} bytes in all); \
                     it is damaged or a zip bomb",
                    self.limits.max_entry_bytes, self.limits.max_total_bytes
                ),
            )
        };
        if entry.size() > limit {
            return Err(too_big());
        }
        // The size the zip declares may lie: memory grows with what is really read.
        let mut bytes = Vec::with_capacity(usize::try_from(entry.size().min(1 << 20)).unwrap_or(0));
        (&mut entry).take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| damaged(&e))?;
        if bytes.len() as u64 > limit {
            return Err(too_big());
        }
        self.read_total += bytes.len() as u64;
        Ok(Some(bytes))
    }

    fn index_ignoring_case(&self, path: &str) -> Option<usize> {
        (0..self.archive.len()).find(|&i| self.archive.name_for_index(i).is_some_and(|n| n.is_ok_and(|n| n.eq_ignore_ascii_case(path))))
    }

    fn has(&self, path: &str) -> bool {
        self.archive.index_for_name(path).is_some()
    }

    /// The entry at `path` as text (a byte-order mark dropped; invalid UTF-8 replaced), or `None`.
    fn read_text(&mut self, path: &str) -> Result<Option<String>> {
        Ok(self.read(path)?.map(|bytes| {
            let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
            String::from_utf8_lossy(bytes).into_owned()
        }))
    }
}

/// A manifest item.
struct Item {
    path: String,
    media_type: String,
    properties: String,
}

/// One table-of-contents entry: the document it points at, the `id` in it (if any), its label.
struct TocEntry {
    path: String,
    anchor: Option<String>,
    label: String,
}

// long: the EPUB's reading order as one sequence (container → package → spine → contents →
// chapters), each step one refusal; to split into "find the parts" and "cut the chapters" next.
pub(super) fn read(bytes: &[u8], name: &str, limits: &BookLimits) -> Result<Book> {
    let mut zip = Container::open(bytes, name, limits)?;
    let mimetype = zip.read_text("mimetype")?;
    let is_epub = mimetype.as_deref().map(str::trim) == Some("application/epub+zip");
    if !is_epub && !zip.has(CONTAINER) {
        return Err(book_error(
            name,
            "is a zip archive but not an EPUB (no mimetype application/epub+zip); \
             cosy reads books in plain text, Markdown or EPUB",
        ));
    }
    refuse_drm(&mut zip)?;
    let container = zip
        .read_text(CONTAINER)?
        .ok_or_else(|| book_error(name, format!("is not a valid EPUB: {CONTAINER} is missing; {FIX}")))?;
    let container = parse_xml(&container, name, CONTAINER)?;
    let rootfiles: Vec<roxmltree::Node> =
        container.descendants().filter(|n| n.tag_name().name() == "rootfile").collect();
    let opf_path = rootfiles
        .iter()
        .find(|n| n.attribute("media-type") == Some("application/oebps-package+xml"))
        .or(rootfiles.first())
        .and_then(|n| n.attribute("full-path"))
        .and_then(|p| resolve("", p))
        .ok_or_else(|| {
            book_error(name, format!("is not a valid EPUB: {CONTAINER} names no package document (rootfile); {FIX}"))
        })?;
    let opf = zip.read_text(&opf_path)?.ok_or_else(|| {
        book_error(name, format!("is not a valid EPUB: the package document {opf_path} named by {CONTAINER} is missing; {FIX}"))
    })?;
    let opf = parse_xml(&opf, name, &opf_path)?;
    let opf_dir = parent(&opf_path);

    let metadata = |tag: &str| -> Vec<String> {
        opf.descendants()
            .filter(|n| n.is_element() && n.tag_name().name() == tag && n.tag_name().namespace() == Some(DC))
            .map(|n| super::collapse_whitespace(&n.descendants().filter_map(|t| t.text().filter(|_| t.is_text())).collect::<String>()))
            .filter(|s| !s.is_empty())
            .collect()
    };
    let title = metadata("title").into_iter().next();
    let authors = metadata("creator");
    let author = (!authors.is_empty()).then(|| authors.join(", "));
    let language = metadata("language").into_iter().next();

    let mut items: HashMap<&str, Item> = HashMap::new();
    for node in opf.descendants().filter(|n| n.tag_name().name() == "item") {
        let (Some(id), Some(href)) = (node.attribute("id"), node.attribute("href")) else { continue };
        let Some(path) = resolve(&opf_dir, href) else { continue };
        items.insert(
            id,
            Item {
                path,
                media_type: node.attribute("media-type").unwrap_or("").to_owned(),
                properties: node.attribute("properties").unwrap_or("").to_owned(),
            },
        );
    }
    let spine = opf.descendants().find(|n| n.tag_name().name() == "spine").ok_or_else(|| {
        book_error(name, format!("is not a valid EPUB: the package document {opf_path} has no spine (the reading order); {FIX}"))
    })?;
    let itemrefs: Vec<roxmltree::Node> = spine.children().filter(|n| n.tag_name().name() == "itemref").collect();
    if itemrefs.is_empty() {
        return Err(book_error(
            name,
            format!("is not a valid EPUB: the spine of {opf_path} names no document to read; {FIX}"),
        ));
    }

    let toc = table_of_contents(&mut zip, &items, spine.attribute("toc"))?;
    let mut titles: HashMap<&str, Vec<&TocEntry>> = HashMap::new();
    for entry in &toc {
        titles.entry(entry.path.as_str()).or_default().push(entry);
    }

    let mut chapters: Vec<Chapter> = Vec::new();
    for itemref in itemrefs {
        if itemref.attribute("linear") == Some("no") {
            continue;
        }
        let idref = itemref.attribute("idref").unwrap_or("");
        let item = items.get(idref).ok_or_else(|| {
            book_error(name, format!("is not a valid EPUB: the spine names item \"{idref}\", which the manifest of {opf_path} does not list; {FIX}"))
        })?;
        if !is_xhtml(&item.media_type) {
            continue;
        }
        let markup = zip.read_text(&item.path)?.ok_or_else(|| {
            book_error(name, format!("is not a valid EPUB: the spine names {}, which is not in the book; {FIX}", item.path))
        })?;
        let document = Dom::parse(&markup);
        let entries = titles.get(item.path.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let anchors: HashSet<&str> = entries.iter().filter_map(|e| e.anchor.as_deref()).collect();
        for part in xhtml::parts(&document, &anchors) {
            let label = entries
                .iter()
                .find(|e| e.anchor.as_deref() == part.anchor.as_deref())
                .map(|e| e.label.clone());
            if label.is_none() && part.blocks.is_empty() {
                continue;
            }
            if label.is_none() && !toc.is_empty() {
                if let Some(previous) = chapters.last_mut() {
                    append(&mut previous.text, &part.blocks);
                    continue;
                }
            }
            let title = label
                .or_else(|| part.first_heading.clone())
                .or_else(|| document.find("title").map(Dom::text).filter(|t| !t.is_empty()))
                .unwrap_or_else(|| format!("Chapter {}", chapters.len() + 1));
            let mut blocks = part.blocks.as_slice();
            // The heading that repeats the title is not read twice.
            if blocks.first().is_some_and(|b| same_words(b, &title)) {
                blocks = &blocks[1..];
            }
            let mut text = String::new();
            append(&mut text, blocks);
            chapters.push(Chapter { title, text });
        }
    }
    let mut warnings = Vec::new();
    let chapters = keep_spoken(chapters, name, &mut warnings)?;
    Ok(Book { title, author, language, format: BookFormat::Epub, chapters, warnings })
}

const DC: &str = "http://purl.org/dc/elements/1.1/";

fn is_xhtml(media_type: &str) -> bool {
    matches!(media_type, "application/xhtml+xml" | "text/html" | "application/xml" | "text/xml" | "")
}

/// Files only DRM-protected books have: Adobe ADEPT's rights, Apple FairPlay's keys.
const DRM_MARKERS: &[&str] = &["META-INF/rights.xml", "META-INF/sinf.xml"];

/// A [`DRM_MARKERS`] file, or META-INF/encryption.xml encrypting anything but fonts: DRM, refused.
fn refuse_drm(zip: &mut Container) -> Result<()> {
    let name = zip.name;
    let drm = |why: String| {
        book_error(name, format!("is DRM-protected ({why}); cosy cannot read it: use a DRM-free copy of the book"))
    };
    for marker in DRM_MARKERS {
        if zip.has(marker) {
            return Err(drm((*marker).into()));
        }
    }
    let Some(encryption) = zip.read_text("META-INF/encryption.xml")? else { return Ok(()) };
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let Ok(document) = roxmltree::Document::parse_with_options(&encryption, options) else {
        return Err(drm("META-INF/encryption.xml".into()));
    };
    for data in document.descendants().filter(|n| n.tag_name().name() == "EncryptedData") {
        let algorithm = data
            .descendants()
            .find(|n| n.tag_name().name() == "EncryptionMethod")
            .and_then(|n| n.attribute("Algorithm"))
            .unwrap_or("");
        if !FONT_OBFUSCATION.contains(&algorithm) {
            let what = data
                .descendants()
                .find(|n| n.tag_name().name() == "CipherReference")
                .and_then(|n| n.attribute("URI"))
                .unwrap_or("content");
            return Err(drm(format!("META-INF/encryption.xml encrypts {what}")));
        }
    }
    Ok(())
}

/// The table of contents: the EPUB 3 navigation document's `toc` nav, else the EPUB 2 NCX (the
/// spine's `toc`, else the manifest's NCX item); empty when the book has neither.
fn table_of_contents(zip: &mut Container, items: &HashMap<&str, Item>, ncx_id: Option<&str>) -> Result<Vec<TocEntry>> {
    if let Some(nav) = items.values().find(|i| i.properties.split_whitespace().any(|p| p == "nav")) {
        if let Some(markup) = zip.read_text(&nav.path)? {
            let entries = nav_entries(&Dom::parse(&markup), &parent(&nav.path));
            if !entries.is_empty() {
                return Ok(entries);
            }
        }
    }
    let ncx = ncx_id
        .and_then(|id| items.get(id))
        .or_else(|| items.values().find(|i| i.media_type == "application/x-dtbncx+xml"));
    let Some(ncx) = ncx else { return Ok(Vec::new()) };
    let Some(text) = zip.read_text(&ncx.path)? else { return Ok(Vec::new()) };
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    // A table of contents that cannot be read leaves the chapters titled by their headings.
    let Ok(document) = roxmltree::Document::parse_with_options(&text, options) else { return Ok(Vec::new()) };
    let base = parent(&ncx.path);
    let mut entries = Vec::new();
    for point in document.descendants().filter(|n| n.tag_name().name() == "navPoint") {
        let label = point
            .children()
            .find(|n| n.tag_name().name() == "navLabel")
            .map(|l| l.descendants().filter_map(|t| t.text().filter(|_| t.is_text())).collect::<String>())
            .unwrap_or_default();
        let src = point.children().find(|n| n.tag_name().name() == "content").and_then(|c| c.attribute("src"));
        if let Some(entry) = src.and_then(|src| toc_entry(&base, src, &label)) {
            entries.push(entry);
        }
    }
    Ok(entries)
}

/// The links of the navigation document's `epub:type="toc"` nav (else its first nav), in order.
fn nav_entries(document: &Dom, base: &str) -> Vec<TocEntry> {
    let navs: Vec<&Dom> = document.descendants().into_iter().filter(|d| d.name() == Some("nav")).collect();
    let toc = navs
        .iter()
        .find(|n| n.attr("epub:type").is_some_and(|t| t.split_whitespace().any(|t| t == "toc")))
        .or(navs.first());
    let Some(toc) = toc else { return Vec::new() };
    toc.descendants()
        .into_iter()
        .filter(|d| d.name() == Some("a"))
        .filter_map(|a| toc_entry(base, a.attr("href")?, &a.text()))
        .collect()
}

fn toc_entry(base: &str, href: &str, label: &str) -> Option<TocEntry> {
    let label = super::collapse_whitespace(label);
    if label.is_empty() {
        return None;
    }
    let anchor = href.split_once('#').map(|(_, f)| percent_decode(f)).filter(|f| !f.is_empty());
    Some(TocEntry { path: resolve(base, href)?, anchor, label })
}

fn parse_xml<'t>(text: &'t str, name: &str, path: &str) -> Result<roxmltree::Document<'t>> {
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    roxmltree::Document::parse_with_options(text, options)
        .map_err(|e| book_error(name, format!("is not a valid EPUB: {path} inside it is not well-formed XML ({e}); {FIX}")))
}

/// Blocks added to a chapter's text, a blank line between.
fn append(text: &mut String, blocks: &[String]) {
    for block in blocks {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(block);
    }
}

/// The same words, case, punctuation and spacing aside ("CHAPTER I." and "Chapter I").
fn same_words(a: &str, b: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
    };
    words(a) == words(b)
}

/// The folder of a path inside the zip ("" at the top).
fn parent(path: &str) -> String {
    path.rsplit_once('/').map_or(String::new(), |(dir, _)| dir.to_owned())
}

/// `href` (relative to the folder `base`, percent-encoded, maybe with a `#fragment`) as a path
/// inside the zip, `.` and `..` resolved; `None` for a link out of the book (a URL) or one that
/// climbs above the zip's top.
fn resolve(base: &str, href: &str) -> Option<String> {
    let href = href.split('#').next().unwrap_or("");
    if href.is_empty() || href.contains("://") || href.starts_with("mailto:") || href.starts_with("data:") {
        return None;
    }
    let href = percent_decode(href);
    let mut parts: Vec<&str> = Vec::new();
    let start = if href.starts_with('/') { "" } else { base };
    for part in start.split('/').chain(href.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// `%XX` escapes decoded (as UTF-8; a sequence that is not UTF-8 is left as written).
fn percent_decode(text: &str) -> String {
    if !text.contains('%') {
        return text.to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hrefs_resolve_inside_the_zip_only() {
        assert_eq!(resolve("OEBPS", "text/ch%201.xhtml#p3").as_deref(), Some("OEBPS/text/ch 1.xhtml"));
        assert_eq!(resolve("OEBPS/text", "../nav.xhtml").as_deref(), Some("OEBPS/nav.xhtml"));
        assert_eq!(resolve("OEBPS", "./a/./b.xhtml").as_deref(), Some("OEBPS/a/b.xhtml"));
        assert_eq!(resolve("OEBPS", "../../etc/passwd"), None);
        assert_eq!(resolve("", "https://example.com/x.xhtml"), None);
        assert_eq!(resolve("OEBPS", "/top.xhtml").as_deref(), Some("top.xhtml"));
        assert_eq!(percent_decode("%E2%80%94%zz"), "—%zz");
    }

    #[test]
    fn titles_compare_by_their_words() {
        assert!(same_words("CHAPTER I.", "Chapter I"));
        assert!(!same_words("Chapter I", "Chapter II"));
    }
}
