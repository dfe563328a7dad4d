//! The conformance suite: plain async cases every backend's
//! `tests/conformance.rs` runs against its REAL server.
//!
//! Each case takes a [`Subject`] (a factory of independent clients plus an
//! admin path) and returns [`Outcome::Passed`], or
//! [`Outcome::NotApplicable`] with the capability that selects it out. A
//! failing case panics with what it saw, like any test assertion.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{AcquireOptions, Capabilities, DistLock, Error, Result};

/// What a backend's test gives the suite.
#[async_trait::async_trait]
pub trait Subject: Send + Sync {
    /// A new, independent client: its own connection and owner id.
    async fn client(&self) -> Result<Arc<dyn DistLock>>;

    /// Deletes the lock state of `key` behind its holder's back, as an
    /// operator or a failover would.
    async fn sabotage(&self, key: &str) -> Result<()>;

    /// The lease the clients' watchdog renews (keep it short: ~300 ms).
    fn watchdog_lease(&self) -> Duration;

    /// Restarts every server the clients talk to (kill -9, then start on
    /// the same address with the data the deployment keeps) and returns
    /// once they serve again. [`tokens_survive_restart`] needs it for every
    /// backend that declares fencing; a subject that cannot restart makes
    /// that case fail, not skip.
    async fn restart_servers(&self) -> Result<()> {
        Err(Error::Unsupported {
            backend: "conformance subject",
            what: "restarting its servers".into(),
        })
    }

    /// Connects a client to an endpoint where nothing listens; returns that
    /// endpoint as the error must name it, and what connecting gave.
    /// `Err(Unsupported)` (the default) selects [`unreachable_endpoint_fails_fast`]
    /// out, which the test must then list as skipped.
    async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
        (
            String::new(),
            Err(Error::Unsupported {
                backend: "conformance subject",
                what: "an unreachable endpoint".into(),
            }),
        )
    }

    /// Round trips an uncontended acquire of a key used before may cost.
    fn uncontended_round_trips(&self) -> u32 {
        1
    }
}

/// A case's verdict when it did not panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The case ran and held.
    Passed,
    /// The backend declares it lacks what the case tests.
    NotApplicable(&'static str),
}

/// A fresh key per case, so cases may share one server.
pub fn unique_key(case: &str) -> String {
    format!("conformance:{case}:{:016x}", rand::random::<u64>())
}

async fn client(s: &dyn Subject) -> Arc<dyn DistLock> {
    match s.client().await {
        Ok(c) => c,
        Err(e) => panic!("creating a client failed: {e}"),
    }
}

fn must<T>(r: Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

fn caps(c: &Arc<dyn DistLock>) -> Capabilities {
    c.capabilities()
}

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

/// A try-lock on a held key says "not acquired" promptly.
pub async fn try_lock_on_held_key(s: &dyn Subject) -> Outcome {
    let key = unique_key("trylock");
    let (a, b) = (client(s).await, client(s).await);
    let g = must(
        a.acquire(&key, AcquireOptions::try_lock()).await,
        "first try-lock",
    );
    let t0 = Instant::now();
    let r = b.acquire(&key, AcquireOptions::try_lock()).await;
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "try-lock on a held key gave {r:?}"
    );
    assert!(took < Duration::from_millis(500), "try-lock took {took:?}");
    must(g.release().await, "release");
    Outcome::Passed
}

