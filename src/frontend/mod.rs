//! Frontend: everything between user input and the first model graph.
//!
//! * [`audio`]: decode a prompt file (wav/flac/mp3/ogg) to mono f32 and validate it.
//! * [`resample`]: torchaudio's default sinc-Hann resampler, bit-for-bit in structure.
//! * [`features`]: the three prompt features (whisper log-mel for the speech tokenizer, kaldi
//!   fbank + CMN for campplus, the 24 kHz matcha mel for the flow).
//! * [`align`]: trims prompt speech tokens and prompt mel to the 1:2 ratio the flow needs.
//! * [`tokenizer`]: the Qwen2 BPE + CosyVoice3 specials, loaded from the exported `tokenizer.json`.
//! * [`text`]: the official text frontend's rules (bypass, zh/en post rules, sentence splitting).
//! * [`lexicon`]: the user's pronunciation lexicon (`text.lexicon`): words to replacement text or
//!   phoneme tokens.
//! * [`pause`]: pause tags (`[pause:0.5s]`): a text cut into stretches and exact silences.
//! * [`readings`]: phone numbers and units read as words (the `phone` and `units` categories).
//! * [`ssml`]: the SSML subset (`<speak>`, `<break>`, `<sub>`, `<say-as>`, `<phoneme>`) as plain
//!   text and pause tags.
//! * [`tn`]: wetext text normalisation (the official frontend's TN grammars run as FSTs).
//! * [`prompt`]: the prompt modes (zero-shot, cross-lingual, instruct, raw) and the
//!   `<|endofprompt|>` rules.

pub mod align;
pub mod audio;
pub mod book;
pub mod fbank;
pub mod lexicon;
pub mod markdown;
pub mod mel;
pub mod numbers;
pub mod pause;
pub mod readings;
pub mod prompt;
pub mod resample;
pub mod sentences;
pub mod ssml;
pub mod text;
pub mod tn;
pub mod tokenizer;
pub mod whisper;

/// The three prompt features, under one name.
pub mod features {
    pub use super::fbank::kaldi_fbank_cmn;
    pub use super::mel::mel_24k;
    pub use super::whisper::whisper_log_mel;
}

/// Periodic Hann window as `torch.hann_window(n)` builds it (float32 values, returned as f64 so
/// that the FFT can run in double precision on exactly the window torch uses).
pub(crate) fn periodic_hann(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos();
            w as f32 as f64
        })
        .collect()
}

/// Reflect padding (`torch.nn.functional.pad(mode="reflect")`): the edge sample is not repeated.
/// Requires `pad < signal.len()`; callers check that.
pub(crate) fn reflect_pad(signal: &[f32], pad: usize) -> Vec<f32> {
    let n = signal.len();
    let mut out = Vec::with_capacity(n + 2 * pad);
    out.extend((1..=pad).rev().map(|i| signal[i]));
    out.extend_from_slice(signal);
    out.extend((0..pad).map(|i| signal[n - 2 - i]));
    out
}
