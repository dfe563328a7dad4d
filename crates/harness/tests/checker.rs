//! The overlap checker on hand-built histories, including ones that must fail.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use harness::checker::check_overlap;
use harness::history::{Event, Op, Outcome};

fn ev(worker: u32, key: &str, op: Op, invoke: u64, complete: u64, outcome: Outcome) -> Event {
    Event {
        worker,
        key: key.into(),
        op,
        invoke_ns: invoke,
        complete_ns: complete,
        outcome,
        token: Some(u64::from(worker)),
        was_held: None,
        round_trips: None,
        told: None,
        lost_ns: None,
        error: None,
    }
}

/// A critical section: acquired at `start` (completion), release invoked at `end`.
fn hold(worker: u32, key: &str, start: u64, end: u64) -> Vec<Event> {
    vec![
        ev(
            worker,
            key,
            Op::Acquire,
            start.saturating_sub(3),
            start,
            Outcome::Ok,
        ),
        ev(worker, key, Op::Release, end, end + 2, Outcome::Ok),
    ]
}

#[test]
fn serial_holders_pass() {
    let h: Vec<Event> = [
        hold(0, "k", 10, 20),
        hold(1, "k", 25, 30),
        hold(0, "k", 31, 40),
    ]
    .concat();
    let r = check_overlap(&h);
    assert!(r.valid);
    assert_eq!((r.violations, r.holds), (0, 3));
}

#[test]
fn touching_intervals_are_not_an_overlap() {
    // end == start: the first released exactly when the second acquired.
    let h = [hold(0, "k", 10, 20), hold(1, "k", 20, 30)].concat();
    let r = check_overlap(&h);
    assert!(r.valid, "{r:?}");
}

#[test]
fn overlapping_holders_fail_with_duration() {
    let h = [hold(0, "k", 10, 20), hold(1, "k", 15, 30)].concat();
    let r = check_overlap(&h);
    assert!(!r.valid);
    assert_eq!(r.violations, 1);
    assert_eq!(r.max_overlap_ns, 5);
    let p = &r.pairs[0];
    assert_eq!(
        (
            p.first_worker,
            p.second_worker,
            p.first_token,
            p.second_token
        ),
        (0, 1, Some(0), Some(1))
    );
}

#[test]
fn nested_and_chained_overlaps_are_all_counted() {
    // 0 holds 0..100; 1 holds 10..20 inside it; 2 holds 50..150.
    let h = [
        hold(0, "k", 0, 100),
        hold(1, "k", 10, 20),
        hold(2, "k", 50, 150),
    ]
    .concat();
    let r = check_overlap(&h);
    assert_eq!(r.violations, 2);
    assert_eq!(r.max_overlap_ns, 50);
}

#[test]
fn a_long_holder_overlaps_a_later_one_past_a_short_one() {
    // The sweep must remember the furthest-reaching holder, not the last.
    let h = [
        hold(0, "k", 0, 100),
        hold(1, "k", 100, 100),
        hold(2, "k", 60, 70),
    ]
    .concat();
    let r = check_overlap(&h);
    assert_eq!(r.violations, 1, "{r:?}");
}

#[test]
fn different_keys_never_conflict() {
    let h = [hold(0, "a", 10, 20), hold(1, "b", 15, 30)].concat();
    assert!(check_overlap(&h).valid);
}

#[test]
fn info_and_failed_acquires_hold_nothing() {
    let mut h = hold(0, "k", 10, 20);
    h.push(ev(1, "k", Op::Acquire, 5, 15, Outcome::Info));
    h.push(ev(2, "k", Op::Acquire, 5, 16, Outcome::Fail));
    let r = check_overlap(&h);
    assert!(r.valid, "{r:?}");
    assert_eq!(r.holds, 1);
}

#[test]
fn an_acquire_without_release_stays_open_to_the_end_of_the_history() {
    // Worker 1 got the key at 15 and never released: it holds it from 15 to
    // the history's end (22), across worker 0's 10..20 and worker 2's 30..40.
    let mut h = [hold(0, "k", 10, 20), hold(2, "k", 30, 40)].concat();
    h.push(ev(1, "k", Op::Acquire, 12, 15, Outcome::Ok));
    let r = check_overlap(&h);
    assert_eq!(r.unreleased, 1);
    assert_eq!(r.holds, 3);
    assert_eq!(r.violations, 2, "{r:?}");
    assert!(r
        .pairs
        .iter()
        .all(|p| p.first_worker == 1 || p.second_worker == 1));
}

