//! Opening a model's stages for the engine: every session through the runtime's factory (engine
//! and graph caches, providers, precision), the LLM and the DiT behind their batching threads,
//! and how long each took (`cosy profile` reports it).

use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::vocab::{Precision, ProviderKind, Stage, StageGroup, LLM_STEP_GRAPH};
use crate::error::Result;
use crate::model::ModelDir;
use crate::pipeline::{ModelConstants, Stages};
use crate::runtime::{GraphCacheUse, SessionFactory, StageSession};

use super::{DitBatcher, LlmScheduler};

/// How one stage's session was opened (for `cosy profile`).
#[derive(Debug, Clone, PartialEq)]
pub struct StageLoad {
    /// Manifest stage name (`llm`, `flow_front`, `dit`, `hift_decode`, `campplus`, `speech_tokenizer`).
    pub stage: String,
    pub seconds: f64,
    pub provider: ProviderKind,
    pub precision: Precision,
    /// `load` (engine cache hit), `build` (TensorRT built an engine), `cached graph` (the saved
    /// optimised graph, not optimised again), `graph optimised and saved` (first CPU load) or
    /// `session` (optimised at load, nothing saved).
    pub kind: &'static str,
    /// Providers asked for but not used, with the reason.
    pub fallbacks: Vec<String>,
}

/// The open stages, with the engine's own handles on its two batchers (for their counters).
pub(super) struct Opened {
    pub stages: Stages,
    pub llm: Arc<LlmScheduler>,
    pub dit: Arc<DitBatcher>,
    pub load_times: Vec<StageLoad>,
}

/// Opens every stage of `dir` as `config` says, starting the LLM scheduler and the DiT batcher.
pub(super) fn open_stages(config: &Config, dir: Arc<ModelDir>, constants: &ModelConstants, llm_gather_first: usize) -> Result<Opened> {
    let factory = SessionFactory::new(config, dir.clone())?;
    let mut load_times = Vec::new();
    let mut open = |stage: &str| -> Result<StageSession> {
        let started = std::time::Instant::now();
        let session = factory.open_named(stage)?;
        load_times.push(StageLoad {
            stage: stage.to_string(),
            seconds: started.elapsed().as_secs_f64(),
            provider: session.provider_used,
            precision: session.precision,
            kind: match (session.engine_cached, session.graph_cache) {
                (Some(true), _) => "load",
                (Some(false), _) => "build",
                (None, GraphCacheUse::Loaded) => "cached graph",
                (None, GraphCacheUse::Saved) => "graph optimised and saved",
                (None, _) => "session",
            },
            fallbacks: session.fallbacks.clone(),
        });
        Ok(session)
    };
    // engine.llm_kv: the static slot cache (graph llm_step) or the growing one (graph llm); `auto`
    // decides by the LLM's first configured provider (the one its session is opened for).
    let llm_provider = config.providers_for(StageGroup::Llm).first().copied().unwrap_or(ProviderKind::Cpu);
    let static_kv = config.engine.llm_kv_static(llm_provider, dir.manifest.graphs.contains_key(LLM_STEP_GRAPH))?;
    let llm_session = if static_kv { open(LLM_STEP_GRAPH)? } else { open(Stage::Llm.name())? };
    let flow_front = Mutex::new(open(Stage::FlowFront.name())?);
    let dit_shape = crate::flow::DitCacheShape::from_graph(dir.graph(Stage::Dit.name())?);
    let dit_session = open(Stage::Dit.name())?;
    let hold = config.engine.first_audio_priority_applies(llm_session.provider_used, dit_session.provider_used);
    let llm = Arc::new(LlmScheduler::start_with_positions(llm_session, constants.llm_shape, config.engine.max_batch, llm_gather_first, hold, config.engine.llm_max_positions)?);
    let prompt_cache_bytes = config.engine.prompt_cache_bound(dit_session.provider_used);
    let prefix_disk = match dit_shape {
        Some(shape) if prompt_cache_bytes > 0 && config.engine.prompt_cache_disk_bytes > 0 => {
            // What a cache depends on besides the voice: the model folder (its manifest lists
            // every file's sha256), the DiT's precision and provider.
            let manifest = std::fs::read(dir.root.join(crate::model::MANIFEST)).map_err(|e| crate::Error::io(dir.root.join(crate::model::MANIFEST), e))?;
            let model = [manifest.as_slice(), dit_session.precision.as_str().as_bytes(), dit_session.provider_used.as_str().as_bytes()].join(&0u8);
            Some(crate::pipeline::PrefixDisk::new(
                config.prompt_cache_dir(),
                &model,
                shape,
                constants.cfm.n_timesteps,
                config.engine.prompt_cache_disk_bytes,
            ))
        }
        _ => None,
    };
    let dit = Arc::new(DitBatcher::start(dit_session, config.engine.dit_max_batch, dit_shape, prompt_cache_bytes, prefix_disk)?);
    let stages = Stages {
        llm: Box::new(llm.clone()),
        flow_front,
        dit: Box::new(dit.clone()),
        hift: Mutex::new(open(Stage::HiftDecode.name())?),
        campplus: Mutex::new(open(Stage::Campplus.name())?),
        speech_tokenizer: Mutex::new(open(Stage::SpeechTokenizer.name())?),
    };
    Ok(Opened { stages, llm, dit, load_times })
}
