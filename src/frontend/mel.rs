//! The 24 kHz mel of the flow (matcha `mel_spectrogram` as configured for CosyVoice3, §2.5) and the
//! Slaney mel filterbank shared with the whisper features.
//!
//! Steps: reflect-pad 720 each side, STFT (n_fft 1920, hop 480, periodic Hann, no centring),
//! magnitude sqrt(re² + im² + 1e-9), Slaney mel (80 bins, 0..12 kHz, area-normalised),
//! natural log of clamp(·, 1e-5). Output [T, 80] with T = floor(N / 480).

use ndarray::Array2;
use realfft::RealFftPlanner;

use crate::frontend::{periodic_hann, reflect_pad};

const SAMPLE_RATE: f64 = 24000.0;
const N_FFT: usize = 1920;
const HOP: usize = 480;
const N_MELS: usize = 80;

fn hz_to_mel_slaney(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if hz >= min_log_hz { min_log_mel + (hz / min_log_hz).ln() / logstep } else { hz / f_sp }
}

fn mel_to_hz_slaney(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if mel >= min_log_mel { min_log_hz * (logstep * (mel - min_log_mel)).exp() } else { f_sp * mel }
}

/// `librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)` with the defaults (Slaney scale, Slaney
/// area normalisation), built in f64 and rounded to f32 like librosa's default dtype.
/// Returns `n_mels` rows of `n_fft / 2 + 1` weights.
pub fn slaney_mel_filterbank(sample_rate: f64, n_fft: usize, n_mels: usize, fmin: f64, fmax: f64) -> Vec<Vec<f32>> {
    let n_bins = n_fft / 2 + 1;
    // numpy.fft.rfftfreq: k * (1 / (n * d)) with d = 1/sr.
    let bin_step = 1.0 / (n_fft as f64 * (1.0 / sample_rate));
    let fft_freqs: Vec<f64> = (0..n_bins).map(|k| k as f64 * bin_step).collect();
    // numpy.linspace over mel, n_mels + 2 points (start + i*step, exact end point).
    let (lo, hi) = (hz_to_mel_slaney(fmin), hz_to_mel_slaney(fmax));
    let n_pts = n_mels + 2;
    let step = (hi - lo) / (n_pts - 1) as f64;
    let mel_pts: Vec<f64> = (0..n_pts)
        .map(|i| if i == n_pts - 1 { hi } else { lo + i as f64 * step })
        .map(mel_to_hz_slaney)
        .collect();
    (0..n_mels)
        .map(|m| {
            let (left, centre, right) = (mel_pts[m], mel_pts[m + 1], mel_pts[m + 2]);
            let enorm = 2.0 / (right - left);
            fft_freqs
                .iter()
                .map(|&f| {
                    let lower = -(left - f) / (centre - left);
                    let upper = (right - f) / (right - centre);
                    (0.0f64.max(lower.min(upper)) * enorm) as f32
                })
                .collect()
        })
        .collect()
}

/// One-sided magnitude-type spectra of the frames of `signal` (already padded), f64 FFT.
/// `frame_fn` receives each spectrum (re, im pairs) and returns the value per bin.
pub(crate) fn stft_frames(
    signal: &[f32],
    n_fft: usize,
    hop: usize,
    window: &[f64],
    mut per_frame: impl FnMut(usize, &[realfft::num_complex::Complex<f64>]),
) -> usize {
    if signal.len() < n_fft {
        return 0;
    }
    let n_frames = (signal.len() - n_fft) / hop + 1;
    let mut planner = RealFftPlanner::<f64>::new();
    let fft = planner.plan_fft_forward(n_fft);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    for t in 0..n_frames {
        let frame = &signal[t * hop..t * hop + n_fft];
        for ((dst, &x), &w) in input.iter_mut().zip(frame).zip(window) {
            *dst = x as f64 * w;
        }
        // Lengths are fixed by construction, so the FFT cannot fail.
        fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch).expect("fft sizes are consistent");
        per_frame(t, &spectrum);
    }
    n_frames
}

/// The flow's prompt mel at 24 kHz: [T, 80], T = floor(N / 480). Empty for N < 721 samples
/// (reflect padding needs more than 720 samples).
pub fn mel_24k(samples: &[f32]) -> Array2<f32> {
    let pad = (N_FFT - HOP) / 2;
    if samples.len() <= pad {
        return Array2::zeros((0, N_MELS));
    }
    let padded = reflect_pad(samples, pad);
    let window = periodic_hann(N_FFT);
    let bank = slaney_mel_filterbank(SAMPLE_RATE, N_FFT, N_MELS, 0.0, SAMPLE_RATE / 2.0);
    let n_frames = (padded.len() - N_FFT) / HOP + 1;
    let mut out = Array2::<f32>::zeros((n_frames, N_MELS));
    let mut magnitude = vec![0.0f64; N_FFT / 2 + 1];
    stft_frames(&padded, N_FFT, HOP, &window, |t, spec| {
        for (m, c) in magnitude.iter_mut().zip(spec) {
            *m = (c.re * c.re + c.im * c.im + 1e-9).sqrt();
        }
        for (k, row) in bank.iter().enumerate() {
            let e: f64 = row.iter().zip(&magnitude).map(|(&w, &m)| w as f64 * m).sum();
            out[[t, k]] = e.max(1e-5).ln() as f32;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filterbank_rows_are_area_normalised_triangles() {
        let bank = slaney_mel_filterbank(16000.0, 400, 128, 0.0, 8000.0);
        assert_eq!(bank.len(), 128);
        assert!(bank.iter().all(|r| r.len() == 201));
        // Every weight is non-negative and each row peaks once.
        for row in &bank {
            assert!(row.iter().all(|&w| w >= 0.0));
        }
        // Row 0 spans 0..46.8 Hz; with 40 Hz bins only bin 1 lies strictly inside it.
        let nz: Vec<usize> = (0..201).filter(|&k| bank[0][k] > 0.0).collect();
        assert_eq!(nz, vec![1]);
    }

    #[test]
    fn frame_count_is_floor_n_over_hop() {
        let x: Vec<f32> = (0..74400).map(|i| ((i as f32) * 0.01).sin() * 0.3).collect();
        assert_eq!(mel_24k(&x).shape(), &[155, 80]);
        assert_eq!(mel_24k(&x[..1000]).shape(), &[2, 80]);
    }
}
