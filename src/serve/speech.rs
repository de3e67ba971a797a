//! `POST /v1/audio/speech`: the OpenAI request shape plus the cloning fields (`ref_audio`,
//! `ref_text`, `instructions`, `seed`), as JSON or multipart; the answer as a stream of audio
//! bytes made as the audio comes (the default, as OpenAI's), whole (`stream: false`), or as
//! server-sent events.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use cosy::app::speech::{api_speed, build_request, ApiSpeed, SpeechOptions};
use cosy::captions::CaptionFormat;
use cosy::request::TestHooks;
use serde::Deserialize;
use tokio::sync::mpsc::UnboundedReceiver;

use super::body::{check_declared_length, from_fields, parse_json, read_body, read_form};
use super::encode::AudioFormat;
use super::error::ApiError;
use super::synthesis::{
    decode_data_url, resolve_voice, start, start_with_sentence_ends, test_hooks_of, voice_name, Encoded, Finish, NormalizationParams, Notes,
    TestHooksParams, VoiceSpec,
};
use super::{AppState, RequestId};

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
    /// Normalisation switches by category, e.g. `{"markdown": false}` (docs/text.md).
    pub normalization: Option<NormalizationParams>,
    /// cosy's: when each sentence is said, as captions ("srt", "vtt" or "json"); a whole file
    /// (`stream: false`) then comes as JSON with the audio in base64 beside the captions, an event
    /// stream carries them in `speech.audio.done` (docs/server.md, "Captions").
    pub captions: Option<String>,
    /// "ssml", "text" or "auto" (absent: SSML only when the input starts with `<speak>`; docs/text.md).
    pub input_format: Option<String>,
    /// Test hooks, accepted only when the server runs with `debug.test_hooks = true` (tests).
    pub cosy_test: Option<TestHooksParams>,
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
    pub normalization: cosy::request::Normalization,
    pub captions: Option<CaptionFormat>,
    pub input_format: cosy::frontend::ssml::InputFormat,
    pub test_hooks: TestHooks,
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
    options.normalization = plan.normalization;
    options.input_format = plan.input_format;
    options.test_hooks = plan.test_hooks;
    let request = build_request(&state.config, options).map_err(|e| state.api_error(e))?;
    let schedule = if request.stream { "chunks" } else { "sentences" };
    // An event stream also says where sentences end (a player that buffers whole sentences
    // when synthesis is slower than real time releases up to there: the web page's).
    let (mut running, sentence_ends) = if plan.sse {
        let (running, ends) = start_with_sentence_ends(state, &engine, request)?;
        (running, Some(ends))
    } else {
        (start(state, &engine, request)?, None)
    };
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
        if let Some(format) = plan.captions {
            let captions = captions_of(running.summary.as_ref(), samples.len(), format, state.sample_rate());
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            let doc = serde_json::json!({
                "audio": base64::engine::general_purpose::STANDARD.encode(&body),
                "content_type": plan.format.content_type(),
                "captions": captions,
            });
            return Ok((headers, doc.to_string()).into_response());
        }
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(plan.format.content_type()));
        return Ok((headers, body).into_response());
    }
    headers.insert(HeaderName::from_static("x-cosy-stream"), HeaderValue::from_static(schedule));
    let mut encoder = plan.format.stream_encoder(state.sample_rate())?;
    let head = encoder.push(&first)?;
    let stream = Encoded::new(running, encoder, head, first.len(), deadline, finish);
    if plan.sse {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok((headers, sse_body(stream, sentence_ends, plan.captions)).into_response());
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
            // An object, written as JSON in its form field.
            "normalization" => serde_json::from_str(&text).map_err(|e| {
                ApiError::bad_request("invalid_normalization", format!("normalization {text:?} is not a JSON object: {e}")).param("normalization")
            })?,
            _ => serde_json::Value::from(text),
        })
    };
    let (fields, upload) = read_form(multipart, limit, is_upload, typed).await?;
    let (params, ignored) = from_fields::<SpeechParams>("the multipart request", fields)?;
    Ok((params, upload, ignored))
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
    let normalization = NormalizationParams::of(p.normalization)?;
    let captions = p
        .captions
        .as_deref()
        .map(|name| {
            CaptionFormat::parse(name).ok_or_else(|| {
                ApiError::bad_request("invalid_captions", format!("captions {name:?}: use {}", CaptionFormat::ALLOWED)).param("captions")
            })
        })
        .transpose()?;
    if captions.is_some() && stream && !sse {
        return Err(ApiError::bad_request(
            "invalid_captions",
            "captions come with a whole file (\"stream\": false) or an event stream (\"stream_format\": \"sse\"), not with streamed audio bytes",
        )
        .param("captions"));
    }
    let input_format = super::synthesis::input_format_of(p.input_format.as_deref())?;
    Ok(Plan { text, format, speed, stream, sse, seed: p.seed, voice, normalization, captions, input_format, test_hooks })
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
///
/// Where a sentence's audio ends is a delta with no audio and `sentence_end` (samples from the
/// start), sent as soon as the engine says so and never before the delta carrying that audio: an
/// extra field on an event OpenAI's clients already read (they append empty audio), so none breaks.
fn sse_body(stream: Encoded, sentence_ends: Option<UnboundedReceiver<u64>>, captions: Option<CaptionFormat>) -> Body {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let end_event = |end: u64| sse_event(&serde_json::json!({ "type": "speech.audio.delta", "audio": "", "sentence_end": end }));
    // (the audio, the sentence ends still to come, an end told before its audio was sent)
    let start = Some((stream, sentence_ends, None::<u64>));
    let stream = futures_util::stream::unfold(start, move |st| async move {
        let (mut s, mut ends, mut told) = st?;
        if let Some(end) = told.filter(|&end| end <= s.samples as u64) {
            return Some((Ok::<Bytes, std::io::Error>(end_event(end)), Some((s, ends, None))));
        }
        let next = match ends.as_mut().filter(|_| told.is_none()) {
            // Audio first: a sentence's last chunk is already waiting when its end is told (the
            // first chunk, already read, goes out at the first poll).
            Some(rx) => tokio::select! {
                biased;
                next = s.next() => next,
                end = rx.recv() => match end {
                    Some(end) if end <= s.samples as u64 => return Some((Ok(end_event(end)), Some((s, ends, None)))),
                    Some(end) => {
                        told = Some(end);
                        s.next().await
                    }
                    // The request's thread has ended: no more ends to tell.
                    None => {
                        ends = None;
                        s.next().await
                    }
                },
            },
            None => s.next().await,
        };
        match next {
            Ok(Some(bytes)) => {
                let event = serde_json::json!({ "type": "speech.audio.delta", "audio": b64.encode(bytes) });
                Some((Ok(sse_event(&event)), Some((s, ends, told))))
            }
            Ok(None) => {
                let summary = s.running.summary.clone().unwrap_or_default();
                let rate = s.finish.state.sample_rate();
                let mut event = serde_json::json!({
                    "type": "speech.audio.done",
                    "usage": {
                        "input_tokens": summary.text_tokens,
                        "output_tokens": summary.speech_tokens,
                        "total_tokens": summary.text_tokens + summary.speech_tokens,
                    },
                    "audio_seconds": s.samples as f64 / f64::from(rate),
                    "sample_rate": rate,
                    "timing": s.finish.timing(s.running.summary.as_ref(), s.samples),
                    "sentences": sentences_of(s.running.summary.as_ref(), rate),
                });
                if let Some(format) = captions {
                    event["captions"] = captions_of(s.running.summary.as_ref(), s.samples, format, rate);
                }
                // The last sentence's end is told just before the request is done: both are
                // waiting now, and the end goes first.
                let mut last = Vec::new();
                for end in told.into_iter().chain(std::iter::from_fn(|| ends.as_mut().and_then(|rx| rx.try_recv().ok()))) {
                    last.extend_from_slice(&end_event(end));
                }
                last.extend_from_slice(&sse_event(&event));
                Some((Ok(Bytes::from(last)), None))
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

/// Each sentence said, with where its audio lies (samples and seconds), from the request's
/// summary: `speech.audio.done`'s `sentences`.
fn sentences_of(summary: Option<&cosy::request::Summary>, rate: u32) -> serde_json::Value {
    let seconds = |s: usize| s as f64 / f64::from(rate);
    let spans = summary.map(|s| s.spans.as_slice()).unwrap_or_default();
    spans
        .iter()
        .map(|span| {
            let end = span.start + span.samples;
            serde_json::json!({
                "text": span.text, "start_sample": span.start, "end_sample": end,
                "start": seconds(span.start), "end": seconds(end),
            })
        })
        .collect()
}

/// The request's captions in `format` (the library's [`cosy::captions`], one rule for the CLI and
/// the server): SRT or WebVTT text, or the JSON form as an object.
fn captions_of(summary: Option<&cosy::request::Summary>, samples: usize, format: CaptionFormat, rate: u32) -> serde_json::Value {
    let spans = summary.map(|s| s.spans.as_slice()).unwrap_or_default();
    let timeline = cosy::captions::Timeline::from_spans(spans, samples as u64);
    let text = timeline.render(format, rate);
    match format {
        CaptionFormat::Json => serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        CaptionFormat::Srt | CaptionFormat::Vtt => serde_json::Value::from(text),
    }
}
