//! The Redis lock as teams deploy it, against real servers the fleet
//! starts: a primary found through Sentinel (and found again after a
//! failover), and a Redis Cluster (3 masters + 3 replicas, a master killed).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::testing::Subject;
use distlock::{AcquireOptions, DistLock, Result};
use fleet::{RedisClusterFleet, SentinelFleet};
use lockbench_redis::{RedisConfig, RedisLock};

/// A lock config for `url` with a short watchdog lease, as the
/// conformance cases want.
fn config(url: String) -> RedisConfig {
    let mut cfg = RedisConfig::new(url);
    // Not shorter: one ~200 ms stall of a loaded machine lost a 300 ms
    // lease, renewed every 100 ms.
    cfg.watchdog_lease_ms = 1_000;
    cfg
}

fn sentinel_url(f: &SentinelFleet) -> String {
    let hosts: Vec<String> = f.sentinels.iter().map(|s| s.host_port()).collect();
    format!(
        "redis+sentinel://{}/{}",
        hosts.join(","),
        fleet::SENTINEL_MASTER_NAME
    )
}

/// Deletes `key`'s lock behind its holder's back, on whatever node holds it.
async fn delete_lock(lock: &RedisLock, key: &str, nodes: Vec<String>, cluster: bool) {
    let k = lock.lock_key(key);
    if cluster {
        let c = redis::cluster::ClusterClient::new(nodes).unwrap();
        let mut con = c.get_async_connection().await.unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(&k)
            .query_async(&mut con)
            .await
            .unwrap();
    } else {
        let c = redis::Client::open(nodes[0].as_str()).unwrap();
        let mut con = c.get_multiplexed_async_connection().await.unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(&k)
            .query_async(&mut con)
            .await
            .unwrap();
    }
}

mod sentinel {
    use super::*;

    struct Behind {
        f: SentinelFleet,
        cfg: RedisConfig,
    }

    #[async_trait::async_trait]
    impl Subject for Behind {
        async fn client(&self) -> Result<Arc<dyn DistLock>> {
            Ok(Arc::new(RedisLock::connect(self.cfg.clone()).await?))
        }

        async fn sabotage(&self, key: &str) -> Result<()> {
            let lock = RedisLock::connect(self.cfg.clone()).await?;
            let primary = format!("redis://{}", lock.sentinel_primary().unwrap());
            delete_lock(&lock, key, vec![primary], false).await;
            Ok(())
        }

        fn watchdog_lease(&self) -> Duration {
            Duration::from_millis(self.cfg.watchdog_lease_ms)
        }

        async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
            let url = "redis+sentinel://127.0.0.1:1/lockbench".to_string();
            let r = RedisLock::connect(RedisConfig::new(url)).await;
            (
                "127.0.0.1:1".into(),
                r.map(|l| Arc::new(l) as Arc<dyn DistLock>),
            )
        }

