//! The client of a running `cosy serve`: `cosy say` and `cosy file` (one text) ask it instead of
//! loading the model themselves (docs/desktop.md, "A warm model behind cosy say").
//!
//! Where to look is `say.server` (`COSY_SERVER`): the per-user socket by default
//! (`cosy::paths::local_socket`, where `cosy serve` listens with `server.socket = "auto"`), a
//! socket path, or `http://HOST:PORT`. The request is the HTTP API's own (`POST
//! /v1/audio/speech`), with `response_format: "pcm_f32"` so the samples arrive exactly as the model
//! made them: the same request gives the same samples with or without the server. HTTP is hyper's
//! client over tokio's `UnixStream` or `TcpStream`, on a runtime of one worker thread that drives
//! the connection while the caller reads the audio blocking (`say` pushes it to the player between
//! reads, so a full player holds the server back through the socket, as it holds the engine back
//! without one).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use futures_util::StreamExt;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;

use crate::serve::settings::ServerChoice;
use cosy::error::{Error, InputCode, Result};

/// How long `find` waits for a server that is still loading its model.
const LOADING_WAIT: Duration = Duration::from_secs(600);
/// The largest error body read from the server.
const ERROR_BODY_LIMIT: usize = 1 << 20;

/// A running server that answered.
pub struct Client {
    address: Address,
    api_key: Option<String>,
    runtime: tokio::runtime::Runtime,
    /// The rate of the samples it sends (`GET /v1/audio/info`).
    pub sample_rate: u32,
}

#[derive(Debug, Clone)]
enum Address {
    Socket(PathBuf),
    /// `HOST:PORT`.
    Http(String),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Socket(path) => write!(f, "{}", path.display()),
            Address::Http(authority) => write!(f, "http://{authority}"),
        }
    }
}

/// Why a request got no answer.
enum NoAnswer {
    /// No connection could be made (no socket file, nobody listening, no permission): no server.
    Absent(String),
    /// A server is there, and said no, or broke off.
    Failed(Error),
}

impl From<Error> for NoAnswer {
    fn from(e: Error) -> Self {
        NoAnswer::Failed(e)
    }
}

