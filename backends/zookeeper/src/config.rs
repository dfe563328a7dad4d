//! Configuration of the ZooKeeper lock.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings for [`crate::ZkLock`]: the `[zookeeper]` table of a lockbench
/// TOML file, or `LOCKBENCH_ZK_CONNECT`.
///
/// A ZooKeeper connect string holds hosts and an optional chroot, never a
/// credential (ZooKeeper authenticates with `addauth` after connecting), so
/// `Debug` shows it as it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// Connect string: `host:port[,host:port...]` (`zookeeper.connect`).
    pub connect: String,
    /// Session timeout asked of the server (it clamps it to its
    /// `min/maxSessionTimeout`). The lock lives as long as the session: a
    /// holder that dies frees the lock after about this long.
    pub session_timeout_ms: u64,
    /// Deadline for establishing the session.
    pub connect_timeout_ms: u64,
    /// Deadline of every request that does not wait for the lock.
    pub op_timeout_ms: u64,
    /// Parent of every lock directory (`<root>/<key>/`), created as a
    /// persistent node on connect.
    pub root: String,
    /// How a waiter learns its turn (`zookeeper.directory_watch`). Off (the
    /// default): Curator's recipe, a one-shot watch on the predecessor;
    /// its release marker means our turn, a plain deletion a children read
    /// (2 round trips per contended acquire, 3 when the node ahead gave
    /// up). On: one persistent recursive watch per contended key per
    /// session (ZooKeeper 3.6+), counting down the nodes ahead from their
    /// deletions (1 round trip), at the price of every create and delete
    /// on the key being sent to every session that waits on it. Measured
    /// on one key, 2 cores, release build: 4 workers 797–852 → 686–860
    /// cycles/s, 16 workers 762–842 → 453–484 (the fan-out costs more than
    /// the reads it saves once 16 processes share the cores).
    pub directory_watch: bool,
}

impl Default for ZkConfig {
    fn default() -> Self {
        Self {
            connect: "127.0.0.1:2181".into(),
            session_timeout_ms: 4_000,
            connect_timeout_ms: 2_000,
            op_timeout_ms: 2_000,
            root: "/lockbench/locks".into(),
            directory_watch: false,
        }
    }
}

impl ZkConfig {
    /// A config for `connect` with defaults otherwise.
    pub fn new(connect: impl Into<String>) -> Self {
        Self {
            connect: connect.into(),
            ..Self::default()
        }
    }

