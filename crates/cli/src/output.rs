//! What a run prints for people, and the flash sale's report read back
//! from its database.

use harness::coordinator;
use harness::data::DataDb;
use harness::spec::CouponPlan;
use harness::summary::CouponReport;

/// The coupon workload's report: the workers' counters next to the
/// invariants checked in PostgreSQL.
pub(crate) async fn coupon_report(
    db: &DataDb,
    plan: &CouponPlan,
    out: &coordinator::RunOutput,
    consumer: Option<harness::data::ConsumerStats>,
) -> anyhow::Result<CouponReport> {
    let check = db.check_coupon().await?;
    let n = |name: &str| out.counters.get(name).copied().unwrap_or(0);
    let ordered = n("ordered");
    let last_order = out.marks.get("last_order_ns").copied();
    // Acknowledged to the user but absent from the database: the
    // pre-deduct design's risk if its consumer loses an order.
    let orders_lost = i64::try_from(ordered).unwrap_or(i64::MAX) - check.orders;
    // A dead worker's acknowledged orders died with its counters: what
    // the others acknowledged beyond the database is then a lower bound,
    // and fewer is no loss (it read "orders lost -156 -> BROKEN").
    let incomplete = !out.deaths.is_empty();
    let orders_lost = if incomplete {
        orders_lost.max(0)
    } else {
        orders_lost
    };
    let wall_s = out.wall.as_secs_f64();
    Ok(CouponReport {
        plan: plan.clone(),
        clicks: n("clicks"),
        ordered,
        rejected_duplicate: n("rejected_duplicate"),
        rejected_sold_out: n("rejected_sold_out"),
        rejected_lock_timeout: n("rejected_lock_timeout"),
        lock_errors: n("lock_errors"),
        errors: n("errors"),
        // More orders than acknowledged is no loss: a click whose reply
        // was lost after its order went through (Redis restarting under
        // the pre-deduct script, a COMMIT's reply cut) was told "error".
        valid: check.valid() && orders_lost <= 0,
        time_to_sell_out_ms: last_order
            .filter(|_| check.remaining_stock == 0)
            .map(|t| t.saturating_sub(out.started_ns) as f64 / 1e6),
        clicks_per_s: if wall_s > 0.0 {
            n("clicks") as f64 / wall_s
        } else {
            0.0
        },
        orders_lost,
        acknowledged_incomplete: incomplete,
        async_lag_ms: consumer
            .as_ref()
            .zip(last_order)
            .map(|(c, t)| c.last_write_ns.saturating_sub(t) as f64 / 1e6),
        consumer,
        check,
        lock_acquires: n("lock_acquires"),
        lock_round_trips: n("lock_round_trips"),
        bought_cache_hits: n("bought_cache_hits"),
    })
}

