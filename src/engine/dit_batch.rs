//! Batching of flow-estimator (DiT) calls across concurrent requests.
//!
//! One thread owns the `dit` session. Every request's CFM solve (`flow::solve_cfm`, its own
//! Euler loop and noise) calls the estimator through a [`RemoteEstimator`]; the thread takes
//! every call that is waiting, groups them, and runs each group as one call:
//! * calls group only with the same `block_frames` (a scalar input of the graph: full attention
//!   offline, the 50-frame block-causal mask when streaming) and the same prompt-prefix cache use
//!   (none, recording R frames, or continuing after P cached frames: the graph takes one
//!   `record_frames` and one cache length per call; the cache rows of different voices stack);
//! * rows of different lengths are right-padded to the group's longest and their `mask` is 0 on
//!   the padding. The DiT's positional convolution is causal and its attention ignores masked
//!   keys, so a padded row's real frames are computed as if alone (manifest `batching:
//!   padded_frames`; the engine tests check the mel against the solo run);
//! * a group is closed when it has `max_batch` calls or when the next call's padding would make
//!   the group's padded frames exceed [`MAX_PADDED_SHARE`] of its real frames (the longest first,
//!   so similar lengths meet).
//!
//! A call that arrives while a group runs waits for the next round: with several requests in
//! the flow stage their Euler steps fall into step and run together.

use crossbeam_channel::{Receiver, Sender};
use ndarray::{s, Array1, Array2, Array3};
use std::sync::{Arc, Mutex};

use super::worker::Worker;
use crate::error::{Error, Result};
use crate::flow::{DitCacheShape, DitInputs, Estimator, PrefixArg, PrefixCache, PrefixStep};
use crate::pipeline::stages::OnnxEstimator;
use crate::profile::Profiler;
use crate::runtime::StageSession;

/// A group's padded frames may be at most this much more than its real frames (1.5 = 50 % waste).
pub const MAX_PADDED_SHARE: f64 = 1.5;

/// Counters of the batcher's work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DitBatchStats {
    /// Graph calls run.
    pub calls: u64,
    /// Request calls they served (one per request per Euler step).
    pub requests: u64,
    /// The most requests one graph call served.
    pub max_requests: usize,
}

impl DitBatchStats {
    /// Both counters together (the loads an idle unload dropped, and the one in memory).
    pub fn plus(&self, other: &DitBatchStats) -> DitBatchStats {
        DitBatchStats {
            calls: self.calls + other.calls,
            requests: self.requests + other.requests,
            max_requests: self.max_requests.max(other.max_requests),
        }
    }
}

/// A call's use of the prompt-prefix cache (docs/model-format.md "dit prompt cache").
#[derive(Clone)]
enum CallPrefix {
    None,
    Record(usize),
    Use(Arc<PrefixCache>, usize),
}

impl CallPrefix {
    /// Calls group only with the same key: (kind, frames).
    fn key(&self) -> (u8, usize) {
        match self {
            CallPrefix::None => (0, 0),
            CallPrefix::Record(n) => (1, *n),
            CallPrefix::Use(c, _) => (2, c.frames),
        }
    }
}

type Reply = Result<(Array3<f32>, Option<PrefixStep>)>;

struct Call {
    x: Array3<f32>,
    mask: Array3<f32>,
    mu: Array3<f32>,
    t: Array1<f32>,
    spks: Array2<f32>,
    cond: Array3<f32>,
    block_frames: i64,
    prefix: CallPrefix,
    profiler: Profiler,
    reply: Sender<Reply>,
}

impl Call {
    fn inputs(&self) -> DitInputs<'_> {
        DitInputs {
            x: self.x.view(),
            mask: self.mask.view(),
            mu: self.mu.view(),
            t: self.t.view(),
            spks: self.spks.view(),
            cond: self.cond.view(),
            block_frames: self.block_frames,
        }
    }
    fn rows(&self) -> usize {
        self.x.dim().0
    }
    fn frames(&self) -> usize {
        self.x.dim().2
    }
}

/// The batcher thread and the way to reach it.
pub struct DitBatcher {
    worker: Worker<Call, DitBatchStats>,
    prefix_shape: Option<DitCacheShape>,
    prefix_store: Option<crate::pipeline::PrefixStore>,
}

impl DitBatcher {
    /// Starts the batcher over `session` (the `dit` stage); `max_batch` calls at most per run.
    /// `prefix_shape`: the graph's prompt-prefix cache I/O (from the manifest; `None` for folders
    /// without it); `prefix_cache_bytes`: the bound of the per-voice cache (0 = no cache).
    pub fn start(
        session: StageSession,
        max_batch: usize,
        prefix_shape: Option<DitCacheShape>,
        prefix_cache_bytes: usize,
        prefix_disk: Option<crate::pipeline::PrefixDisk>,
    ) -> Result<DitBatcher> {
        let worker = Worker::spawn("dit-batcher", move |rx, stats| serve(session, prefix_shape, rx, max_batch.max(1), stats))?;
        let prefix_store = prefix_shape.filter(|_| prefix_cache_bytes > 0).map(|shape| {
            let store = crate::pipeline::PrefixStore::new(shape, prefix_cache_bytes);
            match prefix_disk {
                Some(disk) => store.with_disk(disk),
                None => store,
            }
        });
        Ok(DitBatcher { worker, prefix_shape, prefix_store })
    }

