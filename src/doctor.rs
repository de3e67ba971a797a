//! `cosy doctor`: what this machine, library, configuration and model folder give, and what is
//! wrong with them. Every check runs even after an earlier one failed, so one run names every
//! problem; the report lists them at the end.

use std::collections::BTreeSet;
use std::sync::Arc;

use ort::session::Session;

use cosy::config::Config;
use cosy::error::Error;
use cosy::model::{check_graph_io, ModelDir};
use cosy::runtime::cache_listing::{current_engine_keys, current_graph_keys};
use cosy::runtime::env::{self, OrtRuntime};
use cosy::runtime::keyed_dir::EntryState;
use cosy::runtime::{providers, trt_rtx, SessionFactory, StagePlan};
use cosy::vocab::ProviderKind;

/// Options for [`run`].
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// Skip sha256 of the files and opening the graphs (sizes and names only).
    pub quick: bool,
}

/// The report: sections of text, then the problems found.
#[derive(Debug, Default)]
pub struct DoctorReport {
    pub lines: Vec<String>,
    pub problems: Vec<Error>,
}

impl DoctorReport {
    fn section(&mut self, title: &str) {
        self.lines.push(String::new());
        self.lines.push(format!("== {title}"));
    }
    fn line(&mut self, s: impl Into<String>) {
        self.lines.push(format!("  {}", s.into()));
    }
    fn problem(&mut self, e: Error) {
        self.lines.push(format!("  PROBLEM: {e}"));
        self.problems.push(e);
    }
    /// The whole report as text.
    pub fn render(&self) -> String {
        let mut s = self.lines.join("\n");
        s.push('\n');
        if self.problems.is_empty() {
            s.push_str("\nno problems found\n");
        } else {
            s.push_str(&format!("\n{} problem(s):\n", self.problems.len()));
            for p in &self.problems {
                s.push_str(&format!("  - {p}\n"));
            }
        }
        s
    }
}

/// Runs every check: each section reports what it finds and adds its problems; a later section
/// that needs what an earlier one could not give (the library, the model folder) is left out.
pub fn run(config: &Config, opts: &DoctorOptions) -> DoctorReport {
    let mut r = DoctorReport::default();
    r.lines.push("cosy doctor".into());
    report_configuration(&mut r, config);
    let runtime = report_runtime(&mut r, config);
    report_providers(&mut r, runtime);
    report_tensorrt_rtx(&mut r, config, runtime);
    report_gpus(&mut r);
    let Some(model) = report_model(&mut r, config, opts) else { return r };
    let Some(rt) = runtime else { return r };
    // The doctor writes nothing: its sessions open with the optimised-graph cache off (it only
    // lists that cache's entries below), and it builds no TensorRT engine.
    let mut looking = config.clone();
    looking.runtime.graph_cache_enabled = false;
    let factory = SessionFactory::with_runtime(rt, &looking, model.dir.clone());
    report_graphs(&mut r, rt, &model, opts);
    report_stages(&mut r, &factory, &model, opts);
    report_engine_cache(&mut r, &factory);
    report_graph_cache(&mut r, config, &factory);
    r
}

/// The settings in effect and where each came from.
fn report_configuration(r: &mut DoctorReport, config: &Config) {
    r.section("configuration");
    match &config.source_file {
        Some(f) => r.line(format!("config file: {} ({})", f.display(), config.sources.config_file)),
        None => r.line(format!("config file: {}", config.sources.config_file)),
    }
    r.line(format!("model folder: {} ({})", config.model_dir.display(), config.source_of("model.dir")));
    if Some(config.model_dir.as_path()) == cosy::paths::bundled_model().as_deref() {
        r.line("note: this is the bundled tiny model with random weights: it speaks noise, not speech; add a real export with `cosy model add NAME PATH`");
    }
    r.line(format!("voices folder: {} ({})", config.voices.dir.display(), config.source_of("voices.dir")));
    r.line(format!(
        "providers: {} (fallback {})",
        join(&config.runtime.providers),
        if config.runtime.allow_fallback { "allowed" } else { "not allowed" }
    ));
    r.line(format!("precision: {}, device id: {}, threads: {}", config.runtime.precision, config.runtime.device_id, config.runtime.threads));
    r.line(format!("TensorRT engine cache: {} ({})", config.runtime.engine_cache.display(), config.source_of("runtime.engine_cache")));
    match config.graph_cache_dir() {
        Some(d) => r.line(format!("optimised-graph cache (CPU sessions): {} ({})", d.display(), config.source_of("runtime.graph_cache"))),
        None => r.line("optimised-graph cache (CPU sessions): off (runtime.graph_cache_enabled = false)"),
    }

    r.line(format!(
        "user folders: config {}, data {} (models {}), cache {}",
        cosy::paths::config_home().display(),
        cosy::paths::data_home().display(),
        cosy::paths::models_dir().display(),
        cosy::paths::cache_home().display()
    ));
}

