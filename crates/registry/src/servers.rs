//! The servers a backend's topology needs, started by lockbench itself
//! (or the user's own endpoint), kept alive until dropped.

use fleet::Durability;
use serde_json::{json, Value};

use crate::Topology;

/// What results.json says of servers lockbench did not start.
pub const EXTERNAL_DURABILITY: &str = "unknown (external endpoint)";

/// Keeps the servers of a run alive until dropped; dropping stops them.
#[derive(Debug)]
pub enum Servers {
    /// The user's own endpoint, or an in-process lock: nothing started.
    External,
    /// One or N independent Redis nodes.
    Redis(fleet::RedisFleet),
    /// Redis primary + replica + 3 sentinels.
    Sentinel(Box<fleet::SentinelFleet>),
    /// A Redis Cluster.
    RedisCluster(Box<fleet::RedisClusterFleet>),
    /// One PostgreSQL.
    Postgres(Box<fleet::PostgresFleet>),
    /// ZooKeeper standalone.
    Zookeeper(Box<fleet::ZkFleet>),
    /// One etcd node.
    Etcd(Box<fleet::EtcdFleet>),
}

impl Servers {
    /// Starts the fleet for `topology` with the settings each server always
    /// had here: Redis topologies volatile (no persistence), PostgreSQL,
    /// ZooKeeper and etcd durable (see [`Servers::default_durability`]).
    /// Kept for the benches and tests that predate durability profiles;
    /// `lockbench run` uses [`Servers::start_with`]. Blocking: call it off
    /// the async runtime's worker threads.
    ///
    /// # Errors
    /// A missing server binary (naming its package) or a server that does
    /// not become ready.
    pub fn start(topology: Topology) -> fleet::Result<Self> {
        Self::start_with(topology, Self::default_durability(topology))
    }

    /// The profile [`Servers::start`] gives `topology`'s servers: what they
    /// ran with before profiles existed.
    pub fn default_durability(topology: Topology) -> Durability {
        match topology {
            Topology::RedisSingle
            | Topology::RedisIndependent(_)
            | Topology::RedisIndependentFakeClocks(_)
            | Topology::RedisPrimaryReplica
            | Topology::RedisCluster { .. } => Durability::Volatile,
            Topology::InProcess
            | Topology::Postgres
            | Topology::Zookeeper
            | Topology::ZookeeperEnsemble(_)
            | Topology::Etcd
            | Topology::EtcdCluster(_) => Durability::Durable,
        }
    }

    /// Starts the fleet for `topology`, every server in the `durability`
    /// profile (blocking: call it off the async runtime's worker threads).
    ///
    /// # Errors
    /// A missing server binary (naming its package) or a server that does
    /// not become ready.
    pub fn start_with(topology: Topology, durability: Durability) -> fleet::Result<Self> {
        let d = durability;
        Ok(match topology {
            Topology::InProcess => Servers::External,
            Topology::RedisSingle => Servers::Redis(fleet::RedisFleet::single_with(d)?),
            Topology::RedisIndependent(n) => {
                Servers::Redis(fleet::RedisFleet::independent_with(n, d)?)
            }
            Topology::RedisIndependentFakeClocks(n) => Servers::Redis(
                fleet::RedisFleet::start_with(n, &(0..n).collect::<Vec<_>>(), d)?,
            ),
            Topology::Postgres => Servers::Postgres(Box::new(fleet::PostgresFleet::start_with(d)?)),
            Topology::Zookeeper => {
                Servers::Zookeeper(Box::new(fleet::ZkFleet::standalone_with(d)?))
            }
            Topology::Etcd => Servers::Etcd(Box::new(fleet::EtcdFleet::single_with(d)?)),
            Topology::EtcdCluster(n) => {
                Servers::Etcd(Box::new(fleet::EtcdFleet::cluster_with(n, d)?))
            }
            Topology::ZookeeperEnsemble(n) => {
                Servers::Zookeeper(Box::new(fleet::ZkFleet::ensemble_with(n, d)?))
            }
            Topology::RedisPrimaryReplica => {
                Servers::Sentinel(Box::new(fleet::SentinelFleet::start_with(d)?))
            }
            Topology::RedisCluster { masters, replicas } => Servers::RedisCluster(Box::new(
                fleet::RedisClusterFleet::start_with(masters, replicas, d)?,
            )),
        })
    }

