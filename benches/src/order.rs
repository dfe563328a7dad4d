//! The order groups run in, and the order of the steps inside a round:
//! random, from one seed that the bench prints, so a run can be repeated
//! (`LOCKBENCH_BENCH_SEED=<seed>`) and no backend or group always runs
//! first, on a cold machine, or last, on a hot one.
//!
//! Every use draws from its own generator, derived from the seed and a
//! label (`backends`, `redis/groups`, `uncontended/redis`): criterion's
//! filters skip groups without shifting the draws of the others.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// The environment variable that fixes the seed.
pub const SEED_VAR: &str = "LOCKBENCH_BENCH_SEED";

/// The run's seed: [`SEED_VAR`] if set to a number, else one drawn from
/// the clock.
///
/// # Errors
/// [`SEED_VAR`] set to something that is not a `u64`.
pub fn seed() -> Result<u64, String> {
    match std::env::var(SEED_VAR) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{SEED_VAR} must be a number, not {v:?}")),
        Err(_) => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| {
                u64::from(d.subsec_nanos()) ^ d.as_secs().rotate_left(32)
            })),
    }
}

/// The generator for `label` under `seed`.
pub fn rng(seed: u64, label: &str) -> StdRng {
    // FNV-1a of the label: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    StdRng::seed_from_u64(seed ^ h)
}

/// `items` shuffled by the generator for `label` under `seed`.
pub fn shuffled<T>(mut items: Vec<T>, seed: u64, label: &str) -> Vec<T> {
    items.shuffle(&mut rng(seed, label));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_order_per_label() {
        let v: Vec<u32> = (0..20).collect();
        assert_eq!(shuffled(v.clone(), 7, "a"), shuffled(v.clone(), 7, "a"));
        assert_ne!(shuffled(v.clone(), 7, "a"), shuffled(v.clone(), 7, "b"));
        assert_ne!(shuffled(v.clone(), 7, "a"), shuffled(v, 8, "a"));
    }
}
