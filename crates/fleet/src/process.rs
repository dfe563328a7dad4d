//! Spawning servers so that none can outlive us, and killing whole groups.
//!
//! All servers are forked from ONE long-lived thread: the parent-death
//! signal (`PR_SET_PDEATHSIG`) fires when the forking *thread* exits, so a
//! short-lived thread (a tokio blocking thread, a test thread that outlives
//! its fleet) must never be the parent.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::{FleetError, Result};

/// Plain data describing a process to start.
#[derive(Debug, Clone)]
pub(crate) struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub log: PathBuf,
    /// Run as this (uid, gid) instead of ours (PostgreSQL refuses root).
    pub run_as: Option<(u32, u32)>,
}

type Reply = mpsc::Sender<std::io::Result<Child>>;

static SPAWNER: OnceLock<Mutex<mpsc::Sender<(SpawnSpec, Reply)>>> = OnceLock::new();
static GROUPS: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

fn spawner() -> Result<mpsc::Sender<(SpawnSpec, Reply)>> {
    let cell = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(SpawnSpec, Reply)>();
        let started = std::thread::Builder::new()
            .name("fleet-spawner".into())
            .spawn(move || {
                while let Ok((spec, reply)) = rx.recv() {
                    let _ = reply.send(spawn_here(&spec));
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "could not start the fleet spawner thread");
        }
        Mutex::new(tx)
    });
    cell.lock()
        .map(|tx| tx.clone())
        .map_err(|_| FleetError::Control {
            node: "fleet".into(),
            op: "spawn",
            message: "spawner lock poisoned".into(),
        })
}

fn spawn_here(spec: &SpawnSpec) -> std::io::Result<Child> {
    let log = File::options().create(true).append(true).open(&spec.log)?;
    let log2 = log.try_clone()?;
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    let run_as = spec.run_as;
    // SAFETY: between fork and exec we only call async-signal-safe libc
    // functions and touch no allocator or lock.
    unsafe {
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid)) = run_as {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Set after any uid change: changing credentials clears it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    if let Ok(pgid) = i32::try_from(child.id()) {
        register(pgid);
    }
    Ok(child)
}

/// Starts a process from the spawner thread, in its own process group.
pub(crate) fn spawn(spec: SpawnSpec) -> Result<Child> {
    let (tx, rx) = mpsc::channel();
    let what = format!("starting {}", spec.program.display());
    spawner()?.send((spec, tx)).map_err(|_| FleetError::Io {
        context: what.clone(),
        source: std::io::Error::other("spawner thread is gone"),
    })?;
    rx.recv()
        .map_err(|_| FleetError::Io {
            context: what.clone(),
            source: std::io::Error::other("spawner thread is gone"),
        })?
        .map_err(FleetError::io(what))
}

fn register(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.get_or_insert_with(HashSet::new).insert(pgid);
    }
}

pub(crate) fn unregister(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        if let Some(set) = g.as_mut() {
            set.remove(&pgid);
        }
    }
}

/// Sends `sig` to the whole process group `pgid`.
pub(crate) fn signal_group(pgid: i32, sig: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) with a negative pid signals a process group.
    if unsafe { libc::kill(-pgid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sends `sig` to group `pgid` and to the leader's descendants that left
/// it (PostgreSQL's backends each call `setsid`): a pause of the group
/// alone left every open session serving. The group goes first, so a
/// stopped postmaster forks no new backend while the strays are found.
pub(crate) fn signal_tree(pgid: i32, sig: i32) -> std::io::Result<()> {
    signal_group(pgid, sig)?;
    for p in strays(pgid) {
        // SAFETY: kill(2) on one pid; one that exited meanwhile is fine.
        unsafe { libc::kill(p, sig) };
    }
    Ok(())
}

/// The leader `pgid` and its descendants that left its group, if any: the
/// processes [`signal_tree`] reaches besides the group's own members.
pub(crate) fn tree(pgid: i32) -> Vec<i32> {
    let mut all = vec![pgid];
    all.extend(strays(pgid));
    all
}

/// SIGKILLs every server group this process started and has not yet torn
/// down. For Ctrl-C / SIGTERM handlers, which cannot wait for `Drop`.
pub fn kill_all() {
    // No partition rule outlives the run either.
    crate::partition::heal_all();
    let groups: Vec<i32> = GROUPS
        .lock()
        .ok()
        .and_then(|g| g.as_ref().map(|s| s.iter().copied().collect()))
        .unwrap_or_default();
    for pgid in groups {
        // The descendants that left the group (PostgreSQL's backends) too,
        // found before the leader dies and they are re-parented: a paused
        // server's backends are stopped, never notice their postmaster is
        // gone, and stayed stopped forever.
        let strays = strays(pgid);
        let _ = signal_group(pgid, libc::SIGKILL);
        for p in strays {
            // SAFETY: kill(2) on one pid.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// The fields of `/proc/<pid>/stat` (or a task's) that the fleet reads.
struct Stat {
    state: String,
    ppid: i32,
    pgrp: i32,
}

/// The fields of a `/proc/<pid>/stat` line after the parenthesised command
/// (which may itself hold spaces or parentheses): state, ppid, pgrp, ...
pub(crate) fn after_comm(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat.get(stat.rfind(')')? + 1..)?.split_whitespace())
}

impl Stat {
    fn read(path: &std::path::Path) -> Option<Self> {
        let stat = std::fs::read_to_string(path).ok()?;
        let mut f = after_comm(&stat)?;
        Some(Self {
            state: f.next()?.to_string(),
            ppid: f.next()?.parse().ok()?,
            pgrp: f.next()?.parse().ok()?,
        })
    }

    fn exited(&self) -> bool {
        self.state == "Z" || self.state == "X"
    }
}

/// Every process on the machine with its stat, from /proc.
fn processes() -> Vec<(i32, Stat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            Some((pid, Stat::read(&e.path().join("stat"))?))
        })
        .collect()
}

/// Live (non-zombie) processes in group `pgid`, from /proc. A zombie has
/// exited; under some inits reparented zombies linger, so they count as gone.
pub(crate) fn group_alive(pgid: i32) -> bool {
    processes()
        .iter()
        .any(|(pid, st)| st.pgrp == pgid && (!st.exited() || threads_alive(*pid)))
}

/// The descendants of `pid` that left its process group. PostgreSQL's
/// backends do (`setsid` in every child of the postmaster), so a group kill
/// misses them: they die on their own once they see the postmaster gone,
/// but until then they hold its shared memory, and a postmaster started
/// in that window refuses the data dir ("pre-existing shared memory block
/// is still in use", CI saw it).
fn strays(pid: i32) -> Vec<i32> {
    let all = processes();
    let mut found = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for (child, st) in &all {
            if st.ppid == parent && !found.contains(child) {
                found.push(*child);
                parents.push(*child);
            }
        }
    }
    found.retain(|p| all.iter().any(|(q, st)| q == p && st.pgrp != pid));
    found
}

/// CPU time of `pid` and of its children it reaped (utime + stime +
/// cutime + cstime), in ms; 0 once it is gone.
pub(crate) fn cpu_ms(pid: i32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After the command: state is field 3, utime .. cstime fields 14-17.
    let ticks: u64 = after_comm(&stat).map_or(0, |f| {
        f.skip(11)
            .take(4)
            .filter_map(|v| v.parse::<u64>().ok())
            .sum()
    });
    // SAFETY: sysconf has no preconditions.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[allow(clippy::cast_precision_loss)]
    let ms = ticks as f64 * 1000.0 / if per_s > 0 { per_s as f64 } else { 100.0 };
    ms
}

/// Whether `pid` is still running (not gone, not a zombie with no thread
/// left).
fn alive(pid: i32) -> bool {
    Stat::read(std::path::Path::new(&format!("/proc/{pid}/stat")))
        .is_some_and(|st| !st.exited() || threads_alive(pid))
}

/// Whether any thread of `pid` is still exiting. A killed multi-threaded
/// server's leader shows `Z` while its other threads still hold the shared
/// file table, and with it the listening socket: a restart on the same port
/// in that window fails with "address in use" (CI saw it with redis).
fn threads_alive(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| Stat::read(&t.path().join("stat")).is_some_and(|st| !st.exited()))
}

