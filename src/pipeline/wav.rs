//! WAV output for the pipeline, written atomically (temporary sibling, then rename). A stop-gap
//! until `src/audio.rs` provides the shared writer.

use std::path::Path;

use crate::error::{Error, Result};

/// Sample format of a written WAV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WavFormat {
    /// 16-bit PCM (samples clamped to [-1, 1], scaled by 32767 and rounded).
    Int16,
    /// IEEE float32.
    Float32,
}

/// A float sample as 16-bit PCM.
pub fn to_i16(x: f32) -> i16 {
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// Writes mono `samples` at `sample_rate` to `path` atomically.
pub fn write_wav(path: &Path, samples: &[f32], sample_rate: u32, format: WavFormat) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: if format == WavFormat::Int16 { 16 } else { 32 },
        sample_format: if format == WavFormat::Int16 { hound::SampleFormat::Int } else { hound::SampleFormat::Float },
    };
    let hound_err = |e: hound::Error| match e {
        hound::Error::IoError(io) => Error::io(&tmp, io),
        other => Error::Io { path: tmp.clone(), source: std::io::Error::other(other.to_string()) },
    };
    let result = (|| {
        let mut w = hound::WavWriter::create(&tmp, spec).map_err(hound_err)?;
        for &s in samples {
            match format {
                WavFormat::Int16 => w.write_sample(to_i16(s)).map_err(hound_err)?,
                WavFormat::Float32 => w.write_sample(s).map_err(hound_err)?,
            }
        }
        w.finalize().map_err(hound_err)?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    })();
    if result.is_err() {
        std::fs::remove_file(&tmp).ok();
    }
    result
}
