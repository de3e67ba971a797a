//! Concurrency benchmark of the engine (issue 10): `c` requests submitted at once to one loaded
//! model, offline or streaming, each forced to decode the same number of speech tokens. Mode
//! `llm` stops every request when its LLM is done (before any flow work), to time the LLM alone.
//!
//!     cargo run --release --example concurrency -- --model models/full-export --concurrency 8 \
//!         --tokens 100 --mode offline [--set KEY=VALUE ...]
//!
//! Prints one JSON object: aggregate LLM decode tokens/s (offline: every request's LLM runs
//! before any of its flow work, so the LLM phase is timed apart), audio-seconds per second end
//! to end, time to first audio p50/p95 per request (streaming), peak RSS, and how much the LLM
//! scheduler and the DiT batcher batched. `bench/concurrency.sh` runs the matrix, one process
//! per cell so that each peak RSS is its own.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::Parser;
use cosy::config::{Config, LoadOptions};
use cosy::engine::{Engine, Event};
use cosy::llm::Termination;
use cosy::request::{Request, SynthesisObserver, Voice};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    model: std::path::PathBuf,
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    #[arg(long, default_value_t = 100)]
    tokens: usize,
    /// offline or streaming
    #[arg(long, default_value = "offline")]
    mode: String,
    #[arg(long, default_value = "tests/fixtures/prompt_24k.wav")]
    prompt_wav: std::path::PathBuf,
    #[arg(long, default_value = "This recording is the voice prompt.")]
    prompt_text: String,
    #[arg(long, default_value = "The old lighthouse blinked twice before the fog rolled in over the quiet harbour town.")]
    text: String,
    /// config settings, KEY=VALUE
    #[arg(long)]
    set: Vec<String>,
}

/// When each request's LLM started emitting and finished.
#[derive(Default)]
struct LlmTimes {
    /// Mode `llm`: cancel the request once its LLM is done.
    stop_after_llm: bool,
    first_token: Option<Instant>,
    done: Option<Instant>,
    tokens: usize,
}

struct Timer(Mutex<LlmTimes>);

impl SynthesisObserver for Timer {
    fn llm_token(&self, _sentence: usize, _index: usize, _token: i64) {
        if let Ok(mut t) = self.0.lock() {
            t.first_token.get_or_insert_with(Instant::now);
        }
    }
    fn llm_done(&self, _sentence: usize, tokens: usize, _termination: Termination) {
        if let Ok(mut t) = self.0.lock() {
            t.done = Some(Instant::now());
            t.tokens += tokens;
        }
    }
    fn cancelled(&self) -> bool {
        self.0.lock().map(|t| t.stop_after_llm && t.done.is_some()).unwrap_or(false)
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut opts = LoadOptions::from_process_env();
    opts.flags.push(("model.dir".into(), args.model.to_string_lossy().into_owned()));
    for kv in &args.set {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow::anyhow!("--set {kv}: expected KEY=VALUE"))?;
        opts.flags.push((k.into(), v.into()));
    }
    opts.flags.push(("engine.max_in_flight".into(), args.concurrency.max(1).to_string()));
    let config = Config::load(&opts)?;
    let load = Instant::now();
    let engine = Engine::load(&config)?;
    let load_s = load.elapsed().as_secs_f64();
    let audio = cosy::frontend::audio::load_audio(&args.prompt_wav)?;
    let voice = Arc::new(engine.make_voice("bench", &audio, &args.prompt_wav, &args.prompt_text)?);
    let (stream, llm_only) = match args.mode.as_str() {
        "offline" => (false, false),
        "streaming" => (true, false),
        "llm" => (false, true),
        other => anyhow::bail!("--mode {other}: use offline, streaming or llm"),
    };
    let rate = f64::from(engine.sample_rate());
    let request = |seed: u64| Request {
        text: args.text.clone(),
        voice: Voice::Saved { voice: voice.clone(), instruction: None, lexicon: None },
        text_frontend: true,
        normalization: Default::default(),
        input_format: Default::default(),
        speed: 1.0,
        seed: Some(seed),
        stream,
        ignore_stop_until: Some(args.tokens),
        test_hooks: Default::default(),
    };
    // Warm-up: one request alone (first-run allocations, thread pools).
    let warm = Arc::new(Timer(Mutex::new(LlmTimes { stop_after_llm: llm_only, ..Default::default() })));
    match engine.submit_observed(request(0), Some(warm))?.wait() {
        Ok(_) | Err(cosy::Error::Cancelled) => {}
        Err(e) => return Err(e.into()),
    }
    let before = engine.batch_stats();

