//! What the three PostgreSQL locks share: errors, deadlines, the schema,
//! the key hash and the retry backoff.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Error, Result};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::SqlSafeStr;

use crate::config::{redact, PgConfig};

/// Maps a driver error; an I/O failure or a timeout after sending leaves
/// the outcome unknown.
pub(crate) fn map_err(backend: &'static str, context: impl Into<String>, e: sqlx::Error) -> Error {
    let indeterminate = matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed
    );
    let context = context.into();
    if indeterminate {
        Error::indeterminate(backend, context, e)
    } else {
        Error::backend(backend, context, e)
    }
}

/// Runs a statement under a deadline; a timeout is indeterminate.
pub(crate) async fn deadline<T>(
    backend: &'static str,
    what: &str,
    limit: Duration,
    fut: impl Future<Output = std::result::Result<T, sqlx::Error>>,
) -> Result<T> {
    distlock::with_deadline(backend, || what.to_string(), limit, async {
        fut.await.map_err(|e| map_err(backend, what, e))
    })
    .await
}

/// The schema, applied with sqlx's migrator (idempotent, serialised between
/// concurrent clients by its own advisory lock).
fn migrator() -> Migrator {
    let m = |v: i64, d: &'static str, sql: &'static str| {
        Migration::new(
            v,
            Cow::Borrowed(d),
            MigrationType::Simple,
            sql.into_sql_str(),
            false,
        )
    };
    Migrator::with_migrations(vec![
        m(
            1,
            "lockbench lock tables",
            r"
CREATE SEQUENCE IF NOT EXISTS lockbench_fence;
CREATE TABLE IF NOT EXISTS lockbench_lease (
    key        text PRIMARY KEY,
    owner      text,
    token      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz
);
CREATE TABLE IF NOT EXISTS lockbench_optimistic (
    key        text PRIMARY KEY,
    owner      text,
    version    bigint NOT NULL DEFAULT 0,
    expires_at timestamptz
);
",
        ),
        m(
            2,
            "the write floor",
            r"
CREATE TABLE IF NOT EXISTS lockbench_write_floor (
    id int PRIMARY KEY,
    n  bigint NOT NULL DEFAULT 0
);
INSERT INTO lockbench_write_floor (id) VALUES (1) ON CONFLICT DO NOTHING;
",
        ),
    ])
}

/// The server's TCP addresses, for [`nodelay`]; none for a Unix socket
/// (no Nagle there) or a name that does not resolve (connecting fails and
/// says why).
pub(crate) async fn tcp_peers(opts: &PgConnectOptions) -> Arc<Vec<SocketAddr>> {
    if opts.get_socket().is_some() {
        return Arc::default();
    }
    let peers = tokio::net::lookup_host((opts.get_host(), opts.get_port()))
        .await
        .map(Iterator::collect)
        .unwrap_or_default();
    Arc::new(peers)
}

/// Turns `TCP_NODELAY` on for this process's connections to `peers`; called
/// right after each connection is opened.
///
/// sqlx 0.9 opens its socket with a bare `tokio::net::TcpStream::connect`
/// (sqlx-core 0.9.0, `src/net/socket/mod.rs`, `connect_tcp`) and has no
/// option for it, so Nagle's algorithm stays on: we set the option on the
/// socket ourselves, found by its peer address (`lockbench-nodelay`).
pub(crate) fn nodelay(peers: &[SocketAddr]) {
    if !peers.is_empty() {
        lockbench_nodelay::set_on_sockets_to(peers);
    }
}

/// Why a pool did not connect. The pool says only "timed out" when each of
/// its connects fails; one connect of our own says why (refused, not a
/// PostgreSQL server, a password). `pool_said` when that one does connect
/// or does not answer either.
async fn cause(opts: &PgConnectOptions, limit: Duration, pool_said: String) -> String {
    use sqlx::Connection as _;
    match tokio::time::timeout(limit, sqlx::PgConnection::connect_with(opts)).await {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(c)) => {
            // A clean goodbye, not an EOF in the server's log.
            let _ = c.close().await;
            pool_said
        }
        Err(_) => pool_said,
    }
}

