//! RedLock's waiting queue (`redlock.fair`, the default) on five real
//! masters: a release wakes the waiter (no polling), a waiter that died
//! in the queue holds nobody up for longer than its place's TTL, a
//! try-lock never queues, and a waiter that gives up leaves every queue.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use distlock::{AcquireOptions, DistLock, Error};
use fleet::RedisFleet;
use lockbench_redlock::{RedLock, RedLockConfig};
use tokio::time::Instant;

fn cfg(fleet: &RedisFleet) -> RedLockConfig {
    let mut cfg = RedLockConfig::new(fleet.urls());
    // A busy shared machine: do not let a slow scheduler look like a dead
    // node (as the conformance tests).
    cfg.node_timeout_ms = 1_000;
    cfg
}

fn redis_con(url: &str) -> redis::Connection {
    let c = redis::Client::open(url).unwrap();
    c.get_connection_with_timeout(Duration::from_secs(1))
        .unwrap()
}

/// With a place TTL of 60 s a waiter refreshes every ~20 s, and with the
/// queue the spec's retry delay is not used: only the release's wake-up
/// can bring it the key within seconds. Asked twice (the first wait also
/// subscribes), the contended acquire takes 2 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_queued_waiter() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut c = cfg(&fleet);
    c.waiter_ttl_ms = 60_000;
    c.retry_delay_ms = 20_000;
    let (a, b) = (
        RedLock::connect(c.clone()).await.unwrap(),
        std::sync::Arc::new(RedLock::connect(c).await.unwrap()),
    );
    for round in 0..2 {
        let g = a
            .acquire("k", AcquireOptions::wait(Duration::from_secs(5)))
            .await
            .unwrap();
        let b = b.clone();
        let waiter = tokio::spawn(async move {
            let r = b
                .acquire("k", AcquireOptions::wait(Duration::from_secs(30)))
                .await;
            (r, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let released = Instant::now();
        assert!(g.release().await.unwrap());
        let (got, at) = waiter.await.unwrap();
        let got = got.unwrap();
        let took = at - released;
        assert!(
            took < Duration::from_secs(5),
            "round {round}: the waiter got the key {took:?} after the release: it was not woken"
        );
        // Round 0: queue, subscribe (a round trip), ask again at once,
        // then the woken round. Later: queue, woken round.
        let expected = if round == 0 { 4 } else { 2 };
        assert!(
            got.round_trips() <= expected,
            "round {round}: {} round trips, expected at most {expected}",
            got.round_trips()
        );
        assert!(got.release().await.unwrap());
    }
}

/// A waiter whose process died stays at the head of every queue until its
/// place's TTL runs out; then the next waiter gets the key (the scripts
/// drop stale heads), not the dead one's wait budget or forever later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_at_the_head_holds_nobody_up_past_its_ttl() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut c = cfg(&fleet);
    c.waiter_ttl_ms = 600;
    let lock = std::sync::Arc::new(RedLock::connect(c).await.unwrap());
    let g = lock
        .acquire("k", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    // The dead waiter: first in line (priority 1 µs), its place good for
    // 600 ms from now by each master's clock, never refreshed.
    let key = lock.lock_key("k");
    for url in fleet.urls() {
        let mut con = redis_con(&url);
        let t: Vec<u64> = redis::cmd("TIME").query(&mut con).unwrap();
        let now_ms = t[0] * 1000 + t[1] / 1000;
        let entry = "0000000000000000:dead";
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg(format!("{key}:rank"))
            .arg(1)
            .arg(entry)
            .ignore()
            .cmd("ZADD")
            .arg(format!("{key}:waiting"))
            .arg(now_ms + 600)
            .arg(entry)
            .ignore()
            .query(&mut con)
            .unwrap();
    }
    let w = lock.clone();
    let waiter = tokio::spawn(async move {
        let r = w
            .acquire("k", AcquireOptions::wait(Duration::from_secs(20)))
            .await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    assert!(g.release().await.unwrap());
    let (got, at) = waiter.await.unwrap();
    let got = got.expect("the live waiter must get the key once the dead one's place expired");
    let took = at - released;
    // The dead place had at most 600 ms left; the live waiter refreshes
    // (and so re-checks) every ~200 ms.
    assert!(
        took < Duration::from_secs(3),
        "the live waiter waited {took:?} behind a dead one"
    );
    assert!(got.release().await.unwrap());
}

/// A try-lock answers at once and never joins a queue; a waiter that gives
/// up leaves every master's queue, so a try-lock after it finds the key
/// free to take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_locks_never_queue_and_a_waiter_that_gives_up_leaves() {
    let fleet = RedisFleet::independent(5).unwrap();
    let c = cfg(&fleet);
    let (a, b) = (
        RedLock::connect(c.clone()).await.unwrap(),
        RedLock::connect(c).await.unwrap(),
    );
    let g = a.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    let key = a.lock_key("k");
    let queued = |fleet: &RedisFleet| -> usize {
        fleet
            .urls()
            .iter()
            .map(|u| {
                let n: usize = redis::cmd("ZCARD")
                    .arg(format!("{key}:rank"))
                    .query(&mut redis_con(u))
                    .unwrap();
                n
            })
            .sum()
    };
    assert!(matches!(
        b.acquire("k", AcquireOptions::try_lock()).await,
        Err(Error::Timeout { .. })
    ));
    assert_eq!(queued(&fleet), 0, "a try-lock joined a queue");
    assert!(matches!(
        b.acquire("k", AcquireOptions::wait(Duration::ZERO)).await,
        Err(Error::Timeout { .. })
    ));
    assert_eq!(queued(&fleet), 0, "a wait of 0 joined a queue");
    let r = b
        .acquire("k", AcquireOptions::wait(Duration::from_millis(700)))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert_eq!(queued(&fleet), 0, "a waiter that gave up is still queued");
    assert!(g.release().await.unwrap());
    let g = b.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    assert!(g.release().await.unwrap());
}

/// A lost round gives back what it got, and keeps the waiter's place on
/// those masters: the acquire that landed there took it out of the queue.
/// Here the key is held on 3 masters by a holder we do not know, so the
/// waiter's first round wins the 2 free masters and loses; its place must
/// stand on all five while it waits (before, it was missing on those 2
/// until its next round, and a waiter whose rounds kept timing out on a
/// busy machine was passed by 96 others in one wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_round_keeps_the_waiters_place_everywhere() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut c = cfg(&fleet);
    // The next refresh seconds away: what the lost rounds left is read
    // before another round can change it.
    c.waiter_ttl_ms = 30_000;
    let lock = std::sync::Arc::new(RedLock::connect(c).await.unwrap());
    let key = lock.lock_key("k");
    let urls = fleet.urls();
    for url in &urls[..3] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("someone-else")
            .arg("PX")
            .arg(5_000)
            .query(&mut redis_con(url))
            .unwrap();
    }
    let w = lock.clone();
    let waiter = tokio::spawn(async move {
        w.acquire("k", AcquireOptions::wait(Duration::from_secs(20)))
            .await
    });
    // The lost rounds before the waiter sleeps (one, or two with the
    // SUBSCRIBE between) end within a few ms, or a node deadline each on a
    // loaded machine; the holder's keys (5 s) and the refresh (10 s) are
    // further off. Polled until both hold, for 3 s: without the kept place
    // the free masters lack it until the next round, seconds later.
    let read = || {
        let places: Vec<usize> = urls
            .iter()
            .map(|u| {
                redis::cmd("ZCARD")
                    .arg(format!("{key}:rank"))
                    .query(&mut redis_con(u))
                    .unwrap()
            })
            .collect();
        let held_on_free: Vec<bool> = urls[3..]
            .iter()
            .map(|u| {
                let v: Option<String> = redis::cmd("GET")
                    .arg(&key)
                    .query(&mut redis_con(u))
                    .unwrap();
                v.is_some()
            })
            .collect();
        (places, held_on_free)
    };
    let until = Instant::now() + Duration::from_secs(3);
    let (places, held_on_free) = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (p, h) = read();
        if (p == vec![1; 5] && h == vec![false; 2]) || Instant::now() > until {
            break (p, h);
        }
    };
    for url in &urls[..3] {
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query(&mut redis_con(url))
            .unwrap();
    }
    let g = waiter.await.unwrap().unwrap();
    assert!(g.release().await.unwrap());
    assert_eq!(places, vec![1; 5], "the waiter's place on each master");
    assert_eq!(
        held_on_free,
        vec![false; 2],
        "the lost round gave back the free masters"
    );
}

