//! `lockbench compare`: the default comparison suite. Every registered
//! backend runs the same workloads against servers started for it; one
//! table, one `comparison.json`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use harness::summary::Summary;
use harness::Workload;

use crate::registry::BACKENDS;
use crate::run::{execute, timestamp, RunArgs};

/// Options of `lockbench compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Only these backends (comma-separated) [default: all registered].
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// TOML config file passed to every run (see `lockbench run --help`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Output directory [default: reports/<timestamp>-compare].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct Row {
    backend: String,
    negative_control: bool,
    mutex: Summary,
    latency: Option<Summary>,
}

/// Runs the suite, prints the table, writes `comparison.json`.
pub async fn compare(args: CompareArgs) -> anyhow::Result<ExitCode> {
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("reports").join(format!("{}-compare", timestamp())));
    let mut rows = Vec::new();
    for b in BACKENDS {
        if !args.backends.is_empty() && !args.backends.iter().any(|n| n == b.name) {
            continue;
        }
        eprintln!("== {}: mutex (4 processes x 100 x 10 ms)", b.name);
        let mutex_args = RunArgs::for_compare(
            b.name,
            Workload::Mutex,
            out.join(format!("{}-mutex", b.name)),
            args.config.clone(),
        );
        let (mutex, _) = execute(&mutex_args).await?;
        // A broken lock's latency says nothing anyone should act on.
        let latency = if b.negative_control {
            None
        } else {
            eprintln!(
                "== {}: latency (uncontended, next to the raw floor)",
                b.name
            );
            let lat_args = RunArgs::for_compare(
                b.name,
                Workload::Latency,
                out.join(format!("{}-latency", b.name)),
                args.config.clone(),
            );
            Some(execute(&lat_args).await?.0)
        };
        rows.push(Row {
            backend: b.name.to_string(),
            negative_control: b.negative_control,
            mutex,
            latency,
        });
    }
    println!();
    println!(
        "| {:<24} | {:>10} | {:>12} | {:>11} | {:>12} | {:>11} | {:>10} | {:>6} |",
        "backend",
        "violations",
        "overlap ms",
        "unlock=0",
        "cycle p50 µs",
        "floor p50 µs",
        "ratio",
        "cyc/s"
    );
    println!("|{}|", "-".repeat(124));
    for r in &rows {
        let (c, f, ratio) = match &r.latency {
            Some(l) => (
                format!("{:.1}", l.cycle_p50_us),
                l.floor_p50_us.map_or("-".into(), |v| format!("{v:.1}")),
                l.floor_ratio.map_or("-".into(), |v| format!("{v:.2}x")),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {:<24} | {:>10} | {:>12.3} | {:>11} | {:>12} | {:>11} | {:>10} | {:>6.0} |",
            if r.negative_control {
                format!("{} (ctl)", r.backend)
            } else {
                r.backend.clone()
            },
            r.mutex.violations,
            r.mutex.max_overlap_ms,
            r.mutex.release_not_held,
            c,
            f,
            ratio,
            r.mutex.throughput_per_s
        );
    }
    let path = out.join("comparison.json");
    harness::write_atomic(&path, serde_json::to_string_pretty(&rows)?.as_bytes())?;
    println!("\nmutex: 4 worker processes x 100 cycles x 10 ms on one key; violations = overlapping critical sections");
    println!("unlock=0: releases that found the lock already gone; (ctl) = deliberately broken negative control");
    println!("written: {}", path.display());
    Ok(ExitCode::SUCCESS)
}
