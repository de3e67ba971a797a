//! Prometheus metrics in the text exposition format, kept by hand (a few counters and
//! histograms; no registry crate needed).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A histogram with fixed upper bounds (seconds, or a ratio for RTF).
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in micro-units, so it fits an atomic integer.
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if value <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((value * 1e6).round() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", bucket.load(Ordering::Relaxed));
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 * 1e-6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

const SECONDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];
const RATIO: &[f64] = &[0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0];

/// Everything `/metrics` reports that the server counts itself.
pub struct Metrics {
    /// Finished HTTP exchanges by (route, status).
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Time from receiving a synthesis request to its first audio byte.
    pub ttfb: Histogram,
    /// Synthesis wall time over audio duration, per finished request.
    pub rtf: Histogram,
    /// Audio produced, in microseconds.
    audio_micros: AtomicU64,
    /// Syntheses stopped because the client went away.
    pub cancelled: AtomicU64,
    /// Requests refused with 429.
    pub rejected: AtomicU64,
    /// Requests that ran past server.request_timeout_s.
    pub timeouts: AtomicU64,
    /// Connections cut off because the client took nothing for server.send_timeout_s (the
    /// accept loop counts them: `listen::Limits::send_timeouts`).
    pub send_timeouts: std::sync::Arc<AtomicU64>,
    /// Wyoming requests by (request, outcome): `describe`, `synthesize`, `stream`, `connection`,
    /// `other` × `ok`, `error`, `cancelled`, `refused` (bounded label values).
    wyoming: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Wyoming connections open now.
    pub wyoming_connections: std::sync::atomic::AtomicUsize,
}

/// The counters the server reads from elsewhere when it renders.
pub struct Gauges {
    pub ready: bool,
    pub draining: bool,
    pub in_flight: usize,
    pub queued: usize,
    /// `engine.max_in_flight` and `engine.max_queue`.
    pub max_in_flight: usize,
    pub max_queue: usize,
    /// Connections open now (WebSocket sessions included).
    pub connections: usize,
    /// (name, calls, seconds) per pipeline span ([`cosy::profile::Profiler::totals`]).
    pub stages: Vec<(String, u64, f64)>,
    pub llm: Option<cosy::engine::LlmBatchStats>,
    pub dit: Option<cosy::engine::DitBatchStats>,
    /// Whether the model is in memory now (`engine.idle_unload_s` drops it when idle).
    pub model_loaded: bool,
    /// Times it was loaded again after an idle unload.
    pub model_reloads: u64,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            ttfb: Histogram::new(SECONDS),
            rtf: Histogram::new(RATIO),
            audio_micros: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            send_timeouts: std::sync::Arc::new(AtomicU64::new(0)),
            wyoming: Mutex::new(BTreeMap::new()),
            wyoming_connections: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// One Wyoming request's outcome, beside the HTTP requests' counts.
    pub fn count_wyoming(&self, request: &'static str, outcome: &'static str) {
        *self.wyoming.lock().unwrap_or_else(|p| p.into_inner()).entry((request, outcome)).or_insert(0) += 1;
    }

    pub fn count_request(&self, route: &'static str, status: u16) {
        *self.requests.lock().unwrap_or_else(|p| p.into_inner()).entry((route, status)).or_insert(0) += 1;
    }

    pub fn add_audio_seconds(&self, seconds: f64) {
        self.audio_micros.fetch_add((seconds * 1e6).round() as u64, Ordering::Relaxed);
    }

    /// The `/metrics` page.
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::with_capacity(4096);
        let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        gauge(&mut out, "cosy_ready", "1 when the model is loaded and warmed up", f64::from(u8::from(g.ready)));
        gauge(&mut out, "cosy_draining", "1 while shutting down", f64::from(u8::from(g.draining)));
        gauge(&mut out, "cosy_model_loaded", "1 while the model is in memory (engine.idle_unload_s drops it when idle)", f64::from(u8::from(g.model_loaded)));
        gauge(&mut out, "cosy_requests_in_flight", "Syntheses running now", g.in_flight as f64);
        gauge(&mut out, "cosy_queue_depth", "Requests waiting for a synthesis slot", g.queued as f64);
        gauge(&mut out, "cosy_open_connections", "Connections open now (WebSocket sessions included)", g.connections as f64);
        // The metric keeps its first name (dashboards read it); the setting is engine.max_in_flight.
        gauge(&mut out, "cosy_max_concurrent", "engine.max_in_flight in effect (syntheses run at once)", g.max_in_flight as f64);
        gauge(&mut out, "cosy_max_queue", "engine.max_queue in effect (requests that may wait)", g.max_queue as f64);

