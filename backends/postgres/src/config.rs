//! Configuration of the PostgreSQL locks.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnectOptions;

/// Settings for the three PostgreSQL locks: the `[postgres]` table of a
/// lockbench TOML file, or `LOCKBENCH_PG_URL`. `Debug` hides the password.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct PgConfig {
    /// `postgres://user:pass@host:port/db`; a unix socket is
    /// `postgres://user@localhost/db?host=/socket/dir` (`postgres.url`).
    pub url: String,
    /// Lease the watchdog renews when no fixed lease is asked (row and
    /// optimistic locks).
    pub watchdog_lease_ms: u64,
    /// Deadline of every statement that does not wait for a lock.
    pub op_timeout_ms: u64,
    /// Deadline for connecting.
    pub connect_timeout_ms: u64,
    /// Advisory locks: how often the connection that holds a lock is
    /// pinged; a failed ping means the session (and the lock) may be gone.
    /// Also the server's `client_connection_check_interval` on the lock's
    /// sessions (PostgreSQL 14+): how soon a waiter whose client went away
    /// (a cancelled acquire closes its connection) leaves the lock's queue.
    pub ping_interval_ms: u64,
    /// Advisory locks: the server drops a lock's session, and so frees the
    /// lock, once the client's host has answered nothing for about this
    /// long (at least this long, at most one keepalive interval more):
    /// TCP keepalives and `tcp_user_timeout`, set on each of the lock's
    /// sessions. It is also what `valid_until` is counted with. At least
    /// 1000 (keepalives count in whole seconds).
    pub dead_host_timeout_ms: u64,
    /// Row and optimistic locks: first retry delay when the lock is held
    /// (doubles, with jitter, up to `max_retry_ms`).
    pub min_retry_ms: u64,
    /// Longest retry delay.
    pub max_retry_ms: u64,
    /// Pool size for the row and optimistic locks.
    pub pool_size: u32,
    /// Advisory locks: sessions one handle may have holding or waiting
    /// for locks at once (each is one of the server's `max_connections`,
    /// 100 by default). Beyond it an acquire waits, within its budget, for
    /// one to be released, then fails naming this key: one handle that
    /// held 300 locks took 300 slots and the server refused every other
    /// client ("too many clients already").
    pub max_sessions: u32,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            watchdog_lease_ms: 30_000,
            op_timeout_ms: 2_000,
            connect_timeout_ms: 2_000,
            ping_interval_ms: 500,
            dead_host_timeout_ms: 10_000,
            min_retry_ms: 2,
            max_retry_ms: 100,
            pool_size: 4,
            max_sessions: 64,
        }
    }
}

pub use distlock::redact_url as redact;

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &redact(&self.url))
            .field("watchdog_lease_ms", &self.watchdog_lease_ms)
            .field("op_timeout_ms", &self.op_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("ping_interval_ms", &self.ping_interval_ms)
            .field("dead_host_timeout_ms", &self.dead_host_timeout_ms)
            .field("min_retry_ms", &self.min_retry_ms)
            .field("max_retry_ms", &self.max_retry_ms)
            .field("pool_size", &self.pool_size)
            .field("max_sessions", &self.max_sessions)
            .finish()
    }
}

impl PgConfig {
    /// A config for `url`, defaults otherwise.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Applies `LOCKBENCH_PG_URL` over `self`.
    ///
    /// # Errors
    /// None today; the `Result` is the shape every backend's config shares.
    pub fn with_env(mut self) -> distlock::Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_PG_URL") {
            self.url = v;
        }
        Ok(self)
    }

    /// Checks the URL and the timings.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the bad key.
    pub fn validate(&self) -> distlock::Result<()> {
        self.connect_options().map(|_| ())
    }

    /// Parses the URL and checks the timings.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the bad key.
    pub fn connect_options(&self) -> distlock::Result<PgConnectOptions> {
        if !(self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")) {
            return Err(distlock::Error::config(
                "postgres.url",
                format!("{:?} is not a postgres:// URL", redact(&self.url)),
            ));
        }
        if self.watchdog_lease_ms < 30 {
            return Err(distlock::Error::config(
                "postgres.watchdog_lease_ms",
                "must be at least 30 ms",
            ));
        }
        if self.ping_interval_ms == 0 || self.op_timeout_ms == 0 {
            return Err(distlock::Error::config(
                "postgres.ping_interval_ms",
                "ping_interval_ms and op_timeout_ms must be positive",
            ));
        }
        if self.max_sessions == 0 {
            return Err(distlock::Error::config(
                "postgres.max_sessions",
                "must be at least 1",
            ));
        }
        if self.dead_host_timeout_ms < 1000 {
            return Err(distlock::Error::config(
                "postgres.dead_host_timeout_ms",
                "must be at least 1000 ms (TCP keepalives count in whole seconds)",
            ));
        }
        let opts = PgConnectOptions::from_str(&self.url).map_err(|e| {
            distlock::Error::config("postgres.url", format!("{}: {e}", redact(&self.url)))
        })?;
        let host = distlock::bare_host(opts.get_host()).to_owned();
        Ok(opts.host(&host).application_name("lockbench"))
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub(crate) fn dead_host_timeout(&self) -> Duration {
        Duration::from_millis(self.dead_host_timeout_ms)
    }
}

impl distlock::descriptor::Config for PgConfig {
    const FAMILY: &'static str = "postgres";
    const ENV_VARS: &'static [&'static str] = &["LOCKBENCH_PG_URL"];

    fn with_env(self) -> distlock::Result<Self> {
        PgConfig::with_env(self)
    }

    fn validate(&self) -> distlock::Result<()> {
        PgConfig::validate(self)
    }

    fn set_endpoint(&mut self, endpoint: &str) {
        self.url = endpoint.trim().to_string();
    }

    fn endpoint(&self) -> String {
        self.url.clone()
    }
}
