//! PostgreSQL locks for lockbench, on `sqlx`:
//!
//! - [`PgAdvisoryLock`] (`pg-advisory`): session-level `pg_advisory_lock` on
//!   a dedicated connection per held lock, server-side waiting under
//!   `lock_timeout`, fencing token from a sequence, connection loss = lock
//!   loss (pinged).
//! - [`PgRowLock`] (`pg-row`): a lease row, expiry by the database clock.
//! - [`PgOptimisticLock`] (`pg-optimistic`): version-column CAS with backoff.
//!
//! The tables (`lockbench_lease`, `lockbench_optimistic`) and the sequence
//! (`lockbench_fence`) are created on connect by sqlx's migrator.
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::{AcquireOptions, DistLock};
//! use lockbench_postgres::{PgConfig, PgRowLock};
//! let lock = PgRowLock::connect(PgConfig::new("postgres://postgres@127.0.0.2:21000/postgres")).await?;
//! let g = lock.acquire("coupon:1", AcquireOptions::wait(std::time::Duration::from_secs(3))).await?;
//! g.release().await?;
//! # Ok(()) }
//! ```

mod advisory;
mod common;
mod config;
mod row;

pub use advisory::PgAdvisoryLock;
pub use common::advisory_id;
pub use config::{redact, PgConfig};
pub use row::{PgOptimisticLock, PgRowLock};
