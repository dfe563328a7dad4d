//! The fenced ledger's checker against a real PostgreSQL: each verdict
//! from writes that must produce it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use harness::data::DataDb;

/// A write no later acquisition had superseded, refused by the fence, is
/// counted apart (a crash that re-issued tokens showed only as "rejected 7,
/// stale 0"); a stale write refused is the fence doing its job, and counts
/// as that only. The verdict on the tokens is the history's
/// (`token_regressions`): a late acquire reply shows here too.
#[tokio::test]
async fn a_current_holder_refused_by_the_fence_is_counted_apart() {
    let f = tokio::task::spawn_blocking(fleet::PostgresFleet::start)
        .await
        .unwrap()
        .unwrap();
    let db = DataDb::connect(&f.url(), "ledger-check", 2).await.unwrap();
    let write = |key: &'static str, token: u64, acquired_ns: u64| {
        let db = &db;
        async move {
            db.critical_section(key, 0, Some(token), acquired_ns, Duration::ZERO, false)
                .await
                .unwrap()
        }
    };
    // In order, then a paused holder's stale write: refused, and rightly.
    db.prepare_ledger("fine").await.unwrap();
    assert!(write("fine", 10, 100).await);
    assert!(write("fine", 11, 200).await);
    assert!(!write("fine", 9, 150).await);
    let r = db.check_ledger("fine", true).await.unwrap();
    assert_eq!((r.rejected, r.current_writes_rejected), (1, 0), "{r:?}");
    assert_eq!(r.verdict, "ok");
    // A later acquisition with a lower token: nobody superseded it.
    db.prepare_ledger("backwards").await.unwrap();
    assert!(write("backwards", 10, 100).await);
    assert!(!write("backwards", 4, 200).await);
    let r = db.check_ledger("backwards", true).await.unwrap();
    assert_eq!(r.current_writes_rejected, 1, "{r:?}");
    // The same key prepared again (a --run id reused) starts from nothing.
    db.prepare_ledger("backwards").await.unwrap();
    assert!(write("backwards", 1, 300).await);
    let r = db.check_ledger("backwards", true).await.unwrap();
    assert_eq!((r.writes, r.rejected, r.counter_final), (1, 0, 1), "{r:?}");
    assert_eq!(r.verdict, "ok");
}
