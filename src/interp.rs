//! torch's 1-D linear interpolation taps (`F.interpolate(mode="linear", align_corners=False)`) in
//! float32 with its index arithmetic, shared by the flow's speed change and HiFT's source
//! down-sampling, both of which must match torch to the bit.

/// The two input positions and weights of output index `j`, for `ratio` = input length / output
/// length as torch holds it (float32): `out[j] = in[i0]·l0 + in[i1]·l1`, returned as
/// `(i0, i1, l0, l1)`. `len_in` must be at least 1.
pub fn linear_taps(ratio: f32, j: usize, len_in: usize) -> (usize, usize, f32, f32) {
    let src = (ratio * (j as f32 + 0.5) - 0.5).max(0.0);
    let i0 = src as usize;
    let i1 = if i0 < len_in - 1 { i0 + 1 } else { i0 };
    let l1 = (src - i0 as f32).clamp(0.0, 1.0);
    (i0, i1, 1.0 - l1, l1)
}
