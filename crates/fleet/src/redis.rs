//! Redis topologies: one node, N independent masters, primary + replica +
//! 3 sentinels, and a Redis Cluster (masters sharing the slots, each with
//! its replicas).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::node::{start_on_free_port, Node, NodeSpec};
use crate::process::{self, SpawnSpec};
use crate::{
    find_binary, fleet_dir, loopback_addr, Durability, DurabilitySettings, FleetError, Result,
    ServerKind,
};

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

/// Closes `primary`'s links to its replicas (paused by the caller, so they
/// cannot reconnect): what it writes from now on stays on it. A paused
/// replica alone is not lag: the primary's stream would wait in the
/// replica's socket buffer and be read on SIGCONT.
fn cut_replication(primary: &Node) -> Result<()> {
    query(
        primary,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
    )
    .map(|_| ())
    .map_err(|message| FleetError::Control {
        node: primary.name().to_string(),
        op: "CLIENT KILL TYPE replica",
        message,
    })
}

/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "lockbench";

/// What `--dir` holds and how often it is fsynced, per profile. RDB
/// snapshots stay off in both: the AOF is what a durable node reloads, and
/// a snapshot's fork would land in the middle of a latency run.
fn redis_durability(durability: Durability) -> DurabilitySettings {
    let (flags, note): (&[&str], _) = match durability {
        Durability::Durable => (
            &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            "append-only file in the node's own dir (appendonlydir/), fsynced before \
             every reply to a write; no RDB snapshots",
        ),
        Durability::Volatile => (
            &["--save", "", "--appendonly", "no"],
            "no persistence: a restart comes back empty",
        ),
    };
    DurabilitySettings {
        kind: ServerKind::Redis,
        profile: durability,
        flags: flags.iter().map(|s| s.to_string()).collect(),
        note,
    }
}

