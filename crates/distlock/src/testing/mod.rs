//! The conformance suite: plain async cases every backend's
//! `tests/conformance.rs` runs against its REAL server.
//!
//! Each case takes a [`Subject`] (a factory of independent clients plus an
//! admin path) and returns [`Outcome::Passed`], or
//! [`Outcome::NotApplicable`] with the capability that selects it out. A
//! failing case panics with what it saw, like any test assertion.

use std::sync::Arc;
use std::time::Duration;

use crate::{Capabilities, DistLock, Error, Result};

mod basic;
mod contention;
mod hardening;

pub use basic::*;
pub use contention::*;
pub use hardening::*;

/// What a backend's test gives the suite.
#[async_trait::async_trait]
pub trait Subject: Send + Sync {
    /// A new, independent client: its own connection and owner id.
    async fn client(&self) -> Result<Arc<dyn DistLock>>;

    /// Deletes the lock state of `key` behind its holder's back, as an
    /// operator or a failover would.
    async fn sabotage(&self, key: &str) -> Result<()>;

    /// The lease the clients' watchdog renews: short (300 ms to 2 s), but
    /// with room for a renewal that waits on a stalled server's fsync.
    fn watchdog_lease(&self) -> Duration;

    /// Restarts every server the clients talk to (kill -9, then start on
    /// the same address with the data the deployment keeps) and returns
    /// once they serve again. [`tokens_survive_restart`] needs it for every
    /// backend that declares fencing; a subject that cannot restart makes
    /// that case fail, not skip.
    async fn restart_servers(&self) -> Result<()> {
        Err(Error::Unsupported {
            backend: "conformance subject",
            what: "restarting its servers".into(),
        })
    }

    /// Connects a client to an endpoint where nothing listens; returns that
    /// endpoint as the error must name it, and what connecting gave.
    /// `Err(Unsupported)` (the default) selects [`unreachable_endpoint_fails_fast`]
    /// out, which the test must then list as skipped.
    async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
        (
            String::new(),
            Err(Error::Unsupported {
                backend: "conformance subject",
                what: "an unreachable endpoint".into(),
            }),
        )
    }

    /// Round trips an uncontended acquire of a key used before may cost.
    fn uncontended_round_trips(&self) -> u32 {
        1
    }
}

/// A case's verdict when it did not panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The case ran and held.
    Passed,
    /// The backend declares it lacks what the case tests.
    NotApplicable(&'static str),
}

/// A fresh key per case, so cases may share one server.
pub fn unique_key(case: &str) -> String {
    format!("conformance:{case}:{:016x}", rand::random::<u64>())
}

pub(crate) async fn client(s: &dyn Subject) -> Arc<dyn DistLock> {
    match s.client().await {
        Ok(c) => c,
        Err(e) => panic!("creating a client failed: {e}"),
    }
}

pub(crate) fn must<T>(r: Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: {e}"),
    }
}

pub(crate) fn caps(c: &Arc<dyn DistLock>) -> Capabilities {
    c.capabilities()
}

/// Checks a run's outcomes against the cases the test expects skipped:
/// every other case passed, and exactly those were selected out.
///
/// # Panics
/// When a case was skipped unexpectedly or ran although listed as skipped.
pub fn expect_outcome(case: &str, outcome: Outcome, skipped: &[&str]) {
    match outcome {
        Outcome::Passed => assert!(
            !skipped.contains(&case),
            "{case} ran and passed, but the test lists it as skipped by capability"
        ),
        Outcome::NotApplicable(why) => assert!(
            skipped.contains(&case),
            "{case} was selected out ({why}) but the test does not list it as skipped"
        ),
    }
}

/// Every case, in order, each reported by name (stdout) with its outcome:
/// for backends whose servers are slow to start, one server for all cases.
pub async fn run_all(s: &dyn Subject) -> Vec<(&'static str, Outcome)> {
    let mut out = Vec::new();
    macro_rules! run {
        ($($case:ident),*) => {$(
            println!("conformance case {} ...", stringify!($case));
            let o = $case(s).await;
            println!("conformance case {}: {:?}", stringify!($case), o);
            out.push((stringify!($case), o));
        )*};
    }
    run!(
        mutual_exclusion,
        try_lock_on_held_key,
        wait_budget_is_honoured,
        release_only_own,
        fixed_lease_expires,
        watchdog_keeps_lock,
        lost_fires,
        tokens_increase,
        reentrancy,
        drop_releases,
        shared_handle_mutual_exclusion,
        stale_release_same_handle,
        cancelled_acquire_leaves_nothing,
        cancelled_release_frees_the_key,
        dropped_off_runtime_frees_the_key,
        oversized_requests_are_refused_at_once,
        waiters_served_in_order,
        fixed_lease_after_waiting,
        valid_until_is_a_bound,
        unreachable_endpoint_fails_fast,
        uncontended_acquire_round_trips,
        waiting_forever_is_a_wait,
        tokens_survive_restart
    );
    out
}

/// Checks [`run_all`]'s outcomes (see [`expect_outcome`]).
///
/// # Panics
/// As [`expect_outcome`].
pub fn expect_outcomes(outcomes: Vec<(&'static str, Outcome)>, skipped: &[&str]) {
    for (case, o) in outcomes {
        expect_outcome(case, o, skipped);
    }
}

/// One `#[tokio::test]` per conformance case, each against a fresh
/// `$subject` (an expression, evaluated inside the test's runtime, so it
/// may `.await`), and asserting the cases skipped by capability are
/// exactly `skipped`. The ONE list of cases; [`run_all`] follows it.
///
/// ```ignore
/// distlock::conformance_tests!(subject: Redis::single(), skipped: []);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (subject: $subject:expr, skipped: [$($skip:ident),* $(,)?] $(,)?) => {
        $crate::conformance_tests!(@cases ($subject) (&[$(stringify!($skip)),*])
            mutual_exclusion try_lock_on_held_key wait_budget_is_honoured
            release_only_own fixed_lease_expires watchdog_keeps_lock lost_fires
            tokens_increase reentrancy drop_releases shared_handle_mutual_exclusion
            stale_release_same_handle cancelled_acquire_leaves_nothing
            cancelled_release_frees_the_key dropped_off_runtime_frees_the_key
            oversized_requests_are_refused_at_once
            waiters_served_in_order fixed_lease_after_waiting valid_until_is_a_bound
            unreachable_endpoint_fails_fast uncontended_acquire_round_trips
            waiting_forever_is_a_wait tokens_survive_restart);

        /// The skip list names real cases (a typo would not compile).
        #[test]
        fn conformance_skip_list_names_real_cases() {
            $(let _ = $crate::testing::$skip;)*
        }
    };
    // For servers slow to start (a JVM, initdb, a 3-node cluster): ONE
    // test running every case in turn on one subject (tokens_survive_restart,
    // which restarts the servers, runs last).
    (one_server: $subject:expr, skipped: [$($skip:ident),* $(,)?] $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn conformance() {
            let subject = $subject;
            $crate::testing::expect_outcomes(
                $crate::testing::run_all(&subject).await,
                &[$(stringify!($skip)),*],
            );
        }

        /// The skip list names real cases (a typo would not compile).
        #[test]
        fn conformance_skip_list_names_real_cases() {
            $(let _ = $crate::testing::$skip;)*
        }
    };
    (@cases ($subject:expr) ($skips:expr) $($case:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let subject = $subject;
            $crate::testing::expect_outcome(
                stringify!($case),
                $crate::testing::$case(&subject).await,
                $skips,
            );
        }
    )*};
}
