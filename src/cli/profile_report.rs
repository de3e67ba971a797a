//! `cosy profile`: load a model under one provider × precision setting, run a request a few times
//! with the span recorder on, and report per-stage wall time, time to first audio, RTF, speech
//! tokens/s and memory — as a table, as JSON, and as a Chrome trace.
//!
//! Every number comes from spans the pipeline records (`cosy::profile::STAGE_KEYS`) or from the
//! caller's own clock around the engine request (total, time to first audio). Offline, the
//! top-level stages (frontend, llm, flow, hift) run one after another, so they add up to the total;
//! the remainder is reported as `unaccounted_ms`. The stage breakdown shown is that of the median
//! run (by total time), so it adds up; p50/p95 pool every call of every measured run. Streaming overlaps the LLM with flow/HiFT, so
//! there the stage times add up to more than the total (`overlapped: true`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use cosy::config::Config;
use cosy::error::{Error, Result};
use cosy::request::Request;
use cosy::profile::{
    chrome_trace, median, peak_rss_bytes, summarize, top_level_keys, Profiler, SpanEvent,
    SpanStats, STAGE_KEYS,
};
use cosy::vocab::{Precision, ProviderKind};

/// The run whose total is the median (for an even count the slower middle one, so a report never
/// flatters).
fn median_run(runs: &[RunReport]) -> Option<&RunReport> {
    let mut order: Vec<&RunReport> = runs.iter().collect();
    order.sort_by(|a, b| a.total_ms.total_cmp(&b.total_ms));
    order.get(runs.len() / 2).copied()
}

/// What to run and how often.
#[derive(Debug, Clone)]
pub struct ProfilePlan {
    pub request: Request,
    pub runs: usize,
    pub warmup: usize,
}

/// One provider × precision setting of `--matrix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub provider: ProviderKind,
    pub precision: Precision,
}

impl Setting {
    /// `cpu:fp32`, `cuda:fp16`, `tensorrt:fp16`, …
    pub fn parse(s: &str) -> Result<Setting> {
        let (p, q) = s
            .split_once(':')
            .or_else(|| s.split_once('-'))
            .unwrap_or((s, "fp32"));
        let provider = ProviderKind::parse(p.trim()).ok_or_else(|| {
            Error::invalid(format!(
                "--matrix setting {s:?}: unknown provider {p:?} (cpu, cuda, tensorrt, tensorrt-rtx)"
            ))
        })?;
        let precision = Precision::parse(q.trim()).ok_or_else(|| {
            Error::invalid(format!(
                "--matrix setting {s:?}: unknown precision {q:?} ({})",
                Precision::ALLOWED
            ))
        })?;
        Ok(Setting {
            provider,
            precision,
        })
    }

    pub fn label(&self) -> String {
        format!("{} {}", self.provider, self.precision)
    }

    /// The default matrix: CPU and CUDA in both precisions, TensorRT fp16.
    pub fn default_matrix() -> Vec<Setting> {
        use Precision::*;
        use ProviderKind::*;
        [
            (Cpu, Fp32),
            (Cpu, Fp16),
            (Cuda, Fp32),
            (Cuda, Fp16),
            (TensorRt, Fp16),
        ]
        .into_iter()
        .map(|(provider, precision)| Setting {
            provider,
            precision,
        })
        .collect()
    }

    /// `config` with every stage on this setting (per-stage overrides dropped, no fallback: a
    /// provider that cannot run must say so rather than silently become CPU).
    pub fn apply(&self, config: &Config) -> Config {
        let mut c = config.clone();
        c.runtime.providers = match self.provider {
            ProviderKind::Cpu => vec![ProviderKind::Cpu],
            ProviderKind::Cuda => vec![ProviderKind::Cuda, ProviderKind::Cpu],
            ProviderKind::TensorRtRtx => vec![ProviderKind::TensorRtRtx, ProviderKind::Cpu],
            ProviderKind::TensorRt => vec![
                ProviderKind::TensorRt,
                ProviderKind::Cuda,
                ProviderKind::Cpu,
            ],
        };
        c.runtime.precision = self.precision;
        c.runtime.allow_fallback = false;
        for s in c.stages.values_mut() {
            s.precision = None;
            s.providers = None;
        }
        c
    }
}

