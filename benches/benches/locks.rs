//! Every registered backend against its raw floor and its peers, in one
//! run, on servers this bench starts itself (see `lockbench_registry::Servers`).
//!
//! How it measures (the machinery is in `lockbench_benches`):
//!
//! - A cycle is the harness's: a waiting acquire (budget: the CLI's default
//!   `--wait-ms`, 10 s; lease renewed by the watchdog), then release.
//! - `floor/<b>`, `uncontended/<b>` and `peer/<b>-<p>` run interleaved
//!   rounds: each round takes one floor round trip, one lock cycle and one
//!   cycle of each peer, in a seeded random order, and each group reports
//!   its own part's time. Every round of the three is kept, and the ratios
//!   printed at the end (lock ÷ floor, lock ÷ peer) are medians of those
//!   rounds, where the parts were taken side by side: criterion times one
//!   figure per benchmark, so its own medians of these groups still come
//!   from runs at different times, each interleaved.
//! - `try_held/<b>`: a try-lock of a key another handle holds (the fast
//!   "no"; a waiting acquire would wait its whole budget).
//! - `contended/<b>/<N>-one-key|<N>-own-keys`: N tasks, each with its own
//!   handle, cycle on one key or a key each for the whole group, counting
//!   on one shared counter; a sample is the cycles counted in a fixed
//!   window (the harness's throughput workload); criterion reports
//!   cycles/s.
//! - Backends, and each backend's groups, run in a random order drawn from
//!   a seed printed first: `LOCKBENCH_BENCH_SEED=<seed>` repeats it.
//!
//! `LOCKBENCH_BENCH_BACKENDS=redis,etcd cargo bench --bench locks` limits
//! the backends; criterion's own filters and flags (`--quick`, `--test`,
//! `--save-baseline`, `--baseline`) work as usual. In test mode (`cargo
//! test --benches`, as CI runs it) every group runs once, a contended
//! group is one cycle of each of two tasks, and no figures are printed.

// criterion's macros and our main are not a public API.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use distlock::{AcquireOptions, DistLock};
use lockbench_benches::rounds::{self, Part, Record, Subject};
use lockbench_benches::window::Contention;
use lockbench_benches::{median, order};
use lockbench_registry::{BuildParams, Descriptor, Servers, BACKENDS};
use serde_json::Value;
use tokio::runtime::Runtime;

const TASKS: &[usize] = &[1, 4, 16, 64];
const UNCONTENDED: &str = "lockbench:bench:uncontended";
const HELD: &str = "lockbench:bench:held";
/// Rounds before criterion starts, unrecorded: connections, script
/// caches, the allocator (the harness's latency workload warms up too).
const WARM_UP_ROUNDS: u64 = 20;
/// A contended call's window is this many times criterion's `iters`.
const SLICE: Duration = Duration::from_millis(25);

/// A group of one backend.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// Interleaved rounds reporting this part.
    Rounds(Part),
    /// Try-lock of a held key.
    TryHeld,
    /// Fixed windows of `tasks` tasks.
    Contended { tasks: usize, one_key: bool },
}

fn keys(one_key: bool) -> &'static str {
    if one_key {
        "one-key"
    } else {
        "own-keys"
    }
}

impl Job {
    fn label(&self, s: &Subject<'_>) -> String {
        match *self {
            Job::Rounds(Part::Lock) => "uncontended".into(),
            Job::Rounds(p @ Part::Peer(_)) => format!("peer {}", s.name(p)),
            Job::Rounds(p) => s.name(p).to_string(),
            Job::TryHeld => "try_held".into(),
            Job::Contended { tasks, one_key } => format!("contended {tasks}-{}", keys(one_key)),
        }
    }
}

