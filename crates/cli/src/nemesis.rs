//! The nemesis of `lockbench run --fault`: one fault (or `--fault-repeat`
//! of them on a seeded schedule), at a set time after the workers start,
//! on real processes (the lock's servers, or the worker that holds the
//! lock), undone cleanly, and recorded.

use std::sync::Arc;
use std::time::Duration;

use harness::coordinator::LiveWorkers;
use harness::history::{monotonic_ns, Event, Op, Outcome};
use lockbench_registry::Servers;
use serde::Serialize;

/// The faults `lockbench run --fault` can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGSTOP every server process of the lock for the duration, then
    /// SIGCONT (the seed's "Redis down for 5 s"). Needs servers lockbench
    /// starts itself.
    NodePause,
    /// kill -9 every server process of the lock, restart them on the same
    /// addresses with their data after the duration. Needs servers
    /// lockbench starts itself.
    NodeKill,
    /// kill -9 the worker process holding the lock (recovery: lease,
    /// session timeout, TTL or connection drop).
    HolderKill,
    /// SIGSTOP the worker holding the lock for the duration (default 2 x
    /// the lease), then SIGCONT: it finishes its section believing it
    /// still holds (Kleppmann's GC pause). Where the lock has a fault
    /// point in its release (`redis-get-del`, between GET and DEL), worker
    /// 0 stalls there instead: the check-then-act race, made to happen.
    HolderPause,
    /// Cut the targeted servers (`--fault-target`, default all: use
    /// minority or majority) from the other servers for the duration
    /// (nftables; the workers still reach every server).
    Partition,
    /// Cut the workers from the targeted servers for the duration (a
    /// client that reaches only some of the RedLock masters or ensemble
    /// members).
    PartitionClients,
    /// Jump the targeted RedLock masters' clocks forward by the duration
    /// (libfaketime): their keys expire early (Kleppmann's RedLock
    /// scenario). The clocks stay ahead.
    ClockJump,
    /// A worker exits between the steps of a multi-step acquire (after
    /// SETNX, before PEXPIRE in `redis-setnx-expire`), at a fault point it
    /// armed: the immortal lock.
    AcquireCrash,
    /// The seeds' Redis drill, "the primary dies and a replica takes
    /// over", with the replica lagging: SIGSTOP the replica, wait for a
    /// worker to take the lock, kill -9 the primary, SIGCONT the replica;
    /// the sentinels (or the cluster) promote it without that lock. The
    /// killed node rejoins as a replica after the duration. Needs
    /// `--topology sentinel` or `cluster`.
    Failover,
}

impl FaultKind {
    /// The name `--fault` takes (`node-pause`), for messages, labels and
    /// directory names.
    pub fn cli_name(self) -> String {
        match clap::ValueEnum::to_possible_value(&self) {
            Some(v) => v.get_name().to_string(),
            None => format!("{self:?}"),
        }
    }

