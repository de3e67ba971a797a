//! Load benchmark of `cosy serve` (issue 11): `c` clients on the loopback, each sending streaming
//! speech requests one after another; time to first audio byte (TTFB) p50/p95/p99, audio-seconds
//! per second, errors. With `--in-process MODEL` it also times the same request through the
//! engine in this process (time to the first audio event) alternately with the server, the
//! baseline for the server's own overhead (p50 of the paired differences). `bench/serve_load.sh` starts the server and runs the levels.
//!
//!     cargo run --release --example serve_load -- --url http://127.0.0.1:8080 --concurrency 4 \
//!         --requests 8 [--in-process models/full-export --voices voices]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::Parser;

// The tests' response reader; the benchmark reads only the status and the body.
#[allow(dead_code)]
#[path = "../tests/common/http.rs"]
mod http;

#[derive(Parser)]
struct Args {
    /// The server, e.g. http://127.0.0.1:8080
    #[arg(long)]
    url: String,
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Requests per client.
    #[arg(long, default_value_t = 8)]
    requests: usize,
    #[arg(long, default_value = "me")]
    voice: String,
    #[arg(long, default_value = "Hello there, how are you today?")]
    text: String,
    /// Also time the engine in this process on MODEL (c = 1, same text, voice and seed).
    #[arg(long, value_name = "MODEL")]
    in_process: Option<std::path::PathBuf>,
    /// The voices folder (for --in-process).
    #[arg(long, default_value = "voices")]
    voices: std::path::PathBuf,
    /// config settings for --in-process, KEY=VALUE (as the server was started with)
    #[arg(long)]
    set: Vec<String>,
    /// Force N speech tokens per request (`cosy_test.min_tokens`; the server needs
    /// `debug.test_hooks = true`): random weights otherwise stop after a token or two.
    #[arg(long)]
    min_tokens: Option<usize>,
}

/// One request's outcome: (TTFB s, total s, audio s) or an error.
fn one_request(host_port: &str, body: &str) -> Result<(f64, f64, f64), String> {
    let started = Instant::now();
    let mut s = TcpStream::connect(host_port).map_err(|e| e.to_string())?;
    s.set_nodelay(true).ok();
    s.set_read_timeout(Some(Duration::from_secs(600))).ok();
    write!(
        s,
        "POST /v1/audio/speech HTTP/1.1\r\nHost: {host_port}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let mut ttfb = None;
    loop {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if ttfb.is_none() {
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                // The server sends its head with the first audio; the first body bytes mark it.
                if raw.len() > end + 4 {
                    ttfb = Some(started.elapsed().as_secs_f64());
                }
            }
        }
    }
    let total = started.elapsed().as_secs_f64();
    let reply = http::parse_reply(&raw).ok_or("no HTTP response, or a broken chunked body")?;
    if reply.status != 200 {
        return Err(format!("HTTP {}: {}", reply.status, String::from_utf8_lossy(&reply.body)));
    }
    Ok((ttfb.unwrap_or(total), total, reply.body.len() as f64 / 2.0 / 24_000.0))
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The same request through the engine in this process and through the server, alternately
/// (so that both see the same machine state): `n` pairs of TTFBs, seconds.
fn paired(args: &Args, model: &std::path::Path, host_port: &str, body: &str, n: usize) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut opts = cosy::config::LoadOptions::from_process_env();
    opts.flags.push(("model.dir".into(), model.display().to_string()));
    opts.flags.push(("voices.dir".into(), args.voices.display().to_string()));
    for kv in &args.set {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow::anyhow!("--set {kv}: KEY=VALUE"))?;
        opts.flags.push((k.into(), v.into()));
    }
    let config = cosy::config::Config::load(&opts)?;
    let engine = cosy::engine::Engine::load(&config)?;
    let store = cosy::voice::VoiceStore::new(&config.voices.dir);
    let mut pairs = Vec::new();
    for i in 0..=n {
        let started = Instant::now();
        // As the server does per request: read the voice file, then submit.
        let voice = std::sync::Arc::new(store.load(&args.voice)?);
        let request = cosy::request::Request {
            text: args.text.clone(),
            voice: cosy::request::Voice::Saved { voice, instruction: None, lexicon: None },
            text_frontend: true,
            normalization: Default::default(),
            input_format: Default::default(),
            speed: 1.0,
            seed: Some(0),
            stream: true,
            ignore_stop_until: args.min_tokens,
            test_hooks: Default::default(),
        };
        let mut handle = engine.submit(request)?;
        let mut first = None;
        while let Some(event) = handle.next_event() {
            match event {
                cosy::engine::Event::Audio(_) => {
                    first.get_or_insert(started.elapsed().as_secs_f64());
                }
                cosy::engine::Event::Done(_) => break,
                cosy::engine::Event::Failed(e) => return Err(e.into()),
            }
        }
        let (server, _, _) = one_request(host_port, body).map_err(|e| anyhow::anyhow!("server request: {e}"))?;
        if i > 0 {
            // The first pair warms up.
            pairs.push((first.unwrap_or(f64::NAN), server));
        }
    }
    Ok(pairs)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let host_port = args.url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut body = serde_json::json!({"input": args.text, "voice": args.voice, "stream": true, "response_format": "pcm", "seed": 0});
    if let Some(n) = args.min_tokens {
        body["cosy_test"] = serde_json::json!({ "min_tokens": n });
    }
    let body = body.to_string();
    // Warm-up request.
    one_request(&host_port, &body).map_err(|e| anyhow::anyhow!("warm-up request failed: {e}"))?;
    let started = Instant::now();
    let results: Vec<Result<(f64, f64, f64), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.concurrency)
            .map(|_| scope.spawn(|| (0..args.requests).map(|_| one_request(&host_port, &body)).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let mut ttfb: Vec<f64> = results.iter().filter_map(|r| r.as_ref().ok().map(|o| o.0)).collect();
    ttfb.sort_by(f64::total_cmp);
    let audio: f64 = results.iter().filter_map(|r| r.as_ref().ok().map(|o| o.2)).sum();
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let mut out = serde_json::json!({
        "concurrency": args.concurrency,
        "requests": results.len(),
        "errors": errors.len(),
        "first_error": errors.first(),
        "ttfb_p50_ms": quantile(&ttfb, 0.5) * 1e3,
        "ttfb_p95_ms": quantile(&ttfb, 0.95) * 1e3,
        "ttfb_p99_ms": quantile(&ttfb, 0.99) * 1e3,
        "audio_s_per_s": audio / wall,
        "audio_s_per_request": audio / ttfb.len().max(1) as f64,
        "wall_s": wall,
        "min_tokens": args.min_tokens,
    });
    if let Some(model) = &args.in_process {
        let pairs = paired(&args, model, &host_port, &body, args.requests)?;
        let mut engine: Vec<f64> = pairs.iter().map(|p| p.0).collect();
        let mut server: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        let mut diff: Vec<f64> = pairs.iter().map(|p| p.1 - p.0).collect();
        for v in [&mut engine, &mut server, &mut diff] {
            v.sort_by(f64::total_cmp);
        }
        out["paired_runs"] = serde_json::Value::from(pairs.len());
        out["paired_in_process_ttfb_p50_ms"] = serde_json::Value::from(quantile(&engine, 0.5) * 1e3);
        out["paired_server_ttfb_p50_ms"] = serde_json::Value::from(quantile(&server, 0.5) * 1e3);
        out["server_overhead_p50_ms"] = serde_json::Value::from(quantile(&diff, 0.5) * 1e3);
    }
    println!("{out}");
    Ok(())
}
