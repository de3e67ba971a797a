//! Opening a stage's graph as an ONNX Runtime session with the configured providers.
//!
//! Providers are registered in the configured priority order (ONNX Runtime gives each node to the
//! first provider that takes it; CPU takes the rest). A provider that cannot be registered, or
//! with which the session cannot be created, is an error naming the provider and the reason —
//! unless `runtime.allow_fallback` is set, in which case it is a warning and the next provider is
//! tried (CPU last). The provider that really got the stage is recorded in [`StageSession`].
//!
//! A CPU-only session loads its graph through the optimised-graph cache
//! ([`super::graph_cache`]): the first load saves the graph as ONNX Runtime optimised it, later
//! loads open that with optimisation disabled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ort::ep::{self, ExecutionProvider};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;

use crate::config::{Config, CudaConvSearch};
use crate::error::{Error, Result};
use crate::model::{GraphSpec, ModelDir, Variant};
use crate::runtime::engine_cache::{CacheKey, EngineCache};
use crate::runtime::env::{self, OrtRuntime};
use crate::runtime::graph_cache::{self, GraphCache, GraphKey};
use crate::runtime::providers;
use crate::runtime::trt_rtx;
use crate::vocab::{Precision, ProviderKind, Stage, StageGroup};

/// An open session for one stage and how it was made.
pub struct StageSession {
    pub stage: String,
    pub session: Session,
    /// The provider that got the stage: the first one that registered and ran.
    pub provider_used: ProviderKind,
    /// All providers registered, in priority order (nodes the first rejects go to the next).
    pub providers_registered: Vec<ProviderKind>,
    /// The precision the stage actually runs in.
    pub precision: Precision,
    /// The graph file that was loaded.
    pub graph_file: PathBuf,
    /// One line per provider that was asked for but not used, with the reason (fallback only).
    pub fallbacks: Vec<String>,
    /// The TensorRT cache folder, when TensorRT was registered.
    pub engine_dir: Option<PathBuf>,
    /// With TensorRT: whether a cached engine was found (`true`) or one is built (`false`).
    pub engine_cached: Option<bool>,
    /// How the session used the optimised-graph cache.
    pub graph_cache: GraphCacheUse,
    /// Whether calls of this stage are padded to shape buckets (`runtime.shape_buckets`, resolved
    /// for the provider used: [`crate::config::RuntimeSettings::shape_buckets_apply`]).
    pub shape_buckets: bool,
    pub(crate) device_id: u32,
}

impl std::fmt::Debug for StageSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageSession")
            .field("stage", &self.stage)
            .field("provider_used", &self.provider_used)
            .field("precision", &self.precision)
            .field("graph_file", &self.graph_file)
            .finish()
    }
}

/// How a session used the optimised-graph cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphCacheUse {
    /// Not used: turned off, or providers other than CPU.
    Off,
    /// Loaded the saved optimised graph, without optimising.
    Loaded,
    /// Optimised the graph and saved it for the next load.
    Saved,
    /// Optimised the graph without saving it (the folder cannot be written, saving failed, or
    /// another process saved the same graph first).
    NotSaved,
}

/// Session options that change what ONNX Runtime's graph optimiser makes, as they go into the
/// optimised-graph cache key. Every such option [`SessionFactory::new_builder`] or the cache sets
/// must be listed here, or a cached graph made under other options would be loaded.
pub const OPTIMISER_OPTIONS: &[&str] = &["graph_optimization_level=all"];

/// What a stage would get, before any session is made (`cosy doctor`).
#[derive(Debug, Clone)]
pub struct StagePlan {
    pub stage: String,
    pub group: StageGroup,
    pub providers: Vec<ProviderKind>,
    /// The precision asked for.
    pub requested: Precision,
    /// Graph loaded and precision it gives when the first provider is used.
    pub variant_file: String,
    pub precision: Precision,
    /// Why the precision differs from the one asked for, if it does.
    pub note: Option<String>,
}

/// Hardware facts in the TensorRT cache key, looked up once.
#[derive(Debug, Clone)]
pub struct HardwareFacts {
    pub gpu: String,
    pub trt_version: String,
}

