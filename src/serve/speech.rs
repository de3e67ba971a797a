//! `POST /v1/audio/speech`: the OpenAI request shape plus the cloning fields (`ref_audio`,
//! `ref_text`, `instructions`, `seed`), as JSON or multipart; the answer whole, as a stream of
//! audio bytes, or as server-sent events.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use cosy::engine::{CancelToken, Engine, Event};
use cosy::pipeline::Voice;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::encode::AudioFormat;
use super::error::ApiError;
use super::{AppState, RequestId, Slot, SAMPLE_RATE};

/// The fields a speech request may carry (JSON names; multipart uses the same names).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeechParams {
    /// Any model name is accepted: one server serves one model.
    pub model: Option<String>,
    pub input: Option<String>,
    /// A saved voice's name ("default" = the configured default), or `{"id": NAME}`.
    pub voice: Option<serde_json::Value>,
    pub response_format: Option<String>,
    pub speed: Option<f64>,
    /// Use the streaming schedule and send audio as it is made.
    pub stream: Option<bool>,
    /// "audio" (bytes) or "sse" (`speech.audio.delta` events; streams unless `stream` is false).
    pub stream_format: Option<String>,
    /// The prompt recording: a base64 data URL (`data:audio/wav;base64,...`) or bare base64.
    pub ref_audio: Option<String>,
    /// What is said in `ref_audio` (zero-shot); without it the voice is cross-lingual.
    pub ref_text: Option<String>,
    /// A style instruction (instruct mode), with `ref_audio` or a saved voice.
    pub instructions: Option<String>,
    pub seed: Option<u64>,
}

/// A checked request, ready for the engine (but for the voice, resolved on a blocking thread).
pub struct Plan {
    pub text: String,
    pub format: AudioFormat,
    pub speed: f64,
    pub stream: bool,
    pub sse: bool,
    pub seed: Option<u64>,
    pub voice: VoiceSpec,
}

/// Where the voice comes from.
pub enum VoiceSpec {
    Recording { bytes: Vec<u8>, ref_text: Option<String>, instructions: Option<String> },
    Saved { name: String, instructions: Option<String> },
}

pub async fn handle(State(state): State<Arc<AppState>>, Extension(id): Extension<RequestId>, req: Request) -> Response {
    let started = Instant::now();
    match speech(&state, &id, req, started).await {
        Ok(response) => response,
        Err(e) => {
            tracing::info!("refused: {} {}", e.status.as_u16(), e.message);
            e.into_response()
        }
    }
}

