//! The flow-matching solver and the flow-side bookkeeping (cosyvoice3.md §5.1, §5.3, §5.5, §7.2).
//!
//! The DiT estimator is behind the [`Estimator`] trait (an ONNX session in the runtime, a scripted
//! fake in tests). This module owns: the cosine time schedule, the Euler loop with classifier-free
//! guidance as one batch of conditional + unconditional rows, the `cond` input (prompt mel, then
//! zeros), prompt-frame removal, the streaming chunk planner and the speed (mel time-stretch)
//! control.

use std::sync::Arc;

use ndarray::{s, Array1, Array2, Array3, Array4, ArrayView1, ArrayView2, ArrayView3, Axis};

use crate::error::{Error, Result};
use crate::model::{Dim, GraphSpec};

/// Mel channels of the flow output (fixed by the model family).
pub const MEL_DIM: usize = 80;

/// `torch.linspace(0, 1, n + 1)` in float32, with torch's CPU formula: the first half counts up
/// from the start, the second half counts down from the end (`end − step·(steps − i − 1)`).
fn linspace_unit_f32(steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![0.0];
    }
    let (start, end) = (0f32, 1f32);
    let step = (end - start) / (steps - 1) as f32;
    let halfway = steps / 2;
    (0..steps)
        .map(|i| {
            if i < halfway {
                start + step * i as f32
            } else {
                end - step * (steps - i - 1) as f32
            }
        })
        .collect()
}

/// The cosine time schedule `t = 1 − cos(linspace(0, 1, n + 1) · 0.5 · π)`, evaluated in float32
/// in torch's op order (`(t·0.5)·π`, then cos, then `1 −`). `n_timesteps + 1` values.
pub fn cosine_t_span(n_timesteps: usize) -> Vec<f32> {
    linspace_unit_f32(n_timesteps + 1)
        .into_iter()
        .map(|t| 1.0 - ((t * 0.5) * std::f32::consts::PI).cos())
        .collect()
}

/// The inputs of one DiT velocity evaluation for a batch (`B` = 2 · requests: the conditional
/// rows first, then the unconditional rows). Shapes: x, mu, cond `[B, 80, T]`; mask `[B, 1, T]`;
/// t `[B]`; spks `[B, 80]`; `block_frames` 0 = full attention, 50 = block-causal.
#[derive(Debug, Clone, Copy)]
pub struct DitInputs<'a> {
    pub x: ArrayView3<'a, f32>,
    pub mask: ArrayView3<'a, f32>,
    pub mu: ArrayView3<'a, f32>,
    pub t: ArrayView1<'a, f32>,
    pub spks: ArrayView2<'a, f32>,
    pub cond: ArrayView3<'a, f32>,
    pub block_frames: i64,
}

/// The DiT estimator: one velocity evaluation ([`DitInputs`]).
pub trait Estimator {
    /// The velocity, `[B, 80, T]`.
    fn run(&mut self, inputs: DitInputs<'_>) -> Result<Array3<f32>>;

    /// The graph's prompt-prefix cache shape; `None` when it has no cache inputs (folders
    /// exported before them), and then [`Estimator::run_prefixed`] is never called.
    fn prefix_shape(&self) -> Option<DitCacheShape> {
        None
    }

    /// [`Estimator::run`] with the prompt-prefix cache: `x`, `mask`, `mu`, `cond` hold only the
    /// frames after the cached ones ([`PrefixArg::Use`]), or all frames while the first
    /// `frames` are recorded ([`PrefixArg::Record`]; then the recorded state comes back).
    fn run_prefixed(&mut self, inputs: DitInputs<'_>, prefix: PrefixArg<'_>) -> Result<(Array3<f32>, Option<PrefixStep>)> {
        let _ = (inputs, prefix);
        Err(Error::Runtime("this DiT estimator has no prompt-prefix cache inputs".into()))
    }
}

/// The sizes of the `dit` graph's prompt-prefix cache I/O (docs/model-format.md, "dit prompt
/// cache"), from the manifest's `cache_k` `[depth, batch, past, inner]` and `cache_conv1`
/// `[batch, context, dim]` inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DitCacheShape {
    /// Transformer blocks.
    pub depth: usize,
    /// Attention width (heads × head size) of the cached keys and values.
    pub inner: usize,
    /// Model width of the positional convs' input.
    pub dim: usize,
    /// Input frames each positional conv needs before the first new frame (kernel − 1).
    pub conv_context: usize,
}

