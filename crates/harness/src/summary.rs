//! Figures of a run: counts, HdrHistogram percentiles, the checker's
//! verdict, and the ratio to the raw floor measured in the same run.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::checker::OverlapReport;
use crate::coordinator::{RunOutput, RunPlan};
use crate::history::{Op, Outcome};

/// Percentiles of one latency distribution, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// Percentiles of nanosecond samples (HdrHistogram, 3 significant digits).
pub fn percentiles(samples_ns: impl IntoIterator<Item = u64>) -> Percentiles {
    let Ok(mut h) = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3) else {
        return Percentiles::default();
    };
    for s in samples_ns {
        h.saturating_record(s.max(1));
    }
    if h.is_empty() {
        return Percentiles::default();
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Percentiles {
        count: h.len(),
        p50_us: us(h.value_at_quantile(0.5)),
        p90_us: us(h.value_at_quantile(0.9)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
    }
}

/// A peer implementation timed next to ours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peer {
    /// Its cycle latency.
    pub cycle: Percentiles,
    /// Our cycle p50 / its cycle p50 (below 1: we are faster).
    pub ratio: f64,
}

/// The run's summary: what `--json` prints and `results.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Backend name.
    pub backend: String,
    /// Workload name.
    pub workload: String,
    /// Worker processes.
    pub workers: u32,
    /// Successful acquisitions.
    pub ops_ok: u64,
    /// Acquisitions that definitely failed (timeouts, refused).
    pub ops_failed: u64,
    /// Acquisitions with unknown outcome.
    pub ops_info: u64,
    /// Releases that found the lock no longer ours (the seed's "unlock
    /// script returned 0").
    pub release_not_held: u64,
    /// Overlapping critical sections (overlap checker).
    pub violations: u64,
    /// Longest overlap, ms.
    pub max_overlap_ms: f64,
    /// Acquire latency p50 (µs), successful acquisitions.
    pub acquire_p50_us: f64,
    /// Acquire latency p99 (µs).
    pub acquire_p99_us: f64,
    /// Full acquire-latency percentiles.
    pub acquire: Percentiles,
    /// acquire invoke -> release complete, µs (p50).
    pub cycle_p50_us: f64,
    /// Same, p99.
    pub cycle_p99_us: f64,
    /// Full cycle percentiles.
    pub cycle: Percentiles,
    /// Raw floor p50 (µs), measured in the same run (latency workload).
    pub floor_p50_us: Option<f64>,
    /// Full floor percentiles.
    pub floor: Option<Percentiles>,
    /// cycle p50 / floor p50.
    pub floor_ratio: Option<f64>,
    /// Peers timed in the same run (latency workload), by name.
    pub peers: std::collections::BTreeMap<String, Peer>,
    /// Mean backend round trips per successful acquire (waiting included).
    pub acquire_round_trips_mean: f64,
    /// Successful cycles per second of wall time.
    pub throughput_per_s: f64,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Whether a worker hit the time limit before finishing its ops.
    pub timed_out: bool,
}

/// Builds the summary from a run's output and its overlap verdict.
pub fn summarize(plan: &RunPlan, out: &RunOutput, overlap: &OverlapReport) -> Summary {
    let (mut ok, mut failed, mut info, mut not_held) = (0, 0, 0, 0);
    let mut acquire_ns = Vec::new();
    let mut cycle_ns = Vec::new();
    let mut round_trips = 0u64;
    // Per worker+key, the invoke time of the acquire awaiting its release.
    let mut open: HashMap<(u32, &str), u64> = HashMap::new();
    for e in &out.history {
        match (e.op, e.outcome) {
            (Op::Acquire, Outcome::Ok) => {
                ok += 1;
                acquire_ns.push(e.complete_ns - e.invoke_ns);
                round_trips += u64::from(e.round_trips.unwrap_or(0));
                open.insert((e.worker, &e.key), e.invoke_ns);
            }
            (Op::Acquire, Outcome::Fail) => failed += 1,
            (Op::Acquire, Outcome::Info) => info += 1,
            (Op::Release, _) => {
                if e.was_held == Some(false) {
                    not_held += 1;
                }
                if let Some(start) = open.remove(&(e.worker, e.key.as_str())) {
                    cycle_ns.push(e.complete_ns.saturating_sub(start));
                }
            }
        }
    }
    let acquire = percentiles(acquire_ns);
    let cycle = percentiles(cycle_ns);
    let floor = (!out.floor_ns.is_empty()).then(|| percentiles(out.floor_ns.iter().copied()));
    let floor_p50_us = floor.as_ref().map(|f| f.p50_us);
    let floor_ratio = floor_p50_us.filter(|f| *f > 0.0).map(|f| cycle.p50_us / f);
    let peers = out
        .peers_ns
        .iter()
        .map(|(name, ns)| {
            let p = percentiles(ns.iter().copied());
            let ratio = if p.p50_us > 0.0 {
                cycle.p50_us / p.p50_us
            } else {
                0.0
            };
            (name.clone(), Peer { cycle: p, ratio })
        })
        .collect();
    let wall_s = out.wall.as_secs_f64();
    Summary {
        backend: plan.backend.clone(),
        workload: format!("{:?}", plan.workload).to_lowercase(),
        workers: plan.workers,
        ops_ok: ok,
        ops_failed: failed,
        ops_info: info,
        release_not_held: not_held,
        violations: overlap.violations,
        max_overlap_ms: overlap.max_overlap_ns as f64 / 1e6,
        acquire_p50_us: acquire.p50_us,
        acquire_p99_us: acquire.p99_us,
        acquire,
        cycle_p50_us: cycle.p50_us,
        cycle_p99_us: cycle.p99_us,
        cycle,
        floor_p50_us,
        floor,
        floor_ratio,
        peers,
        acquire_round_trips_mean: if ok > 0 {
            round_trips as f64 / ok as f64
        } else {
            0.0
        },
        throughput_per_s: if wall_s > 0.0 {
            ok as f64 / wall_s
        } else {
            0.0
        },
        wall_s,
        timed_out: out.timed_out,
    }
}
