//! Live playback through cpal: a bounded sample queue fed chunk by chunk by the synthesis thread and
//! drained by the device callback.
//!
//! * Pacing: [`Player::push`] blocks while the queue is full, so a producer faster than real time is
//!   held back by the device itself; no sleeps or clocks are involved.
//! * Format: the model's mono stream is converted to what the device accepts. The rate is kept when
//!   the device supports it; otherwise the nearest supported rate is used and the producer-side
//!   [`Resampler`] (windowed sinc) converts. The mono sample is copied to every device channel.
//!   The sample type (f32, i16, i32, …) is converted in the callback with cpal's `FromSample`.
//! * Draining: [`Player::finish`] waits until the queue is empty and the device has then pulled a
//!   few more buffers of silence (so the last real samples have left the device buffer), counted in
//!   frames, not in wall time.
//! * Cancel: [`Player::cancel`] / [`CancelHandle::cancel`] (e.g. from Ctrl-C via
//!   `interrupt::cancel_on_ctrl_c`) empties the queue, silences the output and makes `push` return
//!   [`Flow::Cancelled`] at once.
//! * Gate: [`GateHandle::set`] lets the device play only up to a position (the buffering rule of
//!   `cosy::app::buffering` decides it); audio held behind the gate does not count against the
//!   queue's capacity, so a producer can buffer a whole sentence. Silence the device pulls after
//!   playback started because the queue ran dry inside what the gate allowed is an *underrun*
//!   ([`PlaybackEvents::underrun_frames`]); waiting at the gate is a planned gap, not counted.
//! * Events: [`PlaybackEvents`] counts callbacks and frames and records, on a sequence counter shared
//!   with the producer, when the first real samples were pulled, so tests can check the *order* of
//!   events (first audio before the last chunk) instead of timings.
//!
//! Use: `let mut player = Player::open(device, 24_000)?;` then, from the
//! synthesis thread, `if player.push(&chunk)? == Flow::Cancelled { break }` per chunk (blocks while
//! the ~2 s queue is full, so synthesis is paced by the device), then `player.finish()?` (plays out
//! the queue and stops). For Ctrl-C: `cancel_on_ctrl_c(player.cancel_handle())?` (`interrupt::cancel_on_ctrl_c` in the binary);
//! the handle is also pollable (`is_cancelled`) to stop synthesis early. `player.events()` exposes
//! counters, including when the first samples reached the device (time to first audio).
//! With no usable output device, `Player::open(None, …)` fails with one line that says so and points
//! to `cosy file`. [`list_devices`] lists outputs with their rates/channels (for a `--device` help).
//!
//! Headless / CI: ALSA reads its configuration once per process at first use. To run without a sound
//! card, either pass `--device null` (discards audio) or start the process with `HOME` pointing to a
//! folder whose `.asoundrc` says `pcm.!default { type null }`. The null device is not paced: it pulls
//! samples as fast as the CPU allows.
//!
//! A module of the binary that imports only the library (`cosy::…`), nothing else of the binary:
//! the playback tests (tests/audio_*.rs, one process each, since ALSA reads its configuration once
//! per process) compile this file into themselves with `#[path]`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{FromSample, SampleFormat, SizedSample, SupportedStreamConfigRange};

use cosy::app::buffering::Gate;
use cosy::audio::Resampler;
use cosy::error::{Error, Result};

/// The rate the CosyVoice3 vocoder produces.
pub const MODEL_SAMPLE_RATE: u32 = 24_000;

/// What `Player::push` tells the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "stop producing when playback was cancelled"]
pub enum Flow {
    /// The chunk was queued; keep going.
    Continue,
    /// Playback was cancelled ([`Player::cancel`], e.g. on Ctrl-C): stop synthesising.
    Cancelled,
}

/// One output device as seen by [`list_devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The name `--device` accepts (the ALSA PCM name on Linux, e.g. `default`, `null`, `hw:CARD=0,DEV=0`).
    pub name: String,
    /// Human-readable description from the host.
    pub description: String,
    /// Whether this is the host's default output.
    pub is_default: bool,
    /// Supported channel counts, ascending (empty when the device could not be opened).
    pub channels: Vec<u16>,
    /// Supported sample-rate ranges `(min, max)` in Hz, merged and ascending.
    pub sample_rates: Vec<(u32, u32)>,
    /// Why the device's configurations could not be read (busy, not present), if so.
    pub error: Option<String>,
}

