//! The fleet against the real servers from the OS packages.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use fleet::{EtcdFleet, PostgresFleet, RedisClusterFleet, RedisFleet, SentinelFleet};

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rfind(')')
                .and_then(|i| s[i + 2..].split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

fn ping(url: &str) -> Result<String, redis::RedisError> {
    let c = redis::Client::open(url)?;
    let mut con = c.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_millis(500)))?;
    redis::cmd("PING").query(&mut con)
}

#[test]
fn redis_node_kill_pause_restart() {
    let f = RedisFleet::single().unwrap();
    let n = &f.nodes[0];
    assert!(n.addr().is_loopback());
    assert_ne!(
        n.addr().octets()[3],
        1,
        "each node gets its own 127.0.0.N, not 127.0.0.1"
    );
    assert_ne!(n.port(), 6379, "never the default port");
    assert_eq!(ping(&n.url()).unwrap(), "PONG");

    n.pause().unwrap();
    assert!(ping(&n.url()).is_err(), "a paused node must not answer");
    n.resume().unwrap();
    assert_eq!(ping(&n.url()).unwrap(), "PONG");

    let old = n.pid().unwrap();
    n.kill().unwrap();
    assert!(!alive(old));
    assert!(ping(&n.url()).is_err());
    // A kill of ours leaves no exit status: a run tells it from a death.
    assert_eq!(n.exit_status(), None);
    n.restart().unwrap();
    assert_ne!(n.pid().unwrap(), old);
    assert_eq!(
        ping(&n.url()).unwrap(),
        "PONG",
        "restart on the same address and port"
    );
    assert_eq!(n.exit_status(), None);
    // A restarted node that then dies on its own (here: a kill -9 from
    // outside) has one, and is no longer running.
    let pid = n.pid().unwrap();
    // SAFETY: kill(2) of the server process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let t0 = std::time::Instant::now();
    while n.exit_status().is_none() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        n.exit_status().is_some_and(|s| s.contains('9')),
        "{:?}",
        n.exit_status()
    );
    assert!(!n.is_running());
}

/// `kill` returns only once the port is free: redis's leader thread turns
/// zombie while its other threads still hold the listening socket, and an
/// immediate restart then failed with "address in use" (seen once in CI,
/// not reproduced here in 400 rounds under load, so this is a guard rather
/// than a reproduction). Forty kill -9 / restart rounds, a client connected.
#[test]
fn a_killed_redis_restarts_on_its_port_at_once() {
    let f = RedisFleet::single().unwrap();
    let n = &f.nodes[0];
    for round in 0..40 {
        let c = redis::Client::open(n.url()).unwrap();
        let mut con = c
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg(round)
            .query(&mut con)
            .unwrap();
        n.kill().unwrap();
        n.restart()
            .unwrap_or_else(|e| panic!("round {round}: restart right after kill: {e}"));
        assert_eq!(ping(&n.url()).unwrap(), "PONG", "round {round}");
    }
}

#[test]
fn independent_masters_have_distinct_addresses_and_drop_kills_all() {
    let f = RedisFleet::independent(5).unwrap();
    let pids: Vec<i32> = f.nodes.iter().map(|n| n.pid().unwrap()).collect();
    let mut addrs: Vec<_> = f.nodes.iter().map(|n| n.addr()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 5);
    for u in f.urls() {
        assert_eq!(ping(&u).unwrap(), "PONG");
    }
    let dir = f.dir().to_path_buf();
    drop(f);
    for p in pids {
        assert!(!alive(p), "pid {p} survived the fleet's drop");
    }
    assert!(!dir.exists(), "temp dir left behind");
}

#[test]
fn panic_tears_down() {
    let (tx, rx) = std::sync::mpsc::channel();
    let r = std::thread::spawn(move || {
        let f = RedisFleet::single().unwrap();
        tx.send(f.nodes[0].pid().unwrap()).unwrap();
        panic!("deliberate panic with a live fleet");
    })
    .join();
    assert!(r.is_err());
    let pid = rx.recv().unwrap();
    assert!(!alive(pid), "redis-server {pid} survived a panic");
}

