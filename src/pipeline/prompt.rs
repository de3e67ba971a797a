//! The prompt side of a request: saved voices made from a recording, and the prompt features
//! (speech tokens, speaker embedding, 24 kHz mel) of a voice.

use std::path::Path;

use ndarray::Array2;

use super::{limits, lock, PromptFeatures, Synthesizer, Voice};
use crate::error::{Error, Result};
use crate::frontend::align::align_prompt;
use crate::frontend::audio::{load_audio, to_rate, Audio};
use crate::frontend::features::{kaldi_fbank_cmn, mel_24k, whisper_log_mel};
use crate::pipeline::stages::{run_campplus, run_speech_tokenizer};
use crate::voice::SavedVoice;

impl Synthesizer {
    /// Computes a saved voice from a prompt recording and its transcript (all prompt-audio work,
    /// once). Refuses an empty transcript.
    pub fn make_voice(&self, name: &str, wav: &Path, transcript: &str) -> Result<SavedVoice> {
        check_voice_args(name, transcript)?;
        let audio = self.profiler.time("frontend.audio_load", || load_audio(wav))?;
        self.voice_of(name, &audio, wav, transcript)
    }

    /// [`Self::make_voice`] from a recording already decoded; `label` names it (and is recorded
    /// as the voice's source).
    pub fn make_voice_from(&self, name: &str, audio: &Audio, label: &Path, transcript: &str) -> Result<SavedVoice> {
        check_voice_args(name, transcript)?;
        self.voice_of(name, audio, label, transcript)
    }

    fn voice_of(&self, name: &str, audio: &Audio, wav: &Path, transcript: &str) -> Result<SavedVoice> {
        let prompt = self.prompt_features_of(audio, wav)?;
        Ok(SavedVoice {
            name: name.to_string(),
            transcript: transcript.to_string(),
            speech_token: prompt.speech_token,
            prompt_feat: prompt.feat,
            embedding: prompt.embedding,
            model_key: self.data.voice_key.clone(),
            model: self.data.model.root.display().to_string(),
            frontend_precision: self.frontend_precision.to_string(),
            source_wav: wav.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            created: crate::voice::utc_now_rfc3339(),
            cosy_version: env!("CARGO_PKG_VERSION").to_string(),
        })
    }

    /// The prompt features of a request's voice ([`Self::prompt_for`]); for a streaming request
    /// the voice's DiT prompt-prefix cache starts loading from disk meanwhile
    /// ([`super::PrefixStore::prefetch`]), so that it is there by the first chunk.
    pub(super) fn prompt_for_request(&self, req: &crate::request::Request) -> Result<PromptFeatures> {
        let prompt = self.prompt_for(&req.voice)?;
        if req.stream {
            if let Some(store) = self.sessions.dit.prefix_store() {
                store.prefetch(&super::prefix_key(&prompt));
            }
        }
        Ok(prompt)
    }

    /// The prompt features of a voice: from the recording, or straight from a saved voice (after
    /// checking that it was made for this model).
    pub fn prompt_for(&self, voice: &Voice) -> Result<PromptFeatures> {
        match voice {
            Voice::Saved { voice, .. } => {
                voice.check_model(&self.data.voice_key, &self.data.model.root)?;
                voice.check_tokens(self.data.constants.llm.stop_token_min)?;
                if voice.prompt_feat.ncols() != self.data.constants.mel_dim || voice.speech_token.is_empty() {
                    return Err(Error::invalid(format!("voice {:?}: stored features do not fit this model", voice.name)));
                }
                Ok(PromptFeatures {
                    whisper_mel: Array2::zeros((0, 0)),
                    speech_token_raw: Vec::new(),
                    speech_token: voice.speech_token.clone(),
                    fbank: Array2::zeros((0, 0)),
                    embedding: voice.embedding.clone(),
                    feat_raw: Array2::zeros((0, 0)),
                    feat: voice.prompt_feat.clone(),
                })
            }
            Voice::Recording { audio, label, .. } => self.prompt_features_of(audio, label),
            other => {
                let wav = other.wav().ok_or_else(|| Error::invalid("the voice has no prompt recording"))?;
                self.prompt_features(wav)
            }
        }
    }

    /// The prompt's features: 16 kHz whisper mel → speech tokens; 16 kHz fbank → campplus
    /// embedding; 24 kHz mel; alignment of tokens and mel.
    pub fn prompt_features(&self, wav: &Path) -> Result<PromptFeatures> {
        let audio = self.profiler.time("frontend.audio_load", || load_audio(wav))?;
        self.prompt_features_of(&audio, wav)
    }

    /// [`Self::prompt_features`] of a recording already decoded; `wav` names it in messages.
    pub fn prompt_features_of(&self, audio: &Audio, wav: &Path) -> Result<PromptFeatures> {
        let prof = &self.profiler;
        // Length limits (every stage's minimum, the tokenizer's 30 s, the flow noise) up front.
        self.check_prompt_audio(audio, wav)?;
        let (wav16, wav24) = prof.time("frontend.resample", || -> Result<_> {
            Ok((to_rate(audio, 16_000, None, wav)?, to_rate(audio, self.data.constants.sample_rate, None, wav)?))
        })?;
        let whisper_mel = prof.time("frontend.whisper_mel", || whisper_log_mel(&wav16));
        let speech_token_raw = prof.time("frontend.speech_tokenizer", || {
            run_speech_tokenizer(&mut lock(&self.sessions.speech_tokenizer), whisper_mel.view())
        })?;
        let fbank = prof.time("frontend.fbank", || kaldi_fbank_cmn(&wav16));
        let embedding = prof.time("frontend.campplus", || run_campplus(&mut lock(&self.sessions.campplus), fbank.view()))?;
        let feat_raw = prof.time("frontend.mel_24k", || mel_24k(&wav24));
        limits::check_finite(wav, "speaker embedding", &embedding)?;
        limits::check_finite(wav, "prompt mel", feat_raw.iter())?;
        let (speech_token, feat) = align_prompt(&speech_token_raw, &feat_raw);
        if speech_token.is_empty() {
            return Err(Error::invalid(format!("prompt audio {}: too short to give any speech token", wav.display())));
        }
        Ok(PromptFeatures { whisper_mel, speech_token_raw, speech_token, fbank, embedding, feat_raw, feat })
    }
}

/// A voice needs a valid name and a transcript; checked before any audio is read.
fn check_voice_args(name: &str, transcript: &str) -> Result<()> {
    crate::vocab::check_voice_name(name)?;
    crate::voice::check_transcript(transcript)
}
