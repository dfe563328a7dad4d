//! A Jepsen-style timeline of one overlap: the holds on its key around it,
//! one lane per worker, with the overlapping pair and the fault windows
//! marked. Kept in the run's summary so a report can draw it from
//! `comparison.json` alone.

use serde::{Deserialize, Serialize};

use crate::checker::{self, OverlapPair, OverlapReport};
use crate::history::{Event, Told};

/// Most holds a timeline keeps (the nearest to the overlap win): enough
/// to show the traffic around it, few enough to draw.
pub const MAX_HOLDS: usize = 300;

/// One critical section on the timeline (ms from the timeline's start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bar {
    /// Worker id.
    pub worker: u32,
    /// Entered (its acquire completed).
    pub start_ms: f64,
    /// Left (its release was invoked), or the worker's death / the end of
    /// the history when it had no release.
    pub end_ms: f64,
    /// It had no release.
    pub open: bool,
    /// Its fencing token.
    pub token: Option<u64>,
    /// One of the overlapping pair the timeline is about.
    pub in_pair: bool,
    /// What the holder had been told when it released.
    pub told: Option<Told>,
}

/// A fault's window on the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// The fault and its target.
    pub what: String,
    /// Began (ms from the timeline's start; negative: before it).
    pub start_ms: f64,
    /// Undone (`None`: never, within the run).
    pub end_ms: Option<f64>,
}

/// The overlap a timeline shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The lock key.
    pub key: String,
    /// Length of the window shown, ms.
    pub span_ms: f64,
    /// Workers with a hold in the window, in order (the lanes).
    pub lanes: Vec<u32>,
    /// The holds in the window.
    pub bars: Vec<Bar>,
    /// The overlapping pair: the earlier holder, then the later.
    pub first_worker: u32,
    /// The later holder.
    pub second_worker: u32,
    /// When the later holder got the lock, ms from the start.
    pub at_ms: f64,
    /// How long both were inside, ms.
    pub overlap_ms: f64,
    /// Faults that overlapped the window.
    pub faults: Vec<Window>,
    /// Holds on the key in the window that were left out (over
    /// [`MAX_HOLDS`]).
    pub left_out: u64,
}

/// A fault to mark: what, began, undone (CLOCK_MONOTONIC ns, as the
/// history).
pub type FaultSpan = (String, u64, Option<u64>);

fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// The timeline of the overlap that matters most in `overlap`: with
/// faults, the first pair at or after the first fault began (the one the
/// fault caused); without, the longest. `None` when there was no overlap.
pub fn build(history: &[Event], overlap: &OverlapReport, faults: &[FaultSpan]) -> Option<Timeline> {
    let first_fault = faults.iter().map(|f| f.1).min();
    let pair: &OverlapPair = match first_fault {
        Some(t) => overlap
            .pairs
            .iter()
            .filter(|p| p.at_ns >= t)
            .min_by_key(|p| p.at_ns)
            .or_else(|| overlap.pairs.iter().max_by_key(|p| p.overlap_ns)),
        None => overlap.pairs.iter().max_by_key(|p| p.overlap_ns),
    }?;
    let (keys, _) = checker::holds(history);
    let holds = keys.into_iter().find(|(k, _)| *k == pair.key)?.1;
    // The pair's holds: the later one starts at `at_ns`; the earlier is the
    // first holder's hold that was open then.
    let second = holds
        .iter()
        .position(|h| h.worker == pair.second_worker && h.start == pair.at_ns)?;
    let first = holds
        .iter()
        .enumerate()
        .filter(|(_, h)| {
            h.worker == pair.first_worker && h.start <= pair.at_ns && h.end > pair.at_ns
        })
        .map(|(i, _)| i)
        .max()?;
    let (lo, hi) = (
        holds[first].start.min(holds[second].start),
        holds[first].end.max(holds[second].end),
    );
    // A margin of a fifth of the pair's span on each side (at least 5 ms)
    // shows the traffic before and after; a fault that began shortly
    // before is pulled in so its window is on the page.
    let pad = ((hi - lo) / 5).max(5_000_000);
    let mut from = lo.saturating_sub(pad);
    if let Some(t) = first_fault.filter(|t| *t < from && from - *t <= 10_000_000_000) {
        from = t.saturating_sub(pad / 2);
    }
    let to = hi.saturating_add(pad);
    let rel = |ns: u64| ms(i128::from(ns) - i128::from(from));
    let mut inside: Vec<(usize, &checker::Hold)> = holds
        .iter()
        .enumerate()
        .filter(|(_, h)| h.end > from && h.start < to)
        .collect();
    let total = inside.len();
    if total > MAX_HOLDS {
        // The pair, then the holds nearest to the overlap.
        inside.sort_by_key(|(i, h)| {
            if *i == first || *i == second {
                0
            } else {
                h.start.abs_diff(pair.at_ns).max(1)
            }
        });
        inside.truncate(MAX_HOLDS);
        inside.sort_by_key(|(_, h)| (h.start, h.end));
    }
    let bars: Vec<Bar> = inside
        .iter()
        .map(|(i, h)| Bar {
            worker: h.worker,
            start_ms: rel(h.start),
            end_ms: rel(h.end),
            open: h.open,
            token: h.token,
            in_pair: *i == first || *i == second,
            told: h.told,
        })
        .collect();
    let left_out = (total - bars.len()) as u64;
    let mut lanes: Vec<u32> = bars.iter().map(|b| b.worker).collect();
    lanes.sort_unstable();
    lanes.dedup();
    Some(Timeline {
        key: pair.key.clone(),
        span_ms: rel(to),
        lanes,
        bars,
        first_worker: pair.first_worker,
        second_worker: pair.second_worker,
        at_ms: rel(pair.at_ns),
        overlap_ms: ms(i128::from(pair.overlap_ns)),
        faults: faults
            .iter()
            .filter(|(_, start, end)| *start < to && end.is_none_or(|e| e > from))
            .map(|(what, start, end)| Window {
                what: what.clone(),
                start_ms: rel(*start),
                end_ms: end.map(rel),
            })
            .collect(),
        left_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op, Outcome};

    fn ev(worker: u32, op: Op, at_ms: u64, token: u64) -> Event {
        Event {
            worker,
            key: "k".into(),
            op,
            invoke_ns: at_ms * 1_000_000,
            complete_ns: at_ms * 1_000_000,
            outcome: Outcome::Ok,
            token: Some(token),
            was_held: None,
            round_trips: None,
            told: None,
            lost_ns: None,
            error: None,
        }
    }

    #[test]
    fn the_pair_and_the_fault_are_marked() {
        let h = vec![
            ev(0, Op::Acquire, 100, 1),
            ev(0, Op::Release, 110, 1),
            ev(1, Op::Acquire, 120, 2),
            // Worker 2 gets the lock while worker 1 still holds it.
            ev(2, Op::Acquire, 150, 3),
            ev(2, Op::Release, 160, 3),
            ev(1, Op::Release, 200, 2),
            ev(0, Op::Acquire, 5_000, 4),
            ev(0, Op::Release, 5_010, 4),
        ];
        let o = checker::check_overlap(&h);
        assert_eq!(o.violations, 1);
        let t =
            build(&h, &o, &[("pause".into(), 130_000_000, Some(140_000_000))]).expect("a timeline");
        assert_eq!((t.first_worker, t.second_worker), (1, 2));
        assert!((t.overlap_ms - 10.0).abs() < 1e-9);
        let pair: Vec<&Bar> = t.bars.iter().filter(|b| b.in_pair).collect();
        assert_eq!(pair.len(), 2);
        assert_eq!(pair[0].token, Some(2));
        assert_eq!(pair[1].token, Some(3));
        assert_eq!(t.faults.len(), 1);
        assert!(t.faults[0].start_ms > 0.0 && t.faults[0].start_ms < t.at_ms);
        // The hold at 5 s is far outside the window; the one at 100 ms is
        // inside the margin.
        assert_eq!(t.bars.len(), 3);
        assert_eq!(t.lanes, vec![0, 1, 2]);
    }

    #[test]
    fn no_overlap_no_timeline() {
        let h = vec![ev(0, Op::Acquire, 1, 1), ev(0, Op::Release, 2, 1)];
        assert!(build(&h, &checker::check_overlap(&h), &[]).is_none());
    }
}
