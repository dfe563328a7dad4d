//! The worker's loop in-process, against the in-memory reference lock: no
//! server, no child process, a few hundred milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::memory::{MemoryLock, MemoryStore};
use distlock::{AcquireOptions, Capabilities, DistLock, Guard};

use super::{run, Probe, Probes, RunOut};
use crate::history::{monotonic_ns, read_jsonl, Op, Outcome};
use crate::spec::{WorkerSpec, Workload};

/// The n-th call's extra time: the floor probe and the lock below count
/// their calls apart, so the n-th floor and the n-th cycle (same
/// iteration, whatever the order inside it) take the same extra time.
fn delay(n: u64) -> Duration {
    Duration::from_millis(n % 2 * 40)
}

struct SlowProbe {
    calls: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl Probe for SlowProbe {
    async fn once(&self) -> distlock::Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(delay(n)).await;
        Ok(())
    }
}

/// The in-memory lock, its n-th acquire slowed by `delay(n)`.
#[derive(Debug)]
struct SlowLock {
    inner: MemoryLock,
    calls: AtomicU64,
}

#[async_trait::async_trait]
impl DistLock for SlowLock {
    fn name(&self) -> &'static str {
        "slow-memory"
    }

    fn capabilities(&self) -> Capabilities {
        MemoryLock::CAPABILITIES
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> distlock::Result<Guard> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(delay(n)).await;
        self.inner.acquire(key, opts).await
    }
}

fn spec(dir: &tempfile::TempDir, workload: Workload, plan: serde_json::Value) -> WorkerSpec {
    let mut p = serde_json::json!({
        "backend": "memory", "backend_config": {}, "workload": workload,
        "workers": 1, "ops": 30, "hold_ms": 0, "lease_ms": null, "wait_ms": 1000,
        "key": "k", "max_secs": 30, "warmup_ms": 0, "seed": 3
    });
    for (k, v) in plan.as_object().unwrap() {
        p[k] = v.clone();
    }
    WorkerSpec {
        worker: 0,
        history_path: dir.path().join("h.jsonl").display().to_string(),
        plan: serde_json::from_value(p).unwrap(),
    }
}

fn memory() -> MemoryLock {
    MemoryLock::new(MemoryStore::new())
}