/// How one stage's session was opened.
#[derive(Debug, Clone, Serialize)]
pub struct LoadRow {
    pub stage: String,
    pub ms: f64,
    pub provider: String,
    pub precision: String,
    /// `session` (plain ONNX Runtime session), `load` (TensorRT engine from cache), `build`.
    pub kind: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<String>,
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub total_ms: f64,
    /// From the start of `synthesize` to the first audio chunk.
    pub ttfb_ms: f64,
    pub audio_s: f64,
    /// Wall time / audio duration.
    pub rtf: f64,
    pub speech_tokens: usize,
    /// Speech tokens per second of LLM time.
    pub tokens_per_s: f64,
    pub chunks: usize,
    /// Sum of the top-level stages (frontend + llm + flow + hift).
    pub accounted_ms: f64,
    /// `total_ms − accounted_ms` (thread hand-offs, audio hand-over; negative when overlapped).
    pub unaccounted_ms: f64,
    pub stages: BTreeMap<String, SpanStats>,
}

/// A stage over all measured runs.
#[derive(Debug, Clone, Serialize)]
pub struct StageRow {
    /// Median over runs of the stage's total time in a run.
    pub ms: f64,
    /// Share of the median total.
    pub share: f64,
    /// Calls per run (median).
    pub calls: f64,
    /// Per call, pooled over all runs.
    pub p50_ms: f64,
    pub p95_ms: f64,
}

/// Memory use.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    /// Peak resident set (VmHWM), MiB; `None` where /proc is unavailable.
    pub peak_rss_mib: Option<f64>,
    /// Device memory this process holds, MiB, or "n/a" (no GPU stage / not measurable).
    pub device_mib: serde_json::Value,
}

/// The DiT prompt-prefix cache's counters (`cosy profile --json`).
#[derive(Debug, Clone, Serialize)]
pub struct PromptCacheReport {
    pub hits: u64,
    pub misses: u64,
    /// Misses in memory read from disk.
    pub disk_hits: u64,
    /// Voices kept in memory at the end, and their bytes.
    pub entries: usize,
    pub bytes: usize,
}

/// The whole report of one setting.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileReport {
    pub setting: String,
    pub stream: bool,
    pub runs: usize,
    pub warmup: usize,
    pub min_tokens: Option<usize>,
    pub load_ms: f64,
    pub load: Vec<LoadRow>,
    /// Medians over the measured runs.
    pub total_ms: f64,
    pub ttfb_ms: f64,
    pub rtf: f64,
    pub audio_s: f64,
    pub speech_tokens: f64,
    pub tokens_per_s: f64,
    pub accounted_ms: f64,
    pub unaccounted_ms: f64,
    /// Stage times overlap (streaming): they add up to more than the total.
    pub overlapped: bool,
    pub stages: BTreeMap<String, StageRow>,
    pub memory: MemoryReport,
    /// The DiT prompt-prefix cache over all runs, warm-up included (absent when it is not used).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<PromptCacheReport>,
    pub per_run: Vec<RunReport>,
    /// The events of the measured runs (for `--trace`); not serialised.
    #[serde(skip)]
    pub events: Vec<SpanEvent>,
    #[serde(skip)]
    pub threads: BTreeMap<u64, String>,
}

