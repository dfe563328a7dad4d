//! The held lock: its node's release, and the task that keeps the guard's
//! `valid_until` honest (and fires `lost()`) while the session lasts.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{drift, Error, HeldLock, LeaseHandle, LostReason, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{lost_connection, timed, zk_err, BACKEND};
use crate::node::withdraw_in_background;
use crate::session::await_connected;

/// A held lock node.
pub(crate) struct ZkHeld {
    pub(crate) client: zk::Client,
    pub(crate) path: String,
    pub(crate) op: Duration,
    pub(crate) keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for ZkHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkHeld")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// What a releasing holder writes to its node in the transaction that
/// deletes it. A waiter watching the node's data hears `NodeDataChanged`
/// only from a release (a withdrawn waiter or an expired session deletes
/// without it), and a release means every node before this one was gone
/// when it took its turn: the waiter behind it is first without reading
/// the children again (one round trip less per contended acquire).
pub(crate) const RELEASED: &[u8] = b"released";

impl ZkHeld {
    /// Releases the node: the marker and the delete in one transaction,
    /// so no waiter sees the marker on a node that stays.
    async fn hand_over(&self) -> std::result::Result<(), zk::Error> {
        let mut txn = self.client.new_multi_writer();
        txn.add_set_data(&self.path, RELEASED, None)?;
        txn.add_delete(&self.path, None)?;
        txn.commit().await.map(|_| ()).map_err(zk::Error::from)
    }
}

#[async_trait]
impl HeldLock for ZkHeld {
    async fn release(&self) -> Result<bool> {
        if let Ok(mut k) = self.keeper.lock() {
            if let Some(t) = k.take() {
                t.abort();
            }
        }
        let what = || format!("release {}", self.path);
        let mut retried = false;
        loop {
            match timed(self.op, "setData + delete", self.hand_over()).await {
                Ok(Ok(())) => return Ok(true),
                // With our session alive, only our own earlier delete (whose
                // reply was lost) or an operator removes our node.
                Ok(Err(zk::Error::NoNode)) => return Ok(retried),
                // The ephemeral node went with the session.
                Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => return Ok(false),
                Ok(Err(e)) if lost_connection(&e) && !retried => {
                    retried = true;
                    if let Err(e) = await_connected(&self.client, Instant::now() + self.op).await {
                        // The session ended while we waited: so did the node.
                        if self.client.state().is_terminated() {
                            return Ok(false);
                        }
                        withdraw_in_background(self.client.clone(), self.path.clone(), self.op);
                        return Err(e);
                    }
                }
                Ok(Err(e)) => {
                    withdraw_in_background(self.client.clone(), self.path.clone(), self.op);
                    return Err(zk_err(what(), e));
                }
                Err(e) => {
                    withdraw_in_background(self.client.clone(), self.path.clone(), self.op);
                    return Err(e);
                }
            }
        }
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "lease renewal (a ZooKeeper lock lives as long as its session)".into(),
        })
    }
}

/// The heartbeat in flight: when it was sent, and the server's answer.
type Check = Pin<
    Box<
        dyn Future<
                Output = (
                    Instant,
                    std::result::Result<
                        std::result::Result<Option<zk::Stat>, zk::Error>,
                        tokio::time::error::Elapsed,
                    >,
                ),
            > + Send,
    >,
>;

/// Resolves with the check's outcome, or never if none is in flight.
async fn in_flight(check: &mut Option<Check>) -> <Check as Future>::Output {
    match check.as_mut() {
        Some(c) => c.await,
        None => std::future::pending().await,
    }
}

/// Keeps the guard honest while the lock is held. Every third of the
/// session timeout an `exists` on our node moves `valid_until` to that
/// request's send time + the session timeout - drift: the server heard
/// from us no earlier than that send, and expires a session no sooner than
/// the session timeout after it last heard from it. When `valid_until`
/// passes without such an answer (disconnected, server unreachable or
/// stalled) `lost()` fires at once: from then on the server may have
/// expired the session and handed the lock over, long before the client
/// would declare the session expired itself (1.4 x the timeout). An
/// expired or closed session, or our node gone while the session lives,
/// fires `lost()` too.
pub(crate) async fn keep(
    client: zk::Client,
    path: String,
    lease: LeaseHandle,
    session: Duration,
    op: Duration,
    mut valid_until: Instant,
) {
    let every = session / 3;
    // After a failed check, try again soon: each answer moves the bound.
    let retry = (every / 4).max(Duration::from_millis(20));
    let vouch = session.saturating_sub(drift(session));
    let owner = client.session_id().0;
    let mut states = client.state_watcher();
    let mut next = Instant::now() + every;
    let mut check: Option<Check> = None;
    loop {
        tokio::select! {
            s = states.changed() => {
                if s.is_terminated() {
                    tracing::warn!(%path, state = %s, "session ended: lock lost");
                    lease.mark_lost(LostReason::SessionEnded);
                    return;
                }
                if s == zk::SessionState::Disconnected {
                    tracing::warn!(%path, "disconnected: the lock is lost at valid_until unless the session reconnects first");
                } else {
                    // Reconnected: vouch again at once.
                    next = Instant::now();
                }
            }
            _ = tokio::time::sleep_until(valid_until) => {
                tracing::warn!(%path, ?session, "no answer from the server for the session timeout: the session may have expired, lock lost");
                lease.mark_lost(LostReason::RenewalFailed);
                return;
            }
            _ = tokio::time::sleep_until(next), if check.is_none() => {
                let (c, p) = (client.clone(), path.clone());
                check = Some(Box::pin(async move {
                    let sent = Instant::now();
                    (sent, tokio::time::timeout(op, c.check_stat(&p)).await)
                }));
            }
            (sent, r) = in_flight(&mut check) => {
                check = None;
                next = Instant::now() + every;
                match r {
                    Ok(Ok(Some(stat))) if stat.ephemeral_owner == owner => {
                        valid_until = valid_until.max(sent + vouch);
                        lease.set_valid_until(valid_until);
                    }
                    Ok(Ok(_)) => {
                        tracing::warn!(%path, "our lock node is gone while the session lives");
                        lease.mark_lost(LostReason::NotOwner);
                        return;
                    }
                    Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                        lease.mark_lost(LostReason::SessionEnded);
                        return;
                    }
                    // Connection trouble: the last bound stands.
                    _ => next = Instant::now() + retry,
                }
            }
        }
    }
}
