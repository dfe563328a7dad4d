//! How long a `pg-advisory` lock outlives its client, measured with a real
//! holder in another process (this test binary, run again as a child).
//!
//! - Vanished without a FIN: the child puts its sockets to the server in
//!   TCP repair mode and exits, so the kernel closes them without a word
//!   (the host forgot the connection, as after a reboot). The server learns
//!   it at its first keepalive probe, which is answered with a reset.
//! - Paused (SIGSTOP): the holder's kernel still answers keepalives, so the
//!   lock is kept; nothing can tell a paused holder from a slow one, and
//!   freeing its lock would make two holders when it wakes.
//! - Killed (SIGKILL): the kernel sends the FIN; the lock is free at once.
//!
//! A host that goes SILENT (powered off, cut off by a partition) is dropped
//! by the server after `dead_host_timeout_ms` (tcp_user_timeout, at the
//! first keepalive probe at or after it). This machine has no packet filter
//! (no nftables, iptables or tc actions) to make a loopback peer silent, so
//! that case is not measured here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, DistLock, Error};
use fleet::PostgresFleet;
use lockbench_postgres::{PgAdvisoryLock, PgConfig};

const KEY: &str = "dead-client";
const DEAD_HOST_MS: u64 = 4_000;

fn cfg(url: String) -> PgConfig {
    let mut cfg = PgConfig::new(url);
    cfg.ping_interval_ms = 100;
    cfg.dead_host_timeout_ms = DEAD_HOST_MS;
    cfg
}

