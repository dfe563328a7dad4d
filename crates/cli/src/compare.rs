//! `lockbench compare`: the default comparison suite. Every registered
//! backend runs the same workloads against servers started for it; tables
//! on stdout, `comparison.json` and a self-contained `index.html`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use harness::spec::{LockScope, Ordering, Strategy};
use harness::summary::Summary;
use harness::Workload;
use report::{Comparison, Row, SaleRun};

use crate::run::{execute, timestamp, RunArgs};
use lockbench_registry::BACKENDS;

/// Options of `lockbench compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Only these backends (comma-separated) [default: all registered].
    /// The flash-sale baselines and lock-scope variants run when `redis`
    /// is among them.
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// TOML config file passed to every run (see `lockbench run --help`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Output directory [default: reports/<timestamp>-compare].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds of each throughput run.
    #[arg(long, default_value_t = 3.0)]
    throughput_secs: f64,
    /// The fault phase: `none`; `quick` (every backend: holder-kill,
    /// holder-pause on the ledger, a 5 s node-pause, the Redis failover
    /// drill, RedLock's workers cut from two masters and a majority of its
    /// masters' clocks jumped, each control's own fault; the whole default suite, faults included, took under 12
    /// minutes on 2 cores);
    /// `full` (quick, plus node-kill, and a minority partition and pause
    /// of the 3-member etcd and ZooKeeper ensembles).
    #[arg(long, value_enum, default_value = "quick")]
    faults: FaultLevel,
    /// Repeats of the performance runs (latency, one hot key, a key each)
    /// per durability profile, each on fresh servers, with the backend
    /// order rotated every repeat. Headlines name a winner only when the
    /// 95 % interval over the repeats excludes a tie and the gap is larger
    /// than the A/A pair's (the first backend run twice as two entries).
    /// 1 disables the intervals.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeats: u32,
    /// Durability profiles of the performance runs: `both` (the price of
    /// durability side by side), `durable` (Redis AOF with fsync on every
    /// write; ZooKeeper, etcd, PostgreSQL flushing as shipped) or
    /// `volatile` (Redis without persistence, etcd --unsafe-no-fsync,
    /// ZooKeeper forceSync=no, PostgreSQL synchronous_commit=off). The
    /// safety runs (ledger, flash sale, faults) always run durable.
    #[arg(long, value_enum, default_value = "both")]
    durability: DurabilityLevel,
    /// Worker-process counts of the scaling phase (comma-separated), or
    /// `none`: every backend's throughput on one key and on a key each at
    /// each count, `--scaling-secs` each, durable, on fresh servers. The
    /// report draws the curve.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    scaling: Vec<String>,
    /// Seconds of each scaling run.
    #[arg(long, default_value_t = 2.0)]
    scaling_secs: f64,
}

/// The worker counts of `--scaling`: none for `none`; a clear error for
/// anything that is not a count from 1 to 256.
fn scaling_counts(list: &[String]) -> anyhow::Result<Vec<u32>> {
    if list.iter().any(|s| s.trim() == "none") {
        return Ok(Vec::new());
    }
    let counts = list
        .iter()
        .map(|s| match s.trim().parse::<u32>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => anyhow::bail!("--scaling: `{s}` is not a worker count from 1 to 256 (or `none`)"),
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    for (i, n) in counts.iter().enumerate() {
        anyhow::ensure!(!counts[..i].contains(n), "--scaling: {n} is listed twice");
    }
    Ok(counts)
}

/// A run length in seconds: above 0 and at most a run's hard limit.
fn seconds(flag: &str, v: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        v.is_finite() && v > 0.0 && v <= 600.0,
        "{flag} must be above 0 and at most 600 s, got {v}"
    );
    Ok(())
}

/// The scaling phase: for each backend and worker count, a throughput run
/// on one key and one on a key each. A failed run is recorded in its
/// point, not fatal. Each point goes into `c` as it finishes.
async fn scaling_phase(args: &CompareArgs, counts: &[u32], out: &Path, c: &mut Comparison) {
    let backends: Vec<String> = c
        .rows
        .iter()
        .filter(|r| !r.negative_control)
        .map(|r| r.backend.clone())
        .collect();
    let total = backends.len() * counts.len() * 2;
    let mut done = 0;
    for b in &backends {
        let b = b.as_str();
        for &n in counts {
            let mut p = report::ScalePoint {
                backend: b.to_string(),
                workers: n,
                ..Default::default()
            };
            for (keys, w) in [(1, "one-key"), (n, "key-each")] {
                done += 1;
                eprintln!("== scaling: {b}, {n} workers, {w} (run {done}/{total})");
                let mut a = RunArgs::for_compare(
                    b,
                    Workload::Throughput,
                    out.join(format!("scale-{b}-{n}-{w}")),
                    args.config.clone(),
                );
                a.workers = Some(n);
                a.keys = keys;
                a.duration = Some(args.scaling_secs);
                let s = match crate::output::sound(execute(&a).await) {
                    Ok((s, _)) => s,
                    Err(e) => {
                        p.failures
                            .push(format!("{w}: {}", crate::output::causes(&e)));
                        continue;
                    }
                };
                if keys == 1 {
                    p.one_key_per_s = Some(s.throughput_per_s);
                    p.handovers_per_s = handovers_per_s(&s);
                    p.acquire_p99_us = shown_p99(&s.acquire);
                    p.handover_p50_us = s.handover.as_ref().map(|h| h.p50_us);
                    p.handover_p99_us = s.handover.as_ref().and_then(shown_p99);
                    p.round_trips_per_acquire = Some(s.acquire_round_trips_mean);
                    p.acquire_spread = s
                        .fairness
                        .as_ref()
                        .and_then(|f| harness::handover::spread(&f.acquires_by_worker));
                    p.fairness = s.fairness.clone();
                    p.servers_cpu_us_per_cycle =
                        s.cpu.as_ref().and_then(|c| c.servers_us_per_cycle);
                    p.workers_cpu_us_per_cycle =
                        s.cpu.as_ref().and_then(|c| c.workers_us_per_cycle);
                } else {
                    p.key_each_per_s = Some(s.throughput_per_s);
                }
            }
            c.scaling.push(p);
            // A comparison cut short here keeps the points it finished.
            progress(out, c, "the scaling runs");
        }
    }
}

