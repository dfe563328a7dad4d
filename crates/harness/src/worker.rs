//! The worker side: one OS process, its own connections, a loop of lock
//! cycles recorded to a history file.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock, Error, Guard};

use crate::data::DataDb;
use crate::history::{monotonic_ns, write_jsonl, Event, EventError, Op, Outcome, Told};
use crate::pacing::{sleep_until_ns, worker_seed, Arrivals, StepOrder, Stream};
use crate::spec::{TimedCycle, WorkerMsg, WorkerSpec, Workload, MIN_WARMUP_ITERATIONS};

pub use distlock::descriptor::{LockCycle, Probe, Probes};

mod coupon;
#[cfg(test)]
mod tests;

pub use coupon::click_order;

/// Set when the coordinator says `stop`: the loops end as at their plan's
/// end (the run can no longer measure anything, e.g. a server died).
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn say(msg: &WorkerMsg) {
    let mut out = std::io::stdout().lock();
    if let Ok(line) = serde_json::to_string(msg) {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Worker main: announce ready, wait for `go` on stdin, run, write the
/// history, announce done. Errors are reported as a message, not a panic.
pub async fn serve(spec: WorkerSpec, lock: Arc<dyn DistLock>, probes: Probes) -> bool {
    // Before `Ready`: the coordinator watches the slot from then on.
    if let Err(e) = crate::alive::hold_from_env() {
        tracing::warn!(error = %e, "the coordinator will know this worker's death by its pipe alone");
    }
    say(&WorkerMsg::Ready);
    // Every line after the orders, `go` and `stop`, through std's one
    // buffered stdin, on a plain thread: a second reader (tokio's) kept
    // bytes it read past `go` and dropped them, a `stop` sent right after
    // `go` with them; and a blocking read inside the runtime would hold
    // its shutdown until the coordinator closes the pipe.
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<bool>();
    std::thread::spawn(move || {
        let mut go = Some(go_tx);
        for line in std::io::stdin().lines() {
            match line.as_deref().map(str::trim) {
                Ok("go") => {
                    if let Some(tx) = go.take() {
                        let _ = tx.send(true);
                    }
                }
                Ok("stop") => {
                    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        // The pipe closed (or broke) before `go`: the coordinator is gone.
        if let Some(tx) = go.take() {
            let _ = tx.send(false);
        }
    });
    if !go_rx.await.unwrap_or(false) {
        say(&WorkerMsg::Error {
            message: "coordinator went away before go".into(),
        });
        return false;
    }
    if let Some(fp) = spec.plan.fault_point.filter(|fp| fp.worker == spec.worker) {
        distlock::faultpoint::observe(|point, _| {
            say(&WorkerMsg::FaultPoint {
                point: point.to_string(),
                at_ns: crate::history::monotonic_ns(),
            });
        });
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(fp.at_ms)).await;
            distlock::faultpoint::arm(fp.action);
        });
    }
    let (lock, metrics) = match instrument(&spec, lock) {
        Ok(x) => x,
        Err(message) => {
            say(&WorkerMsg::Error { message });
            return false;
        }
    };
    let ran = if spec.plan.workload == Workload::Coupon {
        coupon::coupon(&spec, lock.clone()).await
    } else {
        run(&spec, &*lock, &probes).await
    };
    let out = match ran {
        Ok(out) => out,
        Err(message) => {
            say(&WorkerMsg::Error { message });
            return false;
        }
    };
    let mut out = out;
    if let Err(e) = out.events.persist() {
        say(&WorkerMsg::Error {
            message: format!("writing {}: {e}", spec.history_path),
        });
        return false;
    }
    if let Some((handle, pusher)) = metrics {
        pusher.abort();
        say(&WorkerMsg::Metrics {
            text: handle.render(),
        });
    }
    say(&WorkerMsg::Done {
        floor_ns: out.floor_ns,
        peers_ns: out.peers_ns,
        paired_ns: out.paired_ns,
        timed: out.timed,
        loop_start_ns: out.loop_start_ns,
        timed_out: out.timed_out,
        counters: out.counters,
        marks: out.marks,
    });
    true
}

/// The metrics recorder and the task that sends its page.
type MetricsPush = (
    metrics_exporter_prometheus::PrometheusHandle,
    tokio::task::JoinHandle<()>,
);

/// When the plan asks for metrics: the lock wrapped in `Instrumented`,
/// this process's Prometheus recorder (every sample labelled with the
/// worker) and a task sending its page to the coordinator.
fn instrument(
    spec: &WorkerSpec,
    lock: Arc<dyn DistLock>,
) -> Result<(Arc<dyn DistLock>, Option<MetricsPush>), String> {
    if !spec.plan.metrics {
        return Ok((lock, None));
    }
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .add_global_label("worker", spec.worker.to_string())
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))?;
    let lock: Arc<dyn DistLock> = Arc::new(lockbench_patterns::Instrumented::new(lock));
    let h = handle.clone();
    let pusher = tokio::spawn(async move {
        let every = Duration::from_millis(crate::spec::METRICS_EVERY_MS);
        loop {
            tokio::time::sleep(every).await;
            // Drains the histograms' buffers into their summaries.
            h.run_upkeep();
            say(&WorkerMsg::Metrics { text: h.render() });
        }
    });
    Ok((lock, Some((handle, pusher))))
}