/// Kills group `pgid` (SIGKILL) and the leader's descendants that left
/// the group, reaps `child` and waits until none of them is alive, up to
/// `limit`.
pub(crate) fn kill_group_and_wait(pgid: i32, child: &mut Child, limit: Duration) -> bool {
    // Found before the kill: once the leader is gone they are re-parented.
    let strays = strays(pgid);
    let _ = signal_group(pgid, libc::SIGKILL);
    for pid in &strays {
        // SAFETY: kill(2) with a pid read from /proc and a valid signal.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + limit;
    loop {
        // waitpid reports a thread-group leader only once all its threads
        // are gone, so "reaped" is the moment its sockets are closed.
        let reaped = !matches!(child.try_wait(), Ok(None));
        if reaped && !group_alive(pgid) && !strays.iter().any(|p| alive(*p)) {
            unregister(pgid);
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs a one-shot command (initdb, `redis-cli --cluster create`) from the
/// spawner, so it cannot outlive us either, killing it after `limit`; its
/// output goes to `spec.log` and into the error.
pub(crate) fn run_to_completion(spec: SpawnSpec, limit: Duration) -> Result<()> {
    let log = spec.log.clone();
    let name = spec.program.display().to_string();
    let output = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut child = spawn(spec)?;
    let pgid = i32::try_from(child.id()).map_err(|_| FleetError::Io {
        context: format!("{name}: pid out of range"),
        source: std::io::Error::other("pid does not fit an i32"),
    })?;
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                unregister(pgid);
                if status.success() {
                    return Ok(());
                }
                return Err(FleetError::Control {
                    node: name,
                    op: "run",
                    message: format!("{status}\n{}", output()),
                });
            }
            Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            r => {
                kill_group_and_wait(pgid, &mut child, Duration::from_secs(5));
                let why = match r {
                    Err(e) => format!("waiting for it failed: {e}"),
                    _ => format!("did not finish within {limit:?}"),
                };
                return Err(FleetError::Control {
                    node: name,
                    op: "run",
                    message: format!("{why}\n{}", output()),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    /// The CPU reading moves with real work, not a clock: a sleeping
    /// process shows (nearly) none, this one after spinning shows it, and
    /// a wrong field of `/proc/<pid>/stat` (vsize, start time) fails both.
    #[test]
    fn cpu_ms_counts_the_work_a_process_does() {
        let mut idle = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let idle_pid = i32::try_from(idle.id()).unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let (idle0, me0) = (cpu_ms(idle_pid), cpu_ms(me));
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(200) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_ms(me) - me0 > 50.0, "{me0} -> {}", cpu_ms(me));
        assert!(
            cpu_ms(idle_pid) - idle0 < 20.0 && cpu_ms(idle_pid) < 50.0,
            "a sleeping process used CPU: {}",
            cpu_ms(idle_pid)
        );
        let _ = idle.kill();
        let _ = idle.wait();
        assert_eq!(cpu_ms(idle_pid), 0.0, "gone, so nothing");
    }
}