    /// An estimator for one request's solve.
    pub fn client(&self, profiler: &Profiler) -> Result<RemoteEstimator> {
        let tx = self.worker.sender()?;
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        Ok(RemoteEstimator { tx, reply_tx, reply_rx, profiler: profiler.clone(), prefix_shape: self.prefix_shape })
    }

    /// The per-voice prompt-prefix cache (`None`: the graph has no cache I/O, or
    /// `engine.prompt_cache_bytes` is 0), over `prefix_disk` when given.
    pub fn prefix_store(&self) -> Option<&crate::pipeline::PrefixStore> {
        self.prefix_store.as_ref()
    }

    /// A copy of the counters so far.
    pub fn stats(&self) -> DitBatchStats {
        self.worker.stats()
    }
}

/// The pipeline's DiT stage: each solve runs through its own [`RemoteEstimator`].
impl crate::pipeline::DitStage for std::sync::Arc<DitBatcher> {
    fn estimator(&self, profiler: &Profiler) -> Result<Box<dyn Estimator + '_>> {
        Ok(Box::new(self.client(profiler)?))
    }

    fn prefix_store(&self) -> Option<&crate::pipeline::PrefixStore> {
        DitBatcher::prefix_store(self)
    }
}

/// One request's estimator: its calls run in the batcher's groups.
pub struct RemoteEstimator {
    tx: Sender<Call>,
    reply_tx: Sender<Reply>,
    reply_rx: Receiver<Reply>,
    profiler: Profiler,
    prefix_shape: Option<DitCacheShape>,
}

impl RemoteEstimator {
    fn call(&mut self, inputs: DitInputs<'_>, prefix: CallPrefix) -> Reply {
        let call = Call {
            x: inputs.x.to_owned(),
            mask: inputs.mask.to_owned(),
            mu: inputs.mu.to_owned(),
            t: inputs.t.to_owned(),
            spks: inputs.spks.to_owned(),
            cond: inputs.cond.to_owned(),
            block_frames: inputs.block_frames,
            prefix,
            profiler: self.profiler.clone(),
            reply: self.reply_tx.clone(),
        };
        self.tx.send(call).map_err(|_| Error::Runtime("the DiT batcher has stopped".into()))?;
        self.reply_rx.recv().map_err(|_| Error::Runtime("the DiT batcher stopped during a call".into()))?
    }
}

impl Estimator for RemoteEstimator {
    fn run(&mut self, inputs: DitInputs<'_>) -> Result<Array3<f32>> {
        Ok(self.call(inputs, CallPrefix::None)?.0)
    }

    fn prefix_shape(&self) -> Option<DitCacheShape> {
        self.prefix_shape
    }

    fn run_prefixed(&mut self, inputs: DitInputs<'_>, prefix: PrefixArg<'_>) -> Result<(Array3<f32>, Option<PrefixStep>)> {
        let prefix = match prefix {
            PrefixArg::Record(n) => CallPrefix::Record(n),
            PrefixArg::Use { cache, step } => CallPrefix::Use(cache.clone(), step),
        };
        self.call(inputs, prefix)
    }
}

fn serve(
    mut session: StageSession,
    prefix_shape: Option<DitCacheShape>,
    rx: Receiver<Call>,
    max_batch: usize,
    stats: &Mutex<DitBatchStats>,
) {
    while let Ok(first) = rx.recv() {
        let mut calls = vec![first];
        while let Ok(c) = rx.try_recv() {
            calls.push(c);
        }
        for group in plan_groups(calls, max_batch) {
            let n = group.len();
            run_group(&mut session, prefix_shape, group);
            if let Ok(mut s) = stats.lock() {
                s.calls += 1;
                s.requests += n as u64;
                s.max_requests = s.max_requests.max(n);
            }
        }
    }
}

