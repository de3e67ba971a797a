//! What a request is (text, voice, options), what it gives back, and the rules its options and
//! text must meet before any work is done.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndarray::Array2;

use crate::error::{Error, InputCode, Result};
use crate::frontend::audio::Audio;
use crate::frontend::prompt::PromptMode;
use crate::frontend::text::is_only_punctuation;
use crate::llm::Termination;
use crate::voice::SavedVoice;

/// How the voice is given.
#[derive(Debug, Clone, PartialEq)]
pub enum Voice {
    /// Zero-shot: a prompt recording and its transcript.
    ZeroShot { wav: PathBuf, transcript: String },
    /// Cross-lingual: the recording's voice, no transcript.
    CrossLingual { wav: PathBuf },
    /// Instruct: the recording's voice plus a style instruction.
    Instruct { wav: PathBuf, instruction: String },
    /// A saved voice (`cosy voice add`): zero-shot with its transcript, or instruct with
    /// `instruction`; no prompt audio is read. `lexicon`: its pronunciation lexicon
    /// (`NAME.lexicon.toml` beside it), applied over the global one.
    Saved { voice: Arc<SavedVoice>, instruction: Option<String>, lexicon: Option<Arc<crate::frontend::lexicon::Lexicon>> },
    /// A prompt recording already in memory (decoded with [`crate::frontend::audio::decode_bytes`]
    /// or [`crate::frontend::audio::from_pcm`]): zero-shot with a transcript, instruct with an
    /// instruction, cross-lingual with neither. `label` names it in messages.
    Recording { audio: Arc<Audio>, label: PathBuf, transcript: Option<String>, instruction: Option<String> },
}

impl Voice {
    /// The prompt recording, if this voice is given by one.
    pub(crate) fn wav(&self) -> Option<&Path> {
        match self {
            Voice::ZeroShot { wav, .. } | Voice::CrossLingual { wav } | Voice::Instruct { wav, .. } => Some(wav),
            Voice::Saved { .. } | Voice::Recording { .. } => None,
        }
    }
    pub(crate) fn mode(&self) -> PromptMode {
        match self {
            Voice::ZeroShot { transcript, .. } => PromptMode::ZeroShot { transcript: transcript.clone() },
            Voice::CrossLingual { .. } => PromptMode::CrossLingual,
            Voice::Instruct { instruction, .. } | Voice::Saved { instruction: Some(instruction), .. } => {
                PromptMode::Instruct { instruction: instruction.clone() }
            }
            Voice::Saved { voice, instruction: None, .. } => PromptMode::ZeroShot { transcript: voice.transcript.clone() },
            Voice::Recording { transcript: Some(transcript), .. } => PromptMode::ZeroShot { transcript: transcript.clone() },
            Voice::Recording { instruction: Some(instruction), .. } => PromptMode::Instruct { instruction: instruction.clone() },
            Voice::Recording { .. } => PromptMode::CrossLingual,
        }
    }
}

/// Hooks into a running synthesis, for event logs and cancellation. The LLM calls run on the
/// LLM thread and the rest on the token-to-wav thread, hence `Sync`.
pub trait SynthesisObserver: Sync {
    /// The text the LLM is given for sentence `sentence`, exactly as it was tokenised, and its
    /// tokens: a whole sentence before its LLM runs, or in text-in streaming each piece as it is
    /// tokenised (sentence 0; the LLM takes its tokens as it speaks). The one source of "the
    /// model's text" for a running server (`debug.model_text`); `--dump` writes the same
    /// sentence ([`SentenceRecord::text`]).
    fn text_tokens(&self, _sentence: usize, _text: &str, _tokens: &[i64]) {}
    /// The LLM emitted token number `index` (from 0) of sentence `sentence`.
    fn llm_token(&self, _sentence: usize, _index: usize, _token: i64) {}
    /// The LLM finished sentence `sentence` after `tokens` tokens.
    fn llm_done(&self, _sentence: usize, _tokens: usize, _termination: Termination) {}
    /// All audio of sentence `sentence` has been handed to the request's consumer; it ends at
    /// sample `end` of the request (a player buffering whole sentences releases up to there).
    fn sentence_audio_done(&self, _sentence: usize, _end: usize) {}
    /// Polled after every token and before every flow call; `true` stops the LLM and the
    /// token-to-wav worker, and the synthesis returns [`Error::Cancelled`].
    fn cancelled(&self) -> bool {
        false
    }
    /// Whether to keep each sentence's intermediates and hand them to [`Self::sentence_done`]
    /// (`--dump`); keeping them costs memory, so by default they are not kept.
    fn wants_trace(&self) -> bool {
        false
    }
    /// A sentence finished, with its intermediates (only when [`Self::wants_trace`]); an error
    /// ends the request with it.
    fn sentence_done(&self, _sentence: &SentenceRecord<'_>) -> Result<()> {
        Ok(())
    }
}

