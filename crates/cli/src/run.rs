//! `lockbench run`: start the servers (or use the given endpoint), drive
//! worker processes, check, write `results.json` + `history.jsonl`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use harness::coordinator::{self, RunPlan};
use harness::Workload;
use indicatif::{ProgressBar, ProgressStyle};

use crate::registry::{self, BackendConfig, BuildParams, Topology};

/// Options of `lockbench run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Backend to run (see `lockbench backends`).
    #[arg(long, short)]
    backend: String,
    /// Workload: `mutex` (W workers x ops x hold on one key) or `latency`
    /// (uncontended acquire+release next to the raw floor).
    #[arg(long, short, value_enum, default_value = "mutex")]
    workload: Workload,
    /// Worker OS processes [default: 4 for mutex, 1 for latency].
    #[arg(long)]
    workers: Option<u32>,
    /// Lock cycles per worker [default: 100 for mutex, 2000 for latency].
    #[arg(long)]
    ops: Option<u64>,
    /// Milliseconds inside the critical section [default: 10 for mutex, 0
    /// for latency].
    #[arg(long)]
    hold_ms: Option<u64>,
    /// Fixed lease in ms; without it the watchdog renews the backend's
    /// lease (Redisson semantics).
    #[arg(long)]
    lease_ms: Option<u64>,
    /// How long one acquire may wait for the lock, in ms.
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
    /// Hard limit on each worker's loop, in seconds.
    #[arg(long, default_value_t = 600)]
    max_secs: u64,
    /// Seed recorded with the run (reproducible schedules).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Use this server instead of starting one: e.g. redis://my-redis:6379;
    /// for redlock a comma-separated list of masters; for pg-*
    /// postgres://user@host:5432/db; for etcd a comma-separated list of
    /// http:// client URLs. Overrides the config file and the
    /// LOCKBENCH_*_URL(S) / LOCKBENCH_ETCD_ENDPOINTS variables.
    #[arg(long)]
    endpoint: Option<String>,
    /// TOML file with one table per backend family: `[redis]`, `[redlock]`,
    /// `[postgres]` (e.g. `url = ...`), `[etcd]` (`endpoints = [...]`).
    /// Environment variables (LOCKBENCH_REDIS_URL, LOCKBENCH_REDLOCK_URLS,
    /// LOCKBENCH_PG_URL, LOCKBENCH_ETCD_ENDPOINTS, ...) override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Output directory [default: reports/<run-id>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

impl RunArgs {
    /// Arguments for one run of the comparison suite.
    pub fn for_compare(
        backend: &str,
        workload: Workload,
        out: PathBuf,
        config: Option<PathBuf>,
    ) -> Self {
        Self {
            backend: backend.to_string(),
            workload,
            workers: None,
            ops: None,
            hold_ms: None,
            lease_ms: None,
            wait_ms: 10_000,
            max_secs: 600,
            seed: 1,
            endpoint: None,
            config,
            out: Some(out),
            json: false,
            quiet: false,
        }
    }
}

/// Keeps the servers of a run alive until dropped.
enum Servers {
    External,
    Redis(fleet::RedisFleet),
    Sentinel(Box<fleet::SentinelFleet>),
    Postgres(Box<fleet::PostgresFleet>),
    Etcd(fleet::EtcdFleet),
}

fn load_config(args: &RunArgs) -> anyhow::Result<BackendConfig> {
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            toml::from_str::<BackendConfig>(&text)
                .with_context(|| format!("config file {}", path.display()))?
        }
        None => BackendConfig::default(),
    };
    cfg.redis = cfg.redis.with_env()?;
    cfg.redlock = cfg.redlock.with_env();
    cfg.postgres = cfg.postgres.with_env();
    cfg.etcd = cfg.etcd.with_env()?;
    Ok(cfg)
}

/// `YYYYmmdd-HHMMSS` in UTC, from the system clock.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
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

async fn redis_version(url: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut con = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut con)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| format!("redis {}", v.trim()))
}

async fn pg_version(cfg: &lockbench_postgres::PgConfig) -> Option<String> {
    use sqlx::Connection;
    let opts = cfg.connect_options().ok()?;
    let mut c = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::PgConnection::connect_with(&opts),
    )
    .await
    .ok()?
    .ok()?;
    let v: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut c)
        .await
        .ok()?;
    Some(format!("postgresql {v}"))
}

