//! Session-backed stage runners: each wraps one open [`StageSession`] and speaks the graph
//! contract of docs/model-format.md (names, dtypes, layouts).
//!
//! * The `llm` graph is run by the engine's scheduler (`crate::engine::llm_batch`), which keeps
//!   the batched KV cache in ORT values bound through an IoBinding (on the GPU with CUDA).
//! * [`OnnxEstimator`] implements [`Estimator`] for the `dit` graph.
//! * [`run_flow_front`], [`run_hift_decode`], [`run_campplus`], [`run_speech_tokenizer`]: one call each.

use ndarray::{Array2, Array3, ArrayView1, ArrayView2, ArrayView3};
use ort::value::{DynValue, Tensor, TensorElementType};

use crate::error::{Error, Result};
use crate::flow::Estimator;
use crate::profile::Profiler;
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
}

impl Estimator for OnnxEstimator<'_> {
    fn run(
        &mut self,
        x: ArrayView3<f32>,
        mask: ArrayView3<f32>,
        mu: ArrayView3<f32>,
        t: ArrayView1<f32>,
        spks: ArrayView2<f32>,
        cond: ArrayView3<f32>,
        block_frames: i64,
    ) -> Result<Array3<f32>> {
        let _call = self.profiler.span("flow.dit");
        let copy = self.profiler.span("flow.dit.copy");
        let inputs: Vec<(String, DynValue)> = vec![
            ("x".into(), tensor(x.shape(), view_to_vec(x))?),
            ("mask".into(), tensor(mask.shape(), view_to_vec(mask))?),
            ("mu".into(), tensor(mu.shape(), view_to_vec(mu))?),
            ("t".into(), tensor(t.shape(), view_to_vec(t))?),
            ("spks".into(), tensor(spks.shape(), view_to_vec(spks))?),
            ("cond".into(), tensor(cond.shape(), view_to_vec(cond))?),
            ("block_frames".into(), tensor(&[1], vec![block_frames])?),
        ];
        copy.end();
        let outputs = self.session.session.run(inputs)?;
        let (shape, data) = out_f32(&outputs, "dit", "estimator_out")?;
        let dims: [usize; 3] = shape
            .as_slice()
            .try_into()
            .map_err(|_| Error::Runtime(format!("dit: estimator_out has shape {shape:?}")))?;
        Array3::from_shape_vec(dims, data).map_err(|e| Error::Runtime(format!("dit output: {e}")))
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
