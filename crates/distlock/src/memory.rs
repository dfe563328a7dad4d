//! The in-memory reference lock: the contract, with no server and no
//! network (object_store's `InMemory`).
//!
//! NOT a distributed lock: every handle must share one [`MemoryStore`] in
//! one process. It exists so the conformance suite and the harness's own
//! tests run in milliseconds, and as the plainest statement of what every
//! backend promises: owner values per acquisition, leases measured on one
//! clock, a fencing counter that never goes back, waiters woken by release.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{
    AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts, HeldLock,
    LeaseMode, Pending, Result, TokenSource,
};

const BACKEND: &str = "memory";

/// The lease the watchdog renews when no fixed lease is asked for.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
struct Entry {
    owner: u64,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Entry>,
    /// Per-key fencing counters: they survive [`MemoryStore::restart`], as a
    /// durable server's would.
    fences: HashMap<String, u64>,
}

impl State {
    /// The live entry of `key`, dropping it if its lease ran out.
    fn live(&mut self, key: &str, now: Instant) -> Option<Entry> {
        match self.locks.get(key) {
            Some(e) if e.expires_at > now => Some(*e),
            Some(_) => {
                self.locks.remove(key);
                None
            }
            None => None,
        }
    }
}

/// The "server": lock table, fencing counters and the release signal,
/// shared by every [`MemoryLock`] handle made from it.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    released: Notify,
    next_owner: AtomicU64,
}

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this mutex leaves plain data behind: go on.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets every lock (a server restarted without its lock table) but
    /// keeps the fencing counters (kept durably, as they must be).
    pub fn restart(&self) {
        self.state().locks.clear();
        self.released.notify_waiters();
    }

    /// Deletes `key`'s lock behind its holder's back (an operator, a failover).
    pub fn sabotage(&self, key: &str) {
        self.state().locks.remove(key);
        self.released.notify_waiters();
    }

    /// Takes `key` for `owner` if free; else the holder's remaining lease.
    fn try_take(
        &self,
        key: &str,
        owner: u64,
        lease: Duration,
    ) -> std::result::Result<u64, Duration> {
        let now = Instant::now();
        let mut st = self.state();
        if let Some(e) = st.live(key, now) {
            return Err(e.expires_at - now);
        }
        st.locks.insert(
            key.to_string(),
            Entry {
                owner,
                expires_at: now + lease,
            },
        );
        let fence = st.fences.entry(key.to_string()).or_insert(0);
        *fence += 1;
        Ok(*fence)
    }
}

/// What a [`MemoryLock`] holds: the key and this acquisition's owner value.
#[derive(Debug)]
struct MemoryHeld {
    store: Arc<MemoryStore>,
    key: String,
    owner: u64,
}

#[async_trait::async_trait]
impl HeldLock for MemoryHeld {
    async fn release(&self) -> Result<bool> {
        let now = Instant::now();
        let mut st = self.store.state();
        let ours = st
            .live(&self.key, now)
            .is_some_and(|e| e.owner == self.owner);
        if ours {
            st.locks.remove(&self.key);
        }
        drop(st);
        if ours {
            self.store.released.notify_waiters();
        }
        Ok(ours)
    }