    /// One line on what it does and needs, for `lockbench faults`.
    pub fn about(self) -> &'static str {
        match self {
            FaultKind::NodePause => "SIGSTOP every server of the lock for --fault-duration (default 5 s), then SIGCONT; needs servers lockbench starts",
            FaultKind::NodeKill => "kill -9 every server of the lock, restart it with its data after --fault-duration (default 5 s); needs servers lockbench starts",
            FaultKind::HolderKill => "kill -9 the worker process that holds the lock; any backend",
            FaultKind::HolderPause => "SIGSTOP the worker that holds the lock for --fault-duration (default 2 x --lease-ms, else 5 s), then SIGCONT; any backend. redis-get-del's worker 0 stalls between its release's GET and DEL instead (its race, made to happen)",
            FaultKind::Partition => "nftables drop rules between the targeted servers (--fault-target minority|majority|one) and the others for --fault-duration; needs root, nftables and servers lockbench starts",
            FaultKind::PartitionClients => "nftables drop rules between the workers and the targeted servers for --fault-duration; needs root, nftables and servers lockbench starts",
            FaultKind::ClockJump => "jump the clocks of the targeted RedLock masters (--fault-target, e.g. majority) forward by --fault-duration seconds (libfaketime); their keys expire early; the clocks stay ahead; redlock",
            FaultKind::AcquireCrash => "worker 0 exits at its lock's fault point between two acquire steps (after SETNX, before PEXPIRE); backends with a multi-step acquire (redis-setnx-expire)",
            FaultKind::Failover => "Redis primary killed while its replica lags (paused and cut off until a worker takes the lock, at most 10 s, then 0.5 s): the replica is promoted without that lock; the killed node rejoins as a replica after --fault-duration; redis/redis-wait with --topology sentinel or cluster",
        }
    }

    /// Whether it acts on the servers (and so needs lockbench to own them).
    pub fn on_servers(self) -> bool {
        matches!(
            self,
            FaultKind::NodePause
                | FaultKind::NodeKill
                | FaultKind::Failover
                | FaultKind::Partition
                | FaultKind::PartitionClients
                | FaultKind::ClockJump
        )
    }

    /// Whether it needs the workers to announce their critical sections:
    /// it aims at the holder, or waits for somebody to take the lock.
    pub fn needs_holds(self) -> bool {
        !matches!(
            self,
            FaultKind::NodePause
                | FaultKind::NodeKill
                | FaultKind::Partition
                | FaultKind::PartitionClients
                | FaultKind::ClockJump
        )
    }
}

/// Which of the lock's servers a node fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeTarget {
    /// Every server of the lock.
    All,
    /// One server (the first).
    One,
    /// A minority: (N-1)/2 servers, at least one (1 of 3 in an ensemble).
    Minority,
    /// A majority: N/2+1 servers (2 of 3).
    Majority,
}

impl NodeTarget {
    /// How many of `n` servers it hits.
    pub fn count(self, n: usize) -> usize {
        match self {
            NodeTarget::All => n,
            NodeTarget::One => n.min(1),
            NodeTarget::Minority => ((n.saturating_sub(1)) / 2).max(1).min(n),
            NodeTarget::Majority => (n / 2 + 1).min(n),
        }
    }
}

/// When and how long.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Which fault.
    pub kind: FaultKind,
    /// Which servers, for a node fault.
    pub target: NodeTarget,
    /// After "go".
    pub at: Duration,
    /// How long it lasts (a kill of a worker lasts for ever).
    pub duration: Duration,
    /// How many times (`--fault-repeat`): each after the previous one was
    /// undone, `at` x a factor in [0.5, 1.5) drawn from `seed` later.
    pub repeat: u32,
    /// The schedule's seed (the run's `--seed`).
    pub seed: u64,
    /// The key the workers lock (a cluster failover hits its master).
    pub key: String,
    /// The lock's fault point the fault acts at (worker 0 arms it at
    /// `at`): the crash point for `acquire-crash`, the release's pause
    /// point for `holder-pause` where the lock has one.
    pub point: Option<&'static str>,
}

/// How long the replica lags behind the primary in a failover, once a
/// worker has taken the lock on the primary alone.
const REPLICA_LAG: Duration = Duration::from_millis(500);

/// How long a failover waits, replica stopped, for a worker to take the
/// lock. The replica notices its cut link only when resumed, so the
/// sentinels still find it fresh enough to promote.
const LAG_WINDOW: Duration = Duration::from_secs(10);

