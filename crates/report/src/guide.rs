//! The decision guide by need: for each need a reader starts from, the
//! backend the measured figures point to, and the figures that answer
//! rests on. Every answer is computed from the comparison; a backend with a
//! violation under a fault never comes out as safe under that fault.

use serde::Serialize;

use crate::decisions::SaleKind;
use crate::model::{Comparison, FaultCell, Row};
use crate::verdict::{verdict, VerdictClass};

/// One need and its answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Answer {
    /// The reader's need.
    pub need: String,
    /// What the figures point to, one sentence.
    pub answer: String,
    /// The measured figures it rests on.
    pub rests_on: Vec<String>,
    /// `safe` (a backend met the need in every run that tested it),
    /// `caveat` (the best available has a stated limit) or `unsafe` (no
    /// backend measured here meets it).
    pub class: String,
}

/// What one backend's fault runs showed.
struct Faulted<'a> {
    row: &'a Row,
    cells: Vec<&'a FaultCell>,
}

impl Faulted<'_> {
    fn cell(&self, fault: &str) -> Option<&FaultCell> {
        self.cells
            .iter()
            .copied()
            .find(|c| c.fault == fault && ran(c))
    }

    /// `(fault, overlaps)` for every fault run with an overlap.
    fn broke(&self) -> Vec<(String, u64, f64)> {
        self.cells
            .iter()
            .filter(|c| ran(c) && c.summary.violations > 0)
            .map(|c| {
                (
                    c.fault.clone(),
                    c.summary.violations,
                    c.summary.max_overlap_ms,
                )
            })
            .collect()
    }

    fn ran_faults(&self) -> Vec<&str> {
        let mut v: Vec<&str> = Vec::new();
        for c in self.cells.iter().filter(|c| ran(c)) {
            if !v.contains(&c.fault.as_str()) {
                v.push(&c.fault);
            }
        }
        v
    }
}

/// A skipped cell carries `"skipped": "why"`; a run one writes
/// `"skipped": null`.
fn ran(c: &FaultCell) -> bool {
    c.records
        .first()
        .is_none_or(|r| r.get("skipped").is_none_or(serde_json::Value::is_null))
}

fn recovery_ms(c: &FaultCell) -> Option<f64> {
    c.records
        .iter()
        .filter_map(|r| r.get("recovery_ms").and_then(serde_json::Value::as_f64))
        .reduce(f64::max)
}

