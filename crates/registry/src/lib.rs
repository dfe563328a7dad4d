//! The one list of lockbench backends. Each backend crate exports a
//! [`Descriptor`] (name, capabilities, topology, config, connect with its
//! floor and peers, version probe, redaction); the CLI, the benches and the
//! nemesis read them here and know no backend by name. Adding a backend is
//! one crate and one line in [`BACKENDS`].
//!
//! ```
//! let redis = lockbench_registry::find("redis").unwrap();
//! assert!(redis.capabilities().fencing);
//! ```

mod servers;
mod settings;

pub use distlock::descriptor::{BuildParams, Connected, Descriptor, Topology};
pub use fleet::Durability;
pub use servers::{Servers, EXTERNAL_DURABILITY};
pub use settings::Settings;

use distlock::{Error, Result};

/// Every backend, in report order.
pub static BACKENDS: &[&dyn Descriptor] = &[
    &lockbench_redis::REDIS,
    &lockbench_redis::REDIS_CLUSTER,
    &lockbench_redis::REDIS_WAIT,
    &lockbench_redlock::REDLOCK,
    &lockbench_postgres::PG_ADVISORY,
    &lockbench_postgres::PG_ROW,
    &lockbench_postgres::PG_OPTIMISTIC,
    &lockbench_zookeeper::ZOOKEEPER,
    &lockbench_etcd::ETCD,
    &lockbench_redis::SETNX_EXPIRE,
    &lockbench_redis::GET_DEL,
    &lockbench_redis::SHORT_LEASE,
    &distlock::memory::MEMORY,
];

/// Looks a backend up by name.
///
/// # Errors
/// [`Error::Config`] listing the valid names.
pub fn find(name: &str) -> Result<&'static dyn Descriptor> {
    BACKENDS
        .iter()
        .copied()
        .find(|b| b.name() == name)
        .ok_or_else(|| {
            Error::config(
                "backend",
                format!(
                    "unknown backend {name:?}; valid: {}",
                    BACKENDS
                        .iter()
                        .map(|b| b.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

/// What `lockbench backends --json` prints for one backend.
pub fn describe(b: &dyn Descriptor) -> serde_json::Value {
    serde_json::json!({
        "name": b.name(),
        "about": b.about(),
        "capabilities": b.capabilities(),
        "topology": b.topology(),
        "negative_control": b.negative_control(),
        "needs_fault": b.needs_fault(),
        "distributed": b.distributed(),
        "config_table": b.family(),
        "env": b.env_vars(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for b in BACKENDS {
            assert_eq!(find(b.name()).map(|d| d.name()).ok(), Some(b.name()));
        }
        let mut names: Vec<_> = BACKENDS.iter().map(|b| b.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BACKENDS.len());
        let e = find("nope")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("redis-wait") && e.contains("memory"), "{e}");
    }

    #[test]
    fn every_backend_has_default_settings_and_a_family() {
        for b in BACKENDS {
            assert!(!b.family().is_empty());
            assert!(b.settings(None).is_ok(), "{}: defaults must load", b.name());
        }
    }
}
