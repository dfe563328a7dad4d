//! RedLock over N independent Redis masters, as published in the Redis
//! documentation ("Distributed Locks with Redis"), written here so its cost
//! and its guarantees can be measured next to a single node.
//!
//! - Acquire: the single-node acquire script on ALL nodes in parallel, each
//!   with a short per-node timeout; success only with a quorum (N/2+1) AND
//!   time left: validity = lease - elapsed - drift, drift = lease x 1 % + 2 ms.
//!   [`distlock::Guard::valid_until`] reports exactly that.
//! - Failure: release at once on every node where our SET may have landed
//!   (including nodes that timed out). Then, by default (`redlock.fair`),
//!   wait in every master's queue of the key, ordered by the time this
//!   acquisition first asked (the same priority sent to all masters, so
//!   they agree on the order without talking to each other), until a
//!   quorum of masters has named us in a release's wake-up; a waiter
//!   refreshes its place every third of `waiter_ttl_ms`. Without the
//!   queue, retry after the spec's random delay, drawn as [`RetryPolicy`]
//!   says (default: a window that shrinks with the rounds already lost).
//!   Either way within the wait budget.
//! - Release / renewal: compare-and-delete / compare-and-pexpire on all
//!   nodes; a renewal counts only with a quorum inside the validity window.
//! - Fencing: none safe (Kleppmann 2016). The guard's token is the maximum of
//!   the per-node counters of the nodes we won, declared
//!   [`distlock::TokenSource::Unsafe`]: it can go backwards after a node
//!   restarts without persistence.
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::{AcquireOptions, DistLock};
//! let urls = (0..5).map(|i| format!("redis://127.0.0.{}:21000", i + 2)).collect();
//! let lock = lockbench_redlock::RedLock::connect(lockbench_redlock::RedLockConfig::new(urls)).await?;
//! let g = lock.acquire("coupon:1", AcquireOptions::wait(std::time::Duration::from_secs(3))).await?;
//! g.release().await?;
//! # Ok(()) }
//! ```

mod config;
mod descriptor;
mod fair;
mod lock;
mod retry;

pub use config::RedLockConfig;
pub use descriptor::{RedLockBackend, REDLOCK};
pub use lock::RedLock;
pub use retry::{RetryPolicy, UnknownPolicy};
