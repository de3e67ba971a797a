//! Text-in streaming against the official code: `tests/fixtures/bistream/<case>/` holds what the
//! unmodified official CosyVoice3 code (`inference_zero_shot` / `inference_instruct2` with a text
//! generator, i.e. `Qwen2LM.inference_bistream`) produced on the shared reference tiny model, greedy:
//! the text pieces, the speech tokens it yielded (and its raw tokens with the fill tokens), and the
//! audio. The runtime, fed the same pieces, must yield the same tokens and audio within the golden
//! tolerance (mean |Δ log-mel| 0.025, the reference compare.py's). How the data was recorded:
//! tests/fixtures/bistream/README.md.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cosy::config::{Config, LoadOptions};
use cosy::engine::{BistreamOptions, Engine};
use cosy::request::{Request, SynthesisObserver, Voice};

use crate::common::{export_reference_model, log_mel_distance, reference_dir, BistreamCase};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bistream")
}

/// CPU, no text normaliser (the recordings normalised nothing; English numbers are still
/// spelt out by the official inflect rule), no graph cache.
fn reference_config(model: &Path) -> Config {
    let opts = LoadOptions {
        flags: vec![
            ("model.dir".into(), model.display().to_string()),
            ("runtime.providers".into(), "cpu".into()),
            ("text.normalizer".into(), "none".into()),
            ("runtime.graph_cache_enabled".into(), "false".into()),
        ],
        ..LoadOptions::default()
    };
    Config::load(&opts).expect("config")
}

struct Tokens(Mutex<Vec<i64>>);
impl SynthesisObserver for Tokens {
    fn llm_token(&self, _sentence: usize, _index: usize, token: i64) {
        self.0.lock().unwrap().push(token);
    }
}

#[test]
fn bistream_matches_the_official_tokens_and_audio() {
    let Some(reference) = reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = export_reference_model(work.path()) else { return };
    let config = reference_config(&model);
    let engine = Engine::load(&config).expect("load the exported reference model");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(fixtures()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    cases.sort();
    assert!(cases.len() >= 5, "the recorded cases are there");
    for dir in cases {
        let case = BistreamCase::load(&dir.file_name().unwrap().to_string_lossy());
        let name = case.name.clone();
        let meta = &case.meta;
        let pieces = case.pieces();
        let wav = case.prompt_wav(&reference);
        let prompt_text = case.prompt_text();
        let voice = match meta["mode"].as_str() {
            Some("zero_shot") => Voice::ZeroShot { wav, transcript: prompt_text },
            Some("instruct2") => Voice::Instruct { wav, instruction: prompt_text },
            other => panic!("{name}: mode {other:?}"),
        };
        let mut req = Request::new(String::new(), voice);
        req.text_frontend = meta["text_frontend"].as_bool().unwrap_or(true);
        req.seed = meta["seed"].as_u64();
        req.stream = meta["stream"].as_bool().unwrap_or(false);
        let observer = std::sync::Arc::new(Tokens(Mutex::new(Vec::new())));
        let (mut feed, handle) = engine.submit_bistream(req, BistreamOptions::default(), Some(observer.clone())).unwrap();
        for piece in &pieces {
            feed.send(piece.clone()).unwrap();
        }
        feed.finish();
        let (audio, summary) = handle.wait().unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = observer.0.lock().unwrap().clone();
        let want = case.tokens();
        assert_eq!(got, want, "{name}: the speech tokens differ from the official bi-streaming output");
        assert_eq!(summary.speech_tokens, want.len(), "{name}");
        let official = case.audio();
        assert_eq!(audio.len(), official.len(), "{name}: audio length");
        let d = log_mel_distance(&audio, &official);
        assert!(d < 0.025, "{name}: mean |Δ log-mel| {d} over the golden tolerance 0.025");
        eprintln!("{name}: {} tokens, {} samples, mean |Δ log-mel| {d:.2e}", got.len(), audio.len());
    }
}

/// Text-in streaming inside the engine, beside other requests: a streamed request, a whole-text
/// request and a streamed request whose text fails before it is spoken run at once; the first
/// gives the official tokens, the second the same audio as alone, the third its error, and the
/// LLM steps were batched. The engine's test hook makes the first prefill wait for two sentences,
/// so the batching does not depend on how fast the machine is.
#[test]
fn bistream_runs_in_the_engine_beside_other_requests() {
    bistream_beside_other_requests(cosy::config::LlmKv::Growing);
}

/// The same over the static slot cache (`engine.llm_kv = "static"`, graph `llm_step`, issue 29):
/// text fed mid-decode extends a row in its slot; the official tokens again.
#[test]
fn bistream_beside_other_requests_with_the_static_kv_cache() {
    bistream_beside_other_requests(cosy::config::LlmKv::Static);
}

fn bistream_beside_other_requests(llm_kv: cosy::config::LlmKv) {
    use std::sync::Arc;
    let Some(reference) = reference_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let Some(model) = export_reference_model(work.path()) else { return };
    let mut config = reference_config(&model);
    config.engine.llm_kv = llm_kv;
    let engine = Engine::builder(&config).llm_gather_first(2).build().expect("engine");
    let case = BistreamCase::load("en_short");
    let voice = Voice::ZeroShot { wav: case.prompt_wav(&reference), transcript: case.prompt_text() };
    let request = |text: &str, seed: u64| {
        let mut r = Request::new(text, voice.clone());
        r.text_frontend = false;
        r.seed = Some(seed);
        r
    };
    let whole_text = "The fishermen turned their boats toward the shore.";

    let tokens = Arc::new(Tokens(Mutex::new(Vec::new())));
    let (mut feed, streamed) = engine.submit_bistream(request("", 0), BistreamOptions::default(), Some(tokens.clone())).unwrap();
    let (mut bad_feed, failing) = engine.submit_bistream(request("", 0), BistreamOptions::default(), None).unwrap();
    let whole = engine.submit(request(whole_text, 7)).unwrap();
    // Fewer text tokens than the first prompt-mixing round takes, then the error: the failing
    // request never reaches the LLM, so the two sentences the hook waits for are the others.
    bad_feed.send("The old").unwrap();
    bad_feed.fail(cosy::Error::invalid("<stdin>: invalid UTF-8 at byte 20; send UTF-8 text"));
    for piece in case.pieces() {
        feed.send(piece).unwrap();
    }
    feed.finish();
    let (streamed_audio, _) = streamed.wait().expect("the streamed request");
    let (whole_audio, _) = whole.wait().expect("the whole-text request");
    let err = failing.wait().expect_err("the failing stream");
    assert!(err.to_string().contains("invalid UTF-8"), "{err}");
    assert_eq!(tokens.0.lock().unwrap().clone(), case.tokens(), "official tokens beside other requests");
    assert!(log_mel_distance(&streamed_audio, &case.audio()) < 0.025);
    // The same request alone, after the others (the hook only holds the first prefill).
    let (solo, _) = engine.submit(request(whole_text, 7)).unwrap().wait().unwrap();
    assert_eq!(whole_audio.len(), solo.len());
    let peak = solo.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let worst = whole_audio.iter().zip(&solo).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 2e-3 * peak, "the whole-text request is undisturbed: {worst} vs peak {peak}");
    let (llm, _) = engine.batch_stats();
    assert!(llm.max_rows >= 2, "LLM steps were batched: {llm:?}");
    // A request's slot is given back before its last event is sent.
    assert_eq!((engine.in_flight(), engine.queued()), (0, 0), "slots freed");
}

