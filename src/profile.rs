//! A lightweight span recorder for `cosy profile`: named wall-time spans with their thread, kept in
//! memory, summarised per name (calls, total, p50/p95) and written as a Chrome trace.
//!
//! The pipeline takes a [`Profiler`] by reference everywhere; a disabled one (the default, what
//! `cosy file`/`say` use) holds no recorder, so [`Profiler::span`] neither reads the clock nor
//! locks anything — the guard it returns is an empty `Option`.
//!
//! Span names are dotted paths (`llm.decode`, `flow.dit`): the part before the first dot is the
//! top-level stage, the rest a sub-step of it. [`STAGE_KEYS`] lists every name the pipeline
//! records, so a report always has all of them (with zero calls where a stage did not run).


use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Every span name the pipeline records during a request, parents before their sub-steps.
pub const STAGE_KEYS: &[&str] = &[
    "frontend",
    "frontend.tokenizer",
    "frontend.audio_load",
    "frontend.resample",
    "frontend.whisper_mel",
    "frontend.speech_tokenizer",
    "frontend.fbank",
    "frontend.campplus",
    "frontend.mel_24k",
    "llm",
    "llm.prefill",
    "llm.prefill.copy_in",
    "llm.prefill.copy_out",
    "llm.decode",
    "llm.decode.copy_in",
    "llm.decode.copy_out",
    "llm.sampling",
    "flow",
    "flow.front",
    "flow.dit",
    "flow.dit.copy",
    "hift",
    "hift.f0",
    "hift.source",
    "hift.decode",
];

/// The top-level stages of a request (no dot in the name). Offline, they run one after the other
/// on the critical path, so their times add up to the request's wall time.
pub fn top_level_keys() -> impl Iterator<Item = &'static str> {
    STAGE_KEYS.iter().copied().filter(|k| !k.contains('.'))
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    pub name: Cow<'static, str>,
    /// Nanoseconds since the profiler was made.
    pub start_ns: u64,
    pub dur_ns: u64,
    /// Small per-thread number (1, 2, …) in order of first use.
    pub thread: u64,
}

#[derive(Debug)]
struct Recorder {
    origin: Instant,
    /// `false`: a long-running process (a server) keeps only [`Recorder::totals`], in bounded memory.
    keep_events: bool,
    /// Calls and nanoseconds per span name (only when `keep_events` is false).
    totals: Mutex<BTreeMap<Cow<'static, str>, (u64, u64)>>,
    events: Mutex<Vec<SpanEvent>>,
    thread_names: Mutex<BTreeMap<u64, String>>,
}

/// The top-level stages a request's own clock keeps ([`Profiler::for_request`]).
pub const REQUEST_STAGES: [&str; 4] = ["frontend", "llm", "flow", "hift"];

/// Nanoseconds one request spent in each of [`REQUEST_STAGES`], summed over its spans (the LLM
/// and the token-to-wav work run on different threads, so the stages of a streamed request
/// overlap: they add up to more than its wall time).
#[derive(Debug, Default)]
struct RequestClock {
    ns: [AtomicU64; REQUEST_STAGES.len()],
}

impl RequestClock {
    fn slot(&self, name: &str) -> Option<&AtomicU64> {
        REQUEST_STAGES.iter().position(|s| *s == name).map(|i| &self.ns[i])
    }
}

/// A cheap, cloneable handle; [`Profiler::disabled`] records nothing and costs nothing.
#[derive(Debug, Clone, Default)]
pub struct Profiler {
    recorder: Option<Arc<Recorder>>,
    /// One request's stage times ([`Profiler::for_request`]), besides the shared recorder.
    request: Option<Arc<RequestClock>>,
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
thread_local! {
    static THREAD_ID: Cell<u64> = const { Cell::new(0) };
}

fn thread_number() -> (u64, bool) {
    THREAD_ID.with(|c| {
        let id = c.get();
        if id != 0 {
            return (id, false);
        }
        let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        c.set(id);
        (id, true)
    })
}

/// Records a span from its creation until it is dropped (or [`SpanGuard::end`]).
#[must_use = "a span ends when its guard is dropped"]
pub struct SpanGuard<'p> {
    open: Option<(&'p Recorder, Cow<'static, str>, Instant)>,
    /// The request's clock for this stage (a top-level span of a [`Profiler::for_request`]).
    stage: Option<(&'p AtomicU64, Instant)>,
}

impl SpanGuard<'_> {
    /// Ends the span now.
    pub fn end(self) {}
}

impl Drop for SpanGuard<'_> {
    fn drop(&mut self) {
        if self.open.is_none() && self.stage.is_none() {
            return;
        }
        let end = Instant::now();
        if let Some((clock, start)) = self.stage.take() {
            clock.fetch_add(end.saturating_duration_since(start).as_nanos() as u64, Ordering::Relaxed);
        }
        if let Some((rec, name, start)) = self.open.take() {
            rec.record(name, start, end);
        }
    }
}

