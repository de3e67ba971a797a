//! Continuous batching of LLM steps across the sentences of concurrent requests.
//!
//! One thread owns the `llm` session and a KV cache shared by every active sentence (a *row*).
//! Each sentence talks to it through a [`RemoteLlm`], an [`LlmStep`] whose calls become messages:
//! the sentence's own thread still runs the official decode loop (`llm::decode_with`: log-softmax,
//! the `ignore_eos` mask, its own seeded sampler), so batching changes where the forward pass
//! runs, never what a request samples.
//!
//! The schedule, one iteration at a time:
//! * a newcomer's prefill runs alone (batch 1, its own length) and its cache row is merged into
//!   the shared cache; at most one prefill per iteration, so a stream of newcomers cannot starve
//!   the rows already decoding, and a newcomer waits at most one decode step;
//! * when every row has sent its next embedding, one batched call advances them all by one token;
//! * a row leaves when its sentence ends or is cancelled (its [`RemoteLlm`] is dropped), between
//!   steps;
//! * while a [`DecodeHold`] lives (a streaming request's first chunk is in the flow and HiFT, and
//!   `engine.first_audio_priority` applies), no decode step runs: that chunk gets the cores.
//!   Prefills still run (a newcomer's prefill is on its own path to first audio).
//!
//! Layout (docs/model-format.md, `batching: padded_kv`): the cache is `[rows, kv_heads, width,
//! head_dim]` per layer, rows left-padded so every row's newest position is the last column;
//! `attention_mask` marks each row's real columns and `position_ids` carries each row's own
//! position, so a row's logits do not depend on the other rows (up to float summation order;
//! the engine's tests check greedy tokens are identical). `width` is the longest row: a joining
//! row longer than that pads the others, a leaving row lets the common padding go.
//!
//! Graphs exported before batching (no `attention_mask` input) run one row at a time.
//!
//! With the `llm_step` graph (`engine.llm_kv = "static"`, [`super::llm_slots`]) the same schedule
//! runs over a static cache instead: each row keeps a slot of preallocated buffers that every call
//! writes in place, decode calls are padded to a batch-size bucket, and joining or leaving copies
//! no cache. Only the forward passes and the cache bookkeeping differ; the messages, the
//! schedule, holds and sampling are the same.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::value::{DynValue, TensorValueType};

use crate::vocab::{ProviderKind, LLM_STEP_GRAPH};
use super::llm_slots::{bucket, SlotCache};
use super::worker::Worker;
use crate::error::{Error, Result};
use crate::llm::LlmStep;
use crate::pipeline::constants::LlmShape;
use crate::pipeline::stages::tensor;
use crate::profile::Profiler;
use crate::runtime::{StageBinding, StageSession};

/// Counters of the scheduler's work (for benchmarks and tests).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlmBatchStats {
    /// Batched decode calls run.
    pub decode_calls: u64,
    /// Rows advanced by those calls (tokens decoded).
    pub decode_rows: u64,
    /// The most rows one call advanced.
    pub max_rows: usize,
    /// Prefill calls run.
    pub prefills: u64,
    /// Seconds spent in decode calls (graph run and cache bookkeeping), and in prefills (incl.
    /// merging the new row into the shared cache).
    pub decode_seconds: f64,
    pub prefill_seconds: f64,
    /// Times every row had its next step ready and a [`DecodeHold`] made them wait.
    pub held_steps: u64,
    /// Times the static KV cache grew (`engine.llm_max_positions` doubled; 0 with the growing one).
    pub kv_grows: u64,
}

impl LlmBatchStats {
    /// Both counters together (the loads an idle unload dropped, and the one in memory).
    pub fn plus(&self, other: &LlmBatchStats) -> LlmBatchStats {
        LlmBatchStats {
            decode_calls: self.decode_calls + other.decode_calls,
            decode_rows: self.decode_rows + other.decode_rows,
            max_rows: self.max_rows.max(other.max_rows),
            prefills: self.prefills + other.prefills,
            decode_seconds: self.decode_seconds + other.decode_seconds,
            prefill_seconds: self.prefill_seconds + other.prefill_seconds,
            held_steps: self.held_steps + other.held_steps,
            kv_grows: self.kv_grows + other.kv_grows,
        }
    }
}

