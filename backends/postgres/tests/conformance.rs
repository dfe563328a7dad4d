//! The three PostgreSQL locks against a real PostgreSQL from the fleet.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::testing::{self, Outcome, Subject};
use distlock::{AcquireOptions, DistLock, Error, Result};
use fleet::PostgresFleet;
use lockbench_postgres::{PgAdvisoryLock, PgConfig, PgOptimisticLock, PgRowLock};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Advisory,
    Row,
    Optimistic,
}

struct Pg {
    kind: Kind,
    cfg: PgConfig,
    fleet: PostgresFleet,
}

fn pg(kind: Kind) -> Pg {
    let fleet = PostgresFleet::start().unwrap();
    let mut cfg = PgConfig::new(fleet.url());
    cfg.watchdog_lease_ms = 300;
    cfg.ping_interval_ms = 100;
    Pg { kind, cfg, fleet }
}

#[async_trait::async_trait]
impl Subject for Pg {
    async fn client(&self) -> Result<Arc<dyn DistLock>> {
        Ok(match self.kind {
            Kind::Advisory => Arc::new(PgAdvisoryLock::connect(self.cfg.clone()).await?),
            Kind::Row => Arc::new(PgRowLock::connect(self.cfg.clone()).await?),
            Kind::Optimistic => Arc::new(PgOptimisticLock::connect(self.cfg.clone()).await?),
        })
    }

    async fn sabotage(&self, key: &str) -> Result<()> {
        let sql = match self.kind {
            Kind::Row => {
                format!("UPDATE lockbench_lease SET owner = 'intruder' WHERE key = '{key}'")
            }
            Kind::Optimistic => {
                format!("UPDATE lockbench_optimistic SET owner = 'intruder', version = version + 1 WHERE key = '{key}'")
            }
            Kind::Advisory => return Ok(()),
        };
        self.fleet.psql(&sql).unwrap();
        Ok(())
    }

    fn watchdog_lease(&self) -> Duration {
        Duration::from_millis(self.cfg.watchdog_lease_ms)
    }
}

async fn all_cases(kind: Kind, expect_skipped: &[&str]) {
    let s = pg(kind);
    let skipped: Vec<&str> = testing::run_all(&s)
        .await
        .into_iter()
        .filter(|(_, o)| matches!(o, Outcome::NotApplicable(_)))
        .map(|(case, _)| case)
        .collect();
    // Selected out only where the declared capabilities say so.
    assert_eq!(skipped, expect_skipped, "{kind:?}");
}

/// Advisory locks have no lease: the lease cases are selected out; loss of
/// the session is tested below.
const NO_LEASE: &[&str] = &[
    "release_only_own",
    "fixed_lease_expires",
    "watchdog_keeps_lock",
    "lost_fires",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_conformance() {
    all_cases(Kind::Advisory, NO_LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_conformance() {
    all_cases(Kind::Row, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_conformance() {
    all_cases(Kind::Optimistic, &[]).await;
}

/// `pg_terminate_backend` on the holder's session: lost() fires, and the
/// next waiter (already queued in the server) gets the lock promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_session_killed_fires_lost_and_frees_the_lock() {
    let s = pg(Kind::Advisory);
    let a = PgAdvisoryLock::connect(s.cfg.clone()).await.unwrap();
    let b = PgAdvisoryLock::connect(s.cfg.clone()).await.unwrap();
    let g = a
        .acquire("victim", AcquireOptions::try_lock())
        .await
        .unwrap();
    let pid = a.holder_pid("victim").await.unwrap();
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let g = b
            .acquire("victim", AcquireOptions::wait(Duration::from_secs(5)))
            .await;
        (g.map(|g| g.token()), t0)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    assert_eq!(
        s.fleet
            .psql(&format!("SELECT pg_terminate_backend({pid})"))
            .unwrap(),
        "t"
    );
    let lost = tokio::time::timeout(Duration::from_secs(2), g.lost()).await;
    assert!(
        lost.is_ok(),
        "lost() did not fire after the session was killed"
    );
    let (token, _) = waiter.await.unwrap();
    assert!(
        token.unwrap() > g.token(),
        "the next holder's token must be higher"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "the waiter was not woken promptly"
    );
    assert!(
        g.release().await.is_err(),
        "releasing on a dead session cannot succeed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_refuses_a_fixed_lease_clearly() {
    let s = pg(Kind::Advisory);
    let a = PgAdvisoryLock::connect(s.cfg.clone()).await.unwrap();
    let e = a
        .acquire(
            "k",
            AcquireOptions::try_lock().with_lease(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

#[tokio::test]
async fn unreachable_server_fails_fast_naming_it() {
    let t0 = Instant::now();
    let e = PgRowLock::connect(PgConfig::new("postgres://postgres@127.0.0.1:1/postgres"))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    let e = PgRowLock::connect(PgConfig::new("mysql://x"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("postgres.url"), "{e}");
}

#[test]
fn advisory_ids_are_stable() {
    // FNV-1a 64: these values are a contract between processes and versions.
    assert_eq!(
        lockbench_postgres::advisory_id(""),
        0xcbf2_9ce4_8422_2325_u64 as i64
    );
    assert_eq!(
        lockbench_postgres::advisory_id("a"),
        0xaf63_dc4c_8601_ec8c_u64 as i64
    );
}

/// The unix socket is an option: `?host=<socket dir>` in the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_url_works() {
    let fleet = PostgresFleet::start().unwrap();
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?host={}",
        fleet.node.port(),
        fleet.socket_dir().display()
    );
    let lock = PgAdvisoryLock::connect(PgConfig::new(url)).await.unwrap();
    let g = lock
        .acquire("sock", AcquireOptions::try_lock())
        .await
        .unwrap();
    assert!(g.token().is_some());
    assert!(g.release().await.unwrap());
}
