//! Prompt token / prompt mel alignment (`frontend_zero_shot`, CosyVoice3 always at 24 kHz):
//! `L = min(floor(T_mel / 2), n_tokens)`; keep the first `L` tokens and the first `2L` mel frames.
//! The same trimmed tokens feed the LLM and the flow.

use ndarray::{s, Array2};

/// Trims `tokens` and the 24 kHz prompt mel `mel` ([T, 80]) to the 1 token : 2 frames ratio.
pub fn align_prompt<T: Clone>(tokens: &[T], mel: &Array2<f32>) -> (Vec<T>, Array2<f32>) {
    let len = (mel.nrows() / 2).min(tokens.len());
    (tokens[..len].to_vec(), mel.slice(s![..2 * len, ..]).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_to_the_shorter_side() {
        // 155 frames, 78 tokens -> 77 (the reference prompt_24k).
        let mel = Array2::from_shape_fn((155, 80), |(t, m)| (t * 80 + m) as f32);
        let tokens: Vec<i32> = (0..78).collect();
        let (tok, m) = align_prompt(&tokens, &mel);
        assert_eq!(tok.len(), 77);
        assert_eq!(m.shape(), &[154, 80]);
        assert_eq!(m[[153, 79]], mel[[153, 79]]);
        // Fewer tokens than frames/2: the mel is cut.
        let (tok, m) = align_prompt(&tokens[..10], &mel);
        assert_eq!((tok.len(), m.nrows()), (10, 20));
    }
}
