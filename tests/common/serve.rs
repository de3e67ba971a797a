//! A `cosy serve` child process on a free loopback port, for the server tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{self, fixture_model, fixture_prompt};

#[path = "http.rs"]
mod http;
pub use http::{parse_reply, Reply};

/// A running server; killed when dropped (a test that fails midway leaves nothing behind).
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// Everything the server wrote on stderr so far.
    pub log: Arc<Mutex<String>>,
}

/// A test's WebSocket client.
pub type Ws = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>;

/// A WebSocket handshake for `request` (a `ws://` URL, or a request with headers) whose reads, the
/// handshake's own included, give up after 60 s (a hang guard: a server that stops answering fails
/// the test instead of hanging CI; `tungstenite::connect` would read the handshake without one).
/// A refused handshake is its error (`tungstenite::Error::Http` with the response).
pub fn ws_handshake(request: impl tungstenite::client::IntoClientRequest) -> Result<(Ws, tungstenite::handshake::client::Response), tungstenite::Error> {
    let request = request.into_client_request()?;
    let host = request.uri().host().unwrap_or("127.0.0.1").to_string();
    let port = request.uri().port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host.as_str(), port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.set_write_timeout(Some(Duration::from_secs(60)))?;
    match tungstenite::client(request, tungstenite::stream::MaybeTlsStream::Plain(stream)) {
        Ok(connected) => Ok(connected),
        Err(tungstenite::HandshakeError::Failure(e)) => Err(e),
        // A blocking socket is "interrupted" only by its read timeout.
        Err(tungstenite::HandshakeError::Interrupted(_)) => {
            Err(tungstenite::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no handshake reply within 60 s")))
        }
    }
}

/// A WebSocket client connected to `url` (reads give up after 60 s: [`ws_handshake`]).
pub fn ws_connect(url: &str) -> (Ws, tungstenite::handshake::client::Response) {
    ws_handshake(url).unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// The tiny model, a voices folder with a default voice "me", and these `--set` pairs.
pub fn start_server(settings: &[&str]) -> Server {
    start_server_with(&fixture_model(), settings)
}

/// [`start_server`] on another model folder.
pub fn start_server_with(model: &Path, settings: &[&str]) -> Server {
    start_server_wrapped(model, settings, |serve, _| serve)
}

/// [`start_server_with`], the `cosy serve` command turned into the one spawned by `wrap` (given
/// it and the server's folder): run in a namespace of its own, say (tests/cli/disk.rs).
pub fn start_server_wrapped(model: &Path, settings: &[&str], wrap: impl FnOnce(std::process::Command, &Path) -> std::process::Command) -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let voices = dir.path().join("voices");
    let gc = dir.path().join("gc");
    let out = common::cosy_command(&gc)
        .args(["--model"])
        .arg(model)
        .args(["--set", &format!("voices.dir={}", voices.display())])
        .args(["voice", "add", "me", "--text", "Hello there, this is a test.", "--default", "--wav"])
        .arg(fixture_prompt())
        .output()
        .expect("cosy voice add");
    assert!(out.status.success(), "voice add: {}", String::from_utf8_lossy(&out.stderr));
    let mut cmd = common::cosy_command(&gc);
    // The server's default local socket in a folder of its own: the `cosy file` a test runs with
    // the same graph cache (`cosy_file`) loads the model itself, to be compared with the server.
    cmd.env("XDG_RUNTIME_DIR", dir.path().join("run"));
    cmd.arg("--model").arg(model).args(["--set", &format!("voices.dir={}", voices.display())]);
    for s in settings {
        cmd.args(["--set", s]);
    }
    cmd.args(["serve", "--bind", "127.0.0.1:0"]);
    let mut child = wrap(cmd, dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cosy serve");
    let stderr = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(String::new()));
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("cosy serve: listening on http://127.0.0.1:") {
                let _ = port_tx.send(rest.trim().parse::<u16>().ok());
            }
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let port = match port_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Some(p)) => p,
        _ => {
            let _ = child.kill();
            panic!("the server did not say where it listens: {}", log.lock().unwrap());
        }
    };
    let server = Server { child, port, dir, log };
    server.wait_ready();
    server
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    /// The OpenAI-style error message (panics when the body is not one).
    pub fn error_message(&self) -> String {
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string() && e["code"].is_string(), "not an error body: {v}");
        e["message"].as_str().unwrap_or_default().to_string()
    }
}