    async fn renew(&self, lease: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut st = self.store.state();
        match st.locks.get_mut(&self.key) {
            Some(e) if e.owner == self.owner && e.expires_at > now => {
                e.expires_at = now + lease;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// A handle on a [`MemoryStore`]. Clone the store's `Arc` into as many
/// handles as you like; share a handle between tasks freely.
#[derive(Debug, Clone)]
pub struct MemoryLock {
    store: Arc<MemoryStore>,
    watchdog_lease: Duration,
}

impl MemoryLock {
    /// What the reference lock declares. `survives_failover` is false:
    /// there is nothing to fail over to, and it does not cross processes.
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        reentrant: true,
        fair: false,
        lost_signal: true,
        renewal: true,
        survives_failover: false,
        token_source: TokenSource::Counter,
    };

    /// A handle whose watchdog renews [`DEFAULT_WATCHDOG_LEASE`].
    pub fn new(store: Arc<MemoryStore>) -> Self {
        Self::with_watchdog_lease(store, DEFAULT_WATCHDOG_LEASE)
    }

    /// A handle whose watchdog renews `lease`.
    pub fn with_watchdog_lease(store: Arc<MemoryStore>, lease: Duration) -> Self {
        Self {
            store,
            watchdog_lease: lease,
        }
    }
}

#[async_trait::async_trait]
impl DistLock for MemoryLock {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        crate::check_request("memory", key, &opts)?;
        let (lease, mode) = LeaseMode::for_request(opts.lease, self.watchdog_lease);
        if lease.is_zero() {
            return Err(Error::config("lease", "must be above zero"));
        }
        let held = Arc::new(MemoryHeld {
            store: self.store.clone(),
            key: key.to_string(),
            owner: self.store.next_owner.fetch_add(1, Ordering::Relaxed),
        });
        let pending = Pending::new(key, held.clone());
        let start = Instant::now();
        let deadline = opts.wait.map(|w| crate::deadline_after(start, w));
        let mut round_trips = 0;
        let r = loop {
            // Armed before the try, so a release in between still wakes us.
            let released = self.store.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let invoked_at = Instant::now();
            round_trips += 1;
            let left = match self.store.try_take(key, held.owner, lease) {
                Ok(token) => {
                    break Ok(Guard::new(GuardParts {
                        key: key.to_string(),
                        token: Some(FencingToken(token)),
                        held: held.clone(),
                        lease: mode,
                        invoked_at,
                        round_trips,
                    }))
                }
                Err(left) => left,
            };
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| now < *d) else {
                break Err(Error::Timeout {
                    key: key.to_string(),
                    waited: start.elapsed(),
                });
            };
            // Woken by a release, or when the holder's lease runs out.
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until((now + left).min(deadline)) => {}
            }
        };
        pending.settle(&r);
        r
    }
}

/// The registry entry of the reference lock. It is listed so the CLI can
/// name it and refuse it clearly: `lockbench run` drives worker PROCESSES,
/// and an in-memory lock cannot be shared between processes.
#[derive(Debug)]
pub struct MemoryBackend;

/// The registry entry (`memory`).
pub static MEMORY: MemoryBackend = MemoryBackend;

#[async_trait::async_trait]
impl crate::descriptor::Descriptor for MemoryBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn about(&self) -> &'static str {
        "NOT DISTRIBUTED: the in-memory reference lock (one process); the conformance suite's reference, refused by `run`"
    }

    fn capabilities(&self) -> Capabilities {
        MemoryLock::CAPABILITIES
    }

    fn topology(&self) -> crate::descriptor::Topology {
        crate::descriptor::Topology::InProcess
    }

    fn distributed(&self) -> bool {
        false
    }

    fn family(&self) -> &'static str {
        BACKEND
    }

    fn settings(&self, table: Option<serde_json::Value>) -> Result<serde_json::Value> {
        match table {
            Some(serde_json::Value::Object(o)) if !o.is_empty() => Err(Error::config(
                BACKEND,
                "the in-memory lock takes no settings",
            )),
            _ => Ok(serde_json::Value::Object(Default::default())),
        }
    }

    fn set_endpoint(&self, _settings: &mut serde_json::Value, endpoint: &str) -> Result<()> {
        Err(Error::config(
            "endpoint",
            format!("the in-memory lock has no server; {endpoint:?} cannot be one"),
        ))
    }

    fn configured_endpoint(&self, _settings: &serde_json::Value) -> Option<String> {
        None
    }

    async fn connect(
        &self,
        _settings: &serde_json::Value,
        _params: crate::descriptor::BuildParams,
    ) -> Result<crate::descriptor::Connected> {
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "crossing processes: lockbench's workers are separate OS processes and an \
                   in-memory lock lives in one; use `distlock::memory::MemoryLock` in-process \
                   (the conformance suite runs against it in `cargo test`)"
                .into(),
        })
    }

    async fn server_version(&self, _settings: &serde_json::Value) -> Option<String> {
        None
    }
}
