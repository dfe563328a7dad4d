//! Deliberately broken locks from the seed articles: negative controls.
//!
//! They exist to prove the checkers work. A checker that does not flag them
//! under the right workload is broken. Never use them for anything else.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireOptions, Capabilities, DistLock, Guard, HeldLock, LeaseMode, Result, TokenSource,
};
use redis::Value;

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::lock::{acquire_loop, Attempt, RedisHeld, RedisLock};
use crate::node::{self, map_err, new_owner, Keys};

/// What the negative controls declare: a naive lock that thinks it has
/// leases, renewal and a lost signal, and has no token.
pub const BROKEN_CAPABILITIES: Capabilities = Capabilities {
    fencing: false,
    reentrant: false,
    fair: false,
    lost_signal: true,
    renewal: true,
    survives_failover: false,
    token_source: TokenSource::None,
};

async fn deadline<T>(
    backend: &'static str,
    conn: &Conn,
    what: &'static str,
    fut: impl std::future::Future<Output = std::result::Result<T, redis::RedisError>>,
) -> Result<T> {
    distlock::with_deadline(backend, || what.to_string(), conn.cfg.op_timeout(), async {
        fut.await.map_err(|e| map_err(backend, what, e))
    })
    .await
}

fn lease_of(conn: &Conn, opts: AcquireOptions) -> (Duration, LeaseMode) {
    LeaseMode::for_request(
        opts.lease,
        Duration::from_millis(conn.cfg.watchdog_lease_ms),
    )
}

/// `redis-setnx-expire`: `SETNX` then `PEXPIRE` as two calls (the seed's
/// second version done wrong). A crash between the two leaves a lock that
/// never expires; the extra round trip is measurable too.
#[derive(Debug)]
pub struct SetnxExpireLock {
    conn: Conn,
    owner: String,
}

impl SetnxExpireLock {
    /// Connects.
    ///
    /// # Errors
    /// As [`RedisLock::connect`].
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        Ok(Self {
            conn: Conn::connect(NAME_SETNX, cfg).await?,
            owner: new_owner(),
        })
    }
}

const NAME_SETNX: &str = "redis-setnx-expire";
const NAME_GETDEL: &str = "redis-get-del";

/// The fault point of `redis-setnx-expire`: the key is set, its expiry not
/// yet (a crash here leaves an immortal lock).
pub const AFTER_SETNX: &str = "after SETNX, before PEXPIRE";

/// The fault point of `redis-get-del`'s release: the owner checked, the
/// delete not yet sent (a pause here deletes the next holder's lock).
pub const BETWEEN_GET_AND_DEL: &str = "between GET and DEL";

#[async_trait]
impl DistLock for SetnxExpireLock {
    fn name(&self) -> &'static str {
        NAME_SETNX
    }

    fn capabilities(&self) -> Capabilities {
        BROKEN_CAPABILITIES
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        let keys = Keys::new(&self.conn.cfg.key_prefix, key);
        let (lease, mode) = lease_of(&self.conn, opts);
        let try_once = || async {
            let mut con = self.conn.con.clone();
            let got: i64 = deadline(
                NAME_SETNX,
                &self.conn,
                "SETNX",
                redis::cmd("SETNX")
                    .arg(&keys.lock)
                    .arg(&self.owner)
                    .query_async(&mut con),
            )
            .await?;
            if got == 0 {
                let pttl: i64 = deadline(
                    NAME_SETNX,
                    &self.conn,
                    "PTTL",
                    redis::cmd("PTTL").arg(&keys.lock).query_async(&mut con),
                )
                .await?;
                return Ok(Attempt::Held { pttl_ms: pttl });
            }
            // The defect: if we die here, the key never expires.
            distlock::faultpoint::reach(AFTER_SETNX).await;
            let _: i64 = deadline(
                NAME_SETNX,
                &self.conn,
                "PEXPIRE",
                redis::cmd("PEXPIRE")
                    .arg(&keys.lock)
                    .arg(distlock::millis(lease))
                    .query_async(&mut con),
            )
            .await?;
            Ok(Attempt::Acquired {
                token: None,
                held: Arc::new(RedisHeld {
                    backend: NAME_SETNX,
                    con: self.conn.con.clone(),
                    keys: keys.clone(),
                    owner: self.owner.clone(),
                    fair: None,
                }),
            })
        };
        acquire_loop(NAME_SETNX, &self.conn, key, &keys, opts, mode, try_once).await
    }
}

