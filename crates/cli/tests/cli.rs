//! `lockbench` end to end: real Redis from the fleet, worker OS processes,
//! the overlap checker, and teardown on Ctrl-C.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The seed's maxActive test (4 processes x 100 x 10 ms on one key) on
/// `backend`; returns its summary, output dir and process tag.
fn mutex_run(backend: &str) -> (serde_json::Value, tempfile::TempDir, String) {
    let t = tag(&format!("mutex-{backend}-"));
    let dir = out_dir(&t);
    let s = json_run(
        &[
            "run",
            "--backend",
            backend,
            "--workload",
            "mutex",
            "--workers",
            "4",
            "--ops",
            "100",
            "--hold-ms",
            "10",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    (s, dir, t)
}

/// [`mutex_run`] on a correct lock: every cycle succeeds, nothing overlaps,
/// no release finds its lock gone, and nothing is left running. Returns
/// (summary, results, output dir).
fn clean_mutex_run(backend: &str) -> (serde_json::Value, serde_json::Value, tempfile::TempDir) {
    let (s, dir, t) = mutex_run(backend);
    assert_eq!(s["backend"], backend);
    assert_eq!(s["workers"], 4);
    assert_eq!(s["ops_ok"], 400, "{backend}: {s}");
    assert_eq!(s["ops_failed"], 0, "{backend}: {s}");
    assert_eq!(s["violations"], 0, "{backend}: {s}");
    assert_eq!(s["release_not_held"], 0, "{backend}: {s}");
    assert!(s["acquire_p50_us"].as_f64().unwrap() > 0.0);
    assert!(s["acquire_p99_us"].as_f64().unwrap() >= s["acquire_p50_us"].as_f64().unwrap());
    // 400 cycles of 10 ms held one at a time cannot take less than 4 s:
    // the workers really were serialised by the lock.
    assert!(s["wall_s"].as_f64().unwrap() >= 4.0, "{backend}: {s}");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(results["summary"]["violations"], 0);
    assert_nothing_left(&t);
    (s, results, dir)
}

#[test]
fn redis_mutex_across_processes_has_no_violation() {
    let (_, results, dir) = clean_mutex_run("redis");
    assert!(results["server_version"]
        .as_str()
        .unwrap()
        .starts_with("redis "));
    // The history file is a valid input to `lockbench check`, and agrees.
    let hist = dir.path().join("history.jsonl");
    assert_eq!(std::fs::read_to_string(&hist).unwrap().lines().count(), 800);
    let c = json_run(&["check", hist.to_str().unwrap(), "--json"], "check");
    assert_eq!(c["violations"], 0);
}

#[test]
fn short_lease_negative_control_is_caught() {
    let (s, dir, t) = mutex_run("redis-short-lease");
    assert!(
        s["violations"].as_u64().unwrap() > 0,
        "the checker missed a broken lock: {s}"
    );
    assert!(s["max_overlap_ms"].as_f64().unwrap() > 0.0);
    assert!(
        s["release_not_held"].as_u64().unwrap() > 0,
        "unlock-returned-0 not counted: {s}"
    );
    let hist = dir.path().join("history.jsonl");
    // A broken history fails the command: a script reads the exit code
    // (it was 0 with "NOT mutually exclusive" printed).
    let out = lockbench(&["check", hist.to_str().unwrap(), "--json"], &t);
    assert_eq!(out.status.code(), Some(1), "check passed a broken history");
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["violations"], s["violations"]);
    assert!(!c["pairs"].as_array().unwrap().is_empty());
}

/// An uncontended latency run of `ops` cycles: every cycle succeeds and
/// the cycle is reported next to the raw floor measured in the same run,
/// with the ratio the fields promise. Returns the summary.
fn latency_run(backend: &str, ops: u64) -> serde_json::Value {
    let t = tag(&format!("latency-{backend}-"));
    let dir = out_dir(&t);
    let ops_arg = ops.to_string();
    let s = json_run(
        &[
            "run",
            "--backend",
            backend,
            "--workload",
            "latency",
            "--ops",
            &ops_arg,
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    for f in [
        "cycle_p50_us",
        "cycle_p99_us",
        "floor_p50_us",
        "floor_ratio",
    ] {
        assert!(s[f].as_f64().unwrap() > 0.0, "{backend}: {f} missing: {s}");
    }
    let ratio = s["cycle_p50_us"].as_f64().unwrap() / s["floor_p50_us"].as_f64().unwrap();
    assert!((ratio - s["floor_ratio"].as_f64().unwrap()).abs() < 1e-9);
    assert_eq!(s["ops_ok"], ops, "{backend}: {s}");
    s
}

#[test]
fn latency_reports_cycle_next_to_floor() {
    latency_run("redis", 300);
}

#[test]
fn bad_endpoint_fails_fast_and_names_it() {
    let t0 = Instant::now();
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--endpoint",
            "redis://127.0.0.1:1",
        ],
        &tag("badep"),
    );
    assert!(!out.status.success());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("redis://127.0.0.1:1"), "{err}");
}

