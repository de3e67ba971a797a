//! `POST /v1/audio/speech`: the OpenAI request shape plus the cloning fields (`ref_audio`,
//! `ref_text`, `instructions`, `seed`), as JSON or multipart; the answer as a stream of audio
//! bytes made as the audio comes (the default, as OpenAI's), whole (`stream: false`), or as
//! server-sent events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use cosy::app::speech::{api_speed, build_request, ApiSpeed, SpeechOptions};
use cosy::app::voices::{Recording, Resolved, VoiceChoice};
use cosy::engine::{Engine, Event, RequestHandle};
use cosy::request::TestHooks;
use serde::Deserialize;

use super::encode::{AudioFormat, StreamEncoder};
use super::error::ApiError;
use super::{ActiveGuard, AppState, RequestId};

/// The fields a speech request may carry (JSON names; multipart uses the same names). Other
/// fields are accepted and named in `x-cosy-ignored-fields` and the log (clients send extras:
/// the openai SDKs pass `extra_body` keys through, pipecat and LiveKit send fields of newer API
/// versions); a known field of the wrong type is still a 400.
#[derive(Debug, Default, Deserialize)]
pub struct SpeechParams {
    /// Any model name is accepted: one server serves one model.
    pub model: Option<String>,
    pub input: Option<String>,
    /// A saved voice's name ("default" = the configured default), or `{"id": NAME}`.
    pub voice: Option<serde_json::Value>,
    /// Absent = `server.default_format` (mp3, as OpenAI).
    pub response_format: Option<String>,
    /// OpenAI's 0.25 to 4.0; cosy's range is 0.5 to 2.0 (see `cosy::app::speech::api_speed`).
    pub speed: Option<f64>,
    /// Send audio as it is made (absent = true); false = one whole file with exact sizes.
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
    /// Test hooks, accepted only when the server runs with `debug.test_hooks = true` (tests).
    pub cosy_test: Option<TestHooksParams>,
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
}

/// The test hooks of a request; the engine refuses them (one rule, one message) unless the server
/// runs with `debug.test_hooks`.
pub fn test_hooks_of(p: Option<TestHooksParams>) -> TestHooks {
    p.map(|p| TestHooks { hold_after_first_audio: p.hold_after_first_audio, min_tokens: p.min_tokens, max_tokens: p.max_tokens })
        .unwrap_or_default()
}

/// A checked request, ready for the engine (but for the voice, resolved on a blocking thread).
pub struct Plan {
    pub text: String,
    pub format: AudioFormat,
    pub speed: ApiSpeed,
    /// Sent as it is made (the streaming schedule at speed 1, else sentence by sentence).
    pub stream: bool,
    pub sse: bool,
    pub seed: Option<u64>,
    pub voice: VoiceSpec,
    pub test_hooks: TestHooks,
}

/// What the request says of its voice, as received (the recording still encoded).
#[derive(Debug, Default)]
pub struct VoiceSpec {
    /// A saved voice; `None` = the default ("default", or no `voice`).
    pub name: Option<String>,
    pub recording: Option<Vec<u8>>,
    pub transcript: Option<String>,
    pub instruction: Option<String>,
}

pub async fn handle(State(state): State<Arc<AppState>>, Extension(id): Extension<RequestId>, req: Request) -> Response {
    let started = Instant::now();
    let mut notes = Notes::default();
    let mut response = match speech(&state, &id, req, started, &mut notes).await {
        Ok(response) => response,
        Err(e) => {
            tracing::info!("refused: {} {}", e.status.as_u16(), e.message);
            e.into_response()
        }
    };
    notes.apply(&mut response);
    response
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

/// Field names for a header or a log line: printable ASCII (others become `?`), each at most 64
/// characters, at most 16 names, then how many more (a client decides the names: bounded).
pub fn field_list(names: &[String]) -> String {
    const MAX_NAMES: usize = 16;
    let mut shown: Vec<String> = names
        .iter()
        .take(MAX_NAMES)
        .map(|n| n.chars().take(64).map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect())
        .collect();
    if names.len() > MAX_NAMES {
        shown.push(format!("... ({} more)", names.len() - MAX_NAMES));
    }
    shown.join(", ")
}

async fn speech(state: &Arc<AppState>, id: &RequestId, req: Request, started: Instant, notes: &mut Notes) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let deadline = state.request_deadline(started);
    // A client that sends its body slowly is bounded by the same deadline.
    let (params, upload, ignored) = tokio::time::timeout_at(deadline, read_params(state, req))
        .await
        .map_err(|_| ApiError::timeout(state.server.request_timeout_s))??;
    notes.ignored(ignored);
    let plan = check(state, params, upload)?;
    let resolved = resolve_voice(state, plan.voice).await?;
    notes.voice = Some(resolved.how.to_string());
    let voice = resolved.voice;
    // A response sent as it is made follows `say`'s rule (the application layer's): the
    // streaming schedule at speed 1, else whole sentences, each sent when it is made.
    let mut options = SpeechOptions::new(plan.text, voice, plan.stream);
    options.speed = plan.speed.used;
    options.seed = plan.seed;
    options.test_hooks = plan.test_hooks;
    let request = build_request(&state.config, options).map_err(|e| state.api_error(e))?;
    let schedule = if request.stream { "chunks" } else { "sentences" };
    let mut running = start(state, &engine, request)?;
    tracing::debug!("submitted after {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    // The first event decides the status: a request that fails before any audio gets a real
    // error status even when streamed.
    let first = running.next(deadline).await?;
    let ttfb = started.elapsed().as_secs_f64();
    state.metrics.ttfb.observe(ttfb);
    tracing::debug!(request = %id.0, "first audio after {:.1} ms", ttfb * 1e3);
    let finish = Finish { state: state.clone(), started, first_audio: Some(ttfb), id: id.0.clone() };
    let mut headers = speed_headers(plan.speed);
    if !plan.stream && !plan.sse {
        let mut samples = first;
        while let Some(chunk) = running.next_or_done(deadline).await? {
            samples.extend_from_slice(&chunk);
        }
        finish.done(samples.len());
        let body = plan.format.encode_whole(&samples, state.sample_rate())?;
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(plan.format.content_type()));
        return Ok((headers, body).into_response());
    }
    headers.insert(HeaderName::from_static("x-cosy-stream"), HeaderValue::from_static(schedule));
    let mut encoder = plan.format.stream_encoder(state.sample_rate())?;
    let head = encoder.push(&first)?;
    let stream = Encoded { running, encoder, pending: Some(head), samples: first.len(), deadline, finish, ended: false };
    if plan.sse {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok((headers, sse_body(stream)).into_response());
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(plan.format.content_type()));
    Ok((headers, audio_body(stream)).into_response())
}

