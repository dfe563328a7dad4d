//! `fleet`: real servers from the OS packages (Redis, Redis Sentinel,
//! PostgreSQL, ZooKeeper, etcd),
//! started by the suite itself as local child processes, and the faults we
//! inject into them.
//!
//! Every node binds its own loopback address (127.0.0.2, 127.0.0.3, ...) on
//! a port from a configurable base (`LOCKBENCH_PORT_BASE`, never a default
//! port, checked free first), lives in its own temp dir, and is torn down on
//! drop, on Ctrl-C ([`kill_all`]) and on panic. Each server runs in its own
//! process group with a parent-death signal, so not even a `kill -9` of the
//! test process leaves one behind.
//!
//! Every server starts in a [`Durability`] profile: `durable` (fsync before
//! acknowledging a write) or `volatile`. The constructors without a profile
//! (`single()`, `standalone()`, `start()`, ...) keep what they always did:
//! Redis volatile, ZooKeeper, etcd and PostgreSQL durable; the `*_with`
//! ones take the profile. Each [`Node`] reports its settings
//! ([`Node::durability`]).
//!
//! ```no_run
//! # fn demo() -> Result<(), fleet::FleetError> {
//! let zk = fleet::ZkFleet::ensemble(3)?;
//! let leader = zk.leader()?;
//! zk.nodes[leader].kill()?; // the rest elect a new leader
//! let redis = fleet::RedisFleet::single()?;
//! println!("redis at {}", redis.nodes[0].url());
//! redis.nodes[0].pause()?; // SIGSTOP
//! redis.nodes[0].resume()?; // SIGCONT
//! let etcd = fleet::EtcdFleet::single_with(fleet::Durability::Volatile)?;
//! assert_eq!(etcd.nodes[0].durability().map(|d| d.flags.clone()), Some(vec!["--unsafe-no-fsync".to_string()]));
//! # Ok(()) }
//! ```

mod durability;
mod etcd;
mod faketime;
mod net;
mod node;
mod partition;
mod postgres;
mod process;
mod redis;
mod tls;
mod zookeeper;

pub use durability::{
    filesystem_type, Durability, DurabilitySettings, ParseDurabilityError, ServerKind,
};
pub use etcd::EtcdFleet;
pub use net::{forward, loopback_addr, PortAllocator};
pub use node::{Node, NodeSpec, Readiness};
pub use partition::{heal_all, Partition, Side};
pub use postgres::PostgresFleet;
pub use process::kill_all;
pub use redis::{
    RedisClusterFleet, RedisFleet, SentinelFleet, MASTER_NAME as SENTINEL_MASTER_NAME,
};
pub use tls::{make_certs, TestCerts};
pub use zookeeper::{four_letter_word, ZkFleet};

use std::path::PathBuf;

/// What can go wrong starting or controlling servers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// A server binary is not installed.
    #[error(
        "`{binary}` not found (looked in {looked}); install it with: apt-get install {package}"
    )]
    MissingBinary {
        /// The program we need.
        binary: String,
        /// Where we looked.
        looked: String,
        /// The Debian package that ships it.
        package: &'static str,
    },
    /// A node did not become ready in time.
    #[error("{node} not ready after {secs:.1}s: {reason}\n--- last lines of {log} ---\n{tail}")]
    NotReady {
        /// Node name.
        node: String,
        /// Seconds waited.
        secs: f64,
        /// Last readiness error.
        reason: String,
        /// Log file path.
        log: String,
        /// The log's last lines.
        tail: String,
    },
    /// No free port / address could be found.
    #[error("no free port: {0}")]
    NoPort(String),
    /// A control operation failed.
    #[error("{node}: {op}: {message}")]
    Control {
        /// Node name.
        node: String,
        /// Operation.
        op: &'static str,
        /// What happened.
        message: String,
    },
    /// File system or process error.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl FleetError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| FleetError::Io { context, source }
    }
}

/// Result type of this crate.
pub type Result<T, E = FleetError> = std::result::Result<T, E>;

/// Finds `binary` in PATH or in `extra` directories; a missing one names the
/// Debian package to install.
///
/// # Errors
/// [`FleetError::MissingBinary`].
pub fn find_binary(binary: &str, package: &'static str, extra: &[PathBuf]) -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(PathBuf::from),
    );
    dirs.extend(extra.iter().cloned());
    for d in &dirs {
        let p = d.join(binary);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(FleetError::MissingBinary {
        binary: binary.to_string(),
        looked: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":"),
        package,
    })
}

/// A temp dir for one fleet: named `lockbench-<tag>-...` so a leak is easy
/// to spot, world-traversable so a server running as another user (postgres)
/// can reach its own subdirectory.
pub(crate) fn fleet_dir(kind: &str) -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_orphans(&std::env::temp_dir()));
    let tag = std::env::var("LOCKBENCH_FLEET_TAG").unwrap_or_else(|_| "fleet".into());
    let dir = tempfile::Builder::new()
        .prefix(&format!("lockbench-{tag}-{kind}-"))
        .tempdir()
        .map_err(FleetError::io("creating the fleet's temp dir"))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(FleetError::io("chmod of the fleet's temp dir"))?;
    // Who owns it, for the sweep of a later run should we be SIGKILLed
    // (no Drop, no handler: the dir, a data directory of up to 100 MB,
    // stayed forever). The owner holds a lock on the file for as long as
    // it lives (the kernel drops it with the process), which a sweep in
    // another PID namespace sees where it could not see the pid.
    let owner = dir.path().join(OWNER_FILE);
    std::fs::write(&owner, std::process::id().to_string())
        .map_err(FleetError::io("writing the fleet's owner file"))?;
    if let Ok(f) = std::fs::File::open(&owner) {
        if try_lock(&f) {
            if let Ok(mut held) = OWNER_LOCKS.lock() {
                held.push(f);
            }
        }
    }
    Ok(dir)
}

