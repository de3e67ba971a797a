//! Issue 32's acceptance table (tests/data/text_cases.json): for every input, the sentences the
//! model gets from the whole text (`cosy file --show-text`) are the table's, and the same text
//! reaches the model when the input is streamed in seeded random chunkings through the WebSocket
//! ("sentences" segmenting) and Wyoming (`synthesize-start` / `-chunk` / `-stop`), as one server
//! started with `debug.model_text` tells it (each text checked against its tokens).
//!
//! "The same text": a whole text's sentences are grouped by the official frontend, a streamed
//! text's by its settled sentences (one request each), so the texts are compared joined, without
//! the blanks and line breaks at which either cut them. One known difference is allowed through
//! Wyoming (text-in streaming normalises each settled sentence without the official splitting):
//! the full stop the official frontend adds at the end of a whole text that has none.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tungstenite::Message;

use crate::common::fixture_model;
use crate::serve::{start_server, ws_connect, Server};

/// Seeded chunkings of every input through the WebSocket (a few speech tokens a sentence: quick).
const CHUNKINGS: u64 = 3;
/// Seeded chunkings through Wyoming, whose text-in streaming cannot be cut short by the test hook
/// (it would end segments early, see the marked cases): each costs a whole synthesis, so one.
const WYOMING_CHUNKINGS: u64 = 1;
/// A hang guard on every read (not a timing assertion).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

struct Case {
    name: String,
    input: String,
    /// What `cosy file --show-text` prints, a line break inside a sentence as itself.
    model: Vec<String>,
    /// Why the case is not streamed there (`None`: it is).
    not_websocket: Option<String>,
    not_wyoming: Option<String>,
}

fn table() -> (String, Vec<Case>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/text_cases.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read the table")).expect("the table is JSON");
    let text = |v: &Value| v.as_str().map(str::to_string);
    let cases = doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            name: text(&c["name"]).expect("name"),
            input: text(&c["input"]).expect("input"),
            model: c["model"].as_array().expect("model").iter().map(|s| text(s).expect("a sentence")).collect(),
            not_websocket: text(&c["not_websocket"]),
            not_wyoming: text(&c["not_wyoming"]),
        })
        .collect();
    (text(&doc["lexicon"]).expect("lexicon"), cases)
}

/// `text` cut at seeded random places (never inside a character), into two to a dozen pieces.
fn chunking(text: &str, seed: u64) -> Vec<String> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    let cuts = if bounds.is_empty() { 0 } else { 1 + next() % bounds.len().min(12) };
    let mut at: Vec<usize> = (0..cuts).map(|_| bounds[next() % bounds.len()]).collect();
    at.sort_unstable();
    at.dedup();
    let mut pieces = Vec::new();
    let mut start = 0;
    for cut in at.into_iter().chain([text.len()]) {
        pieces.push(text[start..cut].to_string());
        start = cut;
    }
    pieces
}

/// The sentences of a whole text as the model gets them: `cosy file --show-text` (same model,
/// voices and lexicon as the server), a line break written `\n` turned back into one.
fn show_text(server: &Server, lexicon: &Path, input: &str) -> Vec<String> {
    let out = crate::common::cosy_command(&server.dir.path().join("gc"))
        .arg("--model")
        .arg(fixture_model())
        .args(["--set", &format!("voices.dir={}", server.voices_dir().display())])
        .args(["--set", &format!("text.lexicon={}", lexicon.display())])
        .args(["file", "--show-text", "--voice", "me", "--"])
        .arg(input)
        .output()
        .expect("cosy file --show-text");
    assert!(out.status.success(), "cosy file --show-text {input:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8").lines().map(unescape).collect()
}

