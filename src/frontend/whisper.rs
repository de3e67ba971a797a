//! Whisper log-mel features for the speech tokenizer (`whisper.log_mel_spectrogram(x, n_mels=128)`,
//! openai-whisper 20231117) at 16 kHz.
//!
//! Steps: reflect-pad 200 each side (torch.stft center=True), frames of 400 with hop 160 and a
//! periodic Hann window, drop the last frame, power |X|², 128-bin Slaney mel (librosa, sr 16000,
//! n_fft 400), log10(clamp(·, 1e-10)), floor at (global max − 8), then (x + 4) / 4.
//! Output [128, T] with T = floor(N / 160).

use ndarray::Array2;

use crate::frontend::mel::{slaney_mel_filterbank, stft_frames};
use crate::frontend::{periodic_hann, reflect_pad};

const N_FFT: usize = 400;
const HOP: usize = 160;
pub const N_MELS: usize = 128;

/// Whisper log-mel of 16 kHz `samples`: [128, floor(N/160)]. Inputs of 200 samples or fewer (too
/// short for reflect padding) give an empty [128, 0] array.
pub fn whisper_log_mel(samples: &[f32]) -> Array2<f32> {
    let pad = N_FFT / 2;
    let n_out = samples.len() / HOP;
    if samples.len() <= pad || n_out == 0 {
        return Array2::zeros((N_MELS, 0));
    }
    let padded = reflect_pad(samples, pad);
    let window = periodic_hann(N_FFT);
    let bank = slaney_mel_filterbank(16000.0, N_FFT, N_MELS, 0.0, 8000.0);
    let mut log_mel = Array2::<f64>::zeros((N_MELS, n_out));
    let mut power = vec![0.0f64; N_FFT / 2 + 1];
    stft_frames(&padded, N_FFT, HOP, &window, |t, spec| {
        if t >= n_out {
            return; // whisper drops the last STFT frame
        }
        for (p, c) in power.iter_mut().zip(spec) {
            *p = c.re * c.re + c.im * c.im;
        }
        for (m, row) in bank.iter().enumerate() {
            let e: f64 = row.iter().zip(&power).map(|(&w, &p)| w as f64 * p).sum();
            log_mel[[m, t]] = e.max(1e-10).log10();
        }
    });
    let max = log_mel.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    log_mel.mapv(|v| ((v.max(max - 8.0) + 4.0) / 4.0) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_and_range() {
        let x: Vec<f32> = (0..16000).map(|i| ((i as f32) * 0.05).sin() * 0.5).collect();
        let m = whisper_log_mel(&x);
        assert_eq!(m.shape(), &[128, 100]);
        let max = m.iter().cloned().fold(f32::MIN, f32::max);
        let min = m.iter().cloned().fold(f32::MAX, f32::min);
        // The dynamic range is capped at 8 decades, i.e. 2.0 after the /4.
        assert!(max - min <= 2.0 + 1e-6);
    }
}