async fn speech(state: &Arc<AppState>, id: &RequestId, req: Request, started: Instant) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let deadline = state.request_deadline(started);
    // A client that sends its body slowly is bounded by the same deadline.
    let (params, upload) = tokio::time::timeout_at(deadline, read_params(state, req))
        .await
        .map_err(|_| ApiError::timeout(state.config.server.request_timeout_s))??;
    let plan = check(state, params, upload)?;
    let voice = resolve_voice(state, plan.voice).await?;
    let request = cosy::pipeline::Request {
        text: plan.text,
        voice,
        text_frontend: true,
        speed: plan.speed,
        seed: plan.seed,
        stream: plan.stream,
        ignore_stop_until: None,
    };
    let slot = state.admit(deadline).await?;
    let mut running = start(state, &engine, request, slot)?;
    tracing::debug!("submitted after {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    // The first event decides the status: a request that fails before any audio gets a real
    // error status even when streamed.
    let first = running.next(deadline).await?;
    let ttfb = started.elapsed().as_secs_f64();
    state.metrics.ttfb.observe(ttfb);
    tracing::debug!(request = %id.0, "first audio after {:.1} ms", ttfb * 1e3);
    let finish = Finish { state: state.clone(), started, ttfb, id: id.0.clone() };
    if !plan.stream && !plan.sse {
        let mut samples = first;
        while let Some(chunk) = running.next_or_done(deadline).await? {
            samples.extend_from_slice(&chunk);
        }
        finish.done(samples.len());
        let body = plan.format.encode_whole(&samples, SAMPLE_RATE)?;
        return Ok(([(header::CONTENT_TYPE, plan.format.content_type())], body).into_response());
    }
    if plan.sse {
        let prefix = plan.format.stream_prefix(SAMPLE_RATE);
        let body = sse_body(running, first, prefix, deadline, finish);
        return Ok(([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response());
    }
    let mut head = plan.format.stream_prefix(SAMPLE_RATE);
    head.extend(cosy::audio::pcm16_bytes(&first));
    let body = audio_body(running, head, first.len(), deadline, finish);
    Ok(([(header::CONTENT_TYPE, plan.format.content_type())], body).into_response())
}

/// Reads the body (JSON or multipart) within `server.max_body_bytes`.
async fn read_params(state: &Arc<AppState>, req: Request) -> Result<(SpeechParams, Option<Vec<u8>>), ApiError> {
    let limit = state.config.server.max_body_bytes;
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    check_declared_length(req.headers(), limit)?;
    if content_type.starts_with("multipart/form-data") {
        let multipart = Multipart::from_request(req, state).await.map_err(|e| {
            ApiError::bad_request("invalid_multipart", format!("multipart body: {}", e.body_text()))
        })?;
        return read_multipart(multipart, limit).await;
    }
    if !content_type.is_empty() && !content_type.starts_with("application/json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type {content_type:?} is not accepted; send application/json (or multipart/form-data with a ref_audio file)"),
        ));
    }
    let bytes = read_body(req.into_body(), limit).await?;
    let params = parse_json(&bytes, r#"{"input": "Hello.", "voice": "default"}"#)?;
    Ok((params, None))
}

/// 413 at once when the client says its body is too large.
pub fn check_declared_length(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(too_large(limit)),
        _ => Ok(()),
    }
}

pub fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is larger than server.max_body_bytes = {limit} bytes; send a shorter prompt recording or text"),
    )
}

pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let text = format!("{e}");
        if text.contains("length limit") {
            too_large(limit)
        } else {
            ApiError::bad_request("invalid_body", format!("the request body could not be read: {text}"))
        }
    })
}

/// The body as `T`; `example` is a JSON object of the kind expected (for the empty-body error).
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], example: &str) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("invalid_json", format!("the request body is empty; send a JSON object such as {example}")));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the request body is not UTF-8 text ({e})")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| field_error("the request body", e))?;
    de.end().map_err(|e| ApiError::bad_request("invalid_json", format!("the request body is not a valid request: {e}")))?;
    Ok(value)
}

/// A deserialisation error naming the field at fault (`field seed: invalid value ...`).
pub fn field_error(what: &str, e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if path == "." || path.is_empty() {
        ApiError::bad_request("invalid_json", format!("{what} is not a valid request: {inner}"))
    } else {
        ApiError::bad_request("invalid_json", format!("{what} is not a valid request: field `{path}`: {inner}"))
    }
}

/// The parts of a multipart body: the text fields as JSON values (`typed` converts a field's
/// text, e.g. a number), and the one file part (`is_upload(name, has_file_name)`).
pub async fn read_form(
    mut multipart: Multipart,
    limit: usize,
    is_upload: impl Fn(&str, bool) -> bool,
    typed: impl Fn(&str, String) -> Result<serde_json::Value, ApiError>,
) -> Result<(serde_json::Map<String, serde_json::Value>, Option<Vec<u8>>), ApiError> {
    let mut fields = serde_json::Map::new();
    let mut upload = None;
    while let Some(field) = multipart.next_field().await.map_err(|e| multipart_error(e, limit))? {
        let name = field.name().unwrap_or("").to_string();
        let is_file = field.file_name().is_some();
        let bytes = field.bytes().await.map_err(|e| multipart_error(e, limit))?;
        if is_upload(&name, is_file) {
            upload = Some(bytes.to_vec());
            continue;
        }
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| ApiError::bad_request("invalid_multipart", format!("multipart field {name:?} is not UTF-8 text")))?;
        let value = typed(&name, text)?;
        fields.insert(name, value);
    }
    Ok((fields, upload))
}

