//! Pure parts of the workloads: handover latency from a history, the
//! coupon click order, the data schema name.

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
        was_held: None,
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
