//! Wyoming events on a byte stream: one JSON header line (`type`, optional `data`, `data_length`,
//! `payload_length`, `version`), then `data_length` bytes of JSON merged into `data`, then
//! `payload_length` bytes of payload (the `wyoming` package's `event.py`). Reading is bounded:
//! the header line by `wyoming.max_header_bytes`, data and payload by `wyoming.max_payload_bytes`.

use serde_json::{Map, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The protocol version cosy writes in every header: the `wyoming` package release whose
/// protocol this implements (pinned in tests/clients/requirements.txt).
pub const PROTOCOL_VERSION: &str = "1.10.2";

/// One event as received or to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: String,
    pub data: Map<String, Value>,
    pub payload: Vec<u8>,
}

impl Event {
    pub fn new(kind: &str, data: Value) -> Event {
        let data = match data {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Event { kind: kind.to_string(), data, payload: Vec::new() }
    }

    pub fn with_payload(mut self, payload: Vec<u8>) -> Event {
        self.payload = payload;
        self
    }

    /// The bytes on the wire: the header line, the data (its own JSON block, as the `wyoming`
    /// package writes it), the payload.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut header = Map::new();
        header.insert("type".into(), Value::from(self.kind.as_str()));
        header.insert("version".into(), Value::from(PROTOCOL_VERSION));
        let data = if self.data.is_empty() { Vec::new() } else { Value::Object(self.data.clone()).to_string().into_bytes() };
        if !data.is_empty() {
            header.insert("data_length".into(), Value::from(data.len()));
        }
        if !self.payload.is_empty() {
            header.insert("payload_length".into(), Value::from(self.payload.len()));
        }
        let mut out = Value::Object(header).to_string().into_bytes();
        out.push(b'\n');
        out.extend_from_slice(&data);
        out.extend_from_slice(&self.payload);
        out
    }
}

/// What the reader allows.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_header_bytes: usize,
    pub max_payload_bytes: usize,
}

/// Why no event could be read. Every one ends the connection: after a broken frame the next
/// event's start is unknown.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameError {
    pub code: &'static str,
    pub message: String,
}

impl FrameError {
    fn new(code: &'static str, message: impl Into<String>) -> FrameError {
        FrameError { code, message: message.into() }
    }
}

/// Reads the next event; `Ok(None)` at the end of the stream between events.
pub async fn read_event<R: AsyncBufRead + Unpin>(reader: &mut R, bounds: Bounds) -> Result<Option<Event>, FrameError> {
    let io = |e: std::io::Error| FrameError::new("io", format!("reading the connection failed: {e}"));
    let mut line = Vec::new();
    // One byte over the limit tells a line that is too long from one that fits exactly.
    let limit = bounds.max_header_bytes as u64 + 1;
    let n = (&mut *reader).take(limit).read_until(b'\n', &mut line).await.map_err(io)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        if line.len() as u64 >= limit {
            return Err(FrameError::new(
                "header_too_large",
                format!("an event header is longer than wyoming.max_header_bytes = {} bytes; send data with data_length", bounds.max_header_bytes),
            ));
        }
        return Err(FrameError::new("truncated_event", "the connection ended inside an event header (no newline)"));
    }
    let header: Value = serde_json::from_slice(&line)
        .map_err(|e| FrameError::new("invalid_json", format!("an event header is not JSON ({e}); send one JSON object per line")))?;
    let Value::Object(mut header) = header else {
        return Err(FrameError::new("invalid_event", "an event header must be a JSON object with a \"type\""));
    };
    let kind = match header.remove("type") {
        Some(Value::String(kind)) if !kind.is_empty() => kind,
        _ => return Err(FrameError::new("invalid_event", "an event header has no \"type\" (a non-empty string)")),
    };
    let length = |header: &Map<String, Value>, key: &str| -> Result<usize, FrameError> {
        match header.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| FrameError::new("invalid_event", format!("{key} must be a whole number of bytes, not {v}")))?;
                if n > bounds.max_payload_bytes as u64 {
                    return Err(FrameError::new(
                        "payload_too_large",
                        format!("{kind}: {key} = {n} is more than wyoming.max_payload_bytes = {} bytes", bounds.max_payload_bytes),
                    ));
                }
                Ok(n as usize)
            }
        }
    };
    let data_length = length(&header, "data_length")?;
    let payload_length = length(&header, "payload_length")?;
    let mut data = match header.remove("data") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(FrameError::new("invalid_event", format!("{kind}: \"data\" must be a JSON object"))),
    };
    let eof = |what: &str| FrameError::new("truncated_event", format!("the connection ended inside the {what} of a {kind} event"));
    if data_length > 0 {
        let mut bytes = vec![0u8; data_length];
        reader.read_exact(&mut bytes).await.map_err(|_| eof("data"))?;
        let more: Value = serde_json::from_slice(&bytes)
            .map_err(|e| FrameError::new("invalid_json", format!("{kind}: its data is not JSON ({e})")))?;
        let Value::Object(more) = more else {
            return Err(FrameError::new("invalid_event", format!("{kind}: its data must be a JSON object")));
        };
        // As the `wyoming` package merges them: the data block's keys win.
        data.extend(more);
    }
    let mut payload = Vec::new();
    if payload_length > 0 {
        payload.resize(payload_length, 0);
        reader.read_exact(&mut payload).await.map_err(|_| eof("payload"))?;
    }
    Ok(Some(Event { kind, data, payload }))
}