impl DeviceInfo {
    // Read by the playback tests (tests/audio_*.rs compile this file), not by `cosy say`.
    #[allow(dead_code)]
    /// Whether the device accepts `rate` directly (no resampling).
    pub fn supports_rate(&self, rate: u32) -> bool {
        self.sample_rates.iter().any(|&(lo, hi)| lo <= rate && rate <= hi)
    }
}

/// The configuration a [`Player`] ended up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputConfig {
    pub device: String,
    /// Rate of the samples given to `push`.
    pub input_rate: u32,
    /// Rate the device runs at (differs from `input_rate` only if the device cannot do it).
    pub device_rate: u32,
    pub channels: u16,
    pub sample_format: String,
}

/// Options of [`Player::open_with`].
#[derive(Debug, Clone)]
pub struct PlayerOptions {
    /// Device name (see [`DeviceInfo::name`]); `None` = the host's default output.
    pub device: Option<String>,
    /// Rate of the pushed samples.
    pub sample_rate: u32,
    /// Queue capacity in seconds of audio; `push` blocks beyond it.
    pub buffer_seconds: f32,
    /// `push`/`finish` fail if the device pulls nothing for this long while they wait.
    pub stall_timeout: Duration,
}

impl Default for PlayerOptions {
    fn default() -> Self {
        PlayerOptions {
            device: None,
            sample_rate: MODEL_SAMPLE_RATE,
            buffer_seconds: 2.0,
            stall_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters and first-audio markers written by the device callback. Frame counts are device frames
/// (one sample per channel), at the device rate.
#[derive(Debug)]
pub struct PlaybackEvents {
    seq: AtomicU64,
    first_samples_seq: AtomicU64,
    first_samples_at: OnceLock<Instant>,
    callbacks: AtomicU64,
    frames_played: AtomicU64,
    silence_frames: AtomicU64,
    underrun_frames: AtomicU64,
    frames_queued: AtomicU64,
}

impl Default for PlaybackEvents {
    fn default() -> Self {
        PlaybackEvents {
            seq: AtomicU64::new(0),
            first_samples_seq: AtomicU64::new(u64::MAX),
            first_samples_at: OnceLock::new(),
            callbacks: AtomicU64::new(0),
            frames_played: AtomicU64::new(0),
            silence_frames: AtomicU64::new(0),
            underrun_frames: AtomicU64::new(0),
            frames_queued: AtomicU64::new(0),
        }
    }
}

impl PlaybackEvents {
    /// Takes the next number of the sequence shared with the device callback. A producer calls it
    /// around its own steps; comparing with [`first_samples_seq`](Self::first_samples_seq) orders
    /// "device got audio" against those steps.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }
    /// Sequence number taken by the first callback that pulled real (non-silence) samples.
    pub fn first_samples_seq(&self) -> Option<u64> {
        match self.first_samples_seq.load(Ordering::SeqCst) {
            u64::MAX => None,
            s => Some(s),
        }
    }
    // Read by the playback tests (tests/audio_*.rs compile this file), not by `cosy say`.
    #[allow(dead_code)]
    /// When the first real samples were pulled (for time-to-first-audio reports).
    pub fn first_samples_at(&self) -> Option<Instant> {
        self.first_samples_at.get().copied()
    }
    /// Device callbacks so far.
    pub fn callbacks(&self) -> u64 {
        self.callbacks.load(Ordering::SeqCst)
    }
    // Read by the playback tests (tests/audio_*.rs compile this file), not by `cosy say`.
    #[allow(dead_code)]
    /// Frames of pushed audio the device has pulled.
    pub fn frames_played(&self) -> u64 {
        self.frames_played.load(Ordering::SeqCst)
    }
    // Read by the playback tests (tests/audio_*.rs compile this file), not by `cosy say`.
    #[allow(dead_code)]
    /// Frames of silence the device pulled (queue empty: start-up, underrun, drain tail).
    pub fn silence_frames(&self) -> u64 {
        self.silence_frames.load(Ordering::SeqCst)
    }
    /// Frames of silence the device had to play after playback started because the queue ran dry
    /// inside what the gate allowed (not the start, not a wait at the gate, not the drain tail).
    pub fn underrun_frames(&self) -> u64 {
        self.underrun_frames.load(Ordering::SeqCst)
    }
    // Read by the playback tests (tests/audio_*.rs compile this file), not by `cosy say`.
    #[allow(dead_code)]
    /// Frames queued by `push`/`finish` (after resampling), cancelled ones included.
    pub fn frames_queued(&self) -> u64 {
        self.frames_queued.load(Ordering::SeqCst)
    }
}

/// State shared between the producer side and the device callback.
struct Queue {
    samples: VecDeque<f32>,
    capacity: usize,
    producer_done: bool,
    /// Silence frames pulled after `producer_done` with the queue empty.
    tail_silence: u64,
    device_error: Option<String>,
    /// `None`: play whatever is queued; `Some(n)`: play up to device frame `n` from the start.
    gate: Option<u64>,
    /// Samples given to `push`, at the input rate.
    pushed: u64,
}

impl Queue {
    /// Queued frames the gate lets the device play, with `played` frames played so far.
    fn released(&self, played: u64) -> usize {
        match self.gate {
            None => self.samples.len(),
            Some(mark) => usize::try_from(mark.saturating_sub(played)).unwrap_or(usize::MAX).min(self.samples.len()),
        }
    }
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
    cancelled: AtomicBool,
    events: Arc<PlaybackEvents>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic elsewhere while holding the lock leaves plain data behind; keep playing.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A clonable, thread-safe handle that cancels a [`Player`].
#[derive(Clone)]
pub struct CancelHandle(Arc<Shared>);

impl CancelHandle {
    pub fn cancel(&self) {
        cancel_shared(&self.0);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::SeqCst)
    }
}

fn cancel_shared(shared: &Shared) {
    shared.cancelled.store(true, Ordering::SeqCst);
    shared.lock().samples.clear();
    shared.changed.notify_all();
}

/// Live audio output. See the module docs.
pub struct Player {
    // Dropped first: stops the callback before the shared state goes away.
    stream: Option<cpal::Stream>,
    shared: Arc<Shared>,
    resampler: Resampler,
    config: OutputConfig,
    tail_frames: u64,
    stall_timeout: Duration,
}

impl Player {
    /// Opens `device` (or the default output) for mono audio at `sample_rate` with default options.
    pub fn open(device: Option<&str>, sample_rate: u32) -> Result<Player> {
        Player::open_with(&PlayerOptions {
            device: device.map(str::to_string),
            sample_rate,
            ..PlayerOptions::default()
        })
    }

    pub fn open_with(options: &PlayerOptions) -> Result<Player> {
        if options.sample_rate == 0 {
            return Err(Error::invalid("playback sample rate must be positive"));
        }
        silence_alsa_errors();
        let host = cpal::default_host();
        let (device, name) = match options.device.as_deref() {
            Some(wanted) => find_device(&host, wanted)?,
            None => {
                let device = host.default_output_device().ok_or_else(no_device_error)?;
                let name = device_name(&device);
                (device, name)
            }
        };
        let ranges: Vec<SupportedStreamConfigRange> = match device.supported_output_configs() {
            Ok(ranges) => ranges.collect(),
            Err(e) if options.device.is_none() => return Err(no_device_error_because(&e)),
            Err(e) => {
                return Err(Error::invalid(format!(
                    "audio device {name:?} cannot be opened for output: {e}"
                )))
            }
        };
        let chosen = choose_config(&ranges, options.sample_rate).ok_or_else(|| {
            Error::invalid(format!(
                "audio device {name:?} offers no output format cosy can produce (f32/i16/i32/u16/u8/i8/f64)"
            ))
        })?;
        let stream_config = cpal::StreamConfig {
            channels: chosen.channels(),
            sample_rate: chosen.sample_rate(),
            buffer_size: cpal::BufferSize::Default,
        };
        let device_rate = stream_config.sample_rate;
        let capacity = ((options.buffer_seconds.max(0.01) as f64) * device_rate as f64).ceil() as usize;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                samples: VecDeque::with_capacity(capacity),
                capacity,
                producer_done: false,
                tail_silence: 0,
                device_error: None,
                gate: None,
                pushed: 0,
            }),
            changed: Condvar::new(),
            cancelled: AtomicBool::new(false),
            events: Arc::new(PlaybackEvents::default()),
        });
        let stream = match chosen.sample_format() {
            SampleFormat::F32 => build_stream::<f32>(&device, stream_config, &shared),
            SampleFormat::I16 => build_stream::<i16>(&device, stream_config, &shared),
            SampleFormat::I32 => build_stream::<i32>(&device, stream_config, &shared),
            SampleFormat::F64 => build_stream::<f64>(&device, stream_config, &shared),
            SampleFormat::U16 => build_stream::<u16>(&device, stream_config, &shared),
            SampleFormat::U8 => build_stream::<u8>(&device, stream_config, &shared),
            SampleFormat::I8 => build_stream::<i8>(&device, stream_config, &shared),
            other => unreachable!("choose_config only returns handled formats, got {other}"),
        }
        .map_err(|e| Error::invalid(format!("audio device {name:?}: cannot start output: {e}")))?;
        stream
            .play()
            .map_err(|e| Error::invalid(format!("audio device {name:?}: cannot start output: {e}")))?;
        // Enough silence after the last sample to push it out of the device's own buffer (cpal's
        // ALSA default is two periods): four callbacks' worth, and at least 50 ms.
        let per_callback = stream.buffer_size().unwrap_or(0) as u64;
        let tail_frames = (4 * per_callback).max(device_rate as u64 / 20);
        Ok(Player {
            stream: Some(stream),
            resampler: Resampler::new(options.sample_rate, device_rate),
            config: OutputConfig {
                device: name,
                input_rate: options.sample_rate,
                device_rate,
                channels: stream_config.channels,
                sample_format: chosen.sample_format().to_string(),
            },
            shared,
            tail_frames,
            stall_timeout: options.stall_timeout,
        })
    }

    /// The device configuration in use.
    pub fn config(&self) -> &OutputConfig {
        &self.config
    }

    /// The event counters (shared with the device callback).
    pub fn events(&self) -> Arc<PlaybackEvents> {
        self.shared.events.clone()
    }

    /// A handle that moves this player's gate from another thread.
    pub fn gate_handle(&self) -> GateHandle {
        GateHandle { shared: self.shared.clone(), input_rate: self.config.input_rate, device_rate: self.config.device_rate }
    }

    /// A handle that can cancel this player from another thread or a signal handler.
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(self.shared.clone())
    }

    // Read by the playback tests (tests/audio_*.rs compile this file), not by `cosy say`.
    #[allow(dead_code)]
    /// Cancels playback: drops queued audio, outputs silence, `push` returns `Flow::Cancelled`.
    pub fn cancel(&self) {
        cancel_shared(&self.shared);
    }

    pub fn is_cancelled(&self) -> bool {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    /// Queues one chunk of mono samples at the input rate, blocking while the queue is full.
    pub fn push(&mut self, chunk: &[f32]) -> Result<Flow> {
        if self.is_cancelled() {
            return Ok(Flow::Cancelled);
        }
        let converted = self.resampler.process(chunk);
        self.shared.lock().pushed += chunk.len() as u64;
        self.enqueue(&converted)
    }

    /// Plays out everything queued, then stops the stream. Returns early (Ok) when cancelled.
    pub fn finish(mut self) -> Result<()> {
        let tail = self.resampler.flush();
        if self.enqueue(&tail)? == Flow::Cancelled {
            return Ok(());
        }
        let mut queue = self.shared.lock();
        queue.producer_done = true;
        queue.tail_silence = 0;
        // Everything left plays out.
        queue.gate = None;
        let mut watch = StallWatch::new(&self.shared.events, self.stall_timeout);
        loop {
            if self.is_cancelled() {
                break;
            }
            if let Some(e) = &queue.device_error {
                return Err(device_error(&self.config.device, e));
            }
            if queue.samples.is_empty() && queue.tail_silence >= self.tail_frames {
                break;
            }
            watch.check(&self.config.device)?;
            queue = self.wait(queue);
        }
        drop(queue);
        if let Some(stream) = self.stream.take() {
            let _ = stream.pause();
        }
        Ok(())
    }

    fn wait<'a>(&self, queue: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        self.shared
            .changed
            .wait_timeout(queue, Duration::from_millis(50))
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// Appends device-rate samples, waiting for room as often as needed.
    fn enqueue(&self, mut samples: &[f32]) -> Result<Flow> {
        let mut watch = StallWatch::new(&self.shared.events, self.stall_timeout);
        let mut queue = self.shared.lock();
        while !samples.is_empty() {
            if self.is_cancelled() {
                return Ok(Flow::Cancelled);
            }
            if let Some(e) = &queue.device_error {
                return Err(device_error(&self.config.device, e));
            }
            // Audio held behind the gate does not count: a whole sentence can wait there.
            let played = self.shared.events.frames_played();
            let room = queue.capacity.saturating_sub(queue.released(played));
            if room == 0 {
                watch.check(&self.config.device)?;
                queue = self.wait(queue);
                continue;
            }
            let take = room.min(samples.len());
            queue.samples.extend(&samples[..take]);
            self.shared
                .events
                .frames_queued
                .fetch_add(take as u64, Ordering::SeqCst);
            samples = &samples[take..];
        }
        Ok(Flow::Continue)
    }
}

