//! NumPy's legacy global generator (`np.random.seed` / `np.random.permutation`): MT19937
//! seeded by `init_genrand`, and `RandomState.shuffle`'s Fisher-Yates with masked
//! rejection sampling. mlx-lm's scripts draw their data order from it, so the same seed
//! picks the same samples here.

const N: usize = 624;
const M: usize = 397;

/// `numpy.random.RandomState(seed)`.
#[derive(Clone)]
pub struct RandomState {
    key: [u32; N],
    pos: usize,
}

impl RandomState {
    /// `np.random.seed(seed)` (NumPy takes seeds in `0..2**32`).
    pub fn new(seed: u32) -> RandomState {
        let mut key = [0u32; N];
        let mut s = seed;
        for (i, k) in key.iter_mut().enumerate() {
            *k = s;
            s = 1_812_433_253u32
                .wrapping_mul(s ^ (s >> 30))
                .wrapping_add(i as u32 + 1);
        }
        RandomState { key, pos: N }
    }

    fn generate(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX: u32 = 0x9908_b0df;
        for i in 0..N {
            let y = (self.key[i] & UPPER) | (self.key[(i + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX } else { 0 };
            self.key[i] = self.key[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.pos = 0;
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        if self.pos == N {
            self.generate();
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// The next 64 random bits (two draws, the first one high).
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }

    /// A uniform integer in `0..=max` (NumPy's `random_interval`).
    pub fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for shift in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> shift;
        }
        loop {
            let v = if max <= u64::from(u32::MAX) {
                u64::from(self.next_u32()) & mask
            } else {
                self.next_u64() & mask
            };
            if v <= max {
                return v;
            }
        }
    }

    /// `RandomState.shuffle` of a one-dimensional sequence.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.interval(i as u64) as usize;
            items.swap(i, j);
        }
    }

    /// `RandomState.permutation(n)`: `0..n` shuffled.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        self.shuffle(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::RandomState;

    // Values printed by NumPy 2 (`np.random.seed(s); np.random.permutation(n)`).
    #[test]
    fn permutations_equal_numpy() {
        let cases: &[(u32, usize, &[usize])] = &[
            (123, 10, &[4, 0, 7, 5, 8, 3, 1, 6, 9, 2]),
            (0, 1, &[0]),
            (
                7,
                25,
                &[
                    1, 5, 11, 13, 2, 21, 9, 16, 12, 0, 23, 6, 20, 17, 24, 10, 18, 8, 14, 7, 19, 3,
                    22, 4, 15,
                ],
            ),
            (u32::MAX, 5, &[4, 1, 0, 2, 3]),
        ];
        for &(seed, n, want) in cases {
            assert_eq!(RandomState::new(seed).permutation(n), want, "seed {seed}");
        }
        // Past the first 624 draws (the state is regenerated).
        let p = RandomState::new(1).permutation(1000);
        assert_eq!(&p[..8], &[507, 818, 452, 368, 242, 929, 262, 810]);
    }

    #[test]
    fn raw_draws_equal_mt19937() {
        let mut r = RandomState::new(5489);
        assert_eq!([r.next_u32(), r.next_u32()], [3_499_211_612, 581_869_302]);
    }
}
