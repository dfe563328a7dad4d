//! Interleaved rounds: a backend's raw floor, its lock cycle and its peers
//! taken side by side.
//!
//! One round runs each part once (the floor probe, one [`crate::cycle`],
//! one cycle of each peer), in a random order drawn per round from a seeded
//! generator, and times each. A group reports one part's time and the
//! others are taken along, so every group's figure comes from rounds where
//! the floor, the lock and the peers met the same machine: a drift of the
//! 2 shared cores (another build, a server's GC, the thermal state) moves
//! them together instead of landing on whichever group ran at the time.
//!
//! Criterion times one figure per benchmark, so each of a backend's
//! `floor`, `uncontended` and `peer` groups runs rounds of its own and
//! reports its part; every round of all of them is also kept in one
//! [`Record`], and the ratios the bench prints (lock ÷ floor, lock ÷ peer)
//! are medians of those paired rounds, not of groups that ran at
//! different times.

use std::time::{Duration, Instant};

use distlock::descriptor::Probe;
use distlock::DistLock;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// One part of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The backend's raw floor (its probe's `once`).
    Floor,
    /// One cycle of the lock under test.
    Lock,
    /// One cycle of the peer at this index.
    Peer(usize),
}

/// What one backend's rounds take.
pub struct Subject<'a> {
    /// The lock under test.
    pub lock: &'a dyn DistLock,
    /// The key it cycles (free: nobody else takes it).
    pub key: &'a str,
    /// Its raw floor, if it has one.
    pub floor: Option<&'a dyn Probe>,
    /// Its peers, by name.
    pub peers: Vec<(&'a str, &'a dyn Probe)>,
}

impl Subject<'_> {
    /// Every part a round runs, in the column order of a [`Record`].
    pub fn parts(&self) -> Vec<Part> {
        let mut p = Vec::with_capacity(2 + self.peers.len());
        if self.floor.is_some() {
            p.push(Part::Floor);
        }
        p.push(Part::Lock);
        p.extend((0..self.peers.len()).map(Part::Peer));
        p
    }

    /// The name of `part` (`floor`, `lock`, or the peer's name).
    pub fn name(&self, part: Part) -> &str {
        match part {
            Part::Floor => "floor",
            Part::Lock => "lock",
            Part::Peer(i) => self.peers.get(i).map_or("?", |(n, _)| n),
        }
    }

    async fn once(&self, part: Part) -> distlock::Result<()> {
        match part {
            Part::Floor => match self.floor {
                Some(f) => f.once().await,
                None => Ok(()),
            },
            Part::Lock => crate::cycle(self.lock, self.key).await,
            Part::Peer(i) => match self.peers.get(i) {
                Some((_, p)) => p.once().await,
                None => Ok(()),
            },
        }
    }
}

/// Every round's time of each part, in ns, in [`Subject::parts`] order.
#[derive(Debug, Default)]
pub struct Record {
    rows: Vec<Vec<u64>>,
}

impl Record {
    /// How many rounds it holds.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The median time of column `col` over every round, in ns.
    pub fn median(&self, col: usize) -> Option<f64> {
        let mut v: Vec<f64> = self
            .rows
            .iter()
            .filter_map(|r| r.get(col).map(|&ns| ns as f64))
            .collect();
        crate::median(&mut v)
    }

    /// The median over rounds of column `a` ÷ column `b` of the same
    /// round (the paired ratio).
    pub fn paired_ratio(&self, a: usize, b: usize) -> Option<f64> {
        let mut v = self.ratios(a, b);
        crate::median(&mut v)
    }

    /// The paired ratio with its 95 % order-statistic interval (the
    /// estimate's `_us` fields hold the ratio here, not microseconds).
    pub fn paired_ratio_ci(&self, a: usize, b: usize) -> Option<harness::stats::MedianEstimate> {
        harness::stats::median_estimate(&self.ratios(a, b))
    }

    fn ratios(&self, a: usize, b: usize) -> Vec<f64> {
        self.rows
            .iter()
            .filter_map(|r| match (r.get(a), r.get(b)) {
                (Some(&x), Some(&y)) if y > 0 => Some(x as f64 / y as f64),
                _ => None,
            })
            .collect()
    }
}

/// Runs `iters` rounds of `subject` and returns the summed time of
/// `report`; every round's times go onto `record` unless it is `None`
/// (a warm-up).
///
/// # Errors
/// The first part that fails.
pub async fn run(
    subject: &Subject<'_>,
    rng: &mut StdRng,
    iters: u64,
    report: Part,
    mut record: Option<&mut Record>,
) -> distlock::Result<Duration> {
    let parts = subject.parts();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    let mut reported = Duration::ZERO;
    for _ in 0..iters {
        order.shuffle(rng);
        let mut row = vec![0u64; parts.len()];
        for &col in &order {
            let part = parts[col];
            let t0 = Instant::now();
            subject.once(part).await?;
            let took = t0.elapsed();
            if part == report {
                reported += took;
            }
            row[col] = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        }
        if let Some(r) = record.as_deref_mut() {
            r.rows.push(row);
        }
    }
    Ok(reported)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn paired_ratio_is_per_round() {
        let r = Record {
            rows: vec![vec![10, 20], vec![100, 110], vec![1, 3]],
        };
        assert_eq!(r.median(0), Some(10.0));
        assert_eq!(r.median(1), Some(20.0));
        // Rounds 2.0, 1.1, 3.0: median 2.0, where the medians give 2.0 too
        // by chance; a drift between rounds does not enter the pairs.
        assert_eq!(r.paired_ratio(1, 0), Some(2.0));
    }
}
