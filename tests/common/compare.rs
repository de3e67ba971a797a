//! The audio check of `../shared/reference/compare.py`, in Rust: its own log-mel (not
//! `cosy::frontend::mel`) and its max-abs sample check, with its tolerances.
//!
//! compare.py's `waveform` row passes when the sample counts are identical and
//! * `mean |log_mel(dump) − log_mel(golden)|` ≤ [`WAVE_LOGMEL_MEAN_TOL`], and
//! * `max |dump − golden|` ≤ [`WAVE_MAX_ABS_TOL`].
//!
//! Its `log_mel(x, sr=24000, n_fft=1024, hop=256, n_mels=80)`, computed here the same way in f64:
//! 1. the signal (as float64) is padded by `n_fft/2` = 512 on each side, `reflect` (numpy's: the
//!    edge sample is not repeated) when it has more than 512 samples, zeros otherwise;
//! 2. frames of 1024 every 256 samples, `1 + (len_padded − 1024) / 256` of them (no partial frame);
//! 3. each frame times the periodic Hann window `0.5 − 0.5·cos(2πk/1024)`, then the MAGNITUDE
//!    `|rfft|` (513 bins, not the power);
//! 4. times compare.py's own mel filterbank: HTK mel scale (`2595·log10(1 + f/700)`), 82 points
//!    evenly spaced in mel from 0 Hz to sr/2, bin frequencies `linspace(0, sr/2, 513)`, plain
//!    triangles of peak 1 (no area normalisation);
//! 5. `ln(max(·, 1e-5))`.

use std::sync::OnceLock;

use realfft::RealFftPlanner;

/// compare.py `WAVE_LOGMEL_MEAN_TOL`.
pub const WAVE_LOGMEL_MEAN_TOL: f64 = 0.025;
/// compare.py `WAVE_MAX_ABS_TOL`.
pub const WAVE_MAX_ABS_TOL: f64 = 0.05;

const SR: f64 = 24000.0;
const N_FFT: usize = 1024;
const HOP: usize = 256;
const N_MELS: usize = 80;
const N_BINS: usize = N_FFT / 2 + 1;
const LOG_FLOOR: f64 = 1e-5;

/// numpy's `linspace(start, stop, num)` (endpoint included).
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    v[num - 1] = stop;
    v
}

/// compare.py `mel_filterbank(24000, 1024, 80)`: `[80][513]`.
fn mel_filterbank() -> &'static Vec<[f64; N_BINS]> {
    static FB: OnceLock<Vec<[f64; N_BINS]>> = OnceLock::new();
    FB.get_or_init(|| {
        let hz2mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
        let mel2hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
        let fmax = SR / 2.0;
        let freqs = linspace(0.0, SR / 2.0, N_BINS);
        let pts: Vec<f64> = linspace(hz2mel(0.0), hz2mel(fmax), N_MELS + 2).into_iter().map(mel2hz).collect();
        (0..N_MELS)
            .map(|i| {
                let (lo, c, hi) = (pts[i], pts[i + 1], pts[i + 2]);
                let mut row = [0f64; N_BINS];
                for (r, &f) in row.iter_mut().zip(&freqs) {
                    *r = 0f64.max(((f - lo) / (c - lo)).min((hi - f) / (hi - c)));
                }
                row
            })
            .collect()
    })
}

/// compare.py `log_mel(x)`: `[frames][80]`, natural log.
pub fn log_mel(x: &[f32]) -> Vec<[f64; N_MELS]> {
    let half = N_FFT / 2;
    let n = x.len();
    let mut padded = Vec::with_capacity(n + N_FFT);
    if n > half {
        // numpy 'reflect': x[half], ..., x[1] | x | x[n-2], ..., x[n-1-half]
        padded.extend((1..=half).rev().map(|i| f64::from(x[i])));
        padded.extend(x.iter().map(|&v| f64::from(v)));
        padded.extend((0..half).map(|j| f64::from(x[n - 2 - j])));
    } else {
        padded.extend(std::iter::repeat_n(0.0, half));
        padded.extend(x.iter().map(|&v| f64::from(v)));
        padded.extend(std::iter::repeat_n(0.0, half));
    }
    let frames = 1 + (padded.len() - N_FFT) / HOP;
    let window: Vec<f64> =
        (0..N_FFT).map(|k| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * k as f64 / N_FFT as f64).cos()).collect();
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let fb = mel_filterbank();
    let mut out = Vec::with_capacity(frames);
    let mut mag = [0f64; N_BINS];
    for f in 0..frames {
        let frame = &padded[f * HOP..f * HOP + N_FFT];
        for ((d, &s), &w) in input.iter_mut().zip(frame).zip(&window) {
            *d = s * w;
        }
        fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch).expect("fft");
        for (m, c) in mag.iter_mut().zip(&spectrum) {
            *m = c.norm();
        }
        let mut row = [0f64; N_MELS];
        for (r, filt) in row.iter_mut().zip(fb) {
            let e: f64 = filt.iter().zip(&mag).map(|(a, b)| a * b).sum();
            *r = e.max(LOG_FLOOR).ln();
        }
        out.push(row);
    }
    out
}