pub(crate) fn print_human(s: &harness::summary::Summary, out_dir: &std::path::Path) {
    println!(
        "{} / {} with {} worker process(es)",
        s.backend, s.workload, s.workers
    );
    // Across hosts, the history of a host that failed or went silent is
    // lost: the counts and the overlap check below cover the others only
    // (they read as the whole run's).
    if let Some(h) = &s.hosts {
        let lost: Vec<String> = h
            .members
            .iter()
            .filter(|m| m.state != "done")
            .map(|m| format!("shard {} ({})", m.shard, m.host))
            .collect();
        if !lost.is_empty() {
            println!(
                "  INCOMPLETE: the histories of {} of {} hosts are lost ({}): the acquisitions and the overlap check below cover the other hosts only; the ledger's database checks cover every section",
                lost.len(),
                h.members.len(),
                lost.join(", ")
            );
        }
    }
    println!(
        "  acquisitions: {} ok, {} failed, {} unknown; releases that found the lock gone: {}",
        s.ops_ok, s.ops_failed, s.ops_info, s.release_not_held
    );
    println!(
        "  mutual exclusion: {} violation(s), longest overlap {:.3} ms",
        s.violations, s.max_overlap_ms
    );
    if s.token_regressions > 0 {
        println!(
            "  FENCING: {} token(s) not above one granted before them in real time (the tokens went backwards)",
            s.token_regressions
        );
    }
    println!(
        "  round trips per acquire: {:.2} (mean)",
        s.acquire_round_trips_mean
    );
    // A p99 of a few samples is one or two unlucky ones: shown, as in the
    // report, only from `P99_MIN_COUNT` samples on.
    let p99 = |p: &harness::summary::Percentiles| match p.reliable_p99_us() {
        Some(v) => format!("{v:.1} µs"),
        None => format!("- (only {} samples)", p.count),
    };
    println!(
        "  acquire p50 {:.1} µs, p99 {}; cycle p50 {:.1} µs, p99 {}; {:.0} cycles/s",
        s.acquire_p50_us,
        p99(&s.acquire),
        s.cycle_p50_us,
        p99(&s.cycle),
        s.throughput_per_s
    );
    if let (Some(f), Some(r)) = (s.floor_p50_us, s.floor_ratio) {
        println!("  raw floor p50 {f:.1} µs -> cycle is {r:.2}x the floor");
    }
    if let Some(c) = &s.cpu {
        let per = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} µs"));
        println!(
            "  CPU per cycle: servers {}, workers {} ({:.1} s and {:.1} s over the run)",
            c.servers_us_per_cycle
                .map_or("- (not started by this run)".to_string(), |v| format!(
                    "{v:.0} µs"
                )),
            per(c.workers_us_per_cycle),
            c.servers_ms.unwrap_or(0.0) / 1000.0,
            c.workers_ms / 1000.0
        );
    }
    for (name, p) in &s.peers {
        println!(
            "  peer {name}: cycle p50 {:.1} µs -> ours is {:.2}x",
            p.cycle.p50_us, p.ratio
        );
    }
    if let Some(h) = &s.handover {
        println!(
            "  handover (release -> next waiter holds it): p50 {:.1} µs, p99 {} over {}",
            h.p50_us,
            p99(h),
            h.count
        );
    }
    if let Some(l) = &s.ledger {
        println!(
            "  ledger: {} critical sections, counter {} -> {} lost update(s); fenced ledger accepted {}, rejected {}; stale writes: {} accepted by the fenced ledger, {} by an unfenced one -> {}",
            l.acknowledged, l.counter_final, l.lost_updates, l.accepted, l.rejected,
            l.stale_writes_accepted, l.stale_writes_unfenced, l.verdict
        );
        if l.current_writes_rejected > 0 {
            println!(
                "  {} write(s) refused by the fence though no later holder had written: a token not above an earlier holder's (tokens that went backwards, or an acquire reply that came late)",
                l.current_writes_rejected
            );
        }
        if let Some(d) = &l.db_clock {
            println!(
                "  by the database's clock (no shared clock needed): {} of {} sections overlapped another, longest {:.1} ms",
                d.violations, d.sections, d.max_overlap_ms
            );
        }
    }
    if let Some(c) = &s.coupon {
        let k = &c.check;
        println!(
            "  coupon ({:?}, scope {:?}, {:?}, unique index {}): {} clicks -> {} ordered, {} duplicate, {} sold out, {} without the lock ({} acquire(s) failed with an error, not a timeout), {} errors; {:.0} clicks/s{}",
            c.plan.strategy, c.plan.lock_scope, c.plan.ordering, c.plan.unique_index,
            c.clicks, c.ordered, c.rejected_duplicate, c.rejected_sold_out,
            c.rejected_lock_timeout, c.lock_errors, c.errors, c.clicks_per_s,
            c.time_to_sell_out_ms.map(|t| format!(", sold out in {t:.0} ms")).unwrap_or_default()
        );
        println!(
            "  invariants: stock {} -> {} (lowest {}), {} orders, {} user(s) with two orders, oversold {}, orders lost {} -> {}",
            k.initial_stock, k.remaining_stock, k.min_stock, k.orders, k.users_with_two_orders,
            k.oversold, c.orders_lost, if c.valid { "HOLD" } else { "BROKEN" }
        );
        if c.orders_lost < 0 {
            println!(
                "  ({} order(s) in the database no click was told of: a reply lost after the order went through; not a loss)",
                -c.orders_lost
            );
        }
        if c.acknowledged_incomplete {
            println!(
                "  (workers died mid-run: the orders they acknowledged died with their counters, so 'orders lost' counts only what the others acknowledged beyond the database, a lower bound)"
            );
        }
    }
    // The hard limit cut the run short: fewer operations than planned,
    // whatever the figures above say.
    if s.timed_out {
        println!("  STOPPED at --max-secs: the workers did not finish what the run planned");
    }
    if let Some(h) = &s.hosts {
        for m in &h.members {
            println!(
                "  host {} (shard {}, workers {:?}): {}{}",
                m.host,
                m.shard,
                m.workers,
                m.state,
                m.message
                    .as_deref()
                    .map(|w| format!(": {w}"))
                    .unwrap_or_default()
            );
            if let Some(n) = &m.note {
                println!("    WARNING: {n}");
            }
        }
        println!(
            "  compared across hosts as if they shared a clock, the same stamps would claim {} violation(s): no verdict, the hosts' clocks do not compare",
            h.naive_cross_host_violations
        );
    }
    for d in &s.worker_deaths {
        println!("  worker {} died mid-run: {}", d.worker, d.message);
    }
    for (kind, e) in &s.errors {
        println!("  errors: {} {kind}, first: {}", e.count, e.first);
    }
    println!("  results: {}", out_dir.join("results.json").display());
}

