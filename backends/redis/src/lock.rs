//! `RedisLock`: SET NX PX + INCR token in one script, compare-and-delete
//! release, compare-and-pexpire renewal; waiters queue in arrival order
//! and a release wakes only the next (or, with `redis.fair = false`, every
//! waiter of the key through pub/sub).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts, HeldLock,
    LeaseMode, Result, TokenSource,
};
use tokio::time::Instant;

use crate::client::Con;
use crate::config::RedisConfig;
use crate::conn::{Conn, Turn};
use crate::node::{self, map_err, FairEntry, Keys, Reply};

/// One try of an acquisition.
pub(crate) enum Attempt {
    /// We got it.
    Acquired {
        token: Option<u64>,
        held: Arc<dyn HeldLock>,
    },
    /// Somebody holds it; the lock's remaining TTL in ms (-1: no expiry,
    /// -2: already gone).
    Held { pttl_ms: i64 },
}

/// The guard of an acquisition that just succeeded.
fn guard(
    key: &str,
    token: Option<u64>,
    held: Arc<dyn HeldLock>,
    lease: LeaseMode,
    invoked_at: Instant,
    round_trips: u32,
) -> Guard {
    Guard::new(GuardParts {
        key: key.to_string(),
        token: token.map(FencingToken),
        held,
        lease,
        invoked_at,
        round_trips,
    })
}

/// Leaves the key's channel when the waiter goes, however it goes.
struct Listening {
    conn: Conn,
    channel: String,
}

impl Drop for Listening {
    fn drop(&mut self) {
        if self.conn.notifier.leave(&self.channel) {
            let mut con = self.conn.con.clone();
            let channel = std::mem::take(&mut self.channel);
            let t = self.conn.cfg.op_timeout();
            // Off the acquire path: nobody waits for the unsubscribe.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = tokio::time::timeout(t, con.unsubscribe(&channel)).await;
                });
            }
        }
    }
}

/// The deadline of a wait that may go on at `now` (a try just found the
/// lock held), or the timeout: `give_up` runs first (a fair waiter leaves
/// its queue there), then the error is made, so its `waited` counts that
/// too. One place for both wait loops, so that they time out alike: a
/// try-lock (`deadline` `None`) and a spent budget end the same way.
async fn wait_deadline<G, GFut>(
    key: &str,
    start: Instant,
    deadline: Option<Instant>,
    now: Instant,
    give_up: G,
) -> Result<Instant>
where
    G: FnOnce() -> GFut,
    GFut: Future<Output = ()>,
{
    if let Some(deadline) = deadline.filter(|d| now < *d) {
        return Ok(deadline);
    }
    give_up().await;
    Err(Error::Timeout {
        key: key.to_string(),
        waited: start.elapsed(),
    })
}

/// Whether `e` is a refused connection: the request never left.
fn refused(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<redis::RedisError>() {
            return r.is_connection_refusal();
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = s.source();
    }
    false
}

/// Whether a refusal proves nothing was sent, so the same attempt may go
/// on. Not on a Cluster: its client re-sends after a dropped connection or
/// a timeout, and the error seen is the last try's, so a refusal can follow
/// a first try that ran (the attempt is then withdrawn and a new one made).
fn sent_nothing(conn: &Conn) -> bool {
    !matches!(conn.con, crate::client::Con::Cluster(_))
}

/// Whether `e` is a passing state of the deployment, not an answer about
/// the key: a connection dropped or refused, no reply in time (a stalled
/// or hung server), or a server saying "not now" (a slot migrating:
/// TRYAGAIN; a failover under way: MOVED to a dead master, CLUSTERDOWN,
/// MASTERDOWN, READONLY; a restart: LOADING). Waiters gave up 50-135 ms
/// into a 2.5 s Cluster failover, at once in a slot migration, and 1 s
/// into a hung primary that Sentinel replaced 2.6 s later.
fn passing(e: &Error) -> bool {
    if matches!(
        e,
        Error::Backend {
            indeterminate: true,
            ..
        }
    ) {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<redis::RedisError>() {
            use redis::RetryMethod as M;
            return r.is_connection_dropped()
                || r.is_timeout()
                || matches!(
                    r.kind(),
                    redis::ErrorKind::ClusterConnectionNotFound
                        | redis::ErrorKind::MasterNameNotFoundBySentinel
                )
                || matches!(
                    r.retry_method(),
                    M::WaitAndRetry | M::MovedRedirect | M::AskRedirect | M::RefreshSlotsAndRetry
                );
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            return matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::TimedOut
            );
        }
        source = s.source();
    }
    false
}

