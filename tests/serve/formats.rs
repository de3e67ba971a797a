//! Response formats, streaming by default and speed, end to end: every format decodes with
//! ffmpeg to about the length of the same request's pcm; a streamed response's first bytes leave
//! while the request is still running; a speed other than 1 streams sentence by sentence.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::serve::{cosy_file, start_server, unbase64, Server};

const TEXT: &str = "Hello world, how are you today? The weather is fine.";
const RATE: f64 = 24_000.0;

/// ffmpeg's decoding of `bytes` (`input_args` name a raw format): its stderr at `-v error` must
/// be empty, and the samples (s16le, 24 kHz mono) come back. A hang guard kills it after 60 s.
fn ffmpeg_decode(bytes: &[u8], input_args: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("in");
    std::fs::write(&input, bytes).expect("write");
    let output = dir.path().join("out.raw");
    let mut child = Command::new("ffmpeg")
        .args(["-nostdin", "-v", "error"])
        .args(input_args)
        .arg("-i")
        .arg(&input)
        .args(["-f", "s16le", "-ac", "1", "-ar", "24000", "-y"])
        .arg(&output)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("ffmpeg cannot run ({e}): scripts/setup.sh installs it (apt-get install ffmpeg)"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("ffmpeg did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut errors = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut errors).expect("stderr");
    assert!(status.success() && errors.trim().is_empty(), "ffmpeg: {status}: {errors}");
    std::fs::read(&output).expect("decoded")
}

fn speech(server: &Server, body: serde_json::Value) -> crate::serve::Reply {
    let r = server.post_json("/v1/audio/speech", &body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r
}

#[test]
fn every_format_decodes_with_ffmpeg_whole_and_streamed() {
    let server = start_server(&[]);
    let base = json!({"input": TEXT, "voice": "me", "seed": 3});
    let with = |extra: serde_json::Value| {
        let mut b = base.clone();
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    // The reference lengths: the same samples as pcm, streamed (the streaming schedule) and whole.
    let pcm_streamed = speech(&server, with(json!({"response_format": "pcm"}))).body.len() / 2;
    let pcm_whole = speech(&server, with(json!({"response_format": "pcm", "stream": false}))).body.len() / 2;
    assert!(pcm_streamed > 0 && pcm_whole > 0);

    // mp3 is the default, streamed.
    let r = speech(&server, base.clone());
    assert_eq!(r.header("content-type"), Some("audio/mpeg"));
    assert_eq!(r.header("x-cosy-stream"), Some("chunks"));
    assert!(r.header("transfer-encoding").is_some_and(|v| v.contains("chunked")), "{:?}", r.headers);

    let cases = [
        ("mp3", "audio/mpeg"),
        ("opus", "audio/opus"),
        ("wav", "audio/wav"),
        ("flac", "audio/flac"),
        ("pcm", "audio/pcm"),
    ];
    for (format, content_type) in cases {
        for stream in [true, false] {
            let r = speech(&server, with(json!({"response_format": format, "stream": stream})));
            let what = format!("{format} (stream {stream})");
            assert_eq!(r.header("content-type"), Some(content_type), "{what}");
            let raw: &[&str] = if format == "pcm" { &["-f", "s16le", "-ar", "24000", "-ac", "1"] } else { &[] };
            let decoded = ffmpeg_decode(&r.body, raw).len() / 2;
            let want = if stream { pcm_streamed } else { pcm_whole };
            eprintln!("{what}: {} bytes, ffmpeg decoded {decoded} samples, the pcm has {want}", r.body.len());
            // mp3 streamed carries the encoder's delay and the last frame's padding (no Info tag
            // can be written before the end): up to ~0.1 s more. A whole mp3 (its Info tag) and
            // Ogg Opus (pre-skip, end trimming) give the length, to ffmpeg's resampling; the
            // lossless formats are exact.
            let (less, more) = match (format, stream) {
                ("mp3", true) => (0, 2400),
                ("mp3", false) | ("opus", _) => (16, 16),
                _ => (0, 0),
            };
            assert!(
                decoded + less >= want && decoded <= want + more,
                "{what}: ffmpeg decoded {decoded} samples ({:.3} s), the pcm has {want} ({:.3} s)",
                decoded as f64 / RATE,
                want as f64 / RATE
            );
        }
    }
    // The Ogg Opus stream: OpusHead first, and the page that ends the stream.
    let r = speech(&server, with(json!({"response_format": "opus"})));
    assert_eq!(&r.body[..4], b"OggS");
    assert_eq!(&r.body[28..36], b"OpusHead");

    // server.default_format changes the default.
    let server = start_server(&["server.default_format=wav"]);
    let r = speech(&server, json!({"input": TEXT, "voice": "me", "seed": 3, "stream": false}));
    assert_eq!(r.header("content-type"), Some("audio/wav"));
    assert!(r.body == cosy_file(&server, &[TEXT, "--voice", "me", "--seed", "3"]), "stream:false wav = `cosy file`");
}

/// Reads the response to `body` until its first audio bytes (a chunked body's first non-empty
/// chunk; for SSE, the first delta event); returns the head and those bytes.
fn first_bytes(port: u16, body: &serde_json::Value) -> (TcpStream, String, Vec<u8>) {
    let body = body.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("read timeout");
    write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .expect("send");
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = s.read(&mut buf).expect("read (the server held the request without sending its first audio?)");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&raw[..end]).to_string();
        let rest = &raw[end + 4..];
        // The first chunk: "SIZE\r\nDATA\r\n".
        let Some(line) = rest.windows(2).position(|w| w == b"\r\n") else { continue };
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line]).expect("chunk size").trim(), 16).expect("chunk size");
        if rest.len() >= line + 2 + size {
            return (s, head, rest[line + 2..line + 2 + size].to_vec());
        }
    }
}