/// Why the run `s` measured something other than what it set out to, if
/// it did: a server of ours died on its own (an outage, not the lock), its
/// workers were stopped early for that, the hard limit cut it short, or
/// its data checks could not run.
pub(crate) fn unsound(s: &harness::summary::Summary) -> Option<String> {
    if !s.servers_exited.is_empty() {
        return Some(format!(
            "{}: not an injected fault, so this run measured an outage",
            s.servers_exited.join("; ")
        ));
    }
    if let Some(why) = &s.stopped_early {
        return Some(format!("the workers were stopped early: {why}"));
    }
    // A worker that died on its own (not by the run's fault) took its share
    // of the run with it: 204 of 800 sections ran, "ok", exit 0.
    let died: Vec<String> = s
        .worker_deaths
        .iter()
        .filter(|d| !d.injected)
        .map(|d| format!("worker {}: {}", d.worker, d.message))
        .collect();
    if let Some(first) = died.first() {
        return Some(format!(
            "{} worker(s) died without an injected fault ({first}{}): the run is a part of what it planned",
            died.len(),
            if died.len() > 1 { "; ..." } else { "" }
        ));
    }
    if s.timed_out {
        return Some(
            "the run hit --max-secs before its workers finished what it planned: its figures are a part of the run, cut where the limit fell"
                .to_string(),
        );
    }
    s.data_check_error
        .as_ref()
        .map(|e| format!("the data checks could not run: {e}"))
}

/// Every unsound run this process has seen (see [`note_unsound`]): a
/// comparison fails on any of them, wherever it sat.
static UNSOUND: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Remembers the run `what` if it was unsound; returns why.
pub(crate) fn note_unsound(what: &str, s: &harness::summary::Summary) -> Option<String> {
    let why = unsound(s)?;
    if let Ok(mut v) = UNSOUND.lock() {
        v.push(format!("{what}: {why}"));
    }
    Some(why)
}

/// The unsound runs noted so far.
pub(crate) fn unsound_runs() -> Vec<String> {
    UNSOUND.lock().map(|v| v.clone()).unwrap_or_default()
}

/// [`unsound`] as an error naming the run's results, for the callers that
/// gather runs (curve points, the comparison's samples), as `lockbench
/// run` fails too; noted for the comparison's exit code.
pub(crate) fn sound(
    r: anyhow::Result<(harness::summary::Summary, std::path::PathBuf)>,
) -> anyhow::Result<(harness::summary::Summary, std::path::PathBuf)> {
    let (s, dir) = r?;
    let shown = dir.join("results.json").display().to_string();
    if let Some(why) = note_unsound(&shown, &s) {
        anyhow::bail!("{why} (results: {shown})");
    }
    // No acquisition is no measurement: it read as a 0.0 µs cycle, and
    // the report's lowest latency.
    if let Some(why) = nothing_acquired(&s) {
        if let Ok(mut v) = UNSOUND.lock() {
            v.push(format!("{shown}: {why}"));
        }
        anyhow::bail!("{why} (results: {shown})");
    }
    Ok((s, dir))
}

/// Why a run that tried to acquire never succeeded, if it did not.
pub(crate) fn nothing_acquired(s: &harness::summary::Summary) -> Option<String> {
    let tried = s.ops_failed + s.ops_info;
    if s.ops_ok > 0 {
        return None;
    }
    if tried == 0 {
        // The flash sale's lock-free variants (Lua pre-deduct) take no lock.
        if s.coupon.is_some() {
            return None;
        }
        return Some(
            "no acquire was attempted: the run ended before its first operation (see --duration, --max-secs, --rate)"
                .to_string(),
        );
    }
    let reasons: Vec<String> = s
        .errors
        .iter()
        .map(|(kind, e)| format!("{} {kind}, first: {}", e.count, e.first))
        .collect();
    Some(format!(
        "no acquire succeeded: {tried} tried ({} failed, {} unknown); {}",
        s.ops_failed,
        s.ops_info,
        reasons.join("; ")
    ))
}

/// An error and its causes on one line, each said once: our errors
/// already carry their source's text in their own, so `{:#}` printed the
/// same "Connection refused" two or three times.
pub(crate) fn causes(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let s = c.to_string();
        // Our errors end with their source's text: skip it only there, so
        // a cause that merely occurs inside another is still said.
        if out.ends_with(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{causes, nothing_acquired, unsound};

    #[test]
    fn a_worker_that_died_on_its_own_makes_the_run_unsound() {
        let death = |injected| harness::coordinator::WorkerDeath {
            worker: 2,
            at_ns: 1,
            message: "exited without finishing".into(),
            injected,
        };
        let mut s = harness::summary::Summary {
            ops_ok: 10,
            worker_deaths: vec![death(true)],
            ..Default::default()
        };
        assert_eq!(unsound(&s), None, "a fault's own kill is expected");
        s.worker_deaths.push(death(false));
        let why = unsound(&s).unwrap_or_default();
        assert!(
            why.contains("1 worker(s) died") && why.contains("worker 2"),
            "{why}"
        );
    }

    #[test]
    fn a_run_with_no_operation_at_all_is_no_measurement() {
        let s = harness::summary::Summary::default();
        let why = nothing_acquired(&s).unwrap_or_default();
        assert!(why.contains("no acquire was attempted"), "{why}");
        let s = harness::summary::Summary {
            ops_ok: 1,
            ..Default::default()
        };
        assert_eq!(nothing_acquired(&s), None);
    }

    #[test]
    fn each_cause_is_said_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = anyhow::Error::new(refused).context("redis: connecting to redis://h:1: refused");
        assert_eq!(causes(&e), "redis: connecting to redis://h:1: refused");
        let e = anyhow::anyhow!("the data store").context("ledger");
        assert_eq!(causes(&e), "ledger: the data store");
    }
}
