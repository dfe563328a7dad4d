//! Checkers over a history.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::history::{Event, Op, Outcome, Told};

/// One pair of holders whose critical sections intersect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlapPair {
    /// Lock key.
    pub key: String,
    /// The earlier holder's worker id and token.
    pub first_worker: u32,
    /// Its token.
    pub first_token: Option<u64>,
    /// The later holder.
    pub second_worker: u32,
    /// Its token.
    pub second_token: Option<u64>,
    /// What the earlier holder had been told before it released (`None`:
    /// it never released, or the history does not say).
    #[serde(default)]
    pub first_told: Option<Told>,
    /// When the later holder got the lock (ns, CLOCK_MONOTONIC).
    pub at_ns: u64,
    /// How long both were inside.
    pub overlap_ns: u64,
}

/// The overlap checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlapReport {
    /// Whether no two holders ever overlapped.
    pub valid: bool,
    /// Critical sections that began while another was still open.
    pub violations: u64,
    /// Of those, the ones whose earlier holder was never told (it released
    /// believing the lock was still its own, or never released): the
    /// dangerous kind, that only fencing can stop.
    #[serde(default)]
    pub silent_violations: u64,
    /// The longest overlap.
    pub max_overlap_ns: u64,
    /// Critical sections examined.
    pub holds: u64,
    /// Ok acquisitions with no release in the history (a worker that died,
    /// or a guard never given back). Each still counts as a hold that stays
    /// open until the end of the history.
    pub unreleased: u64,
    /// The first pairs found (at most 100), for timelines.
    pub pairs: Vec<OverlapPair>,
}

/// Pairs a report keeps.
const MAX_PAIRS: usize = 100;

impl OverlapReport {
    /// One report from several checked apart (each host's history on its
    /// own clock): counts add up, the longest overlap is the longest of
    /// all, pairs are kept up to the usual 100.
    pub fn merged(reports: impl IntoIterator<Item = OverlapReport>) -> OverlapReport {
        let mut m = OverlapReport {
            valid: true,
            violations: 0,
            silent_violations: 0,
            max_overlap_ns: 0,
            holds: 0,
            unreleased: 0,
            pairs: Vec::new(),
        };
        for r in reports {
            m.valid &= r.valid;
            m.violations += r.violations;
            m.silent_violations += r.silent_violations;
            m.max_overlap_ns = m.max_overlap_ns.max(r.max_overlap_ns);
            m.holds += r.holds;
            m.unreleased += r.unreleased;
            m.pairs.extend(r.pairs);
        }
        m.pairs.truncate(MAX_PAIRS);
        m
    }
}

/// An ok acquire not yet released: (completed at, token).
type OpenAcquire = (u64, Option<u64>);

/// One critical section as the checker sees it.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub worker: u32,
    pub token: Option<u64>,
    pub start: u64,
    pub end: u64,
    pub told: Option<Told>,
    /// It had no release (the worker died, or the history ended first).
    pub open: bool,
}

/// Mutual exclusion: a holder's interval runs from its acquire's completion
/// to its release's invocation; two intervals on one key that intersect are
/// a violation (touching ends are not). An `info` acquire means the worker
/// did not enter its critical section, so it holds nothing. A hold with no
/// release stays open to the end of the history: a second `ok` acquire by
/// the same worker does not close it (a release closes the worker's latest
/// open hold on that key), and a worker that stops recording with a hold
/// open is taken to hold it to the end, or to its death when the history
/// records one (`Op::Exit`).
pub fn check_overlap(history: &[Event]) -> OverlapReport {
    let (keys, unreleased) = holds(history);
    let mut report = OverlapReport {
        valid: true,
        violations: 0,
        silent_violations: 0,
        max_overlap_ns: 0,
        holds: 0,
        unreleased,
        pairs: Vec::new(),
    };
    for (key, hs) in keys {
        report.holds += hs.len() as u64;
        // Sweep: the open interval reaching furthest so far.
        let mut reach: Option<usize> = None;
        for i in 0..hs.len() {
            if let Some(r) = reach {
                let (prev, cur) = (&hs[r], &hs[i]);
                if cur.start < prev.end {
                    let overlap = prev.end.min(cur.end) - cur.start;
                    report.violations += 1;
                    if matches!(prev.told, None | Some(Told::Nothing)) {
                        report.silent_violations += 1;
                    }
                    report.max_overlap_ns = report.max_overlap_ns.max(overlap);
                    if report.pairs.len() < MAX_PAIRS {
                        report.pairs.push(OverlapPair {
                            key: key.clone(),
                            first_worker: prev.worker,
                            first_token: prev.token,
                            second_worker: cur.worker,
                            second_token: cur.token,
                            first_told: prev.told,
                            at_ns: cur.start,
                            overlap_ns: overlap,
                        });
                    }
                }
                if hs[i].end > hs[r].end {
                    reach = Some(i);
                }
            } else {
                reach = Some(i);
            }
        }
    }
    report.valid = report.violations == 0;
    report
}