/// `redis-get-del`: atomic acquire, but unlock is `GET`, compare in the
/// client, then `DEL` (the seed's check-then-act race): if the lease runs
/// out between the two calls, we delete the next owner's lock.
#[derive(Debug)]
pub struct GetDelLock {
    conn: Conn,
    owner: String,
}

impl GetDelLock {
    /// Connects.
    ///
    /// # Errors
    /// As [`RedisLock::connect`].
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        Ok(Self {
            conn: Conn::connect(NAME_GETDEL, cfg).await?,
            owner: new_owner(),
        })
    }
}

struct GetDelHeld {
    conn: Conn,
    keys: Keys,
    owner: String,
}

impl std::fmt::Debug for GetDelHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetDelHeld")
            .field("lock", &self.keys.lock)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for GetDelHeld {
    async fn release(&self) -> Result<bool> {
        let mut con = self.conn.con.clone();
        let v: Option<String> = deadline(
            NAME_GETDEL,
            &self.conn,
            "GET",
            redis::cmd("GET").arg(&self.keys.lock).query_async(&mut con),
        )
        .await?;
        if v.as_deref() != Some(self.owner.as_str()) {
            return Ok(false);
        }
        // The defect: the lock may expire and change hands right here.
        distlock::faultpoint::reach(BETWEEN_GET_AND_DEL).await;
        let _: i64 = deadline(
            NAME_GETDEL,
            &self.conn,
            "DEL",
            redis::cmd("DEL").arg(&self.keys.lock).query_async(&mut con),
        )
        .await?;
        Ok(true)
    }

    async fn renew(&self, lease: Duration) -> Result<bool> {
        let mut con = self.conn.con.clone();
        deadline(
            NAME_GETDEL,
            &self.conn,
            "renew",
            node::renew(&mut con, &self.keys, &self.owner, distlock::millis(lease)),
        )
        .await
    }
}

#[async_trait]
impl DistLock for GetDelLock {
    fn name(&self) -> &'static str {
        NAME_GETDEL
    }

    fn capabilities(&self) -> Capabilities {
        BROKEN_CAPABILITIES
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        let keys = Keys::new(&self.conn.cfg.key_prefix, key);
        let (lease, mode) = lease_of(&self.conn, opts);
        let try_once = || async {
            let mut con = self.conn.con.clone();
            let set: Value = deadline(
                NAME_GETDEL,
                &self.conn,
                "SET NX PX",
                redis::cmd("SET")
                    .arg(&keys.lock)
                    .arg(&self.owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(distlock::millis(lease))
                    .query_async(&mut con),
            )
            .await?;
            if matches!(set, Value::Nil) {
                let pttl: i64 = deadline(
                    NAME_GETDEL,
                    &self.conn,
                    "PTTL",
                    redis::cmd("PTTL").arg(&keys.lock).query_async(&mut con),
                )
                .await?;
                return Ok(Attempt::Held { pttl_ms: pttl });
            }
            Ok(Attempt::Acquired {
                token: None,
                held: Arc::new(GetDelHeld {
                    conn: self.conn.clone(),
                    keys: keys.clone(),
                    owner: self.owner.clone(),
                }),
            })
        };
        acquire_loop(NAME_GETDEL, &self.conn, key, &keys, opts, mode, try_once).await
    }
}

/// `redis-short-lease`: the correct [`RedisLock`], but every acquisition
/// takes a fixed lease shorter than the critical section and nobody renews
/// it, so the lock expires while its holder is still inside.
#[derive(Debug)]
pub struct ShortLeaseLock {
    inner: RedisLock,
    lease: Duration,
}

impl ShortLeaseLock {
    /// The correct lock's guarantees, minus renewal.
    pub const CAPABILITIES: Capabilities = Capabilities {
        renewal: false,
        ..RedisLock::CAPABILITIES
    };

    /// Wraps a [`RedisLock`] with a forced fixed `lease`.
    ///
    /// # Errors
    /// As [`RedisLock::connect`].
    pub async fn connect(cfg: RedisConfig, lease: Duration) -> Result<Self> {
        Ok(Self {
            inner: RedisLock::connect(cfg).await?,
            lease,
        })
    }
}

#[async_trait]
impl DistLock for ShortLeaseLock {
    fn name(&self) -> &'static str {
        "redis-short-lease"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            renewal: false,
            ..self.inner.capabilities()
        }
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        self.inner.acquire(key, opts.with_lease(self.lease)).await
    }
}
