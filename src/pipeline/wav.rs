//! WAV output for the pipeline (`--dump`'s `waveform.wav`): a thin name over the one audio writer,
//! [`crate::audio::wav`] (atomic, links followed, devices and FIFOs written through).

use std::path::Path;

use crate::audio::{write_audio_atomic, OutputFormat};
use crate::error::Result;

/// Sample format of a written WAV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WavFormat {
    /// 16-bit PCM (samples clamped to [-1, 1], scaled by 32767 and rounded).
    Int16,
    /// IEEE float32.
    Float32,
}

/// A float sample as 16-bit PCM (cosy's one convention, [`crate::audio::f32_to_i16`]).
pub fn to_i16(x: f32) -> i16 {
    crate::audio::f32_to_i16(x)
}

/// Writes mono `samples` at `sample_rate` to `path` atomically.
pub fn write_wav(path: &Path, samples: &[f32], sample_rate: u32, format: WavFormat) -> Result<()> {
    let format = match format {
        WavFormat::Int16 => OutputFormat::Wav16,
        WavFormat::Float32 => OutputFormat::WavF32,
    };
    write_audio_atomic(path, samples, sample_rate, format)
}
