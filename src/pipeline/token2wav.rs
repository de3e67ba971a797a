//! The token-to-wav worker of one sentence: silent-token pruning, the streaming schedule, the flow
//! (flow_front + the CFM solve through the [`DitStage`] it is given: the engine's DiT batcher) and HiFT per chunk.

use std::sync::Mutex;

use ndarray::{s, ArrayView2};

use super::{lock, DitStage, LlmStage, PromptFeatures, SegmentTrace, SynthesisObserver};
use crate::error::{Error, Result};
use crate::flow::{
    build_cond, cacheable_prefix_frames, flow_front_tokens, solve_cfm, solve_cfm_prefixed, speed_interpolate, strip_prompt,
    CfmRequest, FlowChunk, PrefixMode, StreamParams, StreamPlanner,
};
use crate::hift::{F0Predictor, HiftStream, SourceGenerator};
use crate::llm::{Sampler, SilentTokenFilter};
use crate::pipeline::constants::ModelConstants;
use crate::pipeline::stages::{run_flow_front, run_hift_decode};
use crate::profile::Profiler;
use crate::runtime::shapes::HIFT_BUCKET_STEP;
use crate::runtime::StageSession;

/// What the sentences of one request share and hand on: the sampling RNG, the streaming hop,
/// and the request's profiler (the shared one with the request's own stage clock).
pub(super) struct RequestState {
    pub(super) sampler: Sampler,
    pub(super) stream_hop: usize,
    pub(super) profiler: Profiler,
    /// Whether a chunk of this request has been made (until then a streaming chunk asks the LLM
    /// stage to hold its decoding: [`super::LlmStage::hold_decoding`]).
    pub(super) first_audio_made: bool,
}

/// The token-to-wav worker of one sentence.
pub(super) struct TokenToWav<'a> {
    pub(super) flow_front: &'a Mutex<StageSession>,
    pub(super) dit: &'a dyn DitStage,
    pub(super) hift: &'a Mutex<StageSession>,
    pub(super) prompt: &'a PromptFeatures,
    pub(super) noise: ArrayView2<'a, f32>,
    pub(super) f0: &'a F0Predictor,
    pub(super) source: SourceGenerator,
    pub(super) constants: &'a ModelConstants,
    pub(super) stream_params: StreamParams,
    /// The streaming hop this sentence starts with; updated to the hop it ends with (official
    /// `self.token_hop_len`, carried across the sentences of one request).
    pub(super) stream_hop: &'a mut usize,
    /// The request's [`RequestState::first_audio_made`].
    pub(super) first_audio_made: &'a mut bool,
    /// The LLM stage, asked to hold its decoding while this request's first chunk is made.
    pub(super) llm: &'a dyn LlmStage,
    pub(super) stream: bool,
    pub(super) speed: f64,
    /// `sentence N of M ("text…")`, for messages.
    pub(super) sentence: String,
    pub(super) filter: SilentTokenFilter,
    pub(super) observer: &'a dyn SynthesisObserver,
    pub(super) profiler: &'a Profiler,
    /// Keep the intermediates `--dump` writes (mel, f0, source, waveform); without it only the
    /// tokens and chunk sizes are kept.
    pub(super) record: bool,
    /// Set when the LLM failed: the closed token channel then means "stop", not "finish".
    pub(super) llm_failed: &'a std::sync::atomic::AtomicBool,
}

