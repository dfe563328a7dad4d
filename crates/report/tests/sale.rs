//! The flash-sale part of the decision guide and the warnings: which
//! variants count as lock-based, lock-free or a deliberate bug.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use distlock::{Capabilities, TokenSource};
use harness::summary::Summary;
use report::{Comparison, Row, SaleRun};
use serde_json::{json, Value};

const FENCED: Capabilities = Capabilities {
    fencing: true,
    reentrant: true,
    fair: false,
    lost_signal: true,
    renewal: true,
    survives_failover: false,
    token_source: TokenSource::Counter,
};

fn base(backend: &str, workload: &str, rate: f64) -> Value {
    let p = json!({"count": 100, "p50_us": 150.0, "p90_us": 160.0, "p99_us": 170.0,
                   "p999_us": 180.0, "max_us": 190.0});
    json!({
        "backend": backend, "workload": workload, "workers": 4, "ops_ok": 400, "ops_failed": 0,
        "ops_info": 0, "release_not_held": 0, "violations": 0, "max_overlap_ms": 0.0,
        "acquire_p50_us": 150.0, "acquire_p99_us": 170.0, "acquire": p.clone(),
        "cycle_p50_us": 150.0, "cycle_p99_us": 170.0, "cycle": p,
        "floor_p50_us": 75.0, "floor_ratio": 2.0, "peers": {},
        "acquire_round_trips_mean": 1.0, "throughput_per_s": rate, "wall_s": 1.0,
        "timed_out": false, "counters": {}
    })
}

fn ledger(backend: &str) -> Summary {
    let mut v = base(backend, "ledger", 90.0);
    v["ledger"] = json!({"fenceable": true, "writes": 400, "accepted": 400, "rejected": 0,
        "stale_writes_accepted": 0, "stale_writes_unfenced": 0, "acknowledged": 400,
        "counter_final": 400, "lost_updates": 0, "verdict": "ok"});
    serde_json::from_value(v).unwrap()
}

/// A coupon run of the given plan (`strategy`, `lock_scope`, `ordering` as
/// they appear in results.json).
/// `rate` = durable orders per second: the stock (200) sells out in
/// 200 / rate seconds.
fn sale(backend: &str, plan: [&str; 3], rate: f64, valid: bool) -> Summary {
    let mut v = base(backend, "coupon", 0.0);
    let dup = i64::from(!valid);
    v["coupon"] = json!({
        "plan": {"stock": 200, "users": 600, "clicks": 3, "strategy": plan[0],
                 "lock_scope": plan[1], "ordering": plan[2], "commit_delay_ms": 0,
                 "unique_index": valid},
        "clicks": 1800, "ordered": 200 + dup, "rejected_duplicate": 1000,
        "rejected_sold_out": 600, "rejected_lock_timeout": 0, "errors": 0,
        "check": {"initial_stock": 200, "remaining_stock": 0, "min_stock": 0,
                  "orders": 200 + dup, "users_with_two_orders": dup, "duplicate_orders": dup,
                  "oversold": dup, "stock_never_negative": true, "one_order_per_user": valid,
                  "orders_match_stock": valid},
        "valid": valid, "time_to_sell_out_ms": (200 + dup) as f64 * 1000.0 / rate, "clicks_per_s": rate * 9.0,
        "orders_lost": 0
    });
    serde_json::from_value(v).unwrap()
}

const USER: [&str; 3] = ["lock", "user+voucher", "commit-then-unlock"];
const VOUCHER: [&str; 3] = ["lock", "voucher", "commit-then-unlock"];
const SQL: [&str; 3] = ["sql-atomic", "user+voucher", "commit-then-unlock"];
const PREDEDUCT: [&str; 3] = ["redis-prededuct", "user+voucher", "commit-then-unlock"];
const BUG: [&str; 3] = ["lock", "user+voucher", "unlock-then-commit"];

fn row(backend: &str, coupon_rate: f64) -> Row {
    let l = ledger(backend);
    Row {
        backend: backend.into(),
        about: format!("{backend} lock"),
        negative_control: false,
        needs_fault: None,
        capabilities: FENCED,
        ledger: Some(l.clone()),
        latency: Some(l.clone()),
        contended: Some(l),
        disjoint: None,
        coupon: Some(sale(backend, USER, coupon_rate, true)),
        open_loop: None,
        servers: None,
    }
}

fn run(label: &str, plan: [&str; 3], rate: f64, valid: bool) -> SaleRun {
    SaleRun {
        label: label.into(),
        note: format!("how {label} works"),
        backend: "redis".into(),
        summary: sale("redis", plan, rate, valid),
    }
}