impl Drop for Player {
    fn drop(&mut self) {
        // Stop the callback before anything else goes away; queued audio is discarded.
        if let Some(stream) = self.stream.take() {
            let _ = stream.pause();
        }
    }
}

/// A clonable handle on a [`Player`]'s gate, in samples at the input rate.
#[derive(Clone)]
pub struct GateHandle {
    shared: Arc<Shared>,
    input_rate: u32,
    device_rate: u32,
}

impl GateHandle {
    /// Lets the device play up to `gate` (input samples from the start), or everything.
    pub fn set(&self, gate: Gate) {
        let mut queue = self.shared.lock();
        queue.gate = match gate {
            Gate::Open => None,
            // Up to all that was pushed: every frame queued so far (whatever the resampler kept).
            Gate::HoldAt(mark) if mark >= queue.pushed => Some(self.shared.events.frames_queued()),
            Gate::HoldAt(mark) => Some(self.to_device(mark)),
        };
        drop(queue);
        self.shared.changed.notify_all();
    }

    /// Samples played so far, at the input rate.
    pub fn played(&self) -> u64 {
        let frames = self.shared.events.frames_played();
        if self.input_rate == self.device_rate {
            return frames;
        }
        (u128::from(frames) * u128::from(self.input_rate) / u128::from(self.device_rate.max(1))) as u64
    }

