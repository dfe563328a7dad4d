//! Configuration of the Redis locks.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings for [`crate::RedisLock`] and the negative controls. Read from
/// the `[redis]` table of a lockbench TOML file or from `LOCKBENCH_REDIS_*`
/// environment variables; `Debug` hides any password in the URL.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// Endpoint (`redis.url`): one server, `redis://127.0.0.2:21000`; a
    /// primary found through Sentinel,
    /// `redis+sentinel://[:password@]h1:p1,h2:p2/master_name`; or a Redis
    /// Cluster, `redis+cluster://[:password@]h1:p1,h2:p2` (seed nodes).
    pub url: String,
    /// Sentinels (`host:port`) that know the primary (`redis.sentinels`);
    /// with `master_name`, an alternative to a `redis+sentinel://` URL.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under (`redis.master_name`).
    pub master_name: String,
    /// Seed nodes (`host:port`) of a Redis Cluster (`redis.cluster`); an
    /// alternative to a `redis+cluster://` URL.
    pub cluster: Vec<String>,
    /// Lease the watchdog renews when no fixed lease is asked for
    /// (Redisson's `lockWatchdogTimeout`, default 30 s).
    pub watchdog_lease_ms: u64,
    /// Deadline of every request (`redis.op_timeout_ms`).
    pub op_timeout_ms: u64,
    /// Deadline for connecting (`redis.connect_timeout_ms`).
    pub connect_timeout_ms: u64,
    /// Longest sleep between retries when no release notification comes
    /// (pub/sub is the normal wake-up; this bounds a lost message).
    pub max_retry_interval_ms: u64,
    /// Serve waiters in arrival order (`redis.fair`, default on): a
    /// release wakes only the head of the key's queue, on its client's
    /// channel, as Redisson's `RedissonFairLock` does. Off: every release
    /// is published to every waiter of the key, who all race for it (the
    /// herd: at 16 worker processes on one key it cost 13 round trips per
    /// acquire and 70 % of the 4-worker throughput).
    pub fair: bool,
    /// How long a fair waiter keeps its place without refreshing it
    /// (`redis.waiter_ttl_ms`). A waiter refreshes every third of it, so
    /// this bounds how long a crashed or paused waiter at the head can hold
    /// up a free lock; a waiter paused for longer loses its place and
    /// queues again at the tail.
    pub waiter_ttl_ms: u64,
    /// After acquiring, `WAIT` for this many replicas (Redisson's replica
    /// sync check); 0 = off. The `redis-wait` backend sets it.
    pub wait_replicas: u32,
    /// Timeout of that `WAIT`.
    pub wait_timeout_ms: u64,
    /// Prefix of every key we write.
    pub key_prefix: String,
    /// PEM file of the CA that signed the server's certificate, for a
    /// `rediss://` URL (`redis.tls_ca_file`, `LOCKBENCH_REDIS_TLS_CA_FILE`);
    /// empty: the system's roots. Hidden wherever settings are shown.
    pub tls_ca_file: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.into(),
            sentinels: Vec::new(),
            master_name: String::new(),
            cluster: Vec::new(),
            watchdog_lease_ms: 30_000,
            op_timeout_ms: 1_000,
            connect_timeout_ms: 2_000,
            max_retry_interval_ms: 100,
            fair: true,
            waiter_ttl_ms: 1_000,
            wait_replicas: 0,
            wait_timeout_ms: 100,
            key_prefix: "lockbench".into(),
            tls_ca_file: String::new(),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field("cluster", &self.cluster)
            .field("watchdog_lease_ms", &self.watchdog_lease_ms)
            .field("op_timeout_ms", &self.op_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("max_retry_interval_ms", &self.max_retry_interval_ms)
            .field("fair", &self.fair)
            .field("waiter_ttl_ms", &self.waiter_ttl_ms)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout_ms", &self.wait_timeout_ms)
            .field("key_prefix", &self.key_prefix)
            .field(
                "tls_ca_file",
                &if self.tls_ca_file.is_empty() {
                    ""
                } else {
                    "***"
                },
            )
            .finish()
    }
}

pub use distlock::redact_url as redact;

const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
const SENTINEL_SCHEME: &str = "redis+sentinel://";
const CLUSTER_SCHEME: &str = "redis+cluster://";

