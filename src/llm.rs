//! Everything around the LLM graph except running it (cosyvoice3.md §4.1–4.4).
//!
//! * [`build_llm_input`]: the prefill embedding sequence `[sos] ++ text ++ [task_id] ++ prompt speech`
//!   and the min/max decode lengths.
//! * [`log_softmax`], [`Sampler`]: repetition-aware sampling (RAS) exactly as the official
//!   `ras_sampling`/`nucleus_sampling`, with our own seeded generator for the draws.
//! * [`decode`]: the token loop over any [`LlmStep`] (prefill once, then one embedding per step),
//!   with the official `ignore_eos` quirk, stop rule and `max_len`.
//! * [`decode_bistream`]: text-in streaming, the text arriving while speech is decoded (its
//!   schedule decided by `BistreamSchedule`, run by `BistreamRun`).
//! * [`SilentTokenFilter`]: the post-LLM silent-token pruning of `llm_job`.

use crate::error::{Error, Result};
use crate::profile::Profiler;
use crate::rng::SamplingRng;

/// Token ids and ratios that drive decoding (manifest `constants`).
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConstants {
    /// Row of the speech embedding that starts the sequence (6561).
    pub sos: i64,
    /// Row of the speech embedding between text and prompt speech (6563).
    pub task_id: i64,
    /// `<|endofprompt|>`; it must occur in prompt text ++ tts text (151646).
    pub endofprompt_id: i64,
    /// Any sampled id in `[stop_token_min, stop_token_end)` ends decoding (6561..6761).
    pub stop_token_min: i64,
    pub stop_token_end: i64,
    /// The one id masked while `step < min_len` (official quirk: 6561, which is sos, not eos).
    pub ignore_eos_masked_id: i64,
    /// `min_len = int(n_tts_text_tokens · min_token_text_ratio)`.
    pub min_token_text_ratio: f64,
    /// `max_len = int(n_tts_text_tokens · max_token_text_ratio)`.
    pub max_token_text_ratio: f64,
}

impl Default for LlmConstants {
    /// The official CosyVoice3 values.
    fn default() -> Self {
        LlmConstants {
            sos: 6561,
            task_id: 6563,
            endofprompt_id: 151_646,
            stop_token_min: 6561,
            stop_token_end: 6761,
            ignore_eos_masked_id: 6561,
            min_token_text_ratio: 2.0,
            max_token_text_ratio: 20.0,
        }
    }
}

impl LlmConstants {
    /// Whether `id` ends decoding.
    pub fn is_stop(&self, id: i64) -> bool {
        (self.stop_token_min..self.stop_token_end).contains(&id)
    }

    /// `(min_len, max_len)` from the number of tts text tokens only (the prompt text does not
    /// count), truncated like Python's `int()`.
    pub fn length_bounds(&self, n_tts_text_tokens: usize) -> (usize, usize) {
        let n = n_tts_text_tokens as f64;
        ((n * self.min_token_text_ratio) as usize, (n * self.max_token_text_ratio) as usize)
    }
}

/// Embedding rows for the LLM input. Implemented over `side.safetensors`
/// (`llm.text_embedding`, `llm.speech_embedding`) by the model loader, and by [`DenseEmbeddings`].
pub trait EmbeddingLookup {
    /// Width of one row (the LLM hidden size).
    fn hidden_size(&self) -> usize;
    /// Copies row `id` of the Qwen text embedding into `out` (`hidden_size` values).
    fn text_row(&self, id: i64, out: &mut [f32]) -> Result<()>;
    /// Copies row `id` of the speech embedding (6761 rows: speech tokens, sos, eos, task, fill…).
    fn speech_row(&self, id: i64, out: &mut [f32]) -> Result<()>;
}

/// Row-major in-memory embedding tables.
#[derive(Debug, Clone)]
pub struct DenseEmbeddings {
    pub hidden: usize,
    /// `[text_vocab, hidden]`
    pub text: Vec<f32>,
    /// `[speech_vocab, hidden]`
    pub speech: Vec<f32>,
}

