//! `engine.idle_unload_s` in the server (issue 34): after the idle time the model is dropped and
//! the process's resident memory falls back (towards the level before the model was loaded);
//! `/ready` stays 200 and says `"model": "unloaded"`, `cosy_model_loaded` is 0; the next request
//! loads it again and gets the same bytes. Every wait polls for the state with a hang guard only.

use std::time::Duration;

use serde_json::json;

use crate::serve::{start_server, Server};

const GUARD: Duration = Duration::from_secs(180);

fn model_state(server: &Server) -> String {
    let r = server.request("GET", "/ready", &[], b"");
    assert_eq!(r.status, 200, "/ready stays 200 whether or not the model is in memory: {}", r.text());
    r.json()["model"].as_str().unwrap_or_default().to_string()
}

fn speak(server: &Server) -> Vec<u8> {
    let r = server.post_json("/v1/audio/speech", &json!({"input": "The model comes back.", "voice": "me", "seed": 3, "stream": false}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.body
}

#[test]
fn idle_unload_gives_memory_back_and_the_next_request_loads_the_model() {
    let server = start_server(&["engine.idle_unload_s=1"]);
    // The resident size with the model in memory: read between two looks that both say it was
    // loaded (nothing else talks to this server, so it cannot have been dropped and loaded again).
    let mut loaded_rss = None;
    let mut first = Vec::new();
    for _ in 0..5 {
        first = speak(&server);
        let before = server.metric("cosy_model_loaded");
        let rss = server.rss_bytes();
        if before == 1.0 && server.metric("cosy_model_loaded") == 1.0 {
            loaded_rss = Some(rss);
            break;
        }
    }
    let loaded_rss = loaded_rss.expect("the model stayed loaded long enough to read the memory once in five tries");

    server.wait_for("the model is unloaded after engine.idle_unload_s", GUARD, |s| model_state(s) == "unloaded");
    assert_eq!(server.metric("cosy_model_loaded"), 0.0);
    let unloaded_rss = server.rss_bytes();
    eprintln!("resident: {} MB loaded, {} MB unloaded", loaded_rss >> 20, unloaded_rss >> 20);
    // The sessions of the tiny model take tens of megabytes (the ONNX Runtime arenas and the
    // intra-op thread pools); dropped, most of that goes back.
    assert!(
        unloaded_rss + (16 << 20) < loaded_rss,
        "resident memory did not fall when the model was dropped: {} MB loaded, {} MB unloaded",
        loaded_rss >> 20,
        unloaded_rss >> 20
    );

    // Counted from here: on a busy machine the server may already have dropped and loaded the
    // model again before the first request above (its idle time is 1 s from its start).
    let loads_before = server.metric("cosy_model_loads_total");
    let again = speak(&server);
    assert!(again == first, "the same bytes after the model was loaded again");
    assert_eq!(server.metric("cosy_model_loads_total"), loads_before + 1.0, "this request loaded the model once");
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("model loaded again in"), "the log says the request paid a load: {log}");
}