/// The owner files this process holds locked (see [`fleet_dir`]).
static OWNER_LOCKS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// `flock(LOCK_EX | LOCK_NB)`: whether we got it.
fn try_lock(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor we own.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// The file in a fleet dir naming the process that made it.
const OWNER_FILE: &str = "lockbench-owner.pid";

/// Removes fleet dirs under `tmp` whose owner process is gone (killed
/// with SIGKILL, or a machine that went down) and that nobody touched for
/// a minute. A dir without an owner file is left alone: not ours to judge.
fn sweep_orphans(tmp: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("lockbench-") {
            continue;
        }
        let path = e.path();
        let Some(pid) = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        else {
            continue;
        };
        // Its owner's lock on the file, then (for a run of an older build)
        // its pid: either one alive keeps the dir.
        let locked = std::fs::File::open(path.join(OWNER_FILE))
            .map(|f| !try_lock(&f))
            .unwrap_or(true);
        let alive = locked || std::path::Path::new(&format!("/proc/{pid}")).exists();
        let idle = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|d| d > std::time::Duration::from_secs(60));
        if !alive && idle {
            kill_dwellers(&path);
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(dir = %path.display(), pid, "removed a fleet directory whose run was killed")
                }
                Err(err) => {
                    tracing::debug!(dir = %path.display(), error = %err, "could not remove an orphaned fleet directory")
                }
            }
        }
    }
}

/// SIGKILLs every process working in `dir` (its cwd inside it): what a
/// killed run's servers left there. PostgreSQL's backends are not the
/// postmaster's children for `PR_SET_PDEATHSIG`, and a run SIGKILLed while
/// it held them stopped (`node-pause`) left nine of them stopped for good
/// (a probe). SIGKILL reaches a stopped process too.
fn kill_dwellers(dir: &std::path::Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if std::fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
            // SAFETY: kill(2) with a pid read just now from /proc.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            tracing::info!(pid, dir = %dir.display(), "killed a process a killed run left behind");
        }
    }
}

#[cfg(test)]
mod sweep_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::{Duration, SystemTime};

    fn fleet_like(
        tmp: &std::path::Path,
        name: &str,
        owner: Option<i32>,
        age: Duration,
    ) -> std::path::PathBuf {
        let d = tmp.join(name);
        std::fs::create_dir_all(d.join("data")).unwrap();
        if let Some(pid) = owner {
            std::fs::write(d.join(OWNER_FILE), pid.to_string()).unwrap();
        }
        let t = SystemTime::now() - age;
        std::fs::File::open(&d).unwrap().set_modified(t).unwrap();
        d
    }

    /// A SIGKILLed run's fleet dir is removed by the next run; a live
    /// run's, a fresh one, or one we did not make are left alone.
    #[test]
    fn only_dirs_of_dead_owners_idle_for_a_minute_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = (900_000..i32::MAX)
            .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .unwrap();
        let hour = Duration::from_secs(3600);
        let orphan = fleet_like(tmp.path(), "lockbench-fleet-pg-a", Some(dead), hour);
        let live = fleet_like(
            tmp.path(),
            "lockbench-fleet-pg-b",
            Some(i32::try_from(std::process::id()).unwrap()),
            hour,
        );
        let fresh = fleet_like(
            tmp.path(),
            "lockbench-fleet-pg-c",
            Some(dead),
            Duration::ZERO,
        );
        let foreign = fleet_like(tmp.path(), "lockbench-fleet-pg-d", None, hour);
        let other = fleet_like(tmp.path(), "other-e", Some(dead), hour);
        // Its owner in another PID namespace: the pid means nothing here,
        // the lock on the file does.
        let elsewhere = fleet_like(tmp.path(), "lockbench-fleet-pg-f", Some(dead), hour);
        let held = std::fs::File::open(elsewhere.join(OWNER_FILE)).unwrap();
        assert!(try_lock(&held));
        let t = SystemTime::now() - hour;
        std::fs::File::open(&elsewhere)
            .unwrap()
            .set_modified(t)
            .unwrap();
        // A server process the dead run left there, stopped (SIGKILLed
        // mid node-pause), and one in a live run's dir.
        let dweller = |dir: &std::path::Path| {
            let c = std::process::Command::new("sleep")
                .arg("60")
                .current_dir(dir.join("data"))
                .spawn()
                .unwrap();
            // SAFETY: signalling our own child.
            unsafe { libc::kill(i32::try_from(c.id()).unwrap(), libc::SIGSTOP) };
            c
        };
        let (mut left, mut neighbour) = (dweller(&orphan), dweller(&live));
        for d in [&orphan, &live] {
            std::fs::File::open(d).unwrap().set_modified(t).unwrap();
        }
        sweep_orphans(tmp.path());
        assert!(!orphan.exists(), "a dead run's dir stayed");
        let status = left.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "{status:?}"
        );
        assert!(
            neighbour.try_wait().unwrap().is_none(),
            "a live run's process was killed"
        );
        neighbour.kill().unwrap();
        let _ = neighbour.wait();
        for d in [live, fresh, foreign, other, elsewhere] {
            assert!(d.exists(), "{} was swept", d.display());
        }
    }
}
