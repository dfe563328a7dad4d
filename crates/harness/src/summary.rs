//! Figures of a run: counts, HdrHistogram percentiles, the checker's
//! verdict, the ratio to and the paired difference from the raw floor
//! measured in the same run, drift between the run's halves, hand-overs
//! and fairness.

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
    /// The distribution as `[quantile, µs]` points at [`CDF_QUANTILES`]
    /// (the report draws its CDFs from them). Empty in results from
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdf: Vec<[f64; 2]>,
}

/// The quantiles a [`Percentiles::cdf`] keeps: dense in the tail, where
/// locks differ, and the minimum (0) and maximum (1) as its ends.
pub const CDF_QUANTILES: &[f64] = &[
    0.0, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7,
    0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99, 0.995, 0.999, 1.0,
];

/// Fewest samples for a p99 worth showing: at 1,000 the p99 is the 10th
/// largest sample, so it rests on ten observations; below that it is one
/// or two unlucky samples.
pub const P99_MIN_COUNT: u64 = 1_000;

/// Fewest samples for a p99.9 worth showing (ten observations above it).
pub const P999_MIN_COUNT: u64 = 10_000;

impl Percentiles {
    /// The p99, if there are at least [`P99_MIN_COUNT`] samples.
    pub fn reliable_p99_us(&self) -> Option<f64> {
        (self.count >= P99_MIN_COUNT).then_some(self.p99_us)
    }

    /// The p99.9, if there are at least [`P999_MIN_COUNT`] samples.
    pub fn reliable_p999_us(&self) -> Option<f64> {
        (self.count >= P999_MIN_COUNT).then_some(self.p999_us)
    }
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
        cdf: CDF_QUANTILES
            .iter()
            .map(|&q| [q, us(h.value_at_quantile(q))])
            .collect(),
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

/// The run's summary: what `--json` prints and `results.json` holds
/// (`Default`: a run that did not happen, such as a skipped fault cell).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// A run across hosts (`lockbench run --hosts`): each host, and what
    /// comparing their clocks would have claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<crate::hosts::HostsRecord>,
    /// Overlapping critical sections (overlap checker).
    pub violations: u64,
    /// Of those, the ones whose earlier holder had not been told (neither
    /// `lost()` nor an expired `valid_until` before its release).
    #[serde(default)]
    pub silent_violations: u64,
    /// Longest overlap, ms.
    pub max_overlap_ms: f64,
    /// Acquire latency p50 (µs), successful acquisitions (open loop: from
    /// each acquire's intended start, see `open_loop_rate`).
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
    /// Median of the per-iteration differences cycle − floor (µs) with its
    /// 95 % order-statistic interval (latency workload with a floor): the
    /// floor and the cycle of one iteration ran back to back, so the
    /// difference cancels what both met.
    #[serde(default)]
    pub cycle_minus_floor: Option<crate::stats::MedianEstimate>,
    /// Median cycle of the first half of the measured cycles (in time
    /// order) against the second half's, and whether they differ: if they
    /// do, the run drifted and one median does not describe it.
    #[serde(default)]
    pub cycle_halves: Option<crate::stats::Halves>,
    /// Peers timed in the same run (latency workload), by name.
    pub peers: std::collections::BTreeMap<String, Peer>,
    /// Mean backend round trips per successful acquire (waiting included).
    pub acquire_round_trips_mean: f64,
    /// Successful cycles per second of wall time.
    pub throughput_per_s: f64,
    /// Wall time of the measured run, s: from "go" to the last worker
    /// done, less the warm-up.
    pub wall_s: f64,
    /// Warm-up before the measured loop, s (latency workload).
    #[serde(default)]
    pub warmup_s: f64,
    /// Open loop: the total arrival rate (per second, all workers) the run
    /// offered, Poisson. Then acquire and cycle latencies (and, latency
    /// workload, floor and peer samples) are timed from each operation's
    /// INTENDED start, so a worker that fell behind shows its backlog
    /// instead of hiding it. `None` = closed loop, timed from the actual
    /// start.
    #[serde(default)]
    pub open_loop_rate: Option<f64>,
    /// Whether a worker hit the time limit before finishing its ops.
    pub timed_out: bool,
    /// Hand-over latency: a clean release by one worker -> the acquire
    /// completing for another worker that was already waiting (contended
    /// runs only; see [`crate::handover`]).
    pub handover: Option<Percentiles>,
    /// Hand-overs, barging and take-overs on contended keys.
    #[serde(default)]
    pub handovers: Option<crate::handover::Handovers>,
    /// How evenly the workers got the lock, and the longest and the most
    /// overtaken wait: what a declared `fair` is checked against.
    #[serde(default)]
    pub fairness: Option<crate::handover::Fairness>,
    /// Workload counters summed over workers (coupon outcomes, ledger
    /// rejections, ...).
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Fenced ledger and lost-update verdicts (ledger workload).
    pub ledger: Option<crate::data::LedgerReport>,
    /// Flash-sale figures and invariants (coupon workload).
    pub coupon: Option<CouponReport>,
    /// The overlap that matters most, drawn as a timeline (runs with a
    /// violation on one host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<crate::timeline::Timeline>,
    /// Servers the run started that died on their own, not by an injected
    /// fault (each: name, address, exit status, last log line): the run
    /// then measured an outage nobody asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers_exited: Vec<String>,
    /// CPU time the lock's servers and the workers spent over the run, and
    /// per cycle (runs on this host without a fault: a fault's restarts
    /// would be counted as work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::cpu::CpuUse>,
    /// Why the workers were stopped before their plan's end, if they were
    /// (a server died: the rest of the run could only measure the outage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
    /// Why the data checks (ledger, flash-sale invariants) could not run
    /// after the workers finished, if they could not: no verdict on the
    /// data then, only the history's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_check_error: Option<String>,
    /// Acquisitions whose fencing token was not above that of one granted
    /// before them in real time (see
    /// [`crate::checker::token_regressions`]): must be 0 for a fencing
    /// backend. 0 across hosts, which share no clock.
    #[serde(default)]
    pub token_regressions: u64,
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
    /// Clicks that could not get the lock: the wait budget ran out, or
    /// (`lock_errors` of them) the lock's server refused or failed.
    pub rejected_lock_timeout: u64,
    /// Lock acquires that failed with an error, not a timeout (a server
    /// restarting): among `rejected_lock_timeout`'s clicks.
    #[serde(default)]
    pub lock_errors: u64,
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
    /// A lower bound when `acknowledged_incomplete`. Negative: orders no
    /// click was told of (a reply lost after the order went through),
    /// which is no loss.
    pub orders_lost: i64,
    /// Workers died mid-run: the orders they had acknowledged are not
    /// known (their counters die with them), so `orders_lost` counts only
    /// what the others acknowledged beyond what PostgreSQL has.
    #[serde(default)]
    pub acknowledged_incomplete: bool,
    /// The stream consumer (pre-deduct only).
    pub consumer: Option<crate::data::ConsumerStats>,
    /// From the last acknowledged order to the last order written to
    /// PostgreSQL (pre-deduct only): how far the database lags.
    pub async_lag_ms: Option<f64>,
    /// Lock acquisitions attempted (a segmented click may take several).
    #[serde(default)]
    pub lock_acquires: u64,
    /// Backend round trips of the acquisitions that got the lock.
    #[serde(default)]
    pub lock_round_trips: u64,
    /// Clicks refused by the bought cache without taking the lock: lock
    /// acquisitions saved.
    #[serde(default)]
    pub bought_cache_hits: u64,
}

