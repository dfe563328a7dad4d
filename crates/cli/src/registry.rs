//! The one place backends are registered: name -> how to build a client,
//! which fleet topology it needs, what it declares.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Capabilities, DistLock, Result};
use harness::worker::{LockCycle, Probe, Probes};
use lockbench_etcd::{EtcdConfig, EtcdLock, LockRpc};
use lockbench_postgres::{PgAdvisoryLock, PgConfig, PgOptimisticLock, PgRowLock};
use lockbench_redis::{
    GetDelLock, RedisConfig, RedisLock, SetnxExpireLock, ShortLeaseLock, BROKEN_CAPABILITIES,
};
use lockbench_redlock::{RedLock, RedLockConfig};
use lockbench_zookeeper::{ZkConfig, ZkLock};
use serde::{Deserialize, Serialize};

/// The servers a backend needs when lockbench starts them itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// One Redis node.
    RedisSingle,
    /// Redis primary + replica + 3 sentinels.
    RedisPrimaryReplica,
    /// N independent Redis masters (RedLock).
    RedisIndependent(usize),
    /// One PostgreSQL server.
    Postgres,
    /// One standalone ZooKeeper server.
    Zookeeper,
    /// One etcd node.
    Etcd,
}

/// One registry entry.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Backend {
    /// Registry name.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// What it declares.
    pub capabilities: Capabilities,
    /// The servers it needs.
    pub topology: Topology,
    /// A deliberately broken lock from the seeds, kept to prove the
    /// checkers catch it.
    pub negative_control: bool,
    /// For a control that only a fault exposes: that fault (the fault-free
    /// workloads cannot catch it, and the report says so instead of
    /// flagging the checkers).
    pub needs_fault: Option<&'static str>,
}

/// Every backend, in report order.
pub const BACKENDS: &[Backend] = &[
    Backend {
        name: "redis",
        about: "single-node Redis: SET NX PX + INCR token (Lua), Lua compare-and-delete, watchdog, pub/sub wake-up",
        capabilities: RedisLock::CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "redis-wait",
        about: "redis + WAIT 1 replica after acquiring (Redisson's replica sync check), primary + replica",
        capabilities: RedisLock::CAPABILITIES,
        topology: Topology::RedisPrimaryReplica,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "redlock",
        about: "RedLock over 5 independent Redis masters: parallel acquire, quorum 3, validity = lease - elapsed - drift; no safe token",
        capabilities: RedLock::CAPABILITIES,
        topology: Topology::RedisIndependent(5),
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "pg-advisory",
        about: "PostgreSQL session advisory lock on a dedicated connection; server-side wait (lock_timeout); sequence token; ping -> lost",
        capabilities: PgAdvisoryLock::CAPABILITIES,
        topology: Topology::Postgres,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "pg-row",
        about: "PostgreSQL lease row: INSERT .. ON CONFLICT DO UPDATE .. WHERE expired (database clock); row counter token; watchdog",
        capabilities: PgRowLock::CAPABILITIES,
        topology: Topology::Postgres,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "pg-optimistic",
        about: "PostgreSQL version-column CAS with jittered exponential backoff; version token; watchdog",
        capabilities: PgOptimisticLock::CAPABILITIES,
        topology: Topology::Postgres,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "zookeeper",
        about: "ZooKeeper ephemeral-sequential recipe (Curator InterProcessMutex): pipelined create + getChildren, predecessor watch, czxid token, session-bound",
        capabilities: ZkLock::CAPABILITIES,
        topology: Topology::Zookeeper,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "etcd",
        about: "etcd concurrency.Mutex recipe: keepalived session lease, one-Txn acquire, watch the key ahead, create-revision token",
        capabilities: EtcdLock::CAPABILITIES,
        topology: Topology::Etcd,
        negative_control: false,
        needs_fault: None,
    },
    Backend {
        name: "redis-setnx-expire",
        about: "NEGATIVE CONTROL: SETNX then PEXPIRE as two calls (a crash between leaves an immortal lock)",
        capabilities: BROKEN_CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: true,
        needs_fault: Some("a client crash between SETNX and PEXPIRE"),
    },
    Backend {
        name: "redis-get-del",
        about: "NEGATIVE CONTROL: unlock = GET, compare in the client, DEL (check-then-act race)",
        capabilities: BROKEN_CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: true,
        needs_fault: Some("a pause of the holder between its GET and DEL while the lease runs out"),
    },
    Backend {
        name: "redis-short-lease",
        about: "NEGATIVE CONTROL: correct lock, fixed lease of half the hold time, no renewal",
        capabilities: ShortLeaseLock::CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: true,
        needs_fault: None,
    },
];