/// One finished sentence and what it went through ([`SynthesisObserver::sentence_done`]).
pub struct SentenceRecord<'a> {
    /// From 0, of `count` sentences in the request.
    pub index: usize,
    pub count: usize,
    pub prompt: &'a PromptFeatures,
    pub prompt_text_token: &'a [i64],
    /// The sentence's text exactly as the tokenizer gets it (after Markdown, normalisation, splitting).
    pub text: &'a str,
    pub text_token: &'a [i64],
    pub trace: &'a SegmentTrace,
    pub stream: bool,
    pub sample_rate: u32,
}

/// What one sentence's synthesis went through (filled by the pipeline when dumping).
#[derive(Debug, Clone, Default)]
pub struct SegmentTrace {
    /// Every token the LLM emitted (stop token excluded).
    pub llm_token_raw: Vec<i64>,
    pub termination: Option<Termination>,
    /// After the silent-token filter: what the flow got.
    pub speech_token: Vec<i64>,
    /// `[80, 2·(Ns+N)]` of the final flow call.
    pub flow_mu: Option<Array2<f32>>,
    pub flow_cond: Option<Array2<f32>>,
    /// `[80, T]`: the mel of the last HiFT call (all chunks joined).
    pub flow_mel: Option<Array2<f32>>,
    /// f0 and source of the last HiFT call.
    pub hift_f0: Option<Vec<f32>>,
    pub hift_source: Option<Vec<f32>>,
    pub chunk_samples: Vec<i64>,
    pub waveform: Vec<f32>,
}


/// An observer that observes nothing.
pub struct NoObserver;
impl SynthesisObserver for NoObserver {}

/// One synthesis request.
#[derive(Debug, Clone)]
pub struct Request {
    pub text: String,
    pub voice: Voice,
    /// Run the text frontend (normalisation + sentence splitting), the official default.
    pub text_frontend: bool,
    /// The request's own normalisation switches (`None`: as configured).
    pub normalization: Normalization,
    /// Whether the text is SSML (`frontend::ssml::InputFormat`; default: when it starts with `<speak>`).
    pub input_format: crate::frontend::ssml::InputFormat,
    /// Mel time-stretch (offline only); 1.0 = unchanged.
    pub speed: f64,
    /// Sampling seed; `None` = the configured `sampling.seed`.
    pub seed: Option<u64>,
    /// Use the streaming chunk schedule.
    pub stream: bool,
    /// Benchmark/test knob, not the official behaviour: decode exactly this many speech tokens
    /// per sentence, stop ids masked (see [`crate::llm::DecodeOptions::ignore_stop_until`]).
    /// `None` = official.
    pub ignore_stop_until: Option<usize>,
    /// Test hooks (none by default); the engine refuses them unless started for tests.
    pub test_hooks: TestHooks,
}