/// The normalising option regroups streamed text into settled sentences and normalises each
/// (numbers read as words); the exact mode (the default) passes pieces through as written.
#[test]
fn normalize_sentences_regroups_and_normalises_settled_text() {
    let synth = Engine::load(&reference_config(&crate::common::fixture_model())).unwrap();
    let pieces = ["I have 3 ", "apples. And", " 12 more"].map(|p| Ok(p.to_string()));
    let out: Vec<String> = synth.normalize_sentences(Default::default(), pieces).collect::<cosy::Result<_>>().unwrap();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out[0].contains("three") && out[0].ends_with("apples."), "{out:?}");
    assert!(out[1].starts_with(' ') && out[1].contains("twelve"), "{out:?}");
    // An error in the stream comes through.
    let failing = vec![Ok("Hi. ".to_string()), Err(cosy::Error::invalid("broken"))];
    let r: cosy::Result<Vec<String>> = synth.normalize_sentences(Default::default(), failing).collect();
    assert!(r.is_err());
}

/// The test hook `max_tokens` ends a segment's speech after that many speech tokens, as the
/// model's stop token would, whatever the random weights sample: a text-in streaming request
/// whose text is still open ends by itself, having taken only part of it (what `app::text_in`
/// counts as an early end); a whole-text request's sentences each end there, without an error.
/// An engine not started for tests refuses the hook.
#[test]
fn max_tokens_hook_ends_the_speech_before_its_text() {
    use cosy::request::TestHooks;
    let opts = LoadOptions {
        flags: vec![
            ("model.dir".into(), crate::common::fixture_model().display().to_string()),
            ("runtime.providers".into(), "cpu".into()),
            ("runtime.graph_cache_enabled".into(), "false".into()),
        ],
        ..LoadOptions::default()
    };
    let config = Config::load(&opts).unwrap();
    let voice = Voice::ZeroShot { wav: crate::common::fixture_prompt(), transcript: "Hello there, this is a test.".into() };
    let hooked = |text: &str, max: usize| {
        let mut r = Request::new(text, voice.clone());
        r.stream = true;
        // A seed whose own end comes later than 8 tokens (some stop after 2 on this random
        // model), so the count checked below is the hook's.
        r.seed = Some(1);
        r.test_hooks = TestHooks { max_tokens: Some(max), ..TestHooks::default() };
        r
    };
    let plain = Engine::load(&config).unwrap();
    let err = plain.submit_bistream(hooked("", 8), BistreamOptions::default(), None).err().expect("refused without test hooks");
    assert!(err.to_string().contains("debug.test_hooks"), "{err}");
    drop(plain);

    let engine = Engine::builder(&config).test_hooks(true).build().unwrap();
    let refused = engine.submit(hooked("Hi.", 0)).err().expect("max_tokens 0 refused");
    assert!(refused.to_string().contains("max_tokens"), "{refused}");
    let tokens = std::sync::Arc::new(Tokens(Mutex::new(Vec::new())));
    let (mut feed, handle) = engine.submit_bistream(hooked("", 8), BistreamOptions::default(), Some(tokens.clone())).unwrap();
    let progress = feed.progress();
    let words = "the quick brown fox jumps over the lazy dog and runs along the river bank ".repeat(8);
    let pieces: Vec<&str> = words.split_inclusive(' ').collect();
    for piece in &pieces {
        feed.send(piece.to_string()).unwrap();
    }
    // The text stays open: only the hook can end the speech.
    let (_audio, summary) = handle.wait().expect("the hooked stream ends by itself");
    assert_eq!(summary.speech_tokens, 8);
    assert_eq!(tokens.0.lock().unwrap().len(), 8);
    assert!(progress.taken() < pieces.len(), "it ended before its text: took {} of {} pieces", progress.taken(), pieces.len());
    drop(feed);

    let (_, summary) = engine.submit(hooked("One sentence here. And another one there.", 3)).unwrap().wait().expect("whole text");
    assert!(summary.speech_tokens <= 3 * summary.sentences, "{summary:?}");
}

