//! When a worker process died, as the kernel orders it: before the
//! servers it talked to can know.
//!
//! A worker killed from outside (`kill -9`) holding a session lock
//! (PostgreSQL's advisory lock, a row lock) frees it when the kernel closes
//! its sockets, and a rival can have the lock a few hundred µs later. The
//! checker ends the dead worker's hold at its death, so the death must be
//! stamped before that rival's acquire completes. The close of the
//! worker's output pipe happens in the same step as the close of its
//! sockets, and a coordinator thread woken by it lost that race in 1 run
//! of 20 (a stamp from the coordinator's runtime, after reaping: 5 of 20).
//!
//! So each worker holds a robust futex in memory shared with the
//! coordinator, registered with `set_robust_list(2)` by a thread that only
//! waits. When that thread dies, the kernel marks the futex `OWNER_DIED`
//! and wakes its waiter while releasing the thread's memory (`exit_mm`),
//! which comes before the close of the process's files (`exit_files`)
//! and, for the last thread out, before the address space is torn down
//! (half a millisecond for a worker here). The coordinator's thread
//! blocked on the futex stamps the death then.
//!
//! Linux only, like the rest of the harness. A worker without the shared
//! memory (started by hand, another host) is stamped by its pipe alone.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Environment variable telling a worker `fd:offset` of its slot.
pub(crate) const ALIVE_ENV: &str = "LOCKBENCH_ALIVE";

/// Bytes per worker: a robust list entry, then the futex word.
const SLOT: usize = 64;
/// Where the futex word sits in a slot (after the list entry's pointer).
const FUTEX_OFFSET: usize = 8;
/// The same, as the kernel's list head wants it.
const FUTEX_OFFSET_C: libc::c_long = 8;
const FUTEX_WAITERS: u32 = 0x8000_0000;
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;

/// The kernel's `struct robust_list`.
#[repr(C)]
struct RobustList {
    next: *mut RobustList,
}

/// The kernel's `struct robust_list_head`.
#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *mut RobustList,
}

/// The coordinator's side: shared memory with one slot per worker.
pub(crate) struct Board {
    fd: libc::c_int,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is only touched through atomics, and it lives as
// long as the Board (threads watching it hold an Arc).
unsafe impl Send for Board {}
unsafe impl Sync for Board {}

impl Board {
    /// Shared memory for `workers` slots.
    pub(crate) fn new(workers: usize) -> std::io::Result<Arc<Self>> {
        let len = (workers.max(1) * SLOT).next_multiple_of(4096);
        // SAFETY: plain syscalls on values we own; every result is checked.
        unsafe {
            let fd = libc::memfd_create(c"lockbench-alive".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let board = |base: *mut u8| Self { fd, base, len };
            if libc::ftruncate(fd, libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX)) != 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(e);
            }
            match map_shared(fd, len) {
                Ok(base) => Ok(Arc::new(board(base))),
                Err(e) => {
                    libc::close(fd);
                    Err(e)
                }
            }
        }
    }

    /// The descriptor a worker must inherit, and the value of
    /// [`ALIVE_ENV`] for worker `id`.
    pub(crate) fn for_worker(&self, id: u32) -> Option<(libc::c_int, String)> {
        let offset = id as usize * SLOT;
        (offset + SLOT <= self.len).then(|| (self.fd, format!("{}:{offset}", self.fd)))
    }

    fn word(&self, id: u32) -> Option<&AtomicU32> {
        let offset = id as usize * SLOT + FUTEX_OFFSET;
        // SAFETY: in bounds (checked), 4-aligned (SLOT and FUTEX_OFFSET
        // are), and the mapping outlives `self`.
        (offset + 4 <= self.len).then(|| unsafe { &*self.base.add(offset).cast::<AtomicU32>() })
    }