#[test]
fn paused_node_is_still_killed_on_drop() {
    let f = RedisFleet::single().unwrap();
    let pid = f.nodes[0].pid().unwrap();
    f.nodes[0].pause().unwrap();
    let t0 = Instant::now();
    drop(f);
    assert!(!alive(pid));
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn sentinel_topology_replicates_and_fails_over() {
    let f = SentinelFleet::start().unwrap();
    let before = f.current_master().unwrap();
    assert_eq!(before, f.primary.host_port());
    // A write on the primary reaches the replica.
    let c = redis::Client::open(f.primary.url()).unwrap();
    let mut con = c.get_connection().unwrap();
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    let _: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut con).unwrap();
    let rc = redis::Client::open(f.replica.url()).unwrap();
    let mut rcon = rc.get_connection().unwrap();
    let v: String = redis::cmd("GET").arg("k").query(&mut rcon).unwrap();
    assert_eq!(v, "v");
    let after = f.failover(Duration::from_secs(20)).unwrap();
    assert_eq!(after, f.replica.host_port(), "the replica is promoted");
}

fn connect(url: &str) -> redis::Connection {
    let con = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_millis(500))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    con
}

/// 3 masters with a replica each, on six addresses: the cluster is ok on
/// every node, a key is served by its slot's master only (MOVED elsewhere),
/// and killing that master promotes its replica, which has the key.
#[test]
fn redis_cluster_routes_by_slot_and_fails_over() {
    let t0 = Instant::now();
    let f = RedisClusterFleet::start(3, 1).unwrap();
    eprintln!("cluster of 6 ready in {:?}", t0.elapsed());
    assert_eq!(f.masters.len(), 3);
    assert_eq!(f.replicas.len(), 3);
    let mut addrs: Vec<_> = f.nodes().iter().map(|n| n.addr()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 6, "each node on its own 127.0.0.N");
    let seeds: Vec<String> = f.masters.iter().map(|m| m.host_port()).collect();
    assert_eq!(f.endpoint(), format!("redis+cluster://{}", seeds.join(",")));
    assert_eq!(f.urls().len(), 3);
    for n in f.nodes() {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut connect(&n.url()))
            .unwrap();
        assert!(info.contains("cluster_state:ok"), "{}: {info}", n.name());
        assert!(
            info.contains("cluster_known_nodes:6"),
            "{}: {info}",
            n.name()
        );
    }

    let key = "lockbench:cluster:somekey";
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut connect(&f.urls()[0]))
        .unwrap();
    let owner = f.master_of_slot(slot).unwrap();
    assert!(f.masters.iter().any(|m| m.host_port() == owner.host_port()));
    let mut con = connect(&owner.url());
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("v1")
        .query(&mut con)
        .unwrap();
    // Replicated before the kill, so the promoted replica must have it.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut con).unwrap();
    assert_eq!(acked, 1);
    let other = f
        .masters
        .iter()
        .find(|m| m.host_port() != owner.host_port())
        .unwrap();
    let e = redis::cmd("SET")
        .arg(key)
        .arg("v1")
        .query::<()>(&mut connect(&other.url()))
        .unwrap_err();
    assert_eq!(e.code(), Some("MOVED"), "{e}");
    assert_eq!(
        e.redirect_node(),
        Some((owner.host_port().as_str(), slot)),
        "{e}"
    );

    let t1 = Instant::now();
    let new = f.failover_master(owner, Duration::from_secs(15)).unwrap();
    let took = t1.elapsed();
    eprintln!("failover of {} to {new} in {took:?}", owner.host_port());
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(!owner.is_running());
    assert_ne!(new, owner.host_port());
    assert!(
        f.replicas.iter().any(|r| r.host_port() == new),
        "{new} is not one of the replicas"
    );
    let promoted = f.master_of_slot(slot).unwrap();
    assert_eq!(promoted.host_port(), new);
    let mut con = connect(&promoted.url());
    let v: String = redis::cmd("GET").arg(key).query(&mut con).unwrap();
    assert_eq!(v, "v1", "the acknowledged write survives the failover");
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("v2")
        .query(&mut con)
        .unwrap();

    let pids: Vec<i32> = f.nodes().iter().filter_map(|n| n.pid()).collect();
    assert_eq!(pids.len(), 5);
    drop(f);
    for p in pids {
        assert!(!alive(p), "redis-server {p} survived the fleet's drop");
    }
}

#[test]
fn postgres_starts_answers_and_stops() {
    let pg = PostgresFleet::start().unwrap();
    assert_eq!(pg.psql("SELECT 1").unwrap(), "1");
    let pid = pg.node.pid().unwrap();
    assert!(pg.url().starts_with("postgres://postgres@127.0.0."));
    drop(pg);
    assert!(!alive(pid), "postmaster survived");
}

#[test]
fn missing_binary_names_the_package() {
    let e = fleet::find_binary("no-such-server-xyz", "no-such-package", &[]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("apt-get install no-such-package"), "{msg}");
}