/// A fixed lease with no validity left after the clock-drift allowance is
/// refused before anything starts, naming the flag and the least lease
/// (every worker's acquire would have failed).
#[test]
fn a_lease_too_short_to_hold_is_refused_naming_the_flag() {
    let t = tag("shortlease");
    for ms in ["0", "3"] {
        let t0 = Instant::now();
        let out = lockbench(
            &["run", "--backend", "redis", "--lease-ms", ms, "--ops", "1"],
            &t,
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--lease-ms {ms}")) && err.contains("at least 4 ms"),
            "{err}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }
    assert!(tagged_processes(&t).is_empty(), "a server was started");
}

/// A worker count out of range is refused by the parser, naming the flag
/// and the range: `-3` was "unexpected argument", and `--workers=-3` was
/// "not in 0..=4294967295" where 1..=256 is what a run takes.
#[test]
fn a_worker_count_out_of_range_names_the_flag_and_range() {
    let t = tag("workers-range");
    for n in ["-3", "0", "1,0", "257"] {
        let out = lockbench(&["run", "--backend", "redis", "--workers", n], &t);
        assert_eq!(out.status.code(), Some(2), "{n}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--workers") && err.contains("1..=256"),
            "{n}: {err}"
        );
    }
    assert!(tagged_processes(&t).is_empty(), "a server was started");
}

/// PostgreSQL's pool said only "pool timed out while waiting for an open
/// connection" when nothing listened: the error now says why, for the
/// locks and for the data database of another backend's ledger.
#[test]
fn a_postgres_nobody_listens_on_is_named_with_the_reason() {
    let url = "postgres://postgres@127.0.0.1:1/postgres";
    let redis = fleet::RedisFleet::single().unwrap();
    for (backend, workload, lock_endpoint, data) in [
        ("pg-row", "mutex", url.to_string(), None),
        ("pg-advisory", "mutex", url.to_string(), None),
        ("redis", "ledger", redis.nodes[0].url(), Some(url)),
    ] {
        let t0 = Instant::now();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockbench"));
        cmd.args(["run", "--backend", backend, "--workload", workload])
            .args(["--ops", "1", "--endpoint", &lock_endpoint])
            .env("LOCKBENCH_FLEET_TAG", tag("pg-refused"));
        if let Some(u) = data {
            cmd.env("LOCKBENCH_PG_URL", u);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{backend}: {err}");
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(15), "{backend}: {took:?}");
        assert!(err.contains("127.0.0.1:1"), "{backend}: {err}");
        assert!(err.to_lowercase().contains("refused"), "{backend}: {err}");
    }
}

#[test]
fn unknown_backend_lists_the_valid_ones() {
    let out = lockbench(&["run", "--backend", "zookeper"], &tag("unknown"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("zookeper") && err.contains("redis-short-lease"),
        "{err}"
    );
}

/// `compare` run lengths out of range were found only when each run
/// reached them (minutes in, exit 0 with every cell failed): refused before
/// anything starts, naming the flag; a worker count listed twice too.
#[test]
fn compare_refuses_bad_run_lengths_before_anything_starts() {
    for (flag, value, says) in [
        ("--throughput-secs", "0", "--throughput-secs"),
        ("--throughput-secs", "1e9", "--throughput-secs"),
        ("--scaling-secs", "-1", "--scaling-secs"),
        ("--scaling", "1,1", "listed twice"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let arg = format!("{flag}={value}");
        let out = lockbench(
            &[
                "compare",
                "--backends",
                "redis",
                &arg,
                "--out",
                dir.path().to_str().unwrap(),
            ],
            &tag("compare-len"),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{arg}: {err}");
        assert!(err.contains(says), "{arg}: {err}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{arg}: {:?}",
            t0.elapsed()
        );
    }
}

/// `compare --out` on a file failed only after the first runs; on the
/// directory of an earlier comparison it mixed the two runs' directories.
/// Both are refused before anything starts.
#[test]
fn compare_refuses_an_out_that_is_a_file_or_holds_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let used = dir.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("comparison.json"), "{}").unwrap();
    for (out, says) in [(&file, "not a directory"), (&used, "not empty")] {
        let t0 = Instant::now();
        let o = lockbench(
            &[
                "compare",
                "--backends",
                "redis",
                "--out",
                out.to_str().unwrap(),
            ],
            &tag("compare-out"),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }
}

/// `compare --backends` with a misspelt name ran the others (or nothing)
/// and exited 0; it must refuse before anything starts, as `run` does.
#[test]
fn compare_refuses_a_backend_it_does_not_know() {
    for list in ["zookeper", "zookeper,redis", "memory"] {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let out = lockbench(
            &[
                "compare",
                "--backends",
                list,
                "--out",
                dir.path().to_str().unwrap(),
            ],
            &tag("compare-unknown"),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{list}: {err}");
        assert!(err.contains("--backends"), "{list}: {err}");
        assert!(
            err.contains(list.split(',').next().unwrap()),
            "{list}: {err}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{list}: {:?}",
            t0.elapsed()
        );
    }
}

/// A port base that is not a port was ignored: the servers started at the
/// default base, where the user had asked them not to.
#[test]
fn a_port_base_that_is_not_a_port_is_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_lockbench"))
        .args(["run", "--backend", "redis", "--ops", "1"])
        .env("LOCKBENCH_PORT_BASE", "abc")
        .env("LOCKBENCH_FLEET_TAG", tag("port-base"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("LOCKBENCH_PORT_BASE"), "{err}");
}

/// Logs go to stderr without colour codes when it is not a terminal (a
/// CI log, a file): they were full of `ESC[33m`.
#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redlock",
            "--endpoint",
            "redis://127.0.0.1:1",
            "--ops",
            "1",
        ],
        &tag("no-ansi"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fewer than 3 nodes"),
        "no warning logged: {err}"
    );
    assert!(!err.contains('\x1b'), "colour codes in a log file: {err:?}");
}

/// `redis-cluster` on servers that are one plain Redis: named by the
/// comparison before anything starts (its connect stopped it halfway).
#[test]
fn compare_refuses_redis_cluster_on_a_plain_redis() {
    let dir = out_dir("cfg-cluster");
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "[redis]\nurl = \"redis://127.0.0.1:1\"\n").unwrap();
    let t0 = Instant::now();
    let out = lockbench(
        &[
            "compare",
            "--backends",
            "redis-cluster",
            "--config",
            p.to_str().unwrap(),
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ],
        &tag("cfg-cluster"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("redis-cluster") && err.contains("redis+cluster://"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn unknown_config_key_is_named() {
    let dir = out_dir("cfg");
    let p = dir.path().join("c.toml");
    std::fs::write(
        &p,
        "[redis]\nurl = \"redis://127.0.0.1:1\"\nwatchdog_lease = 5\n",
    )
    .unwrap();
    let out = lockbench(
        &["run", "--backend", "redis", "--config", p.to_str().unwrap()],
        &tag("cfg"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("watchdog_lease"), "{err}");
}

/// A value of the wrong type names its key: serde alone said "bad
/// configuration `redis`: invalid type: integer", not which one.
#[test]
fn a_value_of_the_wrong_type_names_its_key() {
    for (backend, table, named) in [
        ("redis", "[redis]\nurl = 41010\n", "redis.url"),
        (
            "redis",
            "[redis]\nop_timeout_ms = \"fast\"\n",
            "redis.op_timeout_ms",
        ),
        (
            "redis",
            "[redis]\nop_timeout_ms = -5\n",
            "redis.op_timeout_ms",
        ),
        (
            "etcd",
            "[etcd]\nsession_ttl_s = true\n",
            "etcd.session_ttl_s",
        ),
    ] {
        let dir = out_dir("cfg-type");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, table).unwrap();
        let out = lockbench(
            &["run", "--backend", backend, "--config", p.to_str().unwrap()],
            &tag("cfg-type"),
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{table}: {err}");
    }
}

#[test]
fn check_rejects_a_malformed_history_with_its_line() {
    let dir = out_dir("malformed");
    let p = dir.path().join("h.jsonl");
    std::fs::write(&p, "{\"worker\":0,\"key\":\"k\",\"op\":\"acquire\",\"invoke_ns\":1,\"complete_ns\":2,\"outcome\":\"ok\",\"token\":null}\nnot json\n").unwrap();
    let out = lockbench(&["check", p.to_str().unwrap()], "malformed");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":2:"), "{err}");
    // An empty file is no pass either (it said "0 violations", exit 0).
    std::fs::write(&p, "").unwrap();
    let out = lockbench(&["check", p.to_str().unwrap()], "malformed");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no events"), "{err}");
}

#[test]
fn backends_lists_capabilities() {
    let v: serde_json::Value =
        serde_json::from_slice(&lockbench(&["backends", "--json"], "b").stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    for n in [
        "redis",
        "redis-wait",
        "redis-setnx-expire",
        "redis-get-del",
        "redis-short-lease",
        "etcd",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert_eq!(v[0]["capabilities"]["fencing"], true);
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Two runs given one `--out`: the second is refused at once, naming the
/// flag and the first run, and the first runs on undisturbed. Before, both
/// wrote their workers' histories into the same files: both lost their
/// results and one reported a violation that never happened.
#[test]
fn a_second_run_into_the_same_out_is_refused() {
    let t = tag("sameout");
    let dir = out_dir(&t);
    let out = dir.path().to_str().unwrap().to_string();
    let first = Command::new(BIN)
        .args([
            "run",
            "--backend",
            "redis",
            "--workers",
            "2",
            "--ops",
            "300",
            "--hold-ms",
            "5",
            "--json",
            "--out",
            &out,
        ])
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lock = dir.path().join(".lockbench-run.lock");
    assert!(
        wait_until(Duration::from_secs(20), || lock.exists()),
        "the first run never reserved its directory"
    );
    let t0 = Instant::now();
    let second = lockbench(
        &["run", "--backend", "redis", "--ops", "10", "--out", &out],
        &tag("sameout2"),
    );
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("--out") && err.contains("another lockbench run"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let done = first.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(s["ops_ok"], 600, "{s}");
    assert_eq!(s["violations"], 0, "{s}");
    assert!(!lock.exists(), "the reservation outlived the run");
}

/// Ctrl-C, SIGTERM or SIGHUP (a closed terminal or ssh session) in the
/// middle of a run stops every server and worker it started and removes
/// their directories (SIGHUP was not handled: exit 129 with nothing said,
/// and the server's temp dir left behind).
#[test]
fn ctrl_c_leaves_nothing_behind() {
    for (sig, code) in [
        (libc::SIGINT, 130),
        (libc::SIGHUP, 129),
        (libc::SIGTERM, 143),
    ] {
        let t = tag("ctrlc");
        let dir = out_dir(&t);
        let mut cmd = Command::new(BIN);
        // A hang-up is ignored by design when the run inherits SIGHUP
        // ignored (`nohup`): the tests themselves may run under nohup.
        // SAFETY: `signal` is async-signal-safe, as pre_exec requires.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = cmd
            .args([
                "run",
                "--backend",
                "redis",
                "--workers",
                "3",
                "--ops",
                "100000",
                "--hold-ms",
                "5",
                "--out",
                dir.path().to_str().unwrap(),
            ])
            .env("LOCKBENCH_FLEET_TAG", &t)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Running: the server and three workers are up.
        assert!(
            wait_until(Duration::from_secs(20), || tagged_processes(&t).len() >= 5),
            "run never got going: {:?}",
            tagged_processes(&t)
        );
        // SAFETY: signalling our own child.
        unsafe { libc::kill(i32::try_from(child.id()).unwrap(), sig) };
        let status = wait_until(Duration::from_secs(10), || {
            child.try_wait().unwrap().is_some()
        });
        assert!(status, "lockbench did not exit on signal {sig}");
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "signal {sig}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("servers and workers stopped"),
            "signal {sig}: {err}"
        );
        assert!(
            wait_until(Duration::from_secs(5), || tagged_processes(&t).is_empty()),
            "left behind after signal {sig}: {:?}",
            tagged_processes(&t)
        );
        assert!(!Path::new(&dir.path().join("results.json")).exists());
        let leaked: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("lockbench-{t}-"))
            })
            .map(|e| e.path())
            .collect();
        assert!(leaked.is_empty(), "signal {sig} left {leaked:?}");
    }
}

/// A comparison cut short by Ctrl-C left no page, however many runs it had
/// finished: it now writes those, marked with the phase it was in, and
/// still stops every server.
/// Starts `lockbench compare ARGS --out DIR/c`, waits (up to `within`) for
/// `ready(DIR/c)`, sends SIGINT and returns what the compare wrote: its
/// stderr and comparison.json. Checks the exit (130) and that no process
/// of the run is left.
fn cut_short_compare(
    t: &str,
    args: &[&str],
    within: Duration,
    ready: impl Fn(&Path) -> bool,
) -> (
    String,
    serde_json::Value,
    std::path::PathBuf,
    tempfile::TempDir,
) {
    let dir = out_dir(t);
    let out = dir.path().join("c");
    let mut child = Command::new(BIN)
        .arg("compare")
        .args(args)
        .args(["--out", out.to_str().unwrap()])
        .env("LOCKBENCH_FLEET_TAG", t)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(within, || ready(&out)),
        "the phase to cut never began"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGINT) };
    assert!(
        wait_until(Duration::from_secs(10), || child
            .try_wait()
            .unwrap()
            .is_some()),
        "compare did not exit on SIGINT"
    );
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(130), "{err}");
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("comparison.json")).unwrap()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || tagged_processes(t).is_empty()),
        "left behind: {:?}",
        tagged_processes(t)
    );
    (err, c, out, dir)
}

