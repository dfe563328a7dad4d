//! The coordinator: spawns worker OS processes, starts them together,
//! follows their progress and merges their histories.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::history::Event;
pub use crate::spec::RunPlan;
use crate::spec::{WorkerMsg, WorkerSpec};
use crate::HarnessError;

/// What the workers produced.
#[derive(Debug)]
pub struct RunOutput {
    /// Every worker's events, sorted by invoke time.
    pub history: Vec<Event>,
    /// Raw-floor samples from every worker (latency workload).
    pub floor_ns: Vec<u64>,
    /// Peer samples by name (latency workload).
    pub peers_ns: std::collections::BTreeMap<String, Vec<u64>>,
    /// (floor, cycle) ns of one iteration, every worker's (latency
    /// workload): the raw pairs behind the paired difference.
    pub paired_ns: Vec<[u64; 2]>,
    /// Open loop: every worker's successful cycles, timed from their
    /// intended starts.
    pub timed: Vec<crate::spec::TimedCycle>,
    /// From "go" to the first worker's measured loop (the latency
    /// workload's warm-up); part of `wall`.
    pub warmup: Duration,
    /// Whether any worker stopped on its time limit.
    pub timed_out: bool,
    /// Wall time from "go" to the last "done" (warm-up included).
    pub wall: Duration,
    /// CLOCK_MONOTONIC ns when "go" was sent.
    pub started_ns: u64,
    /// Workload counters, summed over workers.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Workload time marks, the latest over workers.
    pub marks: std::collections::BTreeMap<String, u64>,
    /// Workers that ended without finishing, in order of death.
    pub deaths: Vec<WorkerDeath>,
    /// Why the workers were told to stop before their plan's end, if they
    /// were (see [`LiveWorkers::stop`]).
    pub stopped: Option<String>,
}

/// A worker process that ended without finishing (killed, crashed, or
/// gave up with an error) after the run began. The run goes on without it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerDeath {
    /// Worker id.
    pub worker: u32,
    /// When it went (CLOCK_MONOTONIC ns): when a nemesis sent it SIGKILL
    /// if one did, else when the coordinator saw its output close or its
    /// error arrive. Its events end before this.
    pub at_ns: u64,
    /// Its exit status or its last words.
    pub message: String,
    /// Killed by the run's own fault (a nemesis's SIGKILL, or the fault
    /// point it was armed with): expected. Any other death means the run
    /// measured fewer workers than it planned.
    #[serde(default)]
    pub injected: bool,
}

/// What a nemesis may know of the workers while the run goes: their pids,
/// who is inside a critical section (when the plan announces holds), and
/// when "go" was sent. Shared with the caller of [`run`].
#[derive(Debug, Clone, Default)]
pub struct LiveWorkers(Arc<Mutex<Live>>);

#[derive(Debug, Default)]
struct Live {
    go_ns: Option<u64>,
    workers: Vec<LiveWorker>,
    points: Vec<(u32, String, u64)>,
    /// Each worker's latest metrics page.
    metrics: std::collections::BTreeMap<u32, String>,
    /// Why the run is to stop early, once somebody said so.
    stop: Option<String>,
}

/// One worker as the coordinator last heard of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveWorker {
    /// Its OS process id.
    pub pid: Option<u32>,
    /// Inside a critical section (last said `Holding`, not yet `Released`).
    pub holding: bool,
    /// Still running (not finished, not dead).
    pub alive: bool,
    /// Critical sections it has entered so far.
    pub holds_begun: u64,
    /// When a nemesis sent it SIGKILL (CLOCK_MONOTONIC ns).
    pub killed_ns: Option<u64>,
}

