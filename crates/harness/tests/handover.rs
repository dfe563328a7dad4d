//! Hand-overs, barging, take-overs and fairness on hand-built histories,
//! with exact expected counts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use harness::handover::{fairness, fifo_overtake_bound, handovers, walk};
use harness::history::{Event, Op, Outcome};

fn ev(worker: u32, key: &str, op: Op, invoke_ns: u64, complete_ns: u64) -> Event {
    Event {
        worker,
        key: key.into(),
        op,
        invoke_ns,
        complete_ns,
        outcome: Outcome::Ok,
        token: None,
        was_held: (op == Op::Release).then_some(true),
        round_trips: None,
        told: None,
        lost_ns: None,
        error: None,
    }
}

fn acq(worker: u32, invoke_ns: u64, complete_ns: u64) -> Event {
    ev(worker, "k", Op::Acquire, invoke_ns, complete_ns)
}

/// A clean release: ok, and the lock was still ours.
fn rel(worker: u32, invoke_ns: u64, complete_ns: u64) -> Event {
    ev(worker, "k", Op::Release, invoke_ns, complete_ns)
}

fn with(mut e: Event, outcome: Outcome, was_held: Option<bool>) -> Event {
    e.outcome = outcome;
    e.was_held = was_held;
    e
}

#[test]
fn every_kind_of_step_is_counted_exactly_once() {
    let mut h = vec![
        acq(0, 0, 10),
        rel(0, 20, 22),
        // Barging 1: worker 0 again.
        acq(0, 25, 30),
        rel(0, 40, 42),
        // Hand-over 1, to a waiter (since 5): latency 45 - 40.
        acq(1, 5, 45),
        // Its release failed: the next step is a take-over.
        with(rel(1, 50, 52), Outcome::Fail, None),
        // Take-over 1.
        acq(2, 48, 55),
        // Its lease had expired: the release found the lock gone.
        with(rel(2, 60, 62), Outcome::Ok, Some(false)),
        // Take-over 2.
        acq(0, 44, 70),
        // In doubt (timed out after sending).
        with(rel(0, 80, 82), Outcome::Info, None),
        // Take-over 3.
        acq(1, 75, 90),
        rel(1, 100, 102),
        // Hand-over 2, but worker 2 arrived after the release began: no
        // latency sample (the lock lay idle).
        acq(2, 105, 110),
        // Worker 2 dies holding it.
        ev(2, "", Op::Exit, 120, 120),
        // Take-over 4 (nobody released).
        acq(0, 100, 130),
        rel(0, 140, 142),
        // Barging 2.
        acq(0, 150, 152),
        rel(0, 160, 162),
    ];
    // Failed and doubtful acquires are not holds.
    h.push(with(acq(1, 141, 149), Outcome::Fail, None));
    h.push(with(acq(2, 141, 151), Outcome::Info, None));
    h.sort_by_key(|e| (e.invoke_ns, e.worker));
    let w = walk(&h);
    assert_eq!(w.contended_keys, 1);
    assert_eq!(w.acquires_after_first, 8);
    assert_eq!((w.handovers, w.barging, w.takeovers), (2, 2, 4));
    assert_eq!(w.latency_ns, vec![5]);
    let r = handovers(&w, 2.0).unwrap();
    assert_eq!(r.handovers_per_s, 1.0);
    assert_eq!(r.barging_fraction, 0.25);
    assert_eq!(harness::summary::handover_ns(&h), vec![5]);
}

#[test]
fn a_release_after_the_next_acquire_completed_is_an_overlap_not_a_handover() {
    // Worker 1 held from 15; worker 0 only began releasing at 20.
    let h = vec![acq(0, 0, 10), acq(1, 5, 15), rel(0, 20, 22), rel(1, 30, 32)];
    let w = walk(&h);
    assert_eq!((w.handovers, w.barging, w.takeovers), (0, 0, 1));
    assert!(w.latency_ns.is_empty());
    // Touching is fine: the release began exactly when the acquire completed.
    let h = vec![acq(0, 0, 10), acq(1, 5, 20), rel(0, 20, 22), rel(1, 30, 32)];
    let w = walk(&h);
    assert_eq!((w.handovers, w.takeovers), (1, 0));
    assert_eq!(w.latency_ns, vec![0]);
}

