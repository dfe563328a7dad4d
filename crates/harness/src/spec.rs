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
    /// W workers over K keys (worker w takes key w mod K) for a duration:
    /// K = 1 is contended, K = W disjoint. Cycles/s, acquire latency and
    /// handover latency.
    Throughput,
    /// Every critical section writes its token to a fenced ledger and
    /// increments a shared counter by read-sleep-write (Jepsen's lock-set),
    /// both in PostgreSQL.
    Ledger,
    /// The seed's flash sale: users click "buy" on one voucher, orders and
    /// stock in PostgreSQL.
    Coupon,
}

/// What the coupon workload's lock covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LockScope {
    /// One lock for the voucher: every click is serialised.
    Voucher,
    /// One lock per user and voucher (the seed's choice): users buy in
    /// parallel, a user's duplicate clicks are serialised.
    #[value(name = "user+voucher")]
    #[serde(rename = "user+voucher")]
    UserVoucher,
}

/// When the lock is released relative to the order transaction's commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// Commit, then unlock (correct).
    CommitThenUnlock,
    /// Unlock, then commit: the seed's bug (a second click enters before
    /// the first order is visible).
    UnlockThenCommit,
}

/// How the coupon workload protects stock and one-order-per-user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// The distributed lock under test around the order transaction.
    Lock,
    /// No lock: `UPDATE .. SET stock = stock - 1 WHERE stock > 0` plus a
    /// unique index on (user, voucher).
    SqlAtomic,
    /// No lock: one Redis Lua script checks and pre-deducts; orders reach
    /// PostgreSQL asynchronously through a Redis Stream.
    RedisPrededuct,
    /// Stock split into `segments` rows, each under its own lock: a click
    /// takes the segment its user hashes to and falls over to the next
    /// while its segment is empty (coupon-lock-mechanisms' 10 segments).
    Segmented,
}

/// The coupon workload's parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CouponPlan {
    /// Initial stock of the voucher.
    pub stock: u32,
    /// Distinct users.
    pub users: u32,
    /// Clicks per user (duplicate clicks, close together in time).
    pub clicks: u32,
    /// What the lock covers.
    pub lock_scope: LockScope,
    /// Unlock after or before commit.
    pub ordering: Ordering,
    /// Extra delay before COMMIT (widens the unlock-then-commit window).
    pub commit_delay_ms: u64,
    /// Whether voucher_order has its unique (user, voucher) index.
    pub unique_index: bool,
    /// Lock or lock-free baseline.
    pub strategy: Strategy,
    /// Click tasks per worker process, each its own history lane: with more
    /// than one, the tasks of a process contend for the lock together (the
    /// case `local_first` is for).
    #[serde(default = "one")]
    pub tasks: u32,
    /// Wrap the lock in `LocalFirst`: a process's tasks queue locally, one
    /// at a time goes to the distributed lock.
    #[serde(default)]
    pub local_first: bool,
    /// A per-process cache of users who already bought, kept this long
    /// (ms) and checked before the lock (the seed's Caffeine cache);
    /// `None`: no cache. The unique index and the lock stay.
    #[serde(default)]
    pub bought_cache_ms: Option<u64>,
    /// Stock segments for [`Strategy::Segmented`] (1 otherwise).
    #[serde(default = "one")]
    pub segments: u32,
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
    /// Keys the throughput workload spreads its workers over.
    #[serde(default = "one")]
    pub keys: u32,
    /// Run for this long instead of (or as well as) `ops` cycles.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// Seed of every random choice in the run.
    #[serde(default)]
    pub seed: u64,
    /// PostgreSQL for the ledger and coupon workloads' data.
    #[serde(default)]
    pub data_pg_url: Option<String>,
    /// Redis for the coupon workload's pre-deduct baseline.
    #[serde(default)]
    pub data_redis_url: Option<String>,
    /// Coupon parameters (coupon workload only).
    #[serde(default)]
    pub coupon: Option<CouponPlan>,
    /// Workers tell the coordinator when they enter and leave a critical
    /// section, so a fault can aim at the real holder (off by default: it
    /// costs a write per section).
    #[serde(default)]
    pub announce_holds: bool,
    /// A fault point to arm in one worker, at a set time after "go".
    #[serde(default)]
    pub fault_point: Option<ArmPoint>,
    /// Latency workload: how long each worker warms up (connections,
    /// script caches, allocator, CPU frequency) before it measures; it does
    /// at least [`MIN_WARMUP_ITERATIONS`] iterations whatever this says.
    /// Timed rather than counted because what needs warming (a JIT-less
    /// server's caches, the governor's clock) settles in time, not in ops.
    #[serde(default = "default_warmup_ms")]
    pub warmup_ms: u64,
    /// Open loop: arrivals per second for the WHOLE run (all workers
    /// together), Poisson; `None` = closed loop (each worker starts its
    /// next operation when the last one ends). Each worker draws its own
    /// Poisson stream at `rate / workers`, and independent Poisson streams
    /// add up to one at `rate`, so the offered load does not change with
    /// the worker count. Only the latency and throughput workloads use it
    /// (see [`RunPlan::open_loop_rate`]); latencies are then timed from
    /// each operation's intended start.
    #[serde(default)]
    pub rate: Option<f64>,
    /// The workers are on several hosts (`lockbench run --hosts`): their
    /// clocks do not compare, so the ledger orders sections by the
    /// database's stamp, not by the acquire's completion time, to tell a
    /// stale write.
    #[serde(default)]
    pub across_hosts: bool,
    /// Workers instrument their lock (`lockbench_patterns::Instrumented`)
    /// and send their Prometheus page to the coordinator every
    /// [`METRICS_EVERY_MS`], for `lockbench run --metrics-addr`.
    #[serde(default)]
    pub metrics: bool,
}