/// The names the cache I/O of the `dit` graph has (all or none).
pub const DIT_CACHE_INPUTS: [&str; 5] = ["cache_k", "cache_v", "cache_conv1", "cache_conv2", "record_frames"];
pub const DIT_CACHE_OUTPUTS: [&str; 4] = ["record_k", "record_v", "record_conv1", "record_conv2"];

impl DitCacheShape {
    /// `None` for a graph without the cache I/O (or with sizes that are not fixed).
    pub fn from_graph(graph: &GraphSpec) -> Option<DitCacheShape> {
        let shape = |name: &str| graph.inputs.iter().find(|t| t.name == name).map(|t| t.shape.as_slice());
        let fixed = |d: &Dim| match d {
            Dim::Fixed(n) => usize::try_from(*n).ok(),
            Dim::Named(_) => None,
        };
        let has_all = DIT_CACHE_INPUTS.iter().all(|n| shape(n).is_some())
            && DIT_CACHE_OUTPUTS.iter().all(|n| graph.outputs.iter().any(|o| o.name == *n));
        if !has_all {
            return None;
        }
        let (k, conv) = (shape("cache_k")?, shape("cache_conv1")?);
        if k.len() != 4 || conv.len() != 3 {
            return None;
        }
        Some(DitCacheShape { depth: fixed(&k[0])?, inner: fixed(&k[3])?, dim: fixed(&conv[2])?, conv_context: fixed(&conv[1])? })
    }

    /// Bytes of one voice's cache of `frames` frames over `n_timesteps` Euler steps: per step,
    /// both CFG rows' keys and values of every layer plus the two conv contexts, and the final
    /// prefix mel (all float32).
    pub fn cache_bytes(&self, frames: usize, n_timesteps: usize) -> usize {
        let per_step = 2 * (2 * self.depth * frames * self.inner + 2 * self.conv_context * self.dim);
        4 * (n_timesteps * per_step + MEL_DIM * frames)
    }
}

/// The leading frames of a non-final (block-causal) flow call whose DiT state is a pure function
/// of the voice: whole `dit_block_frames` blocks that end before the prompt's last
/// `token_mel_ratio · pre_lookahead_len` frames (the PreLookahead reaches that far into the
/// text's tokens). The noise is fixed and the positional convs causal, so those frames' keys,
/// values and conv inputs are the same at every Euler step of every such call (cosyvoice3.md
/// §5.4–§5.5). 0 = nothing to cache.
pub fn cacheable_prefix_frames(prompt_frames: usize, params: &StreamParams) -> usize {
    let block = params.dit_block_frames;
    if block == 0 {
        return 0;
    }
    let pure = prompt_frames.saturating_sub(params.token_mel_ratio.saturating_mul(params.pre_lookahead_len));
    pure / block * block
}

/// The DiT state of the cached prefix at one Euler step, both CFG rows (conditional first).
#[derive(Debug, Clone)]
pub struct PrefixStep {
    /// `[depth, 2, frames, inner]`: every layer's keys (after RoPE).
    pub k: Array4<f32>,
    /// `[depth, 2, frames, inner]`: every layer's values.
    pub v: Array4<f32>,
    /// `[2, context, dim]`: the positional convs' inputs of the frames just before the first new one.
    pub conv1: Array3<f32>,
    pub conv2: Array3<f32>,
}

/// One voice's prompt-prefix cache: the state of its first `frames` frames at every Euler step,
/// and those frames' solved mel.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    pub frames: usize,
    pub steps: Vec<PrefixStep>,
    /// `[80, frames]`.
    pub mel: Array2<f32>,
}

impl PrefixCache {
    pub fn bytes(&self) -> usize {
        let step = |s: &PrefixStep| s.k.len() + s.v.len() + s.conv1.len() + s.conv2.len();
        4 * (self.steps.iter().map(step).sum::<usize>() + self.mel.len())
    }
}

/// The prefix part of one estimator call.
#[derive(Debug, Clone, Copy)]
pub enum PrefixArg<'a> {
    /// Record the state of the call's first `frames` frames (the call has all frames).
    Record(usize),
    /// The call continues after the cache's frames with the state of Euler step `step` (0-based).
    Use { cache: &'a Arc<PrefixCache>, step: usize },
}