/// Splits waiting calls into groups (same `block_frames`; longest first; padding bounded).
fn plan_groups(mut calls: Vec<Call>, max_batch: usize) -> Vec<Vec<Call>> {
    calls.sort_by(|a, b| {
        a.block_frames.cmp(&b.block_frames).then(a.prefix.key().cmp(&b.prefix.key())).then(b.frames().cmp(&a.frames()))
    });
    let mut groups: Vec<Vec<Call>> = Vec::new();
    for call in calls {
        if let Some(group) = groups.last_mut() {
            let head = &group[0];
            let longest = head.frames();
            let real: usize = group.iter().map(|c| c.rows() * c.frames()).sum::<usize>() + call.rows() * call.frames();
            let rows: usize = group.iter().map(Call::rows).sum::<usize>() + call.rows();
            let fits = head.block_frames == call.block_frames
                && head.prefix.key() == call.prefix.key()
                && group.len() < max_batch
                && head.mu.dim().1 == call.mu.dim().1
                && head.spks.dim().1 == call.spks.dim().1
                && (rows * longest) as f64 <= MAX_PADDED_SHARE * real as f64;
            if fits {
                group.push(call);
                continue;
            }
        }
        groups.push(vec![call]);
    }
    groups
}

/// The cached state of a call's Euler step (`None` for calls without a cache in use).
fn prefix_state(call: &Call) -> Result<Option<&PrefixStep>> {
    match &call.prefix {
        CallPrefix::Use(cache, step) => {
            cache.steps.get(*step).map(Some).ok_or_else(|| Error::Runtime(format!("prompt-prefix cache has no step {step}")))
        }
        _ => Ok(None),
    }
}

fn run_group(session: &mut StageSession, prefix_shape: Option<DitCacheShape>, group: Vec<Call>) {
    let profiler = group[0].profiler.clone();
    let record = match group[0].prefix {
        CallPrefix::Record(n) => n,
        _ => 0,
    };
    let states: Result<Vec<&PrefixStep>> = group.iter().filter_map(|c| prefix_state(c).transpose()).collect();
    let states = match states {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            for c in &group {
                let _ = c.reply.send(Err(Error::Runtime(msg.clone())));
            }
            return;
        }
    };
    if group.len() == 1 {
        let c = &group[0];
        let mut est = OnnxEstimator { session, profiler: &profiler, prefix_shape };
        let out = est.run_graph(c.inputs(), &states, record);
        let _ = c.reply.send(out);
        return;
    }
    let rows: usize = group.iter().map(Call::rows).sum();
    let frames = group.iter().map(Call::frames).max().unwrap_or(0);
    let mel = group[0].x.dim().1;
    let mu_dim = group[0].mu.dim().1;
    let cond_dim = group[0].cond.dim().1;
    let spk_dim = group[0].spks.dim().1;
    let mut x = Array3::<f32>::zeros((rows, mel, frames));
    let mut mask = Array3::<f32>::zeros((rows, 1, frames));
    let mut mu = Array3::<f32>::zeros((rows, mu_dim, frames));
    let mut cond = Array3::<f32>::zeros((rows, cond_dim, frames));
    let mut t = Array1::<f32>::zeros(rows);
    let mut spks = Array2::<f32>::zeros((rows, spk_dim));
    let mut at = 0;
    for c in &group {
        let (n, f) = (c.rows(), c.frames());
        x.slice_mut(s![at..at + n, .., ..f]).assign(&c.x);
        mask.slice_mut(s![at..at + n, .., ..f]).assign(&c.mask);
        mu.slice_mut(s![at..at + n, .., ..f]).assign(&c.mu);
        cond.slice_mut(s![at..at + n, .., ..f]).assign(&c.cond);
        t.slice_mut(s![at..at + n]).assign(&c.t);
        spks.slice_mut(s![at..at + n, ..]).assign(&c.spks);
        at += n;
    }
    let mut est = OnnxEstimator { session, profiler: &profiler, prefix_shape };
    let inputs =
        DitInputs { x: x.view(), mask: mask.view(), mu: mu.view(), t: t.view(), spks: spks.view(), cond: cond.view(), block_frames: group[0].block_frames };
    let run = est.run_graph(inputs, &states, record);
    match run {
        Ok((v, state)) if v.dim() == (rows, mel, frames) => {
            let mut at = 0;
            for c in &group {
                let (n, f) = (c.rows(), c.frames());
                let rows_of = |a: &ndarray::Array4<f32>| a.slice(s![.., at..at + n, .., ..]).to_owned();
                let own = state.as_ref().map(|st| PrefixStep {
                    k: rows_of(&st.k),
                    v: rows_of(&st.v),
                    conv1: st.conv1.slice(s![at..at + n, .., ..]).to_owned(),
                    conv2: st.conv2.slice(s![at..at + n, .., ..]).to_owned(),
                });
                let _ = c.reply.send(Ok((v.slice(s![at..at + n, .., ..f]).to_owned(), own)));
                at += n;
            }
        }
        Ok((v, _)) => {
            for c in &group {
                let _ = c.reply.send(Err(Error::Runtime(format!("dit returned {:?} for a batch of {:?}", v.dim(), (rows, mel, frames)))));
            }
        }
        Err(e) => {
            let msg = e.to_string();
            for c in &group {
                let _ = c.reply.send(Err(Error::Runtime(msg.clone())));
            }
        }
    }
}