fn outcome_of(e: &Error) -> Outcome {
    if e.is_indeterminate() {
        Outcome::Info
    } else {
        Outcome::Fail
    }
}

/// The worker's events, kept in memory and appended to its history file:
/// at the end, and when `eager` right after every successful acquire,
/// before every release is sent and after it returns, so that a worker
/// killed inside its critical section leaves the start of that hold on
/// disk (the coordinator then closes it at the death), one killed while
/// its release is in flight leaves the hold closed where it let go, and
/// one killed outside leaves none open.
#[derive(Default)]
struct EventLog {
    events: Vec<Event>,
    file: Option<std::fs::File>,
    written: usize,
    eager: bool,
    /// The first failed append: the run stops on it (a full disk ran the
    /// workload to its end with a warning per hold and a cut history).
    failed: Option<String>,
}

impl EventLog {
    /// A log appending to `path` (created empty).
    fn create(path: &str, eager: bool, capacity: usize) -> Result<Self, String> {
        let file = std::fs::File::create(path).map_err(|e| format!("creating {path}: {e}"))?;
        Ok(Self {
            events: Vec::with_capacity(capacity),
            file: Some(file),
            written: 0,
            eager,
            failed: None,
        })
    }

    fn push(&mut self, e: Event) {
        // A hold's two ends: its start must be on disk before the section
        // runs, its end as soon as it is known; otherwise a worker killed
        // later would leave a hold that looks open until its death.
        let edge = e.op == Op::Release || (e.op == Op::Acquire && e.outcome == Outcome::Ok);
        self.events.push(e);
        if edge && self.eager {
            let r = self.persist();
            self.note(r);
        }
    }

    /// Keeps the first failed append (warned of once): the run stops on it.
    fn note(&mut self, r: std::io::Result<()>) {
        if let Err(e) = r {
            if self.failed.is_none() {
                tracing::warn!(error = %e, "appending to the history file failed");
                self.failed = Some(e.to_string());
            }
        }
    }

    /// Before a release is sent: when eager, puts `intent` (an
    /// [`Op::Releasing`] record) on disk after what is pending, so that a
    /// worker killed while its release is in flight leaves its hold closed
    /// where it let go. One write, inside the hold (a few µs).
    fn releasing(&mut self, intent: &Event) {
        if !self.eager {
            return;
        }
        let r = self.write_pending(Some(intent));
        self.note(r);
    }

    /// Appends what is not on disk yet, in one write.
    fn persist(&mut self) -> std::io::Result<()> {
        self.write_pending(None)
    }

    /// What is not on disk yet, then `extra` (not kept in `events`), in
    /// one write.
    fn write_pending(&mut self, extra: Option<&Event>) -> std::io::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &self.events[self.written..])?;
        if let Some(e) = extra {
            write_jsonl(&mut buf, std::slice::from_ref(e))?;
        }
        f.write_all(&buf)?;
        self.written = self.events.len();
        Ok(())
    }
}

#[derive(Default)]
struct RunOut {
    events: EventLog,
    /// Say `Holding` / `Released` around every critical section.
    announce: bool,
    floor_ns: Vec<u64>,
    peers_ns: BTreeMap<String, Vec<u64>>,
    /// (floor, cycle) of the same iteration.
    paired_ns: Vec<[u64; 2]>,
    /// Open loop: cycles timed from their intended start.
    timed: Vec<TimedCycle>,
    /// When the measured loop began (CLOCK_MONOTONIC ns).
    loop_start_ns: u64,
    timed_out: bool,
    counters: BTreeMap<String, u64>,
    marks: BTreeMap<String, u64>,
}