/// What a prefixed solve does: record the cache while solving every frame, or use one.
#[derive(Debug, Clone, Copy)]
pub enum PrefixMode<'a> {
    Record(usize),
    Use(&'a Arc<PrefixCache>),
}

/// Solver settings (manifest `constants.cfm`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CfmParams {
    pub n_timesteps: usize,
    /// `inference_cfg_rate` (0.7): `v = (1 + r)·v_cond − r·v_uncond`.
    pub cfg_rate: f32,
}

impl Default for CfmParams {
    fn default() -> Self {
        CfmParams { n_timesteps: 10, cfg_rate: 0.7 }
    }
}

/// One request of a CFM solve. All requests of one call must have the same frame count.
#[derive(Debug, Clone, Copy)]
pub struct CfmRequest<'a> {
    /// `[80, T]` — PreLookahead output repeated ×2 (flow_front `mu`).
    pub mu: ArrayView2<'a, f32>,
    /// `[80]` — projected speaker embedding (flow_front `spks`).
    pub spks: ArrayView1<'a, f32>,
    /// `[80, T]` — prompt mel then zeros ([`build_cond`]).
    pub cond: ArrayView2<'a, f32>,
    /// `[80, ≥T]` — the fixed noise (`side["flow.noise"]`); columns `0..T` are used.
    pub noise: ArrayView2<'a, f32>,
}

impl CfmRequest<'_> {
    /// `mu`, `cond` `[80, frames]`, `spks` `[80]`, noise `[80, ≥ frames]`; `what` names the
    /// request in the error.
    fn check_shape(&self, frames: usize, what: &str) -> Result<()> {
        let ok = self.mu.dim() == (MEL_DIM, frames)
            && self.cond.dim() == (MEL_DIM, frames)
            && self.spks.len() == MEL_DIM
            && self.noise.nrows() == MEL_DIM
            && self.noise.ncols() >= frames;
        if ok {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{what}: mu {:?}, cond {:?}, spks {}, noise {:?} do not fit {MEL_DIM}×{frames}",
            self.mu.dim(),
            self.cond.dim(),
            self.spks.len(),
            self.noise.dim()
        )))
    }
}

