//! `zookeeper`: Curator's InterProcessMutex recipe, written by us on the
//! `zookeeper-client` crate.
//!
//! This module holds the handle and its session; lock nodes are in `node`,
//! the held lock in `held`, the acquire in `recipe`, the bench probes in
//! `probes`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use distlock::{Capabilities, Error, Result, TokenSource};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{timed, zk_err, BACKEND};
use crate::node::{node_name, CONTAINER, PERSISTENT};
use crate::session::open;

/// ZooKeeper's lock recipe: an EPHEMERAL_SEQUENTIAL node under
/// `<root>/<key>/` (a container); the lowest sequence holds the lock;
/// every other waiter watches only its predecessor (no herd effect).
///
/// One `ZkLock` is one ZooKeeper session, shared by every task that uses
/// the handle. Every acquire is its own owner: its own node, named
/// `_c_<guid>-lock-<seq>` with a GUID drawn for that acquisition, so two
/// tasks of one handle queue and exclude each other exactly as two
/// clients do, and a create whose reply was lost is found again by that
/// GUID (Curator's protected mode) without ever adopting a sibling's node.
/// Reentrancy is explicit ([`Guard::reenter`]).
///
/// An acquire that is dropped (cancelled) or fails after sending deletes
/// its node in the background, as Curator does in `finally`: a queued node
/// would otherwise block everybody behind it for as long as the session.
///
/// The lock lives with the session: there is no lease, so a fixed lease is
/// refused ([`Error::Unsupported`]) and no watchdog runs.
/// [`Guard::valid_until`] is a bound: the send time of the last request the
/// server answered + the session timeout - drift, moved forward by a check
/// every third of the session timeout; the server cannot expire the
/// session earlier. When it passes without contact (disconnected, server
/// unreachable) [`Guard::lost`] fires: the server may hand the lock over
/// from then on, well before the client would declare the session expired
/// (1.4 x the timeout). After an expiry the next acquire opens a new
/// session.
///
/// An uncontended acquire is ONE round trip: ZooKeeper answers a session's
/// requests in order, so the children read is sent right behind the create
/// without waiting for its reply, and sees our node. The release is one
/// more (delete). The fencing token is the lock node's czxid.
///
/// [`Guard::reenter`]: distlock::Guard::reenter
/// [`Guard::valid_until`]: distlock::Guard::valid_until
/// [`Guard::lost`]: distlock::Guard::lost
pub struct ZkLock {
    pub(crate) cfg: Arc<ZkConfig>,
    client: Mutex<zk::Client>,
    reconnecting: tokio::sync::Mutex<()>,
    pub(crate) wakeups: Arc<AtomicU64>,
    /// The session's watches on contended lock directories.
    pub(crate) hub: Arc<crate::hub::Hub>,
}

impl std::fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLock")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl ZkLock {
    /// What `zookeeper` declares. Fair: waiters queue by sequence number.
    /// Reentrant through [`Guard::reenter`] only (an acquire through the
    /// handle is always a new owner). Survives failover: the lock node is
    /// replicated by the quorum, and the session moves to another server.
    /// No renewal: the lock lives as long as the session. Fencing: the
    /// czxid is in the transaction log, so it survives restarts.
    ///
    /// [`Guard::reenter`]: distlock::Guard::reenter
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        reentrant: true,
        fair: true,
        lost_signal: true,
        renewal: false,
        survives_failover: true,
        token_source: TokenSource::Czxid,
    };

    /// Opens a session and creates the root node.
    ///
    /// # Errors
    /// Bad config (naming the key), or an unreachable ensemble (naming
    /// the connect string).
    pub async fn connect(cfg: ZkConfig) -> Result<Self> {
        cfg.validate()?;
        let client = open(&cfg).await?;
        match timed(
            cfg.op_timeout(),
            "mkdir",
            client.mkdir(&cfg.root, &PERSISTENT),
        )
        .await?
        {
            Ok(()) => {}
            Err(e) => {
                // mkdir makes every parent, so "no node" here means the
                // connect string's chroot is missing: ZooKeeper creates
                // none, and the server's message does not say so.
                let (_, chroot) = crate::config::hosts_and_chroot(&cfg.connect);
                let hint = match (&e, chroot) {
                    (zk::Error::NoNode, Some(c)) => {
                        format!(" (the chroot /{c} of the connect string must exist)")
                    }
                    _ => String::new(),
                };
                return Err(zk_err(
                    format!("creating {} on {}{hint}", cfg.root, cfg.connect),
                    e,
                ));
            }
        }
        Ok(Self {
            cfg: Arc::new(cfg),
            client: Mutex::new(client),
            reconnecting: tokio::sync::Mutex::new(()),
            wakeups: Arc::default(),
            hub: Arc::default(),
        })
    }

    /// The directory of `key`'s lock nodes.
    pub fn lock_dir(&self, key: &str) -> String {
        format!("{}/{}", self.cfg.root, node_name(key))
    }

    /// How many watch notifications woke a waiter of this handle so far.
    /// Without a herd effect each release wakes exactly one waiter.
    pub fn watch_wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// The current session's id (for fault injection and tests).
    ///
    /// # Errors
    /// Never in practice (a poisoned lock).
    pub fn session_id(&self) -> Result<i64> {
        Ok(self.current()?.session_id().0)
    }

    fn current(&self) -> Result<zk::Client> {
        self.client
            .lock()
            .map(|c| c.clone())
            .map_err(|_| Error::backend(BACKEND, "session", "session lock poisoned"))
    }

    /// The session, replaced by a new one if it has ended (expired,
    /// closed): Curator does the same after an expiry.
    pub(crate) async fn session(&self) -> Result<zk::Client> {
        let c = self.current()?;
        if !c.state().is_terminated() {
            return Ok(c);
        }
        let _one = self.reconnecting.lock().await;
        let c = self.current()?;
        if !c.state().is_terminated() {
            return Ok(c);
        }
        tracing::warn!(connect = %self.cfg.connect, state = %c.state(), "session ended; opening a new one");
        let fresh = open(&self.cfg).await?;
        if let Ok(mut slot) = self.client.lock() {
            *slot = fresh.clone();
        }
        Ok(fresh)
    }

    /// Creates the container directory of a key (and the root, should an
    /// operator have deleted it).
    pub(crate) async fn make_dir(
        &self,
        client: &zk::Client,
        dir: &str,
        rt: &mut u32,
    ) -> Result<()> {
        let op = self.cfg.op_timeout();
        for _ in 0..2 {
            *rt += 1;
            match timed(op, "create lock dir", client.create(dir, &[], &CONTAINER)).await? {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    *rt += 1;
                    let root = &self.cfg.root;
                    timed(op, "mkdir", client.mkdir(root, &PERSISTENT))
                        .await?
                        .map_err(|e| zk_err(format!("creating {root}"), e))?;
                }
                Err(e) => return Err(zk_err(format!("creating {dir}"), e)),
            }
        }
        Err(Error::backend(
            BACKEND,
            format!("creating {dir}"),
            "its parent keeps vanishing",
        ))
    }
}
