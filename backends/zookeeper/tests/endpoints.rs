//! A connect string that reaches no ZooKeeper: the crate says only "no
//! available hosts"; the error says what each host did.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fleet::RedisFleet;
use lockbench_zookeeper::{ZkConfig, ZkLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_zookeeper_is_told_from_one_that_refuses() {
    let redis = RedisFleet::single().unwrap();
    let not_zk = format!("{}:{}", redis.nodes[0].addr(), redis.nodes[0].port());
    let mut cfg = ZkConfig::new(format!("{not_zk},127.0.0.1:1"));
    cfg.connect_timeout_ms = 3_000;
    let e = ZkLock::connect(cfg).await.err().unwrap().to_string();
    assert!(
        e.contains(&format!(
            "{not_zk} accepts TCP but opened no ZooKeeper session"
        )),
        "{e}"
    );
    assert!(
        e.contains("127.0.0.1:1: ") && e.to_lowercase().contains("refused"),
        "{e}"
    );
}

/// A chroot in the connect string that does not exist: ZooKeeper creates
/// none, and said only "node not exists".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chroot_is_named() {
    let f = fleet::ZkFleet::standalone().unwrap();
    let e = ZkLock::connect(ZkConfig::new(format!("{}/no-such-app", f.connect_string())))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("the chroot /no-such-app"), "{e}");
}