type Reply = Sender<Result<Vec<f32>>>;

enum Msg {
    Prefill { id: u64, embeds: Vec<f32>, seq: usize, profiler: Profiler, reply: Reply },
    Step { id: u64, embed: Vec<f32>, profiler: Profiler, reply: Reply },
    Leave { id: u64 },
    /// A [`DecodeHold`] ended: look again whether a step can run.
    Wake,
}

/// The scheduler thread and the way to reach it. Dropping it stops the thread once every
/// [`RemoteLlm`] is gone.
pub struct LlmScheduler {
    worker: Worker<Msg, LlmBatchStats>,
    next_id: AtomicU64,
    /// Rows one call may hold (1 for graphs without batching).
    pub max_batch: usize,
    /// Whether the graph takes `attention_mask`/`position_ids` (can batch), or is `llm_step`.
    pub batched_graph: bool,
    /// Whether the rows live in the static slot cache (graph `llm_step`).
    pub static_kv: bool,
    /// Live [`DecodeHold`]s; `None` when the scheduler does not hold (see [`LlmScheduler::start`]).
    holds: Option<Arc<AtomicUsize>>,
}

/// While it lives, the scheduler runs no decode step ([`LlmScheduler::hold_decoding`]).
pub struct DecodeHold {
    holds: Arc<AtomicUsize>,
    tx: Sender<Msg>,
}

impl Drop for DecodeHold {
    fn drop(&mut self) {
        self.holds.fetch_sub(1, Ordering::SeqCst);
        // The scheduler may be asleep waiting for a message; a failed send means it is gone.
        let _ = self.tx.send(Msg::Wake);
    }
}

impl LlmScheduler {
    /// Starts the scheduler over `session` (the `llm` stage). `gather_first` is a test hook
    /// ([`crate::engine::EngineBuilder::llm_gather_first`]): the first prefill waits until that
    /// many sentences are waiting, so their steps are batched whatever the machine's timing;
    /// 0 or 1 = start at once (normal serving). `hold_for_first_audio`: whether
    /// [`LlmScheduler::hold_decoding`] holds (`EngineSettings::first_audio_priority_applies`).
    pub fn start(
        session: StageSession,
        shape: LlmShape,
        max_batch: usize,
        gather_first: usize,
        hold_for_first_audio: bool,
    ) -> Result<LlmScheduler> {
        Self::start_with_positions(session, shape, max_batch, gather_first, hold_for_first_audio, DEFAULT_MAX_POSITIONS)
    }

    /// [`LlmScheduler::start`]; a session of the `llm_step` graph gets the static slot cache,
    /// `max_positions` columns per slot to begin with (`engine.llm_max_positions`).
    pub fn start_with_positions(
        session: StageSession,
        shape: LlmShape,
        max_batch: usize,
        gather_first: usize,
        hold_for_first_audio: bool,
        max_positions: usize,
    ) -> Result<LlmScheduler> {
        let static_kv = session.stage == LLM_STEP_GRAPH;
        let names = session.input_names();
        let batched_graph = static_kv || (names.iter().any(|n| n == "attention_mask") && names.iter().any(|n| n == "position_ids"));
        let max_batch = if batched_graph { max_batch.max(1) } else { 1 };
        if !batched_graph {
            tracing::info!("llm graph has no attention_mask/position_ids (exported before batching): one sentence at a time; re-export to batch");
        }
        let slots = if static_kv { Some(SlotCache::new(&session, shape, max_batch, max_positions)?) } else { None };
        let holds = Arc::new(AtomicUsize::new(0));
        let mut state = Batch::new(session, shape, batched_graph, holds.clone(), slots)?;
        let worker = Worker::spawn("llm-scheduler", move |rx, stats| state.serve(rx, max_batch, gather_first, stats))?;
        Ok(LlmScheduler {
            worker,
            next_id: AtomicU64::new(1),
            max_batch,
            batched_graph,
            static_kv,
            holds: hold_for_first_audio.then_some(holds),
        })
    }

