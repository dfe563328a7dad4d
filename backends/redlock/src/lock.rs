//! The RedLock algorithm over N independent masters.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    drift, AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts,
    HeldLock, LeaseMode, Pending, Result, TokenSource,
};
use lockbench_redis::node::{self, ConnectOptions, Keys, Reply};
use lockbench_redis::redact;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::config::RedLockConfig;
use crate::fair::{self, Place, Wakes};
use crate::retry::{Backoff, LostRound, RetryPolicy};

const BACKEND: &str = "redlock";

#[derive(Clone)]
struct Node {
    /// The URL with any password hidden, for messages.
    shown: String,
    con: ConnectionManager,
}

/// Refuses two masters that are one server under two names (`localhost`
/// and `127.0.0.1`, a hostname and its address, a port forward): by the
/// server's `run_id`, which `INFO server` reports and every start of a
/// server draws anew. Such a server votes twice, so the quorum rests on
/// fewer independent masters than it counts. A node that does not answer
/// is left to the quorum check.
async fn same_server_twice(nodes: &[Node], up: &[bool], limit: Duration) -> Result<()> {
    let ids = futures::future::join_all(nodes.iter().zip(up).map(|(n, &up)| {
        let mut con = n.con.clone();
        async move {
            if !up {
                return None;
            }
            let info: String = bounded(
                limit,
                redis::cmd("INFO").arg("server").query_async(&mut con),
            )
            .await
            .ok()?;
            info.lines()
                .find_map(|l| l.strip_prefix("run_id:"))
                .map(|id| id.trim().to_string())
                // A proxy or a stripped INFO may say nothing: not "the same".
                .filter(|id| !id.is_empty())
        }
    }))
    .await;
    for (i, id) in ids.iter().enumerate() {
        let Some(id) = id else { continue };
        if let Some(j) = ids[..i].iter().position(|o| o.as_ref() == Some(id)) {
            return Err(Error::config(
                "redlock.urls",
                format!(
                    "{} and {} are the same server (run_id {id}); RedLock needs independent masters, each once",
                    nodes[j].shown, nodes[i].shown
                ),
            ));
        }
    }
    Ok(())
}

/// One node's answer under its deadline, errors as text naming nothing
/// (the caller adds the node).
async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no reply within {limit:?}")),
    }
}

/// Runs `f` on every node at once, each under its own deadline; the
/// answers come back in node order.
async fn on_all<T, F, Fut>(
    nodes: &[Node],
    limit: Duration,
    f: F,
) -> Vec<std::result::Result<T, String>>
where
    F: Fn(ConnectionManager) -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    futures::future::join_all(nodes.iter().map(|n| bounded(limit, f(n.con.clone())))).await
}

/// Answers with the ones not waited for as errors saying so.
fn waited<T>(
    answers: Vec<Option<std::result::Result<T, String>>>,
) -> Vec<std::result::Result<T, String>> {
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err("not waited for".into())))
        .collect()
}

/// Requests a won round no longer waits for, kept alive until they end.
/// Dropping them is not an option: the redis crate does not even send a
/// request whose caller has gone (its pipeline sheds those), which left a
/// slow node without the lock, or still holding it after a release (the
/// test `a_quorum_win_does_not_cancel_the_slow_nodes_request` caught
/// both). Alive, they are sent and answered without anyone polling them,
/// as they are single `EVAL`s (an `EVALSHA` answered `NOSCRIPT` would need
/// a poll to load and retry); they are polled, without a task of their
/// own (a spawned one cost about 7 % per cycle), only to find and drop
/// those that have ended, whenever the lock next talks to its nodes.
#[derive(Clone, Default)]
struct Leftovers(Arc<Mutex<Vec<Leftover>>>);

/// The rest of one round's requests.
type Leftover = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Leftovers {
    fn keep(&self, f: impl Future<Output = ()> + Send + 'static) {
        if let Ok(mut v) = self.0.lock() {
            v.push(Box::pin(f));
        }
    }

    fn prune(&self) {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        if let Ok(mut v) = self.0.lock() {
            v.retain_mut(|f| f.as_mut().poll(&mut cx).is_pending());
        }
    }
}

