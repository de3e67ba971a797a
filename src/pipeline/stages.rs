//! Session-backed stage runners: each wraps one open [`StageSession`] and speaks the graph
//! contract of docs/model-format.md (names, dtypes, layouts).
//!
//! * The `llm` graph is run by the engine's scheduler (`crate::engine::llm_batch`), which keeps
//!   the batched KV cache in ORT values bound through an IoBinding (on the GPU with CUDA).
//! * [`OnnxEstimator`] implements [`Estimator`] for the `dit` graph.
//! * [`run_flow_front`], [`run_hift_decode`], [`run_campplus`], [`run_speech_tokenizer`]: one call each.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3};
use ort::session::SessionInputValue;
use ort::value::{DynValue, Tensor, TensorElementType, TensorRef};

use crate::error::{Error, Result};
use crate::flow::{DitCacheShape, DitInputs, Estimator, PrefixArg, PrefixStep};
use crate::profile::Profiler;
use crate::runtime::shapes::{bucket_len, DIT_BUCKET_STEP};
use crate::runtime::StageSession;

/// An owned ORT tensor from a shape and row-major data.
pub(crate) fn tensor<T>(shape: &[usize], data: Vec<T>) -> Result<DynValue>
where
    T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static,
{
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(Tensor::from_array((shape, data.into_boxed_slice()))?.into_dyn())
}

fn view_to_vec<D: ndarray::Dimension>(v: ndarray::ArrayView<f32, D>) -> Vec<f32> {
    v.as_standard_layout().iter().copied().collect()
}

fn out_f32(outputs: &ort::session::SessionOutputs<'_>, stage: &str, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let v = outputs
        .get(name)
        .ok_or_else(|| Error::Runtime(format!("{stage}: the graph returned no output {name:?}")))?;
    let (shape, data) = v.try_extract_tensor::<f32>()?;
    Ok((shape.iter().map(|&d| d.max(0) as usize).collect(), data.to_vec()))
}

/// The manifest's first output name of a stage (the frontend graphs' names are not fixed).
fn first_output(session: &StageSession) -> Result<String> {
    session
        .output_names()
        .into_iter()
        .next()
        .ok_or_else(|| Error::Runtime(format!("{}: graph has no outputs", session.stage)))
}

/// The `dit` graph as the CFM [`Estimator`].
pub struct OnnxEstimator<'s> {
    pub session: &'s mut StageSession,
    /// Records `flow.dit` per call and `flow.dit.copy` for the input copies.
    pub profiler: &'s Profiler,
    /// The graph's prompt-prefix cache I/O (`None`: a folder exported without it).
    pub prefix_shape: Option<DitCacheShape>,
}

/// Concatenates per-request arrays along `axis` (the batch rows), straight into the flat
/// row-major buffer an ORT tensor takes.
fn concat_rows<D: ndarray::RemoveAxis>(parts: &[ndarray::ArrayView<f32, D>], axis: usize) -> Result<(Vec<usize>, Vec<f32>)> {
    if let [one] = parts {
        return Ok((one.shape().to_vec(), view_to_vec(one.view())));
    }
    let joined = ndarray::concatenate(ndarray::Axis(axis), parts).map_err(|e| Error::Runtime(format!("dit cache rows: {e}")))?;
    // `concatenate` keeps the inputs' memory order, which along axis 1 is not row-major.
    Ok((joined.shape().to_vec(), view_to_vec(joined.view())))
}

fn out_array<D: ndarray::Dimension>(outputs: &ort::session::SessionOutputs<'_>, name: &str) -> Result<ndarray::Array<f32, D>> {
    let (shape, data) = out_f32(outputs, "dit", name)?;
    ndarray::ArrayD::from_shape_vec(shape.clone(), data)
        .and_then(|a| a.into_dimensionality::<D>())
        .map_err(|e| Error::Runtime(format!("dit: {name} has shape {shape:?}: {e}")))
}

