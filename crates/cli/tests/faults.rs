//! `lockbench run --fault`: the nemesis on real servers and real worker
//! processes, each fault undone, recorded in results.json and measured.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::{
    assert_nothing_left, json_run, never_freed, out_dir, results_in, tag, tagged_processes,
};

/// Runs a 4-worker mutex run of `backend` with `fault` and extra flags;
/// returns its results.json.
fn faulted(backend: &str, fault: &str, extra: &[&str]) -> serde_json::Value {
    faulted_with_history(backend, fault, extra).0
}

/// [`faulted`], also returning the history's events.
fn faulted_with_history(
    backend: &str,
    fault: &str,
    extra: &[&str],
) -> (serde_json::Value, Vec<serde_json::Value>) {
    let t = tag(&format!("fault-{fault}-"));
    let dir = out_dir(&t);
    let mut args = vec![
        "run",
        "--backend",
        backend,
        "--workload",
        "mutex",
        "--workers",
        "4",
        "--ops",
        "120",
        "--hold-ms",
        "10",
        "--fault",
        fault,
        "--fault-at",
        "1",
        "--json",
        "--out",
    ];
    args.push(dir.path().to_str().unwrap());
    args.extend_from_slice(extra);
    json_run(&args, &t);
    assert_nothing_left(&t);
    let results = results_in(dir.path());
    let history = std::fs::read_to_string(dir.path().join("history.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (results, history)
}

#[test]
fn holder_kill_hands_the_lock_over_when_the_lease_ends() {
    // Volatile servers: the bound is about expiry, and the next holder's
    // acquire waiting on one stalled fsync of a loaded machine is not.
    let r = faulted(
        "redis",
        "holder-kill",
        &["--lease-ms", "1000", "--durability", "volatile"],
    );
    let f = &r["faults"][0];
    assert!(f["skipped"].is_null(), "{f}");
    assert!(f["target"].as_str().unwrap().starts_with("worker "), "{f}");
    let recovery = f["recovery_ms"].as_f64().unwrap();
    // The killed holder's lease (1 s, counted from its acquire, a little
    // before the kill) runs out, then the next waiter holds at once: within
    // the lease + 10 %. (Not before: that would be a violation,
    // as the dead holder's hold lasts until its death.)
    assert!(
        recovery <= 1100.0,
        "another worker held {recovery} ms after the kill (lease 1000 ms)"
    );
    let s = &r["summary"];
    assert_eq!(s["worker_deaths"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(s["violations"], 0, "{s}");
}

#[test]
fn a_paused_holder_goes_on_believing_it_holds_and_is_told() {
    // Kleppmann's pause: the holder is stopped for 5 x its 300 ms lease
    // (at 2 x, one slow acquire of the next holder on a loaded machine let
    // the paused one wake and release first: no overlap to see).
    let r = faulted(
        "redis",
        "holder-pause",
        &["--lease-ms", "300", "--fault-duration", "1.5"],
    );
    let f = &r["faults"][0];
    assert!(f["healed_ns"].as_u64().unwrap() > f["started_ns"].as_u64().unwrap());
    let s = &r["summary"];
    assert!(
        s["violations"].as_u64().unwrap() > 0,
        "a 1.5 s pause of a 300 ms holder gave no overlap: {s}"
    );
    // The lock did tell it: lost() had fired (its lease ran out).
    assert_eq!(s["silent_violations"], 0, "{s}");
    // When: the paused holder hears of it on waking, about the pause
    // minus the lease after another worker took the key (the fault
    // record's lock-lost detection delay).
    assert_eq!(f["told_lost"], true, "{f}");
    let delay = f["lost_detection_ms"].as_f64().unwrap();
    assert!((0.0..2000.0).contains(&delay), "{f}");
}

#[test]
fn node_pause_gives_no_double_holder_and_is_undone() {
    let r = faulted("redis", "node-pause", &["--fault-duration", "2"]);
    let f = &r["faults"][0];
    let (a, b) = (
        f["started_ns"].as_u64().unwrap(),
        f["healed_ns"].as_u64().unwrap(),
    );
    assert!(b - a >= 2_000_000_000, "{f}");
    assert!(f["recovery_ms"].as_f64().is_some(), "{f}");
    assert_eq!(r["summary"]["violations"], 0, "{}", r["summary"]);
}

#[test]
fn a_server_fault_needs_servers_lockbench_owns() {
    let t = tag("fault-endpoint");
    let out = common::lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--endpoint",
            "redis://127.0.0.1:1",
            "--fault",
            "node-pause",
        ],
        &t,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--fault") && err.contains("endpoint"), "{err}");
}

/// A minority of a 3-member etcd cluster paused: the majority keeps
/// locking, and nobody holds twice.
#[test]
fn etcd_cluster_minority_pause_keeps_locking_safely() {
    let r = faulted(
        "etcd",
        "node-pause",
        &[
            "--topology",
            "cluster",
            "--fault-target",
            "minority",
            "--fault-duration",
            "3",
        ],
    );
    let f = &r["faults"][0];
    // One member of three.
    assert_eq!(
        f["target"].as_str().unwrap().matches("etcd").count(),
        1,
        "{f}"
    );
    assert!(
        r["topology"].as_str().unwrap().contains("etcd x3"),
        "{}",
        r["topology"]
    );
    let s = &r["summary"];
    assert_eq!(s["violations"], 0, "{s}");
    assert!(s["ops_ok"].as_u64().unwrap() > 0, "{s}");
}

/// The seeds' Redis failover drill, with the replica lagging behind a lock
/// taken on the primary alone: long holds (7 s, fixed 8 s lease) so the
/// holder is still inside when the promoted replica, which never saw its
/// lock, hands the key to another worker.
fn failover_drill(backend: &str, topology: &str) -> serde_json::Value {
    let t = tag(&format!("failover-{backend}-{topology}-"));
    let dir = out_dir(&t);
    let args = [
        "run",
        "--backend",
        backend,
        "--topology",
        topology,
        "--workload",
        "mutex",
        "--workers",
        "2",
        "--duration",
        "18",
        "--hold-ms",
        "7000",
        "--lease-ms",
        "8000",
        "--fault",
        "failover",
        "--fault-at",
        "1",
        "--fault-duration",
        "1",
        "--json",
        "--out",
        dir.path().to_str().unwrap(),
    ];
    json_run(&args, &t);
    assert_nothing_left(&t);
    results_in(dir.path())
}

#[test]
fn failover_loses_the_lock_for_redis_and_not_for_redis_wait() {
    for (backend, topology) in [("redis", "sentinel"), ("redis", "cluster")] {
        let r = failover_drill(backend, topology);
        let f = &r["faults"][0];
        assert!(f["skipped"].is_null(), "{f}");
        assert!(
            f["note"].as_str().unwrap().contains("killed primary only"),
            "{f}"
        );
        let s = &r["summary"];
        assert!(
            s["violations"].as_u64().unwrap() >= 1,
            "{backend} on {topology}: the promoted replica lacked the lock, yet no double holder: {s}"
        );
        // A fixed 8 s lease, released after 7 s: the holder on the dead
        // primary is never told.
        assert_eq!(f["told_lost"], false, "{f}");
    }
    // WAIT refuses every acquire while the replica lags: the promoted
    // replica has every lock that was granted.
    let r = failover_drill("redis-wait", "sentinel");
    let f = &r["faults"][0];
    assert!(f["skipped"].is_null(), "{f}");
    assert!(
        f["note"].as_str().unwrap().contains("no worker took"),
        "{f}"
    );
    assert_eq!(r["summary"]["violations"], 0, "{}", r["summary"]);
}

/// `--fault-repeat`: each repetition on the seeded schedule, recorded in
/// turn; three holders killed, three deaths, no double holder.
#[test]
fn repeated_faults_are_each_recorded() {
    let r = faulted(
        "redis",
        "holder-kill",
        &["--lease-ms", "500", "--fault-repeat", "3"],
    );
    let faults = r["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 3, "{faults:?}");
    let mut last = 0;
    for (i, f) in faults.iter().enumerate() {
        assert!(f["skipped"].is_null(), "{f}");
        assert_eq!(f["repetition"], i, "{f}");
        let at = f["started_ns"].as_u64().unwrap();
        assert!(at > last, "{faults:?}");
        last = at;
    }
    let s = &r["summary"];
    assert_eq!(s["worker_deaths"].as_array().unwrap().len(), 3, "{s}");
    assert_eq!(s["violations"], 0, "{s}");
}

/// `acquire-crash` on the seeds' SETNX-then-PEXPIRE lock: worker 0 exits
/// at the armed point between the two calls; the key never expires, every
/// other worker starves: a liveness failure, "lock never freed".
#[test]
fn acquire_crash_leaves_the_setnx_lock_immortal() {
    let t = tag("acquire-crash-");
    let dir = out_dir(&t);
    json_run(
        &[
            "run",
            "--backend",
            "redis-setnx-expire",
            "--workers",
            "3",
            // A duration, not a count: the others must still be trying
            // after the crash, however fast they ran before it.
            "--duration",
            "3",
            "--wait-ms",
            "200",
            "--lease-ms",
            "1000",
            "--fault",
            "acquire-crash",
            "--fault-at",
            "0.5",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert_nothing_left(&t);
    let r: serde_json::Value = results_in(dir.path());
    let f = &r["faults"][0];
    assert_eq!(
        f["target"], "worker 0 at after SETNX, before PEXPIRE",
        "{f}"
    );
    assert!(f["recovery_ms"].is_null(), "the lock was freed: {f}");
    assert!(f["note"].as_str().unwrap().contains("never freed"), "{f}");
    assert!(f["fail_during"].as_u64().unwrap() > 0, "{f}");
    assert_eq!(r["summary"]["worker_deaths"].as_array().unwrap().len(), 1);
    // ... and `json_run` held the exit code to 3 for it.
    assert!(never_freed(dir.path()));
}

/// A one-step acquire has no point to crash between: said, not faked.
#[test]
fn acquire_crash_is_refused_where_the_acquire_is_one_step() {
    let t = tag("acquire-crash-refused-");
    let dir = out_dir(&t);
    let out = common::lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--fault",
            "acquire-crash",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("one step") && err.contains("holder-kill"),
        "{err}"
    );
}

/// `holder-pause` on the GET-then-DEL unlock stalls worker 0 at the armed
/// point between its GET and its DEL for 2 x the lease: the DEL then
/// removes the next holder's lock, and a third worker joins it inside.
///
/// The scenario needs other workers still at work when worker 0 pauses.
/// This lock barges (a releasing worker takes the key again at once while
/// the others poll), so a worker often runs all its operations in a row,
/// and when worker 0 happens to be served last nobody is left to take the
/// expired lock (seen in about 1 run in 6), or the last of them is alone
/// by the time the DEL comes: such a run shows nothing either way and is
/// run again, up to 6 times. A run where another worker held when the DEL
/// came and someone got in behind it must show the violation.
#[test]
fn a_pause_between_get_and_del_deletes_the_next_holders_lock() {
    for attempt in 1..=6 {
        let t = tag("get-del-pause-");
        let dir = out_dir(&t);
        // Waiters poll every few ms (this lock's release announces
        // nothing), so the next holder is not missed by a slow poll.
        let cfg = dir.path().join("lockbench.toml");
        std::fs::write(&cfg, "[redis]\nmax_retry_interval_ms = 5\n").unwrap();
        json_run(
            &[
                "run",
                "--backend",
                "redis-get-del",
                "--workers",
                "4",
                "--ops",
                "6",
                // The DEL comes (hold + 2 s) after worker 0's acquire, its
                // lock expired 1 s after it, and turns since last one hold
                // each: the DEL lands 1 s mod hold into a turn. With 500
                // that is a turn's very end; with 400, 200 ms before it.
                "--hold-ms",
                "400",
                "--lease-ms",
                "1000",
                "--fault",
                "holder-pause",
                "--fault-at",
                "0.5",
                "--config",
                cfg.to_str().unwrap(),
                "--json",
                "--out",
                dir.path().to_str().unwrap(),
            ],
            &t,
        );
        assert_nothing_left(&t);
        let r: serde_json::Value = results_in(dir.path());
        let fault = &r["faults"][0];
        assert_eq!(fault["target"], "worker 0 at between GET and DEL");
        // Paused inside its own release, the worker had not "let go before
        // the signal": the report must judge the run, not set it aside.
        assert!(fault["note"].is_null(), "{fault}");
        let to = fault["healed_ns"].as_u64().unwrap();
        let s = &r["summary"];
        if s["violations"].as_u64().unwrap() >= 1 {
            return;
        }
        let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
        assert!(!scenario_happened(&history, to), "not caught: {s}");
        eprintln!("attempt {attempt}: nobody held with another behind when the DEL came; again");
    }
    panic!("in 6 runs nobody held the lock with another behind it when worker 0's DEL came");
}

/// Whether, in a history, some worker other than 0 held the lock at `at`
/// (worker 0's DEL) and another (worker 0 itself, back from its pause, or
/// a third) completed an acquire after `at` while that one still held: the
/// moment a GET-then-DEL unlock lets two in.
fn scenario_happened(history: &str, at: u64) -> bool {
    let events: Vec<serde_json::Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Each worker's holds: acquire completed -> its next release invoked.
    let mut holds = Vec::new();
    let mut open: std::collections::HashMap<u64, u64> = Default::default();
    let mut sorted: Vec<&serde_json::Value> = events.iter().collect();
    sorted.sort_by_key(|e| e["invoke_ns"].as_u64());
    for e in sorted {
        let w = e["worker"].as_u64().unwrap();
        match (e["op"].as_str(), e["outcome"].as_str()) {
            (Some("acquire"), Some("ok")) => {
                open.insert(w, e["complete_ns"].as_u64().unwrap());
            }
            (Some("release"), _) => {
                if let Some(from) = open.remove(&w) {
                    holds.push((w, from, e["invoke_ns"].as_u64().unwrap()));
                }
            }
            _ => {}
        }
    }
    holds.iter().any(|&(w, from, until)| {
        w != 0
            && from < at
            && at < until
            && holds.iter().any(|&(v, a, _)| v != w && a > at && a < until)
    })
}

/// The holder-kill bounds, per backend: the next worker holds
/// within the lease + 10 % where the lock has a lease (redis, pg-row,
/// etcd's fixed lease of 1 s), within the session timeout + 1 s for
/// ZooKeeper (4 s), and within 500 ms for pg-advisory (the dead process's
/// connection drops and the server frees its session's locks).
#[test]
fn holder_kill_recovery_per_backend() {
    for (backend, lease, bound_ms) in [
        ("pg-row", Some("1000"), 1100.0),
        ("etcd", Some("1000"), 2000.0),
        ("zookeeper", None, 5000.0),
        ("pg-advisory", None, 500.0),
    ] {
        // Volatile servers, as above: expiry, not one stalled fsync.
        let mut extra = vec!["--durability", "volatile"];
        if let Some(l) = lease {
            extra.extend_from_slice(&["--lease-ms", l]);
        }
        let r = faulted(backend, "holder-kill", &extra);
        let f = &r["faults"][0];
        assert!(f["skipped"].is_null(), "{backend}: {f}");
        let recovery = f["recovery_ms"].as_f64().unwrap();
        eprintln!(
            "{backend}: next holder {recovery:.1} ms after the kill {}",
            f["note"].as_str().unwrap_or("")
        );
        assert!(
            recovery <= bound_ms,
            "{backend}: next holder {recovery} ms after the kill (bound {bound_ms} ms)"
        );
        assert_eq!(r["summary"]["violations"], 0, "{backend}: {}", r["summary"]);
    }
}

/// Partitions (nftables, on loopback only): a minority of the 3-member
/// etcd cluster and of the ZooKeeper ensemble cut from the majority, and
/// RedLock's workers cut from two of its five masters. Locking stays
/// available through the majority (acquires succeed while the cut lasts),
/// with no double holder; every rule is gone afterwards.
#[test]
fn partitions_keep_locking_through_the_majority() {
    for (backend, fault, topology) in [
        ("etcd", "partition", "cluster"),
        ("zookeeper", "partition", "cluster"),
        ("redlock", "partition-clients", "single"),
    ] {
        let (r, history) = faulted_with_history(
            backend,
            fault,
            &[
                "--topology",
                topology,
                "--fault-target",
                "minority",
                "--fault-duration",
                "3",
            ],
        );
        let f = &r["faults"][0];
        assert!(f["skipped"].is_null(), "{backend}: {f}");
        assert!(f["healed_ns"].as_u64().is_some(), "{backend}: {f}");
        let s = &r["summary"];
        assert_eq!(s["violations"], 0, "{backend}: {s}");
        // Available through the majority: acquires completed inside the
        // cut (the history says when).
        let (from, to) = (
            f["started_ns"].as_u64().unwrap(),
            f["healed_ns"].as_u64().unwrap(),
        );
        let ok_during = history
            .iter()
            .filter(|e| e["op"] == "acquire" && e["outcome"] == "ok")
            .filter(|e| (from..to).contains(&e["complete_ns"].as_u64().unwrap()))
            .count();
        assert!(
            ok_during > 0,
            "{backend}: nothing acquired during the cut: {f}"
        );
        eprintln!(
            "{backend}: {fault} of a minority for {:.1} s: {ok_during} acquired, {} failed, {} unknown during it, 0 violations",
            (to - from) as f64 / 1e9,
            f["fail_during"],
            f["info_during"]
        );
    }
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&tables.stdout).contains("lockbench_"),
        "a partition rule was left behind"
    );
}

/// `clock-jump` on RedLock (libfaketime): the clocks of a majority of the
/// masters jump 60 s past a 10 s lease; their copies of the lock expire,
/// a waiter wins them while the holder is still inside (and never told).
/// A minority jumping leaves a holder of all five masters its quorum: no
/// double holder. Not a holder of a bare three: when both workers ask at
/// the same instant, each can win some masters, the loser gives its back,
/// and the winner holds three; two of them jumping is Kleppmann's case
/// (CI saw it: two holders for 1.7 s). So the minority's jump lands in
/// the second hold (4 s in, about 1 s into it), taken by a hand-over from
/// the queue, on all five.
#[test]
fn a_clock_jump_on_a_majority_of_redlock_masters_gives_two_holders() {
    for (target, double, at) in [("majority", true, "1"), ("minority", false, "4")] {
        let t = tag(&format!("clock-jump-{target}-"));
        let dir = out_dir(&t);
        json_run(
            &[
                "run",
                "--backend",
                "redlock",
                "--workers",
                "2",
                "--ops",
                "3",
                "--hold-ms",
                "3000",
                "--lease-ms",
                "10000",
                "--fault",
                "clock-jump",
                "--fault-target",
                target,
                "--fault-duration",
                "60",
                "--fault-at",
                at,
                "--json",
                "--out",
                dir.path().to_str().unwrap(),
            ],
            &t,
        );
        assert_nothing_left(&t);
        let r: serde_json::Value = results_in(dir.path());
        let f = &r["faults"][0];
        assert!(f["skipped"].is_null(), "{f}");
        let v = r["summary"]["violations"].as_u64().unwrap();
        if double {
            assert!(
                v >= 1,
                "a majority's clocks jumped, yet no double holder: {}",
                r["summary"]
            );
            assert_eq!(f["told_lost"], false, "{f}");
        } else {
            assert_eq!(v, 0, "{}", r["summary"]);
        }
    }
}

/// Kleppmann's pause on the ledger, for each lease lock that declares
/// fencing: the paused holder wakes and writes after a later holder did
/// (an unfenced resource would take the stale write), and the fenced
/// ledger refuses it.
#[test]
fn holder_pause_stale_writes_are_refused_by_the_fenced_ledger() {
    for backend in ["redis", "pg-row", "etcd"] {
        // The stop lands anywhere in the section; in the last instant,
        // after the section's write, it leaves nothing stale to refuse: a
        // second run then, not a pass.
        let mut seen = Vec::new();
        for _ in 0..2 {
            let t = tag(&format!("pause-ledger-{backend}-"));
            let dir = out_dir(&t);
            json_run(
                &[
                    "run",
                    "--backend",
                    backend,
                    "--workload",
                    "ledger",
                    "--ops",
                    "25",
                    "--hold-ms",
                    "100",
                    "--lease-ms",
                    "1000",
                    "--fault",
                    "holder-pause",
                    "--fault-at",
                    "1",
                    "--fault-duration",
                    "3",
                    "--json",
                    "--out",
                    dir.path().to_str().unwrap(),
                ],
                &t,
            );
            assert_nothing_left(&t);
            let r: serde_json::Value = results_in(dir.path());
            let l = r["summary"]["ledger"].clone();
            // Whatever the timing, the fenced ledger never takes one.
            assert_eq!(l["stale_writes_accepted"], 0, "{backend}: {l}");
            let hit = l["stale_writes_unfenced"].as_u64().unwrap() > 0;
            seen.push((r["faults"][0].clone(), l));
            if hit {
                break;
            }
        }
        assert!(
            seen.last()
                .is_some_and(|(_, l)| l["stale_writes_unfenced"].as_u64().unwrap() > 0),
            "{backend}: the paused holder made no stale write in {} runs: {seen:?}",
            seen.len()
        );
    }
}

/// Starts a 4 s redis throughput run with `extra` flags, kill -9s its
/// server from outside once it is up and (with `after_restart`) once the
/// run's own node-kill has restarted it, and returns the run's stderr and
/// results.
fn run_whose_server_dies(
    prefix: &str,
    extra: &[&str],
    after_restart: bool,
) -> (String, serde_json::Value) {
    run_whose_server_dies_in(
        prefix,
        &["-w", "throughput", "--duration", "4"],
        extra,
        after_restart,
    )
}

/// [`run_whose_server_dies`] with the workload flags `workload`.
fn run_whose_server_dies_in(
    prefix: &str,
    workload: &[&str],
    extra: &[&str],
    after_restart: bool,
) -> (String, serde_json::Value) {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let t = tag(prefix);
    let dir = out_dir(&t);
    let child = Command::new(common::BIN)
        .args(["run", "-b", "redis", "--workers", "2"])
        .args(workload)
        .args(extra)
        .arg("--out")
        .arg(dir.path())
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server, once the workers are on it (and, if asked, the one the
    // node-kill started in its place).
    let t0 = Instant::now();
    let mut first = None;
    let server = loop {
        let workers = tagged_processes(&t)
            .iter()
            .filter(|p| p.contains(" worker"))
            .count();
        let server = tagged_processes(&t)
            .into_iter()
            .find(|p| p.contains("redis-server"));
        if let (Some(s), true) = (server, workers > 0) {
            let pid = s.split(':').next().unwrap().to_string();
            match &first {
                _ if !after_restart => break s,
                None => first = Some(pid),
                Some(old) if *old != pid => break s,
                Some(_) => {}
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no server and workers (restarted: {after_restart})"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));
    let pid: i32 = server.split(':').next().unwrap().parse().unwrap();
    // SAFETY: kill(2) of the server process we found by our tag.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    assert_nothing_left(&t);
    (
        String::from_utf8_lossy(&out.stderr).to_string(),
        results_in(dir.path()),
    )
}

/// A server the run started that dies on its own (no fault asked for) is
/// named, recorded, and fails the run: it exited 0 with "96 ok, 1104
/// failed" as if that were the lock's figure. Under node-kill, the
/// server the fault restarted is watched the same way (the check was
/// skipped for kill faults).
#[test]
fn a_server_that_dies_mid_run_is_named_and_fails_the_run() {
    let kill = [
        "--fault",
        "node-kill",
        "--fault-at",
        "0.5",
        "--fault-duration",
        "0.5",
    ];
    for (extra, after_restart) in [(&[][..], false), (&kill[..], true)] {
        let (err, r) = run_whose_server_dies("server-dies-", extra, after_restart);
        assert!(
            err.contains("exited during the run") && err.contains("not an injected fault"),
            "{extra:?}: {err}"
        );
        let exited = r["summary"]["servers_exited"].as_array().unwrap();
        assert_eq!(exited.len(), 1, "{exited:?}");
        assert!(exited[0].as_str().unwrap().contains("redis"), "{exited:?}");
    }
    // A run planned for minutes (a million cycles, --max-secs 300) ends
    // within seconds of the death: its workers are stopped, instead of
    // waiting out every acquire's 10 s budget against a dead server.
    let t0 = std::time::Instant::now();
    let (err, r) = run_whose_server_dies_in(
        "server-dies-long-",
        &[
            "-w",
            "mutex",
            "--ops",
            "1000000",
            "--hold-ms",
            "1",
            "--max-secs",
            "300",
        ],
        &[],
        false,
    );
    let took = t0.elapsed();
    assert!(err.contains("stopped early"), "{err}");
    assert!(
        r["summary"]["stopped_early"]
            .as_str()
            .unwrap()
            .contains("redis"),
        "{}",
        r["summary"]
    );
    assert!(
        took < std::time::Duration::from_secs(60),
        "took {took:?}: {err}"
    );
    // The fault's own kill is no death: that run passes.
    let t = tag("node-kill-ok-");
    let dir = out_dir(&t);
    let r = json_run(
        &[
            "run",
            "-b",
            "redis",
            "-w",
            "throughput",
            "--workers",
            "2",
            "--duration",
            "3",
            "--fault",
            "node-kill",
            "--fault-at",
            "0.5",
            "--fault-duration",
            "0.5",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert!(r.get("servers_exited").is_none(), "{r}");
    let f = &results_in(dir.path())["faults"][0];
    assert!(f["skipped"].is_null() && f["healed_ns"].is_u64(), "{f}");
    assert_nothing_left(&t);
}

/// The console says what the fault did, or that it never happened: a
/// fault timed after the run's end was skipped with only `0 violation(s)`
/// on the console, and exit 0. It now fails: the run measured no fault.
#[test]
fn the_console_names_the_fault_or_that_it_was_skipped() {
    let t = tag("fault-line-");
    let dir = out_dir(&t);
    let out = common::lockbench(
        &[
            "run",
            "-b",
            "redis",
            "--fault",
            "node-pause",
            "--ops",
            "5",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}{err}");
    assert!(
        text.contains("fault node-pause: skipped: the run ended before the fault's time"),
        "{text}"
    );
    assert!(err.contains("the fault asked for did not happen"), "{err}");
    // One that cannot happen is refused before anything starts, and a
    // fault setting without a fault is not silently ignored.
    for (args, says) in [
        (
            vec!["--fault", "node-pause", "--fault-at", "100000"],
            "--max-secs",
        ),
        (
            vec![
                "--fault",
                "node-pause",
                "--duration",
                "3",
                "--fault-at",
                "4",
            ],
            "--duration",
        ),
        // The first of three fits, the third cannot (it begins after two
        // faults of 5 s and two waits of at least 2 s).
        (
            vec![
                "--fault",
                "node-pause",
                "--duration",
                "10",
                "--fault-at",
                "4",
                "--fault-repeat",
                "3",
            ],
            "--fault-repeat 3",
        ),
        (vec!["--fault-target", "one"], "--fault"),
        (vec!["--fault-duration", "2"], "--fault"),
    ] {
        let mut all = vec!["run", "-b", "redis", "--out", dir.path().to_str().unwrap()];
        all.extend(args.iter().copied());
        let t0 = std::time::Instant::now();
        let out = common::lockbench(&all, &t);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{args:?}");
    }
    assert_nothing_left(&t);
}

/// Ctrl-C while PostgreSQL is paused by a node-pause: its session backends
/// (stopped, outside the postmaster's group) are killed with it. They were
/// left stopped forever, never noticing their postmaster was gone.
#[test]
fn ctrl_c_during_a_pg_pause_leaves_no_stopped_backend() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let t = tag("pg-pause-int-");
    let dir = out_dir(&t);
    let child = Command::new(common::BIN)
        .args([
            "run",
            "-b",
            "pg-advisory",
            "--workers",
            "2",
            "--ops",
            "100000",
            "--hold-ms",
            "5",
            "--fault",
            "node-pause",
            "--fault-at",
            "1",
            "--fault-duration",
            "30",
            "--out",
        ])
        .arg(dir.path())
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Paused: some process of ours is stopped.
    let t0 = Instant::now();
    loop {
        let stopped = tagged_processes(&t).iter().any(|p| {
            let pid = p.split(':').next().unwrap();
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with('T')))
                .unwrap_or(false)
        });
        if stopped {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never paused");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    interrupt(child, &t);
}

/// Ctrl-C to a run: it must exit within 15 s and leave no process of `t`
/// after 10 more; its output.
fn interrupt(mut child: std::process::Child, t: &str) -> std::process::Output {
    use std::time::{Duration, Instant};
    // SAFETY: signalling our own child.
    unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGINT) };
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "did not exit on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let t0 = Instant::now();
    while !tagged_processes(t).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "left behind: {:?}",
            tagged_processes(t)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    out
}

/// A pg-* ledger run keeps its data on the lock's own PostgreSQL, so a
/// node-kill restarts the data store too: the run ended with "expected to
/// read 5 bytes" and wrote nothing (its pooled connections were dead), and
/// a release that failed in the outage left the lease row held for 28 s.
/// Now the run checks its ledger on fresh connections, and the next holder
/// comes within seconds of the restart.
#[test]
fn a_pg_ledger_run_survives_a_restart_of_its_own_database() {
    let t = tag("pg-ledger-kill-");
    let dir = out_dir(&t);
    let s = json_run(
        &[
            "run",
            "-b",
            "pg-row",
            "-w",
            "ledger",
            "--workers",
            "3",
            "--ops",
            "40",
            "--fault",
            "node-kill",
            "--fault-at",
            "1",
            "--fault-duration",
            "2",
            "--max-secs",
            "60",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert_nothing_left(&t);
    let l = &s["ledger"];
    assert!(l["acknowledged"].as_u64().unwrap() > 60, "{l}");
    assert_eq!(l["lost_updates"], 0, "{l}");
    let f = &results_in(dir.path())["faults"][0];
    let recovery = f["recovery_ms"].as_f64().unwrap();
    assert!(
        recovery < 5_000.0,
        "next holder {recovery} ms after the restart: {f}"
    );
}

/// `--fault-target minority` on a Redis Cluster of 3 masters + 3 replicas
/// paused two masters (the first two of six nodes), and with them the
/// cluster; on an etcd cluster it said nothing of whether it hit the
/// leader. A minority of a Redis Cluster is a minority of its masters now,
/// and every target is named with its role.
#[test]
fn fault_targets_are_named_with_their_roles() {
    for (backend, role) in [("redis", "(master)"), ("etcd", "")] {
        let r = faulted(
            backend,
            "node-pause",
            &[
                "--topology",
                "cluster",
                "--fault-target",
                "minority",
                "--fault-duration",
                "1",
            ],
        );
        let target = r["faults"][0]["target"].as_str().unwrap().to_string();
        assert_eq!(
            target.matches(" (").count(),
            1,
            "{backend}: one node, with its role: {target}"
        );
        assert!(target.ends_with(role), "{backend}: {target}");
        assert!(
            target.ends_with("(leader)") || target.ends_with("(follower)") || backend != "etcd",
            "{target}"
        );
        assert!(
            r["faults"][0]["stalled_ms"].is_number(),
            "{}",
            r["faults"][0]
        );
    }
}

/// Ctrl-C during a partition: the signal handler deletes the nftables
/// table, and the partition's own heal then said "could not remove a
/// partition's nftables table ... No such file or directory", as if a rule
/// were left behind.
#[test]
fn ctrl_c_during_a_partition_says_no_false_error() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let t = tag("part-int-");
    let dir = out_dir(&t);
    let child = Command::new(common::BIN)
        .args([
            "run",
            "-b",
            "redlock",
            "--workers",
            "2",
            "--ops",
            "100000",
            "--hold-ms",
            "5",
            "--fault",
            "partition-clients",
            "--fault-target",
            "minority",
            "--fault-at",
            "1",
            "--fault-duration",
            "6",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Inside the partition: the fault starts 1 s after the workers do.
    let t0 = Instant::now();
    while tagged_processes(&t).len() < 7 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(3_000));
    let pid = child.id();
    let out = interrupt(child, &t);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("could not remove"), "{err}");
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(!tables.contains(&format!("lockbench_{pid}_")), "{tables}");
}
