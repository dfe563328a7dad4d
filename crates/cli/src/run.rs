//! `lockbench run`: start the servers (or use the given endpoint), drive
//! worker processes, check, write `results.json` + `history.jsonl`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use harness::coordinator::{self, RunPlan};
use harness::spec::CouponPlan;
use harness::Workload;
use indicatif::{ProgressBar, ProgressStyle};

use harness::data::{DataDb, PredeductKeys};
use lockbench_registry::{self as registry, BuildParams, Descriptor, Servers, Settings, Topology};

pub use crate::args::{RunArgs, TopologyChoice};
use crate::nemesis::{self, FaultKind, FaultPlan};
use crate::output;

/// `YYYYmmdd-HHMMSS` in UTC, from the system clock.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (i64::try_from(secs / 86_400).unwrap_or(0), secs % 86_400);
    // Civil-from-days (Howard Hinnant), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// `lockbench run`.
pub async fn run(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    // `--workers` is a list: one count is a run, several are a curve.
    match args.worker_counts.as_slice() {
        [] => {}
        [n] => args.workers = Some(*n),
        _ => return crate::curve::run(args).await,
    }
    let (summary, out_dir) = execute(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        output::print_human(&summary, &out_dir);
        // What the fault did, or that it never happened (the run ended
        // before its time): results.json had it, the console did not.
        for line in fault_lines(&out_dir) {
            println!("  {line}");
        }
    }
    // A server of ours died on its own (the figures are an outage's), the
    // workers were stopped for it, or the data checks could not run.
    if let Some(why) = output::unsound(&summary) {
        for e in &summary.servers_exited {
            eprintln!("error: server {e}: not an injected fault, so this run measured an outage");
        }
        if let Some(w) = &summary.stopped_early {
            eprintln!(
                "error: the workers were stopped early ({w}) instead of waiting out --max-secs"
            );
        }
        if summary.servers_exited.is_empty() && summary.stopped_early.is_none() {
            eprintln!("error: {why}");
        }
        eprintln!("results: {}", out_dir.join("results.json").display());
        return Ok(ExitCode::FAILURE);
    }
    // A run in which the lock never once said yes measured nothing: say so,
    // with the server's reason, instead of a table of zeros and exit 0.
    if let Some(reason) = output::nothing_acquired(&summary) {
        eprintln!(
            "error: {reason} (results: {})",
            out_dir.join("results.json").display()
        );
        return Ok(ExitCode::FAILURE);
    }
    // The fault asked for never happened (the run ended first, no worker
    // held the lock, ...): the run measured no fault, and said "skipped"
    // with exit 0.
    let skipped = skipped_faults(&out_dir);
    if !skipped.is_empty() {
        eprintln!(
            "error: the fault asked for did not happen ({}): this run measured no fault (results: {})",
            skipped.join("; "),
            out_dir.join("results.json").display()
        );
        return Ok(ExitCode::FAILURE);
    }
    // The lock broke: that is the run's finding, written like any other,
    // and the exit code says it too, as a Jepsen test exits non-zero on an
    // invalid history (a script reads the code, not the table); 3, apart
    // from 1's "the run itself failed" and clap's 2 for a usage error.
    let mut broken = report::harm(&summary);
    // Liveness counts too: the fault matrix calls a lock that an
    // acquire-crash left held forever broken, and so does the exit code.
    broken.extend(never_freed(&out_dir));
    if !broken.is_empty() {
        eprintln!(
            "unsafe: {} (results: {})",
            broken.join("; "),
            out_dir.join("results.json").display()
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// The fault records in the run's results.json (none when it cannot be read).
fn fault_records(out_dir: &Path) -> Vec<serde_json::Value> {
    let v = std::fs::read_to_string(out_dir.join("results.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .unwrap_or_default();
    v["faults"].as_array().cloned().unwrap_or_default()
}

/// The notes of the run's acquire-crash faults after which no other worker
/// ever held the lock ("lock never freed: ...").
fn never_freed(out_dir: &Path) -> Vec<String> {
    fault_records(out_dir)
        .iter()
        .filter(|f| f["fault"] == "acquire-crash" && f["recovery_ms"].is_null())
        .filter_map(|f| f["note"].as_str())
        .filter(|n| n.starts_with("lock never freed"))
        .map(str::to_string)
        .collect()
}

/// The run's faults that were skipped, each with why.
fn skipped_faults(out_dir: &Path) -> Vec<String> {
    fault_records(out_dir)
        .iter()
        .filter_map(|f| {
            let why = f["skipped"].as_str()?;
            Some(format!("{}: {why}", f["fault"].as_str().unwrap_or("fault")))
        })
        .collect()
}

/// Watches the servers the run started: one that dies on its own (a kill
/// by a fault leaves no exit status) stops the workers, who would
/// otherwise wait out every acquire's budget until `--max-secs` against a
/// server that is gone. Never returns; dropped when the run ends.
async fn stop_on_a_death(
    servers: &Servers,
    data_servers: &[Servers],
    live: &coordinator::LiveWorkers,
) -> std::convert::Infallible {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let dead = servers
            .nodes()
            .into_iter()
            .chain(data_servers.iter().flat_map(|d| d.nodes()))
            .find_map(|n| {
                Some(format!(
                    "{} ({}) exited: {}",
                    n.name(),
                    n.host_port(),
                    n.exit_status()?
                ))
            });
        if let Some(dead) = dead {
            live.stop(dead);
        }
    }
}

/// One line per fault of the run, read back from its results.json.
fn fault_lines(out_dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(out_dir.join("results.json")) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let Some(faults) = v["faults"].as_array() else {
        return Vec::new();
    };
    faults
        .iter()
        .map(|f| {
            let name = f["fault"].as_str().unwrap_or("fault");
            let target = f["target"].as_str().unwrap_or("");
            if let Some(why) = f["skipped"].as_str() {
                return format!("fault {name}: skipped: {why}");
            }
            let lasted = match (f["started_ns"].as_u64(), f["healed_ns"].as_u64()) {
                (Some(a), Some(b)) => format!(" for {:.1} s", b.saturating_sub(a) as f64 / 1e9),
                _ => String::new(),
            };
            let recovery = f["recovery_ms"]
                .as_f64()
                .map(|r| format!("; next holder {r:.0} ms after"))
                .unwrap_or_default();
            // Where the servers were hit; in a holder or failover drill
            // the gap is mostly the holds themselves.
            let on_servers = matches!(
                name,
                "node-pause" | "node-kill" | "partition" | "partition-clients"
            );
            let stalled = f["stalled_ms"]
                .as_f64()
                .filter(|_| on_servers)
                .map(|s| format!("; longest without a successful acquire {s:.0} ms"))
                .unwrap_or_default();
            // A kill is never undone: its counts run to the end of the run,
            // recovery included (a probe read "232 ok while it lasted" of
            // a 30 s wait in which nobody acquired).
            let when = if f["healed_ns"].as_u64().is_some() {
                "while it lasted"
            } else {
                "from it to the end of the run"
            };
            format!(
                "fault {name} on {target}{lasted}: {} ok, {} failed ({} unknown) {when}{stalled}{recovery}",
                f["ok_during"].as_u64().unwrap_or(0),
                f["fail_during"].as_u64().unwrap_or(0),
                f["info_during"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// What a `lockbench run` will do, decided from its arguments alone (no
/// server, no file): testable without servers.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub backend: &'static dyn Descriptor,
    pub workers: u32,
    pub hold_ms: u64,
    pub duration_ms: Option<u64>,
    pub ops: u64,
    pub coupon: Option<CouponPlan>,
    pub run_id: String,
    /// The key the workers lock (`lockbench:<run id>`).
    pub key: String,
    pub out_dir: PathBuf,
    pub fault: Option<FaultPlan>,
    pub topology: Topology,
}

/// Decides the run from its arguments and the current time stamp.
///
/// # Errors
/// An unknown backend or an argument out of range, naming the flag.
pub(crate) fn resolve(args: &RunArgs, now: &str) -> anyhow::Result<Resolved> {
    let backend = registry::find(&args.backend)?;
    anyhow::ensure!(
        backend.distributed(),
        "--backend {}: {} (lockbench run drives worker processes)",
        backend.name(),
        backend.about()
    );
    let w = args.workload;
    if let Some(r) = args.rate {
        anyhow::ensure!(
            r.is_finite() && r > 0.0,
            "--rate {r}: give a positive number of arrivals per second"
        );
        anyhow::ensure!(
            matches!(w, Workload::Latency | Workload::Throughput),
            "--rate: the open loop applies to the latency and throughput workloads, not {w:?}"
        );
    }
    let workers = args.workers.unwrap_or(match w {
        Workload::Latency => 1,
        Workload::Coupon => 8,
        _ => 4,
    });
    let hold_ms = args.hold_ms.unwrap_or(match w {
        Workload::Mutex | Workload::Ledger => 10,
        _ => 0,
    });
    anyhow::ensure!(
        (1..=256).contains(&workers),
        "--workers must be 1..=256, got {workers}"
    );
    anyhow::ensure!(args.keys >= 1, "--keys must be at least 1");
    anyhow::ensure!(args.max_secs >= 1, "--max-secs must be at least 1");
    let max_ms = args.max_secs.saturating_mul(1000);
    // Each of these alone would outlast the run's hard limit: the run
    // stalled until --max-secs and then lost what it had measured.
    anyhow::ensure!(
        hold_ms < max_ms,
        "--hold-ms {hold_ms} must be below --max-secs ({} s)",
        args.max_secs
    );
    if w == Workload::Latency {
        anyhow::ensure!(
            args.warmup_ms < max_ms,
            "--warmup-ms {} must be below --max-secs ({} s)",
            args.warmup_ms,
            args.max_secs
        );
    }
    if let Some(l) = args.lease_ms {
        let lease = Duration::from_millis(l);
        anyhow::ensure!(
            lease >= distlock::min_fixed_lease() && lease <= distlock::MAX_FIXED_LEASE,
            "--lease-ms {l}: a fixed lease must be at least {} ms and at most {} days (leave --lease-ms out for the watchdog)",
            distlock::min_fixed_lease().as_millis(),
            distlock::MAX_FIXED_LEASE.as_secs() / 86_400
        );
    }
    let duration_ms = match (args.duration, w) {
        (Some(d), _) => {
            anyhow::ensure!(
                d.is_finite() && d > 0.0 && d <= args.max_secs as f64,
                "--duration must be > 0 and at most --max-secs ({}), got {d}",
                args.max_secs
            );
            Some(distlock::millis(Duration::from_secs_f64(d)))
        }
        (None, Workload::Throughput) if args.ops.is_none() => Some(5_000),
        _ => None,
    };
    let coupon = (w == Workload::Coupon).then_some(CouponPlan {
        stock: args.stock,
        users: args.users,
        clicks: args.clicks,
        lock_scope: args.lock_scope,
        ordering: args.ordering,
        commit_delay_ms: args.commit_delay_ms,
        unique_index: !args.no_unique_index,
        strategy: args.strategy,
        tasks: args.tasks,
        local_first: args.local_first,
        bought_cache_ms: args.bought_cache_ms,
        segments: if args.strategy == harness::spec::Strategy::Segmented {
            args.segments
        } else {
            1
        },
    });
    if let Some(c) = &coupon {
        anyhow::ensure!(
            (1..=64).contains(&args.segments),
            "--segments must be 1 to 64, not {}",
            args.segments
        );
        anyhow::ensure!(
            (1..=256).contains(&c.tasks),
            "--tasks must be 1 to 256, not {}",
            c.tasks
        );
        anyhow::ensure!(
            c.bought_cache_ms != Some(0),
            "--bought-cache-ms must be above 0 (leave it out for no cache)"
        );
        anyhow::ensure!(
            c.users >= 1 && c.clicks >= 1,
            "--users and --clicks must be at least 1"
        );
        anyhow::ensure!(
            u64::from(c.users) * u64::from(c.clicks) <= 10_000_000,
            "--users x --clicks is capped at 10 million clicks"
        );
    }
    let ops = match (&coupon, args.ops, duration_ms) {
        // Every worker gets its share of the clicks.
        (Some(c), _, _) => (u64::from(c.users) * u64::from(c.clicks)).div_ceil(u64::from(workers)),
        (None, Some(n), _) => n,
        (None, None, Some(_)) => u64::MAX,
        (None, None, None) if w == Workload::Latency => 2000,
        (None, None, None) => 100,
    };
    anyhow::ensure!(ops >= 1, "--ops must be at least 1");
    if let (Some(r), None, true) = (args.rate, duration_ms, ops != u64::MAX) {
        // Arrivals are Poisson at `r` per second over all workers.
        let expected_s = ops as f64 * f64::from(workers) / r;
        anyhow::ensure!(
            expected_s <= args.max_secs as f64,
            "--rate {r} with --ops {ops} x {workers} worker(s) needs about {expected_s:.0} s, over --max-secs ({} s)",
            args.max_secs
        );
    }
    let mut fault = match args.fault {
        None => None,
        Some(kind) => {
            anyhow::ensure!(
                args.fault_at.is_finite() && args.fault_at >= 0.0,
                "--fault-at must be a number of seconds >= 0, got {}",
                args.fault_at
            );
            // A fault the run ends before measured nothing (it said
            // "skipped" and exited 0).
            let ends = args
                .duration
                .map_or(args.max_secs as f64, |d| d.min(args.max_secs as f64));
            anyhow::ensure!(
                args.fault_at < ends,
                "--fault-at {} s: the run ends by {ends} s ({}), before the fault",
                args.fault_at,
                if args.duration.is_some_and(|d| d < args.max_secs as f64) {
                    "--duration"
                } else {
                    "--max-secs"
                }
            );
            let duration = match (args.fault_duration, kind, args.lease_ms) {
                (Some(d), _, _) => {
                    anyhow::ensure!(
                        d.is_finite() && d > 0.0 && d <= 600.0,
                        "--fault-duration must be > 0 and at most 600 s, got {d}"
                    );
                    Duration::from_secs_f64(d)
                }
                (None, FaultKind::HolderPause, Some(l)) => Duration::from_millis(l * 2),
                (None, _, _) => Duration::from_secs(5),
            };
            anyhow::ensure!(
                w != Workload::Latency,
                "--fault: the latency workload times microseconds on one worker; use mutex, ledger, throughput or coupon"
            );
            anyhow::ensure!(
                (1..=100).contains(&args.fault_repeat),
                "--fault-repeat must be 1..=100, got {}",
                args.fault_repeat
            );
            let point = match kind {
                FaultKind::AcquireCrash => Some(backend.crash_point().ok_or_else(|| {
                    anyhow::anyhow!(
                        "--fault acquire-crash: {}'s acquire is one step, with nothing to crash between (holder-kill is the crash that applies)",
                        backend.name()
                    )
                })?),
                FaultKind::HolderPause => backend.pause_point(),
                _ => None,
            };
            anyhow::ensure!(
                point.is_none() || args.fault_repeat == 1,
                "--fault-repeat: a fault at the lock's own fault point is armed once per run"
            );
            let plan = FaultPlan {
                kind,
                target: args.fault_target,
                at: Duration::from_secs_f64(args.fault_at),
                duration,
                repeat: args.fault_repeat,
                seed: args.seed,
                key: String::new(),
                point,
            };
            // The same for the later repetitions (the first is checked
            // above): their schedule is drawn from --seed, known now.
            let last = crate::nemesis::earliest_last_start(&plan).as_secs_f64();
            anyhow::ensure!(
                last < ends,
                "--fault-repeat {}: with --fault-at {} s, --fault-duration {} s and --seed {}, the last repetition would begin {last:.1} s in at the earliest, after the run ends ({ends} s); lower --fault-repeat or lengthen the run",
                args.fault_repeat,
                args.fault_at,
                duration.as_secs_f64(),
                args.seed
            );
            Some(plan)
        }
    };
    let topology = match args.topology {
        TopologyChoice::Single => backend.topology(),
        TopologyChoice::Cluster => backend.cluster_topology().ok_or_else(|| {
            anyhow::anyhow!(
                "--topology cluster: {} has no replicated topology here (etcd, zookeeper and redis do)",
                backend.name()
            )
        })?,
        TopologyChoice::Sentinel => backend.sentinel_topology().ok_or_else(|| {
            anyhow::anyhow!(
                "--topology sentinel: {} does not run behind Redis Sentinel here (redis and redis-wait do)",
                backend.name()
            )
        })?,
    };
    if let Some(f) = &fault {
        anyhow::ensure!(
            f.kind != FaultKind::Partition || args.fault_target != crate::nemesis::NodeTarget::All,
            "--fault partition cuts the targeted servers from the others: choose --fault-target one, minority or majority (on a replicated topology, e.g. --topology cluster)"
        );
        // Servers that never talk to each other (one node, or RedLock's
        // independent masters) have nothing to cut: such a run measured
        // nothing and reported the partition as done.
        let replicated = matches!(
            topology,
            Topology::RedisPrimaryReplica
                | Topology::RedisCluster { .. }
                | Topology::ZookeeperEnsemble(_)
                | Topology::EtcdCluster(_)
        );
        anyhow::ensure!(
            f.kind != FaultKind::Partition || replicated,
            "--fault partition cuts servers from each other, and {}'s servers here ({}) never talk to each other: use --fault partition-clients (the workers cut from some servers){}",
            backend.name(),
            match topology {
                Topology::RedisIndependent(n) | Topology::RedisIndependentFakeClocks(n) => {
                    format!("{n} independent masters")
                }
                _ => "one server".to_string(),
            },
            if backend.cluster_topology().is_some() {
                ", or --topology cluster"
            } else {
                ""
            }
        );
        anyhow::ensure!(
            f.kind != FaultKind::Failover
                || matches!(
                    topology,
                    Topology::RedisPrimaryReplica | Topology::RedisCluster { .. }
                ),
            "--fault failover: {} on this topology has no replica to promote; use redis or redis-wait with --topology sentinel, or redis with --topology cluster",
            backend.name()
        );
    }
    // A clock fault needs clocks it can move: the same masters, each under
    // libfaketime.
    let topology = match (&fault, topology) {
        (Some(f), Topology::RedisIndependent(n)) if f.kind == FaultKind::ClockJump => {
            Topology::RedisIndependentFakeClocks(n)
        }
        (Some(f), _) if f.kind == FaultKind::ClockJump => anyhow::bail!(
            "--fault clock-jump moves the clocks of independent Redis masters: {} does not run on them (redlock does)",
            backend.name()
        ),
        (_, t) => t,
    };
    if let Some(h) = args.hosts {
        anyhow::ensure!(
            w == Workload::Ledger,
            "--hosts: a run across hosts is checked by the database's clock, which stamps the ledger's sections: use --workload ledger"
        );
        anyhow::ensure!(
            fault.is_none(),
            "--hosts: faults act on processes of this host; a run across hosts takes none"
        );
        anyhow::ensure!(
            workers >= h,
            "--hosts {h}: --workers ({workers}) must give every host at least one"
        );
        anyhow::ensure!(
            args.topology == TopologyChoice::Single,
            "--hosts: the servers are the ones in --config, which every host reads; --topology starts servers here"
        );
    }
    let run_id = match &args.run_id {
        Some(id) => {
            check_run_id(id)?;
            id.clone()
        }
        // Made unique when the run claims its directory (`claim_dir`).
        None => format!("{now}-{}-{:?}", backend.name(), args.workload).to_lowercase(),
    };
    let key = format!("lockbench:{run_id}");
    if let Some(f) = &mut fault {
        f.key = key.clone();
    }
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(&run_id));
    Ok(Resolved {
        backend,
        workers,
        hold_ms,
        duration_ms,
        ops,
        coupon,
        run_id,
        key,
        out_dir,
        fault,
        topology,
    })
}

/// A `--run` id: letters, digits, `.`, `_` and `-`, at most 64 (it names
/// a directory, a lock key and the run's rows in the database).
///
/// # Errors
/// Any other id, named.
pub(crate) fn check_run_id(id: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
        "--run {id:?}: letters, digits, '.', '_' and '-' only, at most 64"
    );
    Ok(())
}

/// The config file's tables (or none).
fn load_settings(args: &RunArgs) -> anyhow::Result<Settings> {
    Ok(match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    })
}

/// The settings of the `[postgres]` or `[redis]` table for the data a
/// workload protects, when the run's servers are the user's own.
pub(crate) fn data_settings(
    settings: &Settings,
    family: &dyn Descriptor,
    backend: &dyn Descriptor,
    cfg: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    // The backend's own server when it is of that family (its endpoint
    // included), else the family's table and environment.
    Ok(if backend.family() == family.family() {
        cfg.clone()
    } else {
        settings.for_backend(family, None)?
    })
}

/// The data store of `family` when the lock's servers are the user's
/// own: the lock's server when it is of that family, else the family's
/// endpoint from the config file or environment. `None` when neither names
/// one: the caller starts one, as for its own servers (the family's
/// default URL would be a server nobody named, written into unasked if
/// one happens to listen there).
fn own_data_url(
    settings: &Settings,
    family: &dyn Descriptor,
    backend: &dyn Descriptor,
    cfg: &serde_json::Value,
) -> anyhow::Result<Option<String>> {
    let v = data_settings(settings, family, backend, cfg)?;
    let named = backend.family() == family.family() || family.configured_endpoint(&v).is_some();
    named.then(|| url_of(&v)).transpose()
}

pub(crate) fn url_of(v: &serde_json::Value) -> anyhow::Result<String> {
    v.get("url")
        .and_then(|u| u.as_str())
        .map(str::to_string)
        .context("the data store's settings have no url")
}

/// A default output directory this run created, removed again if the run
/// leaves it empty (it failed before writing anything).
struct ClaimedDir(PathBuf);

impl Drop for ClaimedDir {
    fn drop(&mut self) {
        // Removes only an empty directory: results, once written, stay.
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Claims `<reports>/<base>` by creating it, or the first free `-2`, `-3`,
/// ...: two runs started in the same second shared the default directory
/// (the second's results replaced the first's) and the lock key, and a
/// check for the directory before creating it was still a race.
fn claim_dir(reports: &Path, base: &str) -> anyhow::Result<(String, ClaimedDir)> {
    std::fs::create_dir_all(reports).with_context(|| format!("creating {}", reports.display()))?;
    for n in 1..1000 {
        let id = match n {
            1 => base.to_string(),
            n => format!("{base}-{n}"),
        };
        let dir = reports.join(&id);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((id, ClaimedDir(dir))),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(anyhow::anyhow!("creating {}: {e}", dir.display())),
        }
    }
    anyhow::bail!(
        "{}: 999 runs of that id already; give --out or --run",
        reports.join(base).display()
    )
}

/// A run's hold on its output directory: a lock file no other run can
/// lock while this one lives, removed when it ends; and the directory
/// too if the run made it and wrote nothing into it (it failed first).
struct Writing {
    lock: PathBuf,
    file: std::fs::File,
    made: Option<PathBuf>,
}

impl Drop for Writing {
    fn drop(&mut self) {
        let _ = self.file.unlock();
        let _ = std::fs::remove_file(&self.lock);
        if let Some(dir) = &self.made {
            // Only if empty: results, once written, stay.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Reserves `dir` for this run: two runs given one `--out` wrote their
/// workers' histories into the same files, so both lost their results and
/// one reported a mutual-exclusion violation that never happened.
fn reserve_out(dir: &Path) -> anyhow::Result<Writing> {
    use std::io::Write as _;
    let made = (!dir.exists()).then(|| dir.to_path_buf());
    std::fs::create_dir_all(dir).with_context(|| format!("creating --out {}", dir.display()))?;
    let path = dir.join(".lockbench-run.lock");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    if file.try_lock().is_err() {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        anyhow::bail!(
            "--out {}: another lockbench run (pid {}) is writing there; give this run another --out",
            dir.display(),
            holder.trim()
        );
    }
    file.set_len(0)
        .and_then(|()| write!(file, "{}", std::process::id()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(Writing {
        lock: path,
        file,
        made,
    })
}

/// Runs one backend x workload; returns its summary and output directory.
pub async fn execute(args: &RunArgs) -> anyhow::Result<(harness::summary::Summary, PathBuf)> {
    let Resolved {
        backend,
        workers,
        hold_ms,
        duration_ms,
        ops,
        coupon,
        mut run_id,
        mut key,
        mut out_dir,
        mut fault,
        topology,
    } = resolve(args, &timestamp())?;
    let _claimed = match (&args.out, &args.run_id) {
        (None, None) => {
            let (id, claimed) = claim_dir(Path::new("reports"), &run_id)?;
            if id != run_id {
                run_id = id;
                key = format!("lockbench:{run_id}");
                out_dir = PathBuf::from("reports").join(&run_id);
                if let Some(f) = &mut fault {
                    f.key = key.clone();
                }
            }
            Some(claimed)
        }
        _ => None,
    };
    // After `_claimed`, so dropped before it: an empty claimed directory
    // is still removed.
    let _writing = reserve_out(&out_dir)?;
    let w = args.workload;
    // Bound before any server starts: a taken port or a non-loopback
    // address fails at once, naming the flag.
    anyhow::ensure!(
        args.metrics_addr.is_none() || args.hosts.is_none(),
        "--metrics-addr serves this host's workers only; it cannot be combined with --hosts"
    );
    let metrics = match args.metrics_addr {
        Some(addr) => Some(crate::metrics::bind(addr).await?),
        None => None,
    };
    let settings = load_settings(args)?;
    // Settings first: a bad config fails before any server starts.
    let mut cfg = settings.for_backend(backend, args.endpoint.as_deref())?;

    // Servers: the user's own (--endpoint, or an endpoint set in the config
    // file or the environment), or a fleet started (and torn down) here.
    let own = args
        .endpoint
        .clone()
        .or_else(|| backend.configured_endpoint(&cfg));
    anyhow::ensure!(
        own.is_some() || args.hosts.is_none(),
        "--hosts: the workers on other hosts must reach the lock's servers: give its endpoint in --config (table [{}]), the file every host reads",
        backend.family()
    );
    let servers = if own.is_some() {
        Servers::External
    } else {
        let durability = args.durability;
        let servers =
            tokio::task::spawn_blocking(move || Servers::start_with(topology, durability))
                .await??;
        if let Some(ep) = servers.endpoint() {
            backend.set_endpoint(&mut cfg, &ep)?;
        }
        servers
    };
    let topology = servers.describe(own.as_deref());
    let mut durability = servers.durability_record();
    if let Some(f) = &fault {
        anyhow::ensure!(
            !f.kind.on_servers() || !servers.nodes().is_empty(),
            "--fault {} acts on the lock's server processes: it needs servers lockbench starts itself (no --endpoint, no endpoint in the config or environment)",
            f.kind.cli_name()
        );
    }

    // The data the ledger and coupon workloads protect: the backend's own
    // PostgreSQL / Redis when it has one, else one started for the run.
    // The PostgreSQL is durable whatever --durability says, so the data
    // store is the same for every backend: a volatile pg-* run keeps its
    // data on a second server. The Redis of the pre-deduct baseline is the
    // mechanism measured, not a store beside it: it follows the profile.
    let strategy = coupon.as_ref().map(|c| c.strategy);
    let needs_pg = matches!(w, Workload::Ledger | Workload::Coupon);
    let needs_redis = strategy == Some(harness::spec::Strategy::RedisPrededuct);
    let mut data_servers: Vec<Servers> = Vec::new();
    let data_pg_url = if !needs_pg {
        None
    } else {
        let given = match &servers {
            Servers::Postgres(f)
                if f.node
                    .durability()
                    .is_some_and(|d| d.profile == fleet::Durability::Durable) =>
            {
                Some(f.url())
            }
            Servers::External => {
                own_data_url(&settings, &lockbench_postgres::PG_ROW, backend, &cfg)?
            }
            _ => None,
        };
        Some(match given {
            Some(url) => url,
            None => {
                // Hosts elsewhere could not reach one started here.
                anyhow::ensure!(
                    args.hosts.is_none(),
                    "--hosts: the data and the run meet in a PostgreSQL every host reaches: set [postgres] url in --config"
                );
                let f = tokio::task::spawn_blocking(fleet::PostgresFleet::start).await??;
                let url = f.url();
                data_servers.push(Servers::Postgres(Box::new(f)));
                url
            }
        })
    };
    let data_redis_url = if !needs_redis {
        None
    } else {
        let given = match &servers {
            Servers::Redis(f) => Some(f.nodes[0].url()),
            Servers::Sentinel(f) => Some(f.primary.url()),
            Servers::External => own_data_url(&settings, &lockbench_redis::REDIS, backend, &cfg)?,
            _ => None,
        };
        Some(match given {
            Some(url) => url,
            None => {
                let d = args.durability;
                let f = tokio::task::spawn_blocking(move || fleet::RedisFleet::single_with(d))
                    .await??;
                let url = f.nodes[0].url();
                data_servers.push(Servers::Redis(f));
                url
            }
        })
    };
    // Separately started data servers, with their own settings; a data
    // store that is the lock's own server is already under `servers`.
    durability["requested"] = args.durability.to_string().into();
    durability["data_servers"] = data_servers
        .iter()
        .flat_map(|d| d.durability().unwrap_or_default())
        .collect();
    let mut topology = topology;
    for d in &data_servers {
        match d {
            Servers::Postgres(f) => {
                topology += &format!(" + data postgresql at {}", f.node.host_port())
            }
            Servers::Redis(f) => {
                topology += &format!(" + data redis at {}", f.nodes[0].host_port())
            }
            _ => {}
        }
    }

    // Fail fast, naming the endpoint, before spawning any worker.
    let params = BuildParams {
        hold: Duration::from_millis(hold_ms),
        probes: false,
        key: key.clone(),
    };
    drop(backend.connect(&cfg, params).await?);
    let server_version = backend.server_version(&cfg).await;

    let plan = RunPlan {
        backend: backend.name().to_string(),
        // The workers need the real settings (passwords included); they get
        // them on stdin. Only the redacted form is written to disk.
        backend_config: cfg.clone(),
        workload: args.workload,
        workers,
        ops,
        hold_ms,
        lease_ms: args.lease_ms,
        wait_ms: args.wait_ms,
        key: format!("lockbench:{run_id}"),
        max_secs: args.max_secs,
        keys: args.keys,
        duration_ms,
        seed: args.seed,
        data_pg_url: data_pg_url.clone(),
        data_redis_url: data_redis_url.clone(),
        coupon: coupon.clone(),
        announce_holds: fault.as_ref().is_some_and(|f| f.kind.needs_holds()),
        fault_point: fault.as_ref().and_then(|f| {
            f.point?;
            Some(harness::spec::ArmPoint {
                worker: 0,
                at_ms: u64::try_from(f.at.as_millis()).unwrap_or(u64::MAX),
                action: match f.kind {
                    FaultKind::HolderPause => distlock::faultpoint::Action::Stall(f.duration),
                    _ => distlock::faultpoint::Action::Exit,
                },
            })
        }),
        warmup_ms: args.warmup_ms,
        rate: args.rate,
        across_hosts: args.hosts.is_some(),
        metrics: metrics.is_some(),
    };
    let data = match &data_pg_url {
        Some(url) => Some(DataDb::connect(url, &plan.key, 4).await?),
        None => None,
    };
    let prededuct = PredeductKeys::new(&plan.key);
    match (&data, &coupon) {
        (Some(db), Some(c)) => {
            db.prepare_coupon(c).await?;
            if let Some(url) = &data_redis_url {
                harness::data::prepare_prededuct(url, &prededuct, c.stock).await?;
            }
        }
        (Some(db), None) => db.prepare_ledger(&plan.key).await?,
        _ => {}
    }
    // The pre-deduct baseline's orders reach PostgreSQL through a consumer
    // that runs beside the workers, as in the seed's final design.
    let (stop_consumer, stop_rx) = tokio::sync::watch::channel(false);
    let consumer = match (&data, &data_redis_url) {
        (Some(db), Some(url)) => {
            let (db, url, keys) = (db.clone(), url.clone(), prededuct.clone());
            Some(tokio::spawn(async move {
                harness::data::consume_orders(&url, &keys, &db, stop_rx).await
            }))
        }
        _ => None,
    };
    let total = u64::from(workers).saturating_mul(ops);
    let bar = if std::io::stderr().is_terminal() && !args.quiet {
        let (b, template) = if duration_ms.is_some() {
            (
                ProgressBar::new_spinner(),
                "{spinner} {msg} {pos} cycles ({per_sec}, {elapsed})",
            )
        } else {
            (
                ProgressBar::new(total),
                "{spinner} {msg} [{bar:40}] {pos}/{len} cycles ({per_sec}, eta {eta})",
            )
        };
        b.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(format!("{} {:?}", backend.name(), args.workload));
        b
    } else {
        ProgressBar::hidden()
    };
    let exe = std::env::current_exe().context("locating the lockbench binary for workers")?;
    let live = coordinator::LiveWorkers::default();
    let servers = std::sync::Arc::new(servers);
    let (stop_nemesis, nemesis_rx) = tokio::sync::watch::channel(false);
    let nemesis = fault
        .clone()
        .map(|f| tokio::spawn(nemesis::run(f, servers.clone(), live.clone(), nemesis_rx)));
    let serving = metrics.map(|l| crate::metrics::serve(l, live.clone()));
    let mut hosts = None;
    let mut cpu_mark = None;
    let out = match args.hosts {
        Some(n) => {
            // The directory exists (reserved above), and goes again with
            // the reservation if this run made it and never began.
            let meet = crate::hosts::meeting_url(&settings)?;
            let join = Duration::from_secs(args.join_timeout);
            crate::hosts::coordinate(&plan, backend, &meet, &run_id, n, join, &bar)
                .await
                .map(|(out, record)| {
                    hosts = Some(record);
                    out
                })
        }
        None => {
            let worker_args = ["worker".to_string()];
            cpu_mark = Some(harness::cpu::Mark::now(servers_cpu_ms(&servers)));
            let run = coordinator::run(&plan, &exe, &worker_args, &out_dir, &live, |n| {
                bar.set_position(n)
            });
            tokio::select! {
                out = run => out.map_err(anyhow::Error::from),
                never = stop_on_a_death(&servers, &data_servers, &live) => match never {},
            }
        }
    };
    if let Some(task) = serving {
        task.abort();
    }
    let _ = stop_nemesis.send(true);
    // The fault is undone (servers resumed or restarted) before anything
    // else happens, whatever the run's outcome.
    let mut faults = Vec::new();
    if let Some(h) = nemesis {
        faults.extend(h.await??);
    }
    let out = out?;
    // Read before anything else runs; a fault's kills and restarts would
    // count as the servers' and workers' work, so not under a fault.
    let cpu = cpu_mark
        .filter(|_| fault.is_none())
        .map(|m| (m, servers_cpu_ms(&servers)));
    bar.finish_and_clear();
    for f in &mut faults {
        nemesis::measure(f, &out.history);
    }
    let _ = stop_consumer.send(true);
    // A consumer that failed (Redis gone at the end) leaves the run's
    // history and results to be written, with the reason.
    let mut consumer_error = None;
    let consumer = match consumer {
        Some(h) => match h.await {
            Ok(Ok(stats)) => Some(stats),
            Ok(Err(e)) => {
                consumer_error = Some(format!("the order stream's consumer: {e}"));
                None
            }
            Err(e) => {
                consumer_error = Some(format!("the order stream's consumer: {e}"));
                None
            }
        },
        None => None,
    };

    // Across hosts there is no clock to compare: each host's history is
    // checked on its own, and the database's stamps check them together.
    let overlap = match &hosts {
        Some(h) => h.per_host.clone(),
        None => harness::checker::check_overlap(&out.history),
    };
    let mut summary = harness::summary::summarize(&plan, &out, &overlap);
    if hosts.is_none() && overlap.violations > 0 {
        let spans: Vec<harness::timeline::FaultSpan> = faults
            .iter()
            .filter(|f| f.skipped.is_none())
            .map(|f| {
                let name = f.fault.cli_name();
                (format!("{name}: {}", f.target), f.started_ns, f.healed_ns)
            })
            .collect();
        summary.timeline = harness::timeline::build(&out.history, &overlap, &spans);
    }
    if hosts.is_none() {
        summary.token_regressions = harness::checker::token_regressions(&out.history);
    }
    summary.hosts = hosts;
    summary.cpu = cpu.map(|(m, now)| m.since(now, summary.ops_ok));
    // The data store may have restarted under the run (a node-kill of a
    // pg-* lock keeps its data there): the pooled connections from before
    // are dead and the pool does not test them, so the checks get fresh
    // ones. A check that still fails is recorded, not fatal: the history
    // and results are written either way.
    let data = match (data, &data_pg_url) {
        (Some(old), Some(url)) => {
            old.close(Duration::from_secs(1)).await;
            Some(DataDb::connect(url, &plan.key, 4).await)
        }
        _ => None,
    };
    match data {
        Some(Ok(db)) => {
            let checked = match &coupon {
                Some(c) => output::coupon_report(&db, c, &out, consumer)
                    .await
                    .map(|r| summary.coupon = Some(r)),
                None => db
                    .check_ledger(&plan.key, backend.capabilities().fencing)
                    .await
                    .map(|r| summary.ledger = Some(r))
                    .map_err(anyhow::Error::from),
            };
            if let Err(e) = checked {
                summary.data_check_error = Some(output::causes(&e));
            }
            db.close(Duration::from_secs(5)).await;
        }
        Some(Err(e)) => summary.data_check_error = Some(e.to_string()),
        None => {}
    }
    if let Some(e) = consumer_error {
        summary.data_check_error.get_or_insert(e);
    }
    // A node a fault killed on purpose has no exit status (the kill takes
    // its process); one that has a status died on its own, restarted
    // nodes included, so the check holds under node-kill and failover too.
    summary.servers_exited = servers
        .nodes()
        .into_iter()
        .chain(data_servers.iter().flat_map(|d| d.nodes()))
        .filter_map(|n| {
            let status = n.exit_status()?;
            let last = n.log_tail(1);
            Some(format!(
                "{} ({}) exited during the run ({status}){}",
                n.name(),
                n.host_port(),
                if last.trim().is_empty() {
                    String::new()
                } else {
                    format!("; its log ends: {}", last.trim())
                }
            ))
        })
        .collect();
    drop(data_servers);
    drop(servers);
    let mut history = Vec::new();
    harness::history::write_jsonl(&mut history, &out.history)?;
    harness::write_atomic(&out_dir.join("history.jsonl"), &history)?;
    let results = serde_json::json!({
        "tool": "lockbench",
        "version": env!("CARGO_PKG_VERSION"),
        "run_id": run_id,
        "seed": args.seed,
        "topology": topology,
        "durability": durability,
        "server_version": server_version,
        "capabilities": backend.capabilities(),
        "negative_control": backend.negative_control(),
        "plan": plan,
        "summary": summary,
        "overlap": overlap,
        "faults": faults,
    });
    let mut plan_json = results;
    // Secrets never reach disk: the plan carries the settings with their URLs.
    if let Some(c) = plan_json.pointer_mut("/plan/backend_config") {
        *c = backend.redacted(&cfg);
    }
    // ... and so do the data stores' URLs (the ledger's PostgreSQL is often
    // the user's own, password included).
    for p in ["/plan/data_pg_url", "/plan/data_redis_url"] {
        if let Some(serde_json::Value::String(u)) = plan_json.pointer_mut(p) {
            *u = distlock::redact_url(u);
        }
    }
    harness::write_atomic(
        &out_dir.join("results.json"),
        serde_json::to_string_pretty(&plan_json)?.as_bytes(),
    )?;
    Ok((summary, out_dir))
}

/// The CPU time the lock's servers have used so far, ms, when this run
/// started them.
fn servers_cpu_ms(servers: &Servers) -> Option<f64> {
    let nodes = servers.nodes();
    (!nodes.is_empty()).then(|| nodes.iter().map(|n| n.cpu_ms()).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(backend: &str, workload: Workload) -> RunArgs {
        RunArgs::for_compare(backend, workload, PathBuf::from("/tmp/x"), None)
    }

    /// Runs started in the same second each get a directory of their own
    /// (and so a lock key of their own), even when they claim it at once;
    /// a claimed directory left empty by a failed run is removed.
    #[test]
    fn same_second_runs_claim_distinct_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let reports = tmp.path().join("reports");
        let claims: Vec<(String, ClaimedDir)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| claim_dir(&reports, "20261206-000000-redis-mutex").unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ids: std::collections::BTreeSet<&str> =
            claims.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids.len(), 8, "{ids:?}");
        assert!(ids.contains("20261206-000000-redis-mutex"));
        assert!(ids.contains("20261206-000000-redis-mutex-8"));
        let (_, kept) = &claims[0];
        std::fs::write(kept.0.join("results.json"), "{}").unwrap();
        let kept = kept.0.clone();
        drop(claims);
        assert!(kept.is_dir(), "a directory with results was removed");
        assert_eq!(std::fs::read_dir(&reports).unwrap().count(), 1);
    }

    fn err(a: &RunArgs) -> String {
        resolve(a, "t")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    /// A partition between servers that never talk to each other cut
    /// nothing and was reported as done (single redis, RedLock's masters).
    #[test]
    fn a_partition_needs_servers_that_talk_to_each_other() {
        for (backend, topology) in [
            ("redis", TopologyChoice::Single),
            ("redlock", TopologyChoice::Single),
            ("pg-row", TopologyChoice::Single),
            ("etcd", TopologyChoice::Single),
        ] {
            let mut a = args(backend, Workload::Mutex);
            a.fault = Some(FaultKind::Partition);
            a.fault_target = crate::nemesis::NodeTarget::Minority;
            a.topology = topology;
            let e = err(&a);
            assert!(
                e.contains("never talk to each other") && e.contains("partition-clients"),
                "{backend}: {e}"
            );
        }
        for backend in ["etcd", "zookeeper", "redis"] {
            let mut a = args(backend, Workload::Mutex);
            a.fault = Some(FaultKind::Partition);
            a.fault_target = crate::nemesis::NodeTarget::Minority;
            a.topology = TopologyChoice::Cluster;
            assert!(resolve(&a, "t").is_ok(), "{backend}: {}", err(&a));
        }
    }

    #[test]
    fn a_bad_rate_is_refused_by_name() {
        let mut a = args("redis", Workload::Latency);
        a.rate = Some(0.0);
        assert!(err(&a).contains("--rate 0"), "{}", err(&a));
        a.rate = Some(f64::NAN);
        assert!(err(&a).contains("--rate"), "{}", err(&a));
        let mut a = args("redis", Workload::Ledger);
        a.rate = Some(100.0);
        assert!(err(&a).contains("latency and throughput"), "{}", err(&a));
        let mut a = args("redis", Workload::Throughput);
        a.rate = Some(100.0);
        assert!(resolve(&a, "t").is_ok());
    }

    #[test]
    fn defaults_follow_the_workload() {
        let r = resolve(&args("redis", Workload::Mutex), "20261203-000000").unwrap();
        assert_eq!(
            (r.workers, r.ops, r.hold_ms, r.duration_ms),
            (4, 100, 10, None)
        );
        assert_eq!(r.run_id, "20261203-000000-redis-mutex");
        let r = resolve(&args("etcd", Workload::Latency), "t").unwrap();
        assert_eq!((r.workers, r.ops, r.hold_ms), (1, 2000, 0));
        let r = resolve(&args("zookeeper", Workload::Throughput), "t").unwrap();
        assert_eq!((r.duration_ms, r.ops), (Some(5_000), u64::MAX));
        let r = resolve(&args("pg-row", Workload::Coupon), "t").unwrap();
        // 300 users x 3 clicks over 8 workers, rounded up.
        assert_eq!((r.workers, r.ops), (8, 113));
        assert!(r.coupon.is_some());
    }

    #[test]
    fn bad_arguments_name_their_flag() {
        let mut a = args("redis", Workload::Mutex);
        a.workers = Some(0);
        assert!(err(&a).contains("--workers"), "{}", err(&a));
        let mut a = args("redis", Workload::Throughput);
        a.duration = Some(1e9);
        assert!(err(&a).contains("--duration"), "{}", err(&a));
        let mut a = args("redis", Workload::Coupon);
        a.users = 0;
        assert!(err(&a).contains("--users"), "{}", err(&a));
        assert!(err(&args("redis-clustr", Workload::Mutex)).contains("redis-wait"));
    }

    /// Values that alone outlast the run's hard limit are refused up front
    /// (they stalled until --max-secs, and the run's results were lost).
    #[test]
    fn waits_longer_than_the_run_are_refused_by_name() {
        let mut a = args("redis", Workload::Mutex);
        a.hold_ms = Some(99_999_999_999);
        assert!(err(&a).contains("--hold-ms"), "{}", err(&a));
        let mut a = args("redis", Workload::Latency);
        a.warmup_ms = 99_999_999_999;
        assert!(err(&a).contains("--warmup-ms"), "{}", err(&a));
        let mut a = args("redis", Workload::Latency);
        a.rate = Some(0.001);
        a.ops = Some(10);
        assert!(err(&a).contains("--rate"), "{}", err(&a));
        for l in [0, 99_999_999_999_999] {
            let mut a = args("redis", Workload::Mutex);
            a.lease_ms = Some(l);
            assert!(err(&a).contains("--lease-ms"), "{}", err(&a));
        }
        let mut a = args("redis", Workload::Mutex);
        a.max_secs = 0;
        assert!(err(&a).contains("--max-secs"), "{}", err(&a));
        // Within the limit: fine.
        let mut a = args("redis", Workload::Mutex);
        a.hold_ms = Some(50);
        a.lease_ms = Some(500);
        assert!(resolve(&a, "t").is_ok());
    }

    #[test]
    fn cluster_topology_only_where_the_backend_has_one() {
        let mut a = args("etcd", Workload::Mutex);
        a.topology = TopologyChoice::Cluster;
        assert_eq!(resolve(&a, "t").unwrap().topology, Topology::EtcdCluster(3));
        let mut a = args("redis", Workload::Mutex);
        a.topology = TopologyChoice::Cluster;
        assert!(matches!(
            resolve(&a, "t").unwrap().topology,
            Topology::RedisCluster { masters: 3, .. }
        ));
        let mut a = args("pg-advisory", Workload::Mutex);
        a.topology = TopologyChoice::Cluster;
        assert!(err(&a).contains("--topology cluster"), "{}", err(&a));
        let mut a = args("redis", Workload::Mutex);
        a.topology = TopologyChoice::Sentinel;
        assert_eq!(
            resolve(&a, "t").unwrap().topology,
            Topology::RedisPrimaryReplica
        );
        let mut a = args("redlock", Workload::Mutex);
        a.topology = TopologyChoice::Sentinel;
        assert!(err(&a).contains("--topology sentinel"), "{}", err(&a));
    }

    #[test]
    fn the_in_memory_lock_is_refused_with_the_reason() {
        let e = err(&args("memory", Workload::Mutex));
        assert!(e.contains("memory") && e.contains("process"), "{e}");
    }
}
