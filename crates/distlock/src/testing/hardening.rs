//! The contract under ordinary misuse and outages: a handle shared by many
//! tasks, a stale release by the same handle, a cancelled acquire, a lease
//! taken after a wait, `valid_until` as a bound, tokens across a restart.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{caps, client, must, unique_key, Outcome, Subject};
use crate::{AcquireOptions, DistLock, Error};

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

/// Another handle gets the free `key` within 2 s (not at the end of a
/// lease or a session) and releases it; `after` says what came before.
async fn taken_at_once(other: &Arc<dyn DistLock>, key: &str, after: &str) {
    let t0 = Instant::now();
    let g = must(
        other
            .acquire(key, AcquireOptions::wait(Duration::from_secs(10)))
            .await,
        &format!("another handle, {after}"),
    );
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "{after}, the key stayed blocked for {took:?}"
    );
    assert!(must(g.release().await, "release"));
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
    taken_at_once(&c, &key, "after the cancelled waits").await;
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
    taken_at_once(&c, &key, "after acquires of a free key were cancelled").await;
    must(
        b.acquire(&key, AcquireOptions::wait(Duration::from_secs(2)))
            .await,
        "the cancelled handle itself",
    )
    .release()
    .await
    .ok();
    // Cancelled just as its own budget ran out, while it withdraws what it
    // queued: that withdrawal must still happen (etcd's did not, 10-12 of
    // 40 tries in a probe, and the key stayed blocked for the session).
    let g = must(
        a.acquire(&key, AcquireOptions::wait(Duration::from_secs(10)))
            .await,
        "holder, again",
    );
    for us in (0u64..4_000).step_by(250) {
        let budget = Duration::from_millis(100);
        let r = tokio::time::timeout(
            budget + Duration::from_micros(us),
            b.acquire(&key, AcquireOptions::wait(budget)),
        )
        .await;
        assert!(!matches!(r, Ok(Ok(_))), "a waiter got a held key: {r:?}");
    }
    assert!(must(g.release().await, "holder's release, again"));
    taken_at_once(&c, &key, "after acquires cancelled while withdrawing").await;
    Outcome::Passed
}

/// `opts` with, where leases exist, one far longer than any wait of these
/// cases: a release that never happened shows as a key the next holder
/// cannot get, not as a lease that ran out. Session-bound locks hold for
/// the session's life.
fn outliving(lock: &Arc<dyn DistLock>, opts: AcquireOptions) -> AcquireOptions {
    if caps(lock).renewal {
        opts.with_lease(Duration::from_secs(60))
    } else {
        opts
    }
}

/// A release cancelled on its way (a timeout around it, an aborted task)
/// still gives the key back at once, not at the end of a lease or a
/// session; and whatever of it goes on in the background never takes the
/// next holder's lock, be that holder another handle or the same one.
pub async fn cancelled_release_frees_the_key(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    let key = unique_key("cancelled-release");
    let opts = outliving(&a, AcquireOptions::wait(Duration::from_secs(5)));
    for (i, us) in [0u64, 0, 100, 300, 600, 1_000, 2_000, 4_000]
        .into_iter()
        .enumerate()
    {
        let next = if i % 2 == 0 { &a } else { &b };
        let g = must(a.acquire(&key, opts).await, "holder");
        // 0 µs: one poll, then dropped.
        let _ = tokio::time::timeout(Duration::from_micros(us), g.release()).await;
        let g2 = must(
            next.acquire(&key, opts).await,
            "the next holder, after a release cancelled",
        );
        // Time for what the cancelled release left in the background.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !g2.is_lost(),
            "try {i} ({us} µs): the next holder lost its lock"
        );
        assert!(
            must(g2.release().await, "the next holder's release"),
            "try {i} ({us} µs): the cancelled release took the next holder's lock"
        );
    }
    Outcome::Passed
}

/// A guard dropped where no runtime runs (moved into a plain thread, as a
/// user's sync code or a destructor does) still gives the key back at
/// once, not at the end of a lease, a session or the process: ZooKeeper's
/// and pg-advisory's key stayed held until the process ended, etcd's until
/// the handle was dropped (found by a probe). Where leases exist, one far
/// longer than the wait, so a release that never happened shows.
pub async fn dropped_off_runtime_frees_the_key(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    let key = unique_key("dropped-off-runtime");
    let opts = outliving(&a, AcquireOptions::try_lock());
    for _ in 0..2 {
        let g = must(a.acquire(&key, opts).await, "holder");
        let dropped = std::thread::spawn(move || drop(g)).join();
        assert!(dropped.is_ok(), "dropping a guard off the runtime panicked");
        taken_at_once(&b, &key, "after a guard was dropped off the runtime").await;
    }
    Outcome::Passed
}