#[test]
fn a_comparison_cut_short_writes_what_it_finished() {
    let t = tag("compare-int");
    // The ledger and flash-sale runs are done once the performance phase
    // has made its first run's directory.
    let perf_started = |out: &Path| {
        std::fs::read_dir(out).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("perf-"))
        })
    };
    let (err, c, out, _dir) = cut_short_compare(
        &t,
        &["--backends", "redis", "--repeats", "1"],
        Duration::from_secs(120),
        perf_started,
    );
    assert!(err.contains("marked as cut short"), "{err}");
    assert_eq!(c["interrupted"], "the performance runs", "{c}");
    let rows = c["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{c}");
    assert_eq!(rows[0]["ledger"]["violations"], 0, "{c}");
    assert!(rows[0]["coupon"].is_object(), "{c}");
    let page = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(page.contains("interrupted during the performance runs"));
}

#[test]
fn a_comparison_cut_short_in_its_scaling_runs_keeps_the_points_it_finished() {
    let t = tag("compare-int-scale");
    // The first point (1 worker) is done once the second has made its
    // first run's directory.
    let second_point = |out: &Path| out.join("scale-pg-advisory-2-one-key").exists();
    let (_, c, _, _dir) = cut_short_compare(
        &t,
        &[
            "--backends",
            "pg-advisory",
            "--repeats",
            "1",
            "--durability",
            "volatile",
            "--throughput-secs",
            "1",
            "--faults",
            "none",
            "--scaling",
            "1,2",
            "--scaling-secs",
            "1",
        ],
        Duration::from_secs(240),
        second_point,
    );
    assert_eq!(c["interrupted"], "the scaling runs", "{c}");
    let points = c["scaling"].as_array().unwrap();
    assert_eq!(points.len(), 1, "{c}");
    assert_eq!(points[0]["workers"], 1, "{c}");
    assert!(points[0]["one_key_per_s"].as_f64().unwrap() > 0.0, "{c}");
}

