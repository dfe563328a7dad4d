//! RedLock waiters through a 3 s pause of a majority of its masters.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;

use distlock::DistLock;
use fleet::RedisFleet;
use lockbench_redlock::{RedLock, RedLockConfig};

/// One waiter queued before the pause and one that came during it, each
/// with 20 s to wait: no quorum for 3 s is a wait, not an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wait_through_a_paused_majority() {
    let f = RedisFleet::independent(5).unwrap();
    let mut cfg = RedLockConfig::new(f.urls());
    cfg.watchdog_lease_ms = 3_000;
    distlock::testing::waiters_wait_through_an_outage(
        || async {
            Ok::<Arc<dyn DistLock>, distlock::Error>(Arc::new(RedLock::connect(cfg.clone()).await?))
        },
        |p| {
            for n in &f.nodes[..3] {
                n.set_paused(p).unwrap();
            }
        },
    )
    .await;
}
