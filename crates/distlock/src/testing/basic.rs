//! The contract every lock keeps in the comfortable case: one task per
//! handle, no faults.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{caps, client, must, unique_key, Outcome, Subject};
use crate::{AcquireOptions, Error};

/// 8 clients contend for one key; a counter inside the critical section
/// must never exceed 1, and every acquisition must succeed.
pub async fn mutual_exclusion(s: &dyn Subject) -> Outcome {
    const CLIENTS: u32 = 8;
    const ROUNDS: u32 = 20;
    let key = unique_key("mutex");
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = client(s).await;
        let (key, inside, peak, done) = (key.clone(), inside.clone(), peak.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = must(
                    c.acquire(&key, AcquireOptions::wait(Duration::from_secs(20)))
                        .await,
                    "acquire under contention",
                );
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(must(g.release().await, "release"), "lost the lock mid-test");
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        if let Err(e) = t.await {
            panic!("a contender failed: {e}");
        }
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "two holders were inside at once"
    );
    assert_eq!(done.load(Ordering::SeqCst), CLIENTS * ROUNDS);
    Outcome::Passed
}

/// What "promptly" allows: `floor`, or four of the holder's own
/// uncontended acquires measured just before, whichever is longer. On the
/// durable servers a refused try-lock is itself a write or two (a node
/// created and withdrawn); a machine stalled on fsync slows both alike,
/// while a wait that should not happen (a budget in seconds) still fails.
fn prompt(own_acquire: Duration, floor: Duration) -> Duration {
    floor.max(own_acquire * 4)
}

/// A try-lock on a held key says "not acquired" promptly.
pub async fn try_lock_on_held_key(s: &dyn Subject) -> Outcome {
    let key = unique_key("trylock");
    let (a, b) = (client(s).await, client(s).await);
    let t0 = Instant::now();
    let g = must(
        a.acquire(&key, AcquireOptions::try_lock()).await,
        "first try-lock",
    );
    let bound = prompt(t0.elapsed(), Duration::from_millis(500));
    let t0 = Instant::now();
    let r = b.acquire(&key, AcquireOptions::try_lock()).await;
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "try-lock on a held key gave {r:?}"
    );
    assert!(took < bound, "try-lock took {took:?} (bound {bound:?})");
    must(g.release().await, "release");
    Outcome::Passed
}

/// A 200 ms wait on a held key times out after at least 200 ms and well
/// under a second (see [`prompt`]).
pub async fn wait_budget_is_honoured(s: &dyn Subject) -> Outcome {
    let key = unique_key("wait");
    let (a, b) = (client(s).await, client(s).await);
    let t0 = Instant::now();
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    let bound = prompt(t0.elapsed(), Duration::from_millis(600)) + Duration::from_millis(200);
    let t0 = Instant::now();
    let r = b
        .acquire(&key, AcquireOptions::wait(Duration::from_millis(200)))
        .await;
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "waiting on a held key gave {r:?}"
    );
    assert!(
        took >= Duration::from_millis(200),
        "gave up early, after {took:?}"
    );
    assert!(
        took < bound,
        "overran the budget: {took:?} (bound {bound:?})"
    );
    must(g.release().await, "release");
    Outcome::Passed
}

/// Releasing a lock that expired and was taken by another owner returns
/// false and leaves the new owner's lock in place.
pub async fn release_only_own(s: &dyn Subject) -> Outcome {
    let (a, b, c) = (client(s).await, client(s).await, client(s).await);
    if !caps(&a).renewal {
        return Outcome::NotApplicable("no leases: a lock cannot expire from under its holder");
    }
    let key = unique_key("own");
    let lease = Duration::from_millis(200);
    let old = must(
        a.acquire(&key, AcquireOptions::try_lock().with_lease(lease))
            .await,
        "first holder",
    );
    let new = must(
        b.acquire(&key, AcquireOptions::wait(Duration::from_secs(3)))
            .await,
        "second holder after expiry",
    );
    assert!(
        !must(old.release().await, "stale release"),
        "stale release claimed the lock was still ours"
    );
    let r = c.acquire(&key, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "stale release deleted the new owner's lock: {r:?}"
    );
    assert!(
        must(new.release().await, "new owner's release"),
        "new owner lost its lock"
    );
    Outcome::Passed
}