/// How the lock reaches Redis, resolved from [`RedisConfig`]. No `Debug`:
/// the strings may carry a password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server (or a primary addressed directly).
    Single {
        /// `redis://...`
        url: String,
    },
    /// A primary found, and found again after a failover, through Sentinel.
    Sentinel {
        /// `redis://host:port` of every sentinel.
        sentinels: Vec<String>,
        /// The monitored name.
        master: String,
        /// `user:password@` for the data nodes, or empty.
        userinfo: String,
    },
    /// A Redis Cluster.
    Cluster {
        /// `redis://[userinfo@]host:port` of every seed node.
        nodes: Vec<String>,
    },
}

impl Deployment {
    /// What the user would write in `redis.url` for this deployment.
    pub(crate) fn shown(&self) -> String {
        let hosts = |urls: &[String]| {
            urls.iter()
                .map(|u| u.rsplit(['@', '/']).next().unwrap_or(u).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Deployment::Single { url } => redact(url),
            Deployment::Sentinel {
                sentinels, master, ..
            } => format!("{SENTINEL_SCHEME}{}/{master}", hosts(sentinels)),
            Deployment::Cluster { nodes } => format!("{CLUSTER_SCHEME}{}", hosts(nodes)),
        }
    }
}

/// `host:port` (or `redis://host:port`) as `redis://{userinfo}host:port`,
/// with `default_port` when none is given.
fn node_url(key: &str, entry: &str, userinfo: &str, default_port: u16) -> distlock::Result<String> {
    let bare = entry
        .trim()
        .trim_start_matches("redis://")
        .trim_end_matches('/');
    if bare.is_empty() {
        return Err(distlock::Error::config(key, "an empty host in the list"));
    }
    // `[::1]:port`, `host:port` or a bare host.
    let has_port = match bare.rfind(':') {
        Some(i) => !bare[i..].contains(']'),
        None => false,
    };
    let host_port = if has_port {
        let (_, port) = bare.rsplit_once(':').unwrap_or((bare, ""));
        port.parse::<u16>().map_err(|_| {
            distlock::Error::config(key, format!("{bare:?}: the port is not a number"))
        })?;
        bare.to_string()
    } else {
        format!("{bare}:{default_port}")
    };
    Ok(format!("redis://{userinfo}{host_port}"))
}

/// Splits `scheme://[userinfo@]h1:p1,h2:p2[/path]` into userinfo
/// (with its `@`), hosts and path.
fn split_list_url<'a>(url: &'a str, scheme: &str) -> (&'a str, Vec<&'a str>, &'a str) {
    let rest = &url[scheme.len()..];
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    (
        userinfo,
        hosts.split(',').filter(|h| !h.trim().is_empty()).collect(),
        path,
    )
}

