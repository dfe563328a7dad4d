//! What the CLI, the benches, the report and the nemesis know about a
//! backend, in one place per backend: each backend crate exports a
//! [`Descriptor`], and the registry is a list of them (sqlx's per-driver
//! `DRIVER` constants, OpenDAL's `registry.register`). Adding a backend is
//! one crate and one line in that list.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::{Capabilities, DistLock, Error, Result};

/// The servers a backend needs when lockbench starts them itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Nothing to start: the lock lives inside the process.
    InProcess,
    /// One Redis node.
    RedisSingle,
    /// Redis primary + replica + 3 sentinels.
    RedisPrimaryReplica,
    /// A Redis Cluster: this many masters, each with this many replicas.
    RedisCluster {
        /// Masters (the slots are split between them).
        masters: usize,
        /// Replicas per master (what a failover promotes).
        replicas: usize,
    },
    /// N independent Redis masters (RedLock).
    RedisIndependent(usize),
    /// The same, each under libfaketime so a fault can move its clock
    /// (`--fault clock-jump`; not the default: the shim costs time).
    RedisIndependentFakeClocks(usize),
    /// One PostgreSQL server.
    Postgres,
    /// One standalone ZooKeeper server.
    Zookeeper,
    /// A ZooKeeper ensemble of N servers.
    ZookeeperEnsemble(usize),
    /// One etcd node.
    Etcd,
    /// An etcd cluster of N members.
    EtcdCluster(usize),
}

/// One timed sample besides the lock under test: the backend's raw floor
/// (the round trips a cycle cannot beat, e.g. two PINGs on the lock's own
/// connection) or a peer implementation (another crate's lock).
#[async_trait::async_trait]
pub trait Probe: Send + Sync {
    /// One sample.
    async fn once(&self) -> Result<()>;
}

/// What the latency workload times besides our lock.
#[derive(Default)]
pub struct Probes {
    /// The backend's raw floor.
    pub floor: Option<Box<dyn Probe>>,
    /// Peers, by name (`redis`, `rslock`, ...).
    pub peers: Vec<(String, Box<dyn Probe>)>,
}

/// A peer that is itself a [`DistLock`]: one try-lock + release of `key`.
pub struct LockCycle {
    /// The peer lock.
    pub lock: Arc<dyn DistLock>,
    /// Its key (kept apart from the measured lock's key).
    pub key: String,
}

#[async_trait::async_trait]
impl Probe for LockCycle {
    async fn once(&self) -> Result<()> {
        self.lock
            .acquire(&self.key, crate::AcquireOptions::try_lock())
            .await?
            .release()
            .await?;
        Ok(())
    }
}

/// A connected client and what the latency workload times next to it.
pub struct Connected {
    /// The lock under test.
    pub lock: Arc<dyn DistLock>,
    /// Its raw floor and peers (empty unless asked for).
    pub probes: Probes,
}

impl Connected {
    /// A lock with nothing timed beside it.
    pub fn plain(lock: Arc<dyn DistLock>) -> Self {
        Self {
            lock,
            probes: Probes::default(),
        }
    }
}

/// Run parameters some backends need when they are built.
#[derive(Debug, Clone)]
pub struct BuildParams {
    /// Time inside the critical section (the short-lease control takes half).
    pub hold: Duration,
    /// Build the raw floor and the peers too (latency workload only).
    pub probes: bool,
    /// The key the workload locks (a cluster's floor pings its master).
    pub key: String,
}

/// Everything lockbench knows about one backend.
///
/// Settings travel as JSON values of the backend's own config table
/// (`[redis]`, `[postgres]`, ...; several backends of one family share a
/// table), so the registry can hold every backend in one list.
#[async_trait::async_trait]
pub trait Descriptor: Send + Sync + std::fmt::Debug + 'static {
    /// The registry name (`redis`, `redlock`, ...).
    fn name(&self) -> &'static str;

    /// One line on what it is.
    fn about(&self) -> &'static str;

    /// What it declares.
    fn capabilities(&self) -> Capabilities;

    /// A deliberately broken lock from the seeds, kept to prove the
    /// checkers catch it.
    fn negative_control(&self) -> bool {
        false
    }

    /// For a control that only a fault exposes: that fault (the fault-free
    /// workloads cannot catch it, and the report says so).
    fn needs_fault(&self) -> Option<&'static str> {
        None
    }

    /// The servers it needs when lockbench starts them.
    fn topology(&self) -> Topology;

    /// Its replicated deployment (`--topology cluster`), where it has one:
    /// what minority faults and partitions need (a Redis Cluster for
    /// `redis`).
    fn cluster_topology(&self) -> Option<Topology> {
        None
    }

    /// A fault point inside its acquire (between two steps), where
    /// `acquire-crash` makes a client exit; `None` for a one-step acquire.
    fn crash_point(&self) -> Option<&'static str> {
        None
    }

    /// A fault point inside its release, where `holder-pause` stalls the
    /// holder instead of stopping it at a random moment; `None` if the
    /// release is one step.
    fn pause_point(&self) -> Option<&'static str> {
        None
    }

    /// Its deployment behind Redis Sentinel (`--topology sentinel`), where
    /// it has one: the lock finds the primary through the sentinels.
    fn sentinel_topology(&self) -> Option<Topology> {
        None
    }

    /// Whether its clients in different processes share one lock (false
    /// only for the in-memory reference lock).
    fn distributed(&self) -> bool {
        true
    }

    /// The config table it reads (`redis` for every redis-* backend).
    fn family(&self) -> &'static str;

    /// The environment variables it reads, for `--help` and errors.
    fn env_vars(&self) -> &'static [&'static str] {
        &[]
    }

    /// Its settings: the config file's table (`None`: defaults), then the
    /// environment's overrides, validated.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad key.
    fn settings(&self, table: Option<Value>) -> Result<Value>;

    /// Points `settings` at `endpoint`, in the form `lockbench run
    /// --endpoint` takes (a comma-separated list where it needs several).
    ///
    /// # Errors
    /// [`Error::Config`] when the endpoint cannot be one of its servers.
    fn set_endpoint(&self, settings: &mut Value, endpoint: &str) -> Result<()>;

    /// The endpoint the settings name when the user set one (config file or
    /// environment), `None` when they are the defaults: then lockbench
    /// starts the servers itself.
    fn configured_endpoint(&self, settings: &Value) -> Option<String>;

    /// Whether this backend can run on the servers `settings` name, known
    /// without connecting (e.g. `redis-cluster` needs a cluster's seed
    /// nodes, not one plain server). [`Descriptor::connect`] checks it too;
    /// a comparison asks first, to leave such a backend out rather than
    /// stop halfway.
    ///
    /// # Errors
    /// [`Error::Config`] naming the key and what it would take.
    fn check_servers(&self, _settings: &Value) -> Result<()> {
        Ok(())
    }

    /// `settings` fit to print and store: every secret hidden.
    fn redacted(&self, settings: &Value) -> Value {
        redact_json(settings)
    }

    /// A connected client, with its floor and peers when `params.probes`.
    ///
    /// # Errors
    /// Bad settings (naming the key), an unreachable endpoint (naming it).
    async fn connect(&self, settings: &Value, params: BuildParams) -> Result<Connected>;

    /// The server's name and version, if it says.
    async fn server_version(&self, settings: &Value) -> Option<String>;
}

