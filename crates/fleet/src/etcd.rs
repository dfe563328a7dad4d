//! etcd 3.4 (Debian's `etcd-server`): one node or an N-node raft cluster,
//! each member on its own loopback address with its own client and peer
//! ports.
//!
//! Readiness and leader discovery go through etcd's HTTP endpoints (`GET
//! /health`, the `/v3/maintenance/status` JSON gateway) with a tiny
//! HTTP/1.0 client on a std `TcpStream`: `etcdctl` would add a 2 s dial
//! timeout to every probe, and a gRPC client would weigh on this crate.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::node::{Node, NodeSpec};
use crate::{
    find_binary, fleet_dir, loopback_addr, Durability, DurabilitySettings, FleetError,
    PortAllocator, Result, ServerKind,
};

/// How long a graceful stop waits after SIGTERM before SIGKILL: a leader
/// whose peers are already gone can hang 15 s+ on SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Raft timing for a loaded 2-core machine: 100 ms elections make the
/// leader flap; 500 / 50 ms does not.
const ELECTION_TIMEOUT_MS: &str = "500";
const HEARTBEAT_MS: &str = "50";

/// The flags of a profile. `--unsafe-no-fsync` is not in 3.4's `--help`
/// but Debian's 3.4.23 has it (backported): once the WAL is open no write
/// is fdatasynced (the bootstrap entries before that are; checked by the
/// fleet tests through the WAL fsync count in `/metrics`).
fn etcd_durability(durability: Durability) -> DurabilitySettings {
    let (flags, note): (&[&str], _) = match durability {
        Durability::Durable => (
            &[],
            "WAL fdatasynced before an entry is committed (the default)",
        ),
        Durability::Volatile => (&["--unsafe-no-fsync"], "WAL written but never fdatasynced"),
    };
    DurabilitySettings {
        kind: ServerKind::Etcd,
        profile: durability,
        flags: flags.iter().map(|s| s.to_string()).collect(),
        note,
    }
}

/// One HTTP/1.0 request to `addr:port`; returns the body of a 200 reply.
fn http(
    addr: Ipv4Addr,
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    limit: Duration,
) -> std::result::Result<String, String> {
    let sa = SocketAddr::from((addr, port));
    let mut s = TcpStream::connect_timeout(&sa, limit).map_err(|e| format!("connect {sa}: {e}"))?;
    s.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {sa}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{method} {path}: {e}"))?;
    // HTTP/1.0: the server closes the connection after the reply.
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} {path}: malformed reply {reply:?}"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        return Err(format!("{method} {path}: {status}: {body}"));
    }
    Ok(body.to_string())
}

/// Ready = `/health` says the member has a leader and serves requests.
fn healthy(node: &Node) -> std::result::Result<(), String> {
    let body = http(
        node.addr(),
        node.port(),
        "GET",
        "/health",
        "",
        Duration::from_millis(500),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    if v["health"] == "true" {
        Ok(())
    } else {
        Err(format!("/health: {body}"))
    }
}

/// A member's view from `/v3/maintenance/status`: (its id, its leader's id).
fn status(node: &Node) -> std::result::Result<(String, String), String> {
    let body = http(
        node.addr(),
        node.port(),
        "POST",
        "/v3/maintenance/status",
        "{}",
        Duration::from_millis(500),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    // The gateway prints uint64 ids as JSON strings.
    let id = v["header"]["member_id"].as_str().unwrap_or_default();
    let leader = v["leader"].as_str().unwrap_or_default();
    if id.is_empty() {
        return Err(format!("status without member id: {body}"));
    }
    Ok((id.to_string(), leader.to_string()))
}

/// One member's addresses, fixed before any member starts (every member
/// must know every peer URL in `--initial-cluster`).
#[derive(Debug, Clone)]
struct Member {
    name: String,
    addr: Ipv4Addr,
    client_port: u16,
    peer_port: u16,
}

impl Member {
    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.addr, self.peer_port)
    }

    fn client_url(&self) -> String {
        format!("http://{}:{}", self.addr, self.client_port)
    }
}

