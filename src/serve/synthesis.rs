//! Running a synthesis for any front end (`POST /v1/audio/speech`, the WebSocket, Wyoming, the
//! voices routes): the voice a request names (a saved name or a recording, resolved through the
//! application layer), its test hooks, a request in the engine awaited from the async side
//! (cancelled when dropped, bounded by the request deadline), the bookkeeping when its audio is
//! done, and what a response says about how its request was read.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::Response;
use base64::Engine as _;
use cosy::app::voices::{Recording, Resolved, VoiceChoice};
use cosy::engine::{Engine, Event, RequestHandle};
use cosy::request::TestHooks;
use serde::Deserialize;

use super::body::field_list;
use super::encode::StreamEncoder;
use super::error::ApiError;
use super::{ActiveGuard, AppState};

/// What the request says of its voice, as received (the recording still encoded).
#[derive(Debug, Default)]
pub struct VoiceSpec {
    /// A saved voice; `None` = the default ("default", or no `voice`).
    pub name: Option<String>,
    pub recording: Option<Vec<u8>>,
    pub transcript: Option<String>,
    pub instruction: Option<String>,
}

/// `voice` as a name: a string, or an object with an `id` (newer OpenAI clients); absent or
/// "default" = the default voice (`None`).
pub fn voice_name(v: Option<serde_json::Value>) -> Result<Option<String>, ApiError> {
    let bad = || ApiError::bad_request("invalid_voice", "voice must be a saved voice's name (a string) or {\"id\": NAME}").param("voice");
    let name = match v {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Object(o)) => o.get("id").and_then(|i| i.as_str()).map(str::to_string).ok_or_else(bad)?,
        Some(_) => return Err(bad()),
    };
    Ok((name != "default").then_some(name))
}

/// A base64 data URL (`data:audio/wav;base64,...`) or bare base64, decoded. URLs are refused:
/// the server does not fetch from addresses a client names.
pub fn decode_data_url(data: &str) -> Result<Vec<u8>, ApiError> {
    let data = data.trim();
    let lower: String = data.chars().take(16).collect::<String>().to_ascii_lowercase();
    if ["http://", "https://", "file://", "ftp://"].iter().any(|s| lower.starts_with(s)) {
        return Err(ApiError::bad_request(
            "unsupported_ref_audio",
            "ref_audio URLs are not fetched by this server; send the recording as a base64 data URL (data:audio/wav;base64,...) or a multipart file",
        )
        .param("ref_audio"));
    }
    let payload = if lower.starts_with("data:") {
        let Some((_, rest)) = data.split_once(";base64,") else {
            return Err(ApiError::bad_request("invalid_ref_audio", "ref_audio is a data URL without ;base64, (send data:audio/wav;base64,...)")
                .param("ref_audio"));
        };
        rest
    } else {
        data
    };
    let compact: String = payload.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(compact.as_bytes()).map_err(|e| {
        ApiError::bad_request("invalid_ref_audio", format!("ref_audio is not valid base64 ({e}); send data:audio/wav;base64,... with standard base64"))
            .param("ref_audio")
    })?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request("invalid_ref_audio", "ref_audio is empty; send a few seconds of speech").param("ref_audio"));
    }
    Ok(bytes)
}

/// The voice, through the application layer, on a blocking thread (decoding a recording,
/// reading a voice file); logged with how it was chosen (an alias, the default for an OpenAI
/// name), which the routes also name in their answer.
pub async fn resolve_voice(state: &Arc<AppState>, spec: VoiceSpec) -> Result<Resolved, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || -> Result<Resolved, ApiError> {
        let key = state.engine()?.voice_key().to_string();
        let recording = spec.recording.map(|bytes| Recording::from_bytes("ref_audio", bytes)).transpose().map_err(ApiError::from_engine)?;
        let choice = VoiceChoice { name: spec.name, recording, transcript: spec.transcript, instruction: spec.instruction };
        let resolved = state.voices.resolve(choice, Some(&key)).map_err(ApiError::from_engine)?;
        tracing::info!("voice: {}", resolved.how);
        Ok(resolved)
    })
    .await
    .map_err(|e| ApiError::internal(format!("voice: {e}")))?
}

