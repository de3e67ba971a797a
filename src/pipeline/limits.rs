//! What a request must fit before any model runs: the prompt's length (every stage's minimum,
//! the speech tokenizer's 30 s, and the model's fixed-length flow noise) and each sentence's
//! worst-case length, and finite prompt features.
//!
//! **Flow noise.** The CFM solve starts from a fixed noise tensor (`flow.noise` in
//! `side.safetensors`, `[80, noise_frames]`: 15000 frames = 300 s in an official export, 1500 in
//! the bundled tiny model) that must cover the prompt mel *and* the generated mel of a sentence
//! (the official code slices `rand_noise[:, :, :len]` and fails past its end). A sentence of `n`
//! text tokens may become up to `max_len = int(n · max_token_text_ratio)` speech tokens, i.e.
//! `token_mel_ratio · max_len` mel frames. So:
//! * up front, from the prompt audio's length alone: prompt frames + the frames of a one-token
//!   sentence must fit ([`Synthesizer::max_prompt_seconds`]);
//! * per sentence, the LLM's `max_len` is capped at what the noise leaves beside the prompt. The
//!   official loop can stop at any step (its `min_len` masks a single id), so a sentence whose
//!   *possible* length exceeds the noise is not refused: most stop long before. One that reaches
//!   the cap is an error naming the sentence (the official code fails in the flow there), so
//!   every output the official code produces, cosy produces too, and nothing cut off passes as
//!   complete. A forced token count (`--min-tokens`) is checked up front.

use std::path::Path;

use super::{ModelConstants, PromptFeatures, Synthesizer};
use crate::error::{Error, Result};
use crate::frontend::audio::{check_length, over_limit, samples_at, Audio, MAX_TOKENIZER_SECONDS};
use crate::model::ModelDir;
use crate::side::SideFile;

/// The longest prompt a model takes, in seconds, rounded down to 0.01 s (so that a prompt of
/// exactly the stated length fits): the speech tokenizer's 30 s, the manifest's
/// `max_prompt_seconds`, and what the flow noise (`noise_frames` mel frames) leaves beside the
/// prompt for a one-token sentence (29.2 s for the bundled tiny model, 30 s for a real export).
pub fn prompt_limit_seconds(constants: &ModelConstants, noise_frames: usize) -> f64 {
    let rate = f64::from(constants.sample_rate) / constants.source.samples_per_frame.max(1) as f64;
    let min_sentence = constants.stream.token_mel_ratio * constants.llm.length_bounds(1).1;
    let noise_secs = noise_frames.saturating_sub(min_sentence) as f64 / rate;
    let limit = MAX_TOKENIZER_SECONDS.min(constants.max_prompt_seconds).min(noise_secs);
    ((limit * 100.0) + 1e-6).floor() / 100.0
}

/// [`prompt_limit_seconds`] of a model folder, from its manifest and the shape of its flow noise
/// (nothing is loaded: the side file is mapped and only its header read).
pub fn model_prompt_limit(dir: &ModelDir) -> Result<f64> {
    let constants = ModelConstants::from_manifest(dir)?;
    let side = dir
        .manifest
        .files
        .get("side")
        .map(|f| dir.path_of(&f.file))
        .ok_or_else(|| Error::model(&dir.root, "manifest.json lists no side file"))?;
    let noise = match SideFile::open(&side)?.shape("flow.noise")?.as_slice() {
        &[_, n] => n,
        other => return Err(Error::model(&dir.root, format!("side flow.noise has shape {other:?}, expected [80, frames]"))),
    };
    check_noise_frames(dir, &constants, noise)?;
    Ok(prompt_limit_seconds(&constants, noise))
}

/// Refuses a flow noise of `frames` mel frames (the side file's `flow.noise`) that holds nothing,
/// or that differs from the manifest's `constants.noise_frames`: one of the two is damaged, and
/// the prompt limit and every sentence's room are computed from it.
pub(super) fn check_noise_frames(dir: &ModelDir, constants: &ModelConstants, frames: usize) -> Result<()> {
    let problem = match constants.noise_frames {
        _ if frames == 0 => "side.safetensors: flow.noise has no frames".to_string(),
        Some(stated) if stated != frames => {
            format!("manifest.json: constants.noise_frames = {stated}, but side.safetensors's flow.noise has {frames} frames")
        }
        _ => return Ok(()),
    };
    Err(Error::model(&dir.root, format!("{problem}; re-export the model")))
}

