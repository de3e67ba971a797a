//! Shared test helpers: a valid model folder to run against, and inputs for its graphs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// compare.py's audio metrics (its log-mel and max-abs checks, with its tolerances).
pub mod compare;
/// EPUB books written by the tests (issue 33).
pub mod epub;
/// Written audio files decoded by ffmpeg.
pub mod ffmpeg;

use cosy::model::{sha256_file, Dim, GraphSpec, Manifest};
use ort::value::{DynValue, Tensor};

/// The bundled tiny exported model.
pub fn fixture_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny")
}

/// The bundled synthetic prompt recording (3 s, 24 kHz).
pub fn fixture_prompt() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompt_24k.wav")
}

/// True under CI (`CI=true`, as CI runs `.ci/run`): there, missing test data is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A test cannot run here because `what` is missing. Under CI that fails the test (a green run
/// must have checked everything); elsewhere the reason is printed and the caller skips.
pub fn missing(what: &str) {
    if in_ci() {
        panic!("CI=true and {what}: CI must run every test (set it up, see scripts/test.sh)");
    }
    eprintln!("SKIP: {what}");
}

/// For a test that measures its own process (`/proc/self`: descriptors, resident memory): other
/// tests of the same binary run beside it on other threads, and what they open and allocate would
/// be counted as its own (CI saw a loop's memory "grow" by 70 MiB while the golden and reference
/// tests loaded their models). Outside the child this runs the test `name` (its path in this test
/// binary) alone in a child process of the test binary, asserts it passed and returns `false`:
/// the caller returns. In that child it returns `true`: the caller goes on with its body.
pub fn alone_in_own_process(name: &str) -> bool {
    const ALONE: &str = "COSY_TEST_ALONE";
    if std::env::var(ALONE).is_ok_and(|v| v == name) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(ALONE, name)
        .output()
        .expect("the test binary runs again");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name}, alone in its own process: {:?}\n{stdout}\n{stderr}", out.status);
    // A name that matches no test runs nothing and succeeds: the child must have run this one.
    assert!(stdout.contains("1 passed"), "{name}: the child ran no such test:\n{stdout}");
    false
}

/// The shared reference folder: `$COSY_SHARED`, else `../shared` beside the checkout. `None`
/// (with the reason printed) when it is absent; under CI its absence fails the test.
pub fn shared_dir() -> Option<PathBuf> {
    let p = std::env::var_os("COSY_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    if p.join("reference/tiny-official").is_dir() && p.join("reference/golden").is_dir() {
        Some(p)
    } else {
        missing(&format!("no reference data at {} (set COSY_SHARED)", p.display()));
        None
    }
}

/// `<shared>/reference`: the tiny official model, golden intermediates and compare.py.
pub fn reference_dir() -> Option<PathBuf> {
    shared_dir().map(|s| s.join("reference"))
}

/// The exporter's venv (`$COSY_VENV`, else `~/.cache/cosy/venv`); `None` with the reason printed.
pub fn venv_dir() -> Option<PathBuf> {
    let v = std::env::var_os("COSY_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/cosy/venv")));
    let Some(v) = v else {
        missing("no exporter venv: neither COSY_VENV nor HOME is set");
        return None;
    };
    if v.join("bin/python").is_file() {
        Some(v)
    } else {
        missing(&format!("no exporter venv at {} (scripts/setup.sh --python)", v.display()));
        None
    }
}

/// The venv's python.
pub fn python() -> Option<PathBuf> {
    venv_dir().map(|v| v.join("bin/python"))
}

/// Where a model folder for the tests comes from.
pub enum ModelSource {
    /// The exported tiny fixture, `tests/fixtures/tiny/` (all stages).
    Fixture(PathBuf),
    /// Built here from the two official frontend graphs in the shared reference folder.
    Built(tempfile::TempDir),
}

impl ModelSource {
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Fixture(p) => p,
            ModelSource::Built(t) => t.path(),
        }
    }
}

/// A valid model folder: `tests/fixtures/tiny` when it exists, else one built in a temp folder
/// from `campplus.onnx` and `speech_tokenizer_v3.onnx`; `None` (with the reason printed) when
/// neither is available.
pub fn fixture_model_dir() -> Option<ModelSource> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny");
    if fixture.join("manifest.json").is_file() {
        return Some(ModelSource::Fixture(fixture));
    }
    let Some(shared) = shared_dir() else {
        missing("no tests/fixtures/tiny and no shared reference folder (set COSY_SHARED)");
        return None;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    build_frontend_model(&shared.join("reference/tiny-official"), dir.path());
    Some(ModelSource::Built(dir))
}