/// What `lockbench compare` produces: each backend's own sale, then the
/// redis variants.
fn compare_like() -> Comparison {
    Comparison {
        format: report::FORMAT,
        scaling: Vec::new(),
        benches: None,
        interrupted: None,
        generated_utc: "20261202-120000".into(),
        tool_version: "0.1.0".into(),
        cores: 2,
        rows: vec![row("redis", 800.0), row("etcd", 900.0)],
        faults: Vec::new(),
        measured: None,
        sale: vec![
            run("redis, lock per voucher", VOUCHER, 200.0, true),
            run("baseline: sql-atomic", SQL, 3000.0, true),
            run("baseline: redis-prededuct", PREDEDUCT, 6000.0, true),
            run("bug: redis, unlock before commit", BUG, 9000.0, false),
        ],
    }
}

#[test]
fn the_sale_guide_compares_the_fastest_correct_lock_with_the_fastest_baseline() {
    let d = report::decisions(&compare_like());
    assert!(
        d.contains(&"Flash sale: the fastest correct lock-based variant (etcd, lock per user+voucher) had every order durable in PostgreSQL 222 ms after the sale opened (900 durable orders/s); the fastest lock-free baseline (baseline: redis-prededuct) after 33 ms (6000 orders/s, its database's lag behind the sale included), 6.67x faster than the lock. Where the invariant fits in one atomic statement or script, no distributed lock is needed.".to_string()),
        "{d:#?}"
    );
    assert!(
        d.contains(&"Lock granularity (redis, 4 process(es) x 1 task(s) each): a lock per user+voucher (redis, lock per user+voucher) sold out 4.00x faster than one lock per voucher (redis, lock per voucher) (250 ms against 1000 ms to sell out, compared by durable orders per second); the stock itself stays safe through UPDATE .. WHERE stock > 0, the lock only has to keep one user's clicks apart.".to_string()),
        "{d:#?}"
    );
}

#[test]
fn a_broken_baseline_is_not_recommended_and_is_flagged() {
    let mut c = compare_like();
    c.sale[2].summary = sale("redis", PREDEDUCT, 6000.0, false);
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("baseline (baseline: sql-atomic) after 67 ms (3000 orders/s"),
        "{d}"
    );
    let html = report::render(&c).unwrap();
    assert!(html.contains("baseline: redis-prededuct: flash-sale invariants broken"));
    // The deliberate bug breaking its invariants is the point, not a warning.
    assert!(!html.contains("unlock before commit: flash-sale invariants broken"));
}

#[test]
fn the_guide_reads_the_plan_not_the_label() {
    // The same runs under labels that share no words with the old ones.
    let mut renamed = compare_like();
    for (s, l) in renamed.sale.iter_mut().zip(["v1", "v2", "v3", "v4"]) {
        s.label = l.into();
    }
    let d = report::decisions(&renamed).join("\n");
    assert!(
        d.contains("lock-based variant (etcd, lock per user+voucher) had every order durable in PostgreSQL 222 ms after the sale opened (900 durable orders/s); the fastest lock-free baseline (v3) after 33 ms (6000"),
        "{d}"
    );
    assert!(
        d.contains("Lock granularity (redis, 4 process(es) x 1 task(s) each): a lock per user+voucher (redis, lock per user+voucher) sold out 4.00x faster"),
        "{d}"
    );
    // A label that merely mentions a baseline does not make one, and a
    // deliberate bug is recognised by its ordering, not by the word "bug".
    let mut c = compare_like();
    c.sale[0].label = "baseline: redis, lock per voucher".into();
    c.sale[1].summary = sale("redis", SQL, 100.0, true);
    c.sale[2].summary = sale("redis", PREDEDUCT, 150.0, true);
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("fastest lock-free baseline (baseline: redis-prededuct) after 1333 ms (150"),
        "{d}"
    );
    let html = report::render(&renamed).unwrap();
    assert!(
        !html.contains("flash-sale invariants broken"),
        "bug variant flagged"
    );
}

/// The probe's run: a lock per user+voucher sold out in 3532 ms, one lock
/// per voucher in 3242 ms. That is slower, and the line says so (it once
/// read "0.9x faster").
#[test]
fn a_finer_lock_that_sold_out_slower_is_called_slower() {
    let mut c = compare_like();
    c.rows[0].coupon = Some(sale("redis", USER, 200.0 * 1000.0 / 3532.0, true));
    c.sale[0].summary = sale("redis", VOUCHER, 200.0 * 1000.0 / 3242.0, true);
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("Lock granularity (redis, 4 process(es) x 1 task(s) each): a lock per user+voucher (redis, lock per user+voucher) sold out 1.09x slower than one lock per voucher (redis, lock per voucher) (3532 ms against 3242 ms to sell out"),
        "{d}"
    );
    assert!(!d.contains("0.9x") && !d.contains("0.92x"), "{d}");
    // A lock-free baseline slower than the lock is called slower too.
    c.sale[1].summary = sale("redis", SQL, 10.0, true);
    c.sale[2].summary = sale("redis", PREDEDUCT, 45.0, true);
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("(45 orders/s, its database's lag behind the sale included), 20.00x slower than the lock."),
        "{d}"
    );
}

