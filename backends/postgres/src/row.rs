//! `pg-row` (a lease row, pessimistic) and `pg-optimistic` (version CAS).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts, HeldLock,
    LeaseMode, Reentrancy, Result, TokenSource,
};
use sqlx::postgres::PgPool;
use tokio::time::Instant;

use crate::common::{deadline, Backoff};
use crate::config::PgConfig;

/// Which of the two table locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    /// One `INSERT .. ON CONFLICT DO UPDATE .. WHERE free` per attempt.
    Row,
    /// Read the version, then `UPDATE .. WHERE version = v AND free`.
    Optimistic,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::Row => "pg-row",
            Flavor::Optimistic => "pg-optimistic",
        }
    }
}

/// A lock held as a row: only our own row is renewed or cleared. The row
/// is cleared, not deleted, so its counter keeps rising across holders.
struct RowHeld {
    flavor: Flavor,
    pool: PgPool,
    key: String,
    owner: String,
    version: i64,
    timeout: Duration,
}

impl std::fmt::Debug for RowHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowHeld")
            .field("flavor", &self.flavor)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for RowHeld {
    async fn release(&self) -> Result<bool> {
        let q = match self.flavor {
            Flavor::Row => sqlx::query(
                "UPDATE lockbench_lease SET owner = NULL, expires_at = NULL WHERE key = $1 AND owner = $2",
            ),
            // CAS back: only the acquisition we made, identified by its version.
            Flavor::Optimistic => sqlx::query(
                "UPDATE lockbench_optimistic SET owner = NULL, expires_at = NULL \
                 WHERE key = $1 AND owner = $2 AND version = $3",
            ),
        };
        let q = q.bind(&self.key).bind(&self.owner).bind(self.version);
        let r = deadline(
            self.flavor.name(),
            "release",
            self.timeout,
            q.execute(&self.pool),
        )
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn renew(&self, lease: Duration) -> Result<bool> {
        let q = match self.flavor {
            Flavor::Row => sqlx::query(
                "UPDATE lockbench_lease SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE key = $1 AND owner = $2 AND token = $4",
            ),
            Flavor::Optimistic => sqlx::query(
                "UPDATE lockbench_optimistic SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE key = $1 AND owner = $2 AND version = $4",
            ),
        };
        let q = q
            .bind(&self.key)
            .bind(&self.owner)
            .bind(lease.as_millis() as f64)
            .bind(self.version);
        let r = deadline(
            self.flavor.name(),
            "renew",
            self.timeout,
            q.execute(&self.pool),
        )
        .await?;
        Ok(r.rows_affected() == 1)
    }
}

/// The shared machinery of the two table locks.
struct TableLock {
    flavor: Flavor,
    cfg: Arc<PgConfig>,
    pool: PgPool,
    owner: String,
    reentry: Reentrancy,
}

impl TableLock {
    async fn connect(flavor: Flavor, cfg: PgConfig) -> Result<Self> {
        let (pool, _) = crate::common::connect_pool(flavor.name(), &cfg).await?;
        Ok(Self {
            flavor,
            cfg: Arc::new(cfg),
            pool,
            owner: format!("{:032x}", rand::random::<u128>()),
            reentry: Reentrancy::default(),
        })
    }

    /// One attempt; `Some(version)` if we got it. Expiry is judged by the
    /// DATABASE clock (`now()`), never the client's.
    async fn attempt(
        &self,
        key: &str,
        lease: Duration,
        round_trips: &mut u32,
    ) -> Result<Option<i64>> {
        let name = self.flavor.name();
        let t = self.cfg.op_timeout();
        let ms = lease.as_millis() as f64;
        match self.flavor {
            Flavor::Row => {
                *round_trips += 1;
                deadline(
                    name,
                    "acquire",
                    t,
                    sqlx::query_scalar::<_, i64>(
                        "INSERT INTO lockbench_lease AS l (key, owner, token, expires_at) \
                         VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond') \
                         ON CONFLICT (key) DO UPDATE \
                         SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at \
                         WHERE l.owner IS NULL OR l.expires_at < now() \
                         RETURNING token",
                    )
                    .bind(key)
                    .bind(&self.owner)
                    .bind(ms)
                    .fetch_optional(&self.pool),
                )
                .await
            }
            Flavor::Optimistic => {
                *round_trips += 1;
                let seen: Option<(i64, bool)> = deadline(
                    name,
                    "read version",
                    t,
                    sqlx::query_as(
                        "SELECT version, owner IS NULL OR expires_at < now() \
                         FROM lockbench_optimistic WHERE key = $1",
                    )
                    .bind(key)
                    .fetch_optional(&self.pool),
                )
                .await?;
                let version = match seen {
                    Some((_, false)) => return Ok(None),
                    Some((v, true)) => v,
                    None => {
                        *round_trips += 1;
                        deadline(
                            name,
                            "create row",
                            t,
                            sqlx::query("INSERT INTO lockbench_optimistic (key) VALUES ($1) ON CONFLICT DO NOTHING")
                                .bind(key)
                                .execute(&self.pool),
                        )
                        .await?;
                        0
                    }
                };
                *round_trips += 1;
                let r = deadline(
                    name,
                    "CAS",
                    t,
                    sqlx::query(
                        "UPDATE lockbench_optimistic \
                         SET owner = $2, version = version + 1, expires_at = now() + $3 * interval '1 millisecond' \
                         WHERE key = $1 AND version = $4 AND (owner IS NULL OR expires_at < now())",
                    )
                    .bind(key)
                    .bind(&self.owner)
                    .bind(ms)
                    .bind(version)
                    .execute(&self.pool),
                )
                .await?;
                Ok((r.rows_affected() == 1).then_some(version + 1))
            }
        }
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        if let Some(g) = self.reentry.reenter(key) {
            return Ok(g);
        }
        let (lease, mode) = LeaseMode::for_request(
            opts.lease,
            Duration::from_millis(self.cfg.watchdog_lease_ms),
        );
        let start = Instant::now();
        let deadline_at = opts.wait.map(|w| start + w);
        let mut backoff = Backoff::new(&self.cfg);
        let mut round_trips = 0;
        loop {
            let invoked_at = Instant::now();
            if let Some(version) = self.attempt(key, lease, &mut round_trips).await? {
                let g = Guard::new(GuardParts {
                    key: key.to_string(),
                    token: u64::try_from(version).ok().map(FencingToken),
                    held: Arc::new(RowHeld {
                        flavor: self.flavor,
                        pool: self.pool.clone(),
                        key: key.to_string(),
                        owner: self.owner.clone(),
                        version,
                        timeout: self.cfg.op_timeout(),
                    }),
                    lease: mode,
                    invoked_at,
                    round_trips,
                });
                self.reentry.register(&g);
                return Ok(g);
            }
            let now = Instant::now();
            let Some(until) = deadline_at.filter(|d| now < *d) else {
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: start.elapsed(),
                });
            };
            tokio::time::sleep(backoff.delay().min(until - now)).await;
        }
    }

    /// `sql` twice on one pooled connection (a floor probe).
    async fn twice(&self, sql: &'static str) -> Result<()> {
        let name = self.flavor.name();
        let t = self.cfg.op_timeout();
        let mut conn = deadline(name, "pool", t, self.pool.acquire()).await?;
        for _ in 0..2 {
            deadline(name, sql, t, sqlx::query(sql).execute(&mut *conn)).await?;
        }
        Ok(())
    }

    async fn floor_round_trip(&self) -> Result<()> {
        self.twice("SELECT 1").await
    }

    /// A one-row write, committed durably: what each acquire and release of
    /// this lock is at the least.
    async fn write_floor_round_trip(&self) -> Result<()> {
        self.twice("UPDATE lockbench_write_floor SET n = n + 1 WHERE id = 1")
            .await
    }
}

