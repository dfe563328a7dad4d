//! The shared conformance suite and etcd's own faults, against real etcd
//! (a single node and a 3-node cluster) started by the fleet.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use distlock::testing::Subject;
use distlock::{AcquireOptions, DistLock, Result};
use lockbench_etcd::{EtcdConfig, EtcdLock};
use tokio::time::Instant;

mod common;
use common::*;

#[async_trait::async_trait]
impl Subject for Etcd {
    async fn client(&self) -> Result<Arc<dyn DistLock>> {
        Ok(Arc::new(EtcdLock::connect(self.cfg.clone()).await?))
    }

    /// Deletes the lock's whole queue, as an operator's `etcdctl del
    /// --prefix` would.
    async fn sabotage(&self, key: &str) -> Result<()> {
        let lock = self.lock().await;
        let (start, end) = lock.queue_range(key);
        let deleted = self
            .admin()
            .await
            .delete(
                start.as_str(),
                Some(etcd_client::DeleteOptions::new().with_range(end.as_str())),
            )
            .await
            .unwrap()
            .deleted();
        assert!(deleted > 0, "nothing to sabotage under {start}");
        Ok(())
    }

    fn watchdog_lease(&self) -> Duration {
        Duration::from_secs(self.cfg.session_ttl_s)
    }

    async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
        let url = "http://127.0.0.1:1".to_string();
        let r = EtcdLock::connect(EtcdConfig::new([url.clone()])).await;
        (url, r.map(|l| Arc::new(l) as Arc<dyn DistLock>))
    }

    /// kill -9 of every member, then all restarted together on their
    /// addresses and data dirs (a member reports healthy only once a quorum
    /// is back); returns when each serves with a leader.
    async fn restart_servers(&self) -> Result<()> {
        let fleet = &self.fleet;
        tokio::task::block_in_place(|| {
            for i in 0..fleet.nodes.len() {
                fleet.kill(i)?;
            }
            std::thread::scope(|scope| {
                // Another test process on this machine may probe a port
                // while it is down (a bind "in use" on start): try again.
                let started: Vec<_> = (0..fleet.nodes.len())
                    .map(|i| {
                        scope.spawn(move || {
                            let mut r = fleet.restart(i);
                            for _ in 0..2 {
                                if r.is_ok() {
                                    break;
                                }
                                std::thread::sleep(Duration::from_millis(200));
                                r = fleet.restart(i);
                            }
                            r
                        })
                    })
                    .collect();
                started
                    .into_iter()
                    .try_for_each(|h| h.join().expect("restart thread panicked"))
            })?;
            fleet.leader().map(|_| ())
        })
        .map_err(|e| distlock::Error::backend("etcd", "restarting the fleet", e))
    }
}

/// etcd declares every capability the suite selects cases by (fencing,
/// reentrant through the guard, fair, lost signal, renewal), so no case may
/// be skipped: each must run and pass, on one node and on three.
mod single_node {
    use super::*;
    // A 2 s session lease, as for three: with 1 s a keepalive (a wait on
    // fsynced writes) ~400 ms late made the session look unusable.
    distlock::conformance_tests!(one_server: Etcd::start(1, 2), skipped: []);
}

mod three_node_cluster {
    use super::*;
    distlock::conformance_tests!(one_server: Etcd::start(3, 2), skipped: []);
}

