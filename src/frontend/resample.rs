//! Band-limited resampling identical in construction to torchaudio's default
//! (`torchaudio.transforms.Resample(orig, new)`: method `sinc_interp_hann`, lowpass filter width 6,
//! rolloff 0.99).
//!
//! Why our own code rather than `rubato`: the prompt features (whisper mel, kaldi fbank, 24 kHz
//! mel) are compared with the official ones at 1e-4..1e-3, and the speech tokenizer's FSQ
//! rounding margin on the reference prompts is only 0.0036. A different (even better) filter
//! shifts every feature and can flip tokens. So we rebuild torchaudio's exact polyphase kernel.
//!
//! Algorithm (facts from torchaudio's `_get_sinc_resample_kernel` / `_apply_sinc_resample_kernel`):
//! * reduce the rates by their gcd to `orig`/`new`; cutoff `base = min(orig, new) * rolloff`;
//! * half width `w = ceil(width * orig / base)` input samples;
//! * phase `j` (0..new) has taps `k` (0..2w+orig) at time `t = ((k - w)/orig - j/new) * base`,
//!   clamped to ±width; tap = sinc(π t) · cos²(π t / (2·width)) · base/orig, built in f64 and
//!   rounded to f32 (torchaudio's kernel dtype);
//! * input zero-padded by `w` on the left and `w + orig` on the right, strided by `orig`;
//!   output sample `i·new + j` = `Σ_k tap[j][k] · x_pad[i·orig + k]`; keep `ceil(new·len/orig)`.

const LOWPASS_FILTER_WIDTH: f64 = 6.0;
const ROLLOFF: f64 = 0.99;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The polyphase kernel: `new` rows of `2w + orig` f32 taps, and the half width `w`.
struct SincKernel {
    taps: Vec<Vec<f32>>,
    half_width: usize,
}

fn sinc_hann_kernel(orig: u64, new: u64) -> SincKernel {
    let base = orig.min(new) as f64 * ROLLOFF;
    let half_width = (LOWPASS_FILTER_WIDTH * orig as f64 / base).ceil() as usize;
    let n_taps = 2 * half_width + orig as usize;
    let scale = base / orig as f64;
    let taps = (0..new)
        .map(|j| {
            // torchaudio divides the integer phase index in the default float dtype (f32) before
            // adding the f64 tap positions; reproduce that rounding.
            let phase = -(j as f32) / new as f32;
            (0..n_taps)
                .map(|k| {
                    let idx = (k as f64 - half_width as f64) / orig as f64;
                    let t = ((phase as f64 + idx) * base).clamp(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH);
                    let window = (t * std::f64::consts::PI / LOWPASS_FILTER_WIDTH / 2.0).cos().powi(2);
                    let t = t * std::f64::consts::PI;
                    let sinc = if t == 0.0 { 1.0 } else { t.sin() / t };
                    (sinc * (window * scale)) as f32
                })
                .collect()
        })
        .collect();
    SincKernel { taps, half_width }
}

/// Resamples mono `input` from `from_rate` to `to_rate` Hz exactly as torchaudio's default
/// resampler does. Equal rates return a copy.
pub fn resample(input: &[f32], from_rate: u32, to_rate: u32) -> Vec<f32> {
    if from_rate == to_rate || input.is_empty() {
        return input.to_vec();
    }
    let g = gcd(from_rate as u64, to_rate as u64);
    let (orig, new) = (from_rate as u64 / g, to_rate as u64 / g);
    let kernel = sinc_hann_kernel(orig, new);
    let w = kernel.half_width;
    let orig_us = orig as usize;
    let n_taps = 2 * w + orig_us;

    let mut padded = vec![0.0f32; w];
    padded.extend_from_slice(input);
    padded.resize(input.len() + 2 * w + orig_us, 0.0);

    let n_blocks = (padded.len() - n_taps) / orig_us + 1;
    let target_len = (new as u128 * input.len() as u128).div_ceil(orig as u128) as usize;
    let mut out = Vec::with_capacity(n_blocks * new as usize);
    'blocks: for i in 0..n_blocks {
        let frame = &padded[i * orig_us..i * orig_us + n_taps];
        for taps in &kernel.taps {
            if out.len() == target_len {
                break 'blocks;
            }
            let acc: f64 = taps.iter().zip(frame).map(|(&k, &x)| k as f64 * x as f64).sum();
            out.push(acc as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_length_is_ceil_of_ratio() {
        for (n, from, to) in [(74400usize, 24000, 16000), (40000, 16000, 24000), (7, 24000, 16000), (1, 16000, 22050)] {
            let x = vec![0.1f32; n];
            let y = resample(&x, from, to);
            let expect = ((to as f64) * n as f64 / from as f64).ceil() as usize;
            assert_eq!(y.len(), expect, "{n} {from}->{to}");
        }
    }

    #[test]
    fn kernel_shape_matches_torchaudio() {
        // 24 kHz -> 16 kHz reduces to 3 -> 2: base 1.98, width ceil(6*3/1.98) = 10, 23 taps.
        let k = sinc_hann_kernel(3, 2);
        assert_eq!(k.half_width, 10);
        assert_eq!(k.taps.len(), 2);
        assert!(k.taps.iter().all(|r| r.len() == 23));
        // Phase 0, centre tap: sinc(0) * cos(0)^2 * base/orig = 0.66.
        assert!((k.taps[0][10] - 0.66).abs() < 1e-7);
    }

    #[test]
    fn low_tone_survives_and_dc_is_kept() {
        let from = 24000.0;
        let x: Vec<f32> = (0..24000).map(|i| (2.0 * std::f64::consts::PI * 440.0 * i as f64 / from).sin() as f32).collect();
        let y = resample(&x, 24000, 16000);
        // Compare the middle against the analytic tone at 16 kHz.
        let err = (4000..12000)
            .map(|i| (y[i] as f64 - (2.0 * std::f64::consts::PI * 440.0 * i as f64 / 16000.0).sin()).abs())
            .fold(0.0, f64::max);
        assert!(err < 2e-3, "tone error {err}");
    }
}