/// Makes sessions for the stages of one model folder under one configuration.
pub struct SessionFactory {
    pub runtime: &'static OrtRuntime,
    pub config: Config,
    pub model: Arc<ModelDir>,
    pub cache: EngineCache,
    /// The optimised-graph cache; `None` when turned off.
    pub graph_cache: Option<GraphCache>,
    hardware: Mutex<Option<HardwareFacts>>,
    cpu_features: Mutex<Option<Vec<String>>>,
    /// The unwritable-cache warning is given once per factory, not once per stage.
    graph_cache_warned: AtomicBool,
}

impl SessionFactory {
    /// Loads ONNX Runtime if needed and prepares to open the model's stages.
    pub fn new(config: &Config, model: Arc<ModelDir>) -> Result<Self> {
        let runtime = env::init(config)?;
        Ok(Self::with_runtime(runtime, config, model))
    }

    pub fn with_runtime(runtime: &'static OrtRuntime, config: &Config, model: Arc<ModelDir>) -> Self {
        let graph_cache = config.graph_cache_dir().map(GraphCache::new);
        // Also when the graph cache is off: its folder is never a TensorRT entry.
        let cache = EngineCache::of_config(config);
        SessionFactory {
            runtime,
            config: config.clone(),
            model,
            cache,
            graph_cache,
            hardware: Mutex::new(None),
            cpu_features: Mutex::new(None),
            graph_cache_warned: AtomicBool::new(false),
        }
    }

    /// This CPU's kernel-relevant features (looked up once).
    pub fn cpu_features(&self) -> Vec<String> {
        let mut g = self.cpu_features.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(graph_cache::cpu_features).clone()
    }

    /// The optimised-graph cache key of a stage's graph variant under the given providers.
    pub fn graph_key(&self, stage: &str, graph: &Variant, precision: Precision, providers: &[ProviderKind]) -> GraphKey {
        build_graph_key(stage, graph, precision, providers, &self.runtime.version, &self.cpu_features())
    }

    /// A session builder with the options every session of `stage` gets (no providers yet):
    /// its group's intra-op threads (`stages.<group>.threads`, else `runtime.threads`) and
    /// spinning (`stages.<group>.spinning`).
    fn new_builder(&self, stage: &str) -> std::result::Result<SessionBuilder, ort::Error> {
        let mut builder = Session::builder(&self.runtime.env)?;
        let group = StageGroup::of_graph(stage);
        let threads = group.map_or(self.config.runtime.threads, |g| self.config.threads_for(g));
        if threads > 0 {
            builder = builder.with_intra_threads(threads).map_err(ort::Error::<()>::from)?;
        }
        if let Some(spin) = group.and_then(|g| self.config.spinning_for(g)) {
            builder = builder.with_intra_op_spinning(spin).map_err(ort::Error::<()>::from)?;
        }
        if let Some(prefix) = &self.config.runtime.ort_profile {
            // ONNX Runtime appends `_<time>.json` and writes the file when the session closes.
            let mut file = prefix.clone().into_os_string();
            file.push(format!("-{stage}"));
            builder = builder.with_profiling(file).map_err(ort::Error::<()>::from)?;
        }
        Ok(builder)
    }

    /// GPU name and TensorRT version (cached; `nvidia-smi` and `dlopen` are not free).
    pub fn hardware(&self) -> HardwareFacts {
        let mut g = self.hardware.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(|| HardwareFacts {
            gpu: providers::gpu_name(self.config.runtime.device_id),
            trt_version: providers::tensorrt_version().unwrap_or_else(|| "none".into()),
        })
        .clone()
    }

    fn group_of(&self, stage: &str) -> Result<StageGroup> {
        StageGroup::of_graph(stage)
            .ok_or_else(|| Error::model(&self.model.root, format!("unknown stage {stage:?}")))
    }