        let _ = writeln!(out, "# HELP cosy_http_requests_total HTTP requests by route and status\n# TYPE cosy_http_requests_total counter");
        for ((route, status), n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "cosy_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
        }
        gauge(&mut out, "cosy_wyoming_connections", "Wyoming connections open now", self.wyoming_connections.load(Ordering::Relaxed) as f64);
        let _ = writeln!(
            out,
            "# HELP cosy_wyoming_requests_total Wyoming requests by kind (describe, synthesize, stream) and outcome\n# TYPE cosy_wyoming_requests_total counter"
        );
        for ((request, outcome), n) in self.wyoming.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "cosy_wyoming_requests_total{{request=\"{request}\",outcome=\"{outcome}\"}} {n}");
        }
        let counter = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        counter(&mut out, "cosy_model_loads_total", "Times the model was loaded again after an idle unload", g.model_reloads as f64);
        counter(&mut out, "cosy_audio_seconds_total", "Seconds of audio produced", self.audio_micros.load(Ordering::Relaxed) as f64 * 1e-6);
        counter(&mut out, "cosy_requests_cancelled_total", "Syntheses stopped because the client went away", self.cancelled.load(Ordering::Relaxed) as f64);
        counter(&mut out, "cosy_requests_rejected_total", "Requests answered 429 (slots and queue full)", self.rejected.load(Ordering::Relaxed) as f64);
        counter(&mut out, "cosy_requests_timed_out_total", "Requests past server.request_timeout_s", self.timeouts.load(Ordering::Relaxed) as f64);
        counter(
            &mut out,
            "cosy_send_timeouts_total",
            "Connections cut off: the client took nothing for server.send_timeout_s",
            self.send_timeouts.load(Ordering::Relaxed) as f64,
        );
        self.ttfb.render(&mut out, "cosy_ttfb_seconds", "Time from request to first audio byte");
        self.rtf.render(&mut out, "cosy_rtf", "Real-time factor (synthesis time / audio duration) per request");

        let _ = writeln!(out, "# HELP cosy_stage_seconds_total Wall time spent in each pipeline stage, all requests\n# TYPE cosy_stage_seconds_total counter");
        for (name, _, seconds) in &g.stages {
            let _ = writeln!(out, "cosy_stage_seconds_total{{stage=\"{name}\"}} {seconds}");
        }
        let _ = writeln!(out, "# HELP cosy_stage_calls_total Calls of each pipeline stage, all requests\n# TYPE cosy_stage_calls_total counter");
        for (name, calls, _) in &g.stages {
            let _ = writeln!(out, "cosy_stage_calls_total{{stage=\"{name}\"}} {calls}");
        }
        if let Some(llm) = &g.llm {
            counter(&mut out, "cosy_llm_decode_calls_total", "Batched LLM decode calls", llm.decode_calls as f64);
            counter(&mut out, "cosy_llm_decode_rows_total", "Sentence rows those calls served", llm.decode_rows as f64);
            gauge(&mut out, "cosy_llm_max_rows", "Most rows one decode call served", llm.max_rows as f64);
        }
        if let Some(dit) = &g.dit {
            counter(&mut out, "cosy_dit_calls_total", "Batched DiT calls", dit.calls as f64);
            counter(&mut out, "cosy_dit_requests_total", "Request calls those DiT calls served", dit.requests as f64);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(7.0);
        h.observe(f64::NAN);
        let mut out = String::new();
        h.render(&mut out, "x", "test");
        assert!(out.contains("x_bucket{le=\"0.1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
        assert!(out.contains("x_sum 7.55"), "{out}");
    }
}