    /// Once worker `id` has said it is ready (its slot is held): a thread
    /// that stores in the returned cell the time of its death (or of its
    /// normal end), 0 until then. Gives up, leaving 0, when the slot was
    /// never held, or when `give_up` is set.
    pub(crate) fn watch(
        self: &Arc<Self>,
        id: u32,
        give_up: Arc<std::sync::atomic::AtomicBool>,
    ) -> Arc<AtomicU64> {
        let died = Arc::new(AtomicU64::new(0));
        let (board, cell) = (self.clone(), died.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("worker-{id}-alive"))
            .spawn(move || {
                let Some(word) = board.word(id) else {
                    return;
                };
                while !give_up.load(Ordering::Relaxed) {
                    let v = word.load(Ordering::SeqCst);
                    if v & FUTEX_OWNER_DIED != 0 {
                        cell.store(crate::history::monotonic_ns(), Ordering::SeqCst);
                        return;
                    }
                    if v == 0 {
                        // Never held: a worker without the shared memory.
                        return;
                    }
                    if v & FUTEX_WAITERS == 0
                        && word
                            .compare_exchange(
                                v,
                                v | FUTEX_WAITERS,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            )
                            .is_err()
                    {
                        continue;
                    }
                    // Bounded, to look at `give_up` now and then.
                    let timeout = libc::timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    };
                    // SAFETY: a futex wait on a word of our live mapping
                    // (shared: no FUTEX_PRIVATE_FLAG).
                    unsafe {
                        libc::syscall(
                            libc::SYS_futex,
                            word.as_ptr(),
                            libc::FUTEX_WAIT,
                            v | FUTEX_WAITERS,
                            &timeout as *const libc::timespec,
                        );
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(worker = id, error = %e, "cannot watch the worker's death; its pipe will tell");
        }
        died
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: our own mapping and descriptor, unused from now on (the
        // watching threads hold an Arc, so they are gone).
        unsafe {
            libc::munmap(self.base.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

/// The first `len` bytes of `fd`, mapped shared, read and write.
fn map_shared(fd: libc::c_int, len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: a new mapping; the kernel checks the descriptor and length.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(base.cast())
}

/// Makes the calling thread the holder of the slot at `offset` of the
/// shared memory `fd` (which it closes): when the thread ends, however it
/// ends, the kernel marks the slot's word `OWNER_DIED` and wakes its
/// watcher. The thread must take no robust pthread mutex: this replaces
/// its robust list.
fn hold(fd: libc::c_int, offset: usize) -> Result<(), String> {
    // SAFETY: maps the descriptor we were given; the slot is in bounds of
    // a mapping of offset + SLOT bytes, which is never unmapped, and the
    // robust list registered points into it and at its own head, leaked.
    unsafe {
        let mapped = map_shared(fd, offset + SLOT);
        libc::close(fd);
        let base = mapped.map_err(|e| format!("mapping {ALIVE_ENV}: {e}"))?;
        let entry = base.add(offset).cast::<RobustList>();
        let head = Box::into_raw(Box::new(RobustListHead {
            list: RobustList { next: entry },
            futex_offset: FUTEX_OFFSET_C,
            list_op_pending: std::ptr::null_mut(),
        }));
        // A circular list: the entry leads back to the head.
        (*entry).next = head.cast();
        let r = libc::syscall(
            libc::SYS_set_robust_list,
            head,
            std::mem::size_of::<RobustListHead>(),
        );
        if r != 0 {
            return Err(format!(
                "set_robust_list: {}",
                std::io::Error::last_os_error()
            ));
        }
        let word = &*base.add(offset + FUTEX_OFFSET).cast::<AtomicU32>();
        let tid = u32::try_from(libc::gettid()).unwrap_or(0) & 0x3fff_ffff;
        word.store(tid, Ordering::SeqCst);
    }
    Ok(())
}

/// The worker's side: holds its slot for as long as the process lives,
/// from a thread that does nothing else. Returns once the slot is held;
/// does nothing without [`ALIVE_ENV`].
///
/// # Errors
/// A malformed [`ALIVE_ENV`] or a failed syscall, as text.
pub(crate) fn hold_from_env() -> Result<(), String> {
    let Ok(v) = std::env::var(ALIVE_ENV) else {
        return Ok(());
    };
    let bad = || format!("{ALIVE_ENV}={v:?} is not fd:offset");
    let (fd, offset) = v.split_once(':').ok_or_else(bad)?;
    let fd: libc::c_int = fd.parse().map_err(|_| bad())?;
    let offset: usize = offset.parse().map_err(|_| bad())?;
    let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
    std::thread::Builder::new()
        .name("alive".into())
        .spawn(move || {
            let held = hold(fd, offset);
            if held.is_err() {
                let _ = tx.send(held);
                return;
            }
            let _ = tx.send(held);
            // Held until the process ends: this thread never returns.
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("starting the alive thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the alive thread ended before holding its slot".to_string())?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    fn wait_for(cell: &AtomicU64) -> u64 {
        let t0 = Instant::now();
        while cell.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        cell.load(Ordering::SeqCst)
    }

    #[test]
    fn the_end_of_the_holding_thread_is_stamped_and_a_slot_never_held_is_not() {
        let board = Board::new(2).unwrap();
        let (fd, env) = board.for_worker(1).unwrap();
        assert_eq!(env, format!("{fd}:64"));
        // SAFETY: a copy of the board's descriptor, for `hold` to close.
        let copy = unsafe { libc::dup(fd) };
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            held_tx.send(hold(copy, 64)).unwrap();
            let _ = end_rx.recv();
        });
        held_rx.recv().unwrap().unwrap();
        let give_up = Arc::new(AtomicBool::new(false));
        let died = board.watch(1, give_up.clone());
        let never = board.watch(0, give_up.clone());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(died.load(Ordering::SeqCst), 0, "stamped while it lived");
        let before = crate::history::monotonic_ns();
        end_tx.send(()).unwrap();
        holder.join().unwrap();
        let at = wait_for(&died);
        assert!(at >= before, "{at} < {before}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(never.load(Ordering::SeqCst), 0);
        give_up.store(true, Ordering::Relaxed);
    }
}
