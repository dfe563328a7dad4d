//! Harness overhead: the overlap checker over a synthetic 1 M-event history
//! (target < 1 s) and the per-operation recording cost in a worker (target
//! < 1 µs). No servers.

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use harness::history::{monotonic_ns, Event, Op, Outcome};

/// `n` events: 8 workers taking turns on 16 keys, serially per key, so the
/// checker does its full sweep and finds nothing.
fn history(n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    let mut t = 0u64;
    let mut i = 0u64;
    while out.len() < n {
        let (worker, key) = ((i % 8) as u32, format!("k{}", i % 16));
        out.push(Event {
            worker,
            key: key.clone(),
            op: Op::Acquire,
            invoke_ns: t,
            complete_ns: t + 100,
            outcome: Outcome::Ok,
            token: Some(i),
            was_held: None,
            round_trips: Some(1),
            told: None,
            lost_ns: None,
            error: None,
        });
        out.push(Event {
            worker,
            key,
            op: Op::Release,
            invoke_ns: t + 200,
            complete_ns: t + 300,
            outcome: Outcome::Ok,
            token: None,
            was_held: Some(true),
            round_trips: None,
            told: None,
            lost_ns: None,
            error: None,
        });
        t += 400;
        i += 1;
    }
    out
}

fn checker(c: &mut Criterion) {
    let h = history(1_000_000);
    let mut g = c.benchmark_group("harness");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(h.len() as u64));
    g.bench_function("check_overlap_1M_events", |b| {
        b.iter(|| black_box(harness::checker::check_overlap(black_box(&h))))
    });
    g.finish();
}

/// What a worker does per operation besides the lock call itself: two
/// clock reads and one event pushed onto its history.
fn recording(c: &mut Criterion) {
    let mut g = c.benchmark_group("harness");
    g.throughput(Throughput::Elements(1));
    g.bench_function("record_one_operation", |b| {
        b.iter_batched_ref(
            || Vec::with_capacity(1 << 16),
            |events: &mut Vec<Event>| {
                let invoke_ns = monotonic_ns();
                let complete_ns = monotonic_ns();
                events.push(Event {
                    worker: 3,
                    key: "lockbench:bench".to_string(),
                    op: Op::Acquire,
                    invoke_ns,
                    complete_ns,
                    outcome: Outcome::Ok,
                    token: Some(42),
                    was_held: None,
                    round_trips: Some(1),
                    told: None,
                    lost_ns: None,
                    error: None,
                });
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, checker, recording);
criterion_main!(benches);
