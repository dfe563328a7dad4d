//! Durability profiles against the real servers: each setting is read back
//! from the running server (or from what it counts), not from our own
//! command line alone.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use fleet::{
    Durability, EtcdFleet, Node, PostgresFleet, RedisClusterFleet, RedisFleet, SentinelFleet,
    ServerKind, ZkFleet,
};

fn redis_con(node: &Node) -> redis::Connection {
    let c = redis::Client::open(node.url()).unwrap();
    let con = c
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    con
}

fn redis_config(node: &Node, key: &str) -> String {
    let (_, v): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg(key)
        .query(&mut redis_con(node))
        .unwrap();
    v
}

fn redis_get(node: &Node, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut redis_con(node))
        .unwrap()
}

#[test]
fn redis_durable_fsyncs_an_aof_and_survives_kill_9() {
    let f = RedisFleet::single_with(Durability::Durable).unwrap();
    let n = &f.nodes[0];
    assert_eq!(redis_config(n, "appendonly"), "yes");
    assert_eq!(redis_config(n, "appendfsync"), "always");
    assert_eq!(redis_config(n, "save"), "");
    assert_eq!(
        redis_config(n, "dir"),
        n.dir().canonicalize().unwrap().display().to_string()
    );
    let d = n.durability().unwrap();
    assert_eq!(
        (d.kind, d.profile),
        (ServerKind::Redis, Durability::Durable)
    );
    assert!(d.flags.windows(2).any(|w| w == ["--appendfsync", "always"]));

    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut redis_con(n))
        .unwrap();
    // The AOF lives in the node's own dir, and the write is in it.
    let aof: Vec<_> = std::fs::read_dir(n.dir().join("appendonlydir"))
        .unwrap()
        .flatten()
        .collect();
    assert!(!aof.is_empty(), "no append-only file in the node's dir");
    n.kill().unwrap();
    n.restart().unwrap();
    assert_eq!(redis_get(n, "k").as_deref(), Some("v"), "lost on kill -9");
}

#[test]
fn redis_volatile_and_the_old_constructor_keep_nothing() {
    let old = RedisFleet::single().unwrap();
    let new = RedisFleet::single_with(Durability::Volatile).unwrap();
    for n in [&old.nodes[0], &new.nodes[0]] {
        assert_eq!(redis_config(n, "appendonly"), "no");
        assert_eq!(redis_config(n, "save"), "");
        let d = n.durability().unwrap();
        assert_eq!(d.profile, Durability::Volatile);
        assert_eq!(d.flags, ["--save", "", "--appendonly", "no"]);
    }
    let n = &new.nodes[0];
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut redis_con(n))
        .unwrap();
    n.kill().unwrap();
    n.restart().unwrap();
    assert_eq!(
        redis_get(n, "k"),
        None,
        "a volatile node came back with data"
    );
}

/// Replication with an AOF on each side still forms (the replica rewrites
/// its AOF after the diskless sync), and every data node is durable; the
/// sentinels keep no data and say so.
#[test]
fn replicated_redis_topologies_start_durable() {
    let s = SentinelFleet::start_with(Durability::Durable).unwrap();
    for n in [&s.primary, &s.replica] {
        assert_eq!(redis_config(n, "appendfsync"), "always", "{}", n.name());
        assert_eq!(redis_config(n, "appendonly"), "yes", "{}", n.name());
    }
    assert!(s.sentinels.iter().all(|n| n.durability().is_none()));
    drop(s);
    let c = RedisClusterFleet::start_with(3, 1, Durability::Durable).unwrap();
    for n in c.nodes() {
        assert_eq!(redis_config(n, "appendonly"), "yes", "{}", n.name());
        assert_eq!(n.durability().unwrap().profile, Durability::Durable);
    }
}

#[test]
fn postgres_volatile_turns_off_synchronous_commit_only() {
    let durable = PostgresFleet::start_with(Durability::Durable).unwrap();
    let volatile = PostgresFleet::start_with(Durability::Volatile).unwrap();
    let old = PostgresFleet::start().unwrap();
    for (f, want) in [(&durable, "on"), (&volatile, "off"), (&old, "on")] {
        assert_eq!(f.psql("SHOW synchronous_commit").unwrap(), want);
        assert_eq!(f.psql("SHOW fsync").unwrap(), "on");
    }
    assert_eq!(
        volatile.node.durability().unwrap().flags,
        ["-c", "synchronous_commit=off"]
    );
    assert!(durable.node.durability().unwrap().flags.is_empty());
    assert_eq!(old.node.durability().unwrap().profile, Durability::Durable);
}

fn cmdline(node: &Node) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{}/cmdline", node.pid().unwrap())).unwrap();
    raw.split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// One HTTP/1.0 request; the reply's body.
