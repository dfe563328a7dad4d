//! `sslmode=verify-full` against a real PostgreSQL with TLS on and a
//! certificate from a CA made for the test: the lock's sessions are
//! encrypted when the URL asks for it, and a server the CA did not sign is
//! refused.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use distlock::{AcquireOptions, DistLock};
use lockbench_postgres::{PgAdvisoryLock, PgConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_works_over_tls_and_verifies_the_server() {
    let pg = tokio::task::spawn_blocking(fleet::PostgresFleet::start)
        .await
        .unwrap()
        .unwrap();
    let certs = pg.enable_tls().unwrap();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url(),
        certs.ca.display()
    );
    let a = PgAdvisoryLock::connect(PgConfig::new(url.clone()))
        .await
        .unwrap();
    let b = PgAdvisoryLock::connect(PgConfig::new(url.clone()))
        .await
        .unwrap();
    let g = a.acquire("k", AcquireOptions::default()).await.unwrap();
    assert!(
        b.acquire("k", AcquireOptions::default()).await.is_err(),
        "a second holder over TLS"
    );
    // The holding session is encrypted (psql itself connects without TLS).
    let ssl = pg
        .psql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE s.ssl AND a.application_name IS DISTINCT FROM 'psql'",
        )
        .unwrap();
    assert!(ssl.parse::<u32>().unwrap() >= 1, "no TLS session: {ssl}");
    assert!(g.release().await.unwrap(), "the lock was still ours");

    // A CA that did not sign the server's certificate: refused.
    let other =
        fleet::make_certs(&pg.socket_dir().join("other"), "127.0.0.1".parse().unwrap()).unwrap();
    let wrong = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url(),
        other.ca.display()
    );
    let e = PgAdvisoryLock::connect(PgConfig::new(wrong))
        .await
        .err()
        .unwrap()
        .to_string();
    println!("wrong CA: {e}");
    assert!(
        !e.contains(&other.ca.display().to_string()),
        "the TLS path leaked: {e}"
    );
}
