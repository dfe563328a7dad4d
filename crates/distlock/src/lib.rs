//! `distlock`: the contract every lockbench backend implements.
//!
//! One object-safe async trait, [`DistLock`], hands out a [`Guard`] for a
//! key. The guard carries the fencing token, the lease's end as the client
//! can vouch for it ([`Guard::valid_until`]), a future that resolves when the
//! lock is known lost ([`Guard::lost`]) and an explicit
//! [`release`](Guard::release) that says whether the lock was still ours.
//! Lease renewal (Redisson's watchdog) is written once, in [`Guard`], for
//! every lease-based backend.
//!
//! ```no_run
//! # async fn demo(lock: std::sync::Arc<dyn distlock::DistLock>) -> distlock::Result<()> {
//! use std::time::Duration;
//! use distlock::AcquireOptions;
//! let guard = lock
//!     .acquire("coupon:42", AcquireOptions::wait(Duration::from_secs(3)))
//!     .await?;
//! // ... critical section, fenced with guard.token() ...
//! let still_ours = guard.release().await?;
//! assert!(still_ours, "the seed's 'unlock script returned 0' counter");
//! # Ok(()) }
//! ```
//!
//! The conformance suite every backend runs against its real server lives in
//! [`testing`] (feature `testing`).

pub mod descriptor;
mod error;
pub mod faultpoint;
mod guard;
pub mod memory;
mod pending;
mod retry;

#[cfg(feature = "testing")]
pub mod testing;

use std::fmt::Debug;
use std::time::Duration;

pub use error::{with_deadline, BoxError, Error, ErrorKind, LostReason, Result};
pub use guard::{
    drift, Guard, GuardObserver, GuardParts, HeldLock, LeaseHandle, LeaseMode, ReleaseOutcome,
};
pub use pending::Pending;
pub use retry::retry_within_budget;

/// An endpoint URL fit to print: `scheme://user:secret@host` becomes
/// `scheme://user:***@host`, and the values of the query parameters that
/// name TLS files or carry a secret (`sslrootcert`, `sslcert`, `sslkey`,
/// `sslpassword`, `password`) become `***`. Every backend's config
/// `Debug`, error and results file goes through this, so neither a
/// password nor a TLS path is ever shown.
pub fn redact_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match (base.find("://"), base.rfind('@')) {
        (Some(s), Some(at)) if at > s + 3 => match base[s + 3..at].find(':') {
            Some(c) => format!("{}:***{}", &base[..s + 3 + c], &base[at..]),
            None => base.to_string(),
        },
        _ => base.to_string(),
    };
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _))
                    if matches!(
                        k.to_ascii_lowercase().as_str(),
                        "sslrootcert" | "sslcert" | "sslkey" | "sslpassword" | "password"
                    ) =>
                {
                    format!("{k}=***")
                }
                _ => kv.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// A URL's host as a resolver takes it: URL parsers (and sqlx, which
/// passes it on as is) keep the brackets of an IPv6 literal, and
/// `[::1]` resolves to nothing ("Name or service not known"), while
/// `::1` is the loopback.
pub fn bare_host(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `start + wait`, for an acquire's deadline: a wait too long to add
/// (`Duration::MAX`, the natural "wait forever") ends in a century, not
/// in an overflow panic.
pub fn deadline_after(start: tokio::time::Instant, wait: Duration) -> tokio::time::Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    start.checked_add(wait.min(CENTURY)).unwrap_or(start)
}

/// The longest fixed lease a backend takes. Longer is what the watchdog
/// is for (no fixed lease: renewed while the guard lives); and
/// `Duration::MAX` overflowed clocks and server arguments.
pub const MAX_FIXED_LEASE: Duration = Duration::from_secs(365 * 86_400);

/// The least validity (lease - [`drift`]) a fixed lease must leave: with
/// less, the guard would be lost before the acquire returned (a 1 ns lease
/// was `PX 0` to Redis, an error from inside its script; 1-3 ms gave
/// etcd and PostgreSQL guards already lost, the key free to others).
pub const MIN_VALIDITY: Duration = Duration::from_millis(1);

/// The shortest fixed lease [`MIN_VALIDITY`] allows (4 ms).
pub fn min_fixed_lease() -> Duration {
    (1..=1_000u64)
        .map(Duration::from_millis)
        .find(|l| *l > drift(*l) + MIN_VALIDITY)
        .unwrap_or(Duration::from_secs(1))
}

/// Checks a requested fixed lease: at least [`min_fixed_lease`] and at
/// most [`MAX_FIXED_LEASE`].
///
/// # Errors
/// [`Error::Unsupported`] saying which bound, for `backend`.
pub fn check_fixed_lease(backend: &'static str, lease: Option<Duration>) -> Result<()> {
    match lease {
        Some(l) if l.is_zero() => Err(Error::Unsupported {
            backend,
            what: "a fixed lease of zero (it ends before it begins)".into(),
        }),
        Some(l) if l <= drift(l) + MIN_VALIDITY => Err(Error::Unsupported {
            backend,
            what: format!(
                "a fixed lease of {l:?}: the clock-drift allowance ({:?}) leaves less than {MIN_VALIDITY:?} of validity; take at least {:?}",
                drift(l),
                min_fixed_lease()
            ),
        }),
        Some(l) if l > MAX_FIXED_LEASE => Err(Error::Unsupported {
            backend,
            what: format!(
                "a fixed lease of {l:?}, over {} days: take no fixed lease, and the watchdog keeps the lock while the guard lives",
                MAX_FIXED_LEASE.as_secs() / 86_400
            ),
        }),
        _ => Ok(()),
    }
}

