//! The masters a user names must be independent servers: one server under
//! two names (a hostname and its address, a port forward) votes twice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use fleet::RedisFleet;
use lockbench_redlock::{RedLock, RedLockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_names_is_refused_naming_both() {
    let f = RedisFleet::independent(3).unwrap();
    // A second way to the first master: a forwarder on another address.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let alias = format!("redis://{}", listener.local_addr().unwrap());
    let target = format!("{}:{}", f.nodes[0].addr(), f.nodes[0].port());
    fleet::forward(listener, target.parse().unwrap());
    let urls = f.urls();
    let t0 = Instant::now();
    let e = RedLock::connect(RedLockConfig::new(vec![
        urls[0].clone(),
        urls[1].clone(),
        alias.clone(),
    ]))
    .await
    .expect_err("one server counted as two masters");
    let msg = e.to_string();
    assert!(
        msg.contains("redlock.urls") && msg.contains(&urls[0]) && msg.contains(&alias),
        "{msg}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Three distinct servers are fine.
    RedLock::connect(RedLockConfig::new(urls)).await.unwrap();
}

/// A fixed lease shorter than the spec's clock-drift allowance has no
/// validity: every round would be "lost" on a free key, and the caller was
/// told the key was held. It is refused, naming the least lease; and a
/// short lease that is allowed either holds or says the masters were too
/// slow for it, never that someone else holds the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_validity_is_refused_and_a_late_quorum_is_named() {
    use distlock::{AcquireOptions, DistLock, Error};
    let f = RedisFleet::independent(3).unwrap();
    let lock = RedLock::connect(RedLockConfig::new(f.urls()))
        .await
        .unwrap();
    for ms in [1, 2, 3] {
        let e = lock
            .acquire(
                "short",
                AcquireOptions::try_lock().with_lease(Duration::from_millis(ms)),
            )
            .await
            .expect_err("a lease with no validity was taken");
        assert!(
            matches!(e, Error::Unsupported { .. }) && e.to_string().contains("at least 4ms"),
            "{ms} ms: {e}"
        );
    }
    for _ in 0..20 {
        match lock
            .acquire(
                "short",
                AcquireOptions::try_lock().with_lease(Duration::from_millis(4)),
            )
            .await
        {
            Ok(g) => {
                let _ = g.release().await;
            }
            Err(e) => assert!(e.to_string().contains("past its validity"), "{e}"),
        }
    }
}
