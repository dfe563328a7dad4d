//! The acquire recipe: enqueue our key in one transaction, wait for the
//! key just ahead to go, retry on a fresh key after a cluster fault; and
//! [`DistLock`] for [`EtcdLock`] on top of it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{AcquireOptions, Capabilities, DistLock, Error, Guard, Pending, Result};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use tokio::time::Instant;

use crate::error::{map_err, transient, BACKEND};
use crate::held::{whole_secs, Lease};
use crate::lock::EtcdLock;
use crate::queue::{range_first, Queue};
use crate::queue_key::QueueKey;
use crate::session::Refresher;

/// The queue key just ahead of a waiter's, as its last queue read saw it.
struct Ahead {
    key: Vec<u8>,
    create_rev: i64,
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
        let txn = Txn::new()
            .when([Compare::create_revision(my_key, CompareOp::Equal, 0)])
            // Ops apply in order: the count sees the queue as it was just
            // before our key's revision, so an empty queue = ours is first.
            .and_then([
                queue.count(),
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
                return Err(match mine.take_back().await {
                    Ok(_) if transient(&e) => Fail::Retry(e),
                    Ok(_) | Err(_) => Fail::Final(e),
                });
            }
        };
        let ops = resp.op_responses();
        let (my_rev, first) = if resp.succeeded() {
            let ahead = match ops.first() {
                Some(TxnOpResponse::Get(g)) => g.count(),
                _ => -1,
            };
            let rev = resp.header().map_or(0, |h| h.revision());
            (rev, (ahead == 0).then_some(rev))
        } else {
            (
                range_first(&ops, 0).map_or(0, |(_, rev)| rev),
                range_first(&ops, 1).map(|(_, rev)| rev),
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
            .wait_turn(queue, my_key, my_rev, lease, deadline, round_trips)
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
                Err(e) => Err(Fail::Final(e)),
            },
            Err(f) => {
                let _ = mine.take_back().await;
                Err(f)
            }
        }
    }

    /// Waits until no key ahead of ours remains: watch the one just ahead
    /// for its deletion, re-check, repeat. Ends with our key confirmed.
    async fn wait_turn(
        &self,
        queue: &Queue,
        my_key: &str,
        my_rev: i64,
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
        // Re-check at least this often even if no event comes (a paused
        // member's watch can stall silently).
        let recheck = match lease {
            Lease::Session(s) => (s.ttl / 3).min(Duration::from_secs(2)),
            Lease::Own { .. } => Duration::from_secs(1),
        };
        loop {
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            // Our key still ours, and who is just ahead, in one read.
            let txn = Txn::new()
                .when([Compare::create_revision(my_key, CompareOp::Equal, my_rev)])
                .and_then([queue.ahead_of(my_rev)]);
            *round_trips += 1;
            let resp = match self.client.kv_client().txn(txn).await {
                Ok(r) => r,
                Err(e) => {
                    let e = map_err(format!("checking the queue of {my_key}"), e, false);
                    tracing::debug!(error = %e, "queue check failed");
                    nap(deadline).await;
                    continue;
                }
            };
            if !resp.succeeded() {
                return Err(Fail::Retry(Error::backend(
                    BACKEND,
                    format!("waiting with {my_key}"),
                    "our queue key is gone (its lease ended)",
                )));
            }
            let Some((ahead, ahead_rev)) = range_first(&resp.op_responses(), 0) else {
                return Ok(());
            };
            let seen = resp.header().map_or(0, |h| h.revision());
            *round_trips += 1;
            let until = deadline.min(Instant::now() + recheck);
            let ahead = Ahead {
                key: ahead,
                create_rev: ahead_rev,
                seen,
            };
            if let Err(e) = self.deleted(ahead, until, round_trips).await {
                tracing::debug!(error = %e, "watch failed; re-checking");
                nap(deadline).await;
            }
        }
    }

    /// Returns when the key ahead is deleted (or was replaced), at
    /// `until`, or when the watch ends (the caller re-checks either way).
    ///
    /// The watch starts at the current revision, not at `seen + 1`: etcd
    /// serves a watch whose start revision is already past from its
    /// "unsynced" set, which it catches up only every 100 ms
    /// (`watchResyncPeriod`), so under contention, when other waiters'
    /// writes have moved the revision on, every hand-over would wait up to
    /// 100 ms. The gap that leaves (a delete between our queue read and the
    /// watch's creation) is closed by one read, only when the revision
    /// moved in between.
    async fn deleted(&self, ahead: Ahead, until: Instant, round_trips: &mut u32) -> Result<()> {
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let watching = tokio::time::timeout_at(
            until,
            self.client
                .watch_client()
                .watch(ahead.key.clone(), Some(opts)),
        )
        .await;
        let mut stream = match watching {
            Err(_) => return Ok(()),
            Ok(r) => r.map_err(|e| map_err("watch", e, false))?,
        };
        loop {
            match tokio::time::timeout_at(until, stream.message()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(resp))) => {
                    if resp.canceled()
                        || resp
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(());
                    }
                    let created_at = resp.header().map_or(0, |h| h.revision());
                    if resp.created() && created_at > ahead.seen {
                        // Watched from after `created_at`: is the key we
                        // saw still there, the same incarnation?
                        *round_trips += 1;
                        let got = tokio::time::timeout_at(
                            until,
                            self.client
                                .kv_client()
                                .get(ahead.key.clone(), Some(GetOptions::new().with_keys_only())),
                        )
                        .await;
                        let still = match got {
                            Err(_) => return Ok(()),
                            Ok(r) => r
                                .map_err(|e| map_err("checking the key ahead", e, false))?
                                .kvs()
                                .first()
                                .is_some_and(|kv| kv.create_revision() == ahead.create_rev),
                        };
                        if !still {
                            return Ok(());
                        }
                    }
                }
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(map_err("watch", e, false)),
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
        let started = Instant::now();
        let deadline = started + opts.wait.unwrap_or(Duration::ZERO);
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
