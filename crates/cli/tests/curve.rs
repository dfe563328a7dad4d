//! `lockbench run --workload throughput --workers 1,2`: one run per count
//! against a real Redis from the fleet, then the curve on stdout and in
//! curve.json; a list where it means nothing is refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;

#[test]
fn a_list_of_worker_counts_runs_a_curve() {
    let t = tag("curve-");
    let dir = out_dir(&t);
    let out = dir.path().to_str().unwrap();
    let c = json_run(
        &[
            "run",
            "--backend",
            "redis",
            "--workload",
            "throughput",
            "--workers",
            "1,2",
            "--duration",
            "1",
            "--quiet",
            "--json",
            "--out",
            out,
        ],
        &t,
    );
    assert_eq!(c["backend"], "redis");
    let points = c["points"].as_array().unwrap();
    let workers: Vec<u64> = points
        .iter()
        .map(|p| p["workers"].as_u64().unwrap())
        .collect();
    assert_eq!(workers, vec![1, 2], "{c}");
    for p in points {
        assert!(p["error"].is_null(), "{p}");
        assert!(p["cycles_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert_eq!(p["violations"], 0, "{p}");
        assert!(p["round_trips_per_acquire"].as_f64().unwrap() >= 1.0, "{p}");
        // Where the rate went: the servers this run started and its
        // workers both did work for every cycle.
        assert!(p["servers_cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["workers_cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{p}");
        // Each count is a whole run with its own results.
        let n = p["workers"].as_u64().unwrap();
        let results: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(format!("workers-{n}/results.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(results["summary"]["workers"], n, "{results}");
        assert!(dir
            .path()
            .join(format!("workers-{n}/history.jsonl"))
            .is_file());
    }
    // One worker spreads over itself; two on one key both got the lock
    // (Redis is not fair, but in a second each gets some).
    assert_eq!(points[0]["spread"], 1.0, "{c}");
    assert!(points[0]["longest_wait"].is_null(), "{c}");
    assert!(points[1]["spread"].as_f64().unwrap() >= 1.0, "{c}");
    let ratio = points[1]["of_previous"].as_f64().unwrap();
    let expect =
        points[1]["cycles_per_s"].as_f64().unwrap() / points[0]["cycles_per_s"].as_f64().unwrap();
    assert!((ratio - expect).abs() < 1e-9, "{c}");
    // The file holds what stdout printed.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("curve.json")).unwrap()).unwrap();
    assert_eq!(file, c);
    assert_nothing_left(&t);
}

#[test]
fn a_curve_with_a_broken_point_exits_3() {
    // The negative control: a fixed lease half the hold, no renewal.
    // Alone it cannot overlap; two workers do. `json_run` holds the exit
    // code to 3 exactly when `broken` reads a point with violations.
    let t = tag("curve-broken-");
    let dir = out_dir(&t);
    let c = json_run(
        &[
            "run",
            "--backend",
            "redis-short-lease",
            "--workload",
            "throughput",
            "--workers",
            "1,2",
            "--duration",
            "1",
            "--hold-ms",
            "20",
            "--quiet",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    let points = c["points"].as_array().unwrap();
    assert_eq!(points[0]["violations"], 0, "{c}");
    assert!(points[1]["violations"].as_u64().unwrap() > 0, "{c}");
    assert!(broken(&c), "{c}");
}

#[test]
fn a_list_outside_the_throughput_workload_is_refused_naming_the_flag() {
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--workload",
            "mutex",
            "--workers",
            "1,4",
        ],
        &tag("curve-refused-"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--workers 1,4") && err.contains("the throughput workload only"),
        "{err}"
    );
    let help = lockbench(&["run", "--help"], "curve-help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--workers 1,4,16") && help.contains("curve.json"),
        "{help}"
    );
}

/// Servers the run did not start are not the run's to read: against
/// `--endpoint`, only the workers' CPU is reported.
#[test]
fn cpu_of_servers_a_run_did_not_start_is_not_claimed() {
    let t = tag("curve-external-");
    let redis = fleet::RedisFleet::single().unwrap();
    let dir = out_dir(&t);
    let url = redis.nodes[0].url();
    let s = json_run(
        &[
            "run",
            "--backend",
            "redis",
            "--endpoint",
            &url,
            "--workload",
            "throughput",
            "--workers",
            "2",
            "--duration",
            "1",
            "--quiet",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    let cpu = &s["cpu"];
    assert!(cpu["servers_ms"].is_null(), "{cpu}");
    assert!(cpu["servers_us_per_cycle"].is_null(), "{cpu}");
    assert!(cpu["workers_us_per_cycle"].as_f64().unwrap() > 0.0, "{cpu}");
}
