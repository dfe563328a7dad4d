//! When and in what order a worker does things: the latency workload's
//! order of steps within an iteration, and the open loop's Poisson
//! arrivals. Both come from the run's seed, so a run can be replayed.
//!
//! ```
//! use harness::pacing::{worker_seed, Stream, StepOrder};
//! let mut a = StepOrder::new(worker_seed(7, 0, Stream::Order));
//! let mut b = StepOrder::new(worker_seed(7, 0, Stream::Order));
//! let (mut x, mut y) = ([0, 1, 2], [0, 1, 2]);
//! a.shuffle(&mut x);
//! b.shuffle(&mut y);
//! assert_eq!(x, y);
//! ```

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::history::monotonic_ns;

/// What a worker's random stream is for. Each gets its own seed, so that
/// turning the open loop on does not change the order of steps, and the
/// other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The order of steps within a latency iteration.
    Order,
    /// Open-loop inter-arrival times.
    Arrivals,
}

/// A worker's seed for one stream: the run's seed mixed with the worker id
/// and the stream by SplitMix64's finaliser, so that neighbouring workers
/// (and seeds) get unrelated streams.
pub fn worker_seed(run_seed: u64, worker: u32, stream: Stream) -> u64 {
    let tag = match stream {
        Stream::Order => 1u64,
        Stream::Arrivals => 2,
    };
    let mut z = run_seed
        ^ (u64::from(worker) << 8 | tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ 0xD1B5_4A32_D192_ED03;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seeded order of the latency workload's steps (floor, peers, our
/// cycle) in each iteration. A fixed order would give each step a fixed
/// position relative to the others (the one after our release always
/// meets a server busy expiring our key, say); shuffling spreads such
/// effects over all of them alike.
#[derive(Debug, Clone)]
pub struct StepOrder {
    rng: StdRng,
}

impl StepOrder {
    /// From a seed (see [`worker_seed`]).
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Puts `steps` in a fresh uniformly random order (Fisher-Yates: every
    /// permutation equally likely, whatever order they were in).
    pub fn shuffle<T>(&mut self, steps: &mut [T]) {
        steps.shuffle(&mut self.rng);
    }
}

/// An open-loop worker's arrival times: a Poisson process (exponential
/// gaps) from a start time. The schedule never looks at how the worker is
/// doing: a worker behind its schedule finds its next arrival already due.
#[derive(Debug, Clone)]
pub struct Arrivals {
    rng: StdRng,
    mean_gap_s: f64,
    next_ns: u64,
}

impl Arrivals {
    /// Arrivals at `rate_per_s` on average, the first one gap after
    /// `start_ns`. `rate_per_s` must be positive and finite (see
    /// [`crate::spec::RunPlan::open_loop_rate`]); anything else is taken
    /// as one per second rather than dividing by it.
    pub fn new(seed: u64, rate_per_s: f64, start_ns: u64) -> Self {
        let rate = if rate_per_s.is_finite() && rate_per_s > 0.0 {
            rate_per_s
        } else {
            1.0
        };
        Self {
            rng: StdRng::seed_from_u64(seed),
            mean_gap_s: 1.0 / rate,
            next_ns: start_ns,
        }
    }

    /// The next arrival's intended start (CLOCK_MONOTONIC ns).
    pub fn next_ns(&mut self) -> u64 {
        // Inverse-CDF sampling; 1 - u is in (0, 1], so the log is finite.
        let u: f64 = self.rng.random();
        let gap_s = -self.mean_gap_s * (1.0 - u).ln();
        // An absurd gap becomes "never", not a wrap.
        let gap_ns = Duration::try_from_secs_f64(gap_s).map_or(u64::MAX, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        });
        self.next_ns = self.next_ns.saturating_add(gap_ns);
        self.next_ns
    }
}

/// Below this much time left, [`sleep_until_ns`] stops using tokio's
/// timer. Tokio's timer ticks in whole milliseconds and rounds up, so it
/// alone would start a typical arrival 0.5 ms late, and the open loop would
/// charge that to the lock (a 100 µs cycle would read as 600 µs).
const COARSE_MARGIN_NS: u64 = 2_000_000;

/// Waits until CLOCK_MONOTONIC reaches `target_ns` (returns at once if it
/// has): tokio's timer for the bulk, then a precise OS sleep on a blocking
/// thread (nanosleep, tens of µs late at worst) so the runtime's threads
/// stay free for the lock's background tasks (watchdogs, keep-alives).
pub async fn sleep_until_ns(target_ns: u64) {
    let left = target_ns.saturating_sub(monotonic_ns());
    if left > COARSE_MARGIN_NS {
        tokio::time::sleep(Duration::from_nanos(left - COARSE_MARGIN_NS)).await;
    }
    let left = target_ns.saturating_sub(monotonic_ns());
    if left > 0 {
        let d = Duration::from_nanos(left);
        // A failed join only means the sleep was cut short: start early.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use std::collections::BTreeSet;

    use super::*;

    fn orders(seed: u64, n: usize, count: usize) -> Vec<Vec<usize>> {
        let mut o = StepOrder::new(seed);
        let mut steps: Vec<usize> = (0..n).collect();
        (0..count)
            .map(|_| {
                o.shuffle(&mut steps);
                steps.clone()
            })
            .collect()
    }

    #[test]
    fn the_order_is_deterministic_per_seed_and_worker() {
        let s = worker_seed(42, 3, Stream::Order);
        assert_eq!(orders(s, 4, 200), orders(s, 4, 200));
        assert_ne!(
            orders(s, 4, 200),
            orders(worker_seed(42, 4, Stream::Order), 4, 200)
        );
        assert_ne!(
            orders(s, 4, 200),
            orders(worker_seed(43, 3, Stream::Order), 4, 200)
        );
        assert_ne!(s, worker_seed(42, 3, Stream::Arrivals));
    }

    #[test]
    fn the_order_covers_every_permutation_about_evenly() {
        // Floor, one peer, our cycle: 6 orders, 6000 draws.
        let all = orders(worker_seed(1, 0, Stream::Order), 3, 6000);
        let mut seen = std::collections::BTreeMap::<Vec<usize>, u32>::new();
        for o in &all {
            *seen.entry(o.clone()).or_default() += 1;
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        // 1000 expected each; 6 sigma is about 220.
        assert!(seen.values().all(|c| (780..=1220).contains(c)), "{seen:?}");
        // Every step leads as often as any other.
        let firsts: BTreeSet<usize> = all.iter().map(|o| o[0]).collect();
        assert_eq!(firsts.len(), 3);
    }

    #[test]
    fn arrivals_are_seeded_increasing_and_at_the_asked_rate() {
        let mut a = Arrivals::new(9, 1000.0, 1_000);
        let mut b = Arrivals::new(9, 1000.0, 1_000);
        let xs: Vec<u64> = (0..20_000).map(|_| a.next_ns()).collect();
        let ys: Vec<u64> = (0..20_000).map(|_| b.next_ns()).collect();
        assert_eq!(xs, ys);
        assert!(xs.windows(2).all(|w| w[0] <= w[1]));
        assert!(xs[0] > 1_000);
        // Mean gap 1 ms; over 20,000 gaps the mean is within 3 % (4 sigma
        // is 2.8 %).
        let mean = (xs[19_999] - 1_000) as f64 / 20_000.0;
        assert!((mean - 1e6).abs() < 3e4, "{mean}");
        // Exponential: about 1 - 1/e of the gaps are below the mean.
        let short = xs.windows(2).filter(|w| w[1] - w[0] < 1_000_000).count() as f64;
        assert!((short / 19_999.0 - 0.632).abs() < 0.02, "{short}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sleep_until_is_never_early() {
        let mut late = Vec::new();
        for _ in 0..21 {
            let target = monotonic_ns() + 3_300_000;
            sleep_until_ns(target).await;
            let now = monotonic_ns();
            assert!(now >= target, "woke {} ns early", target - now);
            late.push(now - target);
        }
        late.sort_unstable();
        // How late is a speed figure, for the benchmarks (a bound here
        // either failed on a loaded machine or passed a plain tokio
        // sleep); this only catches a gross error, such as a unit mix-up
        // sleeping a thousand times too long.
        assert!(late[10] < 50_000_000, "{late:?}");
        sleep_until_ns(0).await;
    }
}
