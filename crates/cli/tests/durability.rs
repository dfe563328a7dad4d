//! `lockbench run --durability`: the flag reaches the servers and
//! results.json says what they ran with.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;

fn latency_run(backend: &str, durability: Option<&str>) -> serde_json::Value {
    let t = tag(&format!("durability-{backend}-"));
    let dir = out_dir(&t);
    let mut args = vec![
        "run",
        "--backend",
        backend,
        "--workload",
        "latency",
        "--ops",
        "20",
        "--json",
        "--quiet",
        "--out",
        dir.path().to_str().unwrap(),
    ];
    if let Some(d) = durability {
        args.extend(["--durability", d]);
    }
    json_run(&args, &t);
    assert_nothing_left(&t);
    results_in(dir.path())
}

#[test]
fn redis_runs_durable_by_default_and_volatile_when_asked() {
    let r = latency_run("redis", None);
    let d = &r["durability"];
    assert_eq!(d["profile"], "durable", "{d}");
    assert_eq!(d["requested"], "durable", "{d}");
    let flags = d["servers"][0]["flags"].to_string();
    assert!(flags.contains(r#""--appendfsync","always""#), "{d}");
    assert_eq!(d["servers"][0]["kind"], "redis");
    let fs = d["filesystem"].as_str().unwrap();
    assert!(!fs.is_empty() && fs != "unknown", "{d}");

    let r = latency_run("redis", Some("volatile"));
    let d = &r["durability"];
    assert_eq!(d["profile"], "volatile", "{d}");
    assert_eq!(
        d["servers"][0]["flags"],
        serde_json::json!(["--save", "", "--appendonly", "no"]),
        "{d}"
    );
    assert_eq!(d["data_servers"], serde_json::json!([]), "{d}");
}

#[test]
fn a_volatile_ledger_keeps_its_data_on_a_durable_postgresql() {
    let t = tag("durability-ledger-");
    let dir = out_dir(&t);
    json_run(
        &[
            "run",
            "--backend",
            "pg-row",
            "--workload",
            "ledger",
            "--workers",
            "2",
            "--ops",
            "5",
            "--hold-ms",
            "1",
            "--durability",
            "volatile",
            "--json",
            "--quiet",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    let d = results_in(dir.path())["durability"].clone();
    assert_eq!(d["profile"], "volatile", "{d}");
    assert_eq!(d["servers"][0]["kind"], "postgresql", "{d}");
    assert_eq!(d["data_servers"][0]["kind"], "postgresql", "{d}");
    assert_eq!(d["data_servers"][0]["profile"], "durable", "{d}");
    assert_ne!(d["data_servers"][0]["node"], d["servers"][0]["node"], "{d}");
    assert_nothing_left(&t);
}

#[test]
fn help_explains_the_flag_and_a_bad_value_is_refused() {
    let out = lockbench(&["run", "--help"], "durability-help");
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--durability",
        "durable",
        "volatile",
        "--unsafe-no-fsync",
        "forceSync=no",
    ] {
        assert!(help.contains(want), "{want} not in:\n{help}");
    }
    let out = lockbench(
        &["run", "--backend", "redis", "--durability", "fsync"],
        "durability-bad",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("durable") && err.contains("volatile"), "{err}");
}
