//! "Which lock for which job" and the warnings above it, derived from the
//! figures alone.
//!
//! The flash-sale rules classify a run by its plan (strategy, lock scope,
//! ordering: [`SaleKind`]), never by its label, so renaming a variant in
//! `lockbench compare` cannot silently drop it from the guide.

use harness::spec::{CouponPlan, LockScope, Ordering, Strategy};

use crate::model::{Comparison, Row, Sale};
use crate::verdict::{verdict, VerdictClass};

/// What a flash-sale run is, as the decision guide sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SaleKind {
    /// The lock under test over this scope, released after COMMIT.
    Lock(LockScope),
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
            (Strategy::Lock, Ordering::UnlockThenCommit) => SaleKind::DeliberateBug,
            (Strategy::SqlAtomic | Strategy::RedisPrededuct, _) => SaleKind::Baseline,
        }
    }
}

/// "Which lock for which job", from the numbers alone.
pub fn decisions(c: &Comparison) -> Vec<String> {
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
    if let Some((r, v)) = best(&|r| r.latency.as_ref().map(|s| s.cycle_p50_us), true) {
        let ratio = r
            .latency
            .as_ref()
            .and_then(|s| s.floor_ratio)
            .map(|x| format!(", {x:.2}x its raw floor"))
            .unwrap_or_default();
        out.push(format!(
            "Lowest uncontended cost: {} ({v:.0} µs per acquire + release at p50{ratio}).",
            r.backend
        ));
    }
    if let Some((r, v)) = best(&|r| r.contended.as_ref().map(|s| s.throughput_per_s), false) {
        out.push(format!(
            "Most hand-overs per second on one hot key: {} ({v:.0} cycles/s).",
            r.backend
        ));
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

/// The flash-sale lines of the guide: lock against lock-free, and lock
/// scope on the same backend.
fn sale_decisions(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    let sales = c.sales();
    // The fastest run whose invariants held among those `pick` selects.
    let fastest = |pick: &dyn Fn(&Sale, SaleKind) -> bool| -> Option<(String, f64)> {
        sales
            .iter()
            .filter_map(|s| {
                let k = s.coupon()?;
                (k.valid && pick(s, SaleKind::of(&k.plan)))
                    .then(|| (s.label.clone(), k.clicks_per_s))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    if let (Some((lock_l, lock_v)), Some((free_l, free_v))) = (
        fastest(&|_, kind| matches!(kind, SaleKind::Lock(_))),
        fastest(&|_, kind| kind == SaleKind::Baseline),
    ) {
        out.push(format!(
            "Flash sale: the fastest correct lock-based variant ({lock_l}) sold at {lock_v:.0} clicks/s; the fastest lock-free baseline ({free_l}) at {free_v:.0} clicks/s, {:.1}x. Where the invariant fits in one atomic statement or script, no distributed lock is needed.",
            free_v / lock_v
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
        let scope = |want: LockScope| {
            fastest(&|s, kind| s.backend == b && kind == SaleKind::Lock(want)).map(|(_, v)| v)
        };
        if let (Some(user), Some(voucher)) =
            (scope(LockScope::UserVoucher), scope(LockScope::Voucher))
        {
            out.push(format!(
                "Lock granularity ({b}): a lock per user+voucher sold {:.1}x faster than one lock per voucher; the stock itself stays safe through UPDATE .. WHERE stock > 0, the lock only has to keep one user's clicks apart.",
                user / voucher
            ));
        }
    }
    out
}

/// Things the reader must not miss: a negative control nobody caught means
/// a checker is broken.
pub(crate) fn warnings(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
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
