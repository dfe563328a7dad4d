//! Kleppmann's clock jump ("How to do distributed locking", 2016), scripted
//! against five real Redis masters: RedLock's documented weakness, shown to
//! happen. These tests FAIL if RedLock stops being fooled by it (or if the
//! scenario no longer sets up as scripted).
//!
//! 1. Client A locks K with a fixed 10 s lease while nodes 3 and 4 are
//!    unreachable for it, so A's quorum is nodes 0, 1, 2 only.
//! 2. Node 2's clock jumps 60 s ahead: A's key expires there.
//! 3. Client B locks K and wins nodes 2, 3, 4: a quorum. A still believes
//!    it holds K, and by its own arithmetic rightly so: two holders.
//!
//! The control runs the same steps without the jump: B is refused.
//!
//! "Unreachable for A" is a kill -9 of nodes 3 and 4 for the length of A's
//! acquire, then a restart (no persistence: they come back empty), i.e. A's
//! requests to them are lost. A SIGSTOP would not do: the request A sent
//! waits in the paused node's socket buffer and is executed on SIGCONT
//! (see `a_quorum_win_does_not_cancel_the_slow_nodes_request`), so A would
//! end up holding all five nodes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock, Error, Guard};
use fleet::RedisFleet;
use lockbench_redlock::{RedLock, RedLockConfig};

/// The article's "node 3" (C): the one whose clock jumps.
const JUMPER: usize = 2;
/// The article's D and E: unreachable for A while it acquires.
const CUT: [usize; 2] = [3, 4];
/// Node 2's clock jump (libfaketime syntax): well past the lease.
const JUMP: &str = "+60s";
/// A's and B's fixed lease.
const LEASE: Duration = Duration::from_secs(10);

fn redis_con(url: &str) -> redis::Connection {
    let c = redis::Client::open(url).unwrap();
    c.get_connection_with_timeout(Duration::from_secs(1))
        .unwrap()
}

fn get(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut redis_con(url))
        .unwrap()
}

fn pttl(url: &str, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut redis_con(url))
        .unwrap()
}

/// Five masters, node 2 under libfaketime, and A holding K on 0, 1, 2 only.
struct Scene {
    fleet: RedisFleet,
    cfg: RedLockConfig,
    /// The Redis key of K (the same on every node).
    key: String,
    guard_a: Guard,
    /// A's owner value, as stored on its nodes.
    owner_a: String,
    /// A's handle: kept alive so its connections live as long as its guard.
    _lock_a: RedLock,
}

async fn a_holds_k_on_nodes_0_1_2() -> Scene {
    let fleet = RedisFleet::independent_with_fake_clocks(5, &[JUMPER]).unwrap();
    let mut cfg = RedLockConfig::new(fleet.urls());
    // The default for a 10 s lease is 50 ms; a 2-core machine busy with
    // builds can stall a healthy node that long.
    cfg.node_timeout_ms = 200;
    let lock_a = RedLock::connect(cfg.clone()).await.unwrap();
    let key = lock_a.lock_key("K");

    // D and E drop out of A's reach while it acquires.
    for i in CUT {
        fleet.nodes[i].kill().unwrap();
    }
    let t0 = Instant::now();
    let guard_a = lock_a
        .acquire("K", AcquireOptions::try_lock().with_lease(LEASE))
        .await
        .unwrap();
    eprintln!(
        "A acquired K in {:?} with nodes {CUT:?} down; valid for {:?} more",
        t0.elapsed(),
        guard_a.valid_until() - tokio::time::Instant::now()
    );
    let t0 = Instant::now();
    for i in CUT {
        fleet.nodes[i].restart().unwrap();
    }
    eprintln!("nodes {CUT:?} back (empty) in {:?}", t0.elapsed());

    let urls = fleet.urls();
    let owner_a = get(&urls[0], &key).expect("A's lock on node 0");
    for (i, url) in urls.iter().enumerate() {
        let (v, ttl) = (get(url, &key), pttl(url, &key));
        if CUT.contains(&i) {
            assert_eq!(v, None, "node {i} must not hold A's lock");
            assert_eq!(ttl, -2, "node {i}");
        } else {
            assert_eq!(v.as_deref(), Some(owner_a.as_str()), "node {i}: A's lock");
            assert!(ttl > 0 && ttl <= 10_000, "node {i}: PTTL {ttl}");
        }
    }
    Scene {
        fleet,
        cfg,
        key,
        guard_a,
        owner_a,
        _lock_a: lock_a,
    }
}

