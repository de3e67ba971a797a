//! `cosy serve` end to end: a real server on a free loopback port, real HTTP and WebSocket
//! clients. Output equality with `cosy file` is byte for byte: the same binary, model, seed and
//! CPU produce the same samples (the engine's batching does not change a request's numbers, see
//! tests/pipeline/engine_concurrency.rs), and the server writes them with the same encoder.


use std::time::Duration;

use serde_json::json;
use crate::serve::{base64, cosy_file, data_url, data_url_of, start_server, tone_wav, unbase64, Server};

const TEXT: &str = "Hello world, how are you today? The weather is fine.";

fn good(server: &Server) {
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi there.", "voice": "me", "response_format": "pcm"}));
    assert_eq!(r.status, 200, "a good request after a bad one: {}", r.text());
    assert!(!r.body.is_empty());
}

#[test]
fn speech_matches_cosy_file_whole_streamed_and_sse() {
    let server = start_server(&[]);
    // Whole wav (`stream: false`: responses stream by default) = `cosy file`.
    let r = server.post_json(
        "/v1/audio/speech",
        &json!({"model": "tts-1", "input": TEXT, "voice": "me", "seed": 3, "response_format": "wav", "stream": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("audio/wav"));
    assert_eq!(r.header("x-cosy-stream"), None, "a whole file");
    assert!(r.header("x-request-id").is_some_and(|id| !id.is_empty()));
    let file = cosy_file(&server, &[TEXT, "--voice", "me", "--seed", "3"]);
    assert!(r.body == file, "the wav differs from `cosy file` ({} vs {} bytes)", r.body.len(), file.len());

    // Streamed pcm = `cosy file --stream --format pcm`, sent chunked.
    let r = server.post_json(
        "/v1/audio/speech",
        &json!({"input": TEXT, "voice": "default", "seed": 3, "stream": true, "response_format": "pcm"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("transfer-encoding").is_some_and(|v| v.contains("chunked")), "{:?}", r.headers);
    assert_eq!(r.header("x-cosy-stream"), Some("chunks"));
    let streamed = cosy_file(&server, &[TEXT, "--voice", "me", "--seed", "3", "--stream", "--format", "pcm"]);
    assert!(r.body == streamed, "streamed pcm differs from `cosy file --stream` ({} vs {} bytes)", r.body.len(), streamed.len());

    // A streamed wav (no `stream`: the default): the unknown-length header, then the same samples.
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "me", "seed": 3, "response_format": "wav"}));
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..4], b"RIFF");
    assert_eq!(&r.body[4..8], &[0xFF; 4]);
    assert_eq!(&r.body[40..44], &[0xFF; 4]);
    assert!(r.body[44..] == streamed[..]);

    // SSE: deltas of base64 pcm, then done; together the streamed pcm.
    let r = server.post_json(
        "/v1/audio/speech",
        &json!({"input": TEXT, "voice": "me", "seed": 3, "stream_format": "sse", "response_format": "pcm"}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events: Vec<serde_json::Value> = r
        .text()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("event JSON"))
        .collect();
    assert!(events.len() >= 2, "{events:?}");
    let (last, deltas) = events.split_last().expect("events");
    assert_eq!(last["type"], "speech.audio.done");
    // OpenAI's usage: text tokens in, speech tokens out.
    let usage = &last["usage"];
    let (input, output) = (usage["input_tokens"].as_u64().expect("input_tokens"), usage["output_tokens"].as_u64().expect("output_tokens"));
    assert!(input > 0 && output > 0, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(input + output));
    let mut pcm = Vec::new();
    for d in deltas {
        assert_eq!(d["type"], "speech.audio.delta");
        pcm.extend(unbase64(d["audio"].as_str().expect("audio")));
    }
    assert!(pcm == streamed, "SSE audio differs from the streamed pcm");

    // flac: lossless, so it decodes to the wav's samples, whole or streamed.
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "me", "seed": 3, "response_format": "flac", "stream": false}));
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..4], b"fLaC");
    let flac = cosy::frontend::audio::decode_bytes(std::path::Path::new("flac"), r.body.clone()).expect("flac decodes");
    let wav = cosy::frontend::audio::decode_bytes(std::path::Path::new("wav"), file).expect("wav decodes");
    assert_eq!(flac.samples.len(), wav.samples.len());
    assert!(flac.samples.iter().zip(&wav.samples).all(|(a, b)| (a - b).abs() < 1e-6));
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "me", "seed": 3, "response_format": "flac"}));
    assert_eq!(r.status, 200);
    let flac = cosy::frontend::audio::decode_bytes(std::path::Path::new("flac"), r.body.clone()).expect("streamed flac decodes");
    let pcm: Vec<f32> = streamed.chunks_exact(2).map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0).collect();
    assert_eq!(flac.samples.len(), pcm.len());
    assert!(flac.samples.iter().zip(&pcm).all(|(a, b)| (a - b).abs() < 1e-6), "streamed flac = the streamed samples");

    // SSE with flac: the deltas together are the streamed flac.
    let r = server.post_json(
        "/v1/audio/speech",
        &json!({"input": TEXT, "voice": "me", "seed": 3, "stream_format": "sse", "response_format": "flac"}),
    );
    assert_eq!(r.status, 200);
    let mut bytes = Vec::new();
    for e in r.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        let v: serde_json::Value = serde_json::from_str(e).expect("event JSON");
        if v["type"] == "speech.audio.delta" {
            bytes.extend(unbase64(v["audio"].as_str().expect("audio")));
        }
    }
    let flac = cosy::frontend::audio::decode_bytes(std::path::Path::new("flac"), bytes).expect("SSE flac decodes");
    assert_eq!(flac.samples.len(), pcm.len());
}

