//! Writing audio: WAV (int16 / float32) and raw little-endian int16 PCM, through
//! [`crate::output::OutputFile`]: a regular file is written to a temporary file that is renamed
//! into place (a reader never sees a half-written output), a symbolic link is followed, a device
//! or FIFO is written through once the audio is complete.
//!
//! Sample conversion to int16 (the one convention used everywhere in cosy):
//! `i16 = round_half_away_from_zero(clamp(x, -1, 1) * 32767)`, NaN maps to 0. The scale is symmetric
//! (±1.0 → ±32767; -32768 is never produced), so a full-scale sine does not clip asymmetrically.

use std::fs::File;
use std::io::{self, BufWriter, Seek, Write};
use std::path::Path;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The encoding of an audio output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// RIFF/WAVE, PCM signed 16-bit, mono.
    Wav16,
    /// RIFF/WAVE, IEEE float 32-bit, mono (samples written as produced, no clamping).
    WavF32,
    /// Raw little-endian signed 16-bit mono samples, no header (for piping: `--format pcm`).
    Pcm16,
}

impl OutputFormat {
    /// The names accepted by [`FromStr`], in the order shown in error messages.
    pub const NAMES: [&'static str; 3] = ["wav16", "wavf32", "pcm"];

    /// The canonical name (what [`FromStr`] accepts).
    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::Wav16 => "wav16",
            OutputFormat::WavF32 => "wavf32",
            OutputFormat::Pcm16 => "pcm",
        }
    }

    /// The usual file extension.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Wav16 | OutputFormat::WavF32 => "wav",
            OutputFormat::Pcm16 => "pcm",
        }
    }
}

impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OutputFormat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "wav16" => Ok(OutputFormat::Wav16),
            "wavf32" => Ok(OutputFormat::WavF32),
            "pcm" => Ok(OutputFormat::Pcm16),
            _ => Err(Error::invalid(format!(
                "unknown audio format {s:?}: use one of {}",
                OutputFormat::NAMES.join(", ")
            ))),
        }
    }
}

/// Converts one float sample to int16 with cosy's convention (see the module docs).
#[inline]
pub fn f32_to_i16(x: f32) -> i16 {
    if x.is_nan() {
        return 0;
    }
    // After the clamp the product lies in [-32767, 32767], so the cast cannot saturate.
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// Appends `samples` as little-endian int16 bytes to `out`.
fn extend_pcm16_bytes(out: &mut Vec<u8>, samples: &[f32]) {
    out.reserve(samples.len() * 2);
    for &x in samples {
        out.extend_from_slice(&f32_to_i16(x).to_le_bytes());
    }
}

/// Writes one chunk as raw little-endian int16 (no header) to a stream such as stdout, for
/// `--format pcm`. Call once per chunk as chunks arrive; the caller flushes at the end.
/// Errors name the stream as `<stdout>` (the intended use) and say what to do.
pub fn write_pcm16_stream<W: Write>(mut out: W, chunk: &[f32]) -> Result<()> {
    let mut bytes = Vec::new();
    extend_pcm16_bytes(&mut bytes, chunk);
    out.write_all(&bytes)
        .map_err(|e| Error::io("<stdout>", explain_stream_error(e)))
}

fn explain_stream_error(e: io::Error) -> io::Error {
    let fix = match e.kind() {
        io::ErrorKind::BrokenPipe => "the program reading the audio closed its input",
        io::ErrorKind::StorageFull => "the disk behind the redirected output is full: free space or write elsewhere",
        _ => "check where the output is redirected",
    };
    io::Error::new(e.kind(), format!("{e}; {fix}"))
}

use crate::output::{explain_write_error, OutputFile};

fn hound_to_io(e: hound::Error) -> io::Error {
    match e {
        hound::Error::IoError(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

fn wav_spec(sample_rate: u32, format: OutputFormat) -> Option<hound::WavSpec> {
    let (bits_per_sample, sample_format) = match format {
        OutputFormat::Wav16 => (16, hound::SampleFormat::Int),
        OutputFormat::WavF32 => (32, hound::SampleFormat::Float),
        OutputFormat::Pcm16 => return None,
    };
    Some(hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample,
        sample_format,
    })
}

/// Either a WAV encoder (header finalised at the end) or a raw int16 byte sink.
enum Encoder<W: Write + Seek> {
    Wav {
        writer: hound::WavWriter<W>,
        format: OutputFormat,
    },
    Raw(W),
}

impl<W: Write + Seek> Encoder<W> {
    fn new(inner: W, sample_rate: u32, format: OutputFormat) -> io::Result<Self> {
        if sample_rate == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "sample rate 0 is not valid",
            ));
        }
        Ok(match wav_spec(sample_rate, format) {
            Some(spec) => Encoder::Wav {
                writer: hound::WavWriter::new(inner, spec).map_err(hound_to_io)?,
                format,
            },
            None => Encoder::Raw(inner),
        })
    }

    fn append(&mut self, samples: &[f32]) -> io::Result<()> {
        match self {
            Encoder::Wav {
                writer,
                format: OutputFormat::Wav16,
            } => {
                let mut w16 = writer.get_i16_writer(samples.len() as u32);
                for &x in samples {
                    w16.write_sample(f32_to_i16(x));
                }
                w16.flush().map_err(hound_to_io)
            }
            Encoder::Wav { writer, .. } => {
                for &x in samples {
                    writer.write_sample(x).map_err(hound_to_io)?;
                }
                Ok(())
            }
            Encoder::Raw(w) => {
                let mut bytes = Vec::new();
                extend_pcm16_bytes(&mut bytes, samples);
                w.write_all(&bytes)
            }
        }
    }

    fn finish(self) -> io::Result<()> {
        match self {
            Encoder::Wav { writer, .. } => writer.finalize().map_err(hound_to_io),
            Encoder::Raw(mut w) => w.flush(),
        }
    }
}