/// Runs the Euler solver with CFG for every request in one estimator batch and returns each
/// request's mel `[80, T]` (prompt frames included; see [`strip_prompt`]).
///
/// Mirrors `ConditionalCFM.solve_euler` in float32: `t` and `dt` are carried as the official code
/// does (`t ← t + dt`, `dt ← t_span[k+1] − t`, so the `t` fed to the estimator is the accumulated
/// value), CFG is `(1 + r)·v0 − r·v1` with each product rounded separately, `x ← x + dt·v`.
pub fn solve_cfm<E: Estimator + ?Sized>(
    estimator: &mut E,
    requests: &[CfmRequest<'_>],
    params: &CfmParams,
    block_frames: i64,
) -> Result<Vec<Array2<f32>>> {
    let n = requests.len();
    let Some(first) = requests.first() else { return Ok(Vec::new()) };
    let frames = first.mu.ncols();
    for (i, r) in requests.iter().enumerate() {
        r.check_shape(frames, &format!("flow request {i}"))?;
    }
    let batch = 2 * n;
    // Constant inputs: row i < n conditional, row n + i unconditional (mu, spks, cond zero).
    let mask = Array3::<f32>::ones((batch, 1, frames));
    let mut mu = Array3::<f32>::zeros((batch, MEL_DIM, frames));
    let mut spks = Array2::<f32>::zeros((batch, MEL_DIM));
    let mut cond = Array3::<f32>::zeros((batch, MEL_DIM, frames));
    let mut xs: Vec<Array2<f32>> = Vec::with_capacity(n);
    for (i, r) in requests.iter().enumerate() {
        mu.index_axis_mut(Axis(0), i).assign(&r.mu);
        spks.index_axis_mut(Axis(0), i).assign(&r.spks);
        cond.index_axis_mut(Axis(0), i).assign(&r.cond);
        xs.push(r.noise.slice(s![.., ..frames]).to_owned());
    }

    let t_span = cosine_t_span(params.n_timesteps);
    let cond_scale = 1.0f32 + params.cfg_rate;
    let uncond_scale = params.cfg_rate;
    let mut t = t_span[0];
    let mut dt = t_span[1] - t_span[0];
    let mut x_in = Array3::<f32>::zeros((batch, MEL_DIM, frames));
    for step in 1..t_span.len() {
        for (i, x) in xs.iter().enumerate() {
            x_in.index_axis_mut(Axis(0), i).assign(x);
            x_in.index_axis_mut(Axis(0), n + i).assign(x);
        }
        let t_in = Array1::<f32>::from_elem(batch, t);
        let v = estimator.run(DitInputs {
            x: x_in.view(),
            mask: mask.view(),
            mu: mu.view(),
            t: t_in.view(),
            spks: spks.view(),
            cond: cond.view(),
            block_frames,
        })?;
        if v.dim() != (batch, MEL_DIM, frames) {
            return Err(Error::Runtime(format!(
                "estimator returned {:?}, expected {:?}",
                v.dim(),
                (batch, MEL_DIM, frames)
            )));
        }
        for (i, x) in xs.iter_mut().enumerate() {
            let v_cond = v.index_axis(Axis(0), i);
            let v_uncond = v.index_axis(Axis(0), n + i);
            ndarray::Zip::from(x).and(&v_cond).and(&v_uncond).for_each(|x, &c, &u| {
                let guided = cond_scale * c - uncond_scale * u;
                *x += dt * guided;
            });
        }
        t += dt;
        if step < t_span.len() - 1 {
            dt = t_span[step + 1] - t;
        }
    }
    Ok(xs)
}

/// [`solve_cfm`] for one request with the prompt-prefix cache: [`PrefixMode::Record`] solves every
/// frame and also returns the cache of the first frames; [`PrefixMode::Use`] solves only the
/// frames after the cache's (the cached frames' mel is copied from it). Same arithmetic as
/// [`solve_cfm`] frame by frame, so the mel is the same within float rounding of the graph.
pub fn solve_cfm_prefixed<E: Estimator + ?Sized>(
    estimator: &mut E,
    request: &CfmRequest<'_>,
    params: &CfmParams,
    block_frames: i64,
    mode: PrefixMode<'_>,
) -> Result<(Array2<f32>, Option<PrefixCache>)> {
    let frames = request.mu.ncols();
    let r = request;
    r.check_shape(frames, "flow request")?;
    let (cached, record) = match mode {
        PrefixMode::Record(n) => (0, n),
        PrefixMode::Use(c) => (c.frames, 0),
    };
    // A recording call may be the cached frames alone; a call from the cache needs frames after them.
    if cached >= frames || record > frames || block_frames <= 0 {
        return Err(Error::invalid(format!(
            "a prompt-prefix cache of {} frames needs a longer block-causal call than {frames} frames (block {block_frames})",
            cached.max(record)
        )));
    }
    if let PrefixMode::Use(c) = mode {
        if c.steps.len() != params.n_timesteps {
            return Err(Error::Runtime(format!("prompt-prefix cache has {} steps, the solver {}", c.steps.len(), params.n_timesteps)));
        }
    }
    let solved = frames - cached;
    let mask = Array3::<f32>::ones((2, 1, solved));
    let mut mu = Array3::<f32>::zeros((2, MEL_DIM, solved));
    let mut spks = Array2::<f32>::zeros((2, MEL_DIM));
    let mut cond = Array3::<f32>::zeros((2, MEL_DIM, solved));
    mu.index_axis_mut(Axis(0), 0).assign(&r.mu.slice(s![.., cached..]));
    spks.index_axis_mut(Axis(0), 0).assign(&r.spks);
    cond.index_axis_mut(Axis(0), 0).assign(&r.cond.slice(s![.., cached..]));
    let mut x = r.noise.slice(s![.., cached..frames]).to_owned();

    let t_span = cosine_t_span(params.n_timesteps);
    let cond_scale = 1.0f32 + params.cfg_rate;
    let uncond_scale = params.cfg_rate;
    let mut t = t_span[0];
    let mut dt = t_span[1] - t_span[0];
    let mut x_in = Array3::<f32>::zeros((2, MEL_DIM, solved));
    let mut steps = Vec::with_capacity(if record > 0 { params.n_timesteps } else { 0 });
    for step in 1..t_span.len() {
        x_in.index_axis_mut(Axis(0), 0).assign(&x);
        x_in.index_axis_mut(Axis(0), 1).assign(&x);
        let t_in = Array1::<f32>::from_elem(2, t);
        let arg = match mode {
            PrefixMode::Record(n) => PrefixArg::Record(n),
            PrefixMode::Use(cache) => PrefixArg::Use { cache, step: step - 1 },
        };
        let inputs =
            DitInputs { x: x_in.view(), mask: mask.view(), mu: mu.view(), t: t_in.view(), spks: spks.view(), cond: cond.view(), block_frames };
        let (v, state) = estimator.run_prefixed(inputs, arg)?;
        if v.dim() != (2, MEL_DIM, solved) {
            return Err(Error::Runtime(format!("estimator returned {:?}, expected {:?}", v.dim(), (2, MEL_DIM, solved))));
        }
        if record > 0 {
            let state = state.ok_or_else(|| Error::Runtime("the DiT returned no prompt-prefix state to record".into()))?;
            if state.k.dim() != state.v.dim() || state.k.dim().1 != 2 || state.k.dim().2 != record {
                return Err(Error::Runtime(format!("the DiT recorded keys {:?} for {record} frames", state.k.dim())));
            }
            steps.push(state);
        }
        let (v_cond, v_uncond) = (v.index_axis(Axis(0), 0), v.index_axis(Axis(0), 1));
        ndarray::Zip::from(&mut x).and(&v_cond).and(&v_uncond).for_each(|x, &c, &u| {
            let guided = cond_scale * c - uncond_scale * u;
            *x += dt * guided;
        });
        t += dt;
        if step < t_span.len() - 1 {
            dt = t_span[step + 1] - t;
        }
    }
    let mel = match mode {
        PrefixMode::Record(_) => x,
        PrefixMode::Use(c) => ndarray::concatenate(Axis(1), &[c.mel.view(), x.view()])
            .map_err(|e| Error::Runtime(format!("prefix mel: {e}")))?,
    };
    let cache = (record > 0).then(|| PrefixCache { frames: record, steps, mel: mel.slice(s![.., ..record]).to_owned() });
    Ok((mel, cache))
}

/// The `cond` input `[80, total_frames]`: the prompt mel (given time-major `[P, 80]`, as the
/// frontend produces it) in the first P frames, zeros after.
pub fn build_cond(prompt_mel: ArrayView2<f32>, total_frames: usize) -> Result<Array2<f32>> {
    let (p, dim) = prompt_mel.dim();
    if dim != MEL_DIM || p > total_frames {
        return Err(Error::invalid(format!(
            "prompt mel {:?} does not fit a {MEL_DIM}×{total_frames} flow condition",
            prompt_mel.dim()
        )));
    }
    let mut cond = Array2::<f32>::zeros((MEL_DIM, total_frames));
    cond.slice_mut(s![.., ..p]).assign(&prompt_mel.t());
    Ok(cond)
}

/// Drops the first `prompt_frames` frames of a solved mel `[80, T]` (official
/// `feat[:, :, mel_len1:]`).
pub fn strip_prompt(mel: ArrayView2<f32>, prompt_frames: usize) -> Result<Array2<f32>> {
    if prompt_frames > mel.ncols() {
        return Err(Error::invalid(format!(
            "prompt of {prompt_frames} frames is longer than the {}-frame flow output",
            mel.ncols()
        )));
    }
    Ok(mel.slice(s![.., prompt_frames..]).to_owned())
}

/// The `tokens` input of `flow_front`: prompt tokens ++ speech tokens, plus `[-1, -1, -1]` (zero
/// frames, the official zero pad) on a final call. A non-final call's `speech` must already end
/// with its look-ahead tokens (`tokens[..offset + hop + 3]`).
pub fn flow_front_tokens(prompt: &[i64], speech: &[i64], finalize: bool, lookahead: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(prompt.len() + speech.len() + lookahead);
    out.extend_from_slice(prompt);
    out.extend_from_slice(speech);
    if finalize {
        out.extend(std::iter::repeat_n(-1, lookahead));
    }
    out
}

/// Streaming constants (manifest `constants.streaming` and `config.flow.token_mel_ratio`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamParams {
    pub token_hop_len: usize,
    pub token_max_hop_len: usize,
    pub stream_scale_factor: usize,
    pub pre_lookahead_len: usize,
    pub token_mel_ratio: usize,
    /// DiT block size for non-final calls (50 frames).
    pub dit_block_frames: usize,
}

