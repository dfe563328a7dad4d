//! Durability profiles: whether a server has a write on disk before it
//! acknowledges it, chosen per run so that latency comparisons set fsync
//! against fsync (or nothing against nothing), not one against the other.
//!
//! ```
//! use fleet::Durability;
//! assert_eq!(Durability::default(), Durability::Durable);
//! assert_eq!("volatile".parse::<Durability>().ok(), Some(Durability::Volatile));
//! assert_eq!(Durability::Volatile.to_string(), "volatile");
//! ```

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How hard the servers a fleet starts try to keep acknowledged writes.
///
/// The fleets' older constructors (`RedisFleet::single`,
/// `ZkFleet::standalone`, ...) keep the settings they always had: Redis
/// volatile, ZooKeeper, etcd and PostgreSQL durable. The `*_with`
/// constructors take a profile.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A write is on disk (fsynced) before the server acknowledges it:
    /// Redis with an append-only file fsynced on every write; ZooKeeper,
    /// etcd and PostgreSQL as shipped.
    #[default]
    Durable,
    /// The server may acknowledge a write that is only in memory (or in the
    /// page cache): Redis without persistence, etcd `--unsafe-no-fsync`,
    /// ZooKeeper `forceSync=no`, PostgreSQL `synchronous_commit=off`.
    Volatile,
}

impl Durability {
    /// Every profile, in the order to list them.
    pub const ALL: [Durability; 2] = [Durability::Durable, Durability::Volatile];

    /// The profile's name: `durable` or `volatile`.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Durable => "durable",
            Durability::Volatile => "volatile",
        }
    }

    /// One line on what the profile does to each server (for `--help`).
    pub fn about(self) -> &'static str {
        match self {
            Durability::Durable => {
                "fsync before every acknowledged write: Redis --appendonly yes --appendfsync always; \
                 ZooKeeper, etcd and PostgreSQL as shipped"
            }
            Durability::Volatile => {
                "acknowledged writes may be in memory only: Redis --save \"\" --appendonly no, \
                 etcd --unsafe-no-fsync, ZooKeeper forceSync=no, PostgreSQL synchronous_commit=off"
            }
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A durability profile name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability profile {0:?}; valid: durable, volatile")]
pub struct ParseDurabilityError(pub String);

impl FromStr for Durability {
    type Err = ParseDurabilityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Durability::ALL
            .into_iter()
            .find(|d| d.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParseDurabilityError(s.to_string()))
    }
}

/// Which server program a node runs (for the durability record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// `redis-server`.
    Redis,
    /// PostgreSQL's `postgres`.
    Postgresql,
    /// ZooKeeper's `QuorumPeerMain`.
    Zookeeper,
    /// `etcd`.
    Etcd,
}

impl ServerKind {
    /// The lowercase name used in results.json.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Postgresql => "postgresql",
            ServerKind::Zookeeper => "zookeeper",
            ServerKind::Etcd => "etcd",
        }
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one server was started with that decides whether an acknowledged
/// write is on disk: the settings a node's [`crate::NodeSpec`] carries and
/// [`crate::Node::durability`] reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DurabilitySettings {
    /// The server program.
    pub kind: ServerKind,
    /// The profile the node was started in.
    pub profile: Durability,
    /// Exactly the durability-relevant options given to the server
    /// (command-line arguments, or `zoo.cfg` lines for ZooKeeper); empty
    /// means the server's shipped defaults.
    pub flags: Vec<String>,
    /// What the server does with them, defaults included.
    pub note: &'static str,
}

/// The type of the file system holding `path` (`ext4`, `tmpfs`, `overlay`,
/// `xfs`, ...): fsync on tmpfs costs nothing, so a durable profile there is
/// not one. Read from `/proc/self/mountinfo` (the longest mount point
/// above `path`); `stat -f` only where that fails, as it names ext4
/// `ext2/ext3`.
pub fn filesystem_type(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    if let Some(fs) = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| fs_from_mountinfo(&m, &path))
    {
        return Some(fs);
    }
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&path)
        .output()
        .ok()?;
    let fs = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !fs.is_empty()).then_some(fs)
}

/// The file system type of the deepest mount in `mountinfo` holding `path`
/// (the last one mounted wins a tie, as it hides the ones below it).
fn fs_from_mountinfo(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        // `id parent major:minor root mount-point options [optional...] -
        // fstype source super-options`
        let mut fields = line.split(' ');
        let Some(mount_point) = fields.nth(4) else {
            continue;
        };
        let Some(fstype) = fields.skip_while(|f| *f != "-").nth(1) else {
            continue;
        };
        let mount_point = unescape_mountinfo(mount_point);
        if !path.starts_with(&mount_point) {
            continue;
        }
        let depth = Path::new(&mount_point).components().count();
        if !matches!(&best, Some((d, _)) if *d > depth) {
            best = Some((depth, fstype.to_string()));
        }
    }
    best.map(|(_, fs)| fs)
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Durability::ALL {
            assert_eq!(d.as_str().parse::<Durability>(), Ok(d));
            assert_eq!(
                serde_json::to_value(d).unwrap(),
                serde_json::json!(d.as_str())
            );
        }
        assert_eq!("Volatile".parse::<Durability>(), Ok(Durability::Volatile));
        assert!("fsync".parse::<Durability>().is_err());
    }

    #[test]
    fn the_deepest_mount_wins() {
        let info = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:27 / /tmp rw,nosuid shared:5 - tmpfs tmpfs rw
31 30 0:28 / /tmp/with\\040space rw - overlay overlay rw,lowerdir=/a
";
        let fs = |p: &str| fs_from_mountinfo(info, Path::new(p));
        assert_eq!(fs("/home/x").as_deref(), Some("ext4"));
        assert_eq!(fs("/tmp/lockbench-1").as_deref(), Some("tmpfs"));
        assert_eq!(fs("/tmpx").as_deref(), Some("ext4"));
        assert_eq!(fs("/tmp/with space/d").as_deref(), Some("overlay"));
    }

    #[test]
    fn this_machine_has_a_filesystem_type() {
        let fs = filesystem_type(&std::env::temp_dir()).unwrap();
        assert!(!fs.is_empty() && !fs.contains(' '), "{fs}");
    }
}
