//! The web page (issue 21): `GET /` and its assets from the binary, with a strict policy; the
//! per-request `timing` the page shows (SSE `speech.audio.done`, the WebSocket's `audio.done`);
//! making a voice the default over HTTP; the page's own WebSocket let in as same-origin; the
//! sample rate and limits the page takes from `GET /v1/audio/info`;
//! `server.web_ui = false`. The page itself is driven in Chromium by
//! tests/clients/python/test_web_page.py.


use serde_json::json;
use tungstenite::client::IntoClientRequest;
use tungstenite::Message;

use crate::serve::{data_url, start_server, Server};

const TEXT: &str = "Hello world, how are you today? The weather is fine.";

use crate::serve::Ws;

fn ws_from(server: &Server, origin: &str) -> Result<Ws, tungstenite::Error> {
    let mut request = format!("ws://127.0.0.1:{}/v1/audio/speech/stream", server.port).into_client_request().expect("request");
    request.headers_mut().insert("Origin", origin.parse().expect("origin"));
    let (ws, _) = crate::serve::ws_handshake(request)?;
    Ok(ws)
}

fn check_timing(t: &serde_json::Value) {
    for key in ["queue_s", "frontend_s", "llm_s", "flow_s", "hift_s", "first_audio_s", "total_s", "rtf"] {
        assert!(t[key].as_f64().is_some_and(|v| v >= 0.0), "{key} in {t}");
    }
    // Each stage ran (the queue may be empty), and the first audio came before the end.
    for key in ["frontend_s", "llm_s", "flow_s", "hift_s"] {
        assert!(t[key].as_f64().unwrap_or_default() > 0.0, "{key} in {t}");
    }
    assert!(t["first_audio_s"].as_f64() <= t["total_s"].as_f64(), "{t}");
    assert!(t["rtf"].as_f64().unwrap_or_default() > 0.0, "{t}");
}

#[test]
fn the_page_is_served_from_the_binary_with_a_strict_policy() {
    let server = start_server(&["server.cors_origins=none"]);
    let r = server.request("GET", "/", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r.header("content-security-policy").expect("a CSP").to_string();
    for part in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(part), "{part} in {csp}");
    }
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let html = r.text();
    // Only the server's own assets, no inline script, no other host.
    assert!(html.contains(r#"src="/web/app.js""#) && html.contains(r#"src="/web/buffering.js""#), "{html}");
    assert!(!html.contains("<script>") && !html.contains("http"), "{html}");
    for (path, ct) in
        [("/web/app.js", "text/javascript"), ("/web/buffering.js", "text/javascript"), ("/web/style.css", "text/css"), ("/web/icon.svg", "image/svg+xml")]
    {
        let r = server.request("GET", path, &[], b"");
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-type").is_some_and(|v| v.starts_with(ct)), "{path}: {:?}", r.header("content-type"));
        assert!(r.header("content-security-policy").is_some(), "{path}");
    }
    let r = server.request("GET", "/web/../config.toml", &[], b"");
    assert_eq!(r.status, 404);
    let r = server.request("GET", "/web/nothing.js", &[], b"");
    assert_eq!(r.status, 404);
    assert!(r.error_message().contains("GET /"), "the 404 names the page: {}", r.text());

    // The per-request timing at the end of the event stream.
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "me", "stream_format": "sse", "response_format": "pcm"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let done: serde_json::Value = r
        .text()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("event JSON"))
        .last()
        .expect("events");
    assert_eq!(done["type"], "speech.audio.done");
    check_timing(&done["timing"]);

    // The page's own WebSocket (same origin) is let in although no other page is; another
    // origin is not. Its audio.done carries the segment's timing too.
    let own = format!("http://127.0.0.1:{}", server.port);
    let mut ws = ws_from(&server, &own).expect("the page's own origin");
    match ws_from(&server, "http://127.0.0.1:1") {
        Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 403),
        other => panic!("another origin: {:?}", other.map(|_| ())),
    }
    for m in [json!({"type": "session.config", "voice": "me", "text_streaming": "sentences"}), json!({"type": "input.text", "text": TEXT}), json!({"type": "input.done"})] {
        ws.send(Message::text(m.to_string())).expect("send");
    }
    let mut timings = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("JSON");
                assert_ne!(v["type"], "error", "{v}");
                if v["type"] == "audio.done" {
                    timings.push(v["timing"].clone());
                }
                if v["type"] == "session.done" {
                    break;
                }
            }
            Message::Close(_) => panic!("closed before session.done"),
            _ => {}
        }
    }
    assert!(!timings.is_empty());
    timings.iter().for_each(check_timing);
}

