//! Building a request from a front end's options: every rule a request must meet before the
//! engine sees it, in one place, with the same words whichever front end asked.

use crate::config::Config;
use crate::error::Result;
use crate::frontend::ssml::InputFormat;
use crate::request::{check_options, check_speakable, check_text_length, check_text_streaming, Normalization, Request, TestHooks, Voice};

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
    /// Normalisation switches (Markdown …); `None` each = as configured.
    pub normalization: Normalization,
    /// Whether the text is SSML (default: when it starts with `<speak>`).
    pub input_format: InputFormat,
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
            normalization: Normalization::default(),
            input_format: Default::default(),
            min_tokens: None,
            test_hooks: TestHooks::default(),
        }
    }
}

/// Whether a request streams: as asked, else `default` unless a speed is set (the streaming
/// schedule cannot time-stretch, so a request with a speed is made whole, sentence by sentence:
/// `say` plays, and the HTTP API sends, each sentence as it is made).
pub fn choose_streaming(asked: Option<bool>, default: bool, speed: f64) -> bool {
    asked.unwrap_or(default && speed == 1.0)
}

/// The speeds the HTTP API takes: OpenAI's range for its speech endpoint's `speed`.
pub const API_SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.25..=4.0;

/// A speed as the HTTP API received it and as it is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApiSpeed {
    /// What the client asked for (1 when it did not say).
    pub asked: f64,
    /// What is used: `asked` brought into [`crate::request::SPEED_RANGE`].
    pub used: f64,
}

impl ApiSpeed {
    /// Whether the speed used differs from the one asked for.
    pub fn clamped(&self) -> bool {
        self.asked != self.used
    }
}

/// The HTTP API's speed rule: OpenAI's clients may send anything in [`API_SPEED_RANGE`]; cosy
/// speaks [`crate::request::SPEED_RANGE`] (the mel time-stretch stops sounding like speech
/// beyond it), so a speed outside cosy's range but inside OpenAI's is clamped to the nearest end
/// (the front end says so in the response), and one outside OpenAI's range is refused.
pub fn api_speed(asked: Option<f64>) -> Result<ApiSpeed> {
    let asked = asked.unwrap_or(1.0);
    if !(asked.is_finite() && API_SPEED_RANGE.contains(&asked)) {
        return Err(crate::Error::input(
            crate::error::InputCode::InvalidSpeed,
            Some("speed"),
            format!(
                "speed {asked} is out of range: use a number from {} to {} (1 = normal; cosy speaks {} to {} and brings a speed beyond to the nearest)",
                API_SPEED_RANGE.start(),
                API_SPEED_RANGE.end(),
                crate::request::SPEED_RANGE.start(),
                crate::request::SPEED_RANGE.end()
            ),
        ));
    }
    let range = crate::request::SPEED_RANGE;
    Ok(ApiSpeed { asked, used: asked.clamp(*range.start(), *range.end()) })
}

/// The text rules: something speakable, at most `limits.max_text_chars` characters.
pub fn check_text(config: &Config, text: &str) -> Result<()> {
    check_speakable(text)?;
    check_text_length(text, config.limits.max_text_chars)
}

/// A whole-text request, every rule checked (text, speed, streaming with a speed).
pub fn build_request(config: &Config, o: SpeechOptions) -> Result<Request> {
    // SSML that changes its rate (`<prosody rate>`) is made whole, sentence by sentence, unless
    // streaming is asked for, as a speed is: the streaming schedule cannot stretch.
    let default_stream = o.default_stream && !(o.text_frontend && o.input_format.may_change_rate(&o.text));
    let stream = check_all_but_the_voice(config, &o.text, o.stream, default_stream, o.speed)?;
    Ok(Request {
        text: o.text,
        voice: o.voice,
        text_frontend: o.text_frontend,
        normalization: o.normalization,
        input_format: o.input_format,
        speed: o.speed,
        seed: o.seed,
        stream,
        ignore_stop_until: o.min_tokens,
        test_hooks: o.test_hooks,
    })
}

/// Every rule [`build_request`] applies but the voice's (the speed, the schedule, the text), and
/// the schedule: whether the request streams (`asked`, else `default_stream` at speed 1). For a
/// front end that hands the request to a server, which resolves the voice itself (`cosy say`
/// through a running `cosy serve`).
pub fn check_all_but_the_voice(config: &Config, text: &str, asked: Option<bool>, default_stream: bool, speed: f64) -> Result<bool> {
    let stream = choose_streaming(asked, default_stream, speed);
    check_options(speed, stream)?;
    check_text(config, text)?;
    Ok(stream)
}

/// Whether text that arrives in pieces can be spoken as it comes (text-in streaming): the voice
/// needs a transcript or an instruction ([`check_text_streaming`], which says why not), and the
/// speed must be 1 (a speed needs whole sentences).
pub fn can_stream_text(voice: &Voice, speed: f64) -> bool {
    speed == 1.0 && check_text_streaming(voice).is_ok()
}

/// [`can_stream_text`] for text in `format`: text the request says is SSML is read whole (an
/// element may span pieces), never given to the model as it comes.
pub fn can_stream_text_as(voice: &Voice, speed: f64, format: InputFormat) -> bool {
    format != InputFormat::Ssml && can_stream_text(voice, speed)
}

/// Text-in streaming gives the text to the model as it comes: not SSML, which is read whole.
pub fn check_text_in_format(format: InputFormat) -> Result<()> {
    if format == InputFormat::Ssml {
        return Err(crate::Error::input(
            crate::error::InputCode::Conflict,
            Some("input_format"),
            "SSML is read whole, not given to the model piece by piece (text-in streaming): send it sentence by sentence, or as one text",
        ));
    }
    Ok(())
}

/// A text-in streaming request (the text comes later, through the engine's `TextFeed`), every
/// rule checked: a voice with a prompt text, speed 1, no forced token count.
pub fn build_streaming_request(o: SpeechOptions) -> Result<Request> {
    check_text_streaming(&o.voice)?;
    let stream = choose_streaming(o.stream, o.default_stream, 1.0);
    check_options(o.speed, true)?;
    check_text_in_format(o.input_format)?;
    // (The test hook `min_tokens` too: text-in streaming has no forced count; its `max_tokens` works.)
    if o.min_tokens.is_some() || o.test_hooks.min_tokens.is_some() {
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
        normalization: o.normalization,
        input_format: o.input_format,
        speed: 1.0,
        seed: o.seed,
        stream,
        ignore_stop_until: None,
        test_hooks: o.test_hooks,
    })
}
