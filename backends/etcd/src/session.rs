//! The session: one lease per [`crate::EtcdLock`], kept alive in the
//! background like `concurrency.Session`, that every watchdog-mode lock key
//! is attached to.
//!
//! The session also tells each held lock when it is lost: the keepalive
//! failed until the lease could no longer be vouched for, the lease is gone
//! (revoked, expired), or the lock's key was deleted behind our back (seen
//! in the key list `LeaseTimeToLive` returns, confirmed with a read).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock::{drift, LeaseHandle, LostReason, Result};
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper, LeaseTimeToLiveOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{map_err, BACKEND};

/// A held lock the session reports to.
struct Held {
    handle: LeaseHandle,
    /// Its key's create revision: a name is reused by later acquisitions,
    /// so only this revision identifies the acquisition.
    rev: i64,
    /// When its key was known to exist: a key-list reply to a request sent
    /// before this cannot speak for it.
    since: Instant,
}

struct State {
    /// Last successful keepalive (or the grant) + TTL - drift.
    valid_until: Instant,
    /// Set once the lease is known gone or past vouching: final.
    dead: Option<LostReason>,
    /// Held locks on this lease, by their etcd key (a name is held by one
    /// acquisition at a time: names are reserved per acquisition).
    held: HashMap<String, Held>,
}

/// One lease and its keepalive task.
pub(crate) struct Session {
    /// The lease id.
    pub id: i64,
    /// The TTL the server granted.
    pub ttl: Duration,
    client: Client,
    state: Mutex<State>,
    /// Fault injection: stop renewing, as a stalled process would.
    stopped: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &format_args!("{:016x}", self.id))
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Grants a lease of `ttl` and starts keeping it alive.
    pub(crate) async fn grant(
        client: &Client,
        ttl: Duration,
        op_timeout: Duration,
    ) -> Result<Arc<Self>> {
        let sent = Instant::now();
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let resp = distlock::with_deadline(
            BACKEND,
            || "granting the session lease".into(),
            op_timeout,
            async {
                client
                    .lease_client()
                    .grant(secs, None)
                    .await
                    .map_err(|e| map_err("granting the session lease", e, false))
            },
        )
        .await?;
        // The server may raise a TTL below its minimum.
        let ttl = Duration::from_secs(resp.ttl().max(secs).unsigned_abs());
        let session = Arc::new(Session {
            id: resp.id(),
            ttl,
            client: client.clone(),
            state: Mutex::new(State {
                valid_until: sent + ttl.saturating_sub(drift(ttl)),
                dead: None,
                held: HashMap::new(),
            }),
            stopped: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(keep_alive(
            Arc::downgrade(&session),
            client.clone(),
            session.id,
            ttl,
            op_timeout,
        ));
        if let Ok(mut t) = session.task.lock() {
            *t = Some(task);
        }
        tracing::debug!(lease = %format_args!("{:016x}", session.id), ?ttl, "session lease granted");
        Ok(session)
    }

    /// Whether new locks may still be attached to this lease: alive, and
    /// vouched for a while longer.
    pub(crate) fn usable(&self) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| s.dead.is_none() && s.valid_until > Instant::now() + self.ttl / 4)
    }

    /// Until when we can vouch for the lease.
    pub(crate) fn valid_until(&self) -> Instant {
        self.state
            .lock()
            .map(|s| s.valid_until)
            .unwrap_or_else(|_| Instant::now())
    }

    /// Reports to `handle` from now on (valid_until, loss) for the key
    /// `key` created at `rev`.
    pub(crate) fn register(&self, key: &str, rev: i64, handle: LeaseHandle) {
        let Ok(mut s) = self.state.lock() else {
            handle.mark_lost(LostReason::SessionEnded);
            return;
        };
        if let Some(reason) = s.dead {
            handle.mark_lost(reason);
            return;
        }
        handle.set_valid_until(s.valid_until);
        s.held.insert(
            key.to_string(),
            Held {
                handle,
                rev,
                since: Instant::now(),
            },
        );
    }

    /// Stops reporting for `key` at `rev` (released); a later acquisition
    /// under the same name is left registered.
    pub(crate) fn unregister(&self, key: &str, rev: i64) {
        if let Ok(mut s) = self.state.lock() {
            if s.held.get(key).is_some_and(|h| h.rev == rev) {
                s.held.remove(key);
            }
        }
    }

    /// Fault injection: stop (or resume) the keepalive.
    pub(crate) fn set_stopped(&self, stopped: bool) {
        self.stopped.store(stopped, Ordering::Release);
    }

    fn renewed(&self, until: Instant) {
        if let Ok(mut s) = self.state.lock() {
            if s.dead.is_some() {
                return;
            }
            s.valid_until = until;
            for h in s.held.values() {
                h.handle.set_valid_until(until);
            }
        }
    }

    fn die(&self, reason: LostReason) {
        if let Ok(mut s) = self.state.lock() {
            if s.dead.is_none() {
                tracing::warn!(lease = %format_args!("{:016x}", self.id), %reason, held = s.held.len(), "session lease lost");
                s.dead = Some(reason);
            }
            for (_, h) in s.held.drain() {
                h.handle.mark_lost(reason);
            }
        }
    }

    fn is_dead(&self) -> bool {
        self.state.lock().map_or(true, |s| s.dead.is_some())
    }

    /// Held keys (and their revisions) registered before `asked`, absent
    /// from `present`.
    fn missing(&self, present: &[Vec<u8>], asked: Instant) -> Vec<(String, i64)> {
        let Ok(s) = self.state.lock() else {
            return Vec::new();
        };
        s.held
            .iter()
            .filter(|(k, h)| h.since < asked && !present.iter().any(|p| p == k.as_bytes()))
            .map(|(k, h)| (k.clone(), h.rev))
            .collect()
    }

    fn lose_key(&self, key: &str, rev: i64) {
        if let Ok(mut s) = self.state.lock() {
            if s.held.get(key).is_some_and(|h| h.rev == rev) {
                if let Some(h) = s.held.remove(key) {
                    tracing::warn!(%key, "lock key deleted behind our back");
                    h.handle.mark_lost(LostReason::NotOwner);
                }
            }
        }
    }

    fn has_held(&self) -> bool {
        self.state.lock().is_ok_and(|s| !s.held.is_empty())
    }

    /// Every held key with its create revision.
    fn held_keys(&self) -> Vec<(String, i64)> {
        self.state
            .lock()
            .map(|s| s.held.iter().map(|(k, h)| (k.clone(), h.rev)).collect())
            .unwrap_or_default()
    }
}