    fn to_device(&self, samples: u64) -> u64 {
        if self.input_rate == self.device_rate {
            return samples;
        }
        (u128::from(samples) * u128::from(self.device_rate) / u128::from(self.input_rate.max(1))) as u64
    }
}

/// Fails a wait when the device has not run a callback for `timeout`.
struct StallWatch<'a> {
    events: &'a PlaybackEvents,
    timeout: Duration,
    last_callbacks: u64,
    since: Instant,
}

impl<'a> StallWatch<'a> {
    fn new(events: &'a PlaybackEvents, timeout: Duration) -> Self {
        StallWatch {
            events,
            timeout,
            last_callbacks: events.callbacks(),
            since: Instant::now(),
        }
    }
    fn check(&mut self, device: &str) -> Result<()> {
        let now = self.events.callbacks();
        if now != self.last_callbacks {
            self.last_callbacks = now;
            self.since = Instant::now();
        } else if self.since.elapsed() > self.timeout {
            return Err(Error::invalid(format!(
                "audio device {device:?} stopped taking samples for {:.1} s; use `cosy file` to write a WAV file instead",
                self.timeout.as_secs_f32()
            )));
        }
        Ok(())
    }
}

fn device_error(device: &str, msg: &str) -> Error {
    Error::invalid(format!("audio device {device:?} failed during playback: {msg}"))
}

