//! The two-level lock: a local async mutex per key, then the distributed
//! lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, Guard, GuardObserver, ReleaseOutcome, Result,
};
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::KeyMutexes;

/// A [`DistLock`] that queues the tasks of this process on an in-process
/// async mutex per key before one of them goes to the distributed lock.
///
/// With 64 tasks on one hot key, 63 wait in local memory instead of
/// polling or queueing on the server, so the server sees one contender per
/// process. Safety is that of the wrapped lock: every critical section
/// still takes it, and the local permit is handed on only after the remote
/// release has been answered (or has failed), never before.
///
/// The wait budget of [`AcquireOptions::wait`] covers the local wait and
/// the remote acquire together; a try-lock is a try-lock at both levels.
/// The local queue is FIFO (tokio's mutex is fair).
///
/// ```no_run
/// # async fn demo(redis: std::sync::Arc<dyn distlock::DistLock>) -> distlock::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use distlock::{AcquireOptions, DistLock};
/// use lockbench_patterns::LocalFirst;
///
/// let lock = Arc::new(LocalFirst::new(redis));
/// let guard = lock.acquire("coupon:42", AcquireOptions::wait(Duration::from_secs(3))).await?;
/// // ... critical section, fenced with guard.token() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LocalFirst {
    inner: Arc<dyn DistLock>,
    local: KeyMutexes,
}

impl LocalFirst {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn DistLock>) -> Self {
        Self {
            inner,
            local: KeyMutexes::default(),
        }
    }

    /// The wrapped lock.
    pub fn inner(&self) -> &Arc<dyn DistLock> {
        &self.inner
    }
}

/// Holds the local permit until the remote lock is given back.
struct Permit(Mutex<Option<OwnedMutexGuard<()>>>);

impl GuardObserver for Permit {
    fn released(&self, _held: Duration, _outcome: ReleaseOutcome) {
        if let Ok(mut p) = self.0.lock() {
            p.take();
        }
    }
}

#[async_trait::async_trait]
impl DistLock for LocalFirst {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        let start = Instant::now();
        let mutex = self.local.get(key);
        let permit = match opts.wait {
            None => mutex.try_lock_owned().map_err(|_| Error::Timeout {
                key: key.to_string(),
                waited: Duration::ZERO,
            })?,
            Some(wait) => tokio::time::timeout(wait, mutex.lock_owned())
                .await
                .map_err(|_| Error::Timeout {
                    key: key.to_string(),
                    waited: wait,
                })?,
        };
        let remote = AcquireOptions {
            wait: opts.wait.map(|w| w.saturating_sub(start.elapsed())),
            lease: opts.lease,
        };
        // On an error (or a cancelled acquire) the permit drops here, and
        // the next local waiter goes.
        let guard = self.inner.acquire(key, remote).await?;
        guard.observe(Arc::new(Permit(Mutex::new(Some(permit)))));
        Ok(guard)
    }
}
