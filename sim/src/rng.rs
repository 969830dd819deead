//! Seeded randomness that repeats exactly. Two kinds:
//!
//! - [`Rng`], a stream (SplitMix64) for what is drawn in a fixed order — a thread's whole
//!   workload is drawn up front from its own stream, so every variant of a comparison gets
//!   the same work whatever the pool does with it;
//! - [`draw`], a value hashed from a seed and a few numbers naming the occasion (a request
//!   and its attempt), for what is drawn in an order the pool's decisions shape (faults,
//!   latencies): the same occasion draws the same value in every variant.

/// One SplitMix64 step: the next state and its output.
fn mix(state: u64) -> (u64, u64) {
    let next = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = next;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (next, z ^ (z >> 31))
}

/// A uniform value in [0, 1) hashed from `seed` and `parts`.
pub fn draw(seed: u64, parts: &[u64]) -> f64 {
    let mut state = seed;
    for part in parts {
        state = mix(state ^ part).1;
    }
    unit(mix(state).1)
}

fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// A seeded stream of random values.
#[derive(Debug, Clone)]
pub struct Rng {
    seed: u64,
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng {
            seed,
            state: mix(seed).1,
        }
    }

    /// An independent stream for `tag` (a thread's index, say), the same whatever was drawn
    /// from this one before.
    pub fn fork(&self, tag: u64) -> Rng {
        Rng::new(mix(self.seed ^ mix(tag).1).1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let (next, out) = mix(self.state);
        self.state = next;
        out
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        unit(self.next_u64())
    }

    /// Uniform in `[lo, hi]` (whole numbers).
    pub fn between(&mut self, [lo, hi]: [u64; 2]) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, [lo, hi]: [f64; 2]) -> f64 {
        lo + (hi - lo).max(0.0) * self.unit()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// An index drawn with the given weights (all zero: the first).
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return 0;
        }
        let mut at = self.unit() * total;
        for (i, w) in weights.iter().enumerate() {
            if at < *w {
                return i;
            }
            at -= w;
        }
        weights.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_repeat_and_forks_do_not_depend_on_what_was_drawn() {
        let mut a = Rng::new(1);
        let mut b = Rng::new(1);
        assert_eq!(a.next_u64(), b.next_u64());
        let fork_after = a.fork(3).next_u64();
        let fresh = Rng::new(1);
        assert_eq!(fresh.fork(3).next_u64(), fork_after);
        assert_ne!(fresh.fork(4).next_u64(), fork_after);
    }

    #[test]
    fn draws_are_uniform_enough_and_named_by_their_occasion() {
        let n = 20_000;
        let mean: f64 = (0..n).map(|i| draw(9, &[i, 1])).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert_eq!(draw(9, &[5, 1]), draw(9, &[5, 1]));
        assert_ne!(draw(9, &[5, 1]), draw(9, &[5, 2]));
        let mut r = Rng::new(2);
        for _ in 0..1000 {
            let x = r.between([3, 7]);
            assert!((3..=7).contains(&x));
            let w = r.weighted(&[0.0, 1.0, 0.0]);
            assert_eq!(w, 1);
        }
    }
}
