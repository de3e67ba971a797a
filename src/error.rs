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
    /// The ONNX Runtime library could not be loaded: not found, not a library, too old. The
    /// message names the file and says how to fix it.
    #[error("{0}")]
    Library(String),
    /// Something failed inside cosy while it worked, not because of the input: a stage's graph
    /// gave an output of the wrong shape, a worker thread stopped or could not start, a session
    /// could not be created, a cache could not be written. The message names the part that failed.
    #[error("internal error: {0}")]
    Runtime(String),
    /// A provider that was asked for is not usable.
    #[error("execution provider {provider}: {msg}")]
    Provider { provider: String, msg: String },
    /// Bad user input (text, audio, voice, options): what kind of mistake (`code`), the request
    /// parameter it is about when there is one (`param`, as the HTTP API names it), and a message
    /// that names the thing and the fix. Front ends map `code` to their own status (HTTP 400/404/
    /// 409, exit 2) and show `message` as it is, so every front end says the same words.
    #[error("{}", one_line(message))]
    Input { code: InputCode, param: Option<&'static str>, message: String },
    /// A file could not be read or written.
    #[error("{}: {source}", one_line(&path.display().to_string()))]
    Io { path: PathBuf, #[source] source: std::io::Error },
    /// A file cosy writes could not be written: the disk is full, a quota is reached, the folder
    /// is read-only or not ours. The message names the final path (never a temporary file), the
    /// fault in words and the fix (built by `fsx::Dest::error`).
    #[error("{}", one_line(message))]
    Storage { path: PathBuf, fault: StorageFault, message: String },
    #[error(transparent)]
    Ort(#[from] ort::Error),
    /// The engine has no free slot for another request (`engine.max_in_flight`).
    #[error("busy: {}", one_line(.0))]
    Busy(String),
    /// The work was stopped before it finished: a client that went away, a dropped or cancelled
    /// request handle, a player that was cancelled, Ctrl-C. A front end that knows which says so
    /// itself (the command line: "stopped (Ctrl-C)").
    #[error("cancelled: the request was stopped before it finished")]
    Cancelled,
}

/// Why a write failed ([`Error::Storage`]): front ends choose their answer by it (HTTP 507 for a
/// full disk or quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// No space left on the device (`ENOSPC`).
    Full,
    /// The user's disk quota is reached (`EDQUOT`).
    Quota,
    /// The file system is mounted read-only (`EROFS`).
    ReadOnly,
    /// The folder or file is not writable by this user (`EACCES`, `EPERM`).
    Denied,
    /// Any other I/O error.
    Other,
}

impl StorageFault {
    /// The fault of an I/O error, by its number or (an error made in a test, a wrapped one) its
    /// kind.
    pub fn of(e: &std::io::Error) -> StorageFault {
        use std::io::ErrorKind as K;
        match (e.raw_os_error(), e.kind()) {
            (Some(libc::ENOSPC), _) | (None, K::StorageFull) => StorageFault::Full,
            (Some(libc::EDQUOT), _) | (None, K::QuotaExceeded) => StorageFault::Quota,
            (Some(libc::EROFS), _) | (None, K::ReadOnlyFilesystem) => StorageFault::ReadOnly,
            (Some(libc::EACCES | libc::EPERM), _) | (None, K::PermissionDenied) => StorageFault::Denied,
            _ => StorageFault::Other,
        }
    }

    /// The disk (or the user's share of it) has no room: the server answers 507.
    pub fn is_full(self) -> bool {
        matches!(self, StorageFault::Full | StorageFault::Quota)
    }
}

/// What kind of input mistake an [`Error::Input`] is. The names ([`InputCode::as_str`]) are
/// the HTTP API's error codes (the same ones the server gave before the rules moved here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputCode {
    /// Malformed or invalid input not covered by a more specific code.
    Invalid,
    /// The text is empty, or has nothing speakable.
    InvalidText,
    /// The text is longer than `limits.max_text_chars`.
    TextTooLong,
    /// A speed outside its range, or a speed while streaming.
    InvalidSpeed,
    /// Options that cannot go together (a transcript and an instruction; text-in streaming
    /// without a transcript).
    Conflict,
    /// A prompt transcript without the recording it transcribes.
    MissingRecording,
    /// A prompt recording that cannot be used (format, length, content).
    InvalidAudio,
    /// A voice name that is not allowed.
    InvalidVoiceName,
    /// No saved voice of that name.
    VoiceNotFound,
    /// A saved voice of that name exists already.
    VoiceExists,
    /// No voice given and no default voice set.
    NoVoice,
    /// A saved voice made for another model.
    InvalidVoice,
    /// A request used a test hook, which the engine refuses unless started for tests.
    TestHooksDisabled,
    /// A book that cannot be read: a damaged or DRM-protected EPUB, a binary file, text that is
    /// not UTF-8, a book with no text (`frontend::book`).
    InvalidBook,
}

impl InputCode {
    pub fn as_str(self) -> &'static str {
        match self {
            InputCode::Invalid | InputCode::InvalidText | InputCode::InvalidBook => "invalid_input",
            InputCode::TextTooLong => "text_too_long",
            InputCode::InvalidSpeed => "invalid_speed",
            InputCode::Conflict => "conflicting_fields",
            InputCode::MissingRecording => "missing_ref_audio",
            InputCode::InvalidAudio => "invalid_ref_audio",
            InputCode::InvalidVoiceName => "invalid_voice_name",
            InputCode::VoiceNotFound | InputCode::NoVoice => "voice_not_found",
            InputCode::VoiceExists => "voice_exists",
            InputCode::InvalidVoice => "voice_model_mismatch",
            InputCode::TestHooksDisabled => "test_hooks_disabled",
        }
    }
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
    /// A bad-input error of kind `code`, about request parameter `param` (if any).
    pub fn input(code: InputCode, param: Option<&'static str>, message: impl Into<String>) -> Self {
        Error::Input { code, param, message: message.into() }
    }
    /// A bad-input error with no more specific kind or parameter.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::input(InputCode::Invalid, None, message)
    }
    /// The same input error about another parameter (a front end that knows which one).
    pub fn about(self, param: &'static str) -> Self {
        match self {
            Error::Input { code, message, .. } => Error::Input { code, param: Some(param), message },
            other => other,
        }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn model(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Model { path: path.into(), msg: msg.into() }
    }
}
