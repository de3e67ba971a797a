//! Prompt audio input: decode (symphonia), down-mix to mono, validate.
//!
//! Mirrors the official `load_wav` (`torchaudio.load(backend='soundfile')`, mean over channels,
//! resample when the rate differs, refuse rates below 16 kHz), with clear errors instead of
//! asserts. Integer PCM is scaled to [-1, 1) by 2^(bits-1) as libsndfile does; float WAV (also with
//! a `fact` chunk) is taken as is.
//!
//! Bounds (so that no input can hang cosy or take unbounded memory):
//! * files over [`MAX_PROMPT_FILE_BYTES`] are refused, and at most [`MAX_DECODE_SECONDS`] of audio
//!   is decoded; sample rates above [`MAX_SAMPLE_RATE`] are refused before decoding;
//! * what is not a regular file (a FIFO, `/dev/stdin`, a device) is read as a stream, up to the
//!   same byte bound, then decoded from memory. A FIFO is opened non-blocking: with nothing writing
//!   into it, cosy waits [`FIFO_WRITER_WAIT`] for a writer, then says so; a writer that stops
//!   sending for [`STREAM_IDLE`] is an error too. A stream can only be read once, so its audio is
//!   kept for the rest of the process: the CLI's early check, the pipeline and every line of
//!   `--input` all get the same audio. A terminal is refused; a folder is named as one;
//! * a prompt must be long enough for every stage ([`MIN_PROMPT_SECONDS`], see
//!   [`check_length`]).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;

use crate::error::{Error, Result};
use crate::frontend::resample::resample;

/// Lowest accepted original sample rate (the official `min_sr`).
pub const MIN_SAMPLE_RATE: u32 = 16_000;
/// Longest prompt the speech tokenizer accepts, in seconds (official assert in `_extract_speech_token`).
pub const MAX_TOKENIZER_SECONDS: f64 = 30.0;
/// A file whose peak stays below one 16-bit step is treated as silent.
const SILENCE_PEAK: f32 = 1.0 / 32768.0;
/// The quietest signal a prompt may have, in dBFS (RMS about its mean, full scale = 1): −60 dBFS
/// is 33 steps of 16 bits; speech recorded for a prompt sits around −20 to −30 dBFS, and a whole
/// recording of a few words in 30 s of room noise stays far above −60. Below it there is no
/// speech to take a voice from (a DC offset, a hum of a few steps, a muted microphone), and the
/// frontend would make a voice of the noise floor without a word.
pub const MIN_PROMPT_LEVEL_DBFS: f64 = -60.0;
/// The largest sample magnitude a prompt may have: full scale is 1; a float file may go past it
/// by a few dB (a mix that clips), never by 24 dB (16×). A float sample of 1e30 is a damaged file
/// or not audio, and would make the features overflow.
pub const MAX_PROMPT_PEAK: f32 = 16.0;
/// Highest accepted sample rate: 384 kHz, the top rate of audio interfaces and formats (DXD
/// 352.8 kHz, 384 kHz). Speech has nothing above 12 kHz that the model hears, and a header
/// claiming more (e.g. 4294967295 Hz) is damaged or made up.
pub const MAX_SAMPLE_RATE: u32 = 384_000;
/// Largest prompt file (or stream) read, in bytes: 128 MiB holds 30 s even of stereo float32 at
/// 384 kHz (92 MB); a usable prompt (≤ 30 s) is far smaller in any sane format.
pub const MAX_PROMPT_FILE_BYTES: u64 = 128 << 20;
/// At most this much audio is decoded (twice the longest usable prompt, so that a long file is
/// told its length without decoding hours of it).
pub const MAX_DECODE_SECONDS: f64 = 60.0;
/// How long a FIFO with nothing writing into it is given to get a writer.
pub const FIFO_WRITER_WAIT: Duration = Duration::from_secs(5);
/// How long a connected stream may send nothing before cosy gives up on it.
pub const STREAM_IDLE: Duration = Duration::from_secs(30);
/// Fewest samples at 16 kHz every 16 kHz stage takes: 3 kaldi fbank frames (400 + 2 × 160). The
/// official CAM++ (campplus) halves the frames with a stride-2 TDNN layer and pools with an
/// unbiased standard deviation, which is NaN for a single frame, so it needs 2 frames after the
/// stride, i.e. 3 fbank frames (with no frame at all its Conv fails outright); the speech
/// tokenizer needs less (one whisper frame, 160 samples, and more than 200 for its reflect
/// padding).
pub const MIN_PROMPT_SAMPLES_16K: u64 = 720;
/// Fewest samples at 24 kHz for the flow's prompt mel: 2 frames of 480 (one prompt token after
/// the 1 token : 2 frames alignment; more than 720 for the reflect padding).
pub const MIN_PROMPT_SAMPLES_24K: u64 = 960;
/// The shortest prompt every stage can take, in seconds (from the two sample counts above).
pub const MIN_PROMPT_SECONDS: f64 = 0.045;
/// Sample rate of the flow's prompt mel (`mel_24k`).
const MEL_RATE: u32 = 24_000;

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
    Error::invalid(format!("prompt audio {}: {msg}", path.display()))
}

