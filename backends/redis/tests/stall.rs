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
    let mut clients: Vec<Arc<dyn DistLock>> = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(RedisLock::connect(cfg.clone()).await.unwrap()));
    }
    let clients: [Arc<dyn DistLock>; 3] = clients.try_into().unwrap();
    distlock::testing::a_stall_leaves_no_stuck_key(clients, Duration::from_secs(3), |p| {
        if p {
            f.nodes[0].pause().unwrap();
        } else {
            f.nodes[0].resume().unwrap();
        }
    })
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
