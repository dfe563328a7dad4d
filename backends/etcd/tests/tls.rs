//! `https://` endpoints against a real etcd serving its clients over TLS
//! with a certificate from a CA made for the test: the lock works through
//! it when given the CA, and is refused within seconds otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock};
use lockbench_etcd::{EtcdConfig, EtcdLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_works_over_tls_and_verifies_the_server() {
    let (_fleet, url, certs) = tokio::task::spawn_blocking(fleet::EtcdFleet::single_tls)
        .await
        .unwrap()
        .unwrap();
    let mut cfg = EtcdConfig::new([url.clone()]);
    cfg.ca_file = certs.ca.display().to_string();
    let a = EtcdLock::connect(cfg.clone()).await.unwrap();
    let b = EtcdLock::connect(cfg.clone()).await.unwrap();
    let g = a.acquire("k", AcquireOptions::default()).await.unwrap();
    assert!(
        b.acquire("k", AcquireOptions::default()).await.is_err(),
        "a second holder over TLS"
    );
    assert!(g.token().is_some());
    assert!(g.release().await.unwrap(), "the lock was still ours");
    let g = b.acquire("k", AcquireOptions::default()).await.unwrap();
    assert!(g.release().await.unwrap());

    // Without our CA the member's certificate is not trusted.
    let mut untrusted = cfg.clone();
    untrusted.ca_file.clear();
    untrusted.connect_timeout_ms = 2_000;
    let t0 = Instant::now();
    let r = EtcdLock::connect(untrusted).await;
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let e = match r {
        Ok(_) => panic!("an untrusted certificate must be refused"),
        Err(e) => e.to_string(),
    };
    println!("untrusted: {e}");
    assert!(!e.is_empty());

    let mut bad = cfg;
    bad.ca_file = "/nonexistent/lockbench-ca.pem".into();
    let e = EtcdLock::connect(bad).await.err().unwrap().to_string();
    assert!(
        e.contains("etcd.ca_file") && !e.contains("/nonexistent"),
        "{e}"
    );
}