impl RunOut {
    fn count(&mut self, name: &str) {
        self.add(name, 1);
    }

    fn add(&mut self, name: &str, n: u64) {
        *self.counters.entry(name.to_string()).or_default() += n;
    }
}

/// Counts a failed probe sample (`probe_errors` in the run's counters)
/// and logs the first of each probe.
fn probe_failed(out: &mut RunOut, probe: &str, e: &distlock::Error) {
    let key = format!("probe_errors:{probe}");
    if !out.counters.contains_key(&key) {
        tracing::warn!(probe, error = %e, "a probe sample failed; counted in probe_errors");
    }
    out.count(&key);
    out.count("probe_errors");
}

async fn sample(p: &dyn Probe) -> distlock::Result<u64> {
    let t0 = monotonic_ns();
    p.once().await?;
    Ok(monotonic_ns() - t0)
}

/// What happens between acquire and release.
enum Section<'a> {
    /// Sleep (the mutex, latency and throughput workloads).
    Sleep(Duration),
    /// Read the shared counter, sleep, write it + 1 and the fenced ledger
    /// (stale writes told by the database's clock when the workers are on
    /// several hosts).
    Ledger(&'a DataDb, Duration, bool),
}

/// When a worker's loop ends: `ops` cycles, the run's duration, the coordinator's
/// `stop`, or the hard
/// `max_secs` limit (the only one that counts as timed out). On
/// CLOCK_MONOTONIC ns, the clock the open loop's arrivals are on.
struct Bounds {
    stop_ns: u64,
    end_ns: Option<u64>,
}

impl Bounds {
    fn new(spec: &WorkerSpec) -> Self {
        let now = monotonic_ns();
        Self {
            stop_ns: now.saturating_add(spec.plan.max_secs.saturating_mul(1_000_000_000)),
            end_ns: spec
                .plan
                .duration_ms
                .map(|d| now.saturating_add(d.saturating_mul(1_000_000))),
        }
    }

    /// `Some(timed_out)` when the loop must stop at `at_ns`.
    fn stop_at(&self, at_ns: u64) -> Option<bool> {
        if at_ns >= self.stop_ns {
            Some(true)
        } else if self.end_ns.is_some_and(|e| at_ns >= e)
            || STOP.load(std::sync::atomic::Ordering::Relaxed)
        {
            Some(false)
        } else {
            None
        }
    }

    /// `Some(timed_out)` when the loop must stop now.
    fn stop(&self) -> Option<bool> {
        self.stop_at(monotonic_ns())
    }
}

/// The key this worker locks (the coupon workload's keys are per click).
pub fn lock_key(spec: &WorkerSpec) -> String {
    match spec.plan.workload {
        Workload::Latency => format!("{}:w{}", spec.plan.key, spec.worker),
        Workload::Throughput => {
            format!("{}:k{}", spec.plan.key, spec.worker % spec.plan.keys.max(1))
        }
        _ => spec.plan.key.clone(),
    }
}