impl DenseEmbeddings {
    fn row<'a>(table: &'a [f32], hidden: usize, id: i64, what: &str) -> Result<&'a [f32]> {
        let rows = table.len() / hidden.max(1);
        usize::try_from(id)
            .ok()
            .filter(|&r| r < rows)
            .map(|r| &table[r * hidden..(r + 1) * hidden])
            .ok_or_else(|| Error::invalid(format!("{what} id {id} is outside the {rows}-row embedding table")))
    }
}

impl EmbeddingLookup for DenseEmbeddings {
    fn hidden_size(&self) -> usize {
        self.hidden
    }
    fn text_row(&self, id: i64, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(Self::row(&self.text, self.hidden, id, "text token")?);
        Ok(())
    }
    fn speech_row(&self, id: i64, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(Self::row(&self.speech, self.hidden, id, "speech token")?);
        Ok(())
    }
}

/// The prefill input of one request and its decode-length bounds.
#[derive(Debug, Clone)]
pub struct LlmInput {
    /// `[seq_len, hidden]`, row-major.
    pub embeds: Vec<f32>,
    pub seq_len: usize,
    pub hidden: usize,
    /// While `step < min_len` the `ignore_eos_masked_id` logit is masked.
    pub min_len: usize,
    /// At most this many tokens are generated.
    pub max_len: usize,
}

/// Builds `[speech_emb[sos]] ++ text_emb(prompt_text ++ tts_text) ++ [speech_emb[task_id]] ++
/// speech_emb(prompt_speech)` (§4.1). There is no speaker-embedding slot. Fails when
/// `<|endofprompt|>` is in neither text, as the official code asserts.
pub fn build_llm_input<E: EmbeddingLookup + ?Sized>(
    tables: &E,
    prompt_text: &[i64],
    tts_text: &[i64],
    prompt_speech: &[i64],
    constants: &LlmConstants,
) -> Result<LlmInput> {
    let has_endofprompt =
        prompt_text.iter().chain(tts_text).any(|&t| t == constants.endofprompt_id);
    if !has_endofprompt {
        return Err(Error::invalid(format!(
            "<|endofprompt|> (id {}) is in neither the prompt text nor the text; CosyVoice3 needs \
             it (prefix the instruction, e.g. \"You are a helpful assistant.<|endofprompt|>\")",
            constants.endofprompt_id
        )));
    }
    let hidden = tables.hidden_size();
    let seq_len = 1 + prompt_text.len() + tts_text.len() + 1 + prompt_speech.len();
    let mut embeds = vec![0f32; seq_len * hidden];
    let mut rows = embeds.chunks_exact_mut(hidden);
    let mut next = || rows.next().ok_or_else(|| Error::invalid("embedding row count"));
    tables.speech_row(constants.sos, next()?)?;
    for &id in prompt_text.iter().chain(tts_text) {
        tables.text_row(id, next()?)?;
    }
    tables.speech_row(constants.task_id, next()?)?;
    for &id in prompt_speech {
        tables.speech_row(id, next()?)?;
    }
    let (min_len, max_len) = constants.length_bounds(tts_text.len());
    Ok(LlmInput { embeds, seq_len, hidden, min_len, max_len })
}

/// `log_softmax` in float32 with torch's op order: `(x − max) − ln Σ exp(x − max)`.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| f64::from((x - max).exp())).sum();
    let log_sum = (sum as f32).ln();
    logits.iter().map(|&x| (x - max) - log_sum).collect()
}

/// `softmax` in float32 with torch's op order: `exp(x − max) · (1 / Σ)`.
pub fn softmax(scores: &[f32]) -> Vec<f32> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut out: Vec<f32> = scores.iter().map(|&x| (x - max).exp()).collect();
    let sum: f64 = out.iter().map(|&p| f64::from(p)).sum();
    let inv = 1.0f32 / sum as f32;
    out.iter_mut().for_each(|p| *p *= inv);
    out
}

/// RAS parameters (manifest `constants.sampling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub top_p: f32,
    pub top_k: usize,
    pub win_size: usize,
    pub tau_r: f64,
}