/// The ONNX Runtime library: loaded (`Some`), or where it was looked for and why it failed.
fn report_runtime(r: &mut DoctorReport, config: &Config) -> Option<&'static OrtRuntime> {
    r.section("ONNX Runtime");
    let (lib, how) = env::locate_library(config);
    match env::init(config) {
        Ok(rt) => {
            r.line(format!("library: {} (found by {})", rt.library.display(), rt.found_by));
            r.line(format!("version: {}", rt.version));
            Some(rt)
        }
        Err(e) => {
            r.line(format!("library: {} ({how})", lib.display()));
            if config.ort_library_setting().is_none() {
                let looked: Vec<String> = env::library_candidates(config).iter().map(|(p, _)| p.display().to_string()).collect();
                r.line(format!("looked in: {}, then the system's library path", looked.join(", ")));
            }
            r.problem(e);
            None
        }
    }
}

/// Each execution provider: compiled in, and whether it registers with the loaded library.
fn report_providers(r: &mut DoctorReport, runtime: Option<&OrtRuntime>) {
    r.section("execution providers");
    if let Some(rt) = runtime {
        // TensorRT for RTX is a plugin, with a section of its own below.
        for kind in ProviderKind::ALL.into_iter().filter(|k| *k != ProviderKind::TensorRtRtx) {
            let compiled = providers::compiled_in(kind);
            let usable = if compiled { providers::try_register(rt, kind) } else { Err("not compiled in".to_string()) };
            let state = match &usable {
                Ok(()) => "usable".to_string(),
                Err(e) => format!("not usable: {e}"),
            };
            r.line(format!("{:<9} compiled in: {:<3}  {state}", kind.as_str(), if compiled { "yes" } else { "no" }));
        }
    } else {
        r.line("(ONNX Runtime not loaded)");
    }
    match providers::tensorrt_version() {
        Some(v) => r.line(format!("TensorRT library: {v}")),
        None => r.line("TensorRT library: not found (libnvinfer.so.10)"),
    }
}

/// The TensorRT for RTX plugin (`tensorrt-rtx`): where it is looked for, which package is
/// installed, whether its bundled libraries load, and whether it can run here — the same checks,
/// in the same order and with the same line, as a session that asks for it (`trt_rtx::prepare`).
fn report_tensorrt_rtx(r: &mut DoctorReport, config: &Config, runtime: Option<&OrtRuntime>) {
    r.section("TensorRT for RTX (tensorrt-rtx)");
    let Some(rt) = runtime else {
        r.line("(ONNX Runtime not loaded)");
        return;
    };
    let (plugin, how) = trt_rtx::plugin_path(config, rt);
    if !plugin.is_file() {
        r.line(format!("plugin: not installed ({} not found, {how}); scripts/setup.sh --gpu installs it", plugin.display()));
    } else {
        let package = trt_rtx::package_of(&plugin).unwrap_or_else(|| "package unknown".into());
        r.line(format!("plugin: {} ({how}; {package})", plugin.display()));
        match trt_rtx::load_bundled(&plugin) {
            Ok(()) => r.line("bundled libraries (CUDA runtime 12, TensorRT for RTX, its ONNX parser): load"),
            Err(e) => r.line(format!("bundled libraries: {e}")),
        }
    }
    match trt_rtx::prepare(config, rt) {
        Ok(_) => r.line(format!("usable on GPU {}", config.runtime.device_id)),
        Err(e) => r.line(format!("not usable: {e}")),
    }
}

fn report_gpus(r: &mut DoctorReport) {
    r.section("GPUs");
    let gpus = providers::gpus();
    if gpus.is_empty() {
        r.line("none seen (nvidia-smi found no NVIDIA GPU)");
    }
    for g in &gpus {
        r.line(format!("{}: {} ({} MiB, driver {})", g.index, g.name, g.memory_mib, g.driver));
    }
}

/// A model folder as far as it was checked: the later sections skip what failed here.
struct CheckedModel {
    dir: Arc<ModelDir>,
    /// The labels (`stage NAME (PRECISION)`) of the graph files with a problem.
    bad_files: BTreeSet<String>,
}

impl CheckedModel {
    fn stage_has_bad_file(&self, stage: &str) -> bool {
        self.bad_files.iter().any(|b| b.starts_with(&format!("stage {stage} ")))
    }
}

