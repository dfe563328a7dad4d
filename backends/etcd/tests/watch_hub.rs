//! The per-handle queue watch (`watch_hub`) against a real etcd: waiting
//! goes on when the watch dies under the waiters, and a queue longer than
//! one read of the keys ahead still hands the lock over in order.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{AcquireOptions, DistLock};
use tokio::time::Instant;

mod common;
use common::*;

/// The only member is killed and restarted while two handles wait on the
/// holder's key through their queue watches: the watches die with it, the
/// waiters fall back to reading the queue and open new watches, and each
/// gets the lock in turn once the keys ahead of it are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_after_their_queue_watch_dies() {
    let s = Etcd::start(1, 10);
    let a = s.lock().await;
    let g = a.acquire("dies", AcquireOptions::try_lock()).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let b = s.lock().await;
        waiters.push(tokio::spawn(async move {
            let g = b
                .acquire("dies", AcquireOptions::wait(Duration::from_secs(20)))
                .await
                .unwrap();
            let at = Instant::now();
            let token = g.token();
            assert!(g.release().await.unwrap());
            (at, token)
        }));
        // Queued in this order (room for a session's first writes, each
        // fsynced, on a loaded machine).
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::task::block_in_place(|| {
        s.fleet.kill(0)?;
        s.fleet.restart(0)
    })
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter got a held lock"
    );
    // The holder's release may need a retry while its client reconnects.
    let t0 = Instant::now();
    let mut released = g.release().await;
    while released.is_err() && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        released = a
            .acquire("dies", AcquireOptions::try_lock())
            .await
            .map(|_| true);
    }
    let mut got = Vec::new();
    for w in waiters {
        got.push(w.await.unwrap());
    }
    let took = got[1].0 - t0;
    println!("after the restart, both waiters served within {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(got[0].1 < got[1].1, "served out of queue order: {got:?}");
    assert_eq!(s.queued(&a, "dies").await, 0);
}

/// More contenders than one read of the keys ahead returns (64), all
/// through ONE handle (one watch, many subscribers): never two inside,
/// everybody served, nothing left in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_longer_than_one_read_keeps_mutual_exclusion() {
    let s = Etcd::start(1, 5);
    let shared = Arc::new(s.lock().await);
    let other = Arc::new(s.lock().await);
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    // Held while all queue up behind it, so the queue really is long.
    let first = shared
        .acquire("long", AcquireOptions::try_lock())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..80 {
        let lock = if i % 2 == 0 {
            shared.clone()
        } else {
            other.clone()
        };
        let (inside, peak, tokens) = (inside.clone(), peak.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let g = lock
                    .acquire("long", AcquireOptions::wait(Duration::from_secs(30)))
                    .await
                    .unwrap();
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                tokens.lock().unwrap().push(g.token().unwrap());
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap());
            }
        }));
    }
    let t0 = Instant::now();
    while s.queued(&shared, "long").await < 81 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the queue never filled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(first.release().await.unwrap());
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 1, "two holders inside at once");
    let tokens = std::mem::take(&mut *tokens.lock().unwrap());
    assert_eq!(tokens.len(), 240);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing in hold order"
    );
    assert_eq!(s.queued(&shared, "long").await, 0);
}