/// Reads the rest of a stream: for tests of a reader that must stop.
#[cfg(test)]
async fn drain<R: tokio::io::AsyncRead + Unpin>(reader: &mut R) -> Vec<u8> {
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest).await;
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds { max_header_bytes: 1024, max_payload_bytes: 2048 };

    async fn read_all(bytes: &[u8]) -> Vec<Result<Option<Event>, FrameError>> {
        let mut reader = tokio::io::BufReader::new(bytes);
        let mut out = Vec::new();
        loop {
            let r = read_event(&mut reader, BOUNDS).await;
            let stop = !matches!(r, Ok(Some(_)));
            out.push(r);
            if stop {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn events_round_trip_with_data_and_payload() {
        let sent = [
            Event::new("describe", Value::Null),
            Event::new("synthesize", serde_json::json!({"text": "Hello, wörld.", "voice": {"name": "me"}})),
            Event::new("audio-chunk", serde_json::json!({"rate": 24000})).with_payload(vec![1, 2, 3, 4]),
        ];
        let bytes: Vec<u8> = sent.iter().flat_map(Event::to_bytes).collect();
        let got = read_all(&bytes).await;
        assert_eq!(got.len(), 4);
        for (sent, got) in sent.iter().zip(&got) {
            assert_eq!(got.as_ref().ok().and_then(|e| e.as_ref()), Some(sent));
        }
        assert_eq!(got[3], Ok(None));
    }

    #[tokio::test]
    async fn inline_data_merges_with_the_data_block() {
        let block = br#"{"text": "from the block"}"#;
        let mut bytes = format!("{{\"type\": \"synthesize\", \"data\": {{\"text\": \"inline\", \"x\": 1}}, \"data_length\": {}}}\n", block.len()).into_bytes();
        bytes.extend_from_slice(block);
        let got = read_all(&bytes).await;
        let event = got[0].clone().ok().flatten().expect("an event");
        assert_eq!(event.data["text"], "from the block");
        assert_eq!(event.data["x"], 1);
    }

    #[tokio::test]
    async fn bad_frames_are_named_and_bounded() {
        let long = format!("{{\"type\": \"synthesize\", \"data\": {{\"text\": \"{}\"}}}}\n", "a".repeat(2000));
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"not json\n".to_vec(), "invalid_json"),
            (b"[1, 2]\n".to_vec(), "invalid_event"),
            (b"{\"data\": {}}\n".to_vec(), "invalid_event"),
            (b"{\"type\": \"x\", \"data_length\": -1}\n".to_vec(), "invalid_event"),
            (b"{\"type\": \"x\", \"payload_length\": 999999999}\n".to_vec(), "payload_too_large"),
            (b"{\"type\": \"x\", \"data_length\": 10}\n{\"a\"".to_vec(), "truncated_event"),
            (b"{\"type\": \"x\", \"data_length\": 3}\n[1]".to_vec(), "invalid_event"),
            (b"{\"type\": \"x\"".to_vec(), "truncated_event"),
            (long.into_bytes(), "header_too_large"),
        ];
        for (bytes, code) in cases {
            let got = read_all(&bytes).await;
            let err = got.last().cloned().and_then(Result::err).unwrap_or_else(|| panic!("{code}: {got:?}"));
            assert_eq!(err.code, code, "{}: {}", String::from_utf8_lossy(&bytes[..bytes.len().min(60)]), err.message);
        }
        // A header line far over the limit is not read into memory past it.
        let mut reader = tokio::io::BufReader::new((&b"{\"type\": \"x\", \"pad\": \""[..]).chain(tokio::io::repeat(b'a').take(1 << 20)));
        let err = read_event(&mut reader, BOUNDS).await.err().map(|e| e.code);
        assert_eq!(err, Some("header_too_large"));
        assert!(drain(&mut reader).await.len() >= (1 << 20) - 2048);
    }
}
