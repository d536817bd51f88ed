//! Randomness as a dependency, so jitter is reproducible in tests.

use std::sync::Mutex;

/// A source of uniform numbers in `[0, 1)`.
pub trait RandomSource: Send + Sync + std::fmt::Debug {
    /// The next number in `[0, 1)`.
    fn next_unit(&self) -> f64;
}

/// SplitMix64: tiny, fast and good enough for backoff jitter (not for secrets).
#[derive(Debug)]
pub struct SplitMix64(Mutex<u64>);

impl SplitMix64 {
    /// A generator with a fixed seed (reproducible).
    pub fn seeded(seed: u64) -> Self {
        Self(Mutex::new(seed))
    }

    /// A generator seeded from the time and the address of a stack value,
    /// so relays started together do not jitter in lockstep.
    pub fn from_entropy() -> Self {
        let marker = 0u8;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self::seeded(nanos ^ (&marker as *const u8 as u64).rotate_left(32))
    }

    fn next_u64(&self) -> u64 {
        let mut state = self.0.lock().expect("rng lock");
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl RandomSource for SplitMix64 {
    fn next_unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Always returns the same number; for tests that pin jitter.
#[derive(Debug, Clone, Copy)]
pub struct FixedRandom(pub f64);

impl RandomSource for FixedRandom {
    fn next_unit(&self) -> f64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_stays_in_unit_interval_and_is_reproducible() {
        let a = SplitMix64::seeded(7);
        let b = SplitMix64::seeded(7);
        for _ in 0..1000 {
            let x = a.next_unit();
            assert!((0.0..1.0).contains(&x));
            assert_eq!(x, b.next_unit());
        }
    }
}