/// A master down at a handle's first wait did not take its SUBSCRIBE, and
/// was never asked again: its wake-ups were lost for the handle's life
/// (found by a probe). Once it is back, a later wait subscribes it; then
/// with two other masters down, the wake quorum needs it, and the waiter
/// is woken (its refresh, every ~10 s here, would be too late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_down_at_the_first_wait_is_subscribed_once_back() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut c = cfg(&fleet);
    c.waiter_ttl_ms = 30_000;
    fleet.nodes[0].kill().unwrap();
    let a = RedLock::connect(c.clone()).await.unwrap();
    let b = std::sync::Arc::new(RedLock::connect(c).await.unwrap());
    // Holds `key` on a, lets b wait for it, releases after `hold`; how
    // long after the release b had it.
    let handover = |key: &'static str, hold: Duration| {
        let (a, b) = (&a, b.clone());
        async move {
            let g = a.acquire(key, AcquireOptions::try_lock()).await.unwrap();
            let waiter = tokio::spawn(async move {
                let r = b
                    .acquire(key, AcquireOptions::wait(Duration::from_secs(25)))
                    .await;
                (r, Instant::now())
            });
            tokio::time::sleep(hold).await;
            let released = Instant::now();
            assert!(g.release().await.unwrap());
            let (r, at) = waiter.await.unwrap();
            assert!(r.unwrap().release().await.unwrap());
            at - released
        }
    };
    // The first wait, with master 0 down.
    handover("k", Duration::from_millis(300)).await;
    fleet.nodes[0].restart().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A later wait asks master 0 again, in the background: seen there as a
    // channel with a subscriber, within 5 s (a SUBSCRIBE that failed on a
    // loaded machine is retried at most once a second, on a later wait).
    let subscribed = || {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query(&mut redis_con(&fleet.urls()[0]))
            .unwrap();
        !channels.is_empty()
    };
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        handover("k", Duration::from_millis(300)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if subscribed() || Instant::now() > until {
            break;
        }
    }
    assert!(subscribed(), "master 0 was never asked again");
    fleet.nodes[3].kill().unwrap();
    fleet.nodes[4].kill().unwrap();
    let took = handover("k", Duration::from_millis(1_000)).await;
    assert!(
        took < Duration::from_secs(3),
        "woken {took:?} after the release: master 0's wake-up was missed"
    );
}

