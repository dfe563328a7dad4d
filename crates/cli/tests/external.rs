//! `lockbench compare --config FILE` against servers lockbench did not
//! start (here: a Redis and a PostgreSQL the test starts, standing in for a
//! compose fleet or a real cluster): every workload runs against them, and
//! the faults that need their processes are skipped with the reason, not
//! faked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::{assert_nothing_left, lockbench, out_dir, own_servers, tag};

#[test]
fn compare_against_your_own_servers_skips_only_what_needs_their_processes() {
    let own = own_servers(None);
    let config = &own.config;
    let t = tag("external-");
    let dir = out_dir(&t);
    let out = lockbench(
        &[
            "compare",
            "--backends",
            "redis",
            "--config",
            config.path().to_str().unwrap(),
            "--repeats",
            "1",
            "--throughput-secs",
            "1",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "compare failed: {err}");
    assert!(err.contains("durability lockbench cannot set"), "{err}");
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("comparison.json")).unwrap())
            .unwrap();
    let row = &c["rows"][0];
    assert_eq!(row["backend"], "redis");
    assert_eq!(row["ledger"]["violations"], 0, "{}", row["ledger"]);
    assert!(row["ledger"]["ops_ok"].as_u64().unwrap() > 0);
    // The performance runs used the given server, once.
    let profiles = c["measured"]["profiles"].as_array().unwrap();
    let ran: Vec<(&str, bool)> = profiles
        .iter()
        .map(|p| {
            (
                p["durability"].as_str().unwrap(),
                p["ran"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(ran, [("durable", true), ("volatile", false)], "{ran:?}");
    let cells = c["faults"].as_array().unwrap();
    let cell = |f: &str| {
        cells
            .iter()
            .find(|x| x["fault"] == f)
            .unwrap_or_else(|| panic!("no {f} cell in {cells:?}"))
    };
    // Faults on the servers' processes: skipped, with the reason.
    for f in ["node-pause", "failover"] {
        let why = cell(f)["records"][0]["skipped"]
            .as_str()
            .unwrap_or_default();
        assert!(
            why.contains("your own server") && why.contains("out of scope"),
            "{f}: {why}"
        );
    }
    // Faults on lockbench's own workers still run against them.
    for f in ["holder-kill", "holder-pause"] {
        let x = cell(f);
        assert!(x["records"][0]["skipped"].is_null(), "{f}: {x}");
        assert!(x["summary"]["ops_ok"].as_u64().unwrap() > 0, "{f}: {x}");
    }
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.contains("skipped: "), "the page shows why");
    // The servers are still the test's own: nothing of the run's is left.
    assert_nothing_left(&t);
}

/// A Redis of your own and no PostgreSQL named anywhere: the ledger's data
/// goes to a PostgreSQL started for the run (it went to the default
/// 127.0.0.1:5432, and failed after 5 s, or wrote there unasked if one
/// listened), and that server is stopped with the run.
#[test]
fn your_own_lock_server_without_a_data_database_gets_one_started() {
    let redis = fleet::RedisFleet::single().unwrap();
    let t = tag("external-nopg-");
    let dir = out_dir(&t);
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--endpoint",
            &redis.nodes[0].url(),
            "--workload",
            "ledger",
            "--workers",
            "2",
            "--ops",
            "5",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the ledger failed: {err}");
    let r = common::results_in(dir.path());
    let url = r["plan"]["data_pg_url"].as_str().unwrap_or_default();
    assert!(
        !url.contains(":5432/"),
        "the default data URL was used: {url}"
    );
    let ledger = &r["summary"]["ledger"];
    assert_eq!(ledger["lost_updates"], 0, "{ledger}");
    assert_nothing_left(&t);
}