impl LiveWorkers {
    fn with<T>(&self, f: impl FnOnce(&mut Live) -> T) -> T {
        let mut g = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g)
    }

    /// When "go" was sent (CLOCK_MONOTONIC ns), once it was.
    pub fn go_ns(&self) -> Option<u64> {
        self.with(|l| l.go_ns)
    }

    /// Every worker, by id.
    pub fn workers(&self) -> Vec<LiveWorker> {
        self.with(|l| l.workers.clone())
    }

    /// The live workers inside a critical section now: (worker id, pid).
    pub fn holders(&self) -> Vec<(u32, u32)> {
        self.with(|l| {
            l.workers
                .iter()
                .enumerate()
                .filter(|(_, w)| w.alive && w.holding)
                .filter_map(|(i, w)| Some((u32::try_from(i).ok()?, w.pid?)))
                .collect()
        })
    }

    /// A nemesis is about to SIGKILL `worker`, stopped (or not) since
    /// `at_ns`: its death is dated then, not when the coordinator notices
    /// (a lock freed by the dropped connection may change hands before
    /// that).
    pub fn mark_killed(&self, worker: u32, at_ns: u64) {
        self.set(worker, |w| w.killed_ns = Some(at_ns));
    }

    /// Every worker's latest metrics page, merged into one Prometheus page
    /// (see [`crate::metrics::merge`]); empty until a worker sent one.
    pub fn metrics_page(&self) -> String {
        let pages: Vec<String> = self.with(|l| l.metrics.values().cloned().collect());
        crate::metrics::merge(&pages)
    }

    /// The armed fault points workers reached: (worker, point, at_ns).
    pub fn fault_points(&self) -> Vec<(u32, String, u64)> {
        self.with(|l| l.points.clone())
    }

    /// Critical sections entered so far, by all workers (a nemesis waits
    /// for this to move: "somebody took the lock after I struck").
    pub fn holds_begun(&self) -> u64 {
        self.with(|l| l.workers.iter().map(|w| w.holds_begun).sum())
    }

    /// Asks the workers to end their loops now (each finishes the
    /// operation it is in, then writes its history as at a normal end):
    /// the run can no longer measure what it set out to, e.g. a server it
    /// depends on died. The first reason given is kept.
    pub fn stop(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.with(|l| {
            l.stop.get_or_insert(reason);
        });
    }

    fn stop_reason(&self) -> Option<String> {
        self.with(|l| l.stop.clone())
    }

    fn set(&self, id: u32, f: impl FnOnce(&mut LiveWorker)) {
        self.with(|l| {
            if let Some(w) = l.workers.get_mut(id as usize) {
                f(w);
            }
        });
    }
}

struct Worker {
    id: u32,
    child: Child,
    /// Its output, read by a thread of its own ([`read_output`]).
    out: mpsc::UnboundedReceiver<Output>,
    /// Stamped by the kernel's wake at its death (see `alive`), once it
    /// is ready; `None` without the shared memory.
    died: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// When it died (CLOCK_MONOTONIC ns), as early as the coordinator can
    /// tell: the kernel's stamp or the close of its output.
    death_ns: Option<u64>,
}

/// What a worker's output thread passes on.
enum Output {
    Line(String),
    /// The output closed at this time (CLOCK_MONOTONIC ns).
    Closed(u64),
    Failed(std::io::Error),
}

/// Reads a worker's output on a thread of its own, blocked in `read(2)`,
/// so that the close of the pipe (the worker's death) is stamped the
/// moment the kernel wakes it. The kernel closes the worker's sockets at
/// the same moment, and a server that frees the dead worker's session
/// lock can hand it to a rival within a few hundred µs: stamped by a task
/// of the coordinator's runtime, or after reaping, the death came up to
/// 3 ms later than that rival's acquire (pg-advisory, kill -9 of a worker
/// inside its section: 5 of 20 runs read 1 overlap).
fn read_output(pipe: std::io::PipeReader, tx: mpsc::UnboundedSender<Output>) {
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(pipe);
    loop {
        let mut line = String::new();
        let next = match r.read_line(&mut line) {
            Ok(0) => Output::Closed(crate::history::monotonic_ns()),
            Ok(_) => Output::Line(line),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Output::Failed(e),
        };
        let last = !matches!(next, Output::Line(_));
        if tx.send(next).is_err() || last {
            return;
        }
    }
}

impl Worker {
    async fn next_msg(&mut self) -> Result<WorkerMsg, HarnessError> {
        loop {
            let line = match self.out.recv().await {
                Some(Output::Line(line)) => line,
                Some(Output::Failed(e)) => {
                    return Err(HarnessError::Worker {
                        worker: self.id,
                        message: format!("reading its output: {e}"),
                    })
                }
                closed => {
                    use std::os::unix::process::ExitStatusExt;
                    let closed = match closed {
                        Some(Output::Closed(at)) => at,
                        _ => crate::history::monotonic_ns(),
                    };
                    let kernel = match &self.died {
                        Some(cell) => kernel_stamp(cell).await,
                        None => None,
                    };
                    self.death_ns = Some(kernel.map_or(closed, |k| k.min(closed)));
                    let how = match self.child.wait().await {
                        Ok(s) => match (s.code(), s.signal()) {
                            (Some(c), _) => format!("exit code {c}"),
                            (None, Some(sig)) => format!("killed by signal {sig}"),
                            _ => s.to_string(),
                        },
                        Err(e) => format!("its status unknown: {e}"),
                    };
                    return Err(HarnessError::Worker {
                        worker: self.id,
                        message: format!("exited without finishing ({how})"),
                    });
                }
            };
            // Anything that is not a protocol line is a stray print: skip it.
            if let Ok(m) = serde_json::from_str::<WorkerMsg>(line.trim_end()) {
                return Ok(m);
            }
        }
    }
}

