//! The registry entries of the Redis crate: `redis`, `redis-wait` and the
//! seeds' three broken locks, each with its floor, peers and probes.

use std::sync::Arc;
use std::time::Duration;

use distlock::descriptor::{
    self as d, BuildParams, Config as _, Connected, Descriptor, Probe, Probes, Topology,
};
use distlock::{Capabilities, DistLock, Result};
use serde_json::Value;

use crate::broken::{GetDelLock, SetnxExpireLock, ShortLeaseLock, BROKEN_CAPABILITIES};
use crate::config::{Deployment, RedisConfig};
use crate::lock::RedisLock;
use crate::peers::PlainRedisPeer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis,
    RedisCluster,
    RedisWait,
    SetnxExpire,
    GetDel,
    ShortLease,
}

/// A backend of the Redis family (they all read the `[redis]` table).
#[derive(Debug)]
pub struct RedisBackend(Kind);

/// `redis`: the single-node lock.
pub static REDIS: RedisBackend = RedisBackend(Kind::Redis);
/// `redis-cluster`: the same lock on a 3-master, 3-replica Redis Cluster.
pub static REDIS_CLUSTER: RedisBackend = RedisBackend(Kind::RedisCluster);
/// `redis-wait`: the same lock with `WAIT 1` on primary + replica.
pub static REDIS_WAIT: RedisBackend = RedisBackend(Kind::RedisWait);
/// Negative control: `SETNX` then `PEXPIRE` as two calls.
pub static SETNX_EXPIRE: RedisBackend = RedisBackend(Kind::SetnxExpire);
/// Negative control: `GET`, compare in the client, `DEL`.
pub static GET_DEL: RedisBackend = RedisBackend(Kind::GetDel);
/// Negative control: a fixed lease of half the hold time.
pub static SHORT_LEASE: RedisBackend = RedisBackend(Kind::ShortLease);

/// What `redis-cluster` and `redis --topology cluster` run on: three
/// masters (the fewest `redis-cli --cluster create` accepts), each with a
/// replica for the failover drill.
const CLUSTER: Topology = Topology::RedisCluster {
    masters: 3,
    replicas: 1,
};

/// The raw floor of a Redis lock: two PINGs on the lock's own connection
/// (on a cluster, to the master of the workload key's slot).
struct Floor(Arc<RedisLock>, Option<u16>);

#[async_trait::async_trait]
impl Probe for Floor {
    async fn once(&self) -> Result<()> {
        self.0.floor_round_trip(self.1).await
    }
}

/// Connects the correct lock, with its floor and (for `redis`) the plain
/// peer when probes are asked for.
async fn correct(cfg: RedisConfig, params: BuildParams) -> Result<Connected> {
    let plain_cfg = cfg.clone();
    let wait = cfg.wait_replicas > 0;
    let single = matches!(cfg.deployment()?, Deployment::Single { .. });
    let lock = Arc::new(RedisLock::connect(cfg).await?);
    let mut probes = Probes::default();
    if params.probes {
        let slot = lock.slot_of(&params.key).await?;
        probes.floor = Some(Box::new(Floor(lock.clone(), slot)));
        // The plain peer is written for one server.
        if !wait && single {
            // One key per worker process, apart from the lock's own.
            let key = format!("lockbench:peer:redis-plain:{}", std::process::id());
            probes.peers.push((
                "redis-plain".into(),
                Box::new(PlainRedisPeer::connect(&plain_cfg, key).await?),
            ));
        }
    }
    Ok(Connected {
        lock: lock as Arc<dyn DistLock>,
        probes,
    })
}