/// A p99 only where it rests on enough samples to mean one.
fn shown_p99(p: &harness::summary::Percentiles) -> Option<f64> {
    (p.count >= harness::summary::P99_MIN_COUNT).then_some(p.p99_us)
}

/// `lockbench compare --durability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityLevel {
    /// Durable, then volatile.
    Both,
    /// Durable only (volatile marked "not run").
    Durable,
    /// Volatile only (durable marked "not run").
    Volatile,
}

impl DurabilityLevel {
    fn runs(self, d: fleet::Durability) -> bool {
        match self {
            DurabilityLevel::Both => true,
            DurabilityLevel::Durable => d == fleet::Durability::Durable,
            DurabilityLevel::Volatile => d == fleet::Durability::Volatile,
        }
    }
}

/// `lockbench compare --faults`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultLevel {
    /// No fault phase.
    None,
    /// Each backend's applicable faults once.
    Quick,
    /// Quick, plus node-kill and ensemble minority faults.
    Full,
}

/// The fault runs that apply to `b`: (fault, how it runs, its arguments).
fn fault_runs(
    b: &dyn lockbench_registry::Descriptor,
    level: FaultLevel,
    out: &Path,
    cfg: &Option<PathBuf>,
) -> Vec<(String, String, RunArgs, Option<report::LockTimeout>)> {
    use crate::nemesis::{FaultKind, NodeTarget};
    let mut runs = Vec::new();
    if level == FaultLevel::None {
        return runs;
    }
    let name = b.name();
    let lease = b.capabilities().renewal.then_some(1000);
    let mut add =
        |fault: FaultKind, workload: Workload, setup: &str, set: &dyn Fn(&mut RunArgs)| {
            let label = fault.cli_name();
            let dir = out.join(format!("{name}-fault-{label}-{}", runs.len()));
            let mut a = RunArgs::for_compare(name, workload, dir, cfg.clone());
            a.fault = Some(fault);
            a.fault_at = 1.0;
            a.lease_ms = lease;
            set(&mut a);
            let timeout = lock_timeout(b, a.lease_ms);
            let mut how = format!("{setup}; fault at {} s", a.fault_at);
            if let Some(l) = a.lease_ms {
                how += &format!(", lease {l} ms");
            }
            runs.push((label, how, a, timeout));
        };
    // Each control meets the fault that breaks it (the short lease breaks
    // without one).
    if b.negative_control() {
        if b.crash_point().is_some() {
            add(
                FaultKind::AcquireCrash,
                Workload::Mutex,
                "mutex, 3 workers for 3 s, wait 200 ms",
                &|a| {
                    a.workers = Some(3);
                    a.duration = Some(3.0);
                    a.wait_ms = 200;
                    a.fault_at = 0.5;
                },
            );
        }
        if b.pause_point().is_some() {
            add(
                FaultKind::HolderPause,
                Workload::Mutex,
                "mutex, 4 workers x 6 x 500 ms, paused between GET and DEL for 2 x lease",
                &|a| {
                    a.workers = Some(4);
                    a.ops = Some(6);
                    a.hold_ms = Some(500);
                    a.fault_at = 0.5;
                },
            );
        }
        return runs;
    }
    add(
        FaultKind::HolderKill,
        Workload::Mutex,
        "mutex, 4 workers x 60 x 10 ms",
        &|a| {
            a.workers = Some(4);
            a.ops = Some(60);
        },
    );
    add(
        FaultKind::HolderPause,
        Workload::Ledger,
        "ledger, 4 workers x 100 x 10 ms, holder paused 3 s (3 x the lease)",
        &|a| a.fault_duration = Some(3.0),
    );
    add(
        FaultKind::NodePause,
        Workload::Mutex,
        "mutex, 4 workers for 8 s, every server paused 5 s",
        &|a| {
            a.workers = Some(4);
            a.duration = Some(8.0);
            a.fault_duration = Some(5.0);
        },
    );
    let failover_topology = if b.sentinel_topology().is_some() {
        Some(crate::args::TopologyChoice::Sentinel)
    } else if matches!(
        b.topology(),
        lockbench_registry::Topology::RedisCluster { .. }
    ) {
        Some(crate::args::TopologyChoice::Single)
    } else {
        None
    };
    if let Some(t) = failover_topology {
        add(
            FaultKind::Failover,
            Workload::Mutex,
            "mutex, 2 workers for 18 s x 7 s holds, lease 8 s, the replica lagging",
            &|a| {
                a.topology = t;
                a.workers = Some(2);
                a.duration = Some(18.0);
                a.hold_ms = Some(7000);
                a.lease_ms = Some(8000);
                a.fault_duration = Some(1.0);
            },
        );
    }
    if matches!(
        b.topology(),
        lockbench_registry::Topology::RedisIndependent(_)
    ) {
        add(
            FaultKind::PartitionClients,
            Workload::Mutex,
            "mutex, 4 workers x 120 x 10 ms, the workers cut from a minority of the masters for 3 s",
            &|a| {
                a.workers = Some(4);
                a.ops = Some(120);
                a.fault_target = NodeTarget::Minority;
                a.fault_duration = Some(3.0);
            },
        );
        add(
            FaultKind::ClockJump,
            Workload::Mutex,
            "mutex, 2 workers x 3 x 3 s holds, lease 10 s, a majority of the masters' clocks 60 s ahead",
            &|a| {
                a.workers = Some(2);
                a.ops = Some(3);
                a.hold_ms = Some(3000);
                a.lease_ms = Some(10_000);
                a.fault_target = NodeTarget::Majority;
                a.fault_duration = Some(60.0);
            },
        );
    }
    if level == FaultLevel::Full {
        if let Some(t) = failover_topology {
            add(
                FaultKind::Failover,
                Workload::Mutex,
                "mutex, 2 workers for 60 s x 7 s holds, lease 8 s, three failovers with the replica lagging",
                &|a| {
                    a.topology = t;
                    a.workers = Some(2);
                    a.duration = Some(60.0);
                    a.hold_ms = Some(7000);
                    a.lease_ms = Some(8000);
                    a.fault_duration = Some(1.0);
                    a.fault_repeat = 3;
                },
            );
        }
        add(
            FaultKind::NodeKill,
            Workload::Mutex,
            "mutex, 4 workers for 8 s, every server killed, restarted after 3 s",
            &|a| {
                a.workers = Some(4);
                a.duration = Some(8.0);
                a.fault_duration = Some(3.0);
            },
        );
        if b.cluster_topology().is_some()
            && !matches!(
                b.topology(),
                lockbench_registry::Topology::RedisCluster { .. }
            )
        {
            add(
                FaultKind::Partition,
                Workload::Mutex,
                "mutex, 4 workers for 8 s on the 3-member ensemble, a minority cut from the majority for 5 s",
                &|a| {
                    a.topology = crate::args::TopologyChoice::Cluster;
                    a.fault_target = NodeTarget::Minority;
                    a.workers = Some(4);
                    a.duration = Some(8.0);
                    a.fault_duration = Some(5.0);
                },
            );
            add(
                FaultKind::NodePause,
                Workload::Mutex,
                "mutex, 4 workers for 8 s on the 3-member ensemble, a minority paused 5 s",
                &|a| {
                    a.topology = crate::args::TopologyChoice::Cluster;
                    a.fault_target = NodeTarget::Minority;
                    a.workers = Some(4);
                    a.duration = Some(8.0);
                    a.fault_duration = Some(5.0);
                },
            );
        }
    }
    runs
}