/// Loads the model under `config` and profiles `plan` on it.
pub fn profile(config: &Config, plan: &ProfilePlan, setting_label: &str) -> Result<ProfileReport> {
    if plan.runs == 0 {
        return Err(Error::invalid("--runs must be at least 1"));
    }
    let started = Instant::now();
    let profiler = Profiler::enabled();
    // The runs go through the engine, as every request does (one at a time here).
    let engine = cosy::engine::Engine::builder(config).profiler(profiler.clone()).build()?;
    let load_ms = ms(started.elapsed());
    let load = load_rows(&engine);
    let on_gpu = engine
        .load_times()
        .iter()
        .any(|l| l.provider != ProviderKind::Cpu);
    let (runs, events) = measure_runs(&engine, &profiler, plan)?;

    let med = |f: &dyn Fn(&RunReport) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    // The breakdown is the median run's (by total time), not a median per stage: medians of
    // separate stages come from different runs and need not add up to any run's total, which on a
    // loaded machine makes the table look as if time went missing.
    let typical =
        median_run(&runs).ok_or_else(|| Error::invalid("--runs must be at least 1"))?;
    let total_ms = typical.total_ms;
    let stages = stage_rows(typical, &summarize(&events));
    Ok(ProfileReport {
        setting: setting_label.to_string(),
        stream: plan.request.stream,
        runs: plan.runs,
        warmup: plan.warmup,
        min_tokens: plan.request.ignore_stop_until,
        load_ms,
        load,
        total_ms,
        ttfb_ms: med(&|r| r.ttfb_ms),
        rtf: med(&|r| r.rtf),
        audio_s: med(&|r| r.audio_s),
        speech_tokens: med(&|r| r.speech_tokens as f64),
        tokens_per_s: med(&|r| r.tokens_per_s),
        accounted_ms: typical.accounted_ms,
        unaccounted_ms: typical.unaccounted_ms,
        overlapped: plan.request.stream,
        stages,
        prompt_cache: engine.prompt_cache_stats().map(|s| PromptCacheReport {
            hits: s.hits,
            misses: s.misses,
            disk_hits: s.disk_hits,
            entries: s.entries,
            bytes: s.bytes,
        }),
        memory: MemoryReport {
            peak_rss_mib: peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
            device_mib: if on_gpu {
                device_memory_mib().map_or("n/a".into(), serde_json::Value::from)
            } else {
                "n/a".into()
            },
        },
        per_run: runs,
        threads: profiler.thread_names(),
        events,
    })
}

/// Each stage's load time, provider and precision.
fn load_rows(engine: &cosy::engine::Engine) -> Vec<LoadRow> {
    engine
        .load_times()
        .iter()
        .map(|l| LoadRow {
            stage: l.stage.clone(),
            ms: l.seconds * 1e3,
            provider: l.provider.to_string(),
            precision: l.precision.to_string(),
            kind: l.kind.to_string(),
            fallbacks: l.fallbacks.clone(),
        })
        .collect()
}

