//! Shape buckets (`runtime.shape_buckets`): the few lengths the `dit` and `hift_decode` calls are
//! padded up to, so that a GPU provider sees the same input shapes again and reuses its
//! convolution plans (cuDNN makes them anew for each new shape) instead of meeting a new length
//! on every call. The padding itself is the callers' (src/pipeline/stages.rs for the DiT,
//! src/hift.rs for HiFT); this is only the rule that picks the length.

/// The DiT's bucket step in frames: its streaming block (`dit_block_frames`, 50 for CosyVoice3).
/// A streaming request's non-final DiT calls already end on multiples of it (chunk ends land on
/// multiples of 25 tokens = 50 frames from the prompt's start), so only final and offline calls
/// are padded.
pub const DIT_BUCKET_STEP: usize = 50;

/// HiFT's bucket step in mel frames: one streaming hop's new frames (25 tokens · 2 frames).
/// A windowed streaming call decodes a fixed context plus the new frames, so after the first
/// chunk its lengths are already whole hops above the base ([`crate::hift::HiftStream::bucket_base`]).
pub const HIFT_BUCKET_STEP: usize = 50;

/// The bucket of a call of `n` frames: `base` plus the whole number of `step`s that holds it, so
/// a call wastes less than one step. `base` is a fixed overhead every call of the schedule
/// carries (HiFT's window context); lengths up to `base` are kept as they are. `step == 0` turns
/// bucketing off.
///
/// The step does not grow with the length: a streaming request's non-final DiT calls end on
/// whole 50-frame steps at every length (and HiFT's windows after the first on whole hops above
/// the base), so fixed steps leave them unpadded, where coarser steps for long calls would pad
/// the latency-critical calls of long sentences. The price is one length per step up to the
/// longest call (60 for the DiT's 3000 frames).
pub fn bucket_len(n: usize, base: usize, step: usize) -> usize {
    if step == 0 || n <= base {
        return n;
    }
    base.saturating_add((n - base).div_ceil(step).saturating_mul(step))
}

#[cfg(test)]
mod tests {
    use super::bucket_len;

    #[test]
    fn small_calls_round_up_to_whole_steps() {
        assert_eq!(bucket_len(1, 0, 50), 50);
        assert_eq!(bucket_len(50, 0, 50), 50);
        assert_eq!(bucket_len(51, 0, 50), 100);
        assert_eq!(bucket_len(400, 0, 50), 400);
        // The part above the base counts: HiFT's streaming windows (base 40) of 100 and 200 new
        // frames stay as they are.
        assert_eq!(bucket_len(140, 40, 50), 140);
        assert_eq!(bucket_len(240, 40, 50), 240);
        assert_eq!(bucket_len(47, 40, 50), 90);
        assert_eq!(bucket_len(97, 40, 50), 140);
        assert_eq!(bucket_len(30, 40, 50), 30);
    }

    #[test]
    fn long_calls_keep_whole_steps() {
        assert_eq!(bucket_len(401, 0, 50), 450);
        assert_eq!(bucket_len(450, 0, 50), 450);
        assert_eq!(bucket_len(674, 0, 50), 700);
        assert_eq!(bucket_len(2999, 0, 50), 3000);
    }

    #[test]
    fn a_bucket_holds_the_call_and_wastes_little() {
        for base in [0, 40] {
            for n in 1..5000 {
                let b = bucket_len(n, base, 50);
                assert!(b >= n, "{n} -> {b}");
                if n > base {
                    assert!(b - n < 50, "{n} -> {b}: too much padding");
                    // Idempotent: a bucket is its own bucket.
                    assert_eq!(bucket_len(b, base, 50), b);
                }
            }
        }
        // One length per step up to the 3000-frame DiT profile.
        let distinct: std::collections::BTreeSet<usize> = (1..=3000).map(|n| bucket_len(n, 0, 50)).collect();
        assert_eq!(distinct.len(), 60);
    }

    #[test]
    fn step_zero_is_off() {
        assert_eq!(bucket_len(123, 0, 0), 123);
    }
}
