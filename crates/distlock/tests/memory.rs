//! The whole conformance suite against the in-memory reference lock: the
//! contract itself, checked in a second, with no server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use distlock::memory::{MemoryLock, MemoryStore};
use distlock::testing::{self, Outcome, Subject};
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
        Duration::from_millis(300)
    }

    async fn restart_servers(&self) -> Result<()> {
        self.store.restart();
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_lock_passes_every_case() {
    let s = Memory {
        store: MemoryStore::new(),
    };
    let out = testing::run_all(&s).await;
    let skipped: Vec<_> = out.iter().filter(|(_, o)| *o != Outcome::Passed).collect();
    assert!(
        skipped.is_empty(),
        "it declares every capability: {skipped:?}"
    );
}
