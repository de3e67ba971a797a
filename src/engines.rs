//! `cosy engines build|list|clean`: the TensorRT engine cache and the optimised-graph cache from the
//! command line (`build` makes TensorRT engines; `list` and `clean` cover both caches).

use std::collections::BTreeSet;
use std::sync::Arc;

use cosy::config::Config;
use cosy::error::{Error, Result};
use cosy::model::ModelDir;
use cosy::runtime::cache_listing::{current_engine_keys, current_graph_keys};
use cosy::runtime::engine_cache::EngineCache;
use cosy::runtime::graph_cache::{GraphCache, GraphKey};
use cosy::runtime::keyed_dir::{self, EntryState};
use cosy::runtime::{env, providers, SessionFactory};
use cosy::vocab::{Precision, ProviderKind, StageGroup};

/// One built (or reused) engine.
#[derive(Debug, Clone)]
pub struct BuiltEngine {
    pub stage: String,
    pub precision: Precision,
    pub dir: std::path::PathBuf,
    pub bytes: u64,
}

/// Builds TensorRT engines for `stages` (all in the manifest when empty) at `precisions` (each
/// stage's configured precision when empty). Calls `progress(done, total, label)` before each.
pub fn build(
    config: &Config,
    stages: &[String],
    precisions: &[Precision],
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<Vec<BuiltEngine>> {
    let rt = env::init(config)?;
    if !providers::compiled_in(ProviderKind::TensorRt) {
        return Err(Error::Provider {
            provider: "tensorrt".into(),
            msg: format!(
                "the loaded ONNX Runtime ({}) was built without TensorRT; fix: scripts/setup-ort.sh --gpu (needs CUDA 13, TensorRT 10 and an NVIDIA GPU)",
                rt.library.display()
            ),
        });
    }
    let model = Arc::new(ModelDir::open(&config.model_dir)?);
    let stages: Vec<String> = if stages.is_empty() {
        model.manifest.graphs.keys().cloned().collect()
    } else {
        for s in stages {
            model.graph(s)?;
        }
        stages.to_vec()
    };
    let mut jobs = Vec::new();
    for stage in &stages {
        let group = StageGroup::of_graph(stage)
            .ok_or_else(|| Error::model(&model.root, format!("unknown stage {stage:?}")))?;
        let precs: Vec<Precision> = if precisions.is_empty() { vec![config.precision_for(group)] } else { precisions.to_vec() };
        for p in precs {
            jobs.push((stage.clone(), group, p));
        }
    }
    let mut built = Vec::new();
    for (i, (stage, group, precision)) in jobs.iter().enumerate() {
        progress(i, jobs.len(), &format!("{stage} {precision}"));
        // This stage alone, on TensorRT (CUDA takes what TensorRT does not), no fallback: a
        // build that silently ran on CPU would not be a build.
        let mut cfg = config.clone();
        cfg.runtime.allow_fallback = false;
        let st = cfg.stages.entry(*group).or_default();
        st.providers = Some(vec![ProviderKind::TensorRt, ProviderKind::Cuda, ProviderKind::Cpu]);
        st.precision = Some(*precision);
        let factory = SessionFactory::with_runtime(rt, &cfg, model.clone());
        let session = factory.open_named(stage)?;
        let dir = session.engine_dir.clone().unwrap_or_default();
        built.push(BuiltEngine { stage: stage.clone(), precision: *precision, bytes: keyed_dir::dir_size(&dir), dir });
    }
    progress(jobs.len(), jobs.len(), "done");
    Ok(built)
}

/// Which cache an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// A TensorRT engine (and timing cache) folder.
    Engine,
    /// A saved optimised graph for CPU sessions.
    Graph,
    /// The DiT prompt-prefix cache's files (one per voice; `engine.prompt_cache_disk_bytes`).
    PromptPrefix,
}

impl CacheKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheKind::Engine => "tensorrt-engine",
            CacheKind::Graph => "optimised-graph",
            CacheKind::PromptPrefix => "prompt-prefix",
        }
    }
}

