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
//! request as they arrive; when its speech ends before its text, the rest is a new segment.
//! Otherwise ("sentences") text is spoken
//! segment by segment: a segment ends at settled sentence punctuation (`.`, `!`, `?`, `;`
//! followed by a space or line break; `。！？；` and line breaks at once), or at `input.done`;
//! segments run one after another, each a streaming engine request. Both are the rules of
//! `cosy::app::text_stream`'s session (the budget too); this module translates its steps.
//!
//! Browsers: the handshake's `Origin`, when present, must be allowed (`server.cors_origins`),
//! and the key may come as the subprotocol `cosy-key.KEY` (answered `cosy`) or `?api_key=`
//! (`super::given_key`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use cosy::app::speech::{build_streaming_request, SpeechOptions};
use cosy::app::text_stream::{Report, SegmentEnd, Step, TextStream};

use super::error::ApiError;
use super::synthesis::{decode_data_url, follow, next_chunk, resolve_voice, test_hooks_of, voice_name, Finish, Running, TestHooksParams, VoiceSpec};
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
        let (config, ignored) = super::body::from_fields::<SessionConfig>("session.config", fields)?;
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
    /// Normalisation switches by category, e.g. `{"markdown": false}` (docs/text.md).
    normalization: Option<super::synthesis::NormalizationParams>,
    /// "ssml", "text" or "auto" (absent): whether the streamed text is SSML (docs/text.md).
    input_format: Option<String>,
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

/// One session: its configuration, then its text through a text stream until it is done.
async fn run_session(
    sink: &mut Sink,
    client: &mut mpsc::Receiver<Result<ClientMessage, ApiError>>,
    state: &Arc<AppState>,
    id: &str,
) -> Result<(), ApiError> {
    let Some((config, ignored)) = read_config(client, state).await? else { return Ok(()) };
    let setup = configure(state, id, config, ignored).await?;
    send(sink, event(setup.created)).await?;
    let engine = state.engine()?;
    // `debug.model_text`: each sentence's text as the model gets it, told before its audio.
    let (observer, model_text) = cosy::app::dump::ModelTextObserver::of_config(&state.config);
    let stream = match setup.bistream {
        Some(options) => {
            let request = build_streaming_request(setup.speech).map_err(|e| state.api_error(e))?;
            TextStream::text_in(engine, &state.config, request, options, observer)
        }
        None => TextStream::sentences(engine, &state.config, setup.speech).observed(observer),
    };
    let mut events = Events { sink, state, id, bistream: setup.bistream.is_some(), current: None, position: 0, model_text };
    events.run(client, stream).await
}

/// The first message, which must be the configuration; `None` when the client left first.
async fn read_config(
    client: &mut mpsc::Receiver<Result<ClientMessage, ApiError>>,
    state: &Arc<AppState>,
) -> Result<Option<(SessionConfig, Vec<String>)>, ApiError> {
    let idle = Duration::from_secs(state.server.request_timeout_s);
    match tokio::time::timeout(idle, client.recv()).await {
        Ok(Some(Ok(ClientMessage::Config(c, ignored)))) => Ok(Some((*c, ignored))),
        Ok(Some(Ok(_))) => Err(ApiError::bad_request("missing_config", "send {\"type\": \"session.config\", ...} first")),
        Ok(Some(Err(e))) => Err(e),
        Ok(None) => Ok(None),
        Err(_) => Err(ApiError::timeout(state.server.request_timeout_s)),
    }
}

/// What a `session.config` decided: the speech every segment makes, text-in streaming (with its
/// options) or sentences, and the `session.created` event.
struct Setup {
    speech: SpeechOptions,
    bistream: Option<cosy::engine::BistreamOptions>,
    created: serde_json::Value,
}