/// The backends among `selected` whose settings (`--config`, then the
/// environment) name an endpoint of the user's own: name -> that endpoint,
/// redacted.
///
/// # Errors
/// A config file that does not parse, naming what is wrong.
fn external_endpoints(
    cfg: &Option<PathBuf>,
    selected: &dyn Fn(&str) -> bool,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    Ok(own_servers(cfg, selected)?
        .into_iter()
        .map(|(b, v)| {
            let shown = b.configured_endpoint(&b.redacted(&v)).unwrap_or_default();
            (b.name().to_string(), shown)
        })
        .collect())
}

/// The backends among `asked` that cannot run on the servers the settings
/// name (`Descriptor::check_servers`), with why.
fn unfit_for_own_servers(
    cfg: &Option<PathBuf>,
    asked: &dyn Fn(&str) -> bool,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    Ok(own_servers(cfg, asked)?
        .into_iter()
        .filter_map(|(b, v)| {
            b.check_servers(&v)
                .err()
                .map(|e| (b.name().to_string(), e.to_string()))
        })
        .collect())
}

/// The distributed backends among `asked` whose settings (`--config`, then
/// the environment) name servers of the user's own, with those settings.
fn own_servers(
    cfg: &Option<PathBuf>,
    asked: &dyn Fn(&str) -> bool,
) -> anyhow::Result<
    Vec<(
        &'static dyn lockbench_registry::Descriptor,
        serde_json::Value,
    )>,
> {
    let settings = match cfg {
        Some(p) => lockbench_registry::Settings::from_file(p)?,
        None => lockbench_registry::Settings::default(),
    };
    let mut out = Vec::new();
    for b in BACKENDS
        .iter()
        .filter(|b| b.distributed() && asked(b.name()))
    {
        let v = settings.for_backend(*b, None)?;
        if b.configured_endpoint(&v).is_some() {
            out.push((*b, v));
        }
    }
    Ok(out)
}

/// A fault cell that could not run against the user's own servers, with
/// the reason the report shows.
fn skipped_cell(backend: &str, fault: &str, setup: &str, endpoint: &str) -> report::FaultCell {
    report::FaultCell {
        backend: backend.to_string(),
        fault: fault.to_string(),
        setup: setup.to_string(),
        summary: Summary {
            backend: backend.to_string(),
            ..Summary::default()
        },
        records: vec![serde_json::json!({
            "fault": fault,
            "skipped": format!(
                "{endpoint} is your own server: {fault} acts on server processes lockbench started on this machine; pausing, killing or partitioning a remote fleet is out of scope"
            ),
        })],
        timeout: None,
    }
}

/// Runs one fault cell; a run that fails outright is a cell that says so.
async fn fault_cell(
    backend: &str,
    fault: String,
    setup: String,
    args: RunArgs,
) -> anyhow::Result<report::FaultCell> {
    eprintln!("== {backend}: {fault} ({setup})");
    let (summary, dir) = execute(&args).await?;
    if let Some(why) = crate::output::note_unsound(&format!("{backend} under {fault}"), &summary) {
        eprintln!("error: {backend} under {fault}: {why}");
    }
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json"))?)?;
    let records = results["faults"].as_array().cloned().unwrap_or_default();
    Ok(report::FaultCell {
        backend: backend.to_string(),
        fault,
        setup,
        summary,
        records,
        timeout: None,
    })
}

/// The lock's own timeout in a fault run: the lease it was given, or the
/// session its backend's default settings give it (ZooKeeper's session
/// timeout, etcd's session lease).
fn lock_timeout(
    b: &dyn lockbench_registry::Descriptor,
    lease_ms: Option<u64>,
) -> Option<report::LockTimeout> {
    if let Some(ms) = lease_ms {
        return Some(report::LockTimeout {
            kind: "lease".into(),
            ms: ms as f64,
        });
    }
    let settings = b.settings(None).ok()?;
    let find = |k: &str| -> Option<f64> {
        settings
            .get(k)
            .and_then(serde_json::Value::as_f64)
            .or_else(|| {
                settings
                    .as_object()?
                    .values()
                    .find_map(|v| v.get(k).and_then(serde_json::Value::as_f64))
            })
    };
    let ms = find("session_timeout_ms").or_else(|| find("session_ttl_s").map(|s| s * 1000.0))?;
    Some(report::LockTimeout {
        kind: "session".into(),
        ms,
    })
}

