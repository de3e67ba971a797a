//! The parts of HiFT that run natively (cosyvoice3.md §6.2–6.5, docs/model-format.md
//! "f0 and source"):
//!
//! * [`F0Predictor`]: the causal conv f0 net in float64 (ORT has no float64 Conv on CPU, and the
//!   official code runs it in float64 so that re-computed prefixes agree).
//! * [`SourceGenerator`]: the NSF source (`SineGen2(causal=True)` + `SourceModuleHnNSF`) in
//!   float32 in the official op order, with the replayed uniform noise of [`crate::rng`].
//! * [`plan_hift_call`] / [`HiftStream`]: what to feed the `hift_decode` graph on final and
//!   non-final calls, and which samples of each call are new.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3, Axis};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::profile::Profiler;
use crate::rng::{SineNoise, SINE_NOISE_WIDTH};
use crate::runtime::shapes::bucket_len;

/// One conv layer of the f0 net, stored for an im2col product over time-major activations:
/// `w_cols[j·C_in + c, o] = W[o, c, j]`.
#[derive(Debug, Clone)]
struct F0Conv {
    in_channels: usize,
    kernel: usize,
    w_cols: Array2<f64>,
    bias: Vec<f64>,
}

impl F0Conv {
    fn new(name: &str, weight: ArrayView3<f64>, bias: &[f64]) -> Result<Self> {
        let (out_ch, in_ch, kernel) = weight.dim();
        if bias.len() != out_ch || kernel == 0 {
            return Err(Error::invalid(format!(
                "f0 predictor {name}: weight {:?} and bias [{}] disagree",
                weight.dim(),
                bias.len()
            )));
        }
        let mut w_cols = Array2::<f64>::zeros((kernel * in_ch, out_ch));
        for o in 0..out_ch {
            for c in 0..in_ch {
                for j in 0..kernel {
                    w_cols[[j * in_ch + c, o]] = weight[[o, c, j]];
                }
            }
        }
        Ok(F0Conv { in_channels: in_ch, kernel, w_cols, bias: bias.to_vec() })
    }

    fn out_channels(&self) -> usize {
        self.bias.len()
    }

    /// Valid convolution of a time-major input `[T_in, C_in]` (already padded), then ELU.
    /// Output `[T_in − k + 1, C_out]`. Rows are computed in parallel blocks; each output element
    /// is the same dot product whatever the blocking.
    fn forward_elu(&self, x: &Array2<f64>) -> Array2<f64> {
        let (t_in, c_in) = x.dim();
        debug_assert_eq!(c_in, self.in_channels);
        let t_out = t_in + 1 - self.kernel;
        let width = self.kernel * c_in;
        let x = x.as_standard_layout();
        let flat = x.as_slice().unwrap_or(&[]);
        const BLOCK: usize = 64;
        let n_blocks = t_out.div_ceil(BLOCK);
        let blocks: Vec<Array2<f64>> = (0..n_blocks)
            .into_par_iter()
            .map(|b| {
                let t0 = b * BLOCK;
                let rows = BLOCK.min(t_out - t0);
                // Row t of the im2col matrix is the contiguous window x[t..t+k, :].
                let mut cols = Vec::with_capacity(rows * width);
                for r in 0..rows {
                    let start = (t0 + r) * c_in;
                    cols.extend_from_slice(&flat[start..start + width]);
                }
                let cols = Array2::from_shape_vec((rows, width), cols).expect("im2col block shape");
                let mut y = cols.dot(&self.w_cols);
                for mut row in y.rows_mut() {
                    for (v, &b) in row.iter_mut().zip(&self.bias) {
                        let z = *v + b;
                        *v = if z > 0.0 { z } else { z.exp_m1() };
                    }
                }
                y
            })
            .collect();
        let mut out = Array2::<f64>::zeros((t_out, self.out_channels()));
        for (b, block) in blocks.iter().enumerate() {
            out.slice_mut(s![b * BLOCK..b * BLOCK + block.nrows(), ..]).assign(block);
        }
        out
    }
}

/// `CausalConvRNNF0Predictor` in float64: condnet.0 (k=4, 3 frames of right context), four causal
/// k=3 convs (left pad 2), ELU after each, then `|Linear(C→1)|`.
#[derive(Debug, Clone)]
pub struct F0Predictor {
    convs: Vec<F0Conv>,
    classifier_w: Vec<f64>,
    classifier_b: f64,
}

