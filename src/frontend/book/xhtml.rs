//! An EPUB content document (XHTML) as spoken text. Parsed as XML first (roxmltree), with HTML's
//! named character references (`&nbsp;`, `&mdash;`: EPUB 2 books use them, XML refuses them)
//! rewritten as numeric ones from the WHATWG table html5ever keeps; a document that is still not
//! well-formed XML (tag soup from a careless converter) is parsed as HTML5 by html5ever (through
//! `scraper`), as a browser would. XML first because an HTML5 parser reads XHTML's `<span/>` as
//! an open `<span>` that swallows the text after it.
//!
//! Left out: the head, images and other media, scripts and styles, navigation, note references
//! (`epub:type="noteref"`, `role="doc-noteref"`, and a `<sup>` around a link: a footnote mark),
//! the notes themselves (footnote, endnote, rearnote), and page-break markers (`pagebreak`).
//! Headings, paragraphs, list items, table rows and the other blocks each become a block; a line
//! break (`<br/>`) ends a block too (a line of verse), except inside a heading.

use std::collections::HashSet;

/// A parsed document, as small as the walk needs.
#[derive(Debug)]
pub(super) enum Dom {
    Element { name: String, attrs: Vec<(String, String)>, children: Vec<Dom> },
    Text(String),
}

/// Deeper elements than this are left out (a hostile document cannot overflow the stack).
const MAX_DEPTH: usize = 512;

const OPS_NAMESPACE: &str = "http://www.idpf.org/2007/ops";

impl Dom {
    /// The document `markup`: XML when it is well-formed (after the named references), else HTML5.
    pub(super) fn parse(markup: &str) -> Dom {
        let xml = numeric_references(markup);
        let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
        match roxmltree::Document::parse_with_options(&xml, options) {
            Ok(document) => from_xml(document.root_element(), 0),
            Err(_) => {
                let html = scraper::Html::parse_document(markup);
                from_html(html.root_element(), 0)
            }
        }
    }

    pub(super) fn name(&self) -> Option<&str> {
        match self {
            Dom::Element { name, .. } => Some(name),
            Dom::Text(_) => None,
        }
    }

    pub(super) fn attr(&self, key: &str) -> Option<&str> {
        match self {
            Dom::Element { attrs, .. } => attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()),
            Dom::Text(_) => None,
        }
    }

    pub(super) fn children(&self) -> &[Dom] {
        match self {
            Dom::Element { children, .. } => children,
            Dom::Text(_) => &[],
        }
    }

    /// Every element in document order (this one first).
    pub(super) fn descendants(&self) -> Vec<&Dom> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(node) = stack.pop() {
            if node.name().is_some() {
                out.push(node);
            }
            stack.extend(node.children().iter().rev());
        }
        out
    }

    /// The first element named `name` (this one or below).
    pub(super) fn find(&self, name: &str) -> Option<&Dom> {
        self.descendants().into_iter().find(|d| d.name() == Some(name))
    }

    /// All the text below, whitespace collapsed.
    pub(super) fn text(&self) -> String {
        let mut raw = String::new();
        let mut stack = vec![self];
        while let Some(node) = stack.pop() {
            match node {
                Dom::Text(t) => raw.push_str(t),
                Dom::Element { children, .. } => {
                    raw.push(' ');
                    stack.extend(children.iter().rev());
                }
            }
        }
        super::collapse_whitespace(&raw)
    }

    /// `epub:type` or `role` naming any of `kinds` (whitespace-separated values).
    fn has_type(&self, kinds: &[&str]) -> bool {
        let named = |v: Option<&str>, prefix: &str| {
            v.is_some_and(|v| {
                v.split_whitespace().any(|t| kinds.iter().any(|k| t.strip_prefix(prefix) == Some(k)))
            })
        };
        named(self.attr("epub:type"), "") || named(self.attr("role"), "doc-")
    }
}

fn from_xml(node: roxmltree::Node, depth: usize) -> Dom {
    let attrs = node
        .attributes()
        .map(|a| {
            let key = match a.namespace() {
                Some(OPS_NAMESPACE) => format!("epub:{}", a.name()),
                _ => a.name().to_owned(),
            };
            (key, a.value().to_owned())
        })
        .collect();
    let children = if depth >= MAX_DEPTH {
        Vec::new()
    } else {
        node.children()
            .filter_map(|c| {
                if c.is_element() {
                    Some(from_xml(c, depth + 1))
                } else {
                    c.text().filter(|_| c.is_text()).map(|t| Dom::Text(t.to_owned()))
                }
            })
            .collect()
    };
    Dom::Element { name: node.tag_name().name().to_ascii_lowercase(), attrs, children }
}

fn from_html(element: scraper::ElementRef, depth: usize) -> Dom {
    let name = element.value().name().to_ascii_lowercase();
    let attrs = element.value().attrs().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    let children = if depth >= MAX_DEPTH {
        Vec::new()
    } else {
        element
            .children()
            .filter_map(|c| match scraper::ElementRef::wrap(c) {
                Some(child) => Some(from_html(child, depth + 1)),
                None => c.value().as_text().map(|t| Dom::Text(String::from(&**t))),
            })
            .collect()
    };
    Dom::Element { name, attrs, children }
}