/// Requests no backend can serve are refused at once, naming the bound,
/// and leave the handle whole: a key over [`crate::MAX_KEY_BYTES`] (a 1 MB
/// one cost ZooKeeper its session, and the other locks on it) and a fixed
/// lease with no validity left (a 1 ns lease was an error from inside
/// Redis's script; 1-3 ms leases came back already lost). A key of exactly
/// the bound, of multi-byte characters and separators, is served.
pub async fn oversized_requests_are_refused_at_once(s: &dyn Subject) -> Outcome {
    let (a, b) = (client(s).await, client(s).await);
    let key = unique_key("bounds");
    let held = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    let t0 = Instant::now();
    let long = "k".repeat(crate::MAX_KEY_BYTES + 1);
    let r = a
        .acquire(&long, AcquireOptions::wait(Duration::from_secs(5)))
        .await;
    assert!(
        matches!(&r, Err(Error::Unsupported { what, .. }) if what.contains("1025 bytes")),
        "a key over the bound: {r:?}"
    );
    if caps(&a).renewal {
        for lease in [Duration::from_nanos(1), Duration::from_millis(3)] {
            let r = a
                .acquire(
                    &unique_key("short-lease"),
                    AcquireOptions::try_lock().with_lease(lease),
                )
                .await;
            assert!(
                matches!(&r, Err(Error::Unsupported { what, .. }) if what.contains("at least 4ms")),
                "a {lease:?} lease: {r:?}"
            );
        }
    }
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "refusing took {:?}",
        t0.elapsed()
    );
    // Every byte of the bound used, in characters each backend escapes or
    // encodes: '/' (a path separator), '%', '{}' (a hash tag), 3-byte UTF-8.
    let mut edge = format!("{key}/");
    let pattern = ['/', '%', '{', '}', 'é', '键', 'x', '\u{1F512}'];
    let mut i = 0;
    while edge.len() < crate::MAX_KEY_BYTES {
        let c = pattern[i % pattern.len()];
        if edge.len() + c.len_utf8() > crate::MAX_KEY_BYTES {
            edge.push('x');
        } else {
            edge.push(c);
        }
        i += 1;
    }
    assert_eq!(edge.len(), crate::MAX_KEY_BYTES);
    let g = must(
        b.acquire(&edge, AcquireOptions::try_lock()).await,
        "a key of exactly the bound",
    );
    let r = a.acquire(&edge, AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "a held key of the bound was taken again: {r:?}"
    );
    assert!(must(g.release().await, "release of the longest key"));
    assert!(!held.is_lost(), "a refused request cost another lock");
    assert!(must(held.release().await, "holder's release"));
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
    // Half of it must be left after the grant, a committed write on the
    // durable servers: 300 ms of slack is the margin that failed the
    // watchdog case on CI.
    let lease = Duration::from_millis(1_200);
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