impl F0Predictor {
    /// Frames of right context of condnet.0 (its kernel minus one).
    pub fn look_right(&self) -> usize {
        self.convs[0].kernel - 1
    }

    /// Builds the net from folded (weight-norm baked) float64 tensors: `condnet` holds
    /// `(weight [out, in, k], bias [out])` for condnet.0, .2, .4, .6, .8 in order; the classifier
    /// weight is `[1, C]` flattened, its bias one value.
    pub fn new(
        condnet: &[(ArrayView3<f64>, &[f64])],
        classifier_w: &[f64],
        classifier_b: f64,
    ) -> Result<Self> {
        if condnet.is_empty() {
            return Err(Error::invalid("f0 predictor: no condnet layers"));
        }
        let mut convs = Vec::with_capacity(condnet.len());
        for (i, (w, b)) in condnet.iter().enumerate() {
            let conv = F0Conv::new(&format!("condnet.{}", 2 * i), w.view(), b)?;
            if let Some(prev) = convs.last() {
                let prev: &F0Conv = prev;
                if conv.in_channels != prev.out_channels() {
                    return Err(Error::invalid(format!(
                        "f0 predictor condnet.{}: {} input channels after {} outputs",
                        2 * i,
                        conv.in_channels,
                        prev.out_channels()
                    )));
                }
            }
            convs.push(conv);
        }
        let c = convs[convs.len() - 1].out_channels();
        if classifier_w.len() != c {
            return Err(Error::invalid(format!(
                "f0 predictor classifier has {} weights for {c} channels",
                classifier_w.len()
            )));
        }
        Ok(F0Predictor { convs, classifier_w: classifier_w.to_vec(), classifier_b })
    }

    /// Frames of left context after which a window's f0 equals a whole-prefix call's: the later
    /// convs pad zeros on the left, so the first `Σ (kernel − 1)` outputs of a window differ.
    pub fn left_context(&self) -> usize {
        self.convs[1..].iter().map(|c| c.kernel - 1).sum()
    }

    /// Mel channels expected.
    pub fn in_channels(&self) -> usize {
        self.convs[0].in_channels
    }

    /// f0 in Hz, float64, for a mel `[80, T]`. `finalize`: zero right pad, T values; otherwise the
    /// last `look_right()` frames are context only and T − 3 values come out.
    pub fn predict_f64(&self, mel: ArrayView2<f32>, finalize: bool) -> Result<Vec<f64>> {
        let (ch, t) = mel.dim();
        let look = self.look_right();
        if ch != self.in_channels() {
            return Err(Error::invalid(format!("f0 predictor: mel has {ch} channels, expected {}", self.in_channels())));
        }
        if !finalize && t <= look {
            return Err(Error::invalid(format!("f0 predictor: {t} frames leave nothing after {look} frames of context")));
        }
        // Time-major float64 input with the right zero pad of a final call.
        let pad_right = if finalize { look } else { 0 };
        let mut x = Array2::<f64>::zeros((t + pad_right, ch));
        for (c, row) in mel.outer_iter().enumerate() {
            for (i, &v) in row.iter().enumerate() {
                x[[i, c]] = f64::from(v);
            }
        }
        let mut h = self.convs[0].forward_elu(&x);
        for conv in &self.convs[1..] {
            let pad_left = conv.kernel - 1;
            let mut padded = Array2::<f64>::zeros((h.nrows() + pad_left, h.ncols()));
            padded.slice_mut(s![pad_left.., ..]).assign(&h);
            h = conv.forward_elu(&padded);
        }
        Ok(h
            .rows()
            .into_iter()
            .map(|row| {
                let y: f64 = row.iter().zip(&self.classifier_w).map(|(a, w)| a * w).sum::<f64>() + self.classifier_b;
                y.abs()
            })
            .collect())
    }

    /// [`Self::predict_f64`] cast to float32, as the official code casts f0 back to the mel dtype.
    pub fn predict(&self, mel: ArrayView2<f32>, finalize: bool) -> Result<Vec<f32>> {
        Ok(self.predict_f64(mel, finalize)?.into_iter().map(|v| v as f32).collect())
    }
}