/// A 200 ms wait on a held key times out after at least 200 ms and well
/// under a second.
pub async fn wait_budget_is_honoured(s: &dyn Subject) -> Outcome {
    let key = unique_key("wait");
    let (a, b) = (client(s).await, client(s).await);
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
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
        took < Duration::from_millis(800),
        "overran the budget: {took:?}"
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
    let lease = Duration::from_millis(300);
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
    assert!(!g.is_lost(), "watchdog let the lock go");
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

/// Many tasks share one handle (one client, many tasks: the normal Rust
/// pattern) while tasks on a second handle compete: never two inside at
/// once, over at least 1,000 critical sections.
pub async fn shared_handle_mutual_exclusion(s: &dyn Subject) -> Outcome {
    const SHARED_TASKS: usize = 8;
    const OTHER_TASKS: usize = 2;
    const SECTIONS: u32 = 1_000;
    let key = unique_key("shared-handle");
    let (shared, other) = (client(s).await, client(s).await);
    // What is tested is sharing, not leases: a lease long enough that a
    // renewal delayed by a loaded machine cannot end a hold mid-test.
    let opts = if caps(&shared).renewal {
        AcquireOptions::wait(Duration::from_secs(10)).with_lease(Duration::from_secs(30))
    } else {
        AcquireOptions::wait(Duration::from_secs(10))
    };
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU32::new(0));
    let timeouts = Arc::new(AtomicU32::new(0));
    // Bounded in time as well as in count: a slow backend shows as too few
    // sections, never as a hung test.
    let stop_at = Instant::now() + Duration::from_secs(90);
    let mut tasks = Vec::new();
    for i in 0..SHARED_TASKS + OTHER_TASKS {
        let c = if i < SHARED_TASKS {
            shared.clone()
        } else {
            other.clone()
        };
        let (key, inside, peak, done, timeouts) = (
            key.clone(),
            inside.clone(),
            peak.clone(),
            done.clone(),
            timeouts.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < SECTIONS && Instant::now() < stop_at {
                let g = match c.acquire(&key, opts).await {
                    Ok(g) => g,
                    Err(Error::Timeout { .. }) => {
                        timeouts.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    Err(e) => panic!("acquire through a shared handle: {e}"),
                };
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                // Let the other tasks of this handle run while we hold.
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(must(g.release().await, "release"), "lost the lock mid-test");
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        if let Err(e) = t.await {
            panic!("a task failed: {e}");
        }
    }
    let (peak, done) = (peak.load(Ordering::SeqCst), done.load(Ordering::SeqCst));
    assert_eq!(
        peak, 1,
        "two tasks were inside at once ({done} sections, shared handle + one other)"
    );
    assert!(
        done >= SECTIONS,
        "only {done} sections in 90 s ({} acquires timed out)",
        timeouts.load(Ordering::SeqCst)
    );
    Outcome::Passed
}

/// A stale release or drop by the SAME handle leaves that handle's newer
/// acquisition alone: owner values are per acquisition, not per client.
pub async fn stale_release_same_handle(s: &dyn Subject) -> Outcome {
    let (h, other) = (client(s).await, client(s).await);
    if !caps(&h).renewal {
        return Outcome::NotApplicable("no leases: a lock cannot expire from under its holder");
    }
    let key = unique_key("stale-same");
    let lease = Duration::from_millis(200);
    let wait = AcquireOptions::wait(Duration::from_secs(3));
    let g1 = must(
        h.acquire(&key, AcquireOptions::try_lock().with_lease(lease))
            .await,
        "first acquisition",
    );
    let g2 = must(
        h.acquire(&key, wait.with_lease(lease)).await,
        "second acquisition by the same handle, after the first expired",
    );
    let g3 = must(
        h.acquire(&key, wait).await,
        "third acquisition by the same handle, after the second expired",
    );
    assert!(
        !must(g1.release().await, "stale release"),
        "a stale release claimed the lock was still ours"
    );
    // A stale drop releases in the background: give it time to land.
    drop(g2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = other.acquire(&key, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "a stale release of the same handle deleted its newer lock: {r:?}"
    );
    assert!(!g3.is_lost(), "the newer acquisition was told it is lost");
    assert!(
        must(g3.release().await, "newest release"),
        "the newer acquisition lost its lock"
    );
    Outcome::Passed
}

/// An acquire dropped while it waits (a `timeout`, a `select!`) leaves
/// nothing behind: once the holder releases, another handle gets the key
/// at once, and so does the handle whose acquires were cancelled.
pub async fn cancelled_acquire_leaves_nothing(s: &dyn Subject) -> Outcome {
    let (a, b, c) = (client(s).await, client(s).await, client(s).await);
    let key = unique_key("cancel");
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    // Cancelled at several points: before its first reply, while queued,
    // and after settling into its wait.
    for ms in [0u64, 1, 3, 10, 50, 300] {
        let r = tokio::time::timeout(
            Duration::from_millis(ms),
            b.acquire(&key, AcquireOptions::wait(Duration::from_secs(30))),
        )
        .await;
        assert!(r.is_err(), "a waiter got a held key: {r:?}");
    }
    assert!(must(g.release().await, "holder's release"));
    let t0 = Instant::now();
    let g2 = must(
        c.acquire(&key, AcquireOptions::wait(Duration::from_secs(10)))
            .await,
        "another handle after the cancelled waits",
    );
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "a cancelled acquire blocked the key for {took:?}"
    );
    assert!(must(g2.release().await, "release"));
    // Cancelled on a FREE key, at every point of its way: what it may have
    // taken must be given back, not held for a lease or a session.
    for us in [0u64, 50, 200, 500, 1_000, 2_000, 5_000] {
        let r = tokio::time::timeout(
            Duration::from_micros(us),
            b.acquire(&key, AcquireOptions::wait(Duration::from_secs(30))),
        )
        .await;
        if let Ok(r) = r {
            must(must(r, "acquire of a free key").release().await, "release");
        }
    }
    let t0 = Instant::now();
    let g3 = must(
        c.acquire(&key, AcquireOptions::wait(Duration::from_secs(10)))
            .await,
        "another handle after acquires of a free key were cancelled",
    );
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "an acquire cancelled on a free key kept it for {took:?}"
    );
    assert!(must(g3.release().await, "release"));
    must(
        b.acquire(&key, AcquireOptions::wait(Duration::from_secs(2)))
            .await,
        "the cancelled handle itself",
    )
    .release()
    .await
    .ok();
    Outcome::Passed
}

/// A fixed lease taken after waiting runs from the moment it was granted,
/// not from when the wait began or from an older keepalive.
pub async fn fixed_lease_after_waiting(s: &dyn Subject) -> Outcome {
    let (a, b, c) = (client(s).await, client(s).await, client(s).await);
    if !caps(&a).renewal {
        return Outcome::NotApplicable("no leases");
    }
    let key = unique_key("lease-after-wait");
    let lease = Duration::from_millis(600);
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    let k2 = key.clone();
    let waiter = tokio::spawn(async move {
        b.acquire(
            &k2,
            AcquireOptions::wait(Duration::from_secs(10)).with_lease(lease),
        )
        .await
    });
    // Hold for longer than the waiter's lease.
    tokio::time::sleep(lease + Duration::from_millis(400)).await;
    assert!(must(g.release().await, "holder's release"));
    let got = match waiter.await {
        Ok(r) => must(r, "waiter"),
        Err(e) => panic!("waiter task: {e}"),
    };
    let now = Instant::now();
    assert!(!got.is_lost(), "the lease arrived already lost");
    let left = got.valid_until().saturating_duration_since(now);
    assert!(
        left > lease / 2,
        "a {lease:?} lease taken after waiting was vouched for only {left:?} more"
    );
    let r = c.acquire(&key, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "the server did not hold the lease the guard vouched for: {r:?}"
    );
    // And it does end: the next holder gets the key within lease + 1 s.
    let t0 = Instant::now();
    std::mem::forget(got);
    must(
        c.acquire(&key, AcquireOptions::wait(Duration::from_secs(5)))
            .await,
        "after the fixed lease",
    )
    .release()
    .await
    .ok();
    assert!(t0.elapsed() < lease + Duration::from_secs(1));
    Outcome::Passed
}

/// `valid_until` is a bound: it is never later than the moment the next
/// holder's acquire completes (here, after a holder that never releases).
pub async fn valid_until_is_a_bound(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    if !caps(&a).renewal {
        return Outcome::NotApplicable(
            "no leases: the lock lives as long as its session; tested per backend",
        );
    }
    for (i, ms) in [150u64, 300, 500].into_iter().enumerate() {
        let key = unique_key(&format!("valid-until-{i}"));
        let g = must(
            a.acquire(
                &key,
                AcquireOptions::try_lock().with_lease(Duration::from_millis(ms)),
            )
            .await,
            "holder",
        );
        let vouched = g.valid_until();
        // The holder "hangs": it never releases and never drops.
        std::mem::forget(g);
        let next = must(
            b.acquire(&key, AcquireOptions::wait(Duration::from_secs(5)))
                .await,
            "next holder",
        );
        let acquired = Instant::now();
        assert!(
            vouched <= acquired,
            "valid_until was {:?} after the next holder got the lock",
            vouched - acquired
        );
        must(next.release().await, "release");
    }
    Outcome::Passed
}

/// Fencing tokens never go backwards across a restart of the servers.
pub async fn tokens_survive_restart(s: &dyn Subject) -> Outcome {
    let a = client(s).await;
    if !caps(&a).fencing {
        return Outcome::NotApplicable("no fencing token");
    }
    let key = unique_key("token-restart");
    let mut last = None;
    for _ in 0..3 {
        let g = must(
            a.acquire(&key, AcquireOptions::wait(Duration::from_secs(2)))
                .await,
            "acquire",
        );
        last = last.max(g.token());
        must(g.release().await, "release");
    }
    drop(a);
    if let Err(e) = s.restart_servers().await {
        panic!("the backend declares fencing, so its subject must restart its servers: {e}");
    }
    // Clients reconnect on their own time: retry within a bound.
    let deadline = Instant::now() + Duration::from_secs(30);
    let token = loop {
        let attempt = async {
            let c = s.client().await?;
            let g = c
                .acquire(&key, AcquireOptions::wait(Duration::from_secs(5)))
                .await?;
            let t = g.token();
            g.release().await?;
            Ok::<_, Error>(t)
        };
        match attempt.await {
            Ok(t) => break t,
            Err(e) if Instant::now() < deadline => {
                println!("after restart, not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no lock within 30 s of the restart: {e}"),
        }
    };
    assert!(
        token > last,
        "token {token:?} after a restart, {last:?} before: fencing went backwards"
    );
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

/// Checks a run's outcomes against the cases the test expects skipped:
/// every other case passed, and exactly those were selected out.
///
/// # Panics
/// When a case was skipped unexpectedly or ran although listed as skipped.
pub fn expect_outcome(case: &str, outcome: Outcome, skipped: &[&str]) {
    match outcome {
        Outcome::Passed => assert!(
            !skipped.contains(&case),
            "{case} ran and passed, but the test lists it as skipped by capability"
        ),
        Outcome::NotApplicable(why) => assert!(
            skipped.contains(&case),
            "{case} was selected out ({why}) but the test does not list it as skipped"
        ),
    }
}

/// Every case, in order, each reported by name (stdout) with its outcome:
/// for backends whose servers are slow to start, one server for all cases.
pub async fn run_all(s: &dyn Subject) -> Vec<(&'static str, Outcome)> {
    let mut out = Vec::new();
    macro_rules! run {
        ($($case:ident),*) => {$(
            println!("conformance case {} ...", stringify!($case));
            let o = $case(s).await;
            println!("conformance case {}: {:?}", stringify!($case), o);
            out.push((stringify!($case), o));
        )*};
    }
    run!(
        mutual_exclusion,
        try_lock_on_held_key,
        wait_budget_is_honoured,
        release_only_own,
        fixed_lease_expires,
        watchdog_keeps_lock,
        lost_fires,
        tokens_increase,
        reentrancy,
        drop_releases,
        shared_handle_mutual_exclusion,
        stale_release_same_handle,
        cancelled_acquire_leaves_nothing,
        fixed_lease_after_waiting,
        valid_until_is_a_bound,
        unreachable_endpoint_fails_fast,
        uncontended_acquire_round_trips,
        tokens_survive_restart
    );
    out
}

/// Checks [`run_all`]'s outcomes (see [`expect_outcome`]).
///
/// # Panics
/// As [`expect_outcome`].
pub fn expect_outcomes(outcomes: Vec<(&'static str, Outcome)>, skipped: &[&str]) {
    for (case, o) in outcomes {
        expect_outcome(case, o, skipped);
    }
}

/// One `#[tokio::test]` per conformance case, each against a fresh
/// `$subject` (an expression, evaluated inside the test's runtime, so it
/// may `.await`), and asserting the cases skipped by capability are
/// exactly `skipped`. The ONE list of cases; [`run_all`] follows it.
///
/// ```ignore
/// distlock::conformance_tests!(subject: Redis::single(), skipped: []);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (subject: $subject:expr, skipped: [$($skip:ident),* $(,)?] $(,)?) => {
        $crate::conformance_tests!(@cases ($subject) (&[$(stringify!($skip)),*])
            mutual_exclusion try_lock_on_held_key wait_budget_is_honoured
            release_only_own fixed_lease_expires watchdog_keeps_lock lost_fires
            tokens_increase reentrancy drop_releases shared_handle_mutual_exclusion
            stale_release_same_handle cancelled_acquire_leaves_nothing
            fixed_lease_after_waiting valid_until_is_a_bound
            unreachable_endpoint_fails_fast uncontended_acquire_round_trips
            tokens_survive_restart);

        /// The skip list names real cases (a typo would not compile).
        #[test]
        fn conformance_skip_list_names_real_cases() {
            $(let _ = $crate::testing::$skip;)*
        }
    };
    // For servers slow to start (a JVM, initdb, a 3-node cluster): ONE
    // test running every case in turn on one subject (tokens_survive_restart,
    // which restarts the servers, runs last).
    (one_server: $subject:expr, skipped: [$($skip:ident),* $(,)?] $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn conformance() {
            let subject = $subject;
            $crate::testing::expect_outcomes(
                $crate::testing::run_all(&subject).await,
                &[$(stringify!($skip)),*],
            );
        }

        /// The skip list names real cases (a typo would not compile).
        #[test]
        fn conformance_skip_list_names_real_cases() {
            $(let _ = $crate::testing::$skip;)*
        }
    };
    (@cases ($subject:expr) ($skips:expr) $($case:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let subject = $subject;
            $crate::testing::expect_outcome(
                stringify!($case),
                $crate::testing::$case(&subject).await,
                $skips,
            );
        }
    )*};
}
