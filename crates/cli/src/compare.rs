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
}

/// The flash sale every variant runs: 1,800 clicks from 8 processes.
fn sale_args(backend: &str, out: PathBuf, cfg: &Option<PathBuf>) -> RunArgs {
    let mut a = RunArgs::for_compare(backend, Workload::Coupon, out, cfg.clone());
    a.stock = 200;
    a.users = 600;
    a.clicks = 3;
    a
}

async fn step(what: &str, args: RunArgs) -> anyhow::Result<Summary> {
    eprintln!("== {what}");
    Ok(execute(&args).await?.0)
}

/// Runs the suite, prints the tables, writes `comparison.json` and
/// `index.html`.
pub async fn compare(args: CompareArgs) -> anyhow::Result<ExitCode> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(format!("{}-compare", timestamp())));
    let cfg = &args.config;
    let mut rows = Vec::new();
    let selected = |name: &str| args.backends.is_empty() || args.backends.iter().any(|n| n == name);
    for b in BACKENDS
        .iter()
        .filter(|b| b.distributed() && selected(b.name()))
    {
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
        let (mut latency, mut contended, mut disjoint, mut coupon) = (None, None, None, None);
        if !b.negative_control() {
            latency = Some(
                step(
                    &format!("{}: latency (uncontended, next to the raw floor)", b.name()),
                    RunArgs::for_compare(b.name(), Workload::Latency, dir("latency"), cfg.clone()),
                )
                .await?,
            );
            for (keys, slot, name) in [
                (1, &mut contended, "contended"),
                (4, &mut disjoint, "disjoint"),
            ] {
                let mut a =
                    RunArgs::for_compare(b.name(), Workload::Throughput, dir(name), cfg.clone());
                a.keys = keys;
                a.duration = Some(args.throughput_secs);
                *slot = Some(
                    step(
                        &format!("{}: throughput, 4 processes on {keys} key(s)", b.name()),
                        a,
                    )
                    .await?,
                );
            }
            coupon = Some(
                step(
                    &format!("{}: flash sale, lock per user+voucher", b.name()),
                    sale_args(b.name(), dir("coupon"), cfg),
                )
                .await?,
            );
        }
        rows.push(Row {
            backend: b.name().to_string(),
            about: b.about().to_string(),
            negative_control: b.negative_control(),
            needs_fault: b.needs_fault().map(str::to_string),
            capabilities: b.capabilities(),
            ledger: Some(ledger),
            latency,
            contended,
            disjoint,
            coupon,
        });
    }
    let mut sale = Vec::new();
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
            let summary = step(&format!("flash sale: {label}"), a).await?;
            sale.push(SaleRun {
                label: label.to_string(),
                note: note.to_string(),
                backend: "redis".into(),
                summary,
            });
        }
    }
    let comparison = Comparison {
        generated_utc: timestamp(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        rows,
        sale,
    };
    print_tables(&comparison);
    let (json, html) = write(&comparison, &out)?;
    println!("\nwritten: {}\n         {}", json.display(), html.display());
    Ok(ExitCode::SUCCESS)
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
