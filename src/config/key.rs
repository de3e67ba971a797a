//! What one configuration key is: [`Key`] (its name, allowed values, default, variable, doc and
//! setter), the value it is given ([`Setting`]: a [`RawValue`] from an [`Origin`]) and a table of
//! keys over some settings ([`KeyTable`]: the library's over [`super::Config`], a front end's over
//! its own). The loader (`config/mod.rs`) finds a key in the tables and calls its setter; this file
//! knows nothing of any particular key.

use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where a value came from, for error messages.
#[derive(Debug, Clone)]
pub enum Origin {
    File(PathBuf),
    /// A line of a config file (1-based): errors read `config.toml:12: runtime.threads = …`.
    FileLine(PathBuf, usize),
    Env(&'static str),
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::FileLine(p, line) => write!(f, "{}:{line}", p.display()),
            Origin::Env(v) => write!(f, "environment {v}"),
            Origin::Flag(s) => write!(f, "flag {s}"),
        }
    }
}

/// A value as given: a TOML value from a file, or text from the environment or a flag.
#[derive(Debug, Clone)]
pub enum RawValue {
    Toml(toml::Value),
    Text(String),
}

impl fmt::Display for RawValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawValue::Toml(v) => write!(f, "{v}"),
            RawValue::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// The allowed values of a switch, as messages say them.
pub const TRUE_FALSE: &str = "true, false";

/// Everything said about a key, whatever settings it sets.
#[derive(Debug, Clone, Copy)]
pub struct About {
    /// The dotted key. A segment `<a|b|c>` stands for any one of those names (`stages.<llm|…>.threads`);
    /// a last segment `<name>` for the rest of the key, any name (`voices.aliases.<name>`), and
    /// also for none, so that the setter can say what the table itself must hold.
    pub name: &'static str,
    /// What values are allowed, as an error message says it (`allowed: …`).
    pub allowed: &'static str,
    /// The built-in default as config.toml writes it (TOML); `None` where it is found at run time
    /// (then [`About::default_is`] says what it is).
    pub default: Option<&'static str>,
    /// What the default is when it is a place found at run time (`cosy doctor`: "the default: …").
    pub default_is: Option<&'static str>,
    /// The `COSY_*` variable that sets it, if any.
    pub env: Option<&'static str>,
    /// One line on what it does (config.toml says more).
    pub doc: &'static str,
}

/// Stores a key's value in the settings `T`, or refuses it ([`Setting`] has the parsers and the
/// messages).
pub type Setter<T> = fn(&mut T, &Setting<'_>) -> Result<()>;

/// One configuration key: adding a key is adding one of these to a table (docs/architecture.md,
/// "Adding a config key").
pub struct Key<T: 'static> {
    pub about: About,
    pub set: Setter<T>,
}

impl<T> Key<T> {
    /// A key with a literal default (TOML text, as config.toml writes it).
    pub const fn new(name: &'static str, default: &'static str, allowed: &'static str, set: Setter<T>) -> Self {
        Key { about: About { name, allowed, default: Some(default), default_is: None, env: None, doc: "" }, set }
    }

    /// A key whose default is found at run time (a user folder): `default_is` says what it is.
    pub const fn found(name: &'static str, default_is: &'static str, allowed: &'static str, set: Setter<T>) -> Self {
        Key { about: About { name, allowed, default: None, default_is: Some(default_is), env: None, doc: "" }, set }
    }

    /// The `COSY_*` variable that sets it too.
    pub const fn env(mut self, var: &'static str) -> Self {
        self.about.env = Some(var);
        self
    }

    pub const fn doc(mut self, doc: &'static str) -> Self {
        self.about.doc = doc;
        self
    }

    /// What a literal default (`""`) stands for, when it is a place found at run time.
    pub const fn default_is(mut self, what: &'static str) -> Self {
        self.about.default_is = Some(what);
        self
    }
}

/// An old name of a key, still read. `why`: the key was renamed, and reading it says so (a
/// warning; a refusal names both); `None`: another spelling, read without a word.
#[derive(Debug, Clone, Copy)]
pub struct Renamed {
    /// The old name; placeholders as in [`About::name`], at the same places as in `new`.
    pub old: &'static str,
    pub new: &'static str,
    pub why: Option<&'static str>,
}

impl Renamed {
    /// The key `key` now is, if it is this old name (placeholders carried over).
    pub fn rename(&self, key: &str) -> Option<String> {
        matches(self.old, key)?;
        let given: Vec<&str> = key.split('.').collect();
        let new: Vec<&str> = self.new.split('.').enumerate().map(|(i, p)| if is_placeholder(p) { given.get(i).copied().unwrap_or(p) } else { p }).collect();
        Some(new.join("."))
    }
}

