//! Who gets the lock next: hand-overs, barging and fairness, read from a
//! history.
//!
//! On each contended key (one that more than one worker tried to take),
//! the successful acquires in order of completion form a chain of holds.
//! Each step from one hold to the next is exactly one of:
//! - a **hand-over**: the next hold is another worker's, and the previous
//!   holder's release began no later than that acquire completed, returned
//!   ok, and found the lock still its own (`was_held: true`): the lock was
//!   given, not lost;
//! - **barging**: the same worker took it again right after releasing it
//!   (whether or not anyone else was waiting);
//! - a **take-over**: another worker got it without such a release (the
//!   lease expired, the release failed or was in doubt, the holder died, or
//!   the two holds overlapped).
//!
//! Fairness ([`fairness`]) is read from the same history: how the
//! acquires spread over the workers, and each worker's waits during which
//! other workers took the key ([`Wait`]), judged against what a FIFO queue
//! allows ([`fifo_overtake_bound`]).
//!
//! ```
//! use harness::history::{Event, Op, Outcome};
//! let ev = |w, op, i, c| Event { worker: w, key: "k".into(), op, invoke_ns: i, complete_ns: c,
//!     outcome: Outcome::Ok, token: None, was_held: (op == Op::Release).then_some(true),
//!     round_trips: None, told: None, lost_ns: None, error: None };
//! // Worker 1 waits from 5; worker 0 releases at 100; worker 1 holds at 130.
//! let h = vec![ev(0, Op::Acquire, 0, 10), ev(1, Op::Acquire, 5, 130),
//!              ev(0, Op::Release, 100, 110), ev(1, Op::Release, 200, 210)];
//! let w = harness::handover::walk(&h);
//! assert_eq!((w.handovers, w.barging, w.takeovers), (1, 0, 0));
//! assert_eq!(w.latency_ns, vec![30]);
//! ```

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::history::{Event, Op, Outcome};

/// What [`walk`] found, over all contended keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// Keys that more than one worker tried to acquire.
    pub contended_keys: u64,
    /// Successful acquires after each contended key's first: the steps
    /// (= `handovers + barging + takeovers`).
    pub acquires_after_first: u64,
    /// Steps to another worker after a clean release.
    pub handovers: u64,
    /// Steps to the same worker.
    pub barging: u64,
    /// Steps to another worker without a clean release.
    pub takeovers: u64,
    /// Hand-over latency samples (release invoked -> next acquire
    /// completed), for the hand-overs whose acquirer was already waiting
    /// when the release began: for the others the gap is the lock lying
    /// idle, not the hand-over.
    pub latency_ns: Vec<u64>,
}

/// Classifies every step from one hold to the next on the contended keys
/// of `history` (see the module docs).
pub fn walk(history: &[Event]) -> Walk {
    #[derive(Default)]
    struct Key<'a> {
        tried: BTreeSet<u32>,
        holds: Vec<&'a Event>,
        releases: HashMap<u32, Vec<&'a Event>>,
    }
    let mut keys: HashMap<&str, Key> = HashMap::new();
    for e in history {
        match e.op {
            Op::Acquire => {
                let k = keys.entry(e.key.as_str()).or_default();
                k.tried.insert(e.worker);
                if e.outcome == Outcome::Ok {
                    k.holds.push(e);
                }
            }
            Op::Release => keys
                .entry(e.key.as_str())
                .or_default()
                .releases
                .entry(e.worker)
                .or_default()
                .push(e),
            Op::Exit | Op::Releasing => {}
        }
    }
    let mut w = Walk::default();
    for k in keys.values_mut() {
        if k.tried.len() < 2 {
            continue;
        }
        w.contended_keys += 1;
        k.holds.sort_by_key(|a| (a.complete_ns, a.worker));
        for r in k.releases.values_mut() {
            r.sort_by_key(|r| r.invoke_ns);
        }
        for pair in k.holds.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            w.acquires_after_first += 1;
            if next.worker == prev.worker {
                w.barging += 1;
                continue;
            }
            // The previous holder's release of that hold: its first release
            // after the acquire completed (a worker releases before it
            // acquires again).
            let release = k.releases.get(&prev.worker).and_then(|rs| {
                let i = rs.partition_point(|r| r.invoke_ns < prev.complete_ns);
                rs.get(i).copied()
            });
            match release {
                Some(r)
                    if r.outcome == Outcome::Ok
                        && r.was_held == Some(true)
                        && r.invoke_ns <= next.complete_ns =>
                {
                    w.handovers += 1;
                    if next.invoke_ns < r.invoke_ns {
                        w.latency_ns.push(next.complete_ns - r.invoke_ns);
                    }
                }
                _ => w.takeovers += 1,
            }
        }
    }
    w
}

