//! Golden parity of the whole pipeline: `scripts/golden.sh` exports the reference tiny model with
//! the venv's exporter, runs `cosy file --dump` for the 5 golden cases and checks the dumps with
//! the reference `compare.py`. Skips (with the reason) only when the venv or ../shared is absent.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{shared_dir, venv_dir};

#[test]
fn all_golden_cases_pass_compare_py() {
    let Some(shared) = shared_dir() else {
        return;
    };
    let Some(venv) = venv_dir() else {
        return;
    };
    let dump = tempfile::tempdir().expect("temp dir");
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/golden.sh"))
        .arg(dump.path())
        .env("COSY_SHARED", &shared)
        .env("COSY_VENV", &venv)
        .env("COSY_BIN", cosy_bin())
        .output()
        .expect("run scripts/golden.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "golden.sh failed:\n{stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap_or("");
    assert!(last.starts_with("PASS: 5/5"), "compare.py verdict: {last}");
    for case in ["en", "zh", "num", "p16k", "stream"] {
        assert!(stdout.contains(&format!("PASS case {case}")), "case {case} not passed");
    }
}

/// The binary under test: `CARGO_BIN_EXE_cosy`, or `PIPELINE_TEST_BIN` when set (a shared
/// CARGO_TARGET_DIR can have its `cosy` replaced by another checkout's build mid-run).
fn cosy_bin() -> PathBuf {
    std::env::var_os("PIPELINE_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cosy")))
}
