//! The Wyoming protocol server of `cosy serve` (Home Assistant; docs/wyoming.md): the same engine,
//! voices and rules as the HTTP API, over JSONL events on a TCP port (`wyoming.bind`).
//!
//! Events (the `wyoming` package, 1.10): `describe` → `info` (one `tts` program, one voice per
//! usable saved voice, `supports_synthesize_streaming`); `synthesize` (text, optional voice) →
//! `audio-start`, `audio-chunk`s as the engine makes them (s16le mono at the model's rate, the
//! streaming schedule), `audio-stop`; `synthesize-start` (voice) → `synthesize-chunk`s fed into
//! one text-in streaming session (`cosy::app::text_stream`) as they arrive → `synthesize-stop` → the
//! rest of the audio, `audio-stop`, `synthesize-stopped`. The `synthesize` a streaming client
//! also sends (for servers that cannot stream) is not spoken again. `ping` → `pong`.
//!
//! Errors: a request that cannot run or fails (unknown voice, empty or over-long text, a busy
//! engine) is answered with an `error` event and the connection closes, as Piper's server does
//! (a client waiting for `audio-stop` is not left waiting); a broken frame (not JSON, a header or
//! payload over its bound) too, since the next event's start is unknown. An event cosy does not
//! serve gets an `error` and the connection stays. A client that goes away (end of stream, a
//! write that fails or waits past `server.send_timeout_s`) cancels its synthesis.

mod event;
pub mod zeroconf;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::Instrument;

use cosy::app::speech::{build_request, build_streaming_request, SpeechOptions};
use cosy::app::text_stream::{Report, Step, TextStream};
use event::{Bounds, Event, FrameError};

use super::error::ApiError;
use super::synthesis::{follow, next_chunk, resolve_voice, start, test_hooks_of, voice_name, Finish, Running, TestHooksParams, VoiceSpec};
use super::{ActiveGuard, AppState};

/// The program's name in `info` (what Home Assistant shows for the service).
const PROGRAM: &str = "cosy";
/// Events a connection may queue while a synthesis runs (a client sends the next request after
/// the audio of the last one; a few early ones are kept, more are an error).
const MAX_QUEUED: usize = 16;
/// How long a closing connection keeps reading what its client still sends, so that closing does
/// not reset the connection before the client has read the last event.
const LINGER: Duration = Duration::from_secs(2);

/// Serves Wyoming on `listener` until `stop` turns true; then accepts no more, lets each
/// connection finish the synthesis it runs (an idle one closes at once), and returns once all
/// have closed.
pub async fn serve(listener: TcpListener, state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let limit = state.wyoming.max_connections;
    let slots = Arc::new(Semaphore::new(limit));
    // Every connection task holds a receiver; `closed()` on the sender resolves once all are gone.
    let (alive_tx, alive_rx) = watch::channel(());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = async { let _ = stop.wait_for(|stop| *stop).await; } => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: these pass; back off instead of spinning.
                tracing::warn!("wyoming: accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Audio chunks are small writes that must leave at once.
        let _ = tcp.set_nodelay(true);
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Said at once, without a task: a fresh socket's send buffer takes one short event.
            let refusal = error_event(&ApiError::unavailable(
                "too_many_connections",
                format!("cosy has wyoming.max_connections = {limit} Wyoming connections open; retry later"),
            ));
            let _ = tcp.try_write(&refusal.to_bytes());
            state.metrics.count_wyoming("connection", "refused");
            tracing::info!("wyoming: connection from {peer} refused (wyoming.max_connections = {limit})");
            continue;
        };
        let state = state.clone();
        let stop = stop.clone();
        let alive = alive_rx.clone();
        let span = tracing::info_span!("wyoming", peer = %peer);
        tokio::spawn(
            async move {
                let _permit = permit;
                let _alive = alive;
                state.metrics.wyoming_connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!("connected");
                connection(tcp, state.clone(), stop).await;
                state.metrics.wyoming_connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!("closed");
            }
            .instrument(span),
        );
    }
    drop(listener);
    drop(alive_rx);
    alive_tx.closed().await;
}