/// After the `tries`-th try that failed on a passing state (a server
/// restarting, a failover moving the address, a stall): within a wait
/// budget it is a wait, not an answer (waiters gave up 0.2 s into a 0.5 s
/// restart). Sleeps a little and returns `Ok` to try again, or gives the
/// error back once the budget is spent (or there is none: a try-lock
/// answers at once).
async fn retry_within(e: Error, deadline: Option<Instant>, tries: u32) -> Result<()> {
    match deadline {
        Some(d) if Instant::now() < d => {
            nap_within(d, tries).await;
            Ok(())
        }
        _ => Err(e),
    }
}

/// The nap before the `tries`-th new try ([`nap_for`]), never past
/// `deadline`.
async fn nap_within(deadline: Instant, tries: u32) {
    let nap = nap_for(tries);
    tokio::time::sleep(nap.min(deadline.saturating_duration_since(Instant::now()))).await;
}

/// The nap before the `tries`-th new try: 50-150 ms, doubling from the
/// third try up to 0.4-1.2 s.
fn nap_for(tries: u32) -> Duration {
    let base = 100u64 << tries.saturating_sub(2).min(3);
    Duration::from_millis(rand::random_range(base / 2..base * 3 / 2))
}

/// The wait loop shared by every Redis lock: try; if held and we may wait,
/// subscribe to the key's release channel, then sleep until a release
/// message, the holder's TTL, or a jittered fallback, within the budget.
pub(crate) async fn acquire_loop<F, Fut>(
    backend: &'static str,
    conn: &Conn,
    key: &str,
    keys: &Keys,
    opts: AcquireOptions,
    lease: LeaseMode,
    mut try_once: F,
) -> Result<Guard>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    let start = Instant::now();
    let deadline = opts.wait.map(|w| distlock::deadline_after(start, w));
    let mut round_trips = 0u32;
    let mut listening: Option<(Listening, Arc<tokio::sync::Notify>)> = None;
    loop {
        // Armed before the try, so a release between try and sleep still wakes us.
        let mut wake = listening
            .as_ref()
            .map(|(_, n)| Box::pin(n.clone().notified_owned()));
        if let Some(w) = wake.as_mut() {
            w.as_mut().enable();
        }
        let invoked_at = Instant::now();
        let attempt = try_once().await;
        round_trips += 1;
        let attempt = match attempt {
            Err(e) if refused(&e) && sent_nothing(conn) => {
                retry_within(e, deadline, 1).await?;
                continue;
            }
            other => other,
        };
        let pttl_ms = match attempt? {
            Attempt::Acquired { token, held } => {
                return Ok(guard(key, token, held, lease, invoked_at, round_trips))
            }
            Attempt::Held { pttl_ms } => pttl_ms,
        };
        let now = Instant::now();
        let deadline = wait_deadline(key, start, deadline, now, || async {}).await?;
        if listening.is_none() {
            let (notify, first) = conn.notifier.join(&keys.channel);
            let guard = Listening {
                conn: conn.clone(),
                channel: keys.channel.clone(),
            };
            if first {
                let mut con = conn.con.clone();
                let ch = keys.channel.clone();
                round_trips += 1;
                distlock::with_deadline(
                    backend,
                    || format!("SUBSCRIBE {ch}"),
                    conn.cfg.op_timeout(),
                    async {
                        con.subscribe(&ch)
                            .await
                            .map_err(|e| map_err(backend, "SUBSCRIBE", e))
                    },
                )
                .await?;
            }
            listening = Some((guard, notify));
            // The holder may have released before we subscribed: try again now.
            continue;
        }
        let fallback = Duration::from_millis(conn.cfg.max_retry_interval_ms)
            .mul_f64(rand::random_range(0.5..1.5));
        let mut nap = fallback.min(deadline - now);
        if pttl_ms > 0 {
            nap = nap.min(Duration::from_millis(pttl_ms.unsigned_abs()));
        } else if pttl_ms == -2 {
            nap = Duration::ZERO;
        }
        match wake.as_mut() {
            Some(w) => {
                tokio::select! {
                    _ = w.as_mut() => {}
                    _ = tokio::time::sleep(nap) => {}
                }
            }
            None => tokio::time::sleep(nap).await,
        }
    }
}