impl Default for SamplingParams {
    /// The official values: top_p 0.8, top_k 25, win_size 10, tau_r 0.1.
    fn default() -> Self {
        SamplingParams { top_p: 0.8, top_k: 25, win_size: 10, tau_r: 0.1 }
    }
}

impl SamplingParams {
    /// Greedy decoding expressed as RAS: one candidate and a repetition threshold that is never met.
    pub fn greedy() -> Self {
        SamplingParams { top_p: 0.8, top_k: 1, win_size: 10, tau_r: f64::INFINITY }
    }
}

/// The nucleus candidates of `probs`: indices in descending probability (stable: ties keep the
/// lower index first), taken while `cum < top_p` and `count < top_k`, so the token that crosses
/// `top_p` is included. `cum` is a float32 running sum, compared with `top_p` as float32, as the
/// official loop does with 0-dim float32 tensors.
pub fn nucleus_candidates(probs: &[f32], top_p: f32, top_k: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    // slice::sort_by is stable; descending by probability.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let mut kept = Vec::with_capacity(top_k.min(probs.len()));
    let mut cum = 0f32;
    for idx in order {
        if cum < top_p && kept.len() < top_k {
            cum += probs[idx];
            kept.push((idx, probs[idx]));
        } else {
            break;
        }
    }
    kept
}

/// Repetition-aware sampler with its own seeded generator.
#[derive(Clone)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: SamplingRng,
}

impl Sampler {
    pub fn new(params: SamplingParams, seed: u64) -> Self {
        Sampler { params, rng: SamplingRng::new(seed) }
    }

    /// Draws one index from unnormalised weights (`torch.multinomial` semantics: zero weights are
    /// never drawn). A single candidate is returned without consuming a draw.
    fn multinomial(&mut self, candidates: &[(usize, f32)]) -> Result<usize> {
        let positive: Vec<&(usize, f32)> = candidates.iter().filter(|(_, p)| *p > 0.0).collect();
        match positive.as_slice() {
            [] => Err(Error::invalid("sampling: every candidate has probability 0")),
            [(only, _)] => Ok(*only),
            _ => {
                let total: f64 = positive.iter().map(|(_, p)| f64::from(*p)).sum();
                let target = self.rng.uniform() * total;
                let mut cum = 0f64;
                for (idx, p) in &positive {
                    cum += f64::from(*p);
                    if target < cum {
                        return Ok(*idx);
                    }
                }
                Ok(positive[positive.len() - 1].0)
            }
        }
    }

    /// Official `ras_sampling` over log-probabilities `logp` (modified in place, as the official
    /// code does: a repeated id is set to −inf before the fallback draw). `decoded` holds the
    /// tokens this request has emitted so far (unpruned).
    pub fn sample(&mut self, logp: &mut [f32], decoded: &[i64]) -> Result<i64> {
        let probs = softmax(logp);
        let kept = nucleus_candidates(&probs, self.params.top_p, self.params.top_k);
        let drawn = self.multinomial(&kept)?;
        let window = &decoded[decoded.len().saturating_sub(self.params.win_size)..];
        let repeats = window.iter().filter(|&&t| t == drawn as i64).count();
        if repeats as f64 >= self.params.win_size as f64 * self.params.tau_r {
            logp[drawn] = f32::NEG_INFINITY;
            let probs = softmax(logp);
            let all: Vec<(usize, f32)> = probs.into_iter().enumerate().collect();
            return Ok(self.multinomial(&all)? as i64);
        }
        Ok(drawn as i64)
    }
}