/// Why a connection's loop ended.
enum End {
    /// The client went away (or the server is stopping): nothing more to say.
    Quiet,
    /// Said to the client as an `error` event, then the connection closes.
    Failed(ApiError),
}

impl From<ApiError> for End {
    fn from(e: ApiError) -> End {
        End::Failed(e)
    }
}

fn frame_error(e: FrameError) -> ApiError {
    ApiError::bad_request(e.code, e.message)
}

/// The `error` event of an API error: its message, and its code.
fn error_event(e: &ApiError) -> Event {
    Event::new("error", json!({ "text": e.message, "code": e.code }))
}

/// One connection: events read on a task of their own (so that a client that goes away is seen
/// while audio is made), handled in order.
async fn connection(tcp: TcpStream, state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let (read, write) = tcp.into_split();
    let bounds = Bounds { max_header_bytes: state.wyoming.max_header_bytes, max_payload_bytes: state.wyoming.max_payload_bytes };
    let (events_tx, mut events) = mpsc::channel::<Result<Event, FrameError>>(8);
    let reader = tokio::spawn(async move {
        let mut read = BufReader::new(read);
        loop {
            match event::read_event(&mut read, bounds).await {
                Ok(Some(e)) => {
                    if events_tx.send(Ok(e)).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = events_tx.send(Err(e)).await;
                    break;
                }
            }
        }
    });
    let mut conn = Connection { send_timeout: Duration::from_secs(state.server.send_timeout_s), state, writer: write };
    let mut job = None;
    let end = conn.run(&mut events, &mut stop, &mut job).await;
    if let End::Failed(e) = &end {
        let kind = job.as_ref().map_or("request", Job::kind);
        tracing::info!("wyoming {kind} refused or failed: {} ({})", e.message, e.code);
        let _ = conn.send(&error_event(e)).await;
    }
    // A synthesis still running is cancelled here (its handle drops).
    if let Some(job) = job.take() {
        conn.state.metrics.count_wyoming(job.kind(), if matches!(end, End::Failed(_)) { "error" } else { "cancelled" });
    }
    let _ = conn.writer.shutdown().await;
    let _ = tokio::time::timeout(LINGER, async { while events.recv().await.is_some() {} }).await;
    reader.abort();
}

struct Connection {
    state: Arc<AppState>,
    writer: OwnedWriteHalf,
    send_timeout: Duration,
}

/// The synthesis a connection runs.
/// (Both boxed: large, and one per connection.)
enum Job {
    /// A `synthesize`: one streaming request.
    Whole(Box<Whole>),
    /// `synthesize-start` … `synthesize-stop`: text-in streaming, segment by segment.
    Stream(Box<Stream>),
}

struct Whole {
    running: Running,
    finish: Finish,
    deadline: tokio::time::Instant,
    audio: Audio,
}

struct Stream {
    /// Every rule of the streamed text ([`cosy::app::text_stream`]); this only translates.
    text: TextStream,
    /// The segment speaking.
    current: Option<Running>,
    id: String,
    /// When `synthesize-stop` came (then the request deadline counts from it).
    stopped: Option<Instant>,
    audio: Audio,
    /// `debug.model_text`: the texts the model gets.
    model_text: Option<cosy::app::dump::ModelTexts>,
}

impl Stream {
    /// The texts the model got since the last call (none without `debug.model_text`).
    fn model_texts(&self) -> Vec<cosy::app::dump::ModelText> {
        self.model_text.as_ref().map(cosy::app::dump::ModelTexts::take).unwrap_or_default()
    }
}

/// What a synthesis has sent: whether `audio-start` went out, and how many samples (for the
/// timestamps). Holds the synthesis in the server's count of work in progress until its last
/// event is written (a shutdown waits for it).
struct Audio {
    started: bool,
    samples: usize,
    _active: ActiveGuard,
}

impl Job {
    fn kind(&self) -> &'static str {
        match self {
            Job::Whole(_) => "synthesize",
            Job::Stream(_) => "stream",
        }
    }
}

/// Whether an event was used, must wait until the synthesis running ends, or finished it.
enum Taken {
    Used,
    Later(Event),
    Finished,
}

