//! The comparison as `lockbench compare` writes it to `comparison.json`.

use distlock::Capabilities;
use harness::summary::{CouponReport, Summary};
use serde::{Deserialize, Serialize};

/// The `comparison.json` format this lockbench writes and reads. 1 (no
/// `format` field) is every file from before the field; 2 added the
/// scaling curve, the CDF points, the timelines and the bench figures.
/// Fields added since are optional (`#[serde(default)]`: a format-2 file
/// without them reads, and shows "-"), so they did not bump it: the
/// fairness figures (`Fairness::spread`, `starved`, `longest_wait`,
/// `most_overtaken` in every summary, and `ScalePoint::fairness`).
pub const FORMAT: u32 = 2;

/// One comparison run: every backend on the same workloads, same machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// The file's format ([`FORMAT`]; absent in files from before it).
    #[serde(default = "format_one")]
    pub format: u32,
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
    /// The scaling phase (`lockbench compare --scaling`): throughput at
    /// each worker count, one key and a key each.
    #[serde(default)]
    pub scaling: Vec<ScalePoint>,
    /// `cargo bench` figures, added by `lockbench report --criterion`.
    #[serde(default)]
    pub benches: Option<crate::benches::Benches>,
    /// Set in a comparison cut short (Ctrl-C, SIGTERM): the phase it was
    /// in. Only the runs that finished before it are in the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

fn format_one() -> u32 {
    1
}

/// One backend at one worker count (worker processes, one host).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScalePoint {
    /// Registry name.
    pub backend: String,
    /// Worker processes.
    pub workers: u32,
    /// All on one key: ok cycles per second.
    pub one_key_per_s: Option<f64>,
    /// All on one key: hand-overs per second.
    pub handovers_per_s: Option<f64>,
    /// All on one key: acquire p99, µs (None under 1,000 samples).
    pub acquire_p99_us: Option<f64>,
    /// All on one key: hand-over p50, µs.
    pub handover_p50_us: Option<f64>,
    /// All on one key: hand-over p99, µs (None under 1,000 samples).
    pub handover_p99_us: Option<f64>,
    /// All on one key: backend round trips per acquire.
    pub round_trips_per_acquire: Option<f64>,
    /// All on one key: most acquisitions of any worker ÷ fewest (None
    /// when a worker got none: see `fairness.starved`).
    pub acquire_spread: Option<f64>,
    /// All on one key: the fairness figures (per-worker acquires, spread,
    /// starved workers, the longest and the most overtaken wait), judged
    /// against the backend's declared `fair`. Absent in comparisons from
    /// before it was kept.
    #[serde(default)]
    pub fairness: Option<harness::handover::Fairness>,
    /// All on one key: CPU time of the lock's servers per cycle, µs.
    /// Absent in comparisons from before it was kept.
    #[serde(default)]
    pub servers_cpu_us_per_cycle: Option<f64>,
    /// All on one key: CPU time of the worker processes per cycle, µs.
    #[serde(default)]
    pub workers_cpu_us_per_cycle: Option<f64>,
    /// One key per worker: ok cycles per second.
    pub key_each_per_s: Option<f64>,
    /// Runs that failed, with their error.
    #[serde(default)]
    pub failures: Vec<String>,
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
    /// The lock's own timeout in this run, which recovery and detection
    /// are read against: `lease` (a fixed or watchdog lease) or `session`
    /// (the ZooKeeper session, the etcd session lease), in ms. None: the
    /// lock lives as long as its connection (PostgreSQL).
    #[serde(default)]
    pub timeout: Option<LockTimeout>,
}

/// A lock's own timeout (see [`FaultCell::timeout`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LockTimeout {
    /// `lease` or `session`.
    pub kind: String,
    /// Its length, ms.
    pub ms: f64,
}

/// The servers a backend's lock needs, from its topology: what this run
/// started and what surviving failures takes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServersNeeded {
    /// What this run started, one line ("1 Redis", "5 Redis masters").
    pub started: String,
    /// Server processes this run started.
    pub count: u32,
    /// Server processes it takes to keep the lock through one server
    /// failure (None: the design has no way to, e.g. one Redis, one
    /// PostgreSQL without a standby the suite runs).
    pub for_one_failure: Option<u32>,
    /// And through two.
    pub for_two_failures: Option<u32>,
    /// The rule behind those counts.
    pub rule: String,
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
    /// The servers its lock needs (absent in comparisons from before it).
    #[serde(default)]
    pub servers: Option<ServersNeeded>,
}

