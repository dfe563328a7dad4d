//! Helpers shared by the end-to-end test files: run the real `lockbench`
//! binary, parse its JSON, and find processes a run left behind.

#![allow(dead_code)] // each test file uses its own subset

use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_lockbench");

/// Runs `lockbench args...` with the fleet tagged `tag`, without the
/// backends' endpoint variables of whoever runs the tests (a
/// `LOCKBENCH_PG_URL` in a developer's shell would point the runs at it).
pub fn lockbench(args: &[&str], tag: &str) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        let backend_var = ["REDIS_", "REDLOCK_", "ZK_", "ETCD_", "PG_"]
            .iter()
            .any(|f| k.starts_with(&format!("LOCKBENCH_{f}")));
        if backend_var {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .env("LOCKBENCH_FLEET_TAG", tag)
        .output()
        .unwrap()
}

/// Runs `lockbench args...`, which must succeed and print JSON.
pub fn json_run(args: &[&str], tag: &str) -> serde_json::Value {
    json_run_logged(args, tag).0
}

/// [`json_run`], with what the run wrote on stderr.
pub fn json_run_logged(args: &[&str], tag: &str) -> (serde_json::Value, String) {
    let out = lockbench(args, tag);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code();
    // 3: a run whose checkers found the lock broken (a negative control, a
    // fault that breaks it), results written all the same.
    let run = args.first() == Some(&"run");
    assert!(
        code == Some(0) || (run && code == Some(3)),
        "lockbench {args:?} failed ({code:?}): {stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    if run {
        // An acquire-crash that left the lock held for good is in the
        // run's results.json, not its summary.
        let out = args
            .iter()
            .position(|a| *a == "--out")
            .and_then(|i| args.get(i + 1));
        let stuck = out.is_some_and(|d| never_freed(std::path::Path::new(d)));
        assert_eq!(
            code == Some(3),
            broken(&json) || stuck,
            "lockbench {args:?} exited {code:?}: 3 exactly when the checkers found the lock broken; {stderr}"
        );
    }
    (json, stderr)
}

/// Whether a run's summary shows the lock broken, by the report's rule
/// (`report::harm`), read from the JSON as a script would: double holders
/// (by the history or the database's clock), lost updates, stale writes
/// the fenced ledger took, tokens that went backwards, a failed flash sale.
pub fn broken(s: &serde_json::Value) -> bool {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    // A curve (`--workers 1,4,16`): broken when any of its points is.
    if let Some(points) = s["points"].as_array() {
        return points.iter().any(|p| n(&p["violations"]) > 0);
    }
    n(&s["violations"]) > 0
        || n(&s["ledger"]["lost_updates"]) > 0
        || (s["ledger"]["fenceable"] == true && n(&s["ledger"]["stale_writes_accepted"]) > 0)
        || n(&s["ledger"]["db_clock"]["violations"]) > 0
        || n(&s["token_regressions"]) > 0
        || s["coupon"]["valid"] == false
}

/// Whether the run in `dir` had an acquire-crash after which the lock was
/// never freed (the fault matrix's "lock never freed"), read from its
/// results.json as a script would.
pub fn never_freed(dir: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read(dir.join("results.json")) else {
        return false;
    };
    let r: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    r["faults"].as_array().is_some_and(|fs| {
        fs.iter().any(|f| {
            f["fault"] == "acquire-crash"
                && f["recovery_ms"].is_null()
                && f["note"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("lock never freed"))
        })
    })
}

/// The `results.json` a run wrote into `dir`.
pub fn results_in(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap()
}

/// Processes (other than us) started for `tag`: workers inherit it in their
/// environment; servers run in the fleet's `lockbench-<tag>-...` dir (their
/// environ and cmdline can't be trusted: redis-server rewrites both for its
/// process title).
pub fn tagged_processes(tag: &str) -> Vec<String> {
    let needle = format!("LOCKBENCH_FLEET_TAG={tag}");
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.chars().all(|c| c.is_ascii_digit()) || name == me {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().next());
        if matches!(state, Some("Z") | Some("X") | None) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{name}/environ")).unwrap_or_default();
        let cwd = std::fs::read_link(format!("/proc/{name}/cwd")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes())
            || cwd.to_string_lossy().contains(&format!("lockbench-{tag}-"))
        {
            let cmd = std::fs::read(format!("/proc/{name}/cmdline")).unwrap_or_default();
            found.push(format!(
                "{name}: {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    found
}

/// Fails naming any process started for `tag` that is still running.
pub fn assert_nothing_left(tag: &str) {
    let left = tagged_processes(tag);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A tag unique to this call: tests run in parallel threads of one
/// process, and each must find only its own processes.
pub fn tag(name: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{name}{}x{n}-", std::process::id())
}

/// A fresh output directory named after the tag.
pub fn out_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(tag).tempdir().unwrap()
}

/// `lockbench run --backend B --workload W extra... --json --out DIR`;
/// checks nothing is left running and returns (summary, results.json).
pub fn run_workload(
    backend: &str,
    workload: &str,
    extra: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let t = tag(&format!("{workload}-{backend}-"));
    let dir = out_dir(&t);
    let mut args = vec!["run", "--backend", backend, "--workload", workload];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", "--out", dir.path().to_str().unwrap()]);
    let (s, stderr) = json_run_logged(&args, &t);
    // The run closes its data pool before it stops the servers; a pool
    // dropped with a connection on its way back made sqlx warn of a
    // "connection reset" on a clean run (in about 1 run in 4).
    assert!(
        !stderr.contains("testing the connection on-release"),
        "the data pool was cut by the servers' stop: {stderr}"
    );
    let left = tagged_processes(&t);
    assert!(left.is_empty(), "left behind: {left:?}");
    (s, results_in(dir.path()))
}

/// A Redis and a PostgreSQL standing in for the user's own servers (a
/// compose fleet, a real cluster), and a `--config` file naming both, the
/// PostgreSQL URL with `pg_password` in it when given (trust
/// authentication: the server never asks for it).
pub struct OwnServers {
    pub redis: fleet::RedisFleet,
    pub pg: fleet::PostgresFleet,
    pub config: tempfile::NamedTempFile,
}

pub fn own_servers(pg_password: Option<&str>) -> OwnServers {
    use std::io::Write as _;
    let redis = fleet::RedisFleet::single().unwrap();
    let pg = fleet::PostgresFleet::start().unwrap();
    let pg_url = match pg_password {
        Some(pw) => pg.url().replacen(
            "postgres://postgres@",
            &format!("postgres://postgres:{pw}@"),
            1,
        ),
        None => pg.url(),
    };
    let mut config = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        config,
        "[redis]\nurl = \"{}\"\n\n[postgres]\nurl = \"{pg_url}\"",
        redis.nodes[0].url()
    )
    .unwrap();
    OwnServers { redis, pg, config }
}