impl RedisConfig {
    /// A config for `url` with defaults otherwise.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Applies `LOCKBENCH_REDIS_URL`, `LOCKBENCH_REDIS_SENTINELS` and
    /// `LOCKBENCH_REDIS_CLUSTER` (comma-separated `host:port` lists),
    /// `LOCKBENCH_REDIS_MASTER_NAME`, `LOCKBENCH_REDIS_WATCHDOG_LEASE_MS`,
    /// `LOCKBENCH_REDIS_OP_TIMEOUT_MS`, `LOCKBENCH_REDIS_WAIT_REPLICAS`,
    /// `LOCKBENCH_REDIS_FAIR` (`true`/`false`) and
    /// `LOCKBENCH_REDIS_WAITER_TTL_MS` over `self`.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the variable that is not a number.
    pub fn with_env(mut self) -> distlock::Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_URL") {
            self.url = v;
        }
        let list = |v: String| -> Vec<String> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_SENTINELS") {
            self.sentinels = list(v);
        }
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_MASTER_NAME") {
            self.master_name = v;
        }
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_CLUSTER") {
            self.cluster = list(v);
        }
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_TLS_CA_FILE") {
            self.tls_ca_file = v;
        }
        let num = |name: &str, slot: &mut u64| -> distlock::Result<()> {
            if let Ok(v) = std::env::var(name) {
                *slot = v
                    .parse()
                    .map_err(|_| distlock::Error::config(name, format!("not a number: {v:?}")))?;
            }
            Ok(())
        };
        num(
            "LOCKBENCH_REDIS_WATCHDOG_LEASE_MS",
            &mut self.watchdog_lease_ms,
        )?;
        num("LOCKBENCH_REDIS_OP_TIMEOUT_MS", &mut self.op_timeout_ms)?;
        num("LOCKBENCH_REDIS_WAITER_TTL_MS", &mut self.waiter_ttl_ms)?;
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_FAIR") {
            self.fair = v.parse().map_err(|_| {
                distlock::Error::config("LOCKBENCH_REDIS_FAIR", format!("not true or false: {v:?}"))
            })?;
        }
        let mut replicas = u64::from(self.wait_replicas);
        num("LOCKBENCH_REDIS_WAIT_REPLICAS", &mut replicas)?;
        self.wait_replicas = u32::try_from(replicas)
            .map_err(|_| distlock::Error::config("LOCKBENCH_REDIS_WAIT_REPLICAS", "too large"))?;
        Ok(self)
    }

    /// Checks values that would make the lock misbehave.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the bad key.
    pub fn validate(&self) -> distlock::Result<()> {
        let deployment = self.deployment()?;
        if self.wait_replicas > 0 && matches!(deployment, Deployment::Cluster { .. }) {
            return Err(distlock::Error::config(
                "redis.wait_replicas",
                "WAIT after acquiring is not supported on a Redis Cluster here (redis-wait runs on primary + replica behind Sentinel)",
            ));
        }
        if self.watchdog_lease_ms < 30 {
            return Err(distlock::Error::config(
                "redis.watchdog_lease_ms",
                "must be at least 30 ms",
            ));
        }
        if self.fair && self.waiter_ttl_ms < 30 {
            return Err(distlock::Error::config(
                "redis.waiter_ttl_ms",
                "must be at least 30 ms (a waiter refreshes its place every third of it)",
            ));
        }
        if self.op_timeout_ms == 0 {
            return Err(distlock::Error::config(
                "redis.op_timeout_ms",
                "must be positive",
            ));
        }
        if !self.tls_ca_file.is_empty()
            && !matches!(&deployment, Deployment::Single { url } if url.starts_with("rediss://"))
        {
            return Err(distlock::Error::config(
                "redis.tls_ca_file",
                "a CA for TLS is for a single server's rediss:// URL (not plain redis://, Sentinel or Cluster here)",
            ));
        }
        Ok(())
    }

    /// The CA certificate `tls_ca_file` names, read (`None` without one).
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming `redis.tls_ca_file` (not the
    /// path, which stays out of logs) when it cannot be read.
    pub(crate) fn tls_ca(&self) -> distlock::Result<Option<Vec<u8>>> {
        if self.tls_ca_file.is_empty() {
            return Ok(None);
        }
        std::fs::read(&self.tls_ca_file).map(Some).map_err(|e| {
            distlock::Error::config("redis.tls_ca_file", format!("cannot read it: {e}"))
        })
    }

    /// Where the lock's Redis is: one server, a Sentinel-managed primary or
    /// a cluster, from `url` or from the `sentinels` / `cluster` lists.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the key that is wrong: an unknown
    /// scheme, an empty host list, a port that is not a number, a missing
    /// master name, or two deployments at once.
    pub(crate) fn deployment(&self) -> distlock::Result<Deployment> {
        let url = self.url.trim();
        let lists = !self.sentinels.is_empty() || !self.cluster.is_empty();
        if !self.sentinels.is_empty() && !self.cluster.is_empty() {
            return Err(distlock::Error::config(
                "redis.sentinels",
                "set either redis.sentinels (with redis.master_name) or redis.cluster, not both",
            ));
        }
        if lists && url != DEFAULT_URL {
            return Err(distlock::Error::config(
                "redis.url",
                format!(
                    "{:?} and a redis.sentinels / redis.cluster list are both set; keep one",
                    redact(url)
                ),
            ));
        }
        if !self.sentinels.is_empty() {
            if self.master_name.trim().is_empty() {
                return Err(distlock::Error::config(
                    "redis.master_name",
                    "redis.sentinels needs the name the sentinels monitor the primary under",
                ));
            }
            return Ok(Deployment::Sentinel {
                sentinels: self
                    .sentinels
                    .iter()
                    .map(|s| node_url("redis.sentinels", s, "", 26379))
                    .collect::<distlock::Result<_>>()?,
                master: self.master_name.trim().to_string(),
                userinfo: String::new(),
            });
        }
        if !self.cluster.is_empty() {
            return Ok(Deployment::Cluster {
                nodes: self
                    .cluster
                    .iter()
                    .map(|s| node_url("redis.cluster", s, "", 6379))
                    .collect::<distlock::Result<_>>()?,
            });
        }
        if url.starts_with(SENTINEL_SCHEME) {
            let (userinfo, hosts, master) = split_list_url(url, SENTINEL_SCHEME);
            if hosts.is_empty() {
                return Err(distlock::Error::config(
                    "redis.url",
                    format!("{:?} names no sentinel", redact(url)),
                ));
            }
            if master.is_empty() {
                return Err(distlock::Error::config(
                    "redis.url",
                    format!(
                        "{:?}: the master name goes after the hosts ({SENTINEL_SCHEME}h1:p1,h2:p2/mymaster)",
                        redact(url)
                    ),
                ));
            }
            return Ok(Deployment::Sentinel {
                sentinels: hosts
                    .iter()
                    .map(|h| node_url("redis.url", h, "", 26379))
                    .collect::<distlock::Result<_>>()?,
                master: master.to_string(),
                userinfo: userinfo.to_string(),
            });
        }
        if url.starts_with(CLUSTER_SCHEME) {
            let (userinfo, hosts, _) = split_list_url(url, CLUSTER_SCHEME);
            if hosts.is_empty() {
                return Err(distlock::Error::config(
                    "redis.url",
                    format!("{:?} names no cluster node", redact(url)),
                ));
            }
            return Ok(Deployment::Cluster {
                nodes: hosts
                    .iter()
                    .map(|h| node_url("redis.url", h, userinfo, 6379))
                    .collect::<distlock::Result<_>>()?,
            });
        }
        if !(url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("unix://"))
        {
            return Err(distlock::Error::config(
                "redis.url",
                format!(
                    "{:?} is not a redis://, redis+sentinel:// or redis+cluster:// URL",
                    redact(url)
                ),
            ));
        }
        Ok(Deployment::Single {
            url: url.to_string(),
        })
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }

    /// The connection's response timeout, the one deadline of every lock
    /// call: `op_timeout_ms`, plus `wait_timeout_ms` when the acquire
    /// pipelines a `WAIT`, which the server may hold that long before it
    /// answers.
    pub(crate) fn response_timeout(&self) -> Duration {
        let wait = if self.wait_replicas > 0 {
            self.wait_timeout_ms
        } else {
            0
        };
        Duration::from_millis(self.op_timeout_ms.saturating_add(wait))
    }
}

