//! Pure parts of the workloads: handover latency from a history, the
//! coupon click order, the data schema name; and the summary's figures
//! (paired difference, halves, open loop, tail percentiles, old results).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use harness::history::{Event, Op, Outcome};
use harness::summary::handover_ns;

fn ev(worker: u32, op: Op, invoke_ns: u64, complete_ns: u64) -> Event {
    Event {
        worker,
        key: "k".into(),
        op,
        invoke_ns,
        complete_ns,
        outcome: Outcome::Ok,
        token: None,
        // A release found its own lock unless a test says otherwise.
        was_held: (op == Op::Release).then_some(true),
        round_trips: None,
        told: None,
        lost_ns: None,
        error: None,
    }
}

#[test]
fn handover_counts_only_a_waiter_taking_over() {
    let h = vec![
        ev(0, Op::Acquire, 0, 10),
        // Worker 1 waits from 5; worker 0 starts releasing at 100.
        ev(1, Op::Acquire, 5, 130),
        ev(0, Op::Release, 100, 110),
        // Worker 0 comes back after worker 1 is done: not a waiter then.
        ev(1, Op::Release, 200, 210),
        ev(0, Op::Acquire, 300, 310),
        ev(0, Op::Release, 400, 410),
        // Worker 0 again right after itself: not a handover.
        ev(0, Op::Acquire, 420, 430),
        ev(0, Op::Release, 500, 510),
    ];
    assert_eq!(handover_ns(&h), vec![30]);
}

#[test]
fn handover_ignores_failed_acquires_and_other_keys() {
    let mut failed = ev(1, Op::Acquire, 5, 130);
    failed.outcome = Outcome::Fail;
    let mut other = ev(2, Op::Acquire, 5, 140);
    other.key = "other".into();
    let h = vec![
        ev(0, Op::Acquire, 0, 10),
        failed,
        other,
        ev(0, Op::Release, 100, 110),
    ];
    assert!(handover_ns(&h).is_empty());
}

#[test]
fn clicks_of_one_user_are_adjacent_and_seeded() {
    let a = harness::worker::click_order(50, 3, 7);
    assert_eq!(a.len(), 150);
    for chunk in a.chunks(3) {
        assert!(chunk.iter().all(|u| *u == chunk[0]), "{chunk:?}");
    }
    let mut users: Vec<u64> = a.iter().step_by(3).copied().collect();
    users.sort_unstable();
    assert_eq!(users, (0..50).collect::<Vec<_>>());
    assert_eq!(a, harness::worker::click_order(50, 3, 7));
    assert_ne!(a, harness::worker::click_order(50, 3, 8));
}