/// Like [`on_all`], but returns as soon as `enough` answers are `good`:
/// RedLock needs a quorum, not every node, so the slowest masters do not
/// set the pace. `None` = not waited for; those requests go on (see
/// [`Leftovers`]) and still reach their nodes, in order, before anything
/// sent there later.
async fn on_nodes<T, F, Fut>(
    nodes: &[Node],
    leftovers: &Leftovers,
    limit: Duration,
    f: F,
    enough: usize,
    good: impl Fn(&T) -> bool,
) -> Vec<Option<std::result::Result<T, String>>>
where
    F: Fn(ConnectionManager) -> Fut,
    Fut: Future<Output = redis::RedisResult<T>> + Send + 'static,
    T: Send + 'static,
{
    leftovers.prune();
    // Every node's request is polled once, so written to its connection,
    // before any answer is counted. `FuturesUnordered` hands out an answer
    // as soon as a future has one, and on a loaded machine a future can
    // finish on its FIRST poll (the thread was preempted between the send
    // and the wait, and the reply came meanwhile): three such and the
    // round was won before the last two nodes' futures were ever polled,
    // so their requests were never sent. The lock then stood on 3 nodes,
    // one failure from none, or a release left it on 2 until its TTL
    // (the test `a_quorum_win_does_not_cancel_the_slow_nodes_request`,
    // 3 of 15 runs beside three busy loops).
    let mut pending = futures::stream::FuturesUnordered::new();
    let mut first = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let fut = f(n.con.clone());
        let mut request = Box::pin(async move { (i, bounded(limit, fut).await) });
        match futures::poll!(request.as_mut()) {
            std::task::Poll::Ready(answer) => first.push(answer),
            std::task::Poll::Pending => pending.push(request),
        }
    }
    let mut answers: Vec<Option<std::result::Result<T, String>>> =
        nodes.iter().map(|_| None).collect();
    let mut yes = 0;
    let mut record = |(i, answer): (usize, std::result::Result<T, String>)| {
        if matches!(&answer, Ok(v) if good(v)) {
            yes += 1;
        }
        if let Some(slot) = answers.get_mut(i) {
            *slot = Some(answer);
        }
        yes >= enough
    };
    let mut won = false;
    for a in first {
        won = record(a);
    }
    while !won {
        let Some(a) = futures::StreamExt::next(&mut pending).await else {
            break;
        };
        won = record(a);
    }
    if !pending.is_empty() {
        leftovers
            .keep(async move { while futures::StreamExt::next(&mut pending).await.is_some() {} });
    }
    answers
}

/// Subscribes `channel` on the masters whose flag is not set yet, all at
/// once; sets the flags of those that took it.
async fn subscribe_missing(nodes: &[Node], flags: &[AtomicBool], channel: &str, limit: Duration) {
    let answers = futures::future::join_all(nodes.iter().zip(flags).map(|(n, f)| {
        let mut con = n.con.clone();
        async move {
            if f.load(Ordering::Acquire) {
                return None;
            }
            Some(bounded(limit, con.subscribe(channel)).await)
        }
    }))
    .await;
    for ((n, f), a) in nodes.iter().zip(flags).zip(answers) {
        match a {
            Some(Ok(())) => f.store(true, Ordering::Release),
            Some(Err(e)) => {
                tracing::debug!(node = %n.shown, error = %e, "SUBSCRIBE failed; asked again on a later wait");
            }
            None => {}
        }
    }
}

fn unavailable(
    what: &str,
    nodes: &[Node],
    answers: &[std::result::Result<impl Sized, String>],
    quorum: usize,
) -> Error {
    let failed: Vec<String> = nodes
        .iter()
        .zip(answers)
        .filter_map(|(n, a)| a.as_ref().err().map(|e| format!("{} ({e})", n.shown)))
        .collect();
    Error::backend(
        BACKEND,
        what.to_string(),
        format!(
            "quorum unavailable: {} of {} nodes answered, {quorum} needed; failed nodes: {}",
            nodes.len() - failed.len(),
            nodes.len(),
            failed.join(", ")
        ),
    )
}

