//! `harness`: drives locks from separate worker OS processes, records every
//! operation (Jepsen-style ok / fail / info with CLOCK_MONOTONIC times), and
//! checks the history.
//!
//! The coordinator ([`coordinator::run`]) spawns the lockbench binary in
//! worker mode; each worker ([`worker::serve`]) builds its own lock client,
//! runs its loop and writes its history; the coordinator merges them and the
//! checkers ([`checker`]) give the verdict, summarised by [`summary`]
//! (with [`stats`] for medians and their intervals, and [`handover`] for who
//! got the lock next). [`pacing`] holds the seeded order of the latency
//! workload's steps and the open loop's Poisson arrivals. [`hosts`] lets
//! workers on several hosts meet in the run's PostgreSQL instead.
//!
//! ```
//! use harness::history::{Event, Op, Outcome};
//! let ev = |w, op, i, c| Event { worker: w, key: "k".into(), op, invoke_ns: i, complete_ns: c,
//!     outcome: Outcome::Ok, token: None, was_held: None, round_trips: None, told: None, lost_ns: None,
//!     error: None };
//! // Worker 1 got the lock at 15 while worker 0 was inside until 20.
//! let h = vec![ev(0, Op::Acquire, 0, 10), ev(1, Op::Acquire, 5, 15),
//!              ev(0, Op::Release, 20, 21), ev(1, Op::Release, 30, 31)];
//! let r = harness::checker::check_overlap(&h);
//! assert_eq!((r.violations, r.max_overlap_ns), (1, 5));
//! ```

mod alive;
pub mod checker;
pub mod coordinator;
pub mod cpu;
pub mod data;
pub mod handover;
pub mod history;
pub mod hosts;
pub mod metrics;
pub mod pacing;
pub mod spec;
pub mod stats;
pub mod summary;
pub mod timeline;
pub mod worker;

use std::path::Path;

pub use spec::Workload;

/// What can go wrong in a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A worker failed (u32::MAX = the run as a whole).
    #[error("worker {worker}: {message}")]
    Worker {
        /// Worker id.
        worker: u32,
        /// What happened.
        message: String,
    },
    /// A multi-host run's coordination (through its PostgreSQL) failed.
    #[error("multi-host run: {0}")]
    Hosts(String),
    /// The run plan asks for something impossible.
    #[error("invalid plan: {0}")]
    Plan(String),
    /// A history file is malformed.
    #[error(transparent)]
    History(#[from] history::HistoryError),
    /// File I/O.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// Error.
        #[source]
        source: std::io::Error,
    },
}

impl HarnessError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        HarnessError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Writes `bytes` to `path` atomically: a temp file in the same directory,
/// then a rename, so a reader never sees half a file.
///
/// # Errors
/// I/O errors, naming the path.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), HarnessError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    // Created as any file is (0666 less the umask): a temp file's 0600
    // made every result and report readable by its writer alone.
    let mut tmp = tempfile::Builder::new()
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| HarnessError::io(path, e))?;
    tmp.write_all(bytes)
        .map_err(|e| HarnessError::io(path, e))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| HarnessError::io(path, e))?;
    tmp.persist(path)
        .map_err(|e| HarnessError::io(path, e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    /// Results and reports get the mode any new file gets (a probe found
    /// them all 0600 under a 022 umask).
    #[test]
    fn an_atomic_write_has_an_ordinary_files_mode() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, plain) = (dir.path().join("ours"), dir.path().join("plain"));
        super::write_atomic(&ours, b"x").unwrap();
        std::fs::write(&plain, b"x").unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ours), mode(&plain));
    }
}
