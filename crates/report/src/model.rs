//! The comparison as `lockbench compare` writes it to `comparison.json`.

use distlock::Capabilities;
use harness::summary::{CouponReport, Summary};
use serde::{Deserialize, Serialize};

/// One comparison run: every backend on the same workloads, same machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// When it ran (UTC, `YYYYmmdd-HHMMSS`).
    pub generated_utc: String,
    /// lockbench version.
    pub tool_version: String,
    /// CPU cores of the machine (servers, workers and client share them).
    pub cores: usize,
    /// One row per backend.
    pub rows: Vec<Row>,
    /// Flash-sale variants beyond each backend's own coupon run: lock
    /// scopes, the lock-free baselines and the unlock-before-commit bug.
    pub sale: Vec<SaleRun>,
    /// The fault phase (`lockbench compare --faults`): one cell per backend
    /// and fault that applies to it.
    #[serde(default)]
    pub faults: Vec<FaultCell>,
    /// The repeated measurement phase (`lockbench compare --repeats`):
    /// every performance figure once per repeat and durability profile,
    /// for intervals and ties. Absent in comparisons from before it.
    #[serde(default)]
    pub measured: Option<Measured>,
}

/// Performance figures over repeats, per durability profile.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Measured {
    /// Repeats per profile.
    pub repeats: u32,
    /// The backend run twice as two entries (`<name>` and `<name> (A/A)`,
    /// separate servers each time) to show the noise floor.
    pub aa_backend: Option<String>,
    /// One per profile, `durable` first.
    pub profiles: Vec<Profile>,
}

/// One durability profile's repeats.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Profile {
    /// `durable` or `volatile`.
    pub durability: String,
    /// False when this comparison did not run the profile (`--durability`).
    pub ran: bool,
    /// How the servers were set (one line per server kind), from the runs.
    #[serde(default)]
    pub settings: Vec<String>,
    /// The backend order of each repeat (rotated so no backend always
    /// runs first, on the coldest machine, or last).
    #[serde(default)]
    pub orders: Vec<Vec<String>>,
    /// One entry per backend (and the A/A twin).
    pub backends: Vec<Samples>,
}

/// One backend's figure per repeat (index = repeat; a failed run leaves
/// its figure out, so vectors can be shorter than the repeat count).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Samples {
    /// Registry name, or `<name> (A/A)` for the twin.
    pub backend: String,
    /// Uncontended acquire + release, p50, µs.
    pub cycle_p50_us: Vec<f64>,
    /// The raw round trip measured in the same run, p50, µs.
    pub floor_p50_us: Vec<f64>,
    /// cycle p50 / floor p50, per run.
    pub floor_ratio: Vec<f64>,
    /// Median of the paired (cycle - floor) differences, µs.
    #[serde(default)]
    pub paired_diff_us: Vec<f64>,
    /// Hand-overs per second on one hot key (the lock went to a different
    /// worker after an ok release).
    pub handovers_per_s: Vec<f64>,
    /// Cycles per second, one key per worker.
    pub disjoint_per_s: Vec<f64>,
    /// Runs that failed outright, with their error.
    #[serde(default)]
    pub failures: Vec<String>,
}

/// One backend under one fault: the run's summary and what the nemesis
/// recorded (results.json's `faults`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultCell {
    /// Registry name.
    pub backend: String,
    /// The fault (`holder-kill`, `failover`, ...).
    pub fault: String,
    /// How it ran, one line (workload, workers, lease, topology).
    pub setup: String,
    /// The run's summary.
    pub summary: Summary,
    /// The nemesis's records: target, times, failures during, recovery.
    pub records: Vec<serde_json::Value>,
}

/// Everything measured for one backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Registry name.
    pub backend: String,
    /// What it is.
    pub about: String,
    /// A deliberately broken lock kept to prove the checkers work.
    pub negative_control: bool,
    /// For a negative control that only a fault exposes (a crash or pause
    /// at the wrong moment): that fault. Such a control passing a
    /// fault-free run is expected, not a broken checker.
    #[serde(default)]
    pub needs_fault: Option<String>,
    /// What it declares.
    pub capabilities: Capabilities,
    /// Ledger workload: overlap, fenced ledger, lost updates.
    pub ledger: Option<Summary>,
    /// Uncontended latency next to the raw floor and peers.
    pub latency: Option<Summary>,
    /// Throughput, all workers on one key.
    pub contended: Option<Summary>,
    /// Throughput, one key per worker.
    pub disjoint: Option<Summary>,
    /// Flash sale with a per-user lock.
    pub coupon: Option<Summary>,
    /// The latency workload in open loop (Poisson arrivals) at about 70 %
    /// of the capacity its closed-loop run showed; latency from each
    /// operation's intended start.
    #[serde(default)]
    pub open_loop: Option<Summary>,
}

/// One flash-sale variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SaleRun {
    /// What varied, short (e.g. "redis, lock per voucher"). Shown as is;
    /// the decision guide goes by the plan in `summary.coupon` (strategy,
    /// lock scope, ordering), never by this text.
    pub label: String,
    /// How it works, one line.
    #[serde(default)]
    pub note: String,
    /// The backend whose servers it ran on.
    pub backend: String,
    /// Its summary (with `coupon` filled in).
    pub summary: Summary,
}

/// One flash-sale run as the page lists it: a backend's own coupon run or
/// one of the variants.
#[derive(Debug, Clone)]
pub(crate) struct Sale<'a> {
    /// What the page calls it.
    pub label: String,
    /// How it works ("" for a backend's own run).
    pub note: &'a str,
    /// The backend whose servers it ran on (registry name).
    pub backend: &'a str,
    /// Whether that backend is a negative control.
    pub negative_control: bool,
    /// Its summary.
    pub summary: &'a Summary,
}

impl Sale<'_> {
    /// The sale's figures, its plan and invariants (absent if the run
    /// produced none).
    pub fn coupon(&self) -> Option<&CouponReport> {
        self.summary.coupon.as_ref()
    }
}

impl Comparison {
    /// Every flash-sale run: the backends' own, in row order (labelled
    /// "<backend>, lock per user+voucher"), then the variants.
    pub(crate) fn sales(&self) -> Vec<Sale<'_>> {
        let own = self.rows.iter().filter_map(|r| {
            r.coupon.as_ref().map(|s| Sale {
                label: format!("{}, lock per user+voucher", r.backend),
                note: "",
                backend: &r.backend,
                negative_control: r.negative_control,
                summary: s,
            })
        });
        let variants = self.sale.iter().map(|s| Sale {
            label: s.label.clone(),
            note: &s.note,
            backend: &s.backend,
            negative_control: false,
            summary: &s.summary,
        });
        own.chain(variants).collect()
    }
}

/// From "go" until the last order is in PostgreSQL: the time to sell out
/// plus, for the pre-deduct baseline, how far the database lagged behind
/// the acknowledgements. `None` when the stock did not sell out.
pub(crate) fn durably_sold_out_ms(k: &CouponReport) -> Option<f64> {
    k.time_to_sell_out_ms
        .map(|t| t + k.async_lag_ms.unwrap_or(0.0).max(0.0))
}

/// Hand-overs per second of a throughput run, from the history (`None`
/// for results from before the harness counted them).
pub(crate) fn handovers_per_s(s: &Summary) -> Option<f64> {
    s.handovers.as_ref().map(|h| h.handovers_per_s)
}
