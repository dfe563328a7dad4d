//! A ZooKeeper holder that loses the server: paused (SIGSTOP) or cut off
//! by a partition (a black-holing proxy). lost() fires at valid_until,
//! ahead of the server's own expiry, and the delays are measured.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use distlock::{AcquireOptions, DistLock};
use lockbench_zookeeper::ZkLock;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use zookeeper_client as zk;

mod common;
use common::*;

/// A raw session of the `zookeeper-client` crate next to the lock's own:
/// it shows when the crate itself declares the session expired (its
/// client-side 1.4 x the session timeout after it last heard from the
/// server), which is when lost() used to fire.
async fn reference_session(connect: &str, session: Duration) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(session)
        .connect(connect)
        .await
        .unwrap()
}

/// When `client`'s session ends, as the crate sees it.
fn session_end(client: &zk::Client) -> tokio::task::JoinHandle<Instant> {
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            if states.changed().await.is_terminated() {
                return Instant::now();
            }
        }
    })
}

/// The server stops answering (SIGSTOP) for longer than the session
/// timeout: lost() fires at valid_until (no later than the last contact +
/// the session timeout), not when the crate gives the session up (1.4 x);
/// the handle opens a new session afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_lost_fires_at_valid_until() {
    let s = Zk::standalone();
    let session = Duration::from_millis(s.cfg.session_timeout_ms);
    let a = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let reference = reference_session(&s.fleet.connect_string(), session).await;
    let g = a.acquire("exp", AcquireOptions::try_lock()).await.unwrap();
    tokio::time::sleep(session).await;
    assert!(!g.is_lost());
    assert!(g.valid_until() > Instant::now(), "vouched while connected");
    let crate_expiry = session_end(&reference);
    let paused = Instant::now();
    s.fleet.nodes[0].pause().unwrap();
    let lost = tokio::time::timeout(session * 5, g.lost()).await;
    let lost_at = Instant::now();
    let vouched = g.valid_until();
    // Keep the server stopped until the crate has given the session up
    // too (so the release below is deterministic), then let it go.
    let crate_expired = tokio::time::timeout(session * 5, crate_expiry).await;
    s.fleet.nodes[0].resume().unwrap();
    let reason = lost.expect("lost() did not fire while the server was stopped");
    let crate_expired = crate_expired
        .expect("the crate never declared the session expired")
        .unwrap();
    println!(
        "ZK-PAUSE session={}ms: paused->lost() {}ms ({reason}), paused->valid_until {}ms, \
         paused->crate declares expiry {}ms (lost() before: {}ms earlier)",
        ms(session),
        ms(lost_at - paused),
        ms(vouched.saturating_duration_since(paused)),
        ms(crate_expired - paused),
        ms(crate_expired.saturating_duration_since(lost_at)),
    );
    assert!(
        vouched <= paused + session,
        "valid_until {:?} past the last contact + session timeout",
        vouched - paused
    );
    assert!(vouched <= lost_at);
    assert!(
        lost_at <= paused + session + Duration::from_millis(250),
        "lost() fired {:?} after the server stopped, later than the session timeout",
        lost_at - paused
    );
    assert!(
        lost_at < crate_expired,
        "lost() waited for the crate's expiry"
    );
    assert!(!g.release().await.unwrap(), "an expired lock was not ours");
    // A new session, and the lock is free again.
    let g2 = a
        .acquire("exp", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(g2.release().await.unwrap());
}