/// `&name;` for every HTML named reference XML does not know, as `&#N;` (its code points from the
/// WHATWG table); XML's own five and unknown names are left for the parser. One pass.
fn numeric_references(markup: &str) -> std::borrow::Cow<'_, str> {
    if !markup.contains('&') {
        return std::borrow::Cow::Borrowed(markup);
    }
    let mut out = String::with_capacity(markup.len());
    let mut rest = markup;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let name_len = rest[1..].bytes().take(32).take_while(u8::is_ascii_alphanumeric).count();
        let with_semicolon = rest.as_bytes().get(1 + name_len) == Some(&b';');
        let name = &rest[1..1 + name_len];
        let known_to_xml = matches!(name, "amp" | "lt" | "gt" | "quot" | "apos");
        let entity = if with_semicolon && name_len > 0 && !known_to_xml {
            html5ever::data::NAMED_ENTITIES.get(&rest[1..2 + name_len])
        } else {
            None
        };
        match entity {
            Some(&(first, second)) => {
                out.push_str(&format!("&#{first};"));
                if second != 0 {
                    out.push_str(&format!("&#{second};"));
                }
                rest = &rest[2 + name_len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Elements whose content is never spoken.
const LEFT_OUT: &[&str] = &[
    "head", "script", "style", "img", "image", "svg", "math", "audio", "video", "object", "embed",
    "iframe", "canvas", "noscript", "template", "nav", "rt", "rp",
];

/// Note and page-number markers, by `epub:type` (or `role="doc-…"`).
const LEFT_OUT_TYPES: &[&str] =
    &["noteref", "pagebreak", "footnote", "endnote", "rearnote", "footnotes", "endnotes", "annoref"];

/// Elements that end a block before and after them.
const BLOCKS: &[&str] = &[
    "p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol", "dl", "dt", "dd",
    "blockquote", "section", "article", "aside", "header", "footer", "main", "figure",
    "figcaption", "table", "caption", "tr", "pre", "address", "hr", "body", "html", "center",
];

/// A run of a document's blocks: the whole document, or the part from one anchor (an element whose
/// `id` the table of contents points at) to the next.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Part {
    /// The `id` this part starts at; `None` for the document's start.
    pub anchor: Option<String>,
    /// The blocks' text, each whitespace-collapsed and not empty.
    pub blocks: Vec<String>,
    /// The text of the first heading in the part, if any.
    pub first_heading: Option<String>,
}

/// The spoken blocks of `document`, cut into parts at the elements whose `id` is in `anchors`.
pub(super) fn parts(document: &Dom, anchors: &HashSet<&str>) -> Vec<Part> {
    let mut walk = Walk { parts: vec![Part::default()], inline: String::new(), anchors, in_heading: false };
    let body = document.find("body").unwrap_or(document);
    walk.node(body, 0);
    walk.end_block(false);
    walk.parts
}

struct Walk<'a> {
    parts: Vec<Part>,
    inline: String,
    anchors: &'a HashSet<&'a str>,
    in_heading: bool,
}

impl Walk<'_> {
    fn node(&mut self, node: &Dom, depth: usize) {
        let name = match node {
            Dom::Text(t) => {
                self.inline.push_str(t);
                return;
            }
            Dom::Element { name, .. } => name.as_str(),
        };
        if depth > MAX_DEPTH || LEFT_OUT.contains(&name) || node.has_type(LEFT_OUT_TYPES) || is_note_mark(node)
        {
            return;
        }
        if let Some(id) = node.attr("id").filter(|id| self.anchors.contains(id)) {
            self.end_block(false);
            self.parts.push(Part { anchor: Some(id.to_owned()), ..Part::default() });
        }
        match name {
            "br" if self.in_heading => self.inline.push(' '),
            "br" => self.end_block(false),
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" if !self.in_heading => {
                self.end_block(false);
                self.in_heading = true;
                self.children(node, depth);
                self.in_heading = false;
                self.end_block(true);
            }
            _ if BLOCKS.contains(&name) => {
                self.end_block(false);
                self.children(node, depth);
                self.end_block(false);
            }
            // Table cells side by side, read with a space between.
            "td" | "th" => {
                self.inline.push(' ');
                self.children(node, depth);
                self.inline.push(' ');
            }
            _ => self.children(node, depth),
        }
    }

    fn children(&mut self, node: &Dom, depth: usize) {
        for child in node.children() {
            self.node(child, depth + 1);
        }
    }

    fn end_block(&mut self, heading: bool) {
        let text = super::collapse_whitespace(&self.inline);
        self.inline.clear();
        if text.is_empty() {
            return;
        }
        let part = self.parts.last_mut().expect("parts starts with one and only grows");
        if heading && part.first_heading.is_none() {
            part.first_heading = Some(text.clone());
        }
        part.blocks.push(text);
    }
}

/// A footnote mark: a `<sup>` that holds a link (`<sup><a href="#n1">1</a></sup>`), or a link
/// inside which is only a `<sup>`.
fn is_note_mark(node: &Dom) -> bool {
    match node.name() {
        Some("sup") => node.descendants().iter().any(|d| d.name() == Some("a")),
        Some("a") => {
            let children: Vec<&Dom> =
                node.children().iter().filter(|c| !matches!(c, Dom::Text(t) if t.trim().is_empty())).collect();
            children.len() == 1 && children[0].name() == Some("sup")
        }
        _ => false,
    }
}