/// Hand-over figures of a run (contended keys only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handovers {
    /// Keys that more than one worker tried to acquire.
    pub contended_keys: u64,
    /// Successful acquires after each contended key's first.
    pub acquires_after_first: u64,
    /// The lock went to another worker after a clean release (ok, and the
    /// lock was still the releaser's).
    pub handovers: u64,
    /// Hand-overs per second of the run's measured wall time.
    pub handovers_per_s: f64,
    /// The same worker took the lock again right after releasing it.
    pub barging: u64,
    /// `barging / acquires_after_first`: near 1, one worker keeps the lock
    /// while the others time out.
    pub barging_fraction: f64,
    /// Another worker got the lock without a clean release (expired lease,
    /// failed or doubtful release, dead holder, overlap).
    pub takeovers: u64,
}

/// The figures of [`walk`] over a run of `wall_s` seconds; `None` when no
/// key was contended.
pub fn handovers(w: &Walk, wall_s: f64) -> Option<Handovers> {
    (w.contended_keys > 0).then(|| Handovers {
        contended_keys: w.contended_keys,
        acquires_after_first: w.acquires_after_first,
        handovers: w.handovers,
        handovers_per_s: if wall_s > 0.0 {
            w.handovers as f64 / wall_s
        } else {
            0.0
        },
        barging: w.barging,
        barging_fraction: if w.acquires_after_first > 0 {
            w.barging as f64 / w.acquires_after_first as f64
        } else {
            0.0
        },
        takeovers: w.takeovers,
    })
}

/// How evenly the workers got the lock, over the whole run, and the wait
/// that was least fair: what a backend declaring `fair` (FIFO) is held to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fairness {
    /// Successful acquires of each worker, by worker id (workers that got
    /// none included).
    pub acquires_by_worker: Vec<u64>,
    /// Jain's index of those counts: 1 = all equal, 1/workers = one worker
    /// got everything.
    pub jain_index: f64,
    /// The largest worker's share of all successful acquires.
    pub max_share: f64,
    /// The smallest worker's share (0 = a worker starved).
    pub min_share: f64,
    /// Most acquires of any worker ÷ fewest. `None` when some worker got
    /// none (listed in [`Fairness::starved`]): the ratio is then unbounded,
    /// and JSON has no infinity, so the page says "starved" instead. Absent
    /// in results from before it was kept.
    #[serde(default)]
    pub spread: Option<f64>,
    /// Workers that got no acquire at all, by id (whether or not they
    /// tried: a worker that could not connect starves too).
    #[serde(default)]
    pub starved: Vec<u32>,
    /// The longest wait of any worker during which another worker took the
    /// lock on the same key (see [`Wait`]); `None` when no wait was
    /// overtaken, or in results from before it was kept.
    #[serde(default)]
    pub longest_wait: Option<Wait>,
    /// The wait that saw the most acquires by other workers (ties: the
    /// longer); the figure [`Wait::beyond_fifo`] judges.
    #[serde(default)]
    pub most_overtaken: Option<Wait>,
}

/// One acquire of one worker, from its invoke to its completion, with the
/// successful acquires other workers completed on the same key meanwhile.
///
/// Every completion counts, ok, fail (a timeout) and info alike: a worker
/// that waited its whole `wait` and gave up while others took the lock
/// again and again is the starvation this figure is for, so leaving out
/// failed acquires would hide the worst case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    /// The waiting worker.
    pub worker: u32,
    /// Its wait: acquire invoked -> completed, µs.
    pub wait_us: f64,
    /// Successful acquires other workers completed on the key strictly
    /// inside the wait.
    pub overtakes: u64,
    /// How the wait ended.
    pub outcome: Outcome,
    /// Other workers that tried the key during the run.
    pub rivals: u32,
    /// The most overtakes FIFO allows in one wait: `2 x rivals` (see
    /// [`fifo_overtake_bound`]).
    pub fifo_bound: u64,
}

impl Wait {
    /// More acquires by others during this one wait than any FIFO queue
    /// lets through: evidence against a declared `fair`.
    pub fn beyond_fifo(&self) -> bool {
        self.overtakes > self.fifo_bound
    }
}

