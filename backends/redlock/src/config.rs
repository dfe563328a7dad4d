//! Configuration of [`crate::RedLock`].

use std::fmt;
use std::time::Duration;

use lockbench_redis::redact;
use serde::{Deserialize, Serialize};

/// Settings for [`crate::RedLock`]: the `[redlock]` table of a lockbench
/// TOML file, or `LOCKBENCH_REDLOCK_URLS` (comma-separated). `Debug` hides
/// passwords.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RedLockConfig {
    /// The independent masters (`redlock.urls`), default 5 of them.
    pub urls: Vec<String>,
    /// Lease renewed by the watchdog when no fixed lease is asked.
    pub watchdog_lease_ms: u64,
    /// Per-node deadline of one request; 0 = scaled to the lease
    /// (lease / 20, between 10 and 50 ms).
    pub node_timeout_ms: u64,
    /// Deadline for connecting to one node.
    pub connect_timeout_ms: u64,
    /// A failed attempt is retried after a random delay in [0, this).
    pub retry_delay_ms: u64,
    /// Prefix of every key we write.
    pub key_prefix: String,
}

impl Default for RedLockConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            watchdog_lease_ms: 30_000,
            node_timeout_ms: 0,
            connect_timeout_ms: 2_000,
            retry_delay_ms: 20,
            key_prefix: "lockbench".into(),
        }
    }
}

impl fmt::Debug for RedLockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLockConfig")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("watchdog_lease_ms", &self.watchdog_lease_ms)
            .field("node_timeout_ms", &self.node_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("retry_delay_ms", &self.retry_delay_ms)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl RedLockConfig {
    /// A config for these masters, defaults otherwise.
    pub fn new(urls: Vec<String>) -> Self {
        Self {
            urls,
            ..Self::default()
        }
    }

    /// Applies `LOCKBENCH_REDLOCK_URLS` (comma-separated) over `self`.
    ///
    /// # Errors
    /// None today; the `Result` is the shape every backend's config shares.
    pub fn with_env(mut self) -> distlock::Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_REDLOCK_URLS") {
            self.urls = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
        Ok(self)
    }

    /// Checks values that would make the lock misbehave.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the bad key.
    pub fn validate(&self) -> distlock::Result<()> {
        if self.urls.is_empty() {
            return Err(distlock::Error::config(
                "redlock.urls",
                "no nodes given (e.g. urls = [\"redis://127.0.0.2:7000\", ...])",
            ));
        }
        if self.urls.len() < 3 {
            tracing::warn!(
                n = self.urls.len(),
                "RedLock with fewer than 3 nodes tolerates no failure"
            );
        }
        for u in &self.urls {
            if !u.starts_with("redis://") {
                return Err(distlock::Error::config(
                    "redlock.urls",
                    format!("{:?} is not a redis:// URL", redact(u)),
                ));
            }
        }
        if self.watchdog_lease_ms < 30 {
            return Err(distlock::Error::config(
                "redlock.watchdog_lease_ms",
                "must be at least 30 ms",
            ));
        }
        Ok(())
    }

    /// The per-node deadline for a lease: a few ms to tens of ms, so a dead
    /// node cannot eat the lease (the RedLock paper's advice).
    pub fn node_timeout(&self, lease: Duration) -> Duration {
        if self.node_timeout_ms > 0 {
            return Duration::from_millis(self.node_timeout_ms);
        }
        (lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(50))
    }

    /// Nodes that must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.urls.len() / 2 + 1
    }
}

impl distlock::descriptor::Config for RedLockConfig {
    const FAMILY: &'static str = "redlock";
    const ENV_VARS: &'static [&'static str] = &["LOCKBENCH_REDLOCK_URLS"];

    fn with_env(self) -> distlock::Result<Self> {
        RedLockConfig::with_env(self)
    }

    fn validate(&self) -> distlock::Result<()> {
        RedLockConfig::validate(self)
    }

    /// The masters, comma-separated.
    fn set_endpoint(&mut self, endpoint: &str) {
        self.urls = endpoint
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }

    fn endpoint(&self) -> String {
        self.urls.join(",")
    }
}
