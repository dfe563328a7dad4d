//! The ZooKeeper lock for lockbench: Curator's InterProcessMutex recipe
//! (ephemeral-sequential nodes, the lowest holds the lock, each waiter
//! watches only its predecessor), written by us on the `zookeeper-client`
//! crate, with one change: a release writes a marker into its node in the
//! transaction that deletes it, so the waiter behind a holder knows it is
//! first without reading the children again (two round trips per contended
//! acquire instead of three). With `directory_watch` a waiter learns its
//! turn instead from one persistent watch per contended key per session
//! (the deletions of the nodes ahead of it, no read again). See [`ZkLock`].
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::{AcquireOptions, DistLock};
//! use lockbench_zookeeper::{ZkConfig, ZkLock};
//! let lock = ZkLock::connect(ZkConfig::new("127.0.0.2:21000,127.0.0.3:21000,127.0.0.4:21000")).await?;
//! let g = lock.acquire("coupon:1", AcquireOptions::wait(std::time::Duration::from_secs(3))).await?;
//! // fence writes with g.token() (the lock node's czxid)
//! g.release().await?;
//! # Ok(()) }
//! ```

mod config;
mod descriptor;
mod error;
mod held;
mod hub;
mod lock;
mod node;
mod probes;
mod recipe;
mod session;

pub use config::ZkConfig;
pub use descriptor::{ZkBackend, ZOOKEEPER};
pub use lock::ZkLock;
pub use node::node_name;