/// Every key's critical sections, sorted by (start, end), keys in order,
/// and how many had no release.
pub(crate) fn holds(history: &[Event]) -> (Vec<(String, Vec<Hold>)>, u64) {
    // Per worker and key, the acquires waiting for their release (latest last).
    let mut open: HashMap<(u32, &str), Vec<OpenAcquire>> = HashMap::new();
    let mut holds: HashMap<&str, Vec<Hold>> = HashMap::new();
    // Acquires take effect when they complete, releases when invoked: in
    // that order one worker's acquire always precedes its release.
    let mut order: Vec<&Event> = history.iter().collect();
    order.sort_by_key(|e| match e.op {
        Op::Acquire => e.complete_ns,
        Op::Release | Op::Exit | Op::Releasing => e.invoke_ns,
    });
    let history_end = history.iter().map(|e| e.complete_ns).max().unwrap_or(0);
    let mut unreleased = 0;
    for e in order {
        match (e.op, e.outcome) {
            (Op::Acquire, Outcome::Ok) => open
                .entry((e.worker, &e.key))
                .or_default()
                .push((e.complete_ns, e.token)),
            // Settled away before a check (see `settle_releases`).
            (Op::Acquire, _) | (Op::Releasing, _) => {}
            (Op::Exit, _) => {
                // A dead worker holds nothing after its death.
                let mine: Vec<(u32, &str)> = open
                    .keys()
                    .filter(|(w, _)| *w == e.worker)
                    .copied()
                    .collect();
                for k in mine {
                    for (start, token) in open.remove(&k).unwrap_or_default() {
                        unreleased += 1;
                        holds.entry(k.1).or_default().push(Hold {
                            worker: e.worker,
                            token,
                            start,
                            end: e.invoke_ns.max(start),
                            told: None,
                            open: true,
                        });
                    }
                }
            }
            (Op::Release, _) => {
                if let Some((start, token)) =
                    open.get_mut(&(e.worker, e.key.as_str())).and_then(Vec::pop)
                {
                    holds.entry(&e.key).or_default().push(Hold {
                        worker: e.worker,
                        token,
                        start,
                        end: e.invoke_ns,
                        told: e.told,
                        open: false,
                    });
                }
            }
        }
    }
    for ((worker, key), left) in open {
        for (start, token) in left {
            unreleased += 1;
            holds.entry(key).or_default().push(Hold {
                worker,
                token,
                start,
                end: history_end.max(start),
                told: None,
                open: true,
            });
        }
    }
    let mut keys: Vec<(String, Vec<Hold>)> = holds
        .into_iter()
        .map(|(k, mut hs)| {
            hs.sort_by_key(|h| (h.start, h.end));
            (k.to_string(), hs)
        })
        .collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    (keys, unreleased)
}

/// Acquisitions whose fencing token was not above the token of an
/// acquisition of the same key that had completed before they were even
/// invoked: that one was granted first in real time, so its token must be
/// the lower (a server that lost its counter in a crash hands tokens out
/// again). Needs one clock over the whole history (not across hosts).
/// Acquisitions that overlap in time may get their tokens in either order,
/// and are not compared.
pub fn token_regressions(history: &[Event]) -> u64 {
    let mut by_key: HashMap<&str, Vec<&Event>> = HashMap::new();
    for e in history {
        if e.op == Op::Acquire && e.outcome == Outcome::Ok && e.token.is_some() {
            by_key.entry(e.key.as_str()).or_default().push(e);
        }
    }
    let mut regressions = 0;
    for acquires in by_key.values() {
        // Completions in order, with the highest token seen up to each.
        let mut done: Vec<(u64, u64)> = acquires
            .iter()
            .map(|e| (e.complete_ns, e.token.unwrap_or(0)))
            .collect();
        done.sort_unstable();
        let mut highest = Vec::with_capacity(done.len());
        let mut top = 0;
        for (_, t) in &done {
            top = top.max(*t);
            highest.push(top);
        }
        for e in acquires {
            let before = done.partition_point(|(c, _)| *c < e.invoke_ns);
            if before > 0 && e.token.unwrap_or(0) <= highest[before - 1] {
                regressions += 1;
            }
        }
    }
    regressions
}