/// `lockbench run`.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let (summary, out_dir) = execute(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_human(&summary, &out_dir);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs one backend x workload; returns its summary and output directory.
pub async fn execute(args: &RunArgs) -> anyhow::Result<(harness::summary::Summary, PathBuf)> {
    let backend = registry::find(&args.backend)?;
    let mut cfg = load_config(args)?;
    let latency = args.workload == Workload::Latency;
    let workers = args.workers.unwrap_or(if latency { 1 } else { 4 });
    let ops = args.ops.unwrap_or(if latency { 2000 } else { 100 });
    let hold_ms = args.hold_ms.unwrap_or(if latency { 0 } else { 10 });
    anyhow::ensure!(
        (1..=256).contains(&workers),
        "--workers must be 1..=256, got {workers}"
    );
    anyhow::ensure!(ops >= 1, "--ops must be at least 1");
    let run_id = format!("{}-{}-{:?}", timestamp(), backend.name, args.workload).to_lowercase();
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(&run_id));

    // Servers: the given endpoint, or a fleet started (and torn down) here.
    let servers = if let Some(ep) = &args.endpoint {
        // RedLock takes the masters as a comma-separated list.
        cfg.redis.url = ep.clone();
        cfg.redlock.urls = ep.split(',').map(|s| s.trim().to_string()).collect();
        cfg.postgres.url = ep.clone();
        cfg.etcd.endpoints = lockbench_etcd::split_endpoints(ep);
        Servers::External
    } else {
        let topo = backend.topology;
        let servers = tokio::task::spawn_blocking(move || -> anyhow::Result<Servers> {
            Ok(match topo {
                Topology::RedisSingle => Servers::Redis(fleet::RedisFleet::single()?),
                Topology::RedisIndependent(n) => Servers::Redis(fleet::RedisFleet::independent(n)?),
                Topology::Postgres => Servers::Postgres(Box::new(fleet::PostgresFleet::start()?)),
                Topology::Etcd => Servers::Etcd(fleet::EtcdFleet::single()?),
                Topology::RedisPrimaryReplica => {
                    Servers::Sentinel(Box::new(fleet::SentinelFleet::start()?))
                }
            })
        })
        .await??;
        match &servers {
            Servers::Redis(f) => {
                cfg.redis.url = f.nodes[0].url();
                cfg.redlock.urls = f.urls();
            }
            Servers::Sentinel(f) => cfg.redis.url = f.primary.url(),
            Servers::Postgres(f) => cfg.postgres.url = f.url(),
            Servers::Etcd(f) => cfg.etcd.endpoints = f.endpoints(),
            Servers::External => {}
        }
        servers
    };
    let topology = match &servers {
        Servers::External => format!("external {}", lockbench_redis::redact(&cfg.redis.url)),
        Servers::Redis(f) if f.nodes.len() == 1 => {
            format!("fleet: redis single at {}", f.nodes[0].host_port())
        }
        Servers::Redis(f) => format!(
            "fleet: {} independent redis masters at {}",
            f.nodes.len(),
            f.nodes
                .iter()
                .map(|n| n.host_port())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Servers::Postgres(f) => format!("fleet: postgresql at {}", f.node.host_port()),
        Servers::Etcd(f) => format!(
            "fleet: etcd x{} at {}",
            f.nodes.len(),
            f.endpoints().join(", ")
        ),
        Servers::Sentinel(f) => format!(
            "fleet: redis primary {} + replica {} + 3 sentinels",
            f.primary.host_port(),
            f.replica.host_port()
        ),
    };

    // Fail fast, naming the endpoint, before spawning any worker.
    let params = BuildParams {
        hold: Duration::from_millis(hold_ms),
        probes: false,
    };
    drop(registry::connect(backend.name, &cfg, params).await?);
    let server_version = match backend.topology {
        Topology::Postgres => pg_version(&cfg.postgres).await,
        Topology::Etcd => lockbench_etcd::server_version(&cfg.etcd).await,
        _ => redis_version(&cfg.redis.url).await,
    };

    let plan = RunPlan {
        backend: backend.name.to_string(),
        backend_config: serde_json::to_value(&cfg)?,
        workload: args.workload,
        workers,
        ops,
        hold_ms,
        lease_ms: args.lease_ms,
        wait_ms: args.wait_ms,
        key: format!("lockbench:{run_id}"),
        max_secs: args.max_secs,
    };
    let total = u64::from(workers) * ops;
    let bar = if std::io::stderr().is_terminal() && !args.quiet {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg} [{bar:40}] {pos}/{len} cycles ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(format!("{} {:?}", backend.name, args.workload));
        b
    } else {
        ProgressBar::hidden()
    };
    let exe = std::env::current_exe().context("locating the lockbench binary for workers")?;
    let out = coordinator::run(&plan, &exe, &["worker".to_string()], &out_dir, |n| {
        bar.set_position(n)
    })
    .await?;
    bar.finish_and_clear();
    drop(servers);

    let overlap = harness::checker::check_overlap(&out.history);
    let summary = harness::summary::summarize(&plan, &out, &overlap);
    let mut history = Vec::new();
    harness::history::write_jsonl(&mut history, &out.history)?;
    harness::write_atomic(&out_dir.join("history.jsonl"), &history)?;
    let results = serde_json::json!({
        "tool": "lockbench",
        "version": env!("CARGO_PKG_VERSION"),
        "run_id": run_id,
        "seed": args.seed,
        "topology": topology,
        "server_version": server_version,
        "capabilities": backend.capabilities,
        "negative_control": backend.negative_control,
        "plan": plan,
        "summary": summary,
        "overlap": overlap,
    });
    let mut plan_json = results.clone();
    // Secrets never reach disk: the plan carries the config with its URL.
    if let Some(url) = plan_json.pointer_mut("/plan/backend_config/redis/url") {
        *url = serde_json::Value::String(lockbench_redis::redact(&cfg.redis.url));
    }
    if let Some(url) = plan_json.pointer_mut("/plan/backend_config/postgres/url") {
        *url = serde_json::Value::String(lockbench_postgres::redact(&cfg.postgres.url));
    }
    if let Some(eps) = plan_json.pointer_mut("/plan/backend_config/etcd/endpoints") {
        *eps = cfg
            .etcd
            .endpoints
            .iter()
            .map(|u| distlock::redact_url(u))
            .collect();
    }
    if let Some(urls) = plan_json.pointer_mut("/plan/backend_config/redlock/urls") {
        *urls = cfg
            .redlock
            .urls
            .iter()
            .map(|u| lockbench_redis::redact(u))
            .collect();
    }
    harness::write_atomic(
        &out_dir.join("results.json"),
        serde_json::to_string_pretty(&plan_json)?.as_bytes(),
    )?;
    Ok((summary, out_dir))
}