/// `normalization`: a request's normalisation switches by category (docs/text.md); a category
/// left out is as configured. Unknown categories are named as ignored fields, not refused.
#[derive(Debug, Default, Deserialize)]
pub struct NormalizationParams {
    /// Read Markdown and chat text (`text.markdown`); false: the text as written.
    pub markdown: Option<bool>,
    /// Spell numbers out (`text.numbers`); false: the digits as written.
    pub numbers: Option<bool>,
    /// Read bare URLs, e-mail addresses and file paths out (`text.urls`).
    pub urls: Option<bool>,
    /// Read phone numbers digit by digit in groups (`text.phone`).
    pub phone: Option<bool>,
    /// Read unit abbreviations after a number as words (`text.units`).
    pub units: Option<bool>,
    /// What emoji become: "drop", "name" or "keep" (`text.symbols`).
    pub symbols: Option<String>,
}

impl NormalizationParams {
    pub fn of(p: Option<NormalizationParams>) -> Result<cosy::request::Normalization, ApiError> {
        let Some(p) = p else { return Ok(cosy::request::Normalization::default()) };
        let symbols = match p.symbols.as_deref() {
            None => None,
            Some(s) => Some(cosy::config::Symbols::parse(s).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_normalization",
                    format!("normalization.symbols {s:?} is not one of {}", cosy::config::Symbols::ALLOWED),
                )
                .param("normalization")
            })?),
        };
        Ok(cosy::request::Normalization { markdown: p.markdown, numbers: p.numbers, urls: p.urls, phone: p.phone, units: p.units, symbols, ..Default::default() })
    }
}

/// `input_format` ("ssml", "text", "auto"), absent = auto (SSML only when the text starts with `<speak>`).
pub fn input_format_of(name: Option<&str>) -> Result<cosy::frontend::ssml::InputFormat, ApiError> {
    name.map(cosy::frontend::ssml::InputFormat::parse).transpose().map(Option::unwrap_or_default).map_err(ApiError::from_engine)
}

/// `cosy_test`: the test hooks of a request (docs/server.md, "For tests").
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestHooksParams {
    /// Hold the request after its first audio until the client hangs up (or it times out).
    #[serde(default)]
    pub hold_after_first_audio: bool,
    /// Decode exactly this many speech tokens per sentence.
    pub min_tokens: Option<usize>,
    /// End each segment's speech after this many speech tokens, as the model's stop token would.
    pub max_tokens: Option<usize>,
    /// Hand each chunk over no sooner than this many times its duration after the previous one
    /// (synthesis slower than real time, whatever the machine).
    pub slow_to_rtf: Option<u32>,
}

/// The test hooks of a request; the engine refuses them (one rule, one message) unless the server
/// runs with `debug.test_hooks`.
pub fn test_hooks_of(p: Option<TestHooksParams>) -> TestHooks {
    p.map(|p| TestHooks {
        hold_after_first_audio: p.hold_after_first_audio,
        min_tokens: p.min_tokens,
        max_tokens: p.max_tokens,
        slow_to_rtf: p.slow_to_rtf,
    })
        .unwrap_or_default()
}

/// What a response says about how its request was read: the voice used (`x-cosy-voice`) and the
/// fields ignored (`x-cosy-ignored-fields`), on errors too.
#[derive(Debug, Default)]
pub struct Notes {
    pub voice: Option<String>,
    pub ignored: Vec<String>,
}

impl Notes {
    /// Names the ignored fields in the log (once per request).
    pub fn ignored(&mut self, fields: Vec<String>) {
        if !fields.is_empty() {
            tracing::info!("ignored unknown fields: {}", field_list(&fields));
        }
        self.ignored = fields;
    }

    pub fn apply(&self, response: &mut Response) {
        let headers = response.headers_mut();
        if let Some(v) = self.voice.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert("x-cosy-voice", v);
        }
        if !self.ignored.is_empty() {
            if let Ok(v) = HeaderValue::from_str(&field_list(&self.ignored)) {
                headers.insert("x-cosy-ignored-fields", v);
            }
        }
    }
}