/// The bytes [`write_audio_atomic`] would write for `samples` (same encoder, same header), in
/// memory: a server's response body is then the very file `cosy file` writes.
pub fn encode_audio(samples: &[f32], sample_rate: u32, format: OutputFormat) -> Result<Vec<u8>> {
    let mut cursor = io::Cursor::new(Vec::with_capacity(44 + samples.len() * 2));
    let mut encoder = Encoder::new(&mut cursor, sample_rate, format).map_err(|e| Error::io("<memory>", e))?;
    encoder.append(samples).map_err(|e| Error::io("<memory>", e))?;
    encoder.finish().map_err(|e| Error::io("<memory>", e))?;
    Ok(cursor.into_inner())
}

/// Samples as little-endian int16 bytes (raw pcm), cosy's one conversion ([`f32_to_i16`]).
pub fn pcm16_bytes(samples: &[f32]) -> Vec<u8> {
    let mut bytes = Vec::new();
    extend_pcm16_bytes(&mut bytes, samples);
    bytes
}

/// The 44-byte header of a 16-bit mono WAV whose length is not known yet (a stream): the RIFF
/// and data sizes are 0xFFFFFFFF, the convention players and decoders read as "until the end".
pub fn wav16_stream_header(sample_rate: u32) -> [u8; 44] {
    let mut h = [0u8; 44];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, b"RIFF");
    put(4, &u32::MAX.to_le_bytes());
    put(8, b"WAVE");
    put(12, b"fmt ");
    put(16, &16u32.to_le_bytes());
    put(20, &1u16.to_le_bytes()); // PCM
    put(22, &1u16.to_le_bytes()); // mono
    put(24, &sample_rate.to_le_bytes());
    put(28, &(sample_rate * 2).to_le_bytes()); // bytes per second
    put(32, &2u16.to_le_bytes()); // block align
    put(34, &16u16.to_le_bytes()); // bits per sample
    put(36, b"data");
    put(40, &u32::MAX.to_le_bytes());
    h
}

/// Writes mono `samples` at `sample_rate` to `path` in `format`, atomically: the data goes to a
/// temporary file in the same folder which is fsynced and renamed into place. On any error the
/// temporary file is removed and `path` is untouched (an older file there stays as it was).
/// A symbolic link is followed (its target is replaced, the link stays); a character device or
/// FIFO gets the complete output written into it (see [`crate::output`]).
pub fn write_audio_atomic(path: &Path, samples: &[f32], sample_rate: u32, format: OutputFormat) -> Result<()> {
    write_audio_atomic_with(path, samples, sample_rate, format, BufWriter::new)
}

/// [`write_audio_atomic`] with a caller-chosen layer around the temporary file (buffering, rate
/// limiting, fault injection in tests). The layer must pass writes and seeks through.
pub fn write_audio_atomic_with<W, F>(
    path: &Path,
    samples: &[f32],
    sample_rate: u32,
    format: OutputFormat,
    wrap: F,
) -> Result<()>
where
    W: Write + Seek,
    F: FnOnce(File) -> W,
{
    let mut writer = WavStreamWriter::create_with(path, sample_rate, format, wrap)?;
    writer.append(samples)?;
    writer.finish()
}