impl Synthesizer {
    /// Mel frames per second of the flow (sample rate / samples per frame; 50 for CosyVoice3).
    fn mel_frame_rate(&self) -> f64 {
        f64::from(self.data.constants.sample_rate) / self.data.constants.source.samples_per_frame.max(1) as f64
    }

    /// Flow frames the longest output of a one-token sentence may take.
    fn min_sentence_frames(&self) -> usize {
        self.stream_params.token_mel_ratio * self.data.constants.llm.length_bounds(1).1
    }

    /// The longest prompt this model takes, in seconds ([`prompt_limit_seconds`]).
    pub fn max_prompt_seconds(&self) -> f64 {
        prompt_limit_seconds(&self.data.constants, self.data.noise.ncols())
    }

    /// Refuses, from its length alone, a prompt some stage cannot take: shorter than every stage's
    /// minimum, or longer than [`Self::max_prompt_seconds`] (one limit, named the same way as
    /// before the model is loaded: `app::voices::Voices::prompt_limit`).
    pub(super) fn check_prompt_audio(&self, audio: &Audio, wav: &Path) -> Result<()> {
        let limit = self.max_prompt_seconds();
        check_length(audio, wav, limit)?;
        let hop = self.data.constants.source.samples_per_frame.max(1) as u64;
        let mel_frames = samples_at(audio, self.data.constants.sample_rate) / hop;
        // Aligned prompt frames: an even count (1 token : 2 frames), at most the mel's.
        let prompt_frames = (mel_frames - mel_frames % 2) as usize;
        if prompt_frames + self.min_sentence_frames() > self.data.noise.ncols() {
            // A sample's rounding past the limit: the same message.
            let (long, limit) = over_limit(audio.seconds().max(limit), limit);
            return Err(Error::invalid(format!(
                "prompt audio {}: is {long} s long; this model takes at most {limit} s of prompt; cut the prompt shorter",
                wav.display(),
            )));
        }
        Ok(())
    }

    /// Speech tokens the flow noise leaves room for beside `prompt` (a sentence's cap).
    pub(super) fn noise_room_tokens(&self, prompt: &PromptFeatures) -> usize {
        let ratio = self.stream_params.token_mel_ratio.max(1);
        self.data.noise.ncols().saturating_sub(ratio * prompt.speech_token.len()) / ratio
    }

    /// Refuses, before the LLM runs, a forced token count (`--min-tokens`, benchmarks only) whose
    /// speech cannot fit the flow noise beside the prompt. Without it nothing is refused here:
    /// the official loop may stop at any step, so only decoding shows whether a sentence
    /// outgrows the noise ([`Self::outgrown_noise`] says so then).
    pub(super) fn check_forced_tokens(&self, prompt: &PromptFeatures, forced: Option<usize>) -> Result<()> {
        let room = self.noise_room_tokens(prompt);
        match forced {
            Some(n) if n > room => Err(Error::invalid(format!(
                "--min-tokens {n}: beside this {:.1} s prompt the model's flow noise ({:.1} s) leaves room for {room} \
                 speech tokens; ask for fewer",
                (self.stream_params.token_mel_ratio * prompt.speech_token.len()) as f64 / self.mel_frame_rate(),
                self.data.noise.ncols() as f64 / self.mel_frame_rate(),
            ))),
            _ => Ok(()),
        }
    }

    /// The error for a sentence whose speech reached the end of the flow noise. The LLM was
    /// capped there (the official code would fail in the flow at that point), so no output of a
    /// cut-off sentence is passed off as complete.
    pub(super) fn outgrown_noise(&self, prompt: &PromptFeatures, sentence: &str) -> Error {
        let ratio = self.stream_params.token_mel_ratio;
        let rate = self.mel_frame_rate();
        let prompt_frames = ratio * prompt.speech_token.len();
        let noise = self.data.noise.ncols();
        Error::invalid(format!(
            "{sentence}: its speech ran past {:.1} s, all that the model's flow noise ({:.1} s) leaves beside the \
             {:.1} s prompt; split the text into shorter sentences, or use a shorter prompt",
            noise.saturating_sub(prompt_frames) as f64 / rate,
            noise as f64 / rate,
            prompt_frames as f64 / rate,
        ))
    }
}

/// Refuses a prompt feature that is not all finite (it would make a silent or NaN output).
pub(super) fn check_finite<'a>(wav: &Path, what: &str, values: impl IntoIterator<Item = &'a f32>) -> Result<()> {
    if values.into_iter().any(|v| !v.is_finite()) {
        return Err(Error::invalid(format!(
            "prompt audio {}: its {what} has NaN or infinite values; re-export the recording (16-bit wav) and try again",
            wav.display()
        )));
    }
    Ok(())
}
