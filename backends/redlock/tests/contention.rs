//! Issue #19 (RedLock part): what the retry delay does to a contended key.
//!
//! N tasks, EACH WITH ITS OWN [`RedLock`] handle (its own connections to
//! the five masters, as separate worker processes have), take and release
//! one key in a loop with hold 0, for a bounded time and a bounded count.
//! Printed per policy and N: cycles/s, acquire p50/p99/max, hand-over
//! p50/p99 (one holder's release invoked -> the next holder's acquire
//! returned) and round trips per acquire (as the guard reports them).
//!
//! Asserted: mutual exclusion (no two holders at once, checked on one
//! shared monotonic clock) and that every task acquired at least once.
//! Timing is only printed: the machine is shared and noisy.
//!
//! Run explicitly, in release (about 20 s a round; the medians of
//! `LOCKBENCH_CONTENTION_ROUNDS` rounds are printed at the end, and
//! `LOCKBENCH_CONTENTION_POLICIES=uniform,aging` picks policies):
//! `LOCKBENCH_CONTENTION_ROUNDS=5 cargo test --release -p lockbench-redlock --test contention -- --ignored --nocapture`

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{AcquireOptions, DistLock};
use fleet::RedisFleet;
use lockbench_redlock::{RedLock, RedLockConfig, RetryPolicy};
use tokio::time::Instant;

/// How long one run lasts at most.
const RUN_FOR: Duration = Duration::from_secs(3);
/// How many cycles one run makes at most (all tasks together).
const MAX_CYCLES: u64 = 20_000;
/// Worker counts measured.
const WORKERS: [usize; 2] = [4, 16];
/// One acquire's wait budget: a task that cannot get the key within it
/// fails the run (starvation).
const WAIT: Duration = Duration::from_secs(10);

/// What one task saw.
#[derive(Default)]
struct TaskLog {
    cycles: u64,
    acquire: Vec<Duration>,
    handover: Vec<Duration>,
    round_trips: u64,
    /// Acquires or releases that failed with an error (a node slower than
    /// its deadline on this busy machine, a wait budget run out): counted
    /// and printed, not fatal; mutual exclusion is what is asserted.
    errors: u64,
}

/// Shared by the tasks of one run.
struct Shared {
    /// Holders right now; more than one is a violation.
    holders: AtomicUsize,
    violations: AtomicU64,
    cycles: AtomicU64,
    /// When the last holder invoked its release.
    last_release: Mutex<Option<Instant>>,
}

struct Figures {
    cycles_per_s: f64,
    acquire: [Duration; 3],
    handover: [Duration; 2],
    rt_per_acquire: f64,
    per_task_min: u64,
    per_task_max: u64,
    errors: u64,
}

/// The `per_mille`-th quantile (nearest rank below) of sorted figures.
fn pct(sorted: &[Duration], per_mille: usize) -> Duration {
    let i = sorted.len().saturating_sub(1) * per_mille / 1000;
    sorted.get(i).copied().unwrap_or_default()
}

