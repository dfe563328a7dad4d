//! `TCP_NODELAY` on every connection the PostgreSQL locks open: sqlx 0.9
//! leaves Nagle's algorithm on and has no option for it, so the locks set
//! it on each new connection's socket (pool connections through
//! `after_connect`, the advisory lock's sessions as they are opened).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::net::SocketAddr;
use std::time::Duration;

use distlock::descriptor::{BuildParams, Connected, Descriptor};
use distlock::AcquireOptions;
use fleet::PostgresFleet;

/// The three PostgreSQL locks.
const LOCKS: [&dyn Descriptor; 3] = [
    &lockbench_postgres::PG_ADVISORY,
    &lockbench_postgres::PG_ROW,
    &lockbench_postgres::PG_OPTIMISTIC,
];

/// Connects `b` to `endpoint` with its probes, and runs one waiting cycle,
/// one floor and every peer, so each connection it has is in use.
async fn exercise(b: &dyn Descriptor, endpoint: &str) -> Connected {
    let mut settings = b.settings(None).unwrap();
    b.set_endpoint(&mut settings, endpoint).unwrap();
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: true,
        key: "nodelay".into(),
    };
    let c = b.connect(&settings, params).await.unwrap();
    let g = c
        .lock
        .acquire("nodelay", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    g.release().await.unwrap();
    if let Some(f) = &c.probes.floor {
        f.once().await.unwrap();
    }
    for (_, p) in &c.probes.peers {
        p.once().await.unwrap();
    }
    c
}

/// At least `at_least` sockets to `peers`, all with `TCP_NODELAY`, within
/// 2 s (a background connection may still be opening).
async fn assert_nodelay(peers: &[SocketAddr], at_least: usize) {
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        match lockbench_nodelay::check_sockets_to(peers, at_least) {
            Ok(_) => return,
            Err(e) if tokio::time::Instant::now() >= until => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_three_locks_and_their_floors() {
    let f = PostgresFleet::start().unwrap();
    let url = f.url();
    let mut held = Vec::new();
    for b in LOCKS {
        held.push(exercise(b, &url).await);
    }
    // At least one connection per lock.
    assert_nodelay(&lockbench_nodelay::endpoints(&url), 3).await;
    drop(held);
}

/// A server on the IPv6 loopback, named as URLs name it (`[::1]`): the
/// brackets belong to the URL, not the address, and sqlx 0.9 passes them
/// on to the resolver ("Name or service not known"). The server listens on
/// its own 127.0.0.N; a forwarder on `[::1]` stands in for one that
/// listens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_loopback_url_connects() {
    let listener = match tokio::net::TcpListener::bind("[::1]:0").await {
        Ok(l) => l,
        Err(e) => {
            // A container without IPv6 on its loopback: nothing to test.
            eprintln!("SKIPPED: no IPv6 loopback here ({e})");
            return;
        }
    };
    let f = PostgresFleet::start().unwrap();
    let target: SocketAddr = format!("{}:{}", f.node.addr(), f.node.port())
        .parse()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    fleet::forward(listener, target);
    let url = format!("postgres://postgres@[::1]:{port}/postgres");
    let mut held = Vec::new();
    for b in LOCKS {
        held.push(exercise(b, &url).await);
    }
    // Resolved without the brackets, so TCP_NODELAY was set as well.
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    assert_nodelay(&[v6], 3).await;
    drop(held);
}
