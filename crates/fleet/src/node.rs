//! One server process and the faults that act on it.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::process::{self, SpawnSpec};
use crate::{DurabilitySettings, FleetError, Result};

/// How to tell that a node is ready to serve.
pub type Readiness = fn(&Node) -> std::result::Result<(), String>;

/// Everything needed to (re)start one server.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Human name, used in errors (`redis-0`, `postgres`).
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (e.g. `LD_PRELOAD` for libfaketime).
    pub env: Vec<(String, String)>,
    /// The node's own directory (data, config, log).
    pub dir: PathBuf,
    /// The node's loopback address.
    pub addr: Ipv4Addr,
    /// The node's port.
    pub port: u16,
    /// Run as another user (uid, gid).
    pub run_as: Option<(u32, u32)>,
    /// Readiness probe.
    pub ready: Readiness,
    /// How long readiness may take.
    pub ready_within: Duration,
    /// Set when the node runs under libfaketime: its clock file.
    pub clock_file: Option<PathBuf>,
    /// What the server was told about flushing writes to disk; `None` for
    /// a node that keeps no data of its own (a Redis Sentinel).
    pub durability: Option<DurabilitySettings>,
}

/// A running (or stopped) server process. Dropping it kills its whole
/// process group and waits until every member is gone.
pub struct Node {
    spec: NodeSpec,
    child: Mutex<Option<Child>>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.spec.name)
            .field("addr", &self.spec.addr)
            .field("port", &self.spec.port)
            .field("pid", &self.pid())
            .finish()
    }
}

/// The state letter of process `pid` (`None` once it is gone).
fn proc_state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    process::after_comm(&stat)?.next().map(str::to_string)
}

impl Node {
    /// Starts the process and waits for readiness.
    ///
    /// # Errors
    /// Spawn failures, or [`FleetError::NotReady`] with the log's tail.
    pub fn start(spec: NodeSpec) -> Result<Node> {
        let node = Node {
            spec,
            child: Mutex::new(None),
        };
        node.spawn_and_wait()?;
        Ok(node)
    }

    fn log_path(&self) -> PathBuf {
        self.spec.dir.join("server.log")
    }

    fn spawn_and_wait(&self) -> Result<()> {
        let child = process::spawn(SpawnSpec {
            program: self.spec.program.clone(),
            args: self.spec.args.clone(),
            env: self.spec.env.clone(),
            cwd: self.spec.dir.clone(),
            log: self.log_path(),
            run_as: self.spec.run_as,
        })?;
        if let Ok(mut c) = self.child.lock() {
            *c = Some(child);
        }
        let t0 = Instant::now();
        let mut last = String::from("not probed yet");
        while t0.elapsed() < self.spec.ready_within {
            if let Some(status) = self.exited() {
                last = format!("process exited ({status})");
                break;
            }
            match (self.spec.ready)(self) {
                Ok(()) => {
                    tracing::debug!(node = %self.spec.name, ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX), "ready");
                    return Ok(());
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let err = FleetError::NotReady {
            node: format!("{} ({}:{})", self.spec.name, self.spec.addr, self.spec.port),
            secs: t0.elapsed().as_secs_f64(),
            reason: last,
            log: self.log_path().display().to_string(),
            tail: self.log_tail(15),
        };
        self.kill_quietly();
        Err(err)
    }

    fn exited(&self) -> Option<String> {
        let mut c = self.child.lock().ok()?;
        match c.as_mut()?.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The node's loopback address.
    pub fn addr(&self) -> Ipv4Addr {
        self.spec.addr
    }

    /// The node's port.
    pub fn port(&self) -> u16 {
        self.spec.port
    }

    /// `addr:port`.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.spec.addr, self.spec.port)
    }

    /// `redis://addr:port` (meaningful for Redis nodes).
    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.spec.addr, self.spec.port)
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        &self.spec.dir
    }

    /// The durability settings the server was started with (see
    /// [`crate::Durability`]); `None` for a node that keeps no data (a
    /// Redis Sentinel).
    pub fn durability(&self) -> Option<&DurabilitySettings> {
        self.spec.durability.as_ref()
    }

    /// The pid of the server process (also its process group id).
    pub fn pid(&self) -> Option<i32> {
        let c = self.child.lock().ok()?;
        c.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    /// How the server process ended (`exit status: 1`, `signal: 9`), if
    /// it has.
    pub fn exit_status(&self) -> Option<String> {
        self.exited()
    }

    /// Whether the process is running (a paused one counts as running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some() && self.exited().is_none()
    }

