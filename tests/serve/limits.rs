//! `cosy serve` under pressure: overload answered 429 with Retry-After, a client that hangs up
//! cancels its work and frees its slot, SIGTERM drains the work in flight, and a soak of a few
//! hundred requests (bad ones mixed in) ends with nothing stuck and memory bounded; slow request
//! heads are cut off and open connections are bounded.
//!
//! Nothing here depends on how long a synthesis takes: a request that must still be running is
//! held by the server's test hook (`cosy_test.hold_after_first_audio`, accepted because these
//! servers run with `debug.test_hooks=true`) until its client hangs up or the server cuts it; a
//! request that must be in flight is one whose first audio the client has read.


use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use crate::serve::{start_server, Server};

/// The settings of a server whose requests may use test hooks, plus `extra`.
fn with_hooks<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["debug.test_hooks=true"];
    v.extend_from_slice(extra);
    v
}

/// Sends a streaming request held by the test hook after its first audio, and reads its response
/// head and first body bytes; returns the open connection (the request holds its slot until the
/// connection is dropped, or the server cuts it).
fn open_stream(port: u16, text: &str) -> TcpStream {
    let body = json!({"input": text, "voice": "me", "stream": true, "response_format": "pcm",
        "cosy_test": {"hold_after_first_audio": true}})
    .to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = [0u8; 512];
    let n = s.read(&mut head).expect("first bytes");
    let text = String::from_utf8_lossy(&head[..n]);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    s
}

#[test]
fn overload_gets_429_and_a_disconnect_frees_the_slot() {
    let server = start_server(&with_hooks(&["engine.max_in_flight=1", "engine.max_queue=0", "server.retry_after_s=2"]));
    let busy = open_stream(server.port, "Held after its first audio.");
    assert_eq!(server.metric("cosy_requests_in_flight"), 1.0);
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "me"}));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("2"));
    assert!(r.error_message().contains("engine.max_in_flight"), "{}", r.error_message());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    // The client hangs up: its request is cancelled and the slot frees (a held request frees
    // only that way).
    let hung_up = Instant::now();
    drop(busy);
    server.wait_for("slot freed", Duration::from_secs(60), |s| s.metric("cosy_requests_in_flight") == 0.0);
    assert!(server.metric("cosy_requests_cancelled_total") >= 1.0);
    let freed_after = hung_up.elapsed();
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "me"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(server.metric("cosy_requests_rejected_total") >= 1.0);
    eprintln!("slot freed {freed_after:?} after the hang-up");

    // A queue of one: the second request waits for the slot instead of being refused. (The old
    // names of the two limits still work.)
    let server = start_server(&with_hooks(&["server.max_concurrent=1", "server.max_queue=1"]));
    assert!(server.log.lock().unwrap().contains("server.max_concurrent is deprecated"), "a warning names the new key");
    let busy = open_stream(server.port, "Held after its first audio.");
    let waiter = {
        let port = server.port;
        std::thread::spawn(move || {
            let body = json!({"input": "Hi.", "voice": "me"}).to_string();
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            // A hang guard: the queued request runs once the held one is dropped.
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            crate::serve::parse_reply(&raw).expect("reply").status
        })
    };
    server.wait_for("one queued", Duration::from_secs(60), |s| s.metric("cosy_queue_depth") == 1.0);
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "me"}));
    assert_eq!(r.status, 429, "slots and queue full");
    drop(busy);
    assert_eq!(waiter.join().unwrap(), 200, "the queued request ran once the slot freed");
}

#[test]
fn sigterm_drains_the_work_in_flight() {
    let mut server = start_server(&with_hooks(&["server.shutdown_grace_s=60"]));
    let port = server.port;
    // A streamed request of 300 forced tokens: once its first audio is read it is in flight,
    // and it ends by itself (whether before or after the signal, it must end whole).
    let body = json!({"input": "Drained, not cut.", "voice": "me", "stream": true, "response_format": "pcm",
        "cosy_test": {"min_tokens": 300}})
    .to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(s, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut raw = vec![0u8; 512];
    let n = s.read(&mut raw).expect("first bytes");
    raw.truncate(n);
    assert!(raw.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&raw));
    let runner = std::thread::spawn(move || {
        s.read_to_end(&mut raw).expect("the rest of the reply");
        crate::serve::parse_reply(&raw).expect("reply")
    });
    let status = server.terminate(Duration::from_secs(120));
    let reply = runner.join().unwrap();
    assert_eq!(reply.status, 200, "the request in flight finished: {}", reply.text());
    // 300 tokens at 25 per second: 12 s of 16-bit audio (the last chunk of a chunked body is there).
    assert!(reply.body.len() >= 24_000 * 2 * 10, "and it is whole ({} bytes)", reply.body.len());
    assert!(status.success(), "exit status after a clean drain: {status:?}; log: {}", server.log.lock().unwrap());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "no longer accepting");
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("shutting down") && log.contains("stopped"), "{log}");
}