/// Asserts A still believes it holds K: inside its validity window, and
/// not told it lost the lock.
async fn a_still_believes_it_holds(s: &Scene) {
    let left = s
        .guard_a
        .valid_until()
        .checked_duration_since(tokio::time::Instant::now());
    assert!(
        left.is_some_and(|d| d > Duration::ZERO),
        "A's validity ran out"
    );
    assert!(!s.guard_a.is_lost(), "A was told it lost K");
    assert!(
        tokio::time::timeout(Duration::from_millis(10), s.guard_a.lost())
            .await
            .is_err(),
        "A's lost() resolved"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_on_one_node_gives_two_holders() {
    let s = a_holds_k_on_nodes_0_1_2().await;
    let urls = s.fleet.urls();

    // Node 2's clock jumps past the lease: Redis expires A's key there
    // (lazily, on this PTTL, if its cron has not already).
    let t_jump = Instant::now();
    s.fleet.nodes[JUMPER].set_clock(JUMP).unwrap();
    let mut polls = 0;
    let gone = loop {
        polls += 1;
        let ttl = pttl(&urls[JUMPER], &s.key);
        if ttl == -2 {
            break t_jump.elapsed();
        }
        assert!(
            t_jump.elapsed() < Duration::from_secs(5),
            "node {JUMPER} still holds A's key (PTTL {ttl}) 5 s after its clock jumped {JUMP}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    eprintln!("node {JUMPER}: A's key gone {gone:?} after the clock jump (PTTL poll {polls})");
    for i in [0, 1] {
        assert!(pttl(&urls[i], &s.key) > 0, "node {i} still holds A's key");
    }

    // B, a client of its own, wins 2, 3, 4: a quorum.
    let lock_b = RedLock::connect(s.cfg.clone()).await.unwrap();
    let t0 = Instant::now();
    let r = lock_b
        .acquire("K", AcquireOptions::try_lock().with_lease(LEASE))
        .await;
    let took = t0.elapsed();
    let guard_b = match r {
        Ok(g) => g,
        Err(e) => panic!("B was refused after the clock jump: {e}"),
    };
    eprintln!(
        "B acquired K in {took:?} (round trips {}); A still valid for {:?}",
        guard_b.round_trips(),
        s.guard_a.valid_until() - tokio::time::Instant::now()
    );
    // The double holder: A has not been told anything, and its own clock
    // says the lease still runs.
    a_still_believes_it_holds(&s).await;
    assert!(!guard_b.is_lost());

    // On the nodes: 0, 1 hold A's value, 2, 3, 4 B's.
    let owner_b = get(&urls[JUMPER], &s.key).expect("B's lock on node 2");
    assert_ne!(owner_b, s.owner_a);
    for (i, url) in urls.iter().enumerate() {
        let want = if i < JUMPER { &s.owner_a } else { &owner_b };
        assert_eq!(get(url, &s.key).as_ref(), Some(want), "node {i}");
    }

    // A learns only on release that it had no quorum any more.
    assert!(
        !s.guard_a.release().await.unwrap(),
        "A's release must find only 2 of its 5 nodes"
    );
    assert!(guard_b.release().await.unwrap(), "B held 3 of 5");
    s.fleet.nodes[JUMPER].set_clock("+0").unwrap();
}

/// The control: the same steps without the jump; B is refused, so it is
/// the clock that breaks RedLock here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_clock_jump_the_second_client_is_refused() {
    let s = a_holds_k_on_nodes_0_1_2().await;
    let urls = s.fleet.urls();
    let lock_b = RedLock::connect(s.cfg.clone()).await.unwrap();
    let t0 = Instant::now();
    let r = lock_b
        .acquire("K", AcquireOptions::try_lock().with_lease(LEASE))
        .await;
    eprintln!("control: B's acquire answered in {:?}", t0.elapsed());
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "B must be refused while A holds 3 of 5: {r:?}"
    );
    a_still_believes_it_holds(&s).await;
    // B's lost round (nodes 3, 4) was given back; A's 3 nodes untouched.
    for (i, url) in urls.iter().enumerate() {
        let want = (!CUT.contains(&i)).then_some(&s.owner_a);
        assert_eq!(get(url, &s.key).as_ref(), want, "node {i}");
    }
    assert!(s.guard_a.release().await.unwrap(), "A held 3 of 5");
    s.fleet.nodes[JUMPER].set_clock("+0").unwrap();
}