/// Whether a lease one member called gone (a keepalive answered with TTL
/// 0, a TTL query with -1) is gone for the cluster: a leader deposed while
/// it was paused answers so for a moment after it wakes, though the lease
/// lives on the new leader (lost(Expired) fired while every member still
/// had it; the keepalives then stopped and the lease did die). A revoked
/// or expired lease takes its keys with it in the same revision, so a
/// linearizable read of a key we hold, which a deposed leader cannot
/// serve, tells: the key there, the lease is alive. `None`: no answer in
/// time (retried as a failed renewal, within `valid_until`).
async fn lease_gone_for_all(s: &Session, client: &Client, op_timeout: Duration) -> Option<bool> {
    // Any one of our keys still there proves the lease alive (one deleted
    // behind our back proves nothing about the others).
    for (key, rev) in s.held_keys() {
        if key_there(client, &key, rev, op_timeout).await? {
            return Some(false);
        }
    }
    // None there, or nothing held: nothing to be wrong about.
    Some(true)
}

/// Whether `key` is there with create revision `rev`, by a linearizable
/// read; `None`: no answer in time.
async fn key_there(client: &Client, key: &str, rev: i64, op_timeout: Duration) -> Option<bool> {
    let mut kv = client.kv_client();
    let read = tokio::time::timeout(
        op_timeout,
        kv.get(key, Some(etcd_client::GetOptions::new().with_keys_only())),
    )
    .await;
    match read {
        // Gone, or (never with reserved names, but cheap to check) a
        // different key under the same name: ours is not there.
        Ok(Ok(r)) => Some(r.kvs().iter().any(|kv| kv.create_revision() == rev)),
        _ => None,
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Ok(mut t) = self.task.lock() {
            if let Some(t) = t.take() {
                t.abort();
            }
        }
        // Like concurrency.Session.Close: give the lease back rather than
        // let it linger for its TTL.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let mut lease = self.client.lease_client();
            let id = self.id;
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), lease.revoke(id)).await;
            });
        }
    }
}

/// What one keepalive found.
enum Renewal {
    /// Renewed for this long from when it was sent.
    Renewed(Duration),
    /// The server no longer knows the lease.
    Gone,
}

/// One keepalive on the (re)opened stream.
async fn renew_once(
    client: &Client,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    id: i64,
    ttl: Duration,
) -> std::result::Result<Renewal, etcd_client::Error> {
    let Some((keeper, replies)) = stream.as_mut() else {
        // Opening the stream sends the first keepalive and awaits its reply.
        return match client.lease_client().keep_alive(id).await {
            Ok(pair) => {
                *stream = Some(pair);
                Ok(Renewal::Renewed(ttl))
            }
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                Ok(Renewal::Gone)
            }
            Err(e) => Err(e),
        };
    };
    keeper.keep_alive().await?;
    match replies.message().await? {
        Some(r) if r.ttl() > 0 => Ok(Renewal::Renewed(Duration::from_secs(
            r.ttl().unsigned_abs(),
        ))),
        Some(_) => Ok(Renewal::Gone),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "keepalive stream closed".into(),
        )),
    }
}