/// A streaming audio file writer: chunks are appended as the synthesis produces them, the WAV header
/// is finalised by [`finish`](Self::finish), which also fsyncs and renames the temporary file into
/// place. Dropping the writer without `finish` (error, Ctrl-C unwinding) removes the temporary file.
/// Despite the name it writes every [`OutputFormat`]: for `Pcm16` the file is raw int16 with no header.
pub struct WavStreamWriter<W: Write + Seek = BufWriter<File>> {
    // Field order matters: the encoder (which holds the temp file open) drops before the guard
    // removes the file.
    encoder: Option<Encoder<W>>,
    file: OutputFile,
    samples_written: u64,
}

impl WavStreamWriter<BufWriter<File>> {
    /// Starts writing `path` (through `.<name>.partial-<pid>` in the same folder).
    pub fn create(path: &Path, sample_rate: u32, format: OutputFormat) -> Result<Self> {
        Self::create_with(path, sample_rate, format, BufWriter::new)
    }
}

impl<W: Write + Seek> WavStreamWriter<W> {
    /// Like [`WavStreamWriter::create`] with a caller-chosen layer around the temporary file.
    pub fn create_with<F: FnOnce(File) -> W>(
        path: &Path,
        sample_rate: u32,
        format: OutputFormat,
        wrap: F,
    ) -> Result<Self> {
        let (file, handle) = OutputFile::create(path)?;
        let encoder = Encoder::new(wrap(handle), sample_rate, format).map_err(|e| explain_write_error(e, path))?;
        Ok(WavStreamWriter {
            encoder: Some(encoder),
            file,
            samples_written: 0,
        })
    }

    /// Appends one chunk of mono samples.
    pub fn append(&mut self, chunk: &[f32]) -> Result<()> {
        let encoder = self.encoder.as_mut().ok_or_else(|| {
            Error::invalid(format!(
                "{}: the writer already failed; nothing more can be appended",
                self.file.path().display()
            ))
        })?;
        if let Err(e) = encoder.append(chunk) {
            // Drop the encoder now so no later call writes into a file that is already broken.
            self.encoder = None;
            return Err(explain_write_error(e, self.file.path()));
        }
        self.samples_written += chunk.len() as u64;
        Ok(())
    }

    /// How many samples were appended so far.
    pub fn samples_written(&self) -> u64 {
        self.samples_written
    }

    /// The final path (not the temporary one).
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Finalises the header, fsyncs and renames the file into place.
    pub fn finish(mut self) -> Result<()> {
        let final_path = self.file.path().to_path_buf();
        let encoder = self.encoder.take().ok_or_else(|| {
            Error::invalid(format!(
                "{}: the writer already failed; nothing was written",
                final_path.display()
            ))
        })?;
        encoder.finish().map_err(|e| explain_write_error(e, &final_path))?;
        // `self` is partially moved from here on: commit the guard by value.
        let WavStreamWriter { file, .. } = self;
        file.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_bytes_are_the_written_file() {
        let samples: Vec<f32> = (0..5000).map(|i| ((i as f32) * 0.01).sin() * 0.8).collect();
        let dir = tempfile::tempdir().expect("temp dir");
        for format in [OutputFormat::Wav16, OutputFormat::WavF32, OutputFormat::Pcm16] {
            let path = dir.path().join(format!("a.{}", format.extension()));
            write_audio_atomic(&path, &samples, 24_000, format).expect("write");
            let file = std::fs::read(&path).expect("read");
            assert_eq!(encode_audio(&samples, 24_000, format).expect("encode"), file, "{format}");
        }
        assert_eq!(pcm16_bytes(&samples), encode_audio(&samples, 24_000, OutputFormat::Pcm16).expect("pcm"));
    }

    #[test]
    fn stream_header_is_a_wav16_header_of_unknown_length() {
        let file = encode_audio(&[0.5, -0.5], 24_000, OutputFormat::Wav16).expect("encode");
        let header = wav16_stream_header(24_000);
        // Identical to a finished file's header but for the two sizes.
        assert_eq!(&header[8..40], &file[8..40]);
        assert_eq!(&header[4..8], &[0xFF; 4]);
        assert_eq!(&header[40..44], &[0xFF; 4]);
    }
}
