//! The worker side: one OS process, its own connections, a loop of lock
//! cycles recorded to a history file.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock, Error, Guard};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::data::{self, Click, DataDb, PredeductKeys};
use crate::history::{monotonic_ns, write_jsonl, Event, EventError, Op, Outcome, Told};
use crate::spec::{CouponPlan, LockScope, Strategy, WorkerMsg, WorkerSpec, Workload};

pub use distlock::descriptor::{LockCycle, Probe, Probes};

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
    say(&WorkerMsg::Ready);
    let mut line = String::new();
    let mut stdin = BufReader::new(tokio::io::stdin());
    if stdin.read_line(&mut line).await.is_err() || line.trim() != "go" {
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
    let out = match run(&spec, &*lock, &probes).await {
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
    say(&WorkerMsg::Done {
        floor_ns: out.floor_ns,
        peers_ns: out.peers_ns,
        timed_out: out.timed_out,
        counters: out.counters,
        marks: out.marks,
    });
    true
}

fn outcome_of(e: &Error) -> Outcome {
    if e.is_indeterminate() {
        Outcome::Info
    } else {
        Outcome::Fail
    }
}

/// The worker's events, kept in memory and appended to its history file:
/// at the end, and right after every successful acquire and every release
/// when `eager`, so that a worker killed inside its critical section leaves
/// the start of that hold on disk (the coordinator then closes it at the
/// death), and one killed outside leaves none open.
#[derive(Default)]
struct EventLog {
    events: Vec<Event>,
    file: Option<std::fs::File>,
    written: usize,
    eager: bool,
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
        })
    }

    fn push(&mut self, e: Event) {
        // A hold's two ends: its start must be on disk before the section
        // runs, its end as soon as it is known; otherwise a worker killed
        // later would leave a hold that looks open until its death.
        let edge = e.op == Op::Release || (e.op == Op::Acquire && e.outcome == Outcome::Ok);
        self.events.push(e);
        if edge && self.eager {
            if let Err(e) = self.persist() {
                tracing::warn!(error = %e, "appending to the history file failed");
            }
        }
    }

    /// Appends what is not on disk yet, in one write.
    fn persist(&mut self) -> std::io::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &self.events[self.written..])?;
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
    timed_out: bool,
    counters: BTreeMap<String, u64>,
    marks: BTreeMap<String, u64>,
}

impl RunOut {
    fn count(&mut self, name: &str) {
        *self.counters.entry(name.to_string()).or_default() += 1;
    }
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
    /// Read the shared counter, sleep, write it + 1 and the fenced ledger.
    Ledger(&'a DataDb, Duration),
}

/// When a worker's loop ends: `ops` cycles, the run's duration, or the hard
/// `max_secs` limit (the only one that counts as timed out).
struct Bounds {
    stop_at: tokio::time::Instant,
    end_at: Option<tokio::time::Instant>,
}

impl Bounds {
    fn new(spec: &WorkerSpec) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            stop_at: now + Duration::from_secs(spec.plan.max_secs),
            end_at: spec
                .plan
                .duration_ms
                .map(|d| now + Duration::from_millis(d)),
        }
    }

    /// `Some(timed_out)` when the loop must stop.
    fn stop(&self) -> Option<bool> {
        let now = tokio::time::Instant::now();
        if now >= self.stop_at {
            Some(true)
        } else if self.end_at.is_some_and(|e| now >= e) {
            Some(false)
        } else {
            None
        }
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
    if spec.plan.workload == Workload::Coupon {
        return coupon(spec, lock).await;
    }
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
        Some(db) => Section::Ledger(db, hold),
        None => Section::Sleep(hold),
    };
    let latency = spec.plan.workload == Workload::Latency;
    if latency {
        // Warm-up: connections, script caches, allocator.
        for _ in 0..20 {
            if let Some(f) = &probes.floor {
                f.once().await.map_err(|e| e.to_string())?;
            }
            for (_, p) in &probes.peers {
                p.once().await.map_err(|e| e.to_string())?;
            }
            let g = lock.acquire(&key, opts).await.map_err(|e| e.to_string())?;
            g.release().await.map_err(|e| e.to_string())?;
        }
    }
    let bounds = Bounds::new(spec);
    for i in 0..spec.plan.ops {
        if let Some(timed_out) = bounds.stop() {
            out.timed_out = timed_out;
            break;
        }
        // Interleaved with our cycles, so all see the same conditions.
        if latency {
            if let Some(f) = &probes.floor {
                out.floor_ns
                    .push(sample(f.as_ref()).await.map_err(|e| e.to_string())?);
            }
            for (name, p) in &probes.peers {
                let ns = sample(p.as_ref()).await.map_err(|e| e.to_string())?;
                out.peers_ns.entry(name.clone()).or_default().push(ns);
            }
        }
        cycle(spec.worker, &key, lock, opts, &section, &mut out).await;
        if i % 10 == 9 {
            say(&WorkerMsg::Progress { done: i + 1 });
        }
    }
    Ok(out)
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
) -> Option<(Guard, u64)> {
    let invoke_ns = monotonic_ns();
    let r = lock.acquire(key, opts).await;
    let complete_ns = monotonic_ns();
    let (outcome, token, round_trips) = match &r {
        Ok(g) => (Outcome::Ok, g.token().map(|t| t.0), Some(g.round_trips())),
        Err(e) => (outcome_of(e), None, None),
    };
    let error = r.as_ref().err().map(EventError::of);
    events.push(Event {
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
    });
    r.ok().map(|g| (g, complete_ns))
}