/// The event stream says where each sentence's audio ends (an extra field on an empty delta, for
/// players that buffer whole sentences: the web page's): one end per sentence, in order, each
/// after the audio it ends, the last at the end of the audio; the audio is unchanged.
#[test]
fn sse_tells_where_each_sentence_ends_after_its_audio() {
    let server = start_server(&["debug.test_hooks=true"]);
    let text = "The old lighthouse keeper walked along the narrow path every single evening, carrying a lantern, a notebook and a small loaf of bread for the gulls that waited for him on the rocks, and he wrote down the colour of the sky and the strength of the wind. \
The fishermen who came back late in the autumn storms said that his light was the last thing they saw before the harbour, a steady yellow eye above the black water that never blinked, never faltered and never once went out in forty years of service. \
When he finally retired, the village gathered on the pier with music and lanterns of their own, and the children sang the old songs about the sea while the new electric lamp turned above them for the very first time.";
    let body = json!({"input": text, "voice": "me", "seed": 3, "stream_format": "sse", "response_format": "pcm", "cosy_test": {"min_tokens": 8, "max_tokens": 8}});
    let r = server.post_json("/v1/audio/speech", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut samples = 0u64;
    let mut pcm = Vec::new();
    let mut ends = Vec::new();
    let mut done = None;
    for e in r.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        let v: serde_json::Value = serde_json::from_str(e).expect("event JSON");
        match v["type"].as_str() {
            Some("speech.audio.delta") => {
                let audio = unbase64(v["audio"].as_str().expect("audio"));
                samples += audio.len() as u64 / 2;
                if v.get("sentence_end").is_none() {
                    pcm.extend(audio);
                    continue;
                }
                if let Some(end) = v.get("sentence_end") {
                    assert!(audio.is_empty(), "a sentence end comes on its own: {v}");
                    let end = end.as_u64().expect("samples");
                    assert!(end <= samples, "the end {end} came before its audio ({samples} samples sent)");
                    ends.push(end);
                }
            }
            Some("speech.audio.done") => done = Some(v),
            other => panic!("unexpected event {other:?}: {v}"),
        }
    }
    let done = done.expect("speech.audio.done");
    assert_eq!(ends.len(), 3, "three sentences: {ends:?}");
    assert!(ends.windows(2).all(|w| w[0] < w[1]), "in order: {ends:?}");
    assert_eq!(ends.last(), Some(&samples), "the last sentence ends with the audio");
    let rate = done["sample_rate"].as_f64().expect("sample_rate");
    assert!((done["audio_seconds"].as_f64().expect("audio_seconds") - samples as f64 / rate).abs() < 1e-9, "{done}");
    // The done event lists the sentences said, each where its audio lies: the same ends.
    let sentences = done["sentences"].as_array().expect("sentences");
    let told: Vec<u64> = sentences.iter().map(|s| s["end_sample"].as_u64().expect("end_sample")).collect();
    assert_eq!(told, ends, "{done}");
    assert_eq!(sentences[0]["start_sample"], 0, "{done}");
    assert!(sentences.iter().all(|s| s["text"].as_str().is_some_and(|t| !t.is_empty())), "{done}");
    // The same audio as without the ends: the streamed pcm.
    let streamed = server.post_json("/v1/audio/speech", &json!({"input": text, "voice": "me", "seed": 3, "response_format": "pcm", "cosy_test": {"min_tokens": 8, "max_tokens": 8}}));
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert!(streamed.body == pcm, "SSE audio differs from the streamed pcm");
}