    /// Holds every decode step until the guard is dropped (a step already running finishes);
    /// `None` when this scheduler does not hold, or has stopped.
    pub fn hold_decoding(&self) -> Option<DecodeHold> {
        let holds = self.holds.as_ref()?;
        let tx = self.worker.sender().ok()?;
        holds.fetch_add(1, Ordering::SeqCst);
        Some(DecodeHold { holds: holds.clone(), tx })
    }

    /// A handle for one sentence's decode (prefill, then steps).
    pub fn client(&self, profiler: &Profiler) -> Result<RemoteLlm> {
        let tx = self.worker.sender()?;
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        Ok(RemoteLlm {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            tx,
            reply_tx,
            reply_rx,
            joined: false,
            profiler: profiler.clone(),
        })
    }

    /// A copy of the counters so far.
    pub fn stats(&self) -> LlmBatchStats {
        self.worker.stats()
    }
}

/// The pipeline's LLM stage: each sentence decodes through its own [`RemoteLlm`].
impl crate::pipeline::LlmStage for std::sync::Arc<LlmScheduler> {
    fn step(&self, profiler: &Profiler) -> Result<Box<dyn LlmStep + '_>> {
        Ok(Box::new(self.client(profiler)?))
    }

    fn hold_decoding(&self) -> Option<Box<dyn Send + '_>> {
        LlmScheduler::hold_decoding(self).map(|h| Box::new(h) as Box<dyn Send>)
    }
}

/// One sentence's view of the shared LLM: an [`LlmStep`] whose forward passes run in the
/// scheduler's batch. Dropping it takes the row out of the batch.
pub struct RemoteLlm {
    id: u64,
    tx: Sender<Msg>,
    reply_tx: Reply,
    reply_rx: Receiver<Result<Vec<f32>>>,
    joined: bool,
    profiler: Profiler,
}

impl RemoteLlm {
    fn call(&mut self, msg: Msg) -> Result<Vec<f32>> {
        self.tx.send(msg).map_err(|_| Error::Runtime("the LLM scheduler has stopped".into()))?;
        self.reply_rx.recv().map_err(|_| Error::Runtime("the LLM scheduler stopped during a step".into()))?
    }
}

impl LlmStep for RemoteLlm {
    fn prefill(&mut self, embeds: &[f32], seq: usize) -> Result<Vec<f32>> {
        if self.joined {
            let _ = self.tx.send(Msg::Leave { id: self.id });
        }
        self.joined = true;
        let msg = Msg::Prefill { id: self.id, embeds: embeds.to_vec(), seq, profiler: self.profiler.clone(), reply: self.reply_tx.clone() };
        self.call(msg)
    }

    fn step(&mut self, embed: &[f32]) -> Result<Vec<f32>> {
        if !self.joined {
            return Err(Error::Runtime("llm: step before prefill".into()));
        }
        let msg = Msg::Step { id: self.id, embed: embed.to_vec(), profiler: self.profiler.clone(), reply: self.reply_tx.clone() };
        self.call(msg)
    }
}

impl Drop for RemoteLlm {
    fn drop(&mut self) {
        if self.joined {
            let _ = self.tx.send(Msg::Leave { id: self.id });
        }
    }
}

struct Waiting {
    id: u64,
    embeds: Vec<f32>,
    seq: usize,
    profiler: Profiler,
    reply: Reply,
}

struct Pending {
    embed: Vec<f32>,
    profiler: Profiler,
    reply: Reply,
}

/// `engine.llm_max_positions`'s default: the static cache's initial columns per slot.
pub const DEFAULT_MAX_POSITIONS: usize = 2048;

struct Row {
    id: u64,
    /// Real positions in the cache (prompt + tokens fed so far).
    len: usize,
    /// Its slot in the static cache (unused with the growing one).
    slot: usize,
    pending: Option<Pending>,
}

