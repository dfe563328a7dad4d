//! The options of `lockbench run` (clap), and the preset the comparison
//! suite runs with.

use std::path::PathBuf;

use clap::Args;
use harness::Workload;

use crate::nemesis::{FaultKind, NodeTarget};

/// `--topology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyChoice {
    /// The backend's default servers.
    Single,
    /// Its replicated deployment (etcd, ZooKeeper: 3 members; redis: a
    /// Redis Cluster of 3 masters + 3 replicas).
    Cluster,
    /// Behind Redis Sentinel (redis, redis-wait): primary + replica + 3
    /// sentinels, the lock finding the primary through the sentinels.
    Sentinel,
}

/// Options of `lockbench run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Backend to run (see `lockbench backends`).
    #[arg(long, short)]
    pub(crate) backend: String,
    /// Workload: `mutex` (W workers x ops x hold on one key), `latency`
    /// (uncontended acquire+release next to the raw floor), `throughput`
    /// (W workers over --keys keys for --duration), `ledger` (fenced ledger
    /// + read-sleep-write counter in PostgreSQL), `coupon` (the flash sale).
    #[arg(long, short, value_enum, default_value = "mutex")]
    pub(crate) workload: Workload,
    /// Worker OS processes [default: 4; 1 for latency; 8 for coupon].
    ///
    /// The throughput workload also takes a comma-separated list (e.g.
    /// `--workers 1,4,16`): one run per count, in that order, each on
    /// fresh servers with its results in <out>/workers-<N>/, then a
    /// scaling curve table (cycles/s and its change, round trips per
    /// acquire, hand-over and acquire latency, the spread of acquires
    /// over the workers and the longest wait while others acquired) and
    /// <out>/curve.json. Other workloads take one count.
    #[arg(long = "workers", value_name = "N[,N...]", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256), allow_negative_numbers = true)]
    pub(crate) worker_counts: Vec<u32>,
    /// The one worker count a single run uses (set from `--workers`, or by
    /// the comparison suite): the list above is only the user's input.
    #[arg(skip)]
    pub(crate) workers: Option<u32>,
    /// Lock cycles per worker [default: 100; 2000 for latency; unlimited
    /// within --duration for throughput].
    #[arg(long, conflicts_with = "duration")]
    pub(crate) ops: Option<u64>,
    /// Run for this many seconds instead of a number of cycles [default: 5
    /// for throughput].
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Keys the throughput workload spreads its workers over (worker w
    /// takes key w mod K): 1 = contended, = --workers = disjoint.
    #[arg(long, default_value_t = 1)]
    pub(crate) keys: u32,
    /// Milliseconds inside the critical section [default: 10 for mutex and
    /// ledger, 0 for latency and throughput].
    #[arg(long)]
    pub(crate) hold_ms: Option<u64>,
    /// Coupon: initial stock of the voucher.
    #[arg(long, default_value_t = 100, help_heading = "Coupon workload")]
    pub(crate) stock: u32,
    /// Coupon: distinct users.
    #[arg(long, default_value_t = 300, help_heading = "Coupon workload")]
    pub(crate) users: u32,
    /// Coupon: clicks per user (duplicate clicks arrive together from
    /// different workers).
    #[arg(long, default_value_t = 3, help_heading = "Coupon workload")]
    pub(crate) clicks: u32,
    /// Coupon: what the lock covers.
    #[arg(
        long,
        value_enum,
        default_value = "user+voucher",
        help_heading = "Coupon workload"
    )]
    pub(crate) lock_scope: harness::spec::LockScope,
    /// Coupon: release the lock after COMMIT (correct) or before it (the
    /// seed's bug).
    #[arg(
        long,
        value_enum,
        default_value = "commit-then-unlock",
        help_heading = "Coupon workload"
    )]
    pub(crate) ordering: harness::spec::Ordering,
    /// Coupon: sleep this long before COMMIT (widens the unlock-then-commit
    /// window so the bug shows deterministically).
    #[arg(long, default_value_t = 0, help_heading = "Coupon workload")]
    pub(crate) commit_delay_ms: u64,
    /// Coupon: no unique (user, voucher) index on voucher_order.
    #[arg(long, help_heading = "Coupon workload")]
    pub(crate) no_unique_index: bool,
    /// Coupon: `lock` (the backend's lock around the order transaction),
    /// `segmented` (stock split into --segments rows, a lock each, a click
    /// tries its user's segment then the next ones), or a lock-free
    /// baseline: `sql-atomic` (UPDATE .. WHERE stock > 0 + unique index),
    /// `redis-prededuct` (Lua pre-deduct, orders through a Redis Stream
    /// into PostgreSQL).
    #[arg(
        long,
        value_enum,
        default_value = "lock",
        help_heading = "Coupon workload"
    )]
    pub(crate) strategy: harness::spec::Strategy,
    /// Coupon, `--strategy segmented`: stock segments, 1 to 64.
    #[arg(long, default_value_t = 10, help_heading = "Coupon workload")]
    pub(crate) segments: u32,
    /// Coupon: concurrent click tasks in each worker process (each its own
    /// history lane); with more than one, a process's tasks contend for
    /// the lock together.
    #[arg(long, default_value_t = 1, help_heading = "Coupon workload")]
    pub(crate) tasks: u32,
    /// Coupon: wrap the lock in LocalFirst (an in-process mutex per key
    /// first: one task per process contends remotely). Needs --tasks > 1
    /// to matter.
    #[arg(long, help_heading = "Coupon workload")]
    pub(crate) local_first: bool,
    /// Coupon: cache users who already bought for this many ms in each
    /// process and refuse their clicks before the lock (the seed's
    /// Caffeine cache); the lock and the unique index stay.
    #[arg(long, value_name = "MS", help_heading = "Coupon workload")]
    pub(crate) bought_cache_ms: Option<u64>,
    /// Fixed lease in ms; without it the watchdog renews the backend's
    /// lease (Redisson semantics).
    #[arg(long)]
    pub(crate) lease_ms: Option<u64>,
    /// How long one acquire may wait for the lock, in ms.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) wait_ms: u64,
    /// Hard limit on each worker's loop, in seconds.
    #[arg(long, default_value_t = 600)]
    pub(crate) max_secs: u64,
    /// Seed recorded with the run (reproducible schedules).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Use this server instead of starting one: e.g. redis://my-redis:6379;
    /// for redlock a comma-separated list of masters; for pg-*
    /// postgres://user@host:5432/db; for zookeeper a connect string
    /// host:port[,host:port...]; for etcd a comma-separated list of http://
    /// client URLs. Overrides the config file and the LOCKBENCH_*_URL(S) /
    /// LOCKBENCH_ZK_CONNECT / LOCKBENCH_ETCD_ENDPOINTS variables.
    #[arg(long)]
    pub(crate) endpoint: Option<String>,
    /// TOML file with one table per backend family: `[redis]`, `[redlock]`,
    /// `[postgres]` (e.g. `url = ...`), `[zookeeper]` (`connect = ...`),
    /// `[etcd]` (`endpoints = [...]`). Environment variables
    /// (LOCKBENCH_REDIS_URL, LOCKBENCH_REDLOCK_URLS, LOCKBENCH_PG_URL,
    /// LOCKBENCH_ZK_CONNECT, LOCKBENCH_ETCD_ENDPOINTS, ...) override it.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Output directory [default: reports/<run-id>].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Serve the workers' lock metrics (acquire latency and wait, acquires
    /// by outcome, hold time, renewals and their failures, lost() signals,
    /// unlocks that found the lock gone; all `lockbench_*`, labelled by
    /// backend and worker) in Prometheus text format at
    /// http://ADDR/metrics for the length of the run. A loopback address
    /// (127.0.0.0/8 or [::1]) with a port; port 0 picks a free one and
    /// prints it.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Inject this fault during the run (`lockbench faults` lists them):
    /// node-pause, node-kill (the lock's servers; only servers lockbench
    /// starts itself), holder-kill, holder-pause (the worker that holds).
    #[arg(long, value_enum, help_heading = "Faults")]
    pub(crate) fault: Option<FaultKind>,
    /// Seconds after the workers start when the fault begins.
    #[arg(
        long,
        default_value_t = 2.0,
        help_heading = "Faults",
        requires = "fault"
    )]
    pub(crate) fault_at: f64,
    /// How long the fault lasts, in seconds [default: 5; for holder-pause
    /// 2 x --lease-ms when a fixed lease is given].
    #[arg(long, help_heading = "Faults", requires = "fault")]
    pub(crate) fault_duration: Option<f64>,
    /// Inject the fault this many times, each after the previous one was
    /// undone, --fault-at x a factor in [0.5, 1.5) drawn from --seed later
    /// (the schedule is in results.json).
    #[arg(long, default_value_t = 1, help_heading = "Faults", requires = "fault")]
    pub(crate) fault_repeat: u32,
    /// Which of the lock's servers a node fault hits: all, one, a minority
    /// ((N-1)/2, at least one) or a majority (N/2+1).
    #[arg(
        long,
        value_enum,
        default_value = "all",
        help_heading = "Faults",
        requires = "fault"
    )]
    pub(crate) fault_target: NodeTarget,
    /// `single`: the backend's default servers; `cluster`: its replicated
    /// deployment where it has one (a 3-node etcd cluster, a 3-server
    /// ZooKeeper ensemble, a 3-master + 3-replica Redis Cluster), for
    /// minority faults; `sentinel`: redis and redis-wait on primary +
    /// replica found through 3 sentinels.
    #[arg(long, value_enum, default_value = "single")]
    pub(crate) topology: TopologyChoice,
    /// Durability profile of the lock's servers: `durable` (fsync before
    /// every acknowledged write) or `volatile` (acknowledged writes may be
    /// in memory only).
    ///
    /// Compare backends within one profile: across profiles the gap is
    /// mostly the price of fsync. The PostgreSQL holding the ledger / coupon
    /// data stays durable in both (a volatile pg-* run keeps that data on a
    /// second, durable server), so the data store never differs between
    /// backends. No effect on an --endpoint of your own. results.json
    /// records each server's flags and the file system under them (fsync
    /// on tmpfs costs nothing).
    #[arg(long, default_value_t = fleet::Durability::Durable, value_parser = durability_parser())]
    pub durability: fleet::Durability,
    /// Open loop: arrivals per second in total, across all workers
    /// (each worker a Poisson stream of rate / workers), for the latency
    /// and throughput workloads. Latency is then timed from each
    /// operation's intended start, so a backlog shows in it (no
    /// coordinated omission). Without it the loop is closed: the next
    /// operation starts when the last one ended.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Warm-up of the latency workload, ms (at least 5 iterations; not
    /// measured): connections, script caches, JIT-less server caches.
    #[arg(long, default_value_t = harness::spec::DEFAULT_WARMUP_MS)]
    pub warmup_ms: u64,
    /// Workers on N hosts: this process coordinates and starts no worker;
    /// each host runs `lockbench worker --run ID --config FILE` and they
    /// meet in the run's PostgreSQL (`[postgres] url`). Needs the ledger
    /// workload (its sections are stamped by the database, the check that
    /// needs no shared clock) and the servers in --config, which every
    /// host reads. --workers are split over the hosts.
    #[arg(long, help_heading = "Several hosts", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub hosts: Option<u32>,
    /// The run's id, given to the hosts' `lockbench worker --run`
    /// [default: <timestamp>-<backend>-<workload>]. Letters, digits, `.`,
    /// `_` and `-`, at most 64.
    #[arg(long = "run", help_heading = "Several hosts")]
    pub run_id: Option<String>,
    /// Seconds to wait for every host to join and be ready.
    #[arg(long, default_value_t = 60, help_heading = "Several hosts")]
    pub join_timeout: u64,
}