#[test]
fn the_page_takes_the_sample_rate_and_the_limits_from_the_server() {
    let server = start_server(&["server.api_key=s3cret-key", "server.public_listings=true", "limits.max_text_chars=1234"]);
    let key = ("Authorization", "Bearer s3cret-key");
    // Behind the key, as the rest of the API (it is not one of the public listings).
    let r = server.request("GET", "/v1/audio/info", &[], b"");
    assert_eq!(r.status, 401, "{}", r.text());
    let r = server.request("GET", "/v1/audio/info", &[key], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let info = r.json();
    // The rate the server's audio carries (a wav's header), the model's prompt limit, the
    // configured text limit, the API's speed range.
    let body = json!({"input": TEXT, "voice": "me", "response_format": "wav", "stream": false}).to_string();
    let wav = server.request("POST", "/v1/audio/speech", &[key, ("Content-Type", "application/json")], body.as_bytes());
    assert_eq!(wav.status, 200, "{}", wav.text());
    let rate = u32::from_le_bytes(wav.body[24..28].try_into().expect("a wav header"));
    assert_eq!(info["sample_rate"].as_u64(), Some(u64::from(rate)), "{info}");
    assert!(info["max_prompt_seconds"].as_f64().is_some_and(|s| s > 0.0 && s <= 30.0), "{info}");
    assert_eq!(info["max_text_chars"], 1234, "{info}");
    assert_eq!(info["speed"], json!({"min": 0.25, "max": 4.0}), "{info}");
    // The page reads it and assumes none of it.
    let js = server.request("GET", "/web/app.js", &[], b"").text();
    assert!(js.contains("/v1/audio/info"), "the page asks the server");
    for assumed in ["24000", "24_000", "24 kHz", "MAX_RECORD_S"] {
        assert!(!js.contains(assumed), "app.js assumes {assumed}");
    }
    let html = server.request("GET", "/", &[], b"").text();
    assert!(html.contains(r#"id="prompt-limit""#) && !html.contains("at most 30"), "{html}");
}

#[test]
fn a_voice_is_made_the_default_over_http() {
    let server = start_server(&[]);
    let prompt = crate::common::fixture_prompt();
    let r = server.post_json("/v1/audio/voices", &json!({"name": "ben", "ref_text": "Hello there, this is a test.", "ref_audio": data_url(&prompt)}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(server.request("GET", "/v1/audio/voices", &[], b"").json()["default"], "me");
    let r = server.request("POST", "/v1/audio/voices/ben/default", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"name": "ben", "default": true, "overridden_by": null}));
    let listing = server.request("GET", "/v1/audio/voices", &[], b"").json();
    assert_eq!(listing["default"], "ben");
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "response_format": "wav", "stream": false}));
    assert_eq!(r.header("x-cosy-voice"), Some("ben (default voice)"));
    let r = server.request("POST", "/v1/audio/voices/ghost/default", &[], b"");
    assert_eq!(r.status, 404);
    assert!(r.error_message().contains("ghost"));
}

#[test]
fn web_ui_off_hides_the_page() {
    let server = start_server(&["server.web_ui=false"]);
    for path in ["/", "/web/app.js"] {
        let r = server.request("GET", path, &[], b"");
        assert_eq!(r.status, 404, "{path}");
        assert!(!r.error_message().contains("web page"), "{}", r.text());
    }
}
