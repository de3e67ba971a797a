//! Reading and parsing request bodies, shared by every route (speech, voices, the WebSocket's
//! `session.config`): the size bound (`server.max_body_bytes`, 413), JSON and multipart forms into
//! typed parameters with the unknown fields named, not refused (`x-cosy-ignored-fields`), and a
//! bad field named in its 400.

use axum::body::{Body, Bytes};
use axum::extract::Multipart;
use axum::http::{header, HeaderMap, StatusCode};

use super::error::ApiError;

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

pub fn multipart_error(e: axum::extract::multipart::MultipartError, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(limit);
    }
    ApiError::bad_request("invalid_multipart", format!("multipart body: {}", e.body_text()))
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
