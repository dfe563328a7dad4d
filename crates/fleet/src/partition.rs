//! Network partitions between loopback endpoints, with nftables.
//!
//! Every node listens on its own 127.0.0.N, but every connection a process
//! opens to another 127.0.0.M leaves from 127.0.0.1: an address does not
//! say which process sent a packet. So each side of a partition is a
//! cgroup v1 `net_cls` class, its processes are moved into it (their
//! existing sockets follow), and the rules drop what a side's processes
//! send to the other side's addresses (`meta cgroup`). A connection opened
//! before the cut stalls: the side that dialled can no longer send, not
//! even its acknowledgements.
//!
//! Only 127.0.0.0/8 addresses are ever written into a rule. The table is
//! deleted, and the processes moved back, when the [`Partition`] is
//! dropped, on Ctrl-C ([`heal_all`]) and on panic.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::{find_binary, FleetError, Result};

const NET_CLS: &str = "/sys/fs/cgroup/net_cls";

/// Tables of live partitions, for [`heal_all`].
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One side: its processes and the addresses they serve on.
#[derive(Debug, Clone)]
pub struct Side {
    /// What the side is, for errors (`etcd-1`, `workers`).
    pub name: String,
    /// Its processes (each moved into the side's class).
    pub pids: Vec<i32>,
    /// The loopback addresses its processes listen on.
    pub addrs: Vec<Ipv4Addr>,
}

/// A partition in force; dropping it heals.
#[derive(Debug)]
pub struct Partition {
    table: String,
    classes: Vec<PathBuf>,
    pids: Vec<i32>,
    nft: PathBuf,
}

fn err(op: &'static str, message: impl Into<String>) -> FleetError {
    FleetError::Control {
        node: "partition".into(),
        op,
        message: message.into(),
    }
}

fn net_cls_root() -> Result<&'static Path> {
    let root = Path::new(NET_CLS);
    if root.join("cgroup.procs").exists() {
        return Ok(root);
    }
    std::fs::create_dir_all(root)
        .map_err(|e| err("net_cls", format!("creating {NET_CLS}: {e} (needs root)")))?;
    let st = Command::new("mount")
        .args(["-t", "cgroup", "-o", "net_cls", "net_cls", NET_CLS])
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| err("net_cls", format!("running mount: {e}")))?;
    if !st.status.success() {
        return Err(err(
            "net_cls",
            format!(
                "cannot mount the net_cls cgroup at {NET_CLS} (needs root): {}",
                String::from_utf8_lossy(&st.stderr).trim()
            ),
        ));
    }
    Ok(root)
}