#[test]
fn redlock_mutex_across_processes_has_no_violation() {
    let (_, results, _) = clean_mutex_run("redlock");
    let topology = results["topology"].as_str().unwrap();
    assert!(
        topology.contains("5 independent redis masters"),
        "{results}"
    );
    assert_eq!(results["capabilities"]["token_source"], "unsafe");
}

#[test]
fn redlock_latency_is_timed_next_to_single_redis_and_rslock() {
    let s = latency_run("redlock", 200);
    for peer in ["redis", "rslock"] {
        let p = &s["peers"][peer];
        assert!(
            p["cycle"]["p50_us"].as_f64().unwrap() > 0.0,
            "peer {peer} missing: {s}"
        );
        assert_eq!(p["cycle"]["count"], 200, "{s}");
        let ratio = s["cycle_p50_us"].as_f64().unwrap() / p["cycle"]["p50_us"].as_f64().unwrap();
        assert!((ratio - p["ratio"].as_f64().unwrap()).abs() < 1e-9);
    }
}

/// The three PostgreSQL locks: 4 processes x 100 x 10 ms, no overlap.
#[test]
fn postgres_mutex_across_processes_has_no_violation() {
    for backend in ["pg-advisory", "pg-row", "pg-optimistic"] {
        let (_, results, _) = clean_mutex_run(backend);
        let version = results["server_version"].as_str().unwrap();
        assert!(version.starts_with("postgresql "), "{results}");
    }
}