/// NSF source settings (manifest `config.hift`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceParams {
    pub sample_rate: u32,
    /// Samples per mel frame (480 = prod(upsample_rates) · istft_hop).
    pub samples_per_frame: usize,
    /// Harmonic overtones above the fundamental (8 → 9 sine components).
    pub nb_harmonics: usize,
    /// Sine amplitude (0.1).
    pub nsf_alpha: f32,
    /// Noise amplitude in voiced frames (0.003).
    pub nsf_sigma: f32,
    /// f0 above this (Hz) is voiced (10).
    pub nsf_voiced_threshold: f32,
}

impl Default for SourceParams {
    fn default() -> Self {
        SourceParams {
            sample_rate: 24_000,
            samples_per_frame: 480,
            nb_harmonics: 8,
            nsf_alpha: 0.1,
            nsf_sigma: 0.003,
            nsf_voiced_threshold: 10.0,
        }
    }
}

/// Generates the NSF source signal from frame-rate f0 (§6.3), in float32 with torch's op order.
#[derive(Clone)]
pub struct SourceGenerator {
    params: SourceParams,
    l_linear_w: Vec<f32>,
    l_linear_b: f32,
    noise: SineNoise,
}

impl SourceGenerator {
    /// `l_linear_w` is `hift.source.l_linear.weight` `[1, nb_harmonics + 1]` flattened,
    /// `l_linear_b` its bias; `noise_offset` is the manifest's `sine_noise.offset`.
    pub fn new(params: SourceParams, l_linear_w: &[f32], l_linear_b: f32, noise_offset: u64) -> Result<Self> {
        let dim = params.nb_harmonics + 1;
        if l_linear_w.len() != dim || dim > SINE_NOISE_WIDTH {
            return Err(Error::invalid(format!(
                "source l_linear has {} weights for {dim} harmonics (at most {SINE_NOISE_WIDTH})",
                l_linear_w.len()
            )));
        }
        Ok(SourceGenerator { params, l_linear_w: l_linear_w.to_vec(), l_linear_b, noise: SineNoise::new(noise_offset) })
    }

    /// The source `[T · samples_per_frame]` for f0 `[T]` (Hz, float32).
    ///
    /// Order of operations, following `SineGen2._f02sine` / `forward` and `SourceModuleHnNSF`:
    /// nearest ×480 upsample (torch index `floor(n · float(1/480))`); `fn = f0·h`;
    /// `rad = (fn / sr) mod 1`; linear ×1/480 downsample (samples 480k+239.5, i.e. the frame's own
    /// value; the `rand_ini` added to sample 0 is never sampled); cumulative sum over frames
    /// (torch accumulates a float32 CPU cumsum in float64 and rounds each prefix to float32);
    /// `(·2)·π`, `·480`; nearest ×480 upsample; `sin · alpha`; `uv = f0_up > threshold`;
    /// `noise_amp = uv·sigma + ((1 − uv)·alpha)/3`; `sig = sines·uv + noise_amp·U`;
    /// `tanh(l_linear(sig))`.
    pub fn generate(&mut self, f0: &[f32]) -> Vec<f32> {
        let mut phase = vec![0f64; self.params.nb_harmonics + 1];
        self.generate_from(f0, 0, &mut phase)
    }