/// A request in the engine, awaited from the async side (no thread of its own); dropping it
/// cancels the request.
pub struct Running {
    handle: RequestHandle,
    finished: bool,
    /// What the request made, once it is done.
    pub summary: Option<cosy::request::Summary>,
    state: Arc<AppState>,
    /// Counts the request for the shutdown until it is dropped.
    _active: ActiveGuard,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.finished {
            // Counted before the cancel takes effect: whoever sees the slot freed sees the count.
            self.state.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            self.handle.cancel();
            tracing::info!("client gone: request cancelled");
        }
    }
}

/// Submits `request` to the engine (its one admission: 429 when every slot and queue place is taken).
pub fn start(state: &Arc<AppState>, engine: &Arc<Engine>, request: cosy::request::Request) -> Result<Running, ApiError> {
    let handle = engine.submit(request).map_err(|e| state.api_error(e))?;
    Ok(follow(state, handle))
}

/// [`start`], also telling where each sentence's audio ends (in samples from the request's
/// start), as the engine's observer reports it: right after the sentence's last chunk was handed
/// over, so that chunk is already waiting in the request's events when its end arrives here.
pub fn start_with_sentence_ends(
    state: &Arc<AppState>,
    engine: &Arc<Engine>,
    request: cosy::request::Request,
) -> Result<(Running, tokio::sync::mpsc::UnboundedReceiver<u64>), ApiError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let handle = engine.submit_observed(request, Some(Arc::new(SentenceEnds(tx)))).map_err(|e| state.api_error(e))?;
    Ok((follow(state, handle), rx))
}

/// The observer of [`start_with_sentence_ends`]: sentence ends into a channel (a closed one, the
/// client gone, is nobody's business here: the request is cancelled by its handle).
struct SentenceEnds(tokio::sync::mpsc::UnboundedSender<u64>);

impl cosy::request::SynthesisObserver for SentenceEnds {
    fn sentence_audio_done(&self, _sentence: usize, end: usize) {
        let _ = self.0.send(end as u64);
    }
}

/// Follows a started request's events from the async side.
pub fn follow(state: &Arc<AppState>, handle: RequestHandle) -> Running {
    Running { handle, finished: false, summary: None, _active: state.track(), state: state.clone() }
}

impl Running {
    /// The next audio chunk; the end of the request or its error are errors here.
    pub async fn next(&mut self, deadline: tokio::time::Instant) -> Result<Vec<f32>, ApiError> {
        match self.next_or_done(deadline).await? {
            Some(chunk) => Ok(chunk),
            None => Err(ApiError::bad_request("no_audio", "the text gave no audio; give some words to say")),
        }
    }

    /// The next chunk, `None` when the request is done.
    pub async fn next_or_done(&mut self, deadline: tokio::time::Instant) -> Result<Option<Vec<f32>>, ApiError> {
        match tokio::time::timeout_at(deadline, self.handle.next_event_async()).await {
            Err(_) => {
                // Stopped by the server, not by the client: cancel it here, counted as a timeout.
                self.handle.cancel();
                self.finished = true;
                self.state.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(ApiError::timeout(self.state.server.request_timeout_s))
            }
            Ok(Some(Event::Audio(chunk))) => Ok(Some(chunk)),
            Ok(Some(Event::Done(summary))) => {
                self.finished = true;
                self.summary = Some(summary);
                Ok(None)
            }
            Ok(Some(Event::Failed(e))) => {
                self.finished = true;
                Err(self.state.api_error(e))
            }
            Ok(None) => {
                self.finished = true;
                Err(ApiError::internal("the request ended without a result"))
            }
        }
    }
}

/// The next chunk of `running` ([`Running::next_or_done`]); pending while nothing runs (a
/// `select!` branch of a connection that may have no request).
pub async fn next_chunk(running: Option<&mut Running>, deadline: tokio::time::Instant) -> Result<Option<Vec<f32>>, ApiError> {
    match running {
        Some(running) => running.next_or_done(deadline).await,
        None => std::future::pending().await,
    }
}