async fn run_ok(spec: &WorkerSpec, lock: &dyn DistLock, probes: &Probes) -> RunOut {
    let mut out = run(spec, lock, probes).await.unwrap();
    out.events.persist().unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_pairs_stay_pairs_in_any_order_and_warm_up_is_timed() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &dir,
        Workload::Latency,
        serde_json::json!({"ops": 12, "warmup_ms": 150}),
    );
    let floor_calls = Arc::new(AtomicU64::new(0));
    let peer_calls = Arc::new(AtomicU64::new(0));
    let probes = Probes {
        floor: Some(Box::new(SlowProbe {
            calls: floor_calls.clone(),
        })),
        peers: vec![(
            "peer".into(),
            Box::new(SlowProbe {
                calls: peer_calls.clone(),
            }),
        )],
    };
    let lock = SlowLock {
        inner: memory(),
        calls: AtomicU64::new(0),
    };
    let t0 = monotonic_ns();
    let out = run_ok(&s, &lock, &probes).await;
    // Warmed up for 150 ms, at least 5 iterations, none of them recorded.
    assert!(out.loop_start_ns - t0 >= 150_000_000);
    let warm = floor_calls.load(Ordering::SeqCst) - 12;
    assert!(warm >= 5, "{warm}");
    assert_eq!(lock.calls.load(Ordering::SeqCst), warm + 12);
    assert_eq!(peer_calls.load(Ordering::SeqCst), warm + 12);
    assert_eq!((out.floor_ns.len(), out.paired_ns.len()), (12, 12));
    assert_eq!(out.peers_ns["peer"].len(), 12);
    let events = read_jsonl(dir.path().join("h.jsonl").as_path()).unwrap();
    assert_eq!(events.len(), 24);
    // The n-th floor and the n-th cycle took the same extra 0 or 40 ms;
    // pairs from neighbouring iterations would all be 40 ms apart. Most,
    // not all: a loaded 2-core machine can stall a thread for a while.
    let close = out
        .paired_ns
        .iter()
        .filter(|[f, c]| c.abs_diff(*f) < 20_000_000)
        .count();
    assert!(close >= 10, "{:?}", out.paired_ns);
    assert!(out.timed.is_empty(), "closed loop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_behind_schedule_does_not_sleep_and_shows_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    // A 2 ms section, arrivals every 0.2 ms on average: hopelessly behind.
    let s = spec(
        &dir,
        Workload::Throughput,
        serde_json::json!({"ops": 40, "hold_ms": 2, "rate": 5000.0}),
    );
    let out = run_ok(&s, &memory(), &Probes::default()).await;
    assert_eq!(out.timed.len(), 40);
    assert!(out
        .timed
        .windows(2)
        .all(|w| w[0].intended_ns <= w[1].intended_ns));
    // The backlog builds up: the last cycle waited for most of the run.
    let last = out.timed[39];
    assert!(last.cycle_ns > 40_000_000, "{last:?}");
    assert!(last.acquire_ns + 2_000_000 <= last.cycle_ns);
    // The history keeps the actual invoke times.
    let events = read_jsonl(dir.path().join("h.jsonl").as_path()).unwrap();
    let acquires: Vec<_> = events
        .iter()
        .filter(|e| e.op == Op::Acquire && e.outcome == Outcome::Ok)
        .collect();
    assert_eq!(acquires.len(), 40);
    assert!(acquires[0].invoke_ns >= out.timed[0].intended_ns);
    // Behind schedule, the next cycle starts as soon as the last one
    // ends: no sleep in between (a median, as a loaded machine may
    // preempt the worker anywhere).
    let releases: Vec<_> = events.iter().filter(|e| e.op == Op::Release).collect();
    let mut idle: Vec<u64> = releases
        .iter()
        .zip(&acquires[1..])
        .zip(&out.timed[1..])
        .filter(|((r, _), t)| t.intended_ns < r.complete_ns)
        .map(|((r, a), _)| a.invoke_ns - r.complete_ns)
        .collect();
    assert!(idle.len() >= 30, "{idle:?}");
    idle.sort_unstable();
    assert!(idle[idle.len() / 2] < 1_000_000, "{idle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_on_schedule_waits_for_its_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    // 200 arrivals/s over 2 workers = 100/s for this one: 20 arrivals take
    // about 200 ms, each cycle far shorter than the gaps.
    let s = spec(
        &dir,
        Workload::Throughput,
        serde_json::json!({"ops": 20, "workers": 2, "rate": 200.0}),
    );
    let out = run_ok(&s, &memory(), &Probes::default()).await;
    assert_eq!(out.timed.len(), 20);
    let span = out.timed[19].intended_ns - out.loop_start_ns;
    // Sum of 20 exponential gaps of 10 ms: 200 ms, rarely outside 80-400.
    assert!((80_000_000..400_000_000).contains(&span), "{span}");
    let mut cycles: Vec<u64> = out.timed.iter().map(|t| t.cycle_ns).collect();
    cycles.sort_unstable();
    // On time, cycles are short next to the 10 ms gaps (8 ms: a loaded
    // machine's scheduling; a worker one arrival behind would wait ~10 ms
    // more).
    assert!(cycles[10] < 8_000_000, "{cycles:?}");
    // Same seed, same schedule.
    let dir2 = tempfile::tempdir().unwrap();
    let s2 = spec(
        &dir2,
        Workload::Throughput,
        serde_json::json!({"ops": 20, "workers": 2, "rate": 200.0}),
    );
    let again = run_ok(&s2, &memory(), &Probes::default()).await;
    let gaps = |o: &RunOut| -> Vec<u64> {
        o.timed
            .iter()
            .map(|t| t.intended_ns - o.loop_start_ns)
            .collect()
    };
    assert_eq!(gaps(&out), gaps(&again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rate_is_refused_and_other_workloads_ignore_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &dir,
        Workload::Throughput,
        serde_json::json!({"rate": -1.0}),
    );
    let Err(e) = run(&s, &memory(), &Probes::default()).await else {
        panic!("a negative rate ran");
    };
    assert!(e.contains("rate"), "{e}");
    let s = spec(
        &dir,
        Workload::Mutex,
        serde_json::json!({"ops": 5, "rate": 1.0}),
    );
    let out = run_ok(&s, &memory(), &Probes::default()).await;
    assert!(out.timed.is_empty());
    assert!(out.paired_ns.is_empty());
}

/// A probe whose calls fail where `fails(n)` says.
struct FlakyProbe {
    calls: AtomicU64,
    fails: fn(u64) -> bool,
}

#[async_trait::async_trait]
impl Probe for FlakyProbe {
    async fn once(&self) -> distlock::Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if (self.fails)(n) {
            return Err(distlock::Error::indeterminate(
                "probe",
                "PING",
                "no reply within 50ms",
            ));
        }
        Ok(())
    }
}

/// One slow reply of the floor probe, in the warm-up or in the measured
/// loop, ended the worker ("worker 0 died mid-run ... no reply within
/// 50ms"): it is now a sample lost and counted. A probe that never answers
/// still fails the warm-up, after a few iterations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_sample_is_counted_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&dir, Workload::Latency, serde_json::json!({"ops": 20}));
    let probes = |fails: fn(u64) -> bool| Probes {
        floor: Some(Box::new(FlakyProbe {
            calls: AtomicU64::new(0),
            fails,
        })),
        peers: Vec::new(),
    };
    // The 2nd call is in the warm-up, the 9th and 12th in the loop.
    let out = run_ok(&s, &memory(), &probes(|n| matches!(n, 1 | 8 | 11))).await;
    assert_eq!(
        out.counters.get("probe_errors"),
        Some(&2),
        "{:?}",
        out.counters
    );
    assert_eq!(out.floor_ns.len(), 18);
    assert_eq!(out.paired_ns.len(), 18);
    let e = run(&s, &memory(), &probes(|_| true)).await.err().unwrap();
    assert!(
        e.contains("5 iterations in a row failed") && e.contains("50ms"),
        "{e}"
    );
}