/// Whether a node's failure means the request never reached it.
fn refused(message: &str) -> bool {
    message.contains("Connection refused") || message.contains("connection refused")
}

/// The same error, as one whose outcome is unknown.
fn indeterminate(e: Error) -> Error {
    match e {
        Error::Backend {
            backend,
            context,
            source,
            ..
        } => Error::Backend {
            backend,
            context,
            indeterminate: true,
            source,
        },
        other => other,
    }
}

/// The server side of a held RedLock.
struct RedLockHeld {
    nodes: Arc<Vec<Node>>,
    leftovers: Leftovers,
    keys: Keys,
    owner: String,
    /// The acquisition's place in the queues (`redlock.fair`).
    place: Option<Place>,
    quorum: usize,
    node_timeout: Duration,
}

impl std::fmt::Debug for RedLockHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockHeld")
            .field("lock", &self.keys.lock)
            .finish_non_exhaustive()
    }
}

impl RedLockHeld {
    /// Compare-and-delete on the nodes `which` marks, all at once; `None`
    /// for the others. A queued acquisition keeps its place there for
    /// `keep_ttl_ms` (0: leaves the queue).
    async fn release_where(
        &self,
        which: &[bool],
        keep_ttl_ms: u64,
    ) -> Vec<Option<std::result::Result<bool, String>>> {
        let (keys, owner) = (&self.keys, self.owner.as_str());
        let limit = self.node_timeout;
        futures::future::join_all(self.nodes.iter().zip(which).map(|(n, &send)| {
            let mut con = n.con.clone();
            async move {
                if !send {
                    return None;
                }
                Some(match &self.place {
                    Some(p) => {
                        let r = fair::release_eval(&mut con, keys, owner, p, keep_ttl_ms);
                        bounded(limit, r).await
                    }
                    None => bounded(limit, node::release_quiet(&mut con, keys, owner)).await,
                })
            }
        }))
        .await
    }
}

#[async_trait]
impl HeldLock for RedLockHeld {
    /// True only if a quorum still held it.
    async fn release(&self) -> Result<bool> {
        // Owned: the requests may outlive this call (see `Leftovers`).
        let ids = Arc::new((self.keys.clone(), self.owner.clone(), self.place.clone()));
        let answers = on_nodes(
            &self.nodes,
            &self.leftovers,
            self.node_timeout,
            |mut con| {
                let ids = ids.clone();
                async move {
                    match &ids.2 {
                        Some(p) => fair::release_eval(&mut con, &ids.0, &ids.1, p, 0).await,
                        None => node::release_quiet_eval(&mut con, &ids.0, &ids.1).await,
                    }
                }
            },
            self.quorum,
            |held| *held,
        )
        .await;
        if answers
            .iter()
            .filter(|a| matches!(a, Some(Ok(true))))
            .count()
            >= self.quorum
        {
            return Ok(true);
        }
        // Not a quorum of "ours": every node answered, or timed out.
        let answers = waited(answers);
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum {
            let e = unavailable(
                &format!("release {}", self.keys.lock),
                &self.nodes,
                &answers,
                self.quorum,
            );
            // A node that did not answer in time may still run the delete
            // (a paused server runs it on waking): whether the lock went is
            // then unknown, not "it did not happen".
            return Err(
                if answers.iter().any(|a| matches!(a, Err(m) if !refused(m))) {
                    indeterminate(e)
                } else {
                    e
                },
            );
        }
        let ours = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        let unknown = answers
            .iter()
            .filter(|a| matches!(a, Err(m) if !refused(m)))
            .count();
        if ours < self.quorum && ours + unknown >= self.quorum {
            // The nodes that did not answer may have held it, and may still
            // run the delete: "was it ours?" has no answer.
            return Err(Error::indeterminate(
                BACKEND,
                format!("release {}", self.keys.lock),
                format!(
                    "{ours} nodes said ours, {unknown} did not answer in time; {} needed",
                    self.quorum
                ),
            ));
        }
        Ok(ours >= self.quorum)
    }

