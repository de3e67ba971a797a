//! Parity of the Rust pipeline with the exporter's PyTorch reference pipeline on the bundled
//! fixture's model: the exporter rewrites the fixture's source (random tiny, seed 0) in the official
//! layout, with greedy sampling in its yaml so both sides are deterministic, and exports it; the reference runs on the official-layout folder, `cosy file` on the
//! export; `cosy_export.parity` then requires identical tokens, flow mel within 1e-4 max-abs and
//! a mean |Δ log-mel| of the audio within 5e-3 — offline and streaming (4 chunks).
//! Skips (with the reason) only when the exporter venv is absent.

use std::path::Path;
use std::process::Command;

use crate::common::python;

const TEXT: &str = "Parity check sentence for the tiny random model.";
const PROMPT_TEXT: &str = "You are a helpful assistant.<|endofprompt|>This recording is the voice prompt.";
/// Exactly this many tokens from random weights on both sides (`--min-tokens` /
/// `--ignore-stop-until`): enough for three streaming chunks and a final call.
const MIN_TOKENS: &str = "210";
const FLOW_MEL_TOL: &str = "1e-4";
const LOGMEL_TOL: &str = "5e-3";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn exporter(py: &Path) -> Command {
    let mut c = Command::new(py);
    c.current_dir(repo().join("onnx")).arg("-m");
    c
}

fn cosy() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cosy"));
    // The child must not see the caller's COSY_* settings (cosy refuses unknown ones).
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("COSY_") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn runtime_matches_the_pytorch_reference_offline_and_streaming() {
    let Some(py) = python() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("temp dir");
    let src = tmp.path().join("src");
    let exported = tmp.path().join("exported");
    let prompt = repo().join("tests/fixtures/prompt_24k.wav");
    run(exporter(&py).args(["cosy_export", "random"]).arg(&src).args(["--size", "tiny", "--seed", "0", "--greedy"]), "random model");
    run(
        exporter(&py).args(["cosy_export", "export"]).arg(&src).arg(&exported).args(["--precisions", "fp32", "--no-text-normalization"]),
        "export",
    );
    for stream in [false, true] {
        let tag = if stream { "stream" } else { "offline" };
        let ref_dump = tmp.path().join(format!("ref-{tag}"));
        let rt_dump = tmp.path().join(format!("rt-{tag}"));
        let mut reference = exporter(&py);
        reference
            .args(["cosy_export", "reference"])
            .arg(&src)
            .args(["--text", TEXT, "--prompt-text", PROMPT_TEXT, "--ignore-stop-until", MIN_TOKENS])
            .arg("--prompt-wav")
            .arg(&prompt)
            .arg("--dump")
            .arg(&ref_dump);
        if stream {
            reference.arg("--stream");
        }
        run(&mut reference, &format!("reference pipeline ({tag})"));

        let mut c = cosy();
        // A private cache: the offline run optimises and saves the graphs, the streaming run loads them.
        c.env("COSY_ENGINE_CACHE", tmp.path().join("engines"));
        c.arg("--model")
            .arg(&exported)
            .args(["file", TEXT, "--prompt-text", PROMPT_TEXT, "--no-text-frontend", "--min-tokens", MIN_TOKENS])
            .arg("--prompt-wav")
            .arg(&prompt)
            .arg("--dump")
            .arg(&rt_dump)
            .arg("-o")
            .arg(tmp.path().join(format!("{tag}.wav")));
        if stream {
            c.arg("--stream");
        }
        run(&mut c, &format!("cosy file ({tag})"));

        let report = run(
            exporter(&py)
                .args(["cosy_export.parity"])
                .arg(&rt_dump)
                .arg(&ref_dump)
                .args(["--flow-mel-tol", FLOW_MEL_TOL, "--logmel-tol", LOGMEL_TOL]),
            &format!("parity ({tag})"),
        );
        println!("{tag}:\n{report}");
        assert!(report.trim_end().ends_with("PASS"), "{tag}: {report}");
        if stream {
            assert!(report.contains("chunk_samples          ok (4 vs 4"), "streaming should run 4 calls:\n{report}");
        }
    }
}
