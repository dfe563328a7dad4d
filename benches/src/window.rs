//! Contention measured in fixed time windows, as the harness's throughput
//! workload measures it: tasks cycle without pause, one shared counter
//! counts the cycles they complete, and a window's rate is the cycles
//! completed inside it divided by its length.
//!
//! Splitting a fixed amount of work between the tasks instead (N cycles,
//! N/T each) lets the tasks that finish early leave the last ones running
//! alone: the tail measures fewer tasks than the group's name says, and an
//! unfair lock (one task winning the key again and again) finishes its
//! share early and idles.
//!
//! The tasks run for a whole group ([`Contention::start`] to
//! [`Contention::stop`]), not per window: a window is only two readings of
//! the counter, so it contains neither a start-up (every task colliding at
//! once, back-offs not yet grown) nor a drain (waiters finishing after the
//! window closed), and its wall time is its length. Criterion wants the
//! time of `iters` cycles; [`Outcome::time_for`] scales the window's rate
//! to it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{DistLock, Error};
use tokio::task::JoinHandle;

/// What one window measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Cycles completed inside the window.
    pub cycles: u64,
    /// The window's length as measured.
    pub window: Duration,
    /// Acquires that ran out of their wait budget inside it (not cycles).
    pub timeouts: u64,
}

impl Outcome {
    /// Cycles per second.
    pub fn rate(&self) -> f64 {
        self.cycles as f64 / self.window.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// The time `iters` cycles take at this window's rate (what criterion's
    /// `iter_custom` returns).
    pub fn time_for(&self, iters: u64) -> Duration {
        self.window
            .mul_f64(iters as f64 / self.cycles.max(1) as f64)
    }
}

/// Tasks cycling until stopped, a task per handle.
pub struct Contention {
    stop: Arc<AtomicBool>,
    cycles: Arc<AtomicU64>,
    timeouts: Arc<AtomicU64>,
    /// The first task failure, as text (the error itself ends its task).
    failed: Arc<Mutex<Option<String>>>,
    tasks: Vec<JoinHandle<distlock::Result<()>>>,
}

impl Contention {
    /// Starts a task per handle, each cycling `key(i)` without pause.
    /// Must be called inside a Tokio runtime.
    pub fn start(handles: &[Arc<dyn DistLock>], key: impl Fn(usize) -> String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        let timeouts = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(None));
        let tasks = handles
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let (h, key) = (h.clone(), key(i));
                let (stop, cycles) = (stop.clone(), cycles.clone());
                let (timeouts, failed) = (timeouts.clone(), failed.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        match crate::cycle(&*h, &key).await {
                            Ok(()) => {
                                cycles.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Timeout { .. }) => {
                                timeouts.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                if let Ok(mut f) = failed.lock() {
                                    f.get_or_insert_with(|| e.to_string());
                                }
                                return Err(e);
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        Self {
            stop,
            cycles,
            timeouts,
            failed,
            tasks,
        }
    }

    /// One window of at least `len`, extended until at least one cycle
    /// completed inside it (a zero `len` is one cycle: the test mode's).
    ///
    /// # Errors
    /// A task ended (it failed: the message is its error).
    pub async fn window(&self, len: Duration) -> Result<Outcome, String> {
        let (c0, t0) = (self.cycles.load(Ordering::Relaxed), Instant::now());
        let to0 = self.timeouts.load(Ordering::Relaxed);
        tokio::time::sleep(len).await;
        while self.cycles.load(Ordering::Relaxed) == c0 && !self.any_ended() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if self.any_ended() {
            let why = self.failed.lock().ok().and_then(|f| f.clone());
            return Err(why.unwrap_or_else(|| "a contending task ended".into()));
        }
        Ok(Outcome {
            cycles: self.cycles.load(Ordering::Relaxed) - c0,
            window: t0.elapsed(),
            timeouts: self.timeouts.load(Ordering::Relaxed) - to0,
        })
    }

    fn any_ended(&self) -> bool {
        self.tasks.iter().any(JoinHandle::is_finished)
    }

    /// Stops the tasks: each finishes the cycle it is in.
    ///
    /// # Errors
    /// The first task's failure.
    pub async fn stop(self) -> distlock::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut first = Ok(());
        for t in self.tasks {
            let r = match t.await {
                Ok(r) => r,
                Err(e) => Err(Error::backend("bench", "contending task", e.to_string())),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use distlock::memory::{MemoryLock, MemoryStore};

    #[test]
    fn scales_a_window_to_iterations() {
        let o = Outcome {
            cycles: 500,
            window: Duration::from_millis(250),
            timeouts: 0,
        };
        assert_eq!(o.rate(), 2000.0);
        assert_eq!(o.time_for(4000), Duration::from_secs(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_cycle_across_windows_until_stopped() {
        let store = MemoryStore::new();
        let handles: Vec<Arc<dyn DistLock>> = (0..3)
            .map(|_| Arc::new(MemoryLock::new(store.clone())) as Arc<dyn DistLock>)
            .collect();
        let c = Contention::start(&handles, |_| "one".to_string());
        let a = c.window(Duration::from_millis(30)).await.unwrap();
        let b = c.window(Duration::ZERO).await.unwrap();
        assert!(
            a.cycles > 3 && a.window >= Duration::from_millis(30),
            "{a:?}"
        );
        assert!(b.cycles >= 1, "{b:?}");
        c.stop().await.unwrap();
    }
}
