//! A `Guard::release()` cancelled on its way (a timeout around it, an
//! aborted task) still releases: the guard is done and nobody renews, and
//! the request was dropped unsent, so the key stayed held for its whole
//! 30 s lease while every other client timed out (found by a probe: 19 and
//! 20 of 20 tries, with the queue off and on).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use distlock::{AcquireOptions, DistLock};
use fleet::RedisFleet;
use lockbench_redlock::{RedLock, RedLockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_still_releases() {
    let fleet = RedisFleet::independent(5).unwrap();
    for fair in [true, false] {
        let mut cfg = RedLockConfig::new(fleet.urls());
        // A loaded machine's stall is not a dead node (see conformance.rs).
        cfg.node_timeout_ms = 1_000;
        cfg.fair = fair;
        let (a, b) = (
            RedLock::connect(cfg.clone()).await.unwrap(),
            RedLock::connect(cfg).await.unwrap(),
        );
        for i in 0..5 {
            let g = a
                .acquire("k", AcquireOptions::wait(Duration::from_secs(5)))
                .await
                .unwrap();
            // One poll sends nothing that will be answered for us; then the
            // caller gives up on it.
            let mut release = Box::pin(g.release());
            let _ = futures::poll!(release.as_mut());
            drop(release);
            let other = b
                .acquire("k", AcquireOptions::wait(Duration::from_secs(5)))
                .await;
            let other = other.unwrap_or_else(|e| {
                panic!("fair = {fair}, try {i}: the key stayed held after a cancelled release: {e}")
            });
            assert!(other.release().await.unwrap());
        }
    }
}
