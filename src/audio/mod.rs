//! Audio output to files (WAV / raw PCM) and resampling.
//!
//! For the pipeline author:
//!
//! **Files** ([`wav`]): `write_audio_atomic(path, &samples, 24_000, OutputFormat::Wav16)` writes a
//! whole utterance; [`WavStreamWriter::create`] + `append(chunk)`… + `finish()` writes chunk by chunk
//! (drop without `finish` = nothing left on disk). Both go through `.<name>.partial-<pid>` in the
//! target folder, fsync, and rename, so the output path only ever holds a complete file (links are
//! followed; a device or FIFO gets the complete output written into it: see [`crate::output`]).
//! `OutputFormat` parses `wav16 | wavf32 | pcm`. For `--format pcm` to stdout call
//! [`write_pcm16_stream`]`(stdout.lock(), chunk)` per chunk (raw little-endian int16, no header).
//! int16 convention: `round(clamp(x, -1, 1) · 32767)`, NaN → 0 ([`f32_to_i16`]).
//!
//! Live playback (cpal) is the binary's (`src/playback.rs`, used by `cosy say`): an embedding program
//! plays the samples its own way.

pub mod resample;
pub mod wav;

pub use resample::Resampler;
pub use wav::{
    encode_audio, f32_to_i16, pcm16_bytes, wav16_stream_header, write_audio_atomic, write_audio_atomic_with, write_pcm16_stream, OutputFormat, WavStreamWriter,
};