/// What a topology takes to run, and to keep its lock through one and two
/// server failures (the quorum rule 2f + 1 where there is a quorum).
fn servers_needed(t: lockbench_registry::Topology) -> report::ServersNeeded {
    use lockbench_registry::Topology as T;
    let quorum = |f: u32| 2 * f + 1;
    let (started, count, one, two, rule): (String, u32, Option<u32>, Option<u32>, &str) = match t {
        T::InProcess => ("nothing (in-process)".into(), 0, None, None, "no server: one process only"),
        T::RedisSingle => ("1 Redis".into(), 1, None, None, "one node: a failure loses every lock; adding a replica adds a failover that can hand the lock to two holders (see the failover column)"),
        T::RedisPrimaryReplica => ("2 Redis (primary, replica) + 3 Sentinels".into(), 5, Some(5), Some(7), "a primary, one replica per failure to survive, 3 Sentinels to agree on a failover (5 for two); the lock survives only what reached the replica"),
        T::RedisCluster { masters, replicas } => {
            let (m, r) = (u32::try_from(masters).unwrap_or(u32::MAX), u32::try_from(replicas).unwrap_or(u32::MAX));
            (format!("Redis Cluster: {m} masters x {r} replicas"), m.saturating_mul(r + 1), Some(m.max(3) * 2), Some(m.max(3) * 3), "at least 3 masters, one replica per master per failure to survive; a failover loses what had not replicated")
        }
        T::RedisIndependent(n) | T::RedisIndependentFakeClocks(n) => {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            (format!("{n} independent Redis masters"), n, Some(quorum(1)), Some(quorum(2)), "a majority of 2f + 1 independent masters (and clocks that agree)")
        }
        T::Postgres => ("1 PostgreSQL".into(), 1, None, None, "one server: a failure stops every lock (a lock dies with its session); a standby's failover was not measured here"),
        T::Zookeeper => ("1 ZooKeeper".into(), 1, Some(quorum(1)), Some(quorum(2)), "an ensemble of 2f + 1 servers (ZAB quorum)"),
        T::ZookeeperEnsemble(n) => (format!("{n} ZooKeeper"), u32::try_from(n).unwrap_or(u32::MAX), Some(quorum(1)), Some(quorum(2)), "an ensemble of 2f + 1 servers (ZAB quorum)"),
        T::Etcd => ("1 etcd".into(), 1, Some(quorum(1)), Some(quorum(2)), "a cluster of 2f + 1 members (Raft quorum)"),
        T::EtcdCluster(n) => (format!("{n} etcd"), u32::try_from(n).unwrap_or(u32::MAX), Some(quorum(1)), Some(quorum(2)), "a cluster of 2f + 1 members (Raft quorum)"),
    };
    report::ServersNeeded {
        started,
        count,
        for_one_failure: one,
        for_two_failures: two,
        rule: rule.into(),
    }
}

/// The flash sale every variant runs: 1,800 clicks from 8 processes.
fn sale_args(backend: &str, out: PathBuf, cfg: &Option<PathBuf>) -> RunArgs {
    let mut a = RunArgs::for_compare(backend, Workload::Coupon, out, cfg.clone());
    a.stock = 200;
    a.users = 600;
    a.clicks = 3;
    a
}

/// The backends the flash sale's production patterns run on: Redis, and
/// etcd for a consensus store.
const PATTERN_BACKENDS: [&str; 2] = ["redis", "etcd"];

/// Segment counts the segmented sale runs with (1 is the single lock on
/// one stock row, in the same code path).
const SEGMENTS: [u32; 5] = [1, 2, 4, 8, 16];