/// The most acquires by other workers that a FIFO lock lets complete
/// during one wait, with `rivals` other workers on the key.
///
/// Under FIFO each other worker can be ahead of the waiter at most once
/// (a worker has one acquire outstanding; once it releases and asks again
/// it queues behind the waiter): `rivals`. The bound allows as many again,
/// because the history times the client, not the queue: an acquire joins
/// the server's queue a network trip (or an acquire's first steps) after
/// its invoke, so a rival that asked just after the waiter can still be
/// ahead of it, and a rival's acquire that was granted just before the
/// invoke can complete just after it. More than `2 x rivals` cannot be
/// explained that way; with a hold of 0 and a lock that lets a releasing
/// worker barge, waits see dozens.
pub fn fifo_overtake_bound(rivals: u32) -> u64 {
    2 * u64::from(rivals)
}

/// The overtaken waits of `history`: (the longest, the most overtaken).
fn waits(history: &[Event]) -> (Option<Wait>, Option<Wait>) {
    #[derive(Default)]
    struct Key<'a> {
        tried: BTreeSet<u32>,
        /// Completion times of all ok acquires, sorted.
        ok: Vec<u64>,
        /// The same per worker.
        ok_by: HashMap<u32, Vec<u64>>,
        acquires: Vec<&'a Event>,
    }
    let mut keys: HashMap<&str, Key> = HashMap::new();
    for e in history.iter().filter(|e| e.op == Op::Acquire) {
        let k = keys.entry(e.key.as_str()).or_default();
        k.tried.insert(e.worker);
        k.acquires.push(e);
        if e.outcome == Outcome::Ok {
            k.ok.push(e.complete_ns);
            k.ok_by.entry(e.worker).or_default().push(e.complete_ns);
        }
    }
    // Completions strictly inside (from, to).
    let inside = |v: &[u64], from: u64, to: u64| {
        let lo = v.partition_point(|&c| c <= from);
        let hi = v.partition_point(|&c| c < to);
        hi.saturating_sub(lo) as u64
    };
    let (mut longest, mut most): (Option<Wait>, Option<Wait>) = (None, None);
    for k in keys.values_mut() {
        if k.tried.len() < 2 {
            continue;
        }
        k.ok.sort_unstable();
        for v in k.ok_by.values_mut() {
            v.sort_unstable();
        }
        let rivals = u32::try_from(k.tried.len() - 1).unwrap_or(u32::MAX);
        for e in &k.acquires {
            let own = k
                .ok_by
                .get(&e.worker)
                .map_or(0, |v| inside(v, e.invoke_ns, e.complete_ns));
            let overtakes = inside(&k.ok, e.invoke_ns, e.complete_ns).saturating_sub(own);
            if overtakes == 0 {
                continue;
            }
            let w = Wait {
                worker: e.worker,
                wait_us: (e.complete_ns - e.invoke_ns) as f64 / 1000.0,
                overtakes,
                outcome: e.outcome,
                rivals,
                fifo_bound: fifo_overtake_bound(rivals),
            };
            if longest.as_ref().is_none_or(|l| w.wait_us > l.wait_us) {
                longest = Some(w.clone());
            }
            if most
                .as_ref()
                .is_none_or(|m| (w.overtakes, w.wait_us) > (m.overtakes, m.wait_us))
            {
                most = Some(w);
            }
        }
    }
    (longest, most)
}

/// Most acquires of any worker ÷ fewest, from per-worker counts; `None`
/// when there are none or some worker got none (never a division by zero:
/// the caller names the starved workers instead).
pub fn spread(acquires_by_worker: &[u64]) -> Option<f64> {
    let max = acquires_by_worker.iter().max()?;
    let min = acquires_by_worker.iter().min()?;
    (*min > 0).then(|| *max as f64 / *min as f64)
}

/// Fairness over `workers` workers from the successful acquires in
/// `history`, and its overtaken waits; `None` when nothing was acquired.
pub fn fairness(history: &[Event], workers: u32) -> Option<Fairness> {
    let mut counts = vec![0u64; workers as usize];
    for e in history {
        if e.op == Op::Acquire && e.outcome == Outcome::Ok {
            if let Some(c) = counts.get_mut(e.worker as usize) {
                *c += 1;
            }
        }
    }
    let total: u64 = counts.iter().sum();
    let jain = crate::stats::jain_index(&counts)?;
    let share = |c: Option<&u64>| c.map_or(0.0, |c| *c as f64 / total as f64);
    let (max, min) = (counts.iter().max(), counts.iter().min());
    let spread = spread(&counts);
    let starved = (0..workers)
        .filter(|w| counts.get(*w as usize) == Some(&0))
        .collect();
    let (longest_wait, most_overtaken) = waits(history);
    Some(Fairness {
        jain_index: jain,
        max_share: share(max),
        min_share: share(min),
        spread,
        starved,
        longest_wait,
        most_overtaken,
        acquires_by_worker: counts,
    })
}
