//! `lockbench run --workload throughput --workers 1,4,16`: one throughput
//! run per worker count, in the order given, each exactly as a single
//! `lockbench run` (its own fresh servers, `results.json` and
//! `history.jsonl` in `<out>/workers-<N>/`), then the scaling curve: a
//! table on stdout and `<out>/curve.json`.
//!
//! The comparison suite has its own curve (`lockbench compare --scaling`,
//! one key and a key each, drawn in the report); this is the same question
//! asked of one backend with the user's own flags (`--keys`, `--hold-ms`,
//! `--rate`, `--endpoint`, ...).

use std::path::PathBuf;
use std::process::ExitCode;

use harness::handover::Wait;
use harness::summary::Summary;
use harness::Workload;
use serde::{Deserialize, Serialize};

use crate::run::{execute, timestamp, RunArgs};

/// What `curve.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Curve {
    /// Registry name.
    pub backend: String,
    /// Always `throughput`: the only workload with a curve.
    pub workload: String,
    /// Keys the workers spread over (1 = all on one key).
    pub keys: u32,
    /// Seconds of each run (None: a number of cycles, `--ops`).
    pub duration_s: Option<f64>,
    /// One point per worker count, in the order given.
    pub points: Vec<CurvePoint>,
}

/// One worker count's run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CurvePoint {
    /// Worker processes.
    pub workers: u32,
    /// The run's output directory (`results.json`, `history.jsonl`).
    pub results: PathBuf,
    /// Successful cycles per second.
    pub cycles_per_s: Option<f64>,
    /// cycles/s ÷ the previous point's (None for the first, or when either
    /// is missing or zero).
    pub of_previous: Option<f64>,
    /// cycles/s ÷ the first point's.
    pub of_first: Option<f64>,
    /// Mean backend round trips per successful acquire.
    pub round_trips_per_acquire: Option<f64>,
    /// Hand-over latency p50, µs (release -> a waiting worker holds it).
    pub handover_p50_us: Option<f64>,
    /// Hand-over p99, µs (None under 1,000 hand-overs).
    pub handover_p99_us: Option<f64>,
    /// Acquire latency p99, µs (None under 1,000 acquires).
    pub acquire_p99_us: Option<f64>,
    /// Acquires per worker, max ÷ min (None when a worker got none: see
    /// `starved`).
    pub spread: Option<f64>,
    /// Workers that got no acquire.
    pub starved: Vec<u32>,
    /// The longest wait during which other workers acquired the key.
    pub longest_wait: Option<Wait>,
    /// CPU time of the lock's servers per cycle, µs (None for servers
    /// this run did not start): with the next, where a rate went when the
    /// clients and the servers share a machine.
    pub servers_cpu_us_per_cycle: Option<f64>,
    /// CPU time of the worker processes per cycle, µs.
    pub workers_cpu_us_per_cycle: Option<f64>,
    /// Overlapping critical sections (a curve of a broken lock is not a
    /// throughput figure).
    pub violations: u64,
    /// The run failed: why (the point has no figures then).
    pub error: Option<String>,
}

