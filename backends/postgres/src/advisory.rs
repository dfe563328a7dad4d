//! `pg-advisory`: session-level advisory locks, one dedicated session per
//! acquisition.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    drift, AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts,
    HeldLock, LeaseHandle, LeaseMode, LostReason, Result, TokenSource,
};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::time::Instant;

use crate::common::{advisory_id, connection_broke, deadline, map_err, refused, session_ended};
use crate::config::{redact, PgConfig};

const BACKEND: &str = "pg-advisory";

/// Sessions ready for the next acquisition.
///
/// Invariant: a session is put here only when it holds NO advisory lock.
/// Advisory locks are reentrant per session, so a session put back while
/// holding one would let the next acquisition through this handle "take"
/// the same lock again: two holders, one of them a stranger.
type Idle = Arc<Mutex<Vec<PgConnection>>>;

/// Idle sessions a handle keeps; more are closed as they come back. Each
/// holds one of the server's connection slots (`max_connections`, 100 by
/// default): a handle that once held 200 locks at once kept 200 sessions,
/// and other clients were refused ("too many clients already").
const IDLE_KEPT: usize = 16;

/// Puts a session that holds no advisory lock back on `idle`, or closes it
/// (by dropping it) when enough are kept already.
fn keep_idle(idle: &Idle, conn: PgConnection) {
    if let Ok(mut v) = idle.lock() {
        if v.len() < IDLE_KEPT {
            v.push(conn);
        }
    }
}

/// The session of one acquisition, shared by its guard and its pinger.
type Slot = Arc<tokio::sync::Mutex<Option<PgConnection>>>;

/// `pg_advisory_lock` on a dedicated session.
///
/// An advisory lock belongs to the database SESSION that took it, lives
/// until that session unlocks it or ends, and is reentrant within the
/// session. So every acquisition runs on a session of its own, which holds
/// nothing else, and keeps it until release: two tasks sharing this handle
/// wait for each other in the server as two clients do. A session goes back
/// to the handle's idle list only once it is known to hold no lock (after
/// an unlock that returned true, a try-lock that said no, or a wait that
/// timed out); on any other outcome it is closed, which ends the session
/// and frees whatever it held. For the same reason a transaction-mode
/// pooler (PgBouncer) breaks this lock.
///
/// Waiting is done by the server (`pg_advisory_lock` under `lock_timeout`):
/// no polling; the token is `nextval` of a sequence taken after the lock,
/// in the same round trip.
///
/// A cancelled acquire drops its session's connection: the server ends the
/// session at once if it was idle or holding, and within
/// `client_connection_check_interval` (= `ping_interval_ms`, PostgreSQL
/// 14+) if it was still queued in `pg_advisory_lock`. On older servers a
/// queued session stays until it is granted the lock, which it then frees
/// as soon as it finds its client gone (one round trip).
///
/// # What `valid_until` guarantees
///
/// Each of the lock's sessions is opened with TCP keepalives and
/// `tcp_user_timeout` set so that the server drops it once the client's
/// host has been silent for `dead_host_timeout_ms` (a dead or cut-off host
/// frees its locks in that time, plus at most one keepalive interval), and
/// with `idle_session_timeout` off. So the server never ends the session on
/// its own earlier than `dead_host_timeout_ms` after the last statement it
/// received from us. `valid_until` is that instant for the last statement
/// known to have arrived (the acquire, then each ping that succeeded),
/// minus the drift allowance: a bound on every way the SERVER lets the lock
/// go by itself. It is NOT a bound on what others do to the session: an
/// operator's `pg_terminate_backend`, a crash or restart of the server, or a
/// pooler frees the lock at once, and the holder learns it only after the
/// fact, from [`Guard::lost`] at the next ping (within `ping_interval_ms`
/// of a broken session; a server that stops answering keeps the session,
/// so that is a loss only once `valid_until` passes). Only the fencing
/// token protects a resource against that window. A holder that merely
/// stops (a paused process on a live host) keeps its lock: its kernel still
/// answers the keepalives.
pub struct PgAdvisoryLock {
    cfg: Arc<PgConfig>,
    opts: PgConnectOptions,
    /// The server's TCP addresses, for `TCP_NODELAY` on each new session.
    peers: Arc<Vec<std::net::SocketAddr>>,
    idle: Idle,
    /// One permit per session holding or waiting for a lock
    /// (`postgres.max_sessions`).
    sessions: Arc<tokio::sync::Semaphore>,
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
    conn: Slot,
    idle: Idle,
    pinger: Mutex<Option<tokio::task::JoinHandle<()>>>,
    timeout: Duration,
    /// This acquisition's place among the handle's sessions, given back
    /// when the lock is.
    _permit: tokio::sync::OwnedSemaphorePermit,
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
        // Taken out of the slot for good: whatever happens below, this
        // session never serves this acquisition again.
        let Some(mut conn) = self.conn.lock().await.take() else {
            return Ok(false);
        };
        let held = match deadline(BACKEND, "pg_advisory_unlock", self.timeout, async {
            sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1)")
                .bind(self.id)
                .fetch_one(&mut conn)
                .await
        })
        .await
        {
            Ok(held) => held,
            // The server ended the session (it shut down, crashed or was
            // restarted): the lock went with it, so it is not ours to give
            // back — a known answer, not an unknown one.
            Err(e) if session_ended(&e) => return Ok(false),
            Err(e) => return Err(e),
        };
        // The session took this one lock once, on a session that held
        // nothing, so after an unlock that found it, it holds nothing. An
        // unlock that did not find it means that picture is wrong: the
        // session is closed rather than trusted.
        if held {
            keep_idle(&self.idle, conn);
        }
        // On an error or `false` the connection is dropped here, which
        // ends the session and frees anything it still held.
        Ok(held)
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "lease renewal (an advisory lock lives as long as its session)".into(),
        })
    }
}

