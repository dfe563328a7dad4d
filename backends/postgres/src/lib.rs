//! PostgreSQL locks for lockbench, on `sqlx`:
//!
//! - [`PgAdvisoryLock`] (`pg-advisory`): session-level `pg_advisory_lock` on
//!   a session of its own per acquisition, server-side waiting under
//!   `lock_timeout`, fencing token from a sequence, connection loss = lock
//!   loss (pinged), and a dead client host's sessions dropped by the server
//!   after `dead_host_timeout_ms` (TCP keepalives).
//! - [`PgRowLock`] (`pg-row`): a lease row, expiry by the database clock.
//! - [`PgOptimisticLock`] (`pg-optimistic`): version-column CAS with backoff.
//!
//! Every `acquire` is its own owner (its own session, or an owner value no
//! other acquisition writes): tasks sharing one handle exclude each other as
//! separate clients do, and a stale release never touches a later
//! acquisition. Reentrancy is explicit, through `Guard::reenter`.
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
mod descriptor;
mod row;

pub use advisory::PgAdvisoryLock;
pub use common::advisory_id;
pub use config::{redact, PgConfig};
pub use descriptor::{PgBackend, PG_ADVISORY, PG_OPTIMISTIC, PG_ROW};
pub use row::{PgOptimisticLock, PgRowLock};
