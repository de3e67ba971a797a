//! Flow-side logic: the streaming schedule and HiFT call plan against the golden stream case,
//! the cond input against the golden `flow_cond`, and the CFM loop with a scripted estimator
//! (which checks the batch layout, CFG and time bookkeeping, not DiT parity).

use std::path::Path;

use cosy::flow::{
    build_cond, cosine_t_span, flow_front_tokens, plan_stream, solve_cfm, strip_prompt, CfmParams, CfmRequest,
    DitInputs, Estimator, StreamParams, MEL_DIM,
};
use cosy::hift::{plan_hift_call, HiftStream};
use ndarray::{Array1, Array2, Array3, Axis};

use crate::common::reference_dir;

const CASES: [&str; 5] = ["en", "zh", "num", "p16k", "stream"];

fn read_meta(dir: &Path, case: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(format!("golden/{case}/meta.json"))).expect("meta.json");
    serde_json::from_str(&text).expect("json")
}

fn as_usize(v: &serde_json::Value) -> usize {
    v.as_u64().expect("unsigned number") as usize
}

#[test]
fn flow_and_hift_schedule_matches_golden_calls() {
    let Some(dir) = reference_dir() else { return };
    for case in CASES {
        let meta = read_meta(&dir, case);
        let n_prompt = as_usize(&meta["n_prompt_speech_token"]);
        let n_total = as_usize(&meta["n_speech_token"]);
        let stream = meta["stream"].as_bool().expect("stream flag");
        let chunks = if stream {
            plan_stream(StreamParams::default(), n_prompt, n_total).expect("plan")
        } else {
            vec![cosy::flow::StreamPlanner::new(StreamParams::default(), n_prompt).final_chunk(n_total).expect("final")]
        };
        let flow_calls = meta["flow_calls"].as_array().expect("flow_calls");
        assert_eq!(chunks.len(), flow_calls.len(), "case {case}");
        let hift_calls = meta["hift_calls"].as_array().expect("hift_calls");
        let mut hift = HiftStream::new(MEL_DIM, 9, None);
        let mut chunk_samples = Vec::new();
        for ((chunk, call), hcall) in chunks.iter().zip(flow_calls).zip(hift_calls) {
            assert_eq!(chunk.n_tokens, as_usize(&call["token_len"]), "case {case}");
            assert_eq!(n_prompt, as_usize(&call["prompt_token_len"]));
            assert_eq!(chunk.finalize, call["finalize"].as_bool().expect("finalize"));
            let streaming = call["streaming"].as_bool().expect("streaming");
            assert_eq!(chunk.block_frames == 50, streaming, "case {case}: attention mode");
            assert_eq!(chunk.mel_frames, as_usize(&call["mel_frames"]), "case {case}");
            // HiFT runs over the accumulated new frames.
            hift.push_mel(Array2::<f32>::zeros((MEL_DIM, chunk.new_frames())).view()).expect("push");
            let acc = hift.mel().ncols();
            assert_eq!(acc, as_usize(&hcall["mel_frames"]), "case {case}");
            let plan = plan_hift_call(acc, chunk.finalize, 3, 4, 480).expect("hift plan");
            assert_eq!(plan.total_samples, as_usize(&hcall["samples"]), "case {case}");
            assert_eq!(plan.decode_frames * 480 - plan.drop_tail_samples, plan.total_samples);
            assert_eq!(plan.mel_frames + plan.zero_pad_frames, plan.decode_frames + 4);
            let fake_output = vec![0f32; plan.total_samples];
            chunk_samples.push(hift.take_new(&fake_output, 0, 480).len());
        }
        assert_eq!(chunk_samples.iter().sum::<usize>(), as_usize(&meta["n_samples"]), "case {case}");
        if stream {
            assert_eq!(chunk_samples, vec![42240, 48000, 27840]);
            let path = dir.join("golden/stream/chunk_samples.npy");
            let want: Vec<i64> =
                cosy::npy::read(&path).expect("npy").to_i64(&path).expect("ints").iter().copied().collect();
            assert_eq!(chunk_samples.iter().map(|&n| n as i64).collect::<Vec<_>>(), want);
        }
    }
}