fn nft(nft: &Path, script: &str) -> Result<()> {
    use std::io::Write as _;
    let mut child = Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err("nft", format!("running {}: {e}", nft.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| err("nft", e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| err("nft", e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(err(
            "nft",
            format!(
                "{} (needs root and nf_tables)",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }
}

impl Partition {
    /// Cuts every side from every other: a process of one side can no
    /// longer send to an address of another. Processes not on any side
    /// (the coordinator, clients left out) keep reaching everyone.
    ///
    /// # Errors
    /// A non-loopback address (refused before anything is written), no
    /// root, no `nft` (Debian `nftables`), no `net_cls` cgroup.
    pub fn cut(sides: &[Side]) -> Result<Self> {
        for s in sides {
            if let Some(a) = s.addrs.iter().find(|a| !a.is_loopback()) {
                return Err(err(
                    "cut",
                    format!("{a} ({}) is not a loopback address: never a target", s.name),
                ));
            }
        }
        let nft_bin = find_binary("nft", "nftables", &[PathBuf::from("/usr/sbin/nft")])?;
        let root = net_cls_root()?;
        sweep_orphans(&nft_bin, root);
        let tag = std::process::id();
        let table = format!("lockbench_{tag}_{}", rand_suffix());
        // The table is named only once it exists: a heal of a cut that
        // failed before (on drop) then still moves the processes back and
        // removes the classes, instead of stopping at deleting no table.
        let mut me = Partition {
            table: String::new(),
            classes: Vec::new(),
            pids: Vec::new(),
            nft: nft_bin,
        };
        let mut rules = String::new();
        for (i, s) in sides.iter().enumerate() {
            let classid =
                0x0010_0000u32 + (tag % 0x1000) * 0x10 + u32::try_from(i).unwrap_or(0) + 1;
            let dir = root.join(format!("{table}_{i}"));
            std::fs::create_dir_all(&dir)
                .map_err(|e| err("cut", format!("creating {}: {e}", dir.display())))?;
            me.classes.push(dir.clone());
            std::fs::write(dir.join("net_cls.classid"), classid.to_string())
                .map_err(|e| err("cut", format!("net_cls.classid: {e}")))?;
            for pid in &s.pids {
                // Threads follow with the process (cgroup v1 procs file).
                // A worker that exited since it was listed has nothing to
                // cut: only a live process that cannot be moved is an error.
                if let Err(e) = std::fs::write(dir.join("cgroup.procs"), pid.to_string()) {
                    if Path::new(&format!("/proc/{pid}")).exists() {
                        return Err(err("cut", format!("moving pid {pid} ({}): {e}", s.name)));
                    }
                    continue;
                }
                me.pids.push(*pid);
            }
            let others: Vec<String> = sides
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, o)| o.addrs.iter().map(ToString::to_string))
                .collect();
            if !others.is_empty() {
                rules += &format!(
                    "    meta cgroup {classid} ip daddr {{ {} }} drop\n",
                    others.join(", ")
                );
            }
        }
        let script = format!(
            "table inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n{rules}  }}\n}}\n"
        );
        nft(&me.nft, &script)?;
        me.table = table.clone();
        if let Ok(mut live) = LIVE.lock() {
            live.push(table);
        }
        Ok(me)
    }

    /// Removes the rules and moves the processes back (those even when the
    /// rules cannot be deleted: they then match no process).
    ///
    /// # Errors
    /// If the table cannot be deleted (it is tried again on drop).
    pub fn heal(&mut self) -> Result<()> {
        let mut deleted = Ok(());
        // Deleted already by `heal_all` (Ctrl-C): deleting it again said
        // "No such file or directory" as an error about a rule left behind.
        let still_live = LIVE.lock().map_or(true, |l| l.contains(&self.table));
        if !still_live {
            self.table.clear();
        }
        if !self.table.is_empty() {
            deleted = nft(&self.nft, &format!("delete table inet {}\n", self.table));
            if deleted.is_ok() {
                if let Ok(mut live) = LIVE.lock() {
                    live.retain(|t| *t != self.table);
                }
                self.table.clear();
            }
        }
        for pid in self.pids.drain(..) {
            // Gone already (a killed process) is fine.
            let _ = std::fs::write(Path::new(NET_CLS).join("cgroup.procs"), pid.to_string());
        }
        for dir in self.classes.drain(..) {
            let _ = std::fs::remove_dir(&dir);
        }
        deleted
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if let Err(e) = self.heal() {
            tracing::error!(error = %e, "could not remove a partition's nftables table");
        }
    }
}

/// The pid in a name `lockbench_<pid>_...` when no process has it any
/// more: a run killed outright (SIGKILL) that could not heal its cut.
fn orphaned(name: &str) -> bool {
    name.strip_prefix("lockbench_")
        .and_then(|r| r.split('_').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes the tables and classes of runs that died without healing (a
/// SIGKILL mid-partition left its drop rules in place for good, and a
/// later run whose pid matched mod 4096 would have got the same class).
/// Best effort: what cannot be removed now is tried again by the next cut.
fn sweep_orphans(nft_bin: &Path, root: &Path) {
    if let Ok(out) = Command::new(nft_bin).args(["list", "tables"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(t) = line.strip_prefix("table inet ").map(str::trim) {
                if orphaned(t) && nft(nft_bin, &format!("delete table inet {t}\n")).is_ok() {
                    tracing::warn!(table = t, "removed the partition rules of a run that died");
                }
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for dir in entries.flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        if !orphaned(&name) {
            continue;
        }
        // Its processes (if any outlived the run) back to the root class.
        if let Ok(procs) = std::fs::read_to_string(dir.path().join("cgroup.procs")) {
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(dir.path());
    }
}

fn rand_suffix() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// Deletes every partition table this process made (Ctrl-C, a fatal
/// error): no rule outlives the run.
pub fn heal_all() {
    let tables: Vec<String> = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
    let Ok(nft_bin) = find_binary("nft", "nftables", &[PathBuf::from("/usr/sbin/nft")]) else {
        return;
    };
    for t in tables {
        if nft(&nft_bin, &format!("delete table inet {t}\n")).is_ok() {
            if let Ok(mut live) = LIVE.lock() {
                live.retain(|x| *x != t);
            }
        }
    }
}
