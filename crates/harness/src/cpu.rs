//! CPU time spent during a run, by the lock's servers and by the worker
//! processes, so a scaling curve says where a rate went (issue #19: on a
//! small machine, 16 clients and the server share its cores, and a
//! backend whose work per cycle grows with the clients loses its rate to
//! that, whatever its lock does).
//!
//! The servers' time is the caller's to read (`fleet::Node::cpu_ms`, for
//! servers the run started); the workers' is read here, from
//! `getrusage(RUSAGE_CHILDREN)`: this process's children that were waited
//! for.

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
    /// Reads the workers' clock now, beside the servers' reading
    /// `servers_ms` (`None`: not ours to read).
    pub fn now(servers_ms: Option<f64>) -> Self {
        Self {
            servers_ms,
            children_ms: children_ms(),
        }
    }

    /// What was used since this mark, over `cycles` successful cycles;
    /// `servers_ms` is the servers' reading at the end of the run.
    pub fn since(&self, servers_ms: Option<f64>, cycles: u64) -> CpuUse {
        let servers_ms = match (self.servers_ms, servers_ms) {
            (Some(before), Some(now)) => Some((now - before).max(0.0)),
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

    /// A child that spins for a while shows up in the workers' time; the
    /// servers' readings are taken as given, and no cycles give no rate.
    #[test]
    fn a_busy_child_counts_as_the_workers_and_rates_are_per_cycle() {
        let mark = Mark::now(Some(1_000.0));
        // Busy for ~300 ms of CPU in a child, waited for.
        let st = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(st.success());
        let used = mark.since(Some(1_250.0), 10);
        assert!(used.workers_ms > 20.0, "{used:?}");
        assert_eq!(used.servers_ms, Some(250.0), "{used:?}");
        assert_eq!(used.servers_us_per_cycle, Some(25_000.0), "{used:?}");
        let per = used.workers_us_per_cycle.unwrap();
        assert!((per - used.workers_ms * 100.0).abs() < 1e-6, "{used:?}");
        let none = Mark::now(None).since(Some(5.0), 0);
        assert_eq!(none.servers_ms, None, "no reading before, none claimed");
        assert_eq!(none.workers_us_per_cycle, None, "no cycles, no rate");
    }
}
