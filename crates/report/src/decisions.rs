//! "Which lock for which job" and the warnings above it, derived from the
//! figures alone.
//!
//! The flash-sale rules classify a run by its plan (strategy, lock scope,
//! ordering: [`SaleKind`]), never by its label, so renaming a variant in
//! `lockbench compare` cannot silently drop it from the guide.

use harness::spec::{CouponPlan, LockScope, Ordering, Strategy};
use harness::summary::Summary;

use crate::model::{Comparison, Measured, Row, Sale, Samples};
use crate::stats::{self, Call};
use crate::verdict::{verdict, VerdictClass};

/// What a flash-sale run is, as the decision guide sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SaleKind {
    /// The lock under test over this scope, released after COMMIT.
    Lock(LockScope),
    /// Stock in segments, a lock per segment, released after COMMIT.
    Segmented,
    /// A lock-free baseline (SQL atomic or Redis pre-deduct).
    Baseline,
    /// The seed's bug, run on purpose: the lock released before COMMIT.
    /// Its broken invariants are the point, not a warning.
    DeliberateBug,
}

impl SaleKind {
    /// The kind of a run with this plan.
    pub(crate) fn of(plan: &CouponPlan) -> Self {
        match (plan.strategy, plan.ordering) {
            (Strategy::Lock, Ordering::CommitThenUnlock) => SaleKind::Lock(plan.lock_scope),
            (Strategy::Segmented, Ordering::CommitThenUnlock) => SaleKind::Segmented,
            (Strategy::Lock | Strategy::Segmented, Ordering::UnlockThenCommit) => {
                SaleKind::DeliberateBug
            }
            (Strategy::SqlAtomic | Strategy::RedisPrededuct, _) => SaleKind::Baseline,
        }
    }
}

/// "Which lock for which job", from the numbers alone.
pub fn decisions(c: &Comparison) -> Vec<String> {
    // As the guide: a headline needs the whole suite's runs.
    if let Some(phase) = &c.interrupted {
        return vec![format!(
            "No headline: the comparison was cut short during {phase}, and a headline needs the whole suite's runs; the tables below are what finished."
        )];
    }
    let mut out = Vec::new();
    let clean: Vec<&Row> = c
        .rows
        .iter()
        .filter(|r| {
            // Fault-free runs: the fault matrix has its own section, and
            // under a failover or a pause no lease lock is clean.
            !r.negative_control
                && verdict(r, &[]).class != VerdictClass::Unsafe
                && r.ledger.is_some()
        })
        .collect();
    let best = |f: &dyn Fn(&Row) -> Option<f64>, low: bool| -> Option<(&Row, f64)> {
        clean
            .iter()
            .filter_map(|r| f(r).filter(|v| *v > 0.0).map(|v| (*r, v)))
            .min_by(|a, b| {
                let o = a.1.total_cmp(&b.1);
                if low {
                    o
                } else {
                    o.reverse()
                }
            })
    };
    let clean_names: Vec<&str> = clean.iter().map(|r| r.backend.as_str()).collect();
    match c
        .measured
        .as_ref()
        .and_then(|m| repeated_headlines(m, &clean_names))
    {
        Some(lines) => out.extend(lines),
        None => {
            // One run each: a ranking, not a result (no interval, no tie).
            if let Some((r, v)) = best(&|r| r.latency_measured().map(|s| s.cycle_p50_us), true) {
                let ratio = r
                    .latency_measured()
                    .and_then(|s| s.floor_ratio)
                    .map(|x| format!(", {x:.2}x its raw floor"))
                    .unwrap_or_default();
                out.push(format!(
                    "Lowest uncontended cost in this single run (no repeats, so no interval and no tie test): {} ({v:.0} µs per acquire + release at p50{ratio}).",
                    r.backend
                ));
            }
            if let Some((r, v)) = best(
                &|r| {
                    r.contended_measured()
                        .and_then(crate::model::handovers_per_s)
                },
                false,
            ) {
                out.push(format!(
                    "Most hand-overs per second on one hot key in this single run (no repeats): {} ({v:.0}/s).",
                    r.backend
                ));
            }
        }
    }
    let fenced: Vec<&str> = clean
        .iter()
        .filter(|r| r.capabilities.fencing)
        .map(|r| r.backend.as_str())
        .collect();
    let unfenced: Vec<&str> = clean
        .iter()
        .filter(|r| !r.capabilities.fencing)
        .map(|r| r.backend.as_str())
        .collect();
    if !fenced.is_empty() {
        out.push(format!(
            "When a paused or partitioned holder must not corrupt data (the GC-pause scenario), use a lock with a fencing token the resource checks: {}.{}",
            fenced.join(", "),
            if unfenced.is_empty() {
                String::new()
            } else {
                format!(
                    " Not {}: no safe token, so the resource cannot reject a stale holder.",
                    unfenced.join(", ")
                )
            }
        ));
    }
    out.extend(sale_decisions(c));
    out
}