/// The server `choice` names, ready (it waits while the server loads its model); `None` when the
/// choice is `off`, or is the default socket and no server listens there. A server named by
/// `say.server` / `COSY_SERVER` that does not answer is an error.
pub fn find(choice: &ServerChoice, api_key: Option<&str>) -> Result<Option<Client>> {
    let (address, named) = match choice {
        ServerChoice::Off => return Ok(None),
        ServerChoice::Auto => (Address::Socket(cosy::paths::local_socket()), false),
        ServerChoice::Socket(path) => (Address::Socket(path.clone()), true),
        ServerChoice::Http(authority) => (Address::Http(authority.clone()), true),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("client")
        .enable_all()
        .build()
        .map_err(|e| Error::Runtime(format!("cannot start the client's runtime: {e}")))?;
    let mut client = Client { address, api_key: api_key.map(str::to_string), runtime, sample_rate: 0 };
    match client.wait_ready() {
        Ok(rate) => {
            client.sample_rate = rate;
            tracing::info!("using the cosy server at {}", client.address);
            Ok(Some(client))
        }
        Err(NoAnswer::Absent(why)) if !named => {
            tracing::info!("no cosy server at {} ({why}): loading the model here", client.address);
            Ok(None)
        }
        Err(NoAnswer::Absent(why)) => Err(Error::Config(format!(
            "say.server (COSY_SERVER) {}: no cosy server answers there ({why}); start `cosy serve`, or use --local",
            client.address
        ))),
        Err(NoAnswer::Failed(e)) => Err(e),
    }
}

/// Whether a server listens on the default socket (or the one `choice` names), without asking it
/// anything: for the note that a flag the server cannot honour makes `say` load the model here.
pub fn listening(choice: &ServerChoice) -> Option<String> {
    match choice {
        ServerChoice::Off => None,
        ServerChoice::Auto => {
            let path = cosy::paths::local_socket();
            std::os::unix::net::UnixStream::connect(&path).ok().map(|_| path.display().to_string())
        }
        ServerChoice::Socket(path) => Some(path.display().to_string()),
        ServerChoice::Http(authority) => Some(format!("http://{authority}")),
    }
}

impl Client {
    /// `GET /v1/audio/info` until the model is loaded: the sample rate.
    fn wait_ready(&self) -> std::result::Result<u32, NoAnswer> {
        let started = Instant::now();
        let mut said = false;
        loop {
            let (status, body) = self.runtime.block_on(async {
                let response = self.send(hyper::Method::GET, "/v1/audio/info", Body::empty()).await?;
                let status = response.status();
                let body = axum::body::to_bytes(Body::new(response.into_body()), ERROR_BODY_LIMIT)
                    .await
                    .map_err(|e| self.broken(format!("reading its answer: {e}")))?;
                Ok::<_, NoAnswer>((status, body))
            })?;
            if status == StatusCode::OK {
                let info: serde_json::Value =
                    serde_json::from_slice(&body).map_err(|e| self.broken(format!("GET /v1/audio/info is not JSON ({e})")))?;
                let rate = info["sample_rate"].as_u64().and_then(|r| u32::try_from(r).ok()).filter(|&r| r > 0);
                return rate.ok_or_else(|| self.broken("GET /v1/audio/info names no sample_rate".into()).into());
            }
            let (code, _) = error_of(&body);
            if status != StatusCode::SERVICE_UNAVAILABLE || code != "loading" || started.elapsed() > LOADING_WAIT {
                return Err(self.refused(status, &body).into());
            }
            if !std::mem::replace(&mut said, true) {
                eprintln!("note: the cosy server at {} is loading its model; waiting for it", self.address);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `POST /v1/audio/speech` with `request` (the API's JSON fields; `response_format` is set
    /// here): the audio as it comes, or the server's refusal as an error.
    pub fn speak(&self, mut request: serde_json::Value) -> Result<Audio<'_>> {
        request["response_format"] = serde_json::Value::from("pcm_f32");
        request["stream_format"] = serde_json::Value::from("sse");
        let body = Body::from(request.to_string());
        let response = self.runtime.block_on(self.send(hyper::Method::POST, "/v1/audio/speech", body)).map_err(|e| match e {
            NoAnswer::Absent(why) => self.broken(why),
            NoAnswer::Failed(e) => e,
        })?;
        let status = response.status();
        let body = Body::new(response.into_body());
        if status != StatusCode::OK {
            let bytes = self.runtime.block_on(axum::body::to_bytes(body, ERROR_BODY_LIMIT)).unwrap_or_default();
            return Err(self.refused(status, &bytes));
        }
        Ok(Audio { client: self, stream: body.into_data_stream(), text: Vec::new(), scanned: 0, events: Default::default(), done: false })
    }

    /// One request on a new connection (the socket is local: a connection costs next to nothing).
    async fn send(&self, method: hyper::Method, path: &str, body: Body) -> std::result::Result<hyper::Response<hyper::body::Incoming>, NoAnswer> {
        // Whatever stops the connection (no file, nobody listening, not ours to use), no server
        // answers there: the default socket then means "load the model here".
        let absent = |e: std::io::Error| NoAnswer::Absent(e.to_string());
        let (host, sender) = match &self.address {
            Address::Socket(path) => ("localhost".to_string(), self.handshake(tokio::net::UnixStream::connect(path).await.map_err(absent)?).await?),
            Address::Http(authority) => (authority.clone(), self.handshake(tokio::net::TcpStream::connect(authority).await.map_err(absent)?).await?),
        };
        let mut sender = sender;
        let mut request = hyper::Request::builder().method(method).uri(path).header(HOST, host).header(CONTENT_TYPE, "application/json");
        if let Some(key) = &self.api_key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request.body(body).map_err(|e| self.broken(format!("the request: {e}")))?;
        Ok(sender.send_request(request).await.map_err(|e| self.broken(format!("no answer ({e})")))?)
    }

    /// An HTTP/1 connection over `io`, driven on the runtime's worker.
    async fn handshake<T>(&self, io: T) -> std::result::Result<hyper::client::conn::http1::SendRequest<Body>, NoAnswer>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| self.broken(format!("no HTTP ({e})")))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection to the cosy server ended: {e}");
            }
        });
        Ok(sender)
    }

    /// The server's refusal (its OpenAI-style error body) as the library's error of that kind.
    fn refused(&self, status: StatusCode, body: &[u8]) -> Error {
        let (code, message) = error_of(body);
        let message = if message.is_empty() { format!("HTTP {status}") } else { message };
        match status {
            StatusCode::UNAUTHORIZED => Error::Config(format!(
                "the cosy server at {} wants its API key: set server.api_key (COSY_API_KEY) to it, or use --local",
                self.address
            )),
            StatusCode::TOO_MANY_REQUESTS => Error::Busy(format!("the cosy server at {}: {message}", self.address)),
            s if s.is_client_error() => Error::input(input_code(&code), None, message),
            _ => self.broken(message),
        }
    }

    fn broken(&self, why: String) -> Error {
        Error::Runtime(format!("the cosy server at {}: {why}", self.address))
    }
}

/// The `code` and `message` of an OpenAI-style error body (empty when it is not one).
fn error_of(body: &[u8]) -> (String, String) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |k: &str| v["error"][k].as_str().unwrap_or_default().to_string();
    (text("code"), text("message"))
}

