//! LLM-side logic: silent-token pruning against the golden trajectories, sampling rules, the
//! input layout and the decode loop (with a scripted fake LLM, which tests the loop's logic only).

use std::collections::VecDeque;
use std::path::PathBuf;

use cosy::llm::{
    build_llm_input, decode, log_softmax, nucleus_candidates, softmax, DenseEmbeddings, LlmConstants,
    LlmInput, LlmStep, Sampler, SamplingParams, SilentTokenFilter, Termination,
};
use cosy::Result;

use crate::common::reference_dir;

const CASES: [&str; 5] = ["en", "zh", "num", "p16k", "stream"];

fn read_tokens(path: PathBuf) -> Vec<i64> {
    let arr = cosy::npy::read(&path).expect("npy");
    arr.to_i64(&path).expect("integer npy").iter().copied().collect()
}

fn read_meta(dir: &std::path::Path, case: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(format!("golden/{case}/meta.json"))).expect("meta.json");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn silent_token_filter_reproduces_golden_speech_tokens() {
    let Some(dir) = reference_dir() else { return };
    let mut total_dropped = 0;
    for case in CASES {
        let raw = read_tokens(dir.join(format!("golden/{case}/llm_token_raw.npy")));
        let want = read_tokens(dir.join(format!("golden/{case}/speech_token.npy")));
        let mut filter = SilentTokenFilter::official();
        let got: Vec<i64> = raw.iter().copied().filter(|&t| filter.accept(t)).collect();
        assert_eq!(got, want, "case {case}");
        total_dropped += raw.len() - got.len();
    }
    // p16k drops 115 tokens (README §5.2); the other cases none.
    assert_eq!(total_dropped, 115);
}

#[test]
fn silent_filter_keeps_a_run_of_exactly_five_and_resets() {
    let out = SilentTokenFilter::filter_all(&[1, 2], 5, &[1, 2, 1, 2, 1, 7, 1, 1, 1, 1, 1, 2, 2, 9, 2]);
    assert_eq!(out, vec![1, 2, 1, 2, 1, 7, 1, 1, 1, 1, 1, 9, 2]);
}

#[test]
fn length_bounds_follow_tts_text_only() {
    let Some(dir) = reference_dir() else { return };
    let c = LlmConstants::default();
    for case in CASES {
        let meta = read_meta(&dir, case);
        let n = meta["n_text_token"].as_u64().expect("n_text_token") as usize;
        let (min_len, max_len) = c.length_bounds(n);
        assert_eq!(min_len as u64, meta["llm_min_len"].as_u64().expect("min"), "case {case}");
        assert_eq!(max_len as u64, meta["llm_max_len"].as_u64().expect("max"), "case {case}");
    }
}

/// Tables whose rows encode (table, id) so the layout of the input can be read back.
fn tagged_tables(hidden: usize, text_rows: usize, speech_rows: usize) -> DenseEmbeddings {
    let mut text = vec![0f32; text_rows * hidden];
    for (r, row) in text.chunks_exact_mut(hidden).enumerate() {
        row[0] = r as f32;
        row[1] = 1.0;
    }
    let mut speech = vec![0f32; speech_rows * hidden];
    for (r, row) in speech.chunks_exact_mut(hidden).enumerate() {
        row[0] = r as f32;
        row[1] = 2.0;
    }
    DenseEmbeddings { hidden, text, speech }
}

#[test]
fn llm_input_layout_is_sos_text_task_prompt_speech() {
    let c = LlmConstants { endofprompt_id: 50, ..LlmConstants::default() };
    let tables = tagged_tables(3, 100, 6761);
    let input = build_llm_input(&tables, &[10, 50], &[11, 12, 13], &[7, 8], &c).expect("input");
    let rows: Vec<(f32, f32)> = input.embeds.chunks_exact(3).map(|r| (r[1], r[0])).collect();
    assert_eq!(
        rows,
        vec![(2.0, 6561.0), (1.0, 10.0), (1.0, 50.0), (1.0, 11.0), (1.0, 12.0), (1.0, 13.0), (2.0, 6563.0), (2.0, 7.0), (2.0, 8.0)]
    );
    assert_eq!(input.seq_len, 9);
    assert_eq!((input.min_len, input.max_len), (6, 60));
    // <|endofprompt|> is mandatory somewhere in the text.
    assert!(build_llm_input(&tables, &[10], &[11], &[], &c).is_err());
    // An id outside the table is an error, not a panic.
    assert!(build_llm_input(&tables, &[50], &[1000], &[], &c).is_err());
}