#[test]
fn a_second_acquire_without_release_does_not_overwrite_the_first() {
    // Worker 0 acquires at 10, acquires again at 30 and releases once at 50:
    // the release closes the latest hold; the first stays open to the end
    // (60), so worker 1's 40..45 overlaps it. The old checker replaced the
    // first hold with the second and saw 40..45 only inside 30..50 ... and
    // lost the first hold entirely.
    let h = vec![
        ev(0, "k", Op::Acquire, 8, 10, Outcome::Ok),
        ev(0, "k", Op::Acquire, 28, 30, Outcome::Ok),
        ev(0, "k", Op::Release, 50, 52, Outcome::Ok),
        ev(1, "k", Op::Acquire, 53, 55, Outcome::Ok),
        ev(1, "k", Op::Release, 58, 60, Outcome::Ok),
    ];
    let r = check_overlap(&h);
    assert_eq!(r.unreleased, 1);
    assert_eq!(r.holds, 3);
    // 10..60 (open) against 30..50 (same worker, the key taken twice) and
    // against 55..58 (worker 1).
    assert_eq!(r.violations, 2, "{r:?}");
    assert!(r
        .pairs
        .iter()
        .any(|p| p.first_worker == 0 && p.second_worker == 1));
}

#[test]
fn violations_say_whether_the_earlier_holder_was_told() {
    use harness::history::Told;
    let with_told = |worker, start, end, told| {
        let mut h = hold(worker, "k", start, end);
        h[1].told = Some(told);
        h
    };
    // 0 was told its lock was lost, and went on: a warned violation.
    let warned = [with_told(0, 10, 30, Told::Lost), hold(1, "k", 20, 40)].concat();
    let r = check_overlap(&warned);
    assert_eq!((r.violations, r.silent_violations), (1, 0), "{r:?}");
    assert_eq!(r.pairs[0].first_told, Some(Told::Lost));
    // Its lease was over by its own clock: warned too.
    let expired = [with_told(0, 10, 30, Told::Expired), hold(1, "k", 20, 40)].concat();
    assert_eq!(check_overlap(&expired).silent_violations, 0);
    // Nobody told 0 anything: two holders, neither warned.
    let silent = [with_told(0, 10, 30, Told::Nothing), hold(1, "k", 20, 40)].concat();
    let r = check_overlap(&silent);
    assert_eq!((r.violations, r.silent_violations), (1, 1), "{r:?}");
    assert_eq!(r.pairs[0].first_told, Some(Told::Nothing));
}

