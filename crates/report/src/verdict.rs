//! The verdict per backend: what its runs showed about its safety.

use harness::summary::Summary;
use serde::Serialize;

use crate::faults::Judged;
use crate::model::Row;

/// A backend's verdict class. It is also the CSS class of its row in the
/// verdict table, so it serialises as that class name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum VerdictClass {
    /// Nothing unsafe observed, and fenced (`safe`).
    Safe,
    /// Overlaps, lost updates, accepted stale writes or a broken sale
    /// observed (`unsafe`).
    Unsafe,
    /// Nothing unsafe observed, but something keeps it from `safe`: no
    /// fencing token, or a negative control whose fault was not injected
    /// (`caveat`).
    Caveat,
    /// No run produced figures (`not-run`).
    NotRun,
}

/// One row of the verdict table.
#[derive(Debug, Serialize)]
pub(crate) struct Verdict {
    /// Registry name.
    pub backend: String,
    /// Whether it is a negative control.
    pub control: bool,
    /// The class (and the row's CSS class).
    pub class: VerdictClass,
    /// What was observed, one sentence.
    pub text: String,
}

/// Observed unsafety of one run, one phrase each: overlaps (by the history,
/// or by the database's clock across hosts), lost updates, stale writes
/// the fenced ledger accepted, tokens that went backwards, broken coupon
/// invariants. Empty when the lock held. `lockbench run` exits 3 on it.
pub fn harm(s: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    if s.violations > 0 {
        out.push(format!(
            "{} overlapping critical sections (longest {:.1} ms)",
            s.violations, s.max_overlap_ms
        ));
    }
    if let Some(l) = &s.ledger {
        if l.lost_updates > 0 {
            out.push(format!("{} lost updates", l.lost_updates));
        }
        // The database's clock is the evidence across hosts, which share
        // no other; on one host it repeats the history's count.
        if let Some(d) = l
            .db_clock
            .as_ref()
            .filter(|d| d.violations > 0 && s.violations == 0)
        {
            out.push(format!(
                "{} overlapping critical sections by the database's clock (longest {:.1} ms)",
                d.violations, d.max_overlap_ms
            ));
        }
        if l.fenceable && l.stale_writes_accepted > 0 {
            out.push(format!(
                "{} stale writes accepted by the fenced ledger",
                l.stale_writes_accepted
            ));
        }
    }
    if s.token_regressions > 0 {
        out.push(format!(
            "{} fencing tokens not above one granted before them (the tokens went backwards)",
            s.token_regressions
        ));
    }
    if let Some(k) = &s.coupon {
        if !k.valid {
            out.push(format!(
                "flash sale broken: {} oversold, {} users with two orders",
                k.check.oversold, k.check.users_with_two_orders
            ));
        }
    }
    out
}

/// The verdict on one backend, from its ledger, throughput and coupon runs
/// and its cells of the fault matrix (`faults`: every backend's).
pub(crate) fn verdict(r: &Row, faults: &[Judged]) -> Verdict {
    let runs: Vec<&Summary> = [&r.ledger, &r.contended, &r.disjoint, &r.coupon]
        .into_iter()
        .flatten()
        .collect();
    let mut harms: Vec<String> = runs.iter().flat_map(|s| harm(s)).collect();
    harms.extend(
        faults
            .iter()
            .filter(|f| f.backend == r.backend && f.class == VerdictClass::Unsafe)
            .map(|f| format!("under {}: {}", f.fault, f.text)),
    );
    let (class, text) = if runs.is_empty() {
        (VerdictClass::NotRun, "not run".to_string())
    } else if !harms.is_empty() {
        (
            VerdictClass::Unsafe,
            format!("UNSAFE in these runs: {}", harms.join("; ")),
        )
    } else if let Some(fault) = r
        .needs_fault
        .as_deref()
        .filter(|_| r.negative_control)
        .filter(|_| !faults.iter().any(|f| f.backend == r.backend))
    {
        (
            VerdictClass::Caveat,
            format!("no overlap observed, as expected without a fault: it breaks only under {fault}, which these runs do not inject"),
        )
    } else if !r.capabilities.fencing {
        (
            VerdictClass::Caveat,
            "no overlap or lost update observed; no safe fencing token (a paused holder cannot be stopped at the resource)".to_string(),
        )
    } else {
        (
            VerdictClass::Safe,
            "no overlap, lost update or accepted stale write observed; fenced".to_string(),
        )
    };
    Verdict {
        backend: r.backend.clone(),
        control: r.negative_control,
        class,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::VerdictClass;

    #[test]
    fn classes_serialise_as_the_css_classes_the_page_styles() {
        for (class, css) in [
            (VerdictClass::Safe, "safe"),
            (VerdictClass::Unsafe, "unsafe"),
            (VerdictClass::Caveat, "caveat"),
            (VerdictClass::NotRun, "not-run"),
        ] {
            assert_eq!(serde_json::to_value(class).unwrap(), css);
        }
    }
}