    let start = Instant::now();
    let timers: Vec<Arc<Timer>> = (0..args.concurrency)
        .map(|_| Arc::new(Timer(Mutex::new(LlmTimes { stop_after_llm: llm_only, ..Default::default() }))))
        .collect();
    let results: Vec<anyhow::Result<(f64, f64, usize)>> = std::thread::scope(|scope| {
        let runs: Vec<_> = timers
            .iter()
            .enumerate()
            .map(|(i, timer)| {
                let engine = &engine;
                let req = request(i as u64 + 1);
                let timer = timer.clone();
                scope.spawn(move || -> anyhow::Result<(f64, f64, usize)> {
                    let submitted = Instant::now();
                    let mut handle = engine.submit_observed(req, Some(timer))?;
                    let mut first_audio = None;
                    let mut samples = 0usize;
                    loop {
                        match handle.next_event() {
                            Some(Event::Audio(a)) => {
                                first_audio.get_or_insert_with(|| submitted.elapsed().as_secs_f64());
                                samples += a.len();
                            }
                            Some(Event::Done(_)) | None => break,
                            Some(Event::Failed(cosy::Error::Cancelled)) if llm_only => break,
                            Some(Event::Failed(e)) => return Err(e.into()),
                        }
                    }
                    Ok((first_audio.unwrap_or(f64::NAN), submitted.elapsed().as_secs_f64(), samples))
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("request thread panicked")))).collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let mut ttfb = Vec::new();
    let mut audio_samples = 0usize;
    for r in results {
        let (first, _, samples) = r?;
        ttfb.push(first);
        audio_samples += samples;
    }
    ttfb.sort_by(f64::total_cmp);
    let times: Vec<_> = timers.iter().map(|t| t.0.lock().map(|g| (g.first_token, g.done, g.tokens)).unwrap_or((None, None, 0))).collect();
    let llm_tokens: usize = times.iter().map(|t| t.2).sum();
    let llm_end = times.iter().filter_map(|t| t.1).max();
    let llm_s = llm_end.map(|e| e.duration_since(start).as_secs_f64()).unwrap_or(f64::NAN);
    let after = engine.batch_stats();
    let audio_s = audio_samples as f64 / rate;
    let report = serde_json::json!({
        "concurrency": args.concurrency,
        "mode": args.mode,
        "tokens_per_request": args.tokens,
        "providers": config.runtime.providers.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "precision": config.runtime.precision.to_string(),
        "load_s": load_s,
        "wall_s": wall,
        "llm_phase_s": llm_s,
        "llm_tokens": llm_tokens,
        "llm_tokens_per_s": llm_tokens as f64 / llm_s,
        "audio_s": audio_s,
        "audio_s_per_s": audio_s / wall,
        "ttfb_p50_s": percentile(&ttfb, 50.0),
        "ttfb_p95_s": percentile(&ttfb, 95.0),
        "peak_rss_mib": cosy::profile::peak_rss_bytes().map(|b| b as f64 / (1u64 << 20) as f64),
        "llm_decode_calls": after.0.decode_calls - before.0.decode_calls,
        "llm_rows_per_call": (after.0.decode_rows - before.0.decode_rows) as f64 / (after.0.decode_calls - before.0.decode_calls).max(1) as f64,
        "llm_max_rows": after.0.max_rows,
        "llm_decode_s": after.0.decode_seconds - before.0.decode_seconds,
        "llm_decode_tokens_per_s": (after.0.decode_rows - before.0.decode_rows) as f64 / (after.0.decode_seconds - before.0.decode_seconds),
        "llm_prefill_s": after.0.prefill_seconds - before.0.prefill_seconds,
        "dit_calls": after.1.calls - before.1.calls,
        "dit_requests_per_call": (after.1.requests - before.1.requests) as f64 / (after.1.calls - before.1.calls).max(1) as f64,
    });
    println!("{report}");
    Ok(())
}