/// One figure's samples of a backend (those that measured something).
type Fig = fn(&Samples) -> Vec<f64>;

/// The headline figures from the repeats of the durable profile (the one a
/// production deployment runs), each backend among `clean` only: a call
/// between the best and the rest, with intervals. `None` without at least
/// two repeats.
fn repeated_headlines(m: &Measured, clean: &[&str]) -> Option<Vec<String>> {
    let p = m
        .profiles
        .iter()
        .find(|p| p.ran && p.durability == "durable")?;
    if m.repeats < 2 {
        return None;
    }
    let aa = m.aa_backend.as_deref();
    let twin = aa.map(|a| format!("{a} (A/A)"));
    let find = |name: &str| p.backends.iter().find(|s| s.backend == name);
    let noise = |f: Fig| -> f64 {
        match (aa.and_then(find), twin.as_deref().and_then(find)) {
            (Some(a), Some(b)) => stats::noise_floor(&f(a), &f(b)).unwrap_or(0.0),
            _ => 0.0,
        }
    };
    let pick = |f: Fig, lower: bool| {
        let cands: Vec<(String, Vec<f64>)> = p
            .backends
            .iter()
            .filter(|s| clean.contains(&s.backend.as_str()))
            .map(|s| (s.backend.clone(), f(s)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        stats::call(&cands, lower, noise(f)).map(|c| (c, noise(f)))
    };
    let mut out = Vec::new();
    let say = |what: &str, unit: &str, c: &Call, noise: f64, f: Fig| {
        let fig = |name: &str| {
            find(name)
                .and_then(|s| stats::Estimate::of(&f(s)))
                .map_or("-".into(), |e| format!("{} {unit}", e.show(0)))
        };
        match c {
            Call::Winner {
                winner,
                runner_up,
                ratio,
            } => format!(
                "{what}: {winner} ({}), ahead of {runner_up} ({}) by {}x (95 % interval; {} repeats, A/A noise floor {:.1} %).",
                fig(winner),
                fig(runner_up),
                ratio.show(2),
                m.repeats,
                noise * 100.0
            ),
            Call::Tie { between, why, .. } => format!(
                "{what}: tie (within noise) between {}: {why} ({} repeats).",
                between
                    .iter()
                    .map(|b| format!("{b} ({})", fig(b)))
                    .collect::<Vec<_>>()
                    .join(", "),
                m.repeats
            ),
        }
    };
    // The A/A pair itself, judged like any other pair without a noise
    // floor: it must come out a tie, or the machine was too noisy (or the
    // order biased) for any call on this page.
    if let (Some(a), Some(b)) = (aa.and_then(find), twin.as_deref().and_then(find)) {
        let pair = [
            (a.backend.clone(), a.cycle_p50_measured_us()),
            (b.backend.clone(), b.cycle_p50_measured_us()),
        ];
        match stats::call(&pair, true, 0.0) {
            Some(Call::Tie { ratio, .. }) => out.push(format!(
                "A/A check: {} against its twin is a tie, ratio {} (the interval includes 1), as it must be.",
                a.backend,
                ratio.show(2)
            )),
            Some(Call::Winner { ratio, .. }) => out.push(format!(
                "A/A check FAILED: {} differed from its own twin by {}x, whose interval excludes 1; this machine's drift is larger than these intervals, so read every call here with care.",
                a.backend,
                ratio.show(2)
            )),
            None => {}
        }
    }
    let cycle: Fig = Samples::cycle_p50_measured_us;
    if let Some((c, n)) = pick(cycle, true) {
        out.push(say(
            "Lowest uncontended cost (acquire + release, p50 of each run, median over repeats)",
            "µs",
            &c,
            n,
            cycle,
        ));
    }
    let hand: Fig = |s| s.handovers_per_s.clone();
    if let Some((c, n)) = pick(hand, false) {
        out.push(say(
            "Most hand-overs per second on one hot key (to a different worker, after an ok release)",
            "/s",
            &c,
            n,
            hand,
        ));
    }
    Some(out)
}

/// The flash-sale lines of the guide: lock against lock-free, and lock
/// scope on the same backend.
fn sale_decisions(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    let sales = c.sales();
    // The fastest run whose invariants held among those `pick` selects,
    // by durable orders per second: orders over the time until the last
    // one is in PostgreSQL (the pre-deduct baseline's lag included). Not
    // clicks/s: most clicks are cheap refusals once the stock is gone.
    let fastest = |pick: &dyn Fn(&Sale, SaleKind) -> bool| -> Option<(String, f64, f64)> {
        sales
            .iter()
            .filter_map(|s| {
                let k = s.coupon()?;
                let ms = crate::model::durably_sold_out_ms(k)?;
                (k.valid && pick(s, SaleKind::of(&k.plan)) && ms > 0.0)
                    .then(|| (s.label.clone(), k.check.orders as f64 * 1000.0 / ms, ms))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    if let (Some((lock_l, lock_v, lock_ms)), Some((free_l, free_v, free_ms))) = (
        fastest(&|_, kind| matches!(kind, SaleKind::Lock(_) | SaleKind::Segmented)),
        fastest(&|_, kind| kind == SaleKind::Baseline),
    ) {
        out.push(format!(
            "Flash sale: the fastest correct lock-based variant ({lock_l}) had every order durable in PostgreSQL {lock_ms:.0} ms after the sale opened ({lock_v:.0} durable orders/s); the fastest lock-free baseline ({free_l}) after {free_ms:.0} ms ({free_v:.0} orders/s, its database's lag behind the sale included), {} than the lock. Where the invariant fits in one atomic statement or script, no distributed lock is needed.",
            faster_or_slower(free_v, lock_v)
        ));
    }
    // Same backend, only the scope differs: every backend that ran both.
    let mut backends: Vec<&str> = Vec::new();
    for s in &sales {
        if !backends.contains(&s.backend) {
            backends.push(s.backend);
        }
    }
    for b in backends {
        // Without the patterns (LocalFirst, the bought cache): they are
        // set against their own plain runs below, and taking one as the
        // fastest of a scope would compare a pattern, not the scope.
        // Paired by layout (worker processes x tasks each): the fastest of
        // each scope over every layout paired a per-user run of one layout
        // with a per-voucher run of another, figures no table row showed
        // side by side.
        let runs = |want: LockScope| -> Vec<((u32, u32), f64, f64, String)> {
            sales
                .iter()
                .filter_map(|s| {
                    let k = s.coupon()?;
                    let ms = crate::model::durably_sold_out_ms(k)?;
                    (s.backend == b
                        && k.valid
                        && ms > 0.0
                        && SaleKind::of(&k.plan) == SaleKind::Lock(want)
                        && !k.plan.local_first
                        && k.plan.bought_cache_ms.is_none())
                    .then(|| {
                        (
                            (s.summary.workers, k.plan.tasks),
                            k.check.orders as f64 * 1000.0 / ms,
                            ms,
                            s.label.clone(),
                        )
                    })
                })
                .collect()
        };
        let (users, vouchers) = (runs(LockScope::UserVoucher), runs(LockScope::Voucher));
        let pair = vouchers
            .iter()
            .find_map(|v| users.iter().find(|u| u.0 == v.0).map(|u| (u, v)));
        if let Some(((layout, user, user_ms, user_l), (_, voucher, voucher_ms, voucher_l))) = pair {
            out.push(format!(
                "Lock granularity ({b}, {} process(es) x {} task(s) each): a lock per user+voucher ({user_l}) sold out {} than one lock per voucher ({voucher_l}) ({user_ms:.0} ms against {voucher_ms:.0} ms to sell out, compared by durable orders per second); the stock itself stays safe through UPDATE .. WHERE stock > 0, the lock only has to keep one user's clicks apart.",
                layout.0,
                layout.1.max(1),
                faster_or_slower(*user, *voucher)
            ));
        }
        out.extend(pattern_lines(b, &sales));
    }
    out
}

/// "1.09x faster" or "1.09x slower": a rate `a` against a rate `b`, the
/// ratio always at least 1 so it reads as what it is (a ratio of 0.92 is
/// not "0.9x faster").
fn faster_or_slower(a: f64, b: f64) -> String {
    if a >= b {
        format!("{:.2}x faster", a / b)
    } else {
        format!("{:.2}x slower", b / a)
    }
}

/// The production patterns on one backend, each against the run it
/// changes: segments against the single lock, LocalFirst against the
/// same tasks without it, the bought cache's saved acquisitions.
fn pattern_lines(b: &str, sales: &[Sale]) -> Vec<String> {
    let mut out = Vec::new();
    let mine = || {
        sales
            .iter()
            .filter(move |s| s.backend == b)
            .filter_map(|s| Some((s, s.coupon()?)))
            .filter(|(_, k)| k.plan.ordering == Ordering::CommitThenUnlock)
    };
    let mut seg: Vec<(u32, f64, bool)> = mine()
        .filter(|(_, k)| k.plan.strategy == Strategy::Segmented)
        .filter_map(|(_, k)| Some((k.plan.segments, k.time_to_sell_out_ms?, k.valid)))
        .collect();
    seg.sort_by_key(|x| x.0);
    if seg.len() >= 2 {
        let all_valid = seg.iter().all(|x| x.2);
        out.push(format!(
            "Segmented stock ({b}): time to sell out by segment count {}; invariants (total stock never below 0, one order per user, conservation in each segment) {}.",
            seg.iter()
                .map(|(n, ms, _)| format!("{n}: {ms:.0} ms"))
                .collect::<Vec<_>>()
                .join(", "),
            if all_valid { "held in every run" } else { "BROKEN in at least one run" }
        ));
    }
    let per_section = |k: &harness::summary::CouponReport| {
        (k.lock_acquires > 0).then(|| k.lock_round_trips as f64 / k.lock_acquires as f64)
    };
    let tasks_runs: Vec<_> = mine()
        .filter(|(_, k)| k.plan.tasks > 1 && k.plan.strategy == Strategy::Lock)
        .collect();
    for (_, lf) in tasks_runs.iter().filter(|(_, k)| k.plan.local_first) {
        let twin = tasks_runs.iter().find(|(_, k)| {
            !k.plan.local_first
                && k.plan.tasks == lf.plan.tasks
                && k.plan.lock_scope == lf.plan.lock_scope
                && k.plan.bought_cache_ms.is_none()
        });
        if let (Some((_, plain)), Some(a), Some(z)) = (
            twin,
            twin.and_then(|(_, k)| per_section(k)),
            per_section(lf),
        ) {
            out.push(format!(
                "LocalFirst ({b}, {} tasks per process): {z:.2} remote round trips per acquisition against {a:.2} without it, {:.0} against {:.0} clicks/s; invariants {}.",
                lf.plan.tasks,
                lf.clicks_per_s,
                plain.clicks_per_s,
                if lf.valid { "held" } else { "BROKEN" }
            ));
        }
    }
    for (_, k) in mine().filter(|(_, k)| k.plan.bought_cache_ms.is_some()) {
        out.push(format!(
            "Bought cache ({b}, {} ms): {} of {} clicks refused before the lock ({:.0} % of the lock acquisitions a run without it would take); invariants {}.",
            k.plan.bought_cache_ms.unwrap_or(0),
            k.bought_cache_hits,
            k.clicks,
            100.0 * k.bought_cache_hits as f64 / (k.lock_acquires + k.bought_cache_hits).max(1) as f64,
            if k.valid { "held" } else { "BROKEN" }
        ));
    }
    out
}

/// Runs of the comparison that measured something other than what they
/// set out to: a server it started died on its own (their figures are an
/// outage's), their workers were stopped early for it, or their data
/// checks could not run. One line each, naming the run and why.
pub fn outages(c: &Comparison) -> Vec<String> {
    let mut runs: Vec<(String, &Summary)> = Vec::new();
    for r in &c.rows {
        for (what, s) in [
            ("ledger", &r.ledger),
            ("latency", &r.latency),
            ("one hot key", &r.contended),
            ("a key each", &r.disjoint),
            ("flash sale", &r.coupon),
            ("open loop", &r.open_loop),
        ] {
            if let Some(s) = s {
                runs.push((format!("{}, {what}", r.backend), s));
            }
        }
    }
    for s in &c.sale {
        runs.push((format!("flash sale: {}", s.label), &s.summary));
    }
    for f in &c.faults {
        runs.push((
            format!("{} under {} ({})", f.backend, f.fault, f.setup),
            &f.summary,
        ));
    }
    runs.into_iter()
        .filter_map(|(what, s)| {
            if !s.servers_exited.is_empty() {
                Some(format!(
                    "{what}: a server died on its own during the run, so its figures are an outage's: {}",
                    s.servers_exited.join("; ")
                ))
            } else if let Some(w) = &s.stopped_early {
                Some(format!("{what}: the workers were stopped early ({w})"))
            } else if s.timed_out {
                Some(format!("{what}: cut short at --max-secs"))
            } else {
                s.data_check_error
                    .as_ref()
                    .map(|e| format!("{what}: its data checks could not run ({e})"))
            }
        })
        .collect()
}

/// Things the reader must not miss: a negative control nobody caught means
/// a checker is broken.
pub(crate) fn warnings(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(phase) = &c.interrupted {
        out.push(format!(
            "This comparison was interrupted during {phase}: only the runs that finished before it are here, and the phases after it did not run. The verdicts rest on those runs alone, and the guide and the headlines answer nothing."
        ));
    }
    out.extend(outages(c));
    let faults = crate::faults::judged(c);
    for r in c.rows.iter().filter(|r| r.negative_control) {
        let faulted = faults.iter().any(|f| f.backend == r.backend);
        if r.ledger.is_some()
            && verdict(r, &faults).class != VerdictClass::Unsafe
            && (r.needs_fault.is_none() || faulted)
        {
            out.push(format!(
                "Negative control {} was NOT caught in this run: treat every verdict here with suspicion.",
                r.backend
            ));
        }
    }
    for r in c.rows.iter().filter(|r| !r.negative_control) {
        let v = verdict(r, &faults);
        if v.class == VerdictClass::Unsafe {
            out.push(format!("{}: {}", r.backend, v.text));
        }
    }
    for f in crate::fairness::cells(c) {
        if let Some(x) = f.finding {
            out.push(format!("{}: {x}", f.backend));
        }
    }
    for s in &c.sale {
        if let Some(k) = &s.summary.coupon {
            if !k.valid && SaleKind::of(&k.plan) != SaleKind::DeliberateBug {
                out.push(format!("{}: flash-sale invariants broken", s.label));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use harness::spec::{CouponPlan, LockScope, Ordering, Strategy};

    use super::SaleKind;

    fn plan(strategy: Strategy, lock_scope: LockScope, ordering: Ordering) -> CouponPlan {
        CouponPlan {
            stock: 200,
            users: 600,
            clicks: 3,
            lock_scope,
            ordering,
            commit_delay_ms: 0,
            unique_index: true,
            strategy,
            tasks: 1,
            local_first: false,
            bought_cache_ms: None,
            segments: 1,
        }
    }

    #[test]
    fn a_sale_is_classified_by_strategy_ordering_and_scope() {
        use LockScope::{UserVoucher, Voucher};
        use Ordering::{CommitThenUnlock as Commit, UnlockThenCommit as Unlock};
        let cases = [
            (
                Strategy::Lock,
                UserVoucher,
                Commit,
                SaleKind::Lock(UserVoucher),
            ),
            (Strategy::Lock, Voucher, Commit, SaleKind::Lock(Voucher)),
            (Strategy::Lock, UserVoucher, Unlock, SaleKind::DeliberateBug),
            (Strategy::Lock, Voucher, Unlock, SaleKind::DeliberateBug),
            (Strategy::SqlAtomic, UserVoucher, Commit, SaleKind::Baseline),
            (Strategy::SqlAtomic, Voucher, Unlock, SaleKind::Baseline),
            (Strategy::Segmented, Voucher, Commit, SaleKind::Segmented),
            (
                Strategy::Segmented,
                Voucher,
                Unlock,
                SaleKind::DeliberateBug,
            ),
            (
                Strategy::RedisPrededuct,
                UserVoucher,
                Commit,
                SaleKind::Baseline,
            ),
            (
                Strategy::RedisPrededuct,
                Voucher,
                Unlock,
                SaleKind::Baseline,
            ),
        ];
        for (strategy, scope, ordering, kind) in cases {
            assert_eq!(
                SaleKind::of(&plan(strategy, scope, ordering)),
                kind,
                "{strategy:?} {scope:?} {ordering:?}"
            );
        }
    }
}
