//! The registry entry of `redlock`, with its floor and its two references
//! (one master alone, and the `rslock` crate on the same masters).

use std::sync::Arc;
use std::time::Duration;

use distlock::descriptor::{
    self as d, BuildParams, Config as _, Connected, Descriptor, LockCycle, Probe, Probes, Topology,
};
use distlock::{Capabilities, DistLock, Result};
use lockbench_redis::{RedisConfig, RedisLock};
use serde_json::Value;

use crate::config::RedLockConfig;
use crate::lock::RedLock;

/// `redlock`: RedLock over 5 independent masters.
#[derive(Debug)]
pub struct RedLockBackend;

/// The registry entry.
pub static REDLOCK: RedLockBackend = RedLockBackend;

/// Two rounds of PING to every master, each over at a quorum.
struct Floor(Arc<RedLock>);

#[async_trait::async_trait]
impl Probe for Floor {
    async fn once(&self) -> Result<()> {
        self.0.floor_round_trip().await
    }
}

/// The `rslock` crate's RedLock, lock + unlock, on the same masters.
struct RslockPeer {
    mgr: rslock::LockManager,
    key: String,
    lease: Duration,
}

#[async_trait::async_trait]
impl Probe for RslockPeer {
    async fn once(&self) -> Result<()> {
        let l = self
            .mgr
            .lock(self.key.as_bytes(), self.lease)
            .await
            .map_err(|e| distlock::Error::backend("rslock", "lock", e.to_string()))?;
        self.mgr.unlock(&l).await;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Descriptor for RedLockBackend {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn about(&self) -> &'static str {
        "RedLock over 5 independent Redis masters: parallel acquire, quorum 3, validity = lease - elapsed - drift; no safe token"
    }

    fn capabilities(&self) -> Capabilities {
        RedLock::CAPABILITIES
    }

    fn topology(&self) -> Topology {
        Topology::RedisIndependent(5)
    }

    fn family(&self) -> &'static str {
        RedLockConfig::FAMILY
    }

    fn env_vars(&self) -> &'static [&'static str] {
        RedLockConfig::ENV_VARS
    }

    fn settings(&self, table: Option<Value>) -> Result<Value> {
        d::settings_of::<RedLockConfig>(table)
    }

    fn set_endpoint(&self, settings: &mut Value, endpoint: &str) -> Result<()> {
        d::set_endpoint_of::<RedLockConfig>(settings, endpoint)
    }

    fn configured_endpoint(&self, settings: &Value) -> Option<String> {
        d::configured_endpoint_of::<RedLockConfig>(settings)
    }

    async fn connect(&self, settings: &Value, params: BuildParams) -> Result<Connected> {
        let cfg: RedLockConfig = d::typed(RedLockConfig::FAMILY, settings)?;
        let lock = Arc::new(RedLock::connect(cfg.clone()).await?);
        let mut probes = Probes::default();
        if params.probes {
            probes.floor = Some(Box::new(Floor(lock.clone())));
            // The same algorithm's two references, in the same run: one node
            // of the set alone, and the rslock crate on all of them.
            let first = cfg.urls.first().cloned().unwrap_or_default();
            let single = RedisLock::connect(RedisConfig {
                wait_replicas: 0,
                ..RedisConfig::new(first)
            })
            .await?;
            probes.peers.push((
                "redis".into(),
                Box::new(LockCycle {
                    lock: Arc::new(single),
                    key: "lockbench:peer:redis".into(),
                }),
            ));
            // Clients of ours, so its connections have TCP_NODELAY too.
            let clients = cfg
                .urls
                .iter()
                .map(|u| {
                    lockbench_redis::node::client(u.as_str()).map_err(|e| {
                        distlock::Error::config(
                            "redlock.urls",
                            format!("{}: {e}", lockbench_redis::redact(u)),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let mut mgr = rslock::LockManager::from_clients(clients);
            mgr.set_retry(1, Duration::from_millis(1));
            probes.peers.push((
                "rslock".into(),
                Box::new(RslockPeer {
                    mgr,
                    // One key per worker process, apart from the lock's own.
                    key: format!("lockbench:peer:rslock:{}", std::process::id()),
                    lease: Duration::from_millis(cfg.watchdog_lease_ms),
                }),
            ));
        }
        Ok(Connected {
            lock: lock as Arc<dyn DistLock>,
            probes,
        })
    }

    async fn server_version(&self, settings: &Value) -> Option<String> {
        let cfg: RedLockConfig = d::typed(RedLockConfig::FAMILY, settings).ok()?;
        lockbench_redis::server_version(cfg.urls.first()?).await
    }
}