#[test]
fn sigterm_with_a_short_grace_stops_and_says_so() {
    let mut server = start_server(&with_hooks(&["server.shutdown_grace_s=1"]));
    // Held: still running when the grace period ends, whatever the machine.
    let mut busy = open_stream(server.port, "Held until the server cuts it.");
    // The 30 s limit only keeps a broken shutdown from hanging the test.
    let status = server.terminate(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "work was cut short: exit 1");
    assert!(server.log.lock().unwrap().contains("still running after server.shutdown_grace_s"));
    // The request in flight was cut, not finished: its chunked body never got its last chunk.
    let mut rest = Vec::new();
    let _ = busy.read_to_end(&mut rest);
    assert!(!rest.ends_with(b"0\r\n\r\n"), "the cut request did not end as complete");
}

/// A few hundred requests from several clients, a third of them bad, some hung up midway: at the
/// end nothing is in flight or queued, every good request got its audio, and the server's
/// resident memory grew by less than 200 MiB over the soak (the bound this test states; a
/// leak of one prompt recording or response per request would exceed it).
#[test]
fn soak_ends_with_nothing_stuck_and_memory_bounded() {
    let server = start_server(&with_hooks(&["engine.max_in_flight=4", "engine.max_queue=64"]));
    // Warm the allocator with a few requests of each kind before measuring.
    for _ in 0..3 {
        assert_eq!(server.post_json("/v1/audio/speech", &json!({"input": "Hello there.", "voice": "me"})).status, 200);
    }
    let rss_start = server.rss_bytes();
    let prompt = crate::serve::data_url(&crate::common::fixture_prompt());
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 75;
    let port = server.port;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let prompt = prompt.clone();
            std::thread::spawn(move || {
                let probe = Server::probe(port);
                let mut outcome = (0usize, 0usize, 0usize); // (good ok, bad refused, hung up)
                for i in 0..PER_CLIENT {
                    let n = c * PER_CLIENT + i;
                    match n % 6 {
                        0 | 2 => {
                            let r = probe.post_json("/v1/audio/speech", &json!({"input": "Hello there.", "voice": "me", "seed": n % 2}));
                            assert_eq!(r.status, 200, "{}", r.text());
                            assert!(r.body.len() > 44);
                            outcome.0 += 1;
                        }
                        1 => {
                            let r = probe.post_json("/v1/audio/speech", &json!({"input": "Cloned.", "ref_audio": prompt, "ref_text": "Hello there, this is a test.", "stream": true, "response_format": "pcm"}));
                            assert_eq!(r.status, 200, "{}", r.text());
                            outcome.0 += 1;
                        }
                        3 => {
                            let r = probe.request("POST", "/v1/audio/speech", &[("Content-Type", "application/json")], b"{\"input\": 1");
                            assert_eq!(r.status, 400);
                            outcome.1 += 1;
                        }
                        4 => {
                            let r = probe.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "ghost"}));
                            assert_eq!(r.status, 404);
                            outcome.1 += 1;
                        }
                        _ => {
                            drop(open_stream(port, "This one is hung up after its first audio, on purpose."));
                            outcome.2 += 1;
                        }
                    }
                }
                outcome
            })
        })
        .collect();
    let mut total = (0, 0, 0);
    for t in threads {
        let o = t.join().expect("client thread");
        total = (total.0 + o.0, total.1 + o.1, total.2 + o.2);
    }
    assert_eq!(total.0 + total.1 + total.2, CLIENTS * PER_CLIENT);
    server.wait_for("nothing in flight", Duration::from_secs(30), |s| {
        s.metric("cosy_requests_in_flight") == 0.0 && s.metric("cosy_queue_depth") == 0.0
    });
    let rss_end = server.rss_bytes();
    let grew = rss_end.saturating_sub(rss_start);
    eprintln!("soak: {total:?} (good, bad, hung up); RSS {} → {} MiB", rss_start >> 20, rss_end >> 20);
    assert!(grew < 200 << 20, "RSS grew by {} MiB over the soak", grew >> 20);
    // Still serving.
    assert_eq!(server.post_json("/v1/audio/speech", &json!({"input": "Still here.", "voice": "me"})).status, 200);
}