/// What woke a connection: its client, or the audio of its synthesis.
enum Wake {
    Client(Option<Result<Event, FrameError>>),
    Audio(Result<Option<Vec<f32>>, ApiError>),
}

impl Connection {
    /// Writes one event; `Err(End::Quiet)` when the client is gone or stopped reading.
    async fn send(&mut self, event: &Event) -> Result<(), End> {
        match tokio::time::timeout(self.send_timeout, self.writer.write_all(&event.to_bytes())).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::info!("client gone: {e}");
                Err(End::Quiet)
            }
            Err(_) => {
                tracing::info!("client took nothing for server.send_timeout_s = {} s: disconnected", self.send_timeout.as_secs());
                Err(End::Quiet)
            }
        }
    }

    async fn run(
        &mut self,
        events: &mut mpsc::Receiver<Result<Event, FrameError>>,
        stop: &mut watch::Receiver<bool>,
        job: &mut Option<Job>,
    ) -> End {
        match self.serve_events(events, stop, job).await {
            Ok(()) => End::Quiet,
            Err(end) => end,
        }
    }

    /// Waits for the client and the synthesis running, and hands what comes to
    /// [`Self::client_event`] or [`Self::audio_event`], until the client leaves, the server
    /// stops (between syntheses) or nothing happens for `wyoming.idle_timeout_s`.
    async fn serve_events(
        &mut self,
        events: &mut mpsc::Receiver<Result<Event, FrameError>>,
        stop: &mut watch::Receiver<bool>,
        job: &mut Option<Job>,
    ) -> Result<(), End> {
        let idle_s = self.state.wyoming.idle_timeout_s;
        let idle = Duration::from_secs(idle_s);
        let mut last_activity = Instant::now();
        let mut queued: VecDeque<Event> = VecDeque::new();
        loop {
            while job.is_none() {
                let Some(event) = queued.pop_front() else { break };
                *job = self.idle_event(event).await?;
            }
            let idle_deadline = tokio::time::Instant::from_std(last_activity + idle);
            let audio_deadline = self.audio_deadline(job.as_ref(), idle_deadline);
            let idle_now = waits_for_client(job.as_ref());
            let wake = tokio::select! {
                received = events.recv() => Wake::Client(received),
                chunk = next_audio(job.as_mut(), audio_deadline) => Wake::Audio(chunk),
                // (The watch's guard is not `Send`: dropped inside, before the select's output lives on.)
                _ = async { let _ = stop.wait_for(|stop| *stop).await; }, if job.is_none() => return Ok(()),
                _ = tokio::time::sleep_until(idle_deadline), if idle_now => return Err(idle_error(idle_s).into()),
            };
            last_activity = Instant::now();
            match wake {
                Wake::Client(None) => return Ok(()),
                Wake::Client(Some(Err(e))) => return Err(frame_error(e).into()),
                Wake::Client(Some(Ok(event))) => self.client_event(event, job, &mut queued).await?,
                Wake::Audio(chunk) => self.audio_event(chunk, job, idle_s).await?,
            }
        }
    }

    /// When the synthesis running must have its next audio: a `synthesize`'s request deadline; a
    /// stream's after its `synthesize-stop`, while it still takes text the idle deadline.
    fn audio_deadline(&self, job: Option<&Job>, idle_deadline: tokio::time::Instant) -> tokio::time::Instant {
        match job {
            Some(Job::Whole(w)) => w.deadline,
            Some(Job::Stream(s)) => s.stopped.map_or(idle_deadline, |at| self.state.request_deadline(at)),
            None => idle_deadline,
        }
    }

    /// An event from the client: answered, used by the synthesis running, or queued until it ends.
    async fn client_event(&mut self, event: Event, job: &mut Option<Job>, queued: &mut VecDeque<Event>) -> Result<(), End> {
        if event.kind == "ping" {
            return self.send(&Event::new("pong", Value::Null)).await;
        }
        let taken = match job.as_mut() {
            None => {
                *job = self.idle_event(event).await?;
                Taken::Used
            }
            Some(Job::Stream(stream)) if stream.stopped.is_none() => self.stream_event(stream, event).await?,
            Some(_) => Taken::Later(event),
        };
        match taken {
            Taken::Used => {}
            Taken::Finished => self.job_done(job),
            Taken::Later(_) if queued.len() >= MAX_QUEUED => {
                return Err(ApiError::bad_request(
                    "too_many_events",
                    format!("more than {MAX_QUEUED} events arrived while a synthesis ran; send the next request after its audio-stop"),
                )
                .into());
            }
            Taken::Later(event) => queued.push_back(event),
        }
        Ok(())
    }

    /// The next audio of the synthesis running (`None`: its request is done).
    async fn audio_event(&mut self, chunk: Result<Option<Vec<f32>>, ApiError>, job: &mut Option<Job>, idle_s: u64) -> Result<(), End> {
        let chunk = match chunk {
            // A stream still taking text waited for it past the idle timeout.
            Err(e) if e.code == "timeout" && matches!(job, Some(Job::Stream(s)) if s.stopped.is_none()) => {
                return Err(idle_error(idle_s).into());
            }
            other => other?,
        };
        let finished = match (job.as_mut(), chunk) {
            (None, _) => false,
            (Some(Job::Whole(whole)), Some(samples)) => {
                // The first audio of the request: its time to first audio.
                if whole.finish.first_audio.is_none() {
                    let after = whole.finish.started.elapsed().as_secs_f64();
                    whole.finish.first_audio = Some(after);
                    self.state.metrics.ttfb.observe(after);
                }
                self.send_audio(&mut whole.audio, &samples).await?;
                false
            }
            (Some(Job::Whole(whole)), None) => {
                self.whole_done(whole).await?;
                true
            }
            (Some(Job::Stream(stream)), chunk) => {
                let now = Instant::now();
                let steps = match chunk {
                    Some(samples) => stream.text.audio(samples, now),
                    None => {
                        stream.current = None;
                        stream.text.done(now)
                    }
                };
                self.stream_steps(stream, steps.map_err(|e| self.state.api_error(e))?).await?
            }
        };
        if finished {
            self.job_done(job);
        }
        Ok(())
    }

    /// A synthesis has written its last event.
    fn job_done(&self, job: &mut Option<Job>) {
        if let Some(done) = job.take() {
            self.state.metrics.count_wyoming(done.kind(), "ok");
        }
    }

    fn audio_start(&self) -> Event {
        Event::new("audio-start", json!({ "rate": self.state.sample_rate(), "width": 2, "channels": 1, "timestamp": 0 }))
    }

    /// An `audio-chunk` (after the synthesis's `audio-start`), timed by the audio before it.
    async fn send_audio(&mut self, audio: &mut Audio, samples: &[f32]) -> Result<(), End> {
        if !audio.started {
            audio.started = true;
            self.send(&self.audio_start()).await?;
        }
        let timestamp = audio_ms(audio.samples, self.state.sample_rate());
        audio.samples += samples.len();
        let chunk = Event::new("audio-chunk", json!({ "rate": self.state.sample_rate(), "width": 2, "channels": 1, "timestamp": timestamp }))
            .with_payload(cosy::audio::pcm16_bytes(samples));
        self.send(&chunk).await
    }

    /// `audio-stop` (after an `audio-start`, even with no audio) at the end of `audio`.
    async fn audio_stop(&mut self, audio: &mut Audio) -> Result<(), End> {
        if !audio.started {
            audio.started = true;
            self.send(&self.audio_start()).await?;
        }
        let timestamp = audio_ms(audio.samples, self.state.sample_rate());
        self.send(&Event::new("audio-stop", json!({ "timestamp": timestamp }))).await
    }

    /// A `synthesize`'s request has ended: its last events.
    async fn whole_done(&mut self, whole: &mut Whole) -> Result<(), End> {
        whole.finish.done(whole.audio.samples);
        self.audio_stop(&mut whole.audio).await
    }

    /// `debug.model_text` (when the server has it): a `cosy-model-text` event for each text
    /// `segment` gave the model so far, before the audio made of it.
    async fn tell_model_text(&mut self, texts: Vec<cosy::app::dump::ModelText>, segment: usize) -> Result<(), End> {
        for t in texts {
            self.send(&Event::new("cosy-model-text", json!({ "segment": segment, "sentence": t.sentence, "text": t.text, "tokens": t.tokens }))).await?;
        }
        Ok(())
    }

    /// A stream's steps as events; true once the stream is finished (its last events written).
    async fn stream_steps(&mut self, stream: &mut Stream, steps: Vec<Step>) -> Result<bool, End> {
        for step in steps {
            match step {
                Step::Follow(_, handle) => stream.current = Some(follow(&self.state, handle)),
                Step::Report(Report::FirstAudio { after, .. }) => self.state.metrics.ttfb.observe(after.as_secs_f64()),
                Step::Report(Report::Audio { segment, samples }) => {
                    self.tell_model_text(stream.model_texts(), segment).await?;
                    self.send_audio(&mut stream.audio, &samples).await?
                }
                Step::Report(Report::SegmentDone(end)) => {
                    self.tell_model_text(stream.model_texts(), end.index).await?;
                    Finish::of_segment(&self.state, &stream.id, &end).done(end.samples);
                    tracing::info!(request = %stream.id, "segment {} ended{}: {:?}", end.index, if end.ended_early { " early" } else { "" }, end.text);
                }
                Step::Report(Report::Finished(totals)) => {
                    self.audio_stop(&mut stream.audio).await?;
                    self.send(&Event::new("synthesize-stopped", Value::Null)).await?;
                    let seconds = totals.samples as f64 / f64::from(self.state.sample_rate());
                    tracing::info!(request = %stream.id, "stream done: {} segment(s), {seconds:.2} s of audio", totals.segments);
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// An event while no synthesis runs: answered, or the synthesis it starts.
    async fn idle_event(&mut self, event: Event) -> Result<Option<Job>, End> {
        match event.kind.as_str() {
            "describe" => {
                let info = info(&self.state).await?;
                self.send(&info).await?;
                self.state.metrics.count_wyoming("describe", "ok");
                Ok(None)
            }
            "synthesize" => {
                let job = self.start_whole(event).await.inspect_err(|_| self.state.metrics.count_wyoming("synthesize", "error"))?;
                Ok(Some(job))
            }
            "synthesize-start" => {
                let job = self.start_stream(event).await.inspect_err(|_| self.state.metrics.count_wyoming("stream", "error"))?;
                Ok(Some(job))
            }
            "select-program" => {
                match event.data.get("name").and_then(Value::as_str) {
                    Some(PROGRAM) => {}
                    name => {
                        self.not_served(&format!("select-program {name:?}: this server's one program is {PROGRAM:?}")).await?;
                    }
                }
                Ok(None)
            }
            "synthesize-chunk" | "synthesize-stop" => {
                self.not_served(&format!("{} outside a stream: send synthesize-start first", event.kind)).await?;
                Ok(None)
            }
            other => {
                self.not_served(&format!(
                    "{other:?} is not an event this text-to-speech server takes: describe, synthesize, synthesize-start/-chunk/-stop, ping"
                ))
                .await?;
                Ok(None)
            }
        }
    }

    /// An event the server does not take: an `error` event, and the connection goes on.
    async fn not_served(&mut self, message: &str) -> Result<(), End> {
        tracing::info!("wyoming event refused: {message}");
        self.state.metrics.count_wyoming("other", "error");
        self.send(&error_event(&ApiError::bad_request("unsupported_event", message))).await
    }

    async fn start_whole(&mut self, event: Event) -> Result<Job, End> {
        let id = self.state.new_request_id();
        let started = Instant::now();
        let fields = Fields::of(&event)?;
        let Some(text) = event.data.get("text") else {
            return Err(ApiError::bad_request("missing_text", "synthesize has no \"text\" (the text to say)").param("text").into());
        };
        let Some(text) = text.as_str() else {
            return Err(ApiError::bad_request("invalid_text", "synthesize: \"text\" must be a string").param("text").into());
        };
        // The text rules before the voice is read (a bad text costs nothing).
        cosy::app::speech::check_text(&self.state.config, text).map_err(ApiError::from_engine)?;
        let engine = self.state.engine()?;
        let resolved = resolve_voice(&self.state, fields.voice).await?;
        let mut options = SpeechOptions::new(text, resolved.voice, true);
        options.test_hooks = fields.test_hooks;
        let request = build_request(&self.state.config, options).map_err(|e| self.state.api_error(e))?;
        let running = start(&self.state, &engine, request)?;
        tracing::info!(request = %id, "synthesize: {} characters, voice {}", text.chars().count(), resolved.how);
        Ok(Job::Whole(Box::new(Whole {
            running,
            finish: Finish { state: self.state.clone(), started, first_audio: None, id },
            deadline: self.state.request_deadline(started),
            audio: Audio { started: false, samples: 0, _active: self.state.track() },
        })))
    }

    async fn start_stream(&mut self, event: Event) -> Result<Job, End> {
        let id = self.state.new_request_id();
        let fields = Fields::of(&event)?;
        let engine = self.state.engine()?;
        let resolved = resolve_voice(&self.state, fields.voice).await?;
        let mut speech = SpeechOptions::new(String::new(), resolved.voice, true);
        speech.test_hooks = fields.test_hooks;
        let request = build_streaming_request(speech).map_err(|e| self.state.api_error(e))?;
        let options = cosy::engine::BistreamOptions { normalize_sentences: self.state.wyoming.normalize, ..Default::default() };
        // `debug.model_text`: each text the model gets, told before the audio made of it.
        let (observer, model_text) = cosy::app::dump::ModelTextObserver::of_config(&self.state.config);
        let mut text = TextStream::text_in(engine, &self.state.config, request, options, observer);
        let steps = text.start(Instant::now()).map_err(|e| self.state.api_error(e))?;
        tracing::info!(request = %id, "synthesize-start: voice {}, text normalised: {}", resolved.how, options.normalize_sentences);
        let audio = Audio { started: false, samples: 0, _active: self.state.track() };
        let mut stream = Stream { text, current: None, id, stopped: None, audio, model_text };
        self.stream_steps(&mut stream, steps).await?;
        Ok(Job::Stream(Box::new(stream)))
    }

    /// An event while a stream takes text.
    async fn stream_event(&mut self, stream: &mut Stream, event: Event) -> Result<Taken, End> {
        let now = Instant::now();
        let steps = match event.kind.as_str() {
            "synthesize-chunk" => {
                let Some(text) = event.data.get("text").and_then(Value::as_str) else {
                    return Err(ApiError::bad_request("invalid_text", "synthesize-chunk: \"text\" must be a string").param("text").into());
                };
                stream.text.text(text.to_string(), now)
            }
            // What a streaming client also sends for servers that cannot stream: its text is
            // already in the chunks (the protocol's README, "Streaming").
            "synthesize" => {
                tracing::debug!(request = %stream.id, "synthesize inside a stream: not spoken again");
                return Ok(Taken::Used);
            }
            "synthesize-stop" => {
                stream.stopped = Some(now);
                stream.text.end(now)
            }
            "synthesize-start" => {
                return Err(ApiError::bad_request("stream_open", "synthesize-start inside a stream: send synthesize-stop first").into());
            }
            _ => return Ok(Taken::Later(event)),
        };
        let steps = steps.map_err(|e| self.state.api_error(e))?;
        Ok(if self.stream_steps(stream, steps).await? { Taken::Finished } else { Taken::Used })
    }
}

/// Whether a connection waits for its client alone (then the idle timeout runs): no synthesis,
/// or a stream waiting for text with no segment speaking.
fn waits_for_client(job: Option<&Job>) -> bool {
    match job {
        None => true,
        Some(Job::Stream(s)) => s.current.is_none(),
        Some(Job::Whole(_)) => false,
    }
}

/// The next audio of the running synthesis (`None`: its request is done); pending without one.
async fn next_audio(job: Option<&mut Job>, deadline: tokio::time::Instant) -> Result<Option<Vec<f32>>, ApiError> {
    let running = match job {
        Some(Job::Whole(w)) => Some(&mut w.running),
        Some(Job::Stream(stream)) => stream.current.as_mut(),
        None => None,
    };
    next_chunk(running, deadline).await
}

fn idle_error(seconds: u64) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        "idle_timeout",
        format!("nothing from the client for wyoming.idle_timeout_s = {seconds} s; the connection is closed (connect again to speak)"),
    )
}

fn audio_ms(samples: usize, rate: u32) -> u64 {
    (samples as u64 * 1000) / u64::from(rate.max(1))
}

/// What `synthesize` and `synthesize-start` say besides the text.
struct Fields {
    voice: VoiceSpec,
    test_hooks: cosy::request::TestHooks,
}

impl Fields {
    fn of(event: &Event) -> Result<Fields, ApiError> {
        let kind = &event.kind;
        // `voice`: {name, language, speaker}. Every voice speaks every language the model does, so
        // a language alone means the default voice; a saved voice has one speaker.
        let name = match event.data.get("voice") {
            None | Some(Value::Null) => None,
            Some(Value::Object(voice)) => {
                if let Some(speaker) = voice.get("speaker").filter(|s| !s.is_null()) {
                    tracing::debug!("{kind}: voice speaker {speaker} ignored (a saved voice has one speaker)");
                }
                voice_name(voice.get("name").cloned())
                    .map_err(|_| ApiError::bad_request("invalid_voice", format!("{kind}: voice.name must be a saved voice's name (a string)")).param("voice"))?
            }
            Some(_) => {
                return Err(ApiError::bad_request("invalid_voice", format!("{kind}: \"voice\" must be an object such as {{\"name\": \"anna\"}}"))
                    .param("voice"))
            }
        };
        match event.data.get("text_format").and_then(Value::as_str) {
            None | Some("text") => {}
            Some(other) => {
                return Err(ApiError::bad_request(
                    "unsupported_text_format",
                    format!("{kind}: text_format {other:?} is not supported; send plain text (\"text\")"),
                )
                .param("text_format"))
            }
        }
        // Test hooks (debug.test_hooks only; the engine refuses them otherwise), as in the HTTP API.
        let test_hooks = match event.data.get("cosy_test") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                serde_json::from_value::<TestHooksParams>(v.clone())
                    .map_err(|e| ApiError::bad_request("invalid_test_hooks", format!("{kind}: cosy_test: {e}")).param("cosy_test"))?,
            ),
        };
        Ok(Fields { voice: VoiceSpec { name, ..VoiceSpec::default() }, test_hooks: test_hooks_of(test_hooks) })
    }
}

