//! Throughput of a long-form job (issue 33, point 5): the same chapters said into a fresh job
//! folder with `in_flight` sentences at once (`app::longform`), each sentence forced to `tokens`
//! speech tokens (test hooks) so that every run does the same work. Prints one JSON object:
//! sentences per second and audio seconds per second after the model is loaded and warm.
//!
//!     cargo run --release --example longform -- MODEL_DIR IN_FLIGHT [SENTENCES] [TOKENS] [KEY=VALUE ...]
//!
//! `bench/longform.sh` runs it for one sentence at a time and for N, and compares.

use std::ops::ControlFlow;
use std::time::Instant;

use cosy::app::longform::{Job, JobSpec};
use cosy::config::{Config, LoadOptions};
use cosy::engine::Engine;
use cosy::request::{Request, TestHooks, Voice};

const SENTENCES: [&str; 8] = [
    "The old lighthouse blinked twice before the fog rolled in.",
    "Fishing boats returned to the harbour one by one.",
    "A gull stood on the pier and watched the nets.",
    "The keeper climbed the stairs with a lamp in his hand.",
    "Rain tapped on the windows of the quiet town.",
    "Somewhere a bell rang out across the water.",
    "By midnight the wind had turned to the north.",
    "In the morning the sea was calm and grey.",
];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: longform MODEL_DIR IN_FLIGHT [SENTENCES] [TOKENS] [KEY=VALUE ...]";
    let model = args.first().ok_or_else(|| anyhow::anyhow!(usage))?;
    let in_flight: usize = args.get(1).ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let count: usize = args.get(2).map_or(Ok(24), |s| s.parse())?;
    let tokens: usize = args.get(3).map_or(Ok(60), |s| s.parse())?;
    let mut opts = LoadOptions::from_process_env();
    opts.flags.push(("model.dir".into(), model.clone()));
    for kv in args.iter().skip(4) {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow::anyhow!("{kv}: expected KEY=VALUE"))?;
        opts.flags.push((k.into(), v.into()));
    }
    opts.flags.push(("engine.max_in_flight".into(), in_flight.max(1).to_string()));
    let config = Config::load(&opts)?;
    let engine = Engine::builder(&config).test_hooks(true).build()?;
    let prompt = std::path::PathBuf::from("tests/fixtures/prompt_24k.wav");
    let mut request = Request::new("", Voice::ZeroShot { wav: prompt, transcript: "This recording is the voice prompt.".into() });
    request.test_hooks = TestHooks { min_tokens: Some(tokens), max_tokens: Some(tokens), ..TestHooks::default() };
    // Four chapters, each a paragraph of sentences.
    let per_chapter = count.div_ceil(4).max(1);
    let all: Vec<&str> = SENTENCES.iter().copied().cycle().take(count).collect();
    let chapters: Vec<(String, String)> = all.chunks(per_chapter).enumerate().map(|(i, s)| (format!("Chapter {}", i + 1), s.join(" "))).collect();
    let spec = |in_flight| JobSpec { chapters: chapters.clone(), request: request.clone(), seed: 1986, settings: Vec::new(), in_flight };

    // Warm up (sessions, graph caches) with a one-chapter job, not timed.
    let warm = tempfile::tempdir()?;
    let mut warm_spec = spec(1);
    warm_spec.chapters.truncate(1);
    Job::open(warm.path(), warm_spec, &engine)?.run(&engine, |_| ControlFlow::Break(())).ok();

    let folder = tempfile::tempdir()?;
    let mut job = Job::open(folder.path(), spec(in_flight), &engine)?;
    let (_, total) = job.sentences();
    let start = Instant::now();
    let finished = job.run(&engine, |_| ControlFlow::Continue(()))?;
    let seconds = start.elapsed().as_secs_f64();
    let samples: usize = finished.chapters.iter().flat_map(|c| &c.parts).map(|p| p.len()).sum();
    let audio_s = samples as f64 / f64::from(finished.sample_rate);
    let (llm, dit) = engine.batch_stats();
    println!(
        "{}",
        serde_json::json!({
            "in_flight": in_flight,
            "sentences": total,
            "tokens_per_sentence": tokens,
            "seconds": seconds,
            "sentences_per_s": total as f64 / seconds,
            "audio_s_per_s": audio_s / seconds,
            "llm_decode_calls": llm.decode_calls,
            "dit_calls": dit.calls,
            "peak_rss_mib": cosy::profile::peak_rss_bytes().map(|b| b as f64 / (1u64 << 20) as f64),
        })
    );
    Ok(())
}