/// The library's kind of input mistake for an API error code (`InputCode::as_str` backwards).
fn input_code(code: &str) -> InputCode {
    const KINDS: [InputCode; 12] = [
        InputCode::InvalidText,
        InputCode::TextTooLong,
        InputCode::InvalidSpeed,
        InputCode::Conflict,
        InputCode::MissingRecording,
        InputCode::InvalidAudio,
        InputCode::InvalidVoiceName,
        InputCode::VoiceNotFound,
        InputCode::VoiceExists,
        InputCode::InvalidVoice,
        InputCode::TestHooksDisabled,
        InputCode::Invalid,
    ];
    KINDS.into_iter().find(|k| k.as_str() == code).unwrap_or(InputCode::Invalid)
}

/// What a running server says of one request, as it comes.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// Samples (f32 at the server's rate), one synthesised chunk as the server made it.
    Samples(Vec<f32>),
    /// The sentence under way ends here: this many samples from the start ([`cosy::app::buffering`]
    /// buffers whole sentences when synthesis is slow).
    SentenceEnd(u64),
}

/// The audio of one request, read as it comes: the server's event stream (`stream_format: "sse"`)
/// of `pcm_f32` deltas, so that each chunk arrives as the server made it (a byte stream would hand
/// the player pieces of a few kilobytes, and the buffering rule would measure those) and sentence
/// ends come with the audio.
pub struct Audio<'a> {
    client: &'a Client,
    stream: axum::body::BodyDataStream,
    /// Event-stream text not yet ended by a blank line.
    text: Vec<u8>,
    /// How far into [`Self::text`] no blank line starts: the next search starts there, so an event
    /// arriving in many transport pieces is scanned once, not once per piece.
    scanned: usize,
    /// Events read, not yet handed out.
    events: std::collections::VecDeque<ServerEvent>,
    /// `speech.audio.done` was read.
    done: bool,
}

/// The longest one event may be (a delta holds one chunk of base64 audio, about 130 KB for a
/// second): past it the answer is not one of ours and reading stops, not memory.
const MAX_EVENT_BYTES: usize = 16 << 20;

impl Audio<'_> {
    /// The next samples (`None` at the end), sentence ends skipped. An answer broken off midway is
    /// an error: the server ends the stream with an error event when the synthesis fails after
    /// its first audio.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<f32>>> {
        loop {
            match self.next_event()? {
                Some(ServerEvent::Samples(samples)) => return Ok(Some(samples)),
                Some(ServerEvent::SentenceEnd(_)) => continue,
                None => return Ok(None),
            }
        }
    }

    /// The next thing the server said (`None` after `speech.audio.done`).
    pub fn next_event(&mut self) -> Result<Option<ServerEvent>> {
        loop {
            if let Some(event) = self.events.pop_front() {
                return Ok(Some(event));
            }
            if self.done {
                return Ok(None);
            }
            let piece: Option<std::result::Result<Bytes, axum::Error>> = self.client.runtime.block_on(self.stream.next());
            match piece {
                None => return Err(self.client.broken("the stream ended before its last event".into())),
                Some(Err(e)) => return Err(self.client.broken(format!("the audio stopped midway ({e})"))),
                Some(Ok(bytes)) => self.text.extend_from_slice(&bytes),
            }
            while let Some(end) = self.text[self.scanned..].windows(2).position(|w| w == b"\n\n").map(|i| i + self.scanned) {
                let event: Vec<u8> = self.text.drain(..end + 2).collect();
                self.scanned = 0;
                self.read_event(&event[..end])?;
            }
            // The last byte may be the first of a blank line's two: the next search starts at it.
            self.scanned = self.text.len().saturating_sub(1);
            if self.text.len() > MAX_EVENT_BYTES {
                return Err(self.client.broken(format!("an event longer than {MAX_EVENT_BYTES} bytes")));
            }
        }
    }

    /// One event's `data:` line, into [`Self::events`].
    fn read_event(&mut self, event: &[u8]) -> Result<()> {
        let Some(data) = event.split(|&b| b == b'\n').find_map(|line| line.strip_prefix(b"data:")) else {
            return Ok(());
        };
        let value: serde_json::Value =
            serde_json::from_slice(data).map_err(|e| self.client.broken(format!("an event that is not JSON ({e})")))?;
        match value["type"].as_str() {
            Some("speech.audio.delta") => {
                let audio = value["audio"].as_str().unwrap_or_default();
                if !audio.is_empty() {
                    use base64::Engine as _;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(audio)
                        .map_err(|e| self.client.broken(format!("audio that is not base64 ({e})")))?;
                    if bytes.len() % 4 != 0 {
                        return Err(self.client.broken("a delta that ends inside a sample".into()));
                    }
                    let samples = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                    self.events.push_back(ServerEvent::Samples(samples));
                }
                if let Some(end) = value["sentence_end"].as_u64() {
                    self.events.push_back(ServerEvent::SentenceEnd(end));
                }
            }
            Some("speech.audio.done") => self.done = true,
            Some("error") => {
                let message = value["error"]["message"].as_str().unwrap_or("an error with no message");
                return Err(self.client.broken(format!("the synthesis failed midway: {message}")));
            }
            _ => {}
        }
        Ok(())
    }
}