/// The fair wait: one try; if it is not our turn and we may wait, we are
/// queued (the script did it) and sleep until a release names us on our
/// client's wake channel, refreshing our place every third of the waiter
/// TTL meanwhile. Waking only the head is what keeps a hot key's
/// throughput flat as waiters are added.
async fn acquire_fair_loop<F, Fut>(
    backend: &'static str,
    conn: &Conn,
    key: &str,
    opts: AcquireOptions,
    lease: LeaseMode,
    held: &RedisHeld,
    mut try_once: F,
) -> Result<Guard>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    let start = Instant::now();
    let deadline = opts.wait.map(|w| distlock::deadline_after(start, w));
    // A try-lock never queues (ttl 0): it must not hold up the waiters.
    let waiter_ttl_ms = if deadline.is_some() {
        conn.cfg.waiter_ttl_ms
    } else {
        0
    };
    let refresh = Duration::from_millis(conn.cfg.waiter_ttl_ms / 3);
    let mut round_trips = 0u32;
    // Registered before the first try when the client already listens, so
    // a turn announced between our try and our sleep is kept (a permit),
    // and a contended acquire costs two round trips: queue, then take.
    let mut turn: Option<Turn> =
        (deadline.is_some() && conn.wake_ready()).then(|| conn.notifier.await_turn(&held.owner));
    loop {
        let invoked_at = Instant::now();
        let attempt = try_once(waiter_ttl_ms).await;
        round_trips += 1;
        let attempt = match attempt {
            Err(e) if refused(&e) && sent_nothing(conn) => {
                retry_within(e, deadline, 1).await?;
                continue;
            }
            other => other,
        };
        let pttl_ms = match attempt? {
            Attempt::Acquired { token, held } => {
                return Ok(guard(key, token, held, lease, invoked_at, round_trips))
            }
            Attempt::Held { pttl_ms } => pttl_ms,
        };
        let now = Instant::now();
        let deadline = wait_deadline(key, start, deadline, now, || async {
            if waiter_ttl_ms > 0 {
                // Leave the queue now: our place would otherwise hold up
                // the waiter behind us until it expired.
                if let Err(e) = held.release().await {
                    tracing::debug!(%key, error = %e, "leaving the queue failed; the place expires");
                }
            }
        })
        .await?;
        let Some(t) = turn.as_ref() else {
            turn = Some(conn.notifier.await_turn(&held.owner));
            if conn.subscribe_wake(backend).await? {
                round_trips += 1;
            }
            // Our turn may have been announced before we listened.
            continue;
        };
        let mut nap = refresh
            .mul_f64(rand::random_range(0.8..1.0))
            .min(deadline - now);
        if pttl_ms > 0 {
            // A holder that dies announces nothing: try when its lease ends.
            nap = nap.min(Duration::from_millis(pttl_ms.unsigned_abs()));
        }
        tokio::select! {
            _ = t.notify.notified() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// The server side of a held Redis lock.
pub(crate) struct RedisHeld {
    pub backend: &'static str,
    pub con: Con,
    pub keys: Keys,
    pub owner: String,
    /// The acquisition's fair queue entry (`None`: the unfair lock).
    pub fair: Option<FairEntry>,
}

impl std::fmt::Debug for RedisHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisHeld")
            .field("lock", &self.keys.lock)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for RedisHeld {
    // The deadline of these calls is the connection's response timeout
    // (`RedisConfig::response_timeout`): a second timer per call measurably
    // slows the cycle. The floor (`Conn::ping_twice`) is sent the same way.
    async fn release(&self) -> Result<bool> {
        let mut con = self.con.clone();
        match &self.fair {
            // Also how a fair waiter that gives up leaves the queue.
            Some(me) => node::release_fair(&mut con, &self.keys, me).await,
            None => node::release(&mut con, &self.keys, &self.owner).await,
        }
        .map_err(|e| map_err(self.backend, format!("release {}", self.keys.lock), e))
    }

    async fn renew(&self, lease: Duration) -> Result<bool> {
        let mut con = self.con.clone();
        node::renew(&mut con, &self.keys, &self.owner, distlock::millis(lease))
            .await
            .map_err(|e| map_err(self.backend, format!("renew {}", self.keys.lock), e))
    }
}

/// A single-node Redis lock, Redisson-style: one owner handle per instance.
///
/// Acquire = one Lua script (`SET NX PX` + `INCR` fencing counter); release
/// = Lua compare-and-delete. Waiters queue in that same script (FIFO, a
/// newcomer never barges) and sleep until the release names them on their
/// client's wake channel: one waiter woken per release, not all of them. With no fixed lease the
/// distlock watchdog renews `watchdog_lease_ms` every third of it.
/// `wait_replicas > 0` adds `WAIT` in the same round trip (the `redis-wait`
/// backend). One handle may be shared by many tasks: every acquisition
/// writes its own owner value, so tasks exclude each other and a late
/// release can only ever delete its own acquisition's lock. Reentrancy goes
/// through [`Guard::reenter`].
pub struct RedisLock {
    name: &'static str,
    conn: Conn,
}

impl std::fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLock")
            .field("name", &self.name)
            .field("cfg", &self.conn.cfg)
            .finish_non_exhaustive()
    }
}