/// Looks a backend up by name.
///
/// # Errors
/// [`distlock::Error::Config`] listing the valid names.
pub fn find(name: &str) -> Result<&'static Backend> {
    BACKENDS.iter().find(|b| b.name == name).ok_or_else(|| {
        distlock::Error::config(
            "backend",
            format!(
                "unknown backend {name:?}; valid: {}",
                BACKENDS
                    .iter()
                    .map(|b| b.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// Settings of every backend, as read from the `--config` TOML file (one
/// table per backend family) and environment variables.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendConfig {
    /// `[redis]`: used by every redis-* backend.
    pub redis: RedisConfig,
    /// `[redlock]`: the independent masters and RedLock's timings.
    pub redlock: RedLockConfig,
    /// `[postgres]`: used by every pg-* backend.
    pub postgres: PgConfig,
    /// `[zookeeper]`: the connect string and session timeout.
    pub zookeeper: ZkConfig,
    /// `[etcd]`: the cluster's endpoints and the session lease.
    pub etcd: EtcdConfig,
}

/// Run parameters some backends need when they are built.
#[derive(Debug, Clone, Copy)]
pub struct BuildParams {
    /// Time inside the critical section (the short-lease control takes half).
    pub hold: Duration,
    /// Build the raw floor and the peers too (latency workload only).
    pub probes: bool,
}

/// A connected client and what the latency workload times next to it.
pub struct Connected {
    /// The lock under test.
    pub lock: Arc<dyn DistLock>,
    /// Its raw floor and peers (empty unless asked for).
    pub probes: Probes,
}

/// A lock whose backend has a raw floor on the lock's own connection(s).
#[async_trait::async_trait]
trait RawFloor: DistLock {
    async fn floor(&self) -> Result<()>;
}

macro_rules! raw_floor {
    ($($lock:ty),*) => {$(
        #[async_trait::async_trait]
        impl RawFloor for $lock {
            async fn floor(&self) -> Result<()> {
                self.floor_round_trip().await
            }
        }
    )*};
}

raw_floor!(
    RedisLock,
    RedLock,
    PgAdvisoryLock,
    PgRowLock,
    PgOptimisticLock,
    ZkLock,
    EtcdLock
);

struct FloorOf<L>(Arc<L>);

#[async_trait::async_trait]
impl<L: RawFloor> Probe for FloorOf<L> {
    async fn once(&self) -> Result<()> {
        self.0.floor().await
    }
}

/// The lock, with its floor when the latency workload asks for probes.
fn with_floor<L: RawFloor>(lock: Arc<L>, probes: bool) -> Connected {
    Connected {
        probes: Probes {
            floor: probes.then(|| Box::new(FloorOf(lock.clone())) as Box<dyn Probe>),
            peers: Vec::new(),
        },
        lock,
    }
}

/// Two one-row writes on the lock's own pool: the floor of a lock whose
/// acquire and release each write a row (reported next to the plain
/// `SELECT 1` floor, which no such lock can approach).
struct WriteFloor<L>(Arc<L>);

macro_rules! write_floor {
    ($($lock:ty),*) => {$(
        #[async_trait::async_trait]
        impl Probe for WriteFloor<$lock> {
            async fn once(&self) -> Result<()> {
                self.0.write_floor_round_trip().await
            }
        }
    )*};
}

write_floor!(PgRowLock, PgOptimisticLock);

/// [`with_floor`], plus the write floor as the peer `write-floor`.
fn with_write_floor<L: RawFloor>(lock: Arc<L>, probes: bool) -> Connected
where
    WriteFloor<L>: Probe + 'static,
{
    let mut connected = with_floor(lock.clone(), probes);
    if probes {
        connected
            .probes
            .peers
            .push(("write-floor".into(), Box::new(WriteFloor(lock))));
    }
    connected
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

/// The `zookeeper-client` crate's own lock recipe (`Client::lock`),
/// lock + unlock, on the same session as the lock under test.
struct ZkCrateRecipePeer {
    lock: Arc<ZkLock>,
    key: String,
}

#[async_trait::async_trait]
impl Probe for ZkCrateRecipePeer {
    async fn once(&self) -> Result<()> {
        self.lock.crate_recipe_cycle(&self.key).await
    }
}

/// The same lock written plainly on the `redis` crate, without our trait,
/// guard, token or watchdog: `SET key owner NX PX` and a compare-and-delete
/// script. The gap to `redis` is what the abstraction costs.
struct PlainRedisPeer {
    con: redis::aio::MultiplexedConnection,
    key: String,
    del: redis::Script,
}

impl PlainRedisPeer {
    async fn connect(cfg: &RedisConfig, key: String) -> Result<Self> {
        // Never print a password: the URL as the lock's own errors show it.
        let shown = lockbench_redis::redact(&cfg.url);
        let err = |what: &str, e: String| {
            distlock::Error::backend("redis-plain", what, format!("{shown}: {e}"))
        };
        let client =
            redis::Client::open(cfg.url.as_str()).map_err(|e| err("open", e.to_string()))?;
        let limit = Duration::from_millis(cfg.connect_timeout_ms);
        let con = tokio::time::timeout(limit, client.get_multiplexed_async_connection())
            .await
            .map_err(|_| err("connect", format!("no connection within {limit:?}")))?
            .map_err(|e| err("connect", e.to_string()))?;
        Ok(Self {
            con,
            key,
            del: redis::Script::new(
                "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
            ),
        })
    }
}

#[async_trait::async_trait]
impl Probe for PlainRedisPeer {
    async fn once(&self) -> Result<()> {
        let err = |what: &str, e: redis::RedisError| {
            distlock::Error::backend("redis-plain", what, e.to_string())
        };
        let mut con = self.con.clone();
        let ok: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg("plain-owner")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut con)
            .await
            .map_err(|e| err("set nx px", e))?;
        if ok.is_none() {
            return Err(distlock::Error::backend(
                "redis-plain",
                "set nx px",
                format!("{} is held", self.key),
            ));
        }
        let _: i64 = self
            .del
            .key(&self.key)
            .arg("plain-owner")
            .invoke_async(&mut con)
            .await
            .map_err(|e| err("compare-and-delete", e))?;
        Ok(())
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

/// A connected client for `name`, plus its raw floor (same connection) and
/// peers when `params.probes`.
///
/// # Errors
/// Unknown name, bad config (naming the key), unreachable endpoint.
pub async fn connect(name: &str, cfg: &BackendConfig, params: BuildParams) -> Result<Connected> {
    let redis = cfg.redis.clone();
    let plain = |lock: Arc<dyn DistLock>| Connected {
        lock,
        probes: Probes::default(),
    };
    Ok(match find(name)?.name {
        "redis" | "redis-wait" => {
            let wait_replicas = if name == "redis" {
                0
            } else {
                redis.wait_replicas.max(1)
            };
            let plain_cfg = redis.clone();
            let l = RedisLock::connect(RedisConfig {
                wait_replicas,
                ..redis
            })
            .await?;
            let mut connected = with_floor(Arc::new(l), params.probes);
            if params.probes && wait_replicas == 0 {
                // One key per worker process, apart from the lock's own.
                let key = format!("lockbench:peer:redis-plain:{}", std::process::id());
                connected.probes.peers.push((
                    "redis-plain".into(),
                    Box::new(PlainRedisPeer::connect(&plain_cfg, key).await?),
                ));
            }
            connected
        }
        "redlock" => {
            let l = Arc::new(RedLock::connect(cfg.redlock.clone()).await?);
            let mut connected = with_floor(l, params.probes);
            if params.probes {
                let probes = &mut connected.probes;
                // The same algorithm's two references, in the same run: one
                // node of the set alone, and the rslock crate on all of them.
                let first = cfg.redlock.urls.first().cloned().unwrap_or_default();
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
                let mut mgr = rslock::LockManager::new(cfg.redlock.urls.clone());
                mgr.set_retry(1, Duration::from_millis(1));
                probes.peers.push((
                    "rslock".into(),
                    Box::new(RslockPeer {
                        mgr,
                        // One key per worker process, apart from the lock's own.
                        key: format!("lockbench:peer:rslock:{}", std::process::id()),
                        lease: Duration::from_millis(cfg.redlock.watchdog_lease_ms),
                    }),
                ));
            }
            connected
        }
        "pg-advisory" => with_floor(
            Arc::new(PgAdvisoryLock::connect(cfg.postgres.clone()).await?),
            params.probes,
        ),
        "pg-row" => with_write_floor(
            Arc::new(PgRowLock::connect(cfg.postgres.clone()).await?),
            params.probes,
        ),
        "pg-optimistic" => with_write_floor(
            Arc::new(PgOptimisticLock::connect(cfg.postgres.clone()).await?),
            params.probes,
        ),
        "zookeeper" => {
            let l = Arc::new(ZkLock::connect(cfg.zookeeper.clone()).await?);
            let mut connected = with_floor(l.clone(), params.probes);
            if params.probes {
                connected.probes.peers.push((
                    "zookeeper-client".into(),
                    Box::new(ZkCrateRecipePeer {
                        lock: l,
                        // One key per worker process, apart from the lock's own.
                        key: format!("lockbench:peer:zookeeper-client:{}", std::process::id()),
                    }),
                ));
            }
            connected
        }
        "etcd" => {
            let l = Arc::new(EtcdLock::connect(cfg.etcd.clone()).await?);
            let mut connected = with_floor(l, params.probes);
            if params.probes {
                // One lock name per worker process, apart from ours.
                let name = format!("peer-{}", std::process::id());
                connected.probes.peers.push((
                    "etcd-lock-rpc".into(),
                    Box::new(LockRpcPeer(LockRpc::connect(&cfg.etcd, &name).await?)),
                ));
            }
            connected
        }
        "redis-setnx-expire" => plain(Arc::new(SetnxExpireLock::connect(redis).await?)),
        "redis-get-del" => plain(Arc::new(GetDelLock::connect(redis).await?)),
        "redis-short-lease" => {
            let lease = (params.hold / 2).max(Duration::from_millis(1));
            plain(Arc::new(ShortLeaseLock::connect(redis, lease).await?))
        }
        other => {
            return Err(distlock::Error::Unsupported {
                backend: "registry",
                what: format!("building {other}"),
            })
        }
    })
}