fn print_human(s: &harness::summary::Summary, out_dir: &std::path::Path) {
    println!(
        "{} / {} with {} worker process(es)",
        s.backend, s.workload, s.workers
    );
    println!(
        "  acquisitions: {} ok, {} failed, {} unknown; releases that found the lock gone: {}",
        s.ops_ok, s.ops_failed, s.ops_info, s.release_not_held
    );
    println!(
        "  mutual exclusion: {} violation(s), longest overlap {:.3} ms",
        s.violations, s.max_overlap_ms
    );
    println!(
        "  round trips per acquire: {:.2} (mean)",
        s.acquire_round_trips_mean
    );
    println!(
        "  acquire p50 {:.1} µs, p99 {:.1} µs; cycle p50 {:.1} µs, p99 {:.1} µs; {:.0} cycles/s",
        s.acquire_p50_us, s.acquire_p99_us, s.cycle_p50_us, s.cycle_p99_us, s.throughput_per_s
    );
    if let (Some(f), Some(r)) = (s.floor_p50_us, s.floor_ratio) {
        println!("  raw floor p50 {f:.1} µs -> cycle is {r:.2}x the floor");
    }
    for (name, p) in &s.peers {
        println!(
            "  peer {name}: cycle p50 {:.1} µs -> ours is {:.2}x",
            p.cycle.p50_us, p.ratio
        );
    }
    println!("  results: {}", out_dir.join("results.json").display());
}
