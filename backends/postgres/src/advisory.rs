//! `pg-advisory`: session-level advisory locks, one dedicated connection
//! per held lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts, HeldLock,
    LeaseHandle, LeaseMode, LostReason, Reentrancy, Result, TokenSource,
};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::time::Instant;

use crate::common::{advisory_id, deadline, map_err};
use crate::config::{redact, PgConfig};

const BACKEND: &str = "pg-advisory";

/// Connections that hold no lock, ready for the next acquisition.
type Idle = Arc<Mutex<Vec<PgConnection>>>;

/// `pg_advisory_lock` on a dedicated session.
///
/// An advisory lock belongs to the database SESSION that took it and lives
/// until that session unlocks it or ends. So each held lock owns its
/// connection until release: a pooled connection handed back to a pool
/// while holding the lock would leak it to the next borrower (who then
/// "holds" it too), and a pool that recycles the connection silently drops
/// the lock. For the same reason a transaction-mode pooler (PgBouncer)
/// breaks this lock. Connection loss is lock loss: a ping on the lock's
/// connection every `ping_interval_ms` turns it into `lost()`.
///
/// Waiting is done by the server (`pg_advisory_lock` under `lock_timeout`):
/// no polling; the token is `nextval` of a sequence taken in the same
/// statement, after the lock.
pub struct PgAdvisoryLock {
    cfg: Arc<PgConfig>,
    opts: PgConnectOptions,
    idle: Idle,
    reentry: Reentrancy,
}

impl std::fmt::Debug for PgAdvisoryLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisoryLock")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

struct AdvisoryHeld {
    id: i64,
    key: String,
    conn: Arc<tokio::sync::Mutex<Option<PgConnection>>>,
    idle: Idle,
    pinger: Mutex<Option<tokio::task::JoinHandle<()>>>,
    timeout: Duration,
}

impl std::fmt::Debug for AdvisoryHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryHeld")
            .field("key", &self.key)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for AdvisoryHeld {
    async fn release(&self) -> Result<bool> {
        if let Ok(mut p) = self.pinger.lock() {
            if let Some(t) = p.take() {
                t.abort();
            }
        }
        let mut slot = self.conn.lock().await;
        let Some(mut conn) = slot.take() else {
            return Ok(false);
        };
        let r = deadline(BACKEND, "pg_advisory_unlock", self.timeout, async {
            sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1)")
                .bind(self.id)
                .fetch_one(&mut conn)
                .await
        })
        .await;
        match r {
            Ok(held) => {
                if let Ok(mut idle) = self.idle.lock() {
                    idle.push(conn);
                }
                Ok(held)
            }
            // The connection is dropped, which ends the session and so
            // frees the lock server-side if it still existed.
            Err(e) => Err(e),
        }
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "lease renewal (an advisory lock lives as long as its session)".into(),
        })
    }
}

/// Pings the lock's connection; the first failure marks the lock lost.
async fn ping(
    conn: Arc<tokio::sync::Mutex<Option<PgConnection>>>,
    lease: LeaseHandle,
    every: Duration,
    timeout: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let mut slot = conn.lock().await;
        let Some(c) = slot.as_mut() else { return };
        let ok = matches!(
            tokio::time::timeout(timeout, sqlx::query("SELECT 1").execute(&mut *c)).await,
            Ok(Ok(_))
        );
        if ok {
            lease.set_valid_until(Instant::now() + every);
        } else {
            lease.mark_lost(LostReason::SessionEnded);
            return;
        }
    }
}