/// A `--show-text` line as the sentence it shows (`\n`, `\r`, `\\`).
fn unescape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// What the comparison reads: the sentences' texts joined, pauses left out (a streamed text's
/// model texts are the tokenised texts only), without blanks.
fn joined<S: AsRef<str>>(sentences: &[S]) -> String {
    sentences
        .iter()
        .map(AsRef::as_ref)
        .filter(|s| !(s.starts_with("[pause: ") && s.ends_with(" samples of silence]")))
        .flat_map(|s| s.chars().filter(|c| !c.is_whitespace()))
        .collect()
}

/// `streamed` is `whole`, or `whole` but the full stop the official frontend adds at the end of a
/// whole text (text-in streaming normalises settled sentences without the official splitting).
fn same_but_the_final_stop(streamed: &str, whole: &str) -> bool {
    streamed == whole || [".", "。"].iter().any(|stop| whole.strip_suffix(stop) == Some(streamed))
}

/// A `debug.model_text` / `cosy-model-text` event's text, checked against its tokens.
fn model_text(data: &Value, tokenizer: &cosy::frontend::tokenizer::TextTokenizer) -> String {
    let text = data["text"].as_str().unwrap_or_else(|| panic!("no text: {data}")).to_string();
    let tokens: Vec<u32> = data["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("a token id") as u32).collect();
    assert_eq!(tokenizer.encode(&text).expect("encode").as_slice(), tokens.as_slice(), "the text is what was tokenised: {data}");
    text
}

/// The model's texts of one WebSocket session ("sentences") speaking `pieces`.
fn websocket(server: &Server, pieces: &[String], tokenizer: &cosy::frontend::tokenizer::TextTokenizer) -> Result<Vec<String>, String> {
    let (mut ws, _) = ws_connect(&server.url("/v1/audio/speech/stream").replace("http://", "ws://"));
    let mut send = |v: Value| ws.send(Message::text(v.to_string())).expect("send");
    send(json!({"type": "session.config", "voice": "me", "text_streaming": "sentences", "cosy_test": {"max_tokens": 2}}));
    for piece in pieces {
        send(json!({"type": "input.text", "text": piece}));
    }
    send(json!({"type": "input.done"}));
    let mut texts = Vec::new();
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).expect("event JSON");
                match v["type"].as_str() {
                    Some("debug.model_text") => texts.push(model_text(&v, tokenizer)),
                    Some("session.done") => return Ok(texts),
                    Some("error") => return Err(format!("an error after {texts:?}: {v}")),
                    _ => {}
                }
            }
            Message::Close(_) => panic!("{pieces:?}: closed before session.done: {texts:?}"),
            _ => {}
        }
    }
}

/// One Wyoming event: its header line, data and payload.
fn wyoming_send(tcp: &mut TcpStream, kind: &str, data: Value) {
    let data = data.to_string();
    let header = json!({"type": kind, "version": "1.6.0", "data_length": data.len()});
    tcp.write_all(format!("{header}\n{data}").as_bytes()).expect("send a Wyoming event");
}

/// The next Wyoming event: its type and data (its payload read and dropped).
fn wyoming_read(reader: &mut BufReader<TcpStream>) -> (String, Value) {
    let mut line = String::new();
    reader.read_line(&mut line).expect("read a Wyoming header");
    let header: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("header {line:?}: {e}"));
    let read = |reader: &mut BufReader<TcpStream>, field: &str| {
        let mut bytes = vec![0; header[field].as_u64().unwrap_or(0) as usize];
        reader.read_exact(&mut bytes).expect("read a Wyoming event's body");
        bytes
    };
    let data = read(reader, "data_length");
    read(reader, "payload_length");
    let mut data: Value = if data.is_empty() { header["data"].clone() } else { serde_json::from_slice(&data).expect("event data JSON") };
    if data.is_null() {
        data = json!({});
    }
    (header["type"].as_str().expect("type").to_string(), data)
}

