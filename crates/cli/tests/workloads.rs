//! The ledger, throughput and coupon workloads end to end: real servers
//! from the fleet, worker OS processes, and the checkers' verdicts read
//! back from PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::run_workload;

/// Every correct backend that has landed.
const CORRECT: &[&str] = &[
    "redis",
    "redlock",
    "zookeeper",
    "etcd",
    "pg-advisory",
    "pg-row",
    "pg-optimistic",
];

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn ledger_loses_nothing_with_correct_locks() {
    for backend in CORRECT {
        let (s, _) = run_workload(
            backend,
            "ledger",
            &["--workers", "4", "--ops", "50", "--hold-ms", "5"],
        );
        let l = &s["ledger"];
        assert_eq!(s["ops_ok"], 200, "{backend}: {s}");
        assert_eq!(s["violations"], 0, "{backend}: {s}");
        // Every critical section was acknowledged and none was lost.
        assert_eq!(l["acknowledged"], 200, "{backend}: {l}");
        assert_eq!(l["counter_final"], 200, "{backend}: {l}");
        assert_eq!(l["lost_updates"], 0, "{backend}: {l}");
        assert_eq!(l["stale_writes_unfenced"], 0, "{backend}: {l}");
        assert_eq!(l["stale_writes_accepted"], 0, "{backend}: {l}");
        let fenceable = *backend != "redlock";
        assert_eq!(l["fenceable"], fenceable, "{backend}: {l}");
        let verdict = if fenceable { "ok" } else { "unfenceable" };
        assert_eq!(l["verdict"], verdict, "{backend}: {l}");
        if fenceable {
            assert_eq!(l["accepted"], 200, "{backend}: {l}");
        }
    }
}

/// The seeds' broken locks must be caught by the same checkers, with
/// enough contention (4 processes x 100 on one key) to be reliable.
#[test]
fn ledger_flags_the_broken_locks() {
    let (s, _) = run_workload(
        "redis-short-lease",
        "ledger",
        &["--workers", "4", "--ops", "100", "--hold-ms", "10"],
    );
    let l = &s["ledger"];
    assert!(u(&s["violations"]) > 0, "{s}");
    assert!(u(&l["lost_updates"]) > 0, "{l}");
    assert_eq!(l["verdict"], "lost updates");
    // Nothing is asserted of the fenced ledger here. Its tokens are real,
    // but with a 5 ms lease and a 10 ms hold the expired holder usually
    // writes before its successor does (A: 0-10 ms, B: 5-15 ms), and so in
    // token order: CI has seen 0 refused in 354 overlaps, and 7 refused in
    // another run. Only what a broken lock certainly shows is asserted:
    // the overlaps and the lost updates on the unfenced counter.

    // GET-then-DEL: the lease (= the hold) runs out around the GET, and
    // the DEL then removes the next holder's lock.
    let (s, _) = run_workload(
        "redis-get-del",
        "ledger",
        &[
            "--workers",
            "4",
            "--ops",
            "100",
            "--hold-ms",
            "10",
            "--lease-ms",
            "10",
        ],
    );
    let l = &s["ledger"];
    assert!(
        u(&s["violations"]) + u(&l["lost_updates"]) > 0,
        "get-del not flagged: {s}"
    );
    assert_eq!(l["fenceable"], false, "{l}");
}

#[test]
fn throughput_reports_contended_and_disjoint_keys() {
    let (s, results) = run_workload(
        "redis",
        "throughput",
        &["--workers", "4", "--keys", "1", "--duration", "1.5"],
    );
    assert_eq!(s["violations"], 0, "{s}");
    assert!(u(&s["ops_ok"]) > 0, "{s}");
    assert!(s["throughput_per_s"].as_f64().unwrap() > 0.0);
    // One key, four workers: releases hand the lock to a waiter.
    let h = &s["handover"];
    assert!(u(&h["count"]) > 0, "no handover measured: {s}");
    assert!(h["p50_us"].as_f64().unwrap() > 0.0);
    assert!(s["wall_s"].as_f64().unwrap() >= 1.5, "{s}");
    // results.json: versions, seed, topology, the plan and full percentiles.
    assert_eq!(results["tool"], "lockbench");
    assert!(results["version"].is_string());
    assert!(results["server_version"]
        .as_str()
        .unwrap()
        .starts_with("redis "));
    assert_eq!(results["seed"], 1);
    assert!(results["topology"].as_str().unwrap().contains("fleet"));
    assert_eq!(results["plan"]["keys"], 1);
    for p in ["p50_us", "p90_us", "p99_us", "p999_us", "max_us"] {
        assert!(
            results["summary"]["acquire"][p].as_f64().unwrap() > 0.0,
            "{p}"
        );
    }

    // One key per worker: nobody waits, so there is no handover at all.
    let (s, _) = run_workload(
        "redis",
        "throughput",
        &["--workers", "4", "--keys", "4", "--duration", "1"],
    );
    assert_eq!(s["violations"], 0, "{s}");
    assert!(s["handover"].is_null(), "{s}");
    assert_eq!(s["acquire_round_trips_mean"], 1.0, "{s}");
}