impl OnnxEstimator<'_> {
    /// One `dit` call. `prefix`: the cached state each request of the batch continues after (in
    /// row order, 2 rows each; empty = no cached frames); `record`: leading frames whose state
    /// comes back (0 = none).
    ///
    /// With shape buckets on ([`StageSession::shape_buckets`]) the frames are right-padded up to
    /// [`bucket_len`]`(frames, 0, `[`DIT_BUCKET_STEP`]`)` with `mask` 0 there, and the output cut
    /// back: exact for the real frames for the reason batching is (docs/model-format.md, `dit`:
    /// causal positional conv, masked keys, per-frame rest).
    pub fn run_graph(&mut self, inputs: DitInputs<'_>, prefix: &[&PrefixStep], record: usize) -> Result<(Array3<f32>, Option<PrefixStep>)> {
        let frames = inputs.x.dim().2;
        let bucket = if self.session.shape_buckets { bucket_len(frames, 0, DIT_BUCKET_STEP) } else { frames };
        if bucket == frames {
            return self.run_graph_at_shape(inputs, prefix, record);
        }
        let pad = |a: ArrayView3<f32>| {
            let (rows, ch, _) = a.dim();
            let mut out = Array3::<f32>::zeros((rows, ch, bucket));
            out.slice_mut(s![.., .., ..frames]).assign(&a);
            out
        };
        let (x, mask, mu, cond) = (pad(inputs.x), pad(inputs.mask), pad(inputs.mu), pad(inputs.cond));
        let padded = DitInputs { x: x.view(), mask: mask.view(), mu: mu.view(), cond: cond.view(), ..inputs };
        let (v, state) = self.run_graph_at_shape(padded, prefix, record)?;
        Ok((v.slice(s![.., .., ..frames]).to_owned(), state))
    }

    /// [`Self::run_graph`] at the inputs' own shape.
    fn run_graph_at_shape(&mut self, inputs: DitInputs<'_>, prefix: &[&PrefixStep], record: usize) -> Result<(Array3<f32>, Option<PrefixStep>)> {
        let DitInputs { x, mask, mu, t, spks, cond, block_frames } = inputs;
        let _call = self.profiler.span("flow.dit");
        let copy = self.profiler.span("flow.dit.copy");
        let mut inputs: Vec<(String, SessionInputValue<'_>)> = vec![
            ("x".into(), tensor(x.shape(), view_to_vec(x))?.into()),
            ("mask".into(), tensor(mask.shape(), view_to_vec(mask))?.into()),
            ("mu".into(), tensor(mu.shape(), view_to_vec(mu))?.into()),
            ("t".into(), tensor(t.shape(), view_to_vec(t))?.into()),
            ("spks".into(), tensor(spks.shape(), view_to_vec(spks))?.into()),
            ("cond".into(), tensor(cond.shape(), view_to_vec(cond))?.into()),
            ("block_frames".into(), tensor(&[1], vec![block_frames])?.into()),
        ];
        let batch = x.dim().0;
        match self.prefix_shape {
            None if prefix.is_empty() && record == 0 => {}
            None => return Err(Error::Runtime("dit: this graph has no prompt-prefix cache inputs".into())),
            Some(shape) if prefix.len() == 1 => {
                // One request's cache: ORT reads the stored arrays in place (no copy of the
                // depth × 2 × frames × inner keys and values per call).
                let state = prefix[0];
                if state.k.dim().1 != batch || state.conv1.dim().0 != batch || state.k.dim().3 != shape.inner {
                    return Err(Error::Runtime(format!("dit: prompt-prefix cache {:?} for a batch of {batch}", state.k.dim())));
                }
                inputs.push(("cache_k".into(), TensorRef::from_array_view(state.k.view())?.into()));
                inputs.push(("cache_v".into(), TensorRef::from_array_view(state.v.view())?.into()));
                inputs.push(("cache_conv1".into(), TensorRef::from_array_view(state.conv1.view())?.into()));
                inputs.push(("cache_conv2".into(), TensorRef::from_array_view(state.conv2.view())?.into()));
                inputs.push(("record_frames".into(), tensor(&[1], vec![record as i64])?.into()));
            }
            Some(shape) => {
                let (k, v, c1, c2) = if prefix.is_empty() {
                    let kv = [shape.depth, batch, 0, shape.inner];
                    let conv = [batch, shape.conv_context, shape.dim];
                    let zeros = |d: &[usize]| (d.to_vec(), vec![0f32; d.iter().product()]);
                    (zeros(&kv), zeros(&kv), zeros(&conv), zeros(&conv))
                } else {
                    let views = |f: &dyn Fn(&PrefixStep) -> ndarray::ArrayViewD<f32>| prefix.iter().map(|p| f(p)).collect::<Vec<_>>();
                    (
                        concat_rows(&views(&|p| p.k.view().into_dyn()), 1)?,
                        concat_rows(&views(&|p| p.v.view().into_dyn()), 1)?,
                        concat_rows(&views(&|p| p.conv1.view().into_dyn()), 0)?,
                        concat_rows(&views(&|p| p.conv2.view().into_dyn()), 0)?,
                    )
                };
                if k.0.get(1) != Some(&batch) || c1.0.first() != Some(&batch) {
                    return Err(Error::Runtime(format!("dit: prompt-prefix cache rows {:?} for a batch of {batch}", k.0)));
                }
                inputs.push(("cache_k".into(), tensor(&k.0, k.1)?.into()));
                inputs.push(("cache_v".into(), tensor(&v.0, v.1)?.into()));
                inputs.push(("cache_conv1".into(), tensor(&c1.0, c1.1)?.into()));
                inputs.push(("cache_conv2".into(), tensor(&c2.0, c2.1)?.into()));
                inputs.push(("record_frames".into(), tensor(&[1], vec![record as i64])?.into()));
            }
        }
        copy.end();
        let outputs = self.session.session.run(inputs)?;
        let v: Array3<f32> = out_array(&outputs, "estimator_out")?;
        if record == 0 {
            return Ok((v, None));
        }
        let state = PrefixStep {
            k: out_array(&outputs, "record_k")?,
            v: out_array(&outputs, "record_v")?,
            conv1: out_array(&outputs, "record_conv1")?,
            conv2: out_array(&outputs, "record_conv2")?,
        };
        Ok((v, Some(state)))
    }
}

