//! `Guard`, its watchdog and explicit reentrancy, on a fake `HeldLock` and
//! tokio's paused clock: exact, and independent of the machine's load.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, Guard, GuardParts, HeldLock, LeaseMode, LostReason, Result};
use tokio::time::Instant;

/// What the fake server answers to a renewal.
#[derive(Debug, Clone, Copy)]
enum Renew {
    Yes,
    NotOurs,
    Unreachable,
}

#[derive(Debug)]
struct Fake {
    releases: AtomicU32,
    renewals: AtomicU32,
    renew: Mutex<Renew>,
}

impl Fake {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            releases: AtomicU32::new(0),
            renewals: AtomicU32::new(0),
            renew: Mutex::new(Renew::Yes),
        })
    }
}

#[async_trait::async_trait]
impl HeldLock for Fake {
    async fn release(&self) -> Result<bool> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        match *self.renew.lock().unwrap() {
            Renew::Yes => Ok(true),
            Renew::NotOurs => Ok(false),
            Renew::Unreachable => Err(Error::backend("fake", "renew", "unreachable")),
        }
    }
}

fn guard(fake: &Arc<Fake>, lease: LeaseMode) -> Guard {
    Guard::new(GuardParts {
        key: "k".into(),
        token: None,
        held: fake.clone(),
        lease,
        invoked_at: Instant::now(),
        round_trips: 1,
    })
}

const LEASE: Duration = Duration::from_secs(3);

