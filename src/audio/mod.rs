//! Audio output: files (WAV / raw PCM) and live playback.
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
//! **Playback** ([`play`]): `let mut player = Player::open(device, 24_000)?;` then, from the
//! synthesis thread, `if player.push(&chunk)? == Flow::Cancelled { break }` per chunk (blocks while
//! the ~2 s queue is full, so synthesis is paced by the device), then `player.finish()?` (plays out
//! the queue and stops). For Ctrl-C: `cancel_on_ctrl_c(player.cancel_handle())?` (see [`crate::interrupt`]);
//! the handle is also pollable (`is_cancelled`) to stop synthesis early. `player.events()` exposes
//! counters, including when the first samples reached the device (time to first audio).
//! With no usable output device, `Player::open(None, …)` fails with one line that says so and points
//! to `cosy file`. [`list_devices`] lists outputs with their rates/channels (for a `--device` help).
//!
//! Headless / CI: ALSA reads its configuration once per process at first use. To run without a sound
//! card, either pass `--device null` (discards audio) or start the process with `HOME` pointing to a
//! folder whose `.asoundrc` says `pcm.!default { type null }`. The null device is not paced: it pulls
//! samples as fast as the CPU allows.

#[cfg(feature = "cli")]
pub mod play;
pub mod resample;
pub mod wav;

#[cfg(feature = "cli")]
pub use play::{
    cancel_on_ctrl_c, list_devices, CancelHandle, DeviceInfo, Flow, OutputConfig, PlaybackEvents, Player,
    PlayerOptions, MODEL_SAMPLE_RATE,
};
pub use resample::Resampler;
pub use wav::{
    encode_audio, f32_to_i16, pcm16_bytes, wav16_stream_header, write_audio_atomic, write_audio_atomic_with, write_pcm16_stream, OutputFormat, WavStreamWriter,
};