/// No connection within the connect timeout.
#[derive(Debug, thiserror::Error)]
#[error("no connection within {0:?}")]
struct ConnectTimedOut(Duration);

fn connect_timed_out(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<ConnectTimedOut>().is_some() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Pings the lock's session; each ping that succeeds moves `valid_until`
/// to its send time + `dead_host` (minus drift); the first failure marks
/// the lock lost.
async fn ping(
    conn: Slot,
    lease: LeaseHandle,
    first: Duration,
    every: Duration,
    timeout: Duration,
    dead_host: Duration,
) {
    let mut wait = first;
    loop {
        // Never past what we vouch for: a ping that cannot be answered
        // in time is a loss at `valid_until`, not a ping interval and a
        // request deadline later.
        let until = lease.valid_until();
        tokio::time::sleep_until((Instant::now() + wait).min(until)).await;
        wait = every;
        let mut slot = conn.lock().await;
        let Some(c) = slot.as_mut() else { return };
        let sent = Instant::now();
        let left = lease.valid_until().saturating_duration_since(sent);
        if left.is_zero() {
            lease.mark_lost(LostReason::RenewalFailed);
            return;
        }
        match tokio::time::timeout(timeout.min(left), sqlx::query("SELECT 1").execute(&mut *c))
            .await
        {
            Ok(Ok(_)) => {
                lease.set_valid_until(sent + dead_host.saturating_sub(drift(dead_host)));
            }
            // The session broke (reset, terminated, the server restarted):
            // its locks went with it.
            Ok(Err(_)) => {
                lease.mark_lost(LostReason::SessionEnded);
                return;
            }
            // No answer (a stalled server, a slow network): the server keeps
            // the session, and the lock, until `valid_until` at the least;
            // lost only once that has passed unconfirmed. It was marked
            // ended at the first slow ping, though the lock survived.
            Err(_) => {
                if Instant::now() >= lease.valid_until() {
                    lease.mark_lost(LostReason::RenewalFailed);
                    return;
                }
            }
        }
    }
}

/// The settings every session of the lock is opened with (startup
/// parameters: no extra round trip), for a server of `version`
/// (`server_version_num`).
fn session_options(base: PgConnectOptions, cfg: &PgConfig, version: u32) -> PgConnectOptions {
    let d = cfg.dead_host_timeout();
    // Keepalives count in whole seconds. Probing starts after half the
    // budget of silence; `tcp_user_timeout` (Linux, PostgreSQL 12+) then
    // drops the connection at the first probe tick at or after the full
    // budget, whether the silence is of unanswered probes or of unacked
    // data. Without it, idle + interval * count is still >= the budget.
    let secs = u64::try_from(d.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1);
    let idle = (secs / 2).max(1);
    let interval = (secs / 10).max(1);
    let count = secs.saturating_sub(idle).div_ceil(interval).max(1);
    let mut opts: Vec<(&str, String)> = vec![
        ("tcp_keepalives_idle", idle.to_string()),
        ("tcp_keepalives_interval", interval.to_string()),
        ("tcp_keepalives_count", count.to_string()),
    ];
    if version >= 120_000 {
        opts.push(("tcp_user_timeout", d.as_millis().to_string()));
    }
    if version >= 140_000 {
        // A queued waiter whose client is gone (a cancelled acquire)
        // leaves the queue within this, instead of at its lock_timeout.
        opts.push((
            "client_connection_check_interval",
            cfg.ping_interval_ms.to_string(),
        ));
        // A server-wide idle_session_timeout would end a holder's session
        // between two pings, earlier than valid_until promises.
        opts.push(("idle_session_timeout", "0".to_string()));
    }
    base.options(opts)
}

impl PgAdvisoryLock {
    /// What `pg-advisory` declares. `reentrant`: through
    /// [`Guard::reenter`] only; a second acquire through the handle is
    /// another owner on another session. No lease (`renewal: false`): the
    /// lock lives as long as its session, which the server drops after
    /// `dead_host_timeout_ms` of silence from the client's host; see
    /// [`PgAdvisoryLock`] for what `valid_until` bounds and what it does
    /// not (`pg_terminate_backend`). The token comes from a sequence,
    /// which is WAL-logged and never goes back across a server restart.
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
        // Which session settings this server knows decides the options.
        let version = deadline(BACKEND, "server version", cfg.op_timeout(), pool.acquire())
            .await
            .map(|c| c.server_version_num().unwrap_or(0));
        pool.close().await;
        let opts = session_options(opts, &cfg, version?);
        let sessions = Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(cfg.max_sessions).unwrap_or(usize::MAX),
        ));
        let lock = Self {
            sessions,
            cfg: Arc::new(cfg),
            peers: crate::common::tcp_peers(&opts).await,
            opts,
            idle: Arc::default(),
        };
        let conn = lock.open().await?;
        lock.give_back(conn);
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
            Ok(Ok(c)) => {
                crate::common::nodelay(&self.peers);
                Ok(c)
            }
            Ok(Err(e)) => Err(Error::backend(BACKEND, format!("connecting to {shown}"), e)),
            Err(_) => Err(Error::backend(
                BACKEND,
                format!("connecting to {shown}"),
                ConnectTimedOut(self.cfg.connect_timeout()),
            )),
        }
    }

    /// A session that holds no advisory lock: an idle one, or a new one;
    /// and whether it was idle (it may have died since: a restart, a cut).
    async fn take_one(&self) -> Result<(PgConnection, bool)> {
        self.take_one_by(None).await
    }

    /// [`Self::take_one`], a new session opened as [`Self::open_by`] does.
    async fn take_one_by(&self, deadline: Option<Instant>) -> Result<(PgConnection, bool)> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        match idle {
            Some(c) => Ok((c, true)),
            None => Ok((self.open_by(deadline).await?, false)),
        }
    }

    /// A new session; a connection the server could not take (refused,
    /// starting up, reset while it shut down, no answer in time: a restart
    /// or a stall; no session exists, so nothing was done) is tried again
    /// until `deadline`, an acquire's wait budget: waiters gave up at once
    /// during a 0.5 s restart, and 0.3 s into a 3 s one (reset by peer).
    async fn open_by(&self, deadline: Option<Instant>) -> Result<PgConnection> {
        loop {
            match self.open().await {
                Err(e) if refused(&e) || connection_broke(&e) || connect_timed_out(&e) => {
                    let now = Instant::now();
                    match deadline {
                        Some(d) if now < d => {
                            let nap = Duration::from_millis(rand::random_range(50..150));
                            tokio::time::sleep(nap.min(d - now)).await;
                        }
                        _ => return Err(e),
                    }
                }
                r => return r,
            }
        }
    }

    /// A place for one more session holding or waiting for a lock: at
    /// once, or once another acquisition of this handle gives one back
    /// before `deadline`; else an error naming `postgres.max_sessions`.
    async fn session_slot(
        &self,
        deadline: Option<Instant>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let sessions = self.sessions.clone();
        let got = match deadline {
            None => sessions.try_acquire_owned().ok(),
            Some(d) => tokio::time::timeout_at(d, sessions.acquire_owned())
                .await
                .ok()
                .and_then(|r| r.ok()),
        };
        got.ok_or_else(|| {
            Error::config(
                "postgres.max_sessions",
                format!(
                    "all {} sessions of this handle hold or wait for advisory locks (each is one of the server's connections); release some, or raise it",
                    self.cfg.max_sessions
                ),
            )
        })
    }

    async fn take(&self) -> Result<PgConnection> {
        Ok(self.take_one().await?.0)
    }

    /// Only for a session known to hold no advisory lock (see [`Idle`]).
    fn give_back(&self, conn: PgConnection) {
        keep_idle(&self.idle, conn);
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

    /// The backend pid of the session holding `key`'s lock (for fault
    /// injection with `pg_terminate_backend`).
    ///
    /// # Errors
    /// [`Error::NotHeld`] if no session holds it.
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
            .bind((id >> 32) & 0xffff_ffff)
            .bind(id & 0xffff_ffff)
            .fetch_optional(&mut conn),
        )
        .await?;
        self.give_back(conn);
        pid.ok_or_else(|| Error::NotHeld {
            key: key.to_string(),
        })
    }

    /// One attempt on `conn`, a session that holds no advisory lock.
    /// `Ok(Some(token))`: granted. `Ok(None)`: definitely not granted, and
    /// the session still holds nothing. `Err`: the session may hold the
    /// lock, so the caller must close it, never reuse it.
    async fn attempt(
        &self,
        conn: &mut PgConnection,
        id: i64,
        wait: Option<Duration>,
    ) -> Result<Option<i64>> {
        match wait {
            None => deadline(
                BACKEND,
                "pg_try_advisory_lock",
                self.cfg.op_timeout(),
                sqlx::query_scalar(
                    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('lockbench_fence') END, \
                     set_config('synchronous_commit', 'on', true)",
                )
                .bind(id)
                .fetch_one(&mut *conn),
            )
            .await,
            Some(w) => {
                // The server queues us and wakes us on unlock; lock_timeout
                // is the wait budget. Five statements, one round trip, one
                // implicit transaction, committed with synchronous_commit on
                // (as the try-lock's): a server running it off (volatile)
                // would lose the sequence's advance in a crash and hand the
                // same tokens out again; the flush comes once per 32
                // tokens, when nextval logs ahead. lock_timeout is back at 0 before
                // nextval runs, so a 55P03 (lock_not_available) can only
                // come from the advisory wait, i.e. mean "not granted". Any
                // other error may come after the grant, and a session lock
                // outlives the statement's rollback: the caller closes the
                // session then. The id is an integer, so formatting it into
                // the SQL is safe.
                // Rounded up: a budget is never cut short.
                let ms = w.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128);
                let sql = format!(
                    "SET lock_timeout = {ms}; SELECT pg_advisory_lock({id}); \
                     SET lock_timeout = 0; SELECT set_config('synchronous_commit', 'on', true); \
                     SELECT nextval('lockbench_fence')"
                );
                let limit = w.saturating_add(self.cfg.op_timeout());
                let r = tokio::time::timeout(
                    limit,
                    sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(&mut *conn),
                )
                .await;
                match r {
                    Ok(Ok(rows)) => match rows.last() {
                        Some(row) => row
                            .try_get::<i64, _>(0)
                            .map(Some)
                            .map_err(|e| map_err(BACKEND, "pg_advisory_lock", e)),
                        None => Err(Error::backend(
                            BACKEND,
                            "pg_advisory_lock",
                            "the server returned no token",
                        )),
                    },
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
                        format!("no reply within {limit:?}"),
                    )),
                }
            }
        }
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
        distlock::check_key(BACKEND, key)?;
        if opts.lease.is_some() {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "fixed leases (an advisory lock lives as long as its session)".into(),
            });
        }
        let id = advisory_id(key);
        // This acquisition's own session, holding nothing. Everything it may
        // take lives in this connection: if this future is dropped
        // (cancelled) anywhere below, the connection is dropped with it and
        // the server ends the session (see the type's doc): the equivalent
        // of `distlock::Pending` for a lock that is a session.
        let asked_at = Instant::now();
        let budget = opts.wait.map(|w| distlock::deadline_after(asked_at, w));
        let permit = self.session_slot(budget).await?;
        let (mut conn, was_idle) = self.take_one_by(budget).await?;
        let invoked_at = Instant::now();
        let wait = opts
            .wait
            .map(|w| w.saturating_sub(asked_at.elapsed()))
            .filter(|w| !w.is_zero());
        let mut outcome = self.attempt(&mut conn, id, wait).await;
        // A dead idle session says so (reset, EOF, the server's own
        // code); one that got no answer met a server that does not answer,
        // and a fresh session would only wait for it again, past the
        // caller's budget.
        let broke = matches!(&outcome, Err(e) if connection_broke(e) || refused(e));
        if was_idle && broke {
            // A session kept idle from before a server restart is dead, and
            // so, most likely, are the others: each would fail one acquire.
            // Close them all and try once on a fresh session, within what
            // is left of the wait. The failed session is closed here too,
            // freeing whatever it might have taken.
            if let Ok(mut idle) = self.idle.lock() {
                idle.clear();
            }
            conn = self.open_by(budget).await?;
            let left = wait.map(|w| w.saturating_sub(invoked_at.elapsed()));
            outcome = self
                .attempt(&mut conn, id, left.filter(|w| !w.is_zero()))
                .await;
        }
        let token = match outcome {
            Ok(Some(t)) => t,
            Ok(None) => {
                self.give_back(conn);
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: asked_at.elapsed(),
                });
            }
            // The session may hold the lock: dropping the connection here
            // ends it, which frees the lock.
            Err(e) => return Err(e),
        };
        let conn: Slot = Arc::new(tokio::sync::Mutex::new(Some(conn)));
        let held = Arc::new(AdvisoryHeld {
            id,
            key: key.to_string(),
            conn: conn.clone(),
            idle: self.idle.clone(),
            pinger: Mutex::new(None),
            timeout: self.cfg.op_timeout(),
            _permit: permit,
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
        let dead_host = self.cfg.dead_host_timeout();
        // The acquire statement is the last one known to have reached the
        // server (its reply only proves the server sent, not that it heard
        // from us since).
        let valid_until = invoked_at + dead_host.saturating_sub(drift(dead_host));
        let lease = guard.lease_handle();
        lease.set_valid_until(valid_until);
        // After a wait nearly as long as dead_host the guard would arrive
        // with little or nothing vouched for: ping at once to renew it.
        let first = if valid_until.saturating_duration_since(Instant::now()) < every * 2 {
            Duration::ZERO
        } else {
            every
        };
        let task = tokio::spawn(ping(
            conn,
            lease,
            first,
            every,
            self.cfg.op_timeout(),
            dead_host,
        ));
        if let Ok(mut p) = held.pinger.lock() {
            *p = Some(task);
        }
        Ok(guard)
    }
}