impl Row {
    /// The latency run, if it measured at least one cycle. A run in which
    /// no acquire succeeded still has a summary, holding the zeros the
    /// harness writes for an empty set (p50 0 µs, 0 round trips): those
    /// are no measurement, and never a figure on the page.
    pub(crate) fn latency_measured(&self) -> Option<&Summary> {
        self.latency.as_ref().filter(|s| cycled(s))
    }

    /// The open-loop latency run, if it measured at least one cycle.
    pub(crate) fn open_loop_measured(&self) -> Option<&Summary> {
        self.open_loop.as_ref().filter(|s| cycled(s))
    }

    /// The one-key throughput run, if an acquire succeeded in it.
    pub(crate) fn contended_measured(&self) -> Option<&Summary> {
        self.contended.as_ref().filter(|s| s.ops_ok > 0)
    }

    /// The key-per-worker throughput run, if an acquire succeeded in it.
    pub(crate) fn disjoint_measured(&self) -> Option<&Summary> {
        self.disjoint.as_ref().filter(|s| s.ops_ok > 0)
    }
}

/// At least one acquire succeeded and one cycle was timed.
fn cycled(s: &Summary) -> bool {
    s.ops_ok > 0 && s.cycle.count > 0
}

impl Samples {
    /// The cycle p50s of the repeats that measured one. A repeat whose
    /// latency run acquired nothing is written as 0 µs (the p50 of no
    /// samples); no lock cycle takes 0 µs, so such a figure is left out
    /// rather than taken as the fastest.
    pub(crate) fn cycle_p50_measured_us(&self) -> Vec<f64> {
        self.cycle_p50_us
            .iter()
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect()
    }
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

/// `comparison.json` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// It could not be read (missing, unreadable).
    #[error("{path}: cannot read it: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The JSON stops before its end: the run that wrote it was cut off.
    #[error("{path}: truncated (the JSON ends early, at line {line} column {column}); the run that wrote it did not finish: run `lockbench compare` again")]
    Truncated {
        /// The file.
        path: std::path::PathBuf,
        /// Where it ends.
        line: usize,
        /// Where it ends.
        column: usize,
    },
    /// Written by another lockbench in another format.
    #[error("{path}: comparison format {found}{}, this lockbench reads format {expected}: run `lockbench compare` again with this version", if *found == 1 { " (from before the format was recorded)" } else { "" })]
    Format {
        /// The file.
        path: std::path::PathBuf,
        /// Its format.
        found: u32,
        /// Ours ([`FORMAT`]).
        expected: u32,
    },
    /// Valid JSON, but not a comparison (or a broken one).
    #[error("{path}: not a lockbench comparison: {why}")]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong, as serde says it (names the field).
        why: String,
    },
}

/// Reads a `comparison.json`, checking its format first so an older file
/// is named as older, not as a missing field.
///
/// # Errors
/// See [`LoadError`].
pub fn load(path: &std::path::Path) -> Result<Comparison, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        if e.classify() == serde_json::error::Category::Eof {
            LoadError::Truncated {
                path: path.to_path_buf(),
                line: e.line(),
                column: e.column(),
            }
        } else {
            LoadError::Invalid {
                path: path.to_path_buf(),
                why: e.to_string(),
            }
        }
    })?;
    let Some(obj) = value.as_object() else {
        return Err(LoadError::Invalid {
            path: path.to_path_buf(),
            why: "the top level is not a JSON object".into(),
        });
    };
    if !obj.contains_key("rows") {
        return Err(LoadError::Invalid {
            path: path.to_path_buf(),
            why: "no `rows` (is this a run's results.json? `lockbench report` takes a comparison's directory)".into(),
        });
    }
    let found = obj
        .get("format")
        .and_then(serde_json::Value::as_u64)
        .map_or(1, |f| u32::try_from(f).unwrap_or(u32::MAX));
    if found != FORMAT {
        return Err(LoadError::Format {
            path: path.to_path_buf(),
            found,
            expected: FORMAT,
        });
    }
    serde_json::from_value(value).map_err(|e| LoadError::Invalid {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}
