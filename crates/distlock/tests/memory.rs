//! The whole conformance suite against the in-memory reference lock: the
//! contract itself, checked in a second, with no server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use distlock::memory::{MemoryLock, MemoryStore};
use distlock::testing::{self, Subject};
use distlock::{DistLock, Result};

struct Memory {
    store: Arc<MemoryStore>,
}

#[async_trait::async_trait]
impl Subject for Memory {
    async fn client(&self) -> Result<Arc<dyn DistLock>> {
        Ok(Arc::new(MemoryLock::with_watchdog_lease(
            self.store.clone(),
            self.watchdog_lease(),
        )))
    }

    async fn sabotage(&self, key: &str) -> Result<()> {
        self.store.sabotage(key);
        Ok(())
    }

    fn watchdog_lease(&self) -> Duration {
        // Renewed every third of it: room for a stalled test thread.
        Duration::from_millis(1_000)
    }

    async fn restart_servers(&self) -> Result<()> {
        self.store.restart();
        Ok(())
    }
}

// Not distributed: no server, so no unreachable endpoint to name.
distlock::conformance_tests!(
    subject: Memory {
        store: MemoryStore::new(),
    },
    // A reference mutex, not a queue: waiters race (not declared fair).
    skipped: [unreachable_endpoint_fails_fast, waiters_served_in_order],
);

/// The same cases through `run_all` on ONE store, as a slow backend runs
/// them on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_on_one_store() {
    let s = Memory {
        store: MemoryStore::new(),
    };
    testing::expect_outcomes(
        testing::run_all(&s).await,
        &["unreachable_endpoint_fails_fast", "waiters_served_in_order"],
    );
}