/// A whole file can come with captions (issue 33): JSON with the audio in base64 and the SRT,
/// whose cues are the sentences where their samples lie (the event stream's sentence ends, to the
/// millisecond); captions with streamed audio bytes, or an unknown caption format, are refused.
#[test]
fn a_whole_file_comes_with_captions_where_its_sentences_lie() {
    let server = start_server(&["debug.test_hooks=true"]);
    // Two sentences long enough not to be merged into one by the official splitter.
    let text = "The old lighthouse keeper walked along the narrow path every single evening, carrying a lantern, a notebook and a small loaf of bread for the gulls that waited for him on the rocks, and he wrote down the colour of the sky and the strength of the wind. \
The fishermen who came back late in the autumn storms said that his light was the last thing they saw before the harbour, a steady yellow eye above the black water that never blinked, never faltered and never once went out in forty years of service.";
    let hooks = json!({"min_tokens": 8, "max_tokens": 8});
    let r = server.post_json("/v1/audio/speech", &json!({"input": text, "voice": "me", "seed": 3, "stream": false, "response_format": "wav", "captions": "srt", "cosy_test": hooks}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["content_type"], "audio/wav", "{v}");
    let wav = cosy::frontend::audio::decode_bytes(std::path::Path::new("wav"), unbase64(v["audio"].as_str().expect("audio"))).expect("the audio decodes");
    let srt = v["captions"].as_str().expect("captions");
    let sse = server.post_json("/v1/audio/speech", &json!({"input": text, "voice": "me", "seed": 3, "stream": false, "stream_format": "sse", "response_format": "pcm", "captions": "vtt", "cosy_test": hooks}));
    assert_eq!(sse.status, 200, "{}", sse.text());
    let done: serde_json::Value = sse
        .text()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|e| serde_json::from_str::<serde_json::Value>(e).expect("event JSON"))
        .find(|e| e["type"] == "speech.audio.done")
        .expect("speech.audio.done");
    let sentences = done["sentences"].as_array().expect("sentences");
    assert_eq!(sentences.len(), 2, "{done}");
    assert_eq!(sentences[1]["end_sample"].as_u64(), Some(wav.samples.len() as u64), "{done}");
    assert!(done["captions"].as_str().is_some_and(|c| c.starts_with("WEBVTT")), "{done}");
    let ms = |samples: &serde_json::Value| {
        let ms = (samples.as_u64().expect("samples") * 1000 + 12_000) / 24_000;
        format!("{:02}:{:02}:{:02},{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
    };
    let cues: Vec<&str> = srt.split("\n\n").filter(|c| !c.trim().is_empty()).collect();
    assert_eq!(cues.len(), 2, "{srt}");
    for (i, (cue, sentence)) in cues.iter().zip(sentences).enumerate() {
        let lines: Vec<&str> = cue.lines().collect();
        assert_eq!(lines[0], (i + 1).to_string(), "{srt}");
        assert_eq!(lines[1], format!("{} --> {}", ms(&sentence["start_sample"]), ms(&sentence["end_sample"])), "{srt}");
        assert_eq!(lines[2], sentence["text"].as_str().expect("text").trim(), "{srt}");
    }
    let streamed = server.post_json("/v1/audio/speech", &json!({"input": text, "voice": "me", "captions": "srt", "cosy_test": hooks}));
    assert_eq!(streamed.status, 400, "{}", streamed.text());
    assert!(streamed.error_message().contains("\"stream\": false"), "{}", streamed.text());
    let unknown = server.post_json("/v1/audio/speech", &json!({"input": text, "voice": "me", "stream": false, "captions": "ass"}));
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    assert_eq!(unknown.json()["error"]["param"], "captions", "{}", unknown.text());
}

#[test]
fn cloning_fields_json_and_multipart() {
    let server = start_server(&[]);
    let prompt = crate::common::fixture_prompt();
    let ref_text = "Hello there, this is a test.";
    let file = cosy_file(&server, &[TEXT, "--prompt-wav", prompt.to_str().unwrap(), "--prompt-text", ref_text, "--seed", "5"]);
    // voice is ignored when ref_audio is given (the openai client always sends one).
    let r = server.post_json(
        "/v1/audio/speech",
        &json!({"input": TEXT, "voice": "alloy", "ref_audio": data_url(&prompt), "ref_text": ref_text, "seed": 5, "response_format": "wav", "stream": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == file, "zero-shot from ref_audio differs from `cosy file --prompt-wav`");

    // Multipart: the recording as a file part.
    let boundary = "cosyboundary7MA4YWxk";
    let mut body = Vec::new();
    for (name, value) in [("input", TEXT), ("ref_text", ref_text), ("seed", "5"), ("voice", "alloy"), ("response_format", "wav"), ("stream", "false")] {
        body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes());
    }
    body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"ref_audio\"; filename=\"p.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes());
    body.extend(std::fs::read(&prompt).unwrap());
    body.extend(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = server.request("POST", "/v1/audio/speech", &[("Content-Type", &ct)], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == file, "multipart zero-shot differs");

    // Instruct mode with a saved voice, and cross-lingual (ref_audio alone).
    let instruct = cosy_file(&server, &[TEXT, "--voice", "me", "--instruct", "Speak slowly.", "--seed", "2"]);
    let r = server.post_json(
        "/v1/audio/speech",
        &json!({"input": TEXT, "voice": "me", "instructions": "Speak slowly.", "seed": 2, "response_format": "wav", "stream": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == instruct, "instruct differs");
    let cross = cosy_file(&server, &[TEXT, "--prompt-wav", prompt.to_str().unwrap(), "--seed", "5"]);
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "ref_audio": data_url(&prompt), "seed": 5, "response_format": "wav", "stream": false}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == cross, "cross-lingual differs");
}

#[test]
fn voices_over_http_are_the_cli_voice_files() {
    let server = start_server(&[]);
    let prompt = crate::common::fixture_prompt();
    let r = server.request("GET", "/v1/audio/voices", &[], b"");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["voices"][0], json!({"id": "me", "name": "me"}));
    assert_eq!(v["default"], "me");

    let boundary = "b0undary";
    let form = |name: &str, extra: &[(&str, &str)]| {
        let mut body = Vec::new();
        body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\n{name}\r\n").as_bytes());
        for (k, val) in extra {
            body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{val}\r\n").as_bytes());
        }
        body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"audio_sample\"; filename=\"a.wav\"\r\n\r\n").as_bytes());
        body.extend(std::fs::read(&prompt).unwrap());
        body.extend(format!("\r\n--{boundary}--\r\n").as_bytes());
        body
    };
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = server.request("POST", "/v1/audio/voices", &[("Content-Type", &ct)], &form("anna", &[("ref_text", "Hello there, this is a test.")]));
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(server.voices_dir().join("anna.safetensors").is_file(), "the same file as `cosy voice add`");
    // The same voice as `cosy voice add me` of the same recording and transcript: same audio.
    let a = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "anna", "seed": 1, "response_format": "pcm"}));
    let b = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "me", "seed": 1, "response_format": "pcm"}));
    assert_eq!(a.status, 200);
    assert!(a.body == b.body, "a voice saved over HTTP speaks as the CLI's");
    // Taken name → 409; overwrite → 201.
    let r = server.request("POST", "/v1/audio/voices", &[("Content-Type", &ct)], &form("anna", &[("ref_text", "Hello.")]));
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.error_message().contains("anna"));
    let r = server.request("POST", "/v1/audio/voices", &[("Content-Type", &ct)], &form("anna", &[("ref_text", "Hello."), ("overwrite", "true")]));
    assert_eq!(r.status, 201, "{}", r.text());
    // JSON form with a data URL.
    let r = server.post_json("/v1/audio/voices", &json!({"name": "ben", "ref_text": "Hi.", "ref_audio": data_url(&prompt), "default": true}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(server.request("GET", "/v1/audio/voices", &[], b"").json()["default"], "ben");
    // Delete; then it is unknown.
    let r = server.request("DELETE", "/v1/audio/voices/anna", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!server.voices_dir().join("anna.safetensors").exists());
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT, "voice": "anna"}));
    assert_eq!(r.status, 404);
    assert!(r.error_message().contains("anna"));
    // Deleting the default voice clears the default.
    assert_eq!(server.request("DELETE", "/v1/audio/voices/ben", &[], b"").status, 200);
    let r = server.post_json("/v1/audio/speech", &json!({"input": TEXT}));
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.error_message().contains("default"));
}