/// Decodes `path` (wav incl. float32, flac, mp3, ogg/vorbis), averages the channels and checks
/// that it is usable as a prompt: readable, complete, not empty, 16 kHz ≤ rate ≤ 384 kHz, finite,
/// not all silent. A path that is not a regular file is read as a stream (see the module docs).
pub fn load_audio(path: &Path) -> Result<Audio> {
    let meta = std::fs::metadata(path).map_err(|e| {
        input_err(path, format!("cannot open ({e}); check the path and permissions"))
    })?;
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(input_err(path, "is a folder, not an audio file; give the path of a wav, flac, mp3 or ogg file"));
    }
    if kind.is_file() {
        if meta.len() == 0 {
            return Err(input_err(path, "is an empty file (0 bytes); record a few seconds of speech"));
        }
        if meta.len() > MAX_PROMPT_FILE_BYTES {
            return Err(too_large(path, Some(meta.len())));
        }
        let file = File::open(path).map_err(|e| {
            input_err(path, format!("cannot open ({e}); check the path and permissions"))
        })?;
        return decode(path, Box::new(file));
    }
    if let Some(audio) = cached_stream(path) {
        return Ok(audio);
    }
    let bytes = read_stream(path, kind.is_fifo())?;
    let audio = decode(path, Box::new(std::io::Cursor::new(bytes)))?;
    STREAMS.lock().unwrap_or_else(|e| e.into_inner()).push((path.to_path_buf(), audio.clone()));
    Ok(audio)
}

/// Decodes an audio file held in memory (a server's upload, a base64 data URL), with the same
/// checks as [`load_audio`]; `label` names it in messages.
pub fn decode_bytes(label: &Path, bytes: Vec<u8>) -> Result<Audio> {
    if bytes.is_empty() {
        return Err(input_err(label, "is empty (0 bytes); record a few seconds of speech"));
    }
    if bytes.len() as u64 > MAX_PROMPT_FILE_BYTES {
        return Err(too_large(label, Some(bytes.len() as u64)));
    }
    decode(label, Box::new(std::io::Cursor::new(bytes)))
}

/// Mono samples already decoded (in [-1, 1]) at `sample_rate`, checked as [`load_audio`] checks a
/// decoded file: a rate of 16 to 384 kHz, not empty, a usable level (`check_level`).
pub fn from_pcm(label: &Path, samples: Vec<f32>, sample_rate: u32) -> Result<Audio> {
    check_rate(label, sample_rate)?;
    if samples.is_empty() {
        return Err(input_err(label, "contains no samples; record a few seconds of speech"));
    }
    let max_samples = (MAX_PROMPT_FILE_BYTES / 4) as usize;
    if samples.len() > max_samples {
        return Err(too_large(label, Some(samples.len() as u64 * 4)));
    }
    check_level(label, &samples)?;
    Ok(Audio { samples, sample_rate })
}

