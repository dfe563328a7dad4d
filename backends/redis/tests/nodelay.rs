//! `TCP_NODELAY` on every connection the Redis locks open (the lock's, its
//! floor's, its peer's, the Sentinel watcher's, the cluster client's): the
//! `redis` crate leaves Nagle's algorithm on unless told. Each test looks
//! at this process's sockets connected to its own fleet.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::net::SocketAddr;
use std::time::Duration;

use distlock::descriptor::{BuildParams, Connected, Descriptor};
use distlock::AcquireOptions;
use fleet::{RedisClusterFleet, RedisFleet, SentinelFleet};

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

fn addrs(host_ports: impl IntoIterator<Item = String>) -> Vec<SocketAddr> {
    host_ports
        .into_iter()
        .flat_map(|h| lockbench_nodelay::endpoints(&h))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_lock_floor_and_plain_peer() {
    let f = RedisFleet::single().unwrap();
    let c = exercise(&lockbench_redis::REDIS, &f.nodes[0].url()).await;
    // The lock's connection (the floor's too) and the plain peer's.
    assert_nodelay(&addrs([f.nodes[0].host_port()]), 2).await;
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_and_switch_watcher() {
    let f = SentinelFleet::start().unwrap();
    let hosts: Vec<String> = f.sentinels.iter().map(|s| s.host_port()).collect();
    let url = format!(
        "redis+sentinel://{}/{}",
        hosts.join(","),
        fleet::SENTINEL_MASTER_NAME
    );
    let c = exercise(&lockbench_redis::REDIS_WAIT, &url).await;
    // The primary's connection and the +switch-master watcher's.
    assert_nodelay(&addrs([f.primary.host_port()]), 1).await;
    assert_nodelay(&addrs(hosts), 1).await;
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_client() {
    let f = RedisClusterFleet::start(3, 0).unwrap();
    let c = exercise(&lockbench_redis::REDIS_CLUSTER, &f.endpoint()).await;
    let nodes = addrs(f.nodes().iter().map(|n| n.host_port()));
    assert_nodelay(&nodes, 1).await;
    drop(c);
}