/// Reads a `session.config`: its format, its voice (resolved), its test hooks (refused before
/// `session.created` unless the server allows them) and how its text is streamed.
async fn configure(state: &Arc<AppState>, id: &str, config: SessionConfig, ignored: Vec<String>) -> Result<Setup, ApiError> {
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
        tracing::info!(request = %id, "session.config: ignored unknown fields: {}", super::body::field_list(&ignored));
    }
    let resolved = resolve_voice(state, spec).await?;
    // Test hooks are the engine's to refuse; asked here, the refusal comes before session.created.
    let test_hooks = test_hooks_of(config.cosy_test);
    state.engine()?.check_test_hooks(&test_hooks).map_err(|e| state.api_error(e))?;
    let input_format = super::synthesis::input_format_of(config.input_format.as_deref())?;
    let bistream = match config.text_streaming.as_deref() {
        None => cosy::app::speech::can_stream_text_as(&resolved.voice, 1.0, input_format),
        asked => text_streaming(asked, cosy::app::speech::can_stream_text(&resolved.voice, 1.0))?,
    };
    if bistream {
        cosy::app::speech::check_text_in_format(input_format).map_err(|e| state.api_error(e))?;
    }
    let created = serde_json::json!({
        "type": "session.created", "request_id": id, "sample_rate": state.sample_rate(), "format": "pcm",
        "text_streaming": if bistream { "bistream" } else { "sentences" },
        "voice": resolved.how.to_string(), "ignored_fields": ignored.iter().take(16).collect::<Vec<_>>(),
    });
    let mut speech = SpeechOptions::new(String::new(), resolved.voice, true);
    speech.seed = config.seed;
    speech.normalization = super::synthesis::NormalizationParams::of(config.normalization)?;
    speech.input_format = input_format;
    speech.test_hooks = test_hooks;
    let options = cosy::engine::BistreamOptions { normalize_sentences: config.normalize.unwrap_or(false), ..Default::default() };
    Ok(Setup { speech, bistream: bistream.then_some(options), created })
}

/// `text_streaming` as asked: text-in streaming ("bistream", the default where the voice can
/// take it) or not ("sentences").
fn text_streaming(asked: Option<&str>, voice_can_stream: bool) -> Result<bool, ApiError> {
    match asked.map(str::trim) {
        None => Ok(voice_can_stream),
        Some("bistream") if voice_can_stream => Ok(true),
        Some("bistream") => Err(ApiError::bad_request(
            "invalid_text_streaming",
            "text_streaming \"bistream\" needs a voice with a transcript (ref_text, or a saved voice) or instructions; use \"sentences\"",
        )),
        Some("sentences") => Ok(false),
        Some(other) => Err(ApiError::bad_request("invalid_text_streaming", format!("text_streaming {other:?}: use \"bistream\" or \"sentences\""))),
    }
}

/// What a client message means once the session is configured.
enum Incoming {
    Closed,
    Text(String),
    Done,
}

/// A client message after the configuration: text, done, or the end of the session; anything
/// else is an error.
fn incoming(message: Option<Result<ClientMessage, ApiError>>) -> Result<Incoming, ApiError> {
    match message {
        None | Some(Ok(ClientMessage::Close)) => Ok(Incoming::Closed),
        Some(Err(e)) => Err(e),
        Some(Ok(ClientMessage::Config(..))) => Err(ApiError::bad_request("invalid_message", "session.config may be sent once, first")),
        Some(Ok(ClientMessage::Done)) => Ok(Incoming::Done),
        Some(Ok(ClientMessage::Text { text })) => Ok(Incoming::Text(text)),
    }
}

/// A configured session on its socket: the text stream's steps ([`cosy::app::text_stream`], every
/// rule of the text) as the WebSocket's events.
struct Events<'a> {
    sink: &'a mut Sink,
    state: &'a Arc<AppState>,
    id: &'a str,
    /// Text-in streaming (`audio.start` at a segment's first audio; `audio.done` says the text it
    /// took), else sentences (`audio.start` with the sentence as its request starts).
    bistream: bool,
    /// The segment speaking.
    current: Option<Running>,
    /// Samples of the session's audio sent before the segment speaking: where each segment's
    /// audio lies in the whole (`audio.done`'s `start_sample`/`end_sample`, for captions).
    position: u64,
    /// `debug.model_text`: the sentences' texts as the model gets them.
    model_text: Option<cosy::app::dump::ModelTexts>,
}