/// Hand-over latency samples (ns): a clean release (ok, lock still held)
/// by one worker -> the next hold on the key, another worker's that was
/// already waiting when the release began. See [`crate::handover::walk`].
pub fn handover_ns(history: &[crate::history::Event]) -> Vec<u64> {
    crate::handover::walk(history).latency_ns
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
    // (acquire invoke, cycle) ns: the halves need time order.
    let mut cycle_ns: Vec<(u64, u64)> = Vec::new();
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
            (Op::Exit | Op::Releasing, _) => {}
            (Op::Release, _) => {
                if e.was_held == Some(false) {
                    not_held += 1;
                }
                if let Some(start) = open.remove(&(e.worker, e.key.as_str())) {
                    cycle_ns.push((start, e.complete_ns.saturating_sub(start)));
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
    // Open loop: the same figures, timed from the intended starts the
    // workers kept (the history has the actual invoke times).
    let open_loop_rate = plan.open_loop_rate().ok().flatten();
    if open_loop_rate.is_some() {
        acquire_ns = out.timed.iter().map(|t| t.acquire_ns).collect();
        cycle_ns = out
            .timed
            .iter()
            .map(|t| (t.intended_ns, t.cycle_ns))
            .collect();
    }
    cycle_ns.sort_unstable();
    let cycle_halves = {
        let us: Vec<f64> = cycle_ns.iter().map(|(_, ns)| *ns as f64 / 1000.0).collect();
        crate::stats::halves(&us)
    };
    let acquire = percentiles(acquire_ns);
    let cycle = percentiles(cycle_ns.into_iter().map(|(_, ns)| ns));
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
    let wall_s = out.wall.saturating_sub(out.warmup).as_secs_f64();
    let walk = crate::handover::walk(&out.history);
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
        hosts: None,
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
        cycle_minus_floor: crate::stats::paired_difference(&out.paired_ns),
        cycle_halves,
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
        warmup_s: out.warmup.as_secs_f64(),
        open_loop_rate,
        timed_out: out.timed_out,
        handovers: crate::handover::handovers(&walk, wall_s),
        fairness: crate::handover::fairness(&out.history, plan.workers),
        handover: (!walk.latency_ns.is_empty()).then(|| percentiles(walk.latency_ns)),
        counters: out.counters.clone(),
        ledger: None,
        coupon: None,
        timeline: None,
        servers_exited: Vec::new(),
        cpu: None,
        stopped_early: out.stopped.clone(),
        data_check_error: None,
        token_regressions: 0,
    }
}