    /// Which graph file to load and what precision results, for a given first provider.
    /// TensorRT builds from the fp32 graph and applies the precision as a build flag; the other
    /// providers load the precision's variant, or fp32 (with a note) when there is none. TensorRT
    /// for RTX is among the others: it builds strongly typed networks only, so the graph's own
    /// types are its precision (the fp16 graph for fp16; it has no precision flag).
    fn choose_variant<'g>(
        &self,
        stage: &str,
        spec: &'g GraphSpec,
        primary: ProviderKind,
        requested: Precision,
    ) -> Result<(&'g Variant, Precision, Option<String>)> {
        let fp32 = spec.variant(Precision::Fp32);
        // With fallback allowed, TensorRT's registration refuses int8 instead and the next
        // provider (which can load the int8 graph) takes the stage.
        if primary == ProviderKind::TensorRt && requested == Precision::Int8 && !self.config.runtime.allow_fallback {
            return Err(Error::Provider {
                provider: primary.to_string(),
                msg: tensorrt_int8_refusal(stage),
            });
        }
        if primary == ProviderKind::TensorRt {
            if let Some(v) = fp32 {
                return Ok((v, requested, None));
            }
        }
        if let Some(v) = spec.variant(requested) {
            return Ok((v, requested, None));
        }
        match fp32 {
            Some(v) => Ok((
                v,
                Precision::Fp32,
                Some(format!("stage {stage} has no {requested} graph for {primary}; running fp32")),
            )),
            None => Err(Error::model(
                &self.model.root,
                format!("stage {stage} has neither a {requested} nor an fp32 graph"),
            )),
        }
    }

    /// What `open(stage)` would do, without doing it.
    pub fn plan(&self, stage: &str) -> Result<StagePlan> {
        let group = self.group_of(stage)?;
        let spec = self.model.graph(stage)?;
        let providers = self.config.providers_for(group);
        let requested = self.config.precision_for(group);
        let primary = providers.first().copied().unwrap_or(ProviderKind::Cpu);
        let (variant, precision, note) = self.choose_variant(stage, spec, primary, requested)?;
        Ok(StagePlan {
            stage: stage.to_string(),
            group,
            providers,
            requested,
            variant_file: variant.file.clone(),
            precision,
            note,
        })
    }

    /// The TensorRT cache key of a stage at a precision.
    pub fn cache_key(&self, stage: &str, precision: Precision) -> Result<CacheKey> {
        let spec = self.model.graph(stage)?;
        let graph = spec
            .variant(Precision::Fp32)
            .or_else(|| spec.variant(precision))
            .ok_or_else(|| Error::model(&self.model.root, format!("stage {stage} has no graph for TensorRT")))?;
        let hw = self.hardware();
        Ok(build_cache_key(stage, spec, graph, precision, &hw.gpu, &self.runtime.version, &hw.trt_version))
    }

    /// The TensorRT for RTX runtime-cache key of a stage at a precision: the graph it loads (the
    /// precision's variant, else fp32), the GPU, the ONNX Runtime version and the installed plugin
    /// package (which pins TensorRT for RTX's version), under the option `provider=tensorrt-rtx` so
    /// it never names a TensorRT engine's folder.
    pub fn rtx_cache_key(&self, stage: &str, precision: Precision) -> Result<CacheKey> {
        let spec = self.model.graph(stage)?;
        let graph = spec
            .variant(precision)
            .or_else(|| spec.variant(Precision::Fp32))
            .ok_or_else(|| Error::model(&self.model.root, format!("stage {stage} has no graph for TensorRT for RTX")))?;
        let (plugin, _) = trt_rtx::plugin_path(&self.config, self.runtime);
        let package = trt_rtx::package_of(&plugin).unwrap_or_else(|| "unknown".into());
        Ok(CacheKey {
            stage: stage.to_string(),
            graph_sha256: graph.sha256.to_ascii_lowercase(),
            precision: precision.as_str().to_string(),
            gpu: self.hardware().gpu,
            ort_version: self.runtime.version.clone(),
            trt_version: format!("rtx:{package}"),
            profiles: Vec::new(),
            options: vec![format!("provider={}", ProviderKind::TensorRtRtx)],
        })
    }

    /// Opens a stage: registers the providers, loads the graph, records what it got.
    pub fn open(&self, stage: Stage) -> Result<StageSession> {
        self.open_named(stage.name())
    }

    /// [`Self::open`] by manifest name (what `cosy doctor` and `cosy engines` iterate). Each
    /// attempt chooses the graph variant for the first provider, registers the providers and
    /// creates the session; a provider that cannot be used is an error, or with
    /// `runtime.allow_fallback` a warning and another attempt without it.
    pub fn open_named(&self, stage: &str) -> Result<StageSession> {
        let group = self.group_of(stage)?;
        let spec = self.model.graph(stage)?;
        let requested = self.config.precision_for(group);
        let mut candidates = self.config.providers_for(group);
        let mut fallbacks: Vec<String> = Vec::new();

        loop {
            let primary = candidates.first().copied().unwrap_or(ProviderKind::Cpu);
            let (variant, precision, note) = self.choose_variant(stage, spec, primary, requested)?;
            if let Some(n) = &note {
                tracing::warn!("{n}");
            }
            let graph_file = self.model.path_of(&variant.file);

            let mut builder = self.new_builder(stage)?;
            let mut engine = EngineUse::default();
            let (registered, refused) = self.register_candidates(&mut builder, stage, spec, &candidates, precision, &mut engine)?;
            fallbacks.extend(refused);
            // If this attempt's first registered provider is not the one the variant was chosen
            // for (it failed to register), choose again for the provider actually first.
            let first = registered.first().copied().unwrap_or(ProviderKind::Cpu);
            if first != primary {
                keep_candidates(&mut candidates, |p| registered.contains(p));
                continue;
            }

            let (committed, graph_cache) = self.commit(builder, stage, variant, precision, &registered, &graph_file);
            match committed {
                Ok(session) => {
                    self.note_opened(stage, &engine, first, precision, &fallbacks);
                    return Ok(StageSession {
                        stage: stage.to_string(),
                        session,
                        provider_used: first,
                        providers_registered: registered,
                        precision,
                        graph_file,
                        fallbacks,
                        engine_dir: engine.dir,
                        engine_cached: engine.cached,
                        graph_cache,
                        shape_buckets: self.config.runtime.shape_buckets_apply(first),
                        device_id: self.config.runtime.device_id,
                    });
                }
                Err(e) => {
                    let msg = self.commit_failed(stage, first, &graph_file, e)?;
                    tracing::debug!("{msg}; falling back (runtime.allow_fallback = true)");
                    fallbacks.push(msg);
                    keep_candidates(&mut candidates, |p| *p != first);
                }
            }
        }
    }

    /// Registers each candidate provider with `builder`: the ones registered, and the messages of
    /// those that cannot be used (with `runtime.allow_fallback`; without it the first is the error).
    fn register_candidates(
        &self,
        builder: &mut SessionBuilder,
        stage: &str,
        spec: &GraphSpec,
        candidates: &[ProviderKind],
        precision: Precision,
        engine: &mut EngineUse,
    ) -> Result<(Vec<ProviderKind>, Vec<String>)> {
        let mut registered = Vec::new();
        let mut refused = Vec::new();
        for &p in candidates {
            match self.register(builder, stage, spec, p, precision, &mut engine.key, &mut engine.dir, &mut engine.cached) {
                Ok(()) => registered.push(p),
                Err(reason) => {
                    if !self.config.runtime.allow_fallback {
                        return Err(Error::Provider {
                            provider: p.to_string(),
                            msg: format!("stage {stage}: cannot be used: {reason}; {}", hint(p)),
                        });
                    }
                    let msg = format!("stage {stage}: provider {p} cannot be used: {reason}");
                    // Warned about once the stage has opened (`note_opened`), naming the fallback.
                    tracing::debug!("{msg}; falling back (runtime.allow_fallback = true)");
                    refused.push(msg);
                }
            }
        }
        Ok((registered, refused))
    }

    /// After the session could not be created on `first`: with `runtime.allow_fallback` and a
    /// provider other than the CPU, the message of falling back to the next one; otherwise the
    /// error (the provider's, or on the CPU the graph's own).
    fn commit_failed(&self, stage: &str, first: ProviderKind, graph_file: &Path, e: ort::Error) -> Result<String> {
        if first != ProviderKind::Cpu && self.config.runtime.allow_fallback {
            return Ok(format!("stage {stage}: provider {first} cannot create the session: {e}"));
        }
        if first != ProviderKind::Cpu {
            return Err(Error::Provider {
                provider: first.to_string(),
                msg: format!("stage {stage}: cannot create the session: {e}; {}", hint(first)),
            });
        }
        Err(Error::Runtime(format!("stage {stage}: cannot open {}: {e}", graph_file.display())))
    }

    /// Records the TensorRT engine a new session wrote, and says where a stage runs when it is
    /// not simply the CPU.
    fn note_opened(&self, stage: &str, engine: &EngineUse, first: ProviderKind, precision: Precision, fallbacks: &[String]) {
        if let Some(key) = &engine.key {
            match self.cache.finish(key) {
                Ok(true) => {}
                Ok(false) => tracing::info!("stage {stage}: TensorRT wrote no engine yet (it builds on the first run)"),
                Err(e) => tracing::warn!("stage {stage}: cannot record the engine cache: {e}"),
            }
        }
        if first != ProviderKind::Cpu || !fallbacks.is_empty() {
            tracing::info!("stage {stage}: running on {first} ({precision})");
        }
        if !fallbacks.is_empty() {
            // One line: why the configured provider was not used and what is used instead. The
            // same reasons for every stage (no GPU, no plugin) are one warning, not one per stage.
            let prefix = format!("stage {stage}: ");
            let reasons: Vec<&str> = fallbacks.iter().map(|m| m.strip_prefix(&prefix).unwrap_or(m)).collect();
            let line = format!("{}; falling back to {first} (runtime.allow_fallback = true)", reasons.join("; "));
            if first_time(&line) {
                tracing::warn!("{line}");
            } else {
                tracing::debug!("stage {stage}: {line}");
            }
        }
    }

    /// Creates the session from a builder whose providers are registered, through the optimised-graph
    /// cache when the session is CPU-only and the cache is on. Problems with the cache are warnings;
    /// the error returned is the graph's own.
    fn commit(
        &self,
        mut builder: SessionBuilder,
        stage: &str,
        variant: &Variant,
        precision: Precision,
        registered: &[ProviderKind],
        graph_file: &Path,
    ) -> (std::result::Result<Session, ort::Error>, GraphCacheUse) {
        let Some(cache) = self.graph_cache.as_ref().filter(|_| registered == [ProviderKind::Cpu]) else {
            return (builder.commit_from_file(graph_file), GraphCacheUse::Off);
        };
        let key = self.graph_key(stage, variant, precision, registered);
        if let Some(saved) = cache.lookup(&key) {
            let loaded = builder
                .with_optimization_level(GraphOptimizationLevel::Disable)
                .map_err(ort::Error::<()>::from)
                .and_then(|mut b| b.commit_from_file(&saved));
            match loaded {
                Ok(session) => {
                    tracing::debug!("stage {stage}: loaded the optimised graph {}", saved.display());
                    return (Ok(session), GraphCacheUse::Loaded);
                }
                Err(e) => cache.discard(&cache.dir_for(&key), &format!("ONNX Runtime cannot load it: {e}")),
            }
            builder = match self.cpu_builder(stage) {
                Ok(b) => b,
                Err(e) => return (Err(e), GraphCacheUse::Off),
            };
        }
        let pending = match cache.begin(&key, &variant.file) {
            Ok(p) => p,
            Err(e) => {
                if !self.graph_cache_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "optimised-graph cache {}: cannot write it ({e}); graphs are optimised at every load \
(set runtime.graph_cache to a writable folder, or runtime.graph_cache_enabled = false)",
                        cache.root.display()
                    );
                }
                return (builder.commit_from_file(graph_file), GraphCacheUse::NotSaved);
            }
        };
        let started = std::time::Instant::now();
        let saving = saving_builder(builder, &pending.model_path()).and_then(|mut b| b.commit_from_file(graph_file));
        match saving {
            Ok(session) => {
                let dir = pending.dir().to_path_buf();
                let optimised = started.elapsed().as_secs_f64();
                match pending.commit() {
                    Ok(true) => {
                        tracing::debug!(
                            "stage {stage}: optimised and saved the graph into {} in {optimised:.2} s, recorded in {:.2} s",
                            dir.display(),
                            started.elapsed().as_secs_f64() - optimised
                        );
                        (Ok(session), GraphCacheUse::Saved)
                    }
                    Ok(false) => {
                        tracing::debug!("stage {stage}: another process saved {} first", dir.display());
                        (Ok(session), GraphCacheUse::NotSaved)
                    }
                    Err(e) => {
                        tracing::warn!("stage {stage}: cannot save the optimised graph: {e}");
                        (Ok(session), GraphCacheUse::NotSaved)
                    }
                }
            }
            Err(e) => {
                drop(pending);
                // Saving may be what failed (a full disk, the folder removed meanwhile): load once
                // more without it. A graph that does not load at all fails again with its own error.
                let plain = self.cpu_builder(stage).and_then(|mut b| b.commit_from_file(graph_file));
                if plain.is_ok() {
                    tracing::warn!("stage {stage}: cannot save the optimised graph: {e}; loaded without the cache");
                }
                (plain, GraphCacheUse::NotSaved)
            }
        }
    }

    /// A fresh builder with the CPU provider (the only one the optimised-graph cache serves).
    fn cpu_builder(&self, stage: &str) -> std::result::Result<SessionBuilder, ort::Error> {
        let mut builder = self.new_builder(stage)?;
        ep::CPU::default().register(&mut builder)?;
        Ok(builder)
    }

    /// Registers one provider with its options; the error says why it cannot be used.
    #[allow(clippy::too_many_arguments)]
    fn register(
        &self,
        builder: &mut ort::session::builder::SessionBuilder,
        stage: &str,
        spec: &GraphSpec,
        kind: ProviderKind,
        precision: Precision,
        engine: &mut Option<CacheKey>,
        engine_dir: &mut Option<PathBuf>,
        engine_cached: &mut Option<bool>,
    ) -> std::result::Result<(), String> {
        let rt = &self.config.runtime;
        if !providers::compiled_in(kind) {
            return Err(format!(
                "the loaded ONNX Runtime ({}) was built without {}",
                self.runtime.library.display(),
                kind.ort_name()
            ));
        }
        let r = match kind {
            ProviderKind::Cpu => ep::CPU::default().register(builder),
            ProviderKind::Cuda => {
                let mut cuda = ep::CUDA::default().with_device_id(rt.device_id as i32);
                if rt.cuda_mem_limit > 0 {
                    cuda = cuda.with_memory_limit(rt.cuda_mem_limit as usize);
                }
                cuda = cuda.with_conv_algorithm_search(match rt.cuda_conv_search {
                    CudaConvSearch::Heuristic => ep::cuda::ConvAlgorithmSearch::Heuristic,
                    CudaConvSearch::Exhaustive => ep::cuda::ConvAlgorithmSearch::Exhaustive,
                    CudaConvSearch::Default => ep::cuda::ConvAlgorithmSearch::Default,
                });
                // CUDA graphs replay fixed-shape work only; a dynamic-shape stage would fail.
                if rt.cuda_graphs && spec.has_fixed_shapes() {
                    cuda = cuda.with_cuda_graph(true);
                }
                cuda.register(builder)
            }
            ProviderKind::TensorRt => {
                // Also when TensorRT is not first: it must not build an engine for an int8 stage.
                if precision == Precision::Int8 {
                    return Err(tensorrt_int8_refusal(stage));
                }
                let key = self.cache_key(stage, precision).map_err(|e| e.to_string())?;
                let (dir, reused) = self.cache.prepare(&key).map_err(|e| e.to_string())?;
                if reused {
                    tracing::info!("stage {stage}: loading TensorRT engine from {}", dir.display());
                } else {
                    tracing::info!("stage {stage}: building TensorRT engine into {} (this takes a while)", dir.display());
                }
                let dir_s = dir.to_string_lossy().into_owned();
                let mut trt = ep::TensorRT::default()
                    .with_device_id(rt.device_id as i32)
                    .with_engine_cache(true)
                    .with_engine_cache_path(&dir_s)
                    .with_engine_cache_prefix(stage)
                    .with_timing_cache(true)
                    .with_timing_cache_path(&dir_s)
                    .with_fp16(precision == Precision::Fp16)
                    .with_bf16(precision == Precision::Bf16);
                if layer_norm_fp32(stage, precision) {
                    trt = trt.with_layer_norm_fp32_fallback(true);
                }
                if let Some((min, opt, max)) = profile_strings(spec) {
                    trt = trt.with_profile_min_shapes(min).with_profile_opt_shapes(opt).with_profile_max_shapes(max);
                }
                *engine = Some(key);
                *engine_dir = Some(dir);
                *engine_cached = Some(reused);
                trt.register(builder)
            }
            ProviderKind::TensorRtRtx => {
                let index = trt_rtx::prepare(&self.config, self.runtime).map_err(|e| e.to_string())?;
                let key = self.rtx_cache_key(stage, precision).map_err(|e| e.to_string())?;
                let (dir, reused) = self.cache.prepare_runtime_cache(&key).map_err(|e| e.to_string())?;
                tracing::info!(
                    "stage {stage}: TensorRT for RTX runtime cache {} ({})",
                    dir.display(),
                    if reused { "reused" } else { "new: kernels compile on first use" }
                );
                // The runtime cache keeps what the plugin compiles for this GPU; it rewrites the
                // folder itself, so nothing is recorded after the session (no `engine` key).
                *engine_dir = Some(dir.clone());
                *engine_cached = Some(reused);
                return self.attach_rtx(builder, index, &dir);
            }
        };
        r.map_err(|e| e.to_string())
    }
}

