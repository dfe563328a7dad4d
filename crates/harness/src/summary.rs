//! Figures of a run: counts, HdrHistogram percentiles, the checker's
//! verdict, and the ratio to the raw floor measured in the same run.

use std::collections::{BTreeMap, HashMap};

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
    /// Failed and unknown operations by error kind (`timeout`, `backend`,
    /// ...), each with its count and its first message.
    #[serde(default)]
    pub errors: BTreeMap<String, ErrorCount>,
    /// Workers that died mid-run (killed or crashed); the run went on.
    #[serde(default)]
    pub worker_deaths: Vec<crate::coordinator::WorkerDeath>,
    /// Overlapping critical sections (overlap checker).
    pub violations: u64,
    /// Of those, the ones whose earlier holder had not been told (neither
    /// `lost()` nor an expired `valid_until` before its release).
    #[serde(default)]
    pub silent_violations: u64,
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
    /// Handover latency: a release by one worker -> the acquire completing
    /// for a worker that was already waiting (contended runs only).
    pub handover: Option<Percentiles>,
    /// Workload counters summed over workers (coupon outcomes, ledger
    /// rejections, ...).
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Fenced ledger and lost-update verdicts (ledger workload).
    pub ledger: Option<crate::data::LedgerReport>,
    /// Flash-sale figures and invariants (coupon workload).
    pub coupon: Option<CouponReport>,
}

/// The coupon workload's figures and invariants.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CouponReport {
    /// The variant that ran.
    pub plan: crate::spec::CouponPlan,
    /// Clicks sent.
    pub clicks: u64,
    /// Orders acknowledged to users.
    pub ordered: u64,
    /// Clicks refused as a second order of the same user.
    pub rejected_duplicate: u64,
    /// Clicks refused for lack of stock.
    pub rejected_sold_out: u64,
    /// Clicks that could not get the lock within the wait budget.
    pub rejected_lock_timeout: u64,
    /// Clicks that failed with an error.
    pub errors: u64,
    /// The invariants, by SQL after the run.
    pub check: crate::data::CouponCheck,
    /// All invariants hold (and, pre-deduct, every acknowledged order
    /// reached PostgreSQL).
    pub valid: bool,
    /// From "go" to the last acknowledged order, when the stock sold out.
    pub time_to_sell_out_ms: Option<f64>,
    /// Clicks per second over the run.
    pub clicks_per_s: f64,
    /// Orders acknowledged to users but missing in PostgreSQL (pre-deduct).
    pub orders_lost: i64,
    /// The stream consumer (pre-deduct only).
    pub consumer: Option<crate::data::ConsumerStats>,
    /// From the last acknowledged order to the last order written to
    /// PostgreSQL (pre-deduct only): how far the database lags.
    pub async_lag_ms: Option<f64>,
}

/// Handover samples: for each successful acquire, the latest release on
/// the same key by another worker that began before it completed; counted
/// only if the acquirer was already waiting when that release began.
pub fn handover_ns(history: &[crate::history::Event]) -> Vec<u64> {
    let mut by_key: HashMap<&str, (Vec<&crate::history::Event>, Vec<&crate::history::Event>)> =
        HashMap::new();
    for e in history {
        let slot = by_key.entry(e.key.as_str()).or_default();
        match (e.op, e.outcome) {
            (Op::Acquire, Outcome::Ok) => slot.0.push(e),
            (Op::Release, _) => slot.1.push(e),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (_, (acquires, mut releases)) in by_key {
        releases.sort_by_key(|r| r.invoke_ns);
        for a in acquires {
            let i = releases.partition_point(|r| r.invoke_ns < a.complete_ns);
            let Some(r) = i.checked_sub(1).map(|i| releases[i]) else {
                continue;
            };
            if r.worker != a.worker && a.invoke_ns < r.invoke_ns {
                out.push(a.complete_ns - r.invoke_ns);
            }
        }
    }
    out
}

/// How often one kind of error happened, and its first message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCount {
    /// Occurrences (acquires and releases).
    pub count: u64,
    /// The first message seen.
    pub first: String,
}

/// An error kind as it is written in results (`timeout`, `not_held`, ...).
fn kind_name(kind: distlock::ErrorKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{kind:?}"))
}

/// Builds the summary from a run's output and its overlap verdict.
pub fn summarize(plan: &RunPlan, out: &RunOutput, overlap: &OverlapReport) -> Summary {
    let (mut ok, mut failed, mut info, mut not_held) = (0, 0, 0, 0);
    let mut acquire_ns = Vec::new();
    let mut cycle_ns = Vec::new();
    let mut round_trips = 0u64;
    let mut errors: BTreeMap<String, ErrorCount> = BTreeMap::new();
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
            (Op::Exit, _) => {}
            (Op::Release, _) => {
                if e.was_held == Some(false) {
                    not_held += 1;
                }
                if let Some(start) = open.remove(&(e.worker, e.key.as_str())) {
                    cycle_ns.push(e.complete_ns.saturating_sub(start));
                }
            }
        }
        if let Some(err) = &e.error {
            let c = errors
                .entry(kind_name(err.kind))
                .or_insert_with(|| ErrorCount {
                    count: 0,
                    first: err.message.clone(),
                });
            c.count += 1;
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
        errors,
        worker_deaths: out.deaths.clone(),
        violations: overlap.violations,
        silent_violations: overlap.silent_violations,
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
        handover: {
            let h = handover_ns(&out.history);
            (!h.is_empty()).then(|| percentiles(h))
        },
        counters: out.counters.clone(),
        ledger: None,
        coupon: None,
    }
}
