//! The ZooKeeper lock against real ZooKeeper servers from the fleet: the
//! shared conformance suite on a standalone server and on a 3-node
//! ensemble, and the faults only a session-bound lock has.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::testing::Subject;
use distlock::{AcquireOptions, DistLock, Error, Result};
use fleet::ZkFleet;
use lockbench_zookeeper::{ZkConfig, ZkLock};
use tokio::time::Instant;
use zookeeper_client as zk;

struct Zk {
    cfg: ZkConfig,
    fleet: ZkFleet,
}

fn cfg_for(fleet: &ZkFleet, session_ms: u64) -> ZkConfig {
    let mut cfg = ZkConfig::new(fleet.connect_string());
    cfg.session_timeout_ms = session_ms;
    cfg
}

impl Zk {
    fn standalone() -> Self {
        let fleet = ZkFleet::standalone().unwrap();
        Self {
            cfg: cfg_for(&fleet, 2_000),
            fleet,
        }
    }

    fn ensemble() -> Self {
        let fleet = ZkFleet::ensemble(3).unwrap();
        Self {
            cfg: cfg_for(&fleet, 4_000),
            fleet,
        }
    }
}

/// A plain client for looking behind the lock's back.
async fn admin(connect: &str) -> zk::Client {
    zk::Client::connect(connect).await.unwrap()
}

#[async_trait::async_trait]
impl Subject for Zk {
    async fn client(&self) -> Result<Arc<dyn DistLock>> {
        Ok(Arc::new(ZkLock::connect(self.cfg.clone()).await?))
    }

    async fn sabotage(&self, key: &str) -> Result<()> {
        let lock = ZkLock::connect(self.cfg.clone()).await?;
        let dir = lock.lock_dir(key);
        let c = admin(&self.fleet.connect_string()).await;
        for child in c.list_children(&dir).await.unwrap_or_default() {
            let _ = c.delete(&format!("{dir}/{child}"), None).await;
        }
        Ok(())
    }

    fn watchdog_lease(&self) -> Duration {
        Duration::from_millis(self.cfg.session_timeout_ms)
    }

    async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
        let connect = "127.0.0.1:1".to_string();
        let r = ZkLock::connect(ZkConfig::new(connect.clone())).await;
        (connect, r.map(|l| Arc::new(l) as Arc<dyn DistLock>))
    }

    /// Kills every server (-9), then starts them again on the same
    /// addresses with their data dirs (snapshot + transaction log, where
    /// the czxid tokens live), and waits until each serves.
    async fn restart_servers(&self) -> Result<()> {
        let fleet = &self.fleet;
        tokio::task::block_in_place(|| {
            let fail = |e: fleet::FleetError| Error::backend("zookeeper fleet", "restart", e);
            // All down first: a whole-ensemble restart, not a rolling one,
            // so nothing survives in a running peer's memory.
            for n in &fleet.nodes {
                n.kill().map_err(fail)?;
            }
            for n in &fleet.nodes {
                n.restart().map_err(fail)?;
            }
            for i in 0..fleet.nodes.len() {
                fleet
                    .wait_serving(i, Duration::from_secs(30))
                    .map_err(fail)?;
            }
            Ok(())
        })
    }
}

/// No leases: the lock lives with the session (`renewal: false`), so the
/// cases about a lease running out from under its holder are selected out
/// by that declared capability. Their ZooKeeper counterparts (session
/// loss, a stale release by the same handle, valid_until as a bound while
/// cut off) are the tests below.
macro_rules! zk_conformance {
    ($subject:expr) => {
        distlock::conformance_tests!(
            one_server: $subject,
            skipped: [
                release_only_own,
                fixed_lease_expires,
                watchdog_keeps_lock,
                lost_fires,
                stale_release_same_handle,
                fixed_lease_after_waiting,
                valid_until_is_a_bound,
            ],
        );
    };
}

mod standalone {
    use super::*;
    zk_conformance!(Zk::standalone());
}

