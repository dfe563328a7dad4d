//! `LocalFirst` on real servers: 64 tasks of one process on one hot key,
//! with and without it. Exclusion must hold either way; the remote round
//! trips per section are what it saves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock};
use lockbench_patterns::LocalFirst;

const TASKS: u32 = 64;
const SECTIONS: u32 = 8;

#[derive(Debug, Default)]
struct Tally {
    inside: AtomicU32,
    overlaps: AtomicU32,
    sections: AtomicU32,
    round_trips: AtomicU64,
}

/// 64 tasks × 8 sections on one key; (sections/s, remote round trips per
/// section), asserting that no two tasks were ever inside at once.
async fn hammer(lock: Arc<dyn DistLock>, key: &str) -> (f64, f64) {
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (lock, tally, key) = (lock.clone(), tally.clone(), key.to_string());
        tasks.push(tokio::spawn(async move {
            for _ in 0..SECTIONS {
                let g = lock
                    .acquire(&key, AcquireOptions::wait(Duration::from_secs(60)))
                    .await
                    .unwrap();
                tally
                    .round_trips
                    .fetch_add(u64::from(g.round_trips()), Ordering::SeqCst);
                if tally.inside.fetch_add(1, Ordering::SeqCst) > 0 {
                    tally.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                tally.inside.fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap(), "the lock was ours to release");
                tally.sections.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let n = tally.sections.load(Ordering::SeqCst);
    assert_eq!(n, TASKS * SECTIONS);
    assert_eq!(tally.overlaps.load(Ordering::SeqCst), 0, "two tasks inside");
    let rt = tally.round_trips.load(Ordering::SeqCst);
    (f64::from(n) / secs, rt as f64 / f64::from(n))
}

async fn compare(name: &str) -> ((f64, f64), (f64, f64)) {
    let (_servers, lock) = common::start(name, serde_json::json!({})).await;
    let plain = hammer(lock.clone(), "hot-plain").await;
    let local = hammer(Arc::new(LocalFirst::new(lock)), "hot-local").await;
    println!(
        "{name}: {TASKS} tasks x {SECTIONS} sections on one key: plain {:.0} sections/s at {:.2} \
         remote round trips per section; LocalFirst {:.0} sections/s at {:.2}",
        plain.0, plain.1, local.0, local.1
    );
    (plain, local)
}

/// Redis waits by polling (and a pub/sub wake-up): 64 remote contenders
/// cost many tries per section, one per process costs about one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_local_first_takes_fewer_round_trips_and_still_excludes() {
    let (plain, local) = compare("redis").await;
    assert!(
        local.1 < plain.1,
        "LocalFirst {:.2} round trips per section, plain {:.2}",
        local.1,
        plain.1
    );
    // Alone on the server, each section is one uncontended acquire.
    assert!(local.1 < 2.0, "{:.2}", local.1);
}

/// etcd and ZooKeeper queue on the server instead of polling, so there
/// is less to save; exclusion is what must not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_local_first_still_excludes() {
    let (plain, local) = compare("etcd").await;
    assert!(local.1 <= plain.1, "{local:?} vs {plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_local_first_still_excludes() {
    let (plain, local) = compare("zookeeper").await;
    assert!(local.1 <= plain.1, "{local:?} vs {plain:?}");
}

/// Two handles in one process stand for two processes: `LocalFirst` in
/// each must not weaken the exclusion between them, and a try-lock that
/// finds the key queued locally fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_local_first_handles_still_exclude_each_other() {
    let (servers, a) = common::start("redis", serde_json::json!({})).await;
    let b = common::connect("redis", &servers, serde_json::json!({})).await;
    let a: Arc<dyn DistLock> = Arc::new(LocalFirst::new(a));
    let b: Arc<dyn DistLock> = Arc::new(LocalFirst::new(b));
    let held = a
        .acquire("k2", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    let other = b.acquire("k2", AcquireOptions::try_lock()).await;
    assert!(other.is_err(), "the other process's LocalFirst got in");
    let t = Instant::now();
    let same = a.acquire("k2", AcquireOptions::try_lock()).await;
    assert!(same.is_err(), "a local try-lock on a held key got in");
    assert!(t.elapsed() < Duration::from_secs(1));
    // The local permit goes only after the remote release was answered:
    // the next local waiter's remote acquire then succeeds at once.
    let next = {
        let a = a.clone();
        tokio::spawn(async move {
            a.acquire("k2", AcquireOptions::wait(Duration::from_secs(5)))
                .await
                .map(|g| g.round_trips())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(held.release().await.unwrap());
    assert_eq!(next.await.unwrap().unwrap(), 1, "it had to retry remotely");
    // A cancelled local wait leaves nothing queued.
    let g = a
        .acquire("k3", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        a.acquire("k3", AcquireOptions::wait(Duration::from_secs(5))),
    )
    .await;
    assert!(cancelled.is_err());
    drop(g);
    let again = a
        .acquire("k3", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(again.release().await.unwrap());
}