fn redis_spec(
    name: String,
    dir: PathBuf,
    addr: Ipv4Addr,
    port: u16,
    extra: &[String],
    durability: Durability,
) -> Result<NodeSpec> {
    std::fs::create_dir_all(&dir).map_err(FleetError::io(format!("creating {}", dir.display())))?;
    let mut args: Vec<String> = [
        "--bind",
        &addr.to_string(),
        "--port",
        &port.to_string(),
        "--dir",
        &dir.display().to_string(),
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
    let durability = redis_durability(durability);
    args.extend(durability.flags.iter().cloned());
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
        durability: Some(durability),
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
    /// One Redis node without persistence ([`Durability::Volatile`], as
    /// this constructor always started it).
    ///
    /// # Errors
    /// Missing `redis-server`, no free port, or a node that never answers PING.
    pub fn single() -> Result<Self> {
        Self::single_with(Durability::Volatile)
    }

    /// One Redis node in the given durability profile.
    ///
    /// # Errors
    /// As for [`RedisFleet::single`].
    pub fn single_with(durability: Durability) -> Result<Self> {
        Self::start_with(1, &[], durability)
    }

    /// `n` independent masters (RedLock's topology), without persistence.
    ///
    /// # Errors
    /// As for [`RedisFleet::single`].
    pub fn independent(n: usize) -> Result<Self> {
        Self::independent_with(n, Durability::Volatile)
    }

    /// `n` independent masters in the given durability profile.
    ///
    /// # Errors
    /// As for [`RedisFleet::single`].
    pub fn independent_with(n: usize, durability: Durability) -> Result<Self> {
        Self::start_with(n, &[], durability)
    }

    /// `n` independent masters without persistence; those listed in
    /// `fake_clocks` run under libfaketime, their clocks moved with
    /// [`Node::set_clock`] (the clock fault: a node whose TTLs run fast or
    /// jump).
    ///
    /// # Errors
    /// As for [`RedisFleet::single`], plus missing `gcc` or `faketime`.
    pub fn independent_with_fake_clocks(n: usize, fake_clocks: &[usize]) -> Result<Self> {
        Self::start_with(n, fake_clocks, Durability::Volatile)
    }

    /// `n` independent masters in the given durability profile, those in
    /// `fake_clocks` under libfaketime (see
    /// [`RedisFleet::independent_with_fake_clocks`]).
    ///
    /// # Errors
    /// As for [`RedisFleet::independent_with_fake_clocks`].
    pub fn start_with(n: usize, fake_clocks: &[usize], durability: Durability) -> Result<Self> {
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
                let mut spec = redis_spec(
                    format!("redis-{i}"),
                    node_dir.clone(),
                    addr,
                    port,
                    &[],
                    durability,
                )?;
                if let Some((env, clock)) = &env {
                    spec.env = env.clone();
                    spec.clock_file = Some(clock.clone());
                }
                Ok(spec)
            })?);
        }
        Ok(Self { nodes, dir })
    }

    /// One Redis node that also serves TLS, with a certificate for its
    /// address signed by a CA made for it (see [`crate::make_certs`]; the
    /// plain port stays for readiness and the fleet's own probes). Returns
    /// the fleet, its `rediss://addr:tls_port` URL and the certificates.
    ///
    /// # Errors
    /// As for [`RedisFleet::single`], plus a missing `openssl` or no free
    /// second port.
    pub fn single_tls() -> Result<(Self, String, crate::TestCerts)> {
        let dir = fleet_dir("redis-tls")?;
        let node_dir = dir.path().join("redis-0");
        let addr = loopback_addr();
        let certs = crate::make_certs(&dir.path().join("tls"), addr)?;
        let tls_port = std::cell::Cell::new(0u16);
        let node = start_on_free_port(addr, |port| {
            tls_port.set(crate::PortAllocator::free_port(addr)?);
            let extra: Vec<String> = [
                "--tls-port",
                &tls_port.get().to_string(),
                "--tls-cert-file",
                &certs.cert.display().to_string(),
                "--tls-key-file",
                &certs.key.display().to_string(),
                "--tls-ca-cert-file",
                &certs.ca.display().to_string(),
                // Clients verify the server; the server asks no client
                // certificate (as a managed Redis with TLS usually does).
                "--tls-auth-clients",
                "no",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            redis_spec(
                "redis-tls".into(),
                node_dir.clone(),
                addr,
                port,
                &extra,
                Durability::Volatile,
            )
        })?;
        let url = format!("rediss://{addr}:{}", tls_port.get());
        Ok((
            Self {
                nodes: vec![node],
                dir,
            },
            url,
            certs,
        ))
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
    /// sentinels, each on its own loopback address; primary and replica
    /// without persistence ([`Durability::Volatile`], as always).
    ///
    /// # Errors
    /// Missing binaries (`redis-server`, `redis-sentinel`), or a node that
    /// never becomes ready (the replica must report its link up).
    pub fn start() -> Result<Self> {
        Self::start_with(Durability::Volatile)
    }

    /// [`SentinelFleet::start`] with primary and replica in the given
    /// durability profile (the sentinels keep no data).
    ///
    /// # Errors
    /// As for [`SentinelFleet::start`].
    pub fn start_with(durability: Durability) -> Result<Self> {
        let dir = fleet_dir("sentinel")?;
        let p_addr = loopback_addr();
        let primary = start_on_free_port(p_addr, |port| {
            redis_spec(
                "primary".into(),
                dir.path().join("primary"),
                p_addr,
                port,
                &[],
                durability,
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
                durability,
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
                    // announce-ip: its hello messages would otherwise give
                    // 127.0.0.1 (the source of its link to the primary),
                    // where it does not listen, and the sentinels could
                    // never vote each other into a failover.
                    "port {port}\nbind {addr}\nsentinel announce-ip {addr}\ndir {}\nprotected-mode no\n\
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
                    durability: None,
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

    /// The node the sentinels name as primary now, and the other one.
    ///
    /// # Errors
    /// If no sentinel answers, or it names neither of our nodes.
    pub fn roles(&self) -> Result<(&Node, &Node)> {
        let now = self.current_master()?;
        if now == self.primary.host_port() {
            Ok((&self.primary, &self.replica))
        } else if now == self.replica.host_port() {
            Ok((&self.replica, &self.primary))
        } else {
            Err(FleetError::Control {
                node: "sentinels".into(),
                op: "roles",
                message: format!("the sentinels name {now}, which is not ours"),
            })
        }
    }

    /// The seeds' drill with the replica lagging: SIGSTOP the replica, run
    /// `while_lagging` (the caller waits for a write it will never see),
    /// wait `lag`, kill -9 the primary, SIGCONT the replica, and wait (up
    /// to `limit`) until the sentinels promote it. Returns (the killed
    /// node's `host:port`, the new primary's).
    ///
    /// # Errors
    /// A signal failing, or no promotion within `limit`.
    pub fn kill_primary_lagging(
        &self,
        lag: Duration,
        while_lagging: impl FnOnce(),
        limit: Duration,
    ) -> Result<(String, String)> {
        let (primary, replica) = self.roles()?;
        let old = primary.host_port();
        replica.pause()?;
        cut_replication(primary)?;
        while_lagging();
        std::thread::sleep(lag);
        let killed = primary.kill();
        replica.resume()?;
        killed?;
        let t0 = Instant::now();
        let mut last = String::new();
        while t0.elapsed() < limit {
            match self.current_master() {
                Ok(now) if now != old => return Ok((old, now)),
                Ok(now) => last = format!("still {now}"),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(FleetError::Control {
            node: "sentinels".into(),
            op: "kill_primary_lagging",
            message: format!("no promotion within {limit:?}: {last}"),
        })
    }

    /// Restarts the node at `host_port` (a killed primary) and waits until
    /// it follows the new primary as a synced replica, ready for the next
    /// failover.
    ///
    /// # Errors
    /// Not one of ours, a failed start, or not in sync within `limit`.
    pub fn rejoin(&self, host_port: &str, limit: Duration) -> Result<()> {
        let node = [&self.primary, &self.replica]
            .into_iter()
            .find(|n| n.host_port() == host_port)
            .ok_or_else(|| FleetError::Control {
                node: host_port.to_string(),
                op: "rejoin",
                message: "not a node of this sentinel set".into(),
            })?;
        node.restart()?;
        // It comes back as a primary (with no data unless durable, and then
        // with writes the new primary may not have); a sentinel would turn it
        // into a replica of the new one within about 10 s. Do what the
        // sentinel would, now.
        let now = self.current_master()?;
        let (host, port) = now.rsplit_once(':').unwrap_or((now.as_str(), ""));
        query(node, redis::cmd("REPLICAOF").arg(host).arg(port)).map_err(|message| {
            FleetError::Control {
                node: node.name().to_string(),
                op: "REPLICAOF",
                message,
            }
        })?;
        wait_for(node, limit, replica_synced)
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

/// The text of a bulk or verbatim string reply element (ip, id, ...).
fn value_text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => {
            Some(s.clone())
        }
        _ => None,
    }
}

/// One `key:value` line of an INFO-style reply (`INFO`, `CLUSTER INFO`).
fn info_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// A slot range and the `host:port` of the master serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotRange {
    start: u16,
    end: u16,
    master: String,
}

/// `CLUSTER SLOTS` as `node` sees it. (`CLUSTER SLOTS` is deprecated in 7.0
/// in favour of `CLUSTER SHARDS`, but its reply is flat and positional,
/// where SHARDS' nested maps differ between RESP2 and RESP3.)
fn cluster_slots(node: &Node) -> std::result::Result<Vec<SlotRange>, String> {
    let v = query(node, redis::cmd("CLUSTER").arg("SLOTS"))?;
    let redis::Value::Array(ranges) = v else {
        return Err(format!("CLUSTER SLOTS: unexpected reply {v:?}"));
    };
    ranges
        .iter()
        .map(|r| match r {
            redis::Value::Array(parts) => match parts.as_slice() {
                [redis::Value::Int(s), redis::Value::Int(e), redis::Value::Array(m), ..] => {
                    let (start, end) = (u16::try_from(*s), u16::try_from(*e));
                    match (start, end, m.as_slice()) {
                        (Ok(start), Ok(end), [ip, redis::Value::Int(port), ..]) => {
                            let ip = value_text(ip)
                                .ok_or_else(|| format!("CLUSTER SLOTS: bad ip in {r:?}"))?;
                            Ok(SlotRange {
                                start,
                                end,
                                master: format!("{ip}:{port}"),
                            })
                        }
                        _ => Err(format!("CLUSTER SLOTS: bad range {r:?}")),
                    }
                }
                _ => Err(format!("CLUSTER SLOTS: bad range {r:?}")),
            },
            _ => Err(format!("CLUSTER SLOTS: bad range {r:?}")),
        })
        .collect()
}

/// One line of `CLUSTER NODES`: `host:port` (the bus port and hostname
/// after `@` dropped), flags, and the master's id for a replica.
#[derive(Debug)]
struct ClusterNodeLine {
    id: String,
    host_port: String,
    flags: Vec<String>,
    master_id: Option<String>,
}

fn cluster_nodes(node: &Node) -> std::result::Result<Vec<ClusterNodeLine>, String> {
    let text = query_string(node, redis::cmd("CLUSTER").arg("NODES"))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [id, addr, flags, master, ..] => Ok(ClusterNodeLine {
                    id: (*id).to_string(),
                    host_port: addr.split('@').next().unwrap_or(addr).to_string(),
                    flags: flags.split(',').map(str::to_string).collect(),
                    master_id: (*master != "-").then(|| (*master).to_string()),
                }),
                _ => Err(format!("CLUSTER NODES: bad line {l:?}")),
            }
        })
        .collect()
}

/// The first element of `ROLE`: `master`, `slave` (or `sentinel`).
fn role(node: &Node) -> std::result::Result<String, String> {
    match query(node, &redis::cmd("ROLE"))? {
        redis::Value::Array(a) => a
            .first()
            .and_then(value_text)
            .ok_or_else(|| format!("ROLE: unexpected reply {a:?}")),
        v => Err(format!("ROLE: unexpected reply {v:?}")),
    }
}

/// `Ok` once `node` says the cluster is ok, knows all `total` nodes, has
/// `masters` masters serving slots and `replicas` replicas, none of them
/// suspected down or still in handshake.
fn cluster_converged(
    node: &Node,
    total: usize,
    masters: usize,
    replicas: usize,
) -> std::result::Result<(), String> {
    let info = query_string(node, redis::cmd("CLUSTER").arg("INFO"))?;
    let state = info_field(&info, "cluster_state").unwrap_or("?");
    let known = info_field(&info, "cluster_known_nodes").unwrap_or("?");
    let size = info_field(&info, "cluster_size").unwrap_or("?");
    if state != "ok" || known != total.to_string() || size != masters.to_string() {
        return Err(format!(
            "cluster_state:{state} cluster_known_nodes:{known} (want {total}) \
             cluster_size:{size} (want {masters})"
        ));
    }
    let lines = cluster_nodes(node)?;
    let has = |l: &ClusterNodeLine, f: &str| l.flags.iter().any(|x| x == f);
    let unsettled: Vec<&str> = lines
        .iter()
        .filter(|l| {
            ["fail", "fail?", "handshake", "noaddr"]
                .iter()
                .any(|f| has(l, f))
        })
        .map(|l| l.host_port.as_str())
        .collect();
    if !unsettled.is_empty() {
        return Err(format!("nodes not settled yet: {unsettled:?}"));
    }
    let seen = lines.iter().filter(|l| has(l, "slave")).count();
    if seen != replicas {
        return Err(format!("sees {seen} replicas, want {replicas}"));
    }
    Ok(())
}

/// Time left until `deadline` (zero once past it: a probe then runs once).
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A Redis Cluster: `masters` masters sharing the 16384 slots, each with
/// `replicas_per_master` replicas, every node on its own loopback address
/// with its own cluster-bus port.
///
/// `masters` and `replicas` are the roles at start; after
/// [`RedisClusterFleet::failover_master`] ask the cluster
/// ([`RedisClusterFleet::master_of_slot`]) who serves what.
#[derive(Debug)]
pub struct RedisClusterFleet {
    /// The replicas (declared first: they go down first, so none of them
    /// sees its master die and starts an election during teardown).
    pub replicas: Vec<Node>,
    /// The masters, in the order redis-cli was given them.
    pub masters: Vec<Node>,
    _dir: tempfile::TempDir,
}

/// How long forming the cluster may take once redis-cli is done.
const CLUSTER_READY_WITHIN: Duration = Duration::from_secs(20);

impl RedisClusterFleet {
    /// Starts `masters * (1 + replicas_per_master)` cluster-enabled nodes,
    /// forms the cluster with `redis-cli --cluster create`, and waits until
    /// every node reports `cluster_state:ok` and knows every other node,
    /// every replica's link is up, and each master's writes are
    /// acknowledged by a replica.
    ///
    /// Every node runs without persistence ([`Durability::Volatile`], as
    /// always).
    ///
    /// # Errors
    /// Missing `redis-server` or `redis-cli`, fewer than 3 masters (Redis
    /// Cluster's minimum), `redis-cli` failing or taking over 30 s, roles
    /// not as asked, or a cluster not ready within 20 s.
    pub fn start(masters: usize, replicas_per_master: usize) -> Result<Self> {
        Self::start_with(masters, replicas_per_master, Durability::Volatile)
    }

    /// [`RedisClusterFleet::start`] with every node in the given
    /// durability profile.
    ///
    /// # Errors
    /// As for [`RedisClusterFleet::start`].
    pub fn start_with(
        masters: usize,
        replicas_per_master: usize,
        durability: Durability,
    ) -> Result<Self> {
        if masters < 3 {
            // redis-cli refuses fewer: a failover needs a majority of masters.
            return Err(FleetError::Control {
                node: "redis-cluster".into(),
                op: "start",
                message: format!("a Redis Cluster needs at least 3 masters, not {masters}"),
            });
        }
        let cli = find_binary("redis-cli", "redis-tools", &[])?;
        let dir = fleet_dir("redis-cluster")?;
        let total = masters * (1 + replicas_per_master);
        let mut nodes = Vec::with_capacity(total);
        for i in 0..total {
            let name = format!("cluster-{i}");
            let node_dir = dir.path().join(&name);
            let addr = loopback_addr();
            nodes.push(start_on_free_port(addr, |port| {
                // The bus port is picked with the client port, so a retry on
                // a taken port picks a fresh pair.
                let mut bus = crate::PortAllocator::free_port(addr)?;
                while bus == port {
                    bus = crate::PortAllocator::free_port(addr)?;
                }
                let extra: Vec<String> = [
                    "--cluster-enabled".to_string(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    node_dir.join("nodes.conf").display().to_string(),
                    // Seconds, not the default 15 s, before a silent master
                    // is failed over.
                    "--cluster-node-timeout".into(),
                    "1000".into(),
                    "--cluster-announce-ip".into(),
                    addr.to_string(),
                    // Explicit: port+10000 may be taken, or past 65535.
                    "--cluster-port".into(),
                    bus.to_string(),
                ]
                .into();
                redis_spec(
                    name.clone(),
                    node_dir.clone(),
                    addr,
                    port,
                    &extra,
                    durability,
                )
            })?);
        }

        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(Node::host_port));
        args.extend([
            "--cluster-replicas".into(),
            replicas_per_master.to_string(),
            "--cluster-yes".into(),
        ]);
        process::run_to_completion(
            SpawnSpec {
                program: cli,
                args,
                env: Vec::new(),
                cwd: dir.path().to_path_buf(),
                log: dir.path().join("redis-cli-create.log"),
                run_as: None,
            },
            Duration::from_secs(30),
        )?;

        let deadline = Instant::now() + CLUSTER_READY_WITHIN;
        let want_replicas = total - masters;
        for n in &nodes {
            wait_for(n, left(deadline), |n| {
                cluster_converged(n, total, masters, want_replicas)
            })?;
        }

        // redis-cli picks the masters (the first ones given, spread over
        // hosts), but its choice is not ours to assume: ask each node.
        let mut ms = Vec::with_capacity(masters);
        let mut rs = Vec::with_capacity(want_replicas);
        for n in nodes {
            let r = role(&n).map_err(|e| FleetError::Control {
                node: n.name().to_string(),
                op: "ROLE",
                message: e,
            })?;
            if r == "master" {
                ms.push(n);
            } else {
                rs.push(n);
            }
        }
        if ms.len() != masters {
            return Err(FleetError::Control {
                node: "redis-cluster".into(),
                op: "create",
                message: format!(
                    "asked for {masters} masters, got {}: {:?}",
                    ms.len(),
                    ms.iter().map(Node::host_port).collect::<Vec<_>>()
                ),
            });
        }
        for r in &rs {
            wait_for(r, left(deadline), replica_synced)?;
        }
        if replicas_per_master > 0 {
            let slots = cluster_slots(&ms[0]).map_err(|e| FleetError::Control {
                node: ms[0].name().to_string(),
                op: "CLUSTER SLOTS",
                message: e,
            })?;
            for m in &ms {
                let owned: Vec<&SlotRange> =
                    slots.iter().filter(|r| r.master == m.host_port()).collect();
                wait_for(m, left(deadline), |m| write_acked(m, &owned))?;
            }
        }
        Ok(Self {
            replicas: rs,
            masters: ms,
            _dir: dir,
        })
    }

    /// Kills every node at once and starts each again on its address
    /// (without persistence each comes back empty, durable ones reload
    /// their append-only file; `nodes.conf` keeps its identity and role),
    /// then waits until the cluster is ok again.
    ///
    /// # Errors
    /// A node that does not start, or a cluster that does not converge
    /// within 20 s.
    pub fn restart_all(&self) -> Result<()> {
        let nodes = self.nodes();
        for n in &nodes {
            n.kill()?;
        }
        for n in &nodes {
            n.restart()?;
        }
        let (total, masters) = (nodes.len(), self.masters.len());
        let replicas = total - masters;
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            wait_for(n, left(deadline), |n| {
                cluster_converged(n, total, masters, replicas)
            })?;
        }
        Ok(())
    }

    /// Every node: masters, then replicas.
    pub fn nodes(&self) -> Vec<&Node> {
        self.masters.iter().chain(&self.replicas).collect()
    }

    /// `redis://addr:port` of every master.
    pub fn urls(&self) -> Vec<String> {
        self.masters.iter().map(Node::url).collect()
    }

    /// `redis+cluster://a1:p1,a2:p2,...`: the masters' `host:port` as seed
    /// nodes for a cluster client.
    pub fn endpoint(&self) -> String {
        let seeds: Vec<String> = self.masters.iter().map(Node::host_port).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The node serving `slot` (0..16384) according to the first live node
    /// that answers `CLUSTER SLOTS`; after a failover this may be one of
    /// [`RedisClusterFleet::replicas`].
    ///
    /// # Errors
    /// A slot out of range, no node answering, the slot unserved, or served
    /// by an address that is none of ours.
    pub fn master_of_slot(&self, slot: u16) -> Result<&Node> {
        let err = |message: String| FleetError::Control {
            node: "redis-cluster".into(),
            op: "master_of_slot",
            message,
        };
        if slot >= 16384 {
            return Err(err(format!("slot {slot} is not in 0..16384")));
        }
        let mut last = String::from("no node is running");
        for n in self.nodes().into_iter().filter(|n| n.is_running()) {
            let ranges = match cluster_slots(n) {
                Ok(r) => r,
                Err(e) => {
                    last = format!("{}: {e}", n.name());
                    continue;
                }
            };
            let owner = ranges
                .iter()
                .find(|r| r.start <= slot && slot <= r.end)
                .ok_or_else(|| err(format!("{} says slot {slot} is unserved", n.name())))?;
            return self
                .nodes()
                .into_iter()
                .find(|m| m.host_port() == owner.master)
                .ok_or_else(|| err(format!("slot {slot} served by unknown {}", owner.master)));
        }
        Err(err(last))
    }

    /// Kills (`kill -9`) `master` and waits up to `limit` until one of its
    /// replicas serves all its slots and every surviving node that answers
    /// (the new master at least) agrees and reports `cluster_state:ok`.
    /// Returns the new master's `host:port`.
    ///
    /// # Errors
    /// `master` not ours, not a master serving slots, or without a replica;
    /// the kill failing; or no failover within `limit`.
    pub fn failover_master(&self, master: &Node, limit: Duration) -> Result<String> {
        self.failover_lagging(master, Duration::ZERO, || {}, limit)
    }

    /// Restarts the node at `host_port` (a killed master) and waits until
    /// it rejoins as a synced replica of the master that replaced it.
    ///
    /// # Errors
    /// Not one of ours, a failed start, or not in sync within `limit`.
    pub fn rejoin(&self, host_port: &str, limit: Duration) -> Result<()> {
        let node = self
            .nodes()
            .into_iter()
            .find(|n| n.host_port() == host_port)
            .ok_or_else(|| FleetError::Control {
                node: host_port.to_string(),
                op: "rejoin",
                message: "not a node of this cluster".into(),
            })?;
        node.restart()?;
        wait_for(node, limit, replica_synced)
    }

    /// The master serving `key`'s slot, asked of the cluster.
    ///
    /// # Errors
    /// No node answering `CLUSTER KEYSLOT`, or as [`Self::master_of_slot`].
    pub fn master_of_key(&self, key: &str) -> Result<&Node> {
        let mut last = String::from("no node is running");
        for n in self.nodes().into_iter().filter(|n| n.is_running()) {
            match query(n, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)) {
                Ok(redis::Value::Int(slot)) => {
                    let slot = u16::try_from(slot).map_err(|_| FleetError::Control {
                        node: n.name().to_string(),
                        op: "CLUSTER KEYSLOT",
                        message: format!("slot {slot}"),
                    })?;
                    return self.master_of_slot(slot);
                }
                Ok(v) => last = format!("{}: {v:?}", n.name()),
                Err(e) => last = format!("{}: {e}", n.name()),
            }
        }
        Err(FleetError::Control {
            node: "redis-cluster".into(),
            op: "CLUSTER KEYSLOT",
            message: last,
        })
    }

    /// [`Self::failover_master`] with the replicas lagging: they are
    /// paused (SIGSTOP) first, `while_lagging` runs (the caller waits for a
    /// write the replicas will never see), `lag` passes, then the master
    /// is killed and the replicas resumed, so the one promoted lacks those
    /// writes. Asynchronous replication's loss, made certain instead of
    /// left to a microsecond window on loopback.
    ///
    /// # Errors
    /// As [`Self::failover_master`], or a pause or resume failing.
    pub fn failover_lagging(
        &self,
        master: &Node,
        lag: Duration,
        while_lagging: impl FnOnce(),
        limit: Duration,
    ) -> Result<String> {
        let err = |message: String| FleetError::Control {
            node: master.name().to_string(),
            op: "failover_master",
            message,
        };
        let old = master.host_port();
        if !self.nodes().iter().any(|n| n.host_port() == old) {
            return Err(err(format!("{old} is not a node of this cluster")));
        }
        // Its own view: the slots it serves and the replicas following it.
        let owned: Vec<SlotRange> = cluster_slots(master)
            .map_err(err)?
            .into_iter()
            .filter(|r| r.master == old)
            .collect();
        if owned.is_empty() {
            return Err(err(format!("{old} serves no slots (not a master?)")));
        }
        let lines = cluster_nodes(master).map_err(err)?;
        let id = lines
            .iter()
            .find(|l| l.flags.iter().any(|f| f == "myself"))
            .map(|l| l.id.clone())
            .ok_or_else(|| err("CLUSTER NODES has no `myself` line".into()))?;
        let followers: Vec<String> = lines
            .iter()
            .filter(|l| l.master_id.as_deref() == Some(id.as_str()))
            .map(|l| l.host_port.clone())
            .collect();
        if followers.is_empty() {
            return Err(err(format!("{old} has no replica to promote")));
        }

        let lagging: Vec<&Node> = self
            .nodes()
            .into_iter()
            .filter(|n| followers.contains(&n.host_port()))
            .collect();
        if !lag.is_zero() {
            for r in &lagging {
                r.pause()?;
            }
            cut_replication(master)?;
            while_lagging();
            std::thread::sleep(lag);
        }
        let killed = master.kill();
        if !lag.is_zero() {
            for r in &lagging {
                r.resume()?;
            }
        }
        killed?;
        let t0 = Instant::now();
        loop {
            match self.promoted(&old, &owned, &followers) {
                Ok(new) => {
                    tracing::debug!(%old, %new, ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX), "cluster failover");
                    return Ok(new);
                }
                Err(last) if t0.elapsed() >= limit => {
                    return Err(err(format!(
                        "no replica of {old} took over within {limit:?}: {last}"
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The replica that now serves all of `owned`, once it and every other
    /// surviving node that answers agree and report `cluster_state:ok`.
    fn promoted(
        &self,
        old: &str,
        owned: &[SlotRange],
        followers: &[String],
    ) -> std::result::Result<String, String> {
        let survivors: Vec<&Node> = self
            .nodes()
            .into_iter()
            .filter(|n| n.host_port() != old && n.is_running())
            .collect();
        let mut new: Option<String> = None;
        let mut answered_by_new = false;
        for n in survivors {
            // A node that does not answer (paused by a fault) has no say.
            let (Ok(slots), Ok(info)) = (
                cluster_slots(n),
                query_string(n, redis::cmd("CLUSTER").arg("INFO")),
            ) else {
                continue;
            };
            let state = info_field(&info, "cluster_state").unwrap_or("?");
            if state != "ok" {
                return Err(format!("{} says cluster_state:{state}", n.name()));
            }
            for want in owned {
                let now = slots
                    .iter()
                    .find(|r| r.start <= want.start && want.start <= r.end)
                    .map_or("nobody", |r| r.master.as_str());
                if !followers.iter().any(|f| f == now) {
                    return Err(format!(
                        "{} says slot {} is served by {now}",
                        n.name(),
                        want.start
                    ));
                }
                match &new {
                    Some(m) if m != now => {
                        return Err(format!("{}: slots of {old} split: {m} and {now}", n.name()))
                    }
                    _ => new = Some(now.to_string()),
                }
            }
            answered_by_new |= new.as_deref() == Some(n.host_port().as_str());
        }
        match new {
            Some(m) if answered_by_new => Ok(m),
            Some(m) => Err(format!("the new master {m} does not answer yet")),
            None => Err("no surviving node answers".into()),
        }
    }
}

/// `Ok` once a write to a key of one of `owned` (slots `m` serves) is
/// acknowledged by a replica: see [`SentinelFleet::start`] on diskless sync.
fn write_acked(m: &Node, owned: &[&SlotRange]) -> std::result::Result<(), String> {
    let client = redis::Client::open(m.url()).map_err(|e| e.to_string())?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .map_err(|e| e.to_string())?;
    con.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    // A key this master serves, else the SET gets MOVED: about one in
    // `masters` candidates fits.
    let mut key = None;
    for i in 0..1000 {
        let k = format!("lockbench:fleet:ready:{i}");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&k)
            .query(&mut con)
            .map_err(|e| e.to_string())?;
        if owned
            .iter()
            .any(|r| i64::from(r.start) <= slot && slot <= i64::from(r.end))
        {
            key = Some(k);
            break;
        }
    }
    let key = key.ok_or("no key found for this master's slots")?;
    let acked: i64 = redis::pipe()
        .cmd("SET")
        .arg(&key)
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
        Err("no replica acknowledges writes yet".into())
    }
}
