//! Whether the model is in memory, in one place: loaded when the engine is built, dropped after
//! `engine.idle_unload_s` without requests (its ONNX Runtime sessions, batching threads and model
//! data), loaded again by the next request, which waits for the load and says it paid one
//! (its summary's `stages.load`). A request that arrives while the model is being dropped or
//! loaded waits for that to end, then goes on.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pipeline::{ModelData, Synthesizer};
use crate::profile::Profiler;

use super::{load, DitBatchStats, DitBatcher, LlmBatchStats, LlmScheduler, StageLoad};

/// Everything a loaded model holds: the pipeline over its open stages and the engine's handles
/// on the two batchers.
pub(super) struct Loaded {
    pub synth: Arc<Synthesizer>,
    pub llm: Arc<LlmScheduler>,
    pub dit: Arc<DitBatcher>,
    pub load_times: Vec<StageLoad>,
}

impl Loaded {
    /// Reads the model's data and opens every stage.
    fn open(how: &HowToLoad) -> Result<Loaded> {
        let config = &how.config;
        let data = ModelData::load(config)?;
        let opened = load::open_stages(config, data.model.clone(), &data.constants, how.llm_gather_first)?;
        let synth = Synthesizer::new(config, data, opened.stages, how.profiler.clone())?;
        Ok(Loaded { synth: Arc::new(synth), llm: opened.llm, dit: opened.dit, load_times: opened.load_times })
    }
}

/// What loading the model again needs (the engine's own copy of its settings).
pub(super) struct HowToLoad {
    pub config: Config,
    pub profiler: Profiler,
    pub llm_gather_first: usize,
    /// Test hook: runs on the idle watcher's thread once the model is marked unloading, before
    /// it is dropped ([`super::EngineBuilder::unload_hook`]).
    pub unload_hook: Option<UnloadHook>,
}

/// A test hook run while the model is being unloaded ([`super::EngineBuilder::unload_hook`]).
pub type UnloadHook = Arc<dyn Fn() + Send + Sync>;

/// Where the model is now (`cosy_model_loaded`, `/ready`'s `model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// In memory: requests start at once.
    Loaded,
    /// Being loaded for a request (which waits, with any other that comes).
    Loading,
    /// Being dropped after `engine.idle_unload_s` without requests (a request that comes waits,
    /// then loads it again).
    Unloading,
    /// Dropped; the next request loads it.
    Unloaded,
}

impl ModelState {
    /// The state's name in reports (`/ready`, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Loaded => "loaded",
            ModelState::Loading => "loading",
            ModelState::Unloading => "unloading",
            ModelState::Unloaded => "unloaded",
        }
    }
}

enum Phase {
    Loaded(Arc<Loaded>),
    Loading,
    Unloading,
    Unloaded,
}

struct State {
    phase: Phase,
    /// Leases held now (requests, voice uploads); the model is never dropped under one.
    users: usize,
    /// When the last lease ended (or the model was loaded).
    last_used: Instant,
    /// Times the model was loaded again after an idle unload.
    reloads: u64,
    /// The batchers' counters of the loads already dropped (the reported counters never go back).
    retired: (LlmBatchStats, DitBatchStats),
    /// The engine is being dropped: the idle watcher ends.
    stopped: bool,
    /// Leases waiting for the model to be dropped or loaded first.
    waiting: usize,
}

/// The model's residency: its state, the leases on it, and how to load it again.
pub(super) struct Residency {
    how: HowToLoad,
    state: Mutex<State>,
    changed: Condvar,
}

/// A request's hold on the loaded model: while one is held the model stays in memory.
pub(super) struct Lease {
    loaded: Arc<Loaded>,
    residency: Arc<Residency>,
    /// Seconds this lease waited for the model to be loaded again (`None`: it was in memory).
    pub load_seconds: Option<f64>,
}

impl std::ops::Deref for Lease {
    type Target = Loaded;
    fn deref(&self) -> &Loaded {
        &self.loaded
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.residency.lock();
        s.users = s.users.saturating_sub(1);
        s.last_used = Instant::now();
        self.residency.changed.notify_all();
    }
}

/// The pipeline of a leased model (what [`crate::pipeline::normalize_sentences_in`] keeps).
pub(super) struct LeasedSynthesizer(pub Lease);

impl std::ops::Deref for LeasedSynthesizer {
    type Target = Synthesizer;
    fn deref(&self) -> &Synthesizer {
        &self.0.synth
    }
}

/// Puts the phase back to unloaded if a load ends without a result (a panic in it), so that
/// waiting requests try again instead of waiting for ever.
struct LoadingGuard<'r> {
    residency: &'r Residency,
    done: bool,
}

impl Drop for LoadingGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut s = self.residency.lock();
            s.phase = Phase::Unloaded;
            s.users = s.users.saturating_sub(1);
            self.residency.changed.notify_all();
        }
    }
}