/// What the end of the run prints, gathered per backend.
#[derive(Default)]
struct Report {
    /// Per backend: its parts' names and every round.
    rounds: Vec<(&'static str, Vec<String>, Record)>,
    /// Per (backend, tasks, one key): cycles/s of every window, timeouts.
    rates: BTreeMap<(&'static str, usize, bool), (Vec<f64>, u64)>,
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    panic!("{what} failed: {e}")
}

/// One more client of `b` (its own connection/session), without probes.
fn another_handle(
    rt: &Runtime,
    b: &dyn Descriptor,
    cfg: &Value,
) -> Result<Arc<dyn DistLock>, String> {
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: false,
        key: UNCONTENDED.into(),
    };
    rt.block_on(b.connect(cfg, params))
        .map(|c| c.lock)
        .map_err(|e| e.to_string())
}

fn try_held(
    c: &mut Criterion,
    rt: &Runtime,
    name: &'static str,
    lock: &Arc<dyn DistLock>,
    holder: &Arc<dyn DistLock>,
) -> Result<(), String> {
    // Someone else holds the key, for this group only.
    let held = rt
        .block_on(holder.acquire(HELD, AcquireOptions::try_lock()))
        .map_err(|e| e.to_string())?;
    c.benchmark_group("try_held").bench_function(name, |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let t0 = Instant::now();
                for _ in 0..n {
                    match lock.acquire(HELD, AcquireOptions::try_lock()).await {
                        Ok(_) => panic!("{name}: try-lock on a held key succeeded"),
                        Err(distlock::Error::Timeout { .. }) => {}
                        Err(e) => fail("try-lock of a held key", e),
                    }
                }
                t0.elapsed()
            })
        })
    });
    drop(rt.block_on(held.release()));
    Ok(())
}

fn contended(
    c: &mut Criterion,
    rt: &Runtime,
    name: &'static str,
    handles: &[Arc<dyn DistLock>],
    one_key: bool,
    test: bool,
    report: &mut Report,
) {
    let tasks = handles.len();
    // Test mode only checks that the group runs: two tasks contend once
    // each (64 hand-overs of a backing-off lock would take seconds).
    let handles = if test {
        &handles[..tasks.min(2)]
    } else {
        handles
    };
    let mut g = c.benchmark_group(format!("contended/{name}"));
    // A window lasts `iters` slices, so criterion plans as for any routine:
    // about 10 samples of 10 slices.
    g.throughput(Throughput::Elements(1))
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(SLICE * 10)
        .measurement_time(SLICE * 100);
    let (rates, timeouts) = report.rates.entry((name, tasks, one_key)).or_default();
    let key = |i: usize| {
        if one_key {
            "lockbench:bench:contended".to_string()
        } else {
            format!("lockbench:bench:own:{i}")
        }
    };
    // The tasks contend for the whole group, warm-up included; each call
    // only reads the shared counter over its window.
    let contention = {
        let _rt = rt.enter();
        Contention::start(handles, key)
    };
    let id = BenchmarkId::from_parameter(format!("{tasks}-{}", keys(one_key)));
    let mut started = false;
    g.bench_function(id, |b| {
        b.iter_custom(|n| {
            let len = if test {
                Duration::ZERO
            } else {
                SLICE.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
            };
            match rt.block_on(contention.window(len)) {
                Ok(o) => {
                    // The first window met the tasks starting up.
                    if std::mem::replace(&mut started, true) {
                        rates.push(o.rate());
                    }
                    *timeouts += o.timeouts;
                    o.time_for(n)
                }
                Err(e) => fail("contended cycle", e),
            }
        })
    });
    g.finish();
    if let Err(e) = rt.block_on(contention.stop()) {
        fail("contended cycle", e);
    }
}