/// A holder whose session lease is revoked loses the lock: the waiter gets
/// it within TTL + 1 s and the old holder's `lost()` fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_lease_hands_the_lock_to_the_next_waiter() {
    let s = Etcd::start(1, 2);
    let (a, b) = (s.lock().await, s.lock().await);
    let g = a
        .acquire("revoked", AcquireOptions::try_lock())
        .await
        .unwrap();
    let lost = g.lost();
    let waiter = tokio::spawn(async move {
        let g = b
            .acquire("revoked", AcquireOptions::wait(Duration::from_secs(10)))
            .await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    s.admin()
        .await
        .lease_revoke(a.session_lease().await)
        .await
        .unwrap();
    let (g2, at) = waiter.await.unwrap();
    let g2 = g2.unwrap();
    let ttl = Duration::from_secs(s.cfg.session_ttl_s);
    assert!(at - t0 < ttl + Duration::from_secs(2), "took {:?}", at - t0);
    assert!(g2.token() > g.token(), "fencing token did not increase");
    tokio::time::timeout(ttl, lost)
        .await
        .expect("lost() did not fire on the revoked holder");
    assert!(!g.release().await.unwrap(), "a revoked lock is not ours");
    assert!(g2.release().await.unwrap());
    // The holder's next acquisition runs on a fresh session.
    a.acquire("revoked", AcquireOptions::try_lock())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A holder that stops renewing (a stalled process) loses the lock when
/// its lease runs out: `lost()` fires within the TTL, before the waiter
/// gets the lock, and that is within TTL + 2 s (etcd looks for expired
/// leases every 500 ms, then revokes with a fsynced write; the slack is a
/// stalled CI machine's, not the lock's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_hands_the_lock_to_the_next_waiter() {
    let s = Etcd::start(1, 1);
    let (a, b) = (s.lock().await, s.lock().await);
    let g = a
        .acquire("expired", AcquireOptions::try_lock())
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .acquire("expired", AcquireOptions::wait(Duration::from_secs(10)))
            .await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    a.stop_keepalive(true).await;
    let ttl = Duration::from_secs(s.cfg.session_ttl_s);
    tokio::time::timeout(ttl + Duration::from_millis(500), g.lost())
        .await
        .expect("lost() did not fire within the TTL");
    let lost_at = t0.elapsed();
    let (g2, at) = waiter.await.unwrap();
    let g2 = g2.unwrap();
    assert!(at - t0 < ttl + Duration::from_secs(2), "took {:?}", at - t0);
    // The client stopped vouching before the server let the lock go.
    assert!(
        lost_at <= at - t0,
        "lost() at {lost_at:?}, after the next holder at {:?}",
        at - t0
    );
    assert!(g.valid_until() <= at, "valid_until past the handover");
    assert!(g2.release().await.unwrap());
}

/// Kill the leader of a 3-node cluster while 3 clients contend: locking
/// goes on through the other members within a few seconds, never with two
/// holders inside at once, tokens still increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_locking_without_double_holders() {
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    let s = Etcd::start(3, 3);
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let c = s.lock().await;
        let (inside, peak, ok, failed, stop, tokens) = (
            inside.clone(),
            peak.clone(),
            ok.clone(),
            failed.clone(),
            stop.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match c
                    .acquire("leader-kill", AcquireOptions::wait(Duration::from_secs(5)))
                    .await
                {
                    Ok(g) => {
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(n, Ordering::SeqCst);
                        tokens.lock().unwrap().push(g.token().unwrap());
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        // Still ours at the end of the section, or we say so.
                        let intact = !g.is_lost();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let released = g.release().await;
                        assert!(
                            !intact || released.is_err() || released.unwrap(),
                            "a lock we never saw lost was gone at release"
                        );
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = ok.load(Ordering::SeqCst);
    assert!(before > 10, "only {before} acquisitions before the fault");
    let leader = tokio::task::block_in_place(|| s.fleet.leader()).unwrap();
    tokio::task::block_in_place(|| s.fleet.kill(leader)).unwrap();
    let killed = Instant::now();
    // Locking resumes through the surviving members.
    let resumed = loop {
        if ok.load(Ordering::SeqCst) >= before + 10 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "locking did not resume within 10 s of the leader's death"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let new_leader = tokio::task::block_in_place(|| s.fleet.leader()).unwrap();
    assert_ne!(new_leader, leader);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 1, "two holders inside at once");
    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not increasing across holders: {tokens:?}"
    );
    println!(
        "leader kill: resumed 10 acquisitions in {resumed:?}; {} ok, {} failed",
        ok.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst)
    );
    assert!(
        resumed < Duration::from_secs(5),
        "resumed after {resumed:?}"
    );
}

/// One transaction per uncontended acquire, and the queue key's name is
/// reused: etcd keeps deleted keys in its index until compaction, and a
/// fresh name per cycle would slow every queue read down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_is_one_round_trip() {
    let s = Etcd::start(1, 2);
    let lock = s.lock().await;
    let (start, end) = lock.queue_range("one-rt");
    let mut names = Vec::new();
    for _ in 0..3 {
        let g = lock
            .acquire("one-rt", AcquireOptions::wait(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(g.round_trips(), 1);
        let r = s
            .admin()
            .await
            .get(
                start.as_str(),
                Some(etcd_client::GetOptions::new().with_range(end.as_str())),
            )
            .await
            .unwrap();
        assert_eq!(r.kvs().len(), 1);
        assert_eq!(
            r.kvs()[0].create_revision().unsigned_abs(),
            g.token().unwrap().0
        );
        names.push(r.kvs()[0].key().to_vec());
        assert!(g.release().await.unwrap());
    }
    names.dedup();
    assert_eq!(names.len(), 1, "a new key name per cycle");
    lock.floor_round_trip().await.unwrap();
    let peer = lockbench_etcd::LockRpc::connect(&s.cfg, "peer")
        .await
        .unwrap();
    peer.cycle().await.unwrap();
}

/// Waiters watch the key ahead of them instead of polling: a waiter
/// blocked for 600 ms costs a handful of round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_does_not_hot_spin() {
    // A 10 s session: the waiter's own re-check is then seconds away, and
    // only the watch can end the wait within the bound below.
    let s = Etcd::start(1, 10);
    let (a, b) = (s.lock().await, s.lock().await);
    let g = a.acquire("hot", AcquireOptions::try_lock()).await.unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("hot", AcquireOptions::wait(Duration::from_secs(5)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let t0 = Instant::now();
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "handover took {:?}: watch wake-up missing",
        t0.elapsed()
    );
    assert!(
        g2.round_trips() <= 5,
        "a 600 ms wait cost {} round trips",
        g2.round_trips()
    );
}

/// Keys with `/` stay apart: lock `a` and lock `a/b` are independent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_looking_keys_are_independent() {
    let s = Etcd::start(1, 2);
    let (a, b) = (s.lock().await, s.lock().await);
    let g = a.acquire("a/b", AcquireOptions::try_lock()).await.unwrap();
    let g2 = b.acquire("a", AcquireOptions::try_lock()).await.unwrap();
    g.release().await.unwrap();
    g2.release().await.unwrap();
}

#[tokio::test]
async fn bad_config_names_the_key() {
    let e = EtcdLock::connect(EtcdConfig::new(["redis://x"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("etcd.endpoints"), "{e}");
    let mut cfg = EtcdConfig::new(["http://127.0.0.1:1"]);
    cfg.session_ttl_s = 0;
    let e = EtcdLock::connect(cfg).await.unwrap_err();
    assert!(e.to_string().contains("etcd.session_ttl_s"), "{e}");
    let e = toml_like_unknown_key();
    assert!(e.contains("ttl"), "{e}");
}

fn toml_like_unknown_key() -> String {
    // deny_unknown_fields: a misspelt key is an error naming it.
    serde_json::from_str::<EtcdConfig>(r#"{"endpoints": [], "ttl": 3}"#)
        .unwrap_err()
        .to_string()
}

#[test]
fn debug_hides_a_password_in_an_endpoint() {
    let cfg = EtcdConfig::new(["http://user:s3cret@127.0.0.2:7000"]);
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// Many tasks of ONE owner on one key: in-flight acquisitions get distinct
/// queue keys, and when all are done the queue is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_many_tasks_leaves_a_clean_queue() {
    let s = Etcd::start(1, 2);
    let a = Arc::new(s.lock().await);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let g = a
                    .acquire("shared", AcquireOptions::wait(Duration::from_secs(10)))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let left = s.queued(&a, "shared").await;
    assert_eq!(left, 0, "queue keys left behind");
    let b = s.lock().await;
    b.acquire("shared", AcquireOptions::try_lock())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Two handles, four tasks each, on one key; a quarter of the acquires
/// are dropped a few milliseconds in, while they wait. The waiters of a
/// handle share its queue watch, which wakes each only when its last key
/// ahead is gone (issue #19): a lost wake-up would leave a waiter to its
/// periodic re-read, a wrong count would let two in. Every task ends, no
/// two ever hold at once, the waits cost no requests beyond the enqueues
/// (and a watch's opening), and the queue is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handles_with_cancelled_waiters_neither_hang_nor_overlap() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let s = Etcd::start(1, 2);
    let inside = Arc::new(AtomicU32::new(0));
    let held = Arc::new(AtomicU32::new(0));
    let (waited, trips) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let handles = [Arc::new(s.lock().await), Arc::new(s.lock().await)];
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (h, inside, held) = (
            handles[(t % 2) as usize].clone(),
            inside.clone(),
            held.clone(),
        );
        let (waited, trips) = (waited.clone(), trips.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25u64 {
                let opts = AcquireOptions::wait(Duration::from_secs(10));
                if (t + i) % 4 == 0 {
                    // Dropped while it waits (or, if it got in, released).
                    let cut = Duration::from_millis(1 + (t * 7 + i) % 4);
                    if let Ok(r) = tokio::time::timeout(cut, h.acquire("mixed", opts)).await {
                        r.unwrap().release().await.unwrap();
                    }
                    continue;
                }
                let g = h.acquire("mixed", opts).await.unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                if g.round_trips() > 1 {
                    // More than the enqueue: it waited (and maybe opened
                    // the watch, or re-read the queue).
                    waited.fetch_add(1, Ordering::SeqCst);
                    trips.fetch_add(g.round_trips() - 1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_micros(300)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                held.fetch_add(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(90), all)
        .await
        .expect("a task hung: a waiter was never woken");
    assert!(held.load(Ordering::SeqCst) >= 150, "the waits went through");
    let (waited, trips) = (waited.load(Ordering::SeqCst), trips.load(Ordering::SeqCst));
    // Woken by the watch, a waiter costs no request beyond its enqueue
    // (a handle's first waiter opens the watch: one more). Measured 7-9
    // extra in 150 acquires; a waiter the watch failed to wake re-reads
    // the queue at every re-check instead.
    assert!(
        trips <= 30,
        "{trips} requests beyond the enqueues, in {waited} acquires: waiters were not woken by the watch"
    );
    // Dropped acquires withdraw in the background.
    let t0 = Instant::now();
    loop {
        let left = s.queued(&handles[0], "mixed").await;
        if left == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{left} queue keys left behind"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Acquires dropped while they wait (and before their put's reply) leave
/// no key in the queue, seen on the server: etcd's Mutex deletes its key
/// when its context is cancelled, and so do we, in the background. Then a
/// second acquire through the holder's own handle waits like any other
/// owner (it is one) and gets the key once the first is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_queue_key() {
    let s = Etcd::start(1, 2);
    let (a, b) = (Arc::new(s.lock().await), s.lock().await);
    let g = a
        .acquire("cancel", AcquireOptions::try_lock())
        .await
        .unwrap();
    for ms in [0u64, 1, 5, 50, 200] {
        let r = tokio::time::timeout(
            Duration::from_millis(ms),
            b.acquire("cancel", AcquireOptions::wait(Duration::from_secs(30))),
        )
        .await;
        assert!(r.is_err(), "a waiter got a held key");
        let r = tokio::time::timeout(
            Duration::from_millis(ms),
            b.acquire(
                "cancel",
                AcquireOptions::wait(Duration::from_secs(30)).with_lease(Duration::from_secs(5)),
            ),
        )
        .await;
        assert!(r.is_err(), "a waiter got a held key");
    }
    let t0 = Instant::now();
    while s.queued(&a, "cancel").await > 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "cancelled waiters' keys still queued after {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The same handle, another owner: it queues behind the holder.
    let a2 = a.clone();
    let second = tokio::spawn(async move {
        a2.acquire("cancel", AcquireOptions::wait(Duration::from_secs(5)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "the same handle was let in twice");
    assert_eq!(s.queued(&a, "cancel").await, 2, "one key per owner");
    let first_token = g.token();
    assert!(g.release().await.unwrap());
    let g2 = second.await.unwrap().unwrap();
    assert!(g2.token() > first_token);
    assert!(g2.release().await.unwrap());
    assert_eq!(s.queued(&a, "cancel").await, 0);
}

/// A fixed lease taken after a wait runs from a keepalive sent after the
/// wait, and the waiter's round trips say so (one more than the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lease_after_a_long_wait_is_whole() {
    let s = Etcd::start(1, 2);
    let (a, b) = (s.lock().await, s.lock().await);
    let lease = Duration::from_millis(1_500);
    let g = a
        .acquire("fixed-wait", AcquireOptions::try_lock())
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire(
            "fixed-wait",
            AcquireOptions::wait(Duration::from_secs(10)).with_lease(lease),
        )
        .await
    });
    // Longer than the TTL the server was asked for (2 s): only the renewals
    // while waiting keep the waiter's key alive.
    tokio::time::sleep(Duration::from_millis(2_700)).await;
    // The lease must run from after the wait: from a keepalive sent no
    // earlier than this release began (one from inside the wait, the bug,
    // is before it). Not from the waiter's return, which a loaded machine
    // delays by any amount.
    let released_at = Instant::now();
    assert!(g.release().await.unwrap());
    let got = waiter.await.unwrap().unwrap();
    assert!(
        got.valid_until() >= released_at + lease - distlock::drift(lease),
        "a {lease:?} lease ran from {:?} before the release",
        (released_at + lease).saturating_duration_since(got.valid_until())
    );
    assert!(got.release().await.unwrap());
}
