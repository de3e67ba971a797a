//! `cosy doctor`, `cosy engines`, the stubs and error reporting, through the real binary.


use assert_cmd::Command;
use crate::common::{edit_manifest, fixture_model_dir, writable_model_dir};
use predicates::prelude::*;

/// `cosy` run in an empty folder (so no ./config.toml is picked up) with a private engine cache.
fn cosy(cwd: &std::path::Path) -> Command {
    let mut c = Command::cargo_bin("cosy").unwrap();
    c.current_dir(cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") && k != "COSY_SHARED" {
            c.env_remove(k);
        }
    }
    c.env("COSY_ENGINE_CACHE", cwd.join("engines"));
    c
}

/// `cosy doctor --model DIR`, run from an empty working folder.
fn doctor(model: &std::path::Path) -> assert_cmd::assert::Assert {
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path()).args(["doctor", "--model"]).arg(model).assert()
}

#[test]
fn doctor_on_a_good_model_folder() {
    let Some(model) = fixture_model_dir() else { return };
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .args(["doctor", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("version: 1.3"))
        .stdout(predicate::str::contains("cpu       compiled in: yes  usable"))
        .stdout(predicate::str::contains("format cosy-model version 1"))
        .stdout(predicate::str::contains("sizes and sha256 match"))
        .stdout(predicate::str::contains("campplus fp32: 1 inputs, 1 outputs match"))
        .stdout(predicate::str::contains("speech_tokenizer fp32: 2 inputs, 1 outputs match"))
        .stdout(predicate::str::contains("=> opened on cpu (fp32)"))
        .stdout(predicate::str::contains("no problems found"));
}

#[test]
fn doctor_names_a_missing_file() {
    let Some(dir) = writable_model_dir() else { return };
    std::fs::remove_file(dir.path().join("campplus.onnx")).unwrap();
    doctor(dir.path())
        .code(2)
        .stdout(predicate::str::contains("stage campplus (fp32): campplus.onnx is missing"))
        .stderr(predicate::str::starts_with("cosy: doctor found"))
        .stderr(predicate::str::contains("campplus.onnx is missing"));
}

#[test]
fn doctor_names_a_wrong_hash() {
    let Some(dir) = writable_model_dir() else { return };
    edit_manifest(dir.path(), |m| {
        m["graphs"]["speech_tokenizer"]["variants"]["fp32"]["sha256"] = serde_json::json!("0".repeat(64));
    });
    doctor(dir.path())
        .code(2)
        .stdout(predicate::str::contains("speech_tokenizer_v3.onnx sha256 mismatch"))
        .stderr(predicate::str::contains("sha256 mismatch"));
}

#[test]
fn doctor_names_a_wrong_input_name() {
    let Some(dir) = writable_model_dir() else { return };
    edit_manifest(dir.path(), |m| {
        m["graphs"]["campplus"]["inputs"][0]["name"] = serde_json::json!("fbank");
    });
    doctor(dir.path())
        .code(2)
        .stdout(predicate::str::contains("stage campplus: input \"fbank\" is not in the graph (graph has: input)"))
        .stderr(predicate::str::contains("fbank"));
}

#[test]
fn doctor_refuses_a_wrong_format_version() {
    let Some(dir) = writable_model_dir() else { return };
    edit_manifest(dir.path(), |m| m["format_version"] = serde_json::json!(2));
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .args(["doctor", "--quick", "--model"])
        .arg(dir.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("format_version is 2, this cosy reads version 1"));
}

#[test]
fn missing_onnx_runtime_says_how_to_fix_it() {
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .env("COSY_ORT_LIBRARY", cwd.path().join("nope/libonnxruntime.so"))
        .args(["doctor", "--quick"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("ONNX Runtime library not found at"))
        .stderr(predicate::str::contains("nope/libonnxruntime.so"))
        .stderr(predicate::str::contains("scripts/setup-ort.sh"));
    // A file that is not a library is refused the same way (no panic).
    let fake = cwd.path().join("libonnxruntime.so");
    std::fs::write(&fake, b"not a library").unwrap();
    cosy(cwd.path())
        .env("COSY_ORT_LIBRARY", &fake)
        .args(["engines", "build"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot load ONNX Runtime library"))
        .stderr(predicate::str::contains("panicked").not());
}

#[test]
fn gpu_provider_on_cpu_library_fails_or_falls_back() {
    let Some(model) = fixture_model_dir() else { return };
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .args(["doctor", "--provider", "cuda,cpu", "--model"])
        .arg(model.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("execution provider cuda"))
        .stderr(predicate::str::contains("built without CUDAExecutionProvider"));
    cosy(cwd.path())
        .env("COSY_ALLOW_FALLBACK", "1")
        .args(["doctor", "--provider", "cuda,cpu", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("=> opened on cpu"))
        .stdout(predicate::str::contains("fallback: stage campplus: provider cuda cannot be used"))
        .stderr(predicate::str::contains("falling back"));
}

#[test]
fn config_errors_are_one_line_with_exit_code_2() {
    let cwd = tempfile::tempdir().unwrap();
    let out = cosy(cwd.path()).args(["--precision", "fp8", "doctor"]).assert().code(2).get_output().stderr.clone();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("cosy: config: flag runtime.precision") && text.contains("fp32, fp16, bf16, int8"), "{text}");
    cosy(cwd.path()).args(["--set", "runtime.thread=2", "doctor"]).assert().code(2).stderr(predicate::str::contains("unknown key"));
    // clap usage errors also exit 2.
    cosy(cwd.path()).arg("frobnicate").assert().code(2);
}

#[test]
fn completions_are_generated() {
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .args(["completions", "bash"])
        .assert()
        .success()
        .stdout(predicate::str::contains("_cosy()").and(predicate::str::contains("engines")));
}

#[test]
fn engines_list_and_clean_handle_corrupt_entries() {
    let cwd = tempfile::tempdir().unwrap();
    let cache = cwd.path().join("engines");
    let broken = cache.join("dit-0123456789abcdef");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("dit.engine"), b"partial").unwrap();
    std::fs::write(broken.join("key.json"), b"{ truncated").unwrap();
    cosy(cwd.path())
        .args(["engines", "list"])
        .assert()
        .success()
        .stdout(predicate::str::contains("dit-0123456789abcdef"))
        .stdout(predicate::str::contains("corrupt: key.json is unreadable"));
    cosy(cwd.path())
        .args(["engines", "clean"])
        .assert()
        .success()
        .stdout(predicate::str::contains("1 entry removed"));
    assert!(!broken.exists());
    cosy(cwd.path()).args(["engines", "list"]).assert().success().stdout(predicate::str::contains("is empty"));
    // The DiT prompt-prefix files live in the same folder: listed as one entry of their own (not
    // taken for a corrupt engine), kept by `clean`, removed by `clean --all`.
    let prefix = cache.join("prompt-prefix");
    std::fs::create_dir_all(&prefix).unwrap();
    std::fs::write(prefix.join("ab.safetensors"), b"0123456789").unwrap();
    cosy(cwd.path())
        .args(["engines", "list"])
        .assert()
        .success()
        .stdout(predicate::str::contains("prompt-prefix  prompt-prefix  10 B").and(predicate::str::contains("[1 file]")))
        .stdout(predicate::str::contains("corrupt").not());
    cosy(cwd.path()).args(["engines", "clean"]).assert().success().stdout(predicate::str::contains("0 entries removed"));
    assert!(prefix.exists());
    cosy(cwd.path()).args(["engines", "clean", "--all"]).assert().success().stdout(predicate::str::contains("1 entry removed"));
    assert!(!prefix.exists());
}

#[test]
fn engines_build_needs_tensorrt() {
    let Some(model) = fixture_model_dir() else { return };
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .args(["engines", "build", "--model"])
        .arg(model.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("execution provider tensorrt"))
        .stderr(predicate::str::contains("setup-ort.sh --gpu"));
}

/// Every file under `dir`, relative to it (folders included).
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            if e.path().is_dir() {
                todo.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Nothing is written into the current folder unless asked for: not by `cosy doctor` (which writes
/// nothing of cosy's at all: its sessions open with the graph cache off), not by a `cosy file`
/// that loads the model and then fails. The caches default to the user's cache folder.
#[test]
fn doctor_and_a_failed_run_write_nothing_into_the_current_folder() {
    let model = crate::common::fixture_model();
    let cwd = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let xdg = home.path().join("xdg-cache");
    let run = |args: &[&str]| {
        let mut c = Command::cargo_bin("cosy").unwrap();
        for (k, _) in std::env::vars() {
            if k.starts_with("COSY_") {
                c.env_remove(k);
            }
        }
        c.current_dir(cwd.path()).env("HOME", home.path()).env("XDG_CACHE_HOME", &xdg);
        c.arg("--model").arg(&model).args(args).output().unwrap()
    };
    let o = run(&["doctor"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let graphs = xdg.join("cosy/engines/graphs");
    assert!(stdout.contains(&format!("optimised-graph cache (CPU sessions): {}", graphs.display())), "{stdout}");
    assert_eq!(files_under(cwd.path()), Vec::<String>::new(), "doctor wrote into the current folder");
    assert!(!xdg.join("cosy").exists(), "doctor wrote into the cache: {:?}", files_under(&xdg));
    // Loads the model (filling the graph cache), then fails: too many forced tokens for the noise.
    let prompt = crate::common::fixture_prompt();
    let o = run(&["file", "--prompt-wav", prompt.to_str().unwrap(), "--min-tokens", "100000", "Hello there."]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(files_under(cwd.path()), Vec::<String>::new(), "a failed run wrote into the current folder");
    assert!(std::fs::read_dir(&graphs).unwrap().count() > 0, "the graph cache is in the user's cache folder");
}

/// Every `--set` counts, before and after the command (clap alone keeps one level's: the first
/// here was dropped without a word).
#[test]
fn set_flags_before_and_after_the_command_all_count() {
    let cwd = tempfile::tempdir().unwrap();
    for args in [
        &["--set", "engine.prompt_cache=bogus", "doctor", "--set", "runtime.threads=1"][..],
        &["--set=runtime.threads=1", "doctor", "--set=engine.prompt_cache=bogus"][..],
    ] {
        cosy(cwd.path())
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("engine.prompt_cache = \"bogus\": invalid value; allowed: auto, on, off"));
    }
}