/// At least 20 kinds of bad request, each answered with its status and a clear message, each
/// followed by a good request that succeeds.
#[test]
fn bad_requests_get_clear_errors_and_the_server_keeps_serving() {
    let server = start_server(&["limits.max_text_chars=300", "server.max_body_bytes=3000000"]);
    let prompt = crate::common::fixture_prompt();
    let long_audio = data_url_of(&tone_wav(31.0, 16_000));
    // Issue 30: a prompt text past limits.max_prompt_text_chars, a recording of a 2-step hum.
    let long_text = "a".repeat(21_000);
    let faint = {
        let mut cursor = std::io::Cursor::new(Vec::new());
        let spec = hound::WavSpec { channels: 1, sample_rate: 16_000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
        let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
        for i in 0..32_000 {
            w.write_sample(((i as f32 * 0.1).sin() * 2.0) as i16).unwrap();
        }
        w.finalize().unwrap();
        data_url_of(&cursor.into_inner())
    };
    let json_ct = ("Content-Type", "application/json");
    let speech = |body: serde_json::Value| (body.to_string().into_bytes(), vec![json_ct]);
    type Case = (&'static str, &'static str, &'static str, (Vec<u8>, Vec<(&'static str, &'static str)>), u16, &'static str);
    let cases: Vec<Case> = vec![
        ("bad JSON", "POST", "/v1/audio/speech", (b"{\"input\": ".to_vec(), vec![json_ct]), 400, "not a valid request"),
        ("empty body", "POST", "/v1/audio/speech", (Vec::new(), vec![json_ct]), 400, "empty"),
        ("body not UTF-8", "POST", "/v1/audio/speech", (vec![0xff, 0xfe, 0x00], vec![json_ct]), 400, "UTF-8"),
        ("missing input", "POST", "/v1/audio/speech", speech(json!({"voice": "me"})), 400, "input"),
        ("input not a string", "POST", "/v1/audio/speech", speech(json!({"input": 5})), 400, "invalid type"),
        ("blank input", "POST", "/v1/audio/speech", speech(json!({"input": "  \u{200b} "})), 400, "empty"),
        ("only punctuation", "POST", "/v1/audio/speech", speech(json!({"input": "?!…"})), 400, "nothing speakable"),
        ("text too long", "POST", "/v1/audio/speech", speech(json!({"input": "word ".repeat(80)})), 400, "limits.max_text_chars"),
        ("unknown voice", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "voice": "nobody"})), 404, "nobody"),
        ("voice path traversal", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "voice": "../../etc/passwd"})), 400, "not allowed"),
        ("voice not a string", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "voice": 7})), 400, "voice"),
        ("aac", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "response_format": "aac"})), 400, "mp3, opus, wav, pcm or flac"),
        ("unknown format", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "response_format": "xyz"})), 400, "mp3, opus, wav, pcm or flac"),
        ("bad stream_format", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "stream_format": "ws"})), 400, "sse"),
        ("speed above OpenAI's range", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "speed": 4.5})), 400, "0.25 to 4"),
        ("speed below OpenAI's range", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "speed": 0.2})), 400, "0.25 to 4"),
        ("negative seed", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "seed": -1})), 400, "seed"),
        ("known field of the wrong type", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "speed": "fast", "temperature": 0.3})), 400, "speed"),
        ("test hook without debug.test_hooks", "POST", "/v1/audio/speech",
            speech(json!({"input": "Hi.", "cosy_test": {"hold_after_first_audio": true}})), 400, "debug.test_hooks"),
        ("bad base64", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "ref_audio": "data:audio/wav;base64,@@@@"})), 400, "base64"),
        ("corrupt audio", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "ref_audio": data_url_of(&[7u8; 3000])})), 400, "ref_audio"),
        ("audio too long", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "ref_audio": long_audio})), 400, "at most 29.2 s"),
        ("audio URL", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "ref_audio": "https://example.com/a.wav"})), 400, "not fetched"),
        ("ref_text alone", "POST", "/v1/audio/speech", speech(json!({"input": "Hi.", "ref_text": "Hello."})), 400, "ref_audio"),
        ("ref_text and instructions", "POST", "/v1/audio/speech",
            speech(json!({"input": "Hi.", "ref_audio": data_url(&prompt), "ref_text": "a", "instructions": "b"})), 400, "not both"),
        ("huge body", "POST", "/v1/audio/speech", (vec![b' '; 3_500_000], vec![json_ct]), 413, "max_body_bytes"),
        ("text/plain", "POST", "/v1/audio/speech", (b"Hello".to_vec(), vec![("Content-Type", "text/plain")]), 415, "application/json"),
        ("GET on speech", "GET", "/v1/audio/speech", (Vec::new(), vec![]), 405, "not allowed"),
        ("unknown route", "POST", "/v1/audio/shout", (Vec::new(), vec![]), 404, "no such endpoint"),
        ("delete traversal", "DELETE", "/v1/audio/voices/..%2F..%2Fetc", (Vec::new(), vec![]), 400, "not allowed"),
        ("delete unknown voice", "DELETE", "/v1/audio/voices/ghost", (Vec::new(), vec![]), 404, "ghost"),
        ("voice without audio", "POST", "/v1/audio/voices", speech(json!({"name": "x1", "ref_text": "Hello."})), 400, "missing"),
        ("voice bad name", "POST", "/v1/audio/voices", speech(json!({"name": "a/b", "ref_text": "Hi.", "ref_audio": data_url(&prompt)})), 400, "not allowed"),
        ("voice named default", "POST", "/v1/audio/voices", speech(json!({"name": "default", "ref_text": "Hi.", "ref_audio": data_url(&prompt)})), 400, "default"),
        ("voice taken", "POST", "/v1/audio/voices", speech(json!({"name": "me", "ref_text": "Hi.", "ref_audio": data_url(&prompt)})), 409, "already exists"),
        ("voice empty body", "POST", "/v1/audio/voices", (Vec::new(), vec![json_ct]), 400, "\"name\""),
        ("WebSocket route over plain HTTP", "GET", "/v1/audio/speech/stream", (Vec::new(), vec![]), 400, "WebSocket endpoint"),
        ("voice silent audio", "POST", "/v1/audio/voices",
            speech(json!({"name": "quiet", "ref_text": "Hi.", "ref_audio": data_url_of(&tone_wav(0.0, 16_000))})), 400, "audio_sample"),
        ("ref_text too long", "POST", "/v1/audio/speech",
            speech(json!({"input": "Hi.", "ref_audio": data_url(&prompt), "ref_text": long_text.as_str()})), 400, "limits.max_prompt_text_chars"),
        ("instructions too long", "POST", "/v1/audio/speech",
            speech(json!({"input": "Hi.", "ref_audio": data_url(&prompt), "instructions": long_text.as_str()})), 400, "limits.max_prompt_text_chars"),
        ("voice ref_text too long", "POST", "/v1/audio/voices",
            speech(json!({"name": "wordy", "ref_text": long_text.as_str(), "ref_audio": data_url(&prompt)})), 400, "limits.max_prompt_text_chars"),
        ("only <|endofprompt|>", "POST", "/v1/audio/speech", speech(json!({"input": "<|endofprompt|>"})), 400, "nothing to speak"),
        ("voice far too quiet audio", "POST", "/v1/audio/voices",
            speech(json!({"name": "faint", "ref_text": "Hi.", "ref_audio": faint})), 400, "nearly silent"),
    ];
    assert!(cases.len() >= 20);
    for (what, method, path, (body, headers), status, needle) in cases {
        let r = server.request(method, path, &headers, &body);
        assert_eq!(r.status, status, "{what}: {}", r.text());
        let message = r.error_message();
        assert!(message.contains(needle), "{what}: message {message:?} should mention {needle:?}");
        assert!(!message.contains('\n'), "{what}: one line");
        good(&server);
    }
    for refused in ["quiet", "wordy", "faint"] {
        assert!(!server.voices_dir().join(format!("{refused}.safetensors")).exists(), "no voice file from a refused upload ({refused})");
    }
    // A truncated request (the client promised more than it sent, then hung up).
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.write_all(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"input\":").unwrap();
    }
    good(&server);
}