fn bench_backend(
    c: &mut Criterion,
    rt: &Runtime,
    b: &dyn Descriptor,
    cfg: &Value,
    seed: u64,
    test: bool,
    report: &mut Report,
) -> Result<(), String> {
    let name = b.name();
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: true,
        key: UNCONTENDED.into(),
    };
    let connected = rt
        .block_on(b.connect(cfg, params))
        .map_err(|e| e.to_string())?;
    let lock = connected.lock.clone();
    let subject = Subject {
        lock: &*lock,
        key: UNCONTENDED,
        floor: connected.probes.floor.as_deref(),
        peers: connected
            .probes
            .peers
            .iter()
            .map(|(n, p)| (n.as_str(), p.as_ref()))
            .collect(),
    };
    rt.block_on(rounds::run(
        &subject,
        &mut order::rng(seed, &format!("warm-up/{name}")),
        if test { 1 } else { WARM_UP_ROUNDS },
        Part::Lock,
        None,
    ))
    .map_err(|e| format!("warm-up: {e}"))?;
    let mut handles: Vec<Arc<dyn DistLock>> = vec![lock.clone()];
    let max = TASKS.iter().copied().max().unwrap_or(1).max(2);
    while handles.len() < max {
        handles.push(another_handle(rt, b, cfg)?);
    }
    let mut jobs: Vec<Job> = subject.parts().into_iter().map(Job::Rounds).collect();
    jobs.push(Job::TryHeld);
    for &tasks in TASKS {
        for one_key in [true, false] {
            jobs.push(Job::Contended { tasks, one_key });
        }
    }
    let jobs = order::shuffled(jobs, seed, &format!("groups/{name}"));
    let labels: Vec<String> = jobs.iter().map(|j| j.label(&subject)).collect();
    println!("{name}: groups in this order: {}", labels.join(", "));
    let mut record = Record::default();
    for job in jobs {
        match job {
            Job::Rounds(part) => {
                let (group, id) = match part {
                    Part::Floor => ("floor", name.to_string()),
                    Part::Lock => ("uncontended", name.to_string()),
                    Part::Peer(_) => ("peer", format!("{name}-{}", subject.name(part))),
                };
                let mut rng = order::rng(seed, &format!("{group}/{id}"));
                c.benchmark_group(group).bench_function(id, |bch| {
                    bch.iter_custom(|n| {
                        rt.block_on(rounds::run(&subject, &mut rng, n, part, Some(&mut record)))
                            .unwrap_or_else(|e| fail("interleaved round", e))
                    })
                });
            }
            // The holder is another handle: the lock under test must be
            // refused by someone else, not by itself.
            Job::TryHeld => try_held(c, rt, name, &lock, &handles[1])?,
            Job::Contended { tasks, one_key } => {
                contended(c, rt, name, &handles[..tasks], one_key, test, report);
            }
        }
    }
    let parts = subject
        .parts()
        .into_iter()
        .map(|p| subject.name(p).to_string())
        .collect();
    report.rounds.push((name, parts, record));
    Ok(())
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let test = lockbench_benches::test_mode();
    let seed = match order::seed() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
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
    let backends: Vec<&'static dyn Descriptor> = BACKENDS
        .iter()
        .copied()
        .filter(|b| !b.negative_control() && b.distributed())
        .filter(|b| match &only {
            Some(o) => o.iter().any(|n| n == b.name()),
            None => true,
        })
        .collect();
    let backends = order::shuffled(backends, seed, "backends");
    println!(
        "order seed {seed} ({}={seed} repeats it); backends in this order: {}",
        order::SEED_VAR,
        backends
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut report = Report::default();
    for b in backends {
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
        if let Err(e) = bench_backend(&mut c, &rt, b, &cfg, seed, test, &mut report) {
            println!("skipping {}: {e}", b.name());
        }
        drop(servers);
    }
    c.final_summary();
    if test {
        println!("\n(test mode: every group ran once; no figures)");
    } else {
        targets::print(&report, seed);
    }
}

/// Issue #8's targets, from this run's interleaved rounds and windows.
mod targets {
    use super::*;

    fn line(what: &str, x: f64, y: f64, target: &str, ok: Option<bool>) {
        let r = x / y;
        let verdict = match ok {
            Some(true) => format!("target {target:<10} met"),
            Some(false) => format!("target {target:<10} MISSED"),
            None => format!("({target})"),
        };
        println!(
            "  {what:<48} {:>9.1} µs / {:>9.1} µs = {r:>5.2}x  {verdict}",
            x / 1000.0,
            y / 1000.0,
        );
    }

    /// The target a peer is held to (see the README's table).
    fn peer_target(backend: &str, peer: &str) -> (&'static str, f64) {
        if backend == "redlock" && peer == "redis" {
            // One of its own masters alone, in the same fleet.
            ("<= 1.3x", 1.3)
        } else if peer == "write-floor" {
            // Not a rival: the floor of a lock that writes a row twice.
            ("<= 1.15x", 1.15)
        } else {
            ("<= 1x", 1.0)
        }
    }