#[test]
fn pg_advisory_latency_is_timed_next_to_select_1() {
    let s = latency_run("pg-advisory", 200);
    assert_eq!(
        s["acquire_round_trips_mean"], 1.0,
        "one round trip per uncontended acquire: {s}"
    );
}

/// ZooKeeper (standalone): 4 processes x 100 x 10 ms, no overlap.
#[test]
fn zookeeper_mutex_across_processes_has_no_violation() {
    let (_, results, _) = clean_mutex_run("zookeeper");
    assert!(
        results["server_version"]
            .as_str()
            .unwrap()
            .starts_with("zookeeper 3."),
        "{results}"
    );
    assert_eq!(results["capabilities"]["token_source"], "czxid");
    assert_eq!(results["capabilities"]["fair"], true);
}

/// The uncontended cycle next to the raw floor (create + delete of an
/// ephemeral-sequential node) and the `zookeeper-client` crate's own
/// recipe, in the same run; our acquire is one round trip.
#[test]
fn zookeeper_latency_is_timed_next_to_the_floor_and_the_crate_recipe() {
    let s = latency_run("zookeeper", 200);
    assert_eq!(
        s["acquire_round_trips_mean"], 1.0,
        "create + pipelined getChildren: {s}"
    );
    let p = &s["peers"]["zookeeper-client"];
    assert!(
        p["cycle"]["p50_us"].as_f64().unwrap() > 0.0,
        "peer missing: {s}"
    );
    assert_eq!(p["cycle"]["count"], 200, "{s}");
}

