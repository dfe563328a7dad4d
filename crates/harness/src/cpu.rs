//! CPU time spent during a run, by the lock's servers and by the worker
//! processes, so a scaling curve says where a rate went (issue #19: on a
//! small machine, 16 clients and the server share its cores, and a
//! backend whose work per cycle grows with the clients loses its rate to
//! that, whatever its lock does).
//!
//! Read from the kernel: `/proc/<pid>/stat` for the servers (each process
//! of each server's tree, plus what its reaped children used, so a
//! PostgreSQL backend that exits during the run is still counted by its
//! postmaster), `getrusage(RUSAGE_CHILDREN)` for the workers (this
//! process's children that were waited for). Linux only; `None` elsewhere.

use serde::{Deserialize, Serialize};

/// CPU time over one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// The lock's servers (user + system), ms; `None` for servers this
    /// run did not start (`--endpoint`).
    pub servers_ms: Option<f64>,
    /// The worker processes, ms.
    pub workers_ms: f64,
    /// `servers_ms` per successful cycle, µs.
    pub servers_us_per_cycle: Option<f64>,
    /// `workers_ms` per successful cycle, µs.
    pub workers_us_per_cycle: Option<f64>,
}

/// A reading taken before the workers start.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    servers_ms: Option<f64>,
    children_ms: f64,
}

impl Mark {
    /// Reads the clocks now; `servers` are the server trees' processes
    /// (`None`: not ours to read).
    pub fn now(servers: Option<&[i32]>) -> Self {
        Self {
            servers_ms: servers.map(processes_ms),
            children_ms: children_ms(),
        }
    }

    /// What was used since this mark, over `cycles` successful cycles;
    /// `servers` as at the end of the run (processes started since count
    /// whole).
    pub fn since(&self, servers: Option<&[i32]>, cycles: u64) -> CpuUse {
        let servers_ms = match (self.servers_ms, servers) {
            (Some(before), Some(now)) => Some((processes_ms(now) - before).max(0.0)),
            _ => None,
        };
        let workers_ms = (children_ms() - self.children_ms).max(0.0);
        // Precision loss is irrelevant at any count a run reaches.
        #[allow(clippy::cast_precision_loss)]
        let per = |ms: f64| (cycles > 0).then(|| ms * 1000.0 / cycles as f64);
        CpuUse {
            servers_ms,
            workers_ms,
            servers_us_per_cycle: servers_ms.and_then(per),
            workers_us_per_cycle: per(workers_ms),
        }
    }
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        #[allow(clippy::cast_precision_loss)]
        let t = t as f64;
        t
    } else {
        100.0
    }
}

/// utime + stime + cutime + cstime of `pid`, in ticks; 0 if it is gone.
fn process_ticks(pid: i32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name may hold spaces and parentheses: fields count
    // from the last ')'. After it: state (3), ... utime (14) .. cstime (17).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

fn processes_ms(pids: &[i32]) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let ticks = pids.iter().map(|p| process_ticks(*p)).sum::<u64>() as f64;
    ticks * 1000.0 / ticks_per_s()
}

fn children_ms() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    ms(u.ru_utime) + ms(u.ru_stime)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    /// A child that spins for a while shows up in the workers' time, and a
    /// running process's own time in the servers' (a process that burns
    /// nothing, nothing): the readings move with real work, not a clock.
    #[test]
    fn children_and_processes_are_counted_by_the_work_they_do() {
        let idle = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let idle_pid = i32::try_from(idle.id()).unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let mark = Mark::now(Some(&[idle_pid]));
        let own = Mark::now(Some(&[me]));
        // Busy for ~300 ms of CPU in a child, waited for.
        let st = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(st.success());
        let used = mark.since(Some(&[idle_pid]), 10);
        assert!(used.workers_ms > 20.0, "{used:?}");
        assert!(
            used.servers_ms.unwrap() < 20.0,
            "a sleeping process used CPU: {used:?}"
        );
        let per = used.workers_us_per_cycle.unwrap();
        assert!((per - used.workers_ms * 100.0).abs() < 1e-6, "{used:?}");
        // This process spins a little too: its own reading moves.
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(200) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        let mine = own.since(Some(&[me]), 0);
        assert!(mine.servers_ms.unwrap() > 50.0, "{mine:?}");
        assert_eq!(mine.servers_us_per_cycle, None, "no cycles, no rate");
        let mut idle = idle;
        let _ = idle.kill();
        let _ = idle.wait();
    }
}
