//! The server's names for the formats it answers in (`response_format`) and their Content-Types:
//! the encoding itself is `crate::encode`'s, shared with `cosy file`.

pub use crate::encode::{AudioFormat, StreamEncoder};
use crate::encode::EncodeError;

use super::error::ApiError;

pub const ALLOWED: &str = "mp3, opus, wav, pcm or flac";

impl AudioFormat {
    pub fn parse(name: &str) -> Result<AudioFormat, ApiError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "mp3" => Ok(AudioFormat::Mp3),
            "opus" => Ok(AudioFormat::Opus),
            "wav" => Ok(AudioFormat::Wav),
            "pcm" => Ok(AudioFormat::Pcm),
            "pcm_f32" => Ok(AudioFormat::PcmF32),
            "flac" => Ok(AudioFormat::Flac),
            "aac" => Err(ApiError::bad_request(
                "unsupported_response_format",
                format!("response_format \"aac\" is not served (no AAC encoder with an open licence builds into cosy); use {ALLOWED} (pcm = s16le mono 24 kHz)"),
            )
            .param("response_format")),
            _ => Err(ApiError::bad_request(
                "invalid_response_format",
                format!("response_format {name:?} is unknown; use {ALLOWED} (pcm = s16le mono 24 kHz)"),
            )
            .param("response_format")),
        }
    }

    /// The configured default (`server.default_format`), checked at start-up.
    pub fn parse_setting(name: &str) -> Result<AudioFormat, String> {
        AudioFormat::parse(name).map_err(|_| format!("server.default_format = {name:?}: use {ALLOWED}"))
    }

    /// The Content-Type OpenAI sends for the format.
    pub fn content_type(self) -> &'static str {
        match self {
            AudioFormat::Mp3 => "audio/mpeg",
            AudioFormat::Opus => "audio/opus",
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Pcm => "audio/pcm",
            AudioFormat::PcmF32 => "audio/x-cosy-pcm-f32le",
            AudioFormat::Flac => "audio/flac",
        }
    }
}

/// An encoder's failure is the server's (500), in the encoder's words.
impl From<EncodeError> for ApiError {
    fn from(e: EncodeError) -> ApiError {
        ApiError::internal(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_formats_list_the_allowed_ones() {
        for name in ["aac", "ogg", ""] {
            let err = AudioFormat::parse(name).expect_err(name);
            assert_eq!(err.status, 400);
            assert!(err.message.contains(ALLOWED), "{}", err.message);
        }
        assert_eq!(AudioFormat::parse(" WAV ").ok(), Some(AudioFormat::Wav));
        assert_eq!(AudioFormat::parse("MP3").ok(), Some(AudioFormat::Mp3));
    }
}
