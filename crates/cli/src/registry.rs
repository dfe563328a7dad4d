//! The one place backends are registered: name -> how to build a client,
//! which fleet topology it needs, what it declares.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Capabilities, DistLock, Result};
use harness::worker::Floor;
use lockbench_redis::{
    GetDelLock, RedisConfig, RedisLock, SetnxExpireLock, ShortLeaseLock, BROKEN_CAPABILITIES,
};
use serde::{Deserialize, Serialize};

/// The servers a backend needs when lockbench starts them itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// One Redis node.
    RedisSingle,
    /// Redis primary + replica + 3 sentinels.
    RedisPrimaryReplica,
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
}

/// Every backend, in report order.
pub const BACKENDS: &[Backend] = &[
    Backend {
        name: "redis",
        about: "single-node Redis: SET NX PX + INCR token (Lua), Lua compare-and-delete, watchdog, pub/sub wake-up",
        capabilities: RedisLock::CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: false,
    },
    Backend {
        name: "redis-wait",
        about: "redis + WAIT 1 replica after acquiring (Redisson's replica sync check), primary + replica",
        capabilities: RedisLock::CAPABILITIES,
        topology: Topology::RedisPrimaryReplica,
        negative_control: false,
    },
    Backend {
        name: "redis-setnx-expire",
        about: "NEGATIVE CONTROL: SETNX then PEXPIRE as two calls (a crash between leaves an immortal lock)",
        capabilities: BROKEN_CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: true,
    },
    Backend {
        name: "redis-get-del",
        about: "NEGATIVE CONTROL: unlock = GET, compare in the client, DEL (check-then-act race)",
        capabilities: BROKEN_CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: true,
    },
    Backend {
        name: "redis-short-lease",
        about: "NEGATIVE CONTROL: correct lock, fixed lease of half the hold time, no renewal",
        capabilities: ShortLeaseLock::CAPABILITIES,
        topology: Topology::RedisSingle,
        negative_control: true,
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
}

/// Run parameters some backends need when they are built.
#[derive(Debug, Clone, Copy)]
pub struct BuildParams {
    /// Time inside the critical section (the short-lease control takes half).
    pub hold: Duration,
}

struct RedisFloor(Arc<RedisLock>);

#[async_trait::async_trait]
impl Floor for RedisFloor {
    async fn round_trip(&self) -> Result<()> {
        self.0.floor_round_trip().await
    }
}

/// A connected client for `name`, and its raw floor (same connection)
/// where the backend has one.
///
/// # Errors
/// Unknown name, bad config (naming the key), unreachable endpoint.
pub async fn connect(
    name: &str,
    cfg: &BackendConfig,
    params: BuildParams,
) -> Result<(Arc<dyn DistLock>, Option<Box<dyn Floor>>)> {
    let redis = cfg.redis.clone();
    Ok(match find(name)?.name {
        "redis" => {
            let l = Arc::new(
                RedisLock::connect(RedisConfig {
                    wait_replicas: 0,
                    ..redis
                })
                .await?,
            );
            (
                l.clone() as Arc<dyn DistLock>,
                Some(Box::new(RedisFloor(l)) as Box<dyn Floor>),
            )
        }
        "redis-wait" => {
            let l = Arc::new(
                RedisLock::connect(RedisConfig {
                    wait_replicas: redis.wait_replicas.max(1),
                    ..redis
                })
                .await?,
            );
            (
                l.clone() as Arc<dyn DistLock>,
                Some(Box::new(RedisFloor(l)) as Box<dyn Floor>),
            )
        }
        "redis-setnx-expire" => (Arc::new(SetnxExpireLock::connect(redis).await?), None),
        "redis-get-del" => (Arc::new(GetDelLock::connect(redis).await?), None),
        "redis-short-lease" => {
            let lease = (params.hold / 2).max(Duration::from_millis(1));
            (Arc::new(ShortLeaseLock::connect(redis, lease).await?), None)
        }
        other => {
            return Err(distlock::Error::Unsupported {
                backend: "registry",
                what: format!("building {other}"),
            })
        }
    })
}