/// The model's texts of one Wyoming stream speaking `pieces` (text-in streaming, `wyoming.normalize`).
fn wyoming(port: u16, pieces: &[String], tokenizer: &cosy::frontend::tokenizer::TextTokenizer) -> Result<Vec<String>, String> {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect to Wyoming");
    tcp.set_read_timeout(Some(READ_TIMEOUT)).expect("read timeout");
    let mut reader = BufReader::new(tcp.try_clone().expect("clone"));
    wyoming_send(&mut tcp, "synthesize-start", json!({"voice": {"name": "me"}}));
    for piece in pieces {
        wyoming_send(&mut tcp, "synthesize-chunk", json!({"text": piece}));
    }
    wyoming_send(&mut tcp, "synthesize-stop", json!({}));
    let mut texts = Vec::new();
    loop {
        match wyoming_read(&mut reader) {
            (kind, data) if kind == "cosy-model-text" => texts.push(model_text(&data, tokenizer)),
            (kind, _) if kind == "synthesize-stopped" => return Ok(texts),
            (kind, data) if kind == "error" => return Err(format!("an error after {texts:?}: {data}")),
            _ => {}
        }
    }
}

/// Every case of the table, whole and streamed: one server for all of them, the tiny model, a
/// few speech tokens per sentence (the test hook `max_tokens`): what is checked is the text.
#[test]
fn the_text_table_reaches_the_model_the_same_whole_and_streamed() {
    let (lexicon_toml, cases) = table();
    assert!(cases.len() >= 40, "the table has {} cases; issue 32 asks for at least 40", cases.len());
    let files = tempfile::tempdir().expect("temp dir");
    let lexicon = files.path().join("lexicon.toml");
    std::fs::write(&lexicon, lexicon_toml).expect("write the lexicon");
    let server = start_server(&[
        "debug.test_hooks=true",
        "debug.model_text=true",
        "wyoming.bind=127.0.0.1:0",
        &format!("text.lexicon={}", lexicon.display()),
    ]);
    // Printed before the model loads, but read from stderr by another thread: waited for.
    server.wait_for("the Wyoming address in the log", std::time::Duration::from_secs(60), |s| {
        s.log.lock().unwrap().contains("cosy serve: wyoming on tcp://")
    });
    let wyoming_port: u16 = {
        let log = server.log.lock().unwrap().clone();
        let at = log.lines().find_map(|l| l.strip_prefix("cosy serve: wyoming on tcp://127.0.0.1:")).unwrap_or_else(|| panic!("no Wyoming address: {log}"));
        at.trim().parse().expect("the Wyoming port")
    };
    let tokenizer = cosy::frontend::tokenizer::TextTokenizer::from_file(&fixture_model().join("tokenizer.json")).expect("the tokenizer");
    let mut failures = Vec::new();
    for case in &cases {
        let whole = show_text(&server, &lexicon, &case.input);
        if whole != case.model {
            failures.push(format!("{}: whole text {:?}: the model gets {whole:?}, the table says {:?}", case.name, case.input, case.model));
        }
        let expected = joined(&whole);
        for seed in 0..CHUNKINGS {
            let pieces = chunking(&case.input, seed);
            if case.not_websocket.is_none() {
                match websocket(&server, &pieces, &tokenizer) {
                    Ok(texts) if joined(&texts) == expected => {}
                    Ok(texts) => failures.push(format!("{}: WebSocket {pieces:?}: the model gets {texts:?}, whole {whole:?}", case.name)),
                    Err(e) => failures.push(format!("{}: WebSocket {pieces:?}: {e}", case.name)),
                }
            }
            if case.not_wyoming.is_none() && seed < WYOMING_CHUNKINGS {
                match wyoming(wyoming_port, &pieces, &tokenizer) {
                    Ok(texts) if same_but_the_final_stop(&joined(&texts), &expected) => {}
                    Ok(texts) => failures.push(format!("{}: Wyoming {pieces:?}: the model gets {texts:?}, whole {whole:?}", case.name)),
                    Err(e) => failures.push(format!("{}: Wyoming {pieces:?}: {e}", case.name)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of the table's checks differ:\n{}", failures.len(), failures.join("\n"));
}