fn http(node: &Node, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((node.addr(), node.port())),
        Duration::from_secs(2),
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    body.to_string()
}

/// etcd's count of WAL fsyncs (`etcd_disk_wal_fsync_duration_seconds`).
fn wal_fsyncs(node: &Node) -> u64 {
    let metrics = http(node, "GET", "/metrics", "");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_disk_wal_fsync_duration_seconds_count "))
        .unwrap_or_else(|| panic!("no WAL fsync count in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn etcd_volatile_fsyncs_no_write_to_its_wal() {
    let durable = EtcdFleet::single_with(Durability::Durable).unwrap();
    let volatile = EtcdFleet::single_with(Durability::Volatile).unwrap();
    let old = EtcdFleet::single().unwrap();
    for (f, no_fsync) in [(&durable, false), (&volatile, true), (&old, false)] {
        let n = &f.nodes[0];
        assert_eq!(
            cmdline(n).iter().any(|a| a == "--unsafe-no-fsync"),
            no_fsync
        );
        // Counted from here: 3.4 sets its no-fsync switch only once the
        // WAL is open, so a volatile node's bootstrap entries were synced.
        let before = wal_fsyncs(n);
        // Writes: each is a raft entry the WAL must hold before commit.
        for i in 0..5 {
            // {"key": "lockbench/<i>", "value": "v"}, base64.
            let key = ["bG9ja2JlbmNoLzA=", "bG9ja2JlbmNoLzE=", "bG9ja2JlbmNoLzI="][i % 3];
            http(
                n,
                "POST",
                "/v3/kv/put",
                &format!(r#"{{"key":"{key}","value":"dg=="}}"#),
            );
        }
        let fsyncs = wal_fsyncs(n) - before;
        if no_fsync {
            assert_eq!(fsyncs, 0, "a volatile etcd fsynced its WAL for a write");
        } else {
            assert!(
                fsyncs >= 5,
                "a durable etcd fsynced its WAL {fsyncs} times for 5 writes"
            );
        }
    }
    assert_eq!(
        volatile.nodes[0].durability().unwrap().flags,
        ["--unsafe-no-fsync"]
    );
}

/// Opens (and so creates, through the transaction log) one ZooKeeper
/// session with a raw ConnectRequest, and waits for the server's answer.
fn zk_create_session(node: &Node) {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((node.addr(), node.port())),
        Duration::from_secs(2),
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = Vec::new();
    req.extend(0i32.to_be_bytes()); // protocol version
    req.extend(0i64.to_be_bytes()); // last zxid seen
    req.extend(4000i32.to_be_bytes()); // session timeout, ms
    req.extend(0i64.to_be_bytes()); // session id: a new one
    req.extend(16i32.to_be_bytes()); // password: 16 zero bytes
    req.extend([0u8; 16]);
    req.push(0); // not read-only
    let len = i32::try_from(req.len()).unwrap();
    s.write_all(&len.to_be_bytes()).unwrap();
    s.write_all(&req).unwrap();
    let mut reply_len = [0u8; 4];
    s.read_exact(&mut reply_len).unwrap();
    let mut reply = vec![0u8; usize::try_from(i32::from_be_bytes(reply_len)).unwrap()];
    s.read_exact(&mut reply).unwrap();
    // protocol version, timeout, then the session id: non-zero = created.
    let id = i64::from_be_bytes(reply[8..16].try_into().unwrap());
    assert_ne!(id, 0, "session refused");
}

/// `mntr`'s count of transaction-log fsyncs.
fn zk_fsyncs(node: &Node) -> u64 {
    let out = fleet::four_letter_word(node.addr(), node.port(), "mntr").unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix("zk_cnt_fsynctime"))
        .unwrap_or_else(|| panic!("no fsync count in mntr:\n{out}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn zookeeper_volatile_never_fsyncs_its_transaction_log() {
    let durable = ZkFleet::standalone_with(Durability::Durable).unwrap();
    let volatile = ZkFleet::standalone_with(Durability::Volatile).unwrap();
    for (f, force_sync) in [(&durable, true), (&volatile, false)] {
        let n = &f.nodes[0];
        let cfg = std::fs::read_to_string(n.dir().join("zoo.cfg")).unwrap();
        assert_eq!(cfg.contains("forceSync=no"), !force_sync, "{cfg}");
        for _ in 0..3 {
            zk_create_session(n);
        }
        let fsyncs = zk_fsyncs(n);
        if force_sync {
            assert!(fsyncs >= 3, "durable: {fsyncs} fsyncs for 3 sessions");
        } else {
            assert_eq!(fsyncs, 0, "volatile: the transaction log was fsynced");
        }
    }
    assert_eq!(
        volatile.nodes[0].durability().unwrap().flags,
        ["forceSync=no"]
    );
}