/// A writable copy of the fixture model folder (for breaking it).
pub fn writable_model_dir() -> Option<tempfile::TempDir> {
    let src = fixture_model_dir()?;
    if let ModelSource::Built(t) = src {
        return Some(t);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    for e in std::fs::read_dir(src.path()).expect("read fixture") {
        let e = e.expect("entry");
        if e.path().is_file() {
            std::fs::copy(e.path(), dir.path().join(e.file_name())).expect("copy");
        }
    }
    Some(dir)
}

fn file_entry(dir: &Path, name: &str) -> serde_json::Value {
    let p = dir.join(name);
    serde_json::json!({
        "file": name,
        "sha256": sha256_file(&p).expect("hash"),
        "bytes": std::fs::metadata(&p).expect("meta").len(),
    })
}

/// Writes a format-1 manifest listing the two official frontend graphs (copied into `dst`).
pub fn build_frontend_model(official: &Path, dst: &Path) {
    for f in ["campplus.onnx", "speech_tokenizer_v3.onnx"] {
        std::fs::copy(official.join(f), dst.join(f)).expect("copy graph");
    }
    let manifest = serde_json::json!({
        "format": "cosy-model",
        "format_version": 1,
        "exporter": {"version": "test"},
        "graphs": {
            "campplus": {
                "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", "frames", 80]}],
                "outputs": [{"name": "output", "dtype": "float32", "shape": ["batch", 192]}],
                "variants": {"fp32": file_entry(dst, "campplus.onnx")}
            },
            "speech_tokenizer": {
                "inputs": [
                    {"name": "feats", "dtype": "float32", "shape": ["batch", 128, "frames"]},
                    {"name": "feats_length", "dtype": "int32", "shape": ["batch"]}
                ],
                "outputs": [{"name": "indices", "dtype": "int32", "shape": ["batch", "tokens"]}],
                "variants": {"fp32": file_entry(dst, "speech_tokenizer_v3.onnx")}
            }
        },
        "files": {}
    });
    std::fs::write(dst.join("manifest.json"), serde_json::to_string_pretty(&manifest).expect("json")).expect("write manifest");
}

/// Reads, edits and writes back a manifest.
pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("json");
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).expect("json")).expect("write");
}

/// Deterministic values in [-1, 1).
fn wave(n: usize, salt: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * 7919 + salt * 104729) % 2000) as f32 / 1000.0) - 1.0).collect()
}

/// Size of a named (dynamic) dimension for a test run.
fn named_dim(stage: &str, name: &str) -> i64 {
    let n = name.to_ascii_lowercase();
    // Graphs name their batch axis differently ("batch", or "B" in the frontend graphs).
    let n = if n == "b" { "batch".to_string() } else { n };
    if n == "past_plus_seq" {
        return 4; // llm attention_mask of a prefill: past 0 + seq 4
    }
    if n.contains("past") {
        return 0; // an empty KV cache (prefill)
    }
    match stage {
        "campplus" => if n == "batch" { 1 } else { 60 },
        "speech_tokenizer" => if n == "batch" { 1 } else { 200 },
        "dit" => if n == "batch" { 2 } else { 8 },
        "flow_front" => if n == "batch" { 1 } else { 7 },
        // 2 rows in slots 0 and 1 of 3 (inputs count 0, 1, ...), starting at 0 and 1: columns up
        // to 1 + 3 - 1 = 3 of 8.
        "llm_step" => match n.as_str() {
            "rows" => 2,
            "seq" => 3,
            "num_slots" => 3,
            _ => 8,
        },
        // 10 frames to decode + 4 of right context; the source covers the 10 frames.
        "hift_decode" => match n.as_str() {
            "mel_frames" => 14,
            "source_samples" => 4800,
            _ => 1,
        },
        _ => if n == "batch" { 1 } else { 4 },
    }
}

/// Inputs for one run of a stage's graph, from the manifest's I/O (values chosen so each graph
/// can run: ones for masks, a valid time step, token ids in range, consistent lengths).
pub fn inputs_for(stage: &str, spec: &GraphSpec) -> Vec<(String, DynValue)> {
    let shape_of = |dims: &[Dim]| -> Vec<i64> {
        dims.iter()
            .map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Named(s) => named_dim(stage, s),
            })
            .collect()
    };
    let mut shapes: Vec<(String, Vec<i64>)> = spec.inputs.iter().map(|t| (t.name.clone(), shape_of(&t.shape))).collect();
    // hift: the source covers at least the decoded frames (mel frames - 4), 480 samples each.
    if let Some(mel_frames) = shapes.iter().find(|(n, _)| n == "mel").map(|(_, s)| s[2]) {
        if let Some((_, s)) = shapes.iter_mut().find(|(n, _)| n == "source") {
            *s = vec![1, 1, 480 * (mel_frames - 4).max(1)];
        }
    }
    let mut out = Vec::new();
    for (i, t) in spec.inputs.iter().enumerate() {
        let shape = shapes[i].1.clone();
        let n: usize = shape.iter().map(|&d| d as usize).product();
        let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let v: DynValue = match t.dtype.as_str() {
            "float32" => {
                let data = match t.name.as_str() {
                    "mask" => vec![1.0; n],
                    "t" => vec![0.5; n],
                    _ => wave(n, i),
                };
                Tensor::from_array((dims, data)).expect("tensor").into_dyn()
            }
            "int64" => {
                let data: Vec<i64> = match t.name.as_str() {
                    "block_frames" => vec![0; n],
                    // dit: return the prompt-cache state of the first 4 of the 8 frames
                    "record_frames" => vec![4; n],
                    "attention_mask" => vec![1; n],
                    _ => (0..n as i64).map(|k| k % 100).collect(),
                };
                Tensor::from_array((dims, data)).expect("tensor").into_dyn()
            }
            "int32" => {
                // Lengths: the length of the matching time axis (the last dim of the first input).
                let len = shapes[0].1.last().copied().unwrap_or(1) as i32;
                Tensor::from_array((dims, vec![len; n])).expect("tensor").into_dyn()
            }
            other => panic!("no test input recipe for dtype {other}"),
        };
        out.push((t.name.clone(), v));
    }
    out
}

