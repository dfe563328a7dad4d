//! The held lock: the lease a lock key rides on (the session's, or a fixed
//! lease of its own), when that lease counts from, and the guard an
//! acquisition becomes.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Error, FencingToken, Guard, GuardParts, LeaseMode, Result};
use tokio::time::Instant;

use crate::error::{map_err, BACKEND};
use crate::lock::EtcdLock;
use crate::queue_key::QueueKey;
use crate::session::{keep_alive_once, Session};

/// The lease a lock key is attached to.
pub(crate) enum Lease {
    /// The shared, kept-alive session lease (watchdog mode).
    Session(Arc<Session>),
    /// A lease of its own, for a fixed lease: kept alive only while its
    /// acquisition waits.
    Own {
        id: i64,
        lease: Duration,
        /// When the grant was sent: the server counts the TTL from later.
        granted_at: Instant,
    },
}

impl Lease {
    pub(crate) fn id(&self) -> i64 {
        match self {
            Lease::Session(s) => s.id,
            Lease::Own { id, .. } => *id,
        }
    }
}

/// A fixed lease as etcd takes it: whole seconds, rounded up, so the server
/// never ends it before `lease`.
pub(crate) fn whole_secs(lease: Duration) -> Duration {
    Duration::from_secs(lease.as_secs() + u64::from(lease.subsec_nanos() > 0))
        .max(Duration::from_secs(1))
}

impl EtcdLock {
    /// The session, replaced by a fresh one if it died (and counted as a
    /// round trip then).
    pub(crate) async fn live_session(&self, round_trips: &mut u32) -> Result<Arc<Session>> {
        let mut s = self.session.lock().await;
        if !s.usable() {
            *round_trips += 1;
            *s =
                Session::grant(&self.client, self.cfg.session_ttl(), self.cfg.op_timeout()).await?;
        }
        Ok(s.clone())
    }

    pub(crate) async fn grant_own(&self, lease: Duration, round_trips: &mut u32) -> Result<Lease> {
        let granted_at = Instant::now();
        // Whole seconds, rounded up: the server never ends it before `lease`.
        let secs = i64::try_from(whole_secs(lease).as_secs()).unwrap_or(i64::MAX);
        *round_trips += 1;
        let r = self
            .client
            .lease_client()
            .grant(secs, None)
            .await
            .map_err(|e| map_err("granting a lock lease", e, false))?;
        Ok(Lease::Own {
            id: r.id(),
            lease,
            granted_at,
        })
    }

    /// A fixed lease that waited is counted from a keepalive sent now, once
    /// the wait is over: the last renewal while waiting may be up to a third
    /// of the TTL old, which would hand out a guard already half expired.
    /// Returns when that keepalive was sent. One round trip, on the
    /// contended path only.
    pub(crate) async fn fresh_start(
        &self,
        id: i64,
        lease: Duration,
        round_trips: &mut u32,
    ) -> Result<Instant> {
        *round_trips += 1;
        let sent = Instant::now();
        if keep_alive_once(&self.client, id, whole_secs(lease), self.cfg.op_timeout()).await? {
            Ok(sent)
        } else {
            Err(Error::backend(
                BACKEND,
                format!("lease {id:016x}"),
                "the lock's lease ended while it waited",
            ))
        }
    }

    /// The guard of an acquisition whose key is first in the queue.
    pub(crate) fn held(
        &self,
        key: &str,
        mine: &Arc<QueueKey>,
        my_rev: i64,
        lease: &Lease,
        start: Instant,
        round_trips: u32,
    ) -> Guard {
        // A create revision is positive (etcd starts at 1).
        let token = Some(FencingToken(my_rev.unsigned_abs()));
        match lease {
            Lease::Session(s) => {
                let guard = Guard::new(GuardParts {
                    key: key.to_string(),
                    token,
                    held: mine.clone(),
                    lease: LeaseMode::Managed,
                    invoked_at: start,
                    round_trips,
                });
                // From here the session reports: valid_until, loss.
                s.register(mine.name(), my_rev, guard.lease_handle());
                guard
            }
            Lease::Own { id, lease: d, .. } => {
                let id = *id;
                // Enforce the lease's end ourselves: etcd rounds it up to
                // whole seconds and scans for expired leases every 500 ms.
                let mut revoker = self.client.lease_client();
                let due = start + *d;
                let limit = self.cfg.op_timeout();
                mine.set_expiry(tokio::spawn(async move {
                    tokio::time::sleep_until(due).await;
                    let _ = tokio::time::timeout(limit, revoker.revoke(id)).await;
                }));
                Guard::new(GuardParts {
                    key: key.to_string(),
                    token,
                    held: mine.clone(),
                    lease: LeaseMode::Fixed(*d),
                    invoked_at: start,
                    round_trips,
                })
            }
        }
    }
}