#[test]
fn stream_planner_hops_double_to_the_maximum() {
    // P = 77 → pad 23: hops 48, 50, 100, 100; every chunk end is a multiple of 25 from the prompt start.
    let chunks = plan_stream(StreamParams::default(), 77, 400).expect("plan");
    let offsets: Vec<usize> = chunks.iter().map(|c| c.token_offset).collect();
    assert_eq!(offsets, vec![0, 48, 98, 198, 298]);
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!((77 + c.n_tokens - 3) % 25, 0);
        assert_eq!(c.new_frames(), c.mel_frames - 2 * c.token_offset);
    }
    let last = chunks.last().expect("final");
    assert!(last.finalize && last.block_frames == 0 && last.n_tokens == 400);
    // Too few tokens for any chunk: only the final call.
    assert_eq!(plan_stream(StreamParams::default(), 77, 50).expect("plan").len(), 1);
}

/// The lengths the shape buckets are chosen from (docs/model-format.md, `dit` and `hift_decode`):
/// for streaming requests with prompts of 30–200 tokens, every non-final DiT call (prompt + chunk
/// frames, and the frames after a cacheable prompt prefix) is already a whole 50-frame step, so
/// its bucket is itself; a windowed HiFT call after the first decodes `base` + whole hops.
#[test]
fn streaming_calls_sit_on_shape_buckets_except_the_first_and_final() {
    use cosy::flow::cacheable_prefix_frames;
    use cosy::runtime::shapes::{bucket_len, DIT_BUCKET_STEP, HIFT_BUCKET_STEP};
    let params = StreamParams::default();
    let (context, look) = (35usize, 4usize);
    let base = HiftStream::new(MEL_DIM, 9, Some(context)).bucket_base(look);
    assert_eq!(base, 40);
    for prompt in [30usize, 77, 87, 150, 200] {
        let chunks = plan_stream(params, prompt, 250).expect("plan");
        let prompt_frames = 2 * prompt;
        let (mut dit, mut hift) = (Vec::new(), Vec::new());
        let mut emitted = 0usize;
        for (i, c) in chunks.iter().enumerate() {
            let frames = prompt_frames + c.mel_frames;
            dit.push(frames);
            let first = emitted.saturating_sub(context);
            if c.finalize {
                hift.push(c.mel_frames - first + look);
                continue;
            }
            assert_eq!(bucket_len(frames, 0, DIT_BUCKET_STEP), frames, "prompt {prompt}: non-final DiT call of {frames} frames");
            let after_prefix = frames - cacheable_prefix_frames(prompt_frames, &params);
            assert_eq!(bucket_len(after_prefix, 0, DIT_BUCKET_STEP), after_prefix);
            let call = plan_hift_call(c.mel_frames, false, 3, look, 480).expect("plan");
            let mel_in = call.mel_frames - first;
            hift.push(mel_in);
            if i > 0 {
                assert_eq!(bucket_len(mel_in, base, HIFT_BUCKET_STEP), mel_in, "prompt {prompt}: HiFT window of {mel_in} frames");
            }
            emitted = call.total_samples / 480;
        }
        let dit_b: Vec<usize> = dit.iter().map(|&n| bucket_len(n, 0, DIT_BUCKET_STEP)).collect();
        let hift_b: Vec<usize> = hift[..hift.len() - 1].iter().map(|&n| bucket_len(n, base, HIFT_BUCKET_STEP)).collect();
        println!("prompt {prompt} tokens, 250 speech tokens: DiT frames {dit:?} -> {dit_b:?}; HiFT mel {hift:?} -> non-final {hift_b:?}");
    }
}

