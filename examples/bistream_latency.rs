//! Text-in streaming latency (issue 12): a text arrives word by word at a steady rate (as from a
//! language model); the time from its first word to the first audio, (a) with text-in streaming
//! (`Engine::submit_bistream`, each word a piece as it arrives) and (b) waiting for the whole text
//! and then submitting it as one streaming request. One process, one loaded model, alternating.
//!
//!     cargo run --release --example bistream_latency -- --model models/full-export \
//!         --voice-wav tests/fixtures/prompt_24k.wav --words-per-second 10 --runs 3

use std::time::{Duration, Instant};

use clap::Parser;
use cosy::config::{Config, LoadOptions};
use cosy::engine::{BistreamOptions, Engine, Event};
use cosy::request::{Request, Voice};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    model: std::path::PathBuf,
    #[arg(long, default_value = "tests/fixtures/prompt_24k.wav")]
    voice_wav: std::path::PathBuf,
    #[arg(long, default_value = "This recording is the voice prompt.")]
    voice_text: String,
    #[arg(long, default_value = "The old lighthouse blinked twice before the fog rolled in over the quiet harbour town, and the fishermen turned their boats toward the shore while the bells rang out across the water.")]
    text: String,
    /// How fast the words arrive.
    #[arg(long, default_value_t = 10.0)]
    words_per_second: f64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    set: Vec<String>,
}

/// Seconds from the first word to the first audio, and the audio seconds made.
fn first_audio(mut handle: cosy::engine::RequestHandle, t0: Instant) -> anyhow::Result<(Option<f64>, f64)> {
    let mut first = None;
    let mut samples = 0usize;
    while let Some(event) = handle.next_event() {
        match event {
            Event::Audio(a) => {
                first.get_or_insert(t0.elapsed().as_secs_f64());
                samples += a.len();
            }
            Event::Done(_) => break,
            // Random weights may stop before any speech: reported as no first audio.
            Event::Failed(e) => {
                eprintln!("request failed: {e}");
                break;
            }
        }
    }
    Ok((first, samples as f64 / 24_000.0))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut opts = LoadOptions::from_process_env();
    opts.flags.push(("model.dir".into(), args.model.display().to_string()));
    for kv in &args.set {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow::anyhow!("--set {kv}: KEY=VALUE"))?;
        opts.flags.push((k.into(), v.into()));
    }
    let config = Config::load(&opts)?;
    let engine = Engine::load(&config)?;
    let voice = Voice::ZeroShot { wav: args.voice_wav.clone(), transcript: args.voice_text.clone() };
    let words: Vec<String> = args.text.split_inclusive(' ').map(str::to_string).collect();
    let gap = Duration::from_secs_f64(1.0 / args.words_per_second);
    let request = |seed: u64| Request {
        text: args.text.clone(),
        voice: voice.clone(),
        text_frontend: false,
        normalization: Default::default(),
        input_format: Default::default(),
        speed: 1.0,
        seed: Some(seed),
        stream: true,
        ignore_stop_until: None,
        test_hooks: Default::default(),
    };
    // Warm-up.
    engine.submit(request(0))?.wait()?;
    for run in 0..args.runs {
        let seed = run as u64 + 1;
        // (a) text-in streaming: words fed as they "arrive".
        let t0 = Instant::now();
        let (mut feed, handle) = engine.submit_bistream(request(seed), BistreamOptions::default(), None)?;
        let feeder = {
            let words = words.clone();
            std::thread::spawn(move || {
                for (i, w) in words.into_iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(gap);
                    }
                    if feed.send(w).is_err() {
                        return;
                    }
                }
            })
        };
        let (bi_first, bi_audio) = first_audio(handle, t0)?;
        let _ = feeder.join();
        // (b) wait for the whole text, then one streaming request.
        let t0 = Instant::now();
        std::thread::sleep(gap * (words.len() as u32 - 1));
        let (whole_first, whole_audio) = first_audio(engine.submit(request(seed))?, t0)?;
        println!(
            "{}",
            serde_json::json!({
                "run": run, "words": words.len(), "words_per_second": args.words_per_second,
                "text_arrival_s": gap.as_secs_f64() * (words.len() - 1) as f64,
                "bistream_first_audio_s": bi_first, "bistream_audio_s": bi_audio,
                "whole_text_first_audio_s": whole_first, "whole_text_audio_s": whole_audio,
            })
        );
    }
    Ok(())
}
