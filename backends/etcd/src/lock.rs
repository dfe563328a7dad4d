//! `EtcdLock`: etcd's `concurrency.Mutex` recipe, written out by hand.
//!
//! A lock on `k` is a queue of keys under `<prefix>/<k>/`, one per
//! contender, each attached to a lease; the key with the lowest create
//! revision holds the lock, and its create revision is the fencing token.
//! A waiter waits for the keys ahead of it to be deleted, seen on the one
//! watch its handle keeps on the queue (`watch_hub`): a hand-over costs
//! the waiters no request at all (no herd on the server).
//!
//! This module holds the handle and what it owns (client, session, queue-key
//! names); the lease a lock key rides on and the guard it becomes are in
//! `held`, the acquire itself in `recipe`.

use std::sync::Arc;

use distlock::{Capabilities, Error, Result, TokenSource};
use etcd_client::Client;

use crate::config::EtcdConfig;
use crate::connect::client;
use crate::error::{map_err, BACKEND};
use crate::queue::Queue;
use crate::queue_key::Names;
use crate::session::Session;
use crate::watch_hub::WatchHub;

/// etcd's `concurrency.Mutex` recipe over a session lease: a handle that
/// many tasks may share, every acquire its own owner.
///
/// - acquire, uncontended: ONE transaction — if our key's create revision is
///   0, read the queue's keys (keys only; none when uncontended), then put
///   our key with the lease. An empty queue before our put = ours has the
///   lowest create revision = held; that revision is the token.
/// - every acquisition has a queue key of its own: `<lease>`, or
///   `<lease>-1`, ... when acquisitions through this handle overlap on one
///   key; a name is reused only once its key is known deleted. Our own keys
///   queue by create revision like anybody's, each waiting for the ones
///   ahead, ours or not.
/// - contended: the acquire transaction's read returns every key ahead of
///   ours; we wait for each to be deleted on the one watch this handle
///   keeps on the queue while it has waiters there (`watch_hub`), which
///   also reports if ours goes: no read when our turn comes. On giving
///   up, delete our key.
/// - release: `Txn(create_revision(key) == ours) then delete` (one round
///   trip), so no late delete can remove a newer key under the same name.
/// - a dropped (cancelled) acquire takes its key back in the background, as
///   `concurrency.Mutex` does when its context is cancelled.
/// - lease: with no fixed lease the key rides on the instance's session
///   lease (`session_ttl_s`, kept alive every third of it; `lost()` fires
///   when a keepalive cannot be had in time, the lease is gone, or the key
///   was deleted); a fixed lease `d` gets a lease of its own (TTL `d`
///   rounded up to whole seconds, etcd's granularity) that we also revoke
///   at `d`, so the lock ends on time while we live and within the rounded
///   TTL if we crash. It is counted from its grant, or, after a wait, from
///   a keepalive sent once the wait is over.
/// - reentrancy is explicit: [`Guard::reenter`]; acquiring through the
///   handle again is another owner and waits like one.
///
/// [`Guard::reenter`]: distlock::Guard::reenter
pub struct EtcdLock {
    pub(crate) cfg: EtcdConfig,
    pub(crate) client: Client,
    pub(crate) session: tokio::sync::Mutex<Arc<Session>>,
    pub(crate) names: Arc<Names>,
    /// One watch per queue this handle's waiters wait in (issue #19).
    pub(crate) hub: WatchHub,
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl EtcdLock {
    /// What `etcd` declares.
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        // Through the guard (Guard::reenter), counted; never through the handle.
        reentrant: true,
        // Waiters are served in create-revision order.
        fair: true,
        lost_signal: true,
        renewal: true,
        // Raft: an acknowledged key survives the loss of any minority,
        // leader included (leases are extended across an election).
        survives_failover: true,
        token_source: TokenSource::CreateRevision,
    };

    /// Connects one owner handle and grants its session lease.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad setting, [`Error::Backend`] naming the
    /// endpoints when no member answers within `connect_timeout_ms`.
    pub async fn connect(cfg: EtcdConfig) -> Result<Self> {
        let client = client(&cfg).await?;
        let session = distlock::with_deadline(
            BACKEND,
            || format!("first request to {}", cfg.endpoints_shown()),
            cfg.connect_timeout(),
            Session::grant(&client, cfg.session_ttl(), cfg.op_timeout()),
        )
        .await
        .map_err(|e| {
            Error::backend(
                BACKEND,
                format!("connecting to {}", cfg.endpoints_shown()),
                e,
            )
        })?;
        Ok(Self {
            hub: WatchHub::new(client.clone(), cfg.op_timeout()),
            cfg,
            client,
            session: tokio::sync::Mutex::new(session),
            names: Arc::default(),
        })
    }

    /// The raw floor of one lock cycle: a put and a delete of one key on
    /// this client (two round trips, both through raft like ours).
    ///
    /// # Errors
    /// As any request.
    pub async fn floor_round_trip(&self) -> Result<()> {
        let key = format!("{}-floor/{}", self.cfg.prefix, std::process::id());
        let mut kv = self.client.kv_client();
        kv.put(key.as_str(), "", None)
            .await
            .map_err(|e| map_err("floor put", e, true))?;
        kv.delete(key.as_str(), None)
            .await
            .map_err(|e| map_err("floor delete", e, true))?;
        Ok(())
    }

    /// The session lease every watchdog-mode lock of this instance rides on
    /// (for tests and operators: revoking it frees them all).
    pub async fn session_lease(&self) -> i64 {
        self.session.lock().await.id
    }

    /// Fault injection: stops (`true`) or resumes renewing the session
    /// lease, as a stalled process would; its locks are lost when it runs
    /// out.
    pub async fn stop_keepalive(&self, stopped: bool) {
        self.session.lock().await.set_stopped(stopped);
    }

    /// The etcd key range (`[start, end)`) holding the queue of lock `key`.
    pub fn queue_range(&self, key: &str) -> (String, String) {
        let q = Queue::new(&self.cfg.prefix, key);
        (q.dir, q.dir_end)
    }
}
