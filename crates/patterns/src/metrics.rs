//! Any lock, instrumented with the `metrics` facade.

use std::sync::Arc;
use std::time::Duration;

use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, Guard, GuardObserver, LostReason,
    ReleaseOutcome, Result,
};
use tokio::time::Instant;

/// Every metric [`Instrumented`] (and a degraded
/// [`crate::with_lock`]) writes, with what it measures. Each carries a
/// `backend` label; the counters of outcomes and losses carry one more.
pub const METRIC_NAMES: &[(&str, &str)] = &[
    (
        "lockbench_acquire_latency_seconds",
        "histogram: call to guard, acquires that got the lock",
    ),
    (
        "lockbench_acquire_wait_seconds",
        "histogram: how long every acquire call blocked its caller, whatever its outcome",
    ),
    (
        "lockbench_acquires_total",
        "counter by outcome: ok, timeout, error, indeterminate",
    ),
    (
        "lockbench_hold_seconds",
        "histogram: acquire sent to release answered",
    ),
    (
        "lockbench_renewals_total",
        "counter: watchdog lease extensions",
    ),
    (
        "lockbench_renewal_failures_total",
        "counter: renewals refused or not answered",
    ),
    (
        "lockbench_lost_total",
        "counter by reason: lost() signals (expired, not_owner, renewal_failed, session_ended)",
    ),
    (
        "lockbench_unlock_gone_total",
        "counter: releases that found the lock gone (the seed's 'unlock script returned 0')",
    ),
    (
        "lockbench_release_failures_total",
        "counter: releases that could not be sent or failed",
    ),
    (
        "lockbench_degraded_total",
        "counter: with_lock sections run under a local lock only (DegradeToLocal)",
    ),
];

/// A [`DistLock`] that records, for every acquire and every lock it hands
/// out, the metrics of [`METRIC_NAMES`] through the `metrics` facade (a
/// no-op until the program installs a recorder, e.g.
/// `metrics-exporter-prometheus`).
#[derive(Debug)]
pub struct Instrumented {
    inner: Arc<dyn DistLock>,
}

impl Instrumented {
    /// Wraps `inner`; its [`DistLock::name`] is the `backend` label.
    pub fn new(inner: Arc<dyn DistLock>) -> Self {
        Self::describe();
        Self { inner }
    }

    /// Registers each metric's help text with the installed recorder.
    fn describe() {
        use metrics::{describe_counter, describe_histogram, Unit};
        for (name, help) in METRIC_NAMES {
            if help.starts_with("histogram") {
                describe_histogram!(*name, Unit::Seconds, *help);
            } else {
                describe_counter!(*name, *help);
            }
        }
    }
}

fn outcome(e: &Error) -> &'static str {
    match e {
        Error::Timeout { .. } => "timeout",
        e if e.is_indeterminate() => "indeterminate",
        _ => "error",
    }
}

fn reason_label(r: LostReason) -> &'static str {
    match r {
        LostReason::Expired => "expired",
        LostReason::NotOwner => "not_owner",
        LostReason::RenewalFailed => "renewal_failed",
        LostReason::SessionEnded => "session_ended",
    }
}

struct Observe {
    backend: &'static str,
}

impl GuardObserver for Observe {
    fn renewed(&self) {
        metrics::counter!("lockbench_renewals_total", "backend" => self.backend).increment(1);
    }

    fn renewal_failed(&self) {
        metrics::counter!("lockbench_renewal_failures_total", "backend" => self.backend)
            .increment(1);
    }

    fn lost(&self, reason: LostReason) {
        metrics::counter!("lockbench_lost_total", "backend" => self.backend, "reason" => reason_label(reason))
            .increment(1);
    }

    fn released(&self, held: Duration, outcome: ReleaseOutcome) {
        metrics::histogram!("lockbench_hold_seconds", "backend" => self.backend)
            .record(held.as_secs_f64());
        match outcome {
            ReleaseOutcome::Released => {}
            ReleaseOutcome::WasGone => {
                metrics::counter!("lockbench_unlock_gone_total", "backend" => self.backend)
                    .increment(1);
            }
            ReleaseOutcome::Failed => {
                metrics::counter!("lockbench_release_failures_total", "backend" => self.backend)
                    .increment(1);
            }
        }
    }
}

#[async_trait::async_trait]
impl DistLock for Instrumented {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        let backend = self.inner.name();
        let start = Instant::now();
        let r = self.inner.acquire(key, opts).await;
        let took = start.elapsed().as_secs_f64();
        metrics::histogram!("lockbench_acquire_wait_seconds", "backend" => backend).record(took);
        let label = match &r {
            Ok(g) => {
                metrics::histogram!("lockbench_acquire_latency_seconds", "backend" => backend)
                    .record(took);
                g.observe(Arc::new(Observe { backend }));
                "ok"
            }
            Err(e) => outcome(e),
        };
        metrics::counter!("lockbench_acquires_total", "backend" => backend, "outcome" => label)
            .increment(1);
        r
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reasons_are_snake_case_labels() {
        assert_eq!(
            super::reason_label(distlock::LostReason::RenewalFailed),
            "renewal_failed"
        );
        assert_eq!(
            super::reason_label(distlock::LostReason::Expired),
            "expired"
        );
    }
}
