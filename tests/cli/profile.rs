//! `cosy profile` on the bundled tiny fixture: the JSON report has every stage key, its numbers
//! add up (top-level stages ≈ total within 5 % offline, sub-steps within their parent), call counts
//! follow the pipeline's structure (`--min-tokens` gives exactly N tokens, ten DiT calls per flow
//! call), the Chrome trace holds the spans, streaming reports an earlier first chunk, and
//! `--matrix` keeps going past a setting that cannot run. No timing targets: only structure and sums.

use std::path::{Path, PathBuf};
use std::process::Output;


use cosy::profile::STAGE_KEYS;
use serde_json::Value;

fn fixture() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    (root.join("tiny"), root.join("prompt_24k.wav"))
}

fn cosy(args: &[&str]) -> Output {
    let (model, _) = fixture();
    let cache = tempfile::tempdir().expect("temp dir");
    let mut cmd = crate::common::cosy_command(cache.path());
    cmd.arg("--model")
        .arg(model)
        .args(["--provider", "cpu"])
        .args(args)
        .output()
        .expect("run cosy")
}

/// Runs `cosy profile` with `extra` flags and returns (stdout, JSON report, trace path).
fn profile(extra: &[&str], dir: &Path) -> (String, Value, PathBuf) {
    let (_, wav) = fixture();
    let json = dir.join("report.json");
    let trace = dir.join("trace.json");
    let mut args = vec![
        "profile",
        "--prompt-wav",
        wav.to_str().expect("utf-8 path"),
        "--prompt-text",
        "Good evening, this recording captures my natural voice.",
        "--json",
        json.to_str().expect("utf-8 path"),
        "--trace",
        trace.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    let out = cosy(&args);
    assert!(
        out.status.success(),
        "cosy profile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("valid json");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        report,
        trace,
    )
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

const TOP: [&str; 4] = ["frontend", "llm", "flow", "hift"];

#[test]
fn offline_report_has_every_stage_and_adds_up() {
    let dir = tempfile::tempdir().expect("tmp");
    let (table, r, trace) = profile(
        &[
            "--runs",
            "3",
            "--warmup",
            "1",
            "--min-tokens",
            "40",
            "--",
            "Hello there, this is a test.",
        ],
        dir.path(),
    );

    let stages = r["stages"].as_object().expect("stages object");
    for key in STAGE_KEYS {
        let s = stages
            .get(*key)
            .unwrap_or_else(|| panic!("stage {key} missing"));
        for field in ["ms", "share", "calls", "p50_ms", "p95_ms"] {
            assert!(num(s, field) >= 0.0, "{key}.{field}");
        }
        assert!(
            table.contains(key.rsplit('.').next().expect("name")),
            "table lacks {key}"
        );
    }
    for key in [
        "frontend",
        "frontend.whisper_mel",
        "frontend.fbank",
        "frontend.mel_24k",
        "frontend.speech_tokenizer",
        "frontend.campplus",
        "frontend.tokenizer",
        "frontend.audio_load",
        "frontend.resample",
        "llm.prefill",
        "llm.decode",
        "llm.sampling",
        "flow.front",
        "flow.dit",
        "hift.f0",
        "hift.source",
        "hift.decode",
    ] {
        assert!(
            num(&stages[key], "calls") >= 1.0,
            "{key} was never recorded"
        );
    }

    // Top-level stages run one after another offline, so in every run they fit inside the wall
    // time. How much is left over (thread hand-offs) depends on the machine's load, so it is
    // reported, not bounded here.
    let total = num(&r, "total_ms");
    assert!(total > 0.0);
    assert_eq!(r["overlapped"], false);
    for k in TOP {
        let ms = num(&stages[k], "ms");
        assert!(ms > 0.0, "{k} took no time");
        assert!(ms <= total * 1.0001, "{k}: {ms} ms of a {total} ms run");
        let share = num(&stages[k], "share");
        assert!(
            (share - ms / total).abs() < 1e-9,
            "{k}: share {share} is not ms / total"
        );
    }
    // The breakdown is one run's (the median one), so it adds up exactly: stages + remainder = total.
    let top: f64 = TOP.iter().map(|k| num(&stages[*k], "ms")).sum();
    assert!((num(&r, "accounted_ms") - top).abs() < 1e-6 * total);
    assert!((num(&r, "accounted_ms") + num(&r, "unaccounted_ms") - total).abs() < 1e-6 * total);
    assert!(num(&r, "unaccounted_ms") >= -1e-6);
    let median_total = {
        let mut t: Vec<f64> = r["per_run"]
            .as_array()
            .expect("per_run")
            .iter()
            .map(|run| num(run, "total_ms"))
            .collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    assert_eq!(total, median_total, "total is the median run's");
    assert!(
        table.contains("(unaccounted)"),
        "the table shows the time outside the stages"
    );

    let runs = r["per_run"].as_array().expect("per_run");
    assert_eq!(runs.len(), 3, "--runs 3 gives three measured runs");
    for run in runs {
        let total = num(run, "total_ms");
        let accounted = num(run, "accounted_ms");
        assert!(
            accounted <= total * 1.0001,
            "offline stages cannot exceed the wall time"
        );
        assert!((num(run, "unaccounted_ms") - (total - accounted)).abs() < 1e-6);
        let st = &run["stages"];
        // Sub-steps are inside their parent, at every level.
        for parent in STAGE_KEYS {
            let depth = parent.matches('.').count();
            let children: f64 = STAGE_KEYS
                .iter()
                .filter(|k| {
                    k.starts_with(&format!("{parent}.")) && k.matches('.').count() == depth + 1
                })
                .map(|k| num(&st[*k], "total_ms"))
                .sum();
            assert!(
                children <= num(&st[*parent], "total_ms") * 1.0001 + 0.01,
                "{parent}: sub-steps {children}"
            );
        }
        // --min-tokens 40: exactly 40 tokens; one prefill and 39 decode steps; one sampling per token.
        assert_eq!(run["speech_tokens"], 40);
        assert_eq!(st["llm.prefill"]["calls"], 1);
        assert_eq!(st["llm.decode"]["calls"], 39);
        assert_eq!(st["llm.sampling"]["calls"], 40);
        assert_eq!(st["flow"]["calls"], 1, "offline: one flow call");
        assert_eq!(
            st["flow.dit"]["calls"], 10,
            "ten Euler steps, CFG batched into one call each"
        );
        let audio = num(run, "audio_s");
        assert!(
            (audio - 40.0 * 2.0 * 480.0 / 24000.0).abs() < 0.05,
            "40 tokens give 1.6 s of audio, got {audio}"
        );
        assert!((num(run, "rtf") - total / 1e3 / audio).abs() < 1e-6);
        assert!(num(run, "ttfb_ms") <= total);
    }

    assert_eq!(
        r["memory"]["device_mib"], "n/a",
        "CPU run reports no device memory"
    );
    assert!(num(&r["memory"], "peak_rss_mib") > 1.0);
    let load = r["load"].as_array().expect("load rows");
    let names: Vec<&str> = load.iter().filter_map(|l| l["stage"].as_str()).collect();
    for stage in [
        "llm",
        "flow_front",
        "dit",
        "hift_decode",
        "campplus",
        "speech_tokenizer",
    ] {
        assert!(names.contains(&stage), "load row for {stage}");
    }
    assert!(load.iter().all(|l| l["provider"] == "cpu"));

    // The trace holds a complete event for every recorded span of the three runs.
    let t: Value =
        serde_json::from_slice(&std::fs::read(trace).expect("trace written")).expect("trace json");
    let events = t["traceEvents"].as_array().expect("traceEvents");
    let dit = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "flow.dit")
        .count();
    assert_eq!(dit, 30);
    // Threads are named: the request's token-to-wav worker and the engine's batching threads.
    for thread in ["token2wav", "llm-scheduler", "dit-batcher"] {
        assert!(
            events.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == thread),
            "no thread named {thread} in the trace"
        );
    }
}

#[test]
fn streaming_reports_first_chunk_before_the_end() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_, r, _) = profile(
        &[
            "--stream",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--min-tokens",
            "120",
            "--",
            "Hello there.",
        ],
        dir.path(),
    );
    assert_eq!(r["overlapped"], true);
    let run = &r["per_run"][0];
    assert!(
        num(run, "chunks") >= 2.0,
        "120 tokens stream in several chunks"
    );
    assert!(
        num(run, "ttfb_ms") < num(run, "total_ms"),
        "the first chunk comes before the end"
    );
    assert_eq!(
        run["stages"]["flow"]["calls"], run["chunks"],
        "one flow call per chunk"
    );
    assert_eq!(
        run["stages"]["hift"]["calls"], run["chunks"],
        "one HiFT call per chunk"
    );
}