/// Release, recorded.
async fn release_rec(
    worker: u32,
    key: &str,
    guard: Guard,
    lost_ns: Option<u64>,
    events: &mut EventLog,
) {
    let told = if guard.is_lost() {
        Told::Lost
    } else if tokio::time::Instant::now() >= guard.valid_until() {
        Told::Expired
    } else {
        Told::Nothing
    };
    let invoke_ns = monotonic_ns();
    let r = guard.release().await;
    let complete_ns = monotonic_ns();
    let (outcome, was_held, error) = match r {
        Ok(h) => (Outcome::Ok, Some(h), None),
        Err(e) => (outcome_of(&e), None, Some(EventError::of(&e))),
    };
    events.push(Event {
        worker,
        key: key.to_string(),
        op: Op::Release,
        invoke_ns,
        complete_ns,
        outcome,
        token: None,
        was_held,
        round_trips: None,
        told: Some(told),
        lost_ns,
        error,
    });
}

/// acquire -> critical section -> release, both ends recorded.
async fn cycle(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
    section: &Section<'_>,
    out: &mut RunOut,
) {
    let Some((guard, acquired_ns)) = acquire_rec(worker, key, lock, opts, &mut out.events).await
    else {
        return;
    };
    // In a faulted run, when the holder is told its lock is lost: the
    // nemesis measures how long after the lock really changed hands.
    let watch = out.announce.then(|| {
        let lost = guard.lost();
        tokio::spawn(async move {
            lost.await;
            monotonic_ns()
        })
    });
    if out.announce {
        say(&WorkerMsg::Holding);
    }
    match section {
        Section::Sleep(hold) => {
            if !hold.is_zero() {
                tokio::time::sleep(*hold).await;
            }
        }
        Section::Ledger(db, hold) => {
            let token = guard.token().map(|t| t.0);
            match db
                .critical_section(key, worker, token, acquired_ns, *hold)
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
    if out.announce {
        say(&WorkerMsg::Released);
    }
    let lost_ns = match watch {
        Some(w) if w.is_finished() => w.await.ok(),
        Some(w) => {
            w.abort();
            // Ready but not yet run (a resumed process wakes its section
            // and its watcher at once): the holder can see it now.
            (guard.is_lost() || tokio::time::Instant::now() >= guard.valid_until())
                .then(monotonic_ns)
        }
        None => None,
    };
    release_rec(worker, key, guard, lost_ns, &mut out.events).await;
}

/// The flash-sale click sequence: users in a seeded random order, each
/// user's clicks adjacent, dealt round-robin to the workers so that one
/// user's duplicate clicks arrive at about the same time from different
/// processes (as a user hammering "buy" does).
pub fn click_order(users: u32, clicks: u32, seed: u64) -> Vec<u64> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<u64> = (0..u64::from(users)).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    order
        .into_iter()
        .flat_map(|u| std::iter::repeat_n(u, clicks as usize))
        .collect()
}

async fn coupon(spec: &WorkerSpec, lock: &dyn DistLock) -> Result<RunOut, String> {
    let plan = spec
        .plan
        .coupon
        .as_ref()
        .ok_or("coupon workload without coupon parameters")?;
    let workers = spec.plan.workers.max(1) as usize;
    let mine: Vec<u64> = click_order(plan.users, plan.clicks, spec.plan.seed)
        .into_iter()
        .enumerate()
        .filter(|(j, _)| j % workers == spec.worker as usize)
        .map(|(_, u)| u)
        .collect();
    let db = match plan.strategy {
        Strategy::RedisPrededuct => None,
        _ => Some(data_db(spec, 2).await?),
    };
    let keys = PredeductKeys::new(&spec.plan.key);
    let mut con = match plan.strategy {
        Strategy::RedisPrededuct => {
            let url = spec
                .plan
                .data_redis_url
                .as_deref()
                .ok_or("redis-prededuct needs a Redis (data_redis_url)")?;
            Some(data::redis_connect(url).await.map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let opts = AcquireOptions {
        wait: Some(Duration::from_millis(spec.plan.wait_ms)),
        lease: spec.plan.lease_ms.map(Duration::from_millis),
    };
    let delay = Duration::from_millis(plan.commit_delay_ms);
    let mut out = RunOut {
        events: EventLog::create(&spec.history_path, true, mine.len() * 2 + 16)?,
        ..RunOut::default()
    };
    let bounds = Bounds::new(spec);
    for (i, user) in mine.into_iter().enumerate() {
        if let Some(timed_out) = bounds.stop() {
            out.timed_out = timed_out;
            break;
        }
        let click = match (plan.strategy, &db, &mut con) {
            (Strategy::Lock, Some(db), _) => {
                let key = match plan.lock_scope {
                    LockScope::Voucher => format!("{}:voucher:1", spec.plan.key),
                    LockScope::UserVoucher => format!("{}:voucher:1:user:{user}", spec.plan.key),
                };
                locked_click(
                    spec.worker,
                    &key,
                    lock,
                    opts,
                    db,
                    user,
                    plan,
                    delay,
                    &mut out,
                )
                .await
            }
            (Strategy::SqlAtomic, Some(db), _) => db.order_atomic(user).await.map(Some),
            (Strategy::RedisPrededuct, _, Some(con)) => {
                data::prededuct_click(con, &keys, user).await.map(Some)
            }
            _ => return Err("coupon strategy without its data store".into()),
        };
        out.count("clicks");
        match click {
            Ok(Some(c)) => {
                out.count(c.counter());
                if c == Click::Ordered {
                    out.marks.insert("last_order_ns".into(), monotonic_ns());
                }
            }
            Ok(None) => out.count("rejected_lock_timeout"),
            Err(e) => {
                tracing::warn!(error = %e, "click failed");
                out.count("errors");
            }
        }
        if i % 10 == 9 {
            say(&WorkerMsg::Progress { done: i as u64 + 1 });
        }
    }
    Ok(out)
}

/// One click under the lock: `None` when the lock was not obtained.
#[allow(clippy::too_many_arguments)]
async fn locked_click(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
    db: &DataDb,
    user: u64,
    plan: &CouponPlan,
    delay: Duration,
    out: &mut RunOut,
) -> Result<Option<Click>, data::DataError> {
    let Some((guard, _)) = acquire_rec(worker, key, lock, opts, &mut out.events).await else {
        return Ok(None);
    };
    let pending = match db.order_locked(user).await {
        Ok(p) => p,
        Err(e) => {
            release_rec(worker, key, guard, None, &mut out.events).await;
            return Err(e);
        }
    };
    let click = if data::unlocks_first(plan) {
        release_rec(worker, key, guard, None, &mut out.events).await;
        pending.commit(delay).await
    } else {
        let c = pending.commit(delay).await;
        release_rec(worker, key, guard, None, &mut out.events).await;
        c
    };
    click.map(Some)
}
