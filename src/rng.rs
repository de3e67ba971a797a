//! Random number generation.
//!
//! Two unrelated uses:
//!
//! * **Replaying construction-time noise.** The official HiFT source adds uniform noise taken from a
//!   `torch.rand(1, 7_200_000, 9)` tensor drawn while the model is built (cosyvoice3.md §11). torch's
//!   CPU generator is a plain MT19937 with the classic `init_genrand` seeding, and a float32
//!   `torch.rand` element is `(out & 0xFFFFFF) / 2^24` of one 32-bit output. So the tensor is the
//!   seed-0 stream after discarding `offset` outputs ([`sine_noise_offset`]).
//! * **Sampling.** RAS draws use our own generator ([`SamplingRng`]), reproducible for a given seed.
//!   It does not (and cannot) reproduce torch's `multinomial` draws.

/// The 32-bit Mersenne Twister, identical to C++ `std::mt19937`, numpy's `RandomState` and torch's
/// CPU generator.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; Self::N],
    index: usize,
}

impl Mt19937 {
    const N: usize = 624;
    const M: usize = 397;
    const MATRIX_A: u32 = 0x9908_b0df;
    const UPPER_MASK: u32 = 0x8000_0000;
    const LOWER_MASK: u32 = 0x7fff_ffff;