/// One LLM forward over the exported graph (prefill once, then one embedding per step), keeping
/// its own KV cache. Both return the logits `[speech_vocab]` of the last position.
pub trait LlmStep {
    /// Runs the whole prefill sequence `embeds` (`[seq, hidden]`, row-major) from an empty cache.
    fn prefill(&mut self, embeds: &[f32], seq: usize) -> Result<Vec<f32>>;
    /// Feeds one embedding (`[hidden]`) after the cached positions.
    fn step(&mut self, embed: &[f32]) -> Result<Vec<f32>>;
    /// Feeds `seq` embeddings (`[seq, hidden]`, row-major) after the cached positions; the logits
    /// of the last one. The graph is causal, so this is `seq` steps, one position at a time (an
    /// implementation may run them as one call). Text-in streaming feeds text this way mid-decode.
    fn extend(&mut self, embeds: &[f32], seq: usize) -> Result<Vec<f32>> {
        if seq == 0 || !embeds.len().is_multiple_of(seq) {
            return Err(Error::Runtime(format!("llm: {} embedding values for {seq} positions", embeds.len())));
        }
        let hidden = embeds.len() / seq;
        let mut logits = Vec::new();
        for embed in embeds.chunks_exact(hidden) {
            logits = self.step(embed)?;
        }
        Ok(logits)
    }
}

/// Why decoding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// A stop id was sampled (not emitted).
    StopToken(i64),
    /// `max_len` tokens were emitted.
    MaxLen,
    /// The token callback asked to stop.
    Cancelled,
}

/// All tokens emitted (before silent-token pruning) and why decoding ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeOutcome {
    pub tokens: Vec<i64>,
    pub termination: Termination,
}

/// The decoding loop of `inference_wrapper` (HF path, §4.2): prefill, then per step log-softmax,
/// the `ignore_eos` mask while `step < min_len` (only `ignore_eos_masked_id`), RAS, stop on any id
/// in the stop range, at most `max_len` tokens. Every emitted token is passed to `on_token`
/// as soon as it is sampled; returning `false` cancels.
pub fn decode<S, E, F>(
    llm: &mut S,
    input: &LlmInput,
    tables: &E,
    sampler: &mut Sampler,
    constants: &LlmConstants,
    on_token: F,
) -> Result<DecodeOutcome>
where
    S: LlmStep + ?Sized,
    E: EmbeddingLookup + ?Sized,
    F: FnMut(i64) -> bool,
{
    decode_with(llm, input, tables, sampler, constants, &DecodeOptions::default(), &Profiler::disabled(), on_token)
}

/// Knobs of [`decode_with`] that are not part of the official algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Benchmark/test knob, NOT the official behaviour: decode exactly this many tokens — every
    /// stop id (the whole `[stop_token_min, stop_token_end)` range) is masked and decoding ends at
    /// this count — so random-weight models produce a known amount of work, the same on every
    /// side of a comparison. 0 = off (the official loop).
    pub ignore_stop_until: usize,
}

/// [`decode`] with [`DecodeOptions`], recording `llm.prefill`, `llm.decode` (one span per step)
/// and `llm.sampling` into `profiler` (free when it is disabled).
#[allow(clippy::too_many_arguments)]
pub fn decode_with<S, E, F>(
    llm: &mut S,
    input: &LlmInput,
    tables: &E,
    sampler: &mut Sampler,
    constants: &LlmConstants,
    options: &DecodeOptions,
    profiler: &Profiler,
    mut on_token: F,
) -> Result<DecodeOutcome>
where
    S: LlmStep + ?Sized,
    E: EmbeddingLookup + ?Sized,
    F: FnMut(i64) -> bool,
{
    let mut tokens: Vec<i64> = Vec::new();
    let mut embed = vec![0f32; input.hidden];
    let vocab = usize::try_from(constants.stop_token_end).unwrap_or(0);
    let max_len = if options.ignore_stop_until > 0 { options.ignore_stop_until } else { input.max_len };
    let stop_range = usize::try_from(constants.stop_token_min).unwrap_or(vocab)..vocab;
    for step in 0..max_len {
        let logits = if step == 0 {
            profiler.time("llm.prefill", || llm.prefill(&input.embeds, input.seq_len))?
        } else {
            profiler.time("llm.decode", || llm.step(&embed))?
        };
        let sampling_span = profiler.span("llm.sampling");
        if logits.len() != vocab {
            return Err(Error::Runtime(format!(
                "llm returned {} logits, expected {vocab}",
                logits.len()
            )));
        }
        let mut logp = log_softmax(&logits);
        if step < input.min_len {
            if let Some(v) = usize::try_from(constants.ignore_eos_masked_id).ok().and_then(|i| logp.get_mut(i)) {
                *v = f32::NEG_INFINITY;
            }
        }
        if step < options.ignore_stop_until {
            if let Some(stops) = logp.get_mut(stop_range.clone()) {
                stops.fill(f32::NEG_INFINITY);
            }
        }
        let top = sampler.sample(&mut logp, &tokens)?;
        sampling_span.end();
        if constants.is_stop(top) {
            return Ok(DecodeOutcome { tokens, termination: Termination::StopToken(top) });
        }
        tokens.push(top);
        if !on_token(top) {
            return Ok(DecodeOutcome { tokens, termination: Termination::Cancelled });
        }
        if step + 1 < max_len {
            tables.speech_row(top, &mut embed)?;
        }
    }
    Ok(DecodeOutcome { tokens, termination: Termination::MaxLen })
}