    /// Counts only with a quorum, inside the validity window.
    async fn renew(&self, lease: Duration) -> Result<bool> {
        let sent = Instant::now();
        let px = distlock::millis(lease);
        let (keys, owner) = (&self.keys, self.owner.as_str());
        let answers = on_all(&self.nodes, self.node_timeout, |mut con| async move {
            node::renew(&mut con, keys, owner, px).await
        })
        .await;
        let renewed = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if renewed < self.quorum && renewed + failed >= self.quorum {
            // The nodes that did not answer could still make a quorum: no
            // proof the lock is gone, so an error the watchdog retries
            // within the validity it still has (a definite "not ours"
            // ended a valid lock on one slow node).
            return Err(unavailable(
                &format!("renew {}", self.keys.lock),
                &self.nodes,
                &answers,
                self.quorum,
            ));
        }
        Ok(renewed >= self.quorum && sent.elapsed() + drift(lease) < lease)
    }
}

/// RedLock over N independent Redis masters. One handle may be shared by
/// many tasks: every acquisition writes its own owner value on the nodes,
/// so a task that loses a round and gives back what it got can never
/// delete what a sibling task of the same handle just won. Reentrancy goes
/// through [`Guard::reenter`].
pub struct RedLock {
    nodes: Arc<Vec<Node>>,
    leftovers: Leftovers,
    cfg: Arc<RedLockConfig>,
    queue: Queue,
}

/// This handle's side of the waiting queues (`redlock.fair`).
struct Queue {
    /// The client id in this handle's queue entries.
    client_id: String,
    /// Shared by every acquisition's place (no copy per lock cycle).
    wake_prefix: Arc<str>,
    /// `wake_prefix` + `client_id`: where this handle is woken.
    channel: String,
    wakes: Arc<Wakes>,
    /// Per master: subscribed to this handle's wake channel (from the
    /// first wait on; reconnections subscribe again by themselves).
    subscribed: Arc<Vec<AtomicBool>>,
    /// The first wait subscribes every master before it sleeps.
    first_wait: tokio::sync::OnceCell<()>,
    /// When masters that did not take the SUBSCRIBE were last asked again.
    /// A master down at the first wait was left without it for the
    /// handle's whole life (a probe: its wake-ups were missed, and with
    /// two other masters down every hand-over waited for the refresh).
    retried: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for RedLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLock")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A round a quorum granted after the validity had run out: the key is
/// free, the lease too short for how long the masters took.
fn too_late(key: &str, lease: Duration, took: Duration) -> Error {
    Error::backend(
        BACKEND,
        format!("acquire {key}"),
        format!(
            "a quorum granted the lock, but the round took {took:?}, past its validity ({:?} = lease {lease:?} - clock-drift allowance {:?}); take a longer lease",
            lease.saturating_sub(drift(lease)),
            drift(lease)
        ),
    )
}

enum Attempt {
    Won {
        token: u64,
        invoked_at: Instant,
    },
    Lost {
        unavailable: Option<Error>,
        round: LostRound,
        /// A release round was sent (a round trip more).
        released: bool,
        /// A quorum granted the lock, but after its validity had run out
        /// (lease - drift): the lease is too short for these round trips.
        late: Option<Duration>,
    },
}

impl RedLock {
    /// What `redlock` declares.
    pub const CAPABILITIES: Capabilities = Capabilities {
        // Per-node counters are no fencing token: a node restarted without
        // persistence forgets its counter (Kleppmann 2016).
        fencing: false,
        reentrant: true,
        // Waiters queue by the time they first asked (`redlock.fair`,
        // default on; `capabilities()` says what a handle was built with).
        fair: true,
        lost_signal: true,
        renewal: true,
        // The claim: losing a minority of nodes loses no lock.
        survives_failover: true,
        token_source: TokenSource::Unsafe,
    };