#[test]
fn a_worker_that_keeps_the_lock_while_another_times_out_is_all_barging() {
    let mut h = Vec::new();
    for i in 0..4 {
        h.push(acq(0, i * 100, i * 100 + 5));
        h.push(rel(0, i * 100 + 50, i * 100 + 55));
    }
    // Worker 1 tried (and timed out): the key is contended.
    h.push(with(acq(1, 1, 300), Outcome::Fail, None));
    let w = walk(&h);
    assert_eq!(w.contended_keys, 1);
    assert_eq!((w.acquires_after_first, w.barging), (3, 3));
    let r = handovers(&w, 1.0).unwrap();
    assert_eq!((r.handovers, r.barging_fraction), (0, 1.0));
    let f = fairness(&h, 2).unwrap();
    assert_eq!(f.acquires_by_worker, vec![4, 0]);
    assert_eq!((f.jain_index, f.max_share, f.min_share), (0.5, 1.0, 0.0));
    // No ratio to a worker that got nothing: starved, by name.
    assert_eq!((f.spread, f.starved.clone()), (None, vec![1]));
    // Worker 1 waited 1 -> 300 while worker 0 took it at 105, 205 (its
    // first, at 5, completed after worker 1 asked too: 3 in all).
    let w = f.longest_wait.unwrap();
    assert_eq!((w.worker, w.overtakes, w.outcome), (1, 3, Outcome::Fail));
    assert_eq!((w.wait_us, w.rivals, w.fifo_bound), (0.299, 1, 2));
    assert!(w.beyond_fifo());
}

/// A worker starved while another acquires over and over: no spread, the
/// starved worker named, and its one long wait (which timed out) saw more
/// acquisitions by the other than any FIFO queue lets through.
#[test]
fn a_starved_worker_shows_as_unfair() {
    let mut h = Vec::new();
    // Worker 0 cycles every 10 µs for 1 ms; worker 1 asks at 2 µs and
    // times out at 1 ms; worker 2 gets it once, at the end.
    for i in 0..100u64 {
        let t = i * 10_000;
        h.push(acq(0, t, t + 3_000));
        h.push(rel(0, t + 4_000, t + 5_000));
    }
    h.push(with(acq(1, 2_000, 1_000_000), Outcome::Fail, None));
    h.push(acq(2, 999_000, 1_003_500));
    h.push(rel(2, 1_004_000, 1_004_500));
    let f = fairness(&h, 3).unwrap();
    assert_eq!(f.acquires_by_worker, vec![100, 0, 1]);
    assert_eq!((f.spread, f.starved.clone()), (None, vec![1]));
    let w = f.longest_wait.clone().unwrap();
    // Worker 0's acquires completing in (2 µs, 1000 µs): at 3, 13, ..., 993.
    assert_eq!((w.worker, w.overtakes, w.outcome), (1, 100, Outcome::Fail));
    assert!((w.wait_us - 998.0).abs() < 1e-9, "{w:?}");
    assert_eq!((w.rivals, w.fifo_bound), (2, 4));
    assert!(w.beyond_fifo());
    assert_eq!(f.most_overtaken.as_ref(), Some(&w));
    // Nothing in JSON is infinite or NaN: the starved spread is null.
    let j = serde_json::to_value(&f).unwrap();
    assert!(j["spread"].is_null(), "{j}");
    assert_eq!(j["longest_wait"]["overtakes"], 100);
}

/// A FIFO queue: three workers take turns, each asking again right after
/// its release and getting the lock after the other two. Every wait is
/// overtaken by the two rivals ahead of it, never more.
#[test]
fn a_fifo_queue_stays_within_the_bound() {
    let mut h = Vec::new();
    // Cycle i (0..12) belongs to worker i mod 3: it holds from 10i+5 and
    // releases at 10i+6; the worker asks again at 10i+8.
    for i in 0..12u64 {
        let w = u32::try_from(i % 3).unwrap();
        let invoke = if i < 3 { 0 } else { 10 * (i - 3) + 8 };
        h.push(acq(w, invoke, 10 * i + 5));
        h.push(rel(w, 10 * i + 6, 10 * i + 7));
    }
    h.sort_by_key(|e| (e.invoke_ns, e.worker));
    assert_eq!(walk(&h).handovers, 11);
    let f = fairness(&h, 3).unwrap();
    assert_eq!(f.acquires_by_worker, vec![4, 4, 4]);
    assert_eq!((f.spread, f.starved.clone()), (Some(1.0), vec![]));
    let w = f.longest_wait.unwrap();
    // A wait from 10(i-3)+8 to 10i+5: 27 ns, the two others inside.
    assert_eq!((w.overtakes, w.wait_us, w.outcome), (2, 0.027, Outcome::Ok));
    let m = f.most_overtaken.unwrap();
    assert_eq!((m.overtakes, m.fifo_bound), (2, 4));
    assert!(!m.beyond_fifo());
}