/// Text tokens and prompt speech tokens interleaved `5 : 15` by text-in streaming (the official
/// `mix_ratio`), and the fill token's period (15 speech tokens, then a fill).
pub const MIX_RATIO: (usize, usize) = (5, 15);

impl LlmConstants {
    /// The speech vocabulary's size: ids below it are speech tokens (6561).
    pub fn speech_token_size(&self) -> i64 {
        self.stop_token_min
    }
    /// The end of speech in text-in streaming (`speech_token_size + 1`).
    pub fn eos_token(&self) -> i64 {
        self.stop_token_min + 1
    }
    /// "More text, please" in text-in streaming (`speech_token_size + 3`).
    pub fn fill_token(&self) -> i64 {
        self.stop_token_min + 3
    }
}

/// Text-in streaming (the official `inference_bistream` for CosyVoice3): the text arrives token
/// by token from `text` while speech is decoded. The schedule, step by step as the official code:
/// 1. The input starts as `sos` and the prompt text up to and including `<|endofprompt|>`; the
///    rest of the prompt text starts the text queue.
/// 2. For every text token that arrives: while prompt speech tokens remain and 5 text tokens are
///    queued, 5 text and (up to) 15 prompt speech embeddings are appended to the input.
/// 3. Once the prompt speech is used up: after a fill token (or before any output when the input
///    is `sos` alone), 5 queued text tokens are needed (else wait for more text) and become the
///    next input. Then decode: the forward pass, log-softmax; at the fill index (forced every 16
///    tokens, counted from the prompt speech length) the fill token is taken without sampling,
///    otherwise RAS with id `speech_token_size` masked; a fill ends this round (it is not fed back
///    and not emitted), a speech token is emitted and fed back, any other id is an error.
/// 4. When the text ends: the queued text and `task_id` are appended, then decoding runs (nothing
///    masked) until the end-of-speech token. Any other stop-range id also ends the speech (the
///    official code raises there, with the same tokens out).
///
/// `max_len` bounds the emitted speech tokens (the official loop has no bound; a model that
/// never ends would run forever there). Every emitted token goes to `on_token` (false cancels).
/// The returned tokens include the fill tokens, in order, as the official `out_tokens`.
#[allow(clippy::too_many_arguments)]
pub fn decode_bistream<S, E, T, F>(
    llm: &mut S,
    tables: &E,
    sampler: &mut Sampler,
    constants: &LlmConstants,
    prompt_text: &[i64],
    prompt_speech: &[i64],
    text: T,
    max_len: usize,
    profiler: &Profiler,
    on_token: F,
) -> Result<DecodeOutcome>
where
    S: LlmStep + ?Sized,
    E: EmbeddingLookup + ?Sized,
    T: IntoIterator<Item = Result<i64>>,
    F: FnMut(i64) -> bool,
{
    let fill = constants.fill_token();
    let Some(eop) = prompt_text.iter().position(|&t| t == constants.endofprompt_id) else {
        return Err(Error::invalid(format!(
            "<|endofprompt|> (id {}) is not in the prompt text; text-in streaming needs it there (CosyVoice3 asserts it)",
            constants.endofprompt_id
        )));
    };
    let mut schedule = BistreamSchedule::new(&prompt_text[eop + 1..], prompt_speech);
    let mut run = BistreamRun::new(llm, tables, constants, max_len, profiler, on_token);
    run.push(Row::Speech(constants.sos))?;
    for &id in &prompt_text[..=eop] {
        run.push(Row::Text(id))?;
    }
    // Steps 2 and 3, for every text token that arrives.
    for next in text {
        schedule.queue_text(next?);
        for row in schedule.mix_prompt() {
            run.push(row)?;
        }
        if !schedule.prompt_paired() {
            continue;
        }
        let after_fill = run.ended_with(fill);
        let Some(round_text) = schedule.round_text(after_fill || run.only_sos_pending()) else { continue };
        if after_fill {
            run.input.clear();
        }
        for id in round_text {
            run.push(Row::Text(id))?;
        }
        if let Some(termination) = run.decode_round(&mut schedule, sampler, constants)? {
            return Ok(run.outcome(termination));
        }
    }
    // Step 4: the text has ended: the rest of it and the task token, then decode to the end of
    // speech. After a round that ended with a fill token, the official input still holds that
    // round's last rows (already in the cache): they go in again, ahead of the text.
    if run.ended_with(fill) {
        run.input = run.last_fed.clone();
    }
    for id in schedule.rest_of_text() {
        run.push(Row::Text(id))?;
    }
    // Prompt speech that never found 5 text tokens to pair with is not fed (as the official code).
    run.push(Row::Speech(constants.task_id))?;
    let termination = run.decode_to_end(sampler, constants)?;
    Ok(run.outcome(termination))
}