fn build_stream<T>(
    device: &cpal::Device,
    config: cpal::StreamConfig,
    shared: &Arc<Shared>,
) -> std::result::Result<cpal::Stream, cpal::Error>
where
    T: SizedSample + FromSample<f32>,
{
    let channels = config.channels.max(1) as usize;
    let data_shared = shared.clone();
    let error_shared = shared.clone();
    device.build_output_stream(
        config,
        move |data: &mut [T], _: &cpal::OutputCallbackInfo| fill_output(&data_shared, data, channels),
        move |err: cpal::Error| {
            // Xruns are recoverable glitches; anything else ends playback with this message.
            if err.kind() == cpal::ErrorKind::Xrun {
                return;
            }
            error_shared.lock().device_error.get_or_insert_with(|| err.to_string());
            error_shared.changed.notify_all();
        },
        None,
    )
}

/// The device callback: copies queued mono samples to every channel, silence when there are none.
fn fill_output<T: SizedSample + FromSample<f32>>(shared: &Shared, data: &mut [T], channels: usize) {
    let frames = data.len() / channels;
    let mut queue = shared.lock();
    let events = &shared.events;
    let cancelled = shared.cancelled.load(Ordering::Relaxed);
    let played = events.frames_played.load(Ordering::SeqCst);
    let released = queue.released(played);
    let take = if cancelled { 0 } else { frames.min(released) };
    // Ran dry inside what the gate allows (not waiting at the gate) after playback started.
    let gate_allows_more = queue.gate.is_none_or(|mark| mark.saturating_sub(played) > released as u64);
    let started = events.first_samples_seq.load(Ordering::SeqCst) != u64::MAX;
    for (frame, sample) in data.chunks_exact_mut(channels).zip(queue.samples.drain(..take)) {
        frame.fill(T::from_sample(sample));
    }
    data[take * channels..].fill(T::EQUILIBRIUM);
    let silent = (frames - take) as u64;
    if queue.producer_done {
        queue.tail_silence += silent;
    } else if started && !cancelled && gate_allows_more {
        events.underrun_frames.fetch_add(silent, Ordering::SeqCst);
    }
    // Counters are updated under the lock so that `finish` sees them complete when it returns.
    events.callbacks.fetch_add(1, Ordering::SeqCst);
    events.frames_played.fetch_add(take as u64, Ordering::SeqCst);
    events.silence_frames.fetch_add(silent, Ordering::SeqCst);
    if take > 0 && events.first_samples_seq.load(Ordering::SeqCst) == u64::MAX {
        events.first_samples_seq.store(events.next_seq(), Ordering::SeqCst);
        let _ = events.first_samples_at.set(Instant::now());
    }
    drop(queue);
    shared.changed.notify_all();
}