    pub fn print(report: &Report, seed: u64) {
        println!(
            "\ntargets (order seed {seed}): medians of each backend's interleaved rounds \
             (floor, lock cycle and peers side by side, in a random order per round); \
             the paired column is the median of the per-round ratios"
        );
        let mut lock_median: BTreeMap<&str, f64> = BTreeMap::new();
        let mut floor_median: BTreeMap<&str, f64> = BTreeMap::new();
        for (name, parts, record) in &report.rounds {
            if record.is_empty() {
                continue;
            }
            let col = |p: &str| parts.iter().position(|n| n == p);
            let Some(lock) = col("lock") else { continue };
            let Some(lock_ns) = record.median(lock) else {
                continue;
            };
            lock_median.insert(name, lock_ns);
            println!("  {name} ({} rounds)", record.len());
            for (i, part) in parts.iter().enumerate() {
                if i == lock {
                    continue;
                }
                let Some(ns) = record.median(i) else { continue };
                let paired = record.paired_ratio_ci(lock, i);
                let (what, (target, max)) = if part == "floor" {
                    floor_median.insert(name, ns);
                    (
                        format!("uncontended/{name} vs floor/{name}"),
                        ("<= 1.15x", 1.15),
                    )
                } else {
                    (
                        format!("uncontended/{name} vs peer {part}"),
                        peer_target(name, part),
                    )
                };
                line(&what, lock_ns, ns, target, Some(lock_ns / ns <= max));
                // The call rests on the paired ratio's interval: within the
                // target as a whole, beyond it as a whole, or straddling it.
                match paired {
                    Some(harness::stats::MedianEstimate {
                        median_us: m,
                        ci95_low_us: Some(lo),
                        ci95_high_us: Some(hi),
                        count,
                    }) => {
                        let call = if hi <= max {
                            "met"
                        } else if lo > max {
                            "missed"
                        } else {
                            "inconclusive"
                        };
                        println!(
                            "  {:<48} paired {m:>5.2}x [95 % {lo:.2}–{hi:.2}, {count} rounds]  target {target}: {call}",
                            ""
                        );
                    }
                    Some(e) => println!(
                        "  {:<48} paired {:>5.2}x (too few rounds for an interval)",
                        "", e.median_us
                    ),
                    None => {}
                }
            }
        }
        println!("  across backends (separate fleets, not interleaved):");
        if let (Some(&a), Some(&b)) = (lock_median.get("redlock"), lock_median.get("redis")) {
            line(
                "uncontended/redlock vs uncontended/redis",
                a,
                b,
                "<= 1.3x",
                Some(a / b <= 1.3),
            );
        }
        if let (Some(&a), Some(&b)) = (floor_median.get("redlock"), floor_median.get("redis")) {
            line(
                "floor/redlock vs floor/redis",
                a,
                b,
                "what 5 masters cost this machine before any lock",
                None,
            );
        }
        for (one_key, title) in [
            (false, "own keys (no contention): where cycles/s stop growing with tasks, the server or the machine saturates"),
            (true, "one key (contended): cycles/s by tasks"),
        ] {
            println!("  {title}");
            let names: Vec<&str> = report.rounds.iter().map(|(n, _, _)| *n).collect();
            for name in names {
                let mut timeouts = 0;
                let rates: Vec<String> = TASKS
                    .iter()
                    .filter_map(|&t| {
                        let (rates, to) = report.rates.get(&(name, t, one_key))?;
                        timeouts += to;
                        let mut r = rates.clone();
                        median(&mut r).map(|r| format!("{t:>2}: {r:>6.0}/s"))
                    })
                    .collect();
                if !rates.is_empty() {
                    let to = if timeouts > 0 {
                        format!("  ({timeouts} acquires ran out of their wait)")
                    } else {
                        String::new()
                    };
                    println!("    {name:<14} {}{to}", rates.join("  "));
                }
            }
        }
    }
}
