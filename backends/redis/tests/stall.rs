//! Redis stalled (SIGSTOP) under a holder and a waiter: nothing of the
//! waiter's is left holding the key once the server wakes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use distlock::DistLock;
use fleet::RedisFleet;
use lockbench_redis::{RedisConfig, RedisLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_leaves_no_stuck_key() {
    let f = RedisFleet::single().unwrap();
    let mut cfg = RedisConfig::new(f.nodes[0].url());
    cfg.watchdog_lease_ms = 3_000;
    cfg.op_timeout_ms = 1_000;
    distlock::testing::a_stall_leaves_no_stuck_key(
        || async {
            Ok::<Arc<dyn DistLock>, distlock::Error>(Arc::new(
                RedisLock::connect(cfg.clone()).await?,
            ))
        },
        Duration::from_secs(3),
        |p| f.nodes[0].set_paused(p).unwrap(),
    )
    .await;
}

/// A release while the server is down fails, and is retried until it is
/// back (with its AOF: the lock survived): the key stayed held for the
/// rest of the 10 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_into_an_outage_is_retried() {
    let f = RedisFleet::single_with(fleet::Durability::Durable).unwrap();
    let mut cfg = RedisConfig::new(f.nodes[0].url());
    cfg.watchdog_lease_ms = 10_000;
    cfg.op_timeout_ms = 1_000;
    distlock::testing::a_release_into_an_outage_is_retried(
        || async {
            Ok::<Arc<dyn DistLock>, distlock::Error>(Arc::new(
                RedisLock::connect(cfg.clone()).await?,
            ))
        },
        Duration::from_secs(10),
        |down| {
            if down {
                f.nodes[0].kill().unwrap()
            } else {
                f.nodes[0].restart().unwrap()
            }
        },
    )
    .await;
}

/// A waiter through a server restart: a refused connection sent nothing,
/// so within the wait budget it is a wait, not an answer (the waiter gave
/// up 0.2 s into a 0.5 s restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_waits_through_a_restart() {
    use distlock::AcquireOptions;
    let f = Arc::new(RedisFleet::single().unwrap());
    let lock = RedisLock::connect(RedisConfig::new(f.nodes[0].url()))
        .await
        .unwrap();
    lock.acquire("warm", AcquireOptions::try_lock())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    f.nodes[0].kill().unwrap();
    let back = {
        let f = f.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            f.nodes[0].restart().unwrap();
        })
    };
    let g = lock
        .acquire("k", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .expect("the waiter gave up during the restart");
    back.join().unwrap();
    assert!(g.release().await.unwrap());
    // Without a budget, a refusal is the answer, at once.
    f.nodes[0].kill().unwrap();
    let t0 = std::time::Instant::now();
    let e = lock.acquire("k", AcquireOptions::try_lock()).await;
    assert!(e.is_err() && t0.elapsed() < Duration::from_secs(2), "{e:?}");
}

/// A waiter already waiting when the server is killed and restarted: its
/// next try meets a dropped connection (the request may have landed, so it
/// is withdrawn by its owner value) and goes on under a new one within its
/// budget, instead of failing at the first error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_waits_through_a_restart() {
    use distlock::AcquireOptions;
    let f = Arc::new(RedisFleet::single().unwrap());
    let cfg = RedisConfig::new(f.nodes[0].url());
    let a = RedisLock::connect(cfg.clone()).await.unwrap();
    let b = RedisLock::connect(cfg).await.unwrap();
    let g = a
        .acquire(
            "k",
            AcquireOptions::try_lock().with_lease(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("k", AcquireOptions::wait(Duration::from_secs(15)))
            .await
            .map(|g| g.token())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.nodes[0].kill().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.nodes[0].restart().unwrap();
    // The restart forgot A's lock (no persistence here): B takes the key.
    let r = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter hung")
        .unwrap();
    assert!(r.is_ok(), "the waiter gave up during the restart: {r:?}");
    drop(g);
}

/// Waiters through a 3 s pause of the server: one queued before it and one
/// that came during it, each with 20 s to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wait_through_a_pause() {
    let f = RedisFleet::single().unwrap();
    let mut cfg = RedisConfig::new(f.nodes[0].url());
    cfg.watchdog_lease_ms = 3_000;
    cfg.op_timeout_ms = 1_000;
    distlock::testing::waiters_wait_through_an_outage(
        || async {
            Ok::<Arc<dyn DistLock>, distlock::Error>(Arc::new(
                RedisLock::connect(cfg.clone()).await?,
            ))
        },
        |p| f.nodes[0].set_paused(p).unwrap(),
    )
    .await;
}