#[test]
fn told_round_trips_through_the_history_file() {
    use harness::history::Told;
    let mut h = hold(0, "k", 10, 20);
    h[1].told = Some(Told::Expired);
    let mut buf = Vec::new();
    harness::history::write_jsonl(&mut buf, &h).unwrap();
    let text = String::from_utf8(buf).unwrap();
    assert!(text.contains(r#""told":"expired""#), "{text}");
}

#[test]
fn history_round_trips_and_bad_lines_name_their_number() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("h.jsonl");
    let h = [hold(0, "k", 10, 20), hold(1, "k", 25, 30)].concat();
    let mut buf = Vec::new();
    harness::history::write_jsonl(&mut buf, &h).unwrap();
    std::fs::write(&p, &buf).unwrap();
    assert_eq!(harness::history::read_jsonl(&p).unwrap(), h);

    let mut text = String::from_utf8(buf).unwrap();
    text.push_str("{\"worker\": 1, \"key\": \"k\", \"op\": \"grab\"}\n");
    std::fs::write(&p, text).unwrap();
    let e = harness::history::read_jsonl(&p).unwrap_err().to_string();
    assert!(e.contains(":5:"), "error should name line 5: {e}");
}

#[test]
fn a_dead_worker_holds_nothing_after_its_death() {
    // Worker 0 acquired at 10 and was killed at 20 (the coordinator's exit
    // record); worker 1 got the lock at 30, after the lease ran out.
    let mut h = vec![ev(0, "k", Op::Acquire, 8, 10, Outcome::Ok)];
    h.push(ev(0, "", Op::Exit, 20, 20, Outcome::Info));
    h.extend(hold(1, "k", 30, 40));
    let r = check_overlap(&h);
    assert!(r.valid, "{r:?}");
    assert_eq!((r.holds, r.unreleased), (2, 1));
    // Had worker 1 got it at 15, before the death, that is a violation.
    let mut h = vec![ev(0, "k", Op::Acquire, 8, 10, Outcome::Ok)];
    h.push(ev(0, "", Op::Exit, 20, 20, Outcome::Info));
    h.extend(hold(1, "k", 15, 40));
    let r = check_overlap(&h);
    assert_eq!(r.violations, 1, "{r:?}");
    assert_eq!(r.max_overlap_ns, 5);
}

/// Tokens against real-time order: one acquisition completed before the
/// next was invoked must have the lower token. A crash that re-issued
/// tokens breaks it; acquisitions that overlap in time (a late reply) may
/// get theirs in either order, and are no finding.
#[test]
fn tokens_that_go_backwards_in_real_time_are_counted() {
    use harness::checker::token_regressions;
    let acquire = |key: &str, invoke: u64, complete: u64, token: u64| {
        let mut e = ev(0, key, Op::Acquire, invoke, complete, Outcome::Ok);
        e.token = Some(token);
        e
    };
    let rising = vec![
        acquire("k", 0, 10, 5),
        acquire("k", 20, 30, 6),
        acquire("k", 40, 50, 7),
    ];
    assert_eq!(token_regressions(&rising), 0);
    // After a crash: 5, 6, then 6 again and 3.
    let mut crashed = rising[..2].to_vec();
    crashed.push(acquire("k", 40, 50, 6));
    crashed.push(acquire("k", 60, 70, 3));
    assert_eq!(token_regressions(&crashed), 2);
    // Overlapping in time: either order is fine; other keys never compare.
    let overlapping = vec![
        acquire("k", 0, 30, 9),
        acquire("k", 10, 20, 8),
        acquire("j", 40, 50, 1),
    ];
    assert_eq!(token_regressions(&overlapping), 0);
    // A failed acquire or one without a token holds nothing to compare.
    let mut failed = acquire("k", 40, 50, 1);
    failed.outcome = Outcome::Fail;
    let mut untokened = acquire("k", 40, 50, 0);
    untokened.token = None;
    assert_eq!(
        token_regressions(&[rising.clone(), vec![failed, untokened]].concat()),
        0
    );
}

/// Worker 0 let go at 20 and died at 50 with its release in flight; worker
/// 1 got the lock at 30, the hand-over the release made possible.
fn died_while_releasing(with_marker: bool) -> Vec<Event> {
    let mut h = vec![ev(0, "k", Op::Acquire, 7, 10, Outcome::Ok)];
    if with_marker {
        h.push(ev(0, "k", Op::Releasing, 20, 20, Outcome::Info));
    }
    h.extend(hold(1, "k", 30, 40));
    h.push(ev(0, "", Op::Exit, 50, 50, Outcome::Info));
    h
}

#[test]
fn a_worker_that_died_with_its_release_in_flight_held_until_it_let_go() {
    // Negative control: with nothing on disk past the acquire, the hold
    // lasts to the death, and the hand-over reads as two holders.
    let r = check_overlap(&died_while_releasing(false));
    assert_eq!(r.violations, 1, "{r:?}");
    let settled = harness::history::settle_releases(died_while_releasing(true));
    assert!(settled.iter().all(|e| e.op != Op::Releasing));
    let release = settled
        .iter()
        .find(|e| e.worker == 0 && e.op == Op::Release)
        .expect("the marker became a release");
    assert_eq!(
        (release.invoke_ns, release.complete_ns, release.outcome),
        (20, 50, Outcome::Info)
    );
    let r = check_overlap(&settled);
    assert!(r.valid, "{r:?}");
    assert_eq!((r.holds, r.unreleased), (2, 0));
}

#[test]
fn a_marker_whose_release_followed_is_dropped() {
    let mut h = hold(0, "k", 10, 20);
    h.insert(1, ev(0, "k", Op::Releasing, 20, 20, Outcome::Info));
    let settled = harness::history::settle_releases(h.clone());
    h.remove(1);
    assert_eq!(settled, h);
}

#[test]
fn a_worker_killed_inside_its_section_still_overlaps_a_rival_before_its_death() {
    // A marker for an earlier hold does not close a later one: worker 0
    // let go of its first hold at 20, took the lock again at 25 and died
    // inside at 50; worker 1's acquire at 30 is a second holder.
    let mut h = hold(0, "k", 10, 20);
    h.insert(1, ev(0, "k", Op::Releasing, 20, 20, Outcome::Info));
    h.push(ev(0, "k", Op::Acquire, 22, 25, Outcome::Ok));
    h.extend(hold(1, "k", 30, 40));
    h.push(ev(0, "", Op::Exit, 50, 50, Outcome::Info));
    let r = check_overlap(&harness::history::settle_releases(h));
    assert_eq!(r.violations, 1, "{r:?}");
}