/// A table of keys over some settings, with the settings it fills: what `Config::load_with` sets
/// beside the library's own keys (the library's table is one too).
pub trait KeyTable {
    /// What each key is, in the table's order.
    fn about(&self) -> Vec<&'static About>;
    /// Old names still read.
    fn renamed(&self) -> &'static [Renamed];
    /// Sets key `index` (of [`KeyTable::about`]) from `setting`.
    fn set(&mut self, index: usize, setting: &Setting<'_>) -> Result<()>;
}

/// A static table of keys over `T`, with the `T` it fills.
pub struct Section<'a, T: 'static> {
    keys: &'static [Key<T>],
    renamed: &'static [Renamed],
    settings: &'a mut T,
}

impl<'a, T> Section<'a, T> {
    pub fn new(keys: &'static [Key<T>], renamed: &'static [Renamed], settings: &'a mut T) -> Self {
        Section { keys, renamed, settings }
    }
}

impl<T> KeyTable for Section<'_, T> {
    fn about(&self) -> Vec<&'static About> {
        self.keys.iter().map(|k| &k.about).collect()
    }

    fn renamed(&self) -> &'static [Renamed] {
        self.renamed
    }

    fn set(&mut self, index: usize, setting: &Setting<'_>) -> Result<()> {
        let key = self.keys.get(index).ok_or_else(|| Error::Config(format!("{}: no key number {index}", setting.shown)))?;
        (key.set)(self.settings, setting)
    }
}

fn is_placeholder(segment: &str) -> bool {
    segment.starts_with('<') && segment.ends_with('>')
}

/// Whether `key` is the key `pattern` names ([`About::name`]): the names its placeholders stand
/// for, in order (a last `<name>` with nothing left: an empty list for it).
pub fn matches(pattern: &str, key: &str) -> Option<Vec<String>> {
    let pattern: Vec<&str> = pattern.split('.').collect();
    let given: Vec<&str> = key.split('.').collect();
    let mut captured = Vec::new();
    for (i, p) in pattern.iter().enumerate() {
        let free_name = is_placeholder(p) && !p.contains('|');
        if free_name && i + 1 == pattern.len() {
            if given.len() > i {
                captured.push(given[i..].join("."));
            }
            return Some(captured);
        }
        let g = given.get(i)?;
        if is_placeholder(p) {
            p[1..p.len() - 1].split('|').any(|alt| alt == *g).then_some(())?;
            captured.push(g.to_string());
        } else if p != g {
            return None;
        }
    }
    (given.len() == pattern.len()).then_some(captured)
}

/// One value given to one key: what a [`Setter`] reads, and the messages it refuses it with
/// (every one names where the value came from and the key).
pub struct Setting<'a> {
    /// The key as the messages name it (a renamed key: `server.max_queue (now engine.max_queue)`).
    pub shown: &'a str,
    pub value: &'a RawValue,
    pub origin: &'a Origin,
    /// The folder relative paths are relative to (a config file's); `None`: the current folder.
    pub base: Option<&'a Path>,
    /// The key's [`About::allowed`].
    pub allowed: &'static str,
    /// What the key's placeholders stand for ([`matches`]).
    pub names: &'a [String],
}

