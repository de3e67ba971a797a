//! `GET /`: the web page (docs/server.md, "The web page"). Plain HTML, CSS and JavaScript under
//! `src/serve/web/`, embedded in the binary at build time: no build step, no CDN, no request
//! outside the server's origin (the Content-Security-Policy says so to the browser too). The page
//! calls the public API only, as any client does (`/v1/audio/speech` with server-sent events,
//! the WebSocket, `/v1/audio/voices`, and `/v1/audio/info` for the sample rate and the limits
//! instead of assuming them); it decides nothing itself. `server.web_ui = false` turns
//! it off (its paths then answer 404 like any unknown one).

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The page's assets: (file name under `/web/`, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("web/app.js")),
    ("buffering.js", "text/javascript; charset=utf-8", include_bytes!("web/buffering.js")),
    ("style.css", "text/css; charset=utf-8", include_bytes!("web/style.css")),
    ("icon.svg", "image/svg+xml", include_bytes!("web/icon.svg")),
];

const INDEX: &[u8] = include_bytes!("web/index.html");

/// Only this server's own scripts, styles, images and connections (fetch and the WebSocket:
/// `'self'` covers ws:// to the same host in CSP 3); audio played from `blob:` URLs; no
/// frames, plugins, forms or base URL.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                   media-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`
pub async fn index(State(state): State<Arc<AppState>>, req: Request) -> Response {
    if !state.server.web_ui {
        return super::not_found(State(state), req).await;
    }
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /web/{file}`
pub async fn file(State(state): State<Arc<AppState>>, Path(name): Path<String>, req: Request) -> Response {
    match ASSETS.iter().find(|(n, ..)| *n == name) {
        Some(&(_, content_type, bytes)) if state.server.web_ui => asset(content_type, bytes),
        _ => super::not_found(State(state), req).await,
    }
}

fn asset(content_type: &'static str, bytes: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            // Revalidated on each load: a new binary's page is used at once.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        bytes,
    )
        .into_response()
}