impl Default for StreamParams {
    fn default() -> Self {
        StreamParams {
            token_hop_len: 25,
            token_max_hop_len: 100,
            stream_scale_factor: 2,
            pre_lookahead_len: 3,
            token_mel_ratio: 2,
            dit_block_frames: 50,
        }
    }
}

/// One flow call of a (streaming or offline) request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowChunk {
    /// Speech tokens passed to the flow: `tokens[..n_tokens]` (a non-final call includes the 3
    /// look-ahead tokens, which produce no frames).
    pub n_tokens: usize,
    /// Tokens already turned into mel by earlier calls.
    pub token_offset: usize,
    pub finalize: bool,
    /// `block_frames` for the DiT: 0 (full attention) on the final call, 50 otherwise.
    pub block_frames: usize,
    /// Generated mel frames of this call after prompt removal (`2·(n_tokens − 3)` or `2·n_tokens`).
    pub mel_frames: usize,
    /// The new frames are `mel[first_new_frame..mel_frames]` (`2·token_offset..`).
    pub first_new_frame: usize,
}

impl FlowChunk {
    pub fn new_frames(&self) -> usize {
        self.mel_frames - self.first_new_frame
    }
}

/// The official streaming schedule of `CosyVoice2Model.tts` (§7.2) as a pure state machine over
/// token counts: the first hop is `token_hop_len + prompt_token_pad` (so chunk ends land on
/// multiples of 25 tokens from the prompt start), later hops double up to `token_max_hop_len`;
/// a chunk is taken once `hop + 3` tokens beyond the offset exist.
///
/// The official hop lives on the model object: it grows with every non-final chunk and is never
/// reset, so the next sentence of a request (and every later request) starts where the last one
/// left it, with the prompt pad computed from that hop. cosy carries it across the sentences of
/// one request ([`StreamPlanner::starting_at`], [`StreamPlanner::hop`]), which reproduces the
/// official output of a freshly loaded model, and starts every request at `token_hop_len`.
#[derive(Debug, Clone)]
pub struct StreamPlanner {
    params: StreamParams,
    prompt_token_pad: usize,
    hop: usize,
    token_offset: usize,
}