/// The manifest, the files (sizes, and sha256 unless quick) and the model constants; `None` when
/// the folder cannot be opened at all.
fn report_model(r: &mut DoctorReport, config: &Config, opts: &DoctorOptions) -> Option<CheckedModel> {
    r.section("model folder");
    let model = match ModelDir::open(&config.model_dir) {
        Ok(m) => m,
        Err(e) => {
            r.problem(e);
            return None;
        }
    };
    let m = &model.manifest;
    r.line(format!("{}: format {} version {}", model.root.display(), m.format, m.format_version));
    if let Some(v) = m.exporter.get("version").and_then(|v| v.as_str()) {
        r.line(format!("exporter {v}"));
    }
    if let Some(random) = m.source.get("random") {
        let size = random.get("size").and_then(|v| v.as_str()).unwrap_or("?");
        let seed = random.get("seed").map(|v| v.to_string()).unwrap_or_else(|| "?".into());
        r.line(format!(
            "note: random weights ({size}, seed {seed}), made by the exporter's random mode: it speaks noise, not speech; export a real checkpoint (README)"
        ));
    }
    let stages: Vec<&str> = m.graphs.keys().map(String::as_str).collect();
    r.line(format!("stages: {}", stages.join(", ")));
    let missing = model.missing_stages();
    if !missing.is_empty() {
        r.line(format!("note: no graph for {} (this folder cannot synthesise speech)", missing.join(", ")));
    }
    let file_problems = model.check_files(!opts.quick);
    let n_files = model.listed_files().len();
    if file_problems.is_empty() {
        r.line(format!("{n_files} files present{}", if opts.quick { " (sizes checked)" } else { ", sizes and sha256 match" }));
    }
    let bad_files: BTreeSet<String> = file_problems.iter().map(|p| p.split(':').next().unwrap_or("").to_string()).collect();
    for p in file_problems {
        r.problem(Error::model(&model.root, p));
    }
    // The model constants (rates, steps, bounds) are checked as synthesis would check them; a
    // frontend-only folder has none to check.
    if missing.is_empty() {
        match cosy::engine::check_model_constants(&model) {
            Ok(_) => r.line("model constants valid"),
            Err(e) => r.problem(e),
        }
    }
    Some(CheckedModel { dir: Arc::new(model), bad_files })
}

/// Every graph variant opened on the CPU, its inputs and outputs compared with the manifest.
fn report_graphs(r: &mut DoctorReport, rt: &OrtRuntime, model: &CheckedModel, opts: &DoctorOptions) {
    r.section("graphs (I/O against the manifest)");
    if opts.quick {
        r.line("skipped (--quick)");
        return;
    }
    let dir = &model.dir;
    for (stage, spec) in &dir.manifest.graphs {
        for (prec, v) in &spec.variants {
            let label = format!("stage {stage} ({prec})");
            if model.bad_files.contains(&label) {
                r.line(format!("{stage} {prec}: not opened (file problem above)"));
                continue;
            }
            match open_on_cpu(rt, &dir.path_of(&v.file)) {
                Ok(s) => {
                    let problems = check_graph_io(stage, spec, s.inputs(), s.outputs());
                    if problems.is_empty() {
                        r.line(format!("{stage} {prec}: {} inputs, {} outputs match", spec.inputs.len(), spec.outputs.len()));
                    }
                    for p in problems {
                        r.problem(Error::model(&dir.root, format!("{} ({prec}): {}", p, v.file)));
                    }
                }
                Err(e) => r.problem(Error::model(&dir.root, format!("stage {stage} ({prec}): {} does not open: {e}", v.file))),
            }
        }
    }
}

/// Whether the doctor opens a stage's session to show what it really gets: not when quick, not
/// when its file has a problem, not with a working TensorRT (opening would build engines,
/// which `cosy engines build` does), and not with a usable TensorRT for RTX (opening would write
/// its runtime cache; the section "TensorRT for RTX" says it is usable).
fn opens_stage(factory: &SessionFactory, plan: &StagePlan, stage_has_bad_file: bool, opts: &DoctorOptions) -> bool {
    let would_build = plan.providers.contains(&ProviderKind::TensorRt) && providers::compiled_in(ProviderKind::TensorRt);
    let would_write = plan.providers.contains(&ProviderKind::TensorRtRtx) && trt_rtx::prepare(&factory.config, factory.runtime).is_ok();
    !(opts.quick || would_build || would_write || stage_has_bad_file)
}

