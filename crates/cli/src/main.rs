//! `lockbench`: run distributed-lock backends side by side on the same
//! workload, with real servers, and check what they guarantee.

mod args;
mod compare;
mod curve;
mod hosts;
mod metrics;
mod nemesis;
mod output;

mod run;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lockbench_registry as registry;

/// Distributed locks, measured side by side against real servers.
#[derive(Debug, Parser)]
#[command(name = "lockbench", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Run a workload against a backend (starting its servers unless
    /// --endpoint is given) and check the history.
    ///
    /// Exit 0: the lock held; 3: the checkers found it broken (double
    /// holders, lost updates, stale writes accepted, tokens that went
    /// backwards, a failed flash-sale check), results written; 1: the run
    /// failed or its settings were refused (naming the flag or key); 2:
    /// the command line did not parse.
    Run(run::RunArgs),
    /// The default comparison suite: every backend on the same workloads,
    /// one table and reports/<id>/comparison.json.
    Compare(compare::CompareArgs),
    /// Re-render `index.html` from a comparison's `comparison.json` (the
    /// same page, byte for byte, as `compare` wrote), optionally adding
    /// `cargo bench` figures first.
    Report {
        /// The comparison's directory (holding comparison.json), e.g.
        /// reports/latest.
        dir: PathBuf,
        /// Criterion's output directory (e.g. target/criterion after
        /// `cargo bench --bench locks`): its saved estimates are added to
        /// comparison.json, then the page is rendered with the bench
        /// tables and target ratios.
        #[arg(long)]
        criterion: Option<PathBuf>,
    },
    /// List the registered backends and what each declares.
    Backends {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the faults `lockbench run --fault` can inject, and what each needs.
    Faults,
    /// Run the overlap checker on a history.jsonl file; exits 1 when the
    /// history is not mutually exclusive, so a script can rely on it.
    Check {
        /// The history file (one JSON event per line).
        file: PathBuf,
        /// Print the verdict as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One host of a run across several hosts (`lockbench worker --run ID
    /// --config FILE`): joins the run the coordinator's `lockbench run
    /// --hosts N --run ID` opened in the run's PostgreSQL, runs its share
    /// of the workers, writes their history there. Without --run: the
    /// internal per-process worker, orders on stdin.
    Worker(hosts::HostArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in a CI log or
        // a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCKBENCH_LOG")
                // sqlx warns of every slow statement: during a pause
                // of the servers (a fault we inject) they filled the
                // console; the fault's own record says what it cost.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        )
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if matches!(cli.command, Command::Run(_) | Command::Compare(_)) {
        for w in unread_env(std::env::vars().map(|(k, _)| k)) {
            tracing::warn!("{w}");
        }
    }
    let r = rt.block_on(async {
        match cli.command {
            Command::Run(args) => interruptible(run::run(args)).await,
            Command::Compare(args) => {
                let r = interruptible(compare::compare(args)).await;
                // Stopped by an error (a run whose servers died, a worker
                // killed): the runs finished so far still make a page,
                // said to be cut short.
                if r.is_err() {
                    write_what_finished();
                }
                r
            }
            Command::Backends { json } => backends(json),
            Command::Faults => faults(),
            Command::Report { dir, criterion } => report(&dir, criterion.as_deref()),
            Command::Check { file, json } => check(&file, json),
            Command::Worker(a) => match a.run.clone() {
                Some(id) => interruptible(hosts::serve_host(&a, &id)).await,
                // A person at a terminal meant to join a run, not to type
                // a worker's JSON orders.
                None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => Err(anyhow::anyhow!(
                    "lockbench worker: give --run ID --config FILE to join a run across hosts (see --help); without --run it is the internal worker that reads its orders on stdin"
                )),
                None => worker().await,
            },
        }
    });
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::output::causes(&e));
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C / SIGTERM / SIGHUP (the terminal or ssh session closed):
/// dropping the run tears down its fleet, workers and their directories;
/// `kill_all` catches any server a half-built fleet had started.
async fn interruptible(
    fut: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    // Under `nohup` (SIGHUP ignored) a closed terminal must not end the
    // run: the handler would replace the ignore.
    let mut hup = if sighup_ignored() {
        None
    } else {
        Some(signal(SignalKind::hangup())?)
    };
    let hangup = async {
        match hup.as_mut() {
            Some(h) => h.recv().await,
            None => std::future::pending().await,
        }
    };
    // Signals first: a terminal's Ctrl-C reaches the workers too, and a
    // comparison that saw one die at that instant must not win the race
    // and end as an error with no page.
    tokio::select! {
        biased;
        _ = tokio::signal::ctrl_c() => {
            fleet::kill_all();
            eprintln!("interrupted: servers and workers stopped");
            write_what_finished();
            Ok(ExitCode::from(130))
        }
        _ = term.recv() => {
            fleet::kill_all();
            eprintln!("terminated: servers and workers stopped");
            write_what_finished();
            Ok(ExitCode::from(143))
        }
        _ = hangup => {
            fleet::kill_all();
            eprintln!("hung up: servers and workers stopped");
            write_what_finished();
            Ok(ExitCode::from(129))
        }
        r = fut => r,
    }
}

/// A comparison cut short still leaves a page: the runs it had finished.
fn write_what_finished() {
    match compare::write_interrupted() {
        Some(Ok((json, html))) => eprintln!(
            "the comparison's finished runs: {}\n                                {} (marked as cut short)",
            json.display(),
            html.display()
        ),
        Some(Err(e)) => eprintln!(
            "error: writing the comparison's finished runs: {}",
            crate::output::causes(&e)
        ),
        None => {}
    }
}

/// Whether SIGHUP is ignored (`nohup`), read before any handler of ours.
fn sighup_ignored() -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one
    // into a zeroed struct we own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

fn backends(json: bool) -> anyhow::Result<ExitCode> {
    if json {
        let all: Vec<_> = registry::BACKENDS
            .iter()
            .map(|b| registry::describe(*b))
            .collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(ExitCode::SUCCESS);
    }
    let yn = |b: bool| if b { "yes" } else { "no" };
    println!(
        "{:<20} {:<8} {:<10} {:<6} {:<5} {:<8} {:<9} {:<16} about",
        "backend", "fencing", "reentrant", "fair", "lost", "renewal", "failover", "token"
    );
    for b in registry::BACKENDS {
        let c = b.capabilities();
        println!(
            "{:<20} {:<8} {:<10} {:<6} {:<5} {:<8} {:<9} {:<16} {}",
            b.name(),
            yn(c.fencing),
            yn(c.reentrant),
            yn(c.fair),
            yn(c.lost_signal),
            yn(c.renewal),
            yn(c.survives_failover),
            serde_json::to_value(c.token_source)?
                .as_str()
                .unwrap_or("?"),
            b.about()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn faults() -> anyhow::Result<ExitCode> {
    use clap::ValueEnum;
    for f in nemesis::FaultKind::value_variants() {
        let name = f.cli_name();
        println!("{name:<18} {}", f.about());
    }
    Ok(ExitCode::SUCCESS)
}

fn report(dir: &std::path::Path, criterion: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let mut c = report::load(&dir.join("comparison.json"))?;
    let html = match criterion {
        Some(cdir) => {
            let b = report::benches::read_criterion(cdir)?;
            eprintln!(
                "added {} criterion figures from {}",
                b.figures.len(),
                cdir.display()
            );
            c.benches = Some(b);
            compare::write(&c, dir)?.1
        }
        None => {
            let html = dir.join("index.html");
            harness::write_atomic(&html, report::render(&c)?.as_bytes())?;
            html
        }
    };
    println!("{}", html.display());
    Ok(ExitCode::SUCCESS)
}

fn check(file: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let history = harness::history::read_jsonl(file)?;
    // Nothing to check is no pass: a wrong or truncated file said "0
    // violations" and exited 0.
    anyhow::ensure!(
        !history.is_empty(),
        "{}: no events in it; give a run's history.jsonl",
        file.display()
    );
    let r = harness::checker::check_overlap(&history);
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}: {} critical sections, {} violations, longest overlap {:.3} ms{}",
            file.display(),
            r.holds,
            r.violations,
            r.max_overlap_ns as f64 / 1e6,
            if r.valid {
                ""
            } else {
                "  <-- NOT mutually exclusive"
            }
        );
    }
    // A script or CI job reads the exit code, not the line.
    Ok(if r.valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn worker() -> anyhow::Result<ExitCode> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let spec: harness::spec::WorkerSpec = serde_json::from_str(&line)?;
    let params = registry::BuildParams {
        hold: std::time::Duration::from_millis(spec.plan.hold_ms),
        probes: spec.plan.workload == harness::Workload::Latency,
        key: harness::worker::lock_key(&spec),
    };
    let connected = match registry::find(&spec.plan.backend) {
        Ok(b) => b.connect(&spec.plan.backend_config, params).await,
        Err(e) => Err(e),
    };
    let connected = match connected {
        Ok(x) => x,
        Err(e) => {
            println!(
                "{}",
                serde_json::to_string(&harness::spec::WorkerMsg::Error {
                    message: e.to_string()
                })?
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    let ok = harness::worker::serve(spec, connected.lock, connected.probes).await;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `LOCKBENCH_<family>_*` variables no backend reads, each with the
/// closest one that is read: a misspelt `LOCKBENCH_REDIS_UR` was ignored
/// without a word, and the run started its own servers instead of using
/// the user's.
fn unread_env(vars: impl Iterator<Item = String>) -> Vec<String> {
    let known: std::collections::BTreeSet<&str> = lockbench_registry::BACKENDS
        .iter()
        .flat_map(|b| b.env_vars().iter().copied())
        .collect();
    // The family prefixes the backends read (LOCKBENCH_REDIS_, ..._ZK_).
    let families: std::collections::BTreeSet<&str> = known
        .iter()
        .filter_map(|k| {
            let rest = k.strip_prefix("LOCKBENCH_")?;
            Some(&k[..k.len() - rest.len() + rest.find('_')? + 1])
        })
        .collect();
    let mut out = Vec::new();
    for v in vars {
        if known.contains(v.as_str()) || !families.iter().any(|f| v.starts_with(f)) {
            continue;
        }
        let closest = known
            .iter()
            .min_by_key(|k| strsim::levenshtein(k, &v))
            .copied()
            .unwrap_or_default();
        out.push(format!(
            "{v} is set but not read by any backend (did you mean {closest}?); `lockbench backends --json` lists each backend's variables"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unread_env;

    #[test]
    fn a_misspelt_backend_variable_is_named_with_the_one_meant() {
        let said = unread_env(
            [
                "LOCKBENCH_REDIS_UR",
                "LOCKBENCH_REDIS_URL",
                "LOCKBENCH_ZK_CONECT",
                "LOCKBENCH_REDIS_FAIR",
                "LOCKBENCH_PORT_BASE",
                "LOCKBENCH_LOG",
                "HOME",
            ]
            .map(String::from)
            .into_iter(),
        );
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said[0].contains("LOCKBENCH_REDIS_UR ") && said[0].contains("LOCKBENCH_REDIS_URL?")
        );
        assert!(
            said[1].contains("LOCKBENCH_ZK_CONECT ") && said[1].contains("LOCKBENCH_ZK_CONNECT?")
        );
    }
}