#[test]
fn a_request_past_its_timeout_gets_503_and_frees_its_slot() {
    // One slot and no queue: a slot the timed-out request kept would refuse the next one (429).
    let server = start_server(&with_hooks(&["server.request_timeout_s=1", "engine.max_in_flight=1", "engine.max_queue=0"]));
    // Held after its first audio: past the deadline whatever the machine.
    // A whole file (`stream: false`), so that the status waits for the end.
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Held.", "voice": "me", "stream": false, "cosy_test": {"hold_after_first_audio": true}}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.error_message().contains("server.request_timeout_s"));
    assert_eq!(r.json()["error"]["code"], "timeout");
    server.wait_for("slot freed", Duration::from_secs(60), |s| s.metric("cosy_requests_in_flight") == 0.0);
    assert!(server.metric("cosy_requests_timed_out_total") >= 1.0);
    assert_eq!(server.metric("cosy_requests_cancelled_total"), 0.0, "a timeout is not a hang-up");
    // The slot was given back: the next request is admitted and runs. Whether it also ends within
    // the 1 s deadline depends on the machine's load (a busy CI machine can take longer to
    // synthesise it), so a timeout of its own counts as run too; only a refusal would not.
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "me", "stream": false, "response_format": "pcm"}));
    assert_ne!(r.status, 429, "the timed-out request kept its slot: {}", r.text());
    assert!(r.status == 200 || (r.status == 503 && r.json()["error"]["code"] == "timeout"), "{}: {}", r.status, r.text());
}

/// A client that sends half a request head and then nothing (a slowloris), or connects and says
/// nothing, is disconnected after `server.header_timeout_s`; with `server.max_connections` open,
/// the next client waits until one closes and is then served.
#[test]
fn slow_request_heads_are_cut_off_and_connections_are_bounded() {
    let server = start_server(&["server.header_timeout_s=1", "server.max_connections=2"]);
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    };
    let mut slow = connect();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut silent = connect();
    // Both slots are taken: this request is accepted only once the server has closed one of them.
    let health = server.request("GET", "/health", &[], b"");
    assert_eq!(health.status, 200);
    // So by now at least one of them is already closed: its end is there without waiting.
    let closed_now = |s: &mut TcpStream| {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        let closed = matches!(s.read(&mut buf), Ok(0));
        s.set_nonblocking(false).unwrap();
        closed
    };
    assert!(closed_now(&mut slow) || closed_now(&mut silent), "the third connection was served while both first ones were open");
    // And both end (the 30 s read limit only guards against a hang: a timeout is an error).
    for (what, s) in [("half a request head", &mut slow), ("a silent connection", &mut silent)] {
        let mut rest = Vec::new();
        let read = s.read_to_end(&mut rest);
        assert!(read.is_ok(), "{what}: the server did not close it: {read:?}");
        assert!(rest.is_empty(), "{what}: no response to an unfinished request: {:?}", String::from_utf8_lossy(&rest));
    }
    // Those closed connections are counted out again (the metrics request is the one open now).
    server.wait_for("connections closed", Duration::from_secs(60), |s| s.metric("cosy_open_connections") == 1.0);
}

/// A WebSocket session keeps its connection's slot until it ends (not only until the upgrade), so
/// `server.max_connections` bounds idle sessions too.
#[test]
fn a_websocket_session_counts_as_a_connection_until_it_ends() {
    let server = start_server(&["server.max_connections=2"]);
    let (mut ws, _) =
        crate::serve::ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
    // The session and the metrics request itself.
    assert_eq!(server.metric("cosy_open_connections"), 2.0);
    ws.close(None).expect("close");
    while ws.read().is_ok() {}
    server.wait_for("the session's slot freed", Duration::from_secs(60), |s| s.metric("cosy_open_connections") == 1.0);
}

/// A client that stops reading what the server writes, and keeps its connection open, is cut
/// off after `server.send_timeout_s` (a stalled streaming response would otherwise hold its
/// synthesis slot for as long as the client likes; `listen::SendTimeout`'s unit tests show the
/// mechanism, the disconnect tests above that a closed connection cancels its request). Cheap way
/// to fill both socket buffers: pipelined requests whose responses are never read.
#[test]
fn a_client_that_stops_reading_is_disconnected() {
    // A long header timeout, so that only the send timeout can end this connection.
    let server = start_server(&["server.send_timeout_s=1", "server.header_timeout_s=600"]);
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], server.port)).into()).expect("connect");
    let mut client: TcpStream = socket.into();
    let mut writer = client.try_clone().unwrap();
    // Requests until the server stops taking them (it closed the connection) or many megabytes of
    // responses are owed; the client reads none of them for now.
    let sender = std::thread::spawn(move || {
        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        for _ in 0..20_000 {
            if writer.write_all(request).is_err() {
                break;
            }
        }
    });
    // The server, owed more than both socket buffers hold, waits `server.send_timeout_s` and then
    // cuts the connection off, which it counts: waited for as that event, not as a time (the
    // bound only guards against a hang).
    server.wait_for("the stalled client cut off", Duration::from_secs(120), |s| s.metric("cosy_send_timeouts_total") >= 1.0);
    // The server has given up on this client: the connection ends (a reset is fine: the server
    // closed it with requests still unread). Without the limit it would still be open, and
    // this read would run into its own 30 s limit.
    client.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let read = client.read_to_end(&mut got);
    assert!(
        !matches!(&read, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the connection stayed open: {read:?} after {} bytes",
        got.len()
    );
    sender.join().unwrap();
    assert_eq!(server.request("GET", "/health", &[], b"").status, 200, "the server serves on");
}