/// What happened, for results.json.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// Which fault.
    pub fault: FaultKind,
    /// What it hit: `worker 2 (pid 1234)`, `redis 127.0.0.2:21000`, ...
    pub target: String,
    /// When it began (CLOCK_MONOTONIC ns, as the history).
    pub started_ns: u64,
    /// When it was undone (None: a kill of a worker, nothing to undo). A
    /// fault that outlasts the run is still undone, so this may lie past
    /// the history's last event.
    pub healed_ns: Option<u64>,
    /// Failed and unknown acquires that completed while it lasted.
    pub fail_during: u64,
    /// Unknown-outcome acquires among them.
    pub info_during: u64,
    /// Successful acquires that completed while it lasted: with
    /// `fail_during`, what tells "cost nothing" from "stopped everything"
    /// (a stalled waiter fails nothing until its budget runs out).
    pub ok_during: u64,
    /// The longest time, ms, without any successful acquire in a gap that
    /// reaches into the fault (from the last success before it, or its
    /// start, to the next success; to the run's last event if none came).
    pub stalled_ms: Option<f64>,
    /// From the heal (or, for a fault on the holder: a kill, a crash or a
    /// pause, from its start) to the first successful acquire by another
    /// worker, ms.
    pub recovery_ms: Option<f64>,
    /// Why nothing happened, if nothing did.
    pub skipped: Option<String>,
    /// Which repetition (0-based) of `--fault-repeat`.
    pub repetition: u32,
    /// What else the fault saw (a failover: whether a lock was taken on
    /// the primary alone).
    pub note: Option<String>,
    /// The first double holding the fault caused (another worker acquired
    /// while a holder still held): whether that holder's `lost()` fired
    /// before it released.
    pub told_lost: Option<bool>,
    /// And when, from the other worker's acquire: the lock-lost detection
    /// delay, ms (negative: told before the lock changed hands).
    pub lost_detection_ms: Option<f64>,
    /// The lock's own fault point the fault acted at, when it did (the
    /// worker was inside the lock's code by construction, not by a signal
    /// landing in time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point: Option<String>,
}

fn record(kind: FaultKind, target: String, started_ns: u64) -> FaultRecord {
    FaultRecord {
        fault: kind,
        target,
        started_ns,
        healed_ns: None,
        fail_during: 0,
        info_during: 0,
        ok_during: 0,
        stalled_ms: None,
        recovery_ms: None,
        skipped: None,
        repetition: 0,
        note: None,
        told_lost: None,
        lost_detection_ms: None,
        point: None,
    }
}

/// Node faults act through the fleet's blocking calls.
async fn on_nodes(
    servers: &Arc<Servers>,
    target: NodeTarget,
    f: impl Fn(&fleet::Node) -> fleet::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let servers = servers.clone();
    tokio::task::spawn_blocking(move || {
        for n in servers.split(|n| target.count(n)).0 {
            f(n)?;
        }
        Ok::<_, fleet::FleetError>(())
    })
    .await??;
    Ok(())
}

