//! Redis topologies: one node, N independent masters, primary + replica +
//! 3 sentinels.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::node::{start_on_free_port, Node, NodeSpec};
use crate::{find_binary, fleet_dir, loopback_addr, FleetError, Result};

fn query(node: &Node, cmd: &redis::Cmd) -> std::result::Result<redis::Value, String> {
    let client = redis::Client::open(node.url()).map_err(|e| e.to_string())?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .map_err(|e| e.to_string())?;
    con.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    cmd.query(&mut con).map_err(|e| e.to_string())
}

fn query_string(node: &Node, cmd: &redis::Cmd) -> std::result::Result<String, String> {
    match query(node, cmd)? {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => Ok(s),
        v => Ok(format!("{v:?}")),
    }
}

fn ping(node: &Node) -> std::result::Result<(), String> {
    query(node, &redis::cmd("PING")).map(|_| ())
}

fn replica_synced(node: &Node) -> std::result::Result<(), String> {
    let info = query_string(node, redis::cmd("INFO").arg("replication"))?;
    if info.contains("master_link_status:up") {
        Ok(())
    } else {
        Err("replica not yet in sync with its primary".into())
    }
}

fn sentinel_ready(node: &Node) -> std::result::Result<(), String> {
    let v = query(
        node,
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME),
    )?;
    if !matches!(&v, redis::Value::Array(a) if a.len() == 2) {
        return Err(format!("sentinel does not know its master yet: {v:?}"));
    }
    // A failover needs a replica the sentinel has seen.
    match query(
        node,
        redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME),
    )? {
        redis::Value::Array(a) if !a.is_empty() => Ok(()),
        _ => Err("sentinel has not discovered the replica yet".into()),
    }
}

