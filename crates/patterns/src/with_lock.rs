//! A critical section that cannot outlive its lock.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock, Error, FencingToken, LostReason};
use futures::FutureExt;

use crate::KeyMutexes;

/// What [`with_lock`] does when the backend cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUnreachable {
    /// Fail with [`WithLockError::Acquire`] naming the backend error. The
    /// only safe choice when more than one process runs the section.
    #[default]
    FailClosed,
    /// Run the section under a process-wide local mutex for the key, with
    /// no fencing token. UNSAFE across processes: two processes that both
    /// lose the backend both enter. Every use is logged at `warn` and
    /// counted ([`degraded_sections`], and `lockbench_degraded_total` with
    /// the `metrics` feature).
    DegradeToLocal,
}

/// How [`with_lock`] takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WithLockOptions {
    /// Wait budget and lease, as for [`DistLock::acquire`].
    pub acquire: AcquireOptions,
    /// What to do when the backend is unreachable.
    pub on_unreachable: OnUnreachable,
}

impl WithLockOptions {
    /// Wait up to `wait`, lease renewed by the watchdog, fail closed.
    pub fn wait(wait: Duration) -> Self {
        Self {
            acquire: AcquireOptions::wait(wait),
            on_unreachable: OnUnreachable::FailClosed,
        }
    }

    /// The same options, degrading to a local lock when unreachable.
    #[must_use]
    pub fn degrade_to_local(mut self) -> Self {
        self.on_unreachable = OnUnreachable::DegradeToLocal;
        self
    }
}

/// What the critical section is given.
#[derive(Debug, Clone)]
pub struct LockCtx {
    key: String,
    token: Option<FencingToken>,
    degraded: bool,
}

impl LockCtx {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The guard's fencing token: write it with every change to the
    /// protected resource and have the resource refuse older ones. `None`
    /// for a backend without tokens and for a degraded section.
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// True when the section runs under [`OnUnreachable::DegradeToLocal`]'s
    /// local mutex only: no other process is excluded.
    pub fn degraded(&self) -> bool {
        self.degraded
    }
}

/// Why [`with_lock`] did not return the section's value.
#[derive(Debug, thiserror::Error)]
pub enum WithLockError<E> {
    /// The lock was not taken (timeout, or an unreachable backend under
    /// [`OnUnreachable::FailClosed`]); the section did not run.
    #[error("lock {key:?} not taken, the critical section did not run: {source}")]
    Acquire {
        /// The lock key.
        key: String,
        /// The backend's error.
        #[source]
        source: Error,
    },
    /// The lock was lost while the section ran: its future was dropped at
    /// its next await (failing closed), and whatever it had done before may
    /// need the fencing token's protection.
    #[error("lock {key:?} lost during the critical section ({reason}): the section was cancelled")]
    Lost {
        /// The lock key.
        key: String,
        /// Why the lock is known lost.
        reason: LostReason,
    },
    /// The section finished, but when it was released the lock was no
    /// longer ours (the seed's "unlock script returned 0"): somebody else
    /// may have held it during the section's last part.
    #[error("lock {key:?} was no longer ours when released: the section may have overlapped another holder")]
    Gone {
        /// The lock key.
        key: String,
    },
    /// The section finished but its release failed; the lease will run out
    /// on its own.
    #[error("releasing lock {key:?} failed: {source}")]
    Release {
        /// The lock key.
        key: String,
        /// The backend's error.
        #[source]
        source: Error,
    },
    /// The section itself failed (the lock was released).
    #[error("critical section under lock {key:?} failed: {error}")]
    Body {
        /// The lock key.
        key: String,
        /// The section's error.
        error: E,
    },
}

static DEGRADED: AtomicU64 = AtomicU64::new(0);

/// Critical sections run degraded (under a local lock only) by this
/// process so far.
pub fn degraded_sections() -> u64 {
    DEGRADED.load(Ordering::Relaxed)
}

fn local_locks() -> &'static KeyMutexes {
    static LOCKS: OnceLock<KeyMutexes> = OnceLock::new();
    LOCKS.get_or_init(KeyMutexes::default)
}

