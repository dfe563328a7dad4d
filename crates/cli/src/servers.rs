//! The servers a backend's topology needs, started by lockbench itself
//! (or an external endpoint), kept alive until dropped.

use crate::registry::{BackendConfig, Topology};

/// Keeps the servers of a run alive until dropped; dropping stops them.
#[derive(Debug)]
pub enum Servers {
    /// The user's own endpoint: nothing started.
    External,
    /// One or N independent Redis nodes.
    Redis(fleet::RedisFleet),
    /// Redis primary + replica + 3 sentinels.
    Sentinel(Box<fleet::SentinelFleet>),
    /// One PostgreSQL.
    Postgres(Box<fleet::PostgresFleet>),
    /// ZooKeeper standalone.
    Zookeeper(Box<fleet::ZkFleet>),
    /// One etcd node.
    Etcd(Box<fleet::EtcdFleet>),
}

impl Servers {
    /// Starts the fleet for `topology` (blocking: call it off the async
    /// runtime's worker threads).
    ///
    /// # Errors
    /// A missing server binary (naming its package) or a server that does
    /// not become ready.
    pub fn start(topology: Topology) -> fleet::Result<Self> {
        Ok(match topology {
            Topology::RedisSingle => Servers::Redis(fleet::RedisFleet::single()?),
            Topology::RedisIndependent(n) => Servers::Redis(fleet::RedisFleet::independent(n)?),
            Topology::Postgres => Servers::Postgres(Box::new(fleet::PostgresFleet::start()?)),
            Topology::Zookeeper => Servers::Zookeeper(Box::new(fleet::ZkFleet::standalone()?)),
            Topology::Etcd => Servers::Etcd(Box::new(fleet::EtcdFleet::single()?)),
            Topology::RedisPrimaryReplica => {
                Servers::Sentinel(Box::new(fleet::SentinelFleet::start()?))
            }
        })
    }

    /// Points `cfg` at these servers.
    pub fn apply(&self, cfg: &mut BackendConfig) {
        match self {
            Servers::Redis(f) => {
                cfg.redis.url = f.nodes[0].url();
                cfg.redlock.urls = f.urls();
            }
            Servers::Sentinel(f) => cfg.redis.url = f.primary.url(),
            Servers::Postgres(f) => cfg.postgres.url = f.url(),
            Servers::Zookeeper(f) => cfg.zookeeper.connect = f.connect_string(),
            Servers::Etcd(f) => cfg.etcd.endpoints = f.endpoints(),
            Servers::External => {}
        }
    }

    /// One line for results.json.
    pub fn describe(&self, cfg: &BackendConfig) -> String {
        match self {
            Servers::External => format!("external {}", distlock::redact_url(&cfg.redis.url)),
            Servers::Redis(f) if f.nodes.len() == 1 => {
                format!("fleet: redis single at {}", f.nodes[0].host_port())
            }
            Servers::Redis(f) => format!(
                "fleet: {} independent redis masters at {}",
                f.nodes.len(),
                f.nodes
                    .iter()
                    .map(|n| n.host_port())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Servers::Postgres(f) => format!("fleet: postgresql at {}", f.node.host_port()),
            Servers::Zookeeper(f) => {
                format!("fleet: zookeeper standalone at {}", f.connect_string())
            }
            Servers::Etcd(f) => format!(
                "fleet: etcd x{} at {}",
                f.nodes.len(),
                f.endpoints().join(", ")
            ),
            Servers::Sentinel(f) => format!(
                "fleet: redis primary {} + replica {} + 3 sentinels",
                f.primary.host_port(),
                f.replica.host_port()
            ),
        }
    }
}