impl SessionFactory {
    /// Gives the session TensorRT for RTX's device number `index` (a plugin provider is attached
    /// by device, not registered by name) with its runtime cache in `cache_dir`.
    fn attach_rtx(&self, builder: &mut SessionBuilder, index: usize, cache_dir: &Path) -> std::result::Result<(), String> {
        let device = trt_rtx::device(self.runtime, index).ok_or("the plugin's device went away")?;
        let options = [(
            format!("{}.{}", trt_rtx::EP_NAME, trt_rtx::RUNTIME_CACHE_OPTION),
            cache_dir.to_string_lossy().into_owned(),
        )];
        // `with_devices` takes the builder by value; a fresh one stands in meanwhile and the
        // original comes back on success or failure.
        let stand_in = Session::builder(&self.runtime.env).map_err(|e| e.to_string())?;
        let taken = std::mem::replace(builder, stand_in);
        match taken.with_devices([device], Some(&options)) {
            Ok(b) => {
                *builder = b;
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                *builder = e.recover();
                Err(msg)
            }
        }
    }
}

/// The builder set to optimise at the level the cache key names ([`OPTIMISER_OPTIONS`]) and save
/// the optimised graph to `path`, its initializers of [`graph_cache::EXTERNAL_MIN_BYTES`] or more
/// in [`graph_cache::DATA_FILE`] beside it (one protobuf cannot hold more than 2 GB).
fn saving_builder(builder: SessionBuilder, path: &Path) -> std::result::Result<SessionBuilder, ort::Error> {
    Ok(builder
        .with_optimization_level(GraphOptimizationLevel::All)?
        .with_optimized_model_path(path)?
        .with_config_entry(graph_cache::EXTERNAL_FILE_KEY, graph_cache::DATA_FILE)?
        .with_config_entry(graph_cache::EXTERNAL_MIN_SIZE_KEY, graph_cache::EXTERNAL_MIN_BYTES.to_string())?)
}