    /// Connects to every node in parallel. Nodes that are down now get a
    /// client that connects on first use, so they count again once they
    /// are back; fewer than a quorum reachable is an error naming them.
    ///
    /// # Errors
    /// [`Error::Config`] for bad settings; [`Error::Backend`] ("quorum
    /// unavailable: ...") when fewer than N/2+1 nodes can be reached.
    pub async fn connect(cfg: RedLockConfig) -> Result<Self> {
        cfg.validate()?;
        let client_id = fair::new_client_id();
        let wake_prefix: Arc<str> = fair::wake_prefix(&cfg.key_prefix).into();
        let queue = Queue {
            channel: format!("{wake_prefix}{client_id}"),
            client_id,
            wake_prefix,
            wakes: Arc::new(Wakes::new(cfg.quorum())),
            subscribed: Arc::new(cfg.urls.iter().map(|_| AtomicBool::new(false)).collect()),
            first_wait: tokio::sync::OnceCell::new(),
            retried: Mutex::new(None),
        };
        // Each node's push messages (the wake channel) go to the queue's
        // router. Without the queue too: a RESP3 connection with a push
        // channel learns of its server's death at once and reconnects in
        // the background, so the first request after a restart does not
        // fail on the dead socket (a release after every master restarted
        // answered "broken pipe" from all five, instead of "not held").
        let mut pushes = Vec::new();
        let opts = |lazy, pushes: &mut Vec<_>| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            pushes.push(rx);
            let push = Some(tx);
            ConnectOptions {
                connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
                op_timeout: Duration::from_millis(cfg.connect_timeout_ms),
                push,
                lazy,
                tls_ca: None,
            }
        };
        let first: Vec<_> = cfg
            .urls
            .iter()
            .map(|u| node::connect(BACKEND, u, opts(false, &mut pushes)))
            .collect();
        let tries = futures::future::join_all(first).await;
        let mut nodes = Vec::with_capacity(tries.len());
        let mut down = Vec::new();
        let up: Vec<bool> = tries.iter().map(Result::is_ok).collect();
        for (url, r) in cfg.urls.iter().zip(tries) {
            let con = match r {
                Ok(c) => c,
                Err(e @ Error::Config { .. }) => return Err(e),
                Err(e) => {
                    down.push(e.to_string());
                    let mut lazy = Vec::new();
                    let con = node::connect(BACKEND, url, opts(true, &mut lazy)).await?;
                    // The failed connection's pushes will never come.
                    if let (Some(slot), Some(rx)) = (pushes.get_mut(nodes.len()), lazy.pop()) {
                        *slot = rx;
                    }
                    con
                }
            };
            nodes.push(Node {
                shown: redact(url),
                con,
            });
        }
        same_server_twice(&nodes, &up, Duration::from_millis(cfg.connect_timeout_ms)).await?;
        if !down.is_empty() {
            // Within the spec (a minority may be down), but the run then
            // measures fewer masters than it names: say so.
            tracing::warn!(
                reachable = nodes.len() - down.len(),
                of = nodes.len(),
                quorum = cfg.quorum(),
                "RedLock starts with masters unreachable: {}",
                down.join("; ")
            );
        }
        if nodes.len() - down.len() < cfg.quorum() {
            return Err(Error::backend(
                BACKEND,
                "connecting",
                format!(
                    "quorum unavailable: {} of {} nodes reachable, {} needed; {}",
                    nodes.len() - down.len(),
                    nodes.len(),
                    cfg.quorum(),
                    down.join("; ")
                ),
            ));
        }
        for (i, rx) in pushes.into_iter().enumerate() {
            queue.wakes.listen(i, queue.channel.clone(), rx);
        }
        Ok(Self {
            nodes: Arc::new(nodes),
            leftovers: Leftovers::default(),
            cfg: Arc::new(cfg),
            queue,
        })
    }

