//! Errors as OpenAI-style JSON bodies: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One failed API call: its status and a message that names the thing at fault and the fix.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// A short machine-readable reason (`invalid_input`, `voice_not_found`, …).
    pub code: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<&'static str>,
    /// Seconds for a Retry-After header (429, 503 while loading or draining).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: one_line(&message.into()), code, param: None, retry_after: None }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }
    pub fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }
    pub fn not_found(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, code, message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }
    pub fn timeout(seconds: u64) -> ApiError {
        ApiError::unavailable(
            "timeout",
            format!("the request took longer than server.request_timeout_s = {seconds} s; send shorter text or retry later"),
        )
    }

    /// The OpenAI error `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// An engine or library error as an API error, by variant and input code (the library
    /// checks, the server only maps): bad input is the client's (400; 404 for a voice that does
    /// not exist, 409 for a name that is taken), a full engine is 429 (the caller adds
    /// Retry-After), a full disk 507, everything else is the server's (500).
    pub fn from_engine(err: cosy::Error) -> ApiError {
        use cosy::error::InputCode;
        match err {
            cosy::Error::Input { code, param, message } => {
                let status = match code {
                    // No voice named and no default: the voice "default" is not there (as before).
                    InputCode::VoiceNotFound | InputCode::NoVoice => StatusCode::NOT_FOUND,
                    InputCode::VoiceExists => StatusCode::CONFLICT,
                    _ => StatusCode::BAD_REQUEST,
                };
                ApiError { param, ..ApiError::new(status, code.as_str(), message) }
            }
            cosy::Error::Busy(msg) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "server_busy", format!("the server is busy: {msg}")),
            cosy::Error::Cancelled => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cancelled", "the request was cancelled"),
            // The disk is full: 507, the request may succeed once space is freed; any other
            // storage fault is the server's (500), with the same words.
            cosy::Error::Storage { fault, message, .. } if fault.is_full() => {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage", message)
            }
            cosy::Error::Storage { message, .. } => ApiError::internal(message),
            other => ApiError::internal(other.to_string()),
        }
    }

    /// The JSON body (also sent as a WebSocket or SSE error event).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<cosy::Error> for ApiError {
    fn from(err: cosy::Error) -> ApiError {
        ApiError::from_engine(err)
    }
}

/// Messages stay on one line (a client's text may carry newlines into them).
fn one_line(s: &str) -> String {
    s.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}
