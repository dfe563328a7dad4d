//! The seeds' "server down for 5 s" drill, for every correct backend: a
//! 4-process mutex run (200 ops each, 10 ms holds) against servers started
//! here; 2 s in, every server process of the lock is SIGSTOPped for 5 s,
//! then SIGCONTinued. Timeouts and unknown outcomes are expected; two
//! holders at once are not.
//!
//! `LOCKBENCH_DRILL_RUNS=N` repeats each drill N times (default 1).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_nothing_left, out_dir, tag, BIN};
use lockbench_registry::{self as registry, Servers};

const PAUSE_AFTER: Duration = Duration::from_secs(2);
const PAUSE_FOR: Duration = Duration::from_secs(5);

fn runs() -> usize {
    std::env::var("LOCKBENCH_DRILL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// One drill; returns the run's summary.
fn drill_once(backend: &str) -> serde_json::Value {
    let b = registry::find(backend).unwrap();
    let servers = Servers::start(b.topology()).unwrap();
    let endpoint = servers.endpoint().unwrap();
    let t = tag(&format!("drill-{backend}-"));
    let dir = out_dir(&t);
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--backend",
            backend,
            "--workload",
            "mutex",
            "--workers",
            "4",
            "--ops",
            "200",
            "--hold-ms",
            "10",
            "--endpoint",
            &endpoint,
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // "2 s in" counts from the run's first event, not from the spawn:
    // starting and connecting four workers can take longer than that on a
    // loaded machine, and a pause then failed their connects.
    let started = || {
        std::fs::read_dir(dir.path()).is_ok_and(|d| {
            d.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(".history-w")
                    && e.metadata().is_ok_and(|m| m.len() > 0)
            })
        })
    };
    let t0 = Instant::now();
    while !started() {
        assert!(
            t0.elapsed() < Duration::from_secs(60) && child.try_wait().unwrap().is_none(),
            "{backend}: the run never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(PAUSE_AFTER);
    let nodes = servers.nodes();
    for n in &nodes {
        n.pause().unwrap();
    }
    let paused_at = harness::history::monotonic_ns();
    std::thread::sleep(PAUSE_FOR);
    let resumed_at = harness::history::monotonic_ns();
    for n in &nodes {
        n.resume().unwrap();
    }
    // Bounded: a run that hangs after the pause is a failure, not a wait.
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            panic!("{backend}: the run did not finish within 180 s of the pause");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{backend}: lockbench run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The pause took: no acquire was granted while every server process
    // was stopped (a pause that missed PostgreSQL's backends let the run go
    // on at full speed, and the drill measured nothing).
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    let granted_in_pause: Vec<&str> = history
        .lines()
        .filter(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["op"] == "acquire"
                && e["outcome"] == "ok"
                && e["invoke_ns"].as_u64().unwrap() > paused_at
                && e["complete_ns"].as_u64().unwrap() < resumed_at
        })
        .collect();
    assert!(
        granted_in_pause.is_empty(),
        "{backend}: {} acquires were asked and granted while the servers were paused, e.g. {}",
        granted_in_pause.len(),
        granted_in_pause[0]
    );
    drop(servers);
    assert_nothing_left(&t);
    s
}

/// One drill at a time: each is timed against the wall clock, and seven
/// fleets paused at once on two cores would test the machine, not the locks.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn drill(backend: &str) {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for i in 0..runs() {
        let s = drill_once(backend);
        println!(
            "drill {backend} #{i}: ok {} failed {} info {} release_not_held {} violations {} (silent {}) max_overlap_ms {}",
            s["ops_ok"], s["ops_failed"], s["ops_info"], s["release_not_held"],
            s["violations"], s["silent_violations"], s["max_overlap_ms"]
        );
        assert_eq!(
            s["violations"], 0,
            "{backend}: two holders at once after the server pause (run {i}): {s}"
        );
        assert!(
            s["ops_ok"].as_u64().unwrap() > 0,
            "{backend}: no acquire succeeded: {s}"
        );
    }
}

#[test]
fn redis_survives_a_5s_server_pause() {
    drill("redis");
}

#[test]
fn redlock_survives_a_5s_pause_of_every_master() {
    drill("redlock");
}

#[test]
fn zookeeper_survives_a_5s_server_pause() {
    drill("zookeeper");
}

#[test]
fn etcd_survives_a_5s_server_pause() {
    drill("etcd");
}

#[test]
fn pg_advisory_survives_a_5s_server_pause() {
    drill("pg-advisory");
}

#[test]
fn pg_row_survives_a_5s_server_pause() {
    drill("pg-row");
}

#[test]
fn pg_optimistic_survives_a_5s_server_pause() {
    drill("pg-optimistic");
}

#[test]
fn redis_cluster_survives_a_5s_pause_of_every_node() {
    drill("redis-cluster");
}

#[test]
fn redis_wait_behind_sentinel_survives_a_5s_pause_of_primary_and_replica() {
    drill("redis-wait");
}