/// Picks the device configuration: the wanted rate if any range has it (else the nearest rate),
/// then the best sample format (f32 first), then mono, then stereo, then the fewest channels.
fn choose_config(ranges: &[SupportedStreamConfigRange], wanted_rate: u32) -> Option<cpal::SupportedStreamConfig> {
    ranges
        .iter()
        .filter_map(|range| {
            let format_rank = format_rank(range.sample_format())?;
            let rate = wanted_rate.clamp(range.min_sample_rate(), range.max_sample_rate());
            let channel_rank = match range.channels() {
                0 => return None,
                1 => 0,
                2 => 1,
                n => n as u32,
            };
            Some(((rate.abs_diff(wanted_rate), format_rank, channel_rank), *range, rate))
        })
        .min_by_key(|(key, _, _)| *key)
        .map(|(_, range, rate)| range.with_sample_rate(rate))
}

/// Preference order of the sample formats the callback can write; `None` = not handled.
fn format_rank(format: SampleFormat) -> Option<u32> {
    Some(match format {
        SampleFormat::F32 => 0,
        SampleFormat::I16 => 1,
        SampleFormat::I32 => 2,
        SampleFormat::F64 => 3,
        SampleFormat::U16 => 4,
        SampleFormat::U8 => 5,
        SampleFormat::I8 => 6,
        _ => return None,
    })
}

#[cfg(target_os = "linux")]
extern "C" {
    /// src/audio/c/alsa_quiet.c: installs a handler that drops ALSA's own error prints.
    fn cosy_alsa_silence_errors() -> std::os::raw::c_int;
}

/// ALSA prints its errors to stderr itself (e.g. eight "ALSA lib ..." lines when there is no
/// sound card) before cpal returns them to us; cosy reports each failure as one line of its own,
/// so the library's printing is switched off, once per process, before any device is touched.
pub fn silence_alsa_errors() {
    #[cfg(target_os = "linux")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: the C function only registers a handler that ignores its arguments;
            // `snd_lib_error_set_handler` is process-global and callable from any thread.
            let rc = unsafe { cosy_alsa_silence_errors() };
            if rc != 0 {
                tracing::debug!("could not silence ALSA's error messages (code {rc})");
            }
        });
    }
}

fn no_device_error() -> Error {
    Error::invalid(
        "no audio output device was found; use `cosy file` to write a WAV file instead (or pick one with --device)")
}

fn no_device_error_because(e: &cpal::Error) -> Error {
    Error::invalid(format!(
        "no audio output device was found (the default output is unusable: {e}); use `cosy file` to write a WAV file instead (or pick one with --device)"
    ))
}

/// The name `--device` accepts for `device`: the host's device id without the host prefix.
fn device_name(device: &cpal::Device) -> String {
    match device.id() {
        Ok(id) => id.id().to_string(),
        Err(_) => device.to_string(),
    }
}

fn device_description(device: &cpal::Device) -> String {
    device.description().map(|d| d.name().to_string()).unwrap_or_default()
}

