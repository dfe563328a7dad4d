//! `Instrumented` on a real Redis, rendered by metrics-exporter-prometheus:
//! every metric the issue names appears, labelled by backend, with counts
//! that match what the test did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock};
use lockbench_patterns::{Instrumented, METRIC_NAMES};

/// The value of the sample `name{labels..}` (labels in any order).
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.split(['{', ' ']).next() == Some(name) && labels.iter().all(|lab| l.contains(lab))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_written_with_the_backend_label() {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let (servers, raw) = common::start(
        "redis",
        // Renewed every 200 ms: a busy machine's late renewal must not
        // lose the first lock and change every count below.
        serde_json::json!({"watchdog_lease_ms": 600}),
    )
    .await;
    let lock: Arc<dyn DistLock> = Arc::new(Instrumented::new(raw));
    let wait = AcquireOptions::wait(Duration::from_secs(5));

    // Held past three watchdog periods: renewals.
    let g = lock.acquire("m", wait).await.unwrap();
    // Held by us: a try-lock times out.
    assert!(lock.acquire("m", AcquireOptions::try_lock()).await.is_err());
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(g.release().await.unwrap());
    // A fixed lease left to run out: lost, and the unlock finds it gone.
    let g = lock
        .acquire("m", wait.with_lease(Duration::from_millis(100)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!g.release().await.unwrap());
    // Deleted behind the holder's back: the next renewal is refused.
    let g = lock.acquire("m", wait).await.unwrap();
    let url = servers.endpoint().unwrap();
    let out = std::process::Command::new("redis-cli")
        .args(["-u", &url, "FLUSHALL"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(g.is_lost());
    assert!(!g.release().await.unwrap());
    // The server gone: the release fails.
    let g = lock.acquire("m", wait).await.unwrap();
    servers.nodes()[0].kill().unwrap();
    assert!(g.release().await.is_err());

    let text = handle.render();
    for (name, _) in METRIC_NAMES {
        if *name == "lockbench_degraded_total" {
            continue; // only a degraded with_lock writes it
        }
        assert!(
            text.lines()
                .any(|l| l.starts_with(name) && l.contains("backend=\"redis\"")),
            "{name} missing:\n{text}"
        );
    }
    let b = "backend=\"redis\"";
    assert_eq!(
        sample(&text, "lockbench_acquires_total", &[b, "outcome=\"ok\""]),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            "lockbench_acquires_total",
            &[b, "outcome=\"timeout\""]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "lockbench_lost_total", &[b, "reason=\"expired\""]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "lockbench_lost_total", &[b, "reason=\"not_owner\""]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "lockbench_unlock_gone_total", &[b]),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "lockbench_release_failures_total", &[b]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "lockbench_renewal_failures_total", &[b]),
        Some(1.0)
    );
    assert!(
        sample(&text, "lockbench_renewals_total", &[b]).unwrap() >= 2.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "lockbench_hold_seconds_count", &[b]),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "lockbench_acquire_wait_seconds_count", &[b]),
        Some(5.0)
    );
    assert_eq!(
        sample(&text, "lockbench_acquire_latency_seconds_count", &[b]),
        Some(4.0)
    );
}
