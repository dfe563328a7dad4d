//! Shared machinery of lockbench's criterion benches (`cargo bench`).
//!
//! Benches start their own servers through `fleet`, so nothing needs to be
//! running beforehand, and never time against a server a previous bench
//! left behind: every fleet binds fresh ports in its own temp dir and is
//! torn down before the next one starts.
//!
//! What `benches/locks.rs` measures, and how, is kept here in one module
//! per idea, so the bench itself only says which groups run:
//!
//! - [`cycle`]: one lock cycle as the harness's workloads run it (a
//!   waiting acquire with the CLI's default budget, watchdog lease, then
//!   release).
//! - [`rounds`]: the floor, the lock cycle and the peers taken side by
//!   side, in a seeded random order per round, so a drift of the machine
//!   weighs on all of them alike.
//! - [`window`]: many tasks cycling for a fixed time window with a shared
//!   work counter, as the harness's throughput workload does.
//! - [`order`]: the seeded, printed order groups run in.
//!
//! ```no_run
//! # async fn demo(lock: &dyn distlock::DistLock) -> distlock::Result<()> {
//! lockbench_benches::cycle(lock, "k").await?;
//! # Ok(()) }
//! ```

pub mod order;
pub mod rounds;
pub mod window;

use std::hint::black_box;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock};

/// The acquire budget of every bench cycle: the CLI's default `--wait-ms`
/// (`crates/cli/src/args.rs`), which the harness's workers pass as
/// `AcquireOptions { wait: Some(wait_ms), lease: lease_ms }`.
pub const WAIT: Duration = Duration::from_millis(10_000);

/// What the harness's latency and throughput workloads acquire with by
/// default: a waiting acquire (not a try-lock: some backends take another
/// path to wait, e.g. `pg-advisory`'s server-side `lock_timeout`), lease
/// renewed by the watchdog (no `--lease-ms`).
pub fn acquire_options() -> AcquireOptions {
    AcquireOptions {
        wait: Some(WAIT),
        lease: None,
    }
}

/// One lock cycle: acquire `key` with [`acquire_options`], release.
///
/// # Errors
/// The lock's own.
pub async fn cycle(lock: &dyn DistLock, key: &str) -> distlock::Result<()> {
    let g = lock.acquire(key, acquire_options()).await?;
    black_box(g.token());
    g.release().await?;
    Ok(())
}

/// Whether criterion runs this binary in test mode (`cargo test
/// --benches`, or `cargo bench -- --test`): each bench once, no figures.
/// Decided from the arguments exactly as criterion decides it: without
/// `--bench` (which `cargo bench` passes), or with `--test`.
pub fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    !has("--bench") || has("--test")
}

/// The median of `v` (sorted in place); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
