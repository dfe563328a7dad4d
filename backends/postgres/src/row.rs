//! `pg-row` (a lease row, pessimistic) and `pg-optimistic` (version CAS).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts, HeldLock,
    LeaseMode, Result, TokenSource,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgQueryResult, Postgres};
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

/// One acquisition of a row lock: what its guard releases and renews, and
/// what its `Pending` withdraws if the acquire never returns. The owner
/// value is unique to this acquisition (never shared by two acquisitions of
/// one handle), and a guard's release and renewal also match the token it
/// got, so nothing done for this acquisition can touch a later one. The
/// token is max(last + 1, the database clock in µs): it keeps rising across
/// holders, across a crash that lost the last commits (a server with
/// `synchronous_commit = off`) and after a row deleted by hand.
struct RowHeld {
    flavor: Flavor,
    pool: PgPool,
    key: String,
    owner: String,
    /// The token (row counter or version) this acquisition got; `None`
    /// while it is in flight, when the owner alone identifies it.
    token: Option<i64>,
    timeout: Duration,
    /// The pool's size: how many kept connections a retry may meet broken.
    pool_size: u32,
    /// While the acquisition is in flight: the pooled connection its
    /// statements run on. A withdrawal after a cancelled statement runs on
    /// the same session, so it queues behind that statement instead of
    /// overtaking it on another connection and missing the row it writes.
    conn: tokio::sync::Mutex<Option<PoolConnection<Postgres>>>,
}

