//! `cosy say`: streaming synthesis played live, made here or by a running `cosy serve`
//! ([`Source`]; docs/desktop.md, "A warm model behind cosy say").
//!
//! The device is opened first (so a machine without one fails at once, with the player's one-line
//! message pointing to `cosy file`), then the model is loaded and the request runs with the
//! streaming schedule: every chunk the token-to-wav worker produces is pushed to the [`Player`]
//! while the LLM thread keeps decoding, so the first audio plays before the LLM is done. `push`
//! blocks while the player's queue is full, which paces synthesis by the device.
//!
//! Playback that never stutters: unless `--no-buffering`, playback starts (or resumes after an
//! underrun) only as [`cosy::app::buffering`] allows: at once when the audio arrives at least as
//! fast as it plays, else a whole sentence at a time (with a one-line notice on stderr the first
//! time it waits, none with `-q`).
//!
//! Ctrl-C cancels the player (queue dropped, output silenced); the synthesis observer sees the
//! cancel and stops the LLM loop (its token callback returns false) and the token-to-wav worker,
//! and the command ends with [`Error::Cancelled`] (exit status 130). A second Ctrl-C exits at once.
//!
//! `--event-log PATH` (hidden, for tests and debugging) writes one line per event, `SEQ EVENT
//! ARGS…`, where SEQ comes from the sequence counter the device callback shares
//! ([`PlaybackEvents::next_seq`]), so sorting by SEQ gives the true order of "the device pulled its
//! first samples" against the producer's steps. Events: `llm_token SENTENCE INDEX TOKEN`,
//! `llm_done SENTENCE TOKENS TERMINATION`, `chunk_ready N SAMPLES` (taken before the chunk is
//! queued), `chunk_pushed N SAMPLES` (after), `device_first_samples`, `playback_done`,
//! `cancelled`, `sentence_audio_done SENTENCE END`, the buffering rule's decisions
//! `buffer_open REASON RATE` and `buffer_hold MARK REASON RATE` (RATE: the audio's arrival rate ×
//! real time; MARK: the sample playback holds at), and `underrun_frames N` and `first_audio_ms MS`
//! (the one time: from the start of the command's work to the device's first samples) before
//! `playback_done`. Through a running server ([`Source::Server`]) there are no `llm_*` events; a
//! chunk is one the server made, and `sentence_audio_done` comes from the server's sentence ends.
//! Lines are written as they happen (flushed), `device_first_samples` as soon as a
//! later event notices it, so the file is useful even when the process is interrupted.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::interrupt::cancel_on_ctrl_c;
use crate::playback::{CancelHandle, Flow, GateHandle, PlaybackEvents, Player, MODEL_SAMPLE_RATE};
use cosy::app::buffering::{Buffering, Decision, Gate, Reason};
use cosy::error::{Error, Result};
use cosy::llm::Termination;
use cosy::request::{Request, SynthesisObserver};

/// What `cosy say` plays to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The host's default output.
    Default,
    /// A named device (`--device`, `output.device`).
    Named(String),
    /// No playback (`output.device = "none"`): synthesise and discard.
    Nothing,
}

impl Output {
    /// From `--device` or else `output.device`. An empty or blank `--device` is refused (as an
    /// empty `output.device` is by the config): it is not taken for the default device.
    pub fn from_setting(flag: Option<&str>, config_value: &str) -> Result<Output> {
        if flag.is_some_and(|f| f.trim().is_empty()) {
            return Err(Error::invalid(
                "--device \"\": give a device name (see `cosy say --list-devices`), `default` or `none`; or leave --device out for output.device",
            ));
        }
        Ok(match flag.unwrap_or(config_value).trim() {
            "" | "default" => Output::Default,
            "none" => Output::Nothing,
            name => Output::Named(name.to_string()),
        })
    }
}

/// The `--event-log` file and the counter it orders lines by.
pub struct EventLog {
    /// When the log was made (before the model loads or the server is asked): `first_audio_ms`.
    started: std::time::Instant,
    file: Mutex<std::fs::File>,
    events: Arc<PlaybackEvents>,
    first_samples_logged: AtomicBool,
}

