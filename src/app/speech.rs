//! Building a request from a front end's options: every rule a request must meet before the
//! engine sees it, in one place, with the same words whichever front end asked.

use crate::config::Config;
use crate::error::Result;
use crate::request::{check_options, check_speakable, check_text_length, check_text_streaming, Request, TestHooks, Voice};

/// What a front end asks for, before the rules are applied.
#[derive(Debug, Clone)]
pub struct SpeechOptions {
    pub text: String,
    pub voice: Voice,
    /// Speed (1 = normal); see [`crate::request::SPEED_RANGE`].
    pub speed: f64,
    /// Streaming as asked; `None` = the front end's default (see [`SpeechOptions::default_stream`]).
    pub stream: Option<bool>,
    /// Stream by default (`say`, the WebSocket) or not (`file`, the HTTP API: `streaming.enabled`).
    pub default_stream: bool,
    pub seed: Option<u64>,
    /// Run the text frontend (normalisation, sentence splitting), the official default.
    pub text_frontend: bool,
    /// Benchmark/test knob: decode exactly this many speech tokens per sentence.
    pub min_tokens: Option<usize>,
    pub test_hooks: TestHooks,
}

impl SpeechOptions {
    /// `text` in `voice` with the defaults: speed 1, streaming as `default_stream`, the
    /// configured seed, the text frontend on.
    pub fn new(text: impl Into<String>, voice: Voice, default_stream: bool) -> SpeechOptions {
        SpeechOptions {
            text: text.into(),
            voice,
            speed: 1.0,
            stream: None,
            default_stream,
            seed: None,
            text_frontend: true,
            min_tokens: None,
            test_hooks: TestHooks::default(),
        }
    }
}

/// Whether a request streams: as asked, else `default` unless a speed is set (the streaming
/// schedule cannot time-stretch, so a request with a speed is made whole).
pub fn choose_streaming(asked: Option<bool>, default: bool, speed: f64) -> bool {
    asked.unwrap_or(default && speed == 1.0)
}

/// The text rules: something speakable, at most `limits.max_text_chars` characters.
pub fn check_text(config: &Config, text: &str) -> Result<()> {
    check_speakable(text)?;
    check_text_length(text, config.limits.max_text_chars)
}

/// A whole-text request, every rule checked (text, speed, streaming with a speed).
pub fn build_request(config: &Config, o: SpeechOptions) -> Result<Request> {
    let stream = choose_streaming(o.stream, o.default_stream, o.speed);
    check_options(o.speed, stream)?;
    check_text(config, &o.text)?;
    Ok(Request {
        text: o.text,
        voice: o.voice,
        text_frontend: o.text_frontend,
        speed: o.speed,
        seed: o.seed,
        stream,
        ignore_stop_until: o.min_tokens,
        test_hooks: o.test_hooks,
    })
}

/// Whether text that arrives in pieces can be spoken as it comes (text-in streaming): the voice
/// needs a transcript or an instruction, and the speed must be 1 (a speed needs whole sentences).
pub fn can_stream_text(voice: &Voice, speed: f64) -> bool {
    speed == 1.0 && crate::request::can_stream_text(voice)
}

/// A text-in streaming request (the text comes later, through the engine's `TextFeed`), every
/// rule checked: a voice with a prompt text, speed 1, no forced token count.
pub fn build_streaming_request(o: SpeechOptions) -> Result<Request> {
    check_text_streaming(&o.voice)?;
    let stream = choose_streaming(o.stream, o.default_stream, 1.0);
    check_options(o.speed, true)?;
    if o.min_tokens.is_some() {
        return Err(crate::Error::input(
            crate::error::InputCode::Conflict,
            Some("min_tokens"),
            "text-in streaming does not take a forced token count (min_tokens); drop it, or give the whole text",
        ));
    }
    Ok(Request {
        text: String::new(),
        voice: o.voice,
        text_frontend: o.text_frontend,
        speed: 1.0,
        seed: o.seed,
        stream,
        ignore_stop_until: None,
        test_hooks: o.test_hooks,
    })
}
