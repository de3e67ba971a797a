//! Prompt audio input: decode (symphonia), down-mix to mono, validate.
//!
//! Mirrors the official `load_wav` (`torchaudio.load(backend='soundfile')`, mean over channels,
//! resample when the rate differs, refuse rates below 16 kHz), with clear errors instead of
//! asserts. Integer PCM is scaled to [-1, 1) by 2^(bits-1) as libsndfile does; float WAV (also with
//! a `fact` chunk) is taken as is.

use std::fs::File;
use std::path::Path;

use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::error::{Error, Result};
use crate::frontend::resample::resample;

/// Lowest accepted original sample rate (the official `min_sr`).
pub const MIN_SAMPLE_RATE: u32 = 16_000;
/// Longest prompt the speech tokenizer accepts, in seconds (official assert in `_extract_speech_token`).
pub const MAX_TOKENIZER_SECONDS: f64 = 30.0;
/// A file whose peak stays below one 16-bit step is treated as silent.
const SILENCE_PEAK: f32 = 1.0 / 32768.0;

/// Mono audio at its original sample rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

impl Audio {
    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }
}

fn input_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Input(format!("prompt audio {}: {msg}", path.display()))
}

/// Decodes `path` (wav incl. float32, flac, mp3, ogg/vorbis), averages the channels and checks
/// that it is usable as a prompt: readable, complete, not empty, rate ≥ 16 kHz, not all silent.
pub fn load_audio(path: &Path) -> Result<Audio> {
    let file = File::open(path).map_err(|e| {
        input_err(path, format!("cannot open ({e}); check the path and permissions"))
    })?;
    if file.metadata().map(|m| m.len() == 0).unwrap_or(false) {
        return Err(input_err(path, "is an empty file (0 bytes); record a few seconds of speech"));
    }
    let mss = MediaSourceStream::new(Box::new(file), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let mut format = symphonia::default::get_probe()
        .probe(&hint, mss, FormatOptions::default(), MetadataOptions::default())
        .map_err(|e| match e {
            // A known container that ends early (an ogg reader looks for the last page at once).
            SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                input_err(path, "is truncated (the file ends early); re-export the file")
            }
            e => input_err(path, format!("not a readable audio file ({e}); use wav, flac, mp3 or ogg/vorbis")),
        })?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| input_err(path, "has no audio track; give a file with speech in it"))?;
    let track_id = track.id;
    let expected_frames = track.num_frames;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| input_err(path, "audio codec parameters missing; re-encode it as 16-bit wav"))?
        .clone();
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| input_err(path, format!("unsupported codec ({e}); re-encode it as 16-bit wav")))?;

    let mut mono: Vec<f32> = Vec::new();
    let mut rate: Option<u32> = params.sample_rate;
    let mut planes: Vec<Vec<f32>> = Vec::new();
    let mut truncated = false;
    loop {
        let packet = match format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                truncated = true;
                break;
            }
            Err(e) => return Err(input_err(path, format!("cannot be read ({e}); the file looks damaged"))),
        };
        if packet.track_id != track_id {
            continue;
        }
        let buf = decoder
            .decode(&packet)
            .map_err(|e| input_err(path, format!("cannot be decoded ({e}); the file looks damaged")))?;
        rate = Some(buf.spec().rate());
        buf.copy_to_vecs_planar(&mut planes);
        let channels = planes.len().max(1);
        let frames = planes.first().map_or(0, Vec::len);
        // torch's mean over channels: sum in f32, then divide.
        for i in 0..frames {
            let sum: f32 = planes.iter().map(|p| p[i]).sum();
            mono.push(sum / channels as f32);
        }
    }
    if let Some(n) = expected_frames {
        if (mono.len() as u64) < n {
            truncated = true;
        }
    }
    if truncated {
        return Err(input_err(
            path,
            format!("is truncated (decoded {} frames, header says {}); re-export the file", mono.len(),
                expected_frames.map_or("more".to_string(), |n| n.to_string())),
        ));
    }
    let sample_rate = rate.ok_or_else(|| input_err(path, "sample rate unknown; re-encode it as wav"))?;
    if mono.is_empty() {
        return Err(input_err(path, "contains no samples; record a few seconds of speech"));
    }
    if sample_rate < MIN_SAMPLE_RATE {
        return Err(input_err(
            path,
            format!("sample rate {sample_rate} Hz is below {MIN_SAMPLE_RATE} Hz; record or export at 16 kHz or more"),
        ));
    }
    let peak = mono.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if !peak.is_finite() {
        return Err(input_err(path, "contains NaN or infinite samples; re-export it"));
    }
    if peak < SILENCE_PEAK {
        return Err(input_err(path, "is silent; give a recording with audible speech"));
    }
    Ok(Audio { samples: mono, sample_rate })
}

/// The prompt at `target_rate` (torchaudio-equivalent resampling when the rate differs).
/// `max_seconds` (measured after resampling, as the official check is) rejects long prompts;
/// use [`MAX_TOKENIZER_SECONDS`] for the 16 kHz speech-tokenizer path.
pub fn to_rate(audio: &Audio, target_rate: u32, max_seconds: Option<f64>, path: &Path) -> Result<Vec<f32>> {
    let samples = if audio.sample_rate == target_rate {
        audio.samples.clone()
    } else {
        resample(&audio.samples, audio.sample_rate, target_rate)
    };
    if let Some(limit) = max_seconds {
        let secs = samples.len() as f64 / target_rate as f64;
        if secs > limit {
            return Err(input_err(
                path,
                format!("is {secs:.1} s long; the speech tokenizer accepts at most {limit} s, cut the prompt shorter"),
            ));
        }
    }
    Ok(samples)
}

/// Loads `path` and returns it at `target_rate` (see [`load_audio`] and [`to_rate`]).
pub fn load_at(path: &Path, target_rate: u32, max_seconds: Option<f64>) -> Result<Vec<f32>> {
    let audio = load_audio(path)?;
    to_rate(&audio, target_rate, max_seconds, path)
}