impl PgAdvisoryLock {
    /// What `pg-advisory` declares.
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        reentrant: true,
        fair: false,
        lost_signal: true,
        renewal: false,
        survives_failover: false,
        token_source: TokenSource::Sequence,
    };

    /// Connects (one session, kept idle for the first acquisition) and
    /// creates the schema.
    ///
    /// # Errors
    /// Bad config (naming the key) or unreachable server (naming it).
    pub async fn connect(cfg: PgConfig) -> Result<Self> {
        let (pool, opts) = crate::common::connect_pool(
            BACKEND,
            &PgConfig {
                pool_size: 1,
                ..cfg.clone()
            },
        )
        .await?;
        pool.close().await;
        let lock = Self {
            cfg: Arc::new(cfg),
            opts,
            idle: Arc::default(),
            reentry: Reentrancy::default(),
        };
        let conn = lock.open().await?;
        if let Ok(mut idle) = lock.idle.lock() {
            idle.push(conn);
        }
        Ok(lock)
    }

    async fn open(&self) -> Result<PgConnection> {
        let shown = redact(&self.cfg.url);
        match tokio::time::timeout(
            self.cfg.connect_timeout(),
            PgConnection::connect_with(&self.opts),
        )
        .await
        {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(Error::backend(BACKEND, format!("connecting to {shown}"), e)),
            Err(_) => Err(Error::backend(
                BACKEND,
                format!("connecting to {shown}"),
                format!("no connection within {:?}", self.cfg.connect_timeout()),
            )),
        }
    }

    async fn take(&self) -> Result<PgConnection> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        match idle {
            Some(c) => Ok(c),
            None => self.open().await,
        }
    }

    fn give_back(&self, conn: PgConnection) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    /// The raw floor: two `SELECT 1` round trips on a session like the
    /// ones locks are taken on.
    ///
    /// # Errors
    /// As any statement.
    pub async fn floor_round_trip(&self) -> Result<()> {
        let mut conn = self.take().await?;
        for _ in 0..2 {
            deadline(
                BACKEND,
                "SELECT 1",
                self.cfg.op_timeout(),
                sqlx::query("SELECT 1").execute(&mut conn),
            )
            .await?;
        }
        self.give_back(conn);
        Ok(())
    }

    /// The backend pid of the session holding `guard`'s lock (for fault
    /// injection with `pg_terminate_backend`).
    ///
    /// # Errors
    /// If the guard's session is gone.
    pub async fn holder_pid(&self, key: &str) -> Result<i32> {
        let id = advisory_id(key);
        let mut conn = self.take().await?;
        let pid: Option<i32> = deadline(
            BACKEND,
            "pg_locks",
            self.cfg.op_timeout(),
            sqlx::query_scalar(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2",
            )
            .bind(i64::from((id as u64 >> 32) as u32))
            .bind(i64::from(id as u64 as u32))
            .fetch_optional(&mut conn),
        )
        .await?;
        self.give_back(conn);
        pid.ok_or_else(|| Error::NotHeld {
            key: key.to_string(),
        })
    }
}

#[async_trait]
impl DistLock for PgAdvisoryLock {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        if opts.lease.is_some() {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "fixed leases (an advisory lock lives as long as its session)".into(),
            });
        }
        if let Some(g) = self.reentry.reenter(key) {
            return Ok(g);
        }
        let id = advisory_id(key);
        let mut conn = self.take().await?;
        let invoked_at = Instant::now();
        let wait = opts.wait.filter(|w| !w.is_zero());
        let token: Result<Option<i64>> = match wait {
            None => deadline(
                BACKEND,
                "pg_try_advisory_lock",
                self.cfg.op_timeout(),
                sqlx::query_scalar(
                    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('lockbench_fence') END",
                )
                .bind(id)
                .fetch_one(&mut conn),
            )
            .await,
            Some(w) => {
                // The server queues us and wakes us on unlock; lock_timeout
                // is the wait budget. Both in one round trip; the id is an
                // integer, so formatting it into the SQL is safe.
                let ms = w.as_millis().max(1);
                let sql = format!(
                    "SET lock_timeout = {ms}; \
                     SELECT nextval('lockbench_fence') FROM (SELECT pg_advisory_lock({id})) AS l"
                );
                let r = tokio::time::timeout(
                    w + self.cfg.op_timeout(),
                    sqlx::raw_sql(AssertSqlSafe(sql)).fetch_one(&mut conn),
                )
                .await;
                match r {
                    Ok(Ok(row)) => row
                        .try_get::<i64, _>(0)
                        .map(Some)
                        .map_err(|e| map_err(BACKEND, "pg_advisory_lock", e)),
                    Ok(Err(e))
                        if e.as_database_error().and_then(|d| d.code()).as_deref()
                            == Some("55P03") =>
                    {
                        Ok(None)
                    }
                    Ok(Err(e)) => Err(map_err(BACKEND, "pg_advisory_lock", e)),
                    Err(_) => Err(Error::indeterminate(
                        BACKEND,
                        "pg_advisory_lock",
                        format!("no reply within {:?}", w + self.cfg.op_timeout()),
                    )),
                }
            }
        };
        let token = match token {
            Ok(Some(t)) => t,
            Ok(None) => {
                self.give_back(conn);
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: invoked_at.elapsed(),
                });
            }
            // The session may hold the lock; dropping it frees it.
            Err(e) => return Err(e),
        };
        let conn = Arc::new(tokio::sync::Mutex::new(Some(conn)));
        let held = Arc::new(AdvisoryHeld {
            id,
            key: key.to_string(),
            conn: conn.clone(),
            idle: self.idle.clone(),
            pinger: Mutex::new(None),
            timeout: self.cfg.op_timeout(),
        });
        let guard = Guard::new(GuardParts {
            key: key.to_string(),
            token: u64::try_from(token).ok().map(FencingToken),
            held: held.clone(),
            lease: LeaseMode::Managed,
            invoked_at,
            round_trips: 1,
        });
        let every = Duration::from_millis(self.cfg.ping_interval_ms);
        let lease = guard.lease_handle();
        lease.set_valid_until(invoked_at + every);
        let task = tokio::spawn(ping(conn, lease, every, self.cfg.op_timeout()));
        if let Ok(mut p) = held.pinger.lock() {
            *p = Some(task);
        }
        self.reentry.register(&guard);
        Ok(guard)
    }
}
