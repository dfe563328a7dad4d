//! The guard of a held lock, and the lease watchdog shared by every
//! lease-based backend.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{FencingToken, LostReason, Result};

/// The clock-drift allowance subtracted from every lease before the client
/// vouches for it: 1 % of the lease + 2 ms, as in the RedLock algorithm.
pub fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// The backend's half of a held lock: what the guard calls to give it back
/// or extend it.
#[async_trait::async_trait]
pub trait HeldLock: Send + Sync + fmt::Debug {
    /// Deletes the lock if (and only if) it is still ours; `Ok(true)` if it was.
    async fn release(&self) -> Result<bool>;

    /// Extends the lease to `lease` from now if the lock is still ours;
    /// `Ok(false)` if it is not.
    async fn renew(&self, lease: Duration) -> Result<bool>;
}

/// How the lease of a held lock is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// A fixed lease: the lock is lost when it runs out.
    Fixed(Duration),
    /// The watchdog renews this lease every third of it.
    Watchdog(Duration),
    /// The backend keeps the lock alive itself (a session, a connection) and
    /// reports through [`LeaseHandle`].
    Managed,
}

impl LeaseMode {
    /// The lease an acquisition asks for: `requested` as a fixed lease, or
    /// the backend's `watchdog_lease` renewed by the watchdog. Returns the
    /// lease to write to the server and the mode for [`GuardParts`].
    pub fn for_request(
        requested: Option<Duration>,
        watchdog_lease: Duration,
    ) -> (Duration, LeaseMode) {
        match requested {
            Some(l) => (l, LeaseMode::Fixed(l)),
            None => (watchdog_lease, LeaseMode::Watchdog(watchdog_lease)),
        }
    }
}

/// What a backend hands to [`Guard::new`].
#[derive(Debug)]
pub struct GuardParts {
    /// The lock key.
    pub key: String,
    /// The fencing token, if the backend has one.
    pub token: Option<FencingToken>,
    /// How to release / renew.
    pub held: Arc<dyn HeldLock>,
    /// How the lease is kept.
    pub lease: LeaseMode,
    /// When the acquire request that won was sent: the lease is counted
    /// from here, not from the reply, to stay on the safe side.
    pub invoked_at: Instant,
    /// Backend round trips the acquisition cost.
    pub round_trips: u32,
}

/// How the last release of a lock ended, as an observer hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lock was still ours and is given back.
    Released,
    /// The lock was no longer ours (the seed's "unlock script returned 0").
    WasGone,
    /// The release could not be sent or failed; the lease runs out instead.
    Failed,
}

/// Hears what happens to a held lock: lease renewals, its loss and its
/// release. For metrics, logs and wrappers (a local permit that must be
/// freed only once the remote lock is given back). Every method has an
/// empty default; they run on the task that saw the event and must not
/// block.
pub trait GuardObserver: Send + Sync + 'static {
    /// The watchdog extended the lease.
    fn renewed(&self) {}
    /// A renewal was refused (the lock is not ours) or failed to reach the
    /// server (it is retried until the lease runs out).
    fn renewal_failed(&self) {}
    /// The lock is known lost; told once per lock.
    fn lost(&self, _reason: LostReason) {}
    /// The last hold was given back (or dropped, and given back in the
    /// background) after being held for `held`: told once per lock, after
    /// the release reached the server or failed. A guard dropped outside a
    /// runtime tells [`ReleaseOutcome::Failed`] at once.
    fn released(&self, _held: Duration, _outcome: ReleaseOutcome) {}
}

/// The observers of one lock, shared by its guard and its lease handle.
#[derive(Default)]
struct Observers {
    list: Mutex<Vec<Arc<dyn GuardObserver>>>,
    lost_told: AtomicBool,
}

impl fmt::Debug for Observers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.list.lock().map(|l| l.len()).unwrap_or(0);
        f.debug_struct("Observers").field("count", &n).finish()
    }
}

impl Observers {
    fn each(&self, f: impl Fn(&dyn GuardObserver)) {
        let list = match self.list.lock() {
            Ok(l) => l.clone(),
            Err(_) => return,
        };
        for o in &list {
            f(o.as_ref());
        }
    }

    fn tell_lost(&self, reason: LostReason) {
        if !self.lost_told.swap(true, Ordering::AcqRel) {
            self.each(|o| o.lost(reason));
        }
    }