/// `x-cosy-speed` (the speed used) and `x-cosy-speed-requested` when the asked speed was
/// brought into cosy's range.
fn speed_headers(speed: ApiSpeed) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if speed.clamped() {
        for (name, value) in [("x-cosy-speed", speed.used), ("x-cosy-speed-requested", speed.asked)] {
            if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
                headers.insert(HeaderName::from_static(name), v);
            }
        }
    }
    headers
}

/// The parameters, the uploaded recording (multipart) and the names of the fields ignored.
type Params = (SpeechParams, Option<Vec<u8>>, Vec<String>);

/// Reads the body (JSON or multipart) within `server.max_body_bytes`.
async fn read_params(state: &Arc<AppState>, req: Request) -> Result<Params, ApiError> {
    let limit = state.server.max_body_bytes;
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
    let (params, ignored) = parse_json(&bytes, r#"{"input": "Hello.", "voice": "default"}"#)?;
    Ok((params, None, ignored))
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

/// The body as `T`, and the fields it has that `T` does not know (ignored); `example` is a JSON
/// object of the kind expected (for the empty-body error).
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], example: &str) -> Result<(T, Vec<String>), ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("invalid_json", format!("the request body is empty; send a JSON object such as {example}")));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the request body is not UTF-8 text ({e})")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let mut ignored = Vec::new();
    let value: T = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&mut de, &mut |path: serde_ignored::Path| ignored.push(path.to_string())))
        .map_err(|e| field_error("the request body", e))?;
    de.end().map_err(|e| ApiError::bad_request("invalid_json", format!("the request body is not a valid request: {e}")))?;
    Ok((value, ignored))
}

/// Form fields (as JSON values) as `T`, and the names of the fields `T` does not know.
pub fn from_fields<T: serde::de::DeserializeOwned>(
    what: &str,
    fields: serde_json::Map<String, serde_json::Value>,
) -> Result<(T, Vec<String>), ApiError> {
    let mut ignored = Vec::new();
    let value: T = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(serde_json::Value::Object(fields), &mut |path: serde_ignored::Path| {
        ignored.push(path.to_string())
    }))
    .map_err(|e| field_error(what, e))?;
    Ok((value, ignored))
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
async fn read_multipart(multipart: Multipart, limit: usize) -> Result<Params, ApiError> {
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
    let (params, ignored) = from_fields::<SpeechParams>("the multipart request", fields)?;
    Ok((params, upload, ignored))
}

pub fn multipart_error(e: axum::extract::multipart::MultipartError, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(limit);
    }
    ApiError::bad_request("invalid_multipart", format!("multipart body: {}", e.body_text()))
}