/// Redis under libfaketime at x10: a 10 s PX key expires after about 1 s
/// of real time (and the other nodes keep real time).
#[test]
fn fake_clock_runs_a_node_ten_times_fast() {
    let f = RedisFleet::independent_with_fake_clocks(2, &[1]).unwrap();
    assert!(
        f.nodes[0].set_clock("+0 x10").is_err(),
        "node 0 has a real clock"
    );
    f.nodes[1].set_clock("+0 x10").unwrap();
    let mut cons: Vec<_> = f
        .urls()
        .iter()
        .map(|u| {
            redis::Client::open(u.as_str())
                .unwrap()
                .get_connection()
                .unwrap()
        })
        .collect();
    for c in cons.iter_mut() {
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .arg("PX")
            .arg(10_000)
            .query(c)
            .unwrap();
    }
    let t0 = Instant::now();
    let gone = loop {
        let n: i64 = redis::cmd("EXISTS").arg("k").query(&mut cons[1]).unwrap();
        if n == 0 {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the x10 node kept the key 5 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        gone > Duration::from_millis(500) && gone < Duration::from_millis(2000),
        "10 s at x10 took {gone:?} of real time"
    );
    let n: i64 = redis::cmd("EXISTS").arg("k").query(&mut cons[0]).unwrap();
    assert_eq!(n, 1, "the real-clock node must still hold its key");

    // A jump: +60 s expires a 10 s key at once.
    f.nodes[1].set_clock("+60s").unwrap();
    let _: () = redis::cmd("SET")
        .arg("j")
        .arg("v")
        .arg("PX")
        .arg(10_000)
        .query(&mut cons[1])
        .unwrap();
    f.nodes[1].set_clock("+120s").unwrap();
    std::thread::sleep(Duration::from_millis(250));
    let n: i64 = redis::cmd("EXISTS").arg("j").query(&mut cons[1]).unwrap();
    assert_eq!(n, 0, "a clock jump of 60 s must expire a 10 s key");
}

#[test]
fn zookeeper_standalone_serves_and_drop_kills_it() {
    let f = fleet::ZkFleet::standalone().unwrap();
    let n = &f.nodes[0];
    assert_ne!(n.addr().octets()[3], 1, "its own 127.0.0.N");
    assert_ne!(n.port(), 2181, "never the default port");
    assert_eq!(f.mode(0).unwrap(), "standalone");
    assert_eq!(f.leader().unwrap(), 0);
    assert_eq!(f.connect_string(), n.host_port());
    let pid = n.pid().unwrap();
    n.pause().unwrap();
    assert!(f.mode(0).is_err(), "a paused server must not answer");
    n.resume().unwrap();
    assert_eq!(f.mode(0).unwrap(), "standalone");
    let dir = f.dir().to_path_buf();
    drop(f);
    assert!(!alive(pid), "java {pid} survived the fleet's drop");
    assert!(!dir.exists(), "temp dir left behind");
}

#[test]
fn zookeeper_ensemble_elects_a_leader_and_fails_over() {
    let f = fleet::ZkFleet::ensemble(3).unwrap();
    let pids: Vec<i32> = f.nodes.iter().map(|n| n.pid().unwrap()).collect();
    let mut addrs: Vec<_> = f.nodes.iter().map(|n| n.addr()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 3, "each peer on its own address");
    assert_eq!(f.connect_string().split(',').count(), 3);
    let leader = f.leader().unwrap();
    let modes: Vec<String> = (0..3).map(|i| f.mode(i).unwrap()).collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );

    // Kill the leader: the two others elect a new one.
    f.nodes[leader].kill().unwrap();
    let t0 = Instant::now();
    let new_leader = loop {
        match f.leader() {
            Ok(l) => break l,
            Err(e) if t0.elapsed() > Duration::from_secs(30) => panic!("no new leader: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert_ne!(new_leader, leader);
    // And the old one rejoins as a follower.
    f.restart(leader).unwrap();
    assert_eq!(f.mode(leader).unwrap(), "follower");
    let pids_after: Vec<i32> = f.nodes.iter().map(|n| n.pid().unwrap()).collect();
    drop(f);
    for p in pids.into_iter().chain(pids_after) {
        assert!(!alive(p), "java {p} survived the fleet's drop");
    }
}

#[test]
fn zookeeper_missing_jar_or_java_names_the_package() {
    // `java` is looked up on PATH first, then in the usual system dirs.
    let e = fleet::find_binary("no-such-java-xyz", "default-jre-headless", &[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("apt-get install default-jre-headless"),
        "{e}"
    );
}

/// Live processes whose working directory is inside `dir` (etcd members
/// run in their node dirs).
fn processes_in(dir: &std::path::Path) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if cwd.starts_with(dir) && alive(pid) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn etcd_single_node_serves_and_leads() {
    let f = EtcdFleet::single().unwrap();
    let n = &f.nodes[0];
    assert!(n.addr().is_loopback());
    assert_ne!(n.addr().octets()[3], 1);
    assert_ne!(n.port(), 2379, "never the default port");
    let ep = &f.endpoints()[0];
    assert_eq!(ep, &format!("http://{}:{}", n.addr(), n.port()));
    assert_eq!(f.leader().unwrap(), 0);
    let pid = n.pid().unwrap();
    let dir = f.dir().to_path_buf();
    drop(f);
    assert!(!alive(pid), "etcd {pid} survived the fleet's drop");
    assert!(processes_in(&dir).is_empty());
    assert!(!dir.exists(), "temp dir left behind");
}

/// Three members on three addresses elect a leader; killing it elects
/// another; the killed member restarts and rejoins; a graceful stop of a
/// follower is quick; drop leaves nothing behind.
#[test]
fn etcd_cluster_elects_fails_over_and_tears_down() {
    let f = EtcdFleet::cluster(3).unwrap();
    let mut addrs: Vec<_> = f.nodes.iter().map(|n| n.addr()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 3);
    assert_eq!(f.endpoints().len(), 3);
    let leader = f.leader().unwrap();
    f.kill(leader).unwrap();
    let next = f.leader().unwrap();
    assert_ne!(next, leader, "a killed leader cannot lead");
    f.restart(leader).unwrap();
    assert!(f.nodes[leader].is_running());
    let follower = (0..3).find(|&i| i != f.leader().unwrap()).unwrap();
    let t0 = Instant::now();
    f.stop(follower).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "stop took {:?}",
        t0.elapsed()
    );
    assert!(!f.nodes[follower].is_running());
    f.leader().unwrap();
    let pids: Vec<i32> = f.nodes.iter().filter_map(|n| n.pid()).collect();
    let dir = f.dir().to_path_buf();
    drop(f);
    for p in pids {
        assert!(!alive(p), "etcd {p} survived the fleet's drop");
    }
    assert!(processes_in(&dir).is_empty());
}

#[test]
fn missing_etcd_names_its_package() {
    let e = fleet::find_binary("etcd-not-here", "etcd-server", &[]).unwrap_err();
    assert!(e.to_string().contains("apt-get install etcd-server"), "{e}");
}

/// The failover fault's drill: the replica lags (paused) while a write
/// lands on the primary alone, the primary is killed, the sentinels
/// promote the replica without that write; the killed node rejoins.
#[test]
fn sentinel_promotes_a_lagging_replica_after_the_primary_dies() {
    let f = SentinelFleet::start().unwrap();
    let t0 = std::time::Instant::now();
    let (killed, promoted) = f
        .kill_primary_lagging(
            Duration::from_millis(500),
            || {
                let c = redis::Client::open(f.primary.url()).unwrap();
                let mut con = c.get_connection().unwrap();
                let _: () = redis::cmd("SET")
                    .arg("only-on-primary")
                    .arg(1)
                    .query(&mut con)
                    .unwrap();
            },
            Duration::from_secs(30),
        )
        .unwrap();
    eprintln!("promoted {promoted} in {:?}", t0.elapsed());
    assert_eq!(killed, f.primary.host_port());
    assert_eq!(promoted, f.replica.host_port());
    let c = redis::Client::open(f.replica.url()).unwrap();
    let mut con = c.get_connection().unwrap();
    let lost: Option<i64> = redis::cmd("GET")
        .arg("only-on-primary")
        .query(&mut con)
        .unwrap();
    assert_eq!(lost, None, "the lagging replica had the write");
    f.rejoin(&killed, Duration::from_secs(30)).unwrap();
    assert_eq!(f.roles().unwrap().0.host_port(), promoted);
}

/// A partition drops what one side's processes send to the other side's
/// addresses, on connections opened before the cut too, and heals.
#[test]
fn partition_cuts_existing_and_new_connections_and_heals() {
    let f = RedisFleet::independent(2).unwrap();
    let open = |n: &fleet::Node| {
        let c = redis::Client::open(n.url()).unwrap();
        let con = c
            .get_connection_with_timeout(Duration::from_millis(500))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        con
    };
    let mut before = open(&f.nodes[1]);
    let ping = |con: &mut redis::Connection| redis::cmd("PING").query::<String>(con).is_ok();
    assert!(ping(&mut before));
    // What a run killed outright mid-cut leaves: its table and class,
    // named by a pid no process has now. The next cut removes them.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let orphan = format!("lockbench_{dead}_7");
    let made = std::process::Command::new("nft")
        .args(["add", "table", "inet", &orphan])
        .status()
        .unwrap();
    assert!(made.success());
    let orphan_class = std::path::Path::new("/sys/fs/cgroup/net_cls").join(format!("{orphan}_0"));
    let me = i32::try_from(std::process::id()).unwrap();
    let mut p = match fleet::Partition::cut(&[
        fleet::Side {
            name: "this test".into(),
            pids: vec![me],
            addrs: Vec::new(),
        },
        fleet::Side {
            name: "redis-1".into(),
            pids: Vec::new(),
            addrs: vec![f.nodes[1].addr()],
        },
    ]) {
        Ok(p) => p,
        Err(e) => panic!("partition not possible here: {e}"),
    };
    // (The class dir can only be made once the cut mounted net_cls: made
    // now, it is swept by a second cut below.)
    std::fs::create_dir_all(&orphan_class).unwrap();
    assert!(
        !ping(&mut before),
        "an existing connection still got through"
    );
    let c = redis::Client::open(f.nodes[1].url()).unwrap();
    assert!(
        c.get_connection_with_timeout(Duration::from_millis(300))
            .is_err(),
        "a new connection got through"
    );
    // The other node is not cut.
    assert!(ping(&mut open(&f.nodes[0])));
    p.heal().unwrap();
    assert!(ping(&mut open(&f.nodes[1])));
    let mut again = fleet::Partition::cut(&[fleet::Side {
        name: "nobody".into(),
        pids: Vec::new(),
        addrs: vec![f.nodes[1].addr()],
    }])
    .unwrap();
    again.heal().unwrap();
    assert!(!orphan_class.exists(), "an orphaned class was left");
    // No rule left behind.
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&tables.stdout).contains("lockbench_"),
        "{}",
        String::from_utf8_lossy(&tables.stdout)
    );
}

/// A PostgreSQL killed with sessions open restarts at once: its backends
/// leave the postmaster's process group (`setsid`), so the kill must find
/// and wait for them too, or the new postmaster meets their shared memory
/// ("pre-existing shared memory block is still in use"; CI saw it).
#[test]
fn a_killed_postgres_with_open_sessions_restarts_at_once() {
    let pg = PostgresFleet::start().unwrap();
    for round in 0..5 {
        // Sessions that are busy in the server when it is killed.
        let mut sessions: Vec<std::process::Child> = (0..3)
            .map(|_| {
                std::process::Command::new("psql")
                    .args([pg.url().as_str(), "-qAt", "-c", "SELECT pg_sleep(30)"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let t0 = std::time::Instant::now();
        while pg
            .psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'")
            .unwrap()
            != "3"
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "round {round}: sessions did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        pg.node
            .restart()
            .unwrap_or_else(|e| panic!("round {round}: restart with sessions open: {e}"));
        assert_eq!(pg.psql("SELECT 1").unwrap(), "1", "round {round}");
        for s in &mut sessions {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

/// A pause stops the whole server, the sessions' backends included: they
/// leave the postmaster's group (`setsid`), and a pause of the group alone
/// left every open session serving (a `node-pause` of pg-* measured
/// nothing: the run went on at full speed).
#[test]
fn a_paused_postgres_stops_its_open_sessions_too() {
    let pg = PostgresFleet::start().unwrap();
    let mut session = std::process::Command::new("psql")
        .args([pg.url().as_str(), "-qAt", "-c", "SELECT pg_sleep(30)"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while pg
        .psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'")
        .unwrap()
        != "1"
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "no session");
        std::thread::sleep(Duration::from_millis(20));
    }
    pg.node.pause().unwrap();
    let procs = pg.node.processes();
    assert!(
        procs.len() > 1,
        "no backend found beside the postmaster: {procs:?}"
    );
    for p in &procs {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let state = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
        assert!(
            state == "T" || state == "Z",
            "process {p} of the paused server is {state:?}: {stat}"
        );
    }
    pg.node.resume().unwrap();
    assert_eq!(pg.psql("SELECT 1").unwrap(), "1");
    let _ = session.kill();
    let _ = session.wait();
}