#[test]
fn websocket_session_streams_audio_per_segment() {
    use tungstenite::Message;
    let server = start_server(&[]);
    let (mut ws, _) = crate::serve::ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
    let send = |ws: &mut tungstenite::WebSocket<_>, v: serde_json::Value| ws.send(Message::text(v.to_string())).expect("send");
    send(&mut ws, json!({"type": "session.config", "voice": "me", "seed": 3, "text_streaming": "sentences"}));
    // One sentence in pieces; it is spoken at input.done, as `cosy file --stream` speaks it.
    let sentence = "Hello world, how are you today";
    for piece in ["Hello world, ", "how are you", " today"] {
        send(&mut ws, json!({"type": "input.text", "text": piece}));
    }
    send(&mut ws, json!({"type": "input.done"}));
    let mut pcm = Vec::new();
    let mut types = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                let kind = v["type"].as_str().unwrap_or_default().to_string();
                assert_ne!(kind, "error", "{v}");
                types.push(kind.clone());
                if kind == "session.done" {
                    break;
                }
            }
            Message::Binary(b) => {
                types.push("binary".into());
                pcm.extend_from_slice(&b);
            }
            Message::Close(_) => panic!("closed before session.done: {types:?}"),
            _ => {}
        }
    }
    assert_eq!(types.first().map(String::as_str), Some("session.created"));
    assert_eq!(types.get(1).map(String::as_str), Some("audio.start"));
    assert!(types.iter().any(|t| t == "audio.done"));
    let file = cosy_file(&server, &[sentence, "--voice", "me", "--seed", "3", "--stream", "--format", "pcm"]);
    assert!(pcm == file, "WebSocket audio differs from `cosy file --stream` ({} vs {} bytes)", pcm.len(), file.len());

    // Two settled sentences become two segments, the first started before input.done.
    let (mut ws, _) = crate::serve::ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
    send(&mut ws, json!({"type": "session.config", "voice": "me", "text_streaming": "sentences"}));
    send(&mut ws, json!({"type": "input.text", "text": "First sentence here. Second"}));
    // Audio of the settled first sentence arrives while the input is still open.
    loop {
        match ws.read().expect("read") {
            Message::Binary(_) => break,
            Message::Text(t) => assert!(!t.as_str().contains("\"session.done\""), "{t}"),
            Message::Close(_) => panic!("closed before any audio"),
            _ => {}
        }
    }
    send(&mut ws, json!({"type": "input.text", "text": " one."}));
    send(&mut ws, json!({"type": "input.done"}));
    let mut starts = 1; // the first audio.start came before the binary frame
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                match v["type"].as_str() {
                    Some("audio.start") => starts += 1,
                    Some("session.done") => {
                        assert_eq!(v["segments"], 2);
                        break;
                    }
                    Some("error") => panic!("{v}"),
                    _ => {}
                }
            }
            Message::Close(_) => panic!("closed early"),
            _ => {}
        }
    }
    assert_eq!(starts, 2);

    // Bad sessions: an error event with a clear message, then the socket closes.
    for (first, needle) in [
        (json!({"type": "input.text", "text": "hi"}), "session.config"),
        (json!({"type": "session.config", "voice": "nobody"}), "nobody"),
        (json!({"type": "session.config", "response_format": "wav"}), "pcm"),
        (json!({"type": "session.config", "text_streaming": "paragraphs"}), "bistream"),
        (json!({"type": "nonsense"}), "session.config"),
    ] {
        let (mut ws, _) = crate::serve::ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
        send(&mut ws, first.clone());
        let mut saw_error = false;
        loop {
            match ws.read() {
                Ok(Message::Text(t)) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["type"] == "error" {
                        let m = v["error"]["message"].as_str().unwrap_or_default();
                        assert!(m.contains(needle), "{first}: {m}");
                        saw_error = true;
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                _ => {}
            }
        }
        assert!(saw_error, "{first}: no error event");
    }
    // input.done with nothing to say.
    let (mut ws, _) = crate::serve::ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
    send(&mut ws, json!({"type": "session.config"}));
    send(&mut ws, json!({"type": "input.done"}));
    let mut saw_error = false;
    while let Ok(m) = ws.read() {
        if let Message::Text(t) = m {
            saw_error |= t.as_str().contains("\"error\"");
        }
    }
    assert!(saw_error, "an empty session is an error");
    good(&server);
}