/// The `info` event: one `tts` program with one voice per usable saved voice (its file readable
/// and made for this model), read now (voices saved since start are listed).
async fn info(state: &Arc<AppState>) -> Result<Event, ApiError> {
    let st = state.clone();
    let entries = tokio::task::spawn_blocking(move || {
        let key = st.engine.get().map(|e| e.voice_key().to_string());
        st.voices.list(key.as_deref())
    })
    .await
    .map_err(|e| ApiError::internal(format!("listing voices: {e}")))?
    .map_err(ApiError::from_engine)?;
    let attribution = json!({ "name": "FunAudioLLM (CosyVoice3)", "url": "https://github.com/FunAudioLLM/CosyVoice" });
    let voices: Vec<Value> = entries
        .iter()
        .filter(|e| e.voice.is_ok() && e.fits_model != Some(false))
        .map(|e| {
            let description = if e.is_default { format!("{} (default voice)", e.name) } else { e.name.clone() };
            json!({
                "name": e.name, "description": description, "attribution": attribution, "installed": true,
                "version": null, "languages": cosy::app::voices::VOICE_LANGUAGES, "speakers": null,
            })
        })
        .collect();
    let program = json!({
        "name": PROGRAM,
        "description": "CosyVoice3 text to speech (cosy): text streamed in as it is written, audio streamed out as it is made",
        "attribution": attribution,
        "installed": true,
        "version": env!("CARGO_PKG_VERSION"),
        "voices": voices,
        "supports_synthesize_streaming": true,
    });
    Ok(Event::new("info", json!({ "asr": [], "tts": [program], "handle": [], "intent": [], "wake": [], "mic": [], "snd": [] })))
}
