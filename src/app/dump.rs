//! `--dump DIR`: per-stage intermediates as `.npy` with the golden names and dtypes
//! (reference README §4), plus `waveform.wav` and `text.txt` (the sentence as the tokenizer got it). Every file is written to a temporary name in the
//! same folder and renamed, so a reader never sees a half-written file.
//!
//! [`ModelTextObserver`]: the same text of every sentence from a running server
//! (`debug.model_text`), without the intermediates.

use std::path::Path;

use ndarray::Array2;

use crate::error::Result;
use crate::npy::{encode, NpyElem};
use crate::request::{PromptFeatures, SegmentTrace, SentenceRecord, SynthesisObserver};

fn npy<T: NpyElem>(dir: &Path, name: &str, shape: &[usize], values: &[T]) -> Result<()> {
    crate::output::write_bytes(&dir.join(format!("{name}.npy")), &encode(shape, values))
}

fn ids32(v: &[i64]) -> Vec<i32> {
    v.iter().map(|&x| x as i32).collect()
}

fn mat(a: &Array2<f32>) -> Vec<f32> {
    a.as_standard_layout().iter().copied().collect()
}

/// Writes one sentence's dump into `dir` (created if needed).
pub fn write_segment(
    dir: &Path,
    prompt: &PromptFeatures,
    prompt_text_token: &[i64],
    text_token: &[i64],
    trace: &SegmentTrace,
    stream: bool,
    sample_rate: u32,
) -> Result<()> {
    crate::fsx::create_folder(dir, "the --dump folder")?;
    npy(dir, "text_token", &[1, text_token.len()], &ids32(text_token))?;
    npy(dir, "prompt_text_token", &[1, prompt_text_token.len()], &ids32(prompt_text_token))?;
    // A saved voice has no prompt-audio intermediates (they are empty): nothing to dump for them.
    if !prompt.whisper_mel.is_empty() {
        let (m, t) = prompt.whisper_mel.dim();
        npy(dir, "whisper_mel", &[1, m, t], &mat(&prompt.whisper_mel))?;
    }
    if !prompt.speech_token_raw.is_empty() {
        npy(dir, "prompt_speech_token_raw", &[1, prompt.speech_token_raw.len()], &ids32(&prompt.speech_token_raw))?;
    }
    npy(dir, "prompt_speech_token", &[1, prompt.speech_token.len()], &ids32(&prompt.speech_token))?;
    if !prompt.fbank.is_empty() {
        let (t, b) = prompt.fbank.dim();
        npy(dir, "campplus_fbank", &[1, t, b], &mat(&prompt.fbank))?;
    }
    npy(dir, "speaker_embedding", &[1, prompt.embedding.len()], &prompt.embedding)?;
    if !prompt.feat_raw.is_empty() {
        let (t, b) = prompt.feat_raw.dim();
        npy(dir, "prompt_feat_raw", &[1, t, b], &mat(&prompt.feat_raw))?;
    }
    let (t, b) = prompt.feat.dim();
    npy(dir, "prompt_feat", &[1, t, b], &mat(&prompt.feat))?;
    npy(dir, "llm_token_raw", &[1, trace.llm_token_raw.len()], &ids32(&trace.llm_token_raw))?;
    npy(dir, "speech_token", &[1, trace.speech_token.len()], &ids32(&trace.speech_token))?;
    // The golden data has flow_mu/flow_cond for offline cases only (README §4).
    if !stream {
        for (name, a) in [("flow_mu", &trace.flow_mu), ("flow_cond", &trace.flow_cond)] {
            if let Some(a) = a {
                let (c, f) = a.dim();
                npy(dir, name, &[1, c, f], &mat(a))?;
            }
        }
    }
    if let Some(a) = &trace.flow_mel {
        let (c, f) = a.dim();
        npy(dir, "flow_mel", &[1, c, f], &mat(a))?;
    }
    if let Some(f0) = &trace.hift_f0 {
        npy(dir, "hift_f0", &[1, f0.len()], f0)?;
    }
    if let Some(src) = &trace.hift_source {
        npy(dir, "hift_source", &[1, 1, src.len()], src)?;
    }
    if stream {
        npy(dir, "chunk_samples", &[trace.chunk_samples.len()], &trace.chunk_samples)?;
    }
    npy(dir, "waveform", &[1, trace.waveform.len()], &trace.waveform)?;
    crate::audio::write_audio_atomic(&dir.join("waveform.wav"), &trace.waveform, sample_rate, crate::audio::OutputFormat::WavF32)?;
    Ok(())
}

/// The `--dump DIR` observer: writes every sentence's intermediates as it finishes (one
/// sentence: into `DIR`; several: into `DIR/000`, `DIR/001`, …).
#[derive(Debug, Clone)]
pub struct DumpObserver {
    root: std::path::PathBuf,
}

impl DumpObserver {
    pub fn new(root: impl Into<std::path::PathBuf>) -> DumpObserver {
        DumpObserver { root: root.into() }
    }
}

impl SynthesisObserver for DumpObserver {
    fn wants_trace(&self) -> bool {
        true
    }
    fn sentence_done(&self, s: &SentenceRecord<'_>) -> Result<()> {
        let dir = if s.count == 1 { self.root.clone() } else { self.root.join(format!("{:03}", s.index)) };
        write_segment(&dir, s.prompt, s.prompt_text_token, s.text_token, s.trace, s.stream, s.sample_rate)?;
        // What the text tokens say, as the tokenizer got it (`cosy file --show-text` prints the same).
        crate::output::write_bytes(&dir.join("text.txt"), s.text.as_bytes())
    }
}

/// The text one sentence gave the model ([`SynthesisObserver::text_tokens`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelText {
    /// The sentence, from 0, of its request (text-in streaming: 0, one entry per piece).
    pub sentence: usize,
    /// Exactly what was tokenised.
    pub text: String,
    pub tokens: Vec<i64>,
}

/// `debug.model_text`: every sentence's text as the model gets it, handed to a front end in
/// order through the receiver [`ModelTextObserver::new`] returns (the front end tells its client
/// when it forwards the audio that follows).
#[derive(Debug)]
pub struct ModelTextObserver {
    sender: std::sync::mpsc::Sender<ModelText>,
}

/// What a front end reads the texts from ([`ModelTextObserver::of_config`]).
#[derive(Debug)]
pub struct ModelTexts {
    receiver: std::sync::mpsc::Receiver<ModelText>,
}

impl ModelTexts {
    /// The texts told since the last call, in order.
    pub fn take(&self) -> Vec<ModelText> {
        self.receiver.try_iter().collect()
    }
}

impl ModelTextObserver {
    /// An observer and its texts when `config` has `debug.model_text`; none otherwise.
    pub fn of_config(config: &crate::config::Config) -> (Option<std::sync::Arc<dyn SynthesisObserver + Send>>, Option<ModelTexts>) {
        if !config.debug.model_text {
            return (None, None);
        }
        let (sender, receiver) = std::sync::mpsc::channel();
        (Some(std::sync::Arc::new(ModelTextObserver { sender })), Some(ModelTexts { receiver }))
    }
}

impl SynthesisObserver for ModelTextObserver {
    fn text_tokens(&self, sentence: usize, text: &str, tokens: &[i64]) {
        // A front end that has gone away no longer reads: nothing to tell.
        let _ = self.sender.send(ModelText { sentence, text: text.to_string(), tokens: tokens.to_vec() });
    }
}