    /// Classic `init_genrand(seed)` seeding (only the low 32 bits of the seed are used, as torch does
    /// for `manual_seed` values below 2^32).
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; Self::N];
        state[0] = seed;
        for i in 1..Self::N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, index: Self::N }
    }

    /// Regenerates the whole state block (the "twist").
    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..Self::N {
            let y = (s[i] & Self::UPPER_MASK) | (s[(i + 1) % Self::N] & Self::LOWER_MASK);
            let mag = if y & 1 == 0 { 0 } else { Self::MATRIX_A };
            s[i] = s[(i + Self::M) % Self::N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// The next tempered 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= Self::N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// Skips `n` outputs. Whole blocks are skipped with a bare twist (no tempering), so skipping the
    /// ~5 million outputs before the sine noise costs a few milliseconds.
    pub fn discard(&mut self, mut n: u64) {
        let left_in_block = (Self::N - self.index.min(Self::N)) as u64;
        if n <= left_in_block {
            self.index += n as usize;
            return;
        }
        n -= left_in_block;
        self.index = Self::N;
        while n >= Self::N as u64 {
            self.twist();
            self.index = Self::N;
            n -= Self::N as u64;
        }
        if n > 0 {
            self.twist();
            self.index = n as usize;
        }
    }

    /// torch's float32 `rand` value for one output: the low 24 bits scaled to [0, 1).
    pub fn next_torch_f32(&mut self) -> f32 {
        (self.next_u32() & 0x00ff_ffff) as f32 / 16_777_216.0
    }

    /// A 53-bit uniform double in [0, 1) (numpy's `random_sample`, MT's `genrand_res53`).
    pub fn next_f64(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }
}

/// Width of a row of the official sine-noise tensor. Fixed at 9 by the official code, whatever
/// `nb_harmonics` is.
pub const SINE_NOISE_WIDTH: usize = 9;

/// Number of generator outputs consumed after `torch.manual_seed(0)` and before the HiFT
/// `sine_waves` draw (cosyvoice3.md §11), for the flow sizes `v` (vocab), `i` (input size), `s`
/// (speaker embedding dim), `o` (output size) and the f0 predictor sizes `f` (in channels),
/// `c` (cond channels), `n` (classes).
pub fn sine_noise_offset(v: u64, i: u64, s: u64, o: u64, f: u64, c: u64, n: u64) -> u64 {
    // randn on a contiguous tensor of >= 16 elements: one output per element, +16 if not a
    // multiple of 16.
    let randn = |count: u64| if count.is_multiple_of(16) { count } else { count + 16 };
    let rand_noise = randn(80 * 15_000);
    let input_embedding = randn(v * i);
    let spk_affine = o * s + o;
    let f0_conv0 = 4 * c * f + c;
    let f0_convs = 4 * (3 * c * c + c);
    let classifier = n * c + n;
    let rand_ini = 9;
    rand_noise + input_embedding + spk_affine + f0_conv0 + f0_convs + classifier + rand_ini
}

/// The first `n_rows` rows (×9, flat index `row·9 + harmonic`) of the official sine-noise tensor,
/// i.e. torch float32 `rand` values of the seed-0 MT19937 stream after `offset` discarded outputs.
pub fn sine_noise(offset: u64, n_rows: usize) -> Vec<f32> {
    let mut table = SineNoise::new(offset);
    table.ensure_rows(n_rows);
    table.values
}

/// A growable cache of the sine-noise tensor: rows are generated on first use and kept, so a
/// streaming session that re-runs the source on a longer prefix only pays for the new rows.
#[derive(Clone)]
pub struct SineNoise {
    generator: Mt19937,
    values: Vec<f32>,
}

impl SineNoise {
    /// Positions a seed-0 generator after `offset` outputs (see [`sine_noise_offset`]).
    pub fn new(offset: u64) -> Self {
        let mut generator = Mt19937::new(0);
        generator.discard(offset);
        SineNoise { generator, values: Vec::new() }
    }

    /// Makes sure at least `n_rows` rows exist.
    pub fn ensure_rows(&mut self, n_rows: usize) {
        let want = n_rows * SINE_NOISE_WIDTH;
        if self.values.len() < want {
            self.values.reserve(want - self.values.len());
            while self.values.len() < want {
                self.values.push(self.generator.next_torch_f32());
            }
        }
    }

    /// Rows `0..n_rows`, flat (`row·9 + harmonic`), generated if needed.
    pub fn rows(&mut self, n_rows: usize) -> &[f32] {
        self.ensure_rows(n_rows);
        &self.values[..n_rows * SINE_NOISE_WIDTH]
    }
}

/// The sampling generator for RAS: MT19937 seeded with the user's seed, drawing 53-bit doubles.
/// The same seed gives the same draws on every run and platform.
#[derive(Clone)]
pub struct SamplingRng {
    mt: Mt19937,
}

impl SamplingRng {
    /// A generator for `seed`. Seeds above 2^32 are folded into 32 bits (xor of the halves).
    pub fn new(seed: u64) -> Self {
        SamplingRng { mt: Mt19937::new((seed ^ (seed >> 32)) as u32) }
    }

    /// A uniform double in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.mt.next_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_std_mt19937_reference_outputs() {
        // C++11 [rand.predef]: the 10000th output of a default-constructed mt19937 (seed 5489).
        let mut mt = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = mt.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
        // numpy RandomState(0).randint(0, 2**32) style raw outputs: first seed-0 output.
        let mut mt0 = Mt19937::new(0);
        assert_eq!(mt0.next_u32(), 2_357_136_044);
        assert_eq!(mt0.next_u32(), 2_546_248_239);
        // numpy RandomState(0).random_sample(): 0.5488135039273248
        let mut r = SamplingRng::new(0);
        assert!((r.uniform() - 0.548_813_503_927_324_8).abs() < 1e-16);
    }

    #[test]
    fn discard_equals_drawing() {
        for &n in &[0u64, 1, 623, 624, 625, 1247, 1248, 5000, 100_003] {
            let mut a = Mt19937::new(0);
            let mut b = Mt19937::new(0);
            for _ in 0..n {
                a.next_u32();
            }
            b.discard(n);
            assert_eq!(a.next_u32(), b.next_u32(), "n = {n}");
            // and a second discard from a mid-block position
            a.discard(700);
            for _ in 0..700 {
                b.next_u32();
            }
            assert_eq!(a.next_u32(), b.next_u32(), "n = {n} (+700)");
        }
    }

    #[test]
    fn full_size_offset_is_documented_value() {
        assert_eq!(sine_noise_offset(6561, 80, 192, 80, 80, 512, 1), 5_052_970);
    }
}