impl Request {
    /// A request for `text` in `voice` with the official defaults: text frontend on, speed 1,
    /// the configured seed, offline (not streaming), no test knob.
    pub fn new(text: impl Into<String>, voice: Voice) -> Request {
        Request {
            text: text.into(),
            voice,
            text_frontend: true,
            normalization: Normalization::default(),
            input_format: Default::default(),
            speed: 1.0,
            seed: None,
            stream: false,
            ignore_stop_until: None,
            test_hooks: TestHooks::default(),
        }
    }
}

/// A request's normalisation switches, by category; `None` = as configured (`[text]`). Off means
/// that category's text reaches the model as written (docs/text.md, "The switches").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Normalization {
    /// Read Markdown and chat text as a person would (`text.markdown`); false: the whole text
    /// layer is off (Markdown, URLs, symbols, phone numbers and units as written).
    pub markdown: Option<bool>,
    /// Spell numbers out (`text.numbers`: the official normaliser and English digit runs).
    pub numbers: Option<bool>,
    /// Read bare URLs, e-mail addresses and file paths out (`text.urls`).
    pub urls: Option<bool>,
    /// Read phone numbers digit by digit in groups (`text.phone`).
    pub phone: Option<bool>,
    /// Read unit abbreviations after a number as words (`text.units`).
    pub units: Option<bool>,
    /// What emoji become (`text.symbols`).
    pub symbols: Option<crate::config::Symbols>,
    /// The text is one sentence exactly as [`crate::pipeline::Synthesizer::plan_text`] gave it
    /// (the long-form job, `app::longform`, speaks each planned sentence as a request of its
    /// own): it is said as given, without the text layer again (Markdown, lexicon, pause tags,
    /// normalisation, splitting), which need not give the same text twice; the prompt text is
    /// read as for any request.
    pub as_planned: bool,
}

impl Normalization {
    /// How the text layer reads the text, if it runs: the request's switches over the configured
    /// ones; never without the text frontend (`text_frontend = false` is the text as written).
    /// The one rule that combines a request's switches with the configuration.
    pub fn markdown(&self, configured: crate::config::MarkdownSettings, text_frontend: bool) -> Option<crate::config::MarkdownSettings> {
        let settings = crate::config::MarkdownSettings {
            enabled: self.markdown.unwrap_or(configured.enabled),
            urls: self.urls.unwrap_or(configured.urls),
            phone: self.phone.unwrap_or(configured.phone),
            units: self.units.unwrap_or(configured.units),
            symbols: self.symbols.unwrap_or(configured.symbols),
            ..configured
        };
        (text_frontend && settings.enabled).then_some(settings)
    }

    /// Whether the official frontend spells numbers out: the request's switch, else the
    /// configured one (`text.numbers`).
    pub fn numbers(&self, configured: bool) -> bool {
        self.numbers.unwrap_or(configured)
    }

    /// The categories by name, as `--normalize` takes them.
    pub const CATEGORIES: &'static str = "markdown, numbers, urls, phone, units, symbols";

    /// Sets the switches `spec` names: `CATEGORY=VALUE` pairs separated by commas
    /// (`numbers=off,urls=off,symbols=name`); a switch takes `on`/`off` (or `true`/`false`),
    /// `symbols` takes `drop`, `name` or `keep` (`off` = `keep`: as written).
    pub fn set_from(&mut self, spec: &str) -> Result<()> {
        let bad = |message: String| Error::input(InputCode::Invalid, Some("normalize"), message);
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((category, value)) = pair.split_once('=').map(|(c, v)| (c.trim(), v.trim())) else {
                return Err(bad(format!("--normalize {pair:?}: write CATEGORY=on or CATEGORY=off, as numbers=off (categories: {})", Self::CATEGORIES)));
            };
            if category == "symbols" {
                let symbols = if value == "off" { Some(crate::config::Symbols::Keep) } else { crate::config::Symbols::parse(value) };
                self.symbols = Some(symbols.ok_or_else(|| bad(format!("--normalize symbols={value}: symbols takes drop, name or keep")))?);
                continue;
            }
            let switch = match value {
                "on" | "true" => true,
                "off" | "false" => false,
                _ => return Err(bad(format!("--normalize {category}={value}: write on or off"))),
            };
            let field = match category {
                "markdown" => &mut self.markdown,
                "numbers" => &mut self.numbers,
                "urls" => &mut self.urls,
                "phone" => &mut self.phone,
                "units" => &mut self.units,
                _ => return Err(bad(format!("--normalize {category}={value}: no category {category:?} (categories: {})", Self::CATEGORIES))),
            };
            *field = Some(switch);
        }
        Ok(())
    }
}