mod ensemble {
    use super::*;
    zk_conformance!(Zk::ensemble());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lease_is_refused_clearly() {
    let s = Zk::standalone();
    let a = ZkLock::connect(s.cfg.clone()).await.unwrap();
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
async fn a_connect_string_without_port_names_the_key() {
    let e = ZkLock::connect(ZkConfig::new("no-port")).await.unwrap_err();
    assert!(e.to_string().contains("zookeeper.connect"), "{e}");
}

/// Not a test on its own: the holder process of
/// `holder_process_killed_frees_the_lock_within_session_timeout`, which
/// runs this test binary again with `LOCKBENCH_ZK_HOLDER` set.
#[tokio::test]
async fn holder_process() {
    let Ok(connect) = std::env::var("LOCKBENCH_ZK_HOLDER") else {
        return;
    };
    let mut cfg = ZkConfig::new(connect);
    cfg.session_timeout_ms = 2_000;
    let lock = ZkLock::connect(cfg).await.unwrap();
    let g = lock
        .acquire("victim", AcquireOptions::try_lock())
        .await
        .unwrap();
    println!("HELD {}", g.token().unwrap().0);
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// The holder's process is killed (-9: its TCP connection closes, its
/// session lives on in the server until it expires); the next waiter gets
/// the lock within the session timeout + 1 s, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_killed_frees_the_lock_within_session_timeout() {
    let s = Zk::standalone();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "holder_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LOCKBENCH_ZK_HOLDER", s.fleet.connect_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let held: u64 = out
        .lines()
        .map(|l| l.unwrap())
        // The harness may print "test holder_process ... " on the same line.
        .find_map(|l| {
            l.split_once("HELD ")
                .map(|(_, t)| t.trim().parse().unwrap())
        })
        .expect("the holder process never took the lock");
    let b = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let r = b.acquire("victim", AcquireOptions::try_lock()).await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    let waiter = tokio::spawn(async move {
        let g = b
            .acquire("victim", AcquireOptions::wait(Duration::from_secs(20)))
            .await
            .unwrap();
        (Instant::now(), g.token().unwrap().0)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    child.kill().unwrap();
    child.wait().unwrap();
    let (acquired, token) = waiter.await.unwrap();
    let took = acquired - killed;
    assert!(
        took < Duration::from_millis(2_000 + 1_000),
        "the next waiter got the lock {took:?} after the holder died"
    );
    assert!(token > held, "token {token} after {held}");
}

/// A raw session of the `zookeeper-client` crate next to the lock's own:
/// it shows when the crate itself declares the session expired (its
/// client-side 1.4 x the session timeout after it last heard from the
/// server), which is when lost() used to fire.
async fn reference_session(connect: &str, session: Duration) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(session)
        .connect(connect)
        .await
        .unwrap()
}

/// When `client`'s session ends, as the crate sees it.
fn session_end(client: &zk::Client) -> tokio::task::JoinHandle<Instant> {
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            if states.changed().await.is_terminated() {
                return Instant::now();
            }
        }
    })
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// The server stops answering (SIGSTOP) for longer than the session
/// timeout: lost() fires at valid_until (no later than the last contact +
/// the session timeout), not when the crate gives the session up (1.4 x);
/// the handle opens a new session afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_lost_fires_at_valid_until() {
    let s = Zk::standalone();
    let session = Duration::from_millis(s.cfg.session_timeout_ms);
    let a = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let reference = reference_session(&s.fleet.connect_string(), session).await;
    let g = a.acquire("exp", AcquireOptions::try_lock()).await.unwrap();
    tokio::time::sleep(session).await;
    assert!(!g.is_lost());
    assert!(g.valid_until() > Instant::now(), "vouched while connected");
    let crate_expiry = session_end(&reference);
    let paused = Instant::now();
    s.fleet.nodes[0].pause().unwrap();
    let lost = tokio::time::timeout(session * 5, g.lost()).await;
    let lost_at = Instant::now();
    let vouched = g.valid_until();
    // Keep the server stopped until the crate has given the session up
    // too (so the release below is deterministic), then let it go.
    let crate_expired = tokio::time::timeout(session * 5, crate_expiry).await;
    s.fleet.nodes[0].resume().unwrap();
    let reason = lost.expect("lost() did not fire while the server was stopped");
    let crate_expired = crate_expired
        .expect("the crate never declared the session expired")
        .unwrap();
    println!(
        "ZK-PAUSE session={}ms: paused->lost() {}ms ({reason}), paused->valid_until {}ms, \
         paused->crate declares expiry {}ms (lost() before: {}ms earlier)",
        ms(session),
        ms(lost_at - paused),
        ms(vouched.saturating_duration_since(paused)),
        ms(crate_expired - paused),
        ms(crate_expired.saturating_duration_since(lost_at)),
    );
    assert!(
        vouched <= paused + session,
        "valid_until {:?} past the last contact + session timeout",
        vouched - paused
    );
    assert!(vouched <= lost_at);
    assert!(
        lost_at <= paused + session + Duration::from_millis(250),
        "lost() fired {:?} after the server stopped, later than the session timeout",
        lost_at - paused
    );
    assert!(
        lost_at < crate_expired,
        "lost() waited for the crate's expiry"
    );
    assert!(!g.release().await.unwrap(), "an expired lock was not ours");
    // A new session, and the lock is free again.
    let g2 = a
        .acquire("exp", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(g2.release().await.unwrap());
}

/// A TCP proxy in front of one server that can black-hole either
/// direction, as a partition does: bytes are neither delivered nor
/// refused, the sockets stay open. Healing closes every connection that
/// saw the cut (the client reconnects, as after a real partition).
struct Proxy {
    addr: String,
    up: Arc<tokio::sync::watch::Sender<bool>>,
    down: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until either closes, or the direction is cut;
/// then holds everything until the cut heals, and returns (closing).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            biased;
            _ = async { cut.wait_for(|c| *c).await.is_ok() } => {
                let _ = cut.wait_for(|c| !*c).await;
                return;
            }
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => if to.write_all(&buf[..n]).await.is_err() { return },
            },
        }
    }
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let ip = fleet::loopback_addr();
        let port = fleet::PortAllocator::free_port(ip).unwrap();
        let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
        let (up, _) = tokio::sync::watch::channel(false);
        let (down, _) = tokio::sync::watch::channel(false);
        let (up, down) = (Arc::new(up), Arc::new(down));
        let (u, d) = (up.clone(), down.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let (ucut, dcut) = (u.subscribe(), d.subscribe());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = pump(cr, sw, ucut) => {}
                        _ = pump(sr, cw, dcut) => {}
                    }
                });
            }
        });
        Proxy {
            addr: format!("{ip}:{port}"),
            up,
            down,
            task,
        }
    }

    /// Nothing gets through either way.
    fn cut(&self) {
        self.up.send_replace(true);
        self.down.send_replace(true);
    }

    /// Requests reach the server; its replies are lost.
    fn cut_replies(&self) {
        self.down.send_replace(true);
    }

    fn heal(&self) {
        self.up.send_replace(false);
        self.down.send_replace(false);
    }
}

