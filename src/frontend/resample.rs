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
//!
//! **Odd rates.** That kernel has `new · (2w + orig)` taps, which grows with the product of the
//! *reduced* rates: 44101 Hz → 16 kHz does not reduce at all (gcd 1) and would need 700 M taps
//! (2.8 GB) and as many multiplications per 44101 input samples. Written out, the tap between
//! input sample `n` and output sample `m` is the same function of `t = (n/R_in − m/R_out) ·
//! min(R_in, R_out) · rolloff` (`R` the rates in Hz) whatever the gcd, and it is zero where
//! `|t| ≥ width`. So when the polyphase kernel would be large ([`MAX_KERNEL_TAPS`],
//! [`MAX_KERNEL_ROW`]) each output sample is computed directly from the ≈ `2·width / rolloff ·
//! max(1, R_in/R_out)` input samples inside its window (at most 291 for 384 kHz → 16 kHz):
//! O(input + output) time and memory for any rate. The filter is the same; what differs from
//! torchaudio there is float rounding only (torchaudio rounds each phase `j/new` and each tap to
//! f32 and accumulates in f32; here the taps are exact f64), ≈ 1e-7 of full scale. Every common
//! rate (16, 22.05, 24, 32, 44.1, 48, 88.2, 96, 176.4, 192, 352.8, 384 kHz) takes the polyphase
//! path and stays torchaudio-equal in construction.

const LOWPASS_FILTER_WIDTH: f64 = 6.0;
const ROLLOFF: f64 = 0.99;
/// Largest polyphase kernel (`new · (2w + orig)` f32 taps, 4 MiB) built; above it, the direct path.
pub const MAX_KERNEL_TAPS: u64 = 1 << 20;
/// Longest polyphase kernel row (`2w + orig` multiplications per output sample); above it, the
/// direct path (which only visits the taps inside the window).
pub const MAX_KERNEL_ROW: u64 = 4096;

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
/// resampler does (for odd rates whose polyphase kernel would be huge, the same filter evaluated
/// directly; see the module docs). Equal rates return a copy. Bounded time and memory for any
/// pair of non-zero rates; a zero rate returns the input unchanged (callers refuse such audio).
pub fn resample(input: &[f32], from_rate: u32, to_rate: u32) -> Vec<f32> {
    if from_rate == to_rate || input.is_empty() || from_rate == 0 || to_rate == 0 {
        return input.to_vec();
    }
    let g = gcd(from_rate as u64, to_rate as u64);
    let (orig, new) = (from_rate as u64 / g, to_rate as u64 / g);
    if uses_polyphase(orig, new) {
        resample_polyphase(input, orig, new)
    } else {
        resample_direct(input, from_rate, to_rate)
    }
}

/// Whether the reduced rates `orig`/`new` give a kernel small enough to build.
fn uses_polyphase(orig: u64, new: u64) -> bool {
    let base = orig.min(new) as f64 * ROLLOFF;
    let half_width = (LOWPASS_FILTER_WIDTH * orig as f64 / base).ceil();
    let row = 2.0 * half_width + orig as f64;
    row <= MAX_KERNEL_ROW as f64 && row * new as f64 <= MAX_KERNEL_TAPS as f64
}

/// Whether `from_rate` → `to_rate` is computed with torchaudio's polyphase kernel (not the direct
/// path for odd rates).
pub fn is_torchaudio_kernel(from_rate: u32, to_rate: u32) -> bool {
    if from_rate == to_rate || from_rate == 0 || to_rate == 0 {
        return true;
    }
    let g = gcd(from_rate as u64, to_rate as u64);
    uses_polyphase(from_rate as u64 / g, to_rate as u64 / g)
}