impl Setting<'_> {
    /// The value is not one of [`About::allowed`].
    pub fn invalid(&self) -> Error {
        self.invalid_as(self.allowed)
    }

    /// The value is not one of `allowed` (where one key has more than one way to be wrong).
    pub fn invalid_as(&self, allowed: &str) -> Error {
        self.refuse_value(&format!("invalid value; allowed: {allowed}"))
    }

    /// `{origin}: {key} = {value}: {why}`.
    pub fn refuse_value(&self, why: &str) -> Error {
        Error::Config(format!("{}: {} = {}: {why}", self.origin, self.shown, self.value))
    }

    /// `{origin}: {key}: {why}`, without the value (a secret, or a key that is wrong itself).
    pub fn refuse(&self, why: &str) -> Error {
        Error::Config(format!("{}: {}: {why}", self.origin, self.shown))
    }

    /// What placeholder `i` of the key's name stands for (`stages.<…>.x`: the group).
    pub fn name(&self, i: usize) -> Option<&str> {
        self.names.get(i).map(String::as_str)
    }

    /// Text (trimmed), if the value is text.
    pub fn text(&self) -> Option<String> {
        text_of(self.value)
    }

    /// Whether the value is blank text (`""`: for many keys, "not set").
    pub fn is_blank(&self) -> bool {
        self.text().is_some_and(|s| s.is_empty())
    }

    /// Text, else [`Setting::invalid`].
    pub fn text_or_invalid(&self) -> Result<String> {
        self.text().ok_or_else(|| self.invalid())
    }

    /// true/false (also `1`, `yes`, `on`, … as text), else [`Setting::invalid`].
    pub fn boolean(&self) -> Result<bool> {
        match self.value {
            RawValue::Toml(toml::Value::Boolean(b)) => Some(*b),
            RawValue::Text(s) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Some(true),
                "false" | "0" | "no" | "off" => Some(false),
                _ => None,
            },
            RawValue::Toml(_) => None,
        }
        .ok_or_else(|| self.invalid())
    }

    /// An integer in `range` that fits `N`, else [`Setting::invalid`].
    pub fn int_in<N: TryFrom<i64>>(&self, range: RangeInclusive<i64>) -> Result<N> {
        self.int().filter(|i| range.contains(i)).and_then(|i| N::try_from(i).ok()).ok_or_else(|| self.invalid())
    }

    fn int(&self) -> Option<i64> {
        match self.value {
            RawValue::Toml(toml::Value::Integer(i)) => Some(*i),
            RawValue::Text(s) => s.trim().parse().ok(),
            RawValue::Toml(_) => None,
        }
    }

    /// A finite number (an integer is one too).
    pub fn float(&self) -> Option<f64> {
        match self.value {
            RawValue::Toml(toml::Value::Float(f)) => Some(*f),
            RawValue::Toml(toml::Value::Integer(i)) => Some(*i as f64),
            RawValue::Text(s) => s.trim().parse().ok(),
            RawValue::Toml(_) => None,
        }
        .filter(|f: &f64| f.is_finite())
    }

    /// An integer >= 1.
    pub fn positive(&self) -> Option<usize> {
        self.int().filter(|&i| i >= 1).and_then(|i| usize::try_from(i).ok())
    }

    /// A manifest-backed value: `""` is the model's value (`None`); anything else must `parse`,
    /// else [`Setting::invalid`].
    pub fn model_backed<T>(&self, parse: impl Fn(&Self) -> Option<T>) -> Result<Option<T>> {
        if self.is_blank() {
            return Ok(None);
        }
        parse(self).map(Some).ok_or_else(|| self.invalid())
    }

    /// A path, relative to [`Setting::base`]; empty is refused: it would silently mean the current
    /// folder (or the config file's).
    pub fn path(&self) -> Result<PathBuf> {
        let s = self.text_or_invalid()?;
        if s.is_empty() {
            return Err(self.invalid_as("a path, not empty (\".\" for the current folder)"));
        }
        let p = PathBuf::from(s);
        Ok(match self.base {
            Some(b) if p.is_relative() => b.join(p),
            _ => p,
        })
    }

    /// A path, or `None` for `""` (the key's default).
    pub fn path_or_default(&self) -> Result<Option<PathBuf>> {
        if self.text_or_invalid()?.is_empty() {
            return Ok(None);
        }
        self.path().map(Some)
    }

    /// A list of names: a TOML array of strings, or comma-separated text.
    pub fn list(&self) -> Option<Vec<String>> {
        match self.value {
            RawValue::Toml(toml::Value::Array(items)) => items.iter().map(|i| i.as_str().map(str::to_string)).collect(),
            RawValue::Toml(toml::Value::String(s)) | RawValue::Text(s) => Some(s.split(',').map(str::to_string).collect()),
            RawValue::Toml(_) => None,
        }
    }
}

/// Text (trimmed), if `v` is text.
pub fn text_of(v: &RawValue) -> Option<String> {
    match v {
        RawValue::Toml(toml::Value::String(s)) | RawValue::Text(s) => Some(s.trim().to_string()),
        RawValue::Toml(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_families_and_free_names() {
        assert_eq!(matches("runtime.threads", "runtime.threads"), Some(vec![]));
        assert_eq!(matches("runtime.threads", "runtime.thread"), None);
        assert_eq!(matches("stages.<llm|dit>.threads", "stages.dit.threads"), Some(vec!["dit".to_string()]));
        assert_eq!(matches("stages.<llm|dit>.threads", "stages.vocoder.threads"), None);
        assert_eq!(matches("stages.<llm|dit>.threads", "stages.dit.threads.x"), None);
        assert_eq!(matches("voices.aliases.<name>", "voices.aliases.a.b"), Some(vec!["a.b".to_string()]));
        assert_eq!(matches("voices.aliases.<name>", "voices.aliases"), Some(vec![]));
        assert_eq!(matches("voices.aliases.<name>", "voices"), None);
        let r = Renamed { old: "stages.<llm|dit>.provider", new: "stages.<llm|dit>.providers", why: None };
        assert_eq!(r.rename("stages.llm.provider").as_deref(), Some("stages.llm.providers"));
        assert_eq!(r.rename("stages.llm.providers"), None);
    }
}