/// The measurement of the issue: a holder cut off from a server that keeps
/// running (a partition, not a stopped server), so the server really
/// expires the session and hands the lock to the next waiter. lost() must
/// fire before the server expires the session, valid_until must be no
/// later than the next holder's acquisition, and the figures are printed:
/// cut -> lost(), cut -> server-side expiry (the holder's node deleted,
/// seen by a watch), cut -> next holder, cut -> the crate's own expiry
/// (when lost() used to fire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_lost_fires_before_the_server_expires_it() {
    const RUNS: usize = 3;
    let s = Zk::standalone();
    let session = Duration::from_millis(s.cfg.session_timeout_ms);
    let proxy = Proxy::start(s.fleet.connect_string()).await;
    let mut via_proxy = s.cfg.clone();
    via_proxy.connect = proxy.addr.clone();
    let admin = admin(&s.fleet.connect_string()).await;
    let holder = ZkLock::connect(via_proxy.clone()).await.unwrap();
    let mut margins = Vec::new();
    for run in 0..RUNS {
        let key = format!("cut-{run}");
        let reference = reference_session(&proxy.addr, session).await;
        let g = holder
            .acquire(&key, AcquireOptions::try_lock())
            .await
            .unwrap();
        let dir = holder.lock_dir(&key);
        let kids = admin.list_children(&dir).await.unwrap();
        assert_eq!(kids.len(), 1);
        let node = format!("{dir}/{}", kids[0]);
        let (stat, watcher) = admin.check_and_watch_stat(&node).await.unwrap();
        assert!(stat.is_some());
        let deleted = tokio::spawn(async move {
            let ev = watcher.changed().await;
            (Instant::now(), ev.event_type)
        });
        let next = Arc::new(ZkLock::connect(s.cfg.clone()).await.unwrap());
        let (n, k) = (next.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let g = n
                .acquire(&k, AcquireOptions::wait(Duration::from_secs(30)))
                .await
                .unwrap();
            (Instant::now(), g)
        });
        // Contact goes on for a while: valid_until follows it.
        tokio::time::sleep(session).await;
        assert!(!g.is_lost());
        assert!(g.valid_until() > Instant::now());
        let crate_expiry = session_end(&reference);
        let cut = Instant::now();
        proxy.cut();
        let reason = tokio::time::timeout(session * 5, g.lost())
            .await
            .expect("lost() never fired while cut off");
        let lost_at = Instant::now();
        let vouched = g.valid_until();
        let (expired_at, event) = tokio::time::timeout(session * 5, deleted)
            .await
            .expect("the server never expired the cut-off session")
            .unwrap();
        assert_eq!(event, zk::EventType::NodeDeleted);
        let (acquired_at, g2) = tokio::time::timeout(session * 5, waiter)
            .await
            .expect("the next waiter never got the lock")
            .unwrap();
        let crate_expired = tokio::time::timeout(session * 5, crate_expiry)
            .await
            .expect("the crate never declared the session expired")
            .unwrap();
        proxy.heal();
        println!(
            "ZK-CUT run {run} session={}ms: cut->lost() {}ms ({reason}), cut->valid_until {}ms, \
             cut->server expiry {}ms, cut->next holder {}ms, cut->crate declares expiry {}ms; \
             lost() {}ms before the server expiry (old way: {}ms after it)",
            ms(session),
            ms(lost_at - cut),
            ms(vouched.saturating_duration_since(cut)),
            ms(expired_at - cut),
            ms(acquired_at - cut),
            ms(crate_expired - cut),
            ms(expired_at.saturating_duration_since(lost_at)),
            ms(crate_expired.saturating_duration_since(expired_at)),
        );
        // valid_until is the hard bound (below); lost() is a timer on it,
        // and a loaded machine may run that timer a little late.
        assert!(
            lost_at <= expired_at + Duration::from_millis(50),
            "lost() fired {:?} after the server expired the session",
            lost_at - expired_at
        );
        assert!(
            vouched <= acquired_at,
            "valid_until was {:?} after the next holder got the lock",
            vouched - acquired_at
        );
        assert!(vouched <= expired_at);
        assert!(g2.token() > g.token());
        margins.push(expired_at - lost_at);
        // The old holder's release finds its session gone: not ours.
        assert!(!g.release().await.unwrap(), "a lock taken over was ours");
        assert!(g2.release().await.unwrap());
    }
    println!(
        "ZK-CUT lost() before server expiry over {RUNS} runs: {:?} ms",
        margins.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
    // The handle recovers: a new session once the cut has healed.
    holder
        .acquire("cut-after", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Waits until `dir` holds exactly `n` children.
async fn children_become(c: &zk::Client, dir: &str, n: usize, within: Duration) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        let kids = c.list_children(dir).await.unwrap_or_default();
        if kids.len() == n {
            return kids;
        }
        assert!(
            t0.elapsed() < within,
            "{dir} still holds {kids:?} after {within:?}, expected {n} node(s)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A dropped acquire deletes its queued node (Curator's delete in
/// `finally`): cancelled at several points of its wait, and cancelled
/// after the server created its node but before the reply arrived (the
/// node is then found by the acquisition's GUID once the connection is
/// back). Looked at on the server, not only through the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquire_deletes_its_node() {
    let s = Zk::standalone();
    let proxy = Proxy::start(s.fleet.connect_string()).await;
    let mut via_proxy = s.cfg.clone();
    via_proxy.connect = proxy.addr.clone();
    let admin = admin(&s.fleet.connect_string()).await;
    let holder = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let h = ZkLock::connect(via_proxy).await.unwrap();
    let g = holder
        .acquire("cancel", AcquireOptions::try_lock())
        .await
        .unwrap();
    let dir = holder.lock_dir("cancel");
    let held = children_become(&admin, &dir, 1, Duration::from_secs(1)).await;
    for ms in [0u64, 1, 5, 50, 300] {
        let r = tokio::time::timeout(
            Duration::from_millis(ms),
            h.acquire("cancel", AcquireOptions::wait(Duration::from_secs(30))),
        )
        .await;
        assert!(r.is_err(), "a waiter got a held key");
        let left = children_become(&admin, &dir, 1, Duration::from_secs(2)).await;
        assert_eq!(left, held, "cancelled at {ms} ms");
    }
    // The create reaches the server, its reply does not.
    proxy.cut_replies();
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        h.acquire("cancel", AcquireOptions::wait(Duration::from_secs(30))),
    )
    .await;
    assert!(r.is_err());
    let queued = children_become(&admin, &dir, 2, Duration::from_secs(2)).await;
    println!("created while its reply was lost: {queued:?}");
    proxy.heal();
    let t0 = Instant::now();
    let left = children_become(&admin, &dir, 1, Duration::from_secs(5)).await;
    println!(
        "the orphan node was found by its GUID and deleted {}ms after the connection came back",
        ms(t0.elapsed())
    );
    assert_eq!(left, held);
    assert!(g.release().await.unwrap());
    h.acquire("cancel", AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Two tasks acquiring one key through ONE handle (one session) each
/// queue their own node, named with a GUID of their own; the second gets
/// the lock only after the first releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handle_two_acquires_two_nodes() {
    let s = Zk::standalone();
    let h = Arc::new(ZkLock::connect(s.cfg.clone()).await.unwrap());
    let admin = admin(&s.fleet.connect_string()).await;
    let g1 = h.acquire("two", AcquireOptions::try_lock()).await.unwrap();
    let h2 = h.clone();
    let second = tokio::spawn(async move {
        h2.acquire("two", AcquireOptions::wait(Duration::from_secs(10)))
            .await
            .unwrap()
    });
    let dir = h.lock_dir("two");
    let kids = children_become(&admin, &dir, 2, Duration::from_secs(2)).await;
    let guid = |c: &str| c.split_once("-lock-").unwrap().0.to_string();
    assert!(kids.iter().all(|c| c.starts_with("_c_")), "{kids:?}");
    assert_ne!(
        guid(&kids[0]),
        guid(&kids[1]),
        "one GUID for two acquisitions"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!second.is_finished(), "the second acquire got a held lock");
    let t1 = g1.token();
    assert!(g1.release().await.unwrap());
    let g2 = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap();
    assert!(g2.token() > t1);
    assert!(g2.release().await.unwrap());
}

/// The ZooKeeper form of a stale release by the same handle: an operator
/// deletes the holder's node (lost() fires), the same handle takes the key
/// again, and the first guard's release returns false and leaves the
/// second acquisition's node alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_release_by_the_same_handle_leaves_the_newer_lock() {
    let s = Zk::standalone();
    let h = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let other = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let g1 = h
        .acquire("stale", AcquireOptions::try_lock())
        .await
        .unwrap();
    s.sabotage("stale").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(s.cfg.session_timeout_ms), g1.lost())
        .await
        .expect("lost() did not fire after the node was deleted");
    assert_eq!(reason, distlock::LostReason::NotOwner);
    let g2 = h
        .acquire("stale", AcquireOptions::wait(Duration::from_secs(3)))
        .await
        .unwrap();
    assert!(
        !g1.release().await.unwrap(),
        "a stale release said it held the lock"
    );
    let r = other.acquire("stale", AcquireOptions::try_lock()).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "the stale release deleted the newer lock: {r:?}"
    );
    assert!(!g2.is_lost());
    assert!(g2.release().await.unwrap());
}