async fn run(spec: &WorkerSpec, lock: &dyn DistLock, probes: &Probes) -> Result<RunOut, String> {
    // The latency workload times microseconds and runs no fault: its log
    // is written once, at the end, off the measured path.
    let eager = spec.plan.workload != Workload::Latency;
    let capacity = usize::try_from(spec.plan.ops.min(100_000)).unwrap_or(100_000) * 2 + 16;
    let mut out = RunOut {
        events: EventLog::create(&spec.history_path, eager, capacity)?,
        announce: spec.plan.announce_holds,
        ..RunOut::default()
    };
    let key = lock_key(spec);
    let opts = AcquireOptions {
        wait: Some(Duration::from_millis(spec.plan.wait_ms)),
        lease: spec.plan.lease_ms.map(Duration::from_millis),
    };
    let hold = Duration::from_millis(spec.plan.hold_ms);
    let data = match spec.plan.workload {
        Workload::Ledger => Some(data_db(spec, 2).await?),
        _ => None,
    };
    let section = match &data {
        Some(db) => Section::Ledger(db, hold, spec.plan.across_hosts),
        None => Section::Sleep(hold),
    };
    let latency = spec.plan.workload == Workload::Latency;
    let rate = spec.plan.open_loop_rate().map_err(|e| e.to_string())?;
    if spec.plan.rate.is_some() && rate.is_none() {
        tracing::warn!(workload = ?spec.plan.workload, "rate ignored: only the latency and throughput workloads run an open loop");
    }
    let mut steps = if latency {
        latency_steps(probes)
    } else {
        vec![Step::Cycle]
    };
    if latency {
        warm_up(&steps, probes, lock, &key, opts, spec.plan.warmup_ms).await?;
    }
    let mut order = StepOrder::new(worker_seed(spec.plan.seed, spec.worker, Stream::Order));
    let bounds = Bounds::new(spec);
    out.loop_start_ns = monotonic_ns();
    let mut arrivals = rate.map(|r| {
        Arrivals::new(
            worker_seed(spec.plan.seed, spec.worker, Stream::Arrivals),
            r / f64::from(spec.plan.workers.max(1)),
            out.loop_start_ns,
        )
    });
    for i in 0..spec.plan.ops {
        // Open loop: wait for the arrival's intended start, unless it has
        // passed already: a worker behind schedule does not sleep, and its
        // backlog shows in the latencies below.
        let intended_ns = match arrivals.as_mut() {
            Some(a) => {
                let t = a.next_ns();
                if let Some(timed_out) = bounds.stop_at(t) {
                    out.timed_out = timed_out;
                    break;
                }
                sleep_until_ns(t).await;
                Some(t)
            }
            None => None,
        };
        if let Some(timed_out) = bounds.stop() {
            out.timed_out = timed_out;
            break;
        }
        if let Some(e) = &out.events.failed {
            return Err(format!("writing its history: {e}"));
        }
        // Every step of the iteration is timed from its own intended
        // start: its place in the iteration, moved back by how late the
        // iteration began. So the backlog weighs on floor, peers and our
        // cycle alike, whatever their order.
        let lag_ns = intended_ns.map_or(0, |t| monotonic_ns().saturating_sub(t));
        // Interleaved with our cycles in a fresh order each time, so all
        // see the same conditions.
        order.shuffle(&mut steps);
        let mut floor = None;
        let mut times = None;
        for step in &steps {
            match *step {
                // A probe with no reply in time (a slow moment of the
                // servers) is a sample lost, counted, not the end of the
                // worker: one 50 ms stall of RedLock's masters ended the run.
                Step::Floor => {
                    if let Some(f) = &probes.floor {
                        match sample(f.as_ref()).await {
                            Ok(ns) => {
                                out.floor_ns.push(ns + lag_ns);
                                floor = Some(ns + lag_ns);
                            }
                            Err(e) => probe_failed(&mut out, "floor", &e),
                        }
                    }
                }
                Step::Peer(j) => {
                    if let Some((name, p)) = probes.peers.get(j) {
                        match sample(p.as_ref()).await {
                            Ok(ns) => out
                                .peers_ns
                                .entry(name.clone())
                                .or_default()
                                .push(ns + lag_ns),
                            Err(e) => probe_failed(&mut out, name, &e),
                        }
                    }
                }
                Step::Cycle => {
                    times = cycle(spec.worker, &key, lock, opts, &section, &mut out).await;
                }
            }
        }
        if let Some(t) = times {
            let cycle_ns = t.cycle_ns + lag_ns;
            if let Some(f) = floor {
                out.paired_ns.push([f, cycle_ns]);
            }
            if let Some(intended_ns) = intended_ns {
                out.timed.push(TimedCycle {
                    intended_ns,
                    acquire_ns: t.acquire_ns + lag_ns,
                    cycle_ns,
                });
            }
        }
        if i % 10 == 9 {
            say(&WorkerMsg::Progress { done: i + 1 });
        }
    }
    Ok(out)
}

/// One step of a latency iteration.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A raw-floor sample.
    Floor,
    /// A sample of the peer at this index of [`Probes::peers`].
    Peer(usize),
    /// Our lock cycle.
    Cycle,
}

fn latency_steps(probes: &Probes) -> Vec<Step> {
    let mut steps = Vec::with_capacity(probes.peers.len() + 2);
    if probes.floor.is_some() {
        steps.push(Step::Floor);
    }
    steps.extend((0..probes.peers.len()).map(Step::Peer));
    steps.push(Step::Cycle);
    steps
}

