//! PostgreSQL stalled (SIGSTOP of the postmaster and every session) under a
//! holder and a waiter: nothing of the waiter's is left holding the key
//! once the server wakes. pg-row kept the key for a whole lease.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use distlock::DistLock;
use fleet::PostgresFleet;
use lockbench_postgres::{PgAdvisoryLock, PgConfig, PgOptimisticLock, PgRowLock};

/// A lock of `kind` (`row`, `optimistic`, else advisory).
async fn lock(kind: &str, cfg: PgConfig) -> distlock::Result<Arc<dyn DistLock>> {
    Ok(match kind {
        "row" => Arc::new(PgRowLock::connect(cfg).await?),
        "optimistic" => Arc::new(PgOptimisticLock::connect(cfg).await?),
        _ => Arc::new(PgAdvisoryLock::connect(cfg).await?),
    })
}

async fn stall(kind: &str) {
    let f = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(f.url());
    cfg.watchdog_lease_ms = 3_000;
    cfg.op_timeout_ms = 1_000;
    let connect = || lock(kind, cfg.clone());
    distlock::testing::a_stall_leaves_no_stuck_key(connect, Duration::from_secs(3), |p| {
        f.node.set_paused(p).unwrap()
    })
    .await;
}

/// A release while the server is down fails, and is retried until it is
/// back: the lease row stayed held for the rest of its 10 s lease (a
/// pg-row ledger run under node-kill waited 28 s for the next holder).
async fn release_into_an_outage(kind: &str) {
    let f = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(f.url());
    cfg.watchdog_lease_ms = 10_000;
    cfg.op_timeout_ms = 1_000;
    let connect = || lock(kind, cfg.clone());
    distlock::testing::a_release_into_an_outage_is_retried(
        connect,
        Duration::from_secs(10),
        |down| {
            if down {
                f.node.kill().unwrap()
            } else {
                f.node.restart().unwrap()
            }
        },
    )
    .await;
}

/// Waiters through a 3 s stall, then through a 3 s restart: pg-row and
/// pg-optimistic waiters gave up 2.0-2.4 s in ("no reply within 2s",
/// "pool timed out") with 20 s to go.
async fn waiters_through_outages(kind: &str) {
    let f = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(f.url());
    cfg.watchdog_lease_ms = 3_000;
    cfg.op_timeout_ms = 1_000;
    let connect = || lock(kind, cfg.clone());
    distlock::testing::waiters_wait_through_an_outage(connect, |p| f.node.set_paused(p).unwrap())
        .await;
    distlock::testing::waiters_wait_through_an_outage(connect, |down| {
        if down {
            f.node.kill().unwrap()
        } else {
            f.node.restart().unwrap()
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_row_waiters_wait_through_outages() {
    waiters_through_outages("row").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_optimistic_waiters_wait_through_outages() {
    waiters_through_outages("optimistic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_waiters_wait_through_outages() {
    waiters_through_outages("advisory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_row_release_into_an_outage_is_retried() {
    release_into_an_outage("row").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_optimistic_release_into_an_outage_is_retried() {
    release_into_an_outage("optimistic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_row_stall_leaves_no_stuck_key() {
    stall("row").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_optimistic_stall_leaves_no_stuck_key() {
    stall("optimistic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_stall_leaves_no_stuck_key() {
    stall("advisory").await;
}

/// pg-advisory's acquire(wait 1 s) into a stalled server came back after
/// 4 s: its idle session timed out, and it tried again on a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_acquire_into_a_stall_keeps_to_its_budget() {
    use distlock::AcquireOptions;
    let f = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(f.url());
    cfg.op_timeout_ms = 1_000;
    let lock = PgAdvisoryLock::connect(cfg).await.unwrap();
    // An idle session to start from, as after any earlier lock.
    lock.acquire("warm", AcquireOptions::try_lock())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    f.node.pause().unwrap();
    let t0 = std::time::Instant::now();
    let r = lock
        .acquire("k", AcquireOptions::wait(Duration::from_secs(1)))
        .await;
    let took = t0.elapsed();
    f.node.resume().unwrap();
    assert!(r.is_err(), "acquired from a paused server");
    assert!(
        took < Duration::from_millis(2_500),
        "acquire(wait 1 s) took {took:?}"
    );
}

/// A pg-advisory holder through a 3 s server stall: the server keeps the
/// session, and the lock, for `dead_host_timeout` after the last statement,
/// so a ping with no answer is no loss. `lost()` fired `SessionEnded` at
/// the first slow ping, while the lock stayed held (its release said true).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_holder_is_not_lost_in_a_stall_shorter_than_its_validity() {
    use distlock::AcquireOptions;
    let f = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(f.url());
    cfg.op_timeout_ms = 500;
    cfg.ping_interval_ms = 200;
    cfg.dead_host_timeout_ms = 8_000;
    let lock = PgAdvisoryLock::connect(cfg).await.unwrap();
    let g = lock.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    f.node.pause().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!g.is_lost(), "told lost while its validity still held");
    assert!(g.valid_until() > tokio::time::Instant::now());
    f.node.resume().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!g.is_lost(), "told lost after the stall");
    assert!(
        g.release().await.unwrap(),
        "the lock was not held after all"
    );
}

/// A pg-advisory waiter through a server restart: a refused connection
/// sent nothing, so within the wait budget it is a wait, not an answer (a
/// waiter gave up at once during a 0.5 s restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_waiter_waits_through_a_restart() {
    use distlock::AcquireOptions;
    let f = Arc::new(PostgresFleet::start().unwrap());
    let lock = PgAdvisoryLock::connect(PgConfig::new(f.url()))
        .await
        .unwrap();
    lock.acquire("warm", AcquireOptions::try_lock())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    f.node.kill().unwrap();
    let back = {
        let f = f.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            f.node.restart().unwrap();
        })
    };
    let g = lock
        .acquire("k", AcquireOptions::wait(Duration::from_secs(20)))
        .await
        .expect("the waiter gave up during the restart");
    back.join().unwrap();
    assert!(g.release().await.unwrap());
}

/// A pg-advisory holder through a stall longer than its validity is told
/// at `valid_until`, not up to a ping interval and a request deadline
/// later (a holder relying on `lost()` worked on without the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_holder_is_told_at_valid_until_in_a_long_stall() {
    use distlock::AcquireOptions;
    let f = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(f.url());
    cfg.op_timeout_ms = 1_500;
    cfg.ping_interval_ms = 1_000;
    cfg.dead_host_timeout_ms = 2_000;
    let lock = PgAdvisoryLock::connect(cfg).await.unwrap();
    let g = lock.acquire("k", AcquireOptions::try_lock()).await.unwrap();
    let lost = g.lost();
    f.node.pause().unwrap();
    let r = tokio::time::timeout(Duration::from_secs(6), lost).await;
    let at = tokio::time::Instant::now();
    f.node.resume().unwrap();
    assert!(r.is_ok(), "never told");
    let until = g.valid_until();
    assert!(
        at <= until + Duration::from_millis(400),
        "told {:?} after valid_until",
        at - until
    );
}