/// The provider and precision each stage would get, and (where [`opens_stage`]) what opening it gives.
fn report_stages(r: &mut DoctorReport, factory: &SessionFactory, model: &CheckedModel, opts: &DoctorOptions) {
    r.section("stages (provider and precision each would get)");
    for stage in model.dir.manifest.graphs.keys() {
        let plan = match factory.plan(stage) {
            Ok(p) => p,
            Err(e) => {
                r.problem(e);
                continue;
            }
        };
        let mut line = format!(
            "{stage:<17} [{}] providers {} -> {} {}",
            plan.group.as_str(),
            join(&plan.providers),
            plan.precision,
            plan.variant_file
        );
        if let Some(n) = &plan.note {
            line.push_str(&format!(" ({n})"));
        }
        if !opens_stage(factory, &plan, model.stage_has_bad_file(stage), opts) {
            r.line(line);
            continue;
        }
        match factory.open_named(stage) {
            Ok(s) => {
                line.push_str(&format!("  => opened on {} ({})", s.provider_used, s.precision));
                r.line(line);
                for f in &s.fallbacks {
                    r.line(format!("    fallback: {f}"));
                }
            }
            Err(e) => {
                r.line(line);
                r.problem(e);
            }
        }
    }
}

/// What a TensorRT engine cache entry's state means: `current` when it was built for this model,
/// GPU and library.
fn engine_entry_state(state: &EntryState, current: bool) -> String {
    match state {
        EntryState::Valid if current => "valid, matches this model/GPU/library".to_string(),
        EntryState::Valid => "valid, stale (for another model, GPU or library; `cosy engines clean`)".to_string(),
        EntryState::Incomplete => "incomplete (build did not finish; rebuilt on next use)".to_string(),
        EntryState::Corrupt(why) => format!("corrupt: {why} (rebuilt on next use)"),
    }
}

/// What an optimised-graph cache entry's state means: `current` when it was written for this
/// model, CPU and library; `in_progress` while a running cosy writes it.
fn graph_entry_state(state: &EntryState, current: bool, in_progress: bool) -> String {
    match state {
        EntryState::Valid if current => "valid, matches this model/CPU/library".to_string(),
        EntryState::Valid => "valid, stale (for another model, CPU or library; `cosy engines clean`)".to_string(),
        EntryState::Incomplete if in_progress => "being written by a running cosy".to_string(),
        EntryState::Incomplete => "incomplete (interrupted; `cosy engines clean`)".to_string(),
        EntryState::Corrupt(why) => format!("corrupt: {why} (rebuilt on next use)"),
    }
}

/// One line per cache entry (folder name, size, what its state means), or `empty`.
fn list_entries(r: &mut DoctorReport, entries: Vec<(String, u64, String)>) {
    if entries.is_empty() {
        r.line("empty");
    }
    for (name, bytes, state) in entries {
        r.line(format!("{name}  {}  {state}", human_bytes(bytes)));
    }
}

fn folder_name(dir: &std::path::Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn report_engine_cache(r: &mut DoctorReport, factory: &SessionFactory) {
    r.section("TensorRT engine cache");
    r.line(format!("folder: {}", factory.cache.root.display()));
    let current = current_engine_keys(factory);
    match factory.cache.entries() {
        Ok(entries) => {
            let lines = entries
                .into_iter()
                .map(|e| {
                    let name = folder_name(&e.dir);
                    let state = engine_entry_state(&e.state, current.contains(&name));
                    (name, e.bytes, state)
                })
                .collect();
            list_entries(r, lines);
        }
        Err(e) => r.problem(e),
    }
}

fn report_graph_cache(r: &mut DoctorReport, config: &Config, factory: &SessionFactory) {
    r.section("optimised-graph cache (CPU sessions)");
    let Some(cache) = config.graph_cache_dir().map(cosy::runtime::GraphCache::new) else {
        r.line("off (runtime.graph_cache_enabled = false): every CPU session optimises its graph at load");
        return;
    };
    r.line(format!("folder: {}", cache.root.display()));
    let current = current_graph_keys(factory);
    match cache.entries() {
        Ok(entries) => {
            let lines = entries
                .into_iter()
                .map(|e| {
                    let name = folder_name(&e.dir);
                    let state = graph_entry_state(&e.state, current.contains(&name), e.in_progress);
                    (name, e.bytes, state)
                })
                .collect();
            list_entries(r, lines);
        }
        // Never a problem: sessions load without the cache.
        Err(e) => r.line(format!("cannot be read ({e}); sessions load without it")),
    }
}

fn open_on_cpu(rt: &OrtRuntime, path: &std::path::Path) -> Result<Session, ort::Error> {
    Session::builder(&rt.env)?.commit_from_file(path)
}

fn join(p: &[ProviderKind]) -> String {
    p.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

/// `1.5 GiB`-style sizes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