/// A history that cannot be written (a full disk: `/dev/full`) stops the
/// worker at once, naming why; it ran the workload to its end with a
/// warning per hold and left a cut history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_that_cannot_be_written_stops_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(&dir, Workload::Mutex, serde_json::json!({"ops": 1000}));
    s.history_path = "/dev/full".into();
    let probes = Probes {
        floor: None,
        peers: Vec::new(),
    };
    let e = run(&s, &memory(), &probes).await.err().unwrap();
    assert!(e.contains("writing its history"), "{e}");
}

#[test]
fn a_release_is_on_disk_before_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.jsonl");
    let mut log = super::EventLog::create(path.to_str().unwrap(), true, 4).unwrap();
    let at = |op: Op, t: u64| crate::history::Event {
        key: "k".into(),
        op,
        outcome: Outcome::Ok,
        ..crate::history::Event::exit(0, t)
    };
    let ops = |p: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["op"].to_string())
            .collect()
    };
    log.push(at(Op::Acquire, 1));
    log.releasing(&at(Op::Releasing, 2));
    // What a worker killed now leaves behind: the hold, and where it ended.
    assert_eq!(ops(&path), [r#""acquire""#, r#""releasing""#]);
    log.push(at(Op::Release, 2));
    assert_eq!(
        ops(&path),
        [r#""acquire""#, r#""releasing""#, r#""release""#]
    );
    // Read back, the marker is settled into its release.
    let events = read_jsonl(&path).unwrap();
    assert_eq!(
        events.iter().map(|e| e.op).collect::<Vec<_>>(),
        [Op::Acquire, Op::Release]
    );
}