    /// Applies `LOCKBENCH_ZK_CONNECT`, `LOCKBENCH_ZK_SESSION_TIMEOUT_MS` and
    /// `LOCKBENCH_ZK_DIRECTORY_WATCH` (`true`/`false`) over `self`.
    ///
    /// # Errors
    /// [`distlock::Error::Config`] naming the variable that does not parse.
    pub fn with_env(mut self) -> distlock::Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_ZK_CONNECT") {
            self.connect = v;
        }
        if let Ok(v) = std::env::var("LOCKBENCH_ZK_SESSION_TIMEOUT_MS") {
            self.session_timeout_ms = v.parse().map_err(|_| {
                distlock::Error::config(
                    "LOCKBENCH_ZK_SESSION_TIMEOUT_MS",
                    format!("{v:?} is not a number of milliseconds"),
                )
            })?;
        }
        if let Ok(v) = std::env::var("LOCKBENCH_ZK_DIRECTORY_WATCH") {
            self.directory_watch = v.parse().map_err(|_| {
                distlock::Error::config(
                    "LOCKBENCH_ZK_DIRECTORY_WATCH",
                    format!("{v:?} is not true or false"),
                )
            })?;
        }
        Ok(self)
    }

    /// Checks the values, naming the bad key.
    ///
    /// # Errors
    /// [`distlock::Error::Config`].
    pub fn validate(&self) -> distlock::Result<()> {
        for part in self.connect.split(',').map(str::trim) {
            if let Some((scheme, _)) = part.split_once("://") {
                if !matches!(scheme, "tcp" | "tcp+tls") {
                    // `zk://h:p` read as host "zk" and a chroot "/h:p": the
                    // error came later, about an empty node in a path.
                    return Err(distlock::Error::config(
                        "zookeeper.connect",
                        format!(
                            "{:?}: {scheme}:// is not a ZooKeeper scheme (tcp:// or tcp+tls://, or none): host:port[,host:port...][/chroot]",
                            self.connect
                        ),
                    ));
                }
            }
        }
        let port_ok = |p: &str| p.parse::<u16>().is_ok_and(|p| p > 0) && !p.starts_with('+');
        let host_ok = |h: &str| match h.strip_prefix('[') {
            // The crate gives a bracketed IPv6 address without a port 2181.
            Some(v6) => v6.split_once(']').is_some_and(|(a, tail)| {
                !a.is_empty() && (tail.is_empty() || tail.strip_prefix(':').is_some_and(port_ok))
            }),
            None => h
                .rsplit_once(':')
                .is_some_and(|(host, p)| !host.is_empty() && port_ok(p)),
        };
        let (hosts, _) = hosts_and_chroot(&self.connect);
        if hosts.is_empty() || !hosts.iter().all(|h| host_ok(h)) {
            return Err(distlock::Error::config(
                "zookeeper.connect",
                format!("{:?} is not host:port[,host:port...]", self.connect),
            ));
        }
        if self.session_timeout_ms < 100 {
            return Err(distlock::Error::config(
                "zookeeper.session_timeout_ms",
                "must be at least 100 ms",
            ));
        }
        if self.connect_timeout_ms == 0 || self.op_timeout_ms == 0 {
            return Err(distlock::Error::config(
                "zookeeper.op_timeout_ms",
                "connect_timeout_ms and op_timeout_ms must be positive",
            ));
        }
        if !self.root.starts_with('/') || self.root.len() < 2 || self.root.ends_with('/') {
            return Err(distlock::Error::config(
                "zookeeper.root",
                format!(
                    "{:?} is not an absolute node path like /lockbench/locks",
                    self.root
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }
}

impl distlock::descriptor::Config for ZkConfig {
    const FAMILY: &'static str = "zookeeper";
    const ENV_VARS: &'static [&'static str] = &[
        "LOCKBENCH_ZK_CONNECT",
        "LOCKBENCH_ZK_SESSION_TIMEOUT_MS",
        "LOCKBENCH_ZK_DIRECTORY_WATCH",
    ];

    fn with_env(self) -> distlock::Result<Self> {
        ZkConfig::with_env(self)
    }

    fn validate(&self) -> distlock::Result<()> {
        ZkConfig::validate(self)
    }

    /// A connect string `host:port[,host:port...][/chroot]`.
    fn set_endpoint(&mut self, endpoint: &str) {
        self.connect = endpoint.trim().to_string();
    }

    fn endpoint(&self) -> String {
        self.connect.clone()
    }
}

/// The first server's version from its `srvr` four-letter word, within 2 s
/// (a server may not allow the word: then none).
pub(crate) async fn server_version(connect: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let first = connect.split([',', '/']).next()?.trim().to_string();
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(&first).await.ok()?;
        s.write_all(b"srvr").await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let v = out
            .lines()
            .find_map(|l| l.strip_prefix("Zookeeper version: "))?;
        Some(format!("zookeeper {}", v.split(['-', ',']).next()?.trim()))
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), probe)
        .await
        .ok()?
}

/// The hosts of a connect string, each without the crate's `tcp://` or
/// `tcp+tls://`, and its chroot (after the last host), if any.
pub(crate) fn hosts_and_chroot(connect: &str) -> (Vec<&str>, Option<&str>) {
    let mut hosts = Vec::new();
    let mut chroot = None;
    for part in connect.split(',').map(str::trim) {
        let bare = part
            .strip_prefix("tcp://")
            .or_else(|| part.strip_prefix("tcp+tls://"))
            .unwrap_or(part);
        match bare.split_once('/') {
            Some((h, c)) => {
                hosts.push(h);
                chroot = Some(c);
            }
            None => hosts.push(bare),
        }
    }
    (hosts, chroot)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    #[test]
    fn a_connect_string_with_a_scheme_or_a_bad_port_is_named() {
        for bad in [
            "zk://127.0.0.1:2181",
            "http://127.0.0.1:2181",
            "127.0.0.1:70000",
            "127.0.0.1:abc",
            "127.0.0.1:+2181",
            "[::1]junk",
            "127.0.0.1:2181,127.0.0.2",
            ":2181",
            "",
        ] {
            let e = ZkConfig::new(bad).validate().unwrap_err().to_string();
            assert!(e.contains("zookeeper.connect"), "{bad}: {e}");
        }
        assert_eq!(
            hosts_and_chroot("tcp://h1:1,h2:2/app/x"),
            (vec!["h1:1", "h2:2"], Some("app/x"))
        );
        for good in [
            "127.0.0.1:2181",
            "127.0.0.1:2181,127.0.0.2:2181/app",
            "[::1]:2181",
            "[::1]",
            "tcp://127.0.0.1:2181/app",
            "tcp+tls://127.0.0.1:2281,tcp://127.0.0.2:2181",
        ] {
            ZkConfig::new(good)
                .validate()
                .unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }
}
