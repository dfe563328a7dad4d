//! The fault matrix: what each backend did under each fault, against what
//! its declared capabilities predict. A disagreement is a finding.

use serde::Serialize;

use crate::model::{FaultCell, Row};
use crate::verdict::VerdictClass;

/// One cell as the page and the verdict show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Judged {
    /// Registry name.
    pub backend: String,
    /// The fault.
    pub fault: String,
    /// How it ran.
    pub setup: String,
    /// The cell's class (and CSS class).
    pub class: VerdictClass,
    /// What was observed, short.
    pub text: String,
    /// Where the observation disagrees with the declared capabilities.
    pub finding: Option<String>,
    /// A negative control this fault caught (the cell that proves the
    /// checkers see what the fault does).
    pub caught: bool,
}

/// "(1.2x its 1000 ms lease)": a delay against the lock's own timeout.
fn against(ms: f64, t: Option<&crate::model::LockTimeout>) -> String {
    match t {
        Some(t) if t.ms > 0.0 => format!(" ({:.2}x its {:.0} ms {})", ms / t.ms, t.ms, t.kind),
        _ => String::new(),
    }
}

fn num(v: &serde_json::Value, k: &str) -> Option<f64> {
    v.get(k).and_then(serde_json::Value::as_f64)
}

fn text(v: &serde_json::Value, k: &str) -> Option<String> {
    v.get(k).and_then(|x| x.as_str()).map(str::to_string)
}