    fn take(&self) -> Vec<Arc<dyn GuardObserver>> {
        match self.list.lock() {
            Ok(mut l) => std::mem::take(&mut *l),
            Err(_) => Vec::new(),
        }
    }
}

fn tell_released(list: &[Arc<dyn GuardObserver>], held: Duration, r: &Result<bool>) {
    let outcome = match r {
        Ok(true) => ReleaseOutcome::Released,
        Ok(false) => ReleaseOutcome::WasGone,
        Err(_) => ReleaseOutcome::Failed,
    };
    for o in list {
        o.released(held, outcome);
    }
}

#[derive(Debug, Clone, Copy)]
struct LeaseStatus {
    valid_until: Instant,
    lost: Option<LostReason>,
}

/// Lets a backend that manages its own lease (a session, a connection)
/// report the lease's end or its loss to the guard.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    tx: Arc<watch::Sender<LeaseStatus>>,
    observers: Arc<Observers>,
}

impl LeaseHandle {
    /// Moves the end of what we can vouch for.
    pub fn set_valid_until(&self, until: Instant) {
        self.tx.send_modify(|s| s.valid_until = until);
    }

    /// The end of what we can vouch for now.
    pub fn valid_until(&self) -> Instant {
        self.tx.borrow().valid_until
    }

    /// Marks the lock lost; the first reason wins.
    pub fn mark_lost(&self, reason: LostReason) {
        let first = self.tx.send_if_modified(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
                true
            } else {
                false
            }
        });
        if first {
            self.observers.tell_lost(reason);
        }
    }

    /// Whether the lock is known lost.
    pub fn is_lost(&self) -> bool {
        self.tx.borrow().lost.is_some()
    }
}

struct Shared {
    key: String,
    token: Option<FencingToken>,
    held: Arc<dyn HeldLock>,
    lease: LeaseHandle,
    /// Reentrant holds still outstanding; the server lock goes at zero.
    holds: AtomicU32,
    finished: AtomicBool,
    keeper: Mutex<Option<JoinHandle<()>>>,
    /// A fixed lease's end: known up front, so no task has to watch it.
    fixed_until: Option<Instant>,
    /// When the winning acquire was sent: hold times count from here.
    since: Instant,
    /// The runtime the lock was taken on: a guard dropped where none runs
    /// (a plain thread) releases there, instead of leaving a session-bound
    /// key held until the process ends.
    runtime: Option<tokio::runtime::Handle>,
}

impl Shared {
    fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    fn lost_reason(&self) -> Option<LostReason> {
        if let Some(r) = self.lease.tx.borrow().lost {
            return Some(r);
        }
        self.fixed_until
            .is_some_and(|t| Instant::now() >= t)
            .then_some(LostReason::Expired)
    }

    /// The loss of a fixed lease is a clock reading, not an event: tell
    /// it when the lock is given back.
    fn tell_expiry(&self) {
        if let Some(r) = self.lost_reason() {
            self.lease.observers.tell_lost(r);
        }
    }

    fn stop_keeper(&self) {
        if let Ok(mut k) = self.keeper.lock() {
            if let Some(task) = k.take() {
                task.abort();
            }
        }
    }
}

