//! `lockbench-patterns`: what teams build around a distributed lock once it
//! is in production, written once over any [`DistLock`] so the suite can
//! measure it on every backend.
//!
//! - [`LocalFirst`]: an in-process async mutex per key in front of the
//!   distributed lock (the seeds' two-level lock). Only one task per
//!   process contends remotely; the others queue locally. The distributed
//!   lock is still taken for every critical section.
//! - [`with_lock`]: runs a critical section with the guard's fencing token,
//!   cancels it when the lock is lost, releases on every exit (a panic
//!   included) and fails closed when the backend is unreachable unless told
//!   to [`OnUnreachable::DegradeToLocal`].
//! - `Instrumented` (feature `metrics`): the `metrics` facade's histograms
//!   and counters for any lock, every name prefixed `lockbench_` and
//!   labelled by backend.
//!
//! [`DistLock`]: distlock::DistLock

mod local_first;
#[cfg(feature = "metrics")]
mod metrics;
mod with_lock;

pub use local_first::LocalFirst;
#[cfg(feature = "metrics")]
pub use metrics::{Instrumented, METRIC_NAMES};
pub use with_lock::{
    degraded_sections, with_lock, LockCtx, OnUnreachable, WithLockError, WithLockOptions,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Per-key async mutexes that live only while somebody holds or waits for
/// them: the map keeps `Weak`s and forgets the dead ones as it grows, so a
/// long run over many keys does not keep one mutex per key ever seen.
#[derive(Debug, Default)]
pub(crate) struct KeyMutexes {
    map: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    live: HashMap<String, Weak<tokio::sync::Mutex<()>>>,
    /// Prune when the map reaches this size (then twice what survives).
    prune_at: usize,
}

impl KeyMutexes {
    pub(crate) fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        // A poisoned map only means another task panicked while inserting;
        // the entries are still whole.
        let mut slots = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slots.live.get(key).and_then(Weak::upgrade) {
            return m;
        }
        let m = Arc::new(tokio::sync::Mutex::new(()));
        slots.live.insert(key.to_string(), Arc::downgrade(&m));
        if slots.live.len() >= slots.prune_at.max(64) {
            slots.live.retain(|_, w| w.strong_count() > 0);
            slots.prune_at = slots.live.len() * 2;
        }
        m
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().map(|s| s.live.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::KeyMutexes;

    #[test]
    fn dead_key_mutexes_are_forgotten_as_the_map_grows() {
        let m = KeyMutexes::default();
        let kept = m.get("kept");
        for i in 0..1000 {
            drop(m.get(&format!("k{i}")));
        }
        assert!(m.len() < 130, "{} entries for 1 live key", m.len());
        assert!(std::sync::Arc::ptr_eq(&kept, &m.get("kept")));
    }
}