/// Why TensorRT cannot take an int8 stage, and what to do instead.
fn tensorrt_int8_refusal(stage: &str) -> String {
    let group: &str = match StageGroup::of_graph(stage) {
        Some(g) => g.as_str(),
        None => stage,
    };
    format!(
        "stage {stage}: TensorRT cannot run int8: int8 engines need calibration data, and none is shipped; \
use fp16 or bf16 with TensorRT, or run this stage's int8 graph on cuda or cpu \
(e.g. --set stages.{group}.providers=cpu)"
    )
}

/// The DiT keeps LayerNorm in fp32 under reduced precision (its residual stream overflows fp16).
fn layer_norm_fp32(stage: &str, precision: Precision) -> bool {
    stage == "dit" && precision != Precision::Fp32
}

/// TensorRT profile options (`name:1x80x4,other:...`) from the manifest, sorted by input name.
pub fn profile_strings(spec: &GraphSpec) -> Option<(String, String, String)> {
    if spec.trt_profile.is_empty() {
        return None;
    }
    let dims = |d: &[i64]| d.iter().map(i64::to_string).collect::<Vec<_>>().join("x");
    let mut min = Vec::new();
    let mut opt = Vec::new();
    let mut max = Vec::new();
    for (name, p) in &spec.trt_profile {
        min.push(format!("{name}:{}", dims(&p.min)));
        opt.push(format!("{name}:{}", dims(&p.opt)));
        max.push(format!("{name}:{}", dims(&p.max)));
    }
    Some((min.join(","), opt.join(","), max.join(",")))
}