/// Multipart fields become the JSON fields; a file part named `ref_audio` (or `file`, `audio`)
/// is the prompt recording.
async fn read_multipart(multipart: Multipart, limit: usize) -> Result<(SpeechParams, Option<Vec<u8>>), ApiError> {
    let is_upload = |name: &str, is_file: bool| matches!(name, "ref_audio" | "file" | "audio") && (is_file || name != "ref_audio");
    let typed = |name: &str, text: String| -> Result<serde_json::Value, ApiError> {
        Ok(match name {
            "speed" => serde_json::Value::from(text.trim().parse::<f64>().map_err(|_| {
                ApiError::bad_request("invalid_speed", format!("speed {text:?} is not a number")).param("speed")
            })?),
            "seed" => serde_json::Value::from(text.trim().parse::<u64>().map_err(|_| {
                ApiError::bad_request("invalid_seed", format!("seed {text:?} is not a whole number >= 0")).param("seed")
            })?),
            "stream" => serde_json::Value::from(match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => return Err(ApiError::bad_request("invalid_stream", format!("stream {text:?}: use true or false")).param("stream")),
            }),
            _ => serde_json::Value::from(text),
        })
    };
    let (fields, upload) = read_form(multipart, limit, is_upload, typed).await?;
    let params: SpeechParams = serde_path_to_error::deserialize(serde_json::Value::Object(fields))
        .map_err(|e| field_error("the multipart request", e))?;
    Ok((params, upload))
}

pub fn multipart_error(e: axum::extract::multipart::MultipartError, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(limit);
    }
    ApiError::bad_request("invalid_multipart", format!("multipart body: {}", e.body_text()))
}

/// Everything that can be checked without the model.
fn check(state: &AppState, p: SpeechParams, upload: Option<Vec<u8>>) -> Result<Plan, ApiError> {
    let Some(text) = p.input else {
        return Err(ApiError::bad_request("missing_input", "the field `input` (the text to say) is missing").param("input"));
    };
    check_text(&text, state.config.limits.max_text_chars).map_err(|e| e.param("input"))?;
    let format = AudioFormat::parse(p.response_format.as_deref().unwrap_or("wav"))?;
    let sse = match p.stream_format.as_deref().map(str::trim) {
        None | Some("audio") => false,
        Some("sse") => true,
        Some(other) => {
            return Err(ApiError::bad_request("invalid_stream_format", format!("stream_format {other:?}: use \"audio\" or \"sse\""))
                .param("stream_format"))
        }
    };
    let stream = p.stream.unwrap_or(sse);
    let speed = p.speed.unwrap_or(1.0);
    cosy::pipeline::check_speed(speed)
        .map_err(|_| {
            ApiError::bad_request(
                "invalid_speed",
                format!("speed {speed} is out of range: use 0.5 to 2.0 (1 = normal; the OpenAI range 0.25-4.0 is wider than this model's)"),
            )
        })
        .map_err(|e| e.param("speed"))?;
    if stream && speed != 1.0 {
        return Err(ApiError::bad_request(
            "invalid_speed",
            "speed works only without streaming (the streaming schedule cannot time-stretch; the official code refuses it too): drop stream or speed",
        )
        .param("speed"));
    }
    if (stream || sse) && format == AudioFormat::Flac {
        return Err(ApiError::bad_request(
            "unsupported_response_format",
            "flac cannot be streamed (its header needs the whole audio); stream pcm or wav, or ask for flac without stream",
        )
        .param("response_format"));
    }
    if p.ref_text.is_some() && p.instructions.is_some() {
        return Err(ApiError::bad_request(
            "conflicting_fields",
            "give ref_text (zero-shot: what ref_audio says) or instructions (instruct mode), not both",
        )
        .param("instructions"));
    }
    for (field, value) in [("ref_text", &p.ref_text), ("instructions", &p.instructions)] {
        if let Some(v) = value {
            if v.trim().is_empty() {
                return Err(ApiError::bad_request("invalid_input", format!("{field} is empty; leave it out or give the text")));
            }
            if v.chars().count() > state.config.limits.max_text_chars {
                return Err(ApiError::bad_request(
                    "text_too_long",
                    format!("{field} is longer than limits.max_text_chars = {}", state.config.limits.max_text_chars),
                ));
            }
        }
    }
    let audio = match (upload, &p.ref_audio) {
        (Some(bytes), _) => Some(bytes),
        (None, Some(data)) => Some(decode_data_url(data)?),
        (None, None) => None,
    };
    let voice = match audio {
        Some(bytes) => VoiceSpec::Recording { bytes, ref_text: p.ref_text, instructions: p.instructions },
        None => {
            if p.ref_text.is_some() {
                return Err(ApiError::bad_request("missing_ref_audio", "ref_text describes ref_audio, which is missing; send both")
                    .param("ref_audio"));
            }
            let name = voice_name(p.voice)?;
            VoiceSpec::Saved { name, instructions: p.instructions }
        }
    };
    let _ = p.model;
    Ok(Plan { text, format, speed, stream, sse, seed: p.seed, voice })
}

