//! What the coordinator tells a worker process, and what it answers.

use serde::{Deserialize, Serialize};

/// The workloads the harness can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// The seed's maxActive test: every worker does `ops` acquire -> hold ->
    /// release cycles on ONE key.
    Mutex,
    /// Uncontended acquire + release, interleaved with the backend's raw
    /// floor (its cheapest round trips) on the same connection.
    Latency,
}

/// One worker's orders (sent as one JSON line on its stdin).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Worker id (0-based).
    pub worker: u32,
    /// Where to write this worker's history.
    pub history_path: String,
    /// The run, as every worker gets it.
    #[serde(flatten)]
    pub plan: RunPlan,
}

/// Everything about one run that the workers need.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunPlan {
    /// Backend registry name.
    pub backend: String,
    /// Backend settings handed to every worker.
    pub backend_config: serde_json::Value,
    /// The workload.
    pub workload: Workload,
    /// Worker processes.
    pub workers: u32,
    /// Cycles per worker.
    pub ops: u64,
    /// Time inside the critical section.
    pub hold_ms: u64,
    /// Fixed lease, or `None` for watchdog renewal.
    pub lease_ms: Option<u64>,
    /// How long one acquire may wait.
    pub wait_ms: u64,
    /// The key (or key prefix).
    pub key: String,
    /// Hard stop for each worker's loop.
    pub max_secs: u64,
}

/// A message from a worker on its stdout, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    /// Connected; waiting for "go".
    Ready,
    /// Cycles completed so far.
    Progress {
        /// Count.
        done: u64,
    },
    /// Finished; the history file is complete.
    Done {
        /// Raw-floor samples (ns), for the latency workload.
        floor_ns: Vec<u64>,
        /// Peer samples (ns) by peer name, for the latency workload.
        #[serde(default)]
        peers_ns: std::collections::BTreeMap<String, Vec<u64>>,
        /// Whether the loop stopped on `max_secs` before `ops`.
        timed_out: bool,
    },
    /// Failed before or during the run.
    Error {
        /// What went wrong.
        message: String,
    },
}