/// The scheduler thread's state: the session and the shared cache.
struct Batch {
    session: StageSession,
    binding: StageBinding,
    host: MemoryInfo<'static>,
    shape: LlmShape,
    batched_graph: bool,
    past_names: Vec<String>,
    present_names: Vec<String>,
    rows: Vec<Row>,
    /// Columns of the shared cache (the longest row).
    width: usize,
    /// `present.*` of the last call, `[rows, kv_heads, width, head_dim]`, in `past_names` order.
    cache: Vec<DynValue>,
    /// Live [`DecodeHold`]s (always 0 when the scheduler does not hold).
    holds: Arc<AtomicUsize>,
    /// The static slot cache (graph `llm_step`); `None`: the growing cache above.
    slots: Option<SlotCache>,
}

/// A cache tensor's values on the host (copied from the device when it lives there).
fn host_values(v: &DynValue) -> Result<Vec<f32>> {
    if let Ok((_, data)) = v.try_extract_tensor::<f32>() {
        return Ok(data.to_vec());
    }
    let t = v.view().downcast::<TensorValueType<f32>>()?;
    let host = t.to(AllocationDevice::CPU, 0)?;
    Ok(host.try_extract_tensor::<f32>()?.1.to_vec())
}

impl Batch {
    fn new(session: StageSession, shape: LlmShape, batched_graph: bool, holds: Arc<AtomicUsize>, slots: Option<SlotCache>) -> Result<Batch> {
        let binding = session.binding()?;
        let host = match session.provider_used {
            ProviderKind::Cpu => session.device_memory()?,
            _ => MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default)?,
        };
        let mut past_names = Vec::with_capacity(2 * shape.layers);
        let mut present_names = Vec::with_capacity(2 * shape.layers);
        for i in 0..shape.layers {
            for kind in ["key", "value"] {
                past_names.push(format!("past_key_values.{i}.{kind}"));
                present_names.push(format!("present.{i}.{kind}"));
            }
        }
        Ok(Batch { session, binding, host, shape, batched_graph, past_names, present_names, rows: Vec::new(), width: 0, cache: Vec::new(), holds, slots })
    }

    fn serve(&mut self, rx: Receiver<Msg>, max_batch: usize, gather_first: usize, stats: &Mutex<LlmBatchStats>) {
        let mut waiting: VecDeque<Waiting> = VecDeque::new();
        // Until the first prefill: how many sentences must be waiting (the test hook).
        let mut gather = gather_first.min(max_batch);
        // Whether the rows' current steps were already counted as held.
        let mut counted_hold = false;
        loop {
            let can_prefill = !waiting.is_empty() && self.rows.len() < max_batch && waiting.len() >= gather;
            let steps_ready = self.steps_ready();
            let held = steps_ready && self.holds.load(Ordering::SeqCst) > 0;
            if held && !counted_hold {
                counted_hold = true;
                if let Ok(mut s) = stats.lock() {
                    s.held_steps += 1;
                }
            }
            let can_step = steps_ready && !held;
            if !can_prefill && !can_step {
                match rx.recv() {
                    Ok(msg) => self.handle(msg, &mut waiting),
                    Err(_) => return, // every client and the scheduler handle are gone
                }
                continue;
            }
            while let Ok(msg) = rx.try_recv() {
                self.handle(msg, &mut waiting);
            }
            if self.rows.len() < max_batch && waiting.len() >= gather {
                gather = 0;
                if let Some(w) = waiting.pop_front() {
                    let started = std::time::Instant::now();
                    let result = self.prefill(&w);
                    if let Ok(mut s) = stats.lock() {
                        s.prefills += 1;
                        s.prefill_seconds += started.elapsed().as_secs_f64();
                        s.kv_grows = self.slots.as_ref().map_or(0, SlotCache::grows);
                    }
                    let _ = w.reply.send(result);
                }
            }
            if self.steps_ready() && self.holds.load(Ordering::SeqCst) == 0 {
                counted_hold = false;
                let n = self.rows.len();
                let started = std::time::Instant::now();
                // A failed step is reported to its rows by decode itself.
                let _ = self.decode();
                if let Ok(mut s) = stats.lock() {
                    s.decode_seconds += started.elapsed().as_secs_f64();
                    s.decode_calls += 1;
                    s.decode_rows += n as u64;
                    s.max_rows = s.max_rows.max(n);
                    s.kv_grows = self.slots.as_ref().map_or(0, SlotCache::grows);
                }
            }
        }
    }

    /// Whether every row has sent its next step (one batched call can advance them all).
    fn steps_ready(&self) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|r| r.pending.is_some())
    }

    fn handle(&mut self, msg: Msg, waiting: &mut VecDeque<Waiting>) {
        match msg {
            Msg::Wake => {}
            Msg::Prefill { id, embeds, seq, profiler, reply } => waiting.push_back(Waiting { id, embeds, seq, profiler, reply }),
            Msg::Step { id, embed, profiler, reply } => match self.rows.iter_mut().find(|r| r.id == id) {
                Some(row) if row.pending.is_none() => row.pending = Some(Pending { embed, profiler, reply }),
                Some(_) => {
                    let _ = reply.send(Err(Error::Runtime("llm: a second step before the first returned".into())));
                }
                None => {
                    let _ = reply.send(Err(Error::Runtime("llm: this sentence is no longer in the batch (an earlier step failed)".into())));
                }
            },
            Msg::Leave { id } => {
                waiting.retain(|w| w.id != id);
                if let Some(i) = self.rows.iter().position(|r| r.id == id) {
                    if let Err(e) = self.remove_rows(&[i]) {
                        self.fail_all(&e);
                    }
                }
            }
        }
    }

    /// Runs the graph once; returns the logits `[b, vocab]` (row-major) and the new cache.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &mut self,
        embeds: Vec<f32>,
        b: usize,
        seq: usize,
        mask: Vec<i64>,
        positions: Vec<i64>,
        past: Option<&[DynValue]>,
        profiler: &Profiler,
    ) -> Result<(Vec<f32>, Vec<DynValue>)> {
        let hidden = self.shape.hidden;
        let prefill = past.is_none();
        self.binding.clear_inputs();
        let copy_in = profiler.span(if prefill { "llm.prefill.copy_in" } else { "llm.decode.copy_in" });
        let x = tensor(&[b, seq, hidden], embeds)?;
        self.binding.bind_input("inputs_embeds", &x)?;
        let width = mask.len() / b.max(1);
        let (mask_v, pos_v);
        if self.batched_graph {
            mask_v = tensor(&[b, width], mask)?;
            pos_v = tensor(&[b, seq], positions)?;
            self.binding.bind_input("attention_mask", &mask_v)?;
            self.binding.bind_input("position_ids", &pos_v)?;
        }
        copy_in.end();
        let empty;
        match past {
            Some(cache) => {
                for (name, v) in self.past_names.iter().zip(cache) {
                    self.binding.bind_input(name, v)?;
                }
            }
            None => {
                empty = tensor::<f32>(&[b, self.shape.kv_heads, 0, self.shape.head_dim], Vec::new())?;
                for name in &self.past_names {
                    self.binding.bind_input(name, &empty)?;
                }
            }
        }
        for name in &self.present_names {
            self.binding.bind_output_on_device(name)?;
        }
        self.binding.inner_mut().bind_output_to_device("logits", &self.host)?;
        let mut outputs = self.binding.run(&mut self.session)?;
        let copy_out = profiler.span(if prefill { "llm.prefill.copy_out" } else { "llm.decode.copy_out" });
        let logits = outputs
            .get("logits")
            .ok_or_else(|| Error::Runtime("llm: the graph returned no logits".into()))?
            .try_extract_tensor::<f32>()?
            .1
            .to_vec();
        copy_out.end();
        let mut cache = Vec::with_capacity(self.present_names.len());
        for name in &self.present_names {
            cache.push(outputs.remove(name.as_str()).ok_or_else(|| Error::Runtime(format!("llm: no output {name}")))?);
        }
        Ok((logits, cache))
    }

    /// A newcomer's prefill, alone; its cache row joins the shared cache.
    fn prefill(&mut self, w: &Waiting) -> Result<Vec<f32>> {
        if w.seq == 0 || w.embeds.len() != w.seq * self.shape.hidden {
            return Err(Error::invalid(format!("llm: {} embedding values for {}×{}", w.embeds.len(), w.seq, self.shape.hidden)));
        }
        if let Some(cache) = self.slots.as_mut() {
            // Room for the prompt and the first decoded token. The scheduler does not know a
            // sentence's decode length, so a long one may also grow the cache mid-decode.
            cache.ensure_positions(w.seq + 1)?;
            let slot = cache.take()?;
            let span = w.profiler.span("llm.prefill.static");
            let result = cache.run(&mut self.session, &mut self.binding, &self.host, w.embeds.clone(), 1, w.seq, vec![slot as i64], vec![0]);
            span.end();
            return match result {
                Ok(logits) => {
                    self.rows.push(Row { id: w.id, len: w.seq, slot, pending: None });
                    Ok(logits)
                }
                Err(e) => {
                    cache.give(slot);
                    Err(e)
                }
            };
        }
        let positions: Vec<i64> = (0..w.seq as i64).collect();
        let (logits, present) = self.forward(w.embeds.clone(), 1, w.seq, vec![1; w.seq], positions, None, &w.profiler)?;
        self.merge(present, w.seq)?;
        self.rows.push(Row { id: w.id, len: w.seq, slot: 0, pending: None });
        Ok(logits)
    }

    /// Adds one row (`[1, kv, len, hd]` per name) to the shared cache, left-padding as needed.
    fn merge(&mut self, row: Vec<DynValue>, len: usize) -> Result<()> {
        if self.rows.is_empty() {
            self.cache = row;
            self.width = len;
            return Ok(());
        }
        let (kv, hd) = (self.shape.kv_heads, self.shape.head_dim);
        let b = self.rows.len();
        let width = self.width.max(len);
        let mut merged = Vec::with_capacity(self.cache.len());
        for (old, new) in self.cache.iter().zip(&row) {
            let old = host_values(old)?;
            let new = host_values(new)?;
            let mut out = vec![0f32; (b + 1) * kv * width * hd];
            for r in 0..b {
                for h in 0..kv {
                    let src = &old[(r * kv + h) * self.width * hd..][..self.width * hd];
                    let dst = (r * kv + h) * width * hd + (width - self.width) * hd;
                    out[dst..dst + src.len()].copy_from_slice(src);
                }
            }
            for h in 0..kv {
                let src = &new[h * len * hd..][..len * hd];
                let dst = (b * kv + h) * width * hd + (width - len) * hd;
                out[dst..dst + src.len()].copy_from_slice(src);
            }
            merged.push(tensor(&[b + 1, kv, width, hd], out)?);
        }
        self.cache = merged;
        self.width = width;
        Ok(())
    }

    /// Takes rows out of the shared cache; the columns no remaining row needs go too.
    fn remove_rows(&mut self, gone: &[usize]) -> Result<()> {
        if let Some(cache) = self.slots.as_mut() {
            // Static cache: the rows give their slots back; nobody's columns move.
            for &i in gone {
                if let Some(row) = self.rows.get(i) {
                    cache.give(row.slot);
                }
            }
            let mut i = 0;
            self.rows.retain(|_| {
                i += 1;
                !gone.contains(&(i - 1))
            });
            return Ok(());
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|i| !gone.contains(i)).collect();
        if keep.is_empty() {
            self.rows.clear();
            self.cache.clear();
            self.width = 0;
            return Ok(());
        }
        let (kv, hd) = (self.shape.kv_heads, self.shape.head_dim);
        let width = keep.iter().map(|&i| self.rows[i].len).max().unwrap_or(0);
        let skip = self.width - width;
        let mut trimmed = Vec::with_capacity(self.cache.len());
        for old in &self.cache {
            let old = host_values(old)?;
            let mut out = Vec::with_capacity(keep.len() * kv * width * hd);
            for &r in &keep {
                for h in 0..kv {
                    let start = (r * kv + h) * self.width * hd + skip * hd;
                    out.extend_from_slice(&old[start..start + width * hd]);
                }
            }
            trimmed.push(tensor(&[keep.len(), kv, width, hd], out)?);
        }
        let mut i = 0;
        self.rows.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
        self.cache = trimmed;
        self.width = width;
        Ok(())
    }

    /// One batched step: every row's pending embedding, one call, each row's logits back.
    fn decode(&mut self) -> Result<(), ()> {
        let b = self.rows.len();
        let hidden = self.shape.hidden;
        let width = self.width + 1;
        let mut embeds = Vec::with_capacity(b * hidden);
        let padded_kv = self.slots.is_none();
        // The growing cache's attention mask (the static cache needs none: rows are in slots).
        let mut mask = vec![0i64; if padded_kv { b * width } else { 0 }];
        let mut positions = Vec::with_capacity(b);
        let mut pendings = Vec::with_capacity(b);
        for (r, row) in self.rows.iter_mut().enumerate() {
            let Some(p) = row.pending.take() else { return Err(()) };
            embeds.extend_from_slice(&p.embed);
            if padded_kv {
                mask[r * width + (width - row.len - 1)..(r + 1) * width].fill(1);
            }
            positions.push(row.len as i64);
            pendings.push(p);
        }
        if embeds.len() != b * hidden {
            for p in pendings {
                let _ = p.reply.send(Err(Error::invalid(format!("llm: step embedding of {} values, expected {hidden}", p.embed.len()))));
            }
            let _ = self.remove_rows(&(0..b).collect::<Vec<_>>());
            return Err(());
        }
        let profiler = pendings[0].profiler.clone();
        let result = if self.slots.is_some() {
            self.decode_static(embeds, &profiler)
        } else {
            let cache = std::mem::take(&mut self.cache);
            self.forward(embeds, b, 1, mask, positions, Some(&cache), &profiler).map(|(logits, present)| {
                self.cache = present;
                self.width = width;
                logits
            })
        };
        match result {
            Ok(logits) => {
                let vocab = logits.len() / b;
                for (r, (row, p)) in self.rows.iter_mut().zip(pendings).enumerate() {
                    row.len += 1;
                    let _ = p.reply.send(Ok(logits[r * vocab..(r + 1) * vocab].to_vec()));
                }
                Ok(())
            }
            Err(e) => {
                // The cache no longer matches anyone's state: every row fails and leaves.
                let msg = e.to_string();
                for p in pendings {
                    let _ = p.reply.send(Err(Error::Runtime(msg.clone())));
                }
                self.clear_rows();
                Err(())
            }
        }
    }

    /// One decode step of every row over the static cache: padded to a bucket with rows on the
    /// scratch slot (whose logits are dropped); the logits of the real rows, `[rows, vocab]`.
    fn decode_static(&mut self, mut embeds: Vec<f32>, profiler: &Profiler) -> Result<Vec<f32>> {
        let Some(cache) = self.slots.as_mut() else {
            return Err(Error::Runtime("llm: no static cache".into()));
        };
        let b = self.rows.len();
        let longest = self.rows.iter().map(|r| r.len).max().unwrap_or(0);
        cache.ensure_positions(longest + 1)?;
        let padded = bucket(b);
        let scratch = cache.scratch() as i64;
        let mut slots: Vec<i64> = self.rows.iter().map(|r| r.slot as i64).collect();
        let mut starts: Vec<i64> = self.rows.iter().map(|r| r.len as i64).collect();
        slots.resize(padded, scratch);
        starts.resize(padded, 0);
        embeds.resize(padded * self.shape.hidden, 0.0);
        let span = profiler.span("llm.decode.static");
        let mut logits = cache.run(&mut self.session, &mut self.binding, &self.host, embeds, padded, 1, slots, starts)?;
        span.end();
        let vocab = logits.len() / padded.max(1);
        logits.truncate(b * vocab);
        Ok(logits)
    }

    /// Every row leaves at once (after a failed step), giving back its slot.
    fn clear_rows(&mut self) {
        if let Some(cache) = self.slots.as_mut() {
            for row in &self.rows {
                cache.give(row.slot);
            }
        }
        self.rows.clear();
        self.cache.clear();
        self.width = 0;
    }

    /// After a failed cache rebuild: every row gets the error and the batch starts empty.
    fn fail_all(&mut self, e: &Error) {
        for row in self.rows.iter_mut() {
            if let Some(p) = row.pending.take() {
                let _ = p.reply.send(Err(Error::Runtime(e.to_string())));
            }
        }
        self.clear_rows();
    }
}