impl StreamPlanner {
    /// A request's first sentence: the hop starts at `token_hop_len`.
    pub fn new(params: StreamParams, n_prompt_tokens: usize) -> Self {
        Self::starting_at(params, n_prompt_tokens, params.token_hop_len)
    }

    /// A sentence whose stream starts with `hop` (the previous sentence's [`Self::hop`]).
    pub fn starting_at(params: StreamParams, n_prompt_tokens: usize, hop: usize) -> Self {
        let hop = hop.max(1);
        let prompt_token_pad = n_prompt_tokens.div_ceil(hop) * hop - n_prompt_tokens;
        StreamPlanner { params, prompt_token_pad, hop, token_offset: 0 }
    }

    /// The hop the next non-final chunk would use after the first (what a following sentence
    /// starts with).
    pub fn hop(&self) -> usize {
        self.hop
    }

    pub fn prompt_token_pad(&self) -> usize {
        self.prompt_token_pad
    }

    pub fn token_offset(&self) -> usize {
        self.token_offset
    }

    fn this_hop(&self) -> usize {
        if self.token_offset == 0 {
            self.hop.saturating_add(self.prompt_token_pad)
        } else {
            self.hop
        }
    }

    /// The next non-final chunk if `n_available` (pruned) tokens allow one; advances the state.
    pub fn next_chunk(&mut self, n_available: usize) -> Option<FlowChunk> {
        let hop = self.this_hop();
        let look = self.params.pre_lookahead_len;
        // Saturating: hops and ratios come from the manifest and the user (`--set`), unbounded.
        if n_available < self.token_offset.saturating_add(hop).saturating_add(look) {
            return None;
        }
        let ratio = self.params.token_mel_ratio;
        let chunk = FlowChunk {
            n_tokens: self.token_offset + hop + look,
            token_offset: self.token_offset,
            finalize: false,
            block_frames: self.params.dit_block_frames,
            mel_frames: ratio.saturating_mul(self.token_offset + hop),
            first_new_frame: ratio.saturating_mul(self.token_offset),
        };
        self.token_offset += hop;
        self.hop = self.hop.saturating_mul(self.params.stream_scale_factor).min(self.params.token_max_hop_len);
        Some(chunk)
    }

