//! The history: one record per operation, as Jepsen keeps it.
//!
//! File format (`history.jsonl`, a stable contract): one JSON object per
//! line with `worker` (int), `key` (string), `op` (`"acquire"` |
//! `"release"` | `"exit"`: the worker process died there; a worker's own
//! file may also hold `"releasing"`, settled away before any check, see
//! [`settle_releases`]), `invoke_ns` and `complete_ns` (CLOCK_MONOTONIC ns, shared
//! by all processes on a host), `outcome` (`"ok"` | `"fail"` | `"info"`;
//! info = outcome unknown), `token` (int or null), and for releases
//! `was_held` (false = the lock was no longer ours when we released it) and
//! `told` (`"nothing"` | `"expired"` | `"lost"`: what the holder knew of its
//! lock just before releasing), and for successful acquires `round_trips`
//! (backend round trips it cost); for `fail` and `info` events `error`
//! (`{"kind": "timeout" | "not_held" | "lost" | "unsupported" | "config" |
//! "backend", "message": ...}`).

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The environment variable that moves every time stamp a process writes
/// by a whole number of milliseconds (either sign): a worker host whose
/// clock is not the others', for the multi-host checks. Unset or not a
/// number: no skew (the CLI refuses a bad value before it starts).
pub const SKEW_ENV: &str = "LOCKBENCH_CLOCK_SKEW_MS";

fn skew_ns() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        std::env::var(SKEW_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .map_or(0, |ms| ms.saturating_mul(1_000_000))
    })
}

/// Nanoseconds on CLOCK_MONOTONIC: comparable across processes on one host
/// (moved by [`SKEW_ENV`] when it is set; the offset is fixed, so times
/// stay comparable within the process's host).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let raw = u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec).unwrap_or(0);
    match skew_ns() {
        0 => raw,
        s if s > 0 => raw.saturating_add(s.unsigned_abs()),
        s => raw.saturating_sub(s.unsigned_abs()),
    }
}

/// Which operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Taking the lock.
    Acquire,
    /// Giving it back.
    Release,
    /// The worker process ended without finishing (killed, crashed): its
    /// events end here, and a hold it had open is taken to last until now.
    /// Recorded by the coordinator, with an empty key.
    Exit,
    /// A release about to be sent: written to the worker's own file before
    /// the release goes out, so that a worker killed while its release is
    /// in flight leaves the end of its hold on disk (without it the hold
    /// would look open until the death, and a rival's legitimate acquire in
    /// between would read as two holders). [`settle_releases`] drops it
    /// when the release's own record follows and otherwise turns it into an
    /// `info` release: a settled history never holds one.
    Releasing,
}

/// Jepsen's three outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It happened.
    Ok,
    /// It definitely did not happen.
    Fail,
    /// Unknown (a timeout after sending): it may have happened.
    Info,
}

/// What a holder had been told about its lock when it came to release it:
/// the report tells "the lock said it was lost and the holder went on"
/// from "two holders, and neither was told".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Told {
    /// Nothing: as far as the holder knew, the lock was still its own.
    Nothing,
    /// Its `valid_until` had passed (the lease it could vouch for was over),
    /// though `lost()` had not fired.
    Expired,
    /// `lost()` had fired.
    Lost,
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Worker id.
    pub worker: u32,
    /// Lock key.
    pub key: String,
    /// Operation.
    pub op: Op,
    /// When it was invoked.
    pub invoke_ns: u64,
    /// When it completed.
    pub complete_ns: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Fencing token of an acquisition.
    pub token: Option<u64>,
    /// For a release: whether the lock was still ours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_held: Option<bool>,
    /// For a successful acquire: backend round trips it cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trips: Option<u32>,
    /// For a release: what the holder had been told before it released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub told: Option<Told>,
    /// For a release in a faulted run: when the guard's `lost()` fired
    /// during the hold (CLOCK_MONOTONIC ns), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_ns: Option<u64>,
    /// For a `fail` or `info`: what kind of error, and its message (the
    /// server's own words where it gave any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<EventError>,
}