impl std::fmt::Debug for RowHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowHeld")
            .field("flavor", &self.flavor)
            .field("key", &self.key)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl RowHeld {
    /// Runs `q` on the acquisition's own connection if it still has one,
    /// else (or if that one fails) on the pool, on another pooled connection
    /// while they come out broken (kept from before a server restart: the
    /// pool does not test them), for up to one op timeout. With whether an
    /// earlier try failed, so may have landed.
    async fn run(
        &self,
        what: &str,
        q: impl Fn() -> sqlx::query::Query<'static, Postgres, PgArguments>,
    ) -> Result<(PgQueryResult, bool)> {
        let name = self.flavor.name();
        let start = Instant::now();
        let mut unsure = false;
        let own = self.conn.lock().await.take();
        if let Some(mut conn) = own {
            match deadline(name, what, self.timeout, q().execute(&mut *conn)).await {
                Ok(r) => return Ok((r, false)),
                Err(e) => {
                    unsure = true;
                    tracing::debug!(key = %self.key, error = %e, "{what} on the acquisition's connection failed; again on the pool")
                }
            }
        }
        let mut tries = 0;
        loop {
            match deadline(name, what, self.timeout, q().execute(&self.pool)).await {
                Ok(r) => return Ok((r, unsure)),
                Err(e)
                    if crate::common::connection_broke(&e)
                        && tries < self.pool_size
                        && start.elapsed() < self.timeout =>
                {
                    tries += 1;
                    unsure = true;
                    tracing::debug!(key = %self.key, error = %e, "{what} retried on another connection");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[async_trait]
impl HeldLock for RowHeld {
    async fn release(&self) -> Result<bool> {
        let (key, owner, token) = (self.key.clone(), self.owner.clone(), self.token);
        let sql = match (self.flavor, token) {
            // Only while the lease runs: a release after it ran out says
            // false (as Redis's does, the key being gone), even when nobody
            // took the row since; the expired row is free to take anyway.
            (Flavor::Row, Some(_)) => {
                "UPDATE lockbench_lease SET owner = NULL, expires_at = NULL \
                 WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()"
            }
            // CAS back: only the acquisition we made, identified by its version.
            (Flavor::Optimistic, Some(_)) => {
                "UPDATE lockbench_optimistic SET owner = NULL, expires_at = NULL \
                 WHERE key = $1 AND owner = $2 AND version = $3 AND expires_at > now()"
            }
            // A withdrawal: the owner is this acquisition's alone.
            (Flavor::Row, None) => {
                "UPDATE lockbench_lease SET owner = NULL, expires_at = NULL \
                 WHERE key = $1 AND owner = $2"
            }
            (Flavor::Optimistic, None) => {
                "UPDATE lockbench_optimistic SET owner = NULL, expires_at = NULL \
                 WHERE key = $1 AND owner = $2"
            }
        };
        let (r, unsure) = self
            .run("release", || {
                let q = sqlx::query(sql).bind(key.clone()).bind(owner.clone());
                match token {
                    Some(t) => q.bind(t),
                    None => q,
                }
            })
            .await?;
        match r.rows_affected() {
            1 => Ok(true),
            // Not ours now; but a try that failed may have been the one that
            // released it, so "it was not ours" would be a guess.
            _ if unsure => Err(Error::indeterminate(
                self.flavor.name(),
                format!("release {}", self.key),
                "an earlier try failed with its connection, and the row is no longer ours: that try may have released it",
            )),
            _ => Ok(false),
        }
    }

    async fn renew(&self, lease: Duration) -> Result<bool> {
        // Only a guard renews, and a guard always has its token.
        let Some(token) = self.token else {
            return Ok(false);
        };
        let sql = match self.flavor {
            Flavor::Row => {
                "UPDATE lockbench_lease SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE key = $1 AND owner = $2 AND token = $4 AND expires_at > now()"
            }
            Flavor::Optimistic => {
                "UPDATE lockbench_optimistic SET expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE key = $1 AND owner = $2 AND version = $4 AND expires_at > now()"
            }
        };
        // A try that landed left the row ours: a retry matches it again.
        let (r, _) = self
            .run("renew", || {
                sqlx::query(sql)
                    .bind(self.key.clone())
                    .bind(self.owner.clone())
                    .bind(lease.as_millis() as f64)
                    .bind(token)
            })
            .await?;
        Ok(r.rows_affected() == 1)
    }
}

/// Whether `e` is a passing state of the server (stalled: no reply in
/// time; restarting: refused, starting up, no connection from the pool):
/// within a wait budget a wait, not an answer. Waiters gave up 1.3-2.4 s
/// into a 3 s stall or restart with 20 s to go.
fn passing(e: &Error) -> bool {
    e.is_indeterminate() || crate::common::connection_broke(e) || crate::common::refused(e)
}

/// The shared machinery of the two table locks.
struct TableLock {
    flavor: Flavor,
    cfg: Arc<PgConfig>,
    pool: PgPool,
}

impl TableLock {
    async fn connect(flavor: Flavor, cfg: PgConfig) -> Result<Self> {
        let (pool, _) = crate::common::connect_pool(flavor.name(), &cfg).await?;
        Ok(Self {
            flavor,
            cfg: Arc::new(cfg),
            pool,
        })
    }

    /// One attempt for the acquisition `held`, on a pooled connection kept
    /// in `held` while its statements run; `Some(token)` if we got it.
    /// Expiry is judged by the DATABASE clock (`now()`), never the
    /// client's. On success or a definite no the connection goes back to
    /// the pool; on an error it stays with `held` for the withdrawal.
    async fn attempt(
        &self,
        held: &RowHeld,
        lease: Duration,
        round_trips: &mut u32,
    ) -> Result<Option<i64>> {
        let name = self.flavor.name();
        let t = self.cfg.op_timeout();
        let mut slot = held.conn.lock().await;
        let conn = match slot.as_mut() {
            Some(c) => c,
            None => slot.insert(deadline(name, "pool", t, self.pool.acquire()).await?),
        };
        let r = self
            .statements(&mut *conn, &held.key, &held.owner, lease, round_trips)
            .await;
        if r.is_ok() {
            // Back to the pool while we back off.
            slot.take();
        }
        r
    }

    async fn statements(
        &self,
        conn: &mut PgConnection,
        key: &str,
        owner: &str,
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
                         VALUES ($1, $2, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
                                 now() + $3 * interval '1 millisecond') \
                         ON CONFLICT (key) DO UPDATE \
                         SET owner = EXCLUDED.owner, token = GREATEST(l.token + 1, EXCLUDED.token), \
                             expires_at = EXCLUDED.expires_at \
                         WHERE l.owner IS NULL OR l.expires_at < now() OR l.owner = EXCLUDED.owner \
                         RETURNING token",
                    )
                    .bind(key)
                    .bind(owner)
                    .bind(ms)
                    .fetch_optional(&mut *conn),
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
                        "SELECT version, owner IS NULL OR expires_at < now() OR owner = $2 \
                         FROM lockbench_optimistic WHERE key = $1",
                    )
                    .bind(key)
                    .bind(owner)
                    .fetch_optional(&mut *conn),
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
                                .execute(&mut *conn),
                        )
                        .await?;
                        0
                    }
                };
                *round_trips += 1;
                deadline(
                    name,
                    "CAS",
                    t,
                    sqlx::query_scalar::<_, i64>(
                        "UPDATE lockbench_optimistic \
                         SET owner = $2, \
                             version = GREATEST(version + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint), \
                             expires_at = now() + $3 * interval '1 millisecond' \
                         WHERE key = $1 AND version = $4 AND (owner IS NULL OR expires_at < now() OR owner = $2) \
                         RETURNING version",
                    )
                    .bind(key)
                    .bind(owner)
                    .bind(ms)
                    .bind(version)
                    .fetch_optional(&mut *conn),
                )
                .await
            }
        }
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        distlock::check_request(self.flavor.name(), key, &opts)?;
        // The key is a `text` column, which cannot hold NUL: say so, instead
        // of the server's "invalid byte sequence for encoding" on a write.
        if key.contains('\0') {
            return Err(Error::Unsupported {
                backend: self.flavor.name(),
                what: format!(
                    "the key {key:?}: a NUL character in a key (stored as PostgreSQL text)"
                ),
            });
        }
        let deadline = opts
            .wait
            .map(|w| distlock::deadline_after(Instant::now(), w));
        let mut backoff = Backoff::new(&self.cfg);
        // An attempt that failed in doubt is withdrawn by its owner; a new
        // one goes on.
        distlock::retry_within_budget(
            key,
            deadline,
            passing,
            |e, _| {
                tracing::debug!(key, error = %e, "acquire waits through a passing failure");
                backoff.delay()
            },
            // Every attempt is its own owner: a value no other acquisition,
            // of this handle or any other, ever writes (a statement sent
            // into a stall lands late; under the same owner it took the
            // row back from our own later attempt, or after our release).
            // Its `Pending` is armed before the first statement goes out:
            // if this future is dropped, or ends not knowing whether its
            // write landed, the row it may have taken is cleared in the
            // background.
            || {
                std::future::ready(Ok(Arc::new(RowHeld {
                    flavor: self.flavor,
                    pool: self.pool.clone(),
                    key: key.to_string(),
                    owner: format!("{:032x}", rand::random::<u128>()),
                    token: None,
                    timeout: self.cfg.op_timeout(),
                    pool_size: self.cfg.pool_size,
                    conn: tokio::sync::Mutex::new(None),
                })))
            },
            |inflight: Arc<RowHeld>| async move {
                let attempt = AcquireOptions {
                    wait: deadline.map(|d| d.saturating_duration_since(Instant::now())),
                    ..opts
                };
                self.acquire_as(&inflight, attempt).await
            },
        )
        .await
    }

    async fn acquire_as(&self, inflight: &RowHeld, opts: AcquireOptions) -> Result<Guard> {
        let key = inflight.key.as_str();
        let (lease, mode) = LeaseMode::for_request(
            opts.lease,
            Duration::from_millis(self.cfg.watchdog_lease_ms),
        );
        let start = Instant::now();
        let deadline_at = opts.wait.map(|w| distlock::deadline_after(start, w));
        let mut backoff = Backoff::new(&self.cfg);
        let mut round_trips = 0;
        // A pooled connection kept from before a server restart fails its
        // first statement (the pool does not test them: a round trip per
        // checkout). Another one, or a new one, goes through: retried, a few
        // times, within the wait (or one op timeout for a try-lock). The
        // owner is this acquisition's alone, so an attempt whose reply was
        // lost but did land is taken again, not waited out.
        let budget = opts.wait.unwrap_or_default().max(self.cfg.op_timeout());
        let mut retries = 0;
        loop {
            let invoked_at = Instant::now();
            let got = match self.attempt(inflight, lease, &mut round_trips).await {
                Err(e)
                    if crate::common::connection_broke(&e)
                        && retries <= self.cfg.pool_size
                        && start.elapsed() < budget =>
                {
                    retries += 1;
                    tracing::debug!(key, error = %e, "acquire retried on another connection");
                    // The broken connection goes (the pool closes it).
                    inflight.conn.lock().await.take();
                    continue;
                }
                other => other?,
            };
            if let Some(token) = got {
                return Ok(Guard::new(GuardParts {
                    key: key.to_string(),
                    token: u64::try_from(token).ok().map(FencingToken),
                    held: Arc::new(RowHeld {
                        flavor: self.flavor,
                        pool: self.pool.clone(),
                        key: key.to_string(),
                        owner: inflight.owner.clone(),
                        token: Some(token),
                        timeout: self.cfg.op_timeout(),
                        pool_size: self.cfg.pool_size,
                        conn: tokio::sync::Mutex::new(None),
                    }),
                    lease: mode,
                    invoked_at,
                    round_trips,
                }));
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

    /// `sql` twice (a floor probe), each sent the way the cycle's own
    /// statement in that place is: the first as an acquire's (a connection
    /// checked out of the pool under one deadline, the statement under
    /// another, the connection back to the pool), the second as a
    /// release's (on the pool, checkout and statement under one deadline).
    async fn twice(&self, sql: &'static str) -> Result<()> {
        let name = self.flavor.name();
        let t = self.cfg.op_timeout();
        let mut conn = deadline(name, "pool", t, self.pool.acquire()).await?;
        deadline(name, sql, t, sqlx::query(sql).execute(&mut *conn)).await?;
        drop(conn);
        deadline(name, sql, t, sqlx::query(sql).execute(&self.pool)).await?;
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

            /// The raw floor: two `SELECT 1` through the pool, as an
            /// acquire's and a release's statements go.
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