/// Audio already read from a stream path in this process.
static STREAMS: Mutex<Vec<(PathBuf, Audio)>> = Mutex::new(Vec::new());

fn cached_stream(path: &Path) -> Option<Audio> {
    let streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    streams.iter().find(|(p, _)| p == path).map(|(_, a)| a.clone())
}

fn too_large(path: &Path, bytes: Option<u64>) -> Error {
    let limit = MAX_PROMPT_FILE_BYTES >> 20;
    let size = bytes.map_or(format!("more than {limit} MiB"), |b| format!("{:.1} MiB", b as f64 / 1_048_576.0));
    input_err(
        path,
        format!(
            "is too large ({size}; prompts are read up to {limit} MiB, and a prompt is at most {MAX_TOKENIZER_SECONDS} s); \
             cut it to a few seconds of speech"
        ),
    )
}

/// Reads what is not a regular file (FIFO, `/dev/stdin`, a device) into memory, up to
/// [`MAX_PROMPT_FILE_BYTES`], without ever blocking for good: the file is opened non-blocking
/// (a FIFO's open would otherwise wait for a writer forever) and every wait is a `poll` with a
/// deadline.
fn read_stream(path: &Path, is_fifo: bool) -> Result<Vec<u8>> {
    use std::io::IsTerminal;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| input_err(path, format!("cannot open ({e}); check the path and permissions")))?;
    if file.is_terminal() {
        return Err(input_err(
            path,
            "is a terminal, not an audio file; give the file's path, or redirect it (`--prompt-wav /dev/stdin < me.wav`)",
        ));
    }
    let fd = file.as_raw_fd();
    // Waits until `fd` is readable, hung up, or `timeout` passed; returns the poll events.
    let wait = |timeout: Duration| -> Result<i16> {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(input_err(path, format!("cannot be read ({e})")));
        }
        Ok(pfd.revents)
    };
    let start = Instant::now();
    let mut last_data = start;
    // A FIFO's read gives 0 both at the end of the data and while no writer has opened it yet;
    // once a writer was seen (data, "would block", or a hang-up), 0 is the end.
    let mut writer_seen = !is_fifo;
    let mut bytes: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut chunk) {
            Ok(0) if writer_seen => break,
            Ok(0) => {
                let waited = start.elapsed();
                if waited >= FIFO_WRITER_WAIT {
                    return Err(input_err(
                        path,
                        format!(
                            "is a FIFO (named pipe) with nothing writing into it (waited {} s for a writer); start the \
                             writer first (e.g. `cat me.wav > {}`), or give a file",
                            FIFO_WRITER_WAIT.as_secs(),
                            path.display()
                        ),
                    ));
                }
                if wait(FIFO_WRITER_WAIT - waited)? & libc::POLLHUP != 0 {
                    writer_seen = true; // a writer came (and went)
                }
            }
            Ok(n) => {
                writer_seen = true;
                last_data = Instant::now();
                if (bytes.len() + n) as u64 > MAX_PROMPT_FILE_BYTES {
                    return Err(too_large(path, None));
                }
                bytes.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                writer_seen = true;
                let idle = last_data.elapsed();
                if idle >= STREAM_IDLE {
                    return Err(input_err(
                        path,
                        format!(
                            "sent nothing for {} s ({} bytes so far); give a file, or make sure the writer finishes",
                            STREAM_IDLE.as_secs(),
                            bytes.len()
                        ),
                    ));
                }
                wait(STREAM_IDLE - idle)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(input_err(path, format!("cannot be read ({e})"))),
        }
    }
    if bytes.is_empty() {
        return Err(input_err(
            path,
            "is empty (nothing could be read from it; it is not a regular file); give a recording of a few seconds of speech",
        ));
    }
    Ok(bytes)
}

