//! `with_lock`'s exit paths, each on a real server: the value, the
//! section's error, a panic, a lost lock, a lock gone at release, and an
//! unreachable backend failing closed or degrading to a local lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock, Error, LostReason};
use lockbench_patterns::{
    degraded_sections, with_lock, LocalFirst, OnUnreachable, WithLockError, WithLockOptions,
};

fn wait() -> WithLockOptions {
    WithLockOptions::wait(Duration::from_secs(5))
}

/// Free again: a try-lock by another owner gets it at once.
async fn is_free(lock: &dyn DistLock, key: &str) -> bool {
    match lock.acquire(key, AcquireOptions::try_lock()).await {
        Ok(g) => g.release().await.unwrap(),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exit_path_releases_on_redis() {
    let (_servers, lock) = common::start("redis", serde_json::json!({})).await;
    let lock = lock.as_ref();

    // The value, with the guard's fencing token.
    let token = with_lock(lock, "ok", wait(), |ctx| async move {
        assert!(!ctx.degraded());
        Ok::<_, std::io::Error>(ctx.token())
    })
    .await
    .unwrap();
    assert!(token.is_some(), "redis hands out a fencing token");
    assert!(is_free(lock, "ok").await);

    // The section's own error, with the lock released.
    let r = with_lock(lock, "err", wait(), |_| async {
        Err::<(), _>(std::io::Error::other("no stock"))
    })
    .await;
    assert!(
        matches!(&r, Err(WithLockError::Body { error, .. }) if error.to_string() == "no stock"),
        "{r:?}"
    );
    assert!(is_free(lock, "err").await);

    // A panic: released, then the panic goes on to the caller.
    let shared: Arc<dyn DistLock> =
        common::connect("redis", &_servers, serde_json::json!({})).await;
    let l2 = shared.clone();
    let joined = tokio::spawn(async move {
        with_lock(l2.as_ref(), "panic", wait(), |_| async {
            if true {
                panic!("section panicked");
            }
            Ok::<(), std::io::Error>(())
        })
        .await
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    assert!(is_free(lock, "panic").await, "a panic left the lock held");

    // Held by another owner for the whole wait: the section never runs.
    let holder = lock
        .acquire("busy", AcquireOptions::try_lock())
        .await
        .unwrap();
    let ran = AtomicBool::new(false);
    let r = with_lock(
        lock,
        "busy",
        WithLockOptions::wait(Duration::from_millis(200)),
        |_| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        },
    )
    .await;
    assert!(
        matches!(
            r,
            Err(WithLockError::Acquire {
                source: Error::Timeout { .. },
                ..
            })
        ),
        "{r:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    holder.release().await.unwrap();
}

/// A section that outlives its fixed lease is cancelled at the loss:
/// its future is dropped, it never reaches the write after its sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_cancels_the_section() {
    let (_servers, lock) = common::start("redis", serde_json::json!({})).await;
    let wrote = Arc::new(AtomicBool::new(false));
    let w = wrote.clone();
    let opts = WithLockOptions {
        acquire: AcquireOptions::wait(Duration::from_secs(5))
            .with_lease(Duration::from_millis(300)),
        on_unreachable: OnUnreachable::FailClosed,
    };
    let t = Instant::now();
    let r = with_lock(lock.as_ref(), "lease", opts, |_| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        w.store(true, Ordering::SeqCst);
        Ok::<_, std::io::Error>(())
    })
    .await;
    assert!(
        matches!(
            r,
            Err(WithLockError::Lost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{r:?}"
    );
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "cancelled after {took:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!wrote.load(Ordering::SeqCst), "the cancelled section wrote");
    let text = r.unwrap_err().to_string();
    assert!(text.contains("cancelled"), "{text}");
}

/// The lock deleted behind the holder's back (an operator's FLUSHALL, a
/// failover to a replica that never had it) before the watchdog's next
/// renewal: the release finds it gone, and that is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_gone_at_release_is_an_error() {
    let (servers, lock) = common::start("redis", serde_json::json!({})).await;
    let url = servers.endpoint().unwrap();
    let r = with_lock(lock.as_ref(), "gone", wait(), |_| async move {
        let out = tokio::process::Command::new("redis-cli")
            .args(["-u", &url, "FLUSHALL"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        Ok::<_, std::io::Error>(7)
    })
    .await;
    assert!(matches!(r, Err(WithLockError::Gone { .. })), "{r:?}");
}

/// The server killed: fail closed names the backend error and runs
/// nothing; degrade-to-local runs the section flagged, without a token,
/// counted, and still one task at a time within the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_fails_closed_unless_told_to_degrade() {
    let (servers, lock) = common::start("redis", serde_json::json!({})).await;
    // Connected and working first, then the server dies.
    assert!(is_free(lock.as_ref(), "down").await);
    servers.nodes()[0].kill().unwrap();
    let t = Instant::now();
    let r = with_lock(lock.as_ref(), "down", wait(), |_| async {
        Ok::<_, std::io::Error>(())
    })
    .await;
    assert!(
        matches!(
            &r,
            Err(WithLockError::Acquire {
                source: Error::Backend { .. },
                ..
            })
        ),
        "{r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    println!("fail closed: {}", r.unwrap_err());

    let before = degraded_sections();
    let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (lock, inside) = (lock.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            with_lock(
                lock.as_ref(),
                "down",
                WithLockOptions::wait(Duration::from_secs(20)).degrade_to_local(),
                |ctx| async move {
                    assert!(ctx.degraded());
                    assert_eq!(ctx.token(), None);
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two inside");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(())
                },
            )
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(degraded_sections() - before, 4);
}

/// The same exits through `LocalFirst` on the consensus backends: the
/// value and the token on etcd and ZooKeeper, and the lock free after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_over_local_first_on_etcd_and_zookeeper() {
    for name in ["etcd", "zookeeper"] {
        let (_servers, lock) = common::start(name, serde_json::json!({})).await;
        let lf: Arc<dyn DistLock> = Arc::new(LocalFirst::new(lock.clone()));
        let token = with_lock(lf.as_ref(), "k", wait(), |ctx| async move {
            Ok::<_, std::io::Error>(ctx.token())
        })
        .await
        .unwrap();
        assert!(token.is_some(), "{name} hands out a token");
        let r = with_lock(lf.as_ref(), "k", wait(), |_| async {
            Err::<(), _>(std::io::Error::other("boom"))
        })
        .await;
        assert!(
            matches!(r, Err(WithLockError::Body { .. })),
            "{name}: {r:?}"
        );
        assert!(is_free(lock.as_ref(), "k").await, "{name}: still held");
    }
}
