//! `TCP_NODELAY` on every connection RedLock opens, and its two
//! references: its own client per master, the single-node `redis` peer's
//! and `rslock`'s (built on clients of ours). The `redis` crate leaves
//! Nagle's algorithm on unless told.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::net::SocketAddr;
use std::time::Duration;

use distlock::descriptor::{BuildParams, Connected, Descriptor};
use distlock::AcquireOptions;
use fleet::RedisFleet;

/// Connects `b` to `endpoint` with its probes, and runs one waiting cycle,
/// one floor and every peer, so each connection it has is in use.
async fn exercise(b: &dyn Descriptor, endpoint: &str) -> Connected {
    let mut settings = b.settings(None).unwrap();
    b.set_endpoint(&mut settings, endpoint).unwrap();
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: true,
        key: "nodelay".into(),
    };
    let c = b.connect(&settings, params).await.unwrap();
    let g = c
        .lock
        .acquire("nodelay", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    g.release().await.unwrap();
    if let Some(f) = &c.probes.floor {
        f.once().await.unwrap();
    }
    for (_, p) in &c.probes.peers {
        p.once().await.unwrap();
    }
    c
}

/// At least `at_least` sockets to `peers`, all with `TCP_NODELAY`, within
/// 2 s (a background connection may still be opening).
async fn assert_nodelay(peers: &[SocketAddr], at_least: usize) {
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        match lockbench_nodelay::check_sockets_to(peers, at_least) {
            Ok(_) => return,
            Err(e) if tokio::time::Instant::now() >= until => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_floor_and_peers() {
    let f = RedisFleet::independent(5).unwrap();
    let c = exercise(&lockbench_redlock::REDLOCK, &f.urls().join(",")).await;
    let masters: Vec<SocketAddr> = f
        .nodes
        .iter()
        .flat_map(|n| lockbench_nodelay::endpoints(&n.host_port()))
        .collect();
    // 5 of the lock's (the floor's too), 5 of rslock's, 1 of the redis peer.
    assert_nodelay(&masters, 11).await;
    drop(c);
}
