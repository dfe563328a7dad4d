//! Configuration of [`crate::EtcdLock`].

use std::fmt;
use std::time::Duration;

use distlock::{redact_url, Error, Result};
use serde::{Deserialize, Serialize};

/// Settings for [`crate::EtcdLock`]. Read from the `[etcd]` table of a
/// lockbench TOML file or from `LOCKBENCH_ETCD_*` environment variables.
/// etcd endpoints carry no secrets of their own, but `Debug` still redacts
/// a `user:password@` someone may have written into a URL.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the cluster members, e.g. `http://127.0.0.2:21000`
    /// (`etcd.endpoints`). Requests are balanced over all of them.
    pub endpoints: Vec<String>,
    /// Key prefix: a lock on `k` lives under `<prefix>/<k>/`.
    pub prefix: String,
    /// TTL of the session lease every watchdog-mode lock is attached to, in
    /// whole seconds (etcd's granularity); kept alive every third of it. A
    /// crashed holder's lock is freed after at most this long.
    pub session_ttl_s: u64,
    /// Deadline for the first contact with the cluster.
    pub connect_timeout_ms: u64,
    /// Deadline of every request.
    pub op_timeout_ms: u64,
    /// PEM file of the CA that signed the members' certificates, for
    /// `https://` endpoints (`etcd.ca_file`, `LOCKBENCH_ETCD_CA_FILE`);
    /// empty: the system's roots. Hidden wherever settings are shown.
    pub ca_file: String,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "lockbench/lock".into(),
            session_ttl_s: 10,
            connect_timeout_ms: 2_000,
            op_timeout_ms: 2_000,
            ca_file: String::new(),
        }
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| redact_url(e)).collect();
        f.debug_struct("EtcdConfig")
            .field("endpoints", &endpoints)
            .field("prefix", &self.prefix)
            .field("session_ttl_s", &self.session_ttl_s)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("op_timeout_ms", &self.op_timeout_ms)
            .field("ca_file", &if self.ca_file.is_empty() { "" } else { "***" })
            .finish()
    }
}

impl EtcdConfig {
    /// A config for these endpoints with defaults otherwise.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Applies `LOCKBENCH_ETCD_ENDPOINTS` (comma-separated) and
    /// `LOCKBENCH_ETCD_SESSION_TTL_S` over `self`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable that is not a number.
    pub fn with_env(mut self) -> Result<Self> {
        if let Ok(v) = std::env::var("LOCKBENCH_ETCD_ENDPOINTS") {
            self.endpoints = split_endpoints(&v);
        }
        if let Ok(v) = std::env::var("LOCKBENCH_ETCD_CA_FILE") {
            self.ca_file = v;
        }
        if let Ok(v) = std::env::var("LOCKBENCH_ETCD_SESSION_TTL_S") {
            self.session_ttl_s = v.parse().map_err(|_| {
                Error::config(
                    "LOCKBENCH_ETCD_SESSION_TTL_S",
                    format!("not a number: {v:?}"),
                )
            })?;
        }
        Ok(self)
    }

    /// Checks values that would make the lock misbehave.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad key.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::config("etcd.endpoints", "no endpoint given"));
        }
        let tls = self.endpoints.iter().any(|e| e.starts_with("https://"));
        for e in &self.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(Error::config(
                    "etcd.endpoints",
                    format!("{:?} is not an http:// or https:// URL", redact_url(e)),
                ));
            }
            authority_ok(e).map_err(|why| {
                Error::config("etcd.endpoints", format!("{:?}: {why}", redact_url(e)))
            })?;
            if tls != e.starts_with("https://") {
                return Err(Error::config(
                    "etcd.endpoints",
                    "mixes http:// and https:// members: one client speaks one of them",
                ));
            }
        }
        if !self.ca_file.is_empty() && !tls {
            return Err(Error::config(
                "etcd.ca_file",
                "a CA is for https:// endpoints",
            ));
        }
        if self.prefix.is_empty() || self.prefix.ends_with('/') {
            return Err(Error::config(
                "etcd.prefix",
                "must be non-empty and not end with '/'",
            ));
        }
        if self.session_ttl_s == 0 {
            return Err(Error::config("etcd.session_ttl_s", "must be at least 1 s"));
        }
        if self.op_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return Err(Error::config(
                if self.op_timeout_ms == 0 {
                    "etcd.op_timeout_ms"
                } else {
                    "etcd.connect_timeout_ms"
                },
                "must be positive",
            ));
        }
        Ok(())
    }

    /// The endpoints fit to print, comma-separated.
    pub fn endpoints_shown(&self) -> String {
        self.endpoints
            .iter()
            .map(|e| redact_url(e))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub(crate) fn session_ttl(&self) -> Duration {
        Duration::from_secs(self.session_ttl_s)
    }
}

/// Checks the `host[:port]` of a client URL. The gRPC stack reads a port
/// it cannot parse (`:70000`, `:abc`) as no port at all, and so dials the
/// scheme's default (80): a run against a server nobody named.
fn authority_ok(url: &str) -> std::result::Result<(), String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, tail)) => match tail.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return Err(format!("{tail:?} after the IPv6 address")),
            },
            None => return Err("an IPv6 address without its closing ']'".into()),
        },
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let digits = port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()));
    match port.map(str::parse::<u16>) {
        None | Some(Ok(1..)) if digits => Ok(()),
        _ => Err(format!(
            "the port {:?} is not one of 1-65535",
            port.unwrap_or_default()
        )),
    }
}

/// `a,b, c` -> `["a", "b", "c"]`.
pub fn split_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl distlock::descriptor::Config for EtcdConfig {
    const FAMILY: &'static str = "etcd";
    const ENV_VARS: &'static [&'static str] = &[
        "LOCKBENCH_ETCD_ENDPOINTS",
        "LOCKBENCH_ETCD_SESSION_TTL_S",
        "LOCKBENCH_ETCD_CA_FILE",
    ];

    fn with_env(self) -> Result<Self> {
        EtcdConfig::with_env(self)
    }

    fn validate(&self) -> Result<()> {
        EtcdConfig::validate(self)
    }

    /// Client URLs, comma-separated.
    fn set_endpoint(&mut self, endpoint: &str) {
        self.endpoints = split_endpoints(endpoint);
    }

    fn endpoint(&self) -> String {
        self.endpoints.join(",")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    fn with(endpoint: &str) -> Result<()> {
        EtcdConfig::new(vec![endpoint.to_string()]).validate()
    }

    #[test]
    fn a_port_out_of_range_or_not_a_number_is_named() {
        for bad in [
            "http://127.0.0.1:70000",
            "http://127.0.0.1:-1",
            "http://127.0.0.1:abc",
            "http://127.0.0.1:0",
            "http://127.0.0.1:",
            "http://[::1]:99999",
            "http://[::1",
            "http://:2379",
            "http://[::1]junk",
            "http://127.0.0.1:+2379",
        ] {
            let e = with(bad).unwrap_err().to_string();
            assert!(
                e.contains("etcd.endpoints") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        for good in [
            "http://127.0.0.1:2379",
            "http://localhost:2379/",
            "https://127.0.0.2",
            "http://[::1]:2379",
            "http://user:pw@127.0.0.1:2379",
        ] {
            with(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }
}