/// Refuses a list of worker counts where it means nothing, naming the
/// flag; `Ok` for a throughput run.
///
/// # Errors
/// The workload is not throughput, a count is out of range, or `--hosts`.
pub(crate) fn check(args: &RunArgs) -> anyhow::Result<()> {
    let list = shown(&args.worker_counts);
    anyhow::ensure!(
        args.workload == Workload::Throughput,
        "--workers {list}: a list of worker counts (a scaling curve) applies to the throughput workload only, not {}; give one count",
        format!("{:?}", args.workload).to_lowercase()
    );
    if let Some(n) = args.worker_counts.iter().find(|n| !(1..=256).contains(*n)) {
        anyhow::bail!("--workers {list}: each count must be 1..=256, got {n}");
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(n) = args.worker_counts.iter().find(|n| !seen.insert(**n)) {
        anyhow::bail!(
            "--workers {list}: {n} is given twice (each count is one run, in <out>/workers-{n}/)"
        );
    }
    anyhow::ensure!(
        args.hosts.is_none(),
        "--workers {list}: a curve runs on this host; --hosts takes one count"
    );
    Ok(())
}

fn shown(counts: &[u32]) -> String {
    counts
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The point's figures from its run's summary.
fn point(n: u32, dir: PathBuf, s: &Summary) -> CurvePoint {
    let reliable = |p: &harness::summary::Percentiles| p.reliable_p99_us();
    let f = s.fairness.as_ref();
    CurvePoint {
        workers: n,
        results: dir,
        cycles_per_s: Some(s.throughput_per_s),
        round_trips_per_acquire: Some(s.acquire_round_trips_mean),
        handover_p50_us: s.handover.as_ref().map(|h| h.p50_us),
        handover_p99_us: s.handover.as_ref().and_then(reliable),
        acquire_p99_us: reliable(&s.acquire),
        spread: f.and_then(|f| harness::handover::spread(&f.acquires_by_worker)),
        starved: f.map(|f| f.starved.clone()).unwrap_or_default(),
        longest_wait: f.and_then(|f| f.longest_wait.clone()),
        violations: s.violations,
        servers_cpu_us_per_cycle: s.cpu.as_ref().and_then(|c| c.servers_us_per_cycle),
        workers_cpu_us_per_cycle: s.cpu.as_ref().and_then(|c| c.workers_us_per_cycle),
        ..Default::default()
    }
}

/// Fills in each point's change against the previous and the first.
fn relate(points: &mut [CurvePoint]) {
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let first = points.first().and_then(|p| p.cycles_per_s);
    for i in 0..points.len() {
        let prev = i.checked_sub(1).and_then(|j| points[j].cycles_per_s);
        let now = points[i].cycles_per_s;
        points[i].of_previous = ratio(now, prev);
        points[i].of_first = if i == 0 { None } else { ratio(now, first) };
    }
}

/// The curve as a table for a terminal.
pub(crate) fn table(c: &Curve) -> String {
    let num = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0} %", v * 100.0));
    let mut out = format!(
        "{} / throughput on {} key(s): the curve\n{:>7} {:>11} {:>9} {:>9} {:>8} {:>11} {:>11} {:>11} {:>10} {:>13}  longest wait while others acquired\n",
        c.backend,
        c.keys,
        "workers",
        "cycles/s",
        "vs prev",
        "vs first",
        "rt/acq",
        "h-o p50 µs",
        "h-o p99 µs",
        "acq p99 µs",
        "max÷min",
        "CPU µs srv/wk"
    );
    for p in &c.points {
        if let Some(e) = &p.error {
            out += &format!("{:>7} failed: {e}\n", p.workers);
            continue;
        }
        let spread = match (p.spread, p.starved.as_slice()) {
            (Some(s), _) => format!("{s:.2}"),
            (None, []) => "-".into(),
            (None, w) => format!("starved:{}", shown(w)),
        };
        let wait = p.longest_wait.as_ref().map_or("-".to_string(), |w| {
            format!(
                "{:.0} µs, worker {}, {} acquire{} by others{}",
                w.wait_us,
                w.worker,
                w.overtakes,
                if w.overtakes == 1 { "" } else { "s" },
                if w.outcome == harness::history::Outcome::Ok {
                    ""
                } else {
                    " (gave up)"
                }
            )
        });
        let cpu = format!(
            "{}/{}",
            num(p.servers_cpu_us_per_cycle, 0),
            num(p.workers_cpu_us_per_cycle, 0)
        );
        out += &format!(
            "{:>7} {:>11} {:>9} {:>9} {:>8} {:>11} {:>11} {:>11} {:>10} {:>13}  {wait}{}\n",
            p.workers,
            num(p.cycles_per_s, 0),
            pct(p.of_previous),
            pct(p.of_first),
            num(p.round_trips_per_acquire, 2),
            num(p.handover_p50_us, 0),
            num(p.handover_p99_us, 0),
            num(p.acquire_p99_us, 0),
            spread,
            cpu,
            if p.violations > 0 {
                format!("  <-- {} overlap(s): not a lock", p.violations)
            } else {
                String::new()
            }
        );
    }
    out += "(p99s from 1,000 samples; vs prev / vs first: cycles/s against the previous / the first count;\n CPU µs srv/wk: CPU time per cycle of the lock's servers / of the worker processes, on this machine)\n";
    out
}

/// `lockbench run --workers A,B,...`: the runs, the table, `curve.json`.
///
/// # Errors
/// A list where it does not apply; the output directory or `curve.json`
/// cannot be written. A failed run is recorded in its point (the exit
/// code then says failure), and the next count still runs.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    check(&args)?;
    let counts = args.worker_counts.clone();
    let base_id = args
        .run_id
        .clone()
        .unwrap_or_else(|| format!("{}-{}-throughput", timestamp(), args.backend).to_lowercase());
    let out: PathBuf = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("reports").join(format!("{base_id}-curve")));
    std::fs::create_dir_all(&out).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    let mut points = Vec::new();
    let mut failed = false;
    let mut broken = false;
    for (i, &n) in counts.iter().enumerate() {
        eprintln!(
            "== {} throughput, {n} worker(s) (run {}/{})",
            args.backend,
            i + 1,
            counts.len()
        );
        let mut a = args.clone();
        a.workers = Some(n);
        a.worker_counts = Vec::new();
        a.run_id = Some(format!("{base_id}-w{n}"));
        let dir = out.join(format!("workers-{n}"));
        a.out = Some(dir.clone());
        match crate::output::sound(execute(&a).await) {
            Ok((s, dir)) => {
                if !args.json {
                    crate::output::print_human(&s, &dir);
                }
                if let Some(reason) = crate::output::nothing_acquired(&s) {
                    eprintln!("error: {n} worker(s): {reason}");
                    failed = true;
                }
                // As a single run: the lock broke at this count.
                let harm = report::harm(&s);
                if !harm.is_empty() {
                    eprintln!("unsafe: {n} worker(s): {}", harm.join("; "));
                    broken = true;
                }
                points.push(point(n, dir, &s));
            }
            Err(e) => {
                tracing::warn!(backend = %args.backend, workers = n, "curve point failed: {}", crate::output::causes(&e));
                eprintln!("error: {n} worker(s): {}", crate::output::causes(&e));
                failed = true;
                points.push(CurvePoint {
                    workers: n,
                    results: dir,
                    error: Some(crate::output::causes(&e)),
                    ..Default::default()
                });
            }
        }
    }
    relate(&mut points);
    let curve = Curve {
        backend: args.backend.clone(),
        workload: "throughput".into(),
        keys: args.keys,
        duration_s: match (args.duration, args.ops) {
            (Some(d), _) => Some(d),
            // `lockbench run`'s throughput default (see run::resolve).
            (None, None) => Some(5.0),
            (None, Some(_)) => None,
        },
        points,
    };
    let path = out.join("curve.json");
    harness::write_atomic(&path, serde_json::to_string_pretty(&curve)?.as_bytes())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&curve)?);
    } else {
        print!("{}", table(&curve));
        println!("  curve: {}", path.display());
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else if broken {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(workload: Workload, counts: &[u32]) -> RunArgs {
        let mut a = RunArgs::for_compare("redis", workload, PathBuf::from("/tmp/x"), None);
        a.worker_counts = counts.to_vec();
        a
    }

    #[test]
    fn a_list_is_refused_outside_the_throughput_workload_by_name() {
        let e = check(&args(Workload::Mutex, &[1, 4]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("--workers 1,4") && e.contains("throughput") && e.contains("mutex"),
            "{e}"
        );
        let e = check(&args(Workload::Throughput, &[1, 0]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("1..=256, got 0"), "{e}");
        let e = check(&args(Workload::Throughput, &[1, 4, 1]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("1 is given twice"), "{e}");
        assert!(check(&args(Workload::Throughput, &[1, 4, 16])).is_ok());
    }

    #[test]
    fn points_relate_to_the_previous_and_the_first() {
        let p = |w: u32, c: Option<f64>| CurvePoint {
            workers: w,
            cycles_per_s: c,
            ..Default::default()
        };
        let mut pts = vec![
            p(1, Some(100.0)),
            p(2, Some(150.0)),
            p(4, None),
            p(8, Some(50.0)),
        ];
        relate(&mut pts);
        let got: Vec<_> = pts.iter().map(|p| (p.of_previous, p.of_first)).collect();
        assert_eq!(
            got,
            vec![
                (None, None),
                (Some(1.5), Some(1.5)),
                (None, None),
                (None, Some(0.5))
            ]
        );
        let c = Curve {
            backend: "redis".into(),
            workload: "throughput".into(),
            keys: 1,
            duration_s: Some(1.0),
            points: pts,
        };
        let t = table(&c);
        assert!(t.contains("150 %"), "{t}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curve.json");
        std::fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
        let back: Curve = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.points.len(), 4);
    }
}