        async fn restart_servers(&self) -> Result<()> {
            // No persistence: the primary comes back empty (its replica
            // resyncs from it, or is promoted if the sentinels saw it down).
            self.f
                .primary
                .restart()
                .map_err(|e| distlock::Error::backend("redis", "restart", e.to_string()))
        }
    }

    fn subject() -> Behind {
        let f = SentinelFleet::start().unwrap();
        let cfg = config(sentinel_url(&f));
        Behind { f, cfg }
    }

    // Every case, through the sentinels: nothing may be skipped.
    distlock::conformance_tests!(one_server: subject(), skipped: []);

    /// The seeds' drill: the primary is switched over while a client holds
    /// a lock. The client follows to the new primary without being told,
    /// and a held lock's fate (kept or lost) is what replication gave.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_lock_follows_a_failover() {
        let f = SentinelFleet::start().unwrap();
        let lock = RedisLock::connect(config(sentinel_url(&f))).await.unwrap();
        let before = lock.sentinel_primary().unwrap();
        assert_eq!(before, f.primary.host_port());
        let held = lock
            .acquire("failover:held", AcquireOptions::try_lock())
            .await
            .unwrap();
        let t0 = Instant::now();
        let new_master = tokio::task::spawn_blocking({
            let f = Arc::new(f);
            let g = f.clone();
            move || (g.failover(Duration::from_secs(20)), f)
        })
        .await
        .unwrap();
        let (new_master, f) = (new_master.0.unwrap(), new_master.1);
        assert_eq!(new_master, f.replica.host_port());
        // Acquires go on, on the new primary, within seconds. Until the
        // client switches, an acquire may still land on the old primary:
        // the window in which Sentinel loses locks.
        let mut on_old = 0;
        let mut last = None;
        let mut switched = None;
        while t0.elapsed() < Duration::from_secs(15) {
            match lock
                .acquire("failover:fresh", AcquireOptions::try_lock())
                .await
            {
                Ok(g) => {
                    let now = lock.sentinel_primary().unwrap();
                    let _ = g.release().await;
                    if now == new_master {
                        switched = Some(t0.elapsed());
                        break;
                    }
                    on_old += 1;
                }
                Err(e) => last = Some(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let switched =
            switched.unwrap_or_else(|| panic!("still not on {new_master} after 15 s: {last:?}"));
        eprintln!(
            "followed the failover {before} -> {new_master}: locking on the new primary \
             {switched:?} after the switch was asked; {on_old} acquire(s) landed on the old one first"
        );
        // The lock taken before the switch: kept or lost, the client can
        // tell, and does not hang.
        let kept = tokio::time::timeout(Duration::from_secs(5), held.release())
            .await
            .expect("release after the failover hung");
        eprintln!("the lock held across the failover, on release: {kept:?}");
    }

    /// A primary that hangs (SIGSTOP, a stuck host) and is replaced by the
    /// sentinels: a waiter with a budget waits through it and takes the
    /// key on the new primary once its holder lets go. It gave up 1.1 s
    /// into the hang ("timed out"), with the promotion 2.5 s away.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_waits_through_a_hung_primary_being_replaced() {
        let f = Arc::new(SentinelFleet::start().unwrap());
        let mut cfg = config(sentinel_url(&f));
        cfg.watchdog_lease_ms = 3_000;
        cfg.op_timeout_ms = 1_000;
        let (a, b) = (
            RedisLock::connect(cfg.clone()).await.unwrap(),
            Arc::new(RedisLock::connect(cfg).await.unwrap()),
        );
        let held = a
            .acquire("hung:key", AcquireOptions::try_lock())
            .await
            .unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move {
                let t0 = Instant::now();
                let r = b
                    .acquire("hung:key", AcquireOptions::wait(Duration::from_secs(25)))
                    .await;
                (r, t0.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let old = f.primary.host_port();
        f.primary.set_paused(true).unwrap();
        let t0 = Instant::now();
        let promoted = tokio::task::spawn_blocking({
            let f = f.clone();
            move || {
                while t0.elapsed() < Duration::from_secs(20) {
                    if f.current_master().is_ok_and(|m| m != old) {
                        return Some(t0.elapsed());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                None
            }
        })
        .await
        .unwrap();
        let released = tokio::time::timeout(Duration::from_secs(5), held.release()).await;
        f.primary.set_paused(false).unwrap();
        let promoted = promoted.expect("the sentinels promoted no replica within 20 s");
        let (r, took) = waiter.await.unwrap();
        eprintln!(
            "hung primary replaced after {promoted:?}; the holder's release: {released:?}; \
             the waiter: {:?} after {took:?}",
            r.as_ref().map(|_| "acquired")
        );
        let g = r.unwrap_or_else(|e| panic!("the waiter gave up after {took:?}: {e}"));
        assert!(took > Duration::from_millis(300), "{took:?}");
        g.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_wrong_master_name_is_a_named_config_error() {
        let f = SentinelFleet::start().unwrap();
        let hosts: Vec<String> = f.sentinels.iter().map(|s| s.host_port()).collect();
        let t0 = Instant::now();
        let e = RedisLock::connect(RedisConfig::new(format!(
            "redis+sentinel://{}/no-such-master",
            hosts.join(",")
        )))
        .await
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("redis.master_name") && msg.contains("no-such-master"),
            "{msg}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn dead_sentinels_are_named_within_seconds() {
        let t0 = Instant::now();
        let cfg = RedisConfig {
            sentinels: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            master_name: "lockbench".into(),
            ..RedisConfig::default()
        };
        let e = RedisLock::connect(cfg).await.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("127.0.0.1:1") && msg.contains("127.0.0.1:2"),
            "{msg}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    /// `redis-wait` through the sentinels: WAIT counts the replica.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_wait_through_the_sentinels() {
        let f = SentinelFleet::start().unwrap();
        let mut cfg = config(sentinel_url(&f));
        cfg.wait_replicas = 1;
        cfg.wait_timeout_ms = 500;
        let lock = RedisLock::connect(cfg).await.unwrap();
        let g = lock
            .acquire("wait", AcquireOptions::try_lock())
            .await
            .unwrap();
        assert!(g.token().is_some());
        g.release().await.unwrap();
    }
}

mod cluster {
    use super::*;

    struct OnCluster {
        f: RedisClusterFleet,
        cfg: RedisConfig,
    }

    #[async_trait::async_trait]
    impl Subject for OnCluster {
        async fn client(&self) -> Result<Arc<dyn DistLock>> {
            Ok(Arc::new(RedisLock::connect(self.cfg.clone()).await?))
        }

        async fn sabotage(&self, key: &str) -> Result<()> {
            let lock = RedisLock::connect(self.cfg.clone()).await?;
            delete_lock(&lock, key, self.f.urls(), true).await;
            Ok(())
        }

        fn watchdog_lease(&self) -> Duration {
            Duration::from_millis(self.cfg.watchdog_lease_ms)
        }

        async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
            let url = "redis+cluster://127.0.0.1:1,127.0.0.1:2".to_string();
            let r = RedisLock::connect(RedisConfig::new(url)).await;
            (
                "127.0.0.1:1".into(),
                r.map(|l| Arc::new(l) as Arc<dyn DistLock>),
            )
        }

        async fn restart_servers(&self) -> Result<()> {
            self.f
                .restart_all()
                .map_err(|e| distlock::Error::backend("redis", "restart", e.to_string()))
        }
    }

    fn subject() -> OnCluster {
        let f = RedisClusterFleet::start(3, 1).unwrap();
        let cfg = config(f.endpoint());
        OnCluster { f, cfg }
    }

    // Every case on the cluster: nothing may be skipped.
    distlock::conformance_tests!(one_server: subject(), skipped: []);

    /// The seeds' drill on the cluster: the master of a held lock's slot is
    /// killed; the cluster promotes its replica, the client follows the
    /// new slot map, and locks are taken again within seconds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_master_is_replaced_and_locking_goes_on() {
        let f = RedisClusterFleet::start(3, 1).unwrap();
        let lock = RedisLock::connect(config(f.endpoint())).await.unwrap();
        let held = lock
            .acquire("drill:held", AcquireOptions::try_lock())
            .await
            .unwrap();
        let slot = lock.slot_of("drill:held").await.unwrap().unwrap();
        let victim = f.master_of_slot(slot).unwrap();
        let t0 = Instant::now();
        let promoted = f.failover_master(victim, Duration::from_secs(20)).unwrap();
        let failover = t0.elapsed();
        let mut last = None;
        let mut got = None;
        while t0.elapsed() < Duration::from_secs(20) {
            match lock
                .acquire("drill:fresh", AcquireOptions::try_lock())
                .await
            {
                Ok(g) => {
                    got = Some(g);
                    break;
                }
                Err(e) => last = Some(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let g = got.unwrap_or_else(|| panic!("no acquire after the failover: {last:?}"));
        // Was the held lock replicated before the kill? Either answer is
        // possible (asynchronous replication); what must hold is that the
        // client can tell, not hang.
        let kept = tokio::time::timeout(Duration::from_secs(5), held.release())
            .await
            .expect("release after the failover hung");
        eprintln!(
            "master of slot {slot} killed; {promoted} promoted in {failover:?}; \
             locking again after {:?}; the held lock on release: {kept:?}",
            t0.elapsed()
        );
        g.release().await.unwrap();
    }

    /// Waiters with a budget wait through a failover of their key's
    /// master: one queued before the kill, one that came during it. Both
    /// gave up 50-135 ms after the kill (MOVED to the dead master, or a
    /// refused connection), with the promotion 2.3-2.7 s away.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_wait_through_a_failover_of_their_keys_master() {
        let f = Arc::new(RedisClusterFleet::start(3, 1).unwrap());
        let mut cfg = config(f.endpoint());
        cfg.watchdog_lease_ms = 3_000;
        let a = RedisLock::connect(cfg.clone()).await.unwrap();
        let held = a
            .acquire("fo:key", AcquireOptions::try_lock())
            .await
            .unwrap();
        let slot = a.slot_of("fo:key").await.unwrap().unwrap();
        let waiter = |cfg: RedisConfig| {
            tokio::spawn(async move {
                let lock = RedisLock::connect(cfg).await.unwrap();
                let t0 = Instant::now();
                let r = lock
                    .acquire("fo:key", AcquireOptions::wait(Duration::from_secs(25)))
                    .await;
                let took = t0.elapsed();
                let r = match r {
                    Ok(g) => g.release().await.map(|_| ()),
                    Err(e) => Err(e),
                };
                (r, took)
            })
        };
        let queued = waiter(cfg.clone());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t0 = Instant::now();
        let failover = tokio::task::spawn_blocking({
            let f = f.clone();
            move || {
                let m = f.master_of_slot(slot).unwrap();
                f.failover_master(m, Duration::from_secs(20)).unwrap()
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let newcomer = waiter(cfg);
        failover.await.unwrap();
        let promoted = t0.elapsed();
        let released = tokio::time::timeout(Duration::from_secs(5), held.release()).await;
        for (name, w) in [("queued", queued), ("newcomer", newcomer)] {
            let (r, took) = w.await.unwrap();
            eprintln!(
                "{name}: {r:?} after {took:?} (promoted after {promoted:?}, release {released:?})"
            );
            r.unwrap_or_else(|e| panic!("the {name} waiter gave up after {took:?}: {e}"));
        }
    }

    /// A slot migrating (a reshard under way, or one left half done until
    /// `--cluster fix`) answers TRYAGAIN to the lock's scripts, which name
    /// several keys: a waiter with a budget waits for it to end. It failed
    /// at once (73 ms), and so did every acquire of a key ever locked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_waits_through_a_slot_migration() {
        let f = RedisClusterFleet::start(3, 1).unwrap();
        let lock = RedisLock::connect(config(f.endpoint())).await.unwrap();
        // Locked once: its fence counter exists in the slot.
        lock.acquire("mig:key", AcquireOptions::try_lock())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let slot = lock.slot_of("mig:key").await.unwrap().unwrap();
        let src = f.master_of_slot(slot).unwrap();
        let dst = f
            .masters
            .iter()
            .find(|m| m.host_port() != src.host_port())
            .unwrap();
        let node = |n: &fleet::Node| redis::Client::open(n.url()).unwrap();
        let (mut s, mut d) = (
            node(src).get_multiplexed_async_connection().await.unwrap(),
            node(dst).get_multiplexed_async_connection().await.unwrap(),
        );
        let id = |c: &mut redis::aio::MultiplexedConnection| {
            let mut c = c.clone();
            async move {
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query_async::<String>(&mut c)
                    .await
                    .unwrap()
            }
        };
        let (src_id, dst_id) = (id(&mut s).await, id(&mut d).await);
        let setslot = |c: &redis::aio::MultiplexedConnection, args: Vec<String>| {
            let mut c = c.clone();
            async move {
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(args)
                    .query_async::<()>(&mut c)
                    .await
                    .unwrap()
            }
        };
        setslot(&d, vec!["IMPORTING".into(), src_id]).await;
        setslot(&s, vec!["MIGRATING".into(), dst_id]).await;
        let t0 = Instant::now();
        let waiter = tokio::spawn(async move {
            let r = lock
                .acquire("mig:key", AcquireOptions::wait(Duration::from_secs(15)))
                .await;
            (r, t0.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        // The reshard is called off: the slot stays where it was.
        setslot(&s, vec!["STABLE".into()]).await;
        setslot(&d, vec!["STABLE".into()]).await;
        let (r, took) = waiter.await.unwrap();
        let g = r.unwrap_or_else(|e| panic!("the waiter gave up after {took:?}: {e}"));
        assert!(took >= Duration::from_millis(1_400), "{took:?}");
        g.release().await.unwrap();
    }

    /// Keys a user may well pass: the empty key and one that starts with
    /// `}` gave an empty hash tag, so the lock's keys hashed to different
    /// slots and every acquire failed with CROSSSLOT. Each is one lock
    /// (held → refused to another handle → waited for → handed over), and
    /// a key that escapes to another's spelling is still another lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn any_key_locks_on_the_cluster() {
        let f = RedisClusterFleet::start(3, 1).unwrap();
        let a = RedisLock::connect(config(f.endpoint())).await.unwrap();
        let b = Arc::new(RedisLock::connect(config(f.endpoint())).await.unwrap());
        for key in ["", "}", "}abc", "}{a}", "a}b{c", "{tag}", "%"] {
            let g = a.acquire(key, AcquireOptions::try_lock()).await;
            let g = g.unwrap_or_else(|e| panic!("{key:?}: {e}"));
            let r = b.acquire(key, AcquireOptions::try_lock()).await;
            assert!(r.is_err(), "{key:?} taken twice: {r:?}");
            let (w, k) = (b.clone(), key.to_string());
            let waiter = tokio::spawn(async move {
                w.acquire(&k, AcquireOptions::wait(Duration::from_secs(5)))
                    .await
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(g.release().await.unwrap(), "{key:?}");
            let g2 = waiter.await.unwrap();
            let g2 = g2.unwrap_or_else(|e| panic!("{key:?}, the waiter: {e}"));
            assert!(g2.release().await.unwrap(), "{key:?}");
        }
        let held = a.acquire("a}b", AcquireOptions::try_lock()).await.unwrap();
        let other = b.acquire("a%7Db", AcquireOptions::try_lock()).await;
        assert!(other.is_ok(), "\"a%7Db\" blocked by \"a}}b\": {other:?}");
        other.unwrap().release().await.unwrap();
        held.release().await.unwrap();
    }

    /// `redis-cluster` pointed at one plain server ran as `redis` and was
    /// recorded as a cluster run; it is refused, saying what to give.
    #[tokio::test]
    async fn redis_cluster_refuses_an_endpoint_that_is_not_a_cluster() {
        use distlock::descriptor::{BuildParams, Descriptor};
        let b = &lockbench_redis::REDIS_CLUSTER;
        let mut settings = b.settings(None).unwrap();
        b.set_endpoint(&mut settings, "redis://127.0.0.1:1")
            .unwrap();
        let params = BuildParams {
            hold: Duration::ZERO,
            probes: false,
            key: "k".into(),
        };
        let e = b
            .connect(&settings, params)
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("redis.url") && e.contains("redis+cluster://"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_cluster_that_is_down_is_named_within_seconds() {
        let t0 = Instant::now();
        let e = RedisLock::connect(RedisConfig::new("redis+cluster://127.0.0.1:1,127.0.0.1:2"))
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("127.0.0.1:1"), "{msg}");
        assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
    }

    /// A single-node client pointed at a cluster replica: every acquire is
    /// refused with the server's own reason (MOVED), never silently.
    #[tokio::test]
    async fn a_single_node_client_on_a_cluster_is_refused_with_the_reason() {
        let f = RedisClusterFleet::start(3, 1).unwrap();
        let lock = RedisLock::connect(RedisConfig::new(f.replicas[0].url()))
            .await
            .unwrap();
        let e = lock
            .acquire("k", AcquireOptions::try_lock())
            .await
            .unwrap_err();
        assert!(e.to_string().to_lowercase().contains("moved"), "{e}");
    }
}