impl Recorder {
    fn record(&self, name: Cow<'static, str>, start: Instant, end: Instant) {
        if !self.keep_events {
            let dur_ns = end.saturating_duration_since(start).as_nanos() as u64;
            let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
            let entry = totals.entry(name).or_insert((0, 0));
            entry.0 += 1;
            entry.1 = entry.1.saturating_add(dur_ns);
            return;
        }
        let (thread, first) = thread_number();
        if first {
            let label = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {thread}"), str::to_string);
            self.thread_names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(thread, label);
        }
        let start_ns = start.saturating_duration_since(self.origin).as_nanos() as u64;
        let dur_ns = end.saturating_duration_since(start).as_nanos() as u64;
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(SpanEvent {
                name,
                start_ns,
                dur_ns,
                thread,
            });
    }
}

impl Profiler {
    /// A profiler that records nothing.
    pub fn disabled() -> Self {
        Profiler { recorder: None, request: None }
    }

    /// This profiler (the same recorder, if any) with a clock of its own for one request: the
    /// top-level spans ([`REQUEST_STAGES`]) recorded through it also add to that request's stage
    /// times ([`Profiler::request_seconds`]), whether or not the shared recorder is enabled.
    pub fn for_request(&self) -> Profiler {
        Profiler { recorder: self.recorder.clone(), request: Some(Arc::new(RequestClock::default())) }
    }

    /// Seconds spent in the top-level stage `stage` through this request's profiler (0 for a
    /// profiler not made by [`Profiler::for_request`] or a name not in [`REQUEST_STAGES`]).
    pub fn request_seconds(&self, stage: &str) -> f64 {
        self.request.as_deref().and_then(|c| c.slot(stage)).map_or(0.0, |ns| ns.load(Ordering::Relaxed) as f64 * 1e-9)
    }

    /// A recording profiler; times are relative to now.
    pub fn enabled() -> Self {
        Profiler {
            recorder: Some(Arc::new(Recorder {
                origin: Instant::now(),
                keep_events: true,
                totals: Mutex::new(BTreeMap::new()),
                events: Mutex::new(Vec::new()),
                thread_names: Mutex::new(BTreeMap::new()),
            })),
            request: None,
        }
    }

    /// A profiler that keeps only running totals per span name (calls, seconds): bounded memory
    /// for a process that runs for days (the server's per-stage metrics). See [`Profiler::totals`].
    pub fn totals_only() -> Self {
        Profiler {
            recorder: Some(Arc::new(Recorder {
                origin: Instant::now(),
                keep_events: false,
                totals: Mutex::new(BTreeMap::new()),
                events: Mutex::new(Vec::new()),
                thread_names: Mutex::new(BTreeMap::new()),
            })),
            request: None,
        }
    }

    /// Calls and total seconds per span name so far ([`Profiler::totals_only`]; empty otherwise).
    pub fn totals(&self) -> Vec<(String, u64, f64)> {
        let Some(r) = &self.recorder else {
            return Vec::new();
        };
        let totals = r.totals.lock().unwrap_or_else(|p| p.into_inner());
        totals.iter().map(|(name, &(calls, ns))| (name.to_string(), calls, ns as f64 * 1e-9)).collect()
    }

    pub fn is_enabled(&self) -> bool {
        self.recorder.is_some()
    }

    /// Starts a span named `name` (a static dotted path such as `"llm.decode"`).
    #[inline]
    pub fn span(&self, name: &'static str) -> SpanGuard<'_> {
        let stage = self.request.as_deref().and_then(|c| c.slot(name));
        if self.recorder.is_none() && stage.is_none() {
            return SpanGuard { open: None, stage: None };
        }
        let now = Instant::now();
        SpanGuard {
            open: self.recorder.as_deref().map(|r| (r, Cow::Borrowed(name), now)),
            stage: stage.map(|c| (c, now)),
        }
    }

    /// Starts a span with a computed name (only built when enabled).
    pub fn span_with(&self, name: impl FnOnce() -> String) -> SpanGuard<'_> {
        SpanGuard {
            open: self
                .recorder
                .as_deref()
                .map(|r| (r, Cow::Owned(name()), Instant::now())),
            stage: None,
        }
    }

    /// Times `f` as a span.
    #[inline]
    pub fn time<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let _g = self.span(name);
        f()
    }

    /// Nanoseconds since the profiler was made (0 when disabled).
    pub fn now_ns(&self) -> u64 {
        self.recorder
            .as_ref()
            .map_or(0, |r| r.origin.elapsed().as_nanos() as u64)
    }

    /// Takes every event recorded so far, in start order.
    pub fn take_events(&self) -> Vec<SpanEvent> {
        let Some(r) = &self.recorder else {
            return Vec::new();
        };
        let mut events = std::mem::take(&mut *r.events.lock().unwrap_or_else(|p| p.into_inner()));
        events.sort_by_key(|e| (e.start_ns, std::cmp::Reverse(e.dur_ns)));
        events
    }

    /// Thread numbers and their names, for the trace.
    pub fn thread_names(&self) -> BTreeMap<u64, String> {
        self.recorder
            .as_ref()
            .map(|r| {
                r.thread_names
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            })
            .unwrap_or_default()
    }
}