    /// The durability settings of every server that keeps the lock's data
    /// (as [`Servers::nodes`]; sentinels keep none): `{node, kind, profile,
    /// flags, note, filesystem}` each, `flags` empty meaning the server's
    /// shipped defaults. `None` for an external endpoint, whose settings
    /// lockbench cannot know.
    pub fn durability(&self) -> Option<Vec<Value>> {
        if matches!(self, Servers::External) {
            return None;
        }
        Some(
            self.nodes()
                .into_iter()
                .filter_map(|n| {
                    let d = n.durability()?;
                    Some(json!({
                        "node": n.host_port(),
                        "kind": d.kind,
                        "profile": d.profile,
                        "flags": d.flags,
                        "note": d.note,
                        "filesystem": filesystem_of(n),
                    }))
                })
                .collect(),
        )
    }

    /// results.json's `durability` record: `{profile, servers,
    /// filesystem}`, where `profile` is the one every server was started
    /// in, `servers` as [`Servers::durability`], and `filesystem` the type
    /// of the file system the servers keep their data on (`ext4`, `tmpfs`,
    /// `overlay`; fsync on tmpfs costs nothing). Each is
    /// [`EXTERNAL_DURABILITY`] for an external endpoint.
    pub fn durability_record(&self) -> Value {
        let Some(servers) = self.durability() else {
            return json!({
                "profile": EXTERNAL_DURABILITY,
                "servers": EXTERNAL_DURABILITY,
                "filesystem": EXTERNAL_DURABILITY,
            });
        };
        let distinct = |field: &str| {
            let mut seen: Vec<&str> = Vec::new();
            for s in &servers {
                let v = s[field].as_str().unwrap_or("unknown");
                if !seen.contains(&v) {
                    seen.push(v);
                }
            }
            // One value unless the servers differ (they never do when
            // started by `start_with`); then all of them, not a guess.
            seen.join(" + ")
        };
        json!({
            "profile": distinct("profile"),
            "filesystem": distinct("filesystem"),
            "servers": servers,
        })
    }

    /// The lock's server processes, for faults that act on them (a pause,
    /// a kill): every Redis node, the PostgreSQL, every ZooKeeper or etcd
    /// member; for the sentinel set the primary and its replica (the
    /// sentinels only watch). None for an external endpoint.
    pub fn nodes(&self) -> Vec<&fleet::Node> {
        match self {
            Servers::External => Vec::new(),
            Servers::Redis(f) => f.nodes.iter().collect(),
            Servers::Sentinel(f) => vec![&f.primary, &f.replica],
            Servers::RedisCluster(f) => f.nodes(),
            Servers::Postgres(f) => vec![&f.node],
            Servers::Zookeeper(f) => f.nodes.iter().collect(),
            Servers::Etcd(f) => f.nodes.iter().collect(),
        }
    }

    /// The nodes a node fault aimed at `count(n)` of `n` servers hits,
    /// and the others. On a Redis Cluster the count is of its masters (the
    /// shards): "a minority" of its 3 masters + 3 replicas took two
    /// masters, and with them the cluster. Anything short of all of them
    /// leaves the replicas alone.
    pub fn split(&self, count: impl Fn(usize) -> usize) -> (Vec<&fleet::Node>, Vec<&fleet::Node>) {
        let all = self.nodes();
        let n = count(all.len());
        if let (Servers::RedisCluster(f), true) = (self, n < all.len()) {
            let hit = count(f.masters.len());
            let targets: Vec<&fleet::Node> = f.masters[..hit].iter().collect();
            let rest = all
                .into_iter()
                .filter(|x| !targets.iter().any(|t| std::ptr::eq(*t, *x)))
                .collect();
            return (targets, rest);
        }
        let rest = all[n..].to_vec();
        (all[..n].to_vec(), rest)
    }

