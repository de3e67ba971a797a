//! Saved voices over HTTP: the same files as `cosy voice add|list|rm` (the voices folder, which
//! replicas may share on one volume).

use std::sync::Arc;

use cosy::app::voices::Recording;

use axum::extract::{FromRequest, Multipart, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::body::{check_declared_length, from_fields, parse_json, read_body, read_form};
use super::error::ApiError;
use super::synthesis::{decode_data_url, Notes};
use super::AppState;

/// `GET /v1/audio/voices`: `voices` as `{"id", "name"}` objects (Open WebUI's shape): the saved
/// voices, then the other names a request may give (the aliases of the config, OpenAI's voice
/// names) with what each resolves to now; `data`: the saved voices in detail; `default`.
pub async fn list(State(state): State<Arc<AppState>>) -> Response {
    let st = state.clone();
    let listed = tokio::task::spawn_blocking(move || -> Result<serde_json::Value, ApiError> {
        let key = st.engine.get().map(|e| e.voice_key().to_string());
        let entries = st.voices.list(key.as_deref()).map_err(ApiError::from_engine)?;
        let default = entries.iter().find(|e| e.is_default).map(|e| e.name.clone());
        let saved: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        // A voice a request cannot use says so in its name (Open WebUI shows the name only).
        let mut voices: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                let name = match (&e.voice, e.fits_model) {
                    (Err(_), _) => format!("{} (unusable: see data)", e.name),
                    (Ok(_), Some(false)) => format!("{} (made for another model)", e.name),
                    (Ok(_), _) => e.name.clone(),
                };
                serde_json::json!({ "id": e.name, "name": name })
            })
            .collect();
        for extra in st.voices.extra_names(&saved) {
            let target = extra.target.as_deref().unwrap_or("");
            let name = match (extra.via, extra.available) {
                ("alias", true) => format!("{} (alias of {target})", extra.id),
                ("alias", false) => format!("{} (alias of {target}, which is missing)", extra.id),
                (_, true) => format!("{} (default voice: {target})", extra.id),
                (_, false) => format!("{} (no default voice)", extra.id),
            };
            let resolves_to = extra.available.then_some(target);
            voices.push(serde_json::json!({ "id": extra.id, "name": name, "resolves_to": resolves_to }));
        }
        let data: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| match &e.voice {
                Ok(v) => serde_json::json!({
                    "name": e.name,
                    "transcript": v.transcript,
                    "seconds": cosy::app::voices::summary_seconds(v),
                    "created": v.created,
                    "default": e.is_default,
                    "usable": e.fits_model,
                }),
                Err(problem) => serde_json::json!({ "name": e.name, "default": e.is_default, "usable": false, "error": problem }),
            })
            .collect();
        Ok(serde_json::json!({ "object": "list", "voices": voices, "default": default, "data": data }))
    })
    .await;
    match listed {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

/// The fields of a new voice; others are accepted and named in `x-cosy-ignored-fields`, as for
/// a speech request.
#[derive(Debug, Default, Deserialize)]
struct VoiceForm {
    name: Option<String>,
    /// What the recording says (vLLM-Omni's name; `transcript` and `text` are accepted too).
    #[serde(alias = "transcript", alias = "text")]
    ref_text: Option<String>,
    /// JSON only: the recording as a base64 data URL.
    #[serde(alias = "audio_sample")]
    ref_audio: Option<String>,
    /// Make it the voices folder's default voice.
    default: Option<bool>,
    /// Replace a voice of the same name.
    overwrite: Option<bool>,
}

/// `POST /v1/audio/voices`: multipart (`audio_sample` file, `name`, `ref_text`) or JSON with
/// `ref_audio` as a data URL. 201 with the voice; 409 when the name is taken (unless overwrite).
pub async fn create(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let mut notes = Notes::default();
    let mut response = match create_voice(&state, req, &mut notes).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    notes.apply(&mut response);
    response
}

async fn create_voice(state: &Arc<AppState>, req: Request, notes: &mut Notes) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let limit = state.server.max_body_bytes;
    check_declared_length(req.headers(), limit)?;
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let (form, upload) = if content_type.starts_with("multipart/form-data") {
        let multipart = Multipart::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request("invalid_multipart", format!("multipart body: {}", e.body_text())))?;
        let is_upload = |name: &str, is_file: bool| is_file || matches!(name, "audio_sample" | "audio" | "file");
        let typed = |name: &str, text: String| -> Result<serde_json::Value, ApiError> {
            Ok(match name {
                "default" | "overwrite" => serde_json::Value::from(matches!(text.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")),
                _ => serde_json::Value::from(text),
            })
        };
        let (fields, upload) = read_form(multipart, limit, is_upload, typed).await?;
        let (form, ignored) = from_fields::<VoiceForm>("the voice form", fields)?;
        notes.ignored(ignored);
        (form, upload)
    } else if content_type.is_empty() || content_type.starts_with("application/json") {
        let bytes = read_body(req.into_body(), limit).await?;
        let (form, ignored): (VoiceForm, _) =
            parse_json(&bytes, r#"{"name": "me", "ref_audio": "data:audio/wav;base64,...", "ref_text": "what it says"}"#)?;
        notes.ignored(ignored);
        let upload = form.ref_audio.as_deref().map(decode_data_url).transpose()?;
        (form, upload)
    } else {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type {content_type:?}: send multipart/form-data (audio_sample, name, ref_text) or application/json"),
        ));
    };
    let Some(name) = form.name.filter(|n| !n.is_empty()) else {
        return Err(ApiError::bad_request("missing_name", "the voice's `name` is missing").param("name"));
    };
    if name == "default" {
        return Err(ApiError::bad_request(
            "invalid_voice_name",
            "\"default\" names the default voice in requests; pick another name and pass default=true",
        )
        .param("name"));
    }
    // Absent is this route's to say; empty or blank is the voice rule's (`Voices::check_new`).
    let Some(transcript) = form.ref_text else {
        return Err(ApiError::bad_request("missing_ref_text", "`ref_text` (what the recording says) is missing").param("ref_text"));
    };
    let Some(bytes) = upload else {
        return Err(ApiError::bad_request("missing_audio", "the recording is missing: send it as the multipart file `audio_sample`")
            .param("audio_sample"));
    };
    let overwrite = form.overwrite.unwrap_or(false);
    let make_default = form.default.unwrap_or(false);
    // Name, transcript (its length: limits.max_prompt_text_chars, as every prompt text) and a
    // taken name are refused before the upload is decoded.
    state.voices.check_new(&name, &transcript, overwrite).map_err(ApiError::from_engine)?;
    let st = state.clone();
    let made = tokio::task::spawn_blocking(move || -> Result<serde_json::Value, ApiError> {
        let _active = st.track();
        // The upload is the HTTP API's `audio_sample`: errors about it name that field.
        let about_upload = |err: ApiError| match err.param {
            Some("ref_audio") => ApiError { code: "invalid_audio", ..err }.param("audio_sample"),
            _ => err,
        };
        let recording = Recording::from_bytes("audio_sample", bytes).map_err(|e| about_upload(ApiError::from_engine(e)))?;
        let (voice, _) =
            st.voices.add(&engine, &name, &recording, &transcript, overwrite, make_default).map_err(|e| about_upload(st.api_error(e)))?;
        tracing::info!("saved voice {name} ({} prompt tokens)", voice.speech_token.len());
        Ok(serde_json::json!({
            "name": name,
            "transcript": voice.transcript,
            "seconds": cosy::app::voices::voice_seconds(&voice),
            "created": voice.created,
            "default": make_default,
        }))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok((StatusCode::CREATED, axum::Json(made)).into_response())
}

/// `DELETE /v1/audio/voices/{name}`
pub async fn remove(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    match state.voices.remove(&name) {
        Ok(_) => {
            tracing::info!("removed voice {name}");
            axum::Json(serde_json::json!({ "name": name, "deleted": true })).into_response()
        }
        Err(e) => ApiError::from_engine(e).into_response(),
    }
}

/// `POST /v1/audio/voices/{name}/default`: makes a saved voice the voices folder's default (what
/// requests without a voice, and OpenAI's voice names, speak with). 200 with
/// `{"name", "default": true}`, and `overridden_by` when the config's `voices.default` names
/// another voice, which still wins; 404 for an unknown voice.
pub async fn make_default(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    match state.voices.make_default(&name) {
        Ok(overridden_by) => {
            tracing::info!("{name} is now the voices folder's default voice");
            axum::Json(serde_json::json!({ "name": name, "default": true, "overridden_by": overridden_by })).into_response()
        }
        Err(e) => ApiError::from_engine(e).into_response(),
    }
}
