//! How long a lost RedLock round waits before the next one.
//!
//! The spec ("Distributed Locks with Redis", *Retry on Failure*): a client
//! that could not get the lock retries after a RANDOM delay, so that
//! clients racing for the same resource desynchronise; the delay depends
//! on nothing the nodes order (every node is asked at once, and none is
//! "first"). Every policy here keeps both: each draws at random, from a
//! window that depends only on this acquisition's own history and on what
//! the nodes answered as a whole, and the window never exceeds the lock's
//! validity (a fixed lease's lease minus drift).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// The retry-delay policy (`redlock.retry_policy`,
/// `LOCKBENCH_REDLOCK_RETRY_POLICY`); the window's size is
/// `redlock.retry_delay_ms` (D below). Used with `redlock.fair = false`;
/// the default queue waits for a release's wake-up instead, and uses the
/// policy only while fewer than a quorum of masters answer.
///
/// Measured with `tests/contention.rs` (one key, hold 0, every worker its
/// own handle and connections, 5 local masters, D = 20 ms; a 2-core machine
/// shared with other builds, so medians of 5 rounds of 3 s each;
/// `LOCKBENCH_CONTENTION_ROUNDS=5 cargo test --release -p lockbench-redlock
/// --test contention -- --ignored --nocapture`):
///
/// | policy       | N  | cycles/s | acquire p50 / p99 / max (ms) | hand-over p50 / p99 (ms) | round trips / acquire | 16 vs 4 |
/// |--------------|----|----------|------------------------------|--------------------------|-----------------------|---------|
/// | uniform      |  4 | 2868     | 0.17 / 34.6 / 132            | 0.32 / 0.58              | 1.18                  |         |
/// | uniform      | 16 | 2226     | 0.21 / 100.4 / 291           | 0.37 / 2.11              | 2.17                  | 78 %    |
/// | decorrelated |  4 | 2813     | 0.18 / 28.0 / 221            | 0.33 / 0.60              | 1.32                  |         |
/// | decorrelated | 16 | 2174     | 0.21 / 125.2 / 440           | 0.39 / 2.31              | 2.35                  | 77 %    |
/// | **aging**    |  4 | 2810     | 0.18 / 31.1 / 91             | 0.33 / 0.55              | 1.20                  |         |
/// | **aging**    | 16 | 2454     | 0.19 / 69.2 / 146            | 0.34 / 2.15              | 2.18                  | 87 %    |
///
/// A second run of 5 rounds, under heavier load from other builds (load
/// average 7-10): uniform 2421 -> 1577 cycles/s (65 %), p99 at 16 115 ms;
/// aging 2468 -> 1929 (78 %), p99 77 ms; decorrelated 1698, p99 140 ms.
///
/// Why the tail: with hold 0 the holder that releases asks again at once
/// (its first round has no delay) while the others sleep, so a waiter wins
/// only a round that falls in the short gap between a release and the
/// next acquire; with a window that never changes, a waiter that lost ten
/// rounds is as slow to ask as a newcomer, and the 1 % that keep losing
/// make the p99. Aging halves the worst case (max) and cuts the p99 by
/// a third at the SAME server work (round trips per acquire as uniform's:
/// a lost round now costs one round trip where its nodes all said "held",
/// see `RedLock::attempt`), and keeps 16 workers above 80 % of 4. A window
/// shrinking as D / k (tried as well) cut the p99 a little further (about
/// 55-60 ms) but asked 40 % more rounds (2.5-3.3 round trips per acquire at
/// 16) and lost 15-25 % of the 16-worker cycles on this CPU-bound machine;
/// D / k^0.75 likewise. Decorrelated jitter starts fast, then waits up to D
/// whatever the wait so far: the worst tail of the three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryPolicy {
    /// The original: uniform in `[0, D)` after every lost round, the same
    /// window however long this acquisition has waited already; a lost
    /// round is given back on every node, even those that said "held by
    /// another" (as the spec words it). Kept to be measured against.
    Uniform,
    /// Capped decorrelated jitter (AWS, "Exponential backoff and jitter"):
    /// uniform in `[1 ms, 3 x the previous delay)`, at most D; starts small
    /// and grows towards D, each draw random.
    Decorrelated,
    /// The default. Uniform in `[0, D / sqrt(k))` after the k-th lost round
    /// of this acquisition (never below 1 ms): the first retry is the
    /// original's, and the longer an acquisition has waited, the more often
    /// it asks (k rounds take about D x sqrt(k), so the rounds asked grow
    /// with the square of the time waited), so a long losing streak gets
    /// ever less likely and the acquire tail is bounded, while the many
    /// short waits ask no more often than before. The window also never
    /// runs past the moment a quorum of the nodes will have let the
    /// holder's key expire (the acquire script replies with the key's PTTL
    /// when it is held): a holder that died is followed at once, even with
    /// a large D.
    #[default]
    Aging,
}

impl RetryPolicy {
    /// Every policy, by its config name.
    pub const ALL: [(&'static str, RetryPolicy); 3] = [
        ("uniform", RetryPolicy::Uniform),
        ("decorrelated", RetryPolicy::Decorrelated),
        ("aging", RetryPolicy::Aging),
    ];

    /// The name in TOML and in the environment.
    pub fn name(self) -> &'static str {
        match self {
            RetryPolicy::Uniform => "uniform",
            RetryPolicy::Decorrelated => "decorrelated",
            RetryPolicy::Aging => "aging",
        }
    }
}

impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a policy; says which names are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = RetryPolicy::ALL.iter().map(|(n, _)| *n).collect();
        write!(
            f,
            "unknown retry policy {:?}, expected one of: {}",
            self.0,
            names.join(", ")
        )
    }
}

impl FromStr for RetryPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        RetryPolicy::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(t))
            .map(|(_, p)| *p)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// By name, with an error that lists the names (serde alone would say
/// "unknown variant"); the settings reader adds the key.
impl<'de> Deserialize<'de> for RetryPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: UnknownPolicy| serde::de::Error::custom(e.to_string()))
    }
}

/// What a lost round tells the next delay.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LostRound {
    /// When a quorum of the nodes will have let the holder's key expire:
    /// the quorum-th smallest PTTL among the nodes that said "held" (none
    /// if fewer than a quorum said so with an expiry).
    pub holder_expires_in: Option<Duration>,
}

/// The delays of one acquisition.
#[derive(Debug)]
pub(crate) struct Backoff {
    policy: RetryPolicy,
    /// D, already bounded by the lock's validity.
    window: Duration,
    lost: u32,
    previous: Duration,
}

/// The smallest window [`RetryPolicy::Aging`] shrinks to, and the floor of
/// [`RetryPolicy::Decorrelated`]'s draws.
const FLOOR: Duration = Duration::from_millis(1);

/// Uniform in `[lo, hi)` at microsecond resolution; `lo` if empty.
fn uniform(lo: Duration, hi: Duration) -> Duration {
    let (lo_us, hi_us) = (micros(lo), micros(hi));
    if hi_us <= lo_us {
        return lo;
    }
    Duration::from_micros(rand::random_range(lo_us..hi_us))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Backoff {
    /// `window` = `redlock.retry_delay_ms`; `validity` = the most a delay
    /// may last (the lease minus drift).
    pub(crate) fn new(policy: RetryPolicy, window: Duration, validity: Duration) -> Self {
        Self {
            policy,
            window: window.min(validity).max(Duration::from_micros(1)),
            lost: 0,
            previous: FLOOR,
        }
    }

    /// The delay after a lost round.
    pub(crate) fn next(&mut self, round: LostRound) -> Duration {
        self.lost = self.lost.saturating_add(1);
        match self.policy {
            RetryPolicy::Uniform => uniform(Duration::ZERO, self.window),
            RetryPolicy::Decorrelated => {
                let hi = self.previous.saturating_mul(3).min(self.window);
                let d = uniform(FLOOR.min(self.window), hi.max(FLOOR));
                self.previous = d.max(FLOOR);
                d.min(self.window)
            }
            RetryPolicy::Aging => {
                // D / sqrt(k): k rounds lost take about D x sqrt(k), so the
                // rounds asked grow with the square of the time waited.
                let w = self
                    .window
                    .div_f64(f64::from(self.lost).sqrt())
                    .max(FLOOR.min(self.window));
                let w = match round.holder_expires_in {
                    // +1 ms: the key is gone by then, not just going.
                    Some(e) => w.min(e + FLOOR),
                    None => w,
                };
                uniform(Duration::ZERO, w)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const D: Duration = Duration::from_millis(20);
    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn names_round_trip_and_a_bad_one_names_the_choices() {
        for (n, p) in RetryPolicy::ALL {
            assert_eq!(n.parse::<RetryPolicy>().unwrap(), p);
            assert_eq!(p.to_string(), n);
        }
        let e = "fifo".parse::<RetryPolicy>().unwrap_err().to_string();
        assert!(e.contains("\"fifo\"") && e.contains("aging"), "{e}");
    }

    #[test]
    fn uniform_stays_in_its_window() {
        let mut b = Backoff::new(RetryPolicy::Uniform, D, LONG);
        for _ in 0..1000 {
            assert!(b.next(LostRound::default()) < D);
        }
    }

    #[test]
    fn aging_shrinks_to_the_floor_and_never_passes_the_holders_expiry() {
        let mut b = Backoff::new(RetryPolicy::Aging, D, LONG);
        for k in 1..=1000u32 {
            let d = b.next(LostRound::default());
            let w = D.div_f64(f64::from(k).sqrt()).max(FLOOR);
            assert!(d < w, "round {k}: {d:?}");
        }
        let mut b = Backoff::new(RetryPolicy::Aging, Duration::from_secs(5), LONG);
        let round = LostRound {
            holder_expires_in: Some(Duration::from_millis(3)),
        };
        for _ in 0..1000 {
            assert!(b.next(round) < Duration::from_millis(4));
        }
    }

    #[test]
    fn decorrelated_is_capped_by_the_window() {
        let mut b = Backoff::new(RetryPolicy::Decorrelated, D, LONG);
        for _ in 0..1000 {
            let d = b.next(LostRound::default());
            assert!(d < D && d >= FLOOR, "{d:?}");
        }
    }

    #[test]
    fn no_window_outlasts_the_validity() {
        let validity = Duration::from_millis(5);
        for (_, p) in RetryPolicy::ALL {
            let mut b = Backoff::new(p, D, validity);
            for _ in 0..1000 {
                assert!(b.next(LostRound::default()) <= validity, "{p}");
            }
        }
    }
}
