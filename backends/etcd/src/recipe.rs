//! The acquire recipe: enqueue our key in one transaction (which also
//! reads the keys ahead of it), wait for those to go, retry on a fresh key
//! after a cluster fault; and
//! [`DistLock`] for [`EtcdLock`] on top of it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{AcquireOptions, Capabilities, DistLock, Error, Guard, Pending, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::error::{map_err, transient, BACKEND};
use crate::held::{whole_secs, Lease};
use crate::lock::EtcdLock;
use crate::queue::{range_first, range_keys, Queue};
use crate::queue_key::QueueKey;
use crate::session::Refresher;
use crate::watch_hub::{Subscription, Turn};

/// Keys ahead of ours a queue read returns at most. Enough for every
/// contender of a busy key to know all keys ahead of it; behind a longer
/// queue a waiter reads again once the ones it knows are gone.
const AHEAD_READ: i64 = 64;

/// The keys ahead of a waiter's, as its last queue read saw them, less
/// those the watch has since seen deleted.
struct Ahead {
    keys: HashSet<Vec<u8>>,
    /// Whether the read had them all (not cut at [`AHEAD_READ`]).
    complete: bool,
    /// The revision of that read.
    seen: i64,
}

/// Why one attempt did not end in a guard.
enum Fail {
    /// Give this error to the caller.
    Final(Error),
    /// A fault the next attempt (on another member, with a fresh key) may
    /// get past; our key is known to be gone.
    Retry(Error),
}

