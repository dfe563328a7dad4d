//! The etcd fleet and the lock configured for it, shared by the test files.

// Each test file is its own crate and uses its own subset of this module;
// what one of them leaves unused would otherwise warn there.
#![allow(dead_code)]

use fleet::EtcdFleet;
use lockbench_etcd::{EtcdConfig, EtcdLock};

/// A fleet started for one test and the lock configuration pointing at it.
pub struct Etcd {
    pub cfg: EtcdConfig,
    pub fleet: EtcdFleet,
}

/// A lock configuration for `fleet`'s endpoints, with a session lease of
/// `session_ttl_s`.
pub fn config(fleet: &EtcdFleet, session_ttl_s: u64) -> EtcdConfig {
    let mut cfg = EtcdConfig::new(fleet.endpoints());
    cfg.session_ttl_s = session_ttl_s;
    cfg
}

impl Etcd {
    /// A single node (`members == 1`) or a cluster of `members`.
    pub fn start(members: usize, session_ttl_s: u64) -> Self {
        let fleet = if members == 1 {
            EtcdFleet::single().unwrap()
        } else {
            EtcdFleet::cluster(members).unwrap()
        };
        Self {
            cfg: config(&fleet, session_ttl_s),
            fleet,
        }
    }

    /// A plain client for looking behind the lock's back.
    pub async fn admin(&self) -> etcd_client::Client {
        etcd_client::Client::connect(self.fleet.endpoints(), None)
            .await
            .unwrap()
    }

    /// A lock handle of its own (its own client and session).
    pub async fn lock(&self) -> EtcdLock {
        EtcdLock::connect(self.cfg.clone()).await.unwrap()
    }

    /// The queue keys under lock `key`, as the server has them, read
    /// through a fresh admin client.
    pub async fn queued(&self, lock: &EtcdLock, key: &str) -> i64 {
        queued_via(&self.admin().await, lock, key).await
    }
}

/// The queue keys under lock `key`, as the server has them, read through
/// `admin`.
pub async fn queued_via(admin: &etcd_client::Client, lock: &EtcdLock, key: &str) -> i64 {
    let (start, end) = lock.queue_range(key);
    admin
        .clone()
        .get(
            start.as_str(),
            Some(
                etcd_client::GetOptions::new()
                    .with_range(end.as_str())
                    .with_count_only(),
            ),
        )
        .await
        .unwrap()
        .count()
}