#[tokio::test(start_paused = true)]
async fn the_watchdog_renews_every_third_of_the_lease() {
    let fake = Fake::new();
    let g = guard(&fake, LeaseMode::Watchdog(LEASE));
    tokio::time::sleep(LEASE * 3 + Duration::from_millis(100)).await;
    // At 1 s, 2 s, ... 9 s.
    assert_eq!(fake.renewals.load(Ordering::SeqCst), 9);
    assert!(!g.is_lost());
    assert!(g.valid_until() > Instant::now() + LEASE / 2);
    assert!(g.release().await.unwrap());
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(
        fake.renewals.load(Ordering::SeqCst),
        9,
        "renewed after release"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_renewal_is_a_loss_at_once() {
    let fake = Fake::new();
    *fake.renew.lock().unwrap() = Renew::NotOurs;
    let g = guard(&fake, LeaseMode::Watchdog(LEASE));
    let t0 = Instant::now();
    let reason = g.lost().await;
    assert_eq!(reason, LostReason::NotOwner);
    assert_eq!(t0.elapsed(), LEASE / 3);
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_lose_the_lock_when_the_vouched_lease_ends() {
    let fake = Fake::new();
    *fake.renew.lock().unwrap() = Renew::Unreachable;
    let g = guard(&fake, LeaseMode::Watchdog(LEASE));
    let until = g.valid_until();
    assert_eq!(g.lost().await, LostReason::RenewalFailed);
    assert!(Instant::now() >= until, "lost before the lease ran out");
    assert!(Instant::now() < until + Duration::from_millis(10));
    assert!(fake.renewals.load(Ordering::SeqCst) > 3, "retried");
}

#[tokio::test(start_paused = true)]
async fn a_fixed_lease_is_lost_at_valid_until() {
    let fake = Fake::new();
    let g = guard(&fake, LeaseMode::Fixed(LEASE));
    let until = g.valid_until();
    assert_eq!(until, Instant::now() + LEASE - distlock::drift(LEASE));
    assert_eq!(g.lost().await, LostReason::Expired);
    assert_eq!(Instant::now(), until);
    assert!(g.is_lost());
    assert_eq!(fake.renewals.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn reentrancy_is_counted_and_the_last_release_goes_to_the_server() {
    let fake = Fake::new();
    let outer = guard(&fake, LeaseMode::Fixed(LEASE));
    let inner = outer.reenter().unwrap();
    let innermost = inner.reenter().unwrap();
    assert_eq!(outer.holds(), 3);
    assert_eq!(inner.round_trips(), 0);
    assert!(innermost.release().await.unwrap());
    drop(inner);
    tokio::task::yield_now().await;
    assert_eq!(fake.releases.load(Ordering::SeqCst), 0, "released early");
    assert!(outer.release().await.unwrap());
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lock_cannot_be_reentered() {
    let fake = Fake::new();
    let g = guard(&fake, LeaseMode::Fixed(LEASE));
    tokio::time::sleep(LEASE).await;
    assert!(matches!(
        g.reenter(),
        Err(Error::Lost {
            reason: LostReason::Expired,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn drop_releases_in_the_background_once() {
    let fake = Fake::new();
    let g = guard(&fake, LeaseMode::Watchdog(LEASE));
    let again = g.reenter().unwrap();
    drop(g);
    drop(again);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
}

/// A guard or a pending acquisition dropped on a plain thread releases on
/// the runtime it came from (it sent nothing before: a session-bound key
/// stayed held until the process ended); one dropped after that runtime
/// shut down neither panics nor runs.
#[test]
fn a_drop_off_the_runtime_releases_on_the_runtime_it_came_from() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let fake = Fake::new();
    let (g, p) = rt.block_on(async {
        (
            guard(&fake, LeaseMode::Watchdog(LEASE)),
            distlock::Pending::new("k", fake.clone()),
        )
    });
    std::thread::spawn(move || {
        drop(g);
        drop(p);
    })
    .join()
    .unwrap();
    rt.block_on(async {
        let t0 = Instant::now();
        while fake.releases.load(Ordering::SeqCst) < 2 && t0.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    assert_eq!(fake.releases.load(Ordering::SeqCst), 2);
    let late = rt.block_on(async { guard(&fake, LeaseMode::Watchdog(LEASE)) });
    rt.shutdown_timeout(Duration::from_secs(1));
    std::thread::spawn(move || drop(late)).join().unwrap();
    assert_eq!(fake.releases.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_managed_lease_reports_through_its_handle() {
    let fake = Fake::new();
    let g = guard(&fake, LeaseMode::Managed);
    let h = g.lease_handle();
    let until = Instant::now() + Duration::from_secs(5);
    h.set_valid_until(until);
    assert_eq!(g.valid_until(), until);
    h.mark_lost(LostReason::SessionEnded);
    h.mark_lost(LostReason::Expired);
    assert_eq!(
        g.lost().await,
        LostReason::SessionEnded,
        "the first reason wins"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pending_acquisition_is_withdrawn_unless_settled() {
    let fake = Fake::new();
    // Dropped (the acquire future was cancelled): withdrawn.
    drop(distlock::Pending::new("k", fake.clone()));
    // Settled with a guard, or with a definite "held by another": kept.
    distlock::Pending::new("k", fake.clone()).settle(&Ok::<(), Error>(()));
    distlock::Pending::new("k", fake.clone()).settle(&Err::<(), _>(Error::Timeout {
        key: "k".into(),
        waited: Duration::ZERO,
    }));
    // Ended in doubt: withdrawn.
    distlock::Pending::new("k", fake.clone()).settle(&Err::<(), _>(Error::indeterminate(
        "fake", "acquire", "timeout",
    )));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.releases.load(Ordering::SeqCst), 2);
}

/// Records what a guard tells its observers, in order.
#[derive(Debug, Default)]
struct Log(Mutex<Vec<String>>);

impl distlock::GuardObserver for Log {
    fn renewed(&self) {
        self.0.lock().unwrap().push("renewed".into());
    }
    fn renewal_failed(&self) {
        self.0.lock().unwrap().push("renewal_failed".into());
    }
    fn lost(&self, reason: LostReason) {
        self.0.lock().unwrap().push(format!("lost {reason:?}"));
    }
    fn released(&self, held: Duration, outcome: distlock::ReleaseOutcome) {
        self.0
            .lock()
            .unwrap()
            .push(format!("released {outcome:?} {}ms", held.as_millis()));
    }
}

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[tokio::test(start_paused = true)]
async fn observers_hear_renewals_and_the_last_release_once() {
    let fake = Fake::new();
    let log = Arc::new(Log::default());
    let g = guard(&fake, LeaseMode::Watchdog(LEASE));
    g.observe(log.clone());
    let inner = g.reenter().unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(inner.release().await.unwrap());
    // A reentrant hold's release is not the lock's.
    assert_eq!(log.take(), ["renewed", "renewed"]);
    assert!(g.release().await.unwrap());
    assert_eq!(log.take(), ["released Released 2500ms"]);
}

#[tokio::test(start_paused = true)]
async fn observers_hear_a_refused_renewal_as_a_loss_and_the_gone_unlock() {
    #[derive(Debug)]
    struct Gone;
    #[async_trait::async_trait]
    impl HeldLock for Gone {
        async fn release(&self) -> Result<bool> {
            Ok(false)
        }
        async fn renew(&self, _lease: Duration) -> Result<bool> {
            Ok(false)
        }
    }
    let log = Arc::new(Log::default());
    let g = Guard::new(GuardParts {
        key: "k".into(),
        token: None,
        held: Arc::new(Gone),
        lease: LeaseMode::Watchdog(LEASE),
        invoked_at: Instant::now(),
        round_trips: 1,
    });
    g.observe(log.clone());
    tokio::time::sleep(LEASE).await;
    assert!(!g.release().await.unwrap());
    assert_eq!(
        log.take(),
        ["renewal_failed", "lost NotOwner", "released WasGone 3000ms"]
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_fixed_lease_is_told_lost_once_and_a_drop_is_told_after_its_release() {
    let fake = Fake::new();
    let log = Arc::new(Log::default());
    let g = guard(&fake, LeaseMode::Fixed(Duration::from_secs(1)));
    g.observe(log.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(g);
    // The background release has not run yet: nobody may be told it is done.
    assert_eq!(log.take(), ["lost Expired"]);
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    assert_eq!(fake.releases.load(Ordering::SeqCst), 1);
    assert_eq!(log.take(), ["released Released 2000ms"]);
    // An observer added to a lock already lost hears it at once.
    let late = Arc::new(Log::default());
    let g = guard(&fake, LeaseMode::Fixed(Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_secs(2)).await;
    g.observe(late.clone());
    assert_eq!(late.take(), ["lost Expired"]);
    drop(g);
}