#[test]
fn schema_names_are_safe_identifiers() {
    let s = harness::data::schema_for("lockbench:20261202-184200-redis-ledger; DROP TABLE x");
    assert!(s.len() <= 63, "{s}");
    assert!(s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
    assert_ne!(s, harness::data::schema_for("lockbench:other"));
}

mod figures {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use harness::checker::check_overlap;
    use harness::coordinator::RunOutput;
    use harness::history::{Event, Op};
    use harness::spec::{RunPlan, TimedCycle, Workload};
    use harness::stats::{halves, paired_difference};
    use harness::summary::{percentiles, summarize, Percentiles, Summary};

    use super::ev;

    fn plan(workload: Workload, workers: u32, rate: Option<f64>) -> RunPlan {
        serde_json::from_value(serde_json::json!({
            "backend": "memory", "backend_config": {}, "workload": workload,
            "workers": workers, "ops": 10, "hold_ms": 0, "lease_ms": null, "wait_ms": 100,
            "key": "k", "max_secs": 10, "rate": rate
        }))
        .unwrap()
    }

    fn output(history: Vec<Event>) -> RunOutput {
        RunOutput {
            history,
            floor_ns: Vec::new(),
            peers_ns: BTreeMap::new(),
            paired_ns: Vec::new(),
            timed: Vec::new(),
            warmup: Duration::ZERO,
            timed_out: false,
            wall: Duration::from_secs(1),
            started_ns: 0,
            counters: BTreeMap::new(),
            marks: BTreeMap::new(),
            deaths: Vec::new(),
            stopped: None,
        }
    }

    /// Two workers alternating on one key: each cycle 1,000 ns after
    /// invoke (acquire 100 ns), 10 µs apart.
    fn alternating(n: u64) -> Vec<Event> {
        let mut h = Vec::new();
        for i in 0..n {
            let w = u32::try_from(i % 2).unwrap();
            let t = i * 10_000;
            h.push(ev(w, Op::Acquire, t, t + 100));
            h.push(ev(w, Op::Release, t + 900, t + 1_000));
        }
        h
    }

    #[test]
    fn the_paired_difference_cancels_what_both_saw() {
        // A big shared disturbance per iteration, cycle = floor + 30 µs.
        let pairs: Vec<[u64; 2]> = (0..1000u64)
            .map(|i| {
                let noise = (i * 7919 % 1000) * 1000;
                [50_000 + noise, 80_000 + noise]
            })
            .collect();
        let d = paired_difference(&pairs).unwrap();
        assert_eq!(d.count, 1000);
        assert_eq!(d.median_us, 30.0);
        assert_eq!((d.ci95_low_us, d.ci95_high_us), (Some(30.0), Some(30.0)));
        // Seven pairs, differences (ns) 150, 200, 60, 100, 120, 90, 300;
        // one may be negative.
        let pairs = [
            [100, 250],
            [100, 300],
            [200, 260],
            [400, 500],
            [80, 200],
            [10, 100],
            [0, 300],
        ];
        let d = paired_difference(&pairs).unwrap();
        assert!((d.median_us - 0.12).abs() < 1e-12, "{d:?}");
        assert_eq!((d.ci95_low_us, d.ci95_high_us), (Some(0.06), Some(0.3)));
        let d = paired_difference(&[[500, 200], [500, 100], [500, 400]]).unwrap();
        assert_eq!(d.median_us, -0.3);
        assert_eq!(d.ci95_low_us, None);
        assert!(paired_difference(&[]).is_none());
    }

    #[test]
    fn halves_that_drifted_differ() {
        // 100..109 µs, then 130..139 µs: +29 %, intervals far apart.
        let s: Vec<f64> = (0..1000)
            .map(|i| if i < 500 { 100.0 } else { 130.0 } + f64::from(i % 10))
            .collect();
        let h = halves(&s).unwrap();
        assert!(h.differ, "{h:?}");
        assert!((h.relative_change - 30.0 / 104.5).abs() < 1e-9, "{h:?}");
        assert_eq!((h.first.count, h.second.count), (500, 500));
        // Faster later counts as well.
        let rev: Vec<f64> = s.iter().rev().copied().collect();
        let h = halves(&rev).unwrap();
        assert!(h.differ && h.relative_change < -0.2, "{h:?}");
    }

    #[test]
    fn halves_that_did_not_drift_do_not_differ() {
        // The same spread of values in both halves.
        let steady: Vec<f64> = (0..1000).map(|i| 100.0 + f64::from(i * 37 % 50)).collect();
        let h = halves(&steady).unwrap();
        assert!(!h.differ && h.relative_change.abs() < 0.05, "{h:?}");
        // +5 %: the intervals part, but the change is too small to matter.
        let small: Vec<f64> = (0..1000)
            .map(|i| if i < 500 { 100.0 } else { 105.0 } + f64::from(i % 10))
            .collect();
        let h = halves(&small).unwrap();
        assert!(h.first.ci95_high_us.unwrap() < h.second.ci95_low_us.unwrap());
        assert!(!h.differ, "{h:?}");
        // +33 %, but the intervals touch: a bimodal first half.
        let bimodal: Vec<f64> = (0..1000)
            .map(|i| match (i < 500, i % 2 == 0, i % 3 == 0) {
                (true, true, _) | (false, _, true) => 100.0,
                _ => 200.0,
            })
            .collect();
        let h = halves(&bimodal).unwrap();
        assert!(h.relative_change > 0.3 && !h.differ, "{h:?}");
        // +100 %, but five samples a half: no interval, no verdict.
        let few = [10.0, 11.0, 10.0, 12.0, 10.0, 20.0, 21.0, 20.0, 22.0, 20.0];
        let h = halves(&few).unwrap();
        assert!(h.relative_change > 0.9 && !h.differ, "{h:?}");
        assert!(halves(&[1.0]).is_none());
    }

    #[test]
    fn a_closed_loop_summary_has_handovers_fairness_and_halves() {
        let mut out = output(alternating(100));
        out.warmup = Duration::from_millis(500);
        out.wall = Duration::from_millis(2500);
        let p = plan(Workload::Throughput, 2, None);
        let s = summarize(&p, &out, &check_overlap(&out.history));
        assert_eq!(s.wall_s, 2.0);
        assert_eq!(s.warmup_s, 0.5);
        assert_eq!(s.open_loop_rate, None);
        assert_eq!((s.cycle.count, s.cycle.p50_us), (100, 1.0));
        assert_eq!(s.acquire.p50_us, 0.1);
        let h = s.handovers.unwrap();
        assert_eq!((h.handovers, h.barging, h.takeovers), (99, 0, 0));
        assert_eq!(h.handovers_per_s, 49.5);
        let f = s.fairness.unwrap();
        assert_eq!((f.jain_index, f.acquires_by_worker), (1.0, vec![50, 50]));
        assert_eq!((f.spread, f.starved), (Some(1.0), vec![]));
        assert!(!s.cycle_halves.unwrap().differ);
        assert!(s.cycle_minus_floor.is_none());
        assert_eq!(s.throughput_per_s, 50.0);
    }

    #[test]
    fn an_open_loop_summary_times_from_the_intended_start() {
        let mut out = output(alternating(100));
        // Each cycle started 5 µs after it was due (a backlog the history's
        // invoke times do not show), and later ones later still.
        out.timed = (0..100u64)
            .map(|i| TimedCycle {
                intended_ns: i * 10_000,
                acquire_ns: 5_100 + i * 100,
                cycle_ns: 6_000 + i * 100,
            })
            .collect();
        let p = plan(Workload::Throughput, 2, Some(100.0));
        let s = summarize(&p, &out, &check_overlap(&out.history));
        assert_eq!(s.open_loop_rate, Some(100.0));
        assert_eq!(s.cycle.count, 100);
        assert!(s.cycle.p50_us > 10.0, "{:?}", s.cycle);
        assert!(s.acquire.p50_us > 9.0, "{:?}", s.acquire);
        let h = s.cycle_halves.unwrap();
        assert!(h.differ && h.relative_change > 0.5, "{h:?}");
        // The rate is only for the workloads that run an open loop.
        let s = summarize(
            &plan(Workload::Mutex, 2, Some(100.0)),
            &out,
            &check_overlap(&out.history),
        );
        assert_eq!((s.open_loop_rate, s.cycle.p50_us), (None, 1.0));
    }

    #[test]
    fn a_latency_summary_has_the_paired_difference() {
        let mut h = Vec::new();
        for i in 0..10u64 {
            let t = i * 10_000;
            h.push(ev(0, Op::Acquire, t, t + 100));
            h.push(ev(0, Op::Release, t + 900, t + 1_000));
        }
        let mut out = output(h);
        out.floor_ns = vec![400; 10];
        out.paired_ns = vec![[400, 1_000]; 10];
        let s = summarize(
            &plan(Workload::Latency, 1, None),
            &out,
            &check_overlap(&out.history),
        );
        assert_eq!(s.floor_ratio, Some(2.5));
        let d = s.cycle_minus_floor.unwrap();
        assert_eq!((d.count, d.median_us), (10, 0.6));
        // One worker on its own key: nobody to hand over to.
        assert!(s.handovers.is_none() && s.handover.is_none());
    }

    #[test]
    fn tail_percentiles_are_hidden_below_their_sample_counts() {
        let p = percentiles(1..=999);
        assert_eq!(
            (p.count, p.reliable_p99_us(), p.reliable_p999_us()),
            (999, None, None)
        );
        let p = percentiles(1..=1_000);
        assert_eq!(p.reliable_p99_us(), Some(p.p99_us));
        assert_eq!(p.reliable_p999_us(), None);
        let p = percentiles(1..=10_000);
        assert_eq!(p.reliable_p999_us(), Some(p.p999_us));
        assert_eq!(Percentiles::default().reliable_p99_us(), None);
    }

    #[test]
    fn results_and_plans_written_before_these_figures_still_read() {
        let p = serde_json::json!({"count": 100, "p50_us": 1.0, "p90_us": 1.0, "p99_us": 1.0,
                                   "p999_us": 1.0, "max_us": 1.0});
        let s: Summary = serde_json::from_value(serde_json::json!({
            "backend": "redis", "workload": "latency", "workers": 1, "ops_ok": 100,
            "ops_failed": 0, "ops_info": 0, "release_not_held": 0, "violations": 0,
            "max_overlap_ms": 0.0, "acquire_p50_us": 1.0, "acquire_p99_us": 1.0,
            "acquire": p.clone(), "cycle_p50_us": 1.0, "cycle_p99_us": 1.0, "cycle": p,
            "floor_p50_us": 0.5, "floor": null, "floor_ratio": 2.0, "peers": {},
            "acquire_round_trips_mean": 1.0, "throughput_per_s": 1.0, "wall_s": 1.0,
            "timed_out": false, "handover": null, "counters": {}, "ledger": null, "coupon": null
        }))
        .unwrap();
        assert!(s.cycle_minus_floor.is_none() && s.handovers.is_none() && s.fairness.is_none());
        assert_eq!((s.open_loop_rate, s.warmup_s), (None, 0.0));
        let p = plan(Workload::Latency, 1, None);
        assert_eq!((p.warmup_ms, p.rate), (2000, None));
        let done: harness::spec::WorkerMsg =
            serde_json::from_str(r#"{"type": "done", "floor_ns": [1], "timed_out": false}"#)
                .unwrap();
        assert!(matches!(
            done,
            harness::spec::WorkerMsg::Done { paired_ns, timed, loop_start_ns: 0, .. }
                if paired_ns.is_empty() && timed.is_empty()
        ));
    }

    #[test]
    fn a_rate_must_be_a_positive_number() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut p = plan(Workload::Throughput, 1, None);
            p.rate = Some(bad);
            assert!(p.open_loop_rate().is_err(), "{bad}");
        }
        assert_eq!(
            plan(Workload::Latency, 1, Some(5.0))
                .open_loop_rate()
                .unwrap(),
            Some(5.0)
        );
        assert_eq!(
            plan(Workload::Ledger, 1, Some(5.0))
                .open_loop_rate()
                .unwrap(),
            None
        );
    }
}
