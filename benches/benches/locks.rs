//! Every registered backend against its raw floor and its peers, in one
//! run, on servers this bench starts itself (see `lockbench_registry::Servers`).
//!
//! Groups: `floor/<backend>`, `uncontended/<backend>`, `try_held/<backend>`,
//! `contended/<backend>/<tasks>-one-key|<tasks>-own-keys` (cycles/s) and
//! `peer/<backend>-<peer>`. After criterion's own report the targets of
//! issue #8 are printed as ratios of medians from this same run.
//!
//! `LOCKBENCH_BENCH_BACKENDS=redis,etcd cargo bench --bench locks` limits
//! the backends; criterion's own filters and flags (`--quick`, `--test`,
//! `--save-baseline`, `--baseline`) work as usual.

// criterion's macros and our main are not a public API.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use distlock::{AcquireOptions, DistLock};
use lockbench_registry::{BuildParams, Descriptor, Servers, BACKENDS};
use serde_json::Value;
use tokio::runtime::Runtime;

const TASKS: &[usize] = &[1, 4, 16, 64];

fn wait() -> AcquireOptions {
    AcquireOptions {
        wait: Some(Duration::from_secs(30)),
        lease: None,
    }
}

/// `iters` operations of `op`, timed as one batch (criterion divides).
fn timed<F, Fut>(rt: &Runtime, iters: u64, mut op: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = distlock::Result<()>>,
{
    rt.block_on(async {
        let t0 = Instant::now();
        for _ in 0..iters {
            if let Err(e) = op().await {
                panic!("bench operation failed: {e}");
            }
        }
        t0.elapsed()
    })
}

async fn cycle(lock: &dyn DistLock, key: &str, opts: AcquireOptions) -> distlock::Result<()> {
    let g = lock.acquire(key, opts).await?;
    black_box(g.token());
    g.release().await?;
    Ok(())
}

/// `iters` cycles shared by `handles.len()` tasks, each with its own lock
/// handle (reentrancy is per handle), on one key or on a key each.
fn contended(rt: &Runtime, handles: &[Arc<dyn DistLock>], one_key: bool, iters: u64) -> Duration {
    let n = handles.len() as u64;
    rt.block_on(async {
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, h) in handles.iter().enumerate() {
            let share = iters / n + u64::from((i as u64) < iters % n);
            let key = if one_key {
                "lockbench:bench:contended".to_string()
            } else {
                format!("lockbench:bench:own:{i}")
            };
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..share {
                    cycle(&*h, &key, wait()).await?;
                }
                Ok::<(), distlock::Error>(())
            }));
        }
        for t in tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("contended cycle failed: {e}"),
                Err(e) => panic!("contended task died: {e}"),
            }
        }
        t0.elapsed()
    })
}

/// One more client of `name` (its own connection/session), without probes.
fn another_handle(
    rt: &Runtime,
    b: &dyn Descriptor,
    cfg: &Value,
) -> Result<Arc<dyn DistLock>, String> {
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: false,
        key: "lockbench:bench:uncontended".into(),
    };
    rt.block_on(b.connect(cfg, params))
        .map(|c| c.lock)
        .map_err(|e| e.to_string())
}