/// A config pointing at a model folder, an engine cache in `cache`, and the repo's ORT library.
pub fn config_for(model: &Path, cache: &Path) -> cosy::config::Config {
    let mut c = cosy::config::Config { model_dir: model.to_path_buf(), ..Default::default() };
    c.runtime.engine_cache = cache.to_path_buf();
    c.runtime.threads = 1;
    c
}

/// Loads a model folder's manifest (test shorthand).
pub fn manifest(dir: &Path) -> Manifest {
    cosy::model::ModelDir::open(dir).expect("open model").manifest
}

/// The `cosy` binary as a command that does not see the caller's `COSY_*` settings (cosy refuses
/// unknown ones, and a developer's own must not change what a test checks), with a private
/// optimised-graph cache in `graph_cache` (never the repository's engines/) and a private engine
/// cache beside it (`<graph_cache>.engines`: the prompt-prefix cache a streaming run writes would
/// otherwise go to the user's cache folder, shared by every test and every earlier run, so what
/// a test read from it would depend on what ran before; a test that sets its own wins).
pub fn cosy_command(graph_cache: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(cosy_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("COSY_") {
            cmd.env_remove(k);
        }
    }
    let mut engines = graph_cache.as_os_str().to_owned();
    engines.push(".engines");
    cmd.env("COSY_GRAPH_CACHE", graph_cache).env("COSY_ENGINE_CACHE", engines);
    // A runtime folder of its own beside the graph cache: a `cosy serve` started here listens on
    // a default socket no other test's `say` finds, and a `say` here never finds a server the
    // developer runs (docs/desktop.md).
    let mut runtime = graph_cache.as_os_str().to_owned();
    runtime.push(".run");
    cmd.env("XDG_RUNTIME_DIR", runtime);
    cmd
}

/// `cosy` run as a user in `dir` on the bundled model and CPU: `dir` is HOME (its `.asoundrc`
/// makes the default sound output ALSA's null device, so a `say` that got past its checks plays
/// silently) and the working folder, voices in `dir/voices`, no `COSY_*` from the caller.
pub fn cosy_at_home(dir: &Path) -> std::process::Command {
    let mut cmd = cosy_command(&dir.join("gc"));
    std::fs::write(dir.join(".asoundrc"), "pcm.!default { type null }\n").expect("write .asoundrc");
    cmd.env("HOME", dir)
        .current_dir(dir)
        .arg("--model")
        .arg(fixture_model())
        .args(["--provider", "cpu", "--set"])
        .arg(format!("voices.dir={}", dir.join("voices").display()));
    cmd
}

/// The binary under test: `CARGO_BIN_EXE_cosy`, or `PIPELINE_TEST_BIN` when set (a shared
/// CARGO_TARGET_DIR can have its `cosy` replaced by another checkout's build mid-run).
pub fn cosy_bin() -> PathBuf {
    std::env::var_os("PIPELINE_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cosy")))
}

/// The shared reference tiny model exported by this repository's exporter into `into/model`
/// (about 5 s); `None` (with the reason) without the reference folder or the venv.
pub fn export_reference_model(into: &Path) -> Option<PathBuf> {
    let reference = reference_dir()?;
    let py = python()?;
    let model = into.join("model");
    let out = std::process::Command::new(py)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx"))
        .args(["-m", "cosy_export", "export"])
        .arg(reference.join("tiny-official"))
        .arg(&model)
        .args(["--precisions", "fp32"])
        .output()
        .expect("run the exporter");
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    Some(model)
}

/// A recorded text-in streaming case of the official code (tests/fixtures/bistream/README.md).
pub struct BistreamCase {
    pub name: String,
    pub dir: PathBuf,
    pub meta: serde_json::Value,
}