/// One row of the LLM's input: a text token or a speech-side token (speech, sos, task).
enum Row {
    Text(i64),
    Speech(i64),
}

/// What text-in streaming feeds the LLM and when, apart from running it ([`decode_bistream`],
/// steps 2 and 3): the text queued, the prompt speech not yet paired with text, and where the
/// next fill token is forced.
struct BistreamSchedule {
    text: std::collections::VecDeque<i64>,
    prompt_speech: std::collections::VecDeque<i64>,
    /// The output index at which the next fill token is taken without sampling.
    next_fill: usize,
}

impl BistreamSchedule {
    /// The fill token's period: `MIX_RATIO.1` speech tokens, then a fill.
    const FILL_PERIOD: usize = MIX_RATIO.1 + 1;

    /// `text`: the prompt text after `<|endofprompt|>`; the first fill is forced where the
    /// official code puts it, counted from the prompt speech's length.
    fn new(text: &[i64], prompt_speech: &[i64]) -> Self {
        let (_, mix_speech) = MIX_RATIO;
        let n = prompt_speech.len();
        BistreamSchedule {
            text: text.iter().copied().collect(),
            prompt_speech: prompt_speech.iter().copied().collect(),
            next_fill: (n / mix_speech + 1) * mix_speech - n,
        }
    }

    fn queue_text(&mut self, id: i64) {
        self.text.push_back(id);
    }

    /// Step 2: while prompt speech remains and 5 text tokens are queued, 5 text rows and (up to)
    /// 15 prompt speech rows.
    fn mix_prompt(&mut self) -> Vec<Row> {
        let (mix_text, mix_speech) = MIX_RATIO;
        let mut rows = Vec::new();
        while !self.prompt_speech.is_empty() && self.text.len() >= mix_text {
            rows.extend(self.text.drain(..mix_text).map(Row::Text));
            let n = mix_speech.min(self.prompt_speech.len());
            rows.extend(self.prompt_speech.drain(..n).map(Row::Speech));
        }
        rows
    }

    /// Whether all the prompt speech went in (decoding starts only then).
    fn prompt_paired(&self) -> bool {
        self.prompt_speech.is_empty()
    }

    /// Step 3, before a round: the text tokens that start it. A round that `needs_text` (after a
    /// fill token, or with `sos` alone) takes 5 queued ones, or waits for more text (`None`);
    /// another starts with none.
    fn round_text(&mut self, needs_text: bool) -> Option<Vec<i64>> {
        let (mix_text, _) = MIX_RATIO;
        if !needs_text {
            return Some(Vec::new());
        }
        (self.text.len() >= mix_text).then(|| self.text.drain(..mix_text).collect())
    }