/// Points where a test can hold a request, so that a test about slots, queues, drains or
/// hang-ups does not depend on how long a synthesis takes on the machine. The engine accepts
/// them only when built with [`crate::engine::EngineBuilder::test_hooks`] (`debug.test_hooks`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// After its first audio chunk, the request keeps its slot until it is cancelled (a hang-up,
    /// a timeout, a drain cut short); it then ends as cancelled.
    pub hold_after_first_audio: bool,
    /// Decode exactly this many speech tokens per sentence (as [`Request::ignore_stop_until`]):
    /// a request that lasts, whatever the text and the machine.
    pub min_tokens: Option<usize>,
    /// End each segment's speech after this many speech tokens, as if the model had emitted its
    /// stop token there: text-in streaming then ends before its text does (an early end, as the
    /// model's own), whatever the weights sample; a whole-text request's sentences each end there.
    pub max_tokens: Option<usize>,
    /// Slow synthesis down to this real-time factor: each audio chunk is handed over no sooner
    /// than this many times its own duration after the previous one (the first: after the request
    /// started), so a test of playback under slow synthesis does not depend on the machine's speed.
    pub slow_to_rtf: Option<u32>,
}

impl TestHooks {
    /// Whether any hook is asked for.
    pub fn is_set(&self) -> bool {
        self.hold_after_first_audio || self.min_tokens.is_some() || self.max_tokens.is_some() || self.slow_to_rtf.is_some()
    }

    /// The hooks' own rules: `max_tokens` is at least 1 and not below `min_tokens`.
    pub fn check(&self) -> Result<()> {
        match (self.min_tokens, self.max_tokens) {
            (_, Some(0)) => Err(Error::input(
                InputCode::Invalid,
                Some("max_tokens"),
                "test hook max_tokens 0: the speech needs at least one token; use 1 or more",
            )),
            (Some(min), Some(max)) if max < min => Err(Error::input(
                InputCode::Conflict,
                Some("max_tokens"),
                format!("test hooks min_tokens {min} and max_tokens {max} cannot both hold; make max_tokens at least min_tokens"),
            )),
            _ => Ok(()),
        }
    }
}

/// The prompt's features (the frontend part of a request; shared by its sentences). For a saved
/// voice only `speech_token`, `embedding` and `feat` are known; `whisper_mel`, `speech_token_raw`,
/// `fbank` and `feat_raw` are then empty (and not dumped).
#[derive(Debug, Clone)]
pub struct PromptFeatures {
    /// `[128, T16]`
    pub whisper_mel: Array2<f32>,
    pub speech_token_raw: Vec<i64>,
    /// Aligned: used by the LLM (zero-shot) and the flow.
    pub speech_token: Vec<i64>,
    /// `[Tf, 80]`
    pub fbank: Array2<f32>,
    /// `[192]`
    pub embedding: Vec<f32>,
    /// `[F, 80]`
    pub feat_raw: Array2<f32>,
    /// `[2·Ns, 80]`
    pub feat: Array2<f32>,
}

/// What a request produced.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub samples: usize,
    pub sentences: usize,
    pub chunks: usize,
    /// Speech tokens the LLM emitted (before silent-token pruning), all sentences.
    pub speech_tokens: usize,
    /// Text tokens of the sentences said (the tokenizer's, after normalisation; the prompt's
    /// transcript not counted); 0 for text-in streaming.
    pub text_tokens: usize,
    /// Where the request's time went.
    pub stages: StageTimes,
    /// Each sentence said, in order, with where its audio lies in the request's samples (exact:
    /// counted from the chunks; captions and the Python package's timing come from here).
    pub spans: Vec<SentenceSpan>,
}