/// A fixed lease frees the key when its holder never releases.
pub async fn fixed_lease_expires(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    if !caps(&a).renewal {
        return Outcome::NotApplicable("no leases");
    }
    let key = unique_key("expire");
    // Long enough that acquire and release, each a committed write on the
    // durable servers, fit in it on a stalled machine (300 ms left ~290 ms
    // for two fsyncs, the margin that failed the watchdog case on CI).
    let lease = Duration::from_millis(1_000);
    let t0 = Instant::now();
    let g = must(
        a.acquire(&key, AcquireOptions::try_lock().with_lease(lease))
            .await,
        "holder",
    );
    // The holder "crashes": it never releases and its Drop never runs.
    std::mem::forget(g);
    must(
        b.acquire(&key, AcquireOptions::wait(Duration::from_secs(3)))
            .await,
        "waiter",
    )
    .release()
    .await
    .ok();
    let took = t0.elapsed();
    assert!(
        took >= lease - crate::drift(lease),
        "acquired after {took:?}, before the lease ran out"
    );
    assert!(
        took < lease + Duration::from_secs(1),
        "expiry took {took:?}"
    );
    // A lease of zero, or one too long for any clock or server argument
    // (`Duration::MAX` overflowed; servers answered "invalid expire time"
    // or "not an integer"), is refused, naming the bound.
    for bad in [Duration::ZERO, Duration::MAX] {
        let r = a
            .acquire(&key, AcquireOptions::try_lock().with_lease(bad))
            .await;
        assert!(
            matches!(r, Err(Error::Unsupported { .. })),
            "a fixed lease of {bad:?}: {r:?}"
        );
    }
    // Given back in time, a fixed lease was not lost: lost() stays pending
    // past the lease's end (it resolved with Expired all the same).
    let g = must(
        a.acquire(&key, AcquireOptions::try_lock().with_lease(lease))
            .await,
        "holder, again",
    );
    let lost = g.lost();
    assert!(must(g.release().await, "release in time"));
    let after = tokio::time::timeout(lease + Duration::from_millis(400), lost).await;
    assert!(
        after.is_err(),
        "lost() resolved after a release in time: {after:?}"
    );
    Outcome::Passed
}

/// The watchdog keeps a lock past 3x its lease while the guard lives, and
/// the key is free at once after release.
pub async fn watchdog_keeps_lock(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    if !caps(&a).renewal {
        return Outcome::NotApplicable("no renewal");
    }
    let key = unique_key("watchdog");
    let lease = s.watchdog_lease();
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    tokio::time::sleep(lease * 3 + lease / 2).await;
    // The reason tells a refused renewal (a bug) from renewals that did not
    // come back within the lease (a stalled machine or server).
    let lost = tokio::time::timeout(Duration::ZERO, g.lost()).await;
    assert!(!g.is_lost(), "watchdog let the lock go: {lost:?}");
    assert!(
        g.valid_until() > Instant::now(),
        "valid_until was not moved by renewals"
    );
    let r = b.acquire(&key, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "lock was free while the watchdog ran: {r:?}"
    );
    assert!(
        must(g.release().await, "release"),
        "release after renewals found the lock gone"
    );
    let g2 = must(
        b.acquire(&key, AcquireOptions::try_lock()).await,
        "acquire after release",
    );
    // If the old watchdog were still renewing, it could not matter, but a
    // stray renewal loop would show up as the new holder losing its lock.
    tokio::time::sleep(lease).await;
    assert!(!g2.is_lost());
    assert!(must(g2.release().await, "release"));
    Outcome::Passed
}

/// `lost()` fires when the key is deleted behind the holder's back
/// (watchdog lease) and when a fixed lease runs out.
pub async fn lost_fires(s: &dyn Subject) -> Outcome {
    let a = client(s).await;
    if !caps(&a).lost_signal {
        return Outcome::NotApplicable("no lost signal");
    }
    let lease = s.watchdog_lease();
    if caps(&a).renewal {
        let key = unique_key("lost-deleted");
        let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
        must(s.sabotage(&key).await, "sabotage");
        let lost = tokio::time::timeout(lease * 2, g.lost()).await;
        assert!(
            lost.is_ok(),
            "lost() did not fire within {:?} of the key's deletion",
            lease * 2
        );
        assert!(g.is_lost());
        assert!(
            !must(g.release().await, "release"),
            "release of a deleted lock returned true"
        );
    } else {
        // A session-bound lock is lost with its session: a backend-specific
        // fault (a killed session), tested by the backend itself.
        return Outcome::NotApplicable(
            "no leases: lost() fires on session loss, tested per backend",
        );
    }
    let key = unique_key("lost-expired");
    let fixed = Duration::from_millis(250);
    let t0 = Instant::now();
    let g = must(
        a.acquire(&key, AcquireOptions::try_lock().with_lease(fixed))
            .await,
        "holder",
    );
    let fired = tokio::time::timeout(fixed * 4, g.lost()).await;
    assert!(
        fired.is_ok(),
        "lost() did not fire after the fixed lease ran out"
    );
    assert!(
        t0.elapsed() >= fixed - crate::drift(fixed),
        "lost() fired before the lease ran out"
    );
    Outcome::Passed
}

