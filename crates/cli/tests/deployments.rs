//! `lockbench run` on Redis as teams deploy it: behind Sentinel and on a
//! Redis Cluster, each started by the run itself.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::{lockbench, out_dir, run_workload, tag};

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The bar: the 4-process mutex workload, 0 violations, on both
/// deployments, every acquire succeeding.
#[test]
fn redis_behind_sentinel_and_on_a_cluster_keep_mutual_exclusion() {
    for (topology, shows) in [("sentinel", "3 sentinels"), ("cluster", "redis cluster")] {
        let (s, results) = run_workload(
            "redis",
            "mutex",
            &["--topology", topology, "--workers", "4", "--ops", "25"],
        );
        assert_eq!(s["violations"], 0, "{topology}: {s}");
        assert_eq!(u(&s["ops_ok"]), 100, "{topology}: {s}");
        let t = results["topology"].as_str().unwrap();
        assert!(t.contains(shows), "{topology}: {t}");
        assert!(
            results["server_version"]
                .as_str()
                .unwrap()
                .contains(topology),
            "{results}"
        );
    }
}

/// The comparison's `redis-cluster` row: its latency next to its floor,
/// a PING to the master of the key's slot.
#[test]
fn redis_cluster_latency_has_its_floor() {
    let (s, _) = run_workload("redis-cluster", "latency", &["--ops", "300"]);
    assert_eq!(u(&s["ops_ok"]), 300, "{s}");
    assert!(s["floor_p50_us"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["floor_ratio"].as_f64().unwrap() > 0.0, "{s}");
}

/// Today's single-node client pointed at a cluster node that owns no slot
/// (a replica): every acquire is refused, and the run exits non-zero with
/// the server's reason instead of a silent column of failures.
#[test]
fn a_single_node_lock_on_a_cluster_fails_with_the_servers_reason() {
    let servers = lockbench_registry::Servers::start(lockbench_registry::Topology::RedisCluster {
        masters: 3,
        replicas: 1,
    })
    .unwrap();
    let lockbench_registry::Servers::RedisCluster(f) = &servers else {
        panic!("not a cluster: {servers:?}")
    };
    let t = tag("on-cluster");
    let dir = out_dir(&t);
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--workers",
            "2",
            "--ops",
            "3",
            "--wait-ms",
            "200",
            "--endpoint",
            &f.replicas[0].url(),
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert!(
        !out.status.success(),
        "exited 0 though nothing was acquired"
    );
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("no acquire succeeded") && err.contains("moved"),
        "{err}"
    );
}

/// Bad deployments are named within seconds, before any worker starts.
#[test]
fn bad_sentinel_and_cluster_endpoints_are_named() {
    for (endpoint, names) in [
        (
            "redis+sentinel://127.0.0.1:1,127.0.0.1:2/lockbench",
            "127.0.0.1:2",
        ),
        ("redis+sentinel://127.0.0.1:1", "master name"),
        ("redis+cluster://127.0.0.1:1", "127.0.0.1:1"),
    ] {
        let t = tag("bad-deployment");
        let dir = out_dir(&t);
        let t0 = std::time::Instant::now();
        let out = lockbench(
            &[
                "run",
                "--backend",
                "redis",
                "--ops",
                "1",
                "--endpoint",
                endpoint,
                "--out",
                dir.path().to_str().unwrap(),
            ],
            &t,
        );
        assert!(!out.status.success(), "{endpoint}: exited 0");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(names), "{endpoint}: {err}");
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{endpoint}: {:?}",
            t0.elapsed()
        );
    }
}