/// An etcd single node or raft cluster, torn down on drop.
#[derive(Debug)]
pub struct EtcdFleet {
    /// The members, each on its own loopback address; `nodes[i].port()` is
    /// its client port.
    pub nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl EtcdFleet {
    /// One etcd node, durable ([`Durability::Durable`]: as shipped).
    ///
    /// # Errors
    /// Missing `etcd` (install `etcd-server`), no free port, or a node that
    /// never reports healthy.
    pub fn single() -> Result<Self> {
        Self::cluster(1)
    }

    /// One etcd node in the given durability profile.
    ///
    /// # Errors
    /// As for [`EtcdFleet::single`].
    pub fn single_with(durability: Durability) -> Result<Self> {
        Self::cluster_with(1, durability)
    }

    /// An `n`-member cluster (3 for the fault tests), started together,
    /// durable.
    ///
    /// # Errors
    /// As for [`EtcdFleet::single`].
    pub fn cluster(n: usize) -> Result<Self> {
        Self::cluster_with(n, Durability::Durable)
    }

    /// [`EtcdFleet::cluster`] with every member in the given durability
    /// profile.
    ///
    /// # Errors
    /// As for [`EtcdFleet::single`].
    pub fn cluster_with(n: usize, durability: Durability) -> Result<Self> {
        let program = find_binary("etcd", "etcd-server", &[])?;
        let dir = fleet_dir("etcd")?;
        let addrs: Vec<Ipv4Addr> = (0..n).map(|_| loopback_addr()).collect();
        let mut last = None;
        // A port probed free may be taken by a parallel test before etcd
        // binds it; ports are fixed in --initial-cluster, so retry the lot.
        for attempt in 0..3 {
            match Self::try_start(&program, dir.path(), &addrs, attempt, durability, None) {
                Ok(nodes) => return Ok(Self { nodes, dir }),
                Err(e @ FleetError::NotReady { .. }) if e.to_string().contains("in use") => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| FleetError::NoPort("etcd cluster".into())))
    }

    /// One etcd node that also serves its clients over TLS (the plain
    /// client URL stays for readiness), with a certificate for its address
    /// signed by a CA made for it (see [`crate::make_certs`]). Returns the
    /// fleet, its `https://addr:port` client URL and the certificates.
    ///
    /// # Errors
    /// As for [`EtcdFleet::single`], plus a missing `openssl`.
    pub fn single_tls() -> Result<(Self, String, crate::TestCerts)> {
        let program = find_binary("etcd", "etcd-server", &[])?;
        let dir = fleet_dir("etcd-tls")?;
        let addr = loopback_addr();
        let certs = crate::make_certs(&dir.path().join("tls"), addr)?;
        let mut last = None;
        for attempt in 0..3 {
            let port = PortAllocator::free_port(addr)?;
            let tls = (&certs, port);
            match Self::try_start(
                &program,
                dir.path(),
                &[addr],
                attempt,
                Durability::Durable,
                Some(tls),
            ) {
                Ok(nodes) => {
                    return Ok((Self { nodes, dir }, format!("https://{addr}:{port}"), certs))
                }
                Err(e @ FleetError::NotReady { .. }) if e.to_string().contains("in use") => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| FleetError::NoPort("etcd with TLS".into())))
    }

    fn try_start(
        program: &Path,
        root: &Path,
        addrs: &[Ipv4Addr],
        attempt: u32,
        durability: Durability,
        tls: Option<(&crate::TestCerts, u16)>,
    ) -> Result<Vec<Node>> {
        let durability = etcd_durability(durability);
        let mut members = Vec::with_capacity(addrs.len());
        for (i, &addr) in addrs.iter().enumerate() {
            members.push(Member {
                name: format!("etcd-{i}"),
                addr,
                client_port: PortAllocator::free_port(addr)?,
                peer_port: PortAllocator::free_port(addr)?,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        // Unique per cluster, so members of two fleets can never join.
        let token = format!(
            "lockbench-{}-{}-{attempt}",
            std::process::id(),
            members[0].client_port
        );
        let mut specs = Vec::with_capacity(members.len());
        for m in &members {
            let node_dir = root.join(format!("{}-{attempt}", m.name));
            std::fs::create_dir_all(&node_dir)
                .map_err(FleetError::io(format!("creating {}", node_dir.display())))?;
            let mut args: Vec<String> = [
                "--name",
                &m.name,
                "--data-dir",
                &node_dir.join("data").display().to_string(),
                "--listen-client-urls",
                &m.client_url(),
                "--advertise-client-urls",
                &m.client_url(),
                "--listen-peer-urls",
                &m.peer_url(),
                "--initial-advertise-peer-urls",
                &m.peer_url(),
                "--initial-cluster",
                &initial_cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &token,
                "--election-timeout",
                ELECTION_TIMEOUT_MS,
                "--heartbeat-interval",
                HEARTBEAT_MS,
                // stderr goes to the node's server.log.
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(durability.flags.iter().cloned());
            if let Some((certs, port)) = tls {
                // Plain and TLS client URLs side by side: etcd serves each
                // listener by its scheme.
                let both = format!("{},https://{}:{port}", m.client_url(), m.addr);
                for flag in ["--listen-client-urls", "--advertise-client-urls"] {
                    if let Some(i) = args.iter().position(|a| a == flag) {
                        args[i + 1] = both.clone();
                    }
                }
                args.extend([
                    "--cert-file".to_string(),
                    certs.cert.display().to_string(),
                    "--key-file".to_string(),
                    certs.key.display().to_string(),
                ]);
            }
            specs.push(NodeSpec {
                name: m.name.clone(),
                program: program.to_path_buf(),
                args,
                env: Vec::new(),
                dir: node_dir,
                addr: m.addr,
                port: m.client_port,
                run_as: None,
                ready: healthy,
                ready_within: Duration::from_secs(20),
                clock_file: None,
                durability: Some(durability.clone()),
            });
        }
        // Together: no member reports healthy before a quorum is up.
        let started: Vec<Result<Node>> = std::thread::scope(|s| {
            let handles: Vec<_> = specs
                .into_iter()
                .map(|spec| s.spawn(move || Node::start(spec)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(FleetError::Control {
                            node: "etcd".into(),
                            op: "start",
                            message: "starter thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        // Any failure drops (kills) the members that did start.
        started.into_iter().collect()
    }

    /// `http://addr:port` client URL of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("http://{}:{}", n.addr(), n.port()))
            .collect()
    }

    /// The fleet's temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The index in [`EtcdFleet::nodes`] of the current leader, waiting up
    /// to 10 s for one to be elected. Members that do not answer (killed,
    /// paused) are skipped.
    ///
    /// # Errors
    /// [`FleetError::Control`] when no answering member knows a leader that
    /// is one of ours within 10 s.
    pub fn leader(&self) -> Result<usize> {
        self.leader_within(Duration::from_secs(10))
    }

    /// [`EtcdFleet::leader`] with an explicit wait.
    ///
    /// # Errors
    /// As for [`EtcdFleet::leader`].
    pub fn leader_within(&self, limit: Duration) -> Result<usize> {
        let t0 = Instant::now();
        let mut last = String::from("no member answered");
        loop {
            let views: Vec<Option<(String, String)>> = self
                .nodes
                .iter()
                .map(|n| {
                    if !n.is_running() {
                        return None;
                    }
                    match status(n) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            last = format!("{}: {e}", n.name());
                            None
                        }
                    }
                })
                .collect();
            // The leader is the answering member whose own id is the
            // leader id reported; "0" means no leader yet.
            let found = views.iter().position(|v| {
                v.as_ref()
                    .is_some_and(|(id, leader)| leader != "0" && id == leader)
            });
            if let Some(i) = found {
                return Ok(i);
            }
            if t0.elapsed() >= limit {
                return Err(FleetError::Control {
                    node: "etcd".into(),
                    op: "leader",
                    message: format!("no leader after {limit:?} ({last})"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Graceful stop of member `i`: SIGTERM, [`STOP_GRACE`], then SIGKILL.
    ///
    /// # Errors
    /// As for [`Node::stop`]; an index out of range is a control error.
    pub fn stop(&self, i: usize) -> Result<()> {
        self.node(i)?.stop(STOP_GRACE)
    }

    /// `kill -9` of member `i` (see [`Node::kill`]).
    ///
    /// # Errors
    /// As for [`Node::kill`].
    pub fn kill(&self, i: usize) -> Result<()> {
        self.node(i)?.kill()
    }

    /// Restarts member `i` on its address, ports and data dir, and waits
    /// until it reports healthy (which needs a quorum).
    ///
    /// # Errors
    /// As for [`Node::restart`].
    pub fn restart(&self, i: usize) -> Result<()> {
        self.node(i)?.restart()
    }

    fn node(&self, i: usize) -> Result<&Node> {
        self.nodes.get(i).ok_or_else(|| FleetError::Control {
            node: format!("etcd-{i}"),
            op: "select",
            message: format!("the fleet has {} members", self.nodes.len()),
        })
    }
}