fn wait_for(
    node: &Node,
    limit: Duration,
    probe: impl Fn(&Node) -> std::result::Result<(), String>,
) -> Result<()> {
    let t0 = Instant::now();
    loop {
        match probe(node) {
            Ok(()) => return Ok(()),
            Err(e) if t0.elapsed() >= limit => {
                return Err(FleetError::NotReady {
                    node: node.name().to_string(),
                    secs: t0.elapsed().as_secs_f64(),
                    reason: e,
                    log: node.dir().join("server.log").display().to_string(),
                    tail: node.log_tail(15),
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "lockbench";

fn redis_spec(
    name: String,
    dir: PathBuf,
    addr: Ipv4Addr,
    port: u16,
    extra: &[String],
) -> Result<NodeSpec> {
    std::fs::create_dir_all(&dir).map_err(FleetError::io(format!("creating {}", dir.display())))?;
    let mut args: Vec<String> = [
        "--bind",
        &addr.to_string(),
        "--port",
        &port.to_string(),
        "--dir",
        &dir.display().to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
        "--logfile",
        "",
        // Without these a replica's first sync waits 5 s for more replicas.
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
        // The primary would otherwise record the replica under its source
        // address (127.0.0.1), where nothing listens, and sentinels could
        // never promote it.
        "--replica-announce-ip",
        &addr.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().cloned());
    Ok(NodeSpec {
        name,
        program: find_binary("redis-server", "redis-server", &[])?,
        args,
        env: Vec::new(),
        dir,
        addr,
        port,
        run_as: None,
        ready: ping,
        ready_within: Duration::from_secs(10),
        clock_file: None,
    })
}

/// One or more independent Redis masters.
#[derive(Debug)]
pub struct RedisFleet {
    /// The nodes, each on its own loopback address.
    pub nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl RedisFleet {
    /// One Redis node.
    ///
    /// # Errors
    /// Missing `redis-server`, no free port, or a node that never answers PING.
    pub fn single() -> Result<Self> {
        Self::independent(1)
    }

    /// `n` independent masters (RedLock's topology).
    ///
    /// # Errors
    /// As for [`RedisFleet::single`].
    pub fn independent(n: usize) -> Result<Self> {
        Self::independent_with_fake_clocks(n, &[])
    }

    /// `n` independent masters; those listed in `fake_clocks` run under
    /// libfaketime, their clocks moved with [`Node::set_clock`] (the clock
    /// fault: a node whose TTLs run fast or jump).
    ///
    /// # Errors
    /// As for [`RedisFleet::single`], plus missing `gcc` or `faketime`.
    pub fn independent_with_fake_clocks(n: usize, fake_clocks: &[usize]) -> Result<Self> {
        let dir = fleet_dir("redis")?;
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let node_dir = dir.path().join(format!("redis-{i}"));
            let addr = loopback_addr();
            let env = if fake_clocks.contains(&i) {
                std::fs::create_dir_all(&node_dir).map_err(FleetError::io("creating node dir"))?;
                let clock = node_dir.join("faketime.rc");
                Some((crate::faketime::env(dir.path(), &clock)?, clock))
            } else {
                None
            };
            nodes.push(start_on_free_port(addr, |port| {
                let mut spec = redis_spec(format!("redis-{i}"), node_dir.clone(), addr, port, &[])?;
                if let Some((env, clock)) = &env {
                    spec.env = env.clone();
                    spec.clock_file = Some(clock.clone());
                }
                Ok(spec)
            })?);
        }
        Ok(Self { nodes, dir })
    }

    /// The fleet's temp dir.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `redis://addr:port` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }
}

/// A primary, one replica and three sentinels watching them.
#[derive(Debug)]
pub struct SentinelFleet {
    /// The three sentinels (declared first: they go down first).
    pub sentinels: Vec<Node>,
    /// The replica.
    pub replica: Node,
    /// The initial primary.
    pub primary: Node,
    _dir: tempfile::TempDir,
}

impl SentinelFleet {
    /// Starts primary, then replica (once the primary listens), then three
    /// sentinels, each on its own loopback address.
    ///
    /// # Errors
    /// Missing binaries (`redis-server`, `redis-sentinel`), or a node that
    /// never becomes ready (the replica must report its link up).
    pub fn start() -> Result<Self> {
        let dir = fleet_dir("sentinel")?;
        let p_addr = loopback_addr();
        let primary = start_on_free_port(p_addr, |port| {
            redis_spec(
                "primary".into(),
                dir.path().join("primary"),
                p_addr,
                port,
                &[],
            )
        })?;
        let r_addr = loopback_addr();
        let replicaof = vec![
            "--replicaof".to_string(),
            p_addr.to_string(),
            primary.port().to_string(),
        ];
        let replica = start_on_free_port(r_addr, |port| {
            let mut spec = redis_spec(
                "replica".into(),
                dir.path().join("replica"),
                r_addr,
                port,
                &replicaof,
            )?;
            spec.ready = replica_synced;
            Ok(spec)
        })?;
        // With diskless sync the primary streams to the replica (and counts it
        // for WAIT) only after its first REPLCONF ACK, up to a second after the
        // replica reports the link up: wait until a write is acknowledged.
        wait_for(&primary, Duration::from_secs(10), |p| {
            let client = redis::Client::open(p.url()).map_err(|e| e.to_string())?;
            let mut con = client
                .get_connection_with_timeout(Duration::from_millis(300))
                .map_err(|e| e.to_string())?;
            let acked: i64 = redis::pipe()
                .cmd("SET")
                .arg("lockbench:fleet:ready")
                .arg(1)
                .ignore()
                .cmd("WAIT")
                .arg(1)
                .arg(100)
                .query::<(i64,)>(&mut con)
                .map(|(n,)| n)
                .map_err(|e| e.to_string())?;
            if acked >= 1 {
                Ok(())
            } else {
                Err("the replica does not acknowledge writes yet".into())
            }
        })?;
        let sentinel_bin = find_binary("redis-sentinel", "redis-sentinel", &[])?;
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let addr = loopback_addr();
            let sdir = dir.path().join(format!("sentinel-{i}"));
            sentinels.push(start_on_free_port(addr, |port| {
                std::fs::create_dir_all(&sdir).map_err(FleetError::io("creating sentinel dir"))?;
                // Sentinel rewrites its config file, so it must be writable.
                let conf = sdir.join("sentinel.conf");
                let text = format!(
                    "port {port}\nbind {addr}\ndir {}\nprotected-mode no\n\
                     sentinel monitor {MASTER_NAME} {p_addr} {} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    sdir.display(),
                    primary.port()
                );
                std::fs::write(&conf, text).map_err(FleetError::io("writing sentinel.conf"))?;
                Ok(NodeSpec {
                    name: format!("sentinel-{i}"),
                    program: sentinel_bin.clone(),
                    args: vec![conf.display().to_string()],
                    env: Vec::new(),
                    dir: sdir.clone(),
                    addr,
                    port,
                    run_as: None,
                    ready: sentinel_ready,
                    ready_within: Duration::from_secs(10),
                    clock_file: None,
                })
            })?);
        }
        Ok(Self {
            sentinels,
            replica,
            primary,
            _dir: dir,
        })
    }

    /// The master address the sentinels currently report.
    ///
    /// # Errors
    /// If no sentinel answers.
    pub fn current_master(&self) -> Result<String> {
        let mut last = String::new();
        for s in &self.sentinels {
            match query(
                s,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME),
            ) {
                Ok(redis::Value::Array(a)) if a.len() == 2 => {
                    let parts: Vec<String> = a
                        .iter()
                        .map(|v| match v {
                            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                            v => format!("{v:?}"),
                        })
                        .collect();
                    return Ok(format!("{}:{}", parts[0], parts[1]));
                }
                Ok(v) => last = format!("{v:?}"),
                Err(e) => last = e,
            }
        }
        Err(FleetError::Control {
            node: "sentinels".into(),
            op: "get-master-addr-by-name",
            message: last,
        })
    }

    /// Forces a failover through a sentinel and waits (up to `limit`) until
    /// the sentinels report a new master. Returns the new master `addr:port`.
    ///
    /// # Errors
    /// If the failover is refused or does not complete in time.
    pub fn failover(&self, limit: Duration) -> Result<String> {
        let before = self.current_master()?;
        let t0 = Instant::now();
        let mut last = String::new();
        while t0.elapsed() < limit {
            // Refused while the sentinel has not yet discovered the replica.
            match query(
                &self.sentinels[0],
                redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
            ) {
                Ok(_) => break,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        while t0.elapsed() < limit {
            let now = self.current_master()?;
            if now != before {
                return Ok(now);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(FleetError::Control {
            node: "sentinels".into(),
            op: "failover",
            message: format!("master still {before} after {limit:?} ({last})"),
        })
    }
}
