//! `cosy engines build|list|clean`: the TensorRT engine cache from the command line.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::config::{Config, Precision, ProviderKind, StageGroup};
use crate::doctor::current_keys;
use crate::error::{Error, Result};
use crate::model::ModelDir;
use crate::runtime::engine_cache::{CacheEntry, EngineCache, EntryState};
use crate::runtime::{env, providers, SessionFactory};

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
        let session = factory.open(stage)?;
        let dir = session.engine_dir.clone().unwrap_or_default();
        built.push(BuiltEngine { stage: stage.clone(), precision: *precision, bytes: crate::runtime::engine_cache::dir_size(&dir), dir });
    }
    progress(jobs.len(), jobs.len(), "done");
    Ok(built)
}

/// A cache entry and whether it is one the current model/GPU/library would use.
#[derive(Debug, Clone)]
pub struct ListedEntry {
    pub entry: CacheEntry,
    /// `None` when the model folder or library is not available to tell.
    pub current: Option<bool>,
}

/// The names of the cache folders that the current setup would use, if it can be computed.
fn current_set(config: &Config) -> Option<BTreeSet<String>> {
    let rt = env::init(config).ok()?;
    let model = Arc::new(ModelDir::open(&config.model_dir).ok()?);
    let factory = SessionFactory::with_runtime(rt, config, model);
    Some(current_keys(&factory))
}

/// Every cache entry with its state.
pub fn list(config: &Config) -> Result<Vec<ListedEntry>> {
    let cache = EngineCache::new(config.runtime.engine_cache.clone());
    let entries = cache.entries()?;
    let current = if entries.is_empty() { None } else { current_set(config) };
    Ok(entries
        .into_iter()
        .map(|e| {
            let name = e.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            ListedEntry { current: current.as_ref().map(|c| c.contains(&name)), entry: e }
        })
        .collect())
}

/// Removes corrupt and unfinished entries and (when the current setup is known) stale ones; all
/// entries with `all`. Returns the removed folders.
pub fn clean(config: &Config, all: bool) -> Result<Vec<std::path::PathBuf>> {
    let mut removed = Vec::new();
    for l in list(config)? {
        let stale = match &l.entry.state {
            EntryState::Valid => l.current == Some(false),
            EntryState::Incomplete | EntryState::Corrupt(_) => true,
        };
        if all || stale {
            std::fs::remove_dir_all(&l.entry.dir).map_err(|e| Error::io(&l.entry.dir, e))?;
            removed.push(l.entry.dir);
        }
    }
    Ok(removed)
}