    /// The source samples of frames `start..f0.len()` only, as [`Self::generate`] over all of
    /// `f0` would give them. Every step is causal (the phase is a running sum, the noise is read at
    /// absolute sample positions), so `phase` carries the running sums from frame `start` on:
    /// zeros for `start == 0`, and after the call the sums through the last frame.
    pub fn generate_from(&mut self, f0: &[f32], start: usize, phase_acc: &mut [f64]) -> Vec<f32> {
        let p = self.params;
        let hop = p.samples_per_frame;
        let frames = f0.len();
        let n_samples = frames * hop;
        let dim = p.nb_harmonics + 1;
        if start >= frames || phase_acc.len() != dim {
            return Vec::new();
        }
        let sr = p.sample_rate as f32;
        let hop_f = hop as f32;
        // torch nearest upsample: source index floor(dst · (float)(1/scale)), clamped.
        let up_scale = (1.0f64 / hop as f64) as f32;
        let nearest = |n: usize| ((n as f32 * up_scale).floor() as usize).min(frames - 1);
        // torch linear downsample with scale_factor 1/hop: ratio (float)(1/(1/hop)).
        let down_ratio = (1.0f64 / (1.0f64 / hop as f64)) as f32;
        let rad_at = |n: usize, h: usize| -> f32 {
            let fnv = f0[nearest(n)] * (h + 1) as f32;
            let r = fnv / sr;
            // torch.remainder(x, 1) for float: fmod, shifted into [0, 1) for negative values.
            let m = r % 1.0;
            if m < 0.0 { m + 1.0 } else { m }
        };
        let new_frames = frames - start;
        let mut phase = vec![0f32; new_frames * dim];
        for k in start..frames {
            let (i0, i1, l0, l1) = crate::interp::linear_taps(down_ratio, k, n_samples);
            for h in 0..dim {
                let rad = rad_at(i0, h) * l0 + rad_at(i1, h) * l1;
                phase_acc[h] += f64::from(rad);
                let cum = phase_acc[h] as f32;
                phase[(k - start) * dim + h] = ((cum * 2.0) * std::f32::consts::PI) * hop_f;
            }
        }
        let noise = self.noise.rows(n_samples);
        let amp = p.nsf_alpha;
        let unvoiced_amp = (1.0f32 * amp) / 3.0;
        let mut out = Vec::with_capacity(new_frames * hop);
        for n in start * hop..n_samples {
            // nearest(n) is exactly n / hop over any length the flow noise allows (see the test
            // `nearest_upsample_index_is_exact`), so it never falls before `start`.
            let k = nearest(n).max(start);
            let voiced = f0[k] > p.nsf_voiced_threshold;
            let uv = if voiced { 1.0f32 } else { 0.0 };
            let noise_amp = uv * p.nsf_sigma + if voiced { 0.0 } else { unvoiced_amp };
            let mut y = f64::from(self.l_linear_b);
            for h in 0..dim {
                let sine = phase[(k - start) * dim + h].sin() * amp;
                let sig = sine * uv + noise_amp * noise[n * SINE_NOISE_WIDTH + h];
                y += f64::from(sig) * f64::from(self.l_linear_w[h]);
            }
            out.push((y as f32).tanh());
        }
        out
    }
}

/// What one `hift_decode` call needs, for `acc_frames` accumulated mel frames (docs/model-format.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HiftCall {
    pub finalize: bool,
    /// f0 is predicted over all accumulated frames with this `finalize`; it yields `f0_frames`.
    pub f0_frames: usize,
    /// Frames whose source is generated (`= f0_frames`); the graph's `source` input is
    /// `[1, 1, 480 · source_frames]`.
    pub source_frames: usize,
    /// The graph's `mel` input is `mel[:, :, ..mel_frames]` followed by `zero_pad_frames` zero
    /// frames: `[1, 80, decode_frames + 4]`.
    pub mel_frames: usize,
    pub zero_pad_frames: usize,
    /// Frames the graph turns into audio (its output has `480 · decode_frames` samples).
    pub decode_frames: usize,
    /// Samples dropped from the end of the graph output (480 on a non-final call).
    pub drop_tail_samples: usize,
    /// Samples this call yields in total from sample 0 (`480·T` or `480·(T − 8)`).
    pub total_samples: usize,
}