/// Judges one cell; `row` is the backend's row (capabilities, control).
pub(crate) fn judge(cell: &FaultCell, row: Option<&Row>) -> Judged {
    let s = &cell.summary;
    let first = cell.records.first().cloned().unwrap_or_default();
    let control = row.is_some_and(|r| r.negative_control);
    let caps = row.map(|r| r.capabilities);
    let fencing = caps.is_some_and(|c| c.fencing);
    let timeout = cell.timeout.as_ref();
    let judged = |class, text: String, finding: Option<String>| Judged {
        backend: cell.backend.clone(),
        fault: cell.fault.clone(),
        setup: cell.setup.clone(),
        caught: control && class == VerdictClass::Unsafe,
        class,
        text,
        finding,
    };
    if let Some(why) = text(&first, "skipped") {
        return judged(VerdictClass::NotRun, format!("skipped: {why}"), None);
    }
    let overlaps = if s.violations > 0 {
        format!(
            "{} overlap(s), longest {:.0} ms",
            s.violations, s.max_overlap_ms
        )
    } else {
        "0 overlaps".to_string()
    };
    let recovery = num(&first, "recovery_ms")
        .map(|ms| format!("; next holder {ms:.0} ms after{}", against(ms, timeout)));
    let during = {
        let (f, i) = (
            num(&first, "fail_during").unwrap_or(0.0),
            num(&first, "info_during").unwrap_or(0.0),
        );
        let failed = if f > 0.0 {
            format!("; {f:.0} failed ({i:.0} unknown) while it lasted")
        } else {
            String::new()
        };
        // "0 failed" alone read as "cost nothing" for a fault that stopped
        // every acquire (a stalled waiter fails nothing until its budget).
        // Only where the servers were hit: in a holder or failover drill
        // the longest gap is mostly the holds themselves (7 s holds read
        // "no acquire for 7005 ms").
        let on_servers = matches!(
            cell.fault.as_str(),
            "node-pause" | "node-kill" | "partition" | "partition-clients"
        );
        match num(&first, "stalled_ms") {
            Some(ms) if ms >= 100.0 && on_servers => {
                format!("{failed}; no acquire for {ms:.0} ms")
            }
            _ => failed,
        }
    };
    // The Jepsen question: did the holder that lost the lock find out, and
    // how long after it changed hands?
    let told = match (
        first.get("told_lost").and_then(serde_json::Value::as_bool),
        num(&first, "lost_detection_ms"),
    ) {
        (Some(true), Some(ms)) => format!(
            "; the old holder was told {ms:.0} ms after{}",
            against(ms.abs(), timeout)
        ),
        (Some(false), _) => "; the old holder was never told".to_string(),
        _ => String::new(),
    };
    let missed = text(&first, "note").filter(|n| n.contains("let go"));
    let (class, text) = match cell.fault.as_str() {
        _ if missed.is_some() => (
            VerdictClass::Caveat,
            format!("{overlaps}; {}", missed.unwrap_or_default()),
        ),
        "holder-pause" if !control => match &s.ledger {
            // "held: 76 overlap(s)" read as a contradiction: say that the
            // overlaps are the fault's (a holder paused past its lease) and
            // that what held is the fence.
            Some(l) if fencing && l.stale_writes_accepted == 0 && s.violations > 0 => (
                VerdictClass::Safe,
                format!(
                    "{overlaps} (the paused holder outlived its lease, as this fault means it to){told}; the fence held: {} stale writes unfenced, 0 accepted by the fenced ledger",
                    l.stale_writes_unfenced
                ),
            ),
            Some(l) if fencing && l.stale_writes_accepted == 0 => (
                VerdictClass::Safe,
                format!(
                    "{overlaps}{told}; {} stale writes unfenced, 0 accepted by the fenced ledger",
                    l.stale_writes_unfenced
                ),
            ),
            Some(l) if l.stale_writes_accepted > 0 || (!fencing && l.stale_writes_unfenced > 0) => {
                (
                    VerdictClass::Unsafe,
                    format!(
                        "{overlaps}; {} stale writes, {} accepted by the fenced ledger{}",
                        l.stale_writes_unfenced,
                        l.stale_writes_accepted,
                        if fencing {
                            ""
                        } else {
                            " (no safe fencing token to refuse them)"
                        }
                    ),
                )
            }
            _ => (
                VerdictClass::Safe,
                format!("{overlaps}; the pause cost nothing (the session outlived it)"),
            ),
        },
        "acquire-crash" => match recovery {
            Some(r) => (
                VerdictClass::Safe,
                format!("freed{}", r.trim_start_matches(';')),
            ),
            None => (
                VerdictClass::Unsafe,
                text(&first, "note").unwrap_or_else(|| "lock never freed".into()),
            ),
        },
        _ if s.violations > 0 => (VerdictClass::Unsafe, format!("{overlaps}{told}{during}")),
        _ => (
            VerdictClass::Safe,
            format!("{overlaps}{}{during}", recovery.unwrap_or_default()),
        ),
    };
    let finding = if control {
        (class != VerdictClass::Unsafe)
            .then(|| "a negative control this fault did not catch".to_string())
    } else {
        match (cell.fault.as_str(), class) {
            ("failover", VerdictClass::Safe) if caps.is_some_and(|c| !c.survives_failover) => {
                Some("declared not to survive a failover, yet survived this drill".to_string())
            }
            ("failover", VerdictClass::Unsafe) if caps.is_some_and(|c| c.survives_failover) => {
                Some("declared to survive a failover, yet lost the lock".to_string())
            }
            ("failover", _) => None,
            ("holder-pause", VerdictClass::Unsafe) if fencing => {
                Some("declares fencing, yet the fenced ledger accepted stale writes".to_string())
            }
            ("holder-pause", _) => None,
            (_, VerdictClass::Unsafe) => {
                Some("a correct lock is expected to keep mutual exclusion here".to_string())
            }
            _ => None,
        }
    };
    // The data checks of any ledger run: lost updates, and stale writes
    // with and without fencing (holder-pause words them itself).
    let mut text = text;
    if let Some(l) = &s.ledger {
        if cell.fault != "holder-pause"
            && (l.stale_writes_unfenced > 0 || l.stale_writes_accepted > 0)
        {
            text += &format!(
                "; stale writes: {} without fencing, {} accepted with it",
                l.stale_writes_unfenced, l.stale_writes_accepted
            );
        }
        text += &format!("; {} lost update(s)", l.lost_updates);
    }
    let text = match cell.records.len() {
        n if n > 1 => format!("{n} faults in one run: {text}"),
        _ => text,
    };
    // A server that died on its own turned the cell into an outage: what
    // it shows is not the fault's doing, unless the lock broke anyway.
    if !s.servers_exited.is_empty() && class != VerdictClass::Unsafe {
        return judged(
            VerdictClass::NotRun,
            format!(
                "not measured: a server died on its own during the run ({})",
                s.servers_exited.join("; ")
            ),
            None,
        );
    }
    judged(class, text, finding)
}

/// Every cell of `c`, judged, in the comparison's order.
pub(crate) fn judged(c: &crate::Comparison) -> Vec<Judged> {
    c.faults
        .iter()
        .map(|cell| judge(cell, c.rows.iter().find(|r| r.backend == cell.backend)))
        .collect()
}

/// The fault matrix as lines for a terminal: `backend / fault: VERDICT:
/// what was seen [finding: ...]`.
pub fn fault_lines(c: &crate::Comparison) -> Vec<String> {
    judged(c)
        .into_iter()
        .map(|j| {
            let class = match j.class {
                VerdictClass::Safe => "safe",
                VerdictClass::Unsafe => "BROKE",
                VerdictClass::Caveat => "caveat",
                VerdictClass::NotRun => "not run",
            };
            let mut line = format!("{} / {}: {class}: {}", j.backend, j.fault, j.text);
            if let Some(f) = j.finding {
                line += &format!("  [finding: {f}]");
            }
            line
        })
        .collect()
}
