//! Library errors. Every message names the thing at fault and, where there is one, the fix.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration key or value is invalid.
    #[error("config: {0}")]
    Config(String),
    /// The exported model folder is missing something or does not match its manifest.
    #[error("model folder {}: {msg}", path.display())]
    Model { path: PathBuf, msg: String },
    /// ONNX Runtime could not be loaded or a session failed.
    #[error("onnx runtime: {0}")]
    Runtime(String),
    /// A provider that was asked for is not usable.
    #[error("execution provider {provider}: {msg}")]
    Provider { provider: String, msg: String },
    /// Bad user input (text, audio, voice, options).
    #[error("{0}")]
    Input(String),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, #[source] source: std::io::Error },
    #[error(transparent)]
    Ort(#[from] ort::Error),
    /// The user stopped the work (Ctrl-C).
    #[error("stopped (Ctrl-C)")]
    Cancelled,
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn model(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Model { path: path.into(), msg: msg.into() }
    }
}