const SMALL_SALE: &[&str] = &[
    "--workers",
    "4",
    "--stock",
    "40",
    "--users",
    "80",
    "--clicks",
    "3",
];

fn sale(backend: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = SMALL_SALE.to_vec();
    args.extend_from_slice(extra);
    let (s, _) = run_workload(backend, "coupon", &args);
    s["coupon"].clone()
}

fn assert_sold_out_correctly(c: &serde_json::Value, what: &str) {
    let k = &c["check"];
    assert_eq!(c["valid"], true, "{what}: {c}");
    assert_eq!(c["clicks"], 240, "{what}: {c}");
    assert_eq!(c["errors"], 0, "{what}: {c}");
    assert_eq!(k["orders"], 40, "{what}: {c}");
    assert_eq!(k["remaining_stock"], 0, "{what}: {c}");
    assert_eq!(k["min_stock"], 0, "{what}: {c}");
    assert_eq!(k["users_with_two_orders"], 0, "{what}: {c}");
    assert_eq!(c["ordered"], 40, "{what}: {c}");
    assert_eq!(
        u(&c["ordered"]) + u(&c["rejected_duplicate"]) + u(&c["rejected_sold_out"]),
        240,
        "{what}: {c}"
    );
    assert!(c["time_to_sell_out_ms"].as_f64().unwrap() > 0.0, "{c}");
}

#[test]
fn coupon_invariants_hold_for_correct_locks_and_both_baselines() {
    for backend in CORRECT {
        let c = sale(backend, &["--lock-scope", "user+voucher"]);
        assert_sold_out_correctly(&c, backend);
    }
    let c = sale("redis", &["--lock-scope", "voucher"]);
    assert_sold_out_correctly(&c, "redis, voucher scope");
    let c = sale("redis", &["--strategy", "sql-atomic"]);
    assert_sold_out_correctly(&c, "sql-atomic");
    let c = sale("redis", &["--strategy", "redis-prededuct"]);
    assert_sold_out_correctly(&c, "redis-prededuct");
    assert_eq!(c["orders_lost"], 0, "{c}");
    assert_eq!(c["consumer"]["written"], 40, "{c}");
}

/// The seed's bug: the lock is correct (no overlap), but it is released
/// before COMMIT, so a user's second click does not see the first order;
/// without the unique index the duplicate lands.
#[test]
fn coupon_unlock_before_commit_is_caught() {
    let mut args = SMALL_SALE.to_vec();
    args.extend_from_slice(&[
        "--ordering",
        "unlock-then-commit",
        "--commit-delay-ms",
        "30",
        "--no-unique-index",
    ]);
    let (s, _) = run_workload("redis", "coupon", &args);
    let c = &s["coupon"];
    assert_eq!(s["violations"], 0, "the lock itself is fine: {s}");
    assert_eq!(c["valid"], false, "{c}");
    assert!(u(&c["check"]["users_with_two_orders"]) > 0, "{c}");
    assert_eq!(c["check"]["one_order_per_user"], false, "{c}");
}