    /// What `node` is in its deployment now, where that matters to a
    /// fault: leader or follower (etcd cluster, ZooKeeper ensemble, asked
    /// of the servers), master or replica (Redis Cluster, as started),
    /// primary or replica (Sentinel, as started). `None` for servers that
    /// are all alike. Blocking (it may ask the servers).
    pub fn role(&self, node: &fleet::Node) -> Option<&'static str> {
        let is =
            |i: usize, nodes: &[fleet::Node]| nodes.get(i).is_some_and(|l| std::ptr::eq(l, node));
        match self {
            Servers::Sentinel(f) => Some(if std::ptr::eq(&f.primary, node) {
                "primary"
            } else {
                "replica"
            }),
            Servers::RedisCluster(f) => Some(if f.masters.iter().any(|m| std::ptr::eq(m, node)) {
                "master"
            } else {
                "replica"
            }),
            Servers::Zookeeper(f) if f.nodes.len() > 1 => {
                let l = f.leader().ok()?;
                Some(if is(l, &f.nodes) {
                    "leader"
                } else {
                    "follower"
                })
            }
            Servers::Etcd(f) if f.nodes.len() > 1 => {
                let l = f.leader_within(std::time::Duration::from_secs(2)).ok()?;
                Some(if is(l, &f.nodes) {
                    "leader"
                } else {
                    "follower"
                })
            }
            _ => None,
        }
    }

    /// The seeds' failover drill with the replica lagging, on a Sentinel
    /// set (its primary) or a Redis Cluster (the master of `key`'s slot):
    /// pause the replica(s), run `while_lagging`, wait `lag`, kill -9 the
    /// primary, resume, and wait up to `limit` for the promotion. Returns
    /// (killed, promoted) `host:port`; `None` for servers with no failover
    /// (blocking: call it off the runtime's worker threads).
    pub fn failover(
        &self,
        key: &str,
        lag: std::time::Duration,
        while_lagging: impl FnOnce(),
        limit: std::time::Duration,
    ) -> Option<fleet::Result<(String, String)>> {
        match self {
            Servers::Sentinel(f) => Some(f.kill_primary_lagging(lag, while_lagging, limit)),
            Servers::RedisCluster(f) => Some(f.master_of_key(key).and_then(|m| {
                let old = m.host_port();
                f.failover_lagging(m, lag, while_lagging, limit)
                    .map(|new| (old, new))
            })),
            _ => None,
        }
    }

    /// Restarts a node killed by [`Servers::failover`] and waits until it
    /// follows the new primary as a synced replica.
    pub fn rejoin(&self, host_port: &str, limit: std::time::Duration) -> Option<fleet::Result<()>> {
        match self {
            Servers::Sentinel(f) => Some(f.rejoin(host_port, limit)),
            Servers::RedisCluster(f) => Some(f.rejoin(host_port, limit)),
            _ => None,
        }
    }

    /// What `lockbench run --endpoint` takes to reach these servers (a
    /// comma-separated list where the backend has several); `None` when
    /// nothing was started.
    pub fn endpoint(&self) -> Option<String> {
        match self {
            Servers::External => None,
            Servers::Redis(f) => Some(f.urls().join(",")),
            // Through the sentinels, as a Sentinel user deploys it: the
            // lock finds the primary, and finds it again after a failover.
            Servers::Sentinel(f) => Some(format!(
                "redis+sentinel://{}/{}",
                f.sentinels
                    .iter()
                    .map(|s| s.host_port())
                    .collect::<Vec<_>>()
                    .join(","),
                fleet::SENTINEL_MASTER_NAME
            )),
            Servers::RedisCluster(f) => Some(f.endpoint()),
            Servers::Postgres(f) => Some(f.url()),
            Servers::Zookeeper(f) => Some(f.connect_string()),
            Servers::Etcd(f) => Some(f.endpoints().join(",")),
        }
    }

    /// One line for results.json; `endpoint` is what the run was pointed at
    /// when nothing was started here (shown redacted).
    pub fn describe(&self, endpoint: Option<&str>) -> String {
        match self {
            Servers::External => format!(
                "external {}",
                endpoint
                    .map(|e| {
                        e.split(',')
                            .map(distlock::redact_url)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_else(|| "(in-process)".into())
            ),
            Servers::Redis(f) if f.nodes.len() == 1 => {
                format!("fleet: redis single at {}", f.nodes[0].host_port())
            }
            Servers::Redis(f) => format!(
                "fleet: {} independent redis masters at {}",
                f.nodes.len(),
                f.nodes
                    .iter()
                    .map(|n| n.host_port())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Servers::Postgres(f) => format!("fleet: postgresql at {}", f.node.host_port()),
            Servers::Zookeeper(f) if f.nodes.len() == 1 => {
                format!("fleet: zookeeper standalone at {}", f.connect_string())
            }
            Servers::Zookeeper(f) => format!(
                "fleet: zookeeper ensemble x{} at {}",
                f.nodes.len(),
                f.connect_string()
            ),
            Servers::Etcd(f) => format!(
                "fleet: etcd x{} at {}",
                f.nodes.len(),
                f.endpoints().join(", ")
            ),
            Servers::Sentinel(f) => format!(
                "fleet: redis primary {} + replica {} + 3 sentinels at {}",
                f.primary.host_port(),
                f.replica.host_port(),
                f.sentinels
                    .iter()
                    .map(|s| s.host_port())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Servers::RedisCluster(f) => format!(
                "fleet: redis cluster, {} masters + {} replicas at {}",
                f.masters.len(),
                f.replicas.len(),
                f.nodes()
                    .iter()
                    .map(|n| n.host_port())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The file system type of `node`'s data directory.
fn filesystem_of(node: &fleet::Node) -> String {
    fleet::filesystem_type(node.dir()).unwrap_or_else(|| "unknown".into())
}
