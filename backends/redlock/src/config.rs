//! Configuration of [`crate::RedLock`].

use std::fmt;
use std::time::Duration;

use lockbench_redis::redact;
use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;

/// Settings for [`crate::RedLock`]: the `[redlock]` table of a lockbench
/// TOML file, or `LOCKBENCH_REDLOCK_URLS` (comma-separated),
/// `LOCKBENCH_REDLOCK_RETRY_POLICY`, `LOCKBENCH_REDLOCK_RETRY_DELAY_MS`,
/// `LOCKBENCH_REDLOCK_FAIR` and `LOCKBENCH_REDLOCK_WAITER_TTL_MS`.
/// `Debug` hides passwords.
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
    /// The window a lost round's random delay is drawn from (D of
    /// [`RetryPolicy`]); at least 1, below the watchdog lease, and never
    /// longer than a fixed lease's validity at run time.
    pub retry_delay_ms: u64,
    /// How the delay is drawn from that window (`redlock.retry_policy`:
    /// `"aging"`, the default, `"uniform"` or `"decorrelated"`).
    pub retry_policy: RetryPolicy,
    /// Queue the waiters (`redlock.fair`, default on): every master keeps
    /// a key's waiters in the order of the time each first asked, and a
    /// release wakes only the head, which then asks once; off, waiters
    /// retry after the spec's random delay (`retry_policy`).
    pub fair: bool,
    /// How long a queued waiter keeps its place on a master without
    /// refreshing it (`redlock.waiter_ttl_ms`); it refreshes every third.
    pub waiter_ttl_ms: u64,
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
            retry_policy: RetryPolicy::default(),
            fair: true,
            waiter_ttl_ms: 1_000,
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
            .field("retry_policy", &self.retry_policy)
            .field("fair", &self.fair)
            .field("waiter_ttl_ms", &self.waiter_ttl_ms)
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

    /// Applies `LOCKBENCH_REDLOCK_URLS` (comma-separated),
    /// `LOCKBENCH_REDLOCK_RETRY_POLICY`, `LOCKBENCH_REDLOCK_RETRY_DELAY_MS`,
    /// `LOCKBENCH_REDLOCK_FAIR` and `LOCKBENCH_REDLOCK_WAITER_TTL_MS` over
    /// `self`.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the variable whose value is not a
    /// policy or not a number.
    pub fn with_env(mut self) -> distlock::Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_REDLOCK_URLS") {
            self.urls = v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
        if let Ok(v) = std::env::var("LOCKBENCH_REDLOCK_RETRY_POLICY") {
            self.retry_policy = v.parse().map_err(|e: crate::retry::UnknownPolicy| {
                distlock::Error::config("LOCKBENCH_REDLOCK_RETRY_POLICY", e.to_string())
            })?;
        }
        env_value(
            "LOCKBENCH_REDLOCK_RETRY_DELAY_MS",
            "a number",
            &mut self.retry_delay_ms,
        )?;
        env_value("LOCKBENCH_REDLOCK_FAIR", "true or false", &mut self.fair)?;
        env_value(
            "LOCKBENCH_REDLOCK_WAITER_TTL_MS",
            "a number",
            &mut self.waiter_ttl_ms,
        )?;
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
        let mut servers: Vec<(String, u16)> = Vec::new();
        for u in &self.urls {
            if !u.starts_with("redis://") {
                return Err(distlock::Error::config(
                    "redlock.urls",
                    format!("{:?} is not a redis:// URL", redact(u)),
                ));
            }
            let info =
                redis::IntoConnectionInfo::into_connection_info(u.as_str()).map_err(|e| {
                    distlock::Error::config("redlock.urls", format!("{}: {e}", redact(u)))
                })?;
            if let redis::ConnectionAddr::Tcp(host, port) = info.addr() {
                servers.push((distlock::bare_host(host).to_ascii_lowercase(), *port));
            }
        }
        // One server listed twice (another database on it counts the same)
        // votes twice: the quorum would rest on fewer independent masters
        // than it counts, and the spec's safety argument on none.
        for (i, a) in servers.iter().enumerate() {
            if servers[..i].contains(a) {
                let host = if a.0.contains(':') {
                    format!("[{}]", a.0)
                } else {
                    a.0.clone()
                };
                return Err(distlock::Error::config(
                    "redlock.urls",
                    format!(
                        "{host}:{} is listed more than once; RedLock needs independent masters, each once",
                        a.1
                    ),
                ));
            }
        }
        if self.watchdog_lease_ms < 30 {
            return Err(distlock::Error::config(
                "redlock.watchdog_lease_ms",
                "must be at least 30 ms",
            ));
        }
        // The spec's delay is a desynchronising pause, shorter than the
        // lock's validity: 0 would be a hot spin, one as long as the lease
        // would sleep through a whole holder.
        if self.retry_delay_ms == 0 || self.retry_delay_ms >= self.watchdog_lease_ms {
            return Err(distlock::Error::config(
                "redlock.retry_delay_ms",
                format!(
                    "must be at least 1 and below redlock.watchdog_lease_ms ({}), got {}",
                    self.watchdog_lease_ms, self.retry_delay_ms
                ),
            ));
        }
        // A waiter refreshes its place every third of this: below 30 ms it
        // would spend its rounds refreshing.
        if self.fair && self.waiter_ttl_ms < 30 {
            return Err(distlock::Error::config(
                "redlock.waiter_ttl_ms",
                format!("must be at least 30 ms, got {}", self.waiter_ttl_ms),
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

/// Sets `slot` from the variable `name` if it is set; an error naming it
/// and saying it is not `what` if it does not parse.
fn env_value<T: std::str::FromStr>(name: &str, what: &str, slot: &mut T) -> distlock::Result<()> {
    if let Ok(v) = std::env::var(name) {
        *slot = v
            .trim()
            .parse()
            .map_err(|_| distlock::Error::config(name, format!("not {what}: {v:?}")))?;
    }
    Ok(())
}

impl distlock::descriptor::Config for RedLockConfig {
    const FAMILY: &'static str = "redlock";
    const ENV_VARS: &'static [&'static str] = &[
        "LOCKBENCH_REDLOCK_URLS",
        "LOCKBENCH_REDLOCK_RETRY_POLICY",
        "LOCKBENCH_REDLOCK_RETRY_DELAY_MS",
        "LOCKBENCH_REDLOCK_FAIR",
        "LOCKBENCH_REDLOCK_WAITER_TTL_MS",
    ];

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use distlock::descriptor::Descriptor;

    /// Env is process-wide: the tests that read or write it take turns.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn cfg() -> RedLockConfig {
        RedLockConfig::new(vec!["redis://127.0.0.1:7000".into()])
    }

    #[test]
    fn retry_policy_reads_from_the_table_and_defaults_to_aging() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(RedLockConfig::default().retry_policy, RetryPolicy::Aging);
        let c: RedLockConfig =
            serde_json::from_value(serde_json::json!({ "retry_policy": "uniform" })).unwrap();
        assert_eq!(c.retry_policy, RetryPolicy::Uniform);
        // As the CLI hands a `[redlock]` TOML table to the registry entry.
        let s = crate::REDLOCK
            .settings(Some(serde_json::json!({ "retry_policy": "decorrelated" })))
            .unwrap();
        assert_eq!(s["retry_policy"], "decorrelated");
    }

    #[test]
    fn a_bad_retry_policy_names_the_key_and_the_choices() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let e = crate::REDLOCK
            .settings(Some(serde_json::json!({ "retry_policy": "fifo" })))
            .unwrap_err()
            .to_string();
        assert!(e.contains("redlock.retry_policy"), "{e}");
        assert!(e.contains("\"fifo\"") && e.contains("uniform"), "{e}");
    }

    #[test]
    fn a_master_listed_twice_is_refused_naming_it() {
        for (urls, named) in [
            (
                vec![
                    "redis://127.0.0.2:7000",
                    "redis://127.0.0.3:7000",
                    "redis://127.0.0.2:7000",
                ],
                "127.0.0.2:7000",
            ),
            // Another database on the same server is the same master.
            (
                vec![
                    "redis://127.0.0.2:7000/0",
                    "redis://127.0.0.2:7000/1",
                    "redis://127.0.0.4:7000",
                ],
                "127.0.0.2:7000",
            ),
            (
                vec![
                    "redis://[::1]:6390",
                    "redis://[::1]:6391",
                    "redis://[::1]:6390",
                ],
                "[::1]:6390",
            ),
        ] {
            let mut c = cfg();
            c.urls = urls.iter().map(|u| u.to_string()).collect();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("redlock.urls") && e.contains(named), "{e}");
        }
        let mut c = cfg();
        c.urls = [
            "redis://127.0.0.2:7000",
            "redis://127.0.0.2:7001",
            "redis://[::1]:7000",
        ]
        .iter()
        .map(|u| u.to_string())
        .collect();
        c.validate().unwrap();
    }

    #[test]
    fn retry_delay_must_be_positive_and_below_the_lease() {
        for bad in [0, 30_000, 60_000] {
            let e = RedLockConfig {
                retry_delay_ms: bad,
                ..cfg()
            }
            .validate()
            .unwrap_err()
            .to_string();
            assert!(e.contains("redlock.retry_delay_ms"), "{bad}: {e}");
        }
        RedLockConfig {
            retry_delay_ms: 1,
            ..cfg()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn retry_settings_read_from_env_with_errors_naming_the_variable() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("LOCKBENCH_REDLOCK_RETRY_POLICY", "Uniform");
        std::env::set_var("LOCKBENCH_REDLOCK_RETRY_DELAY_MS", "7");
        let c = cfg().with_env();
        std::env::set_var("LOCKBENCH_REDLOCK_RETRY_POLICY", "soon");
        let bad_policy = cfg().with_env();
        std::env::remove_var("LOCKBENCH_REDLOCK_RETRY_POLICY");
        std::env::set_var("LOCKBENCH_REDLOCK_RETRY_DELAY_MS", "7ms");
        let bad_delay = cfg().with_env();
        std::env::remove_var("LOCKBENCH_REDLOCK_RETRY_DELAY_MS");
        let c = c.unwrap();
        assert_eq!(
            (c.retry_policy, c.retry_delay_ms),
            (RetryPolicy::Uniform, 7)
        );
        let e = bad_policy.unwrap_err().to_string();
        assert!(
            e.contains("LOCKBENCH_REDLOCK_RETRY_POLICY") && e.contains("aging"),
            "{e}"
        );
        let e = bad_delay.unwrap_err().to_string();
        assert!(e.contains("LOCKBENCH_REDLOCK_RETRY_DELAY_MS"), "{e}");
    }

    #[test]
    fn the_queue_is_on_by_default_and_read_from_table_and_env() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        assert!(RedLockConfig::default().fair);
        let s = crate::REDLOCK
            .settings(Some(
                serde_json::json!({ "fair": false, "waiter_ttl_ms": 600 }),
            ))
            .unwrap();
        assert_eq!(
            (&s["fair"], &s["waiter_ttl_ms"]),
            (&serde_json::json!(false), &serde_json::json!(600))
        );
        std::env::set_var("LOCKBENCH_REDLOCK_FAIR", "false");
        std::env::set_var("LOCKBENCH_REDLOCK_WAITER_TTL_MS", "90");
        let c = cfg().with_env();
        std::env::set_var("LOCKBENCH_REDLOCK_FAIR", "no");
        let bad = cfg().with_env();
        std::env::remove_var("LOCKBENCH_REDLOCK_FAIR");
        std::env::remove_var("LOCKBENCH_REDLOCK_WAITER_TTL_MS");
        let c = c.unwrap();
        assert_eq!((c.fair, c.waiter_ttl_ms), (false, 90));
        let e = bad.unwrap_err().to_string();
        assert!(e.contains("LOCKBENCH_REDLOCK_FAIR"), "{e}");
        let short = RedLockConfig {
            waiter_ttl_ms: 10,
            ..cfg()
        };
        let e = short.validate().unwrap_err().to_string();
        assert!(e.contains("redlock.waiter_ttl_ms"), "{e}");
    }
}