/// The calling convention of `hift_decode` for `acc_frames` accumulated frames: a final call
/// decodes all T frames (zero pad of `conv_pre_look_right` frames); a non-final call runs the f0
/// net with `f0_look_right` frames of context, decodes T − 3 − 4 frames with the next 4 as
/// conv_pre context, and drops the last frame's samples, giving `480·(T − 8)`.
pub fn plan_hift_call(
    acc_frames: usize,
    finalize: bool,
    f0_look_right: usize,
    conv_pre_look_right: usize,
    samples_per_frame: usize,
) -> Result<HiftCall> {
    if finalize {
        if acc_frames == 0 {
            return Err(Error::invalid("hift: no mel frames to decode"));
        }
        return Ok(HiftCall {
            finalize,
            f0_frames: acc_frames,
            source_frames: acc_frames,
            mel_frames: acc_frames,
            zero_pad_frames: conv_pre_look_right,
            decode_frames: acc_frames,
            drop_tail_samples: 0,
            total_samples: samples_per_frame * acc_frames,
        });
    }
    let held_back = f0_look_right + conv_pre_look_right + 1;
    if acc_frames <= held_back {
        return Err(Error::invalid(format!(
            "hift: a non-final call needs more than {held_back} mel frames, got {acc_frames}"
        )));
    }
    let f0_frames = acc_frames - f0_look_right;
    let decode_frames = f0_frames - conv_pre_look_right;
    Ok(HiftCall {
        finalize,
        f0_frames,
        source_frames: f0_frames,
        mel_frames: f0_frames,
        zero_pad_frames: 0,
        decode_frames,
        drop_tail_samples: samples_per_frame,
        total_samples: samples_per_frame * (decode_frames - 1),
    })
}

/// Everything the `hift_decode` graph needs for one call.
#[derive(Debug, Clone)]
pub struct HiftInputs {
    pub plan: HiftCall,
    /// The window starts at this mel frame: the graph's output begins at sample
    /// `samples_per_frame · first_frame` of the utterance (0 for a whole-prefix call).
    pub first_frame: usize,
    /// The graph's `mel` input `[1, 80, decode_frames − first_frame + 4]`.
    pub mel: Array3<f32>,
    /// The graph's `source` input `[1, 1, 480 · (source_frames − first_frame)]`.
    pub source: Array3<f32>,
    /// The leading samples of the graph's output that are this call's (`480 · (decode_frames −
    /// first_frame)`); the rest, present only after [`Self::pad_to_bucket`], is padding. The
    /// plan's `drop_tail_samples` then come off these.
    pub output_samples: usize,
}

impl HiftInputs {
    /// Right-pads a non-final call's `mel` (zero frames) and `source` (zeros) up to the shape
    /// bucket [`bucket_len`]`(mel frames, base, step)`; returns whether it padded. The graph's
    /// output then has more samples; its first [`Self::output_samples`] are the unpadded call's
    /// up to float rounding, and the plan's tail drop removes every sample the padding reaches:
    /// * every convolution after `conv_pre` is causal, and `conv_pre` looks 4 frames right, so
    ///   generator column `k` (of `120 · frames + 1`) depends only on mel frames `≤ (k−1)/120 + 4`
    ///   and source STFT columns `≤ k`: columns up to `120 · decode_frames` see real frames only
    ///   (a non-final call's 4 context frames are real mel, and its source runs 4 frames past);
    /// * the padding adds generator columns from `120 · decode_frames + 1` on; the iSTFT
    ///   (n_fft 16, hop 4, centred) lets column `j` reach output samples `4j − 8 ..= 4j + 7` and the
    ///   window envelope there, i.e. only the last 4 samples of the call, inside the 480 a
    ///   non-final call drops anyway.
    ///
    /// A final call is never padded: its last samples are reached by the padding's first
    /// generator column, and its source STFT's last column reads the reflect pad at the source's
    /// end, which a longer source replaces (the unpadded call's last samples would change).
    pub fn pad_to_bucket(&mut self, base: usize, step: usize, samples_per_frame: usize) -> bool {
        if self.plan.finalize {
            return false;
        }
        let (batch, channels, frames) = self.mel.dim();
        let bucket = bucket_len(frames, base, step);
        if bucket <= frames {
            return false;
        }
        let mut mel = Array3::<f32>::zeros((batch, channels, bucket));
        mel.slice_mut(s![.., .., ..frames]).assign(&self.mel);
        self.mel = mel;
        let samples = self.source.dim().2;
        let mut source = Array3::<f32>::zeros((1, 1, samples.max(samples_per_frame * bucket)));
        source.slice_mut(s![.., .., ..samples]).assign(&self.source);
        self.source = source;
        true
    }
}