/// "Wait forever" is `Duration::MAX`, the natural way to say it: a wait,
/// not an overflow (every backend panicked adding it to the clock). On a
/// free key it takes the lock; on a held one, it takes it once released.
pub async fn waiting_forever_is_a_wait(s: &dyn Subject) -> Outcome {
    const LIMIT: Duration = Duration::from_secs(10);
    let (a, b) = (client(s).await, client(s).await);
    let key = unique_key("forever");
    let forever = AcquireOptions::wait(Duration::MAX);
    let g = tokio::time::timeout(LIMIT, a.acquire(&key, forever))
        .await
        .unwrap_or_else(|_| panic!("a wait forever on a free key took over {LIMIT:?}"));
    let g = must(g, "a wait forever on a free key");
    let key2 = key.clone();
    let waiter = tokio::spawn(async move { b.acquire(&key2, forever).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "a wait forever got a held key");
    assert!(must(g.release().await, "holder's release"));
    let got = tokio::time::timeout(LIMIT, waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter did not get the released key within {LIMIT:?}"))
        .unwrap_or_else(|e| panic!("the waiting task failed: {e}"));
    assert!(must(
        must(got, "the waiter").release().await,
        "the waiter's release"
    ));
    Outcome::Passed
}

/// Three clients from `connect`.
async fn three<F, Fut>(connect: &F) -> (Arc<dyn DistLock>, Arc<dyn DistLock>, Arc<dyn DistLock>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = crate::Result<Arc<dyn DistLock>>>,
{
    (
        must(connect().await, "client"),
        must(connect().await, "client"),
        must(connect().await, "client"),
    )
}

/// A waiter whose acquire failed while every server was stalled (SIGSTOP)
/// leaves nothing behind once they wake: its request, sent into the stall,
/// may be served on resume after the holder's lease ran out and take the
/// key, and the withdrawal that could not reach the server during the
/// stall must follow it (it tried once, so the key was dead for a whole
/// lease). `pause(true)` stops every server, `pause(false)` resumes them.
/// The clients' lease (watchdog) should be a few seconds, their request
/// deadline about 1 s.
///
/// Not in [`run_all`]: it needs the servers' processes.
pub async fn a_stall_leaves_no_stuck_key<F, Fut>(connect: F, lease: Duration, pause: impl Fn(bool))
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = crate::Result<Arc<dyn DistLock>>>,
{
    let (a, b, c) = three(&connect).await;
    let key = unique_key("stall");
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            b.acquire(&key, AcquireOptions::wait(Duration::from_secs(30)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    pause(true);
    // Longer than the lease: the holder's key runs out while all sleep.
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    pause(false);
    let resumed = Instant::now();
    let _ = g.release().await;
    // It may have waited through the stall and got the key: give it back.
    if let Ok(Ok(g)) = waiter.await {
        let _ = g.release().await;
    }
    let g3 = must(
        c.acquire(&key, AcquireOptions::wait(lease * 3)).await,
        "another handle after the stall",
    );
    let took = resumed.elapsed();
    assert!(
        took < lease * 7 / 10,
        "the key stayed taken {took:?} after the servers resumed (lease {lease:?}): a request sent into the stall was never withdrawn"
    );
    let _ = g3.release().await;
}

/// Waiters with a budget wait through an outage of the servers (a stall,
/// a restart, a leader lost): one queued before it, one that came during
/// it, each with 20 s to wait. Waiters gave up within 1-3 s of an outage
/// that ended well inside their budget (Redis behind Sentinel, a Redis
/// Cluster, pg-row, pg-optimistic, ZooKeeper). `outage(true)` begins it,
/// `outage(false)` ends it 3 s later; the holder lets go 1 s after that.
///
/// Not in [`run_all`]: it needs the servers' processes.
pub async fn waiters_wait_through_an_outage<F, Fut>(connect: F, outage: impl Fn(bool))
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = crate::Result<Arc<dyn DistLock>>>,
{
    let (a, b, c) = three(&connect).await;
    let key = unique_key("outage-wait");
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    let waiter = |lock: Arc<dyn DistLock>| {
        let key = key.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let r = lock
                .acquire(&key, AcquireOptions::wait(Duration::from_secs(20)))
                .await;
            let took = t0.elapsed();
            match r {
                Ok(g) => {
                    let _ = g.release().await;
                    Ok(took)
                }
                Err(e) => Err((e, took)),
            }
        })
    };
    let queued = waiter(b);
    tokio::time::sleep(Duration::from_millis(300)).await;
    outage(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let newcomer = waiter(c);
    tokio::time::sleep(Duration::from_millis(2_700)).await;
    outage(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = g.release().await;
    for (name, w) in [("queued", queued), ("newcomer", newcomer)] {
        match w.await {
            Ok(Ok(took)) => eprintln!("{name} waiter: acquired after {took:?}"),
            Ok(Err((e, took))) => {
                panic!("the {name} waiter gave up after {took:?} of its 20 s: {e}")
            }
            Err(e) => panic!("the {name} waiter's task: {e}"),
        }
    }
}

/// A release sent into an outage (the server down, its requests refused)
/// fails; the key must not then stay held for the rest of its lease: the
/// release goes on in the background and frees it once the server is back
/// (with its data: the lock survived). `lease` is the watchdog lease the
/// handles were configured with (several seconds); `outage(true)` takes
/// every server down, `outage(false)` brings them back.
pub async fn a_release_into_an_outage_is_retried<F, Fut>(
    connect: F,
    lease: Duration,
    outage: impl Fn(bool),
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = crate::Result<Arc<dyn DistLock>>>,
{
    let (a, b) = (
        must(connect().await, "client"),
        must(connect().await, "client"),
    );
    let key = unique_key("release-outage");
    let g = must(a.acquire(&key, AcquireOptions::try_lock()).await, "holder");
    outage(true);
    let released = g.release().await;
    outage(false);
    let back = Instant::now();
    let g = must(
        b.acquire(&key, AcquireOptions::wait(lease * 2)).await,
        "another handle after the outage",
    );
    let took = back.elapsed();
    assert!(
        took < lease / 2,
        "the key stayed held {took:?} after the server was back (lease {lease:?}); the release into the outage said {released:?}"
    );
    let _ = g.release().await;
}