impl Server {
    /// A client-side handle on a running server (for other threads): requests only, no process.
    pub fn probe(port: u16) -> Probe {
        Probe { port }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            if let Ok(r) = self.try_request("GET", "/ready", &[], b"") {
                if r.status == 200 {
                    return;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(120), "not ready in 120 s: {}", self.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn try_request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<Reply> {
        raw_request(self.port, method, path, headers, body)
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        self.try_request(method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Reply {
        self.request("POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
    }
}

/// A raw HTTP/1.1 request (connection closed after it), so that tests control every byte.
pub fn raw_request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<Reply> {
    {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        // A server may answer (413) before it has read a large body; a reset then is fine.
        let _ = stream.write_all(body);
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        parse_reply(&raw).ok_or_else(|| std::io::Error::other(format!("bad reply: {:?}", String::from_utf8_lossy(&raw))))
    }
}

impl Server {
    /// A value from /metrics (`name` with its labels, exactly as written there).
    pub fn metric(&self, name: &str) -> f64 {
        let page = self.request("GET", "/metrics", &[], b"").text();
        page.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// Waits (up to `limit`) until `f` holds.
    pub fn wait_for(&self, what: &str, limit: Duration, f: impl Fn(&Server) -> bool) {
        let started = Instant::now();
        while !f(self) {
            assert!(started.elapsed() < limit, "{what}: not within {limit:?}; log: {}", self.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Resident memory of the server process, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.status_kb("VmRSS:") * 1024
    }

    /// Peak resident memory of the server process so far (VmHWM), in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        self.status_kb("VmHWM:") * 1024
    }

    /// A `kB` field of the server process's /proc status (0 when unreadable).
    fn status_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    }

    /// SIGTERM, then the exit status (within `limit`).
    pub fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(started.elapsed() < limit, "no exit within {limit:?} of SIGTERM: {}", self.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn voices_dir(&self) -> PathBuf {
        self.dir.path().join("voices")
    }
}

/// Requests to a server by port (what client threads hold).
pub struct Probe {
    pub port: u16,
}

impl Probe {
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        raw_request(self.port, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Reply {
        self.request("POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `cosy file` writes for these arguments (same model and voices folder as `server`).
pub fn cosy_file(server: &Server, args: &[&str]) -> Vec<u8> {
    let out_path = server.dir.path().join(format!("file-{}.out", std::process::id() as u64 ^ rand_suffix()));
    let out = common::cosy_command(&server.dir.path().join("gc"))
        .arg("--model")
        .arg(fixture_model())
        .args(["--set", &format!("voices.dir={}", server.voices_dir().display())])
        .arg("file")
        .args(args)
        .arg("-o")
        .arg(&out_path)
        .output()
        .expect("cosy file");
    assert!(out.status.success(), "cosy file {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&out_path).expect("read cosy file output");
    let _ = std::fs::remove_file(&out_path);
    bytes
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// `data:audio/wav;base64,...` of a file.
pub fn data_url(path: &Path) -> String {
    data_url_of(&std::fs::read(path).expect("read audio"))
}

pub fn data_url_of(bytes: &[u8]) -> String {
    format!("data:audio/wav;base64,{}", base64(bytes))
}

/// Standard base64.
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn unbase64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).expect("base64")
}

/// A 16-bit mono wav of `seconds` of a 220 Hz tone at `rate`.
pub fn tone_wav(seconds: f64, rate: u32) -> Vec<u8> {
    let mut cursor = std::io::Cursor::new(Vec::new());
    let spec = hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::new(&mut cursor, spec).expect("wav");
    let n = (seconds * f64::from(rate)) as usize;
    for i in 0..n {
        let x = (i as f64 * 220.0 * std::f64::consts::TAU / f64::from(rate)).sin() * 0.4;
        w.write_sample((x * 32767.0) as i16).expect("sample");
    }
    w.finalize().expect("finalize");
    cursor.into_inner()
}
