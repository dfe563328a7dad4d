//! Redis locks for lockbench.
//!
//! - [`RedisLock`] (`redis`, `redis-cluster`, and `redis-wait` with
//!   `wait_replicas > 0`): `SET NX PX` + fencing token in one Lua script,
//!   Lua compare-and-delete release, watchdog renewal, a fair queue whose
//!   release wakes only the next waiter; on
//!   one server, on a primary found through Sentinel
//!   (`redis+sentinel://h1:p1,h2:p2/name`) or on a Redis Cluster
//!   (`redis+cluster://h1:p1,h2:p2`).
//! - Negative controls from the seed articles, deliberately broken:
//!   [`SetnxExpireLock`], [`GetDelLock`], [`ShortLeaseLock`].
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::{AcquireOptions, DistLock};
//! let lock = lockbench_redis::RedisLock::connect(
//!     lockbench_redis::RedisConfig::new("redis://127.0.0.2:21000"),
//! ).await?;
//! let g = lock.acquire("coupon:1", AcquireOptions::wait(std::time::Duration::from_secs(3))).await?;
//! println!("token {:?}", g.token());
//! g.release().await?;
//! # Ok(()) }
//! ```

mod broken;
mod client;
mod config;
mod conn;
mod descriptor;
mod lock;
pub mod node;
mod peers;

pub use broken::{
    GetDelLock, SetnxExpireLock, ShortLeaseLock, AFTER_SETNX, BETWEEN_GET_AND_DEL,
    BROKEN_CAPABILITIES,
};
pub use config::{redact, RedisConfig};
pub use descriptor::{
    RedisBackend, GET_DEL, REDIS, REDIS_CLUSTER, REDIS_WAIT, SETNX_EXPIRE, SHORT_LEASE,
};
pub use lock::RedisLock;
pub use peers::server_version;
