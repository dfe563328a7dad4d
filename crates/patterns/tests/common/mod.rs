//! Real servers, started by the suite, and a lock connected to them.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use distlock::DistLock;
use lockbench_registry::{BuildParams, Servers};

/// A backend's servers, started here, and a lock on them; `table` is the
/// backend's config table (`{"watchdog_lease_ms": 300}`).
pub async fn start(name: &str, table: serde_json::Value) -> (Servers, Arc<dyn DistLock>) {
    let b = lockbench_registry::find(name).unwrap();
    let servers = tokio::task::block_in_place(|| Servers::start(b.topology())).unwrap();
    let lock = connect(name, &servers, table).await;
    (servers, lock)
}

/// Another client of the same servers.
pub async fn connect(name: &str, servers: &Servers, table: serde_json::Value) -> Arc<dyn DistLock> {
    let b = lockbench_registry::find(name).unwrap();
    let mut cfg = b.settings(Some(table)).unwrap();
    b.set_endpoint(&mut cfg, &servers.endpoint().unwrap())
        .unwrap();
    let params = BuildParams {
        hold: Duration::ZERO,
        probes: false,
        key: "k".into(),
    };
    b.connect(&cfg, params).await.unwrap().lock
}