fn signal(pid: u32, sig: i32) -> anyhow::Result<()> {
    let pid = i32::try_from(pid)?;
    // SAFETY: kill(2) on a worker process we spawned.
    if unsafe { libc::kill(pid, sig) } != 0 {
        anyhow::bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `plan` (each repetition in turn) against the run's servers and
/// workers; returns once the last fault is undone, or `stop` says the run
/// is over (a fault already begun is still undone).
pub async fn run(
    plan: FaultPlan,
    servers: Arc<Servers>,
    live: LiveWorkers,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Vec<FaultRecord>> {
    let mut records = Vec::new();
    let waits = waits(&plan);
    for (i, wait) in (0u32..).zip(waits.iter().copied()) {
        let last = i as usize + 1 == waits.len();
        let mut r = run_once(&plan, wait, last, &servers, &live, stop.clone()).await?;
        r.repetition = i;
        let skipped = r.skipped.is_some();
        records.push(r);
        if skipped || *stop.borrow() {
            break;
        }
    }
    Ok(records)
}

/// Each repetition's wait: `at` after "go" for the first, then `at` x a
/// factor in [0.5, 1.5) drawn from the seed after the previous one was
/// undone.
fn waits(plan: &FaultPlan) -> Vec<Duration> {
    use rand::{Rng as _, SeedableRng as _};
    let mut rng = rand::rngs::StdRng::seed_from_u64(plan.seed);
    (0..plan.repeat.max(1))
        .map(|i| {
            if i == 0 {
                plan.at
            } else {
                plan.at.mul_f64(rng.random_range(0.5..1.5))
            }
        })
        .collect()
}

/// When the last repetition begins at the earliest, after "go": undoing a
/// fault only ever adds to its `duration`, so a run that ends before this
/// cannot hold every repetition (checked before anything starts).
pub fn earliest_last_start(plan: &FaultPlan) -> Duration {
    let waits = waits(plan);
    let faults_before = u32::try_from(waits.len().saturating_sub(1)).unwrap_or(u32::MAX);
    waits.iter().sum::<Duration>() + plan.duration * faults_before
}

/// One fault, `wait` after "go" (the first) or after the previous fault
/// was undone (the others).
async fn run_once(
    plan: &FaultPlan,
    wait: Duration,
    last: bool,
    servers: &Arc<Servers>,
    live: &LiveWorkers,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<FaultRecord> {
    let kind = plan.kind;
    // Wait for "go", then for the fault's time.
    let go = loop {
        if let Some(go) = live.go_ns() {
            break go;
        }
        if *stop.borrow() {
            let mut r = record(kind, String::new(), monotonic_ns());
            r.skipped = Some("the run ended before it started".into());
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let since = Duration::from_nanos(monotonic_ns().saturating_sub(go));
    let wait = if since < plan.at {
        plan.at - since
    } else {
        wait
    };
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = stop.changed() => {
            let mut r = record(kind, String::new(), monotonic_ns());
            r.skipped = Some("the run ended before the fault's time".into());
            return Ok(r);
        }
    }
    // Named with their roles, asked before the fault: a leader and a
    // follower hit are different faults.
    let targets = if !kind.on_servers() || kind == FaultKind::Failover {
        String::new()
    } else {
        let (srv, target) = (servers.clone(), plan.target);
        tokio::task::spawn_blocking(move || {
            srv.split(|n| target.count(n))
                .0
                .iter()
                .map(|n| match srv.role(n) {
                    Some(role) => format!("{} {} ({role})", n.name(), n.host_port()),
                    None => format!("{} {}", n.name(), n.host_port()),
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .await?
    };
    let nodes = || targets.clone();
    if let Some(point) = plan.point {
        return at_point(plan, point, live, &mut stop).await;
    }
    match kind {
        FaultKind::AcquireCrash => {
            let mut r = record(kind, String::new(), monotonic_ns());
            r.skipped = Some("the lock has no fault point inside its acquire".into());
            Ok(r)
        }
        FaultKind::NodePause | FaultKind::NodeKill => {
            let mut r = record(kind, nodes(), monotonic_ns());
            if kind == FaultKind::NodePause {
                on_nodes(servers, plan.target, fleet::Node::pause).await?;
            } else {
                on_nodes(servers, plan.target, fleet::Node::kill).await?;
            }
            r.started_ns = monotonic_ns();
            // The fault lasts its duration even if the run ends first: the
            // servers are undone before anyone drops them.
            tokio::time::sleep(plan.duration).await;
            if kind == FaultKind::NodePause {
                // The pause ends with the first SIGCONT, so it is stamped
                // before one goes out (stamped once every process ran
                // again, grants in between looked like grants inside it).
                r.healed_ns = Some(monotonic_ns());
                on_nodes(servers, plan.target, fleet::Node::resume).await?;
            } else {
                // A kill ends when the restarted server is ready.
                on_nodes(servers, plan.target, fleet::Node::restart).await?;
                r.healed_ns = Some(monotonic_ns());
            }
            Ok(r)
        }
        FaultKind::Failover => failover(plan, last, servers, live, &stop).await,
        FaultKind::Partition | FaultKind::PartitionClients => {
            partition(plan, servers, live, nodes()).await
        }
        FaultKind::ClockJump => {
            let spec = format!("+{}s", plan.duration.as_secs().max(1));
            let mut r = record(kind, format!("{} clock {spec}", nodes()), monotonic_ns());
            on_nodes(servers, plan.target, move |n| n.set_clock(&spec)).await?;
            r.started_ns = monotonic_ns();
            r.note = Some("the clocks stay ahead".into());
            Ok(r)
        }
        FaultKind::HolderKill | FaultKind::HolderPause => {
            // The real holder, as the workers announce it; bounded wait.
            // The announcement can be stale by the time the signal lands
            // (the holder let go in the meantime), so the holder is first
            // stopped, then checked: once the coordinator has read what it
            // said before it stopped, is it still inside? If not, it is
            // let go again and the next holder is tried.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let (worker, pid, stopped_ns) = loop {
                if let Some((w, pid)) = live.holders().first().copied() {
                    let stopped_ns = monotonic_ns();
                    signal(pid, libc::SIGSTOP)?;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let inside = live
                        .workers()
                        .get(w as usize)
                        .is_some_and(|x| x.alive && x.holding);
                    if inside {
                        break (w, pid, stopped_ns);
                    }
                    signal(pid, libc::SIGCONT)?;
                }
                if tokio::time::Instant::now() > deadline || *stop.borrow() {
                    let mut r = record(kind, String::new(), monotonic_ns());
                    r.skipped = Some("no worker held the lock within 30 s".into());
                    return Ok(r);
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            };
            let target = format!("worker {worker} (pid {pid})");
            if kind == FaultKind::HolderKill {
                // Stopped inside its section since `stopped_ns`: nothing it
                // did after that reached anyone.
                live.mark_killed(worker, stopped_ns);
                let r = record(kind, target, stopped_ns);
                signal(pid, libc::SIGKILL)?;
                return Ok(r);
            }
            let mut r = record(kind, target, stopped_ns);
            let stopped_for = Duration::from_nanos(monotonic_ns().saturating_sub(stopped_ns));
            tokio::time::sleep(plan.duration.saturating_sub(stopped_for)).await;
            signal(pid, libc::SIGCONT)?;
            r.healed_ns = Some(monotonic_ns());
            Ok(r)
        }
    }
}

/// A fault at the lock's own fault point: worker 0 armed it at `at`; wait
/// (up to 30 s) for its lock to reach it.
async fn at_point(
    plan: &FaultPlan,
    point: &str,
    live: &LiveWorkers,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<FaultRecord> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((worker, reached, at_ns)) = live.fault_points().first().cloned() {
            let mut r = record(plan.kind, format!("worker {worker} at {reached}"), at_ns);
            r.point = Some(reached.clone());
            if plan.kind == FaultKind::HolderPause {
                r.healed_ns =
                    Some(at_ns + u64::try_from(plan.duration.as_nanos()).unwrap_or(u64::MAX));
            }
            return Ok(r);
        }
        let ended = *stop.borrow();
        if tokio::time::Instant::now() > deadline || ended {
            let mut r = record(plan.kind, String::new(), monotonic_ns());
            // Said as it happened: a run that ended first had not waited
            // 30 s (a probe read "within 30 s" after a 1 s run).
            r.skipped = Some(if ended {
                format!(
                    "the run ended before worker 0's lock reached the point {point:?} (it is armed at --fault-at; give a longer --duration or more --ops)"
                )
            } else {
                format!("worker 0's lock did not reach the point {point:?} within 30 s of arming")
            });
            return Ok(r);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Cuts the targeted servers from the other servers (`partition`) or
/// from the workers (`partition-clients`) for the duration.
async fn partition(
    plan: &FaultPlan,
    servers: &Arc<Servers>,
    live: &LiveWorkers,
    targets: String,
) -> anyhow::Result<FaultRecord> {
    let (hit, others) = servers.split(|n| plan.target.count(n));
    let side = |name: &str, ns: &[&fleet::Node]| fleet::Side {
        name: name.to_string(),
        pids: ns.iter().filter_map(|n| n.pid()).collect(),
        addrs: ns.iter().map(|n| n.addr()).collect(),
    };
    let (target, rest) = (&hit[..], &others[..]);
    let sides = if plan.kind == FaultKind::Partition {
        vec![
            side("targeted servers", target),
            side("other servers", rest),
        ]
    } else {
        let workers = fleet::Side {
            name: "workers".into(),
            pids: live
                .workers()
                .iter()
                .filter(|w| w.alive)
                .filter_map(|w| w.pid.and_then(|p| i32::try_from(p).ok()))
                .collect(),
            addrs: Vec::new(),
        };
        // The servers' own processes stay where they are: only what the
        // workers send to them is dropped.
        let mut servers = side("targeted servers", target);
        servers.pids.clear();
        vec![workers, servers]
    };
    let what = if plan.kind == FaultKind::Partition {
        format!("{targets} cut from the other servers")
    } else {
        format!("the workers cut from {targets}")
    };
    let mut r = record(plan.kind, what, monotonic_ns());
    let cut = tokio::task::spawn_blocking(move || fleet::Partition::cut(&sides)).await?;
    let mut cut = match cut {
        Ok(p) => p,
        // Not root, no nftables: said, never faked.
        Err(e) => {
            r.skipped = Some(format!("no partition: {e}"));
            return Ok(r);
        }
    };
    r.started_ns = monotonic_ns();
    tokio::time::sleep(plan.duration).await;
    // Stamped before the rules go: a packet may pass from the moment they
    // start going.
    r.healed_ns = Some(monotonic_ns());
    tokio::task::spawn_blocking(move || cut.heal()).await??;
    Ok(r)
}

/// The failover drill: the primary dies while its replica lags behind a
/// lock taken on the primary alone; the heal is the promotion.
async fn failover(
    plan: &FaultPlan,
    last: bool,
    servers: &Arc<Servers>,
    live: &LiveWorkers,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<FaultRecord> {
    let started = monotonic_ns();
    let (srv, lv, key) = (servers.clone(), live.clone(), plan.key.clone());
    let (outcome, took) = tokio::task::spawn_blocking(move || {
        let mut took = None;
        let outcome = srv.failover(
            &key,
            REPLICA_LAG,
            || {
                // A lock taken from now on exists on the primary alone.
                let before = lv.holds_begun();
                let t0 = std::time::Instant::now();
                while t0.elapsed() < LAG_WINDOW {
                    if lv.holds_begun() > before {
                        took = Some(t0.elapsed());
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            },
            Duration::from_secs(30),
        );
        (outcome, took)
    })
    .await?;
    let (killed, promoted) = match outcome {
        Some(Ok(x)) => x,
        // Recorded, not fatal: the run and its history go on.
        failed => {
            let mut r = record(FaultKind::Failover, String::new(), started);
            r.skipped = Some(match failed {
                Some(Err(e)) => format!("the failover did not complete: {e}"),
                _ => "these servers have no replica to promote".into(),
            });
            return Ok(r);
        }
    };
    let mut r = record(
        FaultKind::Failover,
        format!("primary {killed} killed while its replica lagged; {promoted} promoted"),
        started,
    );
    r.healed_ns = Some(monotonic_ns());
    r.note = Some(match took {
        Some(t) => format!(
            "a worker took the lock {:.0} ms after the replica stopped: that lock existed on the killed primary only",
            t.as_secs_f64() * 1e3
        ),
        None => format!("no worker took the lock in the {} s the replica lagged (refused, e.g. by WAIT, or nobody tried): the promoted replica had every lock taken", LAG_WINDOW.as_secs()),
    });
    // The killed node comes back as a replica, ready for the next
    // repetition; after the last one, only if the run goes on.
    if !(last && *stop.borrow()) {
        tokio::time::sleep(plan.duration).await;
        let (srv, node) = (servers.clone(), killed.clone());
        tokio::task::spawn_blocking(move || srv.rejoin(&node, Duration::from_secs(30)))
            .await?
            .transpose()?;
    }
    Ok(r)
}

/// Fills in what the history says about a fault: failures while it lasted
/// and the time to the next successful acquire by another worker.
pub fn measure(r: &mut FaultRecord, history: &[Event]) {
    if r.skipped.is_some() {
        return;
    }
    let victim: Option<u32> = r
        .target
        .strip_prefix("worker ")
        .and_then(|t| t.split(' ').next())
        .and_then(|w| w.parse().ok());
    let end = r.healed_ns.unwrap_or(u64::MAX);
    for e in history {
        if e.op == Op::Acquire && e.complete_ns >= r.started_ns && e.complete_ns <= end {
            match e.outcome {
                Outcome::Ok => r.ok_during += 1,
                Outcome::Info => {
                    r.fail_during += 1;
                    r.info_during += 1;
                }
                _ => r.fail_during += 1,
            }
        }
    }
    r.stalled_ms = stall(history, r.started_ns, end);
    // A fault on the holder is timed from its start: under a pause the
    // lease runs out and another worker takes over while the holder
    // sleeps (timed from the SIGCONT it read "16 ms" for a take-over that
    // came 304 ms into the pause).
    let from = match r.fault {
        FaultKind::HolderKill | FaultKind::AcquireCrash | FaultKind::HolderPause => r.started_ns,
        _ => r.healed_ns.unwrap_or(r.started_ns),
    };
    r.recovery_ms = history
        .iter()
        .filter(|e| {
            e.op == Op::Acquire
                && e.outcome == Outcome::Ok
                && e.complete_ns >= from
                && Some(e.worker) != victim
        })
        .map(|e| e.complete_ns)
        .min()
        .map(|t| (t - from) as f64 / 1e6);
    if let (FaultKind::HolderKill | FaultKind::HolderPause, Some(w), None) =
        (r.fault, victim, &r.point)
    {
        // The holder is chosen from its own announcement; it may have
        // released in the microseconds before the signal landed. (At a
        // fault point inside the release there is no signal to be late:
        // the release has begun, and stalls there.)
        let last = history
            .iter()
            .filter(|e| e.worker == w && e.op != Op::Exit && e.invoke_ns <= r.started_ns)
            .max_by_key(|e| e.invoke_ns);
        if !last.is_some_and(|e| e.op == Op::Acquire && e.outcome == Outcome::Ok) {
            r.note = Some(
                "the worker had let go before the signal landed: this run does not show the lock under the fault"
                    .into(),
            );
        }
    }
    if let Some((taken_ns, lost_ns)) = first_double_holding(history, r.started_ns) {
        r.told_lost = Some(lost_ns.is_some());
        r.lost_detection_ms = lost_ns.map(|l| (l as f64 - taken_ns as f64) / 1e6);
    }
    if r.fault == FaultKind::AcquireCrash && r.recovery_ms.is_none() {
        let end = history.iter().map(|e| e.complete_ns).max().unwrap_or(from);
        r.note = Some(format!(
            "lock never freed: no other worker held it in the {:.1} s from the crash to the end of the run",
            end.saturating_sub(from) as f64 / 1e9
        ));
    }
}

/// The longest gap between successful acquires (by anyone) that reaches
/// into [`from`, `to`]: from the last success before `from` (or `from`) to
/// the next one, to the history's last event if none came. ms.
fn stall(history: &[Event], from: u64, to: u64) -> Option<f64> {
    let mut oks: Vec<u64> = history
        .iter()
        .filter(|e| e.op == Op::Acquire && e.outcome == Outcome::Ok)
        .map(|e| e.complete_ns)
        .collect();
    oks.sort_unstable();
    let mut prev = oks
        .iter()
        .copied()
        .filter(|t| *t < from)
        .max()
        .unwrap_or(from);
    let mut longest = 0u64;
    for t in oks.into_iter().filter(|t| *t >= from) {
        longest = longest.max(t - prev);
        prev = t;
        if t > to {
            return Some(longest as f64 / 1e6);
        }
    }
    let last = history
        .iter()
        .map(|e| e.complete_ns.max(e.invoke_ns))
        .max()?;
    Some(longest.max(last.saturating_sub(prev)) as f64 / 1e6)
}

/// The first acquire, completed at or after `from`, by a worker while
/// another still held the key (it had acquired and not yet released):
/// (that acquire's completion, the holder's `lost()` time if it fired).
fn first_double_holding(history: &[Event], from: u64) -> Option<(u64, Option<u64>)> {
    let mut holds: Vec<(u32, &str, u64, u64, Option<u64>)> = Vec::new();
    let mut by_worker: std::collections::BTreeMap<u32, Vec<&Event>> = Default::default();
    for e in history {
        by_worker.entry(e.worker).or_default().push(e);
    }
    for (w, mut evs) in by_worker {
        evs.sort_by_key(|e| e.invoke_ns);
        let mut open: Option<&Event> = None;
        for e in evs {
            match (e.op, e.outcome) {
                (Op::Acquire, Outcome::Ok) => open = Some(e),
                (Op::Release, _) => {
                    if let Some(a) = open.take() {
                        holds.push((w, a.key.as_str(), a.complete_ns, e.invoke_ns, e.lost_ns));
                    }
                }
                _ => {}
            }
        }
    }
    history
        .iter()
        .filter(|t| t.op == Op::Acquire && t.outcome == Outcome::Ok && t.complete_ns >= from)
        .filter_map(|t| {
            holds
                .iter()
                .find(|(w, key, a, r, _)| {
                    *w != t.worker && *key == t.key && *a < t.complete_ns && t.complete_ns < *r
                })
                .map(|h| (t.complete_ns, h.4))
        })
        .min_by_key(|(t, _)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(worker: u32, at_ms: u64, outcome: Outcome) -> Event {
        let mut e = Event::exit(worker, at_ms * 1_000_000);
        e.op = Op::Acquire;
        e.outcome = outcome;
        e
    }

    /// "0 failed" read as "cost nothing" for a pause that stopped every
    /// acquire: the record now counts the successes inside the fault and
    /// the longest time without one.
    #[test]
    fn a_stall_shows_though_nothing_failed() {
        let history: Vec<Event> = [100, 200, 900, 3300, 3400]
            .into_iter()
            .map(|t| acquire(0, t, Outcome::Ok))
            .collect();
        let mut r = record(FaultKind::NodePause, "x".into(), 1_000_000_000);
        r.healed_ns = Some(3_000_000_000);
        measure(&mut r, &history);
        assert_eq!((r.ok_during, r.fail_during), (0, 0));
        assert_eq!(r.stalled_ms, Some(2400.0), "{r:?}");
        // Acquires going on through the fault: a short gap, and counted.
        let busy: Vec<Event> = (0..40)
            .map(|i| acquire(0, 900 + i * 100, Outcome::Ok))
            .collect();
        measure(&mut r, &busy);
        assert!(r.ok_during >= 20 && r.stalled_ms == Some(100.0), "{r:?}");
        // None after the fault began: to the history's last event.
        let mut dead = history[..3].to_vec();
        dead.push(acquire(1, 2500, Outcome::Fail));
        let mut r = record(FaultKind::NodePause, "x".into(), 1_000_000_000);
        r.healed_ns = Some(3_000_000_000);
        measure(&mut r, &dead);
        assert_eq!((r.ok_during, r.fail_during), (0, 1));
        assert_eq!(r.stalled_ms, Some(1600.0), "{r:?}");
    }

    /// A paused holder is taken over while it sleeps: the next holder is
    /// timed from the pause, not from the SIGCONT (which read 16 ms for a
    /// take-over 304 ms into the pause).
    #[test]
    fn a_holder_pause_is_timed_from_its_start() {
        let history = vec![
            acquire(0, 900, Outcome::Ok),
            acquire(1, 1304, Outcome::Ok),
            acquire(1, 3016, Outcome::Ok),
        ];
        let mut r = record(
            FaultKind::HolderPause,
            "worker 0 (pid 7)".into(),
            1_000_000_000,
        );
        r.healed_ns = Some(3_000_000_000);
        measure(&mut r, &history);
        assert_eq!(r.recovery_ms, Some(304.0), "{r:?}");
    }
}
