//! The worker side: one OS process, its own connections, a loop of lock
//! cycles recorded to a history file.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock, Error};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::history::{monotonic_ns, write_jsonl, Event, Op, Outcome};
use crate::spec::{WorkerMsg, WorkerSpec, Workload};

/// The raw round trips a lock cycle cannot beat, on the lock's own backend.
#[async_trait::async_trait]
pub trait Floor: Send + Sync {
    /// One floor sample (e.g. two PINGs).
    async fn round_trip(&self) -> distlock::Result<()>;
}

fn say(msg: &WorkerMsg) {
    let mut out = std::io::stdout().lock();
    if let Ok(line) = serde_json::to_string(msg) {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Worker main: announce ready, wait for `go` on stdin, run, write the
/// history, announce done. Errors are reported as a message, not a panic.
pub async fn serve(
    spec: WorkerSpec,
    lock: Arc<dyn DistLock>,
    floor: Option<Box<dyn Floor>>,
) -> bool {
    say(&WorkerMsg::Ready);
    let mut line = String::new();
    let mut stdin = BufReader::new(tokio::io::stdin());
    if stdin.read_line(&mut line).await.is_err() || line.trim() != "go" {
        say(&WorkerMsg::Error {
            message: "coordinator went away before go".into(),
        });
        return false;
    }
    match run(&spec, &*lock, floor.as_deref()).await {
        Ok((events, floor_ns, timed_out)) => {
            let written = std::fs::File::create(&spec.history_path).and_then(|f| {
                let mut w = std::io::BufWriter::new(f);
                write_jsonl(&mut w, &events)?;
                w.flush()
            });
            match written {
                Ok(()) => {
                    say(&WorkerMsg::Done {
                        floor_ns,
                        timed_out,
                    });
                    true
                }
                Err(e) => {
                    say(&WorkerMsg::Error {
                        message: format!("writing {}: {e}", spec.history_path),
                    });
                    false
                }
            }
        }
        Err(e) => {
            say(&WorkerMsg::Error {
                message: e.to_string(),
            });
            false
        }
    }
}

fn outcome_of(e: &Error) -> Outcome {
    if e.is_indeterminate() {
        Outcome::Info
    } else {
        Outcome::Fail
    }
}

type RunOut = (Vec<Event>, Vec<u64>, bool);

async fn run(
    spec: &WorkerSpec,
    lock: &dyn DistLock,
    floor: Option<&dyn Floor>,
) -> distlock::Result<RunOut> {
    let mut events = Vec::with_capacity(spec.ops as usize * 2 + 16);
    let mut floor_ns = Vec::new();
    let key = match spec.workload {
        Workload::Mutex => spec.key.clone(),
        Workload::Latency => format!("{}:w{}", spec.key, spec.worker),
    };
    let opts = AcquireOptions {
        wait: Some(Duration::from_millis(spec.wait_ms)),
        lease: spec.lease_ms.map(Duration::from_millis),
    };
    let hold = Duration::from_millis(spec.hold_ms);
    let stop_at = tokio::time::Instant::now() + Duration::from_secs(spec.max_secs);
    if spec.workload == Workload::Latency {
        // Warm-up: connections, script cache, allocator.
        for _ in 0..20 {
            if let Some(f) = floor {
                f.round_trip().await?;
            }
            let g = lock.acquire(&key, opts).await?;
            g.release().await?;
        }
    }
    let mut timed_out = false;
    for i in 0..spec.ops {
        if tokio::time::Instant::now() >= stop_at {
            timed_out = true;
            break;
        }
        if spec.workload == Workload::Latency {
            if let Some(f) = floor {
                let t0 = monotonic_ns();
                f.round_trip().await?;
                floor_ns.push(monotonic_ns() - t0);
            }
        }
        cycle(spec.worker, &key, lock, opts, hold, &mut events).await;
        if i % 10 == 9 {
            say(&WorkerMsg::Progress { done: i + 1 });
        }
    }
    Ok((events, floor_ns, timed_out))
}

/// acquire -> hold -> release, both ends recorded.
async fn cycle(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
    hold: Duration,
    events: &mut Vec<Event>,
) {
    let invoke_ns = monotonic_ns();
    let r = lock.acquire(key, opts).await;
    let complete_ns = monotonic_ns();
    let guard = match r {
        Ok(g) => g,
        Err(e) => {
            events.push(Event {
                worker,
                key: key.to_string(),
                op: Op::Acquire,
                invoke_ns,
                complete_ns,
                outcome: outcome_of(&e),
                token: None,
                was_held: None,
                round_trips: None,
            });
            return;
        }
    };
    events.push(Event {
        worker,
        key: key.to_string(),
        op: Op::Acquire,
        invoke_ns,
        complete_ns,
        outcome: Outcome::Ok,
        token: guard.token().map(|t| t.0),
        was_held: None,
        round_trips: Some(guard.round_trips()),
    });
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    let invoke_ns = monotonic_ns();
    let r = guard.release().await;
    let complete_ns = monotonic_ns();
    let (outcome, was_held) = match r {
        Ok(h) => (Outcome::Ok, Some(h)),
        Err(e) => (outcome_of(&e), None),
    };
    events.push(Event {
        worker,
        key: key.to_string(),
        op: Op::Release,
        invoke_ns,
        complete_ns,
        outcome,
        token: None,
        was_held,
        round_trips: None,
    });
}