fn broke_text(b: &[(String, u64, f64)]) -> String {
    b.iter()
        .map(|(f, n, ms)| format!("{n} overlap(s) under {f} (longest {ms:.0} ms)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The p50 cycle of a backend: the median over the durable repeats when
/// there were repeats, else its one latency run; `None` when no run
/// measured a cycle (a run with no acquisition is no 0 µs figure).
fn cycle_p50(c: &Comparison, backend: &str) -> Option<f64> {
    let repeated = c.measured.as_ref().and_then(|m| {
        let p = m
            .profiles
            .iter()
            .find(|p| p.ran && p.durability == "durable")?;
        let s = p.backends.iter().find(|s| s.backend == backend)?;
        crate::stats::Estimate::of(&s.cycle_p50_measured_us()).map(|e| e.median)
    });
    repeated.or_else(|| {
        c.rows
            .iter()
            .find(|r| r.backend == backend)?
            .latency_measured()
            .map(|s| s.cycle_p50_us)
    })
}

/// The guide, in the order of the needs.
pub fn guide(c: &Comparison) -> Vec<Answer> {
    let rows: Vec<Faulted> = c
        .rows
        .iter()
        .filter(|r| !r.negative_control && r.ledger.is_some())
        .filter(|r| verdict(r, &[]).class != VerdictClass::Unsafe)
        .map(|r| Faulted {
            row: r,
            cells: c.faults.iter().filter(|f| f.backend == r.backend).collect(),
        })
        .collect();
    let any_faults = rows.iter().any(|f| !f.ran_faults().is_empty());
    let mut out = vec![flash_sale(c)];
    out.push(cron_once(&rows, any_faults));
    out.push(money(&rows, any_faults));
    out.push(lowest_latency(c, &rows));
    out.push(failover(c, &rows));
    for (family, label) in [
        ("pg-", "I only run PostgreSQL"),
        ("redis", "I only run Redis"),
        ("etcd", "I only run etcd"),
    ] {
        out.push(only(c, &rows, family, label));
    }
    // A comparison cut short answers nothing: its missing runs (a fault
    // that would have broken a backend, the other variants of a sale)
    // could each change an answer, and a probe saw "redis: no second
    // holder in any fault it met" where the whole suite says 117 overlaps
    // under holder-pause.
    if let Some(phase) = &c.interrupted {
        for a in &mut out {
            a.answer = format!(
                "not answered: the comparison was cut short during {phase}, and an answer needs every run of the suite"
            );
            a.rests_on.clear();
            a.class = "caveat".into();
        }
    }
    out
}

fn answer(need: &str, answer: String, rests_on: Vec<String>, class: &str) -> Answer {
    Answer {
        need: need.into(),
        answer,
        rests_on,
        class: class.into(),
    }
}

fn flash_sale(c: &Comparison) -> Answer {
    let need = "A flash sale with no oversell";
    let mut best: Option<(String, f64, harness::summary::CouponReport, SaleKind)> = None;
    let mut broken = Vec::new();
    for s in c.sales() {
        let Some(k) = s.coupon() else { continue };
        let kind = SaleKind::of(&k.plan);
        if kind == SaleKind::DeliberateBug || s.negative_control {
            continue;
        }
        if !k.valid {
            broken.push(format!(
                "{}: {} oversold, {} users with two orders",
                s.label, k.check.oversold, k.check.users_with_two_orders
            ));
            continue;
        }
        let Some(ms) = crate::model::durably_sold_out_ms(k).filter(|ms| *ms > 0.0) else {
            continue;
        };
        let rate = k.check.orders as f64 * 1000.0 / ms;
        if best.as_ref().is_none_or(|b| rate > b.1) {
            best = Some((s.label.clone(), rate, k.clone(), kind));
        }
    }
    match best {
        None => answer(
            need,
            "not measured: no flash-sale run kept its invariants".into(),
            broken,
            "unsafe",
        ),
        Some((label, rate, k, kind)) => {
            let how = match kind {
                SaleKind::Baseline => "no lock at all: the stock check and the decrement are one atomic step, and a unique index stops a second order",
                _ => "the lock keeps one user's clicks apart; the stock stays safe in the UPDATE's WHERE clause",
            };
            let mut rests = vec![
                format!("{label}: {rate:.0} durable orders/s, {} orders of {} stock", k.check.orders, k.plan.stock),
                format!(
                    "invariants checked in SQL after the run: lowest stock {}, {} oversold, {} users with two orders",
                    k.check.min_stock, k.check.oversold, k.check.users_with_two_orders
                ),
            ];
            rests.extend(broken);
            answer(
                need,
                format!("{label}: the fastest variant whose invariants held ({how})."),
                rests,
                "safe",
            )
        }
    }
}

fn cron_once(rows: &[Faulted], any_faults: bool) -> Answer {
    let need = "A scheduled job that must run once (cron de-duplication)";
    if !any_faults {
        return answer(
            need,
            "not answered: no fault ran, and a job runs twice only on a bad day (a killed or paused holder, a failover)".into(),
            Vec::new(),
            "caveat",
        );
    }
    // Must keep mutual exclusion in every fault it met, and free the lock
    // when its holder dies (the next run is not blocked).
    let mut ok: Vec<(&Faulted, Option<f64>)> = Vec::new();
    let mut rests = Vec::new();
    for f in rows {
        let broke = f.broke();
        let kill = f.cell("holder-kill").and_then(recovery_ms);
        if broke.is_empty() && !f.ran_faults().is_empty() {
            ok.push((f, kill));
        } else if !broke.is_empty() {
            rests.push(format!("not {}: {}", f.row.backend, broke_text(&broke)));
        }
    }
    ok.sort_by(|a, b| {
        a.1.unwrap_or(f64::INFINITY)
            .total_cmp(&b.1.unwrap_or(f64::INFINITY))
    });
    let Some((first, kill)) = ok.first() else {
        return answer(
            need,
            "no backend measured here kept one holder through every fault it met".into(),
            rests,
            "unsafe",
        );
    };
    for (f, kill) in &ok {
        rests.insert(
            0,
            format!(
                "{}: 0 overlaps in {} fault run(s) ({}); next holder {} after its holder was killed",
                f.row.backend,
                f.cells.iter().filter(|c| ran(c)).count(),
                f.ran_faults().join(", "),
                kill.map_or("not measured".into(), |ms| format!("{ms:.0} ms"))
            ),
        );
    }
    rests.reverse();
    answer(
        need,
        format!(
            "{}: no second holder in any fault it met, and the lock came back {} after a holder died{}.",
            first.row.backend,
            kill.map_or("(not measured)".into(), |ms| format!("{ms:.0} ms")),
            if ok.len() > 1 {
                format!(
                    " (also clean: {})",
                    ok[1..]
                        .iter()
                        .map(|(f, _)| f.row.backend.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            }
        ),
        rests,
        "safe",
    )
}

fn money(rows: &[Faulted], any_faults: bool) -> Answer {
    let need = "Money movement: a paused holder must not write";
    // The ledger workload writes each section twice: an unfenced counter
    // (its lost updates show what a store without a token check suffers)
    // and a fenced ledger that refuses a token lower than one it has seen.
    // A paused holder is harmless when no one else got the lock (kept) or
    // when the fenced store refused its write (refused).
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    let mut rests = Vec::new();
    for f in rows {
        let Some(c) = f.cell("holder-pause") else {
            continue;
        };
        let Some(l) = c.summary.ledger.as_ref() else {
            continue;
        };
        let paused_ms = c
            .records
            .iter()
            .filter_map(|r| {
                let at = |k: &str| r.get(k).and_then(serde_json::Value::as_f64);
                Some((at("healed_ns")? - at("started_ns")?) / 1e6)
            })
            .reduce(f64::max);
        let paused = match (paused_ms, c.timeout.as_ref()) {
            (Some(p), Some(t)) => format!(
                "holder paused {:.1} s, {} its {:.0} ms {}",
                p / 1000.0,
                if p > t.ms { "past" } else { "within" },
                t.ms,
                t.kind
            ),
            (Some(p), None) => format!(
                "holder paused {:.1} s (the lock has no timeout)",
                p / 1000.0
            ),
            (None, _) => "holder paused".into(),
        };
        rests.push(format!(
            "{}: {paused}: {} stale write(s) made, {} accepted by the fenced ledger, {} lost update(s) on the unfenced counter{}",
            f.row.backend,
            l.stale_writes_unfenced,
            l.stale_writes_accepted,
            l.lost_updates,
            if f.row.capabilities.fencing { "" } else { " (no safe token)" }
        ));
        if c.summary.violations == 0
            && l.stale_writes_unfenced == 0
            && l.stale_writes_accepted == 0
            && l.lost_updates == 0
        {
            // Only as long as the pause: a pause past its session would
            // have let another holder in.
            kept.push(match (paused_ms, c.timeout.as_ref()) {
                (Some(p), Some(t)) if p <= t.ms => format!(
                    "{} (for a pause within its {:.0} ms {})",
                    f.row.backend, t.ms, t.kind
                ),
                _ => f.row.backend.clone(),
            });
        } else if f.row.capabilities.fencing && l.stale_writes_accepted == 0 {
            refused.push(f.row.backend.clone());
        }
    }
    if !any_faults || rests.is_empty() {
        return answer(
            need,
            "not answered: the holder-pause fault did not run".into(),
            rests,
            "caveat",
        );
    }
    let mut parts = Vec::new();
    if !kept.is_empty() {
        parts.push(format!(
            "{}: the paused holder kept the lock, no one else took it and it wrote nothing stale",
            kept.join(", ")
        ));
    }
    if !refused.is_empty() {
        parts.push(format!(
            "{}: the lock passed to another holder, and the fencing token let the store refuse every stale write; pass the token to the store and make it reject lower ones, since the unfenced counter lost updates",
            refused.join(", ")
        ));
    }
    if parts.is_empty() {
        return answer(
            need,
            "no backend measured here kept a paused holder from writing".into(),
            rests,
            "unsafe",
        );
    }
    answer(need, format!("{}.", parts.join("; ")), rests, "safe")
}

fn lowest_latency(c: &Comparison, rows: &[Faulted]) -> Answer {
    let need = "The lowest latency";
    let mut figs: Vec<(&Faulted, f64)> = rows
        .iter()
        .filter_map(|f| cycle_p50(c, &f.row.backend).map(|v| (f, v)))
        .collect();
    figs.sort_by(|a, b| a.1.total_cmp(&b.1));
    let Some((best, v)) = figs.first() else {
        return answer(need, "not measured".into(), Vec::new(), "caveat");
    };
    let repeated = c.measured.as_ref().is_some_and(|m| m.repeats >= 2);
    let rests: Vec<String> = figs
        .iter()
        .map(|(f, v)| {
            format!(
                "{}: {v:.0} µs per acquire + release at p50{}",
                f.row.backend,
                if repeated {
                    " (median of the durable repeats)"
                } else {
                    ""
                }
            )
        })
        .collect();
    let broke = best.broke();
    let (tail, class) = if broke.is_empty() {
        (String::new(), "safe")
    } else {
        (
            format!("; but not safe under faults: {}", broke_text(&broke)),
            "caveat",
        )
    };
    let next = figs
        .get(1)
        .map(|(f, n)| format!(", {:.2}x ahead of {}", n / v, f.row.backend))
        .unwrap_or_default();
    answer(
        need,
        format!(
            "{}: {v:.0} µs per uncontended cycle{next}{tail}.",
            best.row.backend
        ),
        rests,
        class,
    )
}

/// The faults in which a server of the lock dies or is cut off while the
/// lock must carry on: killed and restarted (`node-kill`), a primary lost
/// and a replica promoted (`failover`), servers cut from each other
/// (`partition`) or from the workers (`partition-clients`). Not
/// `node-pause`: a stopped server comes back with its memory intact, so
/// holding through it says nothing about a server whose state is gone; not
/// `clock-jump`, `holder-*` or `acquire-crash`, which leave every server up.
const SERVER_LOSS_FAULTS: &[&str] = &["node-kill", "failover", "partition", "partition-clients"];

/// Why a backend cannot keep its lock through one server failure by its
/// design, if it cannot: the costs table's "cannot" (no server count
/// survives one failure) or the declared capability.
fn cannot_survive_a_failure(r: &Row) -> Option<String> {
    match &r.servers {
        Some(s) if s.for_one_failure.is_none() => Some(format!(
            "cannot keep the lock through a server failure by its design ({}; see the costs)",
            if s.rule.is_empty() {
                "no server count survives one"
            } else {
                &s.rule
            }
        )),
        _ if !r.capabilities.survives_failover => {
            Some("declared not to survive a failover".to_string())
        }
        _ => None,
    }
}

fn failover(c: &Comparison, rows: &[Faulted]) -> Answer {
    let need = "Surviving a failover (a server dies)";
    // The page's own verdict, fault matrix included: a backend shown UNSAFE
    // in the verdict table is never green here.
    let judged = crate::faults::judged(c);
    let mut ok: Vec<(&Faulted, Vec<&str>)> = Vec::new();
    let mut held_but = Vec::new();
    let mut rests = Vec::new();
    let mut other_faults = Vec::new();
    for f in rows {
        let cells: Vec<&FaultCell> = f
            .cells
            .iter()
            .copied()
            .filter(|c| ran(c) && SERVER_LOSS_FAULTS.contains(&c.fault.as_str()))
            .collect();
        if cells.is_empty() {
            if !f.ran_faults().is_empty() {
                other_faults.push(format!(
                    "{}: no fault that kills or cuts off a server ran for it (only {})",
                    f.row.backend,
                    f.ran_faults().join(", ")
                ));
            }
            continue;
        }
        let names: Vec<&str> = cells.iter().map(|c| c.fault.as_str()).collect();
        let bad: Vec<&FaultCell> = cells
            .iter()
            .copied()
            .filter(|c| c.summary.violations > 0)
            .collect();
        if !bad.is_empty() {
            rests.push(format!(
                "{}: not safe under {}",
                f.row.backend,
                bad.iter()
                    .map(|c| format!(
                        "{} ({} overlap(s), longest {:.0} ms)",
                        c.fault, c.summary.violations, c.summary.max_overlap_ms
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        }
        let page = verdict(f.row, &judged);
        let mut against = Vec::new();
        if page.class == VerdictClass::Unsafe {
            against.push(format!("its verdict on this page is {}", page.text));
        }
        // A cell the matrix judged unsafe without an overlap (lost updates,
        // a lock never freed) is not "carried on" either.
        against.extend(
            judged
                .iter()
                .filter(|j| {
                    j.backend == f.row.backend
                        && names.contains(&j.fault.as_str())
                        && j.class == VerdictClass::Unsafe
                })
                .map(|j| format!("under {}: {}", j.fault, j.text)),
        );
        against.extend(cannot_survive_a_failure(f.row));
        let held = format!("{}: 0 overlaps under {}", f.row.backend, names.join(", "));
        if against.is_empty() {
            rests.push(held);
            ok.push((f, names));
        } else {
            rests.push(format!("{held}; but {}", against.join("; ")));
            held_but.push(f.row.backend.clone());
        }
    }
    if rests.is_empty() {
        return answer(
            need,
            format!(
                "not answered: no fault that kills or cuts off a server ({}) ran; a node-pause only stops the servers, which come back with their state",
                SERVER_LOSS_FAULTS.join(", ")
            ),
            other_faults,
            "caveat",
        );
    }
    rests.extend(other_faults);
    if ok.is_empty() {
        let text = if held_but.is_empty() {
            "no backend measured here kept one holder through a server dying or cut off".to_string()
        } else {
            format!(
                "none to recommend: {} kept one holder while a server died or was cut off, but is unsafe on this page or cannot survive a server failure (see what it rests on)",
                held_but.join(", ")
            )
        };
        return answer(need, text, rests, "unsafe");
    }
    let quorum = |f: &Faulted| {
        f.row
            .servers
            .as_ref()
            .and_then(|s| s.for_one_failure)
            .map_or("as a quorum".to_string(), |n| format!("on {n} servers"))
    };
    answer(
        need,
        format!(
            "{}: one holder at a time while a server died or was cut off ({}); run it {} (see the costs) for one failure not to stop the lock.",
            ok.iter()
                .map(|(f, _)| f.row.backend.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            ok.iter()
                .map(|(f, names)| format!("{}: {}", f.row.backend, names.join(", ")))
                .collect::<Vec<_>>()
                .join("; "),
            ok.iter()
                .map(|(f, _)| {
                    if ok.len() > 1 {
                        format!("{} {}", f.row.backend, quorum(f))
                    } else {
                        quorum(f)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        rests,
        "safe",
    )
}

fn only(c: &Comparison, rows: &[Faulted], family: &str, label: &str) -> Answer {
    let mut cands: Vec<(&Faulted, Option<f64>)> = rows
        .iter()
        .filter(|f| f.row.backend.starts_with(family))
        .map(|f| (f, cycle_p50(c, &f.row.backend)))
        .collect();
    if cands.is_empty() {
        return answer(
            label,
            format!("not measured: no {family}* backend ran clean in this comparison"),
            Vec::new(),
            "caveat",
        );
    }
    // Fewest faults with an overlap first (a count of overlaps grows with
    // the run's length, a count of faults does not), then fencing, then
    // speed.
    cands.sort_by(|a, b| {
        let n = |f: &Faulted| f.broke().len();
        n(a.0)
            .cmp(&n(b.0))
            .then(
                b.0.row
                    .capabilities
                    .fencing
                    .cmp(&a.0.row.capabilities.fencing),
            )
            .then(
                a.1.unwrap_or(f64::INFINITY)
                    .total_cmp(&b.1.unwrap_or(f64::INFINITY)),
            )
    });
    let rests: Vec<String> = cands
        .iter()
        .map(|(f, p50)| {
            let broke = f.broke();
            format!(
                "{}: {}; {}; {}",
                f.row.backend,
                p50.map_or("latency not measured".into(), |v| format!(
                    "{v:.0} µs p50 cycle"
                )),
                if f.row.capabilities.fencing {
                    "fencing token"
                } else {
                    "no safe fencing token"
                },
                if f.ran_faults().is_empty() {
                    "no fault ran".to_string()
                } else if broke.is_empty() {
                    format!("0 overlaps under {}", f.ran_faults().join(", "))
                } else {
                    broke_text(&broke)
                }
            )
        })
        .collect();
    let (best, p50) = cands[0];
    let broke = best.broke();
    let class = if !broke.is_empty() || !best.row.capabilities.fencing {
        "caveat"
    } else {
        "safe"
    };
    let mut text = format!(
        "{}{}",
        best.row.backend,
        p50.map_or(String::new(), |v| format!(" ({v:.0} µs p50 cycle)"))
    );
    if !broke.is_empty() {
        text += &format!("; not safe under {}", broke_text(&broke));
        let fenced_pause = best.row.capabilities.fencing
            && broke.iter().any(|b| b.0 == "holder-pause")
            && best
                .cell("holder-pause")
                .and_then(|c| c.summary.ledger.as_ref())
                .is_some_and(|l| l.stale_writes_accepted == 0);
        if fenced_pause {
            text += "; under holder-pause its fencing token let the store refuse every stale write";
        }
    } else if !best.ran_faults().is_empty() {
        text += &format!("; 0 overlaps under {}", best.ran_faults().join(", "));
    }
    if !best.row.capabilities.fencing {
        text += "; no safe fencing token, so guard the data with a version check or a unique constraint";
    }
    answer(label, format!("{text}."), rests, class)
}