fn bench_backend(
    c: &mut Criterion,
    rt: &Runtime,
    b: &dyn Descriptor,
    cfg: &Value,
) -> Result<(), String> {
    let name = b.name();
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: true,
        key: "lockbench:bench:uncontended".into(),
    };
    let connected = rt
        .block_on(b.connect(cfg, params))
        .map_err(|e| e.to_string())?;
    let lock = connected.lock.clone();
    if let Some(floor) = &connected.probes.floor {
        c.benchmark_group("floor")
            .bench_function(name, |b| b.iter_custom(|n| timed(rt, n, || floor.once())));
    }
    c.benchmark_group("uncontended").bench_function(name, |b| {
        b.iter_custom(|n| {
            timed(rt, n, || {
                cycle(
                    &*lock,
                    "lockbench:bench:uncontended",
                    AcquireOptions::try_lock(),
                )
            })
        })
    });
    // Someone else holds the key: the fast "no" path.
    let other = another_handle(rt, b, cfg)?;
    let held = rt
        .block_on(other.acquire("lockbench:bench:held", AcquireOptions::try_lock()))
        .map_err(|e| e.to_string())?;
    c.benchmark_group("try_held").bench_function(name, |b| {
        b.iter_custom(|n| {
            timed(rt, n, || async {
                match lock
                    .acquire("lockbench:bench:held", AcquireOptions::try_lock())
                    .await
                {
                    Ok(_) => panic!("{name}: try-lock on a held key succeeded"),
                    Err(distlock::Error::Timeout { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            })
        })
    });
    drop(rt.block_on(held.release()));
    for (peer, probe) in &connected.probes.peers {
        c.benchmark_group("peer")
            .bench_function(format!("{name}-{peer}"), |b| {
                b.iter_custom(|n| timed(rt, n, || probe.once()))
            });
    }
    let mut handles: Vec<Arc<dyn DistLock>> = vec![lock.clone()];
    let max = TASKS.iter().copied().max().unwrap_or(1);
    while handles.len() < max {
        handles.push(another_handle(rt, b, cfg)?);
    }
    let mut g = c.benchmark_group(format!("contended/{name}"));
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    for &tasks in TASKS {
        for one_key in [true, false] {
            let id = BenchmarkId::from_parameter(format!(
                "{tasks}-{}",
                if one_key { "one-key" } else { "own-keys" }
            ));
            g.bench_function(id, |b| {
                b.iter_custom(|n| contended(rt, &handles[..tasks], one_key, n))
            });
        }
    }
    g.finish();
    Ok(())
}

fn main() {
    let started = std::time::SystemTime::now();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let only: Option<Vec<String>> = std::env::var("LOCKBENCH_BENCH_BACKENDS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    for b in BACKENDS
        .iter()
        .filter(|b| !b.negative_control() && b.distributed())
    {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == b.name()))
        {
            continue;
        }
        // Fresh servers per backend: never time against one a previous
        // bench (or backend) left behind.
        let servers = match Servers::start(b.topology()) {
            Ok(s) => s,
            Err(e) => {
                println!("skipping {}: {e}", b.name());
                continue;
            }
        };
        let cfg = match b.settings(None).and_then(|mut cfg| {
            if let Some(ep) = servers.endpoint() {
                b.set_endpoint(&mut cfg, &ep)?;
            }
            Ok(cfg)
        }) {
            Ok(cfg) => cfg,
            Err(e) => {
                println!("skipping {}: {e}", b.name());
                continue;
            }
        };
        if let Err(e) = bench_backend(&mut c, &rt, *b, &cfg) {
            println!("skipping {}: {e}", b.name());
        }
        drop(servers);
    }
    c.final_summary();
    targets::print(started);
}

/// Issue #8's targets, as ratios of criterion medians from this run.
mod targets {
    use super::*;

    fn root() -> PathBuf {
        if let Ok(d) = std::env::var("CRITERION_HOME") {
            return PathBuf::from(d);
        }
        let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
            // cargo runs benches from the package dir; the workspace's
            // target dir is one level up.
            |_| PathBuf::from("../target"),
            PathBuf::from,
        );
        target.join("criterion")
    }

    /// Median ns of `group/id` from this run's estimates (files an
    /// earlier run left are ignored).
    fn median(path: &str, since: std::time::SystemTime) -> Option<f64> {
        let p = root().join(path).join("new/estimates.json");
        if std::fs::metadata(&p).and_then(|m| m.modified()).ok()? < since {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).ok()?).ok()?;
        v.pointer("/median/point_estimate")?.as_f64()
    }

    fn line(
        since: std::time::SystemTime,
        what: &str,
        a: &str,
        b: &str,
        target: &str,
        ok: Option<&dyn Fn(f64) -> bool>,
    ) {
        if let (Some(x), Some(y)) = (median(a, since), median(b, since)) {
            let r = x / y;
            let verdict = match ok {
                Some(ok) if ok(r) => format!("target {target:<10} met"),
                Some(_) => format!("target {target:<10} MISSED"),
                None => format!("({target})"),
            };
            println!(
                "  {what:<48} {:>9.1} µs / {:>9.1} µs = {r:>5.2}x  {verdict}",
                x / 1000.0,
                y / 1000.0,
            );
        }
    }

    pub fn print(since: std::time::SystemTime) {
        println!("\ntargets (medians of this run; ratios only mean something within one run):");
        let any = BACKENDS
            .iter()
            .any(|b| median(&format!("uncontended/{}", b.name()), since).is_some());
        if !any {
            println!(
                "  no estimates from this run under {} (test mode?)",
                root().display()
            );
            return;
        }
        for b in BACKENDS
            .iter()
            .filter(|b| !b.negative_control() && b.distributed())
        {
            let n = b.name();
            line(
                since,
                &format!("uncontended/{n} vs floor/{n}"),
                &format!("uncontended/{n}"),
                &format!("floor/{n}"),
                "<= 1.15x",
                Some(&|r| r <= 1.15),
            );
        }
        line(
            since,
            "uncontended/redlock vs uncontended/redis",
            "uncontended/redlock",
            "uncontended/redis",
            "<= 1.3x",
            Some(&|r| r <= 1.3),
        );
        line(
            since,
            "floor/redlock vs floor/redis",
            "floor/redlock",
            "floor/redis",
            "what 5 masters cost this machine before any lock",
            None,
        );
        for b in BACKENDS
            .iter()
            .filter(|b| !b.negative_control() && b.distributed())
        {
            let dir = root().join("peer");
            let Ok(rd) = std::fs::read_dir(&dir) else {
                break;
            };
            for e in rd.flatten() {
                let id = e.file_name().to_string_lossy().to_string();
                let Some(peer) = id.strip_prefix(&format!("{}-", b.name())) else {
                    continue;
                };
                let what = format!("uncontended/{} vs peer {peer}", b.name());
                let (a, p) = (format!("uncontended/{}", b.name()), format!("peer/{id}"));
                if b.name() == "redlock" && peer == "redis" {
                    // One of its own masters alone, in the same fleet.
                    line(since, &what, &a, &p, "<= 1.3x", Some(&|r| r <= 1.3));
                } else if peer == "write-floor" {
                    // Not a rival: the floor of a lock that writes a row twice.
                    line(since, &what, &a, &p, "<= 1.15x", Some(&|r| r <= 1.15));
                } else {
                    line(since, &what, &a, &p, "<= 1x", Some(&|r| r <= 1.0));
                }
            }
        }
        for (keys, title) in [
            ("own-keys", "own keys (no contention): where cycles/s stop growing with tasks, the server or the machine saturates"),
            ("one-key", "one key (contended): cycles/s by tasks"),
        ] {
            println!("  {title}");
            for b in BACKENDS
        .iter()
        .filter(|b| !b.negative_control() && b.distributed()) {
                // criterion turns the '/' of a group name into '_' on disk.
                let rates: Vec<String> = TASKS
                    .iter()
                    .filter_map(|t| {
                        median(&format!("contended_{}/{t}-{keys}", b.name()), since)
                            .map(|ns| format!("{t:>2}: {:>6.0}/s", 1e9 / ns))
                    })
                    .collect();
                if !rates.is_empty() {
                    println!("    {:<14} {}", b.name(), rates.join("  "));
                }
            }
        }
    }
}
