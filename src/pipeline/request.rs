//! What a request is (text, voice, options), what it gives back, and the rules its options and
//! text must meet before any work is done.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndarray::Array2;

use crate::error::{Error, Result};
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
    /// `instruction`; no prompt audio is read.
    Saved { voice: Arc<SavedVoice>, instruction: Option<String> },
    /// A prompt recording already in memory (decoded with [`crate::frontend::audio::decode_bytes`]
    /// or [`crate::frontend::audio::from_pcm`]): zero-shot with a transcript, instruct with an
    /// instruction, cross-lingual with neither. `label` names it in messages.
    Recording { audio: Arc<Audio>, label: PathBuf, transcript: Option<String>, instruction: Option<String> },
}

impl Voice {
    /// The prompt recording, if this voice is given by one.
    pub(super) fn wav(&self) -> Option<&Path> {
        match self {
            Voice::ZeroShot { wav, .. } | Voice::CrossLingual { wav } | Voice::Instruct { wav, .. } => Some(wav),
            Voice::Saved { .. } | Voice::Recording { .. } => None,
        }
    }
    pub(super) fn mode(&self) -> PromptMode {
        match self {
            Voice::ZeroShot { transcript, .. } => PromptMode::ZeroShot { transcript: transcript.clone() },
            Voice::CrossLingual { .. } => PromptMode::CrossLingual,
            Voice::Instruct { instruction, .. } | Voice::Saved { instruction: Some(instruction), .. } => {
                PromptMode::Instruct { instruction: instruction.clone() }
            }
            Voice::Saved { voice, instruction: None } => PromptMode::ZeroShot { transcript: voice.transcript.clone() },
            Voice::Recording { transcript: Some(transcript), .. } => PromptMode::ZeroShot { transcript: transcript.clone() },
            Voice::Recording { instruction: Some(instruction), .. } => PromptMode::Instruct { instruction: instruction.clone() },
            Voice::Recording { .. } => PromptMode::CrossLingual,
        }
    }
}

/// Hooks into a running synthesis, for event logs and cancellation. The LLM calls run on the
/// LLM thread and the rest on the token-to-wav thread, hence `Sync`.
pub trait SynthesisObserver: Sync {
    /// The LLM emitted token number `index` (from 0) of sentence `sentence`.
    fn llm_token(&self, _sentence: usize, _index: usize, _token: i64) {}
    /// The LLM finished sentence `sentence` after `tokens` tokens.
    fn llm_done(&self, _sentence: usize, _tokens: usize, _termination: Termination) {}
    /// Polled after every token and before every flow call; `true` stops the LLM and the
    /// token-to-wav worker, and the synthesis returns [`Error::Cancelled`].
    fn cancelled(&self) -> bool {
        false
    }
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
    /// Mel time-stretch (offline only); 1.0 = unchanged.
    pub speed: f64,
    /// Sampling seed; `None` = the configured `sampling.seed`.
    pub seed: Option<u64>,
    /// Use the streaming chunk schedule.
    pub stream: bool,
    /// Benchmark/test knob, not the official behaviour: decode exactly this many speech tokens
    /// per sentence, stop ids masked (see [`DecodeOptions::ignore_stop_until`]). `None` = official.
    pub ignore_stop_until: Option<usize>,
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
        return Err(Error::Input("--speed works only without --stream (the official code refuses it too)".into()));
    }
    Ok(())
}

/// Whether a request streams: as asked (`Some`), else `default` unless a speed is set (the
/// streaming schedule cannot time-stretch, so a sentence with a speed is made whole).
pub fn choose_streaming(asked: Option<bool>, default: bool, speed: f64) -> bool {
    asked.unwrap_or(default && speed == 1.0)
}

/// Refuses a speed outside [`SPEED_RANGE`] (and NaN, infinities).
pub fn check_speed(speed: f64) -> Result<()> {
    if speed.is_finite() && SPEED_RANGE.contains(&speed) {
        return Ok(());
    }
    Err(Error::Input(format!(
        "--speed {speed}: use a number from {:.1} to {:.1} (1 = normal, 2 = twice as fast)",
        SPEED_RANGE.start(),
        SPEED_RANGE.end()
    )))
}

/// `text` cut to at most `max` characters, with `…` when it was cut (for messages).
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Refuses a text with nothing to say: empty, only blanks and invisible characters (zero-width
/// spaces and joiners, word joiner, byte-order mark, other format characters), or only
/// punctuation, symbols and emoji.
pub fn check_speakable(text: &str) -> Result<()> {
    let visible = crate::frontend::text::strip_invisible(text);
    if visible.is_empty() {
        return Err(Error::Input(if text.trim().is_empty() {
            "the text is empty; give something to say".into()
        } else {
            "the text is empty (only invisible characters such as zero-width spaces); give something to say".into()
        }));
    }
    if is_only_punctuation(&visible) {
        return Err(Error::Input(format!(
            "the text {:?} has nothing speakable (only punctuation, symbols or emoji); give some words",
            shorten(text.trim(), 40)
        )));
    }
    Ok(())
}

/// `sentence N of M ("its text…")` for messages: 1-based, the text cut to 40 characters and
/// without the system prompt that cross-lingual mode puts in front of it.
pub(super) fn sentence_label(index: usize, count: usize, text: &str) -> String {
    let marker = crate::frontend::tokenizer::ENDOFPROMPT;
    let said = text.rsplit(marker).next().filter(|t| !t.trim().is_empty()).unwrap_or(text);
    format!("sentence {} of {count} ({:?})", index + 1, shorten(said.trim(), 40))
}

/// Refuses a text longer than `limit` characters (`limits.max_text_chars`).
pub fn check_text_length(text: &str, limit: usize) -> Result<()> {
    let n = text.chars().count();
    if n > limit {
        return Err(Error::Input(format!(
            "the text has {n} characters, more than the limit of {limit} (limits.max_text_chars); split it, or raise the limit"
        )));
    }
    Ok(())
}