    /// The final call over all `n_total` tokens (full attention, zero look-ahead pad).
    pub fn final_chunk(&self, n_total: usize) -> Result<FlowChunk> {
        if n_total < self.token_offset {
            return Err(Error::invalid(format!(
                "{n_total} tokens is fewer than the {} already vocoded",
                self.token_offset
            )));
        }
        let ratio = self.params.token_mel_ratio;
        Ok(FlowChunk {
            n_tokens: n_total,
            token_offset: self.token_offset,
            finalize: true,
            block_frames: 0,
            mel_frames: ratio.saturating_mul(n_total),
            first_new_frame: ratio.saturating_mul(self.token_offset),
        })
    }
}

/// The whole schedule for a request whose LLM produced `n_total` (pruned) tokens: every
/// non-final chunk, then the final call. Offline synthesis is the single final call
/// (`StreamPlanner::new(..).final_chunk(n_total)`).
pub fn plan_stream(params: StreamParams, n_prompt_tokens: usize, n_total: usize) -> Result<Vec<FlowChunk>> {
    let mut planner = StreamPlanner::new(params, n_prompt_tokens);
    let mut chunks = Vec::new();
    while let Some(c) = planner.next_chunk(n_total) {
        chunks.push(c);
    }
    chunks.push(planner.final_chunk(n_total)?);
    Ok(chunks)
}

/// Frames after the speed change: Python `int(T / speed)`.
pub fn speed_frames(frames: usize, speed: f64) -> usize {
    (frames as f64 / speed) as usize
}

