//! `lockbench run --metrics-addr`: the workers' lock metrics scraped over
//! HTTP while the run goes, against a real Redis the run starts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_nothing_left, out_dir, tag, tagged_processes, BIN};

/// `GET path` over plain HTTP/1.1: (status, body).
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split(' ').nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// The sample names (with their `outcome` / `reason` label) on a page.
fn names(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter(|l| l.starts_with("lockbench_"))
        .map(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or_default();
            let label = ["outcome", "reason"].iter().find_map(|k| {
                let at = l.find(&format!("{k}=\""))?;
                let v = &l[at + k.len() + 2..];
                Some(format!("{{{k}={}}}", &v[..v.find('"')?]))
            });
            format!("{name}{}", label.unwrap_or_default())
        })
        .collect()
}

/// Runs `lockbench run extra..` with `--metrics-addr 127.0.0.1:0`, scraping
/// every 100 ms until it ends: every name seen, and the pages.
fn scrape_run(extra: &[&str]) -> (BTreeSet<String>, Vec<String>) {
    let t = tag("metrics-");
    let dir = out_dir(&t);
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--backend",
            "redis",
            "--workload",
            "mutex",
            "--quiet",
        ])
        .args(extra)
        .args(["--metrics-addr", "127.0.0.1:0", "--out"])
        .arg(dir.path())
        .env("LOCKBENCH_FLEET_TAG", &t)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no metrics line");
        if let Some(rest) = line.strip_prefix("metrics: http://") {
            break rest.split('/').next().unwrap().to_string();
        }
    };
    // Keep stderr drained so the run never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let (status, _) = get(&addr, "/nothing").unwrap();
    assert_eq!(status, 404);
    let mut seen = BTreeSet::new();
    let mut pages = Vec::new();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the run did not end"
        );
        if let Some((200, page)) = get(&addr, "/metrics") {
            seen.extend(names(&page));
            pages.push(page);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The page is for the length of the run only.
    assert!(
        TcpStream::connect(&addr).is_err(),
        "still served after the run"
    );
    assert!(tagged_processes(&t).is_empty(), "left running");
    (seen, pages)
}

/// A holder whose server pauses for 2 s in the middle of a 2 s hold: its
/// watchdog (300 ms lease) renews, then fails, the lock is lost, the other
/// worker's acquire (a 1.5 s budget, so it cannot wait the pause out)
/// ends unanswered. A fixed 50 ms lease held for
/// 100 ms: lost on expiry, and the unlock finds it gone.
#[test]
fn a_run_serves_every_lock_metric_while_it_goes() {
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        "[redis]\nwatchdog_lease_ms = 300\nop_timeout_ms = 200\n",
    )
    .unwrap();
    let (paused, pages) = scrape_run(&[
        "--workers",
        "2",
        "--ops",
        "2",
        "--hold-ms",
        "2000",
        "--wait-ms",
        "1500",
        "--config",
        cfg.path().to_str().unwrap(),
        "--fault",
        "node-pause",
        "--fault-at",
        "1",
        "--fault-duration",
        "2",
    ]);
    let page = pages.last().unwrap();
    // One family, one TYPE line, samples of both workers under it.
    assert_eq!(
        page.matches("# TYPE lockbench_acquires_total counter")
            .count(),
        1,
        "{page}"
    );
    assert!(
        page.contains("worker=\"0\"") && page.contains("worker=\"1\""),
        "{page}"
    );
    assert!(page.contains("backend=\"redis\""), "{page}");
    let (expired, _) = scrape_run(&[
        "--workers",
        "2",
        "--ops",
        "15",
        "--hold-ms",
        "100",
        "--lease-ms",
        "50",
    ]);
    let all: BTreeSet<String> = paused.union(&expired).cloned().collect();
    for want in [
        "lockbench_acquire_latency_seconds",
        "lockbench_acquire_wait_seconds",
        "lockbench_acquires_total{outcome=ok}",
        "lockbench_acquires_total{outcome=indeterminate}",
        "lockbench_hold_seconds",
        "lockbench_renewals_total",
        "lockbench_renewal_failures_total",
        "lockbench_lost_total{reason=renewal_failed}",
        "lockbench_lost_total{reason=expired}",
        "lockbench_unlock_gone_total",
    ] {
        assert!(all.contains(want), "{want} never scraped; seen {all:?}");
    }
}

#[test]
fn a_bad_metrics_address_is_refused_at_once() {
    let t = tag("metrics-bad-");
    let start = Instant::now();
    let out = common::lockbench(
        &[
            "run",
            "--backend",
            "redis",
            "--metrics-addr",
            "10.1.2.3:9100",
        ],
        &t,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--metrics-addr") && err.contains("loopback"),
        "{err}"
    );
    // A port already taken names the flag too.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = common::lockbench(&["run", "--backend", "redis", "--metrics-addr", &addr], &t);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--metrics-addr") && err.contains(&addr),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_nothing_left(&t);
}