async fn run(cfg: &RedLockConfig, n: usize, key: &str) -> Figures {
    let mut locks = Vec::with_capacity(n);
    for _ in 0..n {
        locks.push(RedLock::connect(cfg.clone()).await.unwrap());
    }
    // Warm every handle's connections (and the nodes' script caches).
    for l in &locks {
        let g = l
            .acquire(&format!("{key}:warm"), AcquireOptions::wait(WAIT))
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let shared = Arc::new(Shared {
        holders: AtomicUsize::new(0),
        violations: AtomicU64::new(0),
        cycles: AtomicU64::new(0),
        last_release: Mutex::new(None),
    });
    let start = Instant::now();
    let stop = start + RUN_FOR;
    let tasks: Vec<_> = locks
        .into_iter()
        .map(|lock| {
            let shared = shared.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                let mut log = TaskLog::default();
                while Instant::now() < stop && shared.cycles.load(Ordering::Relaxed) < MAX_CYCLES {
                    let t0 = Instant::now();
                    let g = match lock.acquire(&key, AcquireOptions::wait(WAIT)).await {
                        Ok(g) => g,
                        Err(e) => {
                            eprintln!("acquire failed after {:?}: {e}", t0.elapsed());
                            log.errors += 1;
                            continue;
                        }
                    };
                    let got = Instant::now();
                    if shared.holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        shared.violations.fetch_add(1, Ordering::SeqCst);
                    }
                    log.acquire.push(got - t0);
                    log.round_trips += u64::from(g.round_trips());
                    if let Some(prev) = *shared.last_release.lock().unwrap() {
                        log.handover.push(got.saturating_duration_since(prev));
                    }
                    // Hold 0: release at once.
                    shared.holders.fetch_sub(1, Ordering::SeqCst);
                    *shared.last_release.lock().unwrap() = Some(Instant::now());
                    match g.release().await {
                        Ok(held) => assert!(held, "lost the lock while holding it"),
                        Err(e) => {
                            eprintln!("release failed: {e}");
                            log.errors += 1;
                        }
                    }
                    log.cycles += 1;
                    shared.cycles.fetch_add(1, Ordering::Relaxed);
                }
                log
            })
        })
        .collect();
    let mut logs = Vec::with_capacity(n);
    for t in tasks {
        logs.push(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    assert_eq!(
        shared.violations.load(Ordering::SeqCst),
        0,
        "two holders at once"
    );
    for (i, l) in logs.iter().enumerate() {
        assert!(l.cycles >= 1, "task {i} of {n} never acquired");
    }
    let cycles: u64 = logs.iter().map(|l| l.cycles).sum();
    let rts: u64 = logs.iter().map(|l| l.round_trips).sum();
    let mut acquire: Vec<Duration> = logs.iter().flat_map(|l| l.acquire.clone()).collect();
    let mut handover: Vec<Duration> = logs.iter().flat_map(|l| l.handover.clone()).collect();
    acquire.sort_unstable();
    handover.sort_unstable();
    Figures {
        cycles_per_s: cycles as f64 / elapsed.as_secs_f64(),
        acquire: [
            pct(&acquire, 500),
            pct(&acquire, 990),
            acquire.last().copied().unwrap_or_default(),
        ],
        handover: [pct(&handover, 500), pct(&handover, 990)],
        rt_per_acquire: rts as f64 / cycles.max(1) as f64,
        per_task_min: logs.iter().map(|l| l.cycles).min().unwrap_or(0),
        per_task_max: logs.iter().map(|l| l.cycles).max().unwrap_or(0),
        errors: logs.iter().map(|l| l.errors).sum(),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// The ways of waiting compared, by name: the queue (`fair`, the
/// default), and each retry policy without it.
fn policies() -> Vec<(&'static str, RetryPolicy, bool)> {
    let mut v = vec![("queue", RetryPolicy::default(), true)];
    v.extend(RetryPolicy::ALL.iter().map(|(n, p)| (*n, *p, false)));
    if let Ok(only) = std::env::var("LOCKBENCH_CONTENTION_POLICIES") {
        v.retain(|(name, ..)| only.split(',').any(|o| o.trim() == *name));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement (~40 s): run with --ignored --nocapture"]
async fn contention_retry_policies() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut base = RedLockConfig::new(fleet.urls());
    // A busy shared machine: as the conformance tests, do not let a slow
    // scheduler look like a dead node.
    base.node_timeout_ms = 100;
    let rounds: usize = std::env::var("LOCKBENCH_CONTENTION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    println!(
        "policy        round  N  cycles/s  acq_p50  acq_p99  acq_max  ho_p50  ho_p99  rt/acq  per-task min..max  errors"
    );
    let mut run_id = 0;
    // (policy, N) -> the figures of every round.
    let mut all: Vec<((&str, usize), Vec<Figures>)> = Vec::new();
    for round in 0..rounds {
        for (name, policy, fair) in policies() {
            let mut ratio = Vec::new();
            for n in WORKERS {
                let mut cfg = base.clone();
                cfg.retry_policy = policy;
                cfg.fair = fair;
                run_id += 1;
                let f = run(&cfg, n, &format!("contended{run_id}")).await;
                ratio.push(f.cycles_per_s);
                println!(
                    "{name:<13} {round:>5} {n:>2} {:>9.0} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7.2}  {}..{}  {}",
                    f.cycles_per_s,
                    ms(f.acquire[0]),
                    ms(f.acquire[1]),
                    ms(f.acquire[2]),
                    ms(f.handover[0]),
                    ms(f.handover[1]),
                    f.rt_per_acquire,
                    f.per_task_min,
                    f.per_task_max,
                    f.errors,
                );
                match all.iter_mut().find(|(k, _)| *k == (name, n)) {
                    Some((_, v)) => v.push(f),
                    None => all.push(((name, n), vec![f])),
                }
            }
            if let [a, b] = ratio[..] {
                println!("{name:<13} {round:>5} 16/4 = {:.0} %", 100.0 * b / a);
            }
        }
    }
    // Medians over the rounds: one run is at the mercy of whatever else
    // the machine does in those 3 s.
    println!("\nmedians over {rounds} round(s); max = the largest of all rounds");
    println!("policy         N  cycles/s  acq_p50  acq_p99  acq_max  ho_p50  ho_p99  rt/acq  16/4");
    for (name, ..) in policies() {
        let mut four = 0.0;
        for n in WORKERS {
            let Some((_, v)) = all.iter().find(|(k, _)| *k == (name, n)) else {
                continue;
            };
            let cps = median_f(v.iter().map(|f| f.cycles_per_s).collect());
            if n == WORKERS[0] {
                four = cps;
            }
            println!(
                "{name:<13} {n:>2} {cps:>9.0} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7.2}  {}",
                ms(median_d(v.iter().map(|f| f.acquire[0]).collect())),
                ms(median_d(v.iter().map(|f| f.acquire[1]).collect())),
                ms(v.iter().map(|f| f.acquire[2]).max().unwrap_or_default()),
                ms(median_d(v.iter().map(|f| f.handover[0]).collect())),
                ms(median_d(v.iter().map(|f| f.handover[1]).collect())),
                median_f(v.iter().map(|f| f.rt_per_acquire).collect()),
                if n == WORKERS[0] {
                    String::new()
                } else {
                    format!("{:.0} %", 100.0 * cps / four)
                },
            );
        }
    }
}

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn median_d(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn redis_con(url: &str) -> redis::Connection {
    let c = redis::Client::open(url).unwrap();
    c.get_connection_with_timeout(Duration::from_secs(1))
        .unwrap()
}

/// A holder that died leaves its key to expire; the acquire script's PTTL
/// reply bounds the default policy's delay, so a waiter with a huge retry
/// window still follows it at once instead of sleeping through its wait
/// budget (the original policy would sleep up to 20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_expiry_bounds_the_delay() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut cfg = RedLockConfig::new(fleet.urls());
    cfg.node_timeout_ms = 100;
    cfg.retry_delay_ms = 20_000;
    assert_eq!(cfg.retry_policy, RetryPolicy::Aging, "the default");
    let lock = RedLock::connect(cfg).await.unwrap();
    let key = lock.lock_key("dead");
    for url in fleet.urls() {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("a-holder-that-died")
            .arg("PX")
            // Not shorter: five SETs on new connections took over 300 ms
            // on a loaded machine, and the first round then won.
            .arg(2_000)
            .query(&mut redis_con(&url))
            .unwrap();
    }
    let g = lock
        .acquire("dead", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(g.round_trips() >= 2, "the key was held at first");
    assert!(g.release().await.unwrap());
}
