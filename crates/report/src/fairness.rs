//! Fairness as a figure, beside the `fair` (FIFO) each backend declares:
//! the spread of acquires over the workers and the longest wait while
//! other workers took the lock, from the one-key throughput histories.
//!
//! A backend that declares `fair` must show it. The evidence against it is
//! one wait that more acquires by other workers completed inside than a
//! FIFO queue lets through ([`harness::handover::fifo_overtake_bound`]:
//! twice the rivals on the key). The spread alone proves nothing: on a
//! machine with fewer cores than workers a FIFO lock still hands out fewer
//! turns to a worker the scheduler keeps off the CPU, since it queues
//! again late; so the spread is shown, and only the overtakes are judged.

use harness::handover::{Fairness, Wait};
use harness::history::Outcome;
use serde::Serialize;

use crate::model::Comparison;

/// One backend's one-key throughput run, as the page shows its fairness.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FairCell {
    /// Registry name.
    pub backend: String,
    /// What it declares (`capabilities().fair`).
    pub declared: bool,
    /// Acquires per worker, max ÷ min, or the starved workers.
    pub spread: String,
    /// The longest overtaken wait, in words.
    pub wait: String,
    /// Where the run contradicts the declared `fair`.
    pub finding: Option<String>,
}

/// "1.04", or "starved: worker 3" when a worker got nothing (no ratio to
/// zero), or "-" without figures.
pub(crate) fn spread_text(f: Option<&Fairness>) -> String {
    let Some(f) = f else {
        return "-".into();
    };
    // Results from before `spread` and `starved` were kept still have the
    // counts they come from.
    if let Some(s) = f
        .spread
        .or_else(|| harness::handover::spread(&f.acquires_by_worker))
    {
        return format!("{s:.2}");
    }
    let starved: Vec<String> = f
        .acquires_by_worker
        .iter()
        .enumerate()
        .filter(|(_, n)| **n == 0)
        .map(|(w, _)| w.to_string())
        .collect();
    match starved.len() {
        0 => "-".into(),
        1 => format!("starved: worker {}", starved[0]),
        _ => format!("starved: workers {}", starved.join(", ")),
    }
}

/// "1,234 µs, worker 2, 37 acquires by others (gave up)".
pub(crate) fn wait_text(w: Option<&Wait>) -> String {
    let Some(w) = w else {
        return "-".into();
    };
    let ended = match w.outcome {
        Outcome::Ok => "",
        Outcome::Fail => " (gave up)",
        Outcome::Info => " (outcome unknown)",
    };
    format!(
        "{:.0} µs, worker {}, {} acquire{} by others{ended}",
        w.wait_us,
        w.worker,
        w.overtakes,
        if w.overtakes == 1 { "" } else { "s" }
    )
}

/// The contradiction of a declared `fair`, if the run shows one.
pub(crate) fn finding(declared_fair: bool, f: Option<&Fairness>) -> Option<String> {
    let w = f?.most_overtaken.as_ref()?;
    (declared_fair && w.beyond_fifo()).then(|| {
        format!(
            "declares fair (FIFO), yet worker {} waited {:.0} µs while other workers took the lock {} times (FIFO lets at most {} through with {} rival{})",
            w.worker,
            w.wait_us,
            w.overtakes,
            w.fifo_bound,
            w.rivals,
            if w.rivals == 1 { "" } else { "s" }
        )
    })
}

/// Every backend's one-key throughput run, in row order.
pub(crate) fn cells(c: &Comparison) -> Vec<FairCell> {
    c.rows
        .iter()
        .filter_map(|r| {
            let f = r.contended.as_ref()?.fairness.as_ref();
            Some(FairCell {
                backend: r.backend.clone(),
                declared: r.capabilities.fair,
                spread: spread_text(f),
                wait: wait_text(f.and_then(|f| f.longest_wait.as_ref())),
                finding: finding(r.capabilities.fair, f),
            })
        })
        .collect()
}

/// Whether the backend named `backend` declares `fair` (false if unknown).
pub(crate) fn declared(c: &Comparison, backend: &str) -> bool {
    c.rows
        .iter()
        .find(|r| r.backend == backend)
        .is_some_and(|r| r.capabilities.fair)
}

/// Fairness as lines for a terminal, one per one-key throughput run and
/// per scaling point: `backend[, N workers]: declared fair yes|no; max ÷
/// min ...; longest wait ... [finding: ...]`.
pub fn fairness_lines(c: &Comparison) -> Vec<String> {
    let line = |what: String, declared: bool, f: Option<&Fairness>| {
        let mut l = format!(
            "{what}: declared fair {}; acquires per worker max ÷ min {}; longest wait while others acquired: {}",
            if declared { "yes" } else { "no" },
            spread_text(f),
            wait_text(f.and_then(|f| f.longest_wait.as_ref()))
        );
        if let Some(x) = finding(declared, f) {
            l += &format!("  [finding: {x}]");
        }
        l
    };
    let rows = c.rows.iter().filter_map(|r| {
        let s = r.contended.as_ref()?;
        Some(line(
            format!("{}, {} workers", r.backend, s.workers),
            r.capabilities.fair,
            s.fairness.as_ref(),
        ))
    });
    let points = c.scaling.iter().filter(|p| p.fairness.is_some()).map(|p| {
        line(
            format!("{}, {} workers (scaling)", p.backend, p.workers),
            declared(c, &p.backend),
            p.fairness.as_ref(),
        )
    });
    rows.chain(points).collect()
}