/// Runs the native part of one whole-prefix HiFT call over the accumulated mel `[80, T]`: f0
/// (with the call's `finalize`), the NSF source, and the mel slice/zero pad of [`plan_hift_call`].
/// Returns the graph inputs and the f0 (Hz, float32 as the official code casts it) of all
/// `plan.f0_frames` frames. The graph output (`480 · decode_frames` samples) must then lose
/// `plan.drop_tail_samples`.
pub fn prepare_hift_inputs(
    f0_net: &F0Predictor,
    source: &mut SourceGenerator,
    acc_mel: ArrayView2<f32>,
    finalize: bool,
    conv_pre_look_right: usize,
) -> Result<(HiftInputs, Vec<f32>)> {
    let mut stream = HiftStream::new(acc_mel.nrows(), source.params.nb_harmonics + 1, None);
    stream.push_mel(acc_mel)?;
    let inputs = stream.prepare(f0_net, source, finalize, conv_pre_look_right, &Profiler::disabled())?;
    Ok((inputs, stream.f0))
}

/// Per-request HiFT state for streaming (official `hift_cache_dict[uuid]`: the accumulated `mel`
/// and `speech_offset`, the samples already emitted).
///
/// The official code re-vocodes the whole accumulated mel on every chunk. Everything in HiFT is
/// causal (or looks a fixed few frames right), so this keeps what no later call can change and
/// computes only what is new; the emitted samples are the same:
/// * f0 of frames that had their full right context is kept; a call computes the f0 of new frames
///   over a window with [`F0Predictor::left_context`] frames before them;
/// * the source of those frames is kept with its running phase sums, and extended frame by frame;
/// * with `decode_context = Some(c)`, the `hift_decode` graph runs over a window that starts `c`
///   frames before the first sample not yet emitted (the exporter's bound on the decoder's
///   receptive field, `decode_left_context_frames`), not over the whole prefix. `None` decodes the
///   whole prefix every call, as the official code does.
#[derive(Debug, Clone)]
pub struct HiftStream {
    mel: Array2<f32>,
    speech_offset: usize,
    f0: Vec<f32>,
    source: Vec<f32>,
    phase: Vec<f64>,
    decode_context: Option<usize>,
}

impl HiftStream {
    /// `harmonics` is the source's sine count (nb_harmonics + 1).
    pub fn new(mel_dim: usize, harmonics: usize, decode_context: Option<usize>) -> Self {
        HiftStream {
            mel: Array2::zeros((mel_dim, 0)),
            speech_offset: 0,
            f0: Vec::new(),
            source: Vec::new(),
            phase: vec![0.0; harmonics],
            decode_context,
        }
    }

    /// Appends the new frames `[80, n]` of a flow call.
    pub fn push_mel(&mut self, frames: ArrayView2<f32>) -> Result<()> {
        self.mel.append(Axis(1), frames).map_err(|e| Error::invalid(format!("hift mel append: {e}")))
    }

