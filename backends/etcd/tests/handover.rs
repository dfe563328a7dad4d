//! Hand-over latency under contention on one key (issue #19): N tasks,
//! each with an `EtcdLock` of its own (its own client connection and
//! session, as separate worker processes have), take and release one key
//! in a loop for a bounded time against a real etcd.
//!
//! It asserts what must hold on any machine (never two holders at once,
//! tokens increasing in hold order, every task served, every release
//! still ours, an empty queue at the end) and prints the hand-over
//! latency percentiles and round trips per acquire; timing ratios are
//! printed, not asserted (shared machines are noisy).
//!
//! `cargo test -p lockbench-etcd --test handover -- --nocapture`

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock};
use lockbench_etcd::{EtcdConfig, EtcdLock};
use tokio::time::Instant;

mod common;
use common::*;

/// How long each round contends, and at most how many holds per task.
const RUN: Duration = Duration::from_secs(3);
const MAX_HOLDS_PER_TASK: usize = 5_000;

/// One successful hold, as its task saw it.
#[derive(Debug, Clone, Copy)]
struct Hold {
    worker: usize,
    /// Acquire invoked / completed, release invoked / completed.
    invoked: Instant,
    acquired: Instant,
    releasing: Instant,
    released: Instant,
    token: u64,
    round_trips: u32,
}

/// The `per_mille`-th permille of `sorted` (nearest rank).
fn percentile<T: Copy + Default>(sorted: &[T], per_mille: usize) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let i = (per_mille * sorted.len())
        .div_ceil(1000)
        .clamp(1, sorted.len())
        - 1;
    sorted[i]
}

async fn contend(cfg: &EtcdConfig, admin: &etcd_client::Client, workers: usize) {
    let key = format!("handover-{workers}");
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut locks = Vec::new();
    for _ in 0..workers {
        locks.push(EtcdLock::connect(cfg.clone()).await.unwrap());
    }
    let stop_at = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for (worker, lock) in locks.into_iter().enumerate() {
        let (inside, peak, key) = (inside.clone(), peak.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut holds = Vec::new();
            while Instant::now() < stop_at && holds.len() < MAX_HOLDS_PER_TASK {
                let invoked = Instant::now();
                let g = lock
                    .acquire(&key, AcquireOptions::wait(Duration::from_secs(10)))
                    .await
                    .unwrap();
                let acquired = Instant::now();
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let (token, round_trips) = (g.token().unwrap().0, g.round_trips());
                let releasing = Instant::now();
                assert!(g.release().await.unwrap(), "a release found the lock gone");
                holds.push(Hold {
                    worker,
                    invoked,
                    acquired,
                    releasing,
                    released: Instant::now(),
                    token,
                    round_trips,
                });
            }
            holds
        }));
    }
    let mut holds = Vec::new();
    for (worker, t) in tasks.into_iter().enumerate() {
        let h = t.await.unwrap();
        assert!(!h.is_empty(), "worker {worker} of {workers} never acquired");
        holds.extend(h);
    }
    assert_eq!(peak.load(Ordering::SeqCst), 1, "two holders inside at once");
    holds.sort_by_key(|h| h.acquired);
    // Milliseconds, signed: with a watch the next holder can complete
    // before the releaser has its own reply.
    let ms = |later: Instant, earlier: Instant| {
        if later >= earlier {
            (later - earlier).as_secs_f64() * 1e3
        } else {
            -(earlier - later).as_secs_f64() * 1e3
        }
    };
    let mut handover = Vec::new();
    let mut from_invoke = Vec::new();
    for w in holds.windows(2) {
        let (prev, next) = (w[0], w[1]);
        assert!(
            next.acquired >= prev.releasing,
            "holds overlap: {prev:?} then {next:?}"
        );
        assert!(
            next.token > prev.token,
            "tokens not increasing: {prev:?} then {next:?}"
        );
        // A hand-over proper: another worker, already waiting when the
        // release began (otherwise the gap is the lock lying idle).
        if next.worker != prev.worker && next.invoked < prev.releasing {
            handover.push(ms(next.acquired, prev.released));
            from_invoke.push(ms(next.acquired, prev.releasing));
        }
    }
    handover.sort_by(f64::total_cmp);
    from_invoke.sort_by(f64::total_cmp);
    let rts: u64 = holds.iter().map(|h| u64::from(h.round_trips)).sum();
    let max_rt = holds.iter().map(|h| h.round_trips).max().unwrap_or(0);
    let (p50, p99) = (percentile(&from_invoke, 500), percentile(&from_invoke, 990));
    println!(
        "etcd hand-over, {workers} workers on one key, {RUN:?}: {} holds, {} hand-overs; \
         release invoked -> next acquire done p50 {p50:.2} ms p99 {p99:.2} ms (p99/p50 {:.1}), \
         max {:.2} ms; release done -> next acquire done p50 {:.2} ms p99 {:.2} ms; \
         round trips per acquire mean {:.2} max {max_rt}",
        holds.len(),
        handover.len(),
        p99 / p50,
        from_invoke.last().copied().unwrap_or_default(),
        percentile(&handover, 500),
        percentile(&handover, 990),
        rts as f64 / holds.len() as f64,
    );
    assert!(
        handover.len() * 2 >= holds.len(),
        "most steps should be hand-overs under contention: {} of {}",
        handover.len(),
        holds.len()
    );
    // Nothing left behind in the queue.
    let lock = EtcdLock::connect(cfg.clone()).await.unwrap();
    let left = queued_via(admin, &lock, &key).await;
    assert_eq!(left, 0, "queue keys left behind");
}

/// The uncontended path for comparison: one handle, acquire + release in
/// a loop; one round trip per acquire, whatever ran on the key before.
async fn uncontended(cfg: &EtcdConfig) {
    let lock = EtcdLock::connect(cfg.clone()).await.unwrap();
    let mut cycles = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let g = lock
            .acquire("uncontended", AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .unwrap();
        assert_eq!(
            g.round_trips(),
            1,
            "an uncontended acquire took more than one round trip"
        );
        assert!(g.release().await.unwrap());
        cycles.push(t.elapsed());
    }
    cycles.sort();
    println!(
        "etcd uncontended acquire+release, 300 cycles: p50 {:?} p99 {:?}",
        percentile(&cycles, 500),
        percentile(&cycles, 990)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_latency_under_contention_on_one_key() {
    let s = Etcd::start(1, 5);
    let admin = s.admin().await;
    uncontended(&s.cfg).await;
    for workers in [4, 16] {
        contend(&s.cfg, &admin, workers).await;
    }
    uncontended(&s.cfg).await;
}