    /// The last `n` lines of the node's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn control_err(&self, op: &'static str, e: impl fmt::Display) -> FleetError {
        FleetError::Control {
            node: self.spec.name.clone(),
            op,
            message: e.to_string(),
        }
    }

    fn signal(&self, op: &'static str, sig: i32) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| self.control_err(op, "not running"))?;
        process::signal_tree(pid, sig).map_err(|e| self.control_err(op, e))
    }

    /// The server's processes: its leader, and descendants that left its
    /// process group (PostgreSQL's backends).
    pub fn processes(&self) -> Vec<i32> {
        self.pid().map(process::tree).unwrap_or_default()
    }

    /// CPU time the server has used so far (user + system), in ms: every
    /// process of [`Self::processes`] and what each reaped, so a PostgreSQL
    /// backend that exited is still counted, through its postmaster.
    pub fn cpu_ms(&self) -> f64 {
        self.processes().into_iter().map(process::cpu_ms).sum()
    }

    /// `kill -9` of the whole process group; returns once it is gone.
    ///
    /// # Errors
    /// If the group would not die within 5 s.
    pub fn kill(&self) -> Result<()> {
        let mut c = self
            .child
            .lock()
            .map_err(|_| self.control_err("kill", "poisoned"))?;
        if let Some(mut child) = c.take() {
            let pgid = i32::try_from(child.id())
                .map_err(|_| self.control_err("kill", "pid out of range"))?;
            if !process::kill_group_and_wait(pgid, &mut child, Duration::from_secs(5)) {
                return Err(self.control_err("kill", "process group still alive after 5 s"));
            }
        }
        Ok(())
    }

    fn kill_quietly(&self) {
        if let Err(e) = self.kill() {
            tracing::error!(node = %self.spec.name, error = %e, "teardown failed");
        }
    }

    /// Graceful stop: SIGTERM, up to `grace` to exit, then SIGKILL.
    ///
    /// # Errors
    /// If the group would not die.
    pub fn stop(&self, grace: Duration) -> Result<()> {
        if let Some(pid) = self.pid() {
            let _ = process::signal_group(pid, libc::SIGCONT);
            let _ = process::signal_group(pid, libc::SIGTERM);
            let t0 = Instant::now();
            while t0.elapsed() < grace && self.exited().is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.kill()
    }

    /// SIGSTOP of every process of the server, the backends that left its
    /// group included: they stay, answer nothing (a GC pause, a VM stall).
    ///
    /// # Errors
    /// If the node is not running.
    pub fn pause(&self) -> Result<()> {
        self.signal("pause", libc::SIGSTOP)?;
        // SIGSTOP lands asynchronously: return only once the process is
        // really stopped, so a fault's window starts when we say it does.
        self.wait_state("pause", true)
    }

    /// [`Node::pause`] (`true`) or [`Node::resume`] (`false`).
    ///
    /// # Errors
    /// As those.
    pub fn set_paused(&self, paused: bool) -> Result<()> {
        if paused {
            self.pause()
        } else {
            self.resume()
        }
    }

    /// SIGCONT after [`Node::pause`]; returns once the process runs again.
    ///
    /// # Errors
    /// If the node is not running.
    pub fn resume(&self) -> Result<()> {
        self.signal("resume", libc::SIGCONT)?;
        self.wait_state("resume", false)
    }

    /// Polls `/proc/PID/stat` of every process of the server until each is
    /// (or is no longer) in state `T` (stopped), for at most 5 s.
    fn wait_state(&self, op: &'static str, stopped: bool) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| self.control_err(op, "not running"))?;
        let t0 = Instant::now();
        loop {
            let lagging = process::tree(pid).into_iter().find_map(|p| {
                let state = proc_state(p)?;
                // A process that exited meanwhile is neither.
                let done = state == "Z" || state == "X";
                ((state == "T") != stopped && !done).then_some((p, state))
            });
            let Some((p, state)) = lagging else {
                return Ok(());
            };
            // A process in uninterruptible sleep (an fsync on a busy disk)
            // takes the signal when it comes out.
            if t0.elapsed() > Duration::from_secs(5) {
                return Err(self.control_err(
                    op,
                    format!("process {p}'s state is still {state:?} after 5 s"),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Moves this node's clock (it must have been started with a fake
    /// clock): libfaketime syntax, e.g. `+30s` to jump ahead, `+0 x10` to
    /// run ten times fast, `+0` for real time.
    ///
    /// # Errors
    /// If the node has no fake clock, or the file cannot be written.
    pub fn set_clock(&self, spec: &str) -> Result<()> {
        let file = self.spec.clock_file.as_ref().ok_or_else(|| {
            self.control_err("set_clock", "node was not started with a fake clock")
        })?;
        crate::faketime::write_clock(file, spec)
    }

    /// Kills the node (if running), waits for it to be gone, and starts it
    /// again on the same address and port with the same data dir.
    ///
    /// # Errors
    /// As for [`Node::kill`] and [`Node::start`].
    pub fn restart(&self) -> Result<()> {
        self.kill()?;
        self.spawn_and_wait()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_quietly();
    }
}

/// Starts a node on a fresh port, retrying on another port when the one
/// probed free was taken in the meantime by a parallel test.
pub(crate) fn start_on_free_port(
    addr: Ipv4Addr,
    build: impl Fn(u16) -> Result<NodeSpec>,
) -> Result<Node> {
    let mut last = None;
    for _ in 0..4 {
        let port = crate::PortAllocator::free_port(addr)?;
        match Node::start(build(port)?) {
            Err(e @ FleetError::NotReady { .. }) if e.to_string().contains("in use") => {
                last = Some(e)
            }
            r => return r,
        }
    }
    Err(last.unwrap_or_else(|| FleetError::NoPort(addr.to_string())))
}