/// The warm-up runs, then the measured ones, one at a time: each measured run's report and the
/// span events of all of them.
fn measure_runs(engine: &cosy::engine::Engine, profiler: &Profiler, plan: &ProfilePlan) -> Result<(Vec<RunReport>, Vec<SpanEvent>)> {
    let rate = f64::from(engine.sample_rate());
    let mut runs = Vec::with_capacity(plan.runs);
    let mut events = Vec::new();
    // One tick per run (drawn on stderr only when it is a terminal), so a long profile shows
    // where it is.
    let progress = indicatif::ProgressBar::new((plan.warmup + plan.runs) as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} run {pos}/{len} ({elapsed}, {eta} left) {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for i in 0..plan.warmup + plan.runs {
        progress.set_message(if i < plan.warmup { "warm-up" } else { "measured" });
        progress.set_position(i as u64);
        profiler.take_events();
        let t0 = Instant::now();
        let mut first_chunk: Option<f64> = None;
        let handle = engine.submit(plan.request.clone())?;
        let mut first_audio = cosy::app::drain::FnSink(|_: &[f32]| {
            first_chunk.get_or_insert_with(|| ms(t0.elapsed()));
            Ok(())
        });
        let summary = cosy::app::drain::drain(handle, &mut first_audio)?;
        let total_ms = ms(t0.elapsed());
        let run_events = profiler.take_events();
        if i < plan.warmup {
            continue;
        }
        let timing = RunTiming { total_ms, ttfb_ms: first_chunk.unwrap_or(total_ms), rate };
        runs.push(run_report(&summary, summarize(&run_events), timing));
        events.extend(run_events);
    }
    progress.finish_and_clear();
    Ok((runs, events))
}

/// What was measured around one run: its wall time, its first audio, the output sample rate.
struct RunTiming {
    total_ms: f64,
    ttfb_ms: f64,
    rate: f64,
}

/// One measured run's figures from its summary and its stages.
fn run_report(summary: &cosy::request::Summary, stages: BTreeMap<String, SpanStats>, timing: RunTiming) -> RunReport {
    let RunTiming { total_ms, ttfb_ms, rate } = timing;
    let accounted_ms: f64 = top_level_keys()
        .map(|k| stages.get(k).map_or(0.0, |s| s.total_ms))
        .sum();
    let audio_s = summary.samples as f64 / rate;
    let llm_ms = stages.get("llm").map_or(0.0, |s| s.total_ms);
    RunReport {
        total_ms,
        ttfb_ms,
        audio_s,
        rtf: if audio_s > 0.0 {
            total_ms / 1e3 / audio_s
        } else {
            f64::INFINITY
        },
        speech_tokens: summary.speech_tokens,
        tokens_per_s: if llm_ms > 0.0 {
            summary.speech_tokens as f64 / (llm_ms / 1e3)
        } else {
            0.0
        },
        chunks: summary.chunks,
        accounted_ms,
        unaccounted_ms: total_ms - accounted_ms,
        stages,
    }
}

/// The stage table: the typical run's time, share and calls of each stage, and the percentiles
/// of its calls over every measured run (`pooled`).
fn stage_rows(typical: &RunReport, pooled: &BTreeMap<String, SpanStats>) -> BTreeMap<String, StageRow> {
    let total_ms = typical.total_ms;
    STAGE_KEYS
        .iter()
        .map(|&k| {
            let ms = typical.stages.get(k).map_or(0.0, |s| s.total_ms);
            let p = pooled.get(k).cloned().unwrap_or_default();
            let row = StageRow {
                ms,
                share: if total_ms > 0.0 { ms / total_ms } else { 0.0 },
                calls: typical.stages.get(k).map_or(0.0, |s| s.calls as f64),
                p50_ms: p.p50_ms,
                p95_ms: p.p95_ms,
            };
            (k.to_string(), row)
        })
        .collect()
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// GPU memory this process holds (MiB), from `nvidia-smi --query-compute-apps`.
fn device_memory_mib() -> Option<f64> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    let me = std::process::id().to_string();
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (pid, mib) = l.split_once(',')?;
        (pid.trim() == me)
            .then(|| mib.trim().parse().ok())
            .flatten()
    })
}

impl ProfileReport {
    /// The Chrome trace of the measured runs.
    pub fn chrome_trace(&self) -> serde_json::Value {
        chrome_trace(&self.events, &self.threads)
    }