/// torchaudio's polyphase construction for the reduced rates `orig`/`new`.
fn resample_polyphase(input: &[f32], orig: u64, new: u64) -> Vec<f32> {
    let kernel = sinc_hann_kernel(orig, new);
    let w = kernel.half_width;
    let orig_us = orig as usize;
    let n_taps = 2 * w + orig_us;

    let mut padded = vec![0.0f32; w];
    padded.extend_from_slice(input);
    padded.resize(input.len() + 2 * w + orig_us, 0.0);

    let n_blocks = (padded.len() - n_taps) / orig_us + 1;
    let target_len = (new as u128 * input.len() as u128).div_ceil(orig as u128) as usize;
    let mut out = Vec::with_capacity(target_len);
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

/// The same windowed-sinc filter evaluated per output sample over the input samples inside its
/// window (any rates, no kernel table). Output sample `m` sits at input position
/// `m · from / to`; tap `n` has `t = (n·to − m·from) / (from·to) · base` with `base =
/// min(from, to) · rolloff` (the gcd cancels), nonzero for `|t| < width`.
pub(crate) fn resample_direct(input: &[f32], from_rate: u32, to_rate: u32) -> Vec<f32> {
    use std::f64::consts::PI;
    let (from, to) = (from_rate as u64, to_rate as u64);
    let target_len = (to as u128 * input.len() as u128).div_ceil(from as u128) as usize;
    let base = from.min(to) as f64 * ROLLOFF;
    let scale = base / from as f64;
    // |n − centre| < half window, in input samples.
    let reach = LOWPASS_FILTER_WIDTH * from as f64 / base;
    // t = (n·to − m·from) · t_unit; from one input sample to the next t grows by t_step.
    let t_unit = base / (from as f64 * to as f64);
    let t_step = base / from as f64;
    // From one input sample to the next, π·t grows by π·t_step: sin(π t) and cos(π t / width)
    // follow by rotation (two sin_cos per output sample instead of two per tap; the rotation's
    // rounding stays near 1e-14 over the ≤ 300 taps of a window).
    let step = PI * t_step;
    let (s_step, c_step) = step.sin_cos();
    let (sw_step, cw_step) = (step / LOWPASS_FILTER_WIDTH).sin_cos();
    let last = input.len() as i64 - 1;
    let mut out = Vec::with_capacity(target_len);
    for m in 0..target_len as u64 {
        let centre = (m as u128 * from as u128) as f64 / to as f64;
        let lo = ((centre - reach).ceil() as i64).max(0);
        let hi = ((centre + reach).floor() as i64).min(last);
        // The tap exactly on the output sample (t = 0), if any: n = m·from/to.
        let pos = m as u128 * from as u128;
        let zero_at = if pos.is_multiple_of(to as u128) { (pos / to as u128) as i64 } else { -1 };
        let t0 = (lo as i128 * to as i128 - pos as i128) as f64 * t_unit;
        let (mut s, mut c) = (PI * t0).sin_cos();
        let (mut sw, mut cw) = (PI * t0 / LOWPASS_FILTER_WIDTH).sin_cos();
        let mut acc = 0.0f64;
        let window_in = if hi >= lo { &input[lo as usize..=hi as usize] } else { &[][..] };
        for (k, &x) in window_in.iter().enumerate() {
            let t = t0 + k as f64 * t_step;
            if t.abs() < LOWPASS_FILTER_WIDTH {
                // cos²(π t / (2·width)) = (1 + cos(π t / width)) / 2
                let window = 0.5 * (1.0 + cw);
                let sinc = if lo + k as i64 == zero_at { 1.0 } else { s / (PI * t) };
                acc += sinc * window * x as f64;
            }
            (s, c) = (s * c_step + c * s_step, c * c_step - s * s_step);
            (sw, cw) = (sw * cw_step + cw * sw_step, cw * cw_step - sw * sw_step);
        }
        out.push((acc * scale) as f32);
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

    fn tone(rate: u32, n: usize, hz: f64) -> Vec<f32> {
        (0..n).map(|i| (2.0 * std::f64::consts::PI * hz * i as f64 / rate as f64).sin() as f32).collect()
    }

    #[test]
    fn common_rates_use_torchaudios_kernel() {
        for from in [16_000, 22_050, 24_000, 32_000, 44_100, 48_000, 88_200, 96_000, 176_400, 192_000, 352_800, 384_000] {
            for to in [16_000, 22_050, 24_000] {
                assert!(is_torchaudio_kernel(from, to), "{from} -> {to}");
            }
        }
        for from in [44_101, 47_999, 96_001, 16_001, 383_999] {
            assert!(!is_torchaudio_kernel(from, 16_000), "{from} -> 16000");
        }
    }

    #[test]
    fn direct_path_is_the_same_filter() {
        // The direct evaluation on rates the kernel also handles: equal up to float rounding.
        for (from, to) in [(44_100, 16_000), (22_050, 24_000), (48_000, 16_000), (16_000, 24_000)] {
            let x = tone(from, 7_919, 440.0);
            let a = resample(&x, from, to);
            let b = resample_direct(&x, from, to);
            assert_eq!(a.len(), b.len(), "{from} -> {to}");
            let err = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            assert!(err < 1e-5, "{from} -> {to}: max |polyphase - direct| = {err}");
        }
    }

    #[test]
    fn odd_rates_resample_in_bounded_work() {
        // 44101 Hz does not reduce against 16 kHz; the polyphase kernel would need 2.8 GB.
        for (from, to) in [(44_101u32, 16_000u32), (47_999, 24_000), (96_001, 16_000), (16_001, 24_000), (383_999, 16_000)] {
            let n = from as usize / 2;
            let x = tone(from, n, 440.0);
            let y = resample(&x, from, to);
            let expect = (to as u64 * n as u64).div_ceil(from as u64) as usize;
            assert_eq!(y.len(), expect, "{from} -> {to}");
            let err = (expect / 4..3 * expect / 4)
                .map(|i| (y[i] as f64 - (2.0 * std::f64::consts::PI * 440.0 * i as f64 / to as f64).sin()).abs())
                .fold(0.0, f64::max);
            assert!(err < 2e-3, "{from} -> {to}: tone error {err}");
        }
        // A rate no file should have still ends (the work is linear in the input).
        let y = resample(&[0.5f32; 1000], u32::MAX, 16_000);
        assert_eq!(y.len(), 1);
    }
}