/// The one shape of every backend's config: a serde struct with defaults,
/// read from its TOML table, then overridden by environment variables,
/// then pointed at an endpoint, and validated when the lock connects.
pub trait Config: serde::Serialize + serde::de::DeserializeOwned + Default {
    /// The config table (`redis`, `postgres`, ...).
    const FAMILY: &'static str;
    /// The environment variables [`Config::with_env`] reads.
    const ENV_VARS: &'static [&'static str];

    /// Applies the environment's overrides.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable whose value is not usable.
    fn with_env(self) -> Result<Self>;

    /// Checks values that would make the lock misbehave.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad key.
    fn validate(&self) -> Result<()>;

    /// Points the config at `endpoint` (the `--endpoint` form).
    fn set_endpoint(&mut self, endpoint: &str);

    /// Where the config points, in the `--endpoint` form.
    fn endpoint(&self) -> String;
}

/// [`Descriptor::settings`] for a backend whose config is `C`.
///
/// # Errors
/// As [`Config::with_env`], or a table that does not parse (naming it).
pub fn settings_of<C: Config>(table: Option<Value>) -> Result<Value> {
    let cfg: C = match table {
        Some(t) => typed(C::FAMILY, &t)?,
        None => C::default(),
    };
    untyped(C::FAMILY, &cfg.with_env()?)
}

/// [`Descriptor::set_endpoint`] for a backend whose config is `C`.
///
/// # Errors
/// Settings that do not parse as `C`.
pub fn set_endpoint_of<C: Config>(settings: &mut Value, endpoint: &str) -> Result<()> {
    let mut cfg: C = typed(C::FAMILY, settings)?;
    cfg.set_endpoint(endpoint);
    *settings = untyped(C::FAMILY, &cfg)?;
    Ok(())
}

/// [`Descriptor::configured_endpoint`] for a backend whose config is `C`.
pub fn configured_endpoint_of<C: Config>(settings: &Value) -> Option<String> {
    let cfg: C = typed(C::FAMILY, settings).ok()?;
    let ep = cfg.endpoint();
    (ep != C::default().endpoint()).then_some(ep)
}

/// Reads a backend's typed config from its JSON settings.
///
/// # Errors
/// [`Error::Config`] naming the key (`redis.url`, not just `redis`: serde
/// alone says "invalid type: integer" without saying of what) and serde's
/// complaint.
pub fn typed<T: serde::de::DeserializeOwned>(family: &str, settings: &Value) -> Result<T> {
    serde_path_to_error::deserialize(settings.clone()).map_err(|e| {
        let path = e.path().to_string();
        let key = if path.is_empty() || path == "." {
            family.to_string()
        } else {
            format!("{family}.{path}")
        };
        Error::config(key, e.into_inner().to_string())
    })
}

/// Serialises a backend's typed config back to JSON settings.
///
/// # Errors
/// [`Error::Config`] if it cannot be (it always can for plain structs).
pub fn untyped<T: serde::Serialize>(family: &str, cfg: &T) -> Result<Value> {
    serde_json::to_value(cfg).map_err(|e| Error::config(family, e.to_string()))
}

/// Every string in `v` that is a URL with a password, with the password
/// hidden ([`crate::redact_url`]), at any depth: the default redaction, so
/// a backend that forgets a field still never writes a password to disk.
pub fn redact_json(v: &Value) -> Value {
    match v {
        // A list of endpoints in one string is redacted endpoint by endpoint.
        Value::String(s) => Value::String(
            s.split(',')
                .map(crate::redact_url)
                .collect::<Vec<_>>()
                .join(","),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact_json).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    // Secrets, and the paths of TLS files (a CA, a key):
                    // where a team keeps its certificates is not for a
                    // results file either.
                    let lower = k.to_ascii_lowercase();
                    let secret = matches!(
                        lower.as_str(),
                        "password" | "pass" | "secret" | "token" | "auth"
                    ) || lower.starts_with("tls")
                        || lower.starts_with("ssl")
                        || lower.ends_with("_file");
                    let shown = if secret && !v.is_null() {
                        Value::String("***".into())
                    } else {
                        redact_json(v)
                    };
                    (k.clone(), shown)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}
