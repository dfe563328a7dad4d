//! ZooKeeper topologies: one standalone server, or an ensemble of N
//! (normally 3) quorum peers, each on its own loopback address.
//!
//! The server is Debian's `zookeeper` package run as a plain Java process
//! (no systemd): `java -cp zookeeper.jar:slf4j-simple.jar QuorumPeerMain
//! zoo.cfg`; the jar's manifest pulls in the rest of its class path.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::node::{start_on_free_port, Node, NodeSpec};
use crate::{
    find_binary, fleet_dir, loopback_addr, Durability, DurabilitySettings, FleetError,
    PortAllocator, Result, ServerKind,
};

/// Where Debian's `zookeeper` package puts the server jar.
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The slf4j binding that sends the server's log to stderr (our log file);
/// without it slf4j falls back to printing nothing.
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
/// The ZooKeeper tick: the unit of its session-timeout bounds and of the
/// quorum's init/sync limits. Short, so an ensemble forms and fails over
/// in about a second.
const TICK_MS: u64 = 200;

/// Sends a four-letter word (`srvr`, `ruok`, `stat`, ...) and returns the
/// answer. The 4lw whitelist is `*` in every fleet node.
///
/// # Errors
/// The node does not answer within a second.
pub fn four_letter_word(addr: Ipv4Addr, port: u16, word: &str) -> std::io::Result<String> {
    let timeout = Duration::from_secs(1);
    let mut s = TcpStream::connect_timeout(&SocketAddr::from((addr, port)), timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(word.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The `Mode:` line of `srvr`: `standalone`, `leader` or `follower`.
fn mode(node: &Node) -> std::result::Result<String, String> {
    let out = four_letter_word(node.addr(), node.port(), "srvr").map_err(|e| e.to_string())?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_string())
        // Before it has a quorum the server says it is "not currently serving requests".
        .ok_or_else(|| format!("not serving yet: {}", out.trim()))
}

/// Readiness of a standalone server: it serves.
fn serving(node: &Node) -> std::result::Result<(), String> {
    mode(node).map(|_| ())
}

/// Readiness of an ensemble member at process start: its client port
/// answers at all. It cannot serve before a quorum of peers is up, and the
/// peers are started one after the other, so serving is awaited by
/// [`ZkFleet`] once all are running.
fn listening(node: &Node) -> std::result::Result<(), String> {
    four_letter_word(node.addr(), node.port(), "ruok")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn java_and_class_path() -> Result<(PathBuf, String)> {
    let java = find_binary("java", "default-jre-headless", &[])?;
    if !Path::new(ZK_JAR).is_file() {
        return Err(FleetError::MissingBinary {
            binary: "zookeeper.jar".into(),
            looked: ZK_JAR.into(),
            package: "zookeeper",
        });
    }
    let mut cp = ZK_JAR.to_string();
    if Path::new(SLF4J_SIMPLE).is_file() {
        cp.push(':');
        cp.push_str(SLF4J_SIMPLE);
    }
    Ok((java, cp))
}

/// One peer's addresses in an ensemble.
#[derive(Debug, Clone, Copy)]
struct Peer {
    addr: Ipv4Addr,
    client: u16,
    quorum: u16,
    election: u16,
}

/// The `zoo.cfg` lines of a profile. ZooKeeper turns a key it does not
/// know into the system property `zookeeper.<key>`, and its transaction log
/// reads `zookeeper.forceSync` when it is opened, after the config: so
/// `forceSync=no` here is the documented `-Dzookeeper.forceSync=no`
/// (checked by the fleet tests through `mntr`'s fsync count).
fn zk_durability(durability: Durability) -> DurabilitySettings {
    let (flags, note): (&[&str], _) = match durability {
        Durability::Durable => (
            &[],
            "transaction log fsynced before a write is acknowledged (forceSync=yes, the default)",
        ),
        Durability::Volatile => (
            &["forceSync=no"],
            "transaction log written but never fsynced (zookeeper.forceSync=no)",
        ),
    };
    DurabilitySettings {
        kind: ServerKind::Zookeeper,
        profile: durability,
        flags: flags.iter().map(|s| s.to_string()).collect(),
        note,
    }
}

#[allow(clippy::too_many_arguments)]
fn zk_spec(
    name: String,
    dir: PathBuf,
    addr: Ipv4Addr,
    port: u16,
    java: &Path,
    class_path: &str,
    peers: &[Peer],
    myid: usize,
    durability: Durability,
) -> Result<NodeSpec> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)
        .map_err(FleetError::io(format!("creating {}", data.display())))?;
    let mut cfg = format!(
        "tickTime={TICK_MS}\n\
         initLimit=20\n\
         syncLimit=10\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress={addr}\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=*\n\
         # Session timeouts are the lock's lifetime: let clients pick them\n\
         # freely instead of 2..20 ticks.\n\
         minSessionTimeout=100\n\
         maxSessionTimeout=60000\n\
         # Every client (workers, bench tasks) comes from one address; the\n\
         # default cap of 60 connections per address would refuse them.\n\
         maxClientCnxns=0\n\
         # The default preallocates 64 MB per transaction log.\n\
         preAllocSize=4096\n",
        data.display()
    );
    let durability = zk_durability(durability);
    for line in &durability.flags {
        cfg.push_str(line);
        cfg.push('\n');
    }
    if !peers.is_empty() {
        for (i, p) in peers.iter().enumerate() {
            cfg.push_str(&format!(
                "server.{}={}:{}:{}\n",
                i + 1,
                p.addr,
                p.quorum,
                p.election
            ));
        }
        std::fs::write(data.join("myid"), format!("{}\n", myid + 1))
            .map_err(FleetError::io("writing myid"))?;
    }
    let conf = dir.join("zoo.cfg");
    std::fs::write(&conf, cfg).map_err(FleetError::io("writing zoo.cfg"))?;
    Ok(NodeSpec {
        name,
        program: java.to_path_buf(),
        args: vec![
            "-Xms64m".into(),
            "-Xmx256m".into(),
            "-XX:+UseSerialGC".into(),
            // C1 only. The suite starts a fresh JVM for every run and measures
            // for seconds; with C2, its compiler thread took 2 s of CPU during
            // the second 3-s run on 2 cores, and the hand-over p99 measured
            // that (6-7x its p50, 700-1,200 cycles/s at 4 workers, durable).
            // Warm after ~20 s of load, C2 and C1 run the durable throughput
            // workload alike (1,330-1,450 and 1,360-1,430 cycles/s, p99 2-3x
            // p50); C1 gets there within the first run.
            "-XX:TieredStopAtLevel=1".into(),
            "-Djava.net.preferIPv4Stack=true".into(),
            "-cp".into(),
            class_path.to_string(),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
            conf.display().to_string(),
        ],
        env: Vec::new(),
        dir,
        addr,
        port,
        run_as: None,
        ready: if peers.is_empty() { serving } else { listening },
        ready_within: Duration::from_secs(30),
        clock_file: None,
        durability: Some(durability),
    })
}

/// A standalone ZooKeeper server or an ensemble of quorum peers.
#[derive(Debug)]
pub struct ZkFleet {
    /// The servers, each on its own loopback address; kill / pause /
    /// restart act on one of them (see [`ZkFleet::restart`] for an
    /// ensemble member).
    pub nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl ZkFleet {
    /// One standalone server, durable ([`Durability::Durable`]: its
    /// transaction log fsynced, as shipped).
    ///
    /// # Errors
    /// Missing `java` or `zookeeper.jar` (naming the package), no free
    /// port, or a server that never reports `Mode: standalone`.
    pub fn standalone() -> Result<Self> {
        Self::standalone_with(Durability::Durable)
    }

    /// One standalone server in the given durability profile.
    ///
    /// # Errors
    /// As for [`ZkFleet::standalone`].
    pub fn standalone_with(durability: Durability) -> Result<Self> {
        let (java, cp) = java_and_class_path()?;
        let dir = fleet_dir("zookeeper")?;
        let node_dir = dir.path().join("zk-0");
        let addr = loopback_addr();
        let node = start_on_free_port(addr, |port| {
            zk_spec(
                "zookeeper-0".into(),
                node_dir.clone(),
                addr,
                port,
                &java,
                &cp,
                &[],
                0,
                durability,
            )
        })?;
        Ok(Self {
            nodes: vec![node],
            dir,
        })
    }

    /// An ensemble of `n` quorum peers (3 is the usual one): client,
    /// quorum and election ports on each peer's own address. Returns once
    /// every peer serves (one leader, the rest followers).
    ///
    /// Durable, as shipped.
    ///
    /// # Errors
    /// As for [`ZkFleet::standalone`], or no quorum within 30 s.
    pub fn ensemble(n: usize) -> Result<Self> {
        Self::ensemble_with(n, Durability::Durable)
    }

    /// [`ZkFleet::ensemble`] with every peer in the given durability
    /// profile.
    ///
    /// # Errors
    /// As for [`ZkFleet::ensemble`].
    pub fn ensemble_with(n: usize, durability: Durability) -> Result<Self> {
        let (java, cp) = java_and_class_path()?;
        let dir = fleet_dir("zookeeper")?;
        let mut peers = Vec::with_capacity(n);
        for _ in 0..n {
            let addr = loopback_addr();
            peers.push(Peer {
                addr,
                client: PortAllocator::free_port(addr)?,
                quorum: PortAllocator::free_port(addr)?,
                election: PortAllocator::free_port(addr)?,
            });
        }
        let mut nodes = Vec::with_capacity(n);
        for (i, p) in peers.iter().enumerate() {
            nodes.push(Node::start(zk_spec(
                format!("zookeeper-{i}"),
                dir.path().join(format!("zk-{i}")),
                p.addr,
                p.client,
                &java,
                &cp,
                &peers,
                i,
                durability,
            )?)?);
        }
        let fleet = Self { nodes, dir };
        for i in 0..n {
            fleet.wait_serving(i, Duration::from_secs(30))?;
        }
        Ok(fleet)
    }

    /// The fleet's temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `127.0.0.N:port,...` of every server: a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(Node::host_port)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `srvr`'s `Mode:` of node `i` (`standalone`, `leader`, `follower`).
    ///
    /// # Errors
    /// If the node does not serve.
    pub fn mode(&self, i: usize) -> Result<String> {
        let node = self.node(i)?;
        mode(node).map_err(|message| FleetError::Control {
            node: node.name().to_string(),
            op: "srvr",
            message,
        })
    }

    /// The index of the leader (the standalone server counts as one).
    ///
    /// # Errors
    /// If no node reports `Mode: leader` or `standalone` (no quorum).
    pub fn leader(&self) -> Result<usize> {
        let mut seen = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            match mode(n) {
                Ok(m) if m == "leader" || m == "standalone" => return Ok(i),
                Ok(m) => seen.push(format!("{}: {m}", n.name())),
                Err(e) => seen.push(format!("{}: {e}", n.name())),
            }
        }
        Err(FleetError::Control {
            node: "zookeeper".into(),
            op: "find leader",
            message: seen.join("; "),
        })
    }

    /// Waits until node `i` serves clients (has joined a quorum).
    ///
    /// # Errors
    /// [`FleetError::NotReady`] after `limit`.
    pub fn wait_serving(&self, i: usize, limit: Duration) -> Result<()> {
        let node = self.node(i)?;
        let t0 = Instant::now();
        loop {
            match mode(node) {
                Ok(_) => return Ok(()),
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

    /// Restarts node `i` (kill -9, start on the same address, ports and
    /// data dir) and waits until it serves again.
    ///
    /// # Errors
    /// As for [`Node::restart`] and [`ZkFleet::wait_serving`].
    pub fn restart(&self, i: usize) -> Result<()> {
        self.node(i)?.restart()?;
        self.wait_serving(i, Duration::from_secs(30))
    }

    fn node(&self, i: usize) -> Result<&Node> {
        self.nodes.get(i).ok_or_else(|| FleetError::Control {
            node: format!("zookeeper-{i}"),
            op: "select node",
            message: format!("the fleet has {} node(s)", self.nodes.len()),
        })
    }
}
