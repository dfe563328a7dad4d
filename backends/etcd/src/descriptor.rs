//! The registry entry of `etcd`, with its floor (put + delete) and etcd's
//! own Lock RPC as its peer.

use std::sync::Arc;

use distlock::descriptor::{
    self as d, BuildParams, Config as _, Connected, Descriptor, Probe, Probes, Topology,
};
use distlock::{Capabilities, DistLock, Result};
use serde_json::Value;

use crate::config::EtcdConfig;
use crate::lock::EtcdLock;
use crate::rpc::LockRpc;

/// `etcd`: the concurrency.Mutex recipe.
#[derive(Debug)]
pub struct EtcdBackend;

/// The registry entry.
pub static ETCD: EtcdBackend = EtcdBackend;

struct Floor(Arc<EtcdLock>);

#[async_trait::async_trait]
impl Probe for Floor {
    async fn once(&self) -> Result<()> {
        self.0.floor_round_trip().await
    }
}

/// etcd's own Lock RPC (lock + unlock through `etcd-client`).
struct LockRpcPeer(LockRpc);

#[async_trait::async_trait]
impl Probe for LockRpcPeer {
    async fn once(&self) -> Result<()> {
        self.0.cycle().await
    }
}

#[async_trait::async_trait]
impl Descriptor for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn about(&self) -> &'static str {
        "etcd concurrency.Mutex recipe: keepalived session lease, one-Txn acquire, watch the key ahead, create-revision token"
    }

    fn capabilities(&self) -> Capabilities {
        EtcdLock::CAPABILITIES
    }

    fn topology(&self) -> Topology {
        Topology::Etcd
    }

    fn cluster_topology(&self) -> Option<Topology> {
        Some(Topology::EtcdCluster(3))
    }

    fn family(&self) -> &'static str {
        EtcdConfig::FAMILY
    }

    fn env_vars(&self) -> &'static [&'static str] {
        EtcdConfig::ENV_VARS
    }

    fn settings(&self, table: Option<Value>) -> Result<Value> {
        d::settings_of::<EtcdConfig>(table)
    }

    fn set_endpoint(&self, settings: &mut Value, endpoint: &str) -> Result<()> {
        d::set_endpoint_of::<EtcdConfig>(settings, endpoint)
    }

    fn configured_endpoint(&self, settings: &Value) -> Option<String> {
        d::configured_endpoint_of::<EtcdConfig>(settings)
    }

    async fn connect(&self, settings: &Value, params: BuildParams) -> Result<Connected> {
        let cfg: EtcdConfig = d::typed(EtcdConfig::FAMILY, settings)?;
        let lock = Arc::new(EtcdLock::connect(cfg.clone()).await?);
        let mut probes = Probes::default();
        if params.probes {
            probes.floor = Some(Box::new(Floor(lock.clone())));
            // One lock name per worker process, apart from ours.
            let name = format!("peer-{}", std::process::id());
            probes.peers.push((
                "etcd-lock-rpc".into(),
                Box::new(LockRpcPeer(LockRpc::connect(&cfg, &name).await?)),
            ));
        }
        Ok(Connected {
            lock: lock as Arc<dyn DistLock>,
            probes,
        })
    }

    async fn server_version(&self, settings: &Value) -> Option<String> {
        let cfg: EtcdConfig = d::typed(EtcdConfig::FAMILY, settings).ok()?;
        crate::server_version(&cfg).await
    }
}
