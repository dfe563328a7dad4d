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