/// Renews every third of the TTL; a failure is retried until the lease can
/// no longer be vouched for, then every held lock is lost.
async fn keep_alive(
    session: Weak<Session>,
    client: Client,
    id: i64,
    ttl: Duration,
    op_timeout: Duration,
) {
    let period = ttl / 3;
    let retry = (ttl / 10).max(Duration::from_millis(50));
    let mut stream = None;
    let mut next = Instant::now() + period;
    loop {
        let Some(valid_until) = session.upgrade().map(|s| s.valid_until()) else {
            return;
        };
        tokio::time::sleep_until(next.min(valid_until)).await;
        let Some(s) = session.upgrade() else { return };
        if s.is_dead() {
            return;
        }
        let sent = Instant::now();
        let valid_until = s.valid_until();
        if sent >= valid_until {
            s.die(LostReason::RenewalFailed);
            return;
        }
        if s.stopped.load(Ordering::Acquire) {
            next = sent + period;
            continue;
        }
        // Never let one renewal outlive the lease it is trying to save.
        let budget = (valid_until - sent).min(op_timeout);
        match tokio::time::timeout(budget, renew_once(&client, &mut stream, id, ttl)).await {
            Ok(Ok(Renewal::Renewed(granted))) => {
                s.renewed(sent + granted.saturating_sub(drift(granted)));
                next = sent + period;
            }
            Ok(Ok(Renewal::Gone)) => match lease_gone_for_all(&s, &client, op_timeout).await {
                Some(true) => {
                    s.die(LostReason::Expired);
                    return;
                }
                // One member's word, not the cluster's: renew again soon.
                gone => {
                    tracing::debug!(lease = %format_args!("{id:016x}"), ?gone, "a member called the lease gone; the cluster does not (yet)");
                    stream = None;
                    next = Instant::now() + retry;
                    continue;
                }
            },
            Ok(Err(e)) => {
                tracing::debug!(lease = %format_args!("{id:016x}"), error = %e, "keepalive failed, retrying");
                stream = None;
                next = Instant::now() + retry;
                continue;
            }
            Err(_) => {
                stream = None;
                next = Instant::now();
                continue;
            }
        }
        if s.has_held() {
            check_keys(&s, &client, id, op_timeout).await;
        }
    }
}

/// Marks lost every held lock whose key is gone from the lease.
async fn check_keys(s: &Session, client: &Client, id: i64, op_timeout: Duration) {
    let asked = Instant::now();
    let mut lease = client.lease_client();
    let reply = tokio::time::timeout(
        op_timeout,
        lease.time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys())),
    )
    .await;
    let Ok(Ok(reply)) = reply else { return };
    if reply.ttl() < 0 {
        if lease_gone_for_all(s, client, op_timeout).await == Some(true) {
            s.die(LostReason::Expired);
        }
        return;
    }
    for (key, rev) in s.missing(reply.keys(), asked) {
        // The lease's key list may lag the member that served our put:
        // confirm with a linearizable read before calling the lock lost.
        if key_there(client, &key, rev, op_timeout).await == Some(false) {
            s.lose_key(&key, rev);
        }
    }
}

/// Revokes `id`, ignoring the outcome (cleanup: the lease expires anyway).
pub(crate) fn revoke_in_background(client: &Client, id: i64) {
    let mut lease = client.lease_client();
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), lease.revoke(id)).await;
        });
    }
}

/// One keepalive of lease `id` on a stream of its own, within `limit`:
/// `Ok(true)` renewed (for at least the TTL it was granted, counted from
/// before this call), `Ok(false)` the lease is gone.
///
/// # Errors
/// The request failed or had no reply within `limit`.
pub(crate) async fn keep_alive_once(
    client: &Client,
    id: i64,
    ttl: Duration,
    limit: Duration,
) -> Result<bool> {
    let mut stream = None;
    distlock::with_deadline(
        BACKEND,
        || format!("keepalive of lease {id:016x}"),
        limit,
        async {
            match renew_once(client, &mut stream, id, ttl).await {
                Ok(Renewal::Renewed(_)) => Ok(true),
                Ok(Renewal::Gone) => Ok(false),
                Err(e) => Err(map_err(format!("keepalive of lease {id:016x}"), e, false)),
            }
        },
    )
    .await
}

/// Keeps a per-lock lease alive while its acquisition waits in the queue:
/// a fixed lease must not run out before its lock is even taken. The lease
/// of the guard is counted from a keepalive sent after the wait, not from
/// these.
pub(crate) struct Refresher {
    task: JoinHandle<()>,
}

impl Refresher {
    pub(crate) fn start(client: &Client, id: i64, ttl: Duration) -> Self {
        let client = client.clone();
        let task = tokio::spawn(async move {
            let mut stream = None;
            loop {
                tokio::time::sleep(ttl / 3).await;
                match tokio::time::timeout(ttl / 3, renew_once(&client, &mut stream, id, ttl)).await
                {
                    Ok(Ok(Renewal::Renewed(_))) => {}
                    Ok(Ok(Renewal::Gone)) => return,
                    _ => stream = None,
                }
            }
        });
        Self { task }
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
