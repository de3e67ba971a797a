//! Library errors. Every message names the thing at fault and, where there is one, the fix.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration key or value is invalid.
    #[error("config: {}", one_line(.0))]
    Config(String),
    /// The exported model folder is missing something or does not match its manifest.
    #[error("model folder {}: {}", one_line(&path.display().to_string()), one_line(msg))]
    Model { path: PathBuf, msg: String },
    /// ONNX Runtime could not be loaded or a session failed.
    #[error("onnx runtime: {0}")]
    Runtime(String),
    /// A provider that was asked for is not usable.
    #[error("execution provider {provider}: {msg}")]
    Provider { provider: String, msg: String },
    /// Bad user input (text, audio, voice, options).
    #[error("{}", one_line(.0))]
    Input(String),
    /// A file could not be read or written.
    #[error("{}: {source}", one_line(&path.display().to_string()))]
    Io { path: PathBuf, #[source] source: std::io::Error },
    #[error(transparent)]
    Ort(#[from] ort::Error),
    /// The engine has no free slot for another request (`engine.max_in_flight`).
    #[error("busy: {}", one_line(.0))]
    Busy(String),
    /// The user stopped the work (Ctrl-C).
    #[error("stopped (Ctrl-C)")]
    Cancelled,
}

/// An error message on one line: control characters that came in with user input (a newline in
/// a config key or value, a path, a manifest name) are shown escaped (`\n`).
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn model(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Model { path: path.into(), msg: msg.into() }
    }
}