    /// Whether the output token at index `at` is a fill token taken without sampling.
    fn fill_forced_at(&self, at: usize) -> bool {
        at == self.next_fill
    }

    /// A fill token (forced or sampled) at output index `at`: the next is forced a period later.
    fn filled_at(&mut self, at: usize) {
        self.next_fill = at + Self::FILL_PERIOD;
    }

    /// Step 4: the text still queued when the text ends.
    fn rest_of_text(&mut self) -> Vec<i64> {
        self.text.drain(..).collect()
    }
}

/// Runs the LLM for [`decode_bistream`]: the input rows pending, the forward passes, the tokens
/// out and to the caller.
struct BistreamRun<'a, S: ?Sized, E: ?Sized, F> {
    llm: &'a mut S,
    tables: &'a E,
    profiler: &'a Profiler,
    hidden: usize,
    vocab: usize,
    /// The pending input rows, fed at the next forward pass.
    input: Vec<f32>,
    /// The rows of the latest forward pass: the official code keeps them as its `lm_input` after
    /// a fill token ends a round, and feeds them once more when the text ends right then.
    last_fed: Vec<f32>,
    started: bool,
    /// Every token out, fill tokens included (the official `out_tokens`).
    out: Vec<i64>,
    /// Speech tokens given to `on_token`, at most `max_len`.
    emitted: usize,
    max_len: usize,
    on_token: F,
}