impl EventLog {
    pub fn create(path: &Path, events: Arc<PlaybackEvents>) -> Result<EventLog> {
        let file = std::fs::File::create(path)
            .map_err(|e| Error::invalid(format!("--event-log {}: cannot create ({e})", path.display())))?;
        Ok(EventLog { started: std::time::Instant::now(), file: Mutex::new(file), events, first_samples_logged: AtomicBool::new(false) })
    }

    /// Writes `line` under the next sequence number.
    pub fn log(&self, line: &str) {
        let seq = self.events.next_seq();
        self.write(seq, line);
        self.note_first_samples();
    }

    /// Logs `device_first_samples` (with the device's own sequence number) once it happened.
    pub fn note_first_samples(&self) {
        if let Some(seq) = self.events.first_samples_seq() {
            if !self.first_samples_logged.swap(true, Ordering::SeqCst) {
                self.write(seq, "device_first_samples");
            }
        }
    }

    /// Logs `first_audio_ms MS`: from the log's making to the device's first samples, the one
    /// time in the log (bench/say_warm.sh compares it with and without a server).
    pub fn log_first_audio_time(&self) {
        if let Some(at) = self.events.first_samples_at() {
            self.log(&format!("first_audio_ms {}", at.saturating_duration_since(self.started).as_millis()));
        }
    }

    fn write(&self, seq: u64, line: &str) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // One write per line: `writeln!` on a File writes each formatted piece on its own, so a
        // process ended by a second Ctrl-C could leave half a line ("2 ") behind.
        let whole = format!("{seq} {line}\n");
        // A debug log: a failed write must not stop playback.
        let _ = f.write_all(whole.as_bytes()).and_then(|_| f.flush());
    }
}

/// `say -`: each piece read from standard input, and its end, into the log.
impl cosy::app::text_stream::ReadNotes for EventLog {
    fn piece(&self, number: usize, piece: &str) {
        self.log(&format!("text_piece {number} {}", piece.chars().count()));
    }
    fn end(&self) {
        self.log("text_done");
    }
}

/// How `say` plays, besides where.
#[derive(Debug, Clone, Copy)]
pub struct PlayOptions {
    /// Apply the buffering rule (`--no-buffering` turns it off: play as soon as audio comes).
    pub buffering: bool,
    /// Print the one-line notice when playback waits for audio (off with `-q`).
    pub notices: bool,
}

/// The buffering rule ([`Buffering`]) applied to a player's gate. Shared by the thread that
/// pushes the chunks and the synthesis thread that reports where sentences end.
struct Buffer {
    state: Mutex<BufferState>,
    /// Signalled when a chunk was pushed or the request ended.
    pushed: Condvar,
    clock: Instant,
    gate: GateHandle,
    events: Arc<PlaybackEvents>,
    log: Option<Arc<EventLog>>,
    notices: bool,
    /// Whether sentence ends count (not with text from stdin, whose requests each count from 0).
    sentence_ends: bool,
}

struct BufferState {
    rule: Buffering,
    /// Samples pushed to the player.
    pushed: u64,
    underruns_seen: u64,
    /// The request ended (or failed): nobody waits for more audio.
    closed: bool,
    noticed: bool,
}