/// Takes `key`, runs `body` with the fencing token, and releases on every
/// exit path.
///
/// - The section's future is raced against [`distlock::Guard::lost`]: when
///   the lock is lost the future is dropped and the call fails with
///   [`WithLockError::Lost`].
/// - A panic in the section releases the lock, then resumes the panic.
/// - A release that finds the lock gone is [`WithLockError::Gone`], not a
///   success.
///
/// ```no_run
/// # async fn demo(lock: &dyn distlock::DistLock) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use lockbench_patterns::{with_lock, WithLockOptions};
///
/// let order = with_lock(lock, "coupon:42", WithLockOptions::wait(Duration::from_secs(3)), |ctx| async move {
///     // write ctx.token() with the order; the store refuses older tokens
///     Ok::<_, std::io::Error>(format!("order under token {:?}", ctx.token()))
/// })
/// .await?;
/// # let _ = order; Ok(()) }
/// ```
///
/// # Errors
/// See [`WithLockError`].
pub async fn with_lock<T, E, F, Fut>(
    lock: &dyn DistLock,
    key: &str,
    opts: WithLockOptions,
    body: F,
) -> Result<T, WithLockError<E>>
where
    F: FnOnce(LockCtx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let guard = match lock.acquire(key, opts.acquire).await {
        Ok(g) => g,
        Err(e @ Error::Backend { .. }) if opts.on_unreachable == OnUnreachable::DegradeToLocal => {
            return degraded(lock.name(), key, opts.acquire.wait, e, body).await;
        }
        Err(source) => {
            return Err(WithLockError::Acquire {
                key: key.to_string(),
                source,
            })
        }
    };
    let ctx = LockCtx {
        key: key.to_string(),
        token: guard.token(),
        degraded: false,
    };
    let lost = guard.lost();
    let run = AssertUnwindSafe(body(ctx)).catch_unwind();
    let finished = tokio::select! {
        // A section that is ready wins over a loss seen in the same poll:
        // it did its work while we could still vouch for the lock.
        biased;
        r = run => Ok(r),
        reason = lost => Err(reason),
    };
    let key = key.to_string();
    match finished {
        Err(reason) => {
            if let Err(e) = guard.release().await {
                tracing::debug!(%key, error = %e, "release of a lost lock failed");
            }
            Err(WithLockError::Lost { key, reason })
        }
        Ok(Err(panic)) => {
            if let Err(e) = guard.release().await {
                tracing::warn!(%key, error = %e, "release after a panic in the section failed");
            }
            std::panic::resume_unwind(panic)
        }
        Ok(Ok(Err(source))) => {
            match guard.release().await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(%key, "section failed and its lock was already gone"),
                Err(e) => tracing::warn!(%key, error = %e, "release after a failed section failed"),
            }
            Err(WithLockError::Body { key, error: source })
        }
        Ok(Ok(Ok(value))) => match guard.release().await {
            Ok(true) => Ok(value),
            Ok(false) => Err(WithLockError::Gone { key }),
            Err(source) => Err(WithLockError::Release { key, source }),
        },
    }
}

async fn degraded<T, E, F, Fut>(
    backend: &'static str,
    key: &str,
    wait: Option<Duration>,
    cause: Error,
    body: F,
) -> Result<T, WithLockError<E>>
where
    F: FnOnce(LockCtx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mutex = local_locks().get(key);
    let permit = match wait {
        None => mutex.try_lock_owned().ok(),
        Some(w) => tokio::time::timeout(w, mutex.lock_owned()).await.ok(),
    };
    let Some(_permit) = permit else {
        return Err(WithLockError::Acquire {
            key: key.to_string(),
            source: Error::Timeout {
                key: key.to_string(),
                waited: wait.unwrap_or_default(),
            },
        });
    };
    let n = DEGRADED.fetch_add(1, Ordering::Relaxed) + 1;
    #[cfg(feature = "metrics")]
    metrics::counter!("lockbench_degraded_total", "backend" => backend).increment(1);
    tracing::warn!(
        %key, backend, error = %cause, degraded_sections = n,
        "backend unreachable: running the critical section under a process-local lock only, \
         which does NOT exclude other processes"
    );
    let ctx = LockCtx {
        key: key.to_string(),
        token: None,
        degraded: true,
    };
    body(ctx).await.map_err(|error| WithLockError::Body {
        key: key.to_string(),
        error,
    })
}
