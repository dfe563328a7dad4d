//! `EtcdLock`: etcd's `concurrency.Mutex` recipe, written out by hand.
//!
//! A lock on `k` is a queue of keys under `<prefix>/<k>/`, one per
//! contender, each attached to a lease; the key with the lowest create
//! revision holds the lock, and its create revision is the fencing token.
//! A waiter watches only the key just ahead of it (no herd).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts, LeaseMode,
    Pending, Result, TokenSource,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::queue_key::{Names, QueueKey};
use crate::session::{keep_alive_once, Refresher, Session};

pub(crate) const BACKEND: &str = "etcd";

/// Maps a client error. A write whose reply never came may have been
/// applied (`indeterminate`) unless the server refused it outright.
pub(crate) fn map_err(context: impl Into<String>, e: etcd_client::Error, write: bool) -> Error {
    // gRPC codes of a request the server refused outright: InvalidArgument,
    // NotFound, AlreadyExists, PermissionDenied, FailedPrecondition,
    // OutOfRange, Unauthenticated.
    const REFUSED: [i32; 7] = [3, 5, 6, 7, 9, 11, 16];
    let refused = match &e {
        etcd_client::Error::GRpcStatus(s) => REFUSED.contains(&(s.code() as i32)),
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        _ => false,
    };
    if write && !refused {
        Error::indeterminate(BACKEND, context, e)
    } else {
        Error::backend(BACKEND, context, e)
    }
}

/// Whether an error is the kind a cluster fault causes (a member gone, a
/// leader election), so the acquisition may try again on another member.
fn transient(e: &Error) -> bool {
    matches!(e, Error::Backend { .. })
}

/// `/` and `%` escaped, so the range of lock `a` never holds lock `a/b`'s keys.
fn escape(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The queue of one lock: every key in `[dir, dir_end)`.
struct Queue {
    dir: String,
    dir_end: String,
}

impl Queue {
    fn new(prefix: &str, key: &str) -> Self {
        let base = format!("{prefix}/{}", escape(key));
        Self {
            dir: format!("{base}/"),
            // '0' is the byte after '/': the end of the prefix range.
            dir_end: format!("{base}0"),
        }
    }

    /// How many keys are queued: read inside the acquire transaction BEFORE
    /// our put, zero means nobody is ahead of us. Count-only is served from
    /// the index alone, with no read of the key-value store.
    fn count(&self) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(
                GetOptions::new()
                    .with_range(self.dir_end.as_str())
                    .with_count_only(),
            ),
        )
    }

    /// The holder (lowest create revision).
    fn first(&self) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(
                GetOptions::new()
                    .with_range(self.dir_end.as_str())
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        )
    }

    /// The key just ahead of `rev` (highest create revision below it).
    fn ahead_of(&self, rev: i64) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(
                GetOptions::new()
                    .with_range(self.dir_end.as_str())
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(rev - 1)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        )
    }
}

/// The first key-value of the `i`-th range response of a transaction.
fn range_first(ops: &[TxnOpResponse], i: usize) -> Option<(Vec<u8>, i64)> {
    match ops.get(i)? {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .map(|kv| (kv.key().to_vec(), kv.create_revision())),
        _ => None,
    }
}

/// The queue key just ahead of a waiter's, as its last queue read saw it.
struct Ahead {
    key: Vec<u8>,
    create_rev: i64,
    /// The revision of that read.
    seen: i64,
}

/// The lease a lock key is attached to.
enum Lease {
    /// The shared, kept-alive session lease (watchdog mode).
    Session(Arc<Session>),
    /// A lease of its own, for a fixed lease: kept alive only while its
    /// acquisition waits.
    Own {
        id: i64,
        lease: Duration,
        /// When the grant was sent: the server counts the TTL from later.
        granted_at: Instant,
    },
}

impl Lease {
    fn id(&self) -> i64 {
        match self {
            Lease::Session(s) => s.id,
            Lease::Own { id, .. } => *id,
        }
    }
}