#[test]
fn lock_granularity_is_reported_for_every_backend_that_ran_both_scopes() {
    let mut c = compare_like();
    c.sale.push(SaleRun {
        backend: "etcd".into(),
        ..run("etcd, lock per voucher", VOUCHER, 300.0, true)
    });
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("Lock granularity (redis, 4 process(es) x 1 task(s) each): a lock per user+voucher (redis, lock per user+voucher) sold out 4.00x faster"),
        "{d}"
    );
    assert!(
        d.contains("Lock granularity (etcd, 4 process(es) x 1 task(s) each): a lock per user+voucher (etcd, lock per user+voucher) sold out 3.00x faster"),
        "{d}"
    );
}

/// Scopes are compared within one layout: a per-voucher run of another
/// layout (2 processes x 4 tasks), faster than the same-layout one, is not
/// set against the per-user run (a probe: the line read "398 ms against
/// 1063 ms", the 1063 from a row of another layout, while the row "lock per
/// voucher" said 1789 ms).
#[test]
fn lock_granularity_pairs_runs_of_one_layout() {
    let mut c = compare_like();
    let mut other = run(
        "redis, lock per voucher, 2 processes x 4 tasks",
        VOUCHER,
        900.0,
        true,
    );
    other.summary.workers = 2;
    if let Some(k) = other.summary.coupon.as_mut() {
        k.plan.tasks = 4;
    }
    c.sale.insert(0, other);
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("than one lock per voucher (redis, lock per voucher) (250 ms against 1000 ms"),
        "{d}"
    );
    assert!(!d.contains("2 processes x 4 tasks) ("), "{d}");
}

#[test]
fn an_older_comparison_without_the_newer_fields_still_loads() {
    let c = compare_like();
    let mut v = serde_json::to_value(&c).unwrap();
    for r in v["rows"].as_array_mut().unwrap() {
        r.as_object_mut().unwrap().remove("needs_fault");
    }
    for s in v["sale"].as_array_mut().unwrap() {
        s.as_object_mut().unwrap().remove("note");
    }
    let old: Comparison = serde_json::from_value(v).unwrap();
    assert_eq!(report::decisions(&old), report::decisions(&c));
}

/// A pattern run: `sale` with the plan's pattern fields and the lock's
/// counters set.
fn pattern(set: Value, acquires: u64, trips: u64, hits: u64, valid: bool) -> Summary {
    let mut v = serde_json::to_value(sale("redis", VOUCHER, 400.0, valid)).unwrap();
    for (k, x) in set.as_object().unwrap() {
        v["coupon"]["plan"][k] = x.clone();
    }
    v["coupon"]["lock_acquires"] = json!(acquires);
    v["coupon"]["lock_round_trips"] = json!(trips);
    v["coupon"]["bought_cache_hits"] = json!(hits);
    serde_json::from_value(v).unwrap()
}

fn pattern_run(label: &str, s: Summary) -> SaleRun {
    SaleRun {
        label: label.into(),
        note: String::new(),
        backend: "redis".into(),
        summary: s,
    }
}

#[test]
fn the_patterns_are_each_set_against_the_run_they_change() {
    let mut c = compare_like();
    c.sale.extend([
        pattern_run("tasks", pattern(json!({"tasks": 4}), 1800, 14400, 0, true)),
        pattern_run(
            "tasks + LocalFirst",
            pattern(
                json!({"tasks": 4, "local_first": true}),
                1800,
                3600,
                0,
                true,
            ),
        ),
        pattern_run(
            "cache",
            pattern(json!({"bought_cache_ms": 5000}), 1500, 1500, 300, true),
        ),
    ]);
    for (n, ms) in [(1u32, 900.0), (4, 400.0), (16, 700.0)] {
        let mut s = pattern(
            json!({"strategy": "segmented", "segments": n}),
            3000,
            3000,
            0,
            n != 16,
        );
        s.coupon.as_mut().unwrap().time_to_sell_out_ms = Some(ms);
        c.sale.push(pattern_run(&format!("seg {n}"), s));
    }
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("LocalFirst (redis, 4 tasks per process): 2.00 remote round trips per acquisition against 8.00 without it"),
        "{d}"
    );
    assert!(
        d.contains("Bought cache (redis, 5000 ms): 300 of 1800 clicks refused before the lock (17 % of the lock acquisitions"),
        "{d}"
    );
    assert!(
        d.contains("time to sell out by segment count 1: 900 ms, 4: 400 ms, 16: 700 ms; invariants (total stock never below 0, one order per user, conservation in each segment) BROKEN in at least one run."),
        "{d}"
    );
    // A broken pattern run is flagged, like any other broken sale, and
    // the table shows what each cost the lock server.
    let html = report::render(&c).unwrap();
    assert!(html.contains("seg 16: flash-sale invariants broken"));
    assert!(html.contains("1800 (2.00)"), "LocalFirst's acquisitions");
    assert!(html.contains("300 refused by the cache"));
}