/// A streamed response's first bytes arrive while its request is still running: the test hook
/// holds the request after its first audio until the client hangs up, so bytes that arrive at
/// all left before synthesis ended. No `stream` field: streaming is the default.
#[test]
fn streamed_bytes_arrive_before_the_synthesis_ends() {
    let server = start_server(&["debug.test_hooks=true"]);
    let hold = json!({"hold_after_first_audio": true, "min_tokens": 60});
    for format in ["mp3", "opus", "flac", "wav", "pcm"] {
        let body = json!({"input": TEXT, "voice": "me", "response_format": format, "cosy_test": hold});
        let (conn, head, bytes) = first_bytes(server.port, &body);
        assert!(head.starts_with("HTTP/1.1 200"), "{format}: {head}");
        assert!(head.to_ascii_lowercase().contains("x-cosy-stream: chunks"), "{format}: {head}");
        let magic: &[u8] = match format {
            "mp3" => &[0xFF],
            "opus" => b"OggS",
            "flac" => b"fLaC",
            "wav" => b"RIFF",
            _ => b"",
        };
        assert!(!bytes.is_empty() && bytes.starts_with(magic), "{format}: first bytes {:?}", &bytes[..bytes.len().min(8)]);
        // The request is still held (in flight) while the client holds these bytes.
        assert_eq!(server.metric("cosy_requests_in_flight"), 1.0, "{format}");
        drop(conn);
        server.wait_for("hung up", Duration::from_secs(30), |s| s.metric("cosy_requests_in_flight") == 0.0);
    }
    // Server-sent events: the first delta before the end.
    let body = json!({"input": TEXT, "voice": "me", "response_format": "mp3", "stream_format": "sse", "cosy_test": hold});
    let (conn, head, bytes) = first_bytes(server.port, &body);
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
    let event = String::from_utf8_lossy(&bytes);
    assert!(event.starts_with("data: ") && event.contains("speech.audio.delta"), "{event}");
    assert_eq!(server.metric("cosy_requests_in_flight"), 1.0);
    drop(conn);
    server.wait_for("hung up", Duration::from_secs(30), |s| s.metric("cosy_requests_in_flight") == 0.0);
}

/// OpenAI's speed range is accepted: 0.25 and 4.0 are brought to cosy's 0.5 and 2.0 (headers say
/// so); a speed other than 1 on a streamed response is made sentence by sentence, as
/// `cosy file --speed` makes it, and sent a sentence at a time.
#[test]
fn speed_streams_sentence_by_sentence_and_openai_extremes_are_clamped() {
    let server = start_server(&[]);
    let r = speech(&server, json!({"input": TEXT, "voice": "me", "seed": 3, "speed": 1.5, "response_format": "pcm"}));
    assert_eq!(r.header("x-cosy-stream"), Some("sentences"));
    assert!(r.header("transfer-encoding").is_some_and(|v| v.contains("chunked")), "{:?}", r.headers);
    assert_eq!(r.header("x-cosy-speed"), None, "1.5 is in cosy's range");
    let file = cosy_file(&server, &[TEXT, "--voice", "me", "--seed", "3", "--speed", "1.5", "--format", "pcm"]);
    assert!(r.body == file, "speed 1.5 streamed = `cosy file --speed 1.5` ({} vs {} bytes)", r.body.len(), file.len());

    for (asked, used) in [(4.0, "2"), (0.25, "0.5")] {
        let r = speech(&server, json!({"input": TEXT, "voice": "me", "seed": 3, "speed": asked, "response_format": "pcm", "stream": false}));
        assert_eq!(r.header("x-cosy-speed"), Some(used), "{asked}");
        assert_eq!(r.header("x-cosy-speed-requested"), Some(asked.to_string().as_str()));
        let file = cosy_file(&server, &[TEXT, "--voice", "me", "--seed", "3", "--speed", used, "--format", "pcm"]);
        assert!(r.body == file, "speed {asked} = `cosy file --speed {used}`");
    }
    // SSE with a speed: sentences too, and the usage at the end.
    let r = speech(&server, json!({"input": TEXT, "voice": "me", "seed": 3, "speed": 0.8, "response_format": "pcm", "stream_format": "sse"}));
    assert_eq!(r.header("x-cosy-stream"), Some("sentences"));
    let events: Vec<serde_json::Value> =
        r.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(|d| serde_json::from_str(d).expect("event")).collect();
    let (done, deltas) = events.split_last().expect("events");
    assert_eq!(done["type"], "speech.audio.done", "{done}");
    let pcm: Vec<u8> = deltas.iter().flat_map(|d| unbase64(d["audio"].as_str().expect("audio"))).collect();
    let file = cosy_file(&server, &[TEXT, "--voice", "me", "--seed", "3", "--speed", "0.8", "--format", "pcm"]);
    assert!(pcm == file, "SSE at speed 0.8 = `cosy file --speed 0.8`");
}