impl Events<'_> {
    /// Client messages into the stream, the segments' audio out, until the stream is finished,
    /// the client leaves, or nothing happens for `server.request_timeout_s`.
    async fn run(&mut self, client: &mut mpsc::Receiver<Result<ClientMessage, ApiError>>, mut stream: TextStream) -> Result<(), ApiError> {
        let state = self.state;
        let idle = Duration::from_secs(state.server.request_timeout_s);
        let mut last_activity = Instant::now();
        let steps = stream.start(last_activity).map_err(|e| state.api_error(e))?;
        if self.send_steps(steps, None).await? {
            return Ok(());
        }
        loop {
            let deadline = tokio::time::Instant::from_std(last_activity + idle);
            let mut ended = None;
            let steps = tokio::select! {
                message = client.recv(), if !stream.input_done() => {
                    last_activity = Instant::now();
                    match incoming(message)? {
                        Incoming::Closed => return Ok(()),
                        Incoming::Text(text) => stream.text(text, last_activity),
                        Incoming::Done => stream.end(last_activity),
                    }
                }
                chunk = next_chunk(self.current.as_mut(), deadline) => {
                    last_activity = Instant::now();
                    match chunk? {
                        Some(audio) => stream.audio(audio, last_activity),
                        None => {
                            ended = self.current.take();
                            stream.done(last_activity)
                        }
                    }
                }
                _ = tokio::time::sleep_until(deadline), if self.current.is_none() => {
                    return Err(ApiError::timeout(state.server.request_timeout_s));
                }
            };
            if self.send_steps(steps.map_err(|e| state.api_error(e))?, ended).await? {
                return Ok(());
            }
        }
    }

    /// Sends the events of `steps` (`ended`: the request of a segment that has just ended, for
    /// its timing); true once the session is done (`session.done` sent).
    async fn send_steps(&mut self, steps: Vec<Step>, ended: Option<Running>) -> Result<bool, ApiError> {
        for step in steps {
            match step {
                Step::Follow(start, handle) => {
                    self.current = Some(follow(self.state, handle));
                    if !self.bistream {
                        self.send(json!({ "type": "audio.start", "segment": start.index, "text": start.text() })).await?;
                    }
                }
                Step::Report(Report::FirstAudio { segment, after }) => {
                    self.state.metrics.ttfb.observe(after.as_secs_f64());
                    if self.bistream {
                        self.send(json!({ "type": "audio.start", "segment": segment })).await?;
                    }
                }
                Step::Report(Report::Audio { segment, samples }) => {
                    self.tell_model_text(segment).await?;
                    send(self.sink, Message::Binary(cosy::audio::pcm16_bytes(&samples).into())).await?
                }
                Step::Report(Report::SegmentDone(end)) => {
                    self.tell_model_text(end.index).await?;
                    self.segment_done(&end, ended.as_ref()).await?
                }
                Step::Report(Report::Finished(totals)) => {
                    let audio_seconds = totals.samples as f64 / f64::from(self.state.sample_rate());
                    self.send(json!({ "type": "session.done", "segments": totals.segments, "audio_seconds": audio_seconds })).await?;
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// `audio.done` of a segment (after its `audio.start`, even with no audio), with its timing.
    async fn segment_done(&mut self, end: &SegmentEnd, ended: Option<&Running>) -> Result<(), ApiError> {
        let finish = Finish::of_segment(self.state, self.id, end);
        finish.done(end.samples);
        let timing = finish.timing(ended.and_then(|r| r.summary.as_ref()), end.samples);
        let (start_sample, end_sample) = (self.position, self.position + end.samples as u64);
        self.position = end_sample;
        if !self.bistream {
            return self
                .send(json!({
                    "type": "audio.done", "segment": end.index, "samples": end.samples,
                    "start_sample": start_sample, "end_sample": end_sample, "timing": timing,
                }))
                .await;
        }
        if end.first_audio.is_none() {
            self.send(json!({ "type": "audio.start", "segment": end.index })).await?;
        }
        self.send(json!({
            "type": "audio.done", "segment": end.index, "samples": end.samples,
            "start_sample": start_sample, "end_sample": end_sample,
            "text": end.text, "ended_early": end.ended_early, "timing": timing,
        }))
        .await
    }

    async fn send(&mut self, value: serde_json::Value) -> Result<(), ApiError> {
        send(self.sink, event(value)).await
    }

    /// `debug.model_text` (when the server has it): the texts `segment` gave the model so far,
    /// before the audio made of them.
    async fn tell_model_text(&mut self, segment: usize) -> Result<(), ApiError> {
        let texts = self.model_text.as_ref().map(cosy::app::dump::ModelTexts::take).unwrap_or_default();
        for t in texts {
            self.send(json!({ "type": "debug.model_text", "segment": segment, "sentence": t.sentence, "text": t.text, "tokens": t.tokens })).await?;
        }
        Ok(())
    }
}