impl RedisLock {
    /// What `redis` and `redis-wait` declare (with `redis.fair`, the
    /// default, they are also FIFO: see [`RedisLock::capabilities`]).
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        reentrant: true,
        fair: true,
        lost_signal: true,
        renewal: true,
        // Replication is asynchronous: a failover can lose the lock and the
        // counter, even with WAIT (it is not a consensus write).
        survives_failover: false,
        // Seeded from the server clock (see `node`'s acquire script), so it
        // survives a restart without persistence.
        token_source: TokenSource::Counter,
    };

    /// Connects one owner handle.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad setting, [`Error::Backend`] naming the
    /// endpoint when it cannot be reached within `connect_timeout_ms`.
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        let name = if cfg.wait_replicas > 0 {
            "redis-wait"
        } else if matches!(cfg.deployment()?, crate::config::Deployment::Cluster { .. }) {
            "redis-cluster"
        } else {
            "redis"
        };
        let conn = Conn::connect(name, cfg).await?;
        Ok(Self { name, conn })
    }

    /// The Redis key holding the lock for `key` (for tests and operators).
    pub fn lock_key(&self, key: &str) -> String {
        Keys::new(&self.conn.cfg.key_prefix, key).lock
    }

    /// The raw floor of one lock cycle: two PINGs on this connection; on a
    /// cluster, to the master of the slot `slot_of` gave for the key.
    ///
    /// # Errors
    /// As any request.
    pub async fn floor_round_trip(&self, slot: Option<u16>) -> Result<()> {
        self.conn.ping_twice(slot).await
    }

    /// The cluster slot of `key`'s lock (`None` unless on a Redis Cluster),
    /// for [`RedisLock::floor_round_trip`].
    ///
    /// # Errors
    /// As any request.
    pub async fn slot_of(&self, key: &str) -> Result<Option<u16>> {
        let lock_key = self.lock_key(key);
        let mut con = self.conn.con.clone();
        con.slot_of(&lock_key)
            .await
            .map_err(|e| map_err(self.name, "CLUSTER KEYSLOT", e))
    }

    /// Where requests go now: the primary's `host:port` behind Sentinel
    /// (it changes when the lock follows a failover), else `None`.
    pub fn sentinel_primary(&self) -> Option<String> {
        match &self.conn.con {
            Con::Sentinel(s) => Some(s.primary()),
            _ => None,
        }
    }

    fn held(&self, keys: &Keys, owner: &str) -> RedisHeld {
        let cfg = &self.conn.cfg;
        RedisHeld {
            backend: self.name,
            con: self.conn.con.clone(),
            keys: keys.clone(),
            owner: owner.to_string(),
            fair: cfg
                .fair
                .then(|| FairEntry::new(&cfg.key_prefix, &self.conn.client_id, owner)),
        }
    }

    /// One try; a fair waiter (`waiter_ttl_ms > 0`) that does not get the
    /// lock is queued, or refreshes its place, in the same script.
    async fn try_once(
        &self,
        keys: &Keys,
        held: &Arc<RedisHeld>,
        lease: Duration,
        waiter_ttl_ms: u64,
    ) -> Result<Attempt> {
        let backend = self.name;
        let cfg = &self.conn.cfg;
        let px = distlock::millis(lease);
        let reply = if cfg.wait_replicas == 0 {
            // Deadline: the connection's response timeout, no timer of ours.
            let mut con = self.conn.con.clone();
            match &held.fair {
                Some(me) => node::acquire_fair(&mut con, keys, me, px, waiter_ttl_ms).await,
                None => node::acquire(&mut con, keys, &held.owner, px).await,
            }
            .map_err(|e| map_err(backend, format!("acquire {}", keys.lock), e))?
        } else {
            self.acquire_and_wait(keys, held, px, waiter_ttl_ms).await?
        };
        Ok(match reply {
            Reply::Acquired { token } => Attempt::Acquired {
                token: Some(token),
                held: held.clone(),
            },
            Reply::Held { pttl_ms } => Attempt::Held { pttl_ms },
        })
    }

    /// The acquire script and `WAIT n t` pipelined in one round trip; fewer
    /// acknowledging replicas than asked = we give the lock back and fail.
    async fn acquire_and_wait(
        &self,
        keys: &Keys,
        held: &RedisHeld,
        px: u64,
        waiter_ttl_ms: u64,
    ) -> Result<Reply> {
        let backend = self.name;
        let cfg = &self.conn.cfg;
        let mut con = self.conn.con.clone();
        let mut pipe = redis::pipe();
        let script = match &held.fair {
            Some(me) => {
                pipe.add_command(node::acquire_fair_cmd(keys, me, px, waiter_ttl_ms));
                node::acquire_fair_script()
            }
            None => {
                let script = node::acquire_script();
                pipe.cmd("EVALSHA")
                    .arg(script.get_hash())
                    .arg(2)
                    .arg(&keys.lock)
                    .arg(&keys.fence)
                    .arg(&held.owner)
                    .arg(px);
                script
            }
        };
        pipe.cmd("WAIT")
            .arg(cfg.wait_replicas)
            .arg(cfg.wait_timeout_ms);
        let run = |mut con: Con| {
            let pipe = pipe.clone();
            async move { pipe.query_async::<(Vec<i64>, i64)>(&mut con).await }
        };
        // Deadline: the connection's response timeout, which counts the
        // WAIT's own timeout in (`RedisConfig::response_timeout`).
        let first = run(con.clone()).await;
        let (reply, acked) = match first {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script
                    .load_async(&mut con)
                    .await
                    .map_err(|e| map_err(backend, "SCRIPT LOAD", e))?;
                run(con.clone()).await
            }
            r => r,
        }
        .map_err(|e| map_err(backend, format!("acquire+WAIT {}", keys.lock), e))?;
        let reply = node::parse_reply(&reply).map_err(|e| map_err(backend, "acquire script", e))?;
        if matches!(reply, Reply::Acquired { .. }) && acked < i64::from(cfg.wait_replicas) {
            let released = held.release().await;
            let msg = format!(
                "only {acked} of {} replicas acknowledged the lock within {} ms",
                cfg.wait_replicas, cfg.wait_timeout_ms
            );
            return Err(match released {
                Ok(_) => Error::backend(backend, format!("WAIT on {}", keys.lock), msg),
                Err(_) => Error::indeterminate(backend, format!("WAIT on {}", keys.lock), msg),
            });
        }
        Ok(reply)
    }
}

