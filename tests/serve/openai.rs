//! What real clients send and expect (issue 19): OpenAI's voice names, the listings Open WebUI
//! reads, extra request fields, browsers (CORS, the WebSocket's Origin and key), and text-in
//! streaming that goes on after the speech ended early (forced with the test hook `max_tokens`).


use serde_json::json;
use tungstenite::client::IntoClientRequest;
use tungstenite::Message;

use crate::serve::{data_url, start_server, Server};

const TEXT: &str = "Hello world, how are you today? The weather is fine.";

use crate::serve::Ws;

/// A WebSocket handshake with extra headers; reads give up after 60 s.
fn ws_with(server: &Server, query: &str, headers: &[(&str, &str)]) -> Result<(Ws, tungstenite::handshake::client::Response), tungstenite::Error> {
    let url = format!("ws://127.0.0.1:{}/v1/audio/speech/stream{query}", server.port);
    let mut request = url.into_client_request().expect("request");
    for (k, v) in headers {
        let name = tungstenite::http::HeaderName::from_bytes(k.as_bytes()).expect("header name");
        request.headers_mut().insert(name, v.parse().expect("header value"));
    }
    crate::serve::ws_handshake(request)
}

fn send(ws: &mut Ws, v: serde_json::Value) {
    ws.send(Message::text(v.to_string())).expect("send");
}

/// Every event (JSON) and the audio bytes until `session.done`; panics on an error event.
fn read_session(ws: &mut Ws) -> (Vec<serde_json::Value>, Vec<u8>) {
    let mut events = Vec::new();
    let mut pcm = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("event JSON");
                assert_ne!(v["type"], "error", "{v}");
                let done = v["type"] == "session.done";
                events.push(v);
                if done {
                    return (events, pcm);
                }
            }
            Message::Binary(b) => pcm.extend_from_slice(&b),
            Message::Close(_) => panic!("closed before session.done: {events:?}"),
            _ => {}
        }
    }
}

/// A speech request for a whole wav (the bytes `cosy file` writes), unless the body says otherwise.
fn speech(server: &Server, mut body: serde_json::Value) -> crate::serve::Reply {
    for (field, value) in [("response_format", json!("wav")), ("stream", json!(false))] {
        if body.get(field).is_none() {
            body[field] = value;
        }
    }
    server.post_json("/v1/audio/speech", &body)
}