/// Per-name statistics over a set of events.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SpanStats {
    pub calls: usize,
    pub total_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub max_ms: f64,
}

/// The value at quantile `q` (nearest rank) of sorted `v`; 0 for an empty slice.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of `v` (mean of the two middle values for an even count); 0 when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// Statistics per span name, with every [`STAGE_KEYS`] entry present.
pub fn summarize(events: &[SpanEvent]) -> BTreeMap<String, SpanStats> {
    let mut durations: BTreeMap<String, Vec<f64>> = STAGE_KEYS
        .iter()
        .map(|k| (k.to_string(), Vec::new()))
        .collect();
    for e in events {
        durations
            .entry(e.name.to_string())
            .or_default()
            .push(e.dur_ns as f64 / 1e6);
    }
    durations
        .into_iter()
        .map(|(name, mut d)| {
            d.sort_by(f64::total_cmp);
            let stats = SpanStats {
                calls: d.len(),
                total_ms: d.iter().sum(),
                p50_ms: quantile(&d, 0.5),
                p95_ms: quantile(&d, 0.95),
                max_ms: d.last().copied().unwrap_or(0.0),
            };
            (name, stats)
        })
        .collect()
}

/// The events as a Chrome trace (`chrome://tracing`, Perfetto): complete events (`ph: "X"`) in
/// microseconds, one track per thread, named by thread metadata events.
pub fn chrome_trace(events: &[SpanEvent], threads: &BTreeMap<u64, String>) -> serde_json::Value {
    let mut out: Vec<serde_json::Value> = threads
        .iter()
        .map(|(tid, name)| {
            serde_json::json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}})
        })
        .collect();
    for e in events {
        let cat = e.name.split('.').next().unwrap_or("cosy");
        out.push(serde_json::json!({
            "ph": "X",
            "name": e.name,
            "cat": cat,
            "pid": 1,
            "tid": e.thread,
            "ts": e.start_ns as f64 / 1e3,
            "dur": e.dur_ns as f64 / 1e3,
        }));
    }
    serde_json::json!({ "traceEvents": out, "displayTimeUnit": "ms" })
}

/// Peak resident set size of this process in bytes (`VmHWM` of /proc/self/status), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_only_keeps_sums_not_events() {
        let p = Profiler::totals_only();
        for _ in 0..3 {
            let _g = p.span("llm.decode");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        p.time("hift", || ());
        assert!(p.take_events().is_empty(), "no per-span events are kept");
        let totals = p.totals();
        let decode = totals.iter().find(|(n, _, _)| n == "llm.decode").expect("llm.decode total");
        assert_eq!(decode.1, 3);
        assert!(decode.2 >= 0.003, "three spans of at least 1 ms: {}", decode.2);
        assert!(totals.iter().any(|(n, c, _)| n == "hift" && *c == 1));
        assert!(Profiler::enabled().totals().is_empty());
    }

    #[test]
    fn a_request_clock_sums_its_top_level_stages_only() {
        let shared = Profiler::totals_only();
        let one = shared.for_request();
        let other = shared.for_request();
        for _ in 0..2 {
            let _g = one.span("flow");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        {
            let _sub = one.span("llm.decode");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(one.request_seconds("flow") >= 0.002, "two spans of at least 1 ms");
        assert_eq!(one.request_seconds("llm"), 0.0, "a sub-step is not a stage");
        assert_eq!(other.request_seconds("flow"), 0.0, "each request has its own clock");
        assert!(shared.totals().iter().any(|(n, c, _)| n == "flow" && *c == 2), "the shared totals still get every span");
        let alone = Profiler::disabled().for_request();
        {
            let _g = alone.span("hift");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(alone.request_seconds("hift") > 0.0 && alone.take_events().is_empty(), "a request clock without a recorder");
    }

    #[test]
    fn disabled_records_nothing() {
        let p = Profiler::disabled();
        {
            let _s = p.span("llm");
        }
        assert!(p.take_events().is_empty());
        assert_eq!(p.now_ns(), 0);
    }

    #[test]
    fn spans_nest_and_summarize() {
        let p = Profiler::enabled();
        {
            let _outer = p.span("llm");
            for _ in 0..3 {
                let _inner = p.span("llm.decode");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        let events = p.take_events();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].name, "llm", "the outer span starts first");
        let stats = summarize(&events);
        assert_eq!(stats["llm.decode"].calls, 3);
        assert!(stats["llm.decode"].p50_ms >= 2.0);
        assert!(stats["llm"].total_ms >= stats["llm.decode"].total_ms);
        assert_eq!(stats["hift.f0"].calls, 0, "every stage key is present");
        let trace = chrome_trace(&events, &p.thread_names());
        let list = trace["traceEvents"].as_array().expect("array");
        assert_eq!(list.iter().filter(|e| e["ph"] == "X").count(), 4);
        assert_eq!(list.iter().filter(|e| e["ph"] == "M").count(), 1);
    }

    #[test]
    fn quantiles_and_median() {
        let v = [1.0, 2.0, 3.0, 4.0, 100.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.95), 100.0);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