    /// The Redis key holding the lock for `key` on every node.
    pub fn lock_key(&self, key: &str) -> String {
        Keys::new(&self.cfg.key_prefix, key).lock
    }

    /// The raw floor of one lock cycle: two rounds of PING sent to every
    /// node at once, each round over once a quorum has answered (as
    /// acquire and release are: the lock cannot beat this). Each round
    /// goes through what the lock's rounds go through: the same
    /// connections, [`on_nodes`] with the per-node deadline of a
    /// watchdog-lease acquisition, and the same leftovers.
    ///
    /// # Errors
    /// When fewer than a quorum of nodes answer.
    pub async fn floor_round_trip(&self) -> Result<()> {
        let quorum = self.cfg.quorum();
        let node_timeout = self
            .cfg
            .node_timeout(Duration::from_millis(self.cfg.watchdog_lease_ms));
        for _ in 0..2 {
            let answers = on_nodes(
                &self.nodes,
                &self.leftovers,
                node_timeout,
                |mut con| async move {
                    redis::cmd("PING")
                        .query_async::<redis::Value>(&mut con)
                        .await
                },
                quorum,
                |_| true,
            )
            .await;
            if answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count() < quorum {
                let answers = waited(answers);
                return Err(unavailable("PING", &self.nodes, &answers, quorum));
            }
        }
        Ok(())
    }

    fn held(&self, keys: &Keys, owner: &str, lease: Duration) -> RedLockHeld {
        RedLockHeld {
            nodes: self.nodes.clone(),
            leftovers: self.leftovers.clone(),
            keys: keys.clone(),
            owner: owner.to_string(),
            place: self
                .cfg
                .fair
                .then(|| Place::new(&self.queue.client_id, owner, &self.queue.wake_prefix)),
            quorum: self.cfg.quorum(),
            node_timeout: self.cfg.node_timeout(lease),
        }
    }

