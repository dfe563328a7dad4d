//! Lock nodes: the kinds of node we create, how a key and a sequence
//! number become node names, and how one acquisition's node is found and
//! deleted again, even after a create whose reply was lost (Curator's
//! protected mode).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{Error, HeldLock, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{lost_connection, zk_err, BACKEND};
use crate::session::await_connected;

/// The part of a lock node's name before its sequence number, as in
/// Curator (`_c_<uuid>-lock-0000000042`).
const LOCK_NAME: &str = "-lock-";

pub(crate) const EPHEMERAL_SEQUENTIAL: zk::CreateOptions<'static> =
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
/// Lock directories are containers: the server deletes them once their
/// last lock node is gone, so one-off keys leave nothing behind.
pub(crate) const CONTAINER: zk::CreateOptions<'static> =
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
pub(crate) const PERSISTENT: zk::CreateOptions<'static> =
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());

/// The node name for a lock key: the key itself where it is a safe node
/// name, `%XX` for every other byte (`/` would make a path). Injective, so
/// two keys never share a lock directory.
pub fn node_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() {
        // An empty name is no node; `%` alone is no encoded key.
        out.push('%');
    }
    out
}

/// The sequence number of a lock node name, `None` for a foreign node.
pub(crate) fn sequence_of(child: &str) -> Option<i64> {
    let (_, seq) = child.rsplit_once(LOCK_NAME)?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// Deletes one acquisition's lock node: `path` if we know it, else the
/// child of `dir` named with the acquisition's unique `prefix` (Curator's
/// protected mode: the create's reply was never seen). Retries through
/// connection trouble until the node is gone or the session has ended
/// (which deletes an ephemeral node too): a node left behind would block
/// every later waiter for as long as the session lives. `Ok(true)` if this
/// call deleted it.
///
/// The prefix holds a GUID drawn for this acquisition alone, so the search
/// can never pick a node of another acquisition, even one of a sibling
/// task on the same session.
async fn withdraw(
    client: &zk::Client,
    dir: &str,
    prefix: &str,
    mut path: Option<String>,
    op: Duration,
) -> Result<bool> {
    // Bounded even if the server keeps failing us while the session lives.
    let give_up = Instant::now() + (client.session_timeout() * 10).max(Duration::from_secs(30));
    // Searching by GUID: look again after each delete, until none is left
    // (one create per attempt; a retried create could, in principle, leave
    // two).
    let search = path.is_none();
    let mut deleted = false;
    loop {
        if client.state().is_terminated() {
            return Ok(deleted);
        }
        let target = match path.clone() {
            Some(p) => Some(p),
            None => match tokio::time::timeout(op, client.list_children(dir)).await {
                Ok(Ok(children)) => match children.into_iter().find(|c| c.starts_with(prefix)) {
                    Some(c) => Some(format!("{dir}/{c}")),
                    // The create never happened (or was already undone).
                    None => return Ok(deleted),
                },
                Ok(Err(zk::Error::NoNode)) => return Ok(deleted),
                Ok(Err(e)) if !lost_connection(&e) => {
                    return match e {
                        zk::Error::SessionExpired | zk::Error::ClientClosed => Ok(deleted),
                        e => Err(zk_err(format!("getChildren {dir}"), e)),
                    }
                }
                _ => None,
            },
        };
        if let Some(p) = target {
            match tokio::time::timeout(op, client.delete(&p, None)).await {
                Ok(Ok(())) if search => {
                    deleted = true;
                    path = None;
                    continue;
                }
                Ok(Ok(())) => return Ok(true),
                Ok(Err(zk::Error::NoNode)) if search => {
                    path = None;
                    continue;
                }
                Ok(Err(zk::Error::NoNode)) => return Ok(deleted),
                Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => return Ok(deleted),
                Ok(Err(e)) if !lost_connection(&e) => return Err(zk_err(format!("delete {p}"), e)),
                r => {
                    tracing::debug!(path = %p, result = ?r.map(|r| r.err()), "delete failed, retrying");
                }
            }
            path = Some(p);
        }
        if Instant::now() >= give_up {
            return Err(Error::indeterminate(
                BACKEND,
                format!("deleting our lock node in {dir}"),
                "the server kept failing while the session lived",
            ));
        }
        let _ = await_connected(client, Instant::now() + op).await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(20..60))).await;
    }
}

/// [`withdraw`] in the background, for a path we know.
pub(crate) fn withdraw_in_background(client: zk::Client, path: String, op: Duration) {
    tokio::spawn(async move {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", &path));
        if let Err(e) = withdraw(&client, dir, name, Some(path.clone()), op).await {
            tracing::warn!(%path, error = %e, "background delete of our lock node failed");
        }
    });
}

/// One acquisition's lock node while the acquire runs, from before its
/// create is sent until the acquire returns: what [`Pending`] deletes in
/// the background if the acquire is dropped (cancelled) or fails with an
/// outcome the server may not share.
///
/// [`Pending`]: distlock::Pending
pub(crate) struct QueuedNode {
    pub(crate) client: zk::Client,
    pub(crate) dir: String,
    /// `_c_<guid>-lock-`: the GUID is drawn for this acquisition alone.
    pub(crate) name_prefix: String,
    op: Duration,
    /// Whether a create may have been sent.
    pub(crate) sent: AtomicBool,
    /// Our node's path, once a create reply (or the protected-mode search)
    /// named it.
    path: Mutex<Option<String>>,
}

impl QueuedNode {
    pub(crate) fn new(client: zk::Client, dir: String, op: Duration) -> Self {
        Self {
            client,
            dir,
            // 128 random bits, as Curator's UUID: unique per acquisition,
            // so two tasks of one session never mistake each other's node.
            name_prefix: format!("_c_{:032x}{LOCK_NAME}", rand::random::<u128>()),
            op,
            sent: AtomicBool::new(false),
            path: Mutex::new(None),
        }
    }

    pub(crate) fn set_path(&self, path: &str) {
        if let Ok(mut p) = self.path.lock() {
            *p = Some(path.to_string());
        }
    }
}

impl std::fmt::Debug for QueuedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedNode")
            .field("dir", &self.dir)
            .field("name_prefix", &self.name_prefix)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for QueuedNode {
    async fn release(&self) -> Result<bool> {
        if !self.sent.load(Ordering::Acquire) {
            return Ok(false);
        }
        let path = self.path.lock().ok().and_then(|p| p.clone());
        withdraw(&self.client, &self.dir, &self.name_prefix, path, self.op).await
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_safe_and_injective() {
        assert_eq!(node_name("coupon:42"), "coupon:42");
        assert_eq!(node_name("a/b"), "a%2Fb");
        assert_eq!(node_name("."), "%2E");
        assert_eq!(node_name(".."), "%2E%2E");
        assert_eq!(node_name(""), "%");
        assert_ne!(node_name("a%2Fb"), node_name("a/b"));
    }

    #[test]
    fn sequences_parse_only_lock_nodes() {
        assert_eq!(sequence_of("_c_ab-0-lock-0000000042"), Some(42));
        assert_eq!(sequence_of("_c_ab-0-lock-"), None);
        assert_eq!(sequence_of("foreign"), None);
        assert_eq!(sequence_of("x-lock-12a"), None);
    }
}