/// 20 waiters queue behind a holder; each release wakes exactly one of
/// them (the one whose predecessor went), and they get the lock in the
/// order they queued (tokens = creation order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_herd_each_release_wakes_exactly_one_waiter() {
    const WAITERS: usize = 20;
    let s = Zk::standalone();
    let holder = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let first = holder
        .acquire("herd", AcquireOptions::try_lock())
        .await
        .unwrap();
    let dir = holder.lock_dir("herd");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut locks = Vec::new();
    for _ in 0..WAITERS {
        let l = Arc::new(ZkLock::connect(s.cfg.clone()).await.unwrap());
        locks.push(l.clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            let g = l
                .acquire("herd", AcquireOptions::wait(Duration::from_secs(60)))
                .await
                .unwrap();
            tx.send(g).unwrap();
        });
    }
    let c = admin(&s.fleet.connect_string()).await;
    let t0 = Instant::now();
    while c.list_children(&dir).await.unwrap().len() < WAITERS + 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "waiters did not queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wakeups = || locks.iter().map(|l| l.watch_wakeups()).sum::<u64>();
    assert_eq!(wakeups(), 0, "nobody may wake while the holder holds");
    let mut current = first;
    let mut last_token = current.token();
    for i in 0..WAITERS {
        let before = wakeups();
        assert!(current.release().await.unwrap());
        current = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no waiter got the lock after a release")
            .unwrap();
        // Anyone else woken would have to relist before going back to
        // sleep: give a stray wake-up time to show.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            wakeups() - before,
            1,
            "release {i} woke {} waiters",
            wakeups() - before
        );
        assert!(current.token() > last_token, "not FIFO at release {i}");
        last_token = current.token();
    }
    assert!(current.release().await.unwrap());
    assert_eq!(wakeups(), WAITERS as u64);
}