/// The cache key from its parts (also used by tests to show each part matters).
pub fn build_cache_key(
    stage: &str,
    spec: &GraphSpec,
    graph: &Variant,
    precision: Precision,
    gpu: &str,
    ort_version: &str,
    trt_version: &str,
) -> CacheKey {
    let profiles = spec
        .trt_profile
        .iter()
        .map(|(name, p)| format!("{name}:{:?}/{:?}/{:?}", p.min, p.opt, p.max))
        .collect();
    let mut options = Vec::new();
    if layer_norm_fp32(stage, precision) {
        options.push("layer_norm_fp32_fallback".to_string());
    }
    CacheKey {
        stage: stage.to_string(),
        graph_sha256: graph.sha256.to_ascii_lowercase(),
        precision: precision.as_str().to_string(),
        gpu: gpu.to_string(),
        ort_version: ort_version.to_string(),
        trt_version: trt_version.to_string(),
        profiles,
        options,
    }
}

/// The optimised-graph cache key from its parts (also used by tests to show each part matters).
pub fn build_graph_key(
    stage: &str,
    graph: &Variant,
    precision: Precision,
    providers: &[ProviderKind],
    ort_version: &str,
    cpu_features: &[String],
) -> GraphKey {
    GraphKey {
        format: graph_cache::FORMAT,
        stage: stage.to_string(),
        graph_sha256: graph.sha256.to_ascii_lowercase(),
        data_sha256: graph.data.as_ref().map(|d| d.sha256.to_ascii_lowercase()),
        precision: precision.as_str().to_string(),
        providers: providers.iter().map(|p| p.as_str().to_string()).collect(),
        ort_version: ort_version.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        cpu_features: cpu_features.to_vec(),
        options: OPTIMISER_OPTIONS.iter().map(|o| o.to_string()).collect(),
    }
}