/// A fixed lease as etcd takes it: whole seconds, rounded up, so the server
/// never ends it before `lease`.
fn whole_secs(lease: Duration) -> Duration {
    Duration::from_secs(lease.as_nanos().div_ceil(1_000_000_000).max(1) as u64)
}

/// Why one attempt did not end in a guard.
enum Fail {
    /// Give this error to the caller.
    Final(Error),
    /// A fault the next attempt (on another member, with a fresh key) may
    /// get past; our key is known to be gone.
    Retry(Error),
}

/// etcd's `concurrency.Mutex` recipe over a session lease: a handle that
/// many tasks may share, every acquire its own owner.
///
/// - acquire, uncontended: ONE transaction — if our key's create revision is
///   0, count the queue (index only), then put our key with the lease. An
///   empty queue before our put = ours has the lowest create revision =
///   held; that revision is the token.
/// - every acquisition has a queue key of its own: `<lease>`, or
///   `<lease>-1`, ... when acquisitions through this handle overlap on one
///   key; a name is reused only once its key is known deleted. Our own keys
///   queue by create revision like anybody's, each waiting for the one just
///   ahead, ours or not.
/// - contended: watch only the key just ahead of ours for its deletion,
///   then re-check (and confirm ours still exists) in one transaction;
///   on giving up, delete our key.
/// - release: `Txn(create_revision(key) == ours) then delete` (one round
///   trip), so no late delete can remove a newer key under the same name.
/// - a dropped (cancelled) acquire takes its key back in the background, as
///   `concurrency.Mutex` does when its context is cancelled.
/// - lease: with no fixed lease the key rides on the instance's session
///   lease (`session_ttl_s`, kept alive every third of it; `lost()` fires
///   when a keepalive cannot be had in time, the lease is gone, or the key
///   was deleted); a fixed lease `d` gets a lease of its own (TTL `d`
///   rounded up to whole seconds, etcd's granularity) that we also revoke
///   at `d`, so the lock ends on time while we live and within the rounded
///   TTL if we crash. It is counted from its grant, or, after a wait, from
///   a keepalive sent once the wait is over.
/// - reentrancy is explicit: [`Guard::reenter`]; acquiring through the
///   handle again is another owner and waits like one.
pub struct EtcdLock {
    cfg: EtcdConfig,
    client: Client,
    session: tokio::sync::Mutex<Arc<Session>>,
    names: Arc<Names>,
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Connects a client to `cfg.endpoints` (requests balanced over them).
pub(crate) async fn client(cfg: &EtcdConfig) -> Result<Client> {
    cfg.validate()?;
    let opts = ConnectOptions::new()
        .with_connect_timeout(cfg.connect_timeout())
        .with_timeout(cfg.op_timeout())
        // A member cut off from the leader refuses at once instead of
        // letting requests (watches above all) hang.
        .with_require_leader(true);
    distlock::with_deadline(
        BACKEND,
        || format!("connecting to {}", cfg.endpoints_shown()),
        cfg.connect_timeout(),
        async {
            Client::connect(&cfg.endpoints, Some(opts))
                .await
                .map_err(|e| map_err(format!("connecting to {}", cfg.endpoints_shown()), e, false))
        },
    )
    .await
}

impl EtcdLock {
    /// What `etcd` declares.
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        // Through the guard (Guard::reenter), counted; never through the handle.
        reentrant: true,
        // Waiters are served in create-revision order.
        fair: true,
        lost_signal: true,
        renewal: true,
        // Raft: an acknowledged key survives the loss of any minority,
        // leader included (leases are extended across an election).
        survives_failover: true,
        token_source: TokenSource::CreateRevision,
    };

