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
    /// Endpoint, e.g. `redis://127.0.0.2:21000` (`redis.url`).
    pub url: String,
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
    /// After acquiring, `WAIT` for this many replicas (Redisson's replica
    /// sync check); 0 = off. The `redis-wait` backend sets it.
    pub wait_replicas: u32,
    /// Timeout of that `WAIT`.
    pub wait_timeout_ms: u64,
    /// Prefix of every key we write.
    pub key_prefix: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            watchdog_lease_ms: 30_000,
            op_timeout_ms: 1_000,
            connect_timeout_ms: 2_000,
            max_retry_interval_ms: 100,
            wait_replicas: 0,
            wait_timeout_ms: 100,
            key_prefix: "lockbench".into(),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("watchdog_lease_ms", &self.watchdog_lease_ms)
            .field("op_timeout_ms", &self.op_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("max_retry_interval_ms", &self.max_retry_interval_ms)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout_ms", &self.wait_timeout_ms)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

pub use distlock::redact_url as redact;

impl RedisConfig {
    /// A config for `url` with defaults otherwise.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Applies `LOCKBENCH_REDIS_URL`, `LOCKBENCH_REDIS_WATCHDOG_LEASE_MS`,
    /// `LOCKBENCH_REDIS_OP_TIMEOUT_MS` and `LOCKBENCH_REDIS_WAIT_REPLICAS`
    /// over `self`.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the variable that is not a number.
    pub fn with_env(mut self) -> distlock::Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_REDIS_URL") {
            self.url = v;
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
        if !(self.url.starts_with("redis://")
            || self.url.starts_with("rediss://")
            || self.url.starts_with("unix://"))
        {
            return Err(distlock::Error::config(
                "redis.url",
                format!("{:?} is not a redis:// URL", redact(&self.url)),
            ));
        }
        if self.watchdog_lease_ms < 30 {
            return Err(distlock::Error::config(
                "redis.watchdog_lease_ms",
                "must be at least 30 ms",
            ));
        }
        if self.op_timeout_ms == 0 {
            return Err(distlock::Error::config(
                "redis.op_timeout_ms",
                "must be positive",
            ));
        }
        Ok(())
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }
}

impl distlock::descriptor::Config for RedisConfig {
    const FAMILY: &'static str = "redis";
    const ENV_VARS: &'static [&'static str] = &[
        "LOCKBENCH_REDIS_URL",
        "LOCKBENCH_REDIS_WATCHDOG_LEASE_MS",
        "LOCKBENCH_REDIS_OP_TIMEOUT_MS",
        "LOCKBENCH_REDIS_WAIT_REPLICAS",
    ];

    fn with_env(self) -> distlock::Result<Self> {
        RedisConfig::with_env(self)
    }

    fn validate(&self) -> distlock::Result<()> {
        RedisConfig::validate(self)
    }

    fn set_endpoint(&mut self, endpoint: &str) {
        self.url = endpoint.trim().to_string();
    }

    fn endpoint(&self) -> String {
        self.url.clone()
    }
}
