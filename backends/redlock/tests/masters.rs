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
            // With a 4 ms lease each master gets 10 ms: a busy machine
            // makes that "no quorum in time" rather than "too late", both
            // honest; only "someone holds it" would be a lie.
            Err(e) => assert!(
                !matches!(e, Error::Timeout { .. })
                    && (e.to_string().contains("past its validity")
                        || e.to_string().contains("quorum")),
                "{e}"
            ),
        }
    }
}

/// A majority of masters stalled (SIGSTOP) under a holder: the watchdog's
/// renewals get no answer, which is not "someone else holds it" — the lock
/// is lost when its validity runs out (it was lost at the first renewal,
/// as `NotOwner`, with most of its validity left); and a release sent into
/// the stall may still run there on waking, so its outcome is unknown, not
/// "did not happen". After the stall the key is free for others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_stall_is_no_proof_of_loss_and_a_release_into_it_is_unknown() {
    use distlock::{AcquireOptions, DistLock, Error, LostReason};
    let f = RedisFleet::independent(5).unwrap();
    let mut cfg = RedLockConfig::new(f.urls());
    cfg.watchdog_lease_ms = 1_500;
    cfg.node_timeout_ms = 100;
    let lock = RedLock::connect(cfg.clone()).await.unwrap();
    let g = lock
        .acquire("stall", AcquireOptions::try_lock())
        .await
        .unwrap();
    let lost = g.lost();
    for n in &f.nodes[..3] {
        n.pause().unwrap();
    }
    let until = g.valid_until();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("never told the lock was lost");
    let at = tokio::time::Instant::now();
    assert_ne!(
        reason,
        LostReason::NotOwner,
        "silence taken for another owner"
    );
    assert!(
        at + Duration::from_millis(600) >= until,
        "lost {:?} before its validity ended ({reason:?})",
        until.saturating_duration_since(at)
    );
    let e = g.release().await.expect_err("a release without a quorum");
    assert!(
        matches!(
            e,
            Error::Backend {
                indeterminate: true,
                ..
            }
        ),
        "a release into a stall said it did not happen: {e}"
    );
    for n in &f.nodes[..3] {
        n.resume().unwrap();
    }
    let other = RedLock::connect(cfg).await.unwrap();
    let g2 = other
        .acquire("stall", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    g2.release().await.unwrap();
}

/// Every master restarted without persistence while we held the lock: the
/// lock is gone everywhere, and a release says so ("not held"), not an
/// error. Each connection's first request after its server restarted
/// fails on the dead socket without reaching the new server; the release
/// asks such a node again on the fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_every_master_restarted_says_not_held() {
    use distlock::{AcquireOptions, DistLock};
    let f = RedisFleet::independent(5).unwrap();
    let mut cfg = RedLockConfig::new(f.urls());
    // Each node's first answer after its restart needs a new connection
    // (TCP, HELLO, the push channel's resubscription). With 100 ms, CI's
    // loaded machine once had three of five late ("no reply within
    // 100ms"): an honest "unknown", not the dead-socket error this case
    // guards against, which comes at once whatever the deadline.
    cfg.node_timeout_ms = 1_000;
    for fair in [true, false] {
        cfg.fair = fair;
        let lock = RedLock::connect(cfg.clone()).await.unwrap();
        let g = lock
            .acquire("k", AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .unwrap();
        for n in &f.nodes {
            n.restart().unwrap();
        }
        let r = g.release().await;
        assert!(matches!(r, Ok(false)), "fair = {fair}: {r:?}");
        // And the key is free to take again at once.
        let g = lock.acquire("k", AcquireOptions::try_lock()).await.unwrap();
        assert!(g.release().await.unwrap());
    }
}
