//! Reading a config file: its TOML as (dotted key, value, line) leaves for the loader, and a syntax
//! error as one line naming the file, the line and column, and the key or table
//! ([`toml_error`]).

use std::collections::BTreeMap;
use std::path::Path;

use super::key::Origin;
use crate::error::{Error, Result};

/// The leaves of a config file, in the file's table order: each dotted key (`runtime.threads`;
/// keys of inline tables and dotted keys included), its value, and where it is (the line when it
/// can be found).
pub fn read_leaves(path: &Path) -> Result<Vec<(String, toml::Value, Origin)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| toml_error(path, &text, &e))?;
    let lines = key_lines(&text);
    let mut leaves = Vec::new();
    flatten("", &toml::Value::Table(table), &mut leaves);
    Ok(leaves
        .into_iter()
        .map(|(key, value)| {
            let origin = match lines.get(&key) {
                Some(&line) => Origin::FileLine(path.to_path_buf(), line),
                None => Origin::File(path.to_path_buf()),
            };
            (key, value, origin)
        })
        .collect())
}

/// Line and column (1-based, in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..floor_boundary(text, offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The character boundary at or before byte `i` (a parser's span is always on one; this keeps a
/// slice from panicking if it is not).
fn floor_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A TOML syntax error as one line: the file, line and column, what is wrong, and the text there
/// (the duplicate key or table the `toml` crate's message leaves out).
fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> Error {
    let msg = e.message().trim().trim_end_matches('.').to_string();
    let Some(span) = e.span() else {
        return Error::Config(format!("{}: not valid TOML: {msg}", path.display()));
    };
    let (line, col) = line_col(text, span.start);
    let start = floor_boundary(text, span.start);
    let end = floor_boundary(text, span.end.max(span.start));
    let at: String = text[start..end].lines().next().unwrap_or("").trim().chars().take(60).collect();
    let file = path.display();
    if msg.contains("duplicate") {
        return Error::Config(format!(
            "{file}:{line}:{col}: not valid TOML: {}; each table and each key may appear once: remove or merge the repeat",
            describe_duplicate(text, line, &at)
        ));
    }
    let at = if at.is_empty() { String::new() } else { format!(" (at `{at}`)") };
    Error::Config(format!("{file}:{line}:{col}: not valid TOML: {msg}{at}"))
}

/// What a duplicate is, for [`toml_error`]: the table (`[runtime]`) or the dotted key
/// (`runtime.threads`) repeated on `line` (1-based), and the line it first appeared on when that
/// can be seen from the text.
fn describe_duplicate(text: &str, line: usize, at: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let here = lines.get(line - 1).copied().unwrap_or("");
    let header = |l: &str| -> Option<String> {
        let l = l.split('#').next().unwrap_or("").trim();
        l.starts_with('[').then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
    };
    let before = &lines[..(line - 1).min(lines.len())];
    if let Some(table) = header(here) {
        let first = before.iter().position(|l| header(l).as_deref() == Some(table.as_str()));
        let also = first.map_or(String::new(), |i| format!(" (first on line {})", i + 1));
        return format!("table [{table}] appears twice{also}");
    }
    // The table the key is in: the last header above it.
    let section = before.iter().rposition(|l| header(l).is_some());
    let table = section.and_then(|i| header(before[i])).unwrap_or_default();
    let key = if at.is_empty() { here.split('=').next().unwrap_or("").trim().to_string() } else { at.to_string() };
    let full = if here.contains('{') {
        format!("{key} (in the inline table on this line)")
    } else if table.is_empty() {
        key.clone()
    } else {
        format!("{table}.{key}")
    };
    let from = section.map_or(0, |i| i + 1);
    let first = before[from..]
        .iter()
        .position(|l| l.split('=').next().is_some_and(|k| k.trim() == key))
        .map(|i| from + i);
    let also = first.map_or(String::new(), |i| format!(" (first on line {})", i + 1));
    format!("key {full} appears twice{also}")
}

/// The line of each dotted key of a config file that parses (keys of inline tables and dotted keys
/// included), for errors about its values.
fn key_lines(text: &str) -> BTreeMap<String, usize> {
    fn walk(text: &str, prefix: &str, table: &toml::de::DeTable<'_>, out: &mut BTreeMap<String, usize>) {
        for (k, v) in table.iter() {
            let key = if prefix.is_empty() { k.get_ref().to_string() } else { format!("{prefix}.{}", k.get_ref()) };
            match v.get_ref() {
                toml::de::DeValue::Table(t) => walk(text, &key, t, out),
                _ => {
                    out.insert(key, line_col(text, k.span().start).0);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(doc) = toml::de::DeTable::parse(text) {
        walk(text, "", doc.get_ref(), &mut out);
    }
    out
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}