/// Forwards to `target`, holding every reply back by `delay`: a client
/// behind it has its requests served at once and answered late.
async fn slow_replies(target: std::net::SocketAddr, delay: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    url
}

/// A client whose node timeout is below its round trip (here its replies
/// come 40 ms late, its timeout is 10 ms) can never win a round, yet its
/// requests land and queue it first. Were it to keep its place after such
/// rounds, it would stay the head and stop every other waiter for its
/// whole wait budget; it leaves the queue after a round no quorum
/// answered, and the waiter behind it gets the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_no_quorum_answers_does_not_hold_up_the_queue() {
    let fleet = RedisFleet::independent(5).unwrap();
    let mut slow_urls = Vec::new();
    for n in &fleet.nodes {
        let target = format!("{}:{}", n.addr(), n.port()).parse().unwrap();
        slow_urls.push(slow_replies(target, Duration::from_millis(40)).await);
    }
    let mut slow_cfg = RedLockConfig::new(slow_urls);
    slow_cfg.node_timeout_ms = 10;
    slow_cfg.connect_timeout_ms = 2_000;
    let slow = std::sync::Arc::new(RedLock::connect(slow_cfg).await.unwrap());
    let (a, b) = (
        RedLock::connect(cfg(&fleet)).await.unwrap(),
        std::sync::Arc::new(RedLock::connect(cfg(&fleet)).await.unwrap()),
    );
    let g = a.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    // The slow client asks first, so it is ahead of the waiter.
    let s = slow.clone();
    let slow_wait = tokio::spawn(async move {
        s.acquire("k", AcquireOptions::wait(Duration::from_secs(8)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w = b.clone();
    let waiter = tokio::spawn(async move {
        let r = w
            .acquire("k", AcquireOptions::wait(Duration::from_secs(20)))
            .await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(g.release().await.unwrap());
    let (r, at) = waiter.await.unwrap();
    let took = at - released;
    println!("the waiter had the key {took:?} after the release");
    r.unwrap().release().await.unwrap();
    assert!(
        took < Duration::from_secs(4),
        "the waiter got the key {took:?} after the release, behind a client that could not win"
    );
    assert!(slow_wait.await.unwrap().is_err());
}