impl EtcdLock {
    /// One attempt: enqueue, wait for our turn within `deadline`.
    async fn attempt(
        &self,
        key: &str,
        opts: AcquireOptions,
        deadline: Instant,
        started: Instant,
        round_trips: &mut u32,
    ) -> std::result::Result<Guard, Fail> {
        let lease = match opts.lease {
            None => Lease::Session(self.live_session(round_trips).await.map_err(Fail::Retry)?),
            Some(d) => self.grant_own(d, round_trips).await.map_err(Fail::Retry)?,
        };
        let queue = Queue::new(&self.cfg.prefix, key);
        let name = self
            .names
            .reserve(format!("{}{:016x}", queue.dir, lease.id()));
        let (session, own) = match &lease {
            Lease::Session(s) => (Some(s.clone()), None),
            Lease::Own { id, .. } => (None, Some(*id)),
        };
        let mine = Arc::new(QueueKey::new(
            self.client.clone(),
            self.names.clone(),
            name,
            session,
            own,
            self.cfg.op_timeout(),
        ));
        // Armed before the put goes out: should this future be dropped (a
        // timeout, a select!) or end in an error that may have left our key
        // behind, it is taken back in the background, by our create
        // revision once known. Every path below that gives up takes it back
        // itself first, which leaves the withdrawal nothing to do.
        let pending = Pending::new(key, mine.clone());
        let r = self
            .enqueue(
                key,
                &queue,
                &mine,
                &lease,
                opts,
                deadline,
                started,
                round_trips,
            )
            .await;
        let (result, retry) = match r {
            Ok(g) => (Ok(g), false),
            Err(Fail::Final(e)) => (Err(e), false),
            Err(Fail::Retry(e)) => (Err(e), true),
        };
        pending.settle(&result);
        result.map_err(|e| {
            if retry {
                Fail::Retry(e)
            } else {
                Fail::Final(e)
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn enqueue(
        &self,
        key: &str,
        queue: &Queue,
        mine: &Arc<QueueKey>,
        lease: &Lease,
        opts: AcquireOptions,
        deadline: Instant,
        started: Instant,
        round_trips: &mut u32,
    ) -> std::result::Result<Guard, Fail> {
        let my_key = mine.name();
        let invoked_at = Instant::now();
        // Joined BEFORE the read when this handle already watches the queue
        // (no request): every delete after our read then reaches us.
        let early = self.hub.join(queue);
        let txn = Txn::new()
            .when([Compare::create_revision(my_key, CompareOp::Equal, 0)])
            // Ops apply in order: the read sees the queue as it was just
            // before our key's revision, so an empty queue = ours is first.
            .and_then([
                queue.newest(AHEAD_READ),
                TxnOp::put(my_key, "", Some(PutOptions::new().with_lease(lease.id()))),
            ])
            // Our (reserved) name already has a key: a put of ours that
            // landed after we gave up on it. It is ours: take its place.
            .or_else([TxnOp::get(my_key, None), queue.first()]);
        *round_trips += 1;
        mine.sending();
        let resp = match self.client.kv_client().txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                let e = map_err(format!("acquire {my_key}"), e, true);
                // The put may have landed: take it back before anything else.
                // A take-back the server does not answer (it is restarting)
                // goes on in the background, so a fault is still waited
                // through within the budget: it was final, and clicks were
                // turned away 15-62 ms into a 2 s restart.
                let taken_back = mine.take_back().await;
                return Err(if transient(&e) {
                    if let Err(b) = &taken_back {
                        tracing::debug!(key = %my_key, error = %b, "take-back goes on in the background");
                    }
                    Fail::Retry(e)
                } else {
                    Fail::Final(e)
                });
            }
        };
        let ops = resp.op_responses();
        let (my_rev, first, ahead) = if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            match range_keys(&ops, 0) {
                Some((keys, _)) if keys.is_empty() => (rev, Some(rev), None),
                Some((keys, complete)) => (
                    rev,
                    None,
                    Some(Ahead {
                        keys,
                        complete,
                        seen: rev,
                    }),
                ),
                None => (rev, None, None),
            }
        } else {
            // Adopted a key of ours that landed late: read the queue anew.
            (
                range_first(&ops, 0).map_or(0, |(_, rev)| rev),
                range_first(&ops, 1).map(|(_, rev)| rev),
                None,
            )
        };
        if my_rev == 0 {
            let _ = mine.take_back().await;
            return Err(Fail::Retry(Error::backend(
                BACKEND,
                format!("acquire {my_key}"),
                "our queue key vanished as it was written (lease gone)",
            )));
        }
        mine.created(my_rev);
        if first == Some(my_rev) {
            drop(early);
            let start = match lease {
                // Our revoke and the server's TTL both count from the grant
                // at the earliest, the put came later.
                Lease::Own { granted_at, .. } => *granted_at,
                Lease::Session(_) => invoked_at,
            };
            return Ok(self.held(key, mine, my_rev, lease, start, *round_trips));
        }
        // Held by someone else: wait our turn, keeping a lease of our own
        // alive meanwhile.
        let refresher = match lease {
            Lease::Own { id, lease: d, .. } if opts.wait.is_some() => {
                Some(Refresher::start(&self.client, *id, whole_secs(*d)))
            }
            _ => None,
        };
        let waited = self
            .wait_turn(
                queue,
                (my_key, my_rev),
                ahead,
                early,
                lease,
                deadline,
                round_trips,
            )
            .await;
        drop(refresher);
        match waited {
            Ok(()) => {
                let start = match lease {
                    Lease::Session(_) => invoked_at,
                    Lease::Own { id, lease: d, .. } => {
                        match self.fresh_start(*id, *d, round_trips).await {
                            Ok(sent) => sent,
                            Err(e) => {
                                let _ = mine.take_back().await;
                                return Err(Fail::Retry(e));
                            }
                        }
                    }
                };
                Ok(self.held(key, mine, my_rev, lease, start, *round_trips))
            }
            Err(Fail::Final(Error::Timeout { .. })) => match mine.take_back().await {
                Ok(_) => Err(Fail::Final(Error::Timeout {
                    key: key.to_string(),
                    waited: started.elapsed(),
                })),
                // Named as the call the user made, not as our withdrawal.
                Err(e) => Err(Fail::Final(Error::indeterminate(
                    BACKEND,
                    format!("acquire {key}"),
                    format!("the wait ran out after {:?}, and taking our queue key back got no answer (retried in the background): {e}", started.elapsed()),
                ))),
            },
            Err(f) => {
                let _ = mine.take_back().await;
                Err(f)
            }
        }
    }

    /// Waits until no key ahead of ours remains: every key ahead of ours
    /// (as of our last queue read) is seen deleted on the handle's watch of
    /// the queue (`watch_hub`), which also tells us if ours goes. Reads the
    /// queue again only when the watch may have missed something: it
    /// started after our read, it ended or we fell behind it, or our turn
    /// did not come within `recheck` (a paused member's watch can stall
    /// silently).
    ///
    /// Round trips: none beyond the enqueue when the handle already
    /// watches the queue; the watch's opening and at most one read when
    /// this waiter opens it.
    #[allow(clippy::too_many_arguments)]
    async fn wait_turn(
        &self,
        queue: &Queue,
        (my_key, my_rev): (&str, i64),
        mut view: Option<Ahead>,
        mut sub: Option<Subscription>,
        lease: &Lease,
        deadline: Instant,
        round_trips: &mut u32,
    ) -> std::result::Result<(), Fail> {
        let timeout = || {
            Fail::Final(Error::Timeout {
                key: String::new(),
                waited: Duration::ZERO,
            })
        };
        let gone = || {
            Fail::Retry(Error::backend(
                BACKEND,
                format!("waiting with {my_key}"),
                "our queue key is gone (its lease ended)",
            ))
        };
        // Re-check at least this often even if no event comes.
        let recheck = match lease {
            Lease::Session(s) => (s.ttl / 3).min(Duration::from_secs(2)),
            Lease::Own { .. } => Duration::from_secs(1),
        };
        // The keys we still waited for when a re-check period passed with
        // no delete at all: if the re-check finds one of them gone, the
        // watch missed it.
        let mut quiet: Option<HashSet<Vec<u8>>> = None;
        loop {
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            let until = deadline.min(Instant::now() + recheck);
            // First the subscription, then (if need be) the read: a read
            // sent after joining is at or past every delete the feed
            // passed on before we joined.
            let s = match sub.as_mut() {
                Some(s) => s,
                None => match self.hub.subscribe(queue) {
                    Some((s, opened)) => {
                        if opened {
                            *round_trips += 1;
                        }
                        sub.insert(s)
                    }
                    None => {
                        nap(deadline).await;
                        continue;
                    }
                },
            };
            let Some(after) = s.after(until).await else {
                // Not open in time, or it ended: read, and subscribe anew.
                sub = None;
                view = None;
                nap(deadline).await;
                continue;
            };
            let stale = view
                .as_ref()
                .is_none_or(|v| v.seen < after || (v.keys.is_empty() && !v.complete));
            if stale {
                // Our key still ours, and every key ahead of it, in one read.
                let txn = Txn::new()
                    .when([Compare::create_revision(my_key, CompareOp::Equal, my_rev)])
                    .and_then([queue.ahead_of(my_rev, AHEAD_READ)]);
                *round_trips += 1;
                let resp = match self.client.kv_client().txn(txn).await {
                    Ok(r) => r,
                    Err(e) => {
                        let e = map_err(format!("checking the queue of {my_key}"), e, false);
                        tracing::debug!(error = %e, "queue check failed");
                        view = None;
                        nap(deadline).await;
                        continue;
                    }
                };
                if !resp.succeeded() {
                    return Err(gone());
                }
                let Some((keys, complete)) = range_keys(&resp.op_responses(), 0) else {
                    tracing::debug!(key = %my_key, "queue check without its read");
                    view = None;
                    nap(deadline).await;
                    continue;
                };
                let missed = quiet
                    .take()
                    .is_some_and(|q| q.iter().any(|k| !keys.contains(k)));
                if keys.is_empty() {
                    // None ahead (a read cut at its limit is never empty).
                    return Ok(());
                }
                view = Some(Ahead {
                    keys,
                    complete,
                    seen: resp.header().map_or(0, |h| h.revision()),
                });
                if missed {
                    tracing::debug!(key = %my_key, "queue watch stalled; opening a new one");
                    self.hub.reset(queue);
                    sub = None;
                    continue;
                }
            }
            let Some(v) = view.as_mut() else { continue };
            if v.keys.is_empty() {
                // Complete (an incomplete one is stale) and empty: none ahead.
                return Ok(());
            }
            match s.wait(until, &mut v.keys, v.seen, my_key.as_bytes()).await {
                Turn::Gone => return Err(gone()),
                // Complete: no key ahead of ours remains.
                Turn::Cleared if v.complete => return Ok(()),
                // More were queued than we read: read again.
                Turn::Cleared => view = None,
                Turn::Quiet => quiet = view.take().map(|v| v.keys),
                Turn::Broken => {
                    tracing::debug!(key = %my_key, "queue watch ended; re-checking");
                    sub = None;
                    view = None;
                    nap(deadline).await;
                }
            }
        }
    }
}

/// A short jittered pause after a failed request, so a dead member is not
/// hammered; never past `deadline`.
async fn nap(deadline: Instant) {
    let d = Duration::from_millis(rand::random_range(20..60));
    tokio::time::sleep_until(deadline.min(Instant::now() + d)).await;
}

#[async_trait]
impl DistLock for EtcdLock {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    /// Every call is its own owner (its own queue key), even on a key this
    /// handle already holds: that call waits (or, as a try-lock, fails)
    /// like any other client. Reenter through the guard instead.
    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        distlock::check_request(BACKEND, key, &opts)?;
        let started = Instant::now();
        let deadline = distlock::deadline_after(started, opts.wait.unwrap_or(Duration::ZERO));
        let mut round_trips = 0u32;
        loop {
            match self
                .attempt(key, opts, deadline, started, &mut round_trips)
                .await
            {
                Ok(g) => return Ok(g),
                Err(Fail::Final(e)) => return Err(e),
                // A fault (member gone, election, lease ended): again with a
                // fresh key, on whichever member answers, while time remains.
                Err(Fail::Retry(e)) => {
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    tracing::debug!(%key, error = %e, "acquire attempt failed; retrying");
                    nap(deadline).await;
                }
            }
        }
    }
}