#[test]
fn openai_voice_names_resolve_and_say_which_voice() {
    let server = start_server(&["voices.aliases.ash=anna", "voices.aliases.coral=ghost"]);
    let prompt = crate::common::fixture_prompt();
    let me = speech(&server, json!({"input": TEXT, "voice": "me", "seed": 2}));
    assert_eq!(me.status, 200, "{}", me.text());
    assert_eq!(me.header("x-cosy-voice"), Some("me"));

    // An OpenAI name that is neither saved nor an alias: the default voice, said in the header.
    let alloy = speech(&server, json!({"input": TEXT, "voice": "alloy", "seed": 2}));
    assert_eq!(alloy.status, 200, "{}", alloy.text());
    assert_eq!(alloy.header("x-cosy-voice"), Some("me (default voice, for alloy)"));
    assert!(alloy.body == me.body, "alloy speaks with the default voice");
    // {"id": ...} (newer OpenAI clients) resolves the same way.
    let by_id = speech(&server, json!({"input": TEXT, "voice": {"id": "alloy"}, "seed": 2}));
    assert_eq!(by_id.status, 200, "{}", by_id.text());
    assert!(by_id.body == me.body);
    assert!(server.log.lock().unwrap().contains("voice: me (default voice, for alloy)"), "the log names it too");

    // The CLI resolves the name the same way, and says so on stderr.
    let out = crate::common::cosy_command(&server.dir.path().join("gc"))
        .arg("--model")
        .arg(crate::common::fixture_model())
        .args(["--set", &format!("voices.dir={}", server.voices_dir().display())])
        .args(["file", TEXT, "--voice", "alloy", "--seed", "2", "-o"])
        .arg(server.dir.path().join("alloy.wav"))
        .output()
        .expect("cosy file");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("voice me (default voice, for alloy)"), "{stderr}");
    assert!(std::fs::read(server.dir.path().join("alloy.wav")).unwrap() == me.body, "CLI --voice alloy = HTTP alloy");

    // An alias to a voice that is not there yet: a clear error naming the alias and its key.
    let r = speech(&server, json!({"input": TEXT, "voice": "ash"}));
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.error_message().contains("voices.aliases.ash"), "{}", r.text());
    let r = speech(&server, json!({"input": TEXT, "voice": "coral"}));
    assert_eq!(r.status, 404);
    assert!(r.error_message().contains("voices.aliases.coral") && r.error_message().contains("ghost"), "{}", r.text());
    // Once saved, the alias speaks with it; a saved voice named like an OpenAI voice is itself.
    for name in ["anna", "echo"] {
        let r = server.post_json(
            "/v1/audio/voices",
            &json!({"name": name, "ref_text": "Hello there, this is a test.", "ref_audio": data_url(&prompt)}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = speech(&server, json!({"input": TEXT, "voice": "ash", "seed": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-cosy-voice"), Some("anna (alias of ash)"));
    let r = speech(&server, json!({"input": TEXT, "voice": "echo", "seed": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-cosy-voice"), Some("echo"));
    // Any other unknown name stays a 404 that lists the saved voices.
    let r = speech(&server, json!({"input": TEXT, "voice": "nobody"}));
    assert_eq!(r.status, 404);
    let m = r.error_message();
    assert!(m.contains("nobody") && m.contains("anna, echo, me"), "{m}");

    // The listings: Open WebUI's shapes beside OpenAI's.
    let v = server.request("GET", "/v1/audio/voices", &[], b"").json();
    let voices = v["voices"].as_array().expect("voices").clone();
    assert!(voices.contains(&json!({"id": "me", "name": "me"})), "{v}");
    assert!(voices.iter().all(|x| x["id"].is_string() && x["name"].is_string()), "{v}");
    let find = |id: &str| voices.iter().find(|x| x["id"] == id).cloned().unwrap_or_else(|| panic!("{id} not listed: {v}"));
    assert_eq!(find("ash")["resolves_to"], "anna");
    assert_eq!(find("alloy")["resolves_to"], "me");
    assert_eq!(find("coral")["resolves_to"], serde_json::Value::Null, "an alias to a missing voice resolves to nothing");
    assert_eq!(find("echo"), json!({"id": "echo", "name": "echo"}), "a saved voice wins over the OpenAI name");
    assert_eq!(v["default"], "me");
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.iter().map(|d| d["name"].as_str().unwrap()).collect::<Vec<_>>(), ["anna", "echo", "me"]);
    assert!(data.iter().all(|d| d["transcript"].is_string() && d["usable"] == true), "{v}");
    for path in ["/v1/models", "/v1/audio/models"] {
        let m = server.request("GET", path, &[], b"").json();
        assert_eq!(m["object"], "list", "{path}: {m}");
        assert_eq!(m["data"][0]["id"], "cosyvoice3");
        assert_eq!(m["data"][0]["object"], "model");
        assert_eq!(m["models"][0], json!({"id": "cosyvoice3", "name": "cosyvoice3"}), "{path}: {m}");
    }

    // Extra fields are accepted and named; a known field of the wrong type is still a 400.
    let r = speech(&server, json!({"input": "Hi there.", "voice": "me", "temperature": 0.3, "extra_thing": {"a": 1}}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-cosy-ignored-fields"), Some("extra_thing, temperature"));
    assert!(server.log.lock().unwrap().contains("ignored unknown fields: extra_thing, temperature"));
    assert_eq!(speech(&server, json!({"input": "Hi there.", "voice": "me"})).header("x-cosy-ignored-fields"), None);
    for (body, field) in [
        (json!({"input": "Hi.", "speed": "fast", "whatever": 1}), "speed"),
        (json!({"input": "Hi.", "stream": "yes"}), "stream"),
        (json!({"input": "Hi.", "instructions": 5}), "instructions"),
    ] {
        let r = speech(&server, body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.error_message().contains(field), "{body}: {}", r.text());
    }

    // The default CORS on a loopback bind: pages from this machine, no others.
    let preflight = |origin: &str| {
        server.request(
            "OPTIONS",
            "/v1/audio/speech",
            &[("Origin", origin), ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", "content-type")],
            b"",
        )
    };
    let r = preflight("http://localhost:3000");
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some("http://localhost:3000"));
    assert_eq!(preflight("https://evil.example").header("access-control-allow-origin"), None);
}

#[test]
fn browsers_cors_and_websocket_keys() {
    let server = start_server(&[
        "server.api_key=s3cret-key",
        "server.cors_origins=https://app.example.com, http://localhost:5173",
        "server.public_listings=true",
    ]);
    let allowed = "https://app.example.com";
    // A preflight: 204, the origin echoed, the methods, the asked headers (key, JSON, the openai
    // SDK's x-stainless-*) allowed; no key needed for it.
    let asked = "authorization, content-type, x-stainless-os, x-stainless-lang";
    let r = server.request(
        "OPTIONS",
        "/v1/audio/speech",
        &[("Origin", allowed), ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", asked)],
        b"",
    );
    assert_eq!(r.status, 204, "{:?}", r.headers);
    assert_eq!(r.header("access-control-allow-origin"), Some(allowed));
    let methods = r.header("access-control-allow-methods").unwrap_or_default().to_ascii_uppercase();
    assert!(methods.contains("POST") && methods.contains("GET"), "{methods}");
    let headers = r.header("access-control-allow-headers").unwrap_or_default().to_ascii_lowercase();
    for h in ["authorization", "content-type", "x-stainless-os"] {
        assert!(headers.contains(h), "{h} not allowed: {headers}");
    }
    // Another origin gets no allow-origin (the browser refuses the page the answer).
    for origin in ["https://evil.example", "http://localhost:3000"] {
        let r = server.request(
            "OPTIONS",
            "/v1/audio/speech",
            &[("Origin", origin), ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", asked)],
            b"",
        );
        assert_eq!(r.header("access-control-allow-origin"), None, "{origin}");
    }
    // The request itself: the origin allowed and the x-cosy-* headers readable by the page.
    let body = json!({"input": "Hi there.", "voice": "alloy", "response_format": "pcm"}).to_string();
    let r = server.request(
        "POST",
        "/v1/audio/speech",
        &[("Origin", allowed), ("Content-Type", "application/json"), ("Authorization", "Bearer s3cret-key")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(allowed));
    let exposed = r.header("access-control-expose-headers").unwrap_or_default().to_ascii_lowercase();
    for h in ["x-cosy-voice", "x-request-id", "retry-after"] {
        assert!(exposed.contains(h), "{h} not exposed: {exposed}");
    }
    let r = server.request("POST", "/v1/audio/speech", &[("Origin", "https://evil.example"), ("Content-Type", "application/json"), ("Authorization", "Bearer s3cret-key")], body.as_bytes());
    assert_eq!(r.header("access-control-allow-origin"), None);

    // server.public_listings: the listings answer without the key; nothing else does.
    for path in ["/v1/audio/voices", "/v1/models", "/v1/audio/models"] {
        assert_eq!(server.request("GET", path, &[], b"").status, 200, "{path}");
    }
    assert_eq!(server.request("POST", "/v1/audio/speech", &[("Content-Type", "application/json")], body.as_bytes()).status, 401);
    assert_eq!(server.request("DELETE", "/v1/audio/voices/me", &[], b"").status, 401);
    assert_eq!(server.request("POST", "/v1/audio/voices", &[("Content-Type", "application/json")], b"{}").status, 401);

    // The WebSocket: a page from an origin not allowed is refused, even with the key.
    let key = ("Authorization", "Bearer s3cret-key");
    for origin in ["https://evil.example", "null"] {
        match ws_with(&server, "", &[key, ("Origin", origin)]) {
            Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 403, "{origin}"),
            other => panic!("{origin}: {:?}", other.map(|_| ())),
        }
    }
    // Without a key: refused, and the message says how a browser sends one.
    match ws_with(&server, "", &[("Origin", allowed)]) {
        Err(tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 401);
            let body = String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
            assert!(body.contains("cosy-key.") && body.contains("api_key"), "{body}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    for wrong in [&[("Sec-WebSocket-Protocol", "cosy, cosy-key.wrong")][..], &[("Sec-WebSocket-Protocol", "cosy")][..]] {
        assert!(matches!(ws_with(&server, "", wrong), Err(tungstenite::Error::Http(ref r)) if r.status() == 401), "{wrong:?}");
    }
    assert!(matches!(ws_with(&server, "?api_key=nope", &[]), Err(tungstenite::Error::Http(ref r)) if r.status() == 401));
    // The key as a subprotocol (the answer names `cosy`, never the key), or in the query.
    let (mut ws, response) =
        ws_with(&server, "", &[("Origin", allowed), ("Sec-WebSocket-Protocol", "cosy, cosy-key.s3cret-key")]).expect("subprotocol key");
    assert_eq!(response.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()), Some("cosy"));
    send(&mut ws, json!({"type": "session.config", "voice": "alloy", "text_streaming": "sentences", "unknown_option": true}));
    send(&mut ws, json!({"type": "input.text", "text": "Hi there."}));
    send(&mut ws, json!({"type": "input.done"}));
    let (events, pcm) = read_session(&mut ws);
    assert_eq!(events[0]["type"], "session.created");
    assert_eq!(events[0]["voice"], "me (default voice, for alloy)");
    assert_eq!(events[0]["ignored_fields"], json!(["unknown_option"]));
    assert!(!pcm.is_empty());
    let (mut ws, _) = ws_with(&server, "?api_key=s3cret-key", &[("Origin", "http://localhost:5173")]).expect("query key");
    send(&mut ws, json!({"type": "session.close"}));
    // Neither the key nor the query that carried it reaches the log.
    let log = server.log.lock().unwrap().clone();
    assert!(!log.contains("s3cret"), "{log}");
}

/// Text-in streaming never drops text: the test hook `max_tokens` ends each segment's speech
/// after 20 speech tokens, as if the model had emitted its stop token (whatever the random
/// weights sample), so the first segment ends before the text sent so far; the text it did not
/// take, and what comes after, are spoken as new segments, and the segments' texts are together
/// all the text.
#[test]
fn websocket_text_after_an_early_end_is_a_new_segment() {
    let server = start_server(&["debug.test_hooks=true"]);
    // The hooks' own rules, before any speech: max_tokens ≥ 1; no forced count in text-in streaming.
    for (hooks, code) in [(json!({"max_tokens": 0}), "invalid_input"), (json!({"min_tokens": 5}), "conflicting_fields")] {
        let (mut ws, _) = ws_with(&server, "", &[]).expect("connect");
        send(&mut ws, json!({"type": "session.config", "voice": "me", "cosy_test": hooks}));
        let error = read_error(&mut ws);
        assert_eq!(error["error"]["code"], code, "{hooks}: {error}");
    }
    let (mut ws, _) = ws_with(&server, "", &[]).expect("connect");
    // "me" has a transcript: text-in streaming (bistream) is the default.
    send(&mut ws, json!({"type": "session.config", "voice": "me", "seed": 1, "cosy_test": {"max_tokens": 20}}));
    let text = "Hello world, how are you today? The weather is fine and the sun is shining over the hills. \
                We walked along the river and talked about the old days, the friends we had, the songs we sang. ";
    let pieces: Vec<String> = text.split_inclusive(' ').map(str::to_string).collect();
    for p in &pieces {
        send(&mut ws, json!({"type": "input.text", "text": p}));
    }
    // The first segment ends while the input is still open.
    let mut events = Vec::new();
    let mut pcm = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                assert_ne!(v["type"], "error", "{v}");
                let first_done = v["type"] == "audio.done";
                events.push(v);
                if first_done {
                    break;
                }
            }
            Message::Binary(b) => pcm.extend_from_slice(&b),
            Message::Close(_) => panic!("closed early: {events:?}"),
            _ => {}
        }
    }
    let first = events.last().unwrap().clone();
    assert_eq!(first["segment"], 0);
    assert_eq!(first["ended_early"], true, "{first}");
    let taken = first["text"].as_str().unwrap().to_string();
    assert!(!taken.is_empty() && taken.len() < text.len(), "the first segment took only part of the text: {first}");
    // More text, then the end of the input.
    let tail = "And that was the end of the story.";
    send(&mut ws, json!({"type": "input.text", "text": tail}));
    send(&mut ws, json!({"type": "input.done"}));
    let (rest, more) = read_session(&mut ws);
    events.extend(rest);
    pcm.extend(more);
    let done = events.last().unwrap();
    let segments = done["segments"].as_u64().unwrap();
    assert!(segments >= 2, "{events:?}");
    // Every segment: audio.start then audio.done, in order, with audio; the audio adds up; no
    // text lost; every segment but the last ended early (the hook), the last with its text.
    let starts: Vec<u64> = events.iter().filter(|e| e["type"] == "audio.start").map(|e| e["segment"].as_u64().unwrap()).collect();
    let dones: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "audio.done").collect();
    assert_eq!(starts, (0..segments).collect::<Vec<_>>(), "{events:?}");
    assert_eq!(dones.len() as u64, segments);
    assert!(dones.iter().all(|d| d["samples"].as_u64().unwrap() > 0), "every segment is spoken: {events:?}");
    let samples: u64 = dones.iter().map(|d| d["samples"].as_u64().unwrap()).sum();
    assert_eq!(samples * 2, pcm.len() as u64);
    // Where each segment lies in the session's audio (captions): end to end, from 0 to the last.
    let mut position = 0;
    for d in &dones {
        assert_eq!(d["start_sample"].as_u64(), Some(position), "{d}");
        position += d["samples"].as_u64().unwrap();
        assert_eq!(d["end_sample"].as_u64(), Some(position), "{d}");
    }
    let spoken: String = dones.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(spoken, format!("{text}{tail}"), "the segments' texts are all the text");
    assert!(dones[..dones.len() - 1].iter().all(|d| d["ended_early"] == true), "{events:?}");
    assert_eq!(dones.last().unwrap()["ended_early"], false);
    assert!(server.log.lock().unwrap().contains("ended before its text"));
}

/// The first error event of a session (before any audio), then the close.
fn read_error(ws: &mut Ws) -> serde_json::Value {
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("event JSON");
                if v["type"] == "error" {
                    return v;
                }
                assert_eq!(v["type"], "session.created", "{v}");
            }
            Message::Close(_) => panic!("closed without an error event"),
            other => panic!("{other:?}"),
        }
    }
}

/// `cosy_test` in `session.config` is the engine's to refuse when the server's test hooks are off:
/// an error event (400 `test_hooks_disabled`) before `session.created`, then the close.
#[test]
fn websocket_test_hooks_are_refused_without_debug_test_hooks() {
    let server = start_server(&[]);
    for mode in ["bistream", "sentences"] {
        let (mut ws, _) = ws_with(&server, "", &[]).expect("connect");
        send(&mut ws, json!({"type": "session.config", "voice": "me", "text_streaming": mode, "cosy_test": {"max_tokens": 20}}));
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("event JSON");
                assert_eq!(v["type"], "error", "{mode}: refused before session.created: {v}");
                assert_eq!(v["error"]["code"], "test_hooks_disabled", "{mode}: {v}");
                assert!(v["error"]["message"].as_str().unwrap().contains("debug.test_hooks"), "{v}");
            }
            other => panic!("{mode}: {other:?}"),
        }
        assert!(matches!(ws.read(), Ok(Message::Close(Some(ref f))) if u16::from(f.code) == 1008), "{mode}: closed as the client's fault");
    }
    // The same object in a speech request, as before.
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "me", "cosy_test": {"max_tokens": 20}}));
    assert_eq!(r.status, 400);
    assert!(r.text().contains("test_hooks_disabled"), "{}", r.text());
}