#[test]
fn flow_front_tokens_pad_only_final_calls() {
    assert_eq!(flow_front_tokens(&[1, 2], &[3, 4, 5, 6], true, 3), vec![1, 2, 3, 4, 5, 6, -1, -1, -1]);
    assert_eq!(flow_front_tokens(&[1, 2], &[3, 4, 5, 6], false, 3), vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn cond_matches_golden_flow_cond() {
    let Some(dir) = reference_dir() else { return };
    for case in ["en", "zh", "num", "p16k"] {
        let prompt = cosy::npy::read(&dir.join(format!("golden/{case}/prompt_feat.npy"))).expect("npy").to_f32();
        let want = cosy::npy::read(&dir.join(format!("golden/{case}/flow_cond.npy"))).expect("npy").to_f32();
        let prompt = prompt.index_axis(Axis(0), 0).into_dimensionality::<ndarray::Ix2>().expect("2d").to_owned();
        let want = want.index_axis(Axis(0), 0).into_dimensionality::<ndarray::Ix2>().expect("2d").to_owned();
        let got = build_cond(prompt.view(), want.ncols()).expect("cond");
        assert_eq!(got, want, "case {case}"); // copies and zeros only: exact
        let stripped = strip_prompt(got.view(), prompt.nrows()).expect("strip");
        assert_eq!(stripped.ncols(), want.ncols() - prompt.nrows());
        assert!(stripped.iter().all(|&v| v == 0.0));
    }
}

/// A fake estimator: conditional rows return `mu + cond + spks` (per channel), unconditional rows
/// return `x`. It asserts the batch layout the official solver builds.
struct LayoutCheckingEstimator {
    calls: Vec<f32>,
    block_frames_seen: Vec<i64>,
    n_requests: usize,
}

impl Estimator for LayoutCheckingEstimator {
    fn run(&mut self, inputs: DitInputs<'_>) -> cosy::Result<Array3<f32>> {
        let DitInputs { x, mask, mu, t, spks, cond, block_frames } = inputs;
        let n = self.n_requests;
        assert_eq!(x.dim().0, 2 * n);
        assert!(mask.iter().all(|&m| m == 1.0));
        assert!(t.iter().all(|&v| v == t[0]), "one t for every row");
        for i in 0..n {
            assert_eq!(x.index_axis(Axis(0), i), x.index_axis(Axis(0), n + i), "x shared by the CFG pair");
            assert!(mu.index_axis(Axis(0), n + i).iter().all(|&v| v == 0.0));
            assert!(cond.index_axis(Axis(0), n + i).iter().all(|&v| v == 0.0));
            assert!(spks.index_axis(Axis(0), n + i).iter().all(|&v| v == 0.0));
        }
        self.calls.push(t[0]);
        self.block_frames_seen.push(block_frames);
        let mut v = x.to_owned();
        for i in 0..n {
            for c in 0..MEL_DIM {
                for f in 0..x.dim().2 {
                    v[[i, c, f]] = mu[[i, c, f]] + cond[[i, c, f]] + spks[[i, c]];
                }
            }
        }
        Ok(v)
    }
}

#[test]
fn cfm_solver_batches_cfg_pairs_and_follows_the_schedule() {
    let frames = 7;
    let make = |seed: f32| {
        let mu = Array2::from_shape_fn((MEL_DIM, frames), |(c, f)| seed + 0.01 * c as f32 - 0.02 * f as f32);
        let cond = Array2::from_shape_fn((MEL_DIM, frames), |(c, f)| if f < 2 { 0.5 - 0.001 * c as f32 } else { 0.0 });
        let spks = Array1::from_shape_fn(MEL_DIM, |c| 0.1 * seed - 0.002 * c as f32);
        // More noise columns than frames: only the first `frames` are used.
        let noise = Array2::from_shape_fn((MEL_DIM, frames + 5), |(c, f)| ((c * 31 + f * 7) % 13) as f32 / 13.0 - 0.5);
        (mu, cond, spks, noise)
    };
    let a = make(1.0);
    let b = make(-2.0);
    let requests = [
        CfmRequest { mu: a.0.view(), spks: a.2.view(), cond: a.1.view(), noise: a.3.view() },
        CfmRequest { mu: b.0.view(), spks: b.2.view(), cond: b.1.view(), noise: b.3.view() },
    ];
    let mut est = LayoutCheckingEstimator { calls: Vec::new(), block_frames_seen: Vec::new(), n_requests: 2 };
    let out = solve_cfm(&mut est, &requests, &CfmParams::default(), 50).expect("solve");
    assert_eq!(est.calls.len(), 10);
    assert!(est.block_frames_seen.iter().all(|&b| b == 50));
    // The t fed at step k is the accumulated t, equal to the schedule up to float rounding.
    let span = cosine_t_span(10);
    for (k, &t) in est.calls.iter().enumerate() {
        assert!((t - span[k]).abs() < 1e-6, "step {k}: t {t} vs {}", span[k]);
    }
    // With v_cond = g (constant) and v_uncond = x, each step is x ← x + dt·(1.7·g − 0.7·x):
    // check against a float64 evaluation of the same recursion.
    for (req, (mu, cond, spks, noise)) in out.iter().zip([&a, &b]) {
        for c in 0..MEL_DIM {
            for f in 0..frames {
                let g = f64::from(mu[[c, f]] + cond[[c, f]] + spks[c]);
                let mut x = f64::from(noise[[c, f]]);
                for k in 0..10 {
                    let dt = f64::from(span[k + 1]) - f64::from(span[k]);
                    x += dt * (1.7 * g - 0.7 * x);
                }
                assert!((f64::from(req[[c, f]]) - x).abs() < 1e-5, "[{c},{f}] {} vs {x}", req[[c, f]]);
            }
        }
    }
    // Mismatched frame counts are refused.
    let short = make(0.0);
    let mu_short = short.0.slice(ndarray::s![.., ..5]).to_owned();
    let bad = [CfmRequest { mu: mu_short.view(), ..requests[0] }];
    assert!(solve_cfm(&mut est, &bad, &CfmParams::default(), 0).is_err());
}

/// Deterministic values in [-1, 1) (a 64-bit LCG; no CPU-dependent maths).
fn filled(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    Array2::from_shape_fn((rows, cols), |_| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
}

fn max_abs_diff(a: &Array2<f32>, b: &Array2<f32>) -> f32 {
    assert_eq!(a.dim(), b.dim());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The fixture's `dit` graph as an estimator with its prompt-prefix cache I/O.
fn fixture_dit() -> (cosy::runtime::StageSession, Option<cosy::flow::DitCacheShape>, tempfile::TempDir) {
    let model = crate::common::fixture_model();
    let cache = tempfile::tempdir().expect("tmp");
    let cfg = crate::common::config_for(&model, cache.path());
    let dir = std::sync::Arc::new(cosy::model::ModelDir::open(&model).expect("model"));
    let shape = cosy::flow::DitCacheShape::from_graph(dir.graph("dit").expect("dit graph"));
    let factory = cosy::runtime::SessionFactory::new(&cfg, dir).expect("runtime");
    (factory.open(cosy::vocab::Stage::Dit).expect("dit session"), shape, cache)
}

/// docs/model-format.md "dit prompt cache": for each prompt length class (no whole block before
/// the look-ahead, ending inside a block, an exact multiple of 50 frames, a multiple of 50 after
/// the 6 look-ahead frames) a streaming chunk that records the cache gives the mel of the plain
/// solve, and a later, longer chunk that continues after the cached frames gives the plain
/// solve's mel within 1e-5 (the graph's attention sums the same terms in another order).
#[test]
fn prompt_prefix_cache_is_exact_for_each_prompt_length_class() {
    use cosy::flow::{cacheable_prefix_frames, solve_cfm_prefixed, PrefixMode};
    let (mut session, shape, _keep) = fixture_dit();
    let profiler = cosy::profile::Profiler::disabled();
    let mut est = cosy::pipeline::stages::OnnxEstimator { session: &mut session, profiler: &profiler, prefix_shape: shape };
    let shape = shape.expect("the fixture's dit graph has the prompt-prefix cache I/O");
    let params = CfmParams::default();
    let stream = StreamParams::default();
    for (prompt_frames, want_cached) in [(40usize, 0usize), (74, 50), (100, 50), (150, 100), (156, 150)] {
        let cached = cacheable_prefix_frames(prompt_frames, &stream);
        assert_eq!(cached, want_cached, "prompt of {prompt_frames} frames");
        if cached == 0 {
            continue; // nothing a voice's requests share: the plain solve runs
        }
        let (first, later) = (prompt_frames + 56, prompt_frames + 156);
        let seed = prompt_frames as u64;
        let mu = filled(MEL_DIM, later, seed);
        let mut cond = Array2::<f32>::zeros((MEL_DIM, later));
        cond.slice_mut(ndarray::s![.., ..prompt_frames]).assign(&filled(MEL_DIM, prompt_frames, seed + 1));
        let spks = filled(1, MEL_DIM, seed + 2).row(0).to_owned();
        let noise = filled(MEL_DIM, later + 3, seed + 3);
        let request = |frames: usize| CfmRequest {
            mu: mu.slice(ndarray::s![.., ..frames]),
            spks: spks.view(),
            cond: cond.slice(ndarray::s![.., ..frames]),
            noise: noise.view(),
        };
        let plain_first = solve_cfm(&mut est, &[request(first)], &params, 50).expect("plain").remove(0);
        let (recorded, cache) =
            solve_cfm_prefixed(&mut est, &request(first), &params, 50, PrefixMode::Record(cached)).expect("record");
        let cache = std::sync::Arc::new(cache.expect("a recorded cache"));
        assert_eq!(cache.frames, cached);
        assert_eq!(cache.steps.len(), params.n_timesteps);
        assert_eq!(cache.steps[0].k.dim(), (shape.depth, 2, cached, shape.inner));
        assert_eq!(cache.bytes(), shape.cache_bytes(cached, params.n_timesteps));
        let d_record = max_abs_diff(&recorded, &plain_first);
        assert!(d_record <= 1e-5, "prompt {prompt_frames}: recording changed the mel by {d_record:e}");

        let plain_later = solve_cfm(&mut est, &[request(later)], &params, 50).expect("plain").remove(0);
        let (reused, none) = solve_cfm_prefixed(&mut est, &request(later), &params, 50, PrefixMode::Use(&cache)).expect("use");
        assert!(none.is_none());
        let d_use = max_abs_diff(&reused, &plain_later);
        println!("prompt {prompt_frames} frames, {cached} cached: record {d_record:e}, reuse {d_use:e}");
        assert!(d_use <= 1e-5, "prompt {prompt_frames}: the cached solve differs by {d_use:e}");
        // It did use the cache: a cache of another voice gives another mel.
        let mut wrong = (*cache).clone();
        wrong.steps.iter_mut().for_each(|s| s.k.mapv_inplace(|v| v * 0.5));
        let (off, _) = solve_cfm_prefixed(&mut est, &request(later), &params, 50, PrefixMode::Use(&std::sync::Arc::new(wrong)))
            .expect("use");
        assert!(max_abs_diff(&off, &plain_later) > 1e-3, "the cache's keys made no difference");
    }
}

/// Requests of different voices with caches of the same length share one DiT call: their cache
/// rows stack, a shorter request is right-padded, and each gets what it gets alone.
#[test]
fn prompt_prefix_caches_of_different_voices_batch() {
    use cosy::flow::{solve_cfm_prefixed, PrefixMode, PrefixStep};
    let (mut session, shape, _keep) = fixture_dit();
    let profiler = cosy::profile::Profiler::disabled();
    let mut est = cosy::pipeline::stages::OnnxEstimator { session: &mut session, profiler: &profiler, prefix_shape: shape };
    let params = CfmParams::default();
    let cached = 50;
    let voices: Vec<(Array2<f32>, Array2<f32>, Array1<f32>, Array2<f32>)> = (0..2u64)
        .map(|v| {
            let mut cond = Array2::<f32>::zeros((MEL_DIM, 160));
            cond.slice_mut(ndarray::s![.., ..70]).assign(&filled(MEL_DIM, 70, 10 * v + 1));
            (filled(MEL_DIM, 160, 10 * v), cond, filled(1, MEL_DIM, 10 * v + 2).row(0).to_owned(), filled(MEL_DIM, 160, 10 * v + 3))
        })
        .collect();
    let caches: Vec<_> = voices
        .iter()
        .map(|(mu, cond, spks, noise)| {
            let r = CfmRequest { mu: mu.slice(ndarray::s![.., ..100]), spks: spks.view(), cond: cond.slice(ndarray::s![.., ..100]), noise: noise.view() };
            std::sync::Arc::new(solve_cfm_prefixed(&mut est, &r, &params, 50, PrefixMode::Record(cached)).expect("record").1.expect("cache"))
        })
        .collect();
    // One Euler step (step 3) of both voices after their caches: 110 and 90 new frames.
    let lens = [110usize, 90];
    let rows = |i: usize| {
        let (mu, cond, spks, noise) = &voices[i];
        let f = cached + lens[i];
        let x = noise.slice(ndarray::s![.., cached..f]).to_owned();
        (x, mu.slice(ndarray::s![.., cached..f]).to_owned(), cond.slice(ndarray::s![.., cached..f]).to_owned(), spks.clone())
    };
    let solo: Vec<Array3<f32>> = (0..2)
        .map(|i| {
            let (x, mu, cond, spks) = rows(i);
            let f = lens[i];
            let stack2 = |a: &Array2<f32>, uncond: bool| {
                let mut o = Array3::<f32>::zeros((2, MEL_DIM, f));
                o.index_axis_mut(Axis(0), 0).assign(a);
                if !uncond {
                    o.index_axis_mut(Axis(0), 1).assign(a);
                }
                o
            };
            let mut sp = Array2::<f32>::zeros((2, MEL_DIM));
            sp.row_mut(0).assign(&spks);
            let state: &PrefixStep = &caches[i].steps[3];
            let (xs, mask, mus, t, conds) =
                (stack2(&x, false), Array3::ones((2, 1, f)), stack2(&mu, true), Array1::from_elem(2, 0.3), stack2(&cond, true));
            let inputs = DitInputs { x: xs.view(), mask: mask.view(), mu: mus.view(), t: t.view(), spks: sp.view(), cond: conds.view(), block_frames: 50 };
            est.run_graph(inputs, &[state], 0).expect("solo").0
        })
        .collect();
    // Batch order as the batcher builds it: request 0's two rows, then request 1's.
    let f = lens[0];
    let (mut x, mut mask, mut mu, mut cond) =
        (Array3::<f32>::zeros((4, MEL_DIM, f)), Array3::<f32>::zeros((4, 1, f)), Array3::<f32>::zeros((4, MEL_DIM, f)), Array3::<f32>::zeros((4, MEL_DIM, f)));
    let mut spks = Array2::<f32>::zeros((4, MEL_DIM));
    for i in 0..2 {
        let (xi, mui, condi, spksi) = rows(i);
        let n = lens[i];
        for r in [2 * i, 2 * i + 1] {
            x.slice_mut(ndarray::s![r, .., ..n]).assign(&xi);
            mask.slice_mut(ndarray::s![r, .., ..n]).fill(1.0);
        }
        mu.slice_mut(ndarray::s![2 * i, .., ..n]).assign(&mui);
        cond.slice_mut(ndarray::s![2 * i, .., ..n]).assign(&condi);
        spks.row_mut(2 * i).assign(&spksi);
    }
    let states: Vec<&PrefixStep> = caches.iter().map(|c| &c.steps[3]).collect();
    let t = Array1::from_elem(4, 0.3);
    let inputs = DitInputs { x: x.view(), mask: mask.view(), mu: mu.view(), t: t.view(), spks: spks.view(), cond: cond.view(), block_frames: 50 };
    let (batched, _) = est.run_graph(inputs, &states, 0).expect("batched");
    for i in 0..2 {
        let got = batched.slice(ndarray::s![2 * i..2 * i + 2, .., ..lens[i]]);
        let d = got.iter().zip(solo[i].iter()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(d <= 1e-5, "voice {i}: batched differs from solo by {d:e}");
    }
}

/// `runtime.shape_buckets`: a DiT call padded up to its bucket (frames right-padded, `mask` 0
/// there, output cut back) gives the unpadded call's mel within 1e-5, for a final (full
/// attention) solve, a block-causal one, and one that continues after a prompt-prefix cache.
#[test]
fn dit_shape_buckets_give_the_unpadded_mel() {
    use cosy::flow::{solve_cfm_prefixed, PrefixMode};
    use cosy::runtime::shapes::{bucket_len, DIT_BUCKET_STEP};
    let (mut session, shape, _keep) = fixture_dit();
    assert!(shape.is_some(), "the fixture's dit graph has the prompt-prefix cache I/O");
    let profiler = cosy::profile::Profiler::disabled();
    let params = CfmParams::default();
    let (prompt_frames, frames) = (74usize, 74 + 63);
    let padded = bucket_len(frames, 0, DIT_BUCKET_STEP);
    assert!(padded > frames, "the test length must need padding ({frames} -> {padded})");
    let mu = filled(MEL_DIM, frames, 7);
    let mut cond = Array2::<f32>::zeros((MEL_DIM, frames));
    cond.slice_mut(ndarray::s![.., ..prompt_frames]).assign(&filled(MEL_DIM, prompt_frames, 8));
    let spks = filled(1, MEL_DIM, 9).row(0).to_owned();
    let noise = filled(MEL_DIM, frames + 3, 10);
    let request = CfmRequest { mu: mu.view(), spks: spks.view(), cond: cond.view(), noise: noise.view() };
    let mut solve = |buckets: bool, block: i64| {
        session.shape_buckets = buckets;
        let mut est = cosy::pipeline::stages::OnnxEstimator { session: &mut session, profiler: &profiler, prefix_shape: shape };
        let plain = solve_cfm(&mut est, std::slice::from_ref(&request), &params, block).expect("solve").remove(0);
        // A cache recorded unpadded, used at the bucketed shape: the state is per frame.
        let (_, cache) = solve_cfm_prefixed(&mut est, &request, &params, 50, PrefixMode::Record(50)).expect("record");
        let cache = std::sync::Arc::new(cache.expect("cache"));
        let (cached, _) = solve_cfm_prefixed(&mut est, &request, &params, 50, PrefixMode::Use(&cache)).expect("use");
        (plain, cached)
    };
    for block in [0i64, 50] {
        let (off, off_cached) = solve(false, block);
        let (on, on_cached) = solve(true, block);
        let d = max_abs_diff(&off, &on);
        let d_cached = max_abs_diff(&off_cached, &on_cached);
        println!("dit {frames} -> {padded} frames, block {block}: max abs {d:e}, cached {d_cached:e}");
        assert!(d <= 1e-5, "block {block}: the padded DiT moved the mel by {d:e}");
        assert!(d_cached <= 1e-5, "block {block}, prompt-prefix cache: the padded DiT moved the mel by {d_cached:e}");
    }
}

/// The CPU cost of the DiT's shape buckets on the tiny model (a figure for docs/benchmarks.md,
/// not a check): final solves of a few lengths, unpadded and padded, interleaved, 5 rounds.
/// `cargo test --test synth -- --ignored dit_shape_bucket_cost --nocapture`
#[test]
#[ignore]
fn dit_shape_bucket_cost_on_cpu() {
    let (mut session, shape, _keep) = fixture_dit();
    let profiler = cosy::profile::Profiler::disabled();
    let params = CfmParams::default();
    for frames in [137usize, 224, 424, 674] {
        // Three solves interleaved: unpadded, padded to the bucket, and an unpadded solve of the
        // bucket's length (the extra frames' own cost, without the padding path).
        let padded = cosy::runtime::shapes::bucket_len(frames, 0, cosy::runtime::shapes::DIT_BUCKET_STEP);
        let (mu, cond, noise) = (filled(MEL_DIM, padded, 1), filled(MEL_DIM, padded, 2), filled(MEL_DIM, padded, 4));
        let spks = filled(1, MEL_DIM, 3).row(0).to_owned();
        let request = |n: usize| CfmRequest {
            mu: mu.slice(ndarray::s![.., ..n]),
            spks: spks.view(),
            cond: cond.slice(ndarray::s![.., ..n]),
            noise: noise.view(),
        };
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..6 {
            for (i, (buckets, n)) in [(false, frames), (true, frames), (false, padded)].into_iter().enumerate() {
                session.shape_buckets = buckets;
                let mut est = cosy::pipeline::stages::OnnxEstimator { session: &mut session, profiler: &profiler, prefix_shape: shape };
                let t = std::time::Instant::now();
                solve_cfm(&mut est, &[request(n)], &params, 0).expect("solve");
                times[i].push(t.elapsed().as_secs_f64());
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.remove(0); // warm-up round
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let [a, b, c] = times.each_mut().map(median);
        println!(
            "CPU, tiny model, final DiT solve of {frames} -> {padded} frames: unpadded {:.1} ms, padded {:.1} ms (ratio {:.3}), \
             unpadded {padded} frames {:.1} ms",
            a * 1e3,
            b * 1e3,
            b / a,
            c * 1e3
        );
    }
}

/// Which part of a padded DiT call costs on the CPU (a probe, not a check): one 150-frame call
/// with the mask all ones, with its last 13 frames masked and zero, and masked but not zero.
#[test]
#[ignore]
fn dit_padding_cost_parts_on_cpu() {
    let (mut session, shape, _keep) = fixture_dit();
    let profiler = cosy::profile::Profiler::disabled();
    let (n, real) = (150usize, 137usize);
    let full = |seed: u64| {
        let a = filled(MEL_DIM, n, seed);
        ndarray::stack(ndarray::Axis(0), &[a.view(), a.view()]).expect("rows")
    };
    let (x, mu, cond) = (full(1), full(2), full(3));
    let zero_tail = |a: &Array3<f32>| {
        let mut b = a.clone();
        b.slice_mut(ndarray::s![.., .., real..]).fill(0.0);
        b
    };
    let (xz, muz, condz) = (zero_tail(&x), zero_tail(&mu), zero_tail(&cond));
    let ones = Array3::<f32>::ones((2, 1, n));
    let mut tail = ones.clone();
    tail.slice_mut(ndarray::s![.., .., real..]).fill(0.0);
    let t = Array1::from_vec(vec![0.5f32, 0.5]);
    let spks = Array2::<f32>::zeros((2, MEL_DIM));
    /// (name, x, mask, mu, cond)
    type Case<'a> = (&'a str, &'a Array3<f32>, &'a Array3<f32>, &'a Array3<f32>, &'a Array3<f32>);
    let cases: [Case<'_>; 3] =
        [("mask ones", &x, &ones, &mu, &cond), ("masked zero tail", &xz, &tail, &muz, &condz), ("masked tail, not zero", &x, &tail, &mu, &cond)];
    let (x137, ones137, mu137, cond137) = (
        x.slice(ndarray::s![.., .., ..real]).to_owned(),
        Array3::<f32>::ones((2, 1, real)),
        mu.slice(ndarray::s![.., .., ..real]).to_owned(),
        cond.slice(ndarray::s![.., .., ..real]).to_owned(),
    );
    let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..21 {
        for (i, buckets) in [false, true].into_iter().enumerate() {
            session.shape_buckets = buckets;
            let mut est = cosy::pipeline::stages::OnnxEstimator { session: &mut session, profiler: &profiler, prefix_shape: shape };
            let inputs = DitInputs { x: x137.view(), mask: ones137.view(), mu: mu137.view(), t: t.view(), spks: spks.view(), cond: cond137.view(), block_frames: 0 };
            let start = std::time::Instant::now();
            est.run(inputs).expect("run");
            times[3 + i].push(start.elapsed().as_secs_f64());
        }
        session.shape_buckets = false;
        for (i, (_, x, mask, mu, cond)) in cases.iter().enumerate() {
            let mut est = cosy::pipeline::stages::OnnxEstimator { session: &mut session, profiler: &profiler, prefix_shape: shape };
            let inputs = DitInputs { x: x.view(), mask: mask.view(), mu: mu.view(), t: t.view(), spks: spks.view(), cond: cond.view(), block_frames: 0 };
            let start = std::time::Instant::now();
            est.run(inputs).expect("run");
            times[i].push(start.elapsed().as_secs_f64());
        }
    }
    for (i, (name, ..)) in cases.iter().enumerate() {
        let v = &mut times[i];
        v.remove(0);
        v.sort_by(f64::total_cmp);
        println!("CPU, tiny model, one 150-frame DiT call, {name}: {:.2} ms (median of 20)", v[v.len() / 2] * 1e3);
    }
    for (i, name) in ["137 frames unpadded", "137 frames padded to 150"].iter().enumerate() {
        let v = &mut times[3 + i];
        v.remove(0);
        v.sort_by(f64::total_cmp);
        println!("CPU, tiny model, one DiT call, {name}: {:.2} ms (median of 20)", v[v.len() / 2] * 1e3);
    }
}