impl Residency {
    /// Loads the model now (the engine's build).
    pub(super) fn load(how: HowToLoad) -> Result<Arc<Residency>> {
        let loaded = Loaded::open(&how)?;
        Ok(Arc::new(Residency {
            how,
            state: Mutex::new(State {
                phase: Phase::Loaded(Arc::new(loaded)),
                users: 0,
                last_used: Instant::now(),
                reloads: 0,
                retired: Default::default(),
                stopped: false,
                waiting: 0,
            }),
            changed: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'g>(&self, guard: MutexGuard<'g, State>) -> MutexGuard<'g, State> {
        self.changed.wait(guard).unwrap_or_else(|p| p.into_inner())
    }

    /// The loaded model, loading it again first if it was dropped (waiting while it is being
    /// dropped or loaded by another request).
    pub(super) fn acquire(self: &Arc<Self>) -> Result<Lease> {
        let mut s = self.lock();
        loop {
            match &s.phase {
                Phase::Loaded(loaded) => {
                    let loaded = loaded.clone();
                    s.users += 1;
                    return Ok(Lease { loaded, residency: self.clone(), load_seconds: None });
                }
                Phase::Loading | Phase::Unloading => {
                    s.waiting += 1;
                    s = self.wait(s);
                    s.waiting -= 1;
                }
                Phase::Unloaded => break,
            }
        }
        // This request loads it; the others wait for it.
        s.phase = Phase::Loading;
        s.users += 1;
        drop(s);
        let mut guard = LoadingGuard { residency: self, done: false };
        tracing::info!("loading the model again for a request (it was unloaded after engine.idle_unload_s without requests)");
        let started = Instant::now();
        let opened = Loaded::open(&self.how);
        let seconds = started.elapsed().as_secs_f64();
        let mut s = self.lock();
        guard.done = true;
        self.changed.notify_all();
        match opened {
            Ok(loaded) => {
                let loaded = Arc::new(loaded);
                s.phase = Phase::Loaded(loaded.clone());
                s.reloads += 1;
                tracing::info!("model loaded again in {seconds:.2} s (the first audio of this request waited for it)");
                Ok(Lease { loaded, residency: self.clone(), load_seconds: Some(seconds) })
            }
            Err(e) => {
                s.phase = Phase::Unloaded;
                s.users = s.users.saturating_sub(1);
                Err(e)
            }
        }
    }

    /// Where the model is now.
    pub(super) fn state(&self) -> ModelState {
        match self.lock().phase {
            Phase::Loaded(_) => ModelState::Loaded,
            Phase::Loading => ModelState::Loading,
            Phase::Unloading => ModelState::Unloading,
            Phase::Unloaded => ModelState::Unloaded,
        }
    }

    /// Times the model was loaded again after an idle unload.
    pub(super) fn reloads(&self) -> u64 {
        self.lock().reloads
    }

    /// Requests waiting for the model to be dropped or loaded before they can start.
    pub(super) fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// The loaded model if it is in memory now (reports; loads nothing).
    pub(super) fn current(&self) -> Option<Arc<Loaded>> {
        match &self.lock().phase {
            Phase::Loaded(loaded) => Some(loaded.clone()),
            _ => None,
        }
    }

    /// The batchers' counters over every load (those dropped, and the one in memory).
    pub(super) fn batch_stats(&self) -> (LlmBatchStats, DitBatchStats) {
        let (retired, current) = {
            let s = self.lock();
            let current = match &s.phase {
                Phase::Loaded(loaded) => Some(loaded.clone()),
                _ => None,
            };
            (s.retired.clone(), current)
        };
        match current {
            Some(loaded) => (retired.0.plus(&loaded.llm.stats()), retired.1.plus(&loaded.dit.stats())),
            None => retired,
        }
    }

    /// Starts the thread that drops the model after `idle` without leases.
    pub(super) fn watch_idle(self: &Arc<Self>, idle: Duration) -> Result<std::thread::JoinHandle<()>> {
        let residency = self.clone();
        std::thread::Builder::new()
            .name("idle-unload".into())
            .spawn(move || residency.unload_when_idle(idle))
            .map_err(|e| Error::Runtime(format!("cannot start the idle-unload thread: {e}")))
    }

    /// The idle watcher: waits until the model has had no lease for `idle`, drops it, and again
    /// after each load, until the engine is dropped.
    fn unload_when_idle(&self, idle: Duration) {
        loop {
            let mut s = self.lock();
            let loaded = loop {
                if s.stopped {
                    return;
                }
                let waited = s.last_used.elapsed();
                match &s.phase {
                    Phase::Loaded(loaded) if s.users == 0 && waited >= idle => break loaded.clone(),
                    Phase::Loaded(_) if s.users == 0 => {
                        s = self.changed.wait_timeout(s, idle - waited).unwrap_or_else(|p| p.into_inner()).0;
                    }
                    _ => s = self.wait(s),
                }
            };
            s.phase = Phase::Unloading;
            // The counters so far stay in the reported totals.
            s.retired = (s.retired.0.plus(&loaded.llm.stats()), s.retired.1.plus(&loaded.dit.stats()));
            let waited = s.last_used.elapsed().as_secs_f64();
            drop(s);
            if let Some(hook) = &self.how.unload_hook {
                hook();
            }
            // The last hold on the model (no lease is out): its sessions and threads end here.
            drop(loaded);
            give_back_freed_memory();
            tracing::info!("model unloaded after {waited:.0} s without requests (engine.idle_unload_s); the next request loads it again");
            let mut s = self.lock();
            s.phase = Phase::Unloaded;
            self.changed.notify_all();
        }
    }

    /// Ends the idle watcher (the engine is dropped).
    pub(super) fn stop(&self) {
        self.lock().stopped = true;
        self.changed.notify_all();
    }
}

/// Hands the heap the model used back to the system: glibc keeps freed memory in its arenas
/// (many small tensors and buffers of the sessions), so without this the resident size would not
/// fall although the model is gone.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it takes no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
}