/// etcd: 4 processes x 100 x 10 ms on one key, no overlap.
#[test]
fn etcd_mutex_across_processes_has_no_violation() {
    let (_, results, _) = clean_mutex_run("etcd");
    let version = results["server_version"].as_str().unwrap();
    assert!(version.starts_with("etcd 3."), "{results}");
    assert_eq!(results["capabilities"]["token_source"], "create_revision");
}

/// etcd: our cycle next to put + delete and etcd's own Lock RPC, in the
/// same run; an uncontended acquire is one round trip.
#[test]
fn etcd_latency_is_timed_next_to_put_delete_and_the_lock_rpc() {
    let s = latency_run("etcd", 200);
    let p = &s["peers"]["etcd-lock-rpc"];
    assert_eq!(p["cycle"]["count"], 200, "{s}");
    assert!(p["ratio"].as_f64().unwrap() > 0.0, "{s}");
    assert_eq!(
        s["acquire_round_trips_mean"], 1.0,
        "one round trip per uncontended acquire: {s}"
    );
}

#[test]
fn the_memory_backend_says_it_cannot_cross_processes() {
    let t = tag("memory");
    let out = lockbench(&["run", "--backend", "memory"], &t);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("memory") && err.contains("process"),
        "the refusal should say why: {err}"
    );
    assert_nothing_left(&t);
}