impl distlock::descriptor::Config for RedisConfig {
    const FAMILY: &'static str = "redis";
    const ENV_VARS: &'static [&'static str] = &[
        "LOCKBENCH_REDIS_URL",
        "LOCKBENCH_REDIS_SENTINELS",
        "LOCKBENCH_REDIS_MASTER_NAME",
        "LOCKBENCH_REDIS_CLUSTER",
        "LOCKBENCH_REDIS_WATCHDOG_LEASE_MS",
        "LOCKBENCH_REDIS_OP_TIMEOUT_MS",
        "LOCKBENCH_REDIS_WAIT_REPLICAS",
        "LOCKBENCH_REDIS_TLS_CA_FILE",
        "LOCKBENCH_REDIS_FAIR",
        "LOCKBENCH_REDIS_WAITER_TTL_MS",
    ];

    fn with_env(self) -> distlock::Result<Self> {
        RedisConfig::with_env(self)
    }

    fn validate(&self) -> distlock::Result<()> {
        RedisConfig::validate(self)
    }

    fn set_endpoint(&mut self, endpoint: &str) {
        // An endpoint names the whole deployment: the lists it replaces
        // would otherwise conflict with it.
        self.url = endpoint.trim().to_string();
        self.sentinels.clear();
        self.master_name.clear();
        self.cluster.clear();
    }

    fn endpoint(&self) -> String {
        if self.sentinels.is_empty() && self.cluster.is_empty() {
            return self.url.clone();
        }
        match self.deployment() {
            Ok(d) => d.shown(),
            Err(_) => self.url.clone(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn deployment(url: &str) -> distlock::Result<Deployment> {
        RedisConfig::new(url).deployment()
    }

    #[test]
    fn sentinel_url_with_password_and_default_port() {
        let Deployment::Sentinel {
            sentinels,
            master,
            userinfo,
        } = deployment("redis+sentinel://:pw@127.0.0.5:26380,127.0.0.6/mymaster").unwrap()
        else {
            panic!("not sentinel")
        };
        assert_eq!(
            sentinels,
            ["redis://127.0.0.5:26380", "redis://127.0.0.6:26379"]
        );
        assert_eq!(master, "mymaster");
        // The password is for the data nodes, not the sentinels.
        assert_eq!(userinfo, ":pw@");
    }

    #[test]
    fn cluster_url_carries_the_password_to_every_node() {
        let Deployment::Cluster { nodes } =
            deployment("redis+cluster://:pw@127.0.0.2:7000,[::1]:7001,127.0.0.3").unwrap()
        else {
            panic!("not cluster")
        };
        assert_eq!(
            nodes,
            [
                "redis://:pw@127.0.0.2:7000",
                "redis://:pw@[::1]:7001",
                "redis://:pw@127.0.0.3:6379"
            ]
        );
    }

    #[test]
    fn mistakes_name_the_key() {
        let e = |r: distlock::Result<Deployment>| match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        assert!(e(deployment("redis+sentinel://127.0.0.5:1")).contains("master name"));
        assert!(e(deployment("redis+sentinel:///m")).contains("no sentinel"));
        assert!(e(deployment("redis+cluster://h:port")).contains("not a number"));
        assert!(e(deployment("http://x")).contains("redis.url"));
        let both = RedisConfig {
            sentinels: vec!["a:1".into()],
            cluster: vec!["b:2".into()],
            master_name: "m".into(),
            ..RedisConfig::default()
        };
        assert!(e(both.deployment()).contains("not both"));
        let nameless = RedisConfig {
            sentinels: vec!["a:1".into()],
            ..RedisConfig::default()
        };
        assert!(e(nameless.deployment()).contains("redis.master_name"));
        let url_and_list = RedisConfig {
            url: "redis://127.0.0.9:1".into(),
            cluster: vec!["b:2".into()],
            ..RedisConfig::default()
        };
        assert!(e(url_and_list.deployment()).contains("keep one"));
        let wait_on_cluster = RedisConfig {
            cluster: vec!["b:2".into()],
            wait_replicas: 1,
            ..RedisConfig::default()
        };
        assert!(wait_on_cluster
            .validate()
            .unwrap_err()
            .to_string()
            .contains("redis.wait_replicas"));
        let short_waiter = RedisConfig {
            waiter_ttl_ms: 5,
            ..RedisConfig::default()
        };
        assert!(short_waiter
            .validate()
            .unwrap_err()
            .to_string()
            .contains("redis.waiter_ttl_ms"));
        // Unfair, the waiter TTL is not used and not checked.
        let unfair = RedisConfig {
            fair: false,
            ..short_waiter
        };
        assert!(unfair.validate().is_ok());
        let read: RedisConfig =
            serde_json::from_str(r#"{"fair": false, "waiter_ttl_ms": 500}"#).unwrap();
        assert!(!read.fair && read.waiter_ttl_ms == 500);
    }

    #[test]
    fn lists_show_as_the_url_form_without_the_password() {
        use distlock::descriptor::Config as _;
        let cfg = RedisConfig {
            sentinels: vec!["127.0.0.5:26379".into(), "127.0.0.6:26379".into()],
            master_name: "m".into(),
            ..RedisConfig::default()
        };
        assert_eq!(
            cfg.endpoint(),
            "redis+sentinel://127.0.0.5:26379,127.0.0.6:26379/m"
        );
        let shown = Deployment::Cluster {
            nodes: vec!["redis://:pw@127.0.0.2:7000".into()],
        }
        .shown();
        assert_eq!(shown, "redis+cluster://127.0.0.2:7000");
    }
}
