//! The fair queue (`redis.fair`, the default) against a real Redis: what a
//! hot key does to it, and the waiters a real deployment loses (timed out,
//! cancelled, crashed), none of which may hold up the key for long.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock, Error};
use fleet::RedisFleet;
use lockbench_redis::node::Keys;
use lockbench_redis::{RedisConfig, RedisLock};

fn cfg(f: &RedisFleet) -> RedisConfig {
    RedisConfig::new(f.nodes[0].url())
}

/// The Redis keys of user key "k" under the default prefix, as the lock
/// lays them out (the tests below write and read them directly).
fn k() -> Keys {
    Keys::new(&RedisConfig::new("redis://unused").key_prefix, "k")
}

async fn raw(f: &RedisFleet) -> redis::aio::MultiplexedConnection {
    redis::Client::open(f.nodes[0].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Eight waiters queued behind a holder on their own clients: each release
/// wakes only the next, so every waiter pays its queueing try and its
/// taking try (and, on a client's first wait ever, one SUBSCRIBE and one
/// try again), not a retry per release of everyone ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter() {
    const WAITERS: usize = 8;
    let f = RedisFleet::single().unwrap();
    // A place refresh (every third of the TTL) would add a round trip on
    // a slow machine; this counts what the wake-ups cost.
    let mut c = cfg(&f);
    c.waiter_ttl_ms = 6_000;
    let holder = RedisLock::connect(c.clone()).await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..WAITERS {
        clients.push(Arc::new(RedisLock::connect(c.clone()).await.unwrap()));
    }
    // Warm every client's wake subscription, as a running service has.
    for c in &clients {
        let g = holder
            .acquire("warm", AcquireOptions::try_lock())
            .await
            .unwrap();
        let w = c.clone();
        let t = tokio::spawn(async move {
            w.acquire("warm", AcquireOptions::wait(Duration::from_secs(5)))
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        g.release().await.unwrap();
        t.await.unwrap();
    }
    let g = holder
        .acquire("hot", AcquireOptions::try_lock())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for c in clients {
        tasks.push(tokio::spawn(async move {
            let g = c
                .acquire("hot", AcquireOptions::wait(Duration::from_secs(10)))
                .await
                .unwrap();
            let rt = g.round_trips();
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(g.release().await.unwrap());
            rt
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.release().await.unwrap();
    let mut rts = Vec::new();
    for t in tasks {
        rts.push(t.await.unwrap());
    }
    println!("round trips per waiting acquire: {rts:?}");
    assert!(
        rts.iter().all(|&r| r <= 2),
        "a waiter paid more than queue + take: {rts:?}"
    );
}

/// A waiter whose wait runs out leaves the queue at once: a try-lock right
/// after the holder's release succeeds (it would fail, not its turn, if
/// the dead place were still at the head).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_leaves_no_place_behind() {
    let f = RedisFleet::single().unwrap();
    let (a, b, c) = (
        RedisLock::connect(cfg(&f)).await.unwrap(),
        RedisLock::connect(cfg(&f)).await.unwrap(),
        RedisLock::connect(cfg(&f)).await.unwrap(),
    );
    let g = a.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    let r = b
        .acquire("k", AcquireOptions::wait(Duration::from_millis(300)))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    g.release().await.unwrap();
    let got = c.acquire("k", AcquireOptions::try_lock()).await;
    assert!(got.is_ok(), "the timed-out waiter still blocks: {got:?}");
    let mut con = raw(&f).await;
    let queued: i64 = redis::cmd("LLEN")
        .arg(k().queue)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(queued, 0, "the queue kept the timed-out waiter");
}

/// The lock lying free between a release and the woken head's take is
/// not up for grabs: with a live waiter at the head of the queue, a
/// newcomer's try-lock fails and its waiting acquire only queues behind,
/// while the fast path (empty queue: a plain `SET NX`) does take a free
/// key. The head is written by hand so the window stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_pass_a_waiting_head() {
    let f = RedisFleet::single().unwrap();
    let lock = RedisLock::connect(cfg(&f)).await.unwrap();
    let g = lock.acquire("free", AcquireOptions::try_lock()).await;
    assert!(g.is_ok(), "an empty queue's free key refused: {g:?}");
    g.unwrap().release().await.unwrap();

    let mut con = raw(&f).await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let deadline_ms = secs * 1000 + micros / 1000 + 10_000;
    let head = "0123456789abcdef:someone-else";
    let _: () = redis::cmd("RPUSH")
        .arg(k().queue)
        .arg(head)
        .query_async(&mut con)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(k().waiters)
        .arg(deadline_ms)
        .arg(head)
        .query_async(&mut con)
        .await
        .unwrap();
    let r = lock.acquire("k", AcquireOptions::try_lock()).await;
    assert!(r.is_err(), "a try-lock passed the waiting head: {r:?}");
    let r = lock
        .acquire("k", AcquireOptions::wait(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "a waiting acquire passed the waiting head: {r:?}"
    );
    let held: i64 = redis::cmd("EXISTS")
        .arg(k().lock)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(held, 0, "the key was taken past the head");
    let first: String = redis::cmd("LINDEX")
        .arg(k().queue)
        .arg(0)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(first, head, "the head lost its place");
}

/// An acquire dropped mid-wait (a `select!`, a cancelled task) withdraws
/// its place in the background; the next waiter gets the key on the
/// holder's release without waiting out the dropped one's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_ahead_does_not_delay_the_next() {
    let f = RedisFleet::single().unwrap();
    let mut c = cfg(&f);
    c.waiter_ttl_ms = 5_000;
    let (a, b) = (
        RedisLock::connect(c.clone()).await.unwrap(),
        Arc::new(RedisLock::connect(c.clone()).await.unwrap()),
    );
    let next = Arc::new(RedisLock::connect(c).await.unwrap());
    let g = a.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        b.acquire("k", AcquireOptions::wait(Duration::from_secs(10))),
    )
    .await;
    assert!(cancelled.is_err(), "the acquire should still be waiting");
    let n = next.clone();
    let waiter = tokio::spawn(async move {
        n.acquire("k", AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap();
    let took = t0.elapsed();
    println!("hand-over past a cancelled waiter: {took:?}");
    assert!(
        took < Duration::from_millis(2_000),
        "the next waiter waited {took:?} behind a cancelled acquire (its place lasts 5 s)"
    );
    g2.release().await.unwrap();
}

/// A waiter that died mid-wait (a worker killed: no withdrawal, its place
/// just stops being refreshed) holds up a free key for at most the waiter
/// TTL; the live waiter behind it then gets the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_at_the_head_costs_at_most_its_ttl() {
    let f = RedisFleet::single().unwrap();
    let mut c = cfg(&f);
    c.waiter_ttl_ms = 600;
    let a = RedisLock::connect(c.clone()).await.unwrap();
    let b = Arc::new(RedisLock::connect(c).await.unwrap());
    let g = a.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    // The dead worker's place, as its last refresh left it.
    let mut con = raw(&f).await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let dead = "00000000deadbeef:0123456789abcdef0123456789abcdef";
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(k().queue)
        .arg(dead)
        .cmd("ZADD")
        .arg(k().waiters)
        .arg(now_ms + 600)
        .arg(dead)
        .query_async(&mut con)
        .await
        .unwrap();
    let w = b.clone();
    let waiter = tokio::spawn(async move {
        w.acquire("k", AcquireOptions::wait(Duration::from_secs(10)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap();
    let took = t0.elapsed();
    println!("hand-over past a dead waiter (ttl 600 ms): {took:?}");
    assert!(
        took < Duration::from_millis(600 + 400 + 500),
        "a dead waiter held the free key for {took:?}"
    );
    g2.release().await.unwrap();
}

/// `redis.fair = false` keeps the old lock measurable: it declares itself
/// unfair (so the FIFO case is selected out) and still excludes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unfair_variant_stays_selectable() {
    let f = RedisFleet::single().unwrap();
    let mut c = cfg(&f);
    c.fair = false;
    let lock = RedisLock::connect(c.clone()).await.unwrap();
    assert!(!lock.capabilities().fair);
    assert!(
        RedisLock::connect(cfg(&f))
            .await
            .unwrap()
            .capabilities()
            .fair
    );
    struct Unfair(RedisConfig);
    #[async_trait::async_trait]
    impl distlock::testing::Subject for Unfair {
        async fn client(&self) -> distlock::Result<Arc<dyn DistLock>> {
            Ok(Arc::new(RedisLock::connect(self.0.clone()).await?))
        }
        async fn sabotage(&self, _key: &str) -> distlock::Result<()> {
            Ok(())
        }
        fn watchdog_lease(&self) -> Duration {
            Duration::from_millis(self.0.watchdog_lease_ms)
        }
    }
    let s = Unfair(c);
    use distlock::testing::{self, Outcome};
    assert_eq!(testing::mutual_exclusion(&s).await, Outcome::Passed);
    assert_eq!(
        testing::cancelled_acquire_leaves_nothing(&s).await,
        Outcome::Passed
    );
    assert!(matches!(
        testing::waiters_served_in_order(&s).await,
        Outcome::NotApplicable(_)
    ));
}