/// The leader of a 3-node ensemble is killed (and later restarted) while
/// a lock is held and 4 clients contend for another: the holder keeps its
/// lock or gets lost(), never a silent double holder; the contenders never
/// overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_no_double_holder() {
    let s = Zk::ensemble();
    let holder = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let held = holder
        .acquire("across-kill", AcquireOptions::try_lock())
        .await
        .unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let l = ZkLock::connect(s.cfg.clone()).await.unwrap();
        let (stop, inside, peak, ok) = (stop.clone(), inside.clone(), peak.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            let mut errors = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let g = match l
                    .acquire("contended", AcquireOptions::wait(Duration::from_secs(5)))
                    .await
                {
                    Ok(g) => g,
                    Err(_) => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                // A correct user leaves the critical section when the lock
                // is lost.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = g.lost() => {}
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                let _ = g.release().await;
                ok.fetch_add(1, Ordering::SeqCst);
            }
            errors
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = s.fleet.leader().unwrap();
    s.fleet.nodes[leader].kill().unwrap();
    let killed_at_ok = ok.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s2 = &s;
    tokio::task::block_in_place(|| s2.fleet.restart(leader)).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let mut errors = 0;
    for t in tasks {
        errors += t.await.unwrap();
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "two holders were inside at once"
    );
    assert!(
        ok.load(Ordering::SeqCst) > killed_at_ok,
        "no acquisition after the leader was killed ({errors} errors)"
    );

    // The lock held across the kill: still ours (and nobody else's), or
    // known lost.
    let intruder = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let r = intruder
        .acquire("across-kill", AcquireOptions::try_lock())
        .await;
    if held.is_lost() {
        println!("the holder's session ended across the failover: lost() fired");
        assert!(!held.release().await.unwrap_or(false));
    } else {
        assert!(
            matches!(r, Err(Error::Timeout { .. })),
            "silent double holder: {r:?}"
        );
        assert!(held.release().await.unwrap(), "kept lock was not ours");
    }
}
