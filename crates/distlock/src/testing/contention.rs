//! The contract on a hot key: what a backend that declares `fair` owes
//! its waiters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{caps, client, must, unique_key, Outcome, Subject};
use crate::AcquireOptions;

/// A backend that declares `fair` serves waiters in the order they came:
/// with the key held, five acquires start 200 ms apart (three on their own
/// clients, two sharing one handle); after the release they get the key in
/// that order. An unfair lock (every release wakes every waiter, who race)
/// gets a shuffled order here.
pub async fn waiters_served_in_order(s: &dyn Subject) -> Outcome {
    const WAITERS: usize = 5;
    let holder = client(s).await;
    if !caps(&holder).fair {
        return Outcome::NotApplicable("not declared fair (FIFO)");
    }
    let key = unique_key("fifo");
    // Clients first: a slow connect must not reorder the arrivals.
    let shared = client(s).await;
    let mut clients = Vec::new();
    for i in 0..WAITERS {
        clients.push(if i >= WAITERS - 2 {
            shared.clone()
        } else {
            client(s).await
        });
    }
    let held = must(
        holder
            .acquire(&key, AcquireOptions::wait(Duration::from_secs(5)))
            .await,
        "the holder's acquire",
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (key, order) = (key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = must(
                c.acquire(&key, AcquireOptions::wait(Duration::from_secs(30)))
                    .await,
                "a waiter's acquire",
            );
            if let Ok(mut o) = order.lock() {
                o.push(i);
            }
            // Long enough that the next waiter is surely waiting on us.
            tokio::time::sleep(Duration::from_millis(20)).await;
            must(g.release().await, "a waiter's release");
        }));
        // Each waiter's first request (its place in the queue) lands well
        // before the next one starts, on a loaded machine too: on the
        // durable servers it may be a session's first write, and CI has
        // seen a single fsync stall past 200 ms.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        must(held.release().await, "the holder's release"),
        "the holder lost the key while the waiters queued"
    );
    for t in tasks {
        if let Err(e) = t.await {
            panic!("a waiter failed: {e}");
        }
    }
    let order = order.lock().map(|o| o.clone()).unwrap_or_default();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "declared fair, but the waiters got the key out of their arrival order"
    );
    Outcome::Passed
}