const TABLE_CAPABILITIES: Capabilities = Capabilities {
    fencing: true,
    reentrant: true,
    fair: false,
    lost_signal: true,
    renewal: true,
    survives_failover: false,
    token_source: TokenSource::RowVersion,
};

macro_rules! table_lock {
    ($(#[$doc:meta])* $name:ident, $flavor:expr) => {
        $(#[$doc])*
        pub struct $name(TableLock);

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)).field("cfg", &self.0.cfg).finish_non_exhaustive()
            }
        }

        impl $name {
            /// What it declares.
            pub const CAPABILITIES: Capabilities = TABLE_CAPABILITIES;

            /// Connects a pool and creates the tables (idempotent).
            ///
            /// # Errors
            /// Bad config (naming the key) or unreachable server (naming it).
            pub async fn connect(cfg: PgConfig) -> Result<Self> {
                Ok(Self(TableLock::connect($flavor, cfg).await?))
            }

            /// The raw floor: two `SELECT 1` on one pooled connection.
            ///
            /// # Errors
            /// As any statement.
            pub async fn floor_round_trip(&self) -> Result<()> {
                self.0.floor_round_trip().await
            }

            /// The floor of a lock whose acquire and release each write a
            /// row: two autocommit one-row `UPDATE`s (each a new tuple
            /// version, WAL and a flush at commit).
            ///
            /// # Errors
            /// As any statement.
            pub async fn write_floor_round_trip(&self) -> Result<()> {
                self.0.write_floor_round_trip().await
            }
        }

        #[async_trait]
        impl DistLock for $name {
            fn name(&self) -> &'static str {
                $flavor.name()
            }

            fn capabilities(&self) -> Capabilities {
                Self::CAPABILITIES
            }

            async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
                self.0.acquire(key, opts).await
            }
        }
    };
}

table_lock!(
    /// `pg-row`: a lease row taken with one `INSERT .. ON CONFLICT DO UPDATE
    /// .. WHERE owner IS NULL OR expires_at < now()`; the database clock
    /// decides expiry; the token is the row's counter, bumped on every
    /// acquisition; renewal and release touch only our own row.
    PgRowLock,
    Flavor::Row
);

table_lock!(
    /// `pg-optimistic`: read the row's version, then `UPDATE .. WHERE
    /// version = $v AND (owner IS NULL OR expires_at < now())`; the affected
    /// row count is the verdict; lost races retry with jittered exponential
    /// backoff (the round trips per acquisition show the retry storm).
    PgOptimisticLock,
    Flavor::Optimistic
);