/// Decodes a whole prompt from `source` (`path` names it in messages and gives the format hint).
///
/// A panic inside the decoder (symphonia on a malformed header: an assertion in the Vorbis setup
/// header parser, an overflowing shift on a WAVE_FORMAT_EXTENSIBLE channel mask in a debug
/// build; found by tests/fuzz.rs) is returned as an error naming the file, like any other
/// damaged file.
fn decode(path: &Path, source: Box<dyn MediaSource>) -> Result<Audio> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_unguarded(path, source))).unwrap_or_else(|_| {
        Err(input_err(path, "made the audio decoder fail (its headers are malformed); re-export it as 16-bit wav"))
    })
}

fn decode_unguarded(path: &Path, source: Box<dyn MediaSource>) -> Result<Audio> {
    let mut track = open_track(path, source)?;
    let decoded = decode_mono(path, &mut track)?;
    check_decoded(path, decoded, track.expected_frames)
}

/// A prompt's container, open at its audio track, with a decoder for it.
struct OpenTrack {
    format: Box<dyn symphonia::core::formats::FormatReader>,
    decoder: Box<dyn symphonia::core::codecs::audio::AudioDecoder>,
    track_id: u32,
    /// The frames the header promises, when it says.
    expected_frames: Option<u64>,
    /// The header's sample rate, when it says.
    header_rate: Option<u32>,
    /// The end of the file is the end of the audio, not a cut (see [`open_track`]).
    unknown_length: bool,
}

/// Probes the container (the extension as a hint), finds its audio track and makes its decoder;
/// a header's sample rate out of range is refused here, before anything is decoded.
fn open_track(path: &Path, source: Box<dyn MediaSource>) -> Result<OpenTrack> {
    let mss = MediaSourceStream::new(source, Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let format = symphonia::default::get_probe()
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
    if let Some(rate) = params.sample_rate {
        check_rate(path, rate)?;
    }
    let decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| input_err(path, format!("unsupported codec ({e}); re-encode it as 16-bit wav")))?;
    // A WAV written as a stream (data size 0xFFFFFFFF, "until the end", as `cosy serve` streams
    // it) has no length: the decoder reports none, and its end of file is its end, not a cut.
    let unknown_length = expected_frames.is_none() && {
        use symphonia::core::codecs::audio::well_known::{CODEC_ID_PCM_MULAW, CODEC_ID_PCM_S32LE};
        (CODEC_ID_PCM_S32LE..=CODEC_ID_PCM_MULAW).contains(&params.codec)
    };
    Ok(OpenTrack { format, decoder, track_id, expected_frames, header_rate: params.sample_rate, unknown_length })
}

/// What decoding gave: the channels' mean, the rate of the last packet (else the header's), and
/// whether the file ended before its audio did.
struct DecodedMono {
    samples: Vec<f32>,
    rate: Option<u32>,
    truncated: bool,
}

/// Decodes every packet of the track into one channel (torch's mean over channels), at most
/// [`MAX_DECODE_SECONDS`] of it.
fn decode_mono(path: &Path, track: &mut OpenTrack) -> Result<DecodedMono> {
    let mut mono: Vec<f32> = Vec::new();
    let mut rate: Option<u32> = track.header_rate;
    let mut planes: Vec<Vec<f32>> = Vec::new();
    let mut truncated = false;
    loop {
        let packet = match track.format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                truncated = !track.unknown_length;
                break;
            }
            Err(e) => return Err(input_err(path, format!("cannot be read ({e}); the file looks damaged"))),
        };
        if packet.track_id != track.track_id {
            continue;
        }
        let buf = track
            .decoder
            .decode(&packet)
            .map_err(|e| input_err(path, format!("cannot be decoded ({e}); the file looks damaged")))?;
        let buf_rate = buf.spec().rate();
        check_rate(path, buf_rate)?;
        rate = Some(buf_rate);
        buf.copy_to_vecs_planar(&mut planes);
        let channels = planes.len().max(1);
        let frames = planes.first().map_or(0, Vec::len);
        // torch's mean over channels: sum in f32, then divide.
        for i in 0..frames {
            let sum: f32 = planes.iter().map(|p| p[i]).sum();
            mono.push(sum / channels as f32);
        }
        if mono.len() as f64 > MAX_DECODE_SECONDS * f64::from(buf_rate) {
            return Err(input_err(
                path,
                format!(
                    "is longer than {MAX_DECODE_SECONDS} s; the speech tokenizer accepts at most {MAX_TOKENIZER_SECONDS} s, \
                     cut the prompt shorter"
                ),
            ));
        }
    }
    Ok(DecodedMono { samples: mono, rate, truncated })
}

