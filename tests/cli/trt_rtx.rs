//! The TensorRT for RTX provider (`tensorrt-rtx`) with the REAL plugin that `scripts/setup.sh
//! --trt-rtx` (or `--gpu`) installs beside ONNX Runtime, on a machine without an NVIDIA driver (CI):
//! asked for alone it refuses in one line (exit 2, nothing written); with `cpu` after it and
//! fallback allowed the file is made on the CPU and the one warning says so; `cosy doctor` reports
//! the plugin. Without the plugin these tests fail under `CI=true` and are skipped elsewhere; on a
//! machine with a driver they are skipped (what they check is the refusal).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{cosy_command, fixture_model, fixture_prompt, missing, one_line_error};
use cosy::runtime::trt_rtx;

const TRANSCRIPT: &str = "This recording is the voice prompt.";

/// The plugin where cosy looks for it by default (beside the ONNX Runtime library it loads), when
/// it is installed and this machine has no NVIDIA driver; `None` (skip, or fail under CI) when not.
fn plugin_without_driver() -> Option<PathBuf> {
    let (ort, _) = cosy::runtime::env::locate_library(&cosy::config::Config::default());
    let plugin = ort.parent().unwrap_or(Path::new(".")).join(trt_rtx::PLUGIN_FILE);
    if !plugin.is_file() {
        missing(&format!("the TensorRT for RTX plugin is not installed at {} (scripts/setup.sh --trt-rtx)", plugin.display()));
        return None;
    }
    if trt_rtx::driver().is_ok() {
        eprintln!("SKIP: this machine has an NVIDIA driver; these tests check the refusal without one");
        return None;
    }
    Some(plugin)
}

/// `cosy --model tiny ARGS` in `dir` (cwd and HOME), its caches inside `dir`.
fn cosy(dir: &Path, args: &[&str]) -> Output {
    let mut cmd: Command = cosy_command(&dir.join("gc"));
    cmd.env("HOME", dir)
        .current_dir(dir)
        .arg("--model")
        .arg(fixture_model())
        .arg("--set")
        .arg(format!("runtime.engine_cache={}", dir.join("engines").display()))
        .args(args);
    cmd.output().expect("run cosy")
}

fn file_args<'a>(prompt: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = extra.to_vec();
    v.extend(["file", "--prompt-wav", prompt, "--prompt-text", TRANSCRIPT, "-o", "out.wav", "--", "The plugin is asked for."]);
    v
}

/// What the engine cache folder holds (nothing, when the refusal came before any session).
fn cache_entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir.join("engines")) {
        Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n != "graphs").collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn asked_for_alone_it_refuses_in_one_line_with_exit_2_and_writes_nothing() {
    let Some(_) = plugin_without_driver() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let o = cosy(dir.path(), &file_args(prompt.to_str().unwrap(), &["--provider", "tensorrt-rtx"]));
    let line = one_line_error(&o, "tensorrt-rtx without fallback");
    assert_eq!(o.status.code(), Some(2), "{line}");
    for needle in ["execution provider tensorrt-rtx", "no NVIDIA GPU/driver (libcuda.so.1", "RTX 4090", "compute capability 8.6, 8.9 or 12.0+", "runtime.allow_fallback = true"] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    assert!(!dir.path().join("out.wav").exists(), "no output file");
    assert_eq!(cache_entries(dir.path()), Vec::<String>::new(), "no cache folder");
}

#[test]
fn with_cpu_after_it_and_fallback_allowed_it_runs_on_the_cpu_and_says_so_once() {
    let Some(_) = plugin_without_driver() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let o = cosy(
        dir.path(),
        &file_args(prompt.to_str().unwrap(), &["--provider", "tensorrt-rtx,cpu", "--set", "runtime.allow_fallback=true"]),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let wav = std::fs::metadata(dir.path().join("out.wav")).expect("out.wav written");
    assert!(wav.len() > 44, "audio after the header");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("tensorrt-rtx cannot be used")).collect();
    assert_eq!(warnings.len(), 1, "one warning for all six stages: {err}");
    assert!(warnings[0].contains("no NVIDIA GPU/driver") && warnings[0].contains("falling back to cpu"), "{err}");
}

#[test]
fn profile_shows_the_stages_on_the_cpu_after_the_fallback() {
    let Some(_) = plugin_without_driver() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let json = dir.path().join("report.json");
    let o = cosy(
        dir.path(),
        &[
            "--provider",
            "tensorrt-rtx,cpu",
            "--set",
            "runtime.allow_fallback=true",
            "profile",
            "--prompt-wav",
            prompt.to_str().unwrap(),
            "--prompt-text",
            TRANSCRIPT,
            "--runs",
            "1",
            "--warmup",
            "0",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("report written")).expect("json");
    let load = report["load"].as_array().expect("load rows");
    assert!(!load.is_empty());
    for row in load {
        assert_eq!(row["provider"], "cpu", "{row}");
    }
}

#[test]
fn doctor_reports_the_plugin_and_why_it_cannot_run() {
    let Some(plugin) = plugin_without_driver() else { return };
    let dir = tempfile::tempdir().unwrap();
    let o = cosy(dir.path(), &["--provider", "cpu", "doctor"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let section: Vec<&str> = out.lines().skip_while(|l| !l.contains("== TensorRT for RTX (tensorrt-rtx)")).take(4).collect();
    assert_eq!(section.len(), 4, "{out}");
    assert!(section[1].contains(&plugin.display().to_string()) && section[1].contains("onnxruntime-ep-nv-tensorrt-rtx-cu12=="), "{out}");
    assert!(section[2].contains("bundled libraries") && section[2].ends_with(": load"), "{out}");
    assert!(section[3].contains("not usable: ") && section[3].contains("no NVIDIA GPU/driver"), "{out}");
}

/// Needs no plugin: one named by the setting that is not there is the same kind of refusal.
#[test]
fn a_plugin_that_is_not_there_is_one_line_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = fixture_prompt();
    let missing_plugin = dir.path().join("nope").join(trt_rtx::PLUGIN_FILE);
    let setting = format!("runtime.tensorrt_rtx_library={}", missing_plugin.display());
    let o = cosy(dir.path(), &file_args(prompt.to_str().unwrap(), &["--provider", "tensorrt-rtx", "--set", &setting]));
    let line = one_line_error(&o, "missing plugin");
    assert_eq!(o.status.code(), Some(2), "{line}");
    for needle in ["TensorRT for RTX plugin not installed", "nope/libonnxruntime_providers_nv_tensorrt_rtx.so", "runtime.tensorrt_rtx_library", "scripts/setup.sh --gpu"] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    assert!(!dir.path().join("out.wav").exists());
}