/// Tokens strictly increase across successive holders.
pub async fn tokens_increase(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    if !caps(&a).fencing {
        return Outcome::NotApplicable("no fencing token");
    }
    let key = unique_key("token");
    let mut last = None;
    for i in 0..6 {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = must(
            c.acquire(&key, AcquireOptions::wait(Duration::from_secs(2)))
                .await,
            "acquire",
        );
        let t = g.token();
        assert!(t.is_some(), "a fencing backend gave no token");
        assert!(t > last, "token {t:?} after {last:?}: not increasing");
        last = t;
        must(g.release().await, "release");
    }
    Outcome::Passed
}

/// Reentrancy is explicit: a second `acquire` through the same handle is
/// another owner and is refused while the key is held; re-acquiring through
/// the held guard ([`crate::Guard::reenter`]) is counted, and the key is
/// free only after the last release.
pub async fn reentrancy(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    let key = unique_key("reentrant");
    let outer = must(a.acquire(&key, AcquireOptions::try_lock()).await, "outer");
    let r = a.acquire(&key, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "a second acquire through the same handle was let in while the key was held: {r:?}"
    );
    if !caps(&a).reentrant {
        must(outer.release().await, "release");
        return Outcome::NotApplicable("not reentrant");
    }
    let inner = must(outer.reenter(), "reentrant acquire through the guard");
    assert_eq!(inner.round_trips(), 0, "reentering costs no round trip");
    assert_eq!(
        inner.token(),
        outer.token(),
        "a reentrant hold is the same lock"
    );
    assert!(must(inner.release().await, "inner release"));
    let r = b.acquire(&key, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "inner release freed the lock: {r:?}"
    );
    assert!(must(outer.release().await, "outer release"));
    must(
        b.acquire(&key, AcquireOptions::try_lock()).await,
        "after the last release",
    )
    .release()
    .await
    .ok();
    Outcome::Passed
}

/// Dropping a guard releases the lock in the background, long before its
/// lease would run out.
pub async fn drop_releases(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    let key = unique_key("drop");
    // A long lease, so only the release on drop can free the key in time.
    let opts = if caps(&a).renewal {
        AcquireOptions::try_lock().with_lease(Duration::from_secs(30))
    } else {
        AcquireOptions::try_lock()
    };
    let g = must(a.acquire(&key, opts).await, "holder");
    drop(g);
    let t0 = Instant::now();
    let g2 = must(
        b.acquire(&key, AcquireOptions::wait(Duration::from_secs(5)))
            .await,
        "after drop",
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "drop did not release (waited {:?})",
        t0.elapsed()
    );
    must(g2.release().await, "release");
    Outcome::Passed
}

/// A client pointed at a dead endpoint fails within 5 s, naming it.
pub async fn unreachable_endpoint_fails_fast(s: &dyn Subject) -> Outcome {
    let t0 = Instant::now();
    let (endpoint, r) = s.unreachable_client().await;
    let took = t0.elapsed();
    let e = match r {
        Err(Error::Unsupported { .. }) if endpoint.is_empty() => {
            return Outcome::NotApplicable("no server to be unreachable")
        }
        Err(e) => e,
        Ok(_) => panic!("connecting to {endpoint} (nothing listens there) succeeded"),
    };
    assert!(took < Duration::from_secs(5), "took {took:?} to fail: {e}");
    assert!(
        e.to_string().contains(&endpoint),
        "the error does not name {endpoint}: {e}"
    );
    Outcome::Passed
}

/// An uncontended acquire of a key used before costs the backend's
/// declared round trips (one for most), and so does each of three more.
pub async fn uncontended_acquire_round_trips(s: &dyn Subject) -> Outcome {
    let a = client(s).await;
    let key = unique_key("round-trips");
    // The first acquire of a key may create its directory or row.
    must(
        a.acquire(&key, AcquireOptions::try_lock()).await,
        "first acquire",
    )
    .release()
    .await
    .ok();
    for _ in 0..3 {
        let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "acquire");
        assert!(
            g.round_trips() <= s.uncontended_round_trips(),
            "an uncontended acquire cost {} round trips, {} declared",
            g.round_trips(),
            s.uncontended_round_trips()
        );
        must(g.release().await, "release");
    }
    Outcome::Passed
}