/// Whether the decoded audio is a usable prompt: all the frames the header promised, a known
/// rate of at least 16 kHz, some samples, all finite, not silent.
fn check_decoded(path: &Path, decoded: DecodedMono, expected_frames: Option<u64>) -> Result<Audio> {
    let DecodedMono { samples: mono, rate, mut truncated } = decoded;
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
    check_level(path, &mono)?;
    Ok(Audio { samples: mono, sample_rate })
}

/// Whether decoded samples carry a signal a voice can be taken from: all finite, not silent
/// (peak under one 16-bit step), not far too quiet (under [`MIN_PROMPT_LEVEL_DBFS`]), no sample
/// past [`MAX_PROMPT_PEAK`]. The one rule for files, uploads and PCM alike.
fn check_level(label: &Path, samples: &[f32]) -> Result<()> {
    // `max` skips NaN, so the peak alone does not see a NaN sample (a float wav can hold them).
    if samples.iter().any(|x| !x.is_finite()) {
        return Err(input_err(label, "contains NaN or infinite samples; re-export it"));
    }
    let peak = samples.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if peak < SILENCE_PEAK {
        return Err(input_err(label, "is silent; give a recording with audible speech"));
    }
    if peak > MAX_PROMPT_PEAK {
        return Err(input_err(
            label,
            format!("has a sample of {peak:e}, far past full scale (1.0; at most {MAX_PROMPT_PEAK} is taken): the file is damaged or not a recording; re-export it"),
        ));
    }
    let n = samples.len() as f64;
    let mean = samples.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let rms = (samples.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n).sqrt();
    let level = 20.0 * rms.log10();
    if level < MIN_PROMPT_LEVEL_DBFS {
        let shown = if level.is_finite() { format!("{level:.0} dBFS") } else { "no signal at all, only a constant value".to_string() };
        return Err(input_err(
            label,
            format!(
                "is nearly silent ({shown}; a prompt needs at least {MIN_PROMPT_LEVEL_DBFS} dBFS): there is no speech to take a voice from; \
                 record closer to the microphone or with more gain"
            ),
        ));
    }
    Ok(())
}

/// Refuses a sample rate outside 16 kHz..=384 kHz (checked before decoding, so that neither a
/// 1 Hz nor a 4294967295 Hz header makes cosy decode or resample anything).
fn check_rate(path: &Path, rate: u32) -> Result<()> {
    if rate < MIN_SAMPLE_RATE {
        return Err(input_err(
            path,
            format!("sample rate {rate} Hz is below {MIN_SAMPLE_RATE} Hz; record or export at 16 kHz or more"),
        ));
    }
    if rate > MAX_SAMPLE_RATE {
        return Err(input_err(
            path,
            format!(
                "sample rate {rate} Hz is above {MAX_SAMPLE_RATE} Hz (the header is damaged, or the file is not a \
                 recording); re-export it at 16-48 kHz"
            ),
        ));
    }
    Ok(())
}

/// Samples `audio` has at `rate` after resampling (`ceil(rate · n / original rate)`, as
/// [`resample`] gives), without resampling.
pub fn samples_at(audio: &Audio, rate: u32) -> u64 {
    if audio.sample_rate == 0 || audio.sample_rate == rate {
        return audio.samples.len() as u64;
    }
    (u128::from(rate) * audio.samples.len() as u128).div_ceil(u128::from(audio.sample_rate)) as u64
}

