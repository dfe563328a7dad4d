//! Contention for a fixed time window, as the harness's throughput
//! workload runs it: every task cycles until the window closes, and one
//! shared counter counts the cycles completed inside it.
//!
//! Splitting a fixed amount of work between the tasks instead (N cycles,
//! N/T each) lets the tasks that finish early leave the last ones running
//! alone: the tail measures fewer tasks than the group's name says, and an
//! unfair lock (one task winning the key again and again) finishes its
//! share early and idles. In a window every task contends until the end.
//!
//! Criterion wants the time of `iters` cycles; a window gives a rate, so
//! [`Outcome::time_for`] scales it: `window × iters ÷ cycles`. The bench
//! makes a call's window `iters` slices of a fixed length, so criterion's
//! own planning (warm-up, iterations per sample, measurement time) sees a
//! routine whose wall time grows with `iters`, as any other, and a group
//! lasts its warm-up plus its measurement time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{DistLock, Error};

/// What one window measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Cycles completed inside the window.
    pub cycles: u64,
    /// The window's length as it ran (from the tasks' start to its close).
    pub window: Duration,
    /// Acquires that ran out of their wait budget (not counted as cycles).
    pub timeouts: u64,
    /// Every cycle, including those completed after the window closed.
    pub all_cycles: u64,
    /// From the start until the last task stopped.
    pub elapsed: Duration,
}

impl Outcome {
    /// Cycles per second inside the window; `None` if none completed.
    pub fn rate(&self) -> Option<f64> {
        (self.cycles > 0 && !self.window.is_zero())
            .then(|| self.cycles as f64 / self.window.as_secs_f64())
    }

    /// The time `iters` cycles take at this window's rate (what criterion's
    /// `iter_custom` returns). A window too short for any cycle (the test
    /// mode's, of length zero) is judged on every cycle and the whole run.
    pub fn time_for(&self, iters: u64) -> Duration {
        let (cycles, took) = match self.rate() {
            Some(_) => (self.cycles, self.window),
            None => (self.all_cycles.max(1), self.elapsed),
        };
        took.mul_f64(iters as f64 / cycles as f64)
    }
}

/// One window of `len`: a task per handle, each cycling `key(i)` until the
/// window closes. Every task runs at least one cycle; the cycles under way
/// when the window closes are completed (a dropped acquire would leave
/// clean-up running into the next window) but not counted.
///
/// # Errors
/// The first failure other than a timed-out wait.
pub async fn run(
    handles: &[Arc<dyn DistLock>],
    key: impl Fn(usize) -> String,
    len: Duration,
) -> distlock::Result<Outcome> {
    let counted = Arc::new(AtomicU64::new(0));
    let all = Arc::new(AtomicU64::new(0));
    let timeouts = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let close = start + len;
    let mut tasks = Vec::with_capacity(handles.len());
    for (i, h) in handles.iter().enumerate() {
        let (h, key) = (h.clone(), key(i));
        let (counted, all, timeouts) = (counted.clone(), all.clone(), timeouts.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                match crate::cycle(&*h, &key).await {
                    Ok(()) => {
                        all.fetch_add(1, Ordering::Relaxed);
                        if Instant::now() <= close {
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(Error::Timeout { .. }) => {
                        timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
                if Instant::now() >= close {
                    return Ok(());
                }
            }
        }));
    }
    let mut first_err = None;
    for t in tasks {
        let r = match t.await {
            Ok(r) => r,
            Err(e) => Err(Error::backend("bench", "contended task", e.to_string())),
        };
        if let (Err(e), None) = (r, &first_err) {
            first_err = Some(e);
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let elapsed = start.elapsed();
    Ok(Outcome {
        cycles: counted.load(Ordering::Relaxed),
        window: len.min(elapsed),
        timeouts: timeouts.load(Ordering::Relaxed),
        all_cycles: all.load(Ordering::Relaxed),
        elapsed,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn scales_a_window_to_iterations() {
        let o = Outcome {
            cycles: 500,
            window: Duration::from_millis(250),
            timeouts: 0,
            all_cycles: 510,
            elapsed: Duration::from_millis(260),
        };
        assert_eq!(o.rate(), Some(2000.0));
        assert_eq!(o.time_for(4000), Duration::from_secs(2));
        let test_mode = Outcome {
            cycles: 0,
            window: Duration::ZERO,
            timeouts: 0,
            all_cycles: 4,
            elapsed: Duration::from_millis(8),
        };
        assert_eq!(test_mode.rate(), None);
        assert_eq!(test_mode.time_for(1), Duration::from_millis(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_task_cycles_until_the_window_closes() {
        use distlock::memory::{MemoryLock, MemoryStore};
        let store = MemoryStore::new();
        let handles: Vec<Arc<dyn DistLock>> = (0..3)
            .map(|_| Arc::new(MemoryLock::new(store.clone())) as Arc<dyn DistLock>)
            .collect();
        let o = run(&handles, |_| "one".to_string(), Duration::from_millis(50))
            .await
            .unwrap();
        assert!(o.cycles > 3, "{o:?}");
        assert!(o.all_cycles >= o.cycles);
        assert!(o.elapsed >= Duration::from_millis(50));
        // Length zero (test mode): one cycle per task, none inside.
        let o = run(&handles, |i| format!("own:{i}"), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!((o.cycles, o.all_cycles), (0, 3));
    }
}