/// `--durability`'s values with their help (`fleet::Durability` is not a
/// clap type: the fleet crate does not depend on clap).
fn durability_parser() -> impl clap::builder::TypedValueParser<Value = fleet::Durability> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        fleet::Durability::ALL.map(|d| PossibleValue::new(d.as_str()).help(d.about())),
    )
    .try_map(|s| s.parse::<fleet::Durability>())
}

impl RunArgs {
    /// Arguments for one run of the comparison suite.
    pub fn for_compare(
        backend: &str,
        workload: Workload,
        out: PathBuf,
        config: Option<PathBuf>,
    ) -> Self {
        Self {
            backend: backend.to_string(),
            workload,
            worker_counts: Vec::new(),
            workers: None,
            ops: None,
            duration: None,
            keys: 1,
            hold_ms: None,
            stock: 100,
            users: 300,
            clicks: 3,
            lock_scope: harness::spec::LockScope::UserVoucher,
            ordering: harness::spec::Ordering::CommitThenUnlock,
            commit_delay_ms: 0,
            no_unique_index: false,
            strategy: harness::spec::Strategy::Lock,
            segments: 10,
            tasks: 1,
            local_first: false,
            bought_cache_ms: None,
            lease_ms: None,
            wait_ms: 10_000,
            max_secs: 600,
            seed: 1,
            endpoint: None,
            config,
            out: Some(out),
            json: false,
            quiet: false,
            metrics_addr: None,
            fault: None,
            fault_at: 2.0,
            fault_duration: None,
            fault_target: NodeTarget::All,
            fault_repeat: 1,
            topology: TopologyChoice::Single,
            durability: fleet::Durability::Durable,
            rate: None,
            warmup_ms: harness::spec::DEFAULT_WARMUP_MS,
            hosts: None,
            run_id: None,
            join_timeout: 60,
        }
    }
}