/// Refuses, before any resampling or model, a prompt too short for some stage (under
/// [`MIN_PROMPT_SECONDS`]: [`MIN_PROMPT_SAMPLES_16K`] at 16 kHz, [`MIN_PROMPT_SAMPLES_24K`] at
/// 24 kHz) or longer than `max_seconds` at 16 kHz (the official speech-tokenizer check; use
/// [`MAX_TOKENIZER_SECONDS`]).
pub fn check_length(audio: &Audio, path: &Path, max_seconds: f64) -> Result<()> {
    let n16 = samples_at(audio, 16_000);
    let n24 = samples_at(audio, MEL_RATE);
    if n16 < MIN_PROMPT_SAMPLES_16K || n24 < MIN_PROMPT_SAMPLES_24K {
        return Err(input_err(
            path,
            format!(
                "is {:.3} s long; a prompt must be at least {MIN_PROMPT_SECONDS} s (the speaker embedding needs 3 fbank \
                 frames, the prompt mel 2 frames); record a few seconds of speech",
                audio.seconds()
            ),
        ));
    }
    let secs = n16 as f64 / 16_000.0;
    if secs > max_seconds {
        let (long, limit) = over_limit(secs, max_seconds);
        return Err(input_err(path, format!("is {long} s long; this model takes at most {limit} s of prompt; cut the prompt shorter")));
    }
    Ok(())
}

/// A length over a limit and the limit, in seconds, as a message shows them: the limit rounded
/// down and the length rounded up to 0.01 s (trailing zeros dropped), so that a refused length
/// never reads as equal to (or below) the limit, and a prompt of exactly the stated limit fits.
pub fn over_limit(seconds: f64, limit: f64) -> (String, String) {
    let show = |v: f64| {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    // A hair of tolerance so that 29.2 (29.199999…) is not shown as 29.19.
    let floor = ((limit * 100.0) + 1e-6).floor() / 100.0;
    let ceil = ((seconds * 100.0) - 1e-6).ceil() / 100.0;
    let ceil = if ceil <= floor { floor + 0.01 } else { ceil };
    (show(ceil), show(floor))
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
            let (long, limit) = over_limit(secs, limit);
            return Err(input_err(path, format!("is {long} s long; the speech tokenizer takes at most {limit} s; cut the prompt shorter")));
        }
    }
    Ok(samples)
}

/// Loads `path` and returns it at `target_rate` (see [`load_audio`] and [`to_rate`]).
pub fn load_at(path: &Path, target_rate: u32, max_seconds: Option<f64>) -> Result<Vec<f32>> {
    let audio = load_audio(path)?;
    to_rate(&audio, target_rate, max_seconds, path)
}

#[cfg(test)]
mod level_tests {
    use super::*;

    /// Well-formed samples with no usable signal are refused wherever audio comes in (issue 30):
    /// far too quiet, a constant offset, far past full scale; speech-like levels pass.
    #[test]
    fn samples_far_too_quiet_or_past_full_scale_are_refused() {
        let label = Path::new("upload.wav");
        let tone = |amplitude: f32| (0..24_000).map(|i| (i as f32 * 0.05).sin() * amplitude).collect::<Vec<f32>>();
        let refused = |samples: Vec<f32>, needle: &str| {
            let e = from_pcm(label, samples, 24_000).expect_err(needle).to_string();
            assert!(e.contains("upload.wav") && e.contains(needle), "{e}");
        };
        refused(tone(2.0 / 32768.0), "is nearly silent (-87 dBFS; a prompt needs at least -60 dBFS)");
        refused(vec![0.25; 24_000], "is nearly silent (no signal at all");
        let mut spike = tone(0.3);
        spike[100] = 1e30;
        refused(spike, "has a sample of 1e30, far past full scale");
        // −60 dBFS (RMS) passes, and so do a few dB over full scale in a float file.
        assert!(from_pcm(label, tone(0.0015), 24_000).is_ok());
        assert!(from_pcm(label, tone(2.0), 24_000).is_ok());
    }
}