#[test]
fn api_key_is_required_when_set() {
    let server = start_server(&["server.api_key=s3cret-key"]);
    let body = json!({"input": "Hi.", "voice": "me", "response_format": "pcm"}).to_string();
    let json_ct = ("Content-Type", "application/json");
    let r = server.request("POST", "/v1/audio/speech", &[json_ct], body.as_bytes());
    assert_eq!(r.status, 401);
    assert!(r.error_message().contains("Authorization: Bearer"));
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    for wrong in ["Bearer s3cret-kez", "Bearer s3cret-key-longer", "Basic s3cret-key", "s3cret-key"] {
        let r = server.request("POST", "/v1/audio/speech", &[json_ct, ("Authorization", wrong)], body.as_bytes());
        assert_eq!(r.status, 401, "{wrong}");
    }
    let r = server.request("POST", "/v1/audio/speech", &[json_ct, ("Authorization", "Bearer s3cret-key")], body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.request("GET", "/v1/audio/voices", &[], b"").status, 401);
    // Probes and metrics need no key.
    assert_eq!(server.request("GET", "/health", &[], b"").status, 200);
    assert_eq!(server.request("GET", "/ready", &[], b"").status, 200);
    assert_eq!(server.request("GET", "/metrics", &[], b"").status, 200);
    // The key never reaches the log.
    assert!(!server.log.lock().unwrap().contains("s3cret"));
    // A WebSocket without the key is refused before the upgrade.
    let err = crate::serve::ws_handshake(server.url("/v1/audio/speech/stream").replace("http://", "ws://")).expect_err("refused");
    assert!(matches!(err, tungstenite::Error::Http(ref r) if r.status() == 401), "{err}");
    let _ = base64(b"");
    let _ = Duration::ZERO;
}

#[test]
fn serve_refuses_bad_settings_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let gc = dir.path().join("gc");
    // A port that is taken: the Wyoming port is opened before the server says it listens.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let cases: [(&[&str], &str); 9] = [
        (&["--model", "/nonexistent-model", "serve", "--bind", "127.0.0.1:0"], "model folder"),
        (&["serve", "--bind", "127.0.0.1:0", "--wyoming", "home-assistant"], "wyoming.bind"),
        (&["serve", "--bind", "127.0.0.1:0", "--wyoming", &taken], "wyoming.bind"),
        // The announcement needs the Wyoming server it announces.
        (&["serve", "--bind", "127.0.0.1:0", "--zeroconf"], "wyoming.zeroconf announces the Wyoming server, which is off"),
        (&["serve", "--bind", "nonsense"], "server.bind"),
        (&["--set", "engine.max_in_flight=0", "serve"], "engine.max_in_flight"),
        // The old name of the same limit is still read, and its errors name what was written.
        (&["--set", "server.max_concurrent=0", "serve"], "server.max_concurrent (now engine.max_in_flight)"),
        (&["--set", "server.max_body_bytes=12", "serve"], "server.max_body_bytes"),
        (&["--set", "server.default_format=aac", "serve"], "server.default_format"),
    ];
    for (args, needle) in cases {
        let mut cmd = crate::common::cosy_command(&gc);
        if args[0] != "--model" {
            cmd.arg("--model").arg(crate::common::fixture_model());
        }
        let out = cmd.args(args).current_dir(dir.path()).output().expect("run cosy serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("listening on"), "{args:?}: refused before listening: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: one line: {stderr}");
    }
}


/// The WebSocket in text-in streaming (its default for a voice with a transcript): the pieces go
/// into one request as they arrive; on the reference model the audio is the official
/// bi-streaming's (tests/fixtures/bistream), the first audio comes before `input.done`, a piece
/// over the text limit is an error event, and a request beside a failing session is undisturbed.
#[test]
fn websocket_bistream_matches_the_official_code() {
    use tungstenite::Message;
    let Some(reference) = crate::common::reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = crate::common::export_reference_model(work.path()) else { return };
    let server = crate::serve::start_server_with(&model, &["text.normalizer=none", "limits.max_text_chars=400"]);
    let url = server.url("/v1/audio/speech/stream").replace("http://", "ws://");
    let send = |ws: &mut tungstenite::WebSocket<_>, v: serde_json::Value| ws.send(Message::text(v.to_string())).expect("send");
    let config = |case: &crate::common::BistreamCase| {
        json!({"type": "session.config", "ref_audio": data_url(&case.prompt_wav(&reference)), "ref_text": case.prompt_text(), "seed": 0})
    };
    /// Reads audio frames until session.done.
    fn collect<S: std::io::Read + std::io::Write>(ws: &mut tungstenite::WebSocket<S>) -> Vec<u8> {
        let mut pcm = Vec::new();
        loop {
            match ws.read().expect("read") {
                Message::Binary(b) => pcm.extend_from_slice(&b),
                Message::Text(t) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                    assert_ne!(v["type"], "error", "{v}");
                    if v["type"] == "session.done" {
                        return pcm;
                    }
                }
                Message::Close(_) => panic!("closed before session.done"),
                _ => {}
            }
        }
    }
    let to_f32 = |pcm: &[u8]| -> Vec<f32> { pcm.chunks_exact(2).map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0).collect() };

    // The WebSocket streams (the streaming chunk schedule), as the official stream=True run.
    let case = crate::common::BistreamCase::load("en_short_stream");
    let (mut ws, _) = crate::serve::ws_connect(&url);
    send(&mut ws, config(&case));
    for piece in case.pieces() {
        send(&mut ws, json!({"type": "input.text", "text": piece}));
    }
    send(&mut ws, json!({"type": "input.done"}));
    let audio = to_f32(&collect(&mut ws));
    let official = case.audio();
    assert_eq!(audio.len(), official.len(), "audio length");
    let d = crate::common::log_mel_distance(&audio, &official);
    assert!(d < 0.025, "mean |Δ log-mel| {d}");

    // Word by word: audio arrives while the input is still open.
    let case = crate::common::BistreamCase::load("en_long_stream");
    let (mut ws, _) = crate::serve::ws_connect(&url);
    send(&mut ws, config(&case));
    for piece in case.pieces() {
        send(&mut ws, json!({"type": "input.text", "text": piece}));
    }
    let mut early = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Binary(b) => {
                early.extend_from_slice(&b);
                break;
            }
            Message::Text(t) => assert!(!t.as_str().contains("error"), "{t}"),
            Message::Close(_) => panic!("closed early"),
            _ => {}
        }
    }
    send(&mut ws, json!({"type": "input.done"}));
    // The official run ends where the LLM samples a stop id mid-text (random weights; it raises
    // there): the first segment is that audio. The text it did not take is not dropped: it is
    // spoken as the next segments (docs/server.md), and the segments' texts are all the pieces.
    let mut dones = Vec::new();
    let mut rest = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Binary(b) if dones.is_empty() => early.extend_from_slice(&b),
            Message::Binary(b) => rest.extend_from_slice(&b),
            Message::Text(t) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                assert_ne!(v["type"], "error", "{v}");
                if v["type"] == "audio.done" {
                    dones.push(v.clone());
                }
                if v["type"] == "session.done" {
                    break;
                }
            }
            Message::Close(_) => panic!("closed before session.done"),
            _ => {}
        }
    }
    let official = case.audio();
    assert_eq!(early.len() / 2, official.len());
    assert!(crate::common::log_mel_distance(&to_f32(&early), &official) < 0.025);
    let spoken: String = dones.iter().map(|d| d["text"].as_str().unwrap_or_default()).collect();
    assert_eq!(spoken, case.pieces().concat(), "every piece is spoken: {dones:?}");
    assert_eq!(dones.len() > 1, dones[0]["ended_early"] == true, "{dones:?}");

    // A piece over the text limit: an error event; a request beside it is undisturbed.
    let (mut ws, _) = crate::serve::ws_connect(&url);
    send(&mut ws, config(&case));
    send(&mut ws, json!({"type": "input.text", "text": "word ".repeat(100)}));
    let mut error = None;
    while let Ok(m) = ws.read() {
        if let Message::Text(t) = m {
            let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
            if v["type"] == "error" {
                error = v["error"]["message"].as_str().map(str::to_string);
            }
        }
    }
    assert!(error.as_deref().is_some_and(|m| m.contains("limits.max_text_chars")), "{error:?}");
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hello there.", "voice": "me", "seed": 1}));
    assert_eq!(r.status, 200, "{}", r.text());
    server.wait_for("nothing in flight", Duration::from_secs(60), |s| s.metric("cosy_requests_in_flight") == 0.0);
}