/// The text rules of the command line, as 400s.
pub fn check_text(text: &str, max_chars: usize) -> Result<(), ApiError> {
    cosy::pipeline::check_speakable(text).map_err(|e| ApiError::bad_request("invalid_input", format!("input: {e}")))?;
    let n = text.chars().count();
    if n > max_chars {
        return Err(ApiError::bad_request(
            "text_too_long",
            format!("input has {n} characters, more than limits.max_text_chars = {max_chars}; split it into several requests"),
        ));
    }
    Ok(())
}

/// `voice` as a name: a string, or an object with an `id` (newer OpenAI clients); absent = "default".
pub fn voice_name(v: Option<serde_json::Value>) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request("invalid_voice", "voice must be a saved voice's name (a string) or {\"id\": NAME}").param("voice");
    match v {
        None | Some(serde_json::Value::Null) => Ok("default".into()),
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(serde_json::Value::Object(o)) => o.get("id").and_then(|i| i.as_str()).map(str::to_string).ok_or_else(bad),
        Some(_) => Err(bad()),
    }
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

/// The voice, on a blocking thread (decoding a recording, reading a voice file).
pub async fn resolve_voice(state: &Arc<AppState>, spec: VoiceSpec) -> Result<Voice, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || resolve_voice_now(&state, spec))
        .await
        .map_err(|e| ApiError::internal(format!("voice: {e}")))?
}

fn resolve_voice_now(state: &AppState, spec: VoiceSpec) -> Result<Voice, ApiError> {
    match spec {
        VoiceSpec::Recording { bytes, ref_text, instructions } => {
            let label = PathBuf::from("ref_audio");
            let audio = cosy::frontend::audio::decode_bytes(&label, bytes)
                .map_err(|e| ApiError::bad_request("invalid_ref_audio", e.to_string()).param("ref_audio"))?;
            cosy::frontend::audio::check_length(&audio, &label, cosy::frontend::audio::MAX_TOKENIZER_SECONDS)
                .map_err(|e| ApiError::bad_request("invalid_ref_audio", e.to_string()).param("ref_audio"))?;
            Ok(Voice::Recording { audio: Arc::new(audio), label, transcript: ref_text, instruction: instructions })
        }
        VoiceSpec::Saved { name, instructions } => {
            let voice = load_saved_voice(state, &name)?;
            Ok(Voice::Saved { voice: Arc::new(voice), instruction: instructions })
        }
    }
}

