//! One persistent recursive watch per lock directory per session, shared by
//! every waiter of that lock in this client.
//!
//! Curator's recipe watches the predecessor and, when it goes, reads the
//! children again to learn whether anyone is still ahead: three round trips
//! per contended acquire (create + children, getData + watch, children
//! again), measured 3.0 at 4 and at 16 workers; our release marker (see
//! `held::RELEASED`) saves the last read, so two. A waiter that knows the
//! nodes ahead of it (the children read pipelined behind its create) and
//! hears every deletion in the directory needs no more requests: when the
//! last node ahead is gone, no node can come ahead of it again (sequence
//! numbers only grow), so it holds the lock. `AddWatch` (ZooKeeper 3.6+)
//! gives that stream; the server sends each deletion to every client
//! listening on the directory (one notification per client per release,
//! no request), where Curator's waiters would each send a read.
//!
//! The watch is added only when an acquire of this client first has to
//! wait on a key (the uncontended path sends nothing new), and dropped once
//! no waiter has listened for [`LINGER`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;
use zookeeper_client as zk;

/// How long a directory's watch is kept with nobody waiting, so that a hot
/// key's next waiter finds it there.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// Waiters that fall this far behind the stream read the queue again.
const BUFFER: usize = 1024;

/// The name of a deleted child of a lock directory.
pub(crate) type Deleted = Arc<str>;

struct DirWatch {
    tx: broadcast::Sender<Deleted>,
    session: zk::SessionId,
}

/// The watches of one [`crate::ZkLock`], by lock directory.
#[derive(Default)]
pub(crate) struct Hub {
    dirs: Mutex<HashMap<String, Arc<DirWatch>>>,
}

impl Hub {
    /// Listens to `dir`'s deletions if this session already watches it:
    /// subscribed now, so every deletion processed by the server after a
    /// request sent from here on reaches the receiver.
    pub(crate) fn listen(
        &self,
        client: &zk::Client,
        dir: &str,
    ) -> Option<broadcast::Receiver<Deleted>> {
        let dirs = self.dirs.lock().ok()?;
        let w = dirs.get(dir)?;
        (w.session == client.session_id()).then(|| w.tx.subscribe())
    }

    /// Listens to `dir` through `watcher`, the session's new watch on it
    /// (added in the same pipeline as the caller's children read, so the
    /// read misses no deletion). Returns the receiver, and false if
    /// another waiter of this session had just added one: then the new
    /// watch is dropped and the caller, subscribed only now, reads again.
    pub(crate) fn adopt(
        self: &Arc<Self>,
        client: &zk::Client,
        dir: &str,
        watcher: zk::PersistentWatcher,
    ) -> (broadcast::Receiver<Deleted>, bool) {
        let Ok(mut dirs) = self.dirs.lock() else {
            // Nobody will send on it: the waiter sees it closed and falls
            // back to watching its predecessor.
            return (broadcast::channel(1).1, true);
        };
        if let Some(w) = dirs.get(dir) {
            if w.session == client.session_id() {
                return (w.tx.subscribe(), false);
            }
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        let w = Arc::new(DirWatch {
            tx: tx.clone(),
            session: client.session_id(),
        });
        dirs.insert(dir.to_string(), w.clone());
        let (hub, dir) = (Arc::downgrade(self), dir.to_string());
        tokio::spawn(async move {
            run(watcher, &dir, &tx).await;
            // Closing the channel tells the waiters to fall back.
            if let Some(hub) = hub.upgrade() {
                hub.forget(&dir, &w);
            }
        });
        (rx, true)
    }

    /// Drops `dir`'s feed (a re-check found a deletion it never reported):
    /// its waiters see the channel close; the next wait adds a new watch.
    pub(crate) fn reset(&self, dir: &str) {
        if let Ok(mut dirs) = self.dirs.lock() {
            dirs.remove(dir);
        }
    }

    fn forget(&self, dir: &str, w: &Arc<DirWatch>) {
        if let Ok(mut dirs) = self.dirs.lock() {
            if dirs.get(dir).is_some_and(|cur| Arc::ptr_eq(cur, w)) {
                dirs.remove(dir);
            }
        }
    }
}

/// Forwards the directory's deletions until the session ends or nobody
/// has listened for [`LINGER`].
async fn run(mut watcher: zk::PersistentWatcher, dir: &str, tx: &broadcast::Sender<Deleted>) {
    let prefix = format!("{dir}/");
    let mut idle_since: Option<Instant> = None;
    loop {
        let event = tokio::time::timeout(LINGER, watcher.changed()).await.ok();
        if tx.receiver_count() == 0 {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= LINGER {
                return;
            }
        } else {
            idle_since = None;
        }
        let Some(event) = event else { continue };
        match event.event_type {
            zk::EventType::NodeDeleted => {
                if let Some(name) = event.path.strip_prefix(&prefix) {
                    if !name.contains('/') {
                        let _ = tx.send(name.into());
                    }
                }
            }
            // A disconnection ends the feed: after the session moved to
            // another server its persistent watch was seen to go deaf (no
            // event again, measured in a minority partition), and events
            // during the reconnection may be lost anyway (ZOOKEEPER-4698).
            // Waiters add a fresh watch or fall back; after a terminal state
            // the watcher must not be polled again either (the crate panics).
            zk::EventType::Session if event.session_state != zk::SessionState::SyncConnected => {
                return;
            }
            _ => {}
        }
    }
}

/// How a waiter's listening ended.
pub(crate) enum Heard {
    /// Every node that was ahead is gone: ours is the lowest.
    NoneAhead,
    /// Read the queue again (events may be missing, or our own node went).
    Relist,
    /// Nothing heard for a while: read the queue to check the feed.
    Recheck,
    /// The watch is gone: fall back to watching the predecessor.
    Closed,
    /// The wait budget ran out.
    Deadline,
}

/// Listens until every node in `ahead` has been deleted, `recheck` is
/// due, or `deadline`.
pub(crate) async fn await_none_ahead(
    rx: &mut broadcast::Receiver<Deleted>,
    ahead: &mut std::collections::HashSet<String>,
    mine: &str,
    recheck: Instant,
    deadline: Instant,
) -> Heard {
    if ahead.is_empty() {
        return Heard::NoneAhead;
    }
    loop {
        let r = tokio::select! {
            r = rx.recv() => r,
            _ = tokio::time::sleep_until(recheck.min(deadline)) => {
                return if Instant::now() >= deadline { Heard::Deadline } else { Heard::Recheck };
            }
        };
        match r {
            Ok(name) => {
                if &*name == mine {
                    return Heard::Relist;
                }
                if ahead.remove(&*name) && ahead.is_empty() {
                    return Heard::NoneAhead;
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => return Heard::Relist,
            Err(broadcast::error::RecvError::Closed) => return Heard::Closed,
        }
    }
}
