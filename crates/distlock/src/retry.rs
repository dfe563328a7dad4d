//! Retrying an acquisition within its wait budget after a passing failure.
//!
//! A server restarting, failing over or stalled answers an acquire with an
//! error that says nothing about the key: within a wait budget that is a
//! wait, not an answer (waiters of every backend gave up a fraction of a
//! second into outages of a few seconds, with most of their budget left).
//! [`retry_within_budget`] is that loop, written once for the backends
//! that retry on a new attempt: the Redis lock, the PostgreSQL row locks
//! and the ZooKeeper recipe.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, HeldLock, Pending, Result};

/// Runs attempts at an acquisition until one answers, or the wait budget
/// (`deadline`) is spent, each attempt under its own state.
///
/// Each attempt:
/// 1. `begin` makes the attempt's own state (an owner value, a queued
///    node, ...), what a withdrawal of the attempt compares against. An
///    error here is returned as it is, with no retry and no in-doubt
///    substitution: no attempt was made.
/// 2. A [`Pending`] for that state is armed *before* `run` sends anything:
///    if the acquire future is dropped at any later await, or the attempt
///    ends not knowing whether what it sent landed, what it may have taken
///    or queued is withdrawn in the background (and asked for again after
///    the server's first answer, for a request that lands after it).
/// 3. `run` makes the attempt; its result settles the `Pending`.
///
/// An attempt that failed with an error `passing` accepts (a passing state
/// of the deployment: a restart, a failover, a stall), while `deadline` is
/// still ahead, is followed by a nap and a new attempt under new state: a
/// request the old attempt sent may land later, and under the same state
/// it would take the lock back from our own later attempt, or after our
/// release. The nap is `nap(&error, retries)` (`retries` counts from 1),
/// never past `deadline`; growing naps keep a long outage from piling up
/// withdrawals. `nap` is also where a backend logs the retry, if it does:
/// a line written there keeps its backend's target (module path), which
/// log filters select by.
///
/// A try-lock (`deadline` `None`) makes one attempt and answers at once.
///
/// # Errors
/// The last attempt's error, except that an [`Error::Timeout`] after an
/// attempt in doubt is that attempt's error instead: "not ours" would be
/// wrong while an earlier attempt, in doubt, may still hold the lock (a
/// key, a row, a queued node) until its withdrawal lands.
pub async fn retry_within_budget<S, T, P, N, B, BFut, R, RFut>(
    key: &str,
    deadline: Option<Instant>,
    passing: P,
    mut nap: N,
    mut begin: B,
    mut run: R,
) -> Result<T>
where
    S: HeldLock + 'static,
    P: Fn(&Error) -> bool,
    N: FnMut(&Error, u32) -> Duration,
    B: FnMut() -> BFut,
    BFut: Future<Output = Result<Arc<S>>>,
    R: FnMut(Arc<S>) -> RFut,
    RFut: Future<Output = Result<T>>,
{
    let mut retries = 0u32;
    let mut in_doubt = None;
    loop {
        let state = begin().await?;
        let pending = Pending::new(key, state.clone());
        let r = run(state).await;
        pending.settle(&r);
        match r {
            Err(e) if passing(&e) && deadline.is_some_and(|d| Instant::now() < d) => {
                retries = retries.saturating_add(1);
                let nap = nap(&e, retries);
                let left = deadline.map_or(Duration::ZERO, |d| {
                    d.saturating_duration_since(Instant::now())
                });
                tokio::time::sleep(nap.min(left)).await;
                in_doubt = Some(e);
            }
            r => {
                return match (r, in_doubt) {
                    (Err(Error::Timeout { .. }), Some(e)) => Err(e),
                    (r, _) => r,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// One attempt's state: counts the withdrawals `Pending` makes of it.
    #[derive(Debug)]
    struct Probe {
        id: u32,
        releases: AtomicU32,
    }

    #[async_trait::async_trait]
    impl HeldLock for Probe {
        async fn release(&self) -> Result<bool> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            Ok(false)
        }

        async fn renew(&self, _: Duration) -> Result<bool> {
            Ok(false)
        }
    }

    /// The attempts made, in order.
    #[derive(Default)]
    struct Made(Mutex<Vec<Arc<Probe>>>);

    impl Made {
        fn begin(&self) -> std::future::Ready<Result<Arc<Probe>>> {
            let mut made = self.0.lock().unwrap();
            let p = Arc::new(Probe {
                id: u32::try_from(made.len()).unwrap(),
                releases: AtomicU32::new(0),
            });
            made.push(p.clone());
            std::future::ready(Ok(p))
        }

        /// Which attempts `Pending` withdrew (it may ask more than once).
        fn withdrawn(&self) -> Vec<bool> {
            let made = self.0.lock().unwrap();
            made.iter()
                .map(|p| p.releases.load(Ordering::SeqCst) > 0)
                .collect()
        }
    }

    fn stalled() -> Error {
        Error::indeterminate("test", "acquire", "no reply within 1s")
    }

    fn timeout() -> Error {
        Error::Timeout {
            key: "k".into(),
            waited: Duration::ZERO,
        }
    }

    /// Lets the background withdrawals run their first try.
    async fn settle_down() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_passing_error_then_success_retries_under_new_state() {
        let made = Made::default();
        let naps = Mutex::new(Vec::new());
        let t0 = Instant::now();
        let r = retry_within_budget(
            "k",
            Some(t0 + Duration::from_secs(5)),
            Error::is_indeterminate,
            |_, n| {
                naps.lock().unwrap().push(n);
                Duration::from_millis(100)
            },
            || made.begin(),
            |p: Arc<Probe>| async move {
                match p.id {
                    0 => Err(stalled()),
                    id => Ok(id),
                }
            },
        )
        .await;
        assert_eq!(r.unwrap(), 1, "the second attempt, with its own state");
        assert_eq!(*naps.lock().unwrap(), [1]);
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        settle_down().await;
        // The attempt in doubt is withdrawn; the one that won is kept.
        assert_eq!(made.withdrawn(), [true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_after_an_attempt_in_doubt_is_that_doubt() {
        let made = Made::default();
        let t0 = Instant::now();
        let r: Result<()> = retry_within_budget(
            "k",
            Some(t0 + Duration::from_secs(1)),
            Error::is_indeterminate,
            |_, _| Duration::from_millis(100),
            || made.begin(),
            |_| async move {
                if t0.elapsed() < Duration::from_millis(500) {
                    Err(stalled())
                } else {
                    Err(timeout())
                }
            },
        )
        .await;
        let e = r.unwrap_err();
        assert!(e.is_indeterminate(), "{e}: not the in-doubt error");
        // Attempts at 0, 100, ..., 500 ms.
        assert_eq!(made.0.lock().unwrap().len(), 6);
        settle_down().await;
        // A definite no needs no withdrawal.
        assert_eq!(made.withdrawn(), [true, true, true, true, true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn passing_errors_until_the_deadline_end_in_the_last_one_and_naps_stop_at_it() {
        let made = Made::default();
        let naps = Mutex::new(Vec::new());
        let t0 = Instant::now();
        let r: Result<()> = retry_within_budget(
            "k",
            Some(t0 + Duration::from_secs(1)),
            Error::is_indeterminate,
            |_, n| {
                naps.lock().unwrap().push(n);
                Duration::from_millis(300)
            },
            || made.begin(),
            |_| async { Err(stalled()) },
        )
        .await;
        assert!(r.unwrap_err().is_indeterminate());
        // Attempts at 0, 300, 600, 900 and, the last nap cut short, 1000 ms.
        assert_eq!(*naps.lock().unwrap(), [1, 2, 3, 4]);
        assert_eq!(made.0.lock().unwrap().len(), 5);
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_with_nothing_in_doubt_stays_a_timeout() {
        let made = Made::default();
        let r: Result<()> = retry_within_budget(
            "k",
            Some(Instant::now() + Duration::from_secs(1)),
            Error::is_indeterminate,
            |_, _| Duration::from_millis(100),
            || made.begin(),
            |_| async { Err(timeout()) },
        )
        .await;
        assert!(matches!(r, Err(Error::Timeout { .. })));
        settle_down().await;
        assert_eq!(made.withdrawn(), [false]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_that_is_not_passing_is_returned_at_once() {
        let made = Made::default();
        let t0 = Instant::now();
        let r: Result<()> = retry_within_budget(
            "k",
            Some(t0 + Duration::from_secs(5)),
            Error::is_indeterminate,
            |_, _| Duration::from_millis(100),
            || made.begin(),
            |_| async { Err(Error::backend("test", "acquire", "refused by policy")) },
        )
        .await;
        let e = r.unwrap_err();
        assert!(!e.is_indeterminate() && e.to_string().contains("by policy"));
        assert_eq!(made.0.lock().unwrap().len(), 1);
        assert_eq!(t0.elapsed(), Duration::ZERO);
        settle_down().await;
        // Not a definite no: withdrawn all the same.
        assert_eq!(made.withdrawn(), [true]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_lock_makes_one_attempt() {
        let made = Made::default();
        let t0 = Instant::now();
        let r: Result<()> = retry_within_budget(
            "k",
            None,
            Error::is_indeterminate,
            |_, _| Duration::from_millis(100),
            || made.begin(),
            |_| async { Err(stalled()) },
        )
        .await;
        assert!(r.unwrap_err().is_indeterminate());
        assert_eq!(made.0.lock().unwrap().len(), 1);
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_making_the_state_is_returned_as_it_is() {
        let made = Made::default();
        let begins = AtomicU32::new(0);
        let runs = AtomicU32::new(0);
        let r: Result<()> = retry_within_budget(
            "k",
            Some(Instant::now() + Duration::from_secs(5)),
            Error::is_indeterminate,
            |_, _| Duration::from_millis(100),
            || {
                // The first attempt gets its state; the second cannot.
                let first = begins.fetch_add(1, Ordering::SeqCst) == 0;
                let made = &made;
                async move {
                    if first {
                        made.begin().await
                    } else {
                        Err(Error::indeterminate("test", "session", "connect: no reply"))
                    }
                }
            },
            |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Err(stalled()) }
            },
        )
        .await;
        let e = r.unwrap_err();
        assert!(e.to_string().contains("session"), "{e}");
        assert_eq!(begins.load(Ordering::SeqCst), 2);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
