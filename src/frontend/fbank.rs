//! Kaldi fbank + cepstral mean normalisation for campplus (speaker embedding).
//!
//! Equivalent of `torchaudio.compliance.kaldi.fbank(wav, num_mel_bins=80, dither=0,
//! sample_frequency=16000)` followed by subtracting the per-bin mean over time, on the float
//! waveform (not rescaled to the int16 range). Defaults that matter: 25 ms frames (400), 10 ms
//! shift (160), snip_edges (T = 1 + (N − 400) / 160), per-frame DC removal, pre-emphasis 0.97 with
//! the first sample replicated, Povey window (non-periodic Hann ^ 0.85), zero-pad to 512, power
//! spectrum, 80 triangular mel bins on the 1127·ln(1 + f/700) scale from 20 Hz to 8 kHz (the
//! Nyquist bin has no weight), natural log floored at float32 epsilon. No energy term.

use ndarray::Array2;

use crate::frontend::mel::stft_frames;

const FRAME_LEN: usize = 400;
const FRAME_SHIFT: usize = 160;
const PADDED_LEN: usize = 512;
pub const N_BINS: usize = 80;
const PREEMPH: f64 = 0.97;
const LOW_FREQ: f64 = 20.0;
const HIGH_FREQ: f64 = 8000.0;
const SAMPLE_RATE: f64 = 16000.0;

fn kaldi_mel(hz: f64) -> f64 {
    1127.0 * (1.0 + hz / 700.0).ln()
}

/// Kaldi's triangular mel banks: `N_BINS` rows over the 257 one-sided bins of a 512 FFT.
fn kaldi_mel_banks() -> Vec<Vec<f64>> {
    let n_fft_bins = PADDED_LEN / 2;
    let bin_width = SAMPLE_RATE / PADDED_LEN as f64;
    let (mel_low, mel_high) = (kaldi_mel(LOW_FREQ), kaldi_mel(HIGH_FREQ));
    let delta = (mel_high - mel_low) / (N_BINS + 1) as f64;
    (0..N_BINS)
        .map(|m| {
            let left = mel_low + m as f64 * delta;
            let centre = mel_low + (m + 1) as f64 * delta;
            let right = mel_low + (m + 2) as f64 * delta;
            let mut row: Vec<f64> = (0..n_fft_bins)
                .map(|k| {
                    let mel = kaldi_mel(bin_width * k as f64);
                    let up = (mel - left) / (centre - left);
                    let down = (right - mel) / (right - centre);
                    up.min(down).max(0.0)
                })
                .collect();
            row.push(0.0); // the Nyquist bin is padded with a zero weight
            row
        })
        .collect()
}

fn povey_window() -> Vec<f64> {
    (0..FRAME_LEN)
        .map(|i| {
            let hann = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / (FRAME_LEN - 1) as f64).cos();
            hann.powf(0.85)
        })
        .collect()
}

/// 80-bin kaldi log fbank of 16 kHz `samples` minus its time mean: [T, 80],
/// T = 1 + (N − 400) / 160 (0 rows when N < 400).
pub fn kaldi_fbank_cmn(samples: &[f32]) -> Array2<f32> {
    if samples.len() < FRAME_LEN {
        return Array2::zeros((0, N_BINS));
    }
    let n_frames = 1 + (samples.len() - FRAME_LEN) / FRAME_SHIFT;
    let window = povey_window();
    let banks = kaldi_mel_banks();
    let eps = f32::EPSILON as f64;

    // Pre-process each frame (DC removal, pre-emphasis, window) into a contiguous buffer of
    // zero-padded 512-sample frames, so that the shared STFT helper can run with hop = 512.
    let mut frames = vec![0.0f32; n_frames * PADDED_LEN];
    for t in 0..n_frames {
        let raw = &samples[t * FRAME_SHIFT..t * FRAME_SHIFT + FRAME_LEN];
        let mean = raw.iter().map(|&x| x as f64).sum::<f64>() / FRAME_LEN as f64;
        let centred: Vec<f64> = raw.iter().map(|&x| x as f64 - mean).collect();
        let dst = &mut frames[t * PADDED_LEN..t * PADDED_LEN + FRAME_LEN];
        for i in 0..FRAME_LEN {
            let prev = if i == 0 { centred[0] } else { centred[i - 1] };
            dst[i] = ((centred[i] - PREEMPH * prev) * window[i]) as f32;
        }
    }
    // The f32 round trip above costs < 1e-7 relative; the window is applied already, so the
    // STFT runs with a rectangular window.
    let ones = vec![1.0f64; PADDED_LEN];
    let mut log_fbank = Array2::<f64>::zeros((n_frames, N_BINS));
    let mut power = vec![0.0f64; PADDED_LEN / 2 + 1];
    stft_frames(&frames, PADDED_LEN, PADDED_LEN, &ones, |t, spec| {
        for (p, c) in power.iter_mut().zip(spec) {
            *p = c.re * c.re + c.im * c.im;
        }
        for (m, row) in banks.iter().enumerate() {
            let e: f64 = row.iter().zip(&power).map(|(w, p)| w * p).sum();
            log_fbank[[t, m]] = e.max(eps).ln();
        }
    });
    let means = log_fbank.mean_axis(ndarray::Axis(0)).unwrap_or_else(|| ndarray::Array1::zeros(N_BINS));
    let mut out = Array2::<f32>::zeros((n_frames, N_BINS));
    for t in 0..n_frames {
        for m in 0..N_BINS {
            out[[t, m]] = (log_fbank[[t, m]] - means[m]) as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_count_and_zero_mean() {
        let x: Vec<f32> = (0..16000).map(|i| ((i as f32) * 0.07).sin() * 0.2 + 0.01 * ((i * 7919 % 101) as f32 / 101.0)).collect();
        let f = kaldi_fbank_cmn(&x);
        assert_eq!(f.shape(), &[98, 80]);
        for m in 0..80 {
            let mean: f64 = (0..98).map(|t| f[[t, m]] as f64).sum::<f64>() / 98.0;
            assert!(mean.abs() < 1e-5);
        }
        assert_eq!(kaldi_fbank_cmn(&x[..399]).shape(), &[0, 80]);
    }

    #[test]
    fn banks_are_triangles_inside_20_to_8000_hz() {
        let banks = kaldi_mel_banks();
        assert_eq!(banks.len(), 80);
        assert!(banks.iter().all(|r| r.len() == 257 && r[256] == 0.0 && r[0] == 0.0));
        assert!(banks.iter().all(|r| r.iter().cloned().fold(0.0, f64::max) <= 1.0));
    }
}