/// How to make a provider usable, or how to run without it.
/// The TensorRT engine a session uses, when TensorRT registered: its cache key, its folder, and
/// whether it was in the cache already.
#[derive(Default)]
struct EngineUse {
    key: Option<CacheKey>,
    dir: Option<PathBuf>,
    cached: Option<bool>,
}

/// Whether `what` is new in this process: a fallback warning is given once per provider and
/// reason, not once per stage and session (later ones go to the debug log).
fn first_time(what: &str) -> bool {
    static SEEN: Mutex<std::collections::BTreeSet<String>> = Mutex::new(std::collections::BTreeSet::new());
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).insert(what.to_string())
}

/// The providers left for the next attempt: those that `keep`, or the CPU when none is.
fn keep_candidates(candidates: &mut Vec<ProviderKind>, keep: impl FnMut(&ProviderKind) -> bool) {
    candidates.retain(keep);
    if candidates.is_empty() {
        candidates.push(ProviderKind::Cpu);
    }
}

fn hint(p: ProviderKind) -> String {
    match p {
        ProviderKind::Cpu => "the CPU provider is part of every ONNX Runtime build; the library may be damaged".into(),
        ProviderKind::TensorRtRtx => format!(
            "no fallback allowed: drop {p} from runtime.providers / --provider, \
or set runtime.allow_fallback = true (COSY_ALLOW_FALLBACK=1) to fall back to the next provider with a warning"
        ),
        _ => format!(
            "fix: install the GPU build with scripts/setup-ort.sh --gpu (needs CUDA 13{} and an NVIDIA GPU), \
or drop {p} from runtime.providers / --provider, or set runtime.allow_fallback = true (COSY_ALLOW_FALLBACK=1) to fall back with a warning",
            if p == ProviderKind::TensorRt { " and TensorRT 10" } else { "" }
        ),
    }
}