/// A held lock. Release it with [`Guard::release`]; dropping it releases in
/// the background (never panics, never blocks).
pub struct Guard {
    shared: Arc<Shared>,
    round_trips: u32,
    done: bool,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.shared.key)
            .field("token", &self.shared.token)
            .field("round_trips", &self.round_trips)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// Wraps a freshly acquired lock and starts its lease keeper: a timer
    /// for a fixed lease, the renewal loop for a watchdog lease.
    pub fn new(parts: GuardParts) -> Self {
        let valid_until = match parts.lease {
            LeaseMode::Fixed(d) | LeaseMode::Watchdog(d) => {
                parts.invoked_at + d.saturating_sub(drift(d))
            }
            // A managed lease is vouched for until the backend says otherwise.
            LeaseMode::Managed => parts.invoked_at + Duration::from_secs(86_400 * 365),
        };
        let (tx, _) = watch::channel(LeaseStatus {
            valid_until,
            lost: None,
        });
        let lease = LeaseHandle {
            tx: Arc::new(tx),
            observers: Arc::default(),
        };
        let shared = Arc::new(Shared {
            key: parts.key,
            token: parts.token,
            held: parts.held,
            lease,
            holds: AtomicU32::new(1),
            finished: AtomicBool::new(false),
            keeper: Mutex::new(None),
            fixed_until: matches!(parts.lease, LeaseMode::Fixed(_)).then_some(valid_until),
            since: parts.invoked_at,
            runtime: tokio::runtime::Handle::try_current().ok(),
        });
        let keeper = match parts.lease {
            // Its end is known: is_lost() and lost() compare with the clock.
            LeaseMode::Fixed(_) => None,
            LeaseMode::Watchdog(d) => Some(tokio::spawn(watchdog(
                Arc::downgrade(&shared),
                d,
                parts.invoked_at,
            ))),
            LeaseMode::Managed => None,
        };
        if let Ok(mut k) = shared.keeper.lock() {
            *k = keeper;
        }
        Guard {
            shared,
            round_trips: parts.round_trips,
            done: false,
        }
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The fencing token (see [`crate::Capabilities::fencing`]).
    pub fn token(&self) -> Option<FencingToken> {
        self.shared.token
    }

    /// The end of the lease minus the drift allowance: past this instant the
    /// client can no longer vouch that nobody else holds the lock.
    pub fn valid_until(&self) -> Instant {
        self.shared.lease.tx.borrow().valid_until
    }

    /// Backend round trips the acquisition cost (0 for a reentrant hold).
    pub fn round_trips(&self) -> u32 {
        self.round_trips
    }

    /// Whether the lock is already known lost.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Resolves with the reason once the lock is known lost (lease expired,
    /// renewal refused or failed, session ended). Never resolves if the lock
    /// is released first.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.shared.lease.tx.subscribe();
        let fixed_until = self.shared.fixed_until;
        // Weak: a lost() future kept after the guard is gone must not keep
        // the lock's connection alive.
        let shared = Arc::downgrade(&self.shared);
        async move {
            let signalled = async move {
                let reason = match rx.wait_for(|s| s.lost.is_some()).await {
                    Ok(s) => s.lost,
                    Err(_) => None,
                };
                match reason {
                    Some(r) => r,
                    None => std::future::pending().await,
                }
            };
            match fixed_until {
                Some(t) => tokio::select! {
                    r = signalled => r,
                    _ = tokio::time::sleep_until(t) => {
                        // A lease that ends after its lock was given back
                        // was not lost: it resolved with Expired anyway.
                        match shared.upgrade() {
                            Some(s) if !s.finished.load(Ordering::Acquire) => LostReason::Expired,
                            _ => std::future::pending().await,
                        }
                    }
                },
                None => signalled.await,
            }
        }
    }

    /// A handle for backends that keep the lease themselves.
    pub fn lease_handle(&self) -> LeaseHandle {
        self.shared.lease.clone()
    }

    /// Reentrancy, made explicit: another hold on the lock this guard holds,
    /// for code that already holds it and calls into code that locks the
    /// same key. No round trip; the lock goes back to the server only when
    /// the last of the holds is released. Acquiring the key again through
    /// the handle is NOT reentrant: every `acquire` is its own owner, so two
    /// tasks sharing a handle exclude each other as two clients would.
    ///
    /// # Errors
    /// [`crate::Error::Lost`] when the lock is known lost,
    /// [`crate::Error::NotHeld`] when every hold has been released.
    pub fn reenter(&self) -> Result<Guard> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(crate::Error::Lost {
                key: self.shared.key.clone(),
                reason,
            });
        }
        // Only join a hold that is still alive: at zero it is being released.
        self.shared
            .holds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .map_err(|_| crate::Error::NotHeld {
                key: self.shared.key.clone(),
            })?;
        Ok(Guard {
            shared: self.shared.clone(),
            round_trips: 0,
            done: false,
        })
    }

    /// Adds an observer of this lock's renewals, loss and release (see
    /// [`GuardObserver`]). One already known lost is told so at once.
    pub fn observe(&self, observer: Arc<dyn GuardObserver>) {
        let lost = self.shared.lost_reason();
        let obs = &self.shared.lease.observers;
        if let Ok(mut l) = obs.list.lock() {
            l.push(observer.clone());
        }
        if let Some(r) = lost {
            if obs.lost_told.load(Ordering::Acquire) {
                observer.lost(r);
            } else {
                obs.tell_lost(r);
            }
        }
    }

    /// Outstanding holds on this lock (1 unless [`Guard::reenter`] was used).
    pub fn holds(&self) -> u32 {
        self.shared.holds.load(Ordering::Acquire)
    }

    /// Gives the lock back. For a reentrant hold only the last release goes
    /// to the server.
    ///
    /// `Ok(false)` means the lock was no longer ours when we came to release
    /// it (it expired and maybe somebody else took it): the seed's "unlock
    /// script returned 0", which the harness counts.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the server could not be reached; the
    /// lease will still run out on its own.
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        if self.shared.holds.fetch_sub(1, Ordering::AcqRel) > 1 {
            return Ok(!self.shared.is_lost());
        }
        self.shared.finished.store(true, Ordering::Release);
        self.shared.stop_keeper();
        self.shared.tell_expiry();
        // Cancelled on its way (a timeout around `release()`, an aborted
        // task), the request may never go out: the redis crate drops those
        // whose caller has gone. The guard is done and nobody renews, so
        // the key stayed held for its whole lease (30 s by default) while
        // every other client waited. A release that never returned goes on
        // in the background, as a dropped guard's does.
        let mut unfinished = Unfinished(Some(self.shared.clone()));
        let r = self.shared.held.release().await;
        unfinished.0 = None;
        if r.is_err() {
            crate::pending::release_later(self.shared.key.clone(), self.shared.held.clone());
        }
        let observers = self.shared.lease.observers.take();
        tell_released(&observers, self.shared.since.elapsed(), &r);
        r
    }
}