    /// The terminal table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mode = if self.stream { "streaming" } else { "offline" };
        let _ = writeln!(
            s,
            "cosy profile — {} — {mode}, {} run(s) after {} warm-up (median run){}",
            self.setting,
            self.runs,
            self.warmup,
            self.min_tokens
                .map_or(String::new(), |n| format!(", {n} speech tokens forced"))
        );
        let _ = writeln!(
            s,
            "\n{:<28} {:>7} {:>11} {:>7} {:>10} {:>10}",
            "stage", "calls", "wall ms", "share", "p50 ms", "p95 ms"
        );
        for k in STAGE_KEYS {
            let Some(r) = self.stages.get(*k) else {
                continue;
            };
            let depth = k.matches('.').count();
            let name = format!(
                "{}{}",
                "  ".repeat(depth),
                k.rsplit('.').next().unwrap_or(k)
            );
            let _ = writeln!(
                s,
                "{name:<28} {:>7} {:>11.1} {:>6.1}% {:>10.2} {:>10.2}",
                fmt_calls(r.calls),
                r.ms,
                100.0 * r.share,
                r.p50_ms,
                r.p95_ms
            );
        }
        let _ = writeln!(
            s,
            "{:<28} {:>7} {:>11.1}",
            if self.overlapped {
                "(overlap)"
            } else {
                "(unaccounted)"
            },
            "",
            self.unaccounted_ms
        );
        let _ = writeln!(
            s,
            "{:<28} {:>7} {:>11.1} {:>6.1}%",
            "total", "", self.total_ms, 100.0
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "time to first audio {:.1} ms · RTF {:.3} ({:.2} s audio) · {} speech tokens, {:.1} tokens/s",
            self.ttfb_ms, self.rtf, self.audio_s, self.speech_tokens, self.tokens_per_s
        );
        let rss = self
            .memory
            .peak_rss_mib
            .map_or("n/a".to_string(), |m| format!("{m:.0} MiB"));
        let dev = match &self.memory.device_mib {
            serde_json::Value::Number(n) => format!("{n} MiB"),
            _ => "n/a".to_string(),
        };
        let _ = writeln!(s, "peak host RSS {rss} · device memory {dev}");
        let _ = writeln!(s, "session load {:.0} ms:", self.load_ms);
        for l in &self.load {
            let _ = writeln!(
                s,
                "  {:<18} {:>8.1} ms  {} {} ({})",
                l.stage, l.ms, l.provider, l.precision, l.kind
            );
            for f in &l.fallbacks {
                let _ = writeln!(s, "    fallback: {f}");
            }
        }
        s
    }

    /// `llm=cpu/fp32 dit=cpu/fp16 …`: what each stage really got.
    pub fn providers_line(&self) -> String {
        self.load
            .iter()
            .map(|l| format!("{}={}/{}", l.stage, l.provider, l.precision))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn fmt_calls(c: f64) -> String {
    if c.fract() == 0.0 {
        format!("{c:.0}")
    } else {
        format!("{c:.1}")
    }
}

/// One row of `--matrix`: a report, or why the setting cannot run here.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixRow {
    pub setting: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<ProfileReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Runs `plan` under every setting; a setting that fails becomes a row with its reason.
pub fn matrix(config: &Config, plan: &ProfilePlan, settings: &[Setting]) -> Vec<MatrixRow> {
    settings
        .iter()
        .map(|s| {
            let label = s.label();
            match profile(&s.apply(config), plan, &label) {
                Ok(r) => MatrixRow {
                    setting: label,
                    report: Some(r),
                    error: None,
                },
                Err(e) => MatrixRow {
                    setting: label,
                    report: None,
                    error: Some(one_line(&e.to_string())),
                },
            }
        })
        .collect()
}

fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The `--matrix` table.
pub fn render_matrix(rows: &[MatrixRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<15} {:>9} {:>9} {:>8} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9}  stages",
        "setting",
        "load ms",
        "total ms",
        "TTFB ms",
        "RTF",
        "tok/s",
        "frontend",
        "llm",
        "flow",
        "hift"
    );
    for r in rows {
        match (&r.report, &r.error) {
            (Some(p), _) => {
                let st = |k: &str| p.stages.get(k).map_or(0.0, |x| x.ms);
                let _ = writeln!(
                    s,
                    "{:<15} {:>9.0} {:>9.1} {:>8.1} {:>6.3} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {}",
                    r.setting,
                    p.load_ms,
                    p.total_ms,
                    p.ttfb_ms,
                    p.rtf,
                    p.tokens_per_s,
                    st("frontend"),
                    st("llm"),
                    st("flow"),
                    st("hift"),
                    p.providers_line()
                );
            }
            (None, e) => {
                let _ = writeln!(
                    s,
                    "{:<15} cannot run here: {}",
                    r.setting,
                    e.as_deref().unwrap_or("unknown reason")
                );
            }
        }
    }
    s
}

/// Machine facts for the JSON report.
pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    serde_json::json!({ "cpu": cpu, "logical_cpus": threads, "cosy": env!("CARGO_PKG_VERSION") })
}