/// All output devices plus the default one (which ALSA does not always list).
fn output_devices(host: &cpal::Host) -> Result<(Vec<cpal::Device>, Option<String>)> {
    let mut devices: Vec<cpal::Device> = host
        .output_devices()
        .map_err(|e| Error::invalid(format!("cannot list audio devices: {e}")))?
        .collect();
    let default = host.default_output_device();
    let default_name = default.as_ref().map(device_name);
    if let Some(default) = default {
        if !devices.iter().any(|d| device_name(d) == device_name(&default)) {
            devices.insert(0, default);
        }
    }
    Ok((devices, default_name))
}

/// Finds an output device by its name (`null`), full id (`alsa:null`) or description.
fn find_device(host: &cpal::Host, wanted: &str) -> Result<(cpal::Device, String)> {
    let (devices, _) = output_devices(host)?;
    let matches = |d: &cpal::Device| {
        let name = device_name(d);
        name == wanted
            || d.id().map(|id| id.to_string() == wanted).unwrap_or(false)
            || device_description(d).eq_ignore_ascii_case(wanted)
    };
    if let Some(device) = devices.iter().find(|d| matches(d)) {
        let name = device_name(device);
        return Ok((device.clone(), name));
    }
    // ALSA also accepts shorthands such as `hw:0,0` for listed devices.
    if let Some(device) = host.device_by_id(&cpal::DeviceId::new(host.id(), wanted)) {
        let name = device_name(&device);
        return Ok((device, name));
    }
    let names: Vec<String> = devices.iter().map(device_name).collect();
    Err(Error::invalid(format!(
        "audio device {wanted:?} not found; available output devices: {}",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    )))
}

/// Lists the output devices with their supported rates and channel counts. A device whose
/// configuration cannot be read (absent card, busy) is listed with `error` set.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    silence_alsa_errors();
    let host = cpal::default_host();
    let (devices, default_name) = output_devices(&host)?;
    Ok(devices
        .iter()
        .map(|device| {
            let name = device_name(device);
            let mut info = DeviceInfo {
                is_default: Some(&name) == default_name.as_ref(),
                description: device_description(device),
                name,
                channels: Vec::new(),
                sample_rates: Vec::new(),
                error: None,
            };
            match device.supported_output_configs() {
                Ok(ranges) => {
                    let ranges: Vec<_> = ranges.filter(|r| format_rank(r.sample_format()).is_some()).collect();
                    info.channels = ranges.iter().map(|r| r.channels()).collect();
                    info.channels.sort_unstable();
                    info.channels.dedup();
                    info.sample_rates = merge_ranges(ranges.iter().map(|r| (r.min_sample_rate(), r.max_sample_rate())));
                }
                Err(e) => info.error = Some(e.to_string()),
            }
            info
        })
        .collect())
}