impl TokenToWav<'_> {
    /// Consumes tokens until the LLM thread hangs up; sends each chunk's new audio.
    pub(super) fn run(
        mut self,
        tokens_in: crossbeam_channel::Receiver<i64>,
        on_chunk: &mut (dyn FnMut(&[f32]) -> Result<()> + Send),
    ) -> Result<SegmentTrace> {
        let mut trace = SegmentTrace::default();
        let mut tokens: Vec<i64> = Vec::new();
        let mut planner = StreamPlanner::starting_at(self.stream_params, self.prompt.speech_token.len(), *self.stream_hop);
        let mut hift = HiftStream::new(
            self.constants.mel_dim,
            self.constants.source.nb_harmonics + 1,
            self.constants.hift_decode_left_context,
        );
        for t in tokens_in.iter() {
            if self.observer.cancelled() {
                return Err(Error::Cancelled);
            }
            if self.filter.accept(t) {
                tokens.push(t);
            }
            if self.stream {
                while let Some(chunk) = planner.next_chunk(tokens.len()) {
                    let audio = self.make_chunk(&chunk, &tokens, &mut hift, &mut trace)?;
                    on_chunk(&audio)?;
                }
            }
        }
        // The LLM is done (or failed: then its error is what the caller reports).
        if self.observer.cancelled() || self.llm_failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Cancelled);
        }
        if tokens.is_empty() {
            return Err(Error::invalid(format!(
                "{}: the LLM produced no speech tokens (with this seed it stopped at once); sampling is random: try \
                 another seed (--seed N, or \"seed\" in a request), or reword the sentence",
                self.sentence
            )));
        }
        if self.stream {
            while let Some(chunk) = planner.next_chunk(tokens.len()) {
                let audio = self.make_chunk(&chunk, &tokens, &mut hift, &mut trace)?;
                on_chunk(&audio)?;
            }
        }
        if self.stream {
            *self.stream_hop = planner.hop();
        }
        let last = planner.final_chunk(tokens.len())?;
        let audio = self.make_chunk(&last, &tokens, &mut hift, &mut trace)?;
        on_chunk(&audio)?;
        trace.speech_token = tokens;
        if self.record {
            trace.flow_mel = Some(hift.mel().to_owned());
            trace.hift_f0 = Some(hift.f0().to_vec());
            trace.hift_source = Some(hift.source().to_vec());
        }
        Ok(trace)
    }

    /// The CFM solve of one chunk. A non-final (block-causal) call uses the voice's prompt-prefix
    /// cache when the DiT has one: it continues after the cached frames, recording them first
    /// (a solve of those frames alone) on the voice's first such call.
    fn solve(
        &self,
        estimator: &mut dyn crate::flow::Estimator,
        request: &CfmRequest<'_>,
        chunk: &FlowChunk,
        prompt_frames: usize,
    ) -> Result<ndarray::Array2<f32>> {
        let c = self.constants;
        let block = chunk.block_frames as i64;
        let prefix_frames = cacheable_prefix_frames(prompt_frames, &self.stream_params);
        let store = match self.dit.prefix_store() {
            Some(store) if !chunk.finalize && block > 0 && prefix_frames > 0 && estimator.prefix_shape() == Some(store.shape()) => {
                Some(store)
            }
            _ => None,
        };
        let Some(store) = store else {
            let mut solved = solve_cfm(estimator, std::slice::from_ref(request), &c.cfm, block)?;
            return solved.pop().ok_or_else(|| Error::Runtime("flow solver returned nothing".into()));
        };
        let key = crate::pipeline::prefix_key(self.prompt);
        if let Some(cache) = store.get(&key).filter(|cache| cache.frames == prefix_frames) {
            return Ok(solve_cfm_prefixed(estimator, request, &c.cfm, block, PrefixMode::Use(&cache))?.0);
        }
        if !store.fits(store.shape().cache_bytes(prefix_frames, c.cfm.n_timesteps)) {
            tracing::debug!(prefix_frames, "the voice's prompt-prefix cache is larger than engine.prompt_cache_bytes: not kept");
            let mut solved = solve_cfm(estimator, std::slice::from_ref(request), &c.cfm, block)?;
            return solved.pop().ok_or_else(|| Error::Runtime("flow solver returned nothing".into()));
        }
        // Recorded by a solve of the cacheable frames alone, then this chunk is solved from the
        // cache like every later one: the cached path differs from the plain one by float
        // rounding (≤ 1e-5), so recording inside this chunk's own solve would make the first
        // request with a voice sound a few LSB apart from the next one with the same seed. This
        // way a request gives the same samples whether or not its voice was cached before (and
        // `cosy file --stream` the same as the server), for the same DiT work in all.
        let prefix = CfmRequest {
            mu: request.mu.slice(ndarray::s![.., ..prefix_frames]),
            spks: request.spks,
            cond: request.cond.slice(ndarray::s![.., ..prefix_frames]),
            noise: request.noise,
        };
        let (_, recorded) = solve_cfm_prefixed(estimator, &prefix, &c.cfm, block, PrefixMode::Record(prefix_frames))?;
        let cache = std::sync::Arc::new(recorded.ok_or_else(|| Error::Runtime("the DiT recorded no prompt-prefix cache".into()))?);
        tracing::debug!(frames = cache.frames, bytes = cache.bytes(), "recorded the voice's DiT prompt-prefix cache");
        let mel = solve_cfm_prefixed(estimator, request, &c.cfm, block, PrefixMode::Use(&cache))?.0;
        store.insert(key, cache);
        Ok(mel)
    }

    /// [`Self::run_chunk`]; a streaming request's first chunk holds the LLM's decoding meanwhile
    /// (when the stage does: [`LlmStage::hold_decoding`]), released before the audio is handed on.
    fn make_chunk(&mut self, chunk: &FlowChunk, tokens: &[i64], hift: &mut HiftStream, trace: &mut SegmentTrace) -> Result<Vec<f32>> {
        let llm = self.llm;
        let hold = if self.stream && !*self.first_audio_made { llm.hold_decoding() } else { None };
        let audio = self.run_chunk(chunk, tokens, hift, trace);
        drop(hold);
        *self.first_audio_made = true;
        audio
    }

    /// One flow call plus one HiFT call over the accumulated mel; returns the new samples.
    fn run_chunk(
        &mut self,
        chunk: &FlowChunk,
        tokens: &[i64],
        hift: &mut HiftStream,
        trace: &mut SegmentTrace,
    ) -> Result<Vec<f32>> {
        let c = self.constants;
        let prof = self.profiler;
        let flow_span = prof.span("flow");
        let prompt_tokens = &self.prompt.speech_token;
        let ratio = self.stream_params.token_mel_ratio;
        let prompt_frames = ratio * prompt_tokens.len();
        let ft = flow_front_tokens(prompt_tokens, &tokens[..chunk.n_tokens], chunk.finalize, self.stream_params.pre_lookahead_len);
        let (mu, spks) = prof.time("flow.front", || run_flow_front(&mut lock(self.flow_front), &ft, &self.prompt.embedding))?;
        let total = mu.ncols();
        if total != prompt_frames + chunk.mel_frames {
            return Err(Error::Runtime(format!(
                "flow_front gave {total} frames, expected {} (prompt) + {}",
                prompt_frames, chunk.mel_frames
            )));
        }
        if self.noise.ncols() < total {
            return Err(Error::invalid(format!(
                "{total} mel frames exceed the model's {}-frame flow noise; use shorter sentences",
                self.noise.ncols()
            )));
        }
        let cond = build_cond(self.prompt.feat.view(), total)?;
        let spks = ndarray::Array1::from_vec(spks);
        let request = CfmRequest { mu: mu.view(), spks: spks.view(), cond: cond.view(), noise: self.noise };
        let mut estimator = self.dit.estimator(prof)?;
        let mel_all = self.solve(estimator.as_mut(), &request, chunk, prompt_frames)?;
        let mel = strip_prompt(mel_all.view(), prompt_frames)?;
        let mut new = mel.slice(s![.., chunk.first_new_frame..]).to_owned();
        if chunk.finalize && self.speed != 1.0 && hift.mel().ncols() == 0 {
            new = speed_interpolate(new.view(), self.speed)?;
        }
        if chunk.finalize && self.record {
            trace.flow_mu = Some(mu);
            trace.flow_cond = Some(cond);
        }
        flow_span.end();
        let _hift_span = prof.span("hift");
        hift.push_mel(new.view())?;
        let mut inputs = hift.prepare(self.f0, &mut self.source, chunk.finalize, c.conv_pre_look_right, prof)?;
        let plan = inputs.plan;
        let first_frame = inputs.first_frame;
        let spf = c.source.samples_per_frame;
        // Padded outside the session's lock (other sentences' HiFT calls wait on it).
        let buckets = lock(self.hift).shape_buckets;
        if buckets {
            inputs.pad_to_bucket(hift.bucket_base(c.conv_pre_look_right), HIFT_BUCKET_STEP, spf);
        }
        let output_samples = inputs.output_samples;
        let mut wav = prof.time("hift.decode", || run_hift_decode(&mut lock(self.hift), inputs.mel, inputs.source))?;
        // A padded call's extra samples, then the plan's tail drop.
        wav.truncate(output_samples);
        let keep = wav.len().saturating_sub(plan.drop_tail_samples);
        wav.truncate(keep);
        if wav.len() + spf * first_frame != plan.total_samples {
            return Err(Error::Runtime(format!(
                "hift_decode gave {} samples from frame {first_frame}, expected {} in all",
                wav.len(),
                plan.total_samples
            )));
        }
        let out = hift.take_new(&wav, first_frame, spf);
        trace.chunk_samples.push(out.len() as i64);
        if self.record {
            trace.waveform.extend_from_slice(&out);
        }
        Ok(out)
    }
}