/// Connects a pool, fails fast naming the endpoint, applies the schema.
pub(crate) async fn connect_pool(
    backend: &'static str,
    cfg: &PgConfig,
) -> Result<(PgPool, PgConnectOptions)> {
    let opts = cfg.connect_options()?;
    let shown = redact(&cfg.url);
    let peers = tcp_peers(&opts).await;
    let pool = PgPoolOptions::new()
        .max_connections(cfg.pool_size.max(1))
        // sqlx pings a connection before every checkout by default: one
        // extra round trip per lock operation. A dead connection fails the
        // statement instead, which is reported like any other failure.
        .test_before_acquire(false)
        .acquire_timeout(cfg.connect_timeout())
        // Every connection the pool opens, now or on a reconnect.
        .after_connect(move |_, _| {
            nodelay(&peers);
            Box::pin(async { Ok(()) })
        })
        .connect_with(opts.clone());
    let pool = match tokio::time::timeout(cfg.connect_timeout() * 2, pool).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            let why = cause(&opts, cfg.connect_timeout(), e.to_string()).await;
            return Err(Error::backend(
                backend,
                format!("connecting to {shown}"),
                why,
            ));
        }
        // Silent, not refusing: one more connect would only wait as long.
        Err(_) => {
            return Err(Error::backend(
                backend,
                format!("connecting to {shown}"),
                format!("no connection within {:?}", cfg.connect_timeout() * 2),
            ))
        }
    };
    let limit = cfg.op_timeout() * 5;
    match tokio::time::timeout(limit, migrator().run(&pool)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(Error::backend(
                backend,
                format!("creating the lock tables on {shown}"),
                e,
            ))
        }
        Err(_) => {
            return Err(Error::backend(
                backend,
                format!("creating the lock tables on {shown}"),
                format!("not done within {limit:?}"),
            ))
        }
    }
    Ok((pool, opts))
}

/// The advisory-lock id of a key: FNV-1a 64 of its UTF-8 bytes, as i64.
///
/// Stable across processes, versions and platforms (the ids of one key
/// must agree everywhere). Two keys whose hashes collide share one lock:
/// extra contention, never a lost exclusion. With 64 bits, a collision
/// among a million live keys has a probability of about 3e-8.
pub fn advisory_id(key: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // The bits as they are: a key id, not a quantity.
    i64::from_ne_bytes(h.to_ne_bytes())
}

/// Jittered exponential backoff between retries of a held lock.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(cfg: &PgConfig) -> Self {
        Self {
            next: Duration::from_millis(cfg.min_retry_ms.max(1)),
            max: Duration::from_millis(cfg.max_retry_ms.max(cfg.min_retry_ms.max(1))),
        }
    }

    /// The next delay: uniform in [d/2, d], then d doubles up to the cap.
    pub(crate) fn delay(&mut self) -> Duration {
        let d = self.next.mul_f64(rand::random_range(0.5..=1.0));
        self.next = (self.next * 2).min(self.max);
        d
    }
}

fn sqlx_source(e: &Error) -> Option<&sqlx::Error> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<sqlx::Error>())
}

/// Whether `e` is the server's word that our session is over: its own
/// termination codes (57P01-57P03: shutdown, crash; 08: connection
/// failure). A closed or reset connection is not: a proxy or a firewall
/// in between may have cut it while the server keeps the session (and
/// its locks) until `dead_host_timeout`.
pub(crate) fn session_ended(e: &Error) -> bool {
    sqlx_source(e).is_some_and(|s| match s {
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    })
}

/// Whether `e` is a connection that broke (an I/O error, or the server
/// ended the session), or was dead when taken from a pool or an idle list:
/// its statement either ran to its end or never will, so another
/// connection may try again. Not a timeout: a statement stalled on a live
/// connection could still land after a retry, and hold what it took.
pub(crate) fn connection_broke(e: &Error) -> bool {
    session_ended(e) || matches!(sqlx_source(e), Some(sqlx::Error::Io(_)))
}

/// Whether `e` is a connection the server could not take yet: refused
/// (nothing listens: it is restarting) or 57P03, "the database system is
/// starting up". Nothing was done either way.
pub(crate) fn refused(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        match s.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Io(io)) => return io.kind() == std::io::ErrorKind::ConnectionRefused,
            Some(sqlx::Error::Database(d)) => return d.code().as_deref() == Some("57P03"),
            _ => {}
        }
        source = s.source();
    }
    false
}
