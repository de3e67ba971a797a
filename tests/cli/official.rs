//! `cosy file` against recordings of the unmodified official code (tests/fixtures/official/README.md):
//! cross-lingual, instruct2, speed 1.5, and a streamed request of two sentences. Each case runs the
//! `cosy` binary on the exported reference tiny model with the case's options and `--dump`, and
//! requires the same LLM speech token ids as the official run, sentence by sentence, and the audio
//! within compare.py's waveform tolerances (tests/common/compare.rs). Skips when the venv or
//! ../shared is absent; under CI=true that fails.

use std::path::{Path, PathBuf};

use crate::common::compare::check_waveform;
use crate::common::reference_dir;

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/official").join(case)
}

fn ints(path: &Path) -> Vec<i64> {
    let a = cosy::npy::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    a.to_i64(path).expect("integer array").iter().copied().collect()
}

fn floats(path: &Path) -> Vec<f32> {
    cosy::npy::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_f32().iter().copied().collect()
}

fn json_ints(v: &serde_json::Value) -> Vec<i64> {
    v.as_array().expect("array").iter().map(|x| x.as_i64().expect("int")).collect()
}

/// Runs one recorded case through `cosy file --dump` and compares.
fn check_case(case: &str) {
    let Some(reference) = reference_dir() else { return };
    let Some(model) = crate::pipeline::model() else { return };
    let dir = fixture(case);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).expect("meta.json")).expect("json");
    let s = |k: &str| meta[k].as_str().unwrap_or_else(|| panic!("{case}: meta.json {k}")).to_string();

    let work = tempfile::tempdir().expect("temp dir");
    let (dump, out_wav) = (work.path().join("dump"), work.path().join("out.wav"));
    let cache = tempfile::tempdir().expect("temp dir");
    let mut cmd = crate::common::cosy_command(cache.path());
    cmd.arg("--model").arg(model).args(["--provider", "cpu"]).arg("file");
    cmd.arg("--prompt-wav").arg(reference.join(s("prompt_wav")));
    match s("mode").as_str() {
        "zero_shot" => {
            cmd.args(["--prompt-text", &s("prompt_text")]);
        }
        "instruct2" => {
            cmd.args(["--instruct", &s("instruct_text")]);
        }
        "cross_lingual" => {}
        other => panic!("{case}: unknown mode {other}"),
    }
    cmd.arg(if meta["stream"].as_bool().expect("stream") { "--stream" } else { "--no-stream" });
    cmd.args(["--speed", &meta["speed"].as_f64().expect("speed").to_string()]);
    cmd.args(["--seed", &meta["seed"].as_u64().expect("seed").to_string()]);
    if meta["text_frontend"].as_bool().expect("text_frontend") {
        // The official run had neither ttsfrd nor wetext: no normaliser, only its own rules.
        assert!(meta["text_frontend_engine"].is_null(), "{case}: recorded with a text normaliser");
        cmd.args(["--set", "text.normalizer=none"]);
    } else {
        cmd.arg("--no-text-frontend");
    }
    cmd.arg("--dump").arg(&dump).arg("-o").arg(&out_wav).arg("--").arg(s("tts_text"));
    let out = cmd.output().expect("run cosy");
    assert!(out.status.success(), "{case}: cosy failed: {}", String::from_utf8_lossy(&out.stderr));

    // One sentence dumps into DIR, several into DIR/000, DIR/001, ...
    let calls = meta["llm_calls"].as_array().expect("llm_calls");
    let sentence_dirs: Vec<PathBuf> = if calls.len() == 1 {
        vec![dump.clone()]
    } else {
        (0..calls.len()).map(|i| dump.join(format!("{i:03}"))).collect()
    };
    if calls.len() > 1 {
        assert!(!dump.join(format!("{:03}", calls.len())).exists(), "{case}: cosy split the text into more sentences");
    }
    let mut audio = Vec::new();
    for (i, (call, sdir)) in calls.iter().zip(&sentence_dirs).enumerate() {
        assert!(
            sdir.join("llm_token_raw.npy").exists(),
            "{case}: no dump for sentence {i} (cosy split the text differently)"
        );
        assert_eq!(
            ints(&sdir.join("text_token.npy")),
            json_ints(&call["text_token"]),
            "{case}: sentence {i}: text tokens"
        );
        assert_eq!(
            ints(&sdir.join("prompt_text_token.npy")),
            json_ints(&call["prompt_text_token"]),
            "{case}: sentence {i}: prompt text tokens"
        );
        let want_file = if calls.len() == 1 { "llm_token.npy".to_string() } else { format!("llm_token_{i:03}.npy") };
        let want = ints(&dir.join(want_file));
        let got = ints(&sdir.join("llm_token_raw.npy"));
        // On an official LLM-thread error only the tokens before it exist; none of these cases has one
        // (the non-bistream LLM stops on any of the 200 stop ids), so the whole list must match.
        assert!(
            meta["llm_thread_errors"].as_array().is_some_and(|e| e.is_empty()),
            "{case}: recorded LLM-thread errors"
        );
        assert_eq!(got, want, "{case}: sentence {i}: the LLM speech tokens differ from the official run");
        audio.extend(floats(&sdir.join("waveform.npy")));
        eprintln!("{case}: sentence {i}: {} LLM tokens identical", got.len());
    }
    let official = floats(&dir.join("waveform.npy"));
    let check = check_waveform(&audio, &official);
    eprintln!("{case}: waveform {check}");
    assert!(check.ok(), "{case}: waveform outside compare.py's tolerance: {check}");
}

#[test]
fn cross_lingual_matches_the_official_run() {
    check_case("cross_lingual");
}

#[test]
fn instruct2_matches_the_official_run() {
    check_case("instruct");
}

#[test]
fn speed_matches_the_official_run() {
    check_case("speed");
}

#[test]
fn multi_sentence_stream_matches_the_official_run() {
    check_case("multi_sentence_stream");
}