/// One sentence of a request's audio: its text as the model got it (after normalisation and
/// splitting; for text-in streaming, the pieces a segment took) and its samples
/// `start..start + samples` of the request's audio.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentenceSpan {
    pub text: String,
    pub start: usize,
    pub samples: usize,
}

/// Seconds one request spent waiting for a slot (`queue`, the engine's admission) and in each
/// stage (the pipeline's top-level spans through its own clock, `Profiler::for_request`): the
/// LLM's time includes waiting for its batched steps, the flow's for its batched DiT calls. The
/// LLM runs on the request's thread while flow and HiFT run on its token-to-wav thread, so when
/// streaming the stages overlap and add up to more than the wall time. In text-in streaming the
/// LLM's time also holds its waits for text that has not arrived yet.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    pub queue: f64,
    /// Seconds the request waited for the model to be loaded again after an idle unload
    /// (`engine.idle_unload_s`); 0 when it was in memory.
    pub load: f64,
    pub frontend: f64,
    pub llm: f64,
    pub flow: f64,
    pub hift: f64,
}

impl StageTimes {
    /// The pipeline's stages as `profiler` (made by `Profiler::for_request`) timed them.
    pub fn of(profiler: &crate::profile::Profiler) -> StageTimes {
        StageTimes {
            queue: 0.0,
            load: 0.0,
            frontend: profiler.request_seconds("frontend"),
            llm: profiler.request_seconds("llm"),
            flow: profiler.request_seconds("flow"),
            hift: profiler.request_seconds("hift"),
        }
    }
}


/// The speeds `--speed` takes: the range of the official web UI's speed control (0.5 to 2.0).
/// The official code itself does not bound it, but the change is a linear time-stretch of the
/// mel: far outside this range it is no longer speech, and a tiny speed asks for a huge mel
/// (`--speed 1e-6` would be gigabytes).
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 0.5..=2.0;

/// The speed and streaming rules of a request, in one place: the speed is in [`SPEED_RANGE`],
/// and streaming cannot time-stretch (the official code refuses a speed when streaming too).
pub fn check_options(speed: f64, stream: bool) -> Result<()> {
    check_speed(speed)?;
    if stream && speed != 1.0 {
        return Err(Error::input(
            InputCode::InvalidSpeed,
            Some("speed"),
            format!("speed {speed} works only without streaming (the official code refuses it too); use speed 1, or do not stream"),
        ));
    }
    Ok(())
}

/// The speed of a stretch of SSML at `rate` (`<prosody rate>`) in a request at `speed`: their
/// product, under a request's speed rules ([`check_options`]: in range, not streamed), refused in
/// the markup's name.
pub fn rated_speed(speed: f64, rate: f64, stream: bool) -> Result<f64> {
    let rated = speed * rate;
    check_options(rated, stream).map_err(|e| match e {
        Error::Input { code, message, .. } => Error::Input { code, param: Some("input"), message: format!("<prosody rate> {rate} at speed {speed}: {message}") },
        other => other,
    })?;
    Ok(rated)
}

/// Refuses a speed outside [`SPEED_RANGE`] (and NaN, infinities).
pub fn check_speed(speed: f64) -> Result<()> {
    if speed.is_finite() && SPEED_RANGE.contains(&speed) {
        return Ok(());
    }
    Err(Error::input(
        InputCode::InvalidSpeed,
        Some("speed"),
        format!(
            "speed {speed} is out of range: use a number from {:.1} to {:.1} (1 = normal, 2 = twice as fast)",
            SPEED_RANGE.start(),
            SPEED_RANGE.end()
        ),
    ))
}