/// A saved voice by name ("default" = the configured default): 404 names an unknown one.
pub fn load_saved_voice(state: &AppState, name: &str) -> Result<cosy::voice::SavedVoice, ApiError> {
    let store = &state.store;
    let name = if name == "default" {
        match store.default_name(state.config.voices.default.as_deref()) {
            Ok(Some((n, _))) => n,
            Ok(None) => {
                return Err(ApiError::not_found(
                    "voice_not_found",
                    "voice \"default\": no default voice is set; save one (POST /v1/audio/voices with default=true), name a saved voice, or send ref_audio",
                )
                .param("voice"))
            }
            Err(e) => return Err(ApiError::internal(e.to_string())),
        }
    } else {
        name.to_string()
    };
    cosy::vocab::check_voice_name(&name).map_err(|e| ApiError::bad_request("invalid_voice", e.to_string()).param("voice"))?;
    if !store.path_of(&name).is_file() {
        let names = store.names().unwrap_or_default();
        let have = if names.is_empty() { "there are no saved voices".to_string() } else { format!("saved voices: {}", names.join(", ")) };
        return Err(ApiError::not_found("voice_not_found", format!("voice {name:?} not found; {have} (or send ref_audio)")).param("voice"));
    }
    let voice = store.load(&name).map_err(|e| ApiError::internal(format!("voice {name:?}: {e}")))?;
    let engine = state.engine()?;
    voice
        .check_model(engine.synthesizer().voice_key(), &state.config.model_dir)
        .map_err(|e| ApiError::bad_request("voice_model_mismatch", e.to_string()).param("voice"))?;
    Ok(voice)
}

/// A request running in the engine: its events arrive on `rx`; dropping it cancels the request.
pub struct Running {
    rx: mpsc::Receiver<Event>,
    guard: CancelOnDrop,
}

/// Cancels the engine request when the client's side goes away first.
struct CancelOnDrop {
    token: CancelToken,
    finished: bool,
    state: Arc<AppState>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.token.cancel();
            self.state.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            tracing::info!("client gone: request cancelled");
        }
    }
}

/// Submits `request`; a blocking thread carries its events to the async side and holds the slot
/// until the engine has let go of the request.
pub fn start(state: &Arc<AppState>, engine: &Arc<Engine>, request: cosy::pipeline::Request, slot: Slot) -> Result<Running, ApiError> {
    let handle = engine.try_submit(request).map_err(ApiError::from_engine)?;
    Ok(follow(state, handle, slot))
}

/// Carries a started request's events to the async side (see [`start`]).
pub fn follow(state: &Arc<AppState>, mut handle: cosy::engine::RequestHandle, slot: Slot) -> Running {
    let token = handle.cancel_token();
    let (tx, rx) = mpsc::channel::<Event>(8);
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        while let Some(event) = handle.next_event() {
            if tx.blocking_send(event).is_err() {
                handle.cancel();
                // Drain so the slot frees only once the engine has stopped.
                while handle.next_event().is_some() {}
                break;
            }
        }
    });
    Running { rx, guard: CancelOnDrop { token, finished: false, state: state.clone() } }
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
        match tokio::time::timeout_at(deadline, self.rx.recv()).await {
            Err(_) => {
                // Stopped by the server, not by the client: cancel it here, counted as a timeout.
                self.guard.token.cancel();
                self.guard.finished = true;
                self.guard.state.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(ApiError::timeout(self.guard.state.config.server.request_timeout_s))
            }
            Ok(Some(Event::Audio(chunk))) => Ok(Some(chunk)),
            Ok(Some(Event::Done(_))) => {
                self.guard.finished = true;
                Ok(None)
            }
            Ok(Some(Event::Failed(e))) => {
                self.guard.finished = true;
                Err(ApiError::from_engine(e))
            }
            Ok(None) => {
                self.guard.finished = true;
                Err(ApiError::internal("the request ended without a result"))
            }
        }
    }
}

/// Bookkeeping when a request has produced all its audio.
pub struct Finish {
    pub state: Arc<AppState>,
    pub started: Instant,
    pub ttfb: f64,
    pub id: String,
}