/// The seeds' production patterns keep every invariant on Redis and on a
/// consensus backend: stock in segments (each its own lock, checked per
/// segment), click tasks sharing a process with and without LocalFirst,
/// and the bought cache in front of the lock.
#[test]
fn coupon_patterns_keep_the_invariants() {
    for backend in ["redis", "etcd"] {
        let c = sale(backend, &["--strategy", "segmented", "--segments", "4"]);
        assert_sold_out_correctly(&c, &format!("{backend}: segmented"));
        assert_eq!(c["check"]["segments"], 4, "{c}");
        assert_eq!(c["check"]["unbalanced_segments"], 0, "{c}");
        // Once a segment is empty its clicks fall over to the next.
        assert!(u(&c["lock_acquires"]) > 240, "{c}");

        let tasks = ["--tasks", "3", "--lock-scope", "voucher"];
        let plain = sale(backend, &tasks);
        assert_sold_out_correctly(&plain, &format!("{backend}: 3 tasks"));
        let mut lf = tasks.to_vec();
        lf.push("--local-first");
        let mut args = SMALL_SALE.to_vec();
        args.extend_from_slice(&lf);
        let (s, _) = run_workload(backend, "coupon", &args);
        assert_eq!(s["violations"], 0, "{s}");
        let local = &s["coupon"];
        assert_sold_out_correctly(local, &format!("{backend}: LocalFirst"));
        assert_eq!(local["plan"]["local_first"], true);
        // Every task's acquisition is in the history, on its own lane.
        assert_eq!(u(&local["lock_acquires"]), 240, "{local}");
        let per = |k: &serde_json::Value| {
            u(&k["lock_round_trips"]) as f64 / u(&k["lock_acquires"]) as f64
        };
        println!(
            "{backend}: 4 processes x 3 tasks, voucher lock: {:.2} round trips per acquisition, {:.2} with LocalFirst",
            per(&plain),
            per(local)
        );
        if backend == "redis" {
            // Redis waiters poll: 12 remote contenders cost more tries
            // than 4.
            assert!(per(local) < per(&plain), "{local} vs {plain}");
        }
    }
    // The bought cache: 2 processes, so a user's clicks meet in one.
    let args = [
        "--workers",
        "2",
        "--stock",
        "40",
        "--users",
        "80",
        "--clicks",
        "3",
    ];
    let mut with = args.to_vec();
    with.extend_from_slice(&["--bought-cache-ms", "5000"]);
    let (s, _) = run_workload("redis", "coupon", &with);
    let c = &s["coupon"];
    assert_eq!(c["valid"], true, "{c}");
    assert_eq!(c["check"]["orders"], 40, "{c}");
    assert!(u(&c["bought_cache_hits"]) > 0, "{c}");
    assert_eq!(
        u(&c["lock_acquires"]) + u(&c["bought_cache_hits"]),
        240,
        "each click took the lock or was refused by the cache: {c}"
    );
}

/// The segmented checker can fail: the seed's unlock-before-commit bug,
/// per segment and without the unique index, lets a user's second click
/// order again.
#[test]
fn segmented_unlock_before_commit_is_caught() {
    let mut args = SMALL_SALE.to_vec();
    args.extend_from_slice(&[
        "--strategy",
        "segmented",
        "--segments",
        "4",
        "--ordering",
        "unlock-then-commit",
        "--commit-delay-ms",
        "30",
        "--no-unique-index",
    ]);
    let (s, _) = run_workload("redis", "coupon", &args);
    let c = &s["coupon"];
    assert_eq!(c["valid"], false, "{c}");
    assert!(u(&c["check"]["users_with_two_orders"]) > 0, "{c}");
}

/// The flash sale on a bad day. A holder fault never landed on it (the
/// sale's lock never said it held: "skipped: no worker held the lock",
/// and the run read HOLD); a killed worker's acknowledged orders died with
/// its counters and the sale read "orders lost -156 -> BROKEN"; and the
/// pre-deduct design's clicks all failed for good after a 0.2 s Redis
/// restart, its consumer gave up, and the run ended with nothing written.
#[test]
fn the_flash_sale_through_a_holder_kill_and_a_redis_restart() {
    let big = [
        "--stock",
        "400",
        "--users",
        "1200",
        "--clicks",
        "2",
        "--workers",
        "4",
    ];
    let mut a = big.to_vec();
    a.extend_from_slice(&[
        "--lease-ms",
        "300",
        "--fault",
        "holder-kill",
        "--fault-at",
        "0.5",
    ]);
    let (s, r) = run_workload("redis", "coupon", &a);
    let f = &r["faults"][0];
    assert!(f["skipped"].is_null(), "{f}");
    assert_eq!(s["worker_deaths"].as_array().unwrap().len(), 1, "{s}");
    let c = &s["coupon"];
    assert_eq!(c["valid"], true, "{c}");
    assert_eq!(c["acknowledged_incomplete"], true, "{c}");
    assert_eq!(c["check"]["orders"], 400, "{c}");
    let a = [
        "--stock",
        "400",
        "--users",
        "20000",
        "--clicks",
        "2",
        "--workers",
        "4",
        "--strategy",
        "redis-prededuct",
        "--fault",
        "node-kill",
        "--fault-at",
        "0.3",
        "--fault-duration",
        "0.2",
    ];
    let (s, r) = run_workload("redis", "coupon", &a);
    assert!(r["faults"][0]["skipped"].is_null(), "{}", r["faults"][0]);
    let c = &s["coupon"];
    assert_eq!(c["check"]["orders"], 400, "sold out after the restart: {c}");
    assert_eq!(c["check"]["oversold"], 0, "{c}");
    assert!(c["orders_lost"].as_i64().unwrap() <= 0, "{c}");
}