impl Estimator for OnnxEstimator<'_> {
    fn run(&mut self, inputs: DitInputs<'_>) -> Result<Array3<f32>> {
        Ok(self.run_graph(inputs, &[], 0)?.0)
    }

    fn prefix_shape(&self) -> Option<DitCacheShape> {
        self.prefix_shape
    }

    fn run_prefixed(&mut self, inputs: DitInputs<'_>, prefix: PrefixArg<'_>) -> Result<(Array3<f32>, Option<PrefixStep>)> {
        match prefix {
            PrefixArg::Record(n) => self.run_graph(inputs, &[], n),
            PrefixArg::Use { cache, step } => {
                let state = cache.steps.get(step).ok_or_else(|| Error::Runtime(format!("prompt-prefix cache has no step {step}")))?;
                self.run_graph(inputs, &[state], 0)
            }
        }
    }
}

/// `flow_front`: `tokens` (prompt ++ speech ++ 3 look-ahead entries, −1 = zero frame) and the
/// campplus embedding → `mu` `[80, frames]` and `spks` `[80]`.
pub fn run_flow_front(session: &mut StageSession, tokens: &[i64], embedding: &[f32]) -> Result<(Array2<f32>, Vec<f32>)> {
    let inputs: Vec<(String, DynValue)> = vec![
        ("tokens".into(), tensor(&[1, tokens.len()], tokens.to_vec())?),
        ("embedding".into(), tensor(&[1, embedding.len()], embedding.to_vec())?),
    ];
    let outputs = session.session.run(inputs)?;
    let (shape, mu) = out_f32(&outputs, "flow_front", "mu")?;
    let (_, spks) = out_f32(&outputs, "flow_front", "spks")?;
    let (channels, frames) = match shape.as_slice() {
        &[1, c, f] => (c, f),
        other => return Err(Error::Runtime(format!("flow_front: mu has shape {other:?}"))),
    };
    let mu = Array2::from_shape_vec((channels, frames), mu).map_err(|e| Error::Runtime(format!("flow_front mu: {e}")))?;
    Ok((mu, spks))
}

/// `hift_decode`: mel `[1, 80, frames + 4]` and source `[1, 1, 480·s]` → waveform samples.
pub fn run_hift_decode(session: &mut StageSession, mel: Array3<f32>, source: Array3<f32>) -> Result<Vec<f32>> {
    let mel_shape = mel.shape().to_vec();
    let src_shape = source.shape().to_vec();
    let inputs: Vec<(String, DynValue)> = vec![
        ("mel".into(), tensor(&mel_shape, mel.into_raw_vec_and_offset().0)?),
        ("source".into(), tensor(&src_shape, source.into_raw_vec_and_offset().0)?),
    ];
    let outputs = session.session.run(inputs)?;
    Ok(out_f32(&outputs, "hift_decode", "waveform")?.1)
}

/// campplus: the CMN fbank `[T, 80]` → the 192-dim speaker embedding.
pub fn run_campplus(session: &mut StageSession, fbank: ArrayView2<f32>) -> Result<Vec<f32>> {
    let (t, bins) = fbank.dim();
    let input = session
        .input_names()
        .into_iter()
        .next()
        .ok_or_else(|| Error::Runtime("campplus: graph has no inputs".into()))?;
    let output = first_output(session)?;
    let inputs: Vec<(String, DynValue)> = vec![(input, tensor(&[1, t, bins], view_to_vec(fbank))?)];
    let outputs = session.session.run(inputs)?;
    Ok(out_f32(&outputs, "campplus", &output)?.1)
}

/// speech_tokenizer_v3: the whisper log-mel `[128, T]` → the prompt speech tokens. The length
/// input and the token output may be int32 or int64 (whatever the graph declares).
pub fn run_speech_tokenizer(session: &mut StageSession, whisper_mel: ArrayView2<f32>) -> Result<Vec<i64>> {
    let (n_mels, t) = whisper_mel.dim();
    let names = session.input_names();
    let (Some(feats), Some(lengths)) = (names.first(), names.get(1)) else {
        return Err(Error::Runtime("speech_tokenizer: graph needs 2 inputs (feats, feats_length)".into()));
    };
    let length_type = session.session.inputs()[1].dtype().tensor_type();
    let length_value = match length_type {
        Some(TensorElementType::Int64) => tensor(&[1], vec![t as i64])?,
        _ => tensor(&[1], vec![t as i32])?,
    };
    let output = first_output(session)?;
    let inputs: Vec<(String, DynValue)> = vec![
        (feats.clone(), tensor(&[1, n_mels, t], view_to_vec(whisper_mel))?),
        (lengths.clone(), length_value),
    ];
    let outputs = session.session.run(inputs)?;
    let v = outputs
        .get(output.as_str())
        .ok_or_else(|| Error::Runtime(format!("speech_tokenizer: no output {output}")))?;
    if let Ok((_, data)) = v.try_extract_tensor::<i64>() {
        return Ok(data.to_vec());
    }
    let (_, data) = v.try_extract_tensor::<i32>()?;
    Ok(data.iter().map(|&x| i64::from(x)).collect())
}
