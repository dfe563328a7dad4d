//! The etcd lock for lockbench: etcd's `concurrency.Mutex` recipe (a
//! session lease kept alive in the background, one key per contender
//! ordered by create revision, each waiter waiting for the keys ahead of
//! it to be deleted), written by hand so every round trip is ours to
//! count. Waiters of one handle share one watch per queue (`watch_hub`):
//! a watch opened per wait is served late by etcd once the revision has
//! moved on, which put hand-over p99 at 25-36x its p50 under contention.
//!
//! - [`EtcdLock`]: acquire = one transaction when uncontended; release =
//!   one transaction deleting our key only if it still has our create
//!   revision; fencing token = that create revision (what Jepsen's etcd
//!   3.4.3 analysis recommends). Every acquire is its own owner, with a
//!   queue key of its own, also between tasks sharing one handle; a
//!   cancelled acquire takes its key back in the background.
//! - [`LockRpc`]: etcd's own Lock RPC (v3lock) through `etcd-client`, the
//!   peer the latency workload times next to ours.
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::{AcquireOptions, DistLock};
//! let lock = lockbench_etcd::EtcdLock::connect(
//!     lockbench_etcd::EtcdConfig::new(["http://127.0.0.2:21000"]),
//! ).await?;
//! let g = lock.acquire("coupon:1", AcquireOptions::wait(std::time::Duration::from_secs(3))).await?;
//! println!("token {:?}", g.token());
//! g.release().await?;
//! # Ok(()) }
//! ```

mod config;
mod connect;
mod descriptor;
mod error;
mod held;
mod lock;
mod queue;
mod queue_key;
mod recipe;
mod rpc;
mod session;
mod watch_hub;

pub use config::{split_endpoints, EtcdConfig};
pub use descriptor::{EtcdBackend, ETCD};
pub use lock::EtcdLock;
pub use rpc::LockRpc;

/// `etcd <version>` of the member that answers, for results files; `None`
/// if none does within the connect timeout.
pub async fn server_version(cfg: &EtcdConfig) -> Option<String> {
    let mut c = connect::client(cfg).await.ok()?;
    let status = tokio::time::timeout(cfg.connect_timeout(), c.status())
        .await
        .ok()?
        .ok()?;
    Some(format!("etcd {}", status.version()))
}
