//! `GET /v1/audio/speech/stream`: a WebSocket session (vLLM-Omni's message names).
//!
//! Client → server (text frames, JSON): `{"type": "session.config", ...}` first (the speech
//! request's fields but `input`: `voice`, `ref_audio`, `ref_text`, `instructions`, `seed`,
//! `response_format` = "pcm", and `cosy_test` (test hooks, refused by the engine unless the
//! server runs with `debug.test_hooks`); unknown fields are accepted and named), then
//! `{"type": "input.text", "text": "..."}` pieces, then `{"type": "input.done"}`;
//! `{"type": "session.close"}` ends the session at once.
//!
//! Server → client: `session.created` (with the voice used and the fields ignored); for each
//! text segment `audio.start`, binary frames of s16le 24 kHz mono PCM as they are made,
//! `audio.done`; after `input.done` and the last segment `session.done`, then the socket closes.
//! Errors: `{"type": "error", "error": {...}}`, then close.
//!
//! Text-in streaming (a voice with a transcript or an instruction): the pieces go into one
//! request as they arrive; when its speech ends before its text, the rest is a new segment
//! (`cosy::app::text_in`, the rule for every front end). Otherwise ("sentences") text is spoken
//! segment by segment: a segment ends at settled sentence punctuation (`.`, `!`, `?`, `;`
//! followed by a space or line break; `。！？；` and line breaks at once), or at `input.done`;
//! segments run one after another, each a streaming engine request.
//!
//! Browsers: the handshake's `Origin`, when present, must be allowed (`server.cors_origins`),
//! and the key may come as the subprotocol `cosy-key.KEY` (answered `cosy`) or `?api_key=`
//! (`super::given_key`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;

use cosy::app::text_in::{Next, TextBudget, TextIn};

use super::error::ApiError;
use super::speech::{decode_data_url, resolve_voice, test_hooks_of, voice_name, Finish, Running, TestHooksParams, VoiceSpec};
use super::{AppState, RequestId};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    connection: Option<Extension<super::listen::ConnectionSlot>>,
    headers: axum::http::HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // A browser sends its page's Origin (and no preflight): only the pages server.cors_origins
    // allows may open a session. Clients that are not browsers send none.
    if let Some(origin) = headers.get(axum::http::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok());
        if !state.origins.allows_socket(origin, host) {
            tracing::info!("WebSocket from origin {origin:?} refused (server.cors_origins)");
            return ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!("web pages from {origin:?} may not open this WebSocket; the server allows them with server.cors_origins"),
            )
            .into_response();
        }
    }
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        // A plain HTTP request (or a broken handshake): the same JSON error as everywhere else.
        Err(rejection) => {
            let message = format!(
                "/v1/audio/speech/stream is a WebSocket endpoint ({}); connect with a WebSocket client (ws://...)",
                rejection.body_text()
            );
            return ApiError::new(rejection.status(), "websocket_required", message).into_response();
        }
    };
    if let Err(e) = state.engine() {
        return e.into_response();
    }
    let limit = state.server.max_body_bytes;
    upgrade
        // `cosy` when the client offers it (a browser that sends its key as `cosy-key.KEY` must
        // also offer `cosy`: the answer names one of the offered protocols, never the key).
        .protocols([super::WS_PROTOCOL])
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| async move {
            // The session holds its connection's slot (server.max_connections) until it ends.
            let _connection = connection;
            let _active = state.track();
            session(socket, state, id.0).await;
        })
}

#[derive(Debug)]
enum ClientMessage {
    /// The configuration, and the names of its fields the server does not know (ignored, and
    /// named in `session.created`).
    Config(Box<SessionConfig>, Vec<String>),
    Text { text: String },
    Done,
    Close,
}

/// The other messages' shapes (`type` and their fields).
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum OtherMessage {
    #[serde(rename = "input.text")]
    Text { text: String },
    #[serde(rename = "input.done")]
    Done,
    #[serde(rename = "session.close")]
    Close,
}