/// Bookkeeping when a request has produced all its audio.
pub struct Finish {
    pub state: Arc<AppState>,
    pub started: Instant,
    /// Seconds from the start to the first audio (`None`: no audio yet).
    pub first_audio: Option<f64>,
    pub id: String,
}

impl Finish {
    /// A text stream's segment, as its session timed it ([`cosy::app::text_stream::Session`]).
    pub fn of_segment(state: &Arc<AppState>, id: &str, end: &cosy::app::text_stream::SegmentEnd) -> Finish {
        Finish { state: state.clone(), started: end.started, first_audio: end.first_audio.map(|d| d.as_secs_f64()), id: id.to_string() }
    }

    pub fn done(&self, samples: usize) {
        let audio = samples as f64 / f64::from(self.state.sample_rate());
        let wall = self.started.elapsed().as_secs_f64();
        self.state.metrics.add_audio_seconds(audio);
        if audio > 0.0 {
            self.state.metrics.rtf.observe(wall / audio);
        }
        tracing::info!(
            request = %self.id,
            "speech done: {audio:.2} s of audio in {wall:.2} s (first audio {:.0} ms, RTF {:.3})",
            self.first_audio.unwrap_or(0.0) * 1e3,
            if audio > 0.0 { wall / audio } else { 0.0 }
        );
    }
}

impl Finish {
    /// Where the request's time went, as the final events carry it (SSE `speech.audio.done`,
    /// the WebSocket's `audio.done`): the engine's per-request stage times
    /// ([`cosy::request::StageTimes`]: queue, the model's load after an idle unload, frontend,
    /// LLM, flow, HiFT; when streaming the stages
    /// overlap), the first audio and the whole request as the server saw them, and the real-time
    /// factor (wall time / audio time). A header cannot carry this on a streamed body.
    pub fn timing(&self, summary: Option<&cosy::request::Summary>, samples: usize) -> serde_json::Value {
        let stages = summary.map(|s| s.stages).unwrap_or_default();
        let total = self.started.elapsed().as_secs_f64();
        let audio = samples as f64 / f64::from(self.state.sample_rate());
        serde_json::json!({
            "queue_s": stages.queue,
            "load_s": stages.load,
            "frontend_s": stages.frontend,
            "llm_s": stages.llm,
            "flow_s": stages.flow,
            "hift_s": stages.hift,
            "first_audio_s": self.first_audio.unwrap_or(0.0),
            "total_s": total,
            "rtf": if audio > 0.0 { total / audio } else { 0.0 },
        })
    }
}

/// A request's audio, encoded as it comes: the bytes of a streamed response.
pub struct Encoded {
    /// The request (its summary once the audio has ended).
    pub running: Running,
    encoder: StreamEncoder,
    /// Bytes made but not yet sent (the first chunk's).
    pending: Option<Vec<u8>>,
    /// The samples encoded so far.
    pub samples: usize,
    deadline: tokio::time::Instant,
    pub finish: Finish,
    ended: bool,
}

impl Encoded {
    /// `running`'s audio after its first chunk, already encoded by `encoder` as `head`
    /// (`samples` long).
    pub fn new(running: Running, encoder: StreamEncoder, head: Vec<u8>, samples: usize, deadline: tokio::time::Instant, finish: Finish) -> Encoded {
        Encoded { running, encoder, pending: Some(head), samples, deadline, finish, ended: false }
    }

    /// The next bytes to send (never empty), `None` at the end (the request's summary is then
    /// in `running`).
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, ApiError> {
        if let Some(bytes) = self.pending.take().filter(|b| !b.is_empty()) {
            return Ok(Some(bytes));
        }
        while !self.ended {
            let bytes = match self.running.next_or_done(self.deadline).await? {
                Some(chunk) => {
                    self.samples += chunk.len();
                    self.encoder.push(&chunk)?
                }
                None => {
                    self.ended = true;
                    self.finish.done(self.samples);
                    self.encoder.finish()?
                }
            };
            if !bytes.is_empty() {
                return Ok(Some(bytes));
            }
        }
        Ok(None)
    }
}
