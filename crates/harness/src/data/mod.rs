//! The data the ledger and coupon workloads protect, in a real PostgreSQL
//! (and, for the pre-deduct baseline, a real Redis), and the checks run on
//! it by SQL after the run.
//!
//! Every run gets its own schema (named from the run's key), so runs never
//! see each other's rows and the unique-index variant can differ per run.
//!
//! This file holds what the workloads share: the error type, the run's
//! schema name and the [`DataDb`] connection pool. Each workload's tables,
//! critical section and check live in a file of their own, re-exported
//! here: `ledger.rs` (the fenced ledger and the lost-update counter,
//! [`LedgerReport`]), `coupon.rs` (the flash sale's order transaction and
//! its invariants, [`CouponCheck`]) and `prededuct.rs` (the lock-free Redis
//! pre-deduct baseline and its stream consumer, [`consume_orders`]).

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::AssertSqlSafe;

mod coupon;
mod ledger;
mod prededuct;

pub use coupon::{home_segment, unlocks_first, uses_lock, Click, CouponCheck, Pending};
pub use ledger::{DbClockCheck, LedgerReport};
pub use prededuct::{
    consume_orders, prededuct_click, prepare_prededuct, redis_connect, ConsumerStats, PredeductKeys,
};

/// A data-store failure, naming what was being done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// PostgreSQL.
    #[error("postgres ({what}): {source}")]
    Sql {
        /// The step.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Redis.
    #[error("redis ({what}): {source}")]
    Redis {
        /// The step.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: redis::RedisError,
    },
    /// A URL or parameter is missing.
    #[error("{0}")]
    Config(String),
}

fn sql(what: &'static str) -> impl FnOnce(sqlx::Error) -> DataError {
    move |source| DataError::Sql { what, source }
}

fn red(what: &'static str) -> impl FnOnce(redis::RedisError) -> DataError {
    move |source| DataError::Redis { what, source }
}

/// The schema of one run: `lb_` + the key's letters and digits + a hash,
/// within PostgreSQL's 63-byte identifier limit.
pub fn schema_for(key: &str) -> String {
    let clean: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    let tail: String = clean
        .chars()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("lb_{tail}_{h:08x}")
}

/// A connection pool to the run's data database, in the run's schema.
#[derive(Debug, Clone)]
pub struct DataDb {
    pool: PgPool,
    schema: String,
}

/// Why a pool could not connect: "pool timed out" is all the pool says
/// when each connect fails, so one connect of our own says why (refused,
/// a bad password, ...), within 2 s.
pub(crate) async fn why_not_connected(
    opts: &sqlx::postgres::PgConnectOptions,
    pool_error: sqlx::Error,
) -> String {
    use sqlx::Connection as _;
    match tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::PgConnection::connect_with(opts),
    )
    .await
    {
        Ok(Err(direct)) => direct.to_string(),
        Ok(Ok(c)) => {
            let _ = c.close().await;
            pool_error.to_string()
        }
        Err(_) => pool_error.to_string(),
    }
}

impl DataDb {
    /// Connects (failing within seconds, naming the server).
    ///
    /// # Errors
    /// Unreachable server or bad URL.
    pub async fn connect(url: &str, key: &str, max_connections: u32) -> Result<Self, DataError> {
        let shown = || distlock::redact_url(url);
        let opts: sqlx::postgres::PgConnectOptions = url
            .parse()
            .map_err(|e| DataError::Config(format!("data database {}: {e}", shown())))?;
        let host = distlock::bare_host(opts.get_host()).to_owned();
        let opts = opts.host(&host);
        // sqlx leaves Nagle on and has no option for it: the ledger's
        // statements are timed inside the critical section, so set
        // TCP_NODELAY on each connection as it opens (as the pg backends do).
        let peers: std::sync::Arc<Vec<std::net::SocketAddr>> =
            std::sync::Arc::new(if opts.get_socket().is_some() {
                Vec::new()
            } else {
                tokio::net::lookup_host((opts.get_host(), opts.get_port()))
                    .await
                    .map(Iterator::collect)
                    .unwrap_or_default()
            });
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            // A ping before every statement would double the cost we time.
            .test_before_acquire(false)
            .after_connect(move |_, _| {
                if !peers.is_empty() {
                    lockbench_nodelay::set_on_sockets_to(&peers);
                }
                Box::pin(async { Ok(()) })
            })
            .connect_with(opts.clone())
            .await;
        let pool = match pool {
            Ok(p) => p,
            Err(e) => {
                let why = why_not_connected(&opts, e).await;
                return Err(DataError::Config(format!(
                    "data database {}: {why}",
                    shown()
                )));
            }
        };
        Ok(Self {
            pool,
            schema: schema_for(key),
        })
    }

    /// Ends every session of the pool cleanly, waiting at most `within`
    /// for connections still in use. sqlx pings a connection as it comes
    /// back to the pool, in the background: closing first keeps a server
    /// stopped right after the last check from cutting that ping (a
    /// "connection reset" warning on an otherwise clean run).
    pub async fn close(self, within: Duration) {
        if tokio::time::timeout(within, self.pool.close())
            .await
            .is_err()
        {
            tracing::debug!("data database: connections still in use after {within:?}, dropped");
        }
    }

    /// The run's schema name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    async fn batch(&self, what: &'static str, script: &str) -> Result<(), DataError> {
        sqlx::raw_sql(AssertSqlSafe(script.to_string()))
            .execute(&self.pool)
            .await
            .map_err(sql(what))?;
        Ok(())
    }
}