impl BistreamCase {
    pub fn load(name: &str) -> BistreamCase {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bistream").join(name);
        let meta = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).expect("meta.json")).expect("json");
        BistreamCase { name: name.to_string(), dir, meta }
    }
    pub fn pieces(&self) -> Vec<String> {
        self.meta["pieces"].as_array().expect("pieces").iter().map(|p| p.as_str().unwrap_or_default().to_string()).collect()
    }
    pub fn prompt_text(&self) -> String {
        self.meta["prompt_text"].as_str().unwrap_or_default().to_string()
    }
    /// The prompt recording (a file of the shared reference prompts, or of the fixture folder).
    pub fn prompt_wav(&self, reference: &Path) -> PathBuf {
        let file = Path::new(self.meta["prompt_wav"].as_str().unwrap_or_default()).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let local = self.dir.parent().map(|p| p.join(&file)).unwrap_or_default();
        if local.is_file() { local } else { reference.join("prompts").join(file) }
    }
    pub fn tokens(&self) -> Vec<i64> {
        let path = self.dir.join("llm_token_yielded.npy");
        let arr = cosy::npy::read(&path).expect("npy");
        arr.to_i64(&path).expect("integer npy").iter().copied().collect()
    }
    pub fn audio(&self) -> Vec<f32> {
        let arr = cosy::npy::read(&self.dir.join("waveform.npy")).expect("npy");
        arr.to_f32().iter().copied().collect()
    }
}

/// compare.py's waveform metric: mean |Δ log-mel| with compare.py's own log-mel (n_fft 1024, hop
/// 256, Hann, 80 HTK-mel triangles over the magnitude spectrum, ln with floor 1e-5), see
/// [`compare`]. Its tolerance is [`compare::WAVE_LOGMEL_MEAN_TOL`] (0.025). The sample counts must
/// be identical, as compare.py requires.
pub fn log_mel_distance(a: &[f32], b: &[f32]) -> f64 {
    compare::logmel_mean_abs(a, b)
}

/// Fills `voices` (which holds a good voice file `good`) with what a listing must describe
/// without reading it whole: `huge` (a 3 GB sparse file named like a voice), `dangling` (a link
/// to nothing), `cut` (the good voice truncated) and `foreign` (the good voice made for another
/// model). Returns the names, in that order.
pub fn broken_voices(voices: &Path, good: &str) -> [&'static str; 4] {
    let good_path = voices.join(format!("{good}.safetensors"));
    let huge = std::fs::File::create(voices.join("huge.safetensors")).expect("create huge");
    huge.set_len(3 << 30).expect("a sparse 3 GB file");
    std::os::unix::fs::symlink(voices.join("gone.bin"), voices.join("dangling.safetensors")).expect("symlink");
    let bytes = std::fs::read(&good_path).expect("good voice");
    std::fs::write(voices.join("cut.safetensors"), &bytes[..bytes.len() / 2]).expect("cut");
    let mut foreign = cosy::voice::SavedVoice::from_bytes(&bytes, &good_path).expect("parse good voice");
    foreign.name = "foreign".into();
    foreign.model_key = "0".repeat(64);
    std::fs::write(voices.join("foreign.safetensors"), foreign.to_bytes().expect("voice bytes")).expect("foreign");
    ["huge", "dangling", "cut", "foreign"]
}

/// Runs `cmd` under `python3`'s resource module and returns its output and its peak resident
/// memory in bytes (the child's `ru_maxrss`, which Rust's std does not expose).
pub fn run_measuring_peak_memory(cmd: &std::process::Command) -> (std::process::Output, u64) {
    let script = "import resource, subprocess, sys\n\
                  r = subprocess.run(sys.argv[1:], capture_output=True)\n\
                  sys.stdout.buffer.write(r.stdout)\n\
                  sys.stderr.buffer.write(r.stderr)\n\
                  sys.stderr.write('\\npeak-rss-kb %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n\
                  sys.exit(r.returncode)\n";
    let mut py = std::process::Command::new("python3");
    py.arg("-c").arg(script).arg(cmd.get_program()).args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        py.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => py.env(k, v),
            None => py.env_remove(k),
        };
    }
    let mut out = py.output().expect("python3 (to measure peak memory)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let (rest, peak) = stderr.rsplit_once("\npeak-rss-kb ").expect("peak memory line");
    let kb: u64 = peak.trim().parse().expect("peak kB");
    out.stderr = rest.as_bytes().to_vec();
    (out, kb * 1024)
}

/// A failure with exactly one `cosy: …` line on stderr; returns it.
pub fn one_line_error(o: &std::process::Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{what}: should fail: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: expected one line: {err}");
    assert!(lines[0].starts_with("cosy: "), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    lines[0].to_string()
}
