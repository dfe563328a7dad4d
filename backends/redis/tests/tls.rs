//! `rediss://` against a real Redis serving TLS with a certificate from a
//! CA made for the test: the lock works through it when given the CA, and
//! is refused (naming the endpoint, within seconds) when it would have to
//! trust the server blindly.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock};
use lockbench_redis::{RedisConfig, RedisLock};

#[tokio::test]
async fn the_lock_works_over_tls_and_verifies_the_server() {
    let (fleet, url, certs) = tokio::task::spawn_blocking(fleet::RedisFleet::single_tls)
        .await
        .unwrap()
        .unwrap();
    let mut cfg = RedisConfig::new(url.clone());
    cfg.tls_ca_file = certs.ca.display().to_string();
    let a = RedisLock::connect(cfg.clone()).await.unwrap();
    let b = RedisLock::connect(cfg.clone()).await.unwrap();
    let g = a.acquire("k", AcquireOptions::default()).await.unwrap();
    assert!(
        b.acquire("k", AcquireOptions::default()).await.is_err(),
        "a second holder over TLS"
    );
    assert!(g.token().is_some());
    assert!(g.release().await.unwrap(), "the lock was still ours");
    let g = b.acquire("k", AcquireOptions::default()).await.unwrap();
    assert!(g.release().await.unwrap());

    // Without our CA the server's certificate is not trusted.
    let t0 = Instant::now();
    let e = RedisLock::connect(RedisConfig::new(url.clone()))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    println!("untrusted: {e}");
    assert!(
        e.contains(&url["rediss://".len()..]),
        "names the endpoint: {e}"
    );

    // A CA file that is not there is named by its key, not its path.
    let mut bad = cfg.clone();
    bad.tls_ca_file = "/nonexistent/lockbench-ca.pem".into();
    let e = RedisLock::connect(bad).await.err().unwrap().to_string();
    assert!(
        e.contains("redis.tls_ca_file") && !e.contains("/nonexistent"),
        "{e}"
    );

    // A CA with a plain redis:// URL is a config error, not silently ignored.
    let mut plain = cfg;
    plain.url = fleet.nodes[0].url();
    let e = RedisLock::connect(plain).await.err().unwrap().to_string();
    assert!(e.contains("redis.tls_ca_file"), "{e}");
}