    /// The accumulated mel `[80, T]`.
    pub fn mel(&self) -> ArrayView2<'_, f32> {
        self.mel.view()
    }

    /// f0 of every frame settled so far (all frames after a final call).
    pub fn f0(&self) -> &[f32] {
        &self.f0
    }

    /// The NSF source of those frames.
    pub fn source(&self) -> &[f32] {
        &self.source
    }

    pub fn speech_offset(&self) -> usize {
        self.speech_offset
    }

    /// The `base` of this stream's HiFT shape buckets ([`HiftInputs::pad_to_bucket`]): a windowed
    /// non-final call decodes the new frames plus `decode_context + conv_pre_look_right + 1`
    /// frames (the window's context, conv_pre's right context and the frame whose samples the
    /// previous call dropped), so the buckets are that overhead plus whole hops of new frames.
    /// The whole-prefix form (no window) has no such overhead.
    pub fn bucket_base(&self, conv_pre_look_right: usize) -> usize {
        self.decode_context.map_or(0, |c| c + conv_pre_look_right + 1)
    }

    /// The graph inputs of the next call over the accumulated mel (recording `hift.f0` and
    /// `hift.source`).
    pub fn prepare(
        &mut self,
        f0_net: &F0Predictor,
        source: &mut SourceGenerator,
        finalize: bool,
        conv_pre_look_right: usize,
        profiler: &Profiler,
    ) -> Result<HiftInputs> {
        let (channels, frames) = self.mel.dim();
        let spf = source.params.samples_per_frame;
        let plan = plan_hift_call(frames, finalize, f0_net.look_right(), conv_pre_look_right, spf)?;
        if plan.f0_frames < self.f0.len() {
            return Err(Error::Runtime(format!(
                "hift: {} f0 frames settled but this call yields only {}",
                self.f0.len(),
                plan.f0_frames
            )));
        }

        // f0 of the new frames, from a window with enough left context to be exact.
        let done = self.f0.len();
        let w = done.saturating_sub(f0_net.left_context());
        let window = self.mel.slice(s![.., w..]);
        let f0_new = profiler.time("hift.f0", || f0_net.predict(window, finalize))?;
        if w + f0_new.len() != plan.f0_frames {
            return Err(Error::Runtime(format!("hift: f0 window gave {} frames", f0_new.len())));
        }
        self.f0.extend_from_slice(&f0_new[done - w..]);

        let src_new = profiler.time("hift.source", || source.generate_from(&self.f0, done, &mut self.phase));
        self.source.extend_from_slice(&src_new);
        debug_assert_eq!(self.source.len(), plan.source_frames * spf);

        let first_needed = self.speech_offset / spf;
        let first_frame = match self.decode_context {
            Some(context) => first_needed.saturating_sub(context),
            None => 0,
        };
        let mut mel = Array3::<f32>::zeros((1, channels, plan.mel_frames - first_frame + plan.zero_pad_frames));
        mel.slice_mut(s![0, .., ..plan.mel_frames - first_frame])
            .assign(&self.mel.slice(s![.., first_frame..plan.mel_frames]));
        let src = self.source[first_frame * spf..plan.source_frames * spf].to_vec();
        let n = src.len();
        let source = Array3::from_shape_vec((1, 1, n), src)
            .map_err(|e| Error::invalid(format!("hift source shape: {e}")))?;
        let output_samples = spf * (plan.decode_frames - first_frame);
        Ok(HiftInputs { plan, first_frame, mel, source, output_samples })
    }

    /// Takes the samples of a call's output (which starts at sample `spf · first_frame` of the
    /// utterance and has lost its tail drop) that were not emitted before, and advances
    /// `speech_offset`.
    pub fn take_new(&mut self, call_output: &[f32], first_frame: usize, samples_per_frame: usize) -> Vec<f32> {
        let begin = first_frame * samples_per_frame;
        let start = self.speech_offset.saturating_sub(begin).min(call_output.len());
        let new = call_output[start..].to_vec();
        self.speech_offset += new.len();
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `generate_from` relies on torch's float nearest-upsample index being exactly `n / 480`
    /// for every sample the flow noise allows (15 000 frames), so a frame's samples never read
    /// an earlier frame's f0.
    #[test]
    fn nearest_upsample_index_is_exact() {
        let hop = 480usize;
        let up_scale = (1.0f64 / hop as f64) as f32;
        for n in 0..hop * 20_000 {
            // IEEE-exact: one f32 product and a floor, the same on every CPU.
            assert_eq!((n as f32 * up_scale).floor() as usize, n / hop, "sample {n}");
        }
    }

    /// Extending the source frame by frame (with the carried phase sums) gives the same bits as
    /// generating it in one go.
    #[test]
    fn source_in_pieces_equals_source_at_once() {
        let params = SourceParams::default();
        let w: Vec<f32> = (0..9).map(|h| 0.1 * (h as f32 - 4.0)).collect();
        let f0: Vec<f32> = (0..90).map(|k| if k % 17 < 3 { 0.0 } else { 90.0 + 3.7 * k as f32 }).collect();
        let once = SourceGenerator::new(params, &w, 0.05, 1234).expect("source").generate(&f0);
        let mut gen = SourceGenerator::new(params, &w, 0.05, 1234).expect("source");
        let mut phase = vec![0f64; 9];
        let mut pieces = Vec::new();
        for (a, b) in [(0, 13), (13, 50), (50, 90)] {
            pieces.extend(gen.generate_from(&f0[..b], a, &mut phase));
        }
        assert_eq!(pieces.len(), once.len());
        // Exact on any CPU: one process, and `generate` is `generate_from(.., 0, ..)`, so each sample
        // goes through the same scalar operations on the same inputs (the f64 phase sums are
        // carried, not recomputed).
        assert!(pieces.iter().zip(&once).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
