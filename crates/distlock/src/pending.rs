//! Withdrawing an acquisition whose acquire never returned a guard.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, HeldLock};

/// An acquisition in flight. Created before the first request goes out and
/// settled when the acquire returns; if the acquire future is dropped
/// instead (a `timeout`, a `select!`, a cancelled task) or ends with an
/// outcome the server may not share (a timeout after sending), whatever it
/// may have taken or queued is withdrawn in the background through
/// [`HeldLock::release`]: Curator's delete-in-`finally`, etcd's Mutex on
/// context cancel.
///
/// This is safe only because owner values are unique per acquisition: the
/// withdrawal compares against this acquisition's own owner, so it can
/// never touch a later acquisition, even by the same handle.
#[must_use = "dropping it at once withdraws the acquisition"]
pub struct Pending {
    key: String,
    held: Option<Arc<dyn HeldLock>>,
    /// Where the acquire ran: a future dropped off it (a plain thread)
    /// withdraws there.
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("key", &self.key)
            .field("armed", &self.held.is_some())
            .finish()
    }
}

impl Pending {
    /// Arms the withdrawal of the acquisition `held` stands for.
    pub fn new(key: &str, held: Arc<dyn HeldLock>) -> Self {
        Self {
            key: key.to_string(),
            held: Some(held),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// The acquire returned: a guard now owns the lock, or the server said
    /// a definite no ([`Error::Timeout`]: nothing of ours is there). Any
    /// other error may have left something behind, so it is withdrawn.
    pub fn settle<T>(mut self, result: &Result<T, Error>) {
        if matches!(result, Ok(_) | Err(Error::Timeout { .. })) {
            self.held = None;
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let key = std::mem::take(&mut self.key);
        let rt = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.take());
        if let Some(rt) = rt {
            rt.spawn(withdraw(key, held));
        }
    }
}

/// Goes on releasing, in the background, an acquisition whose release
/// failed without an answer (the server restarting, stalled or cut off):
/// the key stayed held for the rest of its lease (30 s at a watchdog's
/// default) after a 2 s outage. Each try compares against this
/// acquisition's own owner, node or session, so a try that lands after
/// the lease ran out and another holder took the key does nothing.
pub(crate) fn release_later(key: String, held: Arc<dyn HeldLock>) {
    // Outside a runtime nothing can be sent: the lease runs out instead.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            // The caller's own try has just failed.
            tokio::time::sleep(Duration::from_millis(100)).await;
            keep_releasing(&key, &*held, "a failed release").await;
        });
    }
}

/// Releases `held` until the server answers, for up to [`WITHDRAW_FOR`],
/// with naps doubling from 100 ms to 2 s; whether it answered. `what`
/// names it in the logs.
async fn keep_releasing(key: &str, held: &dyn HeldLock, what: &str) -> bool {
    let t0 = Instant::now();
    let mut nap = Duration::from_millis(100);
    loop {
        match held.release().await {
            Ok(found) => {
                tracing::debug!(%key, found, "{what}: done");
                return true;
            }
            Err(e) if t0.elapsed() >= WITHDRAW_FOR => {
                tracing::warn!(%key, error = %e, "{what}: failed for {WITHDRAW_FOR:?}; what it holds ends with its lease");
                return false;
            }
            Err(e) => {
                tracing::debug!(%key, error = %e, "{what}: failed; trying again");
                tokio::time::sleep(nap).await;
                nap = (nap * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// How long a withdrawal keeps asking a server that does not answer.
const WITHDRAW_FOR: Duration = Duration::from_secs(60);

/// When a withdrawal asks again after its first answer.
const RECHECKS: [Duration; 3] = [
    Duration::from_millis(500),
    Duration::from_secs(2),
    Duration::from_secs(5),
];

/// Withdraws `held` until the server answers (a stalled server answers
/// nothing: one try, given up, left the acquisition's request to land on
/// resume and hold the key for a whole lease), then asks again a few
/// times: a request the acquisition sent before the stall, on another
/// connection, may be served after our answer. Asking again can never
/// touch a later acquisition: the releases compare against this
/// acquisition's own owner (Redis, RedLock, the PostgreSQL rows), its own
/// node (ZooKeeper), or are one-shot (etcd's queue key, which deletes by
/// its create revision or by a name reserved to it, and retries in the
/// background on its own).
async fn withdraw(key: String, held: Arc<dyn HeldLock>) {
    if !keep_releasing(&key, &*held, "withdrawing an unfinished acquisition").await {
        return;
    }
    let mut at = Duration::ZERO;
    for check in RECHECKS {
        tokio::time::sleep(check - at).await;
        at = check;
        if let Ok(true) = held.release().await {
            tracing::debug!(%key, "withdrew a request of an unfinished acquisition that landed late");
        }
    }
}