/// The child's half: takes the lock, says so, then vanishes or waits to be
/// paused or killed. Does nothing unless started by a test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the holder process of the dead-client tests, which start it"]
async fn holder_child() {
    let Ok(url) = std::env::var("LOCKBENCH_PG_CHILD_URL") else {
        return;
    };
    let mode = std::env::var("LOCKBENCH_PG_CHILD_MODE").unwrap();
    let port: u16 = std::env::var("LOCKBENCH_PG_CHILD_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let mut cfg = cfg(url);
    if mode == "vanish-quiet" {
        // No pings: the connection is silent when the host vanishes.
        cfg.ping_interval_ms = 600_000;
    }
    let lock = PgAdvisoryLock::connect(cfg).await.unwrap();
    let g = lock.acquire(KEY, AcquireOptions::try_lock()).await.unwrap();
    let vouched = g
        .valid_until()
        .saturating_duration_since(tokio::time::Instant::now());
    println!("HELD vouched_ms={}", vouched.as_millis());
    if mode.starts_with("vanish") {
        if mode == "vanish-quiet" {
            // Past any delayed ACK: nothing is unacknowledged either way.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        match repair::silence_sockets_to(port) {
            Ok(n) => println!("VANISH sockets={n}"),
            // Not permitted (no CAP_NET_ADMIN): say so, and exit normally.
            Err(e) => println!("VANISH unsupported: {e}"),
        }
        // Exit without closing anything politely: sockets in repair mode
        // are closed without a FIN or a reset.
        std::process::exit(0);
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// TCP repair mode through the C library std already links (no extra crate).
mod repair {
    use std::ffi::c_void;

    const IPPROTO_TCP: i32 = 6;
    const TCP_REPAIR: i32 = 19;
    const AF_INET: u16 = 2;

    extern "C" {
        fn getpeername(fd: i32, addr: *mut u8, len: *mut u32) -> i32;
        fn setsockopt(fd: i32, level: i32, name: i32, val: *const c_void, len: u32) -> i32;
    }

    /// Puts every IPv4 socket of this process whose peer port is `port`
    /// into repair mode; returns how many. Needs CAP_NET_ADMIN.
    pub fn silence_sockets_to(port: u16) -> Result<usize, String> {
        let mut n = 0;
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let mut addr = [0u8; 128];
            let mut len = u32::try_from(addr.len()).unwrap();
            // SAFETY: addr is a writable buffer of len bytes; a bad fd only
            // makes the call fail.
            if unsafe { getpeername(fd, addr.as_mut_ptr(), &mut len) } != 0 {
                continue;
            }
            let family = u16::from_ne_bytes([addr[0], addr[1]]);
            let peer_port = u16::from_be_bytes([addr[2], addr[3]]);
            if family != AF_INET || peer_port != port {
                continue;
            }
            let on: i32 = 1;
            // SAFETY: fd is an open socket; the option value is an i32.
            let rc = unsafe {
                setsockopt(
                    fd,
                    IPPROTO_TCP,
                    TCP_REPAIR,
                    (&on as *const i32).cast(),
                    u32::try_from(std::mem::size_of::<i32>()).unwrap(),
                )
            };
            if rc != 0 {
                return Err(format!(
                    "TCP_REPAIR on fd {fd}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            n += 1;
        }
        Ok(n)
    }
}

/// The holder process, killed (by its pid, which we own) when dropped.
struct Holder {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Holder {
    fn start(fleet: &PostgresFleet, mode: &str) -> Holder {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "holder_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LOCKBENCH_PG_CHILD_URL", fleet.url())
            .env("LOCKBENCH_PG_CHILD_MODE", mode)
            .env("LOCKBENCH_PG_CHILD_PORT", fleet.node.port().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Holder { child, lines }
    }

    /// The child's first line holding `tag`, from the tag on (libtest's
    /// "test holder_child ... " may precede it on the same line).
    fn expect(&self, tag: &str) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(tag) => return l[l.find(tag).unwrap_or(0)..].to_string(),
                Ok(_) => {}
                Err(e) => panic!("the holder never said {tag}: {e}"),
            }
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.child.id());
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (server-side) for the key; returns how long it took.
async fn time_to_acquire(lock: &PgAdvisoryLock, wait: Duration) -> Result<Duration, Error> {
    let t0 = Instant::now();
    let g = lock.acquire(KEY, AcquireOptions::wait(wait)).await?;
    let took = t0.elapsed();
    assert!(g.release().await.unwrap());
    Ok(took)
}

/// The holder's host forgets the connection (no FIN, no reset). The server
/// learns it the next time it sends anything: a retransmission of a ping
/// reply whose ACK was still delayed (~RTO, 200 ms), or else its first
/// keepalive probe (dead_host_timeout / 2 of silence), answered with a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_vanishes_without_a_fin_frees_its_lock_by_the_first_keepalive() {
    let fleet = PostgresFleet::start().unwrap();
    let next = PgAdvisoryLock::connect(cfg(fleet.url())).await.unwrap();
    for mode in ["vanish", "vanish-quiet"] {
        let mut holder = Holder::start(&fleet, mode);
        let held = holder.expect("HELD");
        let vanish = holder.expect("VANISH");
        let status = holder.child.wait().unwrap();
        let gone = Instant::now();
        println!("{mode} holder: {held}; {vanish}; {status}");
        if vanish.contains("unsupported") {
            println!("SKIPPED: closing a socket without a FIN needs CAP_NET_ADMIN ({vanish})");
            return;
        }
        assert!(
            !vanish.ends_with("sockets=0"),
            "no socket was put in repair mode"
        );
        // Still held: nothing told the server. Only "vanish-quiet" can
        // be sure of it: after "vanish", the server's retransmission
        // (~200 ms) may already have met the reset by the time a slow
        // machine gets here.
        match next.acquire(KEY, AcquireOptions::try_lock()).await {
            Err(Error::Timeout { .. }) => {}
            Ok(g) if mode == "vanish" => {
                println!("vanish: already free at the first look (the retransmission came first)");
                assert!(g.release().await.unwrap());
            }
            r => panic!("{mode}: {r:?}"),
        }
        time_to_acquire(&next, Duration::from_secs(30))
            .await
            .unwrap();
        let freed = gone.elapsed();
        println!(
            "{mode}: lock free {freed:?} after its holder vanished without a FIN \
             (dead_host_timeout_ms = {DEAD_HOST_MS}: keepalive idle {} s)",
            DEAD_HOST_MS / 2000
        );
        assert!(
            freed < Duration::from_millis(DEAD_HOST_MS / 2 + 1_000),
            "the lock outlived its vanished holder by {freed:?}"
        );
        if mode == "vanish-quiet" {
            // Its last word was >= 1 s before it vanished: the probe came
            // at keepalive idle (2 s) after that, ~1 s after `gone`; the
            // bound leaves room for a slow exit, and still tells a probe
            // from a reset seen at once.
            assert!(
                freed >= Duration::from_millis(DEAD_HOST_MS / 2 - 1_500),
                "{freed:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_client_keeps_its_lock_and_a_killed_one_frees_it_at_once() {
    let fleet = PostgresFleet::start().unwrap();
    let next = PgAdvisoryLock::connect(cfg(fleet.url())).await.unwrap();
    let holder = Holder::start(&fleet, "hold");
    println!("holder: {}", holder.expect("HELD"));
    holder.signal("-STOP");
    let paused = Instant::now();
    // Longer than dead_host_timeout: the paused holder's kernel still
    // answers keepalives, so its lock stays (no second holder when it
    // wakes up).
    let wait = Duration::from_millis(DEAD_HOST_MS + 2_000);
    let r = time_to_acquire(&next, wait).await;
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "a paused holder's lock was handed over after {:?}: {r:?}",
        paused.elapsed()
    );
    println!(
        "paused holder still held the lock after {:?}",
        paused.elapsed()
    );
    holder.signal("-KILL");
    let killed = Instant::now();
    let took = time_to_acquire(&next, Duration::from_secs(10))
        .await
        .unwrap();
    println!(
        "killed holder: lock free {:?} after SIGKILL (acquire waited {took:?})",
        killed.elapsed()
    );
    assert!(killed.elapsed() < Duration::from_secs(1));
}