impl Buffer {
    /// Starts holding `player` until the rule lets it play; the rate is measured from now.
    fn start(player: &Player, rate: u32, options: PlayOptions, log: Option<Arc<EventLog>>, sentence_ends: bool) -> Buffer {
        let gate = player.gate_handle();
        gate.set(Gate::HoldAt(0));
        Buffer {
            state: Mutex::new(BufferState { rule: Buffering::new(rate, Duration::ZERO), pushed: 0, underruns_seen: 0, closed: false, noticed: false }),
            pushed: Condvar::new(),
            clock: Instant::now(),
            gate,
            events: player.events(),
            log,
            notices: options.notices,
            sentence_ends,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BufferState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A chunk of `samples` that arrived at `arrived` (from [`Buffer::now`]) is in the player.
    fn chunk_pushed(&self, arrived: Duration, samples: usize) {
        let mut state = self.lock();
        state.pushed += samples as u64;
        let played = self.gate.played();
        let underruns = self.events.underrun_frames();
        if underruns > state.underruns_seen {
            state.underruns_seen = underruns;
            let decision = state.rule.underrun(arrived, played);
            self.apply(&mut state, decision);
        }
        let decision = state.rule.audio(arrived, samples, played);
        self.apply(&mut state, decision);
        drop(state);
        self.pushed.notify_all();
    }

    /// A sentence's audio ends at sample `end`: once it is all in the player, the rule may release
    /// it. Called on the synthesis thread right after it handed over the sentence's last chunk,
    /// so it waits for this side to push that chunk (the request ending stops the wait).
    fn sentence_end(&self, end: u64) {
        if !self.sentence_ends {
            return;
        }
        let mut state = self.lock();
        // While playback is open the end changes nothing now: synthesis goes on at once (the
        // push of the last chunk may be waiting for the device).
        while state.rule.gate() != Gate::Open && state.pushed < end && !state.closed {
            state = self.pushed.wait_timeout(state, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
        let decision = state.rule.sentence_end(self.now(), end, self.gate.played());
        self.apply(&mut state, decision);
    }

    /// The request ended: everything plays, and nobody waits for more.
    fn done(&self) {
        let mut state = self.lock();
        let decision = state.rule.done(self.now(), self.gate.played());
        self.apply(&mut state, decision);
        self.close_locked(&mut state);
    }

    fn close(&self) {
        let mut state = self.lock();
        self.close_locked(&mut state);
    }

    fn close_locked(&self, state: &mut BufferState) {
        state.closed = true;
        self.pushed.notify_all();
    }

    fn now(&self) -> Duration {
        self.clock.elapsed()
    }

    fn apply(&self, state: &mut BufferState, decision: Option<Decision>) {
        let Some(d) = decision else { return };
        // At the end the gate is left to `Player::finish`, which opens it as it marks the
        // producer done: opened here first, the device would run dry in between and count it.
        if d.reason != Reason::Done {
            self.gate.set(d.gate);
        }
        if let Some(log) = &self.log {
            match d.gate {
                Gate::Open => log.log(&format!("buffer_open {} {:.3}", d.reason.as_str(), d.rate)),
                Gate::HoldAt(mark) => log.log(&format!("buffer_hold {mark} {} {:.3}", d.reason.as_str(), d.rate)),
            }
        }
        if d.waiting && self.notices && !std::mem::replace(&mut state.noticed, true) {
            eprintln!(
                "cosy: synthesis runs at {:.2}x real time here; buffering each sentence before it plays (--no-buffering plays at once)",
                d.rate
            );
        }
    }
}

/// Observer of a `say` synthesis: cancellation from the player, events into the log, sentence
/// ends to the buffering rule.
struct SayObserver {
    cancel: Option<CancelHandle>,
    log: Option<Arc<EventLog>>,
    buffer: Option<Arc<Buffer>>,
}

impl SynthesisObserver for SayObserver {
    fn llm_token(&self, sentence: usize, index: usize, token: i64) {
        if let Some(log) = &self.log {
            log.log(&format!("llm_token {sentence} {index} {token}"));
        }
    }
    fn llm_done(&self, sentence: usize, tokens: usize, termination: Termination) {
        if let Some(log) = &self.log {
            let why = match termination {
                Termination::StopToken(_) => "stop_token",
                Termination::MaxLen => "max_len",
                Termination::Cancelled => "cancelled",
            };
            log.log(&format!("llm_done {sentence} {tokens} {why}"));
        }
    }
    fn sentence_audio_done(&self, sentence: usize, end: usize) {
        if let Some(log) = &self.log {
            log.log(&format!("sentence_audio_done {sentence} {end}"));
        }
        if let Some(buffer) = &self.buffer {
            buffer.sentence_end(end as u64);
        }
    }
    fn cancelled(&self) -> bool {
        crate::interrupt::requested() || self.cancel.as_ref().is_some_and(CancelHandle::is_cancelled)
    }
}

/// Where `say` takes its text from.
pub enum SayText {
    /// `req.text`, whole.
    Whole,
    /// Text-in streaming from standard input, read as it arrives (`cosy say -`).
    Stdin(cosy::engine::BistreamOptions),
}

/// Where `say`'s audio comes from.
pub enum Source<'a> {
    /// The model, loaded here: `req` (its `stream` flag decides the schedule) and its text.
    Local { config: &'a cosy::config::Config, req: &'a Request, text: SayText },
    /// A running `cosy serve` ([`crate::client`]), asked with this speech request (the API's fields).
    Server { client: &'a crate::client::Client, request: serde_json::Value },
}

/// Plays what `source` makes on `output`, as `options` say. `event_log` as in the module docs.
/// Returns [`Error::Cancelled`] after Ctrl-C.
///
/// Ctrl-C is caught from the start (with or without a player), and once it was pressed every
/// way this ends is [`Error::Cancelled`]: whatever failed while the work was being stopped (a
/// model stage, the player, the log) is a consequence of the stop, not something to report.
pub fn say(source: Source<'_>, output: &Output, options: PlayOptions, event_log: Option<&Path>) -> Result<()> {
    crate::interrupt::install()?;
    let result = say_until_stopped(source, output, options, event_log);
    if crate::interrupt::requested() {
        return Err(Error::Cancelled);
    }
    result
}

fn say_until_stopped(source: Source<'_>, output: &Output, options: PlayOptions, event_log: Option<&Path>) -> Result<()> {
    let (mut player, cancel) = open_output(output)?;
    // Without a player there is no device callback; the counter still orders the log lines.
    let events = player.as_ref().map_or_else(|| Arc::new(PlaybackEvents::default()), Player::events);
    let log = event_log.map(|p| EventLog::create(p, events.clone())).transpose()?.map(Arc::new);
    let (engine, rate) = ready_source(&source, &mut player)?;
    // The rate is measured from here, as the request is sent.
    // Sentence ends are known for a whole text, made here or by a server (not for text from
    // stdin, whose requests each count from 0).
    let sentence_ends = !matches!(source, Source::Local { text: SayText::Stdin(_), .. });
    let buffer = match &player {
        Some(p) if options.buffering => Some(Arc::new(Buffer::start(p, rate, options, log.clone(), sentence_ends))),
        _ => None,
    };
    let observer = Arc::new(SayObserver { cancel, log: log.clone(), buffer: buffer.clone() });
    let mut chunks = 0u64;
    let mut play = |chunk: &[f32]| -> Result<()> {
        chunks += 1;
        let n = chunks;
        let arrived = buffer.as_ref().map(|b| b.now());
        if let Some(log) = &log {
            log.log(&format!("chunk_ready {n} {}", chunk.len()));
        }
        if let Some(p) = player.as_mut() {
            if p.push(chunk)? == Flow::Cancelled {
                return Err(Error::Cancelled);
            }
        }
        if let (Some(b), Some(arrived)) = (&buffer, arrived) {
            b.chunk_pushed(arrived, chunk.len());
        }
        if let Some(log) = &log {
            log.log(&format!("chunk_pushed {n} {}", chunk.len()));
        }
        Ok(())
    };
    let result = synthesize_to(source, engine, rate, &observer, log.clone(), &mut play);
    // Whatever the end, the synthesis side no longer waits for audio to be pushed.
    if let Some(b) = &buffer {
        if result.is_ok() {
            b.done();
        }
        b.close();
    }
    let cancelled = observer.cancelled();
    if cancelled || matches!(result, Err(Error::Cancelled)) {
        if let Some(log) = &log {
            log.log("cancelled");
        }
        return Err(Error::Cancelled);
    }
    let said = result?;
    finish_playback(player, log.as_deref())?;
    if observer.cancelled() {
        return Err(Error::Cancelled);
    }
    tracing::info!("said {said}");
    Ok(())
}

/// The player for `output` (none for [`Output::Nothing`]) and its cancel handle, Ctrl-C wired to it.
fn open_output(output: &Output) -> Result<(Option<Player>, Option<CancelHandle>)> {
    let player = match output {
        Output::Default => Some(Player::open(None, MODEL_SAMPLE_RATE)?),
        Output::Named(name) => Some(Player::open(Some(name), MODEL_SAMPLE_RATE)?),
        Output::Nothing => None,
    };
    let cancel = match &player {
        Some(p) => {
            cancel_on_ctrl_c(p.cancel_handle())?;
            let c = p.config();
            tracing::info!("playing on {} ({} Hz, {} ch, {})", c.device, c.device_rate, c.channels, c.sample_format);
            Some(p.cancel_handle())
        }
        None => None,
    };
    Ok((player, cancel))
}

/// The model loaded here, or nothing for a server's answer, and the rate the audio comes at; the
/// player is opened again at that rate when it is not the model's usual one.
fn ready_source(source: &Source<'_>, player: &mut Option<Player>) -> Result<(Option<cosy::engine::Engine>, u32)> {
    let (engine, rate) = match source {
        Source::Local { config, .. } => {
            let engine = cosy::engine::Engine::load(config)?;
            let rate = engine.sample_rate();
            (Some(engine), rate)
        }
        Source::Server { client, .. } => (None, client.sample_rate),
    };
    if rate != MODEL_SAMPLE_RATE {
        if let Some(p) = player.as_ref() {
            let device = p.config().device.clone();
            let reopened = Player::open(Some(&device), rate)?;
            cancel_on_ctrl_c(reopened.cancel_handle())?;
            *player = Some(reopened);
        }
    }
    Ok((engine, rate))
}

/// Runs the synthesis (the model here, one request through the engine, or the server's answer):
/// either way `play` gets the chunks as they are made. Returns what was said, for the log. A
/// failed push drops the handle (or the server's answer), which cancels the request.
fn synthesize_to(
    source: Source<'_>,
    engine: Option<cosy::engine::Engine>,
    rate: u32,
    observer: &Arc<SayObserver>,
    log: Option<Arc<EventLog>>,
    play: &mut dyn FnMut(&[f32]) -> Result<()>,
) -> Result<String> {
    match (source, engine) {
        (Source::Local { config, req, text }, Some(engine)) => {
            let mut sink = cosy::app::drain::FnSink(play);
            match text {
                SayText::Whole => engine
                    .submit_observed(req.clone(), Some(observer.clone()))
                    .and_then(|handle| cosy::app::drain::drain(handle, &mut sink)),
                SayText::Stdin(options) => {
                    // Standard input is read as it arrives, each read a piece, while audio plays.
                    let stream = cosy::app::text_stream::TextStream::text_in(Arc::new(engine), config, req.clone(), options, Some(observer.clone()));
                    let notes = log.map(|log| log as Arc<dyn cosy::app::text_stream::ReadNotes>);
                    cosy::app::text_stream::speak_read(stream, std::io::stdin(), "<stdin>", notes, &mut sink)
                }
            }
            .map(|summary| format!("{} sentence(s), {} chunk(s), {:.2} s", summary.sentences, summary.chunks, summary.samples as f64 / f64::from(rate)))
        }
        (Source::Server { client, request }, _) => play_from_server(client, request, observer, play)
            .map(|samples| format!("{samples} samples from the server, {:.2} s", samples as f64 / f64::from(rate))),
        (Source::Local { .. }, None) => Err(Error::Runtime("say: no engine for a local synthesis".into())),
    }
}

/// Lets the player (reopened at the model's rate or not) play out, then logs what it counted.
fn finish_playback(player: Option<Player>, log: Option<&EventLog>) -> Result<()> {
    let player_events = player.as_ref().map(Player::events);
    if let Some(p) = player {
        p.finish()?;
    }
    if let Some(log) = log {
        log.note_first_samples();
        if let Some(e) = &player_events {
            log.log(&format!("underrun_frames {}", e.underrun_frames()));
        }
        log.log_first_audio_time();
        log.log("playback_done");
    }
    Ok(())
}

/// The server's audio for `request`, each piece played as it arrives; the samples played.
fn play_from_server(
    client: &crate::client::Client,
    request: serde_json::Value,
    observer: &SayObserver,
    play: &mut dyn FnMut(&[f32]) -> Result<()>,
) -> Result<u64> {
    let mut audio = client.speak(request)?;
    let mut samples = 0u64;
    let mut sentence = 0;
    while let Some(event) = audio.next_event()? {
        if observer.cancelled() {
            return Err(Error::Cancelled);
        }
        match event {
            crate::client::ServerEvent::Samples(chunk) => {
                samples += chunk.len() as u64;
                play(&chunk)?;
            }
            // As a synthesis here tells it (the buffering rule buffers whole sentences).
            crate::client::ServerEvent::SentenceEnd(end) => {
                observer.sentence_audio_done(sentence, usize::try_from(end).unwrap_or(usize::MAX));
                sentence += 1;
            }
        }
    }
    Ok(samples)
}