/// A password given in the config file, in the environment or in
/// `--endpoint` never reaches results.json, history.jsonl or the output.
#[test]
fn no_password_reaches_the_results() {
    let servers =
        lockbench_registry::Servers::start(lockbench_registry::Topology::RedisSingle).unwrap();
    let plain = servers.endpoint().unwrap();
    // Redis 7's default user has no password: AUTH with any password works.
    let with_pw = plain.replacen("redis://", "redis://default:s3cretPW@", 1);
    type Form<'a> = (&'a str, Vec<&'a str>, Option<(&'a str, &'a str)>);
    let forms: [Form; 3] = [
        ("endpoint", vec!["--endpoint", &with_pw], None),
        ("env", vec![], Some(("LOCKBENCH_REDIS_URL", &with_pw))),
        ("file", vec!["--config", "FILE"], None),
    ];
    for (form, extra, env) in forms {
        let t = tag(&format!("pw-{form}-"));
        let dir = out_dir(&t);
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, format!("[redis]\nurl = \"{with_pw}\"\n")).unwrap();
        let mut args = vec![
            "run",
            "--backend",
            "redis",
            "--workload",
            "mutex",
            "--workers",
            "1",
            "--ops",
            "5",
            "--json",
            "--out",
        ];
        args.push(dir.path().to_str().unwrap());
        for a in &extra {
            args.push(if *a == "FILE" {
                cfg.to_str().unwrap()
            } else {
                a
            });
        }
        let mut cmd = Command::new(BIN);
        cmd.args(&args).env("LOCKBENCH_FLEET_TAG", &t);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{form}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut seen = String::from_utf8_lossy(&out.stdout).to_string();
        seen += &String::from_utf8_lossy(&out.stderr);
        for f in ["results.json", "history.jsonl"] {
            seen += &std::fs::read_to_string(dir.path().join(f)).unwrap();
        }
        assert!(!seen.contains("s3cretPW"), "{form}: the password leaked");
        let results = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
        assert!(results.contains("default:***@"), "{form}: {results}");
    }
}

#[test]
fn no_password_of_the_data_store_reaches_the_results() {
    // The ledger's PostgreSQL is the user's own here, a password in its URL
    // (trust authentication: the server never asks for it).
    // Both servers are the user's: a run that starts its own servers
    // starts its own ledger database too.
    let own = own_servers(Some("s3cretPG"));
    let t = tag("pw-data-");
    let dir = out_dir(&t);
    let cfg = own.config.path();
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--workload",
            "ledger",
            "--workers",
            "2",
            "--ops",
            "5",
            "--config",
            cfg.to_str().unwrap(),
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen = String::from_utf8_lossy(&out.stdout).to_string();
    seen += &String::from_utf8_lossy(&out.stderr);
    for f in ["results.json", "history.jsonl"] {
        seen += &std::fs::read_to_string(dir.path().join(f)).unwrap();
    }
    assert!(
        !seen.contains("s3cretPG"),
        "the data store's password leaked"
    );
    let results = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
    assert!(results.contains("postgres:***@"), "{results}");
}