    /// Connects one owner handle and grants its session lease.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad setting, [`Error::Backend`] naming the
    /// endpoints when no member answers within `connect_timeout_ms`.
    pub async fn connect(cfg: EtcdConfig) -> Result<Self> {
        let client = client(&cfg).await?;
        let session = distlock::with_deadline(
            BACKEND,
            || format!("first request to {}", cfg.endpoints_shown()),
            cfg.connect_timeout(),
            Session::grant(&client, cfg.session_ttl(), cfg.op_timeout()),
        )
        .await
        .map_err(|e| {
            Error::backend(
                BACKEND,
                format!("connecting to {}", cfg.endpoints_shown()),
                e,
            )
        })?;
        Ok(Self {
            cfg,
            client,
            session: tokio::sync::Mutex::new(session),
            names: Arc::default(),
        })
    }

    /// The raw floor of one lock cycle: a put and a delete of one key on
    /// this client (two round trips, both through raft like ours).
    ///
    /// # Errors
    /// As any request.
    pub async fn floor_round_trip(&self) -> Result<()> {
        let key = format!("{}-floor/{}", self.cfg.prefix, std::process::id());
        let mut kv = self.client.kv_client();
        kv.put(key.as_str(), "", None)
            .await
            .map_err(|e| map_err("floor put", e, true))?;
        kv.delete(key.as_str(), None)
            .await
            .map_err(|e| map_err("floor delete", e, true))?;
        Ok(())
    }

    /// The session lease every watchdog-mode lock of this instance rides on
    /// (for tests and operators: revoking it frees them all).
    pub async fn session_lease(&self) -> i64 {
        self.session.lock().await.id
    }

    /// Fault injection: stops (`true`) or resumes renewing the session
    /// lease, as a stalled process would; its locks are lost when it runs
    /// out.
    pub async fn stop_keepalive(&self, stopped: bool) {
        self.session.lock().await.set_stopped(stopped);
    }

    /// The etcd key range (`[start, end)`) holding the queue of lock `key`.
    pub fn queue_range(&self, key: &str) -> (String, String) {
        let q = Queue::new(&self.cfg.prefix, key);
        (q.dir, q.dir_end)
    }

    /// The session, replaced by a fresh one if it died (and counted as a
    /// round trip then).
    async fn live_session(&self, round_trips: &mut u32) -> Result<Arc<Session>> {
        let mut s = self.session.lock().await;
        if !s.usable() {
            *round_trips += 1;
            *s =
                Session::grant(&self.client, self.cfg.session_ttl(), self.cfg.op_timeout()).await?;
        }
        Ok(s.clone())
    }

    async fn grant_own(&self, lease: Duration, round_trips: &mut u32) -> Result<Lease> {
        let granted_at = Instant::now();
        // Whole seconds, rounded up: the server never ends it before `lease`.
        let secs = lease.as_nanos().div_ceil(1_000_000_000).max(1) as i64;
        *round_trips += 1;
        let r = self
            .client
            .lease_client()
            .grant(secs, None)
            .await
            .map_err(|e| map_err("granting a lock lease", e, false))?;
        Ok(Lease::Own {
            id: r.id(),
            lease,
            granted_at,
        })
    }

