//! The one random number generator of the crate: the sampler's, synthetic weights' and the
//! kernel checks'. A leaf: the same numbers on every target from the same seed.

/// xoshiro256** seeded by splitmix64: small, fast and identical on every target (rand's
/// SmallRng is not: it changes algorithm with the pointer width).
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Self([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform on [−2.5, 2.5): a cheap spread of values for the kernel checks the package runs
    /// at every load (a normal costs a logarithm and a cosine, in software in wasm), wide
    /// enough that scaled and clamped values reach their extremes.
    pub fn spread(&mut self) -> f32 {
        (self.next_f64() * 5.0 - 2.5) as f32
    }

    /// Standard normal (Box–Muller), for synthetic weights.
    pub fn normal(&mut self) -> f32 {
        let u1 = self.next_f64().max(1e-300);
        let u2 = self.next_f64();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// A fresh seed for a sampled request that gave none, so that unseeded requests differ (seed
/// 0 for all of them gave three identical answers at temperature 0.9): the process's random
/// hash keys (std's `RandomState`, a new pair each call) over a counter and the clock. Report
/// it, so that a request can be replayed. Native only (the browser's package draws its own).
#[cfg(not(target_arch = "wasm32"))]
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(DRAWN.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
