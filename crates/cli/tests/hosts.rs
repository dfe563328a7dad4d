//! Workers on several hosts, simulated here: a coordinator (`lockbench
//! run --hosts 2`) and two `lockbench worker --run` processes, each
//! "host" with its clock skewed the other way (`LOCKBENCH_CLOCK_SKEW_MS`
//! = +500 / -500), against a Redis and a PostgreSQL started here as the
//! user's own servers. The database-clock check must still see what the
//! locks did, and the naive cross-host comparison of monotonic stamps must
//! be shown to be wrong.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_nothing_left, out_dir, own_servers, tag, OwnServers as Fleet, BIN};

/// One simulated run: the fleet tag its processes carry and the run id the
/// hosts join by.
struct Trial {
    t: String,
    run: String,
}

impl Trial {
    fn new(name: &str) -> Self {
        let t = tag(name);
        let run = t.trim_end_matches('-').to_string();
        Self { t, run }
    }

    /// The coordinator, writing to a fresh directory (returned).
    fn coordinator(
        &self,
        f: &Fleet,
        backend: &str,
        ops: &str,
        extra: &[&str],
    ) -> (Child, std::path::PathBuf) {
        let (run, t) = (self.run.as_str(), self.t.as_str());
        // Not there yet: the run makes it.
        let dir = out_dir(t).keep().join("out");
        let mut args = vec![
            "run",
            "--backend",
            backend,
            "--workload",
            "ledger",
            "--hosts",
            "2",
            "--run",
            run,
            "--workers",
            "4",
            "--ops",
            ops,
            "--config",
            f.config.path().to_str().unwrap(),
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let c = Command::new(BIN)
            .args(&args)
            .env("LOCKBENCH_FLEET_TAG", t)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (c, dir)
    }

    /// A host joining the run.
    fn host(&self, f: &Fleet, skew_ms: i64, name: &str) -> Child {
        let (run, t) = (self.run.as_str(), self.t.as_str());
        Command::new(BIN)
            .args([
                "worker",
                "--run",
                run,
                "--config",
                f.config.path().to_str().unwrap(),
                "--host",
                name,
                "--join-timeout",
                "30",
            ])
            .env("LOCKBENCH_FLEET_TAG", t)
            .env("LOCKBENCH_CLOCK_SKEW_MS", skew_ms.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// Waits for each host, at most 30 s, and fails naming one that failed.
fn hosts_succeed(hosts: Vec<(Child, &str)>) {
    for (h, name) in hosts {
        let o = finish(h, 30, name);
        assert!(
            o.status.success(),
            "{name} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Waits for `c`, at most `secs`: a hang is a failure, not a wait.
fn finish(mut c: Child, secs: u64, what: &str) -> Output {
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = c.kill();
            let out = c.wait_with_output().unwrap();
            panic!(
                "{what} still running after {secs} s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    c.wait_with_output().unwrap()
}

fn results(out: &Output) -> serde_json::Value {
    let code = out.status.code();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        code == Some(0) || code == Some(3),
        "coordinator failed ({code:?}): {err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 3 exactly when the checkers found the lock broken.
    assert_eq!(code == Some(3), common::broken(&s), "{code:?}: {err}");
    s
}

/// One run of `backend` on two skewed hosts: the coordinator's summary and
/// its results.json.
fn two_hosts(f: &Fleet, backend: &str) -> (serde_json::Value, serde_json::Value) {
    let tr = Trial::new(&format!("hosts-{backend}-"));
    let (c, dir) = tr.coordinator(f, backend, "40", &[]);
    let a = tr.host(f, 500, "host-a");
    let b = tr.host(f, -500, "host-b");
    let out = finish(c, 120, "the coordinator");
    hosts_succeed(vec![(a, "host-a"), (b, "host-b")]);
    let s = results(&out);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_nothing_left(&tr.t);
    (s, r)
}

#[test]
fn the_database_clock_sees_what_skewed_host_clocks_cannot() {
    let f = own_servers(None);

    let (s, r) = two_hosts(&f, "redis");
    assert_eq!(
        r["summary"]["hosts"], s["hosts"],
        "results.json says the same"
    );
    let l = &s["ledger"];
    println!("redis on 2 hosts: {l}\nhosts: {}", s["hosts"]);
    assert_eq!(l["acknowledged"], 160, "every section acknowledged: {l}");
    assert_eq!(l["lost_updates"], 0, "{l}");
    // Stale writes are told by the database's stamps here: the hosts'
    // skewed clocks would have called half of the writes stale.
    assert_eq!(l["stale_writes_unfenced"], 0, "{l}");
    assert_eq!(l["verdict"], "ok", "{l}");
    assert_eq!(l["db_clock"]["sections"], 160, "{l}");
    assert_eq!(
        l["db_clock"]["violations"], 0,
        "a correct lock, by the database's clock: {l}"
    );
    assert_eq!(s["violations"], 0, "within each host: {s}");
    let members = s["hosts"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|m| m["state"] == "done"), "{members:?}");
    // One host's stamps run 1 s ahead of the other's: compared as if they
    // shared a clock, the correct lock's sections seem to intersect.
    assert!(
        s["hosts"]["naive_cross_host_violations"].as_u64().unwrap() > 0,
        "the naive cross-host check should have been fooled by the skew: {}",
        s["hosts"]
    );

    let (s, _) = two_hosts(&f, "redis-short-lease");
    let l = &s["ledger"];
    println!("redis-short-lease on 2 hosts: {l}");
    assert!(
        l["db_clock"]["violations"].as_u64().unwrap() > 0,
        "the broken lock's overlaps, by the database's clock: {l}"
    );
}

#[test]
fn a_host_that_never_joins_is_named_and_nothing_hangs() {
    let f = own_servers(None);
    let tr = Trial::new("hosts-missing-");
    let t0 = Instant::now();
    let (c, _) = tr.coordinator(&f, "redis", "40", &["--join-timeout", "3"]);
    let a = tr.host(&f, 0, "host-a");
    let out = finish(c, 30, "the coordinator");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a run with a missing host must fail");
    assert!(
        err.contains("1 of 2 hosts ready") && err.contains("shard 1") && err.contains("host-a"),
        "the error names who came and who did not: {err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // The host that came is told the run ended, and gives up by itself.
    let o = finish(a, 30, "host-a");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ended the run"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_nothing_left(&tr.t);
}

#[test]
fn a_host_that_dies_mid_run_is_recorded_and_the_run_ends() {
    let f = own_servers(None);
    let tr = Trial::new("hosts-death-");
    // Long enough to kill a host in the middle: 4 x 400 sections of 10 ms.
    let (c, _) = tr.coordinator(&f, "redis", "400", &[]);
    let a = tr.host(&f, 0, "host-a");
    let mut b = tr.host(&f, 0, "host-b");
    std::thread::sleep(Duration::from_secs(4));
    b.kill().unwrap();
    let _ = b.wait();
    let out = finish(c, 120, "the coordinator");
    // Half the run's workers went: its figures are a part of what it
    // planned, and it fails saying so, with its results.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("died without an injected fault"),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let deaths = s["worker_deaths"].as_array().unwrap();
    assert_eq!(deaths.len(), 2, "both of host-b's workers: {deaths:?}");
    assert!(
        deaths
            .iter()
            .all(|d| d["message"].as_str().unwrap().contains("host-b")),
        "{deaths:?}"
    );
    assert_eq!(s["ledger"]["db_clock"]["violations"], 0, "{}", s["ledger"]);
    let o = finish(a, 30, "host-a");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_nothing_left(&tr.t);
}

/// A host killed while it waited for go still counted as ready: the run
/// went ahead without its workers and passed, exit 0, with half its
/// sections. Now it is not ready once it stops beating, and a host that
/// comes after it takes over its shard.
#[test]
fn a_host_killed_before_go_is_replaced_not_counted() {
    let f = own_servers(None);
    let tr = Trial::new("hosts-replaced-");
    let (c, _) = tr.coordinator(&f, "redis", "20", &["--join-timeout", "40"]);
    let mut a = tr.host(&f, 0, "host-a");
    // host-a joined and is ready (its workers connected) before it dies.
    std::thread::sleep(Duration::from_secs(3));
    a.kill().unwrap();
    let _ = a.wait();
    let b = tr.host(&f, 0, "host-b");
    // Once host-a is silent, host-c takes its shard.
    std::thread::sleep(Duration::from_secs(6));
    let c2 = tr.host(&f, 0, "host-c");
    let s = results(&finish(c, 120, "the coordinator"));
    hosts_succeed(vec![(b, "host-b"), (c2, "host-c")]);
    assert_eq!(s["worker_deaths"], serde_json::json!([]), "{s}");
    assert_eq!(s["ops_ok"], 80, "every worker of both shards ran: {s}");
    let members = s["hosts"]["members"].as_array().unwrap();
    let names: Vec<&str> = members
        .iter()
        .map(|m| m["host"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"host-b") && names.contains(&"host-c"),
        "{names:?}"
    );
    assert_nothing_left(&tr.t);
}

/// A host silent long enough before go (SIGSTOP, a sleeping laptop) loses
/// its shard to a host that comes; when it wakes it must not run that
/// shard too (it went on beating the other's row, saw go, and ran the same
/// workers a second time).
#[test]
fn a_host_whose_shard_was_taken_over_does_not_run_it() {
    let f = own_servers(None);
    let tr = Trial::new("hosts-woken-");
    let (c, _) = tr.coordinator(&f, "redis", "20", &["--join-timeout", "40"]);
    let a = tr.host(&f, 0, "host-a");
    std::thread::sleep(Duration::from_secs(3));
    let pid = a.id().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    std::thread::sleep(Duration::from_secs(6));
    let b = tr.host(&f, 0, "host-b");
    let c2 = tr.host(&f, 0, "host-c");
    let s = results(&finish(c, 120, "the coordinator"));
    signal("-CONT");
    let o = finish(a, 30, "host-a");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("taken over"), "{err}");
    hosts_succeed(vec![(b, "host-b"), (c2, "host-c")]);
    assert_eq!(s["ops_ok"], 80, "{s}");
    assert_nothing_left(&tr.t);
}

/// A host whose config points the lock elsewhere (here another database
/// of the same Redis) ran unnoticed, and the lock was blamed for the lost
/// updates (120 of 240). The same servers may have other names on another
/// host (the compose network), so it is not refused: the host warns, and
/// the run's results name the setting that differs.
#[test]
fn a_host_locking_other_servers_is_named_in_the_results() {
    use std::io::Write as _;
    let f = own_servers(None);
    let tr = Trial::new("hosts-otherdb-");
    let (c, _) = tr.coordinator(&f, "redis", "20", &["--join-timeout", "20"]);
    let a = tr.host(&f, 0, "host-a");
    let mut other = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        other,
        "[redis]\nurl = \"{}/3\"\n\n[postgres]\nurl = \"{}\"",
        f.redis.nodes[0].url(),
        f.pg.url()
    )
    .unwrap();
    let b = Command::new(BIN)
        .args([
            "worker",
            "--run",
            &tr.run,
            "--config",
            other.path().to_str().unwrap(),
            "--host",
            "host-b",
        ])
        .env("LOCKBENCH_FLEET_TAG", &tr.t)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let s = results(&finish(c, 120, "the coordinator"));
    let o = finish(b, 30, "host-b");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not the coordinator's") && err.contains("url"),
        "{err}"
    );
    let _ = finish(a, 30, "host-a");
    let notes: Vec<&str> = s["hosts"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["note"].as_str())
        .collect();
    assert!(notes.len() == 1 && notes[0].contains("/3"), "{notes:?}");
    assert_nothing_left(&tr.t);
}

/// A coordinator killed mid-run (kill -9, Ctrl-C, a closed terminal) left
/// its hosts running for the rest of the run, then exiting 0 with "done".
/// They now stop once it is silent, and say so.
#[test]
fn hosts_stop_when_their_coordinator_dies() {
    let f = own_servers(None);
    let tr = Trial::new("hosts-orphans-");
    let (mut c, _) = tr.coordinator(&f, "redis", "100000", &["--max-secs", "300"]);
    let a = tr.host(&f, 0, "host-a");
    let b = tr.host(&f, 0, "host-b");
    std::thread::sleep(Duration::from_secs(6));
    c.kill().unwrap();
    let _ = c.wait();
    let t0 = Instant::now();
    for (h, name) in [(a, "host-a"), (b, "host-b")] {
        let o = finish(h, 60, name);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name} said it went well: {err}");
        assert!(
            err.contains("coordinator stopped reporting"),
            "{name}: {err}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(40), "{:?}", t0.elapsed());
    assert_nothing_left(&tr.t);
}

#[test]
fn a_worker_without_a_run_or_with_a_bad_skew_says_why() {
    let f = own_servers(None);
    let cfg = f.config.path().to_str().unwrap();
    let t0 = Instant::now();
    let o = Command::new(BIN)
        .args([
            "worker",
            "--run",
            "nobody-opened-this",
            "--config",
            cfg,
            "--join-timeout",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("nobody-opened-this") && err.contains("no such run"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(15));
    // A run id no coordinator accepts is refused at once (it waited out
    // the join timeout looking for the run).
    let t0 = Instant::now();
    let o = Command::new(BIN)
        .args(["worker", "--run", "bad 6", "--config", cfg])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("\"bad 6\""), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let o = Command::new(BIN)
        .args(["worker", "--run", "x", "--config", cfg])
        .env("LOCKBENCH_CLOCK_SKEW_MS", "soon")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("LOCKBENCH_CLOCK_SKEW_MS"),
        "{err}"
    );
    let o = Command::new(BIN)
        .args(["run", "--backend", "redis", "--hosts", "2", "--config", cfg])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--workload ledger"),
        "{err}"
    );
}