/// A client's text frame as a message. `session.config` takes unknown fields as a speech request
/// does (accepted, named); a field of the wrong type is an error.
fn parse_message(text: &str) -> Result<ClientMessage, ApiError> {
    let bad = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(
            "invalid_message",
            format!("message is not a valid session message ({e}); send session.config, input.text, input.done or session.close"),
        )
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&e))?;
    if value.get("type").and_then(|t| t.as_str()) == Some("session.config") {
        let serde_json::Value::Object(mut fields) = value else { return Err(bad(&"not an object")) };
        fields.remove("type");
        let (config, ignored) = super::speech::from_fields::<SessionConfig>("session.config", fields)?;
        return Ok(ClientMessage::Config(Box::new(config), ignored));
    }
    Ok(match serde_json::from_value::<OtherMessage>(value).map_err(|e| bad(&e))? {
        OtherMessage::Text { text } => ClientMessage::Text { text },
        OtherMessage::Done => ClientMessage::Done,
        OtherMessage::Close => ClientMessage::Close,
    })
}

#[derive(Debug, Default, Deserialize)]
struct SessionConfig {
    model: Option<String>,
    voice: Option<serde_json::Value>,
    response_format: Option<String>,
    ref_audio: Option<String>,
    ref_text: Option<String>,
    instructions: Option<String>,
    seed: Option<u64>,
    /// "bistream" (default where the voice has a transcript or an instruction): the text pieces
    /// go into one text-in streaming request; "sentences": each settled sentence is a request.
    text_streaming: Option<String>,
    /// With bistream: normalise settled sentences instead of the exact text (default false).
    normalize: Option<bool>,
    /// Test hooks for every segment, as a speech request's (`debug.test_hooks` only).
    cosy_test: Option<TestHooksParams>,
}

fn event(value: serde_json::Value) -> Message {
    Message::Text(value.to_string().into())
}

fn error_event(e: &ApiError) -> Message {
    let mut body = e.body();
    body["type"] = serde_json::Value::from("error");
    event(body)
}