/// How often a worker sends its metrics page when the plan asks for them.
pub const METRICS_EVERY_MS: u64 = 250;

/// Fewest warm-up iterations of the latency workload, however short
/// `warmup_ms` is: the first iterations open connections and load scripts.
pub const MIN_WARMUP_ITERATIONS: u32 = 5;

/// [`RunPlan::warmup_ms`] when a plan does not say.
pub const DEFAULT_WARMUP_MS: u64 = 2000;

fn default_warmup_ms() -> u64 {
    DEFAULT_WARMUP_MS
}

impl RunPlan {
    /// The open-loop arrival rate (per second, whole run) this plan's
    /// workload runs at: `rate` for the latency and throughput workloads,
    /// `None` for a closed loop and for the other workloads (their
    /// operations are paced by the data they work on).
    ///
    /// # Errors
    /// [`crate::HarnessError::Plan`] for a rate that is not a positive,
    /// finite number.
    pub fn open_loop_rate(&self) -> Result<Option<f64>, crate::HarnessError> {
        let Some(rate) = self.rate else {
            return Ok(None);
        };
        if !(rate.is_finite() && rate > 0.0) {
            return Err(crate::HarnessError::Plan(format!(
                "rate must be a positive number of arrivals per second, not {rate}"
            )));
        }
        Ok(matches!(self.workload, Workload::Latency | Workload::Throughput).then_some(rate))
    }
}

/// Arms the next fault point one worker's lock reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmPoint {
    /// Which worker.
    pub worker: u32,
    /// When, after "go", in ms.
    pub at_ms: u64,
    /// What the point does.
    pub action: distlock::faultpoint::Action,
}

fn one() -> u32 {
    1
}

/// One open-loop lock cycle, timed from when it was meant to start: a
/// worker that fell behind its arrivals shows the backlog here, where a
/// closed loop would have hidden it (coordinated omission).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimedCycle {
    /// When the arrival was due (CLOCK_MONOTONIC ns).
    pub intended_ns: u64,
    /// Intended start -> acquire complete, ns.
    pub acquire_ns: u64,
    /// Intended start -> release complete, ns.
    pub cycle_ns: u64,
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
        /// Latency workload: (floor, cycle) ns of the same iteration, for
        /// every iteration that measured both (open loop: both timed from
        /// the iteration's intended start).
        #[serde(default)]
        paired_ns: Vec<[u64; 2]>,
        /// Open loop: every successful cycle timed from its intended start.
        #[serde(default)]
        timed: Vec<TimedCycle>,
        /// CLOCK_MONOTONIC ns when the measured loop began (after any
        /// warm-up); 0 = not said.
        #[serde(default)]
        loop_start_ns: u64,
        /// Whether the loop stopped on `max_secs` before `ops`.
        timed_out: bool,
        /// Workload counters (summed over workers), e.g. coupon outcomes.
        #[serde(default)]
        counters: std::collections::BTreeMap<String, u64>,
        /// Workload time marks in CLOCK_MONOTONIC ns (the latest over
        /// workers wins), e.g. the last successful order.
        #[serde(default)]
        marks: std::collections::BTreeMap<String, u64>,
    },
    /// Entered a critical section (only when the plan asks).
    Holding,
    /// Its lock reached the armed fault point (the action follows: an exit,
    /// or a stall).
    FaultPoint {
        /// The point's name.
        point: String,
        /// CLOCK_MONOTONIC ns.
        at_ns: u64,
    },
    /// Left it: the release is about to be sent.
    Released,
    /// Its metrics so far, in Prometheus text format, every sample
    /// labelled `worker` (only when the plan asks).
    Metrics {
        /// The page.
        text: String,
    },
    /// Failed before or during the run.
    Error {
        /// What went wrong.
        message: String,
    },
}