/// `GET /v1/audio/voices` reads each voice file's header only (as `cosy voice list`): a 3 GB stray
/// file, a dangling link, a truncated voice and another model's voice are each listed as what
/// they are, and the server's peak memory does not move by anything like the stray file's size.
#[test]
fn voice_listing_reads_headers_only_and_names_broken_entries() {
    let server = start_server(&[]);
    let [huge, dangling, cut, foreign] = crate::common::broken_voices(&server.voices_dir(), "me");
    let before = server.peak_rss_bytes();
    let r = server.request("GET", "/v1/audio/voices", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let grown = server.peak_rss_bytes().saturating_sub(before);
    assert!(grown < 100 << 20, "listing raised the server's peak memory by {} MB", grown >> 20);
    let v = r.json();
    let data = v["data"].as_array().expect("data");
    let entry = |name: &str| data.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("{name} listed: {v}"));
    assert_eq!(data.len(), 5, "{v}");
    assert_eq!(entry("me")["usable"], true);
    assert_eq!(entry("me")["default"], true);
    for (name, says) in [(huge, "not a voice file"), (dangling, "symbolic link"), (cut, "truncated")] {
        assert_eq!(entry(name)["usable"], false, "{v}");
        assert!(entry(name)["error"].as_str().unwrap_or("").contains(says), "{name}: {v}");
    }
    assert_eq!(entry(foreign)["usable"], false, "{v}");
    assert!(entry(foreign)["error"].is_null() && entry(foreign)["transcript"].is_string(), "{v}");
    let picker: Vec<(&str, &str)> =
        v["voices"].as_array().unwrap().iter().map(|e| (e["id"].as_str().unwrap(), e["name"].as_str().unwrap())).collect();
    assert!(picker.contains(&(foreign, "foreign (made for another model)")), "{picker:?}");
    assert!(picker.contains(&(huge, "huge (unusable: see data)")), "{picker:?}");
}

/// A WebSocket session of `config` sent `pieces` then `input.done`: the text of each segment
/// (`audio.start`) and the `session.created` event, or the error the session ended with.
fn ws_segments(server: &Server, config: serde_json::Value, pieces: &[&str]) -> Result<(Vec<String>, serde_json::Value), String> {
    use tungstenite::Message;
    let (mut ws, _) = crate::serve::ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
    let send = |ws: &mut tungstenite::WebSocket<_>, v: serde_json::Value| ws.send(Message::text(v.to_string())).expect("send");
    send(&mut ws, config);
    for piece in pieces {
        send(&mut ws, json!({"type": "input.text", "text": piece}));
    }
    send(&mut ws, json!({"type": "input.done"}));
    let (mut texts, mut created) = (Vec::new(), json!(null));
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                match v["type"].as_str() {
                    Some("audio.start") => texts.push(v["text"].as_str().unwrap_or_default().to_string()),
                    Some("session.created") => created = v,
                    Some("session.done") => return Ok((texts, created)),
                    Some("error") => return Err(v.to_string()),
                    _ => {}
                }
            }
            Ok(Message::Close(_)) | Err(_) => return Err(format!("closed before session.done: {texts:?}")),
            Ok(_) => {}
        }
    }
}

/// The texts of the segments a WebSocket session says (each `audio.start`'s) for `config` (a
/// `session.config`) and the text `pieces`; the session must create no ignored fields.
fn ws_segment_texts(server: &Server, config: serde_json::Value, pieces: &[&str]) -> Vec<String> {
    let (texts, created) = ws_segments(server, config, pieces).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(created["ignored_fields"], json!([]), "{created}");
    texts
}

