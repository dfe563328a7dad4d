//! The ZooKeeper lock against real ZooKeeper servers from the fleet: the
//! shared conformance suite on a standalone server and on a 3-node
//! ensemble, and the faults only a session-bound lock has.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::testing::{self, Outcome, Subject};
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
}

/// No leases: the lock lives with the session. The lease cases are
/// selected out by the declared capabilities; session loss is tested below.
const NO_LEASE: &[&str] = &[
    "release_only_own",
    "fixed_lease_expires",
    "watchdog_keeps_lock",
    "lost_fires",
];

async fn all_cases(s: &Zk) {
    let skipped: Vec<&str> = testing::run_all(s)
        .await
        .into_iter()
        .filter(|(_, o)| matches!(o, Outcome::NotApplicable(_)))
        .map(|(case, _)| case)
        .collect();
    assert_eq!(skipped, NO_LEASE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_conformance() {
    all_cases(&Zk::standalone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_conformance() {
    all_cases(&Zk::ensemble()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_is_one_round_trip() {
    let s = Zk::standalone();
    let a = ZkLock::connect(s.cfg.clone()).await.unwrap();
    // The first acquire of a key also creates its directory.
    a.acquire("rt", AcquireOptions::try_lock())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let g = a.acquire("rt", AcquireOptions::try_lock()).await.unwrap();
    assert_eq!(g.round_trips(), 1, "create + pipelined getChildren");
    assert!(g.release().await.unwrap());
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
async fn unreachable_server_fails_fast_naming_it() {
    let t0 = Instant::now();
    let e = ZkLock::connect(ZkConfig::new("127.0.0.1:1"))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
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

/// The server stops answering (SIGSTOP) for longer than the session
/// timeout: the holder's guard stops vouching (valid_until no later than
/// the last contact + the session timeout) and then lost() fires; the
/// handle opens a new session afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_fires_lost_and_valid_until_stops() {
    let s = Zk::standalone();
    let a = ZkLock::connect(s.cfg.clone()).await.unwrap();
    let g = a.acquire("exp", AcquireOptions::try_lock()).await.unwrap();
    let session = Duration::from_millis(s.cfg.session_timeout_ms);
    tokio::time::sleep(session).await;
    assert!(!g.is_lost());
    assert!(g.valid_until() > Instant::now(), "vouched while connected");
    let paused = Instant::now();
    s.fleet.nodes[0].pause().unwrap();
    let lost = tokio::time::timeout(session * 5, g.lost()).await;
    let lost_at = Instant::now();
    s.fleet.nodes[0].resume().unwrap();
    assert!(
        lost.is_ok(),
        "lost() did not fire while the server was gone"
    );
    assert!(
        g.valid_until() <= paused + session,
        "valid_until {:?} past the last contact + session timeout",
        g.valid_until() - paused
    );
    assert!(g.valid_until() <= lost_at);
    assert!(!g.release().await.unwrap(), "an expired lock was not ours");
    // A new session, and the lock is free again.
    let g2 = a
        .acquire("exp", AcquireOptions::wait(Duration::from_secs(10)))
        .await
        .unwrap();
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