#[async_trait]
impl DistLock for RedisLock {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: self.conn.cfg.fair,
            ..Self::CAPABILITIES
        }
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        distlock::check_request(self.name, key, &opts)?;
        let keys = Keys::new(&self.conn.cfg.key_prefix, key);
        let (lease, mode) = LeaseMode::for_request(
            opts.lease,
            Duration::from_millis(self.conn.cfg.watchdog_lease_ms),
        );
        let start = Instant::now();
        let deadline = opts.wait.map(|w| distlock::deadline_after(start, w));
        let keys = &keys;
        // A passing state (a restart, a failover, a stall, a slot
        // migrating; see `passing`): what an attempt sent may have landed,
        // or land later, so its `Pending` withdraws it in the background by
        // its owner value, and, within the wait budget, a new attempt goes
        // on under a new owner.
        distlock::retry_within_budget(
            key,
            deadline,
            passing,
            |_, retries| nap_for(retries),
            // This attempt's own owner value: nothing done in its name (a
            // release, a renewal, the withdrawal) can touch another.
            // Cancelled or ended in doubt, the attempt gives back what its
            // SET may have taken instead of leaving it for the lease to
            // expire.
            || std::future::ready(Ok(Arc::new(self.held(keys, &node::new_owner())))),
            |held: Arc<RedisHeld>| async move {
                let opts = AcquireOptions {
                    wait: deadline.map(|d| d.saturating_duration_since(Instant::now())),
                    ..opts
                };
                if self.conn.cfg.fair {
                    acquire_fair_loop(self.name, &self.conn, key, opts, mode, &held, |ttl| {
                        self.try_once(keys, &held, lease, ttl)
                    })
                    .await
                } else {
                    acquire_loop(self.name, &self.conn, key, keys, opts, mode, || {
                        self.try_once(keys, &held, lease, 0)
                    })
                    .await
                }
            },
        )
        .await
    }
}