/// The latency workload's warm-up (connections, script caches, allocator,
/// CPU clock): every step, unrecorded, for `warmup_ms` and at least
/// [`MIN_WARMUP_ITERATIONS`] times. In a fixed order: the seeded order of
/// the measured iterations must not depend on how many iterations the
/// warm-up happened to fit in.
async fn warm_up(
    steps: &[Step],
    probes: &Probes,
    lock: &dyn DistLock,
    key: &str,
    opts: AcquireOptions,
    warmup_ms: u64,
) -> Result<(), String> {
    let until = monotonic_ns().saturating_add(warmup_ms.saturating_mul(1_000_000));
    let mut n = 0u32;
    // A step that fails now and then (a slow reply) is part of warming up;
    // only servers that fail every iteration are a reason to give up.
    let mut failed_in_a_row = 0u32;
    while n < MIN_WARMUP_ITERATIONS || monotonic_ns() < until {
        let mut failed = None;
        for step in steps {
            let r = match *step {
                Step::Floor => match &probes.floor {
                    Some(f) => f.once().await,
                    None => Ok(()),
                },
                Step::Peer(j) => match probes.peers.get(j) {
                    Some((_, p)) => p.once().await,
                    None => Ok(()),
                },
                Step::Cycle => match lock.acquire(key, opts).await {
                    Ok(g) => g.release().await.map(|_| ()),
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = r {
                failed = Some(e.to_string());
            }
        }
        match failed {
            Some(e) => {
                failed_in_a_row += 1;
                if failed_in_a_row >= MIN_WARMUP_ITERATIONS {
                    return Err(format!(
                        "warming up: {failed_in_a_row} iterations in a row failed, the last: {e}"
                    ));
                }
            }
            None => {
                failed_in_a_row = 0;
                n = n.saturating_add(1);
            }
        }
    }
    tracing::debug!(iterations = n, warmup_ms, "warmed up");
    Ok(())
}

async fn data_db(spec: &WorkerSpec, conns: u32) -> Result<DataDb, String> {
    let url = spec
        .plan
        .data_pg_url
        .as_deref()
        .ok_or("this workload needs a PostgreSQL for its data (data_pg_url)")?;
    DataDb::connect(url, &spec.plan.key, conns)
        .await
        .map_err(|e| e.to_string())
}

/// Acquire, recorded; the guard on success.
async fn acquire_rec(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
    events: &mut EventLog,
) -> Option<Acquired> {
    let (event, acquired) = acquire_ev(worker, key, lock, opts).await;
    events.push(event);
    acquired
}

/// An acquire and the event that records it, for callers that share
/// their log between tasks (and so cannot lend it across the await).
async fn acquire_ev(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
) -> (Event, Option<Acquired>) {
    let invoke_ns = monotonic_ns();
    let r = lock.acquire(key, opts).await;
    let complete_ns = monotonic_ns();
    let (outcome, token, round_trips) = match &r {
        Ok(g) => (Outcome::Ok, g.token().map(|t| t.0), Some(g.round_trips())),
        Err(e) => (outcome_of(e), None, None),
    };
    let error = r.as_ref().err().map(EventError::of);
    let event = Event {
        worker,
        key: key.to_string(),
        op: Op::Acquire,
        invoke_ns,
        complete_ns,
        outcome,
        token,
        was_held: None,
        round_trips,
        told: None,
        lost_ns: None,
        error,
    };
    let acquired = r.ok().map(|guard| Acquired {
        guard,
        invoke_ns,
        complete_ns,
    });
    (event, acquired)
}

/// A successful acquire, with its two ends (CLOCK_MONOTONIC ns).
struct Acquired {
    guard: Guard,
    invoke_ns: u64,
    complete_ns: u64,
}

/// What one recorded cycle took, ns.
#[derive(Debug, Clone, Copy)]
struct CycleTimes {
    /// Acquire invoke -> complete.
    acquire_ns: u64,
    /// Acquire invoke -> release complete.
    cycle_ns: u64,
}

/// Release, recorded; when it completed (CLOCK_MONOTONIC ns).
async fn release_rec(
    worker: u32,
    key: &str,
    guard: Guard,
    lost_ns: Option<u64>,
    events: &mut EventLog,
) -> u64 {
    let intent = releasing_ev(worker, key, &guard, lost_ns);
    events.releasing(&intent);
    let event = release_ev(intent, guard).await;
    let complete_ns = event.complete_ns;
    die_here_if_told(worker);
    events.push(event);
    complete_ns
}

/// The environment variable for the harness's own tests: `N` makes worker
/// 0 exit 200 ms after its `N`-th release returned, before recording it (a
/// worker killed while its release is in flight, made repeatable).
pub const DIE_AFTER_RELEASE_ENV: &str = "LOCKBENCH_TEST_DIE_AFTER_RELEASE";

fn die_here_if_told(worker: u32) {
    static AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static RELEASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Some(n) = *AFTER.get_or_init(|| {
        std::env::var(DIE_AFTER_RELEASE_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
    }) else {
        return;
    };
    let seen = RELEASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if worker == 0 && seen == n {
        // Blocking on purpose: nothing else of this worker may run first.
        std::thread::sleep(Duration::from_millis(200));
        std::process::exit(9);
    }
}

/// The record a release leaves on disk before it is sent
/// ([`Op::Releasing`]): what the holder had been told, and when it let go.
fn releasing_ev(worker: u32, key: &str, guard: &Guard, lost_ns: Option<u64>) -> Event {
    let told = if guard.is_lost() {
        Told::Lost
    } else if tokio::time::Instant::now() >= guard.valid_until() {
        Told::Expired
    } else {
        Told::Nothing
    };
    let invoke_ns = monotonic_ns();
    Event {
        worker,
        key: key.to_string(),
        op: Op::Releasing,
        invoke_ns,
        complete_ns: invoke_ns,
        outcome: Outcome::Info,
        token: None,
        was_held: None,
        round_trips: None,
        told: Some(told),
        lost_ns,
        error: None,
    }
}

/// Sends the release `intent` announced and returns the event that
/// records it (see [`acquire_ev`]).
async fn release_ev(intent: Event, guard: Guard) -> Event {
    let r = guard.release().await;
    let complete_ns = monotonic_ns();
    let (outcome, was_held, error) = match r {
        Ok(h) => (Outcome::Ok, Some(h), None),
        Err(e) => (outcome_of(&e), None, Some(EventError::of(&e))),
    };
    Event {
        op: Op::Release,
        complete_ns,
        outcome,
        was_held,
        error,
        ..intent
    }
}

/// In a faulted run, says `Holding` (a nemesis picks its victim by it) and
/// watches when the holder is told its lock is lost: the nemesis measures
/// how long after the lock really changed hands.
pub(super) fn holding(announce: bool, guard: &Guard) -> Option<tokio::task::JoinHandle<u64>> {
    if !announce {
        return None;
    }
    let lost = guard.lost();
    let watch = tokio::spawn(async move {
        lost.await;
        monotonic_ns()
    });
    say(&WorkerMsg::Holding);
    Some(watch)
}

/// The end of [`holding`]: says `Released`; when `lost()` fired, if it did.
pub(super) async fn leaving(
    announce: bool,
    watch: Option<tokio::task::JoinHandle<u64>>,
    guard: &Guard,
) -> Option<u64> {
    if announce {
        say(&WorkerMsg::Released);
    }
    match watch {
        Some(w) if w.is_finished() => w.await.ok(),
        Some(w) => {
            w.abort();
            // Ready but not yet run (a resumed process wakes its section
            // and its watcher at once): the holder can see it now.
            (guard.is_lost() || tokio::time::Instant::now() >= guard.valid_until())
                .then(monotonic_ns)
        }
        None => None,
    }
}

/// acquire -> critical section -> release, both ends recorded; its times
/// if the acquire succeeded.
async fn cycle(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
    section: &Section<'_>,
    out: &mut RunOut,
) -> Option<CycleTimes> {
    let Acquired {
        guard,
        invoke_ns,
        complete_ns: acquired_ns,
    } = acquire_rec(worker, key, lock, opts, &mut out.events).await?;
    let watch = holding(out.announce, &guard);
    match section {
        Section::Sleep(hold) => {
            if !hold.is_zero() {
                tokio::time::sleep(*hold).await;
            }
        }
        Section::Ledger(db, hold, across_hosts) => {
            let token = guard.token().map(|t| t.0);
            match db
                .critical_section(key, worker, token, acquired_ns, *hold, *across_hosts)
                .await
            {
                Ok(true) => {}
                Ok(false) => out.count("ledger_rejected"),
                Err(e) => {
                    tracing::warn!(error = %e, "ledger critical section failed");
                    out.count("ledger_errors");
                }
            }
        }
    }
    let lost_ns = leaving(out.announce, watch, &guard).await;
    let released_ns = release_rec(worker, key, guard, lost_ns, &mut out.events).await;
    Some(CycleTimes {
        acquire_ns: acquired_ns - invoke_ns,
        cycle_ns: released_ns.saturating_sub(invoke_ns),
    })
}