/// A language model's reply sent in pieces over the WebSocket ("sentences") is read as Markdown
/// across the pieces (issue 32): the segments' texts are the reply as a person reads it, the same
/// as the whole reply reads; `normalization: {"markdown": false}` gives it as written. The HTTP
/// API takes the same object.
#[test]
fn websocket_reads_markdown_across_pieces_unless_asked_not_to() {
    let server = start_server(&[]);
    let pieces = ["**Bo", "ld** claim: see [the do", "cs](https://exa", "mple.com/a_b?x=1) 😀 and `cargo", " build`.\n\n- item one\n- it", "em two"];
    let segments = |config: serde_json::Value| ws_segment_texts(&server, config, &pieces);
    let read = segments(json!({"type": "session.config", "voice": "me", "text_streaming": "sentences"}));
    assert_eq!(read.concat(), "Bold claim: see the docs and cargo build.\n\nitem one.\nitem two", "{read:?}");
    let written = segments(json!({"type": "session.config", "voice": "me", "text_streaming": "sentences", "normalization": {"markdown": false}}));
    assert_eq!(written.concat(), pieces.concat(), "{written:?}");
    let r = server.post_json("/v1/audio/speech", &json!({"input": "**Hi** there.", "voice": "me", "stream": false, "normalization": {"markdown": false}}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-cosy-ignored-fields"), None);
}

/// The `normalization` object switches each category (issue 32, point 2): over the WebSocket
/// the segments' texts show phone numbers, units, URLs and emoji read or left as written, as the
/// object says, the same across pieces; over HTTP `"numbers": false` gives the model the digits
/// (fewer text tokens than the spelt-out words), and a bad `symbols` value is refused naming it.
#[test]
fn normalization_object_switches_categories_over_http_and_websocket() {
    let server = start_server(&[]);
    let pieces = ["Call +1 555-0", "123 about the 5 k", "m run at https://exa", "mple.com, 3 items 😀", "."];
    let segments = |normalization: serde_json::Value| {
        let config = json!({"type": "session.config", "voice": "me", "text_streaming": "sentences", "normalization": normalization});
        ws_segment_texts(&server, config, &pieces).concat()
    };
    assert_eq!(segments(json!({"phone": true})), "Call plus 1, 5 5 5, 0 1 2 3 about the 5 kilometers run at example dot com, 3 items.");
    assert_eq!(segments(json!({"urls": false, "units": false, "symbols": "keep"})), pieces.concat());
    assert_eq!(segments(json!({"symbols": "name", "numbers": false})), "Call +1 555-0123 about the 5 kilometers run at example dot com, 3 items grinning face.");

    let input_tokens = |normalization: serde_json::Value| -> u64 {
        let body = json!({"input": "I have 12345 apples and 67890 pears.", "voice": "me", "stream_format": "sse", "response_format": "pcm", "normalization": normalization});
        let r = server.post_json("/v1/audio/speech", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-cosy-ignored-fields"), None);
        let done = r.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).last().map(|d| serde_json::from_str::<serde_json::Value>(d).expect("event JSON")).expect("events");
        done["usage"]["input_tokens"].as_u64().expect("input_tokens")
    };
    let (spelt, digits) = (input_tokens(json!({})), input_tokens(json!({"numbers": false})));
    assert!(digits < spelt, "numbers off: the digits as written ({digits} tokens), not the words ({spelt})");
    let r = server.post_json("/v1/audio/speech", &json!({"input": "Hi.", "voice": "me", "normalization": {"symbols": "shout"}}));
    assert_eq!(r.status, 400, "{}", r.text());
    let error: serde_json::Value = serde_json::from_str(&r.text()).expect("error JSON");
    assert_eq!(error["error"]["message"], "normalization.symbols \"shout\" is not one of \"drop\", \"name\", \"keep\"", "{error}");
    assert_eq!(error["error"]["param"], "normalization", "{error}");
}

/// `input_format` (issue 32, point 3): "ssml" reads a text without `<speak>` as if inside one (the
/// same audio as the text inside `<speak>`), its errors placed in the text as sent; "text" reads
/// a leading `<speak>` as text; absent, only a leading `<speak>` is SSML; another value is
/// refused, naming the field.
#[test]
fn input_format_says_whether_the_input_is_ssml() {
    let server = start_server(&[]);
    let speak = |input: &str, format: Option<&str>| {
        let mut body = json!({"input": input, "voice": "me", "seed": 3, "stream": false, "response_format": "wav"});
        if let Some(format) = format {
            body["input_format"] = format.into();
        }
        server.post_json("/v1/audio/speech", &body)
    };
    let inner = r#"Call <sub alias="the consortium">W3C</sub>. <break time="250ms"/> Bye."#;
    let wrapped = speak(&format!("<speak>{inner}</speak>"), None);
    assert_eq!(wrapped.status, 200, "{}", wrapped.text());
    let ssml = speak(inner, Some("ssml"));
    assert_eq!(ssml.status, 200, "{}", ssml.text());
    assert_eq!(ssml.header("x-cosy-ignored-fields"), None);
    assert!(ssml.body == wrapped.body, "input_format ssml reads the text as inside <speak>");
    // Errors: "ssml" places them in the text as sent; auto would read it as text.
    let r = speak("Hi <b>x</b>.", Some("ssml"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["message"], "invalid SSML at line 1, column 4: <b> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme, prosody)");
    assert_eq!(speak("Hi <b>x</b>.", None).status, 200);
    // "text": a leading <speak> that is not well-formed XML is text (its tags dropped as HTML).
    let broken = "<speak>Hi <b>there.</speak>";
    assert_eq!(speak(broken, None).status, 400);
    let r = speak(broken, Some("text"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = speak("Hi.", Some("xml"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "input_format", "{}", r.text());
}

/// SSML sent in pieces over the WebSocket (issue 32): with `input_format: "ssml"` (or a stream
/// that starts with `<speak>`) the text is held until `input.done` and read whole, one segment
/// (sentences, the default then); text-in streaming ("bistream") cannot read it and is refused.
#[test]
fn websocket_reads_ssml_whole() {
    let server = start_server(&[]);
    let run = |config: serde_json::Value, pieces: &[&str]| ws_segments(&server, config, pieces);
    let pieces = ["One. <break time=\"250ms\"/> Tw", "o <sub alias=\"three\">", "3</sub>."];
    let (texts, created) = run(json!({"type": "session.config", "voice": "me", "seed": 1, "input_format": "ssml"}), &pieces).expect("spoken");
    assert_eq!(texts, vec![pieces.concat()], "one segment, the whole text");
    assert_eq!(created["text_streaming"], "sentences", "{created}");
    let spoken = format!("<speak>{}</speak>", pieces.concat());
    let (texts, _) = run(json!({"type": "session.config", "voice": "me", "seed": 1, "text_streaming": "sentences"}), &[&spoken[..9], &spoken[9..]]).expect("spoken");
    assert_eq!(texts, vec![spoken.clone()], "a stream that starts with <speak> is held too");
    let refused = run(json!({"type": "session.config", "voice": "me", "input_format": "ssml", "text_streaming": "bistream"}), &pieces).expect_err("refused");
    assert!(refused.contains("SSML is read whole"), "{refused}");
}