    /// One round of the algorithm: all nodes at once; on a lost round, give
    /// back whatever we got, everywhere at once.
    ///
    /// `maybe_ours` (one flag per node, kept across the rounds of one
    /// acquisition): a node where this acquisition's value may still be,
    /// because a release sent there earlier got no answer.
    async fn attempt(
        &self,
        held: &RedLockHeld,
        lease: Duration,
        waiter_ttl_ms: u64,
        maybe_ours: &mut [bool],
    ) -> Attempt {
        let keys = &held.keys;
        let quorum = self.cfg.quorum();
        let px = distlock::millis(lease);
        let invoked_at = Instant::now();
        // Owned: the requests may outlive this call (see `Leftovers`).
        let ids = Arc::new((keys.clone(), held.owner.clone(), held.place.clone()));
        let answers = on_nodes(
            &self.nodes,
            &self.leftovers,
            self.cfg.node_timeout(lease),
            |mut con| {
                let ids = ids.clone();
                async move {
                    match &ids.2 {
                        Some(p) => {
                            fair::acquire_eval(&mut con, &ids.0, &ids.1, px, p, waiter_ttl_ms).await
                        }
                        None => node::acquire_eval(&mut con, &ids.0, &ids.1, px).await,
                    }
                }
            },
            quorum,
            |r| matches!(r, Reply::Acquired { .. }),
        )
        .await;
        let elapsed = invoked_at.elapsed();
        let tokens: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(Reply::Acquired { token })) => Some(*token),
                _ => None,
            })
            .collect();
        if tokens.len() >= quorum && elapsed + drift(lease) < lease {
            return Attempt::Won {
                token: tokens.iter().copied().max().unwrap_or(0),
                invoked_at,
            };
        }
        // A lost round waited for every node (or its timeout), unless a
        // quorum answered too late for the validity.
        let answers = waited(answers);
        // Nodes that timed out are released too: their SET may have landed.
        // The original policy also releases where the node said "held by
        // another" (the spec: "even the instances it believed it was not
        // able to lock"); that answer is definite (the script's SET NX did
        // not happen), so the others skip those nodes unless an earlier
        // round's value of ours may still be there. Under contention most
        // lost rounds are "held" on every node: they then cost one round
        // trip and five scripts instead of two and ten.
        let release: Vec<bool> = answers
            .iter()
            .zip(maybe_ours.iter())
            .map(|(a, &mine)| {
                // A queued waiter keeps its place where it was told "held".
                (self.cfg.retry_policy == RetryPolicy::Uniform && held.place.is_none())
                    || mine
                    || !matches!(a, Ok(Reply::Held { .. }))
            })
            .collect();
        let released = release.iter().any(|r| *r);
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if released {
            // A queued waiter keeps its place where it gives back what it
            // got, but only after a round a quorum answered: a client
            // whose rounds no quorum answers in time (its node timeout
            // below its round trip, a stall) cannot use the key, and kept
            // as the head by its own late-landing requests it would stop
            // every other waiter for its whole wait budget. It re-joins
            // at the same place once its rounds are answered again.
            let keep = if answered >= quorum { waiter_ttl_ms } else { 0 };
            let outcomes = held.release_where(&release, keep).await;
            for ((mine, sent), outcome) in maybe_ours.iter_mut().zip(&release).zip(outcomes) {
                if *sent {
                    // Any answer means the compare-and-delete ran there.
                    *mine = !matches!(outcome, Some(Ok(_)));
                }
            }
        }
        // When a quorum of nodes will have let the holder's key expire.
        let mut pttls: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Held { pttl_ms }) => u64::try_from(*pttl_ms).ok(),
                _ => None,
            })
            .collect();
        pttls.sort_unstable();
        let round = LostRound {
            holder_expires_in: pttls
                .get(quorum.saturating_sub(1))
                .map(|ms| Duration::from_millis(*ms)),
        };
        Attempt::Lost {
            round,
            released,
            late: (tokens.len() >= quorum).then_some(elapsed),
            unavailable: (answered < quorum).then(|| {
                unavailable(
                    &format!("acquire {}", keys.lock),
                    &self.nodes,
                    &answers,
                    quorum,
                )
            }),
        }
    }

    /// Rounds until one is won or the wait budget runs out, with the
    /// Subscribes this handle to its wake channel on every master at once,
    /// on its first wait; true if this call sent the `SUBSCRIBE`s. Later
    /// waits ask the masters that did not take it again, in the
    /// background, at most once a second.
    async fn subscribe_wake(&self, lease: Duration) -> bool {
        let mut sent = false;
        let channel = &self.queue.channel;
        let limit = self.cfg.node_timeout(lease).max(Duration::from_millis(200));
        self.queue
            .first_wait
            .get_or_init(|| async {
                sent = true;
                subscribe_missing(&self.nodes, &self.queue.subscribed, channel, limit).await;
            })
            .await;
        if !sent {
            self.subscribe_missing_later(limit);
        }
        sent
    }

    /// Asks the masters without this handle's SUBSCRIBE again, in a task of
    /// its own, unless that was done less than a second ago.
    fn subscribe_missing_later(&self, limit: Duration) {
        if self
            .queue
            .subscribed
            .iter()
            .all(|s| s.load(Ordering::Acquire))
        {
            return;
        }
        if let Ok(mut at) = self.queue.retried.lock() {
            if at.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *at = Some(Instant::now());
        }
        let (nodes, flags) = (self.nodes.clone(), self.queue.subscribed.clone());
        let channel = self.queue.channel.clone();
        tokio::spawn(async move { subscribe_missing(&nodes, &flags, &channel, limit).await });
    }

    /// Rounds until one is won or the wait budget runs out: between them,
    /// queued, the wake-up of a quorum of releases or the refresh of our
    /// place; without the queue, the spec's random delay (drawn as
    /// `redlock.retry_policy` says, see [`RetryPolicy`]).
    async fn acquire_rounds(
        &self,
        key: &str,
        held: &Arc<RedLockHeld>,
        lease: Duration,
        mode: LeaseMode,
        opts: AcquireOptions,
    ) -> Result<Guard> {
        let start = Instant::now();
        let deadline = opts.wait.map(|w| distlock::deadline_after(start, w));
        let mut round_trips = 0;
        let mut backoff = Backoff::new(
            self.cfg.retry_policy,
            Duration::from_millis(self.cfg.retry_delay_ms),
            lease.saturating_sub(drift(lease)),
        );
        let mut maybe_ours = vec![false; self.nodes.len()];
        // Queued only when it may wait: a try-lock (or a wait of 0) must
        // not hold up the waiters. Registered before the first round once
        // this handle listens, so a turn announced between a round and the
        // sleep is kept (a permit).
        let queued = held.place.is_some() && opts.wait.is_some_and(|w| !w.is_zero());
        let waiter_ttl_ms = if queued { self.cfg.waiter_ttl_ms } else { 0 };
        let mut turn = (queued && self.queue.first_wait.initialized())
            .then(|| self.queue.wakes.await_turn(&held.owner));
        loop {
            round_trips += 1;
            if let Some(t) = &turn {
                t.reset();
            }
            let attempt = self
                .attempt(held, lease, waiter_ttl_ms, &mut maybe_ours)
                .await;
            let (unavailable, round) = match attempt {
                Attempt::Won { token, invoked_at } => {
                    return Ok(Guard::new(GuardParts {
                        key: key.to_string(),
                        token: Some(FencingToken(token)),
                        held: held.clone(),
                        lease: mode,
                        invoked_at,
                        round_trips,
                    }));
                }
                Attempt::Lost {
                    unavailable,
                    round,
                    released,
                    late,
                } => {
                    round_trips += u32::from(released);
                    (
                        unavailable.or_else(|| late.map(|took| too_late(key, lease, took))),
                        round,
                    )
                }
            };
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| now < *d) else {
                if queued {
                    // Leave the queues now: our place would otherwise hold
                    // up the waiter behind us until it expired.
                    if let Err(e) = held.release().await {
                        tracing::debug!(%key, error = %e, "leaving the queue failed; the place expires");
                    }
                }
                return Err(unavailable.unwrap_or(Error::Timeout {
                    key: key.to_string(),
                    waited: start.elapsed(),
                }));
            };
            if !queued {
                let nap = backoff.next(round).min(deadline - now);
                tokio::time::sleep(nap).await;
                continue;
            }
            let Some(t) = turn.as_ref() else {
                turn = Some(self.queue.wakes.await_turn(&held.owner));
                if self.subscribe_wake(lease).await {
                    round_trips += 1;
                }
                // Our turn may have been announced before we listened.
                continue;
            };
            self.subscribe_wake(lease).await;
            // Woken by a quorum of releases; else we refresh our place
            // every third of its TTL, and a holder that dies (announcing
            // nothing) is followed once a quorum has let its key expire.
            let mut nap = Duration::from_millis(self.cfg.waiter_ttl_ms / 3)
                .mul_f64(rand::random_range(0.8..1.0))
                .min(deadline - now);
            if let Some(expires) = round.holder_expires_in {
                nap = nap.min(expires);
            }
            if unavailable.is_some() {
                // A quorum did not answer: no quorum will wake us either.
                nap = nap.min(backoff.next(round));
            }
            tokio::select! {
                () = t.notify.notified() => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }
}

#[async_trait]
impl DistLock for RedLock {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: self.cfg.fair,
            ..Self::CAPABILITIES
        }
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        distlock::check_request(BACKEND, key, &opts)?;
        let keys = Keys::new(&self.cfg.key_prefix, key);
        let (lease, mode) = LeaseMode::for_request(
            opts.lease,
            Duration::from_millis(self.cfg.watchdog_lease_ms),
        );
        // This acquisition's own owner value on every node.
        let held = Arc::new(self.held(&keys, &node::new_owner(), lease));
        // Cancelled mid-round, the SETs already sent may land: give them back.
        let pending = Pending::new(key, held.clone());
        let r = self.acquire_rounds(key, &held, lease, mode, opts).await;
        pending.settle(&r);
        r
    }
}