#[test]
fn log_softmax_and_softmax_are_normalised() {
    let logits = [1.0f32, 2.0, -3.0, 0.5, 2.0];
    let logp = log_softmax(&logits);
    let total: f64 = logp.iter().map(|&v| f64::from(v).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
    let p = softmax(&logp);
    let direct: Vec<f64> = {
        let z: f64 = logits.iter().map(|&v| f64::from(v).exp()).sum();
        logits.iter().map(|&v| f64::from(v).exp() / z).collect()
    };
    for (a, b) in p.iter().zip(direct) {
        assert!((f64::from(*a) - b).abs() < 1e-6);
    }
}

#[test]
fn top_k_one_picks_the_first_maximum() {
    // Ties keep the lower index first (stable descending sort), like torch.sort(stable=True).
    let probs = [0.1f32, 0.3, 0.05, 0.3, 0.25];
    assert_eq!(nucleus_candidates(&probs, 0.8, 1), vec![(1, 0.3)]);
    let mut sampler = Sampler::new(SamplingParams::greedy(), 7);
    let mut logp = log_softmax(&[0.0, 4.0, 1.0, 4.0, -2.0]);
    assert_eq!(sampler.sample(&mut logp, &[1, 1, 1]).expect("sample"), 1);
}

#[test]
fn nucleus_includes_the_crossing_token_and_respects_top_k() {
    let probs = [0.5f32, 0.2, 0.25, 0.05];
    // cum: 0 → 0.5 (take idx 0), 0.5 < 0.8 → take idx 2 (0.75), 0.75 < 0.8 → take idx 1 (0.95, crosses).
    assert_eq!(nucleus_candidates(&probs, 0.8, 25), vec![(0, 0.5), (2, 0.25), (1, 0.2)]);
    assert_eq!(nucleus_candidates(&probs, 0.8, 2), vec![(0, 0.5), (2, 0.25)]);
    // Exactly reaching top_p stops (cum < top_p is false).
    assert_eq!(nucleus_candidates(&[0.5, 0.5], 0.5, 25), vec![(0, 0.5)]);
}

#[test]
fn nucleus_draws_only_kept_tokens_with_their_weights() {
    let params = SamplingParams { top_p: 0.8, top_k: 25, win_size: 10, tau_r: 0.1 };
    let mut sampler = Sampler::new(params, 1234);
    // probs 0.5 / 0.35 / 0.1 / 0.05: kept = {0, 1} (cum 0.85 after two), draws ~ 5:3.5.
    let logits: Vec<f32> = [0.5f32, 0.35, 0.1, 0.05].iter().map(|p| p.ln()).collect();
    let mut counts = [0usize; 4];
    for _ in 0..4000 {
        let mut logp = log_softmax(&logits);
        counts[sampler.sample(&mut logp, &[]).expect("sample") as usize] += 1;
    }
    assert_eq!(counts[2] + counts[3], 0, "tokens outside the nucleus drawn: {counts:?}");
    let ratio = counts[0] as f64 / counts[1] as f64;
    assert!((ratio - 5.0 / 3.5).abs() < 0.15, "ratio {ratio}, counts {counts:?}");
    // Same seed, same draws.
    let mut a = Sampler::new(params, 99);
    let mut b = Sampler::new(params, 99);
    for _ in 0..50 {
        let (mut la, mut lb) = (log_softmax(&logits), log_softmax(&logits));
        assert_eq!(a.sample(&mut la, &[]).expect("a"), b.sample(&mut lb, &[]).expect("b"));
    }
}

#[test]
fn ras_fallback_masks_the_repeated_token() {
    // Token 0 dominates; it occurred in the last 10 tokens, so RAS masks it and redraws from the
    // full distribution: token 0 can never come out.
    let params = SamplingParams { top_p: 0.8, top_k: 25, win_size: 10, tau_r: 0.1 };
    let mut sampler = Sampler::new(params, 5);
    let logits = [10.0f32, 1.0, 1.0, 0.0];
    for _ in 0..200 {
        let mut logp = log_softmax(&logits);
        let tok = sampler.sample(&mut logp, &[3, 0, 2]).expect("sample");
        assert_ne!(tok, 0);
        assert_eq!(logp[0], f32::NEG_INFINITY);
    }
    // Outside the window (11 tokens back) it does not count.
    let mut logp = log_softmax(&logits);
    let history = [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    assert_eq!(sampler.sample(&mut logp, &history).expect("sample"), 0);
    // The tiny reference config (top_k 1, tau_r 2.0): threshold 20 can never be met.
    let mut greedyish = Sampler::new(SamplingParams { top_p: 0.8, top_k: 1, win_size: 10, tau_r: 2.0 }, 0);
    let mut logp = log_softmax(&logits);
    assert_eq!(greedyish.sample(&mut logp, &[0; 10]).expect("sample"), 0);
}

/// A fake LLM that replays scripted logits and records what it was fed.
struct ScriptedLlm {
    script: VecDeque<Vec<f32>>,
    fed: Vec<Vec<f32>>,
    prefill_seq: Option<usize>,
}

impl ScriptedLlm {
    fn new(script: Vec<Vec<f32>>) -> Self {
        ScriptedLlm { script: script.into(), fed: Vec::new(), prefill_seq: None }
    }
    fn next(&mut self) -> Result<Vec<f32>> {
        self.script.pop_front().ok_or_else(|| cosy::Error::Runtime("script exhausted".into()))
    }
}

impl LlmStep for ScriptedLlm {
    fn prefill(&mut self, embeds: &[f32], seq: usize) -> Result<Vec<f32>> {
        assert_eq!(embeds.len() % seq, 0);
        self.prefill_seq = Some(seq);
        self.next()
    }
    fn step(&mut self, embed: &[f32]) -> Result<Vec<f32>> {
        self.fed.push(embed.to_vec());
        self.next()
    }
}

const VOCAB: usize = 6761;

/// Logits whose ranking is `order` (first = best), everything else far below.
fn ranked(order: &[usize]) -> Vec<f32> {
    let mut l = vec![-30.0f32; VOCAB];
    for (rank, &id) in order.iter().enumerate() {
        l[id] = 10.0 - rank as f32;
    }
    l
}

fn input(min_len: usize, max_len: usize, hidden: usize) -> LlmInput {
    LlmInput { embeds: vec![0.0; 4 * hidden], seq_len: 4, hidden, min_len, max_len }
}

#[test]
fn decode_emits_tokens_feeds_their_embeddings_and_stops_without_emitting_stop() {
    let tables = tagged_tables(2, 10, VOCAB);
    let c = LlmConstants::default();
    let mut llm = ScriptedLlm::new(vec![ranked(&[5]), ranked(&[17]), ranked(&[6621, 3]), ranked(&[9])]);
    let mut sampler = Sampler::new(SamplingParams::greedy(), 0);
    let mut streamed = Vec::new();
    let out = decode(&mut llm, &input(0, 100, 2), &tables, &mut sampler, &c, |t| {
        streamed.push(t);
        true
    })
    .expect("decode");
    assert_eq!(out.tokens, vec![5, 17]);
    assert_eq!(streamed, vec![5, 17]);
    assert_eq!(out.termination, Termination::StopToken(6621));
    assert_eq!(llm.prefill_seq, Some(4));
    // Steps are fed the speech-embedding rows of the emitted tokens.
    assert_eq!(llm.fed, vec![vec![5.0, 2.0], vec![17.0, 2.0]]);
}

#[test]
fn ignore_eos_masks_only_6561_before_min_len() {
    let tables = tagged_tables(2, 10, VOCAB);
    let c = LlmConstants::default();
    // Step 0: 6561 best, then 6562. Masking only 6561 lets 6562 stop decoding before min_len.
    let mut llm = ScriptedLlm::new(vec![ranked(&[6561, 6562, 4])]);
    let mut sampler = Sampler::new(SamplingParams::greedy(), 0);
    let out = decode(&mut llm, &input(10, 100, 2), &tables, &mut sampler, &c, |_| true).expect("decode");
    assert_eq!(out.termination, Termination::StopToken(6562));
    assert!(out.tokens.is_empty());
    // Step 0 with 6561 best: masked while step < min_len, so the next best (a speech token) wins;
    // at step 1 = min_len the mask is off and 6561 stops.
    let mut llm = ScriptedLlm::new(vec![ranked(&[6561, 4]), ranked(&[6561, 4])]);
    let out = decode(&mut llm, &input(1, 100, 2), &tables, &mut sampler, &c, |_| true).expect("decode");
    assert_eq!(out.tokens, vec![4]);
    assert_eq!(out.termination, Termination::StopToken(6561));
}

#[test]
fn decode_stops_at_max_len_and_on_cancel() {
    let tables = tagged_tables(2, 10, VOCAB);
    let c = LlmConstants::default();
    let mut llm = ScriptedLlm::new(vec![ranked(&[1]); 3]);
    let mut sampler = Sampler::new(SamplingParams::greedy(), 0);
    let out = decode(&mut llm, &input(0, 3, 2), &tables, &mut sampler, &c, |_| true).expect("decode");
    assert_eq!(out.tokens, vec![1, 1, 1]);
    assert_eq!(out.termination, Termination::MaxLen);
    assert_eq!(llm.fed.len(), 2, "max_len forwards: one prefill and max_len − 1 steps");

    let mut llm = ScriptedLlm::new(vec![ranked(&[1]); 5]);
    let mut n = 0;
    let out = decode(&mut llm, &input(0, 10, 2), &tables, &mut sampler, &c, |_| {
        n += 1;
        n < 2
    })
    .expect("decode");
    assert_eq!(out.tokens, vec![1, 1]);
    assert_eq!(out.termination, Termination::Cancelled);

    // Wrong logits width is an error.
    let mut llm = ScriptedLlm::new(vec![vec![0.0; 10]]);
    assert!(decode(&mut llm, &input(0, 10, 2), &tables, &mut sampler, &c, |_| true).is_err());
}

#[test]
fn extend_feeds_every_position_in_order_and_returns_the_last_logits() {
    let mut llm = ScriptedLlm::new(vec![vec![0.0; 3], vec![1.0; 3], vec![2.0; 3], vec![3.0; 3]]);
    llm.prefill(&[0.5; 4], 2).expect("prefill");
    let embeds: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let logits = llm.extend(&embeds, 3).expect("extend");
    assert_eq!(logits, vec![3.0; 3], "the logits of the last position fed");
    assert_eq!(llm.fed, vec![vec![0.0, 1.0], vec![2.0, 3.0], vec![4.0, 5.0]]);
    assert!(llm.extend(&[1.0; 5], 2).is_err(), "values that do not split into positions");
    assert!(llm.extend(&[], 0).is_err());
}