/// A [`Guard::release`] in flight; dropped before it returned, it hands
/// the release to the background.
struct Unfinished(Option<Arc<Shared>>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            release_in_background(&shared);
        }
    }
}

/// Releases in a task of its own (retrying a failed release as
/// [`crate::pending::release_later`] does) and tells the observers.
fn release_in_background(shared: &Shared) {
    let held = shared.held.clone();
    let key = shared.key.clone();
    let observers = shared.lease.observers.take();
    let since = shared.since;
    // Off the runtime (a plain thread): on the one the lock was taken on.
    // A runtime already shut down drops the task unrun, and with it the
    // connections and sessions the lock stood on.
    let rt = tokio::runtime::Handle::try_current()
        .ok()
        .or_else(|| shared.runtime.clone());
    if let Some(rt) = rt {
        rt.spawn(async move {
            let r = held.release().await;
            if let Err(e) = &r {
                tracing::warn!(%key, error = %e, "background release failed; trying again");
                crate::pending::release_later(key, held);
            }
            tell_released(&observers, since.elapsed(), &r);
        });
    } else {
        tell_released(
            &observers,
            since.elapsed(),
            &Err(crate::Error::NotHeld { key }),
        );
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.done || self.shared.holds.fetch_sub(1, Ordering::AcqRel) > 1 {
            return;
        }
        self.shared.finished.store(true, Ordering::Release);
        self.shared.stop_keeper();
        self.shared.tell_expiry();
        release_in_background(&self.shared);
    }
}

/// Renews every lease/3; a refused renewal is a loss at once, a failed one
/// is retried until the lease we can vouch for runs out.
async fn watchdog(shared: Weak<Shared>, lease: Duration, invoked_at: Instant) {
    let period = lease / 3;
    let retry = (lease / 10).max(Duration::from_millis(5));
    let mut valid_until = invoked_at + lease.saturating_sub(drift(lease));
    let mut next = invoked_at + period;
    loop {
        tokio::time::sleep_until(next.min(valid_until)).await;
        let Some(sh) = shared.upgrade() else { return };
        if sh.finished.load(Ordering::Acquire) {
            return;
        }
        if Instant::now() >= valid_until {
            sh.lease.mark_lost(LostReason::RenewalFailed);
            return;
        }
        let sent = Instant::now();
        // Never let one renewal outlive the lease it is trying to save.
        let budget = valid_until.saturating_duration_since(sent);
        match tokio::time::timeout(budget, sh.held.renew(lease)).await {
            Ok(Ok(true)) => {
                sh.lease.observers.each(|o| o.renewed());
                valid_until = sent + lease.saturating_sub(drift(lease));
                sh.lease.set_valid_until(valid_until);
                next = sent + period;
            }
            Ok(Ok(false)) => {
                sh.lease.observers.each(|o| o.renewal_failed());
                sh.lease.mark_lost(LostReason::NotOwner);
                return;
            }
            Ok(Err(e)) => {
                sh.lease.observers.each(|o| o.renewal_failed());
                tracing::debug!(key = %sh.key, error = %e, "lease renewal failed, retrying");
                next = Instant::now() + retry;
            }
            Err(_) => {
                sh.lease.observers.each(|o| o.renewal_failed());
                next = Instant::now();
            }
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
