//! The PostgreSQL locks across a crash of their server (kill -9, restart
//! with the same data), in both durability profiles, and after an
//! operator's clean-up of the lease tables: fencing tokens never repeat,
//! and a release right after the restart frees the key.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock};
use fleet::{Durability, PostgresFleet};
use lockbench_postgres::{PgAdvisoryLock, PgConfig, PgOptimisticLock, PgRowLock};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Advisory,
    Row,
    Optimistic,
}

const KINDS: [Kind; 3] = [Kind::Advisory, Kind::Row, Kind::Optimistic];

async fn connect(kind: Kind, f: &PostgresFleet) -> distlock::Result<Arc<dyn DistLock>> {
    let mut cfg = PgConfig::new(f.url());
    cfg.watchdog_lease_ms = 2000;
    cfg.ping_interval_ms = 100;
    Ok(match kind {
        Kind::Advisory => Arc::new(PgAdvisoryLock::connect(cfg).await?),
        Kind::Row => Arc::new(PgRowLock::connect(cfg).await?),
        Kind::Optimistic => Arc::new(PgOptimisticLock::connect(cfg).await?),
    })
}

fn wait(ms: u64) -> AcquireOptions {
    AcquireOptions::wait(Duration::from_millis(ms))
}

/// kill -9 of the server, a start on its data, and back once it serves SQL.
async fn crash(f: &PostgresFleet) {
    tokio::task::block_in_place(|| f.node.restart()).unwrap();
    let t0 = Instant::now();
    while tokio::task::block_in_place(|| f.psql("SELECT 1")).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "postgres not back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` cycles on `key`, the last right before the return; the highest token.
async fn cycles(lock: &dyn DistLock, key: &str, n: usize) -> u64 {
    let mut max = 0;
    for _ in 0..n {
        let g = lock.acquire(key, wait(2000)).await.unwrap();
        max = max.max(g.token().unwrap().0);
        assert!(g.release().await.unwrap());
    }
    max
}

/// A crash that loses the last commits (the volatile profile's
/// `synchronous_commit = off`: up to the WAL writer's last flush) must not
/// hand out a token again: a paused holder from before the crash would pass
/// the fence. Every kind re-issued tokens (pg-advisory restarted its
/// sequence at 1 on a fresh server, pg-row went 45 -> 33) before the
/// sequence was flushed with its token and the row tokens took the
/// database clock as a floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_crash_that_lost_commits() {
    for profile in [Durability::Volatile, Durability::Durable] {
        let f = PostgresFleet::start_with(profile).unwrap();
        for kind in KINDS {
            let key = format!("crash-{kind:?}");
            for n in [1, 40] {
                let lock = connect(kind, &f).await.unwrap();
                let before = cycles(&*lock, &key, n).await;
                drop(lock);
                crash(&f).await;
                let lock = connect(kind, &f).await.unwrap();
                let after = lock.acquire(&key, wait(5000)).await.unwrap();
                let t = after.token().unwrap().0;
                assert!(
                    t > before,
                    "{kind:?}, {profile}, {n} cycles before the crash: token {t} after it, {before} before"
                );
                after.release().await.unwrap();
            }
        }
    }
}

/// A release right after a restart meets the pooled connections kept from
/// before it, dead: it must go through on a live one, not fail and leave
/// the key held for the rest of its lease (the next client waited 1.8 s of
/// a 2 s lease; 30 s at the default lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_a_restart_frees_the_key() {
    let f = PostgresFleet::start().unwrap();
    for kind in [Kind::Row, Kind::Optimistic] {
        let key = format!("release-after-{kind:?}");
        let a = connect(kind, &f).await.unwrap();
        // Fill the pool with connections that the crash will kill.
        let _ = cycles(&*a, &format!("{key}-warm"), 4).await;
        let g = a
            .acquire(&key, wait(2000).with_lease(Duration::from_secs(20)))
            .await
            .unwrap();
        crash(&f).await;
        let released = g.release().await;
        assert!(
            matches!(released, Ok(true)),
            "{kind:?}: release after the restart: {released:?}"
        );
        let b = connect(kind, &f).await.unwrap();
        let t0 = Instant::now();
        let g = b.acquire(&key, AcquireOptions::try_lock()).await;
        assert!(
            g.is_ok(),
            "{kind:?}: the key stayed held after its release: {g:?}"
        );
        g.unwrap().release().await.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}

/// The lease tables are the operator's too: a row deleted, or the table
/// truncated, by hand (a clean-up of "stale" locks) must not start a key's
/// tokens again at 1 under a holder still fenced by the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_the_lease_rows_are_deleted_by_hand() {
    let f = PostgresFleet::start().unwrap();
    for (kind, table) in [
        (Kind::Row, "lockbench_lease"),
        (Kind::Optimistic, "lockbench_optimistic"),
    ] {
        let lock = connect(kind, &f).await.unwrap();
        for sql in [
            format!("DELETE FROM {table} WHERE key = 'by-hand'"),
            format!("TRUNCATE {table}"),
        ] {
            let before = cycles(&*lock, "by-hand", 5).await;
            tokio::task::block_in_place(|| f.psql(&sql)).unwrap();
            let after = cycles(&*lock, "by-hand", 1).await;
            assert!(
                after > before,
                "{kind:?} after {sql:?}: token {after}, {before} before"
            );
        }
    }
}