#[test]
fn the_fifo_bound_is_twice_the_rivals() {
    assert_eq!(
        (0..4).map(fifo_overtake_bound).collect::<Vec<_>>(),
        vec![0, 2, 4, 6]
    );
}

#[test]
fn only_completions_strictly_inside_a_wait_on_its_key_overtake_it() {
    let h = vec![
        // Worker 1 waits 10 -> 50.
        acq(1, 10, 50),
        // Completed exactly at its invoke and at its completion: not inside.
        acq(0, 0, 10),
        acq(0, 40, 50),
        // Inside, but on another key.
        ev(2, "other", Op::Acquire, 20, 30),
        // Inside, but failed.
        with(acq(0, 15, 25), Outcome::Fail, None),
    ];
    let f = fairness(&h, 3).unwrap();
    assert!(
        f.longest_wait.is_none() && f.most_overtaken.is_none(),
        "{f:?}"
    );
    // One more, inside: now it is overtaken once.
    let mut h = h;
    h.push(acq(0, 12, 20));
    let w = fairness(&h, 3).unwrap().longest_wait.unwrap();
    assert_eq!((w.worker, w.overtakes, w.rivals), (1, 1, 1));
}

#[test]
fn keys_only_one_worker_tried_have_no_handovers() {
    // The latency workload: each worker on its own key.
    let mut h = Vec::new();
    for i in 0..3 {
        for w in 0..2 {
            let key = format!("k:w{w}");
            h.push(ev(w, &key, Op::Acquire, i * 100, i * 100 + 5));
            h.push(ev(w, &key, Op::Release, i * 100 + 10, i * 100 + 15));
        }
    }
    let w = walk(&h);
    assert_eq!(w.contended_keys, 0);
    assert_eq!(w.acquires_after_first, 0);
    assert!(handovers(&w, 1.0).is_none());
    assert_eq!(fairness(&h, 2).unwrap().jain_index, 1.0);
}

#[test]
fn keys_are_walked_separately() {
    // Alternating between two workers on key a, one worker on key b whose
    // holds interleave in time: b's holds are not steps of a's chain.
    let mut h = Vec::new();
    for i in 0..4u64 {
        let w = u32::try_from(i % 2).unwrap();
        h.push(ev(w, "a", Op::Acquire, i * 100, i * 100 + 5));
        h.push(ev(w, "a", Op::Release, i * 100 + 10, i * 100 + 15));
        h.push(ev(2, "b", Op::Acquire, i * 100 + 6, i * 100 + 7));
        h.push(ev(2, "b", Op::Release, i * 100 + 8, i * 100 + 9));
    }
    h.sort_by_key(|e| (e.invoke_ns, e.worker));
    let w = walk(&h);
    assert_eq!(w.contended_keys, 1);
    assert_eq!((w.acquires_after_first, w.handovers), (3, 3));
    let f = fairness(&h, 3).unwrap();
    assert_eq!(f.acquires_by_worker, vec![2, 2, 4]);
    // (8)^2 / (3 * 24)
    assert!((f.jain_index - 64.0 / 72.0).abs() < 1e-12);
    assert_eq!((f.max_share, f.min_share), (0.5, 0.25));
}

#[test]
fn fairness_counts_only_successful_acquires_and_needs_one() {
    let h = vec![
        acq(0, 0, 10),
        rel(0, 20, 22),
        acq(0, 30, 40),
        rel(0, 50, 52),
        acq(0, 60, 70),
        rel(0, 80, 82),
        acq(1, 90, 95),
        rel(1, 96, 97),
        with(acq(2, 1, 99), Outcome::Fail, None),
    ];
    let f = fairness(&h, 3).unwrap();
    assert_eq!(f.acquires_by_worker, vec![3, 1, 0]);
    // (3+1)^2 / (3 * (9+1)) = 16/30
    assert!((f.jain_index - 16.0 / 30.0).abs() < 1e-12);
    assert_eq!((f.max_share, f.min_share), (0.75, 0.0));
    assert!(fairness(&[with(acq(0, 0, 1), Outcome::Fail, None)], 2).is_none());
}
