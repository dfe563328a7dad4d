//! Waiters through a stalled ZooKeeper: a standalone server paused
//! (SIGSTOP), and an ensemble's leader paused while the others elect a new
//! one. A newcomer gave up 2.7-3.1 s into a leader pause with 20 s to wait
//! ("waiting for the connection: still disconnected").

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;

use distlock::DistLock;
use fleet::ZkFleet;
use lockbench_zookeeper::ZkLock;

mod common;
use common::cfg_for;

async fn through_a_pause(fleet: &ZkFleet, session_ms: u64, node: usize) {
    let mut cfg = cfg_for(fleet, session_ms);
    cfg.op_timeout_ms = 1_000;
    let connect = || async {
        Ok::<Arc<dyn DistLock>, distlock::Error>(Arc::new(ZkLock::connect(cfg.clone()).await?))
    };
    distlock::testing::waiters_wait_through_an_outage(connect, |p| {
        fleet.nodes[node].set_paused(p).unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wait_through_a_paused_server() {
    let f = ZkFleet::standalone().unwrap();
    // Longer than the pause: the sessions live through it.
    through_a_pause(&f, 8_000, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wait_through_a_paused_leader() {
    let f = ZkFleet::ensemble(3).unwrap();
    let leader = f.leader().unwrap();
    through_a_pause(&f, 4_000, leader).await;
}
