//! The worker side: one OS process, its own connections, a loop of lock
//! cycles recorded to a history file.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistLock, Error};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::history::{monotonic_ns, write_jsonl, Event, Op, Outcome};
use crate::spec::{WorkerMsg, WorkerSpec, Workload};

/// Something timed next to the lock cycle in the latency workload: the raw
/// floor (the round trips a cycle cannot beat, e.g. two PINGs on the lock's
/// own connection) or a peer implementation (another crate's lock).
#[async_trait::async_trait]
pub trait Probe: Send + Sync {
    /// One sample.
    async fn once(&self) -> distlock::Result<()>;
}

/// What the latency workload times besides our lock.
#[derive(Default)]
pub struct Probes {
    /// The backend's raw floor.
    pub floor: Option<Box<dyn Probe>>,
    /// Peers, by name (`redis`, `rslock`, ...).
    pub peers: Vec<(String, Box<dyn Probe>)>,
}

/// A peer that is itself a [`DistLock`]: one try-lock + release of `key`.
pub struct LockCycle {
    /// The peer lock.
    pub lock: Arc<dyn DistLock>,
    /// Its key (kept apart from the measured lock's key).
    pub key: String,
}

#[async_trait::async_trait]
impl Probe for LockCycle {
    async fn once(&self) -> distlock::Result<()> {
        self.lock
            .acquire(&self.key, AcquireOptions::try_lock())
            .await?
            .release()
            .await?;
        Ok(())
    }
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
pub async fn serve(spec: WorkerSpec, lock: Arc<dyn DistLock>, probes: Probes) -> bool {
    say(&WorkerMsg::Ready);
    let mut line = String::new();
    let mut stdin = BufReader::new(tokio::io::stdin());
    if stdin.read_line(&mut line).await.is_err() || line.trim() != "go" {
        say(&WorkerMsg::Error {
            message: "coordinator went away before go".into(),
        });
        return false;
    }
    let out = match run(&spec, &*lock, &probes).await {
        Ok(out) => out,
        Err(e) => {
            say(&WorkerMsg::Error {
                message: e.to_string(),
            });
            return false;
        }
    };
    let written = std::fs::File::create(&spec.history_path).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        write_jsonl(&mut w, &out.events)?;
        w.flush()
    });
    if let Err(e) = written {
        say(&WorkerMsg::Error {
            message: format!("writing {}: {e}", spec.history_path),
        });
        return false;
    }
    say(&WorkerMsg::Done {
        floor_ns: out.floor_ns,
        peers_ns: out.peers_ns,
        timed_out: out.timed_out,
    });
    true
}

fn outcome_of(e: &Error) -> Outcome {
    if e.is_indeterminate() {
        Outcome::Info
    } else {
        Outcome::Fail
    }
}

struct RunOut {
    events: Vec<Event>,
    floor_ns: Vec<u64>,
    peers_ns: BTreeMap<String, Vec<u64>>,
    timed_out: bool,
}

async fn sample(p: &dyn Probe) -> distlock::Result<u64> {
    let t0 = monotonic_ns();
    p.once().await?;
    Ok(monotonic_ns() - t0)
}

async fn run(spec: &WorkerSpec, lock: &dyn DistLock, probes: &Probes) -> distlock::Result<RunOut> {
    let mut events = Vec::with_capacity(spec.plan.ops as usize * 2 + 16);
    let mut floor_ns = Vec::new();
    let mut peers_ns: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let key = match spec.plan.workload {
        Workload::Mutex => spec.plan.key.clone(),
        Workload::Latency => format!("{}:w{}", spec.plan.key, spec.worker),
    };
    let opts = AcquireOptions {
        wait: Some(Duration::from_millis(spec.plan.wait_ms)),
        lease: spec.plan.lease_ms.map(Duration::from_millis),
    };
    let hold = Duration::from_millis(spec.plan.hold_ms);
    let stop_at = tokio::time::Instant::now() + Duration::from_secs(spec.plan.max_secs);
    let latency = spec.plan.workload == Workload::Latency;
    if latency {
        // Warm-up: connections, script caches, allocator.
        for _ in 0..20 {
            if let Some(f) = &probes.floor {
                f.once().await?;
            }
            for (_, p) in &probes.peers {
                p.once().await?;
            }
            lock.acquire(&key, opts).await?.release().await?;
        }
    }
    let mut timed_out = false;
    for i in 0..spec.plan.ops {
        if tokio::time::Instant::now() >= stop_at {
            timed_out = true;
            break;
        }
        // Interleaved with our cycles, so all see the same conditions.
        if latency {
            if let Some(f) = &probes.floor {
                floor_ns.push(sample(f.as_ref()).await?);
            }
            for (name, p) in &probes.peers {
                let ns = sample(p.as_ref()).await?;
                peers_ns.entry(name.clone()).or_default().push(ns);
            }
        }
        cycle(spec.worker, &key, lock, opts, hold, &mut events).await;
        if i % 10 == 9 {
            say(&WorkerMsg::Progress { done: i + 1 });
        }
    }
    Ok(RunOut {
        events,
        floor_ns,
        peers_ns,
        timed_out,
    })
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