/// compare.py's `logmel_mean_abs`: `mean |log_mel(a) − log_mel(b)|`. The sample counts must be
/// identical (compare.py fails a waveform of another shape before computing anything).
pub fn logmel_mean_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compare.py compares waveforms of identical sample counts only");
    let (ma, mb) = (log_mel(a), log_mel(b));
    let mut sum = 0f64;
    for (ra, rb) in ma.iter().zip(&mb) {
        sum += ra.iter().zip(rb).map(|(x, y)| (x - y).abs()).sum::<f64>();
    }
    sum / (ma.len() * N_MELS) as f64
}

/// compare.py's `max_abs`: the largest |sample difference| (0 for empty signals).
pub fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compare.py compares waveforms of identical sample counts only");
    a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs()).fold(0.0, f64::max)
}

/// compare.py's verdict on a waveform against the golden one.
#[derive(Debug, Clone, Copy)]
pub struct WaveCheck {
    pub samples: usize,
    pub golden_samples: usize,
    /// `None` when the sample counts differ (compare.py: "shape ... != golden ...").
    pub logmel_mean_abs: Option<f64>,
    pub max_abs: Option<f64>,
}

impl WaveCheck {
    pub fn ok(&self) -> bool {
        self.samples == self.golden_samples
            && self.logmel_mean_abs.is_some_and(|d| d <= WAVE_LOGMEL_MEAN_TOL)
            && self.max_abs.is_some_and(|d| d <= WAVE_MAX_ABS_TOL)
    }
}

impl std::fmt::Display for WaveCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.logmel_mean_abs, self.max_abs) {
            (Some(lm), Some(mx)) => write!(
                f,
                "logmel_mean_abs {lm:.3e} (tol {WAVE_LOGMEL_MEAN_TOL}) max_abs {mx:.3e} (tol {WAVE_MAX_ABS_TOL}), {} samples",
                self.samples
            ),
            _ if self.samples != self.golden_samples => {
                write!(f, "shape [{}] != golden [{}]", self.samples, self.golden_samples)
            }
            _ => write!(f, "non-finite samples in dump"),
        }
    }
}

/// compare.py's `waveform` row: identical sample count, finite samples, both tolerances.
pub fn check_waveform(dump: &[f32], golden: &[f32]) -> WaveCheck {
    let (samples, golden_samples) = (dump.len(), golden.len());
    if samples != golden_samples || dump.iter().any(|x| !x.is_finite()) {
        return WaveCheck { samples, golden_samples, logmel_mean_abs: None, max_abs: None };
    }
    WaveCheck {
        samples,
        golden_samples,
        logmel_mean_abs: Some(logmel_mean_abs(dump, golden)),
        max_abs: Some(max_abs(dump, golden)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed test signals: a triangle wave plus integer-hash noise (no transcendental
    /// functions, so Rust and numpy build the same float32 samples), and a scaled, perturbed copy.
    fn signals(n: usize) -> (Vec<f32>, Vec<f32>) {
        let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n as i64 {
            let tri = ((i % 60) as f64 / 30.0 - 1.0).abs() - 0.5;
            let noise = ((i * 7919 + 13) % 1009) as f64 / 1009.0 - 0.5;
            let noise2 = ((i * 104729 + 7) % 997) as f64 / 997.0 - 0.5;
            let x = (0.3 * tri + 0.1 * noise) as f32;
            a.push(x);
            b.push((0.95 * f64::from(x) + 0.01 * noise2) as f32);
        }
        (a, b)
    }

    fn close(got: f64, want: f64, what: &str) {
        assert!((got - want).abs() <= 1e-4 * want.abs(), "{what}: {got} vs compare.py {want}");
    }

    /// Expected values from compare.py's own functions with numpy 1.26.4 (Python 3.11), the same
    /// signals built with numpy (int64 arithmetic, float64, cast to float32):
    /// `la = compare.log_mel(a.astype(float64))`, `lb` likewise, then `mean(abs(la - lb))`,
    /// `max(abs(a - b))` in float64, `la[1, 10]`, `la.mean()` and `la.shape`. n = 5000 takes the
    /// reflect padding, n = 400 (≤ 512) the zero padding.
    #[test]
    fn compare_py_log_mel_and_max_abs() {
        for (n, frames, lm, mx, la_1_10, la_mean) in [
            (5000, 20, 0.10395604869867946, 0.014342069625854492, -0.761125200937668, -0.2025658610186963),
            (400, 2, 0.06016898929801762, 0.01387089490890503, 1.7916518956570577, 0.6314321339533758),
        ] {
            let (a, b) = signals(n);
            let la = log_mel(&a);
            assert_eq!(la.len(), frames, "n={n}: frames");
            close(la[1][10], la_1_10, &format!("n={n}: log_mel[1][10]"));
            let mean = la.iter().flat_map(|r| r.iter()).sum::<f64>() / (la.len() * 80) as f64;
            close(mean, la_mean, &format!("n={n}: mean log_mel"));
            close(logmel_mean_abs(&a, &b), lm, &format!("n={n}: logmel_mean_abs"));
            close(max_abs(&a, &b), mx, &format!("n={n}: max_abs"));
            let check = check_waveform(&b, &a);
            assert!(!check.ok(), "n={n}: {check} is over compare.py's log-mel tolerance");
            assert!(check_waveform(&a, &a).ok());
            assert!(!check_waveform(&a[1..], &a[1..n - 1]).ok(), "another sample count fails");
        }
    }
}