/// A library caller of normalised text-in streaming that does not cut its text
/// (`settled_pieces` off): the feed cuts it into settled spans and hands those over, so an early
/// end (the `max_tokens` hook) leaves whole sentences behind, listed by `FeedProgress::not_taken`,
/// and the spans handed over are the caller's text, none lost or half-read.
#[test]
fn a_feed_that_cuts_sentences_loses_no_text_on_an_early_end() {
    use cosy::request::TestHooks;
    let engine = Engine::builder(&reference_config(&crate::common::fixture_model())).test_hooks(true).build().unwrap();
    let mut request = Request::new("", Voice::ZeroShot { wav: crate::common::fixture_prompt(), transcript: "Hello there, this is a test.".into() });
    request.stream = true;
    request.seed = Some(1);
    request.test_hooks = TestHooks { max_tokens: Some(8), ..TestHooks::default() };
    let options = BistreamOptions { normalize_sentences: true, settled_pieces: false };
    let (mut feed, handle) = engine.submit_bistream(request, options, None).unwrap();
    let progress = feed.progress();
    let text = (1..=12).map(|i| format!("Sentence number {} is here. ", ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"][i - 1])).collect::<String>();
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    for word in &words {
        feed.send(word.to_string()).unwrap();
    }
    // Each settled sentence was handed over as it settled, not word by word.
    assert!(feed.sent() < 12, "spans, not words: {}", feed.sent());
    // The text stays open: only the hook ends the speech.
    let (_audio, summary) = handle.wait().expect("the hooked stream ends by itself");
    assert_eq!(summary.speech_tokens, 8);
    // The end of the text hands over the last sentence (the request has ended: nobody takes it).
    drop(feed);
    let not_taken = progress.not_taken();
    assert!(progress.taken() >= 1 && !not_taken.is_empty(), "an early end: took {}, left {not_taken:?}", progress.taken());
    // What was left is whole sentences: the caller's text from a sentence start to its end.
    let left = not_taken.concat();
    assert!(left.trim_start().starts_with("Sentence number") && left.trim_end().ends_with("twelve is here."), "{left:?}");
    assert!(text.trim_end().ends_with(left.trim()), "the end of the text, as written: {left:?}");
    // Taken and left together: every sentence once.
    assert_eq!(left.matches("Sentence number").count() + progress.taken().min(12), 12, "taken {}, left {not_taken:?}", progress.taken());
}
