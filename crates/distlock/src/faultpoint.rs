//! Fault points: named places inside a lock's steps (between `SETNX` and
//! `PEXPIRE`, between `GET` and `DEL`) where a worker armed by the nemesis
//! crashes or stalls on purpose. A fault then lands exactly where the
//! seeds' broken locks break, every time, instead of by timing luck.
//!
//! Disarmed (always, outside a faulted run) a point costs one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// What an armed point does when a lock reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The process exits at once (exit code 86): a client crash mid-step.
    Exit,
    /// The acquisition's task stalls this long: a pause of the holder at
    /// that step. Nothing of that acquisition runs meanwhile (with a fixed
    /// lease, nothing renews it, as in a process pause).
    Stall(Duration),
}

static ARMED: AtomicBool = AtomicBool::new(false);
static ACTION: Mutex<Option<Action>> = Mutex::new(None);
type Observer = Box<dyn Fn(&str, Action) + Send + Sync>;
static OBSERVER: OnceLock<Observer> = OnceLock::new();

/// Arms the next point reached in this process (once: the first point to
/// be reached takes it).
pub fn arm(action: Action) {
    if let Ok(mut a) = ACTION.lock() {
        *a = Some(action);
        ARMED.store(true, Ordering::SeqCst);
    }
}

/// Sets who hears of a point firing, before its action runs (the worker
/// tells the coordinator). Only the first call counts.
pub fn observe(f: impl Fn(&str, Action) + Send + Sync + 'static) {
    let _ = OBSERVER.set(Box::new(f));
}

/// Marks a point in a lock's steps; acts if one is armed.
pub async fn reach(point: &'static str) {
    if !ARMED.load(Ordering::Relaxed) {
        return;
    }
    let action = match ACTION.lock() {
        Ok(mut a) => a.take(),
        Err(_) => None,
    };
    ARMED.store(false, Ordering::SeqCst);
    let Some(action) = action else { return };
    if let Some(o) = OBSERVER.get() {
        o(point, action);
    }
    match action {
        Action::Exit => std::process::exit(86),
        Action::Stall(d) => tokio::time::sleep(d).await,
    }
}