/// The measurement of the issue: a holder cut off from a server that keeps
/// running (a partition, not a stopped server), so the server really
/// expires the session and hands the lock to the next waiter. lost() must
/// fire before the server expires the session, valid_until must be no
/// later than the next holder's acquisition, and the figures are printed:
/// cut -> lost(), cut -> server-side expiry (the holder's node deleted,
/// seen by a watch), cut -> next holder, cut -> the crate's own expiry
/// (when lost() used to fire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_lost_fires_before_the_server_expires_it() {
    const RUNS: usize = 3;
    let s = Zk::standalone();
    let session = Duration::from_millis(s.cfg.session_timeout_ms);
    let proxy = Proxy::start(s.fleet.connect_string()).await;
    let mut via_proxy = s.cfg.clone();
    via_proxy.connect = proxy.addr.clone();
    let admin = admin(&s.fleet.connect_string()).await;
    let holder = ZkLock::connect(via_proxy.clone()).await.unwrap();
    let mut margins = Vec::new();
    for run in 0..RUNS {
        let key = format!("cut-{run}");
        let reference = reference_session(&proxy.addr, session).await;
        let g = holder
            .acquire(&key, AcquireOptions::try_lock())
            .await
            .unwrap();
        let dir = holder.lock_dir(&key);
        let kids = admin.list_children(&dir).await.unwrap();
        assert_eq!(kids.len(), 1);
        let node = format!("{dir}/{}", kids[0]);
        let (stat, watcher) = admin.check_and_watch_stat(&node).await.unwrap();
        assert!(stat.is_some());
        let deleted = tokio::spawn(async move {
            let ev = watcher.changed().await;
            (Instant::now(), ev.event_type)
        });
        let next = Arc::new(ZkLock::connect(s.cfg.clone()).await.unwrap());
        let (n, k) = (next.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let g = n
                .acquire(&k, AcquireOptions::wait(Duration::from_secs(30)))
                .await
                .unwrap();
            (Instant::now(), g)
        });
        // Contact goes on for a while: valid_until follows it.
        tokio::time::sleep(session).await;
        assert!(!g.is_lost());
        assert!(g.valid_until() > Instant::now());
        let crate_expiry = session_end(&reference);
        let cut = Instant::now();
        proxy.cut();
        let reason = tokio::time::timeout(session * 5, g.lost())
            .await
            .expect("lost() never fired while cut off");
        let lost_at = Instant::now();
        let vouched = g.valid_until();
        let (expired_at, event) = tokio::time::timeout(session * 5, deleted)
            .await
            .expect("the server never expired the cut-off session")
            .unwrap();
        assert_eq!(event, zk::EventType::NodeDeleted);
        let (acquired_at, g2) = tokio::time::timeout(session * 5, waiter)
            .await
            .expect("the next waiter never got the lock")
            .unwrap();
        let crate_expired = tokio::time::timeout(session * 5, crate_expiry)
            .await
            .expect("the crate never declared the session expired")
            .unwrap();
        proxy.heal();
        println!(
            "ZK-CUT run {run} session={}ms: cut->lost() {}ms ({reason}), cut->valid_until {}ms, \
             cut->server expiry {}ms, cut->next holder {}ms, cut->crate declares expiry {}ms; \
             lost() {}ms before the server expiry (old way: {}ms after it)",
            ms(session),
            ms(lost_at - cut),
            ms(vouched.saturating_duration_since(cut)),
            ms(expired_at - cut),
            ms(acquired_at - cut),
            ms(crate_expired - cut),
            ms(expired_at.saturating_duration_since(lost_at)),
            ms(crate_expired.saturating_duration_since(expired_at)),
        );
        // valid_until is the hard bound (below); lost() is a timer on it,
        // and a loaded machine may run that timer a little late (250 ms,
        // as the pause case: the old way, the crate's own expiry, came
        // ~500-960 ms after the server's).
        assert!(
            lost_at <= expired_at + Duration::from_millis(250),
            "lost() fired {:?} after the server expired the session",
            lost_at - expired_at
        );
        assert!(
            vouched <= acquired_at,
            "valid_until was {:?} after the next holder got the lock",
            vouched - acquired_at
        );
        assert!(vouched <= expired_at);
        assert!(g2.token() > g.token());
        margins.push(expired_at - lost_at);
        // The old holder's release finds its session gone: not ours.
        assert!(!g.release().await.unwrap(), "a lock taken over was ours");
        assert!(g2.release().await.unwrap());
    }
    println!(
        "ZK-CUT lost() before server expiry over {RUNS} runs: {:?} ms",
        margins.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
    // The handle recovers: a new session once the cut has healed.
    holder
        .acquire("cut-after", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
