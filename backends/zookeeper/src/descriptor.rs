//! The registry entry of `zookeeper`, with its floor (create + delete of an
//! ephemeral-sequential node) and the `zookeeper-client` crate's own recipe
//! as its peer.

use std::sync::Arc;

use distlock::descriptor::{
    self as d, BuildParams, Config as _, Connected, Descriptor, Probe, Probes, Topology,
};
use distlock::{Capabilities, DistLock, Result};
use serde_json::Value;

use crate::config::ZkConfig;
use crate::lock::ZkLock;

/// `zookeeper`: Curator's InterProcessMutex recipe.
#[derive(Debug)]
pub struct ZkBackend;

/// The registry entry.
pub static ZOOKEEPER: ZkBackend = ZkBackend;

struct Floor(Arc<ZkLock>);

#[async_trait::async_trait]
impl Probe for Floor {
    async fn once(&self) -> Result<()> {
        self.0.floor_round_trip().await
    }
}

/// The `zookeeper-client` crate's own lock recipe (`Client::lock`), lock +
/// unlock, on the same session as the lock under test.
struct CrateRecipePeer {
    lock: Arc<ZkLock>,
    key: String,
}

#[async_trait::async_trait]
impl Probe for CrateRecipePeer {
    async fn once(&self) -> Result<()> {
        self.lock.crate_recipe_cycle(&self.key).await
    }
}

#[async_trait::async_trait]
impl Descriptor for ZkBackend {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn about(&self) -> &'static str {
        "ZooKeeper ephemeral-sequential recipe (Curator InterProcessMutex): pipelined create + getChildren, predecessor watch, czxid token, session-bound"
    }

    fn capabilities(&self) -> Capabilities {
        ZkLock::CAPABILITIES
    }

    fn topology(&self) -> Topology {
        Topology::Zookeeper
    }

    fn cluster_topology(&self) -> Option<Topology> {
        Some(Topology::ZookeeperEnsemble(3))
    }

    fn family(&self) -> &'static str {
        ZkConfig::FAMILY
    }

    fn env_vars(&self) -> &'static [&'static str] {
        ZkConfig::ENV_VARS
    }

    fn settings(&self, table: Option<Value>) -> Result<Value> {
        d::settings_of::<ZkConfig>(table)
    }

    fn set_endpoint(&self, settings: &mut Value, endpoint: &str) -> Result<()> {
        d::set_endpoint_of::<ZkConfig>(settings, endpoint)
    }

    fn configured_endpoint(&self, settings: &Value) -> Option<String> {
        d::configured_endpoint_of::<ZkConfig>(settings)
    }

    async fn connect(&self, settings: &Value, params: BuildParams) -> Result<Connected> {
        let cfg: ZkConfig = d::typed(ZkConfig::FAMILY, settings)?;
        let lock = Arc::new(ZkLock::connect(cfg).await?);
        let mut probes = Probes::default();
        if params.probes {
            probes.floor = Some(Box::new(Floor(lock.clone())));
            probes.peers.push((
                "zookeeper-client".into(),
                Box::new(CrateRecipePeer {
                    lock: lock.clone(),
                    // One key per worker process, apart from the lock's own.
                    key: format!("lockbench:peer:zookeeper-client:{}", std::process::id()),
                }),
            ));
        }
        Ok(Connected {
            lock: lock as Arc<dyn DistLock>,
            probes,
        })
    }

    async fn server_version(&self, settings: &Value) -> Option<String> {
        let cfg: ZkConfig = d::typed(ZkConfig::FAMILY, settings).ok()?;
        crate::config::server_version(&cfg.connect).await
    }
}