/// Sets its flag when dropped: the death watchers stop.
struct GiveUp(Arc<std::sync::atomic::AtomicBool>);

impl Drop for GiveUp {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The death a watcher stamped (see `alive`). The kernel wakes it before
/// the pipe closes, but its thread may run after the pipe's: it gets
/// 100 ms to store it.
async fn kernel_stamp(cell: &std::sync::atomic::AtomicU64) -> Option<u64> {
    let until = Instant::now() + Duration::from_millis(100);
    loop {
        let at = cell.load(std::sync::atomic::Ordering::SeqCst);
        if at != 0 {
            return Some(at);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Starts a worker; its output is the pipe's other end (our copy of the
/// writing end is gone when this returns, so the pipe closes with it).
fn spawn_worker(
    program: &Path,
    args: &[String],
    alive: Option<(libc::c_int, String)>,
) -> std::io::Result<(Child, std::io::PipeReader)> {
    let (reader, writer) = std::io::pipe()?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(writer)
        .stderr(Stdio::inherit());
    let alive_fd = alive.as_ref().map(|(fd, _)| *fd);
    if let Some((_, env)) = &alive {
        cmd.env(crate::alive::ALIVE_ENV, env);
    }
    // SAFETY: prctl and fcntl are async-signal-safe; a worker must never
    // outlive us, and it inherits the shared memory of `alive` (the
    // descriptor is close-on-exec for every other child).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = alive_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut cmd = Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd.spawn()?;
    Ok((child, reader))
}

/// Runs `plan` with worker processes started as `program args...` (the
/// lockbench binary in worker mode). `on_progress` gets the total number of
/// cycles done so far. Histories land in `out_dir/history.jsonl`.
///
/// # Errors
/// A worker that cannot start, connect or finish (named, with its message);
/// a run that overruns `max_secs` + 30 s is killed.
pub async fn run(
    plan: &RunPlan,
    program: &Path,
    args: &[String],
    out_dir: &Path,
    live: &LiveWorkers,
    on_progress: impl FnMut(u64),
) -> Result<RunOutput, HarnessError> {
    let ready = async { Ok(()) };
    run_gated(
        plan,
        program,
        args,
        out_dir,
        live,
        0..plan.workers,
        ready,
        on_progress,
    )
    .await
}

/// [`run`] for the workers `ids` of the plan only (one host's share of a
/// multi-host run), with "go" held back until `gate` is through (the
/// other hosts are ready too, and the coordinator said go).
///
/// # Errors
/// As [`run`], and `gate`'s error.
#[allow(clippy::too_many_arguments)] // run's six, plus the share and the gate
pub async fn run_gated(
    plan: &RunPlan,
    program: &Path,
    args: &[String],
    out_dir: &Path,
    live: &LiveWorkers,
    ids: std::ops::Range<u32>,
    gate: impl std::future::Future<Output = Result<(), HarnessError>>,
    mut on_progress: impl FnMut(u64),
) -> Result<RunOutput, HarnessError> {
    std::fs::create_dir_all(out_dir).map_err(|e| HarnessError::io(out_dir, e))?;
    live.with(|l| {
        l.go_ns = None;
        l.workers = vec![LiveWorker::default(); ids.end as usize];
        l.metrics.clear();
        l.stop = None;
    });
    let count = ids.end.saturating_sub(ids.start);
    // Deaths stamped in the kernel's order (see `alive`); without it, by
    // the pipe alone.
    let board = crate::alive::Board::new(ids.end as usize)
        .map_err(|e| tracing::warn!(error = %e, "no shared memory to stamp deaths by"))
        .ok();
    let give_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Stops the watching threads however this function returns.
    let _give_up = GiveUp(give_up.clone());
    let mut workers = Vec::new();
    let mut paths: Vec<PathBuf> = Vec::new();
    for id in ids.clone() {
        let history_path = out_dir.join(format!(".history-w{id}.jsonl"));
        let spec = WorkerSpec {
            worker: id,
            history_path: history_path.display().to_string(),
            plan: plan.clone(),
        };
        paths.push(history_path);
        let alive = board.as_ref().and_then(|b| b.for_worker(id));
        let (mut child, output) =
            spawn_worker(program, args, alive).map_err(|e| HarnessError::Worker {
                worker: id,
                message: format!("cannot start {}: {e}", program.display()),
            })?;
        live.set(id, |w| {
            w.pid = child.id();
            w.alive = true;
        });
        let mut stdin = child.stdin.take().ok_or_else(|| HarnessError::Worker {
            worker: id,
            message: "no stdin".into(),
        })?;
        let (out_tx, out) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name(format!("worker-{id}-output"))
            .spawn(move || read_output(output, out_tx))
            .map_err(|e| HarnessError::Worker {
                worker: id,
                message: format!("cannot start the thread reading its output: {e}"),
            })?;
        let mut line = serde_json::to_string(&spec).map_err(|e| HarnessError::Worker {
            worker: id,
            message: e.to_string(),
        })?;
        line.push('\n');
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| HarnessError::Worker {
                worker: id,
                message: format!("sending its orders: {e}"),
            })?;
        workers.push((
            Worker {
                id,
                child,
                out,
                died: None,
                death_ns: None,
            },
            stdin,
        ));
    }
    // Everyone connects first, so the run starts with all contenders ready.
    for (w, _) in workers.iter_mut() {
        let msg = tokio::time::timeout(Duration::from_secs(30), w.next_msg())
            .await
            .map_err(|_| HarnessError::Worker {
                worker: w.id,
                message: "not ready within 30 s".into(),
            })??;
        match msg {
            WorkerMsg::Ready => {
                if let Some(b) = &board {
                    w.died = Some(b.watch(w.id, give_up.clone()));
                }
            }
            WorkerMsg::Error { message } => {
                return Err(HarnessError::Worker {
                    worker: w.id,
                    message,
                })
            }
            other => {
                return Err(HarnessError::Worker {
                    worker: w.id,
                    message: format!("unexpected {other:?} before go"),
                })
            }
        }
    }
    gate.await?;
    for (w, stdin) in workers.iter_mut() {
        stdin
            .write_all(b"go\n")
            .await
            .map_err(|e| HarnessError::Worker {
                worker: w.id,
                message: format!("sending go: {e}"),
            })?;
    }
    let started = Instant::now();
    let started_ns = crate::history::monotonic_ns();
    live.with(|l| l.go_ns = Some(started_ns));
    // Each message carries when its reader saw it, a death its
    // `death_ns`: not when this loop gets to it (a session lock freed by
    // the death may change hands in between).
    let (tx, mut rx) = mpsc::unbounded_channel::<(u32, Result<WorkerMsg, HarnessError>, u64)>();
    let mut children = Vec::new();
    // Kept here, open until the run ends: the way to tell workers to stop.
    let mut stdins = Vec::new();
    for (mut w, stdin) in workers {
        let tx = tx.clone();
        stdins.push(stdin);
        children.push(tokio::spawn(async move {
            loop {
                let m = w.next_msg().await;
                let last = matches!(
                    m,
                    Err(_) | Ok(WorkerMsg::Done { .. } | WorkerMsg::Error { .. })
                );
                let seen = w.death_ns.unwrap_or_else(crate::history::monotonic_ns);
                if tx.send((w.id, m, seen)).is_err() || last {
                    break;
                }
            }
            let _ = w.child.wait().await;
        }));
    }
    drop(tx);
    let limit = Duration::from_secs(plan.max_secs + 30);
    let mut done = vec![0u64; ids.end as usize];
    let mut finished = 0;
    let mut floor_ns = Vec::new();
    let mut paired_ns = Vec::new();
    let mut timed = Vec::new();
    let mut loop_start_ns: Option<u64> = None;
    let mut peers_ns: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    let mut timed_out = false;
    let mut counters: std::collections::BTreeMap<String, u64> = Default::default();
    let mut marks: std::collections::BTreeMap<String, u64> = Default::default();
    let mut deaths: Vec<WorkerDeath> = Vec::new();
    let mut stopped = None;
    while finished < count {
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            for c in &children {
                c.abort();
            }
            return Err(HarnessError::Worker {
                worker: u32::MAX,
                message: format!("run did not finish within {limit:?}; workers killed"),
            });
        }
        if stopped.is_none() {
            if let Some(why) = live.stop_reason() {
                tracing::warn!(reason = %why, "stopping the workers early");
                for stdin in &mut stdins {
                    // A worker already gone has closed its end: nothing to tell.
                    let _ = stdin.write_all(b"stop\n").await;
                }
                stopped = Some(why);
            }
        }
        // Woken at least every 100 ms to look for a stop request.
        let (id, msg, seen) =
            match tokio::time::timeout(left.min(Duration::from_millis(100)), rx.recv()).await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => continue,
            };
        // A worker that dies mid-run ends its events there; the run goes
        // on with the others and records the death (a nemesis kills
        // workers on purpose, and a crash is a finding, not a reason to
        // throw the other workers' history away).
        let msg = match msg {
            Ok(WorkerMsg::Error { message }) | Err(HarnessError::Worker { message, .. }) => {
                live.set(id, |w| w.alive = false);
                let killed = live.with(|l| l.workers.get(id as usize).and_then(|w| w.killed_ns));
                let at_its_point = live.with(|l| l.points.iter().any(|p| p.0 == id));
                deaths.push(WorkerDeath {
                    worker: id,
                    at_ns: killed.map_or(seen, |k| k.min(seen)),
                    message,
                    injected: killed.is_some() || at_its_point,
                });
                finished += 1;
                continue;
            }
            other => other?,
        };
        match msg {
            WorkerMsg::Holding => live.set(id, |w| {
                w.holding = true;
                w.holds_begun += 1;
            }),
            WorkerMsg::Released => live.set(id, |w| w.holding = false),
            WorkerMsg::Metrics { text } => live.with(|l| {
                l.metrics.insert(id, text);
            }),
            WorkerMsg::FaultPoint { point, at_ns } => {
                live.with(|l| l.points.push((id, point, at_ns)));
            }
            WorkerMsg::Progress { done: n } => {
                done[id as usize] = n;
                on_progress(done.iter().fold(0u64, |a, b| a.saturating_add(*b)));
            }
            WorkerMsg::Done {
                floor_ns: f,
                peers_ns: p,
                paired_ns: pairs,
                timed: tc,
                loop_start_ns: ls,
                timed_out: t,
                counters: c,
                marks: m,
            } => {
                for (name, v) in c {
                    *counters.entry(name).or_default() += v;
                }
                for (name, v) in m {
                    let e = marks.entry(name).or_default();
                    *e = (*e).max(v);
                }
                floor_ns.extend(f);
                // Each worker's pairs arrive whole, so pairs stay pairs.
                paired_ns.extend(pairs);
                timed.extend(tc);
                if ls > 0 {
                    loop_start_ns = Some(loop_start_ns.map_or(ls, |s| s.min(ls)));
                }
                for (name, v) in p {
                    peers_ns.entry(name).or_default().extend(v);
                }
                timed_out |= t;
                finished += 1;
                live.set(id, |w| w.alive = false);
                if plan.duration_ms.is_none() {
                    done[id as usize] = plan.ops;
                }
                on_progress(done.iter().fold(0u64, |a, b| a.saturating_add(*b)));
            }
            WorkerMsg::Error { .. } | WorkerMsg::Ready => {}
        }
    }
    let wall = started.elapsed();
    drop(stdins);
    for c in children {
        let _ = c.await;
    }
    let mut history = Vec::new();
    for p in &paths {
        // A worker killed mid-write leaves a torn last line: keep what is
        // whole (its events end there, as its death says).
        history.extend(read_jsonl_prefix(p)?);
        let _ = std::fs::remove_file(p);
    }
    for d in &deaths {
        history.push(Event::exit(d.worker, d.at_ns));
    }
    let mut history = crate::history::settle_releases(history);
    history.sort_by_key(|e| (e.invoke_ns, e.worker));
    let warmup =
        Duration::from_nanos(loop_start_ns.map_or(0, |s| s.saturating_sub(started_ns))).min(wall);
    Ok(RunOutput {
        history,
        floor_ns,
        peers_ns,
        paired_ns,
        timed,
        warmup,
        timed_out,
        wall,
        started_ns,
        counters,
        marks,
        deaths,
        stopped,
    })
}

/// The whole lines of a worker's history file (a missing file is empty: the
/// worker died before its first write).
fn read_jsonl_prefix(p: &Path) -> Result<Vec<Event>, HarnessError> {
    let text = match std::fs::read_to_string(p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HarnessError::io(p, e)),
    };
    let whole = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let mut out = Vec::new();
    for (i, line) in whole.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Event = serde_json::from_str(line).map_err(|e| HarnessError::Worker {
            worker: u32::MAX,
            message: format!("{}:{}: {e}", p.display(), i + 1),
        })?;
        out.push(e);
    }
    Ok(out)
}