type PatternVariant = (String, &'static str, String, Box<dyn Fn(&mut RunArgs)>);

/// The seeds' production patterns as flash-sale variants on `backend`,
/// each beside the run it changes.
fn pattern_variants(backend: &str) -> Vec<PatternVariant> {
    let mut v: Vec<PatternVariant> = vec![
        (
            format!("{backend}, lock per voucher, 2 processes x 4 tasks"),
            "four click tasks per process, each to the distributed lock",
            format!("coupon-{backend}-tasks"),
            Box::new(|a: &mut RunArgs| {
                a.workers = Some(2);
                a.tasks = 4;
                a.lock_scope = LockScope::Voucher;
            }),
        ),
        (
            format!("{backend}, lock per voucher, 2 processes x 4 tasks, LocalFirst"),
            "the same tasks queue on an in-process mutex first: one per process goes to the distributed lock",
            format!("coupon-{backend}-local-first"),
            Box::new(|a: &mut RunArgs| {
                a.workers = Some(2);
                a.tasks = 4;
                a.lock_scope = LockScope::Voucher;
                a.local_first = true;
            }),
        ),
        (
            format!("{backend}, lock per user+voucher, 2 processes"),
            "the cache's twin: the same clicks without it",
            format!("coupon-{backend}-2p"),
            Box::new(|a: &mut RunArgs| a.workers = Some(2)),
        ),
        (
            format!("{backend}, lock per user+voucher, 2 processes, bought cache 5 s"),
            "each process remembers users who bought for 5 s and refuses their clicks before the lock",
            format!("coupon-{backend}-bought-cache"),
            Box::new(|a: &mut RunArgs| {
                a.workers = Some(2);
                a.bought_cache_ms = Some(5000);
            }),
        ),
    ];
    for n in SEGMENTS {
        v.push((
            format!("{backend}, stock in {n} segment(s), a lock each"),
            "a click takes its user's segment, then the next while empty",
            format!("coupon-{backend}-seg{n}"),
            Box::new(move |a: &mut RunArgs| {
                a.strategy = Strategy::Segmented;
                a.segments = n;
            }),
        ));
    }
    v
}

async fn step(what: &str, args: RunArgs) -> anyhow::Result<Summary> {
    eprintln!("== {what}");
    let s = execute(&args).await?.0;
    // Kept in the comparison (the page warns), and it fails at the end.
    if let Some(why) = crate::output::note_unsound(what, &s) {
        eprintln!("error: {what}: {why}");
    }
    Ok(s)
}

/// One backend's summaries from one repeat: latency, one hot key, a key
/// each.
type Trio = (Option<Summary>, Option<Summary>, Option<Summary>);

/// The repeated performance phase: every non-control backend (and the
/// first one again, as its A/A twin) × repeats × durability profiles, each
/// run on fresh servers, in an order rotated every repeat. Returns the
/// samples and, per backend, the summaries of its first durable repeat
/// (the single-run tables and charts show those).
async fn measure(
    args: &CompareArgs,
    out: &Path,
    rows: &[Row],
) -> (report::Measured, std::collections::BTreeMap<String, Trio>) {
    let backends: Vec<String> = rows
        .iter()
        .filter(|r| !r.negative_control)
        .map(|r| r.backend.clone())
        .collect();
    let aa = backends.first().cloned();
    // (registry name, entry label)
    let mut entries: Vec<(String, String)> =
        backends.iter().map(|b| (b.clone(), b.clone())).collect();
    if let Some(a) = &aa {
        entries.push((a.clone(), format!("{a} (A/A)")));
    }
    let mut first = std::collections::BTreeMap::new();
    let mut profiles = Vec::new();
    let n = entries.len().max(1);
    // Each run draws its own progress bar; this phase says where it is
    // between them, with a plain estimate of what is left.
    let profiles_run = [fleet::Durability::Durable, fleet::Durability::Volatile]
        .into_iter()
        .filter(|d| args.durability.runs(*d))
        .count();
    let total = entries.len() * 3 * args.repeats as usize * profiles_run;
    let mut done = 0usize;
    let started = std::time::Instant::now();
    for durability in [fleet::Durability::Durable, fleet::Durability::Volatile] {
        let name = durability.to_string();
        let mut profile = report::Profile {
            durability: name.clone(),
            ran: args.durability.runs(durability),
            backends: entries
                .iter()
                .map(|(_, label)| report::Samples {
                    backend: label.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        if !profile.ran {
            profiles.push(profile);
            continue;
        }
        for rep in 0..args.repeats {
            let mut order: Vec<usize> = (0..entries.len()).collect();
            order.rotate_left(rep as usize % n);
            profile
                .orders
                .push(order.iter().map(|&i| entries[i].1.clone()).collect());
            for i in order {
                let (backend, label) = &entries[i];
                let slug = label.replace(" (A/A)", "-aa");
                let dir = |w: &str| out.join(format!("perf-{name}-r{rep}-{slug}-{w}"));
                let samples = &mut profile.backends[i];
                let mut runs: Vec<(&str, RunArgs)> = Vec::new();
                let mut a = RunArgs::for_compare(
                    backend,
                    Workload::Latency,
                    dir("latency"),
                    args.config.clone(),
                );
                a.durability = durability;
                // A different seed each repeat: a different interleaving.
                a.seed = u64::from(rep) + 1;
                runs.push(("latency", a));
                for (keys, w) in [(1, "contended"), (4, "disjoint")] {
                    let mut a = RunArgs::for_compare(
                        backend,
                        Workload::Throughput,
                        dir(w),
                        args.config.clone(),
                    );
                    a.keys = keys;
                    a.duration = Some(args.throughput_secs);
                    a.durability = durability;
                    a.seed = u64::from(rep) + 1;
                    runs.push((w, a));
                }
                let mut trio: Trio = (None, None, None);
                for (w, a) in runs {
                    let left = match done {
                        0 => String::new(),
                        d => format!(
                            ", ~{:.0} min left",
                            started.elapsed().as_secs_f64() * (total - d) as f64 / d as f64 / 60.0
                        ),
                    };
                    eprintln!(
                        "== performance, {name} repeat {}/{}: {label}, {w} (run {}/{total}{left})",
                        rep + 1,
                        args.repeats,
                        done + 1
                    );
                    let r = crate::output::sound(execute(&a).await);
                    done += 1;
                    let (s, dir) = match r {
                        Ok(v) => v,
                        Err(e) => {
                            samples.failures.push(format!(
                                "repeat {} {w}: {}",
                                rep + 1,
                                crate::output::causes(&e)
                            ));
                            continue;
                        }
                    };
                    if profile.settings.is_empty() || w == "latency" {
                        for line in settings_of(&dir) {
                            if !profile.settings.contains(&line) {
                                profile.settings.push(line);
                            }
                        }
                    }
                    match w {
                        "latency" => {
                            samples.cycle_p50_us.push(s.cycle_p50_us);
                            if let Some(d) = &s.cycle_minus_floor {
                                samples.paired_diff_us.push(d.median_us);
                            }
                            if let (Some(f), Some(r)) = (s.floor_p50_us, s.floor_ratio) {
                                samples.floor_p50_us.push(f);
                                samples.floor_ratio.push(r);
                            }
                            trio.0 = Some(s);
                        }
                        "contended" => {
                            if let Some(h) = handovers_per_s(&s) {
                                samples.handovers_per_s.push(h);
                            }
                            trio.1 = Some(s);
                        }
                        _ => {
                            samples.disjoint_per_s.push(s.throughput_per_s);
                            trio.2 = Some(s);
                        }
                    }
                }
                if !label.ends_with("(A/A)") && !first.contains_key(backend) {
                    first.insert(backend.clone(), trio);
                }
            }
        }
        profiles.push(profile);
    }
    (
        report::Measured {
            repeats: args.repeats,
            aa_backend: aa,
            profiles,
        },
        first,
    )
}

/// "redis: --appendonly yes ...; filesystem ext4" lines from a run's
/// `results.json` (its `durability` record).
fn settings_of(dir: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(dir.join("results.json")) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Vec::new();
    };
    let d = &v["durability"];
    let fs = d["filesystem"].as_str().unwrap_or("unknown");
    let mut out = Vec::new();
    for s in d["servers"].as_array().into_iter().flatten() {
        let flags: Vec<&str> = s["flags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str())
            .collect();
        let line = format!(
            "{}: {} (filesystem {fs})",
            s["kind"].as_str().unwrap_or("?"),
            if flags.is_empty() {
                "as shipped".to_string()
            } else {
                flags.join(" ")
            }
        );
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// Hand-overs per second of a one-hot-key run.
fn handovers_per_s(s: &Summary) -> Option<f64> {
    s.handovers.as_ref().map(|h| h.handovers_per_s)
}

/// Runs the suite, prints the tables, writes `comparison.json` and
/// `index.html`.
pub async fn compare(mut args: CompareArgs) -> anyhow::Result<ExitCode> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(format!("{}-compare", timestamp())));
    // Before any server starts: a file there failed only after the first
    // runs, and an earlier comparison's run directories were left beside
    // this one's, under a page that calls the sub-directories its data.
    if out.exists() {
        anyhow::ensure!(
            out.is_dir(),
            "--out {}: exists and is not a directory",
            out.display()
        );
        let used = std::fs::read_dir(&out)
            .map_err(|e| anyhow::anyhow!("--out {}: {e}", out.display()))?
            .next()
            .is_some();
        anyhow::ensure!(
            !used,
            "--out {}: not empty (an earlier comparison's runs would be mixed with this one's): give a new directory or remove it",
            out.display()
        );
    }
    let cfg = &args.config.clone();
    let counts = scaling_counts(&args.scaling)?;
    // Checked here, not when the first run reaches them minutes in (each
    // run failed then, naming a --duration the user never gave).
    seconds("--throughput-secs", args.throughput_secs)?;
    if !counts.is_empty() {
        seconds("--scaling-secs", args.scaling_secs)?;
    }
    let wanted = args.backends.clone();
    // A misspelt name would otherwise just match nothing: a shorter (or
    // empty) comparison that says it went well.
    for name in &wanted {
        let b = lockbench_registry::find(name).map_err(|e| anyhow::anyhow!("--backends: {e}"))?;
        if !b.distributed() {
            anyhow::bail!(
                "--backends: {name:?} does not cross processes, so it has no place in the comparison; distributed backends: {}",
                BACKENDS
                    .iter()
                    .filter(|b| b.distributed())
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let asked = |name: &str| wanted.is_empty() || wanted.iter().any(|n| n == name);
    // A backend that cannot run on the servers named (redis-cluster on a
    // plain Redis) is left out with the reason, before anything starts:
    // its connect would stop the comparison halfway.
    let unfit = unfit_for_own_servers(cfg, &asked)?;
    for (name, why) in &unfit {
        // Asked for by name: say no; else leave it out and say so.
        anyhow::ensure!(!wanted.contains(name), "--backends: {name}: {why}");
        eprintln!("note: {name} left out of the comparison: {why}");
    }
    let selected = |name: &str| asked(name) && !unfit.contains_key(name);
    // Backends pointed at the user's own servers (--config or the
    // environment): redacted endpoint by name.
    let external = external_endpoints(cfg, &selected)?;
    if !external.is_empty() && args.durability != DurabilityLevel::Durable {
        eprintln!(
            "note: {} run against your own servers, whose durability lockbench cannot set: the performance runs use one profile, recorded as durable (volatile: not run)",
            external.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        args.durability = DurabilityLevel::Durable;
    }
    let mut c = Comparison {
        format: report::FORMAT,
        scaling: Vec::new(),
        benches: None,
        generated_utc: timestamp(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        rows: Vec::new(),
        sale: Vec::new(),
        faults: Vec::new(),
        measured: None,
        interrupted: None,
    };
    for b in BACKENDS
        .iter()
        .filter(|b| b.distributed() && selected(b.name()))
    {
        progress(
            &out,
            &c,
            &format!("{}'s ledger and flash-sale runs", b.name()),
        );
        let dir = |w: &str| out.join(format!("{}-{w}", b.name()));
        let ledger = step(
            &format!(
                "{}: ledger (4 processes x 100 x 10 ms, fenced ledger + counter)",
                b.name()
            ),
            RunArgs::for_compare(b.name(), Workload::Ledger, dir("ledger"), cfg.clone()),
        )
        .await?;
        // A broken lock's speed says nothing anyone should act on.
        let mut coupon = None;
        if !b.negative_control() {
            coupon = Some(
                step(
                    &format!("{}: flash sale, lock per user+voucher", b.name()),
                    sale_args(b.name(), dir("coupon"), cfg),
                )
                .await?,
            );
        }
        c.rows.push(Row {
            backend: b.name().to_string(),
            about: b.about().to_string(),
            negative_control: b.negative_control(),
            needs_fault: b.needs_fault().map(str::to_string),
            capabilities: b.capabilities(),
            ledger: Some(ledger),
            latency: None,
            contended: None,
            disjoint: None,
            coupon,
            open_loop: None,
            servers: Some(servers_needed(b.topology())),
        });
    }
    progress(&out, &c, "the performance runs");
    let (measured, first) = measure(&args, &out, &c.rows).await;
    c.measured = Some(measured);
    for r in &mut c.rows {
        if let Some((l, c, d)) = first.get(&r.backend) {
            (r.latency, r.contended, r.disjoint) = (l.clone(), c.clone(), d.clone());
        }
    }
    for i in 0..c.rows.len() {
        // One open-loop point per backend at ~70 % of the rate its closed
        // loop sustained: iterations per second, each a floor sample, the
        // peers' and our cycle. From the cycle's p50 alone it was beyond
        // capacity (pg-advisory offered 1174/s, served 493/s, p50 1.1 s).
        let Some(l) = c.rows[i]
            .latency
            .as_ref()
            .filter(|l| l.throughput_per_s > 0.0 && l.ops_ok > 0)
        else {
            continue;
        };
        let rate = 0.7 * l.throughput_per_s;
        let backend = c.rows[i].backend.clone();
        progress(&out, &c, &format!("{backend}'s open-loop run"));
        let mut a = RunArgs::for_compare(
            &backend,
            Workload::Latency,
            out.join(format!("{backend}-open-loop")),
            cfg.clone(),
        );
        a.rate = Some(rate);
        match step(
            &format!(
                "{backend}: latency, open loop at {rate:.0}/s (~70 % of the closed loop's rate)"
            ),
            a,
        )
        .await
        {
            Ok(s) => c.rows[i].open_loop = Some(s),
            Err(e) => eprintln!(
                "   {backend}: open-loop run failed: {}",
                crate::output::causes(&e)
            ),
        }
    }
    for b in BACKENDS
        .iter()
        .filter(|b| b.distributed() && selected(b.name()))
    {
        for (fault, setup, a, timeout) in fault_runs(*b, args.faults, &out, cfg) {
            if let (Some(ep), Some(kind)) = (external.get(b.name()), a.fault) {
                if kind.on_servers() {
                    c.faults.push(skipped_cell(b.name(), &fault, &setup, ep));
                    continue;
                }
            }
            progress(&out, &c, &format!("{}'s {fault} run", b.name()));
            // A backend the fault cannot run on (a missing package, a
            // refused combination) is reported, not fatal to the suite.
            match fault_cell(b.name(), fault.clone(), setup.clone(), a).await {
                Ok(mut cell) => {
                    cell.timeout = timeout;
                    c.faults.push(cell);
                }
                Err(e) => {
                    eprintln!(
                        "   {}: {fault} did not run: {}",
                        b.name(),
                        crate::output::causes(&e)
                    );
                }
            }
        }
    }
    progress(&out, &c, "the scaling runs");
    scaling_phase(&args, &counts, &out, &mut c).await;
    if selected("redis") {
        type Variant = (&'static str, &'static str, &'static str, fn(&mut RunArgs));
        let variants: [Variant; 4] = [
            (
                "redis, lock per voucher",
                "every click serialised on one lock",
                "coupon-voucher",
                |a| a.lock_scope = LockScope::Voucher,
            ),
            (
                "baseline: sql-atomic",
                "no lock: UPDATE .. SET stock = stock - 1 WHERE stock > 0, unique (user, voucher) index",
                "coupon-sql-atomic",
                |a| a.strategy = Strategy::SqlAtomic,
            ),
            (
                "baseline: redis-prededuct",
                "no lock: one Lua script checks the user set and stock and pre-deducts; orders reach PostgreSQL through a Redis Stream",
                "coupon-redis-prededuct",
                |a| a.strategy = Strategy::RedisPrededuct,
            ),
            (
                "bug: redis, unlock before commit",
                "the seed's bug: lock per user+voucher released before COMMIT (20 ms window), no unique index",
                "coupon-unlock-then-commit",
                |a| {
                    a.ordering = Ordering::UnlockThenCommit;
                    a.commit_delay_ms = 20;
                    a.no_unique_index = true;
                },
            ),
        ];
        for (label, note, dir, set) in variants {
            let mut a = sale_args("redis", out.join(dir), cfg);
            set(&mut a);
            progress(&out, &c, &format!("the flash sale's {label} run"));
            let summary = step(&format!("flash sale: {label}"), a).await?;
            c.sale.push(SaleRun {
                label: label.to_string(),
                note: note.to_string(),
                backend: "redis".into(),
                summary,
            });
        }
    }
    for b in PATTERN_BACKENDS.iter().filter(|b| selected(b)) {
        for (label, note, dir, set) in pattern_variants(b) {
            let mut a = sale_args(b, out.join(dir), cfg);
            set(&mut a);
            progress(&out, &c, &format!("the flash sale's {label} run"));
            let summary = step(&format!("flash sale: {label}"), a).await?;
            c.sale.push(SaleRun {
                label,
                note: note.to_string(),
                backend: b.to_string(),
                summary,
            });
        }
    }
    c.generated_utc = timestamp();
    print_tables(&c);
    println!("\nWhich lock for which job (derived from the figures above):");
    for d in report::decisions(&c) {
        println!("  - {d}");
    }
    let (json, html) = write(&c, &out)?;
    // Written whole: nothing left for an interrupt to write.
    if let Ok(mut s) = SO_FAR.lock() {
        *s = None;
    }
    println!("\nwritten: {}\n         {}", json.display(), html.display());
    if let Err(e) = point_latest(&out) {
        eprintln!("note: reports/latest not updated: {e}");
    }
    // Written, and said: a comparison with an outage in it is no verdict.
    let outages = crate::output::unsound_runs();
    for o in &outages {
        eprintln!("error: {o}");
    }
    Ok(if outages.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The comparison so far, with the phase it is in, and its directory: what
/// [`write_interrupted`] writes for a comparison cut short (a 20-minute
/// suite stopped in its last phase left no page at all).
static SO_FAR: std::sync::Mutex<Option<(PathBuf, Comparison)>> = std::sync::Mutex::new(None);

/// Records `c` as the comparison so far, about to run `phase`.
fn progress(out: &Path, c: &Comparison, phase: &str) {
    let mut c = c.clone();
    c.interrupted = Some(phase.to_string());
    if let Ok(mut s) = SO_FAR.lock() {
        *s = Some((out.to_path_buf(), c));
    }
}

/// For a comparison cut short (Ctrl-C, SIGTERM, SIGHUP): writes the runs
/// it had finished as `comparison.json` and `index.html`, the page saying
/// where it stopped. `None` when no comparison was under way.
pub fn write_interrupted() -> Option<anyhow::Result<(PathBuf, PathBuf)>> {
    let (out, mut c) = SO_FAR.lock().ok()?.take()?;
    // When it stopped, not when it began.
    c.generated_utc = timestamp();
    Some(write(&c, &out))
}

/// Points `reports/latest` at `out` when `out` is a comparison directory
/// in a `reports/` directory (the default): a relative link, so the tree
/// can be moved or copied whole.
fn point_latest(out: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (out.parent(), out.file_name()) else {
        return Ok(());
    };
    if parent.file_name().and_then(|n| n.to_str()) != Some("reports") {
        return Ok(());
    }
    let link = parent.join("latest");
    let fresh = parent.join(".latest.new");
    let _ = std::fs::remove_file(&fresh);
    std::os::unix::fs::symlink(name, &fresh)?;
    // rename over the old link: readers never see it missing.
    std::fs::rename(&fresh, &link)
}

/// Writes `comparison.json` and `index.html` into `dir`.
///
/// # Errors
/// I/O, or a report template bug.
pub fn write(c: &Comparison, dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let json = dir.join("comparison.json");
    harness::write_atomic(&json, serde_json::to_string_pretty(c)?.as_bytes())?;
    let html = dir.join("index.html");
    harness::write_atomic(&html, report::render(c)?.as_bytes())?;
    Ok((json, html))
}

fn print_tables(c: &Comparison) {
    println!();
    println!(
        "| {:<24} | {:>10} | {:>8} | {:>8} | {:>14} | {:>12} | {:>12} | {:>8} | {:>10} | {:>10} |",
        "backend",
        "violations",
        "unlock=0",
        "lost upd",
        "stale acc/unf",
        "cycle p50 µs",
        "floor p50 µs",
        "ratio",
        "1 key c/s",
        "4 keys c/s"
    );
    println!("|{}|", "-".repeat(146));
    for r in &c.rows {
        let (cycle, floor, ratio) = match &r.latency {
            Some(l) => (
                format!("{:.1}", l.cycle_p50_us),
                l.floor_p50_us.map_or("-".into(), |v| format!("{v:.1}")),
                l.floor_ratio.map_or("-".into(), |v| format!("{v:.2}x")),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let rate = |s: &Option<Summary>| {
            s.as_ref()
                .map_or("-".into(), |s| format!("{:.0}", s.throughput_per_s))
        };
        let (viol, unlock0, lost, stale) = match &r.ledger {
            Some(s) => (
                s.violations.to_string(),
                s.release_not_held.to_string(),
                s.ledger
                    .as_ref()
                    .map_or("-".into(), |l| l.lost_updates.to_string()),
                s.ledger.as_ref().map_or("-".into(), |l| {
                    format!("{}/{}", l.stale_writes_accepted, l.stale_writes_unfenced)
                }),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {:<24} | {:>10} | {:>8} | {:>8} | {:>14} | {:>12} | {:>12} | {:>8} | {:>10} | {:>10} |",
            if r.negative_control {
                format!("{} (ctl)", r.backend)
            } else {
                r.backend.clone()
            },
            viol,
            unlock0,
            lost,
            stale,
            cycle,
            floor,
            ratio,
            rate(&r.contended),
            rate(&r.disjoint),
        );
    }
    if let Some(m) = &c.measured {
        print_repeats(m);
    }
    if !c.faults.is_empty() {
        println!("\nUnder faults (one run each; capabilities predict the outcome, a disagreement is a finding):");
        for line in report::fault_lines(c) {
            println!("  {line}");
        }
    }
    let fair = report::fairness_lines(c);
    if !fair.is_empty() {
        println!("\nFairness on one key (the declared `fair` against the waits; a FIFO wait sees at most 2 x rivals acquire before it, more is a finding):");
        for line in fair {
            println!("  {line}");
        }
    }
    let sales: Vec<(String, &Summary)> = c
        .rows
        .iter()
        .filter_map(|r| {
            r.coupon
                .as_ref()
                .map(|s| (format!("{}, lock per user+voucher", r.backend), s))
        })
        .chain(c.sale.iter().map(|s| (s.label.clone(), &s.summary)))
        .collect();
    if !sales.is_empty() {
        println!(
            "\nflash sale ({} clicks each):",
            sales[0].1.coupon.as_ref().map_or(0, |k| k.clicks)
        );
        for (label, s) in sales {
            if let Some(k) = &s.coupon {
                println!(
                    "  {:>6.0} clicks/s  {:>7} ms to sell out  {:>4} orders  {:>3} users with 2 orders  oversold {:>3}  {}  {label}",
                    k.clicks_per_s,
                    k.time_to_sell_out_ms.map_or("-".into(), |t| format!("{t:.0}")),
                    k.check.orders,
                    k.check.users_with_two_orders,
                    k.check.oversold,
                    if k.valid { "hold  " } else { "BROKEN" },
                );
            }
        }
    }
    println!("\nledger: 4 worker processes x 100 cycles x 10 ms on one key; violations = overlapping critical sections; lost upd = counter increments lost; stale acc/unf = stale writes accepted by the fenced ledger / by an unfenced one");
    println!("unlock=0: releases that found the lock already gone; (ctl) = deliberately broken negative control");
}

/// The repeated figures: median over repeats with its 95 % interval.
fn print_repeats(m: &report::Measured) {
    let est =
        |v: &[f64], d: usize| report::stats::Estimate::of(v).map_or("-".to_string(), |e| e.show(d));
    for p in &m.profiles {
        if !p.ran {
            println!("\n{}: not run", p.durability);
            continue;
        }
        println!(
            "\n{} servers, median over {} repeats [95 % bootstrap interval]:",
            p.durability, m.repeats
        );
        println!(
            "| {:<22} | {:>24} | {:>20} | {:>22} | {:>22} |",
            "backend", "cycle p50 µs", "x floor", "1 key hand-overs/s", "4 keys cycles/s"
        );
        for s in &p.backends {
            println!(
                "| {:<22} | {:>24} | {:>20} | {:>22} | {:>22} |",
                s.backend,
                est(&s.cycle_p50_us, 1),
                est(&s.floor_ratio, 2),
                est(&s.handovers_per_s, 0),
                est(&s.disjoint_per_s, 0),
            );
            for f in &s.failures {
                println!("    failed: {f}");
            }
        }
    }
}