/// The longest key, in bytes, any backend takes. Each stores the key in a
/// path, a row's index or a key of its own, several times over in one
/// request: a 1 MB key went past ZooKeeper's request limit, which drops
/// the connection and with it every lock of the session; etcd refused
/// ~220 KB; pg-row's primary key is a B-tree, whose entries stop at
/// ~2.7 KB. One bound for all, well inside each, far above any real key,
/// so a run compares the same keys everywhere.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a lock key's length against [`MAX_KEY_BYTES`].
///
/// # Errors
/// [`Error::Unsupported`] naming the key's length (not the key: it may be
/// megabytes), for `backend`.
pub fn check_key(backend: &'static str, key: &str) -> Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::Unsupported {
            backend,
            what: format!(
                "a key of {} bytes (at most {MAX_KEY_BYTES}): hash a long name into the key",
                key.len()
            ),
        });
    }
    Ok(())
}

/// Checks what every backend with fixed leases checks first: the key
/// ([`check_key`]) and the lease ([`check_fixed_lease`]).
///
/// # Errors
/// [`Error::Unsupported`], as those two say.
pub fn check_request(backend: &'static str, key: &str, opts: &AcquireOptions) -> Result<()> {
    check_key(backend, key)?;
    check_fixed_lease(backend, opts.lease)
}

/// `d` in whole milliseconds, saturating (a `u128` never silently wraps
/// into a short lease).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A fencing token: strictly increasing per key for backends whose
/// [`Capabilities::fencing`] is true. A resource that rejects writes whose
/// token is not above the last one it accepted is safe against a paused,
/// expired holder (Kleppmann 2016).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct FencingToken(pub u64);

/// How to acquire: how long to wait, and what lease to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AcquireOptions {
    /// `None`: try once and fail at once if held (try-lock). `Some(d)`: wait
    /// up to `d` for the holder to go, then fail with [`Error::Timeout`].
    pub wait: Option<Duration>,
    /// `Some(d)`: a fixed lease that ends after `d` unless released.
    /// `None`: a watchdog renews the backend's configured lease every third
    /// of it while the guard lives (Redisson semantics).
    pub lease: Option<Duration>,
}

impl AcquireOptions {
    /// Try once, no waiting; lease renewed by the watchdog.
    pub fn try_lock() -> Self {
        Self::default()
    }

    /// Wait up to `wait`; lease renewed by the watchdog.
    pub fn wait(wait: Duration) -> Self {
        Self {
            wait: Some(wait),
            lease: None,
        }
    }

    /// The same options with a fixed lease.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }
}

/// Where a backend's fencing token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The backend gives no token.
    None,
    /// A per-key counter incremented atomically with the acquisition (Redis `INCR`).
    Counter,
    /// A database sequence taken inside the acquisition.
    Sequence,
    /// The store's revision at which our key was created (etcd).
    CreateRevision,
    /// The transaction id that created our node (ZooKeeper czxid).
    Czxid,
    /// A version column bumped on each acquisition.
    RowVersion,
    /// A token exists but is not safe (may go backwards after faults).
    Unsafe,
}

/// What a backend declares it guarantees; the report puts these next to
/// what was observed, and the conformance suite picks cases by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    /// Tokens strictly increase across successive holders of a key.
    pub fencing: bool,
    /// A holder may take the lock it holds again through its guard
    /// ([`Guard::reenter`]), counted: the lock is freed by the last release.
    /// Acquiring through the handle never reenters (see [`DistLock`]).
    pub reentrant: bool,
    /// Waiters get the lock in arrival order.
    pub fair: bool,
    /// [`Guard::lost`] fires when the lock is lost.
    pub lost_signal: bool,
    /// The lock has a lease (fixed, or renewed by the watchdog when
    /// `lease: None`); without one it lives as long as a session.
    pub renewal: bool,
    /// The lock survives a failover of the backend (no lost lock).
    pub survives_failover: bool,
    /// Where [`Guard::token`] comes from.
    pub token_source: TokenSource,
}

/// A distributed lock client: a handle that many tasks may share.
///
/// Every [`acquire`](DistLock::acquire) is its own owner, with an owner value
/// unique to that acquisition: two tasks sharing one handle (one client,
/// many tasks, the normal Rust pattern) exclude each other exactly as two
/// clients do, as Redisson's threads do through one client. A release,
/// renewal or clean-up of one acquisition can never touch a later one, even
/// by the same handle. Reentrancy is explicit: re-acquire through the guard
/// you hold ([`Guard::reenter`]).
///
/// A dropped (cancelled) acquire leaves nothing behind that blocks others:
/// whatever it queued on the server is withdrawn in the background.
#[async_trait::async_trait]
pub trait DistLock: Send + Sync + Debug + 'static {
    /// The registry name (`redis`, `redlock`, ...).
    fn name(&self) -> &'static str;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Takes the lock on `key`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the wait budget ran out (or at once for a
    /// try-lock on a held key), [`Error::Backend`] when the server could
    /// not be reached; see [`Error::is_indeterminate`].
    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard>;
}