    /// One attempt: enqueue, wait for our turn within `deadline`.
    async fn attempt(
        &self,
        key: &str,
        opts: AcquireOptions,
        deadline: Instant,
        started: Instant,
        round_trips: &mut u32,
    ) -> std::result::Result<Guard, Fail> {
        let lease = match opts.lease {
            None => Lease::Session(self.live_session(round_trips).await.map_err(Fail::Retry)?),
            Some(d) => self.grant_own(d, round_trips).await.map_err(Fail::Retry)?,
        };
        let queue = Queue::new(&self.cfg.prefix, key);
        let name = self
            .names
            .reserve(format!("{}{:016x}", queue.dir, lease.id()));
        let (session, own) = match &lease {
            Lease::Session(s) => (Some(s.clone()), None),
            Lease::Own { id, .. } => (None, Some(*id)),
        };
        let mine = Arc::new(QueueKey::new(
            self.client.clone(),
            self.names.clone(),
            name,
            session,
            own,
            self.cfg.op_timeout(),
        ));
        // Armed before the put goes out: should this future be dropped (a
        // timeout, a select!) or end in an error that may have left our key
        // behind, it is taken back in the background, by our create
        // revision once known. Every path below that gives up takes it back
        // itself first, which leaves the withdrawal nothing to do.
        let pending = Pending::new(key, mine.clone());
        let r = self
            .enqueue(
                key,
                &queue,
                &mine,
                &lease,
                opts,
                deadline,
                started,
                round_trips,
            )
            .await;
        let (result, retry) = match r {
            Ok(g) => (Ok(g), false),
            Err(Fail::Final(e)) => (Err(e), false),
            Err(Fail::Retry(e)) => (Err(e), true),
        };
        pending.settle(&result);
        result.map_err(|e| {
            if retry {
                Fail::Retry(e)
            } else {
                Fail::Final(e)
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn enqueue(
        &self,
        key: &str,
        queue: &Queue,
        mine: &Arc<QueueKey>,
        lease: &Lease,
        opts: AcquireOptions,
        deadline: Instant,
        started: Instant,
        round_trips: &mut u32,
    ) -> std::result::Result<Guard, Fail> {
        let my_key = mine.name();
        let invoked_at = Instant::now();
        let txn = Txn::new()
            .when([Compare::create_revision(my_key, CompareOp::Equal, 0)])
            // Ops apply in order: the count sees the queue as it was just
            // before our key's revision, so an empty queue = ours is first.
            .and_then([
                queue.count(),
                TxnOp::put(my_key, "", Some(PutOptions::new().with_lease(lease.id()))),
            ])
            // Our (reserved) name already has a key: a put of ours that
            // landed after we gave up on it. It is ours: take its place.
            .or_else([TxnOp::get(my_key, None), queue.first()]);
        *round_trips += 1;
        mine.sending();
        let resp = match self.client.kv_client().txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                let e = map_err(format!("acquire {my_key}"), e, true);
                // The put may have landed: take it back before anything else.
                return Err(match mine.take_back().await {
                    Ok(_) if transient(&e) => Fail::Retry(e),
                    Ok(_) | Err(_) => Fail::Final(e),
                });
            }
        };
        let ops = resp.op_responses();
        let (my_rev, first) = if resp.succeeded() {
            let ahead = match ops.first() {
                Some(TxnOpResponse::Get(g)) => g.count(),
                _ => -1,
            };
            let rev = resp.header().map_or(0, |h| h.revision());
            (rev, (ahead == 0).then_some(rev))
        } else {
            (
                range_first(&ops, 0).map_or(0, |(_, rev)| rev),
                range_first(&ops, 1).map(|(_, rev)| rev),
            )
        };
        if my_rev == 0 {
            let _ = mine.take_back().await;
            return Err(Fail::Retry(Error::backend(
                BACKEND,
                format!("acquire {my_key}"),
                "our queue key vanished as it was written (lease gone)",
            )));
        }
        mine.created(my_rev);
        if first == Some(my_rev) {
            let start = match lease {
                // Our revoke and the server's TTL both count from the grant
                // at the earliest, the put came later.
                Lease::Own { granted_at, .. } => *granted_at,
                Lease::Session(_) => invoked_at,
            };
            return Ok(self.held(key, mine, my_rev, lease, start, *round_trips));
        }
        // Held by someone else: wait our turn, keeping a lease of our own
        // alive meanwhile.
        let refresher = match lease {
            Lease::Own { id, lease: d, .. } if opts.wait.is_some() => {
                Some(Refresher::start(&self.client, *id, whole_secs(*d)))
            }
            _ => None,
        };
        let waited = self
            .wait_turn(queue, my_key, my_rev, lease, deadline, round_trips)
            .await;
        drop(refresher);
        match waited {
            Ok(()) => {
                let start = match lease {
                    Lease::Session(_) => invoked_at,
                    Lease::Own { id, lease: d, .. } => {
                        match self.fresh_start(*id, *d, round_trips).await {
                            Ok(sent) => sent,
                            Err(e) => {
                                let _ = mine.take_back().await;
                                return Err(Fail::Retry(e));
                            }
                        }
                    }
                };
                Ok(self.held(key, mine, my_rev, lease, start, *round_trips))
            }
            Err(Fail::Final(Error::Timeout { .. })) => match mine.take_back().await {
                Ok(_) => Err(Fail::Final(Error::Timeout {
                    key: key.to_string(),
                    waited: started.elapsed(),
                })),
                Err(e) => Err(Fail::Final(e)),
            },
            Err(f) => {
                let _ = mine.take_back().await;
                Err(f)
            }
        }
    }

    /// A fixed lease that waited is counted from a keepalive sent now, once
    /// the wait is over: the last renewal while waiting may be up to a third
    /// of the TTL old, which would hand out a guard already half expired.
    /// Returns when that keepalive was sent. One round trip, on the
    /// contended path only.
    async fn fresh_start(
        &self,
        id: i64,
        lease: Duration,
        round_trips: &mut u32,
    ) -> Result<Instant> {
        *round_trips += 1;
        let sent = Instant::now();
        if keep_alive_once(&self.client, id, whole_secs(lease), self.cfg.op_timeout()).await? {
            Ok(sent)
        } else {
            Err(Error::backend(
                BACKEND,
                format!("lease {id:016x}"),
                "the lock's lease ended while it waited",
            ))
        }
    }

    /// Waits until no key ahead of ours remains: watch the one just ahead
    /// for its deletion, re-check, repeat. Ends with our key confirmed.
    async fn wait_turn(
        &self,
        queue: &Queue,
        my_key: &str,
        my_rev: i64,
        lease: &Lease,
        deadline: Instant,
        round_trips: &mut u32,
    ) -> std::result::Result<(), Fail> {
        let timeout = || {
            Fail::Final(Error::Timeout {
                key: String::new(),
                waited: Duration::ZERO,
            })
        };
        // Re-check at least this often even if no event comes (a paused
        // member's watch can stall silently).
        let recheck = match lease {
            Lease::Session(s) => (s.ttl / 3).min(Duration::from_secs(2)),
            Lease::Own { .. } => Duration::from_secs(1),
        };
        loop {
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            // Our key still ours, and who is just ahead, in one read.
            let txn = Txn::new()
                .when([Compare::create_revision(my_key, CompareOp::Equal, my_rev)])
                .and_then([queue.ahead_of(my_rev)]);
            *round_trips += 1;
            let resp = match self.client.kv_client().txn(txn).await {
                Ok(r) => r,
                Err(e) => {
                    let e = map_err(format!("checking the queue of {my_key}"), e, false);
                    tracing::debug!(error = %e, "queue check failed");
                    nap(deadline).await;
                    continue;
                }
            };
            if !resp.succeeded() {
                return Err(Fail::Retry(Error::backend(
                    BACKEND,
                    format!("waiting with {my_key}"),
                    "our queue key is gone (its lease ended)",
                )));
            }
            let Some((ahead, ahead_rev)) = range_first(&resp.op_responses(), 0) else {
                return Ok(());
            };
            let seen = resp.header().map_or(0, |h| h.revision());
            *round_trips += 1;
            let until = deadline.min(Instant::now() + recheck);
            let ahead = Ahead {
                key: ahead,
                create_rev: ahead_rev,
                seen,
            };
            if let Err(e) = self.deleted(ahead, until, round_trips).await {
                tracing::debug!(error = %e, "watch failed; re-checking");
                nap(deadline).await;
            }
        }
    }

    /// Returns when the key ahead is deleted (or was replaced), at
    /// `until`, or when the watch ends (the caller re-checks either way).
    ///
    /// The watch starts at the current revision, not at `seen + 1`: etcd
    /// serves a watch whose start revision is already past from its
    /// "unsynced" set, which it catches up only every 100 ms
    /// (`watchResyncPeriod`), so under contention, when other waiters'
    /// writes have moved the revision on, every hand-over would wait up to
    /// 100 ms. The gap that leaves (a delete between our queue read and the
    /// watch's creation) is closed by one read, only when the revision
    /// moved in between.
    async fn deleted(&self, ahead: Ahead, until: Instant, round_trips: &mut u32) -> Result<()> {
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let watching = tokio::time::timeout_at(
            until,
            self.client
                .watch_client()
                .watch(ahead.key.clone(), Some(opts)),
        )
        .await;
        let mut stream = match watching {
            Err(_) => return Ok(()),
            Ok(r) => r.map_err(|e| map_err("watch", e, false))?,
        };
        loop {
            match tokio::time::timeout_at(until, stream.message()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(resp))) => {
                    if resp.canceled()
                        || resp
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(());
                    }
                    let created_at = resp.header().map_or(0, |h| h.revision());
                    if resp.created() && created_at > ahead.seen {
                        // Watched from after `created_at`: is the key we
                        // saw still there, the same incarnation?
                        *round_trips += 1;
                        let got = tokio::time::timeout_at(
                            until,
                            self.client
                                .kv_client()
                                .get(ahead.key.clone(), Some(GetOptions::new().with_keys_only())),
                        )
                        .await;
                        let still = match got {
                            Err(_) => return Ok(()),
                            Ok(r) => r
                                .map_err(|e| map_err("checking the key ahead", e, false))?
                                .kvs()
                                .first()
                                .is_some_and(|kv| kv.create_revision() == ahead.create_rev),
                        };
                        if !still {
                            return Ok(());
                        }
                    }
                }
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(map_err("watch", e, false)),
            }
        }
    }

    fn held(
        &self,
        key: &str,
        mine: &Arc<QueueKey>,
        my_rev: i64,
        lease: &Lease,
        start: Instant,
        round_trips: u32,
    ) -> Guard {
        let token = Some(FencingToken(my_rev as u64));
        match lease {
            Lease::Session(s) => {
                let guard = Guard::new(GuardParts {
                    key: key.to_string(),
                    token,
                    held: mine.clone(),
                    lease: LeaseMode::Managed,
                    invoked_at: start,
                    round_trips,
                });
                // From here the session reports: valid_until, loss.
                s.register(mine.name(), my_rev, guard.lease_handle());
                guard
            }
            Lease::Own { id, lease: d, .. } => {
                let id = *id;
                // Enforce the lease's end ourselves: etcd rounds it up to
                // whole seconds and scans for expired leases every 500 ms.
                let mut revoker = self.client.lease_client();
                let due = start + *d;
                let limit = self.cfg.op_timeout();
                mine.set_expiry(tokio::spawn(async move {
                    tokio::time::sleep_until(due).await;
                    let _ = tokio::time::timeout(limit, revoker.revoke(id)).await;
                }));
                Guard::new(GuardParts {
                    key: key.to_string(),
                    token,
                    held: mine.clone(),
                    lease: LeaseMode::Fixed(*d),
                    invoked_at: start,
                    round_trips,
                })
            }
        }
    }
}

/// A short jittered pause after a failed request, so a dead member is not
/// hammered; never past `deadline`.
async fn nap(deadline: Instant) {
    let d = Duration::from_millis(rand::random_range(20..60));
    tokio::time::sleep_until(deadline.min(Instant::now() + d)).await;
}

#[async_trait]
impl DistLock for EtcdLock {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    /// Every call is its own owner (its own queue key), even on a key this
    /// handle already holds: that call waits (or, as a try-lock, fails)
    /// like any other client. Reenter through the guard instead.
    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        let started = Instant::now();
        let deadline = started + opts.wait.unwrap_or(Duration::ZERO);
        let mut round_trips = 0u32;
        loop {
            match self
                .attempt(key, opts, deadline, started, &mut round_trips)
                .await
            {
                Ok(g) => return Ok(g),
                Err(Fail::Final(e)) => return Err(e),
                // A fault (member gone, election, lease ended): again with a
                // fresh key, on whichever member answers, while time remains.
                Err(Fail::Retry(e)) => {
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    tracing::debug!(%key, error = %e, "acquire attempt failed; retrying");
                    nap(deadline).await;
                }
            }
        }
    }
}