/// Reads the HTTP-only parts of a request (format, stream format, where the voice comes from);
/// the rules every front end shares (text, speed, streaming, voices) are the application
/// layer's, applied when the request is built.
fn check(state: &AppState, p: SpeechParams, upload: Option<Vec<u8>>) -> Result<Plan, ApiError> {
    let Some(text) = p.input else {
        return Err(ApiError::bad_request("missing_input", "the field `input` (the text to say) is missing").param("input"));
    };
    // The text rules before any audio is decoded (a bad text costs nothing).
    cosy::app::speech::check_text(&state.config, &text).map_err(ApiError::from_engine)?;
    let format = AudioFormat::parse(p.response_format.as_deref().unwrap_or(&state.server.default_format))?;
    let sse = match p.stream_format.as_deref().map(str::trim) {
        None | Some("audio") => false,
        Some("sse") => true,
        Some(other) => {
            return Err(ApiError::bad_request("invalid_stream_format", format!("stream_format {other:?}: use \"audio\" or \"sse\""))
                .param("stream_format"))
        }
    };
    // Every format streams (OpenAI's default); `stream: false` asks for one whole file.
    let stream = p.stream.unwrap_or(true);
    let speed = api_speed(p.speed).map_err(ApiError::from_engine)?;
    let recording = match (upload, &p.ref_audio) {
        (Some(bytes), _) => Some(bytes),
        (None, Some(data)) => Some(decode_data_url(data)?),
        (None, None) => None,
    };
    let name = match recording {
        Some(_) => None,
        None => voice_name(p.voice)?,
    };
    let _ = p.model;
    let test_hooks = test_hooks_of(p.cosy_test);
    let voice = VoiceSpec { name, recording, transcript: p.ref_text, instruction: p.instructions };
    Ok(Plan { text, format, speed, stream, sse, seed: p.seed, voice, test_hooks })
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
            self.handle.cancel();
            self.state.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            tracing::info!("client gone: request cancelled");
        }
    }
}

/// Submits `request` to the engine (its one admission: 429 when every slot and queue place is taken).
pub fn start(state: &Arc<AppState>, engine: &Arc<Engine>, request: cosy::request::Request) -> Result<Running, ApiError> {
    let handle = engine.submit(request).map_err(|e| state.api_error(e))?;
    Ok(follow(state, handle))
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
    /// ([`cosy::request::StageTimes`]: queue, frontend, LLM, flow, HiFT; when streaming the stages
    /// overlap), the first audio and the whole request as the server saw them, and the real-time
    /// factor (wall time / audio time). A header cannot carry this on a streamed body.
    pub fn timing(&self, summary: Option<&cosy::request::Summary>, samples: usize) -> serde_json::Value {
        let stages = summary.map(|s| s.stages).unwrap_or_default();
        let total = self.started.elapsed().as_secs_f64();
        let audio = samples as f64 / f64::from(self.state.sample_rate());
        serde_json::json!({
            "queue_s": stages.queue,
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
    running: Running,
    encoder: StreamEncoder,
    /// Bytes made but not yet sent (the first chunk's).
    pending: Option<Vec<u8>>,
    samples: usize,
    deadline: tokio::time::Instant,
    finish: Finish,
    ended: bool,
}

impl Encoded {
    /// The next bytes to send (never empty), `None` at the end (the request's summary is then
    /// in `running`).
    async fn next(&mut self) -> Result<Option<Vec<u8>>, ApiError> {
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

/// Streamed audio bytes; an error after the first byte aborts the connection (the client sees a
/// broken transfer, never a silently short file).
fn audio_body(stream: Encoded) -> Body {
    let stream = futures_util::stream::unfold(Some(stream), |s| async move {
        let mut s = s?;
        match s.next().await {
            Ok(Some(bytes)) => Some((Ok::<Bytes, std::io::Error>(Bytes::from(bytes)), Some(s))),
            Ok(None) => None,
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
/// the same format carries, in the same pieces), then `speech.audio.done` with OpenAI's `usage`
/// (input tokens = the text tokens of the sentences said, output tokens = the speech tokens the
/// model made) and cosy's `timing` ([`Finish::timing`]), or an `error` event.
fn sse_body(stream: Encoded) -> Body {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let stream = futures_util::stream::unfold(Some(stream), move |s| async move {
        let mut s = s?;
        match s.next().await {
            Ok(Some(bytes)) => {
                let event = serde_json::json!({ "type": "speech.audio.delta", "audio": b64.encode(bytes) });
                Some((Ok::<Bytes, std::io::Error>(sse_event(&event)), Some(s)))
            }
            Ok(None) => {
                let summary = s.running.summary.clone().unwrap_or_default();
                let rate = s.finish.state.sample_rate();
                let event = serde_json::json!({
                    "type": "speech.audio.done",
                    "usage": {
                        "input_tokens": summary.text_tokens,
                        "output_tokens": summary.speech_tokens,
                        "total_tokens": summary.text_tokens + summary.speech_tokens,
                    },
                    "audio_seconds": s.samples as f64 / f64::from(rate),
                    "sample_rate": rate,
                    "timing": s.finish.timing(s.running.summary.as_ref(), s.samples),
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

#[cfg(test)]
mod tests {
    use super::field_list;

    #[test]
    fn ignored_field_lists_are_bounded_and_printable() {
        assert_eq!(field_list(&["a".into(), "b c".into()]), "a, b c");
        assert_eq!(field_list(&["x\ny\u{e9}".into()]), "x?y?");
        let many: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
        let list = field_list(&many);
        assert!(list.starts_with("f0, f1,") && list.ends_with("f15, ... (4 more)"), "{list}");
        assert_eq!(field_list(&["z".repeat(100)]).len(), 64);
    }
}