impl Event {
    /// `worker`'s process died at `at_ns`: its history ends there.
    pub fn exit(worker: u32, at_ns: u64) -> Self {
        Event {
            worker,
            key: String::new(),
            op: Op::Exit,
            invoke_ns: at_ns,
            complete_ns: at_ns,
            outcome: Outcome::Info,
            token: None,
            was_held: None,
            round_trips: None,
            told: None,
            lost_ns: None,
            error: None,
        }
    }
}

/// Settles the [`Op::Releasing`] records of a history that also holds its
/// workers' deaths ([`Op::Exit`]). A record whose release followed (same
/// worker, key and invoke time) goes; one whose release never came (the
/// worker died with it in flight) becomes that release, `info`: invoked
/// then, complete at the worker's death, outcome unknown. The critical
/// section ended when the release was invoked, whatever became of it.
pub fn settle_releases(history: Vec<Event>) -> Vec<Event> {
    use std::collections::{HashMap, HashSet};
    if !history.iter().any(|e| e.op == Op::Releasing) {
        return history;
    }
    let released: HashSet<(u32, String, u64)> = history
        .iter()
        .filter(|e| e.op == Op::Release)
        .map(|e| (e.worker, e.key.clone(), e.invoke_ns))
        .collect();
    let died: HashMap<u32, u64> = history
        .iter()
        .filter(|e| e.op == Op::Exit)
        .map(|e| (e.worker, e.invoke_ns))
        .collect();
    history
        .into_iter()
        .filter_map(|e| {
            if e.op != Op::Releasing {
                return Some(e);
            }
            if released.contains(&(e.worker, e.key.clone(), e.invoke_ns)) {
                return None;
            }
            Some(Event {
                op: Op::Release,
                complete_ns: died
                    .get(&e.worker)
                    .map_or(e.invoke_ns, |&d| d.max(e.invoke_ns)),
                outcome: Outcome::Info,
                was_held: None,
                error: Some(EventError {
                    kind: distlock::ErrorKind::Backend,
                    message: "the worker died before this release's outcome was recorded".into(),
                }),
                ..e
            })
        })
        .collect()
}

/// Why an operation failed or ended in doubt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventError {
    /// The error's kind.
    pub kind: distlock::ErrorKind,
    /// Its message.
    pub message: String,
}

impl EventError {
    /// From a lock error.
    pub fn of(e: &distlock::Error) -> Self {
        Self {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// A malformed history.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A line is not a valid event.
    #[error("{path}:{line}: {message}")]
    Malformed {
        /// File.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Error.
        #[source]
        source: std::io::Error,
    },
}

/// Reads a `history.jsonl`; blank lines are skipped.
///
/// # Errors
/// [`HistoryError::Malformed`] with the line number of the first bad line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Event>, HistoryError> {
    let shown = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| HistoryError::Io {
        path: shown.clone(),
        source,
    })?;
    parse_jsonl(std::io::BufReader::new(f), &shown)
}

/// Parses history lines from `r` (named `shown` in errors); blank lines
/// are skipped.
///
/// # Errors
/// [`HistoryError::Malformed`] with the line number of the first bad line.
pub fn parse_jsonl(r: impl BufRead, shown: &str) -> Result<Vec<Event>, HistoryError> {
    let mut out = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let line = line.map_err(|source| HistoryError::Io {
            path: shown.to_string(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| HistoryError::Malformed {
            path: shown.to_string(),
            line: i + 1,
            message,
        };
        let e: Event = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        if e.complete_ns < e.invoke_ns {
            return Err(bad("complete_ns is before invoke_ns".into()));
        }
        out.push(e);
    }
    Ok(settle_releases(out))
}

/// Writes events as JSON lines to `w`.
///
/// # Errors
/// I/O errors.
pub fn write_jsonl(w: &mut impl Write, events: &[Event]) -> std::io::Result<()> {
    for e in events {
        serde_json::to_writer(&mut *w, e)?;
        w.write_all(b"\n")?;
    }
    Ok(())
}