async fn session(socket: WebSocket, state: Arc<AppState>, id: String) {
    let (mut sink, mut source) = socket.split();
    // Client messages arrive on their own task, so audio can flow while text comes in.
    let (client_tx, mut client_rx) = mpsc::channel::<Result<ClientMessage, ApiError>>(64);
    let reader = tokio::spawn(async move {
        while let Some(message) = source.next().await {
            let parsed = match message {
                Ok(Message::Text(text)) => parse_message(text.as_str()),
                Ok(Message::Binary(_)) => Err(ApiError::bad_request("invalid_message", "binary messages are not accepted; send JSON text messages")),
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let fatal = parsed.is_err();
            if client_tx.send(parsed).await.is_err() || fatal {
                break;
            }
        }
    });
    let result = run_session(&mut sink, &mut client_rx, &state, &id).await;
    if let Err(e) = &result {
        tracing::info!(request = %id, "session ended: {} {}", e.status.as_u16(), e.message);
        let _ = sink.send(error_event(e)).await;
    }
    let code = match &result {
        Ok(()) => 1000,
        Err(e) if e.status.is_client_error() => 1008,
        Err(_) => 1011,
    };
    let _ = sink.send(Message::Close(Some(CloseFrame { code, reason: "".into() }))).await;
    reader.abort();
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

async fn send(sink: &mut Sink, message: Message) -> Result<(), ApiError> {
    sink.send(message).await.map_err(|_| ApiError::bad_request("client_gone", "the client closed the connection"))
}

async fn run_session(
    sink: &mut Sink,
    client: &mut mpsc::Receiver<Result<ClientMessage, ApiError>>,
    state: &Arc<AppState>,
    id: &str,
) -> Result<(), ApiError> {
    let idle = Duration::from_secs(state.server.request_timeout_s);
    // 1. The configuration.
    let (config, ignored) = match tokio::time::timeout(idle, client.recv()).await {
        Ok(Some(Ok(ClientMessage::Config(c, ignored)))) => (*c, ignored),
        Ok(Some(Ok(_))) => {
            return Err(ApiError::bad_request("missing_config", "send {\"type\": \"session.config\", ...} first"));
        }
        Ok(Some(Err(e))) => return Err(e),
        Ok(None) => return Ok(()),
        Err(_) => return Err(ApiError::timeout(state.server.request_timeout_s)),
    };
    let _ = config.model;
    match config.response_format.as_deref().map(str::trim) {
        None | Some("pcm") => {}
        Some(other) => {
            return Err(ApiError::bad_request(
                "unsupported_response_format",
                format!("response_format {other:?}: the WebSocket sends pcm (s16le mono 24 kHz) only"),
            )
            .param("response_format"))
        }
    }
    let recording = config.ref_audio.as_deref().map(decode_data_url).transpose()?;
    let name = if recording.is_some() { None } else { voice_name(config.voice.clone())? };
    let spec = VoiceSpec { name, recording, transcript: config.ref_text.clone(), instruction: config.instructions.clone() };
    if !ignored.is_empty() {
        tracing::info!(request = %id, "session.config: ignored unknown fields: {}", super::speech::field_list(&ignored));
    }
    let resolved = resolve_voice(state, spec).await?;
    let voice = resolved.voice;
    // Test hooks are the engine's to refuse; asked here, the refusal comes before session.created.
    let test_hooks = test_hooks_of(config.cosy_test);
    state.engine()?.check_test_hooks(&test_hooks).map_err(|e| state.api_error(e))?;
    let has_prompt_text = cosy::app::speech::can_stream_text(&voice, 1.0);
    let bistream = match config.text_streaming.as_deref().map(str::trim) {
        None => has_prompt_text,
        Some("bistream") if has_prompt_text => true,
        Some("bistream") => {
            return Err(ApiError::bad_request(
                "invalid_text_streaming",
                "text_streaming \"bistream\" needs a voice with a transcript (ref_text, or a saved voice) or instructions; use \"sentences\"",
            ))
        }
        Some("sentences") => false,
        Some(other) => {
            return Err(ApiError::bad_request("invalid_text_streaming", format!("text_streaming {other:?}: use \"bistream\" or \"sentences\"")))
        }
    };
    send(
        sink,
        event(serde_json::json!({
            "type": "session.created", "request_id": id, "sample_rate": state.sample_rate(), "format": "pcm",
            "text_streaming": if bistream { "bistream" } else { "sentences" },
            "voice": resolved.how.to_string(), "ignored_fields": ignored.iter().take(16).collect::<Vec<_>>(),
        })),
    )
    .await?;
    if bistream {
        let options = cosy::engine::BistreamOptions { normalize_sentences: config.normalize.unwrap_or(false) };
        return run_bistream(sink, client, state, id, voice, config.seed, test_hooks, options).await;
    }

    // 2. Text in, audio out.
    let mut buffer = String::new();
    let mut budget = TextBudget::new(state.config.limits.max_text_chars);
    let mut segments: VecDeque<String> = VecDeque::new();
    let mut input_done = false;
    let mut current: Option<(Running, usize, usize, Finish)> = None; // (request, segment, samples, bookkeeping)
    let mut segment_count = 0usize;
    let mut total_samples = 0usize;
    let mut last_message = Instant::now();
    loop {
        if current.is_none() {
            if let Some(text) = segments.pop_front() {
                let engine = state.engine()?;
                let started = Instant::now();
                let mut options = cosy::app::speech::SpeechOptions::new(text.clone(), voice.clone(), true);
                options.seed = config.seed;
                options.test_hooks = test_hooks.clone();
                let request = cosy::app::speech::build_request(&state.config, options).map_err(|e| state.api_error(e))?;
                let running = super::speech::start(state, &engine, request)?;
                send(sink, event(serde_json::json!({ "type": "audio.start", "segment": segment_count, "text": text }))).await?;
                let finish = Finish { state: state.clone(), started, ttfb: 0.0, id: id.to_string() };
                current = Some((running, segment_count, 0, finish));
                segment_count += 1;
            } else if input_done {
                send(
                    sink,
                    event(serde_json::json!({
                        "type": "session.done",
                        "segments": segment_count,
                        "audio_seconds": total_samples as f64 / f64::from(state.sample_rate()),
                    })),
                )
                .await?;
                return Ok(());
            }
        }
        let deadline = tokio::time::Instant::from_std(last_message + idle);
        tokio::select! {
            message = client.recv(), if !input_done => {
                last_message = Instant::now();
                match incoming(message, &mut budget)? {
                    Incoming::Closed => return Ok(()),
                    Incoming::Text(text) => {
                        buffer.push_str(&text);
                        if let Some(end) = cosy::frontend::text::settled_end(&buffer) {
                            let settled: String = buffer.drain(..end).collect();
                            // Text with nothing to say (only punctuation) joins the next segment.
                            if cosy::request::check_speakable(&settled).is_ok() {
                                segments.push_back(settled);
                            } else {
                                buffer.insert_str(0, &settled);
                            }
                        }
                    }
                    Incoming::Done => {
                        input_done = true;
                        let rest = std::mem::take(&mut buffer);
                        if cosy::request::check_speakable(&rest).is_ok() {
                            segments.push_back(rest);
                        } else if segment_count == 0 && segments.is_empty() {
                            cosy::app::speech::check_text(&state.config, &rest).map_err(ApiError::from_engine)?;
                        }
                    }
                }
            }
            chunk = async {
                match current.as_mut() {
                    Some((running, ..)) => running.next_or_done(state.request_deadline(Instant::now())).await,
                    None => std::future::pending().await,
                }
            } => {
                match chunk? {
                    Some(samples) => {
                        if let Some((_, _, count, finish)) = current.as_mut() {
                            if *count == 0 {
                                finish.ttfb = finish.started.elapsed().as_secs_f64();
                                state.metrics.ttfb.observe(finish.ttfb);
                            }
                            *count += samples.len();
                        }
                        total_samples += samples.len();
                        send(sink, Message::Binary(cosy::audio::pcm16_bytes(&samples).into())).await?;
                    }
                    None => {
                        if let Some((running, segment, samples, finish)) = current.take() {
                            finish.done(samples);
                            let timing = finish.timing(running.summary.as_ref(), samples);
                            send(sink, event(serde_json::json!({ "type": "audio.done", "segment": segment, "samples": samples, "timing": timing }))).await?;
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline), if current.is_none() && !input_done => {
                return Err(ApiError::timeout(state.server.request_timeout_s));
            }
        }
    }
}

/// What a client message means once the session is configured.
enum Incoming {
    Closed,
    Text(String),
    Done,
}

/// A client message after the configuration: text (counted against the session's limit), done,
/// or the end of the session; anything else is an error.
fn incoming(message: Option<Result<ClientMessage, ApiError>>, budget: &mut TextBudget) -> Result<Incoming, ApiError> {
    match message {
        None | Some(Ok(ClientMessage::Close)) => Ok(Incoming::Closed),
        Some(Err(e)) => Err(e),
        Some(Ok(ClientMessage::Config(..))) => Err(ApiError::bad_request("invalid_message", "session.config may be sent once, first")),
        Some(Ok(ClientMessage::Done)) => Ok(Incoming::Done),
        Some(Ok(ClientMessage::Text { text })) => {
            budget.take(&text).map_err(ApiError::from_engine)?;
            Ok(Incoming::Text(text))
        }
    }
}

/// Text-in streaming for the whole session (`cosy::app::text_in`): every `input.text` piece
/// goes into the segment speaking as it arrives, `input.done` ends its text, audio frames leave
/// as they are made. When a segment's speech ends before its text, the rest is a new segment.
#[allow(clippy::too_many_arguments)]
async fn run_bistream(
    sink: &mut Sink,
    client: &mut mpsc::Receiver<Result<ClientMessage, ApiError>>,
    state: &Arc<AppState>,
    id: &str,
    voice: cosy::request::Voice,
    seed: Option<u64>,
    test_hooks: cosy::request::TestHooks,
    options: cosy::engine::BistreamOptions,
) -> Result<(), ApiError> {
    let idle = Duration::from_secs(state.server.request_timeout_s);
    let engine = state.engine()?;
    let mut speech = cosy::app::speech::SpeechOptions::new(String::new(), voice, true);
    speech.seed = seed;
    speech.test_hooks = test_hooks;
    let request = cosy::app::speech::build_streaming_request(speech).map_err(|e| state.api_error(e))?;
    let (mut text_in, handle) = TextIn::start(engine, request, options).map_err(|e| state.api_error(e))?;
    // The segment speaking: its request, whether its audio.start went out, its samples.
    let new_segment = |handle| (super::speech::follow(state, handle), false, 0usize, Finish { state: state.clone(), started: Instant::now(), ttfb: 0.0, id: id.to_string() });
    let mut current = Some(new_segment(handle));
    let mut budget = TextBudget::new(state.config.limits.max_text_chars);
    let mut total_samples = 0usize;
    let mut last_activity = Instant::now();
    let session_done = |segments: usize, samples: usize| {
        event(serde_json::json!({
            "type": "session.done",
            "segments": segments,
            "audio_seconds": samples as f64 / f64::from(state.sample_rate()),
        }))
    };
    loop {
        let deadline = tokio::time::Instant::from_std(last_activity + idle);
        tokio::select! {
            message = client.recv(), if !text_in.input_done() => {
                last_activity = Instant::now();
                let started = match incoming(message, &mut budget)? {
                    Incoming::Closed => return Ok(()),
                    Incoming::Text(text) => text_in.push(text).map_err(|e| state.api_error(e))?,
                    Incoming::Done => text_in.finish().map_err(|e| state.api_error(e))?,
                };
                if let Some(handle) = started {
                    current = Some(new_segment(handle));
                } else if current.is_none() && text_in.input_done() {
                    // Nothing left to say after a segment that ended early.
                    send(sink, session_done(text_in.segments(), total_samples)).await?;
                    return Ok(());
                }
            }
            chunk = async {
                match current.as_mut() {
                    Some((running, ..)) => running.next_or_done(deadline).await,
                    None => std::future::pending().await,
                }
            } => {
                last_activity = Instant::now();
                let Some((_, announced, samples, finish)) = current.as_mut() else { continue };
                let segment = text_in.current().unwrap_or(0);
                match chunk? {
                    Some(audio) => {
                        if !*announced {
                            *announced = true;
                            finish.ttfb = finish.started.elapsed().as_secs_f64();
                            state.metrics.ttfb.observe(finish.ttfb);
                            send(sink, event(serde_json::json!({ "type": "audio.start", "segment": segment }))).await?;
                        }
                        *samples += audio.len();
                        total_samples += audio.len();
                        send(sink, Message::Binary(cosy::audio::pcm16_bytes(&audio).into())).await?;
                    }
                    None => {
                        // `current` was Some (checked above); `take` ends the segment.
                        let Some((running, announced, samples, finish)) = current.take() else { continue };
                        finish.done(samples);
                        let timing = finish.timing(running.summary.as_ref(), samples);
                        let end = text_in.segment_ended().map_err(|e| state.api_error(e))?;
                        if !announced {
                            send(sink, event(serde_json::json!({ "type": "audio.start", "segment": end.index }))).await?;
                        }
                        send(
                            sink,
                            event(serde_json::json!({
                                "type": "audio.done", "segment": end.index, "samples": samples,
                                "text": end.text, "ended_early": end.ended_early, "timing": timing,
                            })),
                        )
                        .await?;
                        match end.next {
                            Next::Segment(handle) => current = Some(new_segment(handle)),
                            Next::Waiting => {}
                            Next::Finished => {
                                send(sink, session_done(text_in.segments(), total_samples)).await?;
                                return Ok(());
                            }
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline), if current.is_none() => {
                return Err(ApiError::timeout(state.server.request_timeout_s));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cosy::frontend::text::settled_end;

    #[test]
    fn sentences_settle_at_punctuation_and_space() {
        assert_eq!(settled_end("Hello world"), None);
        assert_eq!(settled_end("Hello world."), None, "a final '.' may still be a decimal point");
        assert_eq!(settled_end("Hello. Wor"), Some(6));
        assert_eq!(settled_end("It costs 3.5 dollars! And"), Some(21));
        assert_eq!(settled_end("你好。世界"), Some("你好。".len()));
        assert_eq!(settled_end("line one\nline"), Some(9));
    }
}