impl<'a, S, E, F> BistreamRun<'a, S, E, F>
where
    S: LlmStep + ?Sized,
    E: EmbeddingLookup + ?Sized,
    F: FnMut(i64) -> bool,
{
    fn new(llm: &'a mut S, tables: &'a E, constants: &LlmConstants, max_len: usize, profiler: &'a Profiler, on_token: F) -> Self {
        BistreamRun {
            llm,
            hidden: tables.hidden_size(),
            tables,
            profiler,
            vocab: usize::try_from(constants.stop_token_end).unwrap_or(0),
            input: Vec::new(),
            last_fed: Vec::new(),
            started: false,
            out: Vec::new(),
            emitted: 0,
            max_len,
            on_token,
        }
    }

    fn push(&mut self, row: Row) -> Result<()> {
        let at = self.input.len();
        self.input.resize(at + self.hidden, 0.0);
        match row {
            Row::Text(id) => self.tables.text_row(id, &mut self.input[at..]),
            Row::Speech(id) => self.tables.speech_row(id, &mut self.input[at..]),
        }
    }

    /// Whether the last token out was `id`.
    fn ended_with(&self, id: i64) -> bool {
        self.out.last() == Some(&id)
    }

    /// Nothing decoded yet and `sos` the only row pending.
    fn only_sos_pending(&self) -> bool {
        self.out.is_empty() && self.input.len() == self.hidden && !self.started
    }

    /// The pending rows through the LLM (prefill the first time, then one step or an extension).
    fn forward(&mut self) -> Result<Vec<f32>> {
        let seq = self.input.len() / self.hidden;
        let (llm, input, profiler) = (&mut *self.llm, &self.input, self.profiler);
        let logits = if !self.started {
            self.started = true;
            profiler.time("llm.prefill", || llm.prefill(input, seq))?
        } else if seq == 1 {
            profiler.time("llm.decode", || llm.step(input))?
        } else {
            profiler.time("llm.decode", || llm.extend(input, seq))?
        };
        std::mem::swap(&mut self.input, &mut self.last_fed);
        self.input.clear();
        if logits.len() != self.vocab {
            return Err(Error::Runtime(format!("llm returned {} logits, expected {}", logits.len(), self.vocab)));
        }
        Ok(logits)
    }

    /// A speech token out: to the caller, then fed back; `Some` when decoding ends here.
    fn emit(&mut self, top: i64) -> Result<Option<Termination>> {
        self.emitted += 1;
        if !(self.on_token)(top) {
            return Ok(Some(Termination::Cancelled));
        }
        if self.emitted >= self.max_len {
            return Ok(Some(Termination::MaxLen));
        }
        self.push(Row::Speech(top))?;
        Ok(None)
    }

    fn outcome(self, termination: Termination) -> DecodeOutcome {
        DecodeOutcome { tokens: self.out, termination }
    }

    /// Step 3's decoding, one round: the fill token at its forced index, otherwise RAS with
    /// `speech_token_size` masked, until a fill token asks for more text (`None`) or the speech
    /// ends (`Some`).
    fn decode_round(&mut self, schedule: &mut BistreamSchedule, sampler: &mut Sampler, constants: &LlmConstants) -> Result<Option<Termination>> {
        let speech_size = constants.speech_token_size();
        let fill = constants.fill_token();
        let profiler = self.profiler;
        loop {
            let logits = self.forward()?;
            let _sampling = profiler.span("llm.sampling");
            let mut logp = log_softmax(&logits);
            let top = if schedule.fill_forced_at(self.out.len()) {
                fill
            } else {
                if let Some(v) = usize::try_from(speech_size).ok().and_then(|i| logp.get_mut(i)) {
                    *v = f32::NEG_INFINITY;
                }
                sampler.sample(&mut logp, &self.out)?
            };
            if top == fill {
                schedule.filled_at(self.out.len());
            }
            self.out.push(top);
            if top == fill {
                return Ok(None);
            }
            if top >= speech_size {
                return Ok(Some(Self::unexpected(top)));
            }
            if let Some(termination) = self.emit(top)? {
                return Ok(Some(termination));
            }
        }
    }

    /// Step 4's decoding (nothing masked) until the end-of-speech token.
    fn decode_to_end(&mut self, sampler: &mut Sampler, constants: &LlmConstants) -> Result<Termination> {
        let profiler = self.profiler;
        loop {
            let logits = self.forward()?;
            let _sampling = profiler.span("llm.sampling");
            let mut logp = log_softmax(&logits);
            let top = sampler.sample(&mut logp, &self.out)?;
            self.out.push(top);
            if top == constants.eos_token() {
                return Ok(Termination::StopToken(top));
            }
            if top >= constants.speech_token_size() {
                return Ok(Self::unexpected(top));
            }
            if let Some(termination) = self.emit(top)? {
                return Ok(termination);
            }
        }
    }

    /// Another id of the stop range ends the speech: the official code raises there (its LLM
    /// thread dies and the audio of the tokens so far is what comes out), so the tokens are the
    /// same; here it is an ordinary end.
    fn unexpected(id: i64) -> Termination {
        tracing::debug!("text-in streaming: the LLM produced stop-range id {id}; the speech ends there (the official code raises)");
        Termination::StopToken(id)
    }
}

/// The official silent-token filter between LLM and flow (§4.4): a token from the silent list is
/// dropped once more than `max_run` consecutive silent tokens have been seen; any other token
/// resets the run. The LLM itself still conditions on dropped tokens.
#[derive(Debug, Clone)]
pub struct SilentTokenFilter {
    silent: Vec<i64>,
    max_run: usize,
    run: usize,
}

impl SilentTokenFilter {
    pub fn new(silent: &[i64], max_run: usize) -> Self {
        SilentTokenFilter { silent: silent.to_vec(), max_run, run: 0 }
    }

    /// The CosyVoice3 list `[1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323]`, run limit 5.
    pub fn official() -> Self {
        Self::new(&[1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323], 5)
    }

    /// Whether `token` goes on to the flow.
    pub fn accept(&mut self, token: i64) -> bool {
        if self.silent.contains(&token) {
            self.run += 1;
            self.run <= self.max_run
        } else {
            self.run = 0;
            true
        }
    }

    /// Filters a whole sequence (fresh state).
    pub fn filter_all(silent: &[i64], max_run: usize, tokens: &[i64]) -> Vec<i64> {
        let mut f = Self::new(silent, max_run);
        tokens.iter().copied().filter(|&t| f.accept(t)).collect()
    }
}