/// A cache entry and whether it is one the current model/hardware/library would use.
#[derive(Debug, Clone)]
pub struct ListedEntry {
    pub kind: CacheKind,
    pub dir: std::path::PathBuf,
    pub state: EntryState,
    pub bytes: u64,
    /// What the entry is for (stage, precision, hardware, versions), when its key is readable.
    pub summary: Option<String>,
    /// `None` when the model folder or library is not available to tell.
    pub current: Option<bool>,
    /// Being written by a running process (an optimised graph's temporary folder).
    pub in_progress: bool,
}

/// The names of the cache folders that the current setup would use (engines and graphs), if it
/// can be computed.
fn current_set(config: &Config) -> Option<BTreeSet<String>> {
    let rt = env::init(config).ok()?;
    let model = Arc::new(ModelDir::open(&config.model_dir).ok()?);
    let factory = SessionFactory::with_runtime(rt, config, model);
    let mut set = current_engine_keys(&factory);
    set.extend(current_graph_keys(&factory));
    Some(set)
}

/// Every entry of both caches with its state.
pub fn list(config: &Config) -> Result<Vec<ListedEntry>> {
    let mut out = Vec::new();
    let graph_dir = config.graph_cache_folder();
    let engines = EngineCache::of_config(config);
    for e in engines.entries()? {
        let summary = e
            .key
            .as_ref()
            .map(|k| format!("{} {} gpu={} ort={} trt={}", k.stage, k.precision, k.gpu, k.ort_version, k.trt_version));
        out.push(ListedEntry { kind: CacheKind::Engine, dir: e.dir, state: e.state, bytes: e.bytes, summary, current: None, in_progress: false });
    }
    // The prompt-prefix files as one entry (each file names a voice and model by a hash): kept in
    // its own bound, removed only by `clean --all`.
    let prefix_dir = config.prompt_cache_dir();
    if let Ok(files) = std::fs::read_dir(&prefix_dir) {
        let sizes: Vec<u64> = files.flatten().filter_map(|f| f.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).collect();
        out.push(ListedEntry {
            kind: CacheKind::PromptPrefix,
            dir: prefix_dir,
            state: EntryState::Valid,
            bytes: sizes.iter().sum(),
            summary: Some(format!("{} file{}", sizes.len(), if sizes.len() == 1 { "" } else { "s" })),
            current: None,
            in_progress: false,
        });
    }
    // Listed (and cleaned) also when the cache is turned off.
    for e in GraphCache::new(graph_dir).entries()? {
        let summary = e.key.as_ref().map(graph_summary);
        out.push(ListedEntry {
            kind: CacheKind::Graph,
            dir: e.dir,
            state: e.state,
            bytes: e.bytes,
            summary,
            current: None,
            in_progress: e.in_progress,
        });
    }
    if out.iter().any(|e| e.state == EntryState::Valid) {
        if let Some(current) = current_set(config) {
            for e in out.iter_mut().filter(|e| e.kind != CacheKind::PromptPrefix) {
                let name = e.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                e.current = Some(current.contains(&name));
            }
        }
    }
    Ok(out)
}

/// `llm fp32 cpu ort=1.31.1 x86_64 avx2 …`: an optimised graph's key in a few words.
pub fn graph_summary(k: &GraphKey) -> String {
    format!(
        "{} {} {} ort={} {} {}",
        k.stage,
        k.precision,
        k.providers.join(","),
        k.ort_version,
        k.arch,
        if k.cpu_features.is_empty() { "-".to_string() } else { k.cpu_features.join(",") }
    )
}

/// Removes corrupt and unfinished entries of both caches and (when the current setup is known)
/// stale ones; all entries with `all`. An optimised graph being written by a running process is
/// left alone unless `all`. Returns the removed folders.
pub fn clean(config: &Config, all: bool) -> Result<Vec<std::path::PathBuf>> {
    let mut removed = Vec::new();
    for l in list(config)? {
        let stale = match &l.state {
            EntryState::Valid => l.current == Some(false),
            EntryState::Incomplete => !l.in_progress,
            EntryState::Corrupt(_) => true,
        };
        if all || stale {
            match std::fs::remove_dir_all(&l.dir) {
                Ok(()) => removed.push(l.dir),
                // Another process removed or renamed it meanwhile (e.g. its save finished).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&l.dir, e)),
            }
        }
    }
    Ok(removed)
}
