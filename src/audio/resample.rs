//! A small streaming windowed-sinc resampler for mono f32, used only when the playback device cannot
//! run at the model's rate (24 kHz). Quality target: speech playback, not mastering.
//!
//! Method: output sample `j` sits at input time `t = j · in_rate / out_rate` (exact integer
//! arithmetic for the integer part and phase) and is `Σ_k x[k] · h(t − k)` with
//! `h(d) = fc · sinc(fc · d) · blackman(d / half_width)`. `fc = 0.97 · min(1, out/in)` puts the
//! cut-off just under the lower of the two Nyquist frequencies (anti-imaging when upsampling,
//! anti-aliasing when downsampling); `half_width = 16 / fc` input samples. The integral of `h` is 1,
//! so the DC gain is 1. Input before the first sample is taken as silence; [`Resampler::flush`]
//! pads silence after the last one so the output has exactly `ceil(n · out / in)` samples and is
//! aligned with the input (no added delay).

use std::collections::VecDeque;

/// Kernel half width in units of the narrower Nyquist band (taps each side when upsampling).
const HALF_TAPS: f64 = 16.0;
/// The cut-off as a fraction of the lower Nyquist frequency.
const CUTOFF: f64 = 0.97;

/// Streaming mono resampler; feed chunks with [`process`](Self::process), end with
/// [`flush`](Self::flush). Processing in chunks gives the same samples as one call on the whole.
#[derive(Debug, Clone)]
pub struct Resampler {
    in_rate: u64,
    out_rate: u64,
    fc: f64,
    half_width: f64,
    /// Input samples from absolute index `history_start` on.
    history: VecDeque<f32>,
    history_start: u64,
    /// Input samples received so far.
    received: u64,
    /// Index of the next output sample.
    next_out: u64,
}

impl Resampler {
    pub fn new(in_rate: u32, out_rate: u32) -> Resampler {
        assert!(in_rate > 0 && out_rate > 0, "sample rates must be positive");
        let fc = CUTOFF * (out_rate as f64 / in_rate as f64).min(1.0);
        Resampler {
            in_rate: in_rate as u64,
            out_rate: out_rate as u64,
            fc,
            half_width: HALF_TAPS / fc,
            history: VecDeque::new(),
            history_start: 0,
            received: 0,
            next_out: 0,
        }
    }

    /// True when input and output rates are equal (samples pass through untouched).
    pub fn is_identity(&self) -> bool {
        self.in_rate == self.out_rate
    }

    /// Feeds one chunk; returns the output samples that are now fully determined.
    pub fn process(&mut self, input: &[f32]) -> Vec<f32> {
        if self.is_identity() {
            self.received += input.len() as u64;
            self.next_out += input.len() as u64;
            return input.to_vec();
        }
        self.history.extend(input.iter().copied());
        self.received += input.len() as u64;
        let mut out = Vec::new();
        // An output at input time t = i0 + frac reads indices up to floor(t + half_width), at most
        // i0 + floor(half_width) + 1: wait until that one has arrived.
        while {
            let (i0, _) = self.position(self.next_out);
            i0 + self.half_width.floor() as u64 + 2 <= self.received
        } {
            out.push(self.render(self.next_out));
            self.next_out += 1;
        }
        self.trim();
        out
    }

    /// Ends the stream: returns the remaining outputs, computed with silence after the input.
    pub fn flush(&mut self) -> Vec<f32> {
        if self.is_identity() {
            return Vec::new();
        }
        let total_out = (self.received * self.out_rate).div_ceil(self.in_rate);
        let mut out = Vec::new();
        while self.next_out < total_out {
            out.push(self.render(self.next_out));
            self.next_out += 1;
        }
        self.trim();
        out
    }

    /// Integer input index and fractional phase of output sample `j`.
    fn position(&self, j: u64) -> (u64, f64) {
        let num = j * self.in_rate;
        (num / self.out_rate, (num % self.out_rate) as f64 / self.out_rate as f64)
    }

    fn input_at(&self, k: i64) -> f32 {
        if k < self.history_start as i64 {
            return 0.0; // before the stream start (or already trimmed, which `trim` prevents)
        }
        self.history
            .get((k as u64 - self.history_start) as usize)
            .copied()
            .unwrap_or(0.0)
    }

    fn render(&self, j: u64) -> f32 {
        let (i0, frac) = self.position(j);
        let t = i0 as f64 + frac;
        let reach = self.half_width.floor() as i64;
        let mut acc = 0.0f64;
        for k in (i0 as i64 - reach)..=(i0 as i64 + reach + 1) {
            let d = t - k as f64;
            if d.abs() >= self.half_width {
                continue;
            }
            acc += self.input_at(k) as f64 * self.kernel(d);
        }
        acc as f32
    }

    fn kernel(&self, d: f64) -> f64 {
        let x = self.fc * d;
        let sinc = if x.abs() < 1e-12 {
            1.0
        } else {
            (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x)
        };
        let u = d / self.half_width; // in (-1, 1)
        let window = 0.42 + 0.5 * (std::f64::consts::PI * u).cos() + 0.08 * (2.0 * std::f64::consts::PI * u).cos();
        self.fc * sinc * window
    }

    /// Drops input samples no future output can reach.
    fn trim(&mut self) {
        let (i0, _) = self.position(self.next_out);
        let keep_from = i0.saturating_sub(self.half_width.ceil() as u64 + 1);
        while self.history_start < keep_from && !self.history.is_empty() {
            self.history.pop_front();
            self.history_start += 1;
        }
    }
}