/// Speed control (§7.2): `F.interpolate(mel, size=int(T/speed), mode='linear',
/// align_corners=False)` on a `[80, T]` mel, in float32 with torch's index arithmetic. Only valid
/// for a non-streaming (single, final) flow call.
pub fn speed_interpolate(mel: ArrayView2<f32>, speed: f64) -> Result<Array2<f32>> {
    if !(speed.is_finite() && speed > 0.0) {
        return Err(Error::invalid(format!("speed must be a positive number, got {speed}")));
    }
    let (channels, t_in) = mel.dim();
    let t_out = speed_frames(t_in, speed);
    if t_out == 0 || t_in == 0 {
        return Err(Error::invalid(format!("speed {speed} leaves no mel frames ({t_in} in)")));
    }
    if t_out == t_in {
        return Ok(mel.to_owned());
    }
    let scale = t_in as f32 / t_out as f32;
    let mut out = Array2::<f32>::zeros((channels, t_out));
    for j in 0..t_out {
        let (i0, i1, l0, l1) = crate::interp::linear_taps(scale, j, t_in);
        for c in 0..channels {
            // torch's AVX2 kernel contracts `v0·l0 + v1·l1` into fma(v0, l0, v1·l1); the scalar
            // (ATEN_CPU_CAPABILITY=default) kernel does not and differs by an ulp.
            out[[c, j]] = mel[[c, i0]].mul_add(l0, mel[[c, i1]] * l1);
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::excessive_precision)] // reference values are kept as torch printed them
mod tests {
    use super::*;

    // Reference bit patterns below were recorded with torch 2.15 on CPU (identical under
    // ATEN_CPU_CAPABILITY=default/avx2/avx512):
    //   t = torch.linspace(0, 1, 11); ts = 1 - torch.cos(t * 0.5 * torch.pi)
    const TORCH_LINSPACE_11: [u32; 11] = [
        0x00000000, 0x3dcccccd, 0x3e4ccccd, 0x3e99999a, 0x3ecccccd, 0x3f000000, 0x3f19999a, 0x3f333333,
        0x3f4ccccd, 0x3f666666, 0x3f800000,
    ];
    const TORCH_COSINE_T_SPAN_10: [u32; 11] = [
        0x00000000, 0x3c49b6c0, 0x3d4878f0, 0x3ddf37f8, 0x3e43910c, 0x3e95f61a, 0x3ed30dd2, 0x3f0bc747,
        0x3f30e444, 0x3f57f3e9, 0x3f800000,
    ];

    /// The official `stream_multi` schedule on the tiny model (16 kHz prompt: 62 prompt tokens):
    /// sentence 0 has 216 tokens and leaves the hop at 100; sentence 1 (235 tokens) starts there,
    /// with the pad computed from 100 (38), so its first chunk is 100 + 38 + 3 tokens.
    #[test]
    fn the_hop_carries_into_the_next_sentence() {
        let p = StreamParams::default();
        let mut first = StreamPlanner::new(p, 62);
        let mut ends = Vec::new();
        while let Some(c) = first.next_chunk(216) {
            ends.push(c.mel_frames / 2);
        }
        assert_eq!(ends, vec![25 + 13, 25 + 13 + 50, 25 + 13 + 50 + 100]);
        assert_eq!(first.hop(), 100);
        let mut second = StreamPlanner::starting_at(p, 62, first.hop());
        assert_eq!(second.prompt_token_pad(), 38);
        let c = second.next_chunk(235).expect("first chunk of sentence 1");
        assert_eq!((c.n_tokens, c.mel_frames), (141, 276));
        assert!(second.next_chunk(235).is_none(), "235 − 138 = 97 < 100 + 3: only the final call is left");
        // 480 samples per frame; a non-final HiFT call holds back 8 frames.
        assert_eq!(480 * (c.mel_frames - 8), 128_640);
    }

    #[test]
    fn linspace_matches_torch_bits() {
        // IEEE-exact: one f32 division, multiplications and subtractions, the same bits on every CPU.
        let got: Vec<u32> = linspace_unit_f32(11).iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, TORCH_LINSPACE_11);
    }

    #[test]
    fn cosine_schedule_matches_torch() {
        let got = cosine_t_span(10);
        for (i, (g, w)) in got.iter().zip(TORCH_COSINE_T_SPAN_10).enumerate() {
            // cosf comes from the system libm (glibc picks an FMA or a plain variant by CPU), torch's
            // from SLEEF: either may be an ulp off the other. The values are positive, so adjacent
            // bit patterns are adjacent floats.
            let ulps = (i64::from(g.to_bits()) - i64::from(w)).abs();
            assert!(ulps <= 1, "t[{i}] = {g:e}, torch {:e}: {ulps} ulps apart", f32::from_bits(w));
        }
    }

    #[test]
    fn speed_interpolation_matches_torch() {
        // torch.manual_seed(3); m = torch.randn(2, 7);
        // F.interpolate(m[None], size=int(7/speed), mode='linear')[0]   (AVX2 CPU kernel)
        let m = ndarray::arr2(&[
            [0.8032760620117188f32, 0.17483338713645935, 0.08897809684276581, -0.6137180328369141,
             0.04618244990706444, -1.3682591915130615, 0.3374950885772705],
            [1.0111159086227417, -1.435179352760315, 0.9774317741394043, 0.5220499634742737,
             1.2379167079925537, -0.8646355867385864, 0.2989608347415924],
        ]);
        let cases: [(f64, Vec<Vec<u32>>); 2] = [
            (1.5, vec![vec![1058098916, 982880336, 3172250795, 3197809940],
                       vec![1035993782, 1064019579, 1066598365, 3188502373]]),
            (0.8, vec![vec![1062052736, 1050007646, 1038953646, 3197948376, 3198576619, 3200952910,
                            3213243126, 1051511848],
                       vec![1065446463, 3212442582, 1046796996, 1060677062, 1062589030, 1058321367,
                            3206905468, 1050218853]]),
        ];
        // Exact: the taps are IEEE arithmetic and `mul_add` is a correctly rounded fused multiply-add
        // (hardware or libm fma), so every x86-64 CPU computes these bits.
        for (speed, want) in cases {
            let got = speed_interpolate(m.view(), speed).unwrap();
            assert_eq!(got.ncols(), want[0].len());
            for c in 0..2 {
                for (j, &w) in want[c].iter().enumerate() {
                    let (g, w) = (got[[c, j]], f32::from_bits(w));
                    assert_eq!(g.to_bits(), w.to_bits(), "speed {speed} [{c},{j}]: {g} vs {w}");
                }
            }
        }
    }
}