impl Finish {
    pub fn done(&self, samples: usize) {
        let audio = samples as f64 / f64::from(SAMPLE_RATE);
        let wall = self.started.elapsed().as_secs_f64();
        self.state.metrics.add_audio_seconds(audio);
        if audio > 0.0 {
            self.state.metrics.rtf.observe(wall / audio);
        }
        tracing::info!(
            request = %self.id,
            "speech done: {audio:.2} s of audio in {wall:.2} s (first audio {:.0} ms, RTF {:.3})",
            self.ttfb * 1e3,
            if audio > 0.0 { wall / audio } else { 0.0 }
        );
    }
}

/// Streamed audio bytes; an error after the first byte aborts the connection (the client sees a
/// broken transfer, never a silently short file).
fn audio_body(running: Running, head: Vec<u8>, first_samples: usize, deadline: tokio::time::Instant, finish: Finish) -> Body {
    struct S {
        running: Running,
        head: Option<Vec<u8>>,
        samples: usize,
        deadline: tokio::time::Instant,
        finish: Finish,
    }
    let s = S { running, head: Some(head), samples: first_samples, deadline, finish };
    let stream = futures_util::stream::unfold(Some(s), |s| async move {
        let mut s = s?;
        if let Some(head) = s.head.take() {
            return Some((Ok::<Bytes, std::io::Error>(Bytes::from(head)), Some(s)));
        }
        match s.running.next_or_done(s.deadline).await {
            Ok(Some(chunk)) => {
                s.samples += chunk.len();
                let bytes = Bytes::from(cosy::audio::pcm16_bytes(&chunk));
                Some((Ok(bytes), Some(s)))
            }
            Ok(None) => {
                s.finish.done(s.samples);
                None
            }
            Err(e) => {
                tracing::warn!(request = %s.finish.id, "stream aborted: {}", e.message);
                Some((Err(std::io::Error::other(e.message)), None))
            }
        }
    });
    Body::from_stream(stream)
}

fn sse_event(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Server-sent events: `speech.audio.delta` with base64 audio (the bytes a streamed response in
/// the same format would carry), then `speech.audio.done`, or an `error` event.
fn sse_body(running: Running, first: Vec<f32>, prefix: Vec<u8>, deadline: tokio::time::Instant, finish: Finish) -> Body {
    struct S {
        running: Running,
        pending: Option<Vec<u8>>,
        samples: usize,
        deadline: tokio::time::Instant,
        finish: Finish,
    }
    let mut head = prefix;
    head.extend(cosy::audio::pcm16_bytes(&first));
    let s = S { running, pending: Some(head), samples: first.len(), deadline, finish };
    let b64 = &base64::engine::general_purpose::STANDARD;
    let stream = futures_util::stream::unfold(Some(s), move |s| async move {
        let mut s = s?;
        if let Some(bytes) = s.pending.take() {
            let event = serde_json::json!({ "type": "speech.audio.delta", "audio": b64.encode(bytes) });
            return Some((Ok::<Bytes, std::io::Error>(sse_event(&event)), Some(s)));
        }
        match s.running.next_or_done(s.deadline).await {
            Ok(Some(chunk)) => {
                s.samples += chunk.len();
                let event = serde_json::json!({ "type": "speech.audio.delta", "audio": b64.encode(cosy::audio::pcm16_bytes(&chunk)) });
                Some((Ok(sse_event(&event)), Some(s)))
            }
            Ok(None) => {
                s.finish.done(s.samples);
                let event = serde_json::json!({
                    "type": "speech.audio.done",
                    "audio_seconds": s.samples as f64 / f64::from(SAMPLE_RATE),
                    "sample_rate": SAMPLE_RATE,
                });
                Some((Ok(sse_event(&event)), None))
            }
            Err(e) => {
                tracing::warn!(request = %s.finish.id, "event stream ended by an error: {}", e.message);
                let mut event = e.body();
                event["type"] = serde_json::Value::from("error");
                Some((Ok(sse_event(&event)), None))
            }
        }
    });
    Body::from_stream(stream)
}