#[test]
fn matrix_keeps_going_past_settings_that_cannot_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let (table, r, _) = profile(
        &[
            "--matrix",
            "--settings",
            "cpu:fp32,cpu:fp16,tensorrt:fp16",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--min-tokens",
            "20",
            "--",
            "Hi.",
        ],
        dir.path(),
    );
    let rows = r["matrix"].as_array().expect("matrix rows");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["setting"], "cpu fp32");
    let fp32 = &rows[0]["report"];
    assert!(num(fp32, "total_ms") > 0.0);
    assert!(fp32["load"]
        .as_array()
        .expect("load")
        .iter()
        .all(|l| l["provider"] == "cpu" && l["precision"] == "fp32"));
    // cpu fp16: the fixture has fp16 llm/dit/hift graphs; flow_front has none and stays fp32.
    let fp16 = &rows[1]["report"];
    let prec = |stage: &str| {
        fp16["load"]
            .as_array()
            .expect("load")
            .iter()
            .find(|l| l["stage"] == stage)
            .map(|l| l["precision"].clone())
    };
    assert_eq!(prec("dit"), Some(Value::from("fp16")));
    assert_eq!(prec("flow_front"), Some(Value::from("fp32")));
    // TensorRT: either it ran (a GPU machine) or the row says why not; the matrix did not fail.
    let trt = &rows[2];
    assert!(
        trt["report"].is_object() || trt["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{trt}"
    );
    if let Some(e) = trt["error"].as_str() {
        assert!(
            table.contains("cannot run here"),
            "table shows why: {table}"
        );
        assert!(
            e.contains("tensorrt") || e.contains("TensorRT") || e.contains("Tensorrt"),
            "{e}"
        );
    }
}