#[async_trait::async_trait]
impl Descriptor for RedisBackend {
    fn name(&self) -> &'static str {
        match self.0 {
            Kind::Redis => "redis",
            Kind::RedisCluster => "redis-cluster",
            Kind::RedisWait => "redis-wait",
            Kind::SetnxExpire => "redis-setnx-expire",
            Kind::GetDel => "redis-get-del",
            Kind::ShortLease => "redis-short-lease",
        }
    }

    fn about(&self) -> &'static str {
        match self.0 {
            Kind::Redis => "single-node Redis: SET NX PX + fencing counter (Lua), owner per acquisition, Lua compare-and-delete, watchdog; fair queue (a release wakes only the next waiter, on its client's channel)",
            Kind::RedisCluster => "redis on a Redis Cluster (3 masters + 3 replicas): the lock's keys share a hash tag, the client follows MOVED/ASK",
            Kind::RedisWait => "redis + WAIT 1 replica after acquiring (Redisson's replica sync check), primary + replica found through 3 sentinels",
            Kind::SetnxExpire => "NEGATIVE CONTROL: SETNX then PEXPIRE as two calls (a crash between leaves an immortal lock)",
            Kind::GetDel => "NEGATIVE CONTROL: unlock = GET, compare in the client, DEL (check-then-act race)",
            Kind::ShortLease => "NEGATIVE CONTROL: correct lock, fixed lease of half the hold time, no renewal",
        }
    }

    fn capabilities(&self) -> Capabilities {
        match self.0 {
            Kind::Redis | Kind::RedisCluster | Kind::RedisWait => RedisLock::CAPABILITIES,
            Kind::SetnxExpire | Kind::GetDel => BROKEN_CAPABILITIES,
            Kind::ShortLease => ShortLeaseLock::CAPABILITIES,
        }
    }

    fn negative_control(&self) -> bool {
        matches!(self.0, Kind::SetnxExpire | Kind::GetDel | Kind::ShortLease)
    }

    fn needs_fault(&self) -> Option<&'static str> {
        match self.0 {
            Kind::SetnxExpire => Some("a client crash between SETNX and PEXPIRE"),
            Kind::GetDel => {
                Some("a pause of the holder between its GET and DEL while the lease runs out")
            }
            _ => None,
        }
    }

    fn topology(&self) -> Topology {
        match self.0 {
            Kind::RedisWait => Topology::RedisPrimaryReplica,
            Kind::RedisCluster => CLUSTER,
            _ => Topology::RedisSingle,
        }
    }

    fn cluster_topology(&self) -> Option<Topology> {
        matches!(self.0, Kind::Redis | Kind::RedisCluster).then_some(CLUSTER)
    }

    fn crash_point(&self) -> Option<&'static str> {
        (self.0 == Kind::SetnxExpire).then_some(crate::broken::AFTER_SETNX)
    }

    fn pause_point(&self) -> Option<&'static str> {
        (self.0 == Kind::GetDel).then_some(crate::broken::BETWEEN_GET_AND_DEL)
    }

    fn sentinel_topology(&self) -> Option<Topology> {
        matches!(self.0, Kind::Redis | Kind::RedisWait).then_some(Topology::RedisPrimaryReplica)
    }

    fn family(&self) -> &'static str {
        RedisConfig::FAMILY
    }

    fn env_vars(&self) -> &'static [&'static str] {
        RedisConfig::ENV_VARS
    }

    fn settings(&self, table: Option<Value>) -> Result<Value> {
        d::settings_of::<RedisConfig>(table)
    }

    fn set_endpoint(&self, settings: &mut Value, endpoint: &str) -> Result<()> {
        d::set_endpoint_of::<RedisConfig>(settings, endpoint)
    }

    fn configured_endpoint(&self, settings: &Value) -> Option<String> {
        d::configured_endpoint_of::<RedisConfig>(settings)
    }

    fn check_servers(&self, settings: &Value) -> Result<()> {
        let cfg: RedisConfig = d::typed(RedisConfig::FAMILY, settings)?;
        if self.0 == Kind::RedisCluster
            && !matches!(cfg.deployment()?, crate::config::Deployment::Cluster { .. })
        {
            // It would run as `redis` on one server, recorded as a cluster.
            return Err(distlock::Error::config(
                "redis.url",
                format!(
                    "redis-cluster runs on a Redis Cluster: give its seed nodes as redis+cluster://host:port[,host:port...] (or [redis] cluster = [...]), not {}; on one server or behind Sentinel, run -b redis",
                    crate::config::redact(&cfg.url)
                ),
            ));
        }
        Ok(())
    }

    async fn connect(&self, settings: &Value, params: BuildParams) -> Result<Connected> {
        let cfg: RedisConfig = d::typed(RedisConfig::FAMILY, settings)?;
        self.check_servers(settings)?;
        Ok(match self.0 {
            Kind::Redis | Kind::RedisCluster => {
                correct(
                    RedisConfig {
                        wait_replicas: 0,
                        ..cfg
                    },
                    params,
                )
                .await?
            }
            Kind::RedisWait => {
                let wait_replicas = cfg.wait_replicas.max(1);
                correct(
                    RedisConfig {
                        wait_replicas,
                        ..cfg
                    },
                    params,
                )
                .await?
            }
            Kind::SetnxExpire => Connected::plain(Arc::new(SetnxExpireLock::connect(cfg).await?)),
            Kind::GetDel => Connected::plain(Arc::new(GetDelLock::connect(cfg).await?)),
            Kind::ShortLease => {
                let lease = (params.hold / 2).max(Duration::from_millis(1));
                Connected::plain(Arc::new(ShortLeaseLock::connect(cfg, lease).await?))
            }
        })
    }

    async fn server_version(&self, settings: &Value) -> Option<String> {
        let cfg: RedisConfig = d::typed(RedisConfig::FAMILY, settings).ok()?;
        crate::peers::deployment_version(&cfg).await
    }
}