/// `text` cut to at most `max` characters, with `…` when it was cut (for messages).
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Refuses a text with nothing to say: empty, only blanks and invisible characters (zero-width
/// spaces and joiners, word joiner, byte-order mark, other format characters), only
/// punctuation, symbols and emoji, or only special tokens (`<|endofprompt|>` with nothing after
/// it).
pub fn check_speakable(text: &str) -> Result<()> {
    // The rule is `has_something_to_say`; what follows only words why it failed.
    if crate::frontend::text::has_something_to_say(text) {
        return Ok(());
    }
    let visible = crate::frontend::text::strip_invisible(text);
    let spoken = crate::frontend::text::strip_invisible(&crate::frontend::text::spoken_part(text));
    if !visible.is_empty() && spoken.is_empty() {
        return Err(Error::input(
            InputCode::InvalidText,
            Some("input"),
            format!(
                "the text {:?} has nothing to speak (only special tokens such as {}, or nothing after the last one); give some words",
                shorten(text.trim(), 40),
                crate::frontend::tokenizer::ENDOFPROMPT
            ),
        ));
    }
    let visible = spoken;
    if visible.is_empty() {
        return Err(Error::input(
            InputCode::InvalidText,
            Some("input"),
            if text.trim().is_empty() {
                "the text is empty; give something to say"
            } else {
                "the text is empty (only invisible characters such as zero-width spaces); give something to say"
            },
        ));
    }
    if is_only_punctuation(&visible) {
        return Err(Error::input(
            InputCode::InvalidText,
            Some("input"),
            format!("the text {:?} has nothing speakable (only punctuation, symbols or emoji); give some words", shorten(text.trim(), 40)),
        ));
    }
    Ok(())
}

/// `sentence N of M ("its text…")` for messages: 1-based, the text cut to 40 characters and
/// without the system prompt that cross-lingual mode puts in front of it.
pub(crate) fn sentence_label(index: usize, count: usize, text: &str) -> String {
    let marker = crate::frontend::tokenizer::ENDOFPROMPT;
    let said = text.rsplit(marker).next().filter(|t| !t.trim().is_empty()).unwrap_or(text);
    format!("sentence {} of {count} ({:?})", index + 1, shorten(said.trim(), 40))
}

/// Refuses text that arrives in pieces once `received` characters in all are more than `limit`
/// (`limits.max_text_chars`): the one rule and message wherever streamed text is counted (a
/// front end's session, `app::text_stream`; the engine's `TextFeed`, which bounds its queue; the
/// pipeline's text-in streaming).
pub fn check_streamed_length(received: usize, limit: usize) -> Result<()> {
    if received > limit {
        return Err(Error::input(
            InputCode::TextTooLong,
            Some("text"),
            format!("the streamed text is longer than limits.max_text_chars = {limit} characters; send the rest in a new session or stream"),
        ));
    }
    Ok(())
}

/// Refuses a text longer than `limit` characters (`limits.max_text_chars`).
pub fn check_text_length(text: &str, limit: usize) -> Result<()> {
    let n = text.chars().count();
    if n > limit {
        return Err(Error::input(
            InputCode::TextTooLong,
            Some("input"),
            format!("the text has {n} characters, more than the limit of {limit} (limits.max_text_chars); split it, or raise the limit"),
        ));
    }
    Ok(())
}


/// Refuses a voice that cannot take text-in streaming, naming the fix: the official
/// bi-streaming puts the text after `<|endofprompt|>`, so it needs a transcript (zero-shot) or an
/// instruction; cross-lingual has no prompt text. (Whether a front end may stream text at all,
/// speed included: `app::speech::can_stream_text`.)
pub fn check_text_streaming(voice: &Voice) -> Result<()> {
    if !matches!(voice.mode(), PromptMode::CrossLingual) {
        return Ok(());
    }
    Err(Error::input(
        InputCode::Conflict,
        Some("voice"),
        "text-in streaming needs a voice with a transcript (zero-shot) or an instruction: cross-lingual mode has no prompt text for <|endofprompt|>",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's switch wins over the configured one, `None` keeps it; without the text
    /// frontend, or with Markdown off, the layer does not run at all.
    #[test]
    fn normalization_switches_combine_request_over_config() {
        use crate::config::{MarkdownSettings, Symbols};
        let configured = MarkdownSettings::ON;
        assert_eq!(Normalization::default().markdown(configured, true), Some(configured));
        assert_eq!(Normalization::default().markdown(configured, false), None);
        assert_eq!(Normalization { markdown: Some(false), ..Default::default() }.markdown(configured, true), None);
        let asked = Normalization { urls: Some(false), phone: Some(true), units: Some(false), symbols: Some(Symbols::Name), ..Default::default() };
        assert_eq!(
            asked.markdown(configured, true),
            Some(MarkdownSettings { urls: false, phone: true, units: false, symbols: Symbols::Name, ..configured })
        );
        let off = MarkdownSettings { enabled: false, ..configured };
        assert_eq!(Normalization { markdown: Some(true), ..Default::default() }.markdown(off, true), Some(configured));
        assert!(Normalization::default().numbers(true));
        assert!(!Normalization { numbers: Some(false), ..Default::default() }.numbers(true));
        assert!(Normalization { numbers: Some(true), ..Default::default() }.numbers(false));
    }

    #[test]
    fn normalize_flags_set_the_switches_they_name() {
        let mut n = Normalization::default();
        n.set_from("numbers=off, urls=off,symbols=name").unwrap();
        n.set_from("phone=on,units=false,markdown=true").unwrap();
        let want = Normalization { markdown: Some(true), numbers: Some(false), urls: Some(false), phone: Some(true), units: Some(false), symbols: Some(crate::config::Symbols::Name), ..Default::default() };
        assert_eq!(n, want);
        n.set_from("symbols=off").unwrap();
        assert_eq!(n.symbols, Some(crate::config::Symbols::Keep));
        for (bad, says) in [("numbers", "write CATEGORY=on"), ("dates=off", "no category \"dates\""), ("units=maybe", "write on or off"), ("symbols=on", "drop, name or keep")] {
            let e = Normalization::default().set_from(bad).expect_err(bad);
            assert!(matches!(e, Error::Input { code: InputCode::Invalid, .. }) && e.to_string().contains(says), "{bad}: {e}");
        }
    }

    /// Text that is only special tokens has nothing to speak (issue 30: `<|endofprompt|>` alone was
    /// synthesised); what follows the last `<|endofprompt|>` is what is spoken.
    #[test]
    fn only_special_tokens_are_nothing_to_speak() {
        for text in ["<|endofprompt|>", " <|endofprompt|> ", "Speak slowly.<|endofprompt|>", "<|en|><|endofprompt|>\u{200b}"] {
            let e = check_speakable(text).expect_err(text);
            assert!(matches!(e, Error::Input { code: InputCode::InvalidText, .. }), "{e:?}");
            assert!(e.to_string().contains("nothing to speak"), "{e}");
        }
        let e = check_speakable("Speak slowly.<|endofprompt|>?!").expect_err("only punctuation after the marker");
        assert!(e.to_string().contains("only punctuation"), "{e}");
        for text in ["You are a helpful assistant.<|endofprompt|>Hello there.", "<|en|>Hello", "a <| b |> c", "Hello"] {
            assert!(check_speakable(text).is_ok(), "{text}");
        }
    }

    /// The streamed-text cutter's test (`frontend::text::has_something_to_say`) is this rule.
    #[test]
    fn has_something_to_say_is_check_speakable() {
        let texts = [
            "", " ", "\u{200b}\u{feff}", "?!", "… ", "🙂", "<|endofprompt|>", "Speak.<|endofprompt|>?!", "<|en|>Hello", "a <| b |> c", "Hello.", " 3 ",
        ];
        for text in texts {
            assert_eq!(crate::frontend::text::has_something_to_say(text), check_speakable(text).is_ok(), "{text:?}");
        }
    }
}