/// A server that refuses every acquire (here a Redis turned into a
/// read-only replica of nothing): the run exits non-zero, and says why
/// with the server's own words; the history says why per event.
#[test]
fn a_run_where_nothing_was_acquired_fails_with_the_reason() {
    let servers =
        lockbench_registry::Servers::start(lockbench_registry::Topology::RedisSingle).unwrap();
    let node = &servers.nodes()[0];
    let st = Command::new("redis-cli")
        .args([
            "-h",
            &node.addr().to_string(),
            "-p",
            &node.port().to_string(),
        ])
        .args(["REPLICAOF", "127.0.0.1", "1"])
        .status()
        .unwrap();
    assert!(st.success());
    let t = tag("refused");
    let dir = out_dir(&t);
    let out = lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--workload",
            "mutex",
            "--workers",
            "2",
            "--ops",
            "3",
            "--wait-ms",
            "200",
            "--endpoint",
            &servers.endpoint().unwrap(),
            "--out",
            dir.path().to_str().unwrap(),
        ],
        &t,
    );
    assert!(
        !out.status.success(),
        "exited 0 though nothing was acquired"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no acquire succeeded") && err.contains("read only replica"),
        "{err}"
    );
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert!(history.contains(r#""kind":"backend""#), "{history}");
    let results = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
    assert!(results.contains("read only replica"), "{results}");
}

/// kill -9 of one worker mid-run: the run goes on with the others and
/// records the death; the dead worker's hold ends at its death, so the
/// lease running out and another worker taking the key is no overlap. Not
/// the run's own fault, so it fails, with its results: it ran a part of
/// what it planned (it said "ok" and exited 0).
#[test]
fn a_killed_worker_is_recorded_and_the_run_goes_on() {
    killed_worker_goes_on("redis", &["--lease-ms", "1000"]);
}

/// The same with a session lock: the kill frees it at once (the server sees
/// the connection close), and the rival that takes it right after is no
/// second holder. The death must be stamped before that rival's acquire:
/// stamped from the worker's pipe, 5 of 20 such runs read 1 overlap (the
/// rival up to 3 ms ahead of the stamp); see `harness::alive`.
#[test]
fn a_killed_session_lock_holder_is_no_second_holder_at_its_death() {
    killed_worker_goes_on("pg-advisory", &[]);
}

fn killed_worker_goes_on(backend: &str, extra: &[&str]) {
    let t = tag(&format!("killed-{backend}"));
    let dir = out_dir(&t);
    let child = Command::new(BIN)
        .args([
            "run",
            "--backend",
            backend,
            "--workload",
            "mutex",
            "--workers",
            "3",
            "--ops",
            "150",
            "--hold-ms",
            "10",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .args(extra)
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the workers, then kill one of them.
    let t0 = Instant::now();
    let victim = loop {
        let workers: Vec<i32> = tagged_processes(&t)
            .iter()
            .filter(|p| p.ends_with(" worker ") || p.contains(" worker"))
            .filter_map(|p| p.split(':').next()?.parse().ok())
            .collect();
        if workers.len() == 3 || t0.elapsed() > Duration::from_secs(20) {
            break workers.first().copied();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let victim = victim.expect("no worker process appeared");
    std::thread::sleep(Duration::from_millis(800));
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("1 worker(s) died without an injected fault"),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["worker_deaths"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(s["violations"], 0, "{s}");
    assert!(s["ops_ok"].as_u64().unwrap() > 150, "{s}");
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert!(history.contains(r#""op":"exit""#));
    assert_nothing_left(&t);
}

/// A worker that dies with its release in flight (here: 200 ms after its
/// 5th release returned, before recording it, as a kill landing there
/// would): the release it sent let a rival in, and that hand-over is no
/// overlap. The hold ends where the worker let go, and the release is
/// recorded as `info`. Before the worker put its release on disk before
/// sending it, the hold lasted to the death and this run read 1 overlap
/// (CI, once, from a real kill).
#[test]
fn a_worker_dead_with_its_release_in_flight_is_no_second_holder() {
    let t = tag("died-releasing");
    let dir = out_dir(&t);
    let out = Command::new(BIN)
        .args([
            "run",
            "--backend",
            "redis",
            "--workload",
            "mutex",
            "--workers",
            "3",
            "--ops",
            "30",
            "--hold-ms",
            "5",
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .env("LOCKBENCH_FLEET_TAG", &t)
        .env("LOCKBENCH_TEST_DIE_AFTER_RELEASE", "5")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["worker_deaths"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(s["violations"], 0, "{s}");
    // Its 5 and the rivals' 30 each: they went on past its death.
    assert_eq!(s["ops_ok"], 65, "{s}");
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert!(!history.contains(r#""op":"releasing""#), "{history}");
    let orphan: Vec<&str> = history
        .lines()
        .filter(|l| l.contains("before this release's outcome was recorded"))
        .collect();
    assert_eq!(orphan.len(), 1, "{history}");
    assert!(orphan[0].contains(r#""outcome":"info""#), "{}", orphan[0]);
    assert_nothing_left(&t);
}

/// Under `nohup` a hang-up leaves the run going (the SIGHUP handler must
/// not replace the ignore `nohup` set up).
#[test]
fn nohup_keeps_a_run_through_a_hang_up() {
    let t = tag("nohup");
    let dir = out_dir(&t);
    let mut child = Command::new("nohup")
        .arg(BIN)
        .args([
            "run",
            "--backend",
            "redis",
            "--workers",
            "2",
            "--ops",
            "100000",
            "--hold-ms",
            "5",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || tagged_processes(&t).len() >= 4),
        "run never got going"
    );
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        child.try_wait().unwrap().is_none(),
        "a hang-up ended a nohup run"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGINT) };
    assert!(wait_until(Duration::from_secs(10), || child
        .try_wait()
        .unwrap()
        .is_some()));
    assert!(wait_until(Duration::from_secs(5), || tagged_processes(&t).is_empty()));
}