fn merge_ranges(ranges: impl Iterator<Item = (u32, u32)>) -> Vec<(u32, u32)> {
    let mut ranges: Vec<(u32, u32)> = ranges.collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpal::SupportedBufferSize::Unknown;

    fn range(channels: u16, min: u32, max: u32, format: SampleFormat) -> SupportedStreamConfigRange {
        SupportedStreamConfigRange::new(channels, min, max, Unknown, format)
    }

    fn pick(ranges: &[SupportedStreamConfigRange]) -> (u16, u32, SampleFormat) {
        let c = choose_config(ranges, MODEL_SAMPLE_RATE).expect("a config");
        (c.channels(), c.sample_rate(), c.sample_format())
    }

    #[test]
    fn config_prefers_the_model_rate_then_f32_then_mono() {
        let ranges = [
            range(2, 8_000, 192_000, SampleFormat::F32),
            range(1, 8_000, 192_000, SampleFormat::I16),
            range(1, 8_000, 192_000, SampleFormat::F32),
            range(1, 44_100, 44_100, SampleFormat::F32),
        ];
        assert_eq!(pick(&ranges), (1, 24_000, SampleFormat::F32));
        // A stereo-only device keeps the rate and gets 2 channels.
        assert_eq!(pick(&ranges[..1]), (2, 24_000, SampleFormat::F32));
        // An exact rate beats a better sample format.
        let ranges = [
            range(1, 48_000, 48_000, SampleFormat::F32),
            range(2, 24_000, 24_000, SampleFormat::I16),
        ];
        assert_eq!(pick(&ranges), (2, 24_000, SampleFormat::I16));
    }

    #[test]
    fn config_falls_back_to_the_nearest_rate_and_skips_unusable_formats() {
        let ranges = [
            range(2, 44_100, 44_100, SampleFormat::I16),
            range(2, 48_000, 48_000, SampleFormat::F32),
        ];
        assert_eq!(pick(&ranges), (2, 44_100, SampleFormat::I16));
        let ranges = [
            range(2, 22_050, 22_050, SampleFormat::I16),
            range(2, 48_000, 96_000, SampleFormat::F32),
        ];
        assert_eq!(pick(&ranges), (2, 22_050, SampleFormat::I16));
        let ranges = [range(2, 32_000, 96_000, SampleFormat::I32)];
        assert_eq!(pick(&ranges), (2, 32_000, SampleFormat::I32));
        assert!(choose_config(&[range(2, 24_000, 24_000, SampleFormat::DsdU8)], MODEL_SAMPLE_RATE).is_none());
        assert!(choose_config(&[], MODEL_SAMPLE_RATE).is_none());
    }

    fn shared_with(samples: &[f32], producer_done: bool) -> Shared {
        Shared {
            queue: Mutex::new(Queue {
                samples: samples.iter().copied().collect(),
                capacity: 100,
                producer_done,
                tail_silence: 0,
                device_error: None,
                gate: None,
                pushed: 0,
            }),
            changed: Condvar::new(),
            cancelled: AtomicBool::new(false),
            events: Arc::new(PlaybackEvents::default()),
        }
    }

    #[test]
    fn callback_copies_mono_to_every_channel_and_pads_with_silence() {
        let shared = shared_with(&[0.5, -0.25], true);
        let marker = shared.events.next_seq();
        let mut out = [7i16; 9]; // 3 frames of 3 channels
        fill_output(&shared, &mut out, 3);
        assert_eq!(out, [16384, 16384, 16384, -8192, -8192, -8192, 0, 0, 0]);
        let events = &shared.events;
        assert_eq!(
            (events.callbacks(), events.frames_played(), events.silence_frames()),
            (1, 2, 1)
        );
        assert!(events.first_samples_seq().unwrap() > marker);
        assert_eq!(shared.lock().tail_silence, 1);

        let mut out = [1.0f32; 4];
        fill_output(&shared, &mut out, 2);
        assert_eq!(out, [0.0; 4]);
        assert_eq!(
            (events.callbacks(), events.frames_played(), events.silence_frames()),
            (2, 2, 3)
        );
        assert_eq!(shared.lock().tail_silence, 3);
    }

    #[test]
    fn callback_waits_at_the_gate_and_counts_only_running_dry_inside_it_as_underrun() {
        let shared = shared_with(&[0.5; 4], false);
        shared.lock().gate = Some(2);
        let mut out = [1.0f32; 3];
        // Plays up to the gate; the silence after it is a wait, not an underrun.
        fill_output(&shared, &mut out, 1);
        assert_eq!(out, [0.5, 0.5, 0.0]);
        fill_output(&shared, &mut out, 1);
        assert_eq!(out, [0.0; 3]);
        let events = &shared.events;
        assert_eq!((events.frames_played(), events.underrun_frames()), (2, 0));
        // Held audio does not fill the queue: only the released part counts against capacity.
        assert_eq!(shared.lock().released(2), 0);
        // Opened: the two queued samples play, then the queue runs dry: one underrun frame.
        shared.lock().gate = None;
        fill_output(&shared, &mut out, 1);
        assert_eq!(out, [0.5, 0.5, 0.0]);
        assert_eq!((events.frames_played(), events.underrun_frames()), (4, 1));
        // A gate beyond what is queued runs dry inside it: an underrun too.
        shared.lock().gate = Some(10);
        fill_output(&shared, &mut out, 1);
        assert_eq!(events.underrun_frames(), 4);
        // Silence before the first real samples is the start, not an underrun.
        let fresh = shared_with(&[], false);
        fill_output(&fresh, &mut out, 1);
        assert_eq!(fresh.events.underrun_frames(), 0);
    }

    #[test]
    fn callback_outputs_silence_once_cancelled() {
        let shared = shared_with(&[0.5; 10], false);
        shared.cancelled.store(true, Ordering::SeqCst);
        let mut out = [1.0f32; 4];
        fill_output(&shared, &mut out, 1);
        assert_eq!(out, [0.0; 4]);
        assert_eq!(shared.events.frames_played(), 0);
        assert_eq!(shared.events.first_samples_seq(), None);
        // Silence before the producer is done is an underrun, not drain tail.
        assert_eq!(shared.lock().tail_silence, 0);
    }
}
