//! What the latency workload times next to the Redis lock, and the version
//! probe.

use std::time::Duration;

use distlock::descriptor::Probe;
use distlock::Result;

use crate::client::{discover, Answer};
use crate::config::{redact, Deployment, RedisConfig};

/// The same lock written plainly on the `redis` crate, without our trait,
/// guard, token or watchdog: `SET key owner NX PX` and a compare-and-delete
/// script. The gap to `redis` is what the abstraction costs.
pub(crate) struct PlainRedisPeer {
    con: redis::aio::MultiplexedConnection,
    key: String,
    del: redis::Script,
}

impl PlainRedisPeer {
    pub(crate) async fn connect(cfg: &RedisConfig, key: String) -> Result<Self> {
        // Never print a password: the URL as the lock's own errors show it.
        let shown = redact(&cfg.url);
        let err = |what: &str, e: String| {
            distlock::Error::backend("redis-plain", what, format!("{shown}: {e}"))
        };
        let client =
            crate::node::client(cfg.url.as_str()).map_err(|e| err("open", e.to_string()))?;
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

/// The version of the server the lock of `cfg` talks to: the primary the
/// sentinels name, or a cluster's first seed node.
pub(crate) async fn deployment_version(cfg: &RedisConfig) -> Option<String> {
    match cfg.deployment().ok()? {
        Deployment::Single { url } => server_version(&url).await,
        Deployment::Cluster { nodes } => server_version(nodes.first()?)
            .await
            .map(|v| format!("{v} (cluster)")),
        Deployment::Sentinel {
            sentinels,
            master,
            userinfo,
        } => match discover(&sentinels, &master, Duration::from_secs(1)).await {
            Ok(Answer::Master(addr)) => server_version(&format!("redis://{userinfo}{addr}"))
                .await
                .map(|v| format!("{v} (sentinel)")),
            _ => None,
        },
    }
}

/// `redis <version>` from `INFO server`, within 2 s; `None` if it won't say.
pub async fn server_version(url: &str) -> Option<String> {
    let client = crate::node::client(url).ok()?;
    let mut con = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let info: String = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("INFO").arg("server").query_async(&mut con),
    )
    .await
    .ok()?
    .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| format!("redis {}", v.trim()))
}
