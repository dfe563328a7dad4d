//! `zookeeper`: Curator's InterProcessMutex recipe, written by us on the
//! `zookeeper-client` crate.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    drift, AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts,
    HeldLock, LeaseHandle, LeaseMode, LostReason, Pending, Result, TokenSource,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;

const BACKEND: &str = "zookeeper";

/// The part of a lock node's name before its sequence number, as in
/// Curator (`_c_<uuid>-lock-0000000042`).
const LOCK_NAME: &str = "-lock-";

const EPHEMERAL_SEQUENTIAL: zk::CreateOptions<'static> =
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
/// Lock directories are containers: the server deletes them once their
/// last lock node is gone, so one-off keys leave nothing behind.
const CONTAINER: zk::CreateOptions<'static> =
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
const PERSISTENT: zk::CreateOptions<'static> =
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());

/// Whether `e` says the request's fate is unknown: the connection broke
/// (the crate reports a connection that stopped answering as a custom
/// error, not `ConnectionLoss`) rather than the server answering.
fn lost_connection(e: &zk::Error) -> bool {
    use zk::Error as E;
    !matches!(
        e,
        E::NoNode
            | E::NodeExists
            | E::BadVersion
            | E::NotEmpty
            | E::NoAuth
            | E::InvalidAcl
            | E::NoChildrenForEphemerals
            | E::BadArguments(_)
            | E::SessionExpired
            | E::SessionMoved
            | E::ClientClosed
            | E::AuthFailed
    )
}

/// A ZooKeeper error as ours; a lost connection leaves the request's
/// outcome unknown.
fn zk_err(context: impl Into<String>, e: zk::Error) -> Error {
    if lost_connection(&e) {
        Error::indeterminate(BACKEND, context, e)
    } else {
        Error::backend(BACKEND, context, e)
    }
}

/// Runs one request under `limit`. The outer error is our deadline (the
/// outcome is unknown); the inner result is ZooKeeper's answer, left for
/// the caller to interpret (`NoNode` is often an answer, not a failure).
async fn timed<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = std::result::Result<T, zk::Error>>,
) -> Result<std::result::Result<T, zk::Error>> {
    tokio::time::timeout(limit, fut).await.map_err(|_| {
        Error::indeterminate(
            BACKEND,
            what.to_string(),
            format!("no reply within {limit:?}"),
        )
    })
}

/// The node name for a lock key: the key itself where it is a safe node
/// name, `%XX` for every other byte (`/` would make a path). Injective, so
/// two keys never share a lock directory.
pub fn node_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() {
        // An empty name is no node; `%` alone is no encoded key.
        out.push('%');
    }
    out
}

/// The sequence number of a lock node name, `None` for a foreign node.
fn sequence_of(child: &str) -> Option<i64> {
    let (_, seq) = child.rsplit_once(LOCK_NAME)?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// Waits until the session is connected again, up to `until`.
async fn await_connected(client: &zk::Client, until: Instant) -> Result<()> {
    // Created first, so a change between the check and the wait is seen.
    let mut states = client.state_watcher();
    loop {
        match client.state() {
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => return Ok(()),
            s if s.is_terminated() => {
                return Err(Error::backend(
                    BACKEND,
                    "waiting for the connection",
                    format!("session {s}"),
                ))
            }
            _ => {}
        }
        if tokio::time::timeout_at(until, states.changed())
            .await
            .is_err()
        {
            return Err(Error::indeterminate(
                BACKEND,
                "waiting for the connection",
                "still disconnected",
            ));
        }
    }
}

/// Deletes one acquisition's lock node: `path` if we know it, else the
/// child of `dir` named with the acquisition's unique `prefix` (Curator's
/// protected mode: the create's reply was never seen). Retries through
/// connection trouble until the node is gone or the session has ended
/// (which deletes an ephemeral node too): a node left behind would block
/// every later waiter for as long as the session lives. `Ok(true)` if this
/// call deleted it.
///
/// The prefix holds a GUID drawn for this acquisition alone, so the search
/// can never pick a node of another acquisition, even one of a sibling
/// task on the same session.
async fn withdraw(
    client: &zk::Client,
    dir: &str,
    prefix: &str,
    mut path: Option<String>,
    op: Duration,
) -> Result<bool> {
    // Bounded even if the server keeps failing us while the session lives.
    let give_up = Instant::now() + (client.session_timeout() * 10).max(Duration::from_secs(30));
    // Searching by GUID: look again after each delete, until none is left
    // (one create per attempt; a retried create could, in principle, leave
    // two).
    let search = path.is_none();
    let mut deleted = false;
    loop {
        if client.state().is_terminated() {
            return Ok(deleted);
        }
        let target = match path.clone() {
            Some(p) => Some(p),
            None => match tokio::time::timeout(op, client.list_children(dir)).await {
                Ok(Ok(children)) => match children.into_iter().find(|c| c.starts_with(prefix)) {
                    Some(c) => Some(format!("{dir}/{c}")),
                    // The create never happened (or was already undone).
                    None => return Ok(deleted),
                },
                Ok(Err(zk::Error::NoNode)) => return Ok(deleted),
                Ok(Err(e)) if !lost_connection(&e) => {
                    return match e {
                        zk::Error::SessionExpired | zk::Error::ClientClosed => Ok(deleted),
                        e => Err(zk_err(format!("getChildren {dir}"), e)),
                    }
                }
                _ => None,
            },
        };
        if let Some(p) = target {
            match tokio::time::timeout(op, client.delete(&p, None)).await {
                Ok(Ok(())) if search => {
                    deleted = true;
                    path = None;
                    continue;
                }
                Ok(Ok(())) => return Ok(true),
                Ok(Err(zk::Error::NoNode)) if search => {
                    path = None;
                    continue;
                }
                Ok(Err(zk::Error::NoNode)) => return Ok(deleted),
                Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => return Ok(deleted),
                Ok(Err(e)) if !lost_connection(&e) => return Err(zk_err(format!("delete {p}"), e)),
                r => {
                    tracing::debug!(path = %p, result = ?r.map(|r| r.err()), "delete failed, retrying");
                }
            }
            path = Some(p);
        }
        if Instant::now() >= give_up {
            return Err(Error::indeterminate(
                BACKEND,
                format!("deleting our lock node in {dir}"),
                "the server kept failing while the session lived",
            ));
        }
        let _ = await_connected(client, Instant::now() + op).await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(20..60))).await;
    }
}

/// [`withdraw`] in the background, for a path we know.
fn withdraw_in_background(client: zk::Client, path: String, op: Duration) {
    tokio::spawn(async move {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", &path));
        if let Err(e) = withdraw(&client, dir, name, Some(path.clone()), op).await {
            tracing::warn!(%path, error = %e, "background delete of our lock node failed");
        }
    });
}

/// One acquisition's lock node while the acquire runs, from before its
/// create is sent until the acquire returns: what [`Pending`] deletes in
/// the background if the acquire is dropped (cancelled) or fails with an
/// outcome the server may not share.
struct QueuedNode {
    client: zk::Client,
    dir: String,
    /// `_c_<guid>-lock-`: the GUID is drawn for this acquisition alone.
    name_prefix: String,
    op: Duration,
    /// Whether a create may have been sent.
    sent: AtomicBool,
    /// Our node's path, once a create reply (or the protected-mode search)
    /// named it.
    path: Mutex<Option<String>>,
}

impl QueuedNode {
    fn new(client: zk::Client, dir: String, op: Duration) -> Self {
        Self {
            client,
            dir,
            // 128 random bits, as Curator's UUID: unique per acquisition,
            // so two tasks of one session never mistake each other's node.
            name_prefix: format!("_c_{:032x}{LOCK_NAME}", rand::random::<u128>()),
            op,
            sent: AtomicBool::new(false),
            path: Mutex::new(None),
        }
    }

    fn set_path(&self, path: &str) {
        if let Ok(mut p) = self.path.lock() {
            *p = Some(path.to_string());
        }
    }
}

impl std::fmt::Debug for QueuedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedNode")
            .field("dir", &self.dir)
            .field("name_prefix", &self.name_prefix)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for QueuedNode {
    async fn release(&self) -> Result<bool> {
        if !self.sent.load(Ordering::Acquire) {
            return Ok(false);
        }
        let path = self.path.lock().ok().and_then(|p| p.clone());
        withdraw(&self.client, &self.dir, &self.name_prefix, path, self.op).await
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        Ok(false)
    }
}

/// ZooKeeper's lock recipe: an EPHEMERAL_SEQUENTIAL node under
/// `<root>/<key>/` (a container); the lowest sequence holds the lock;
/// every other waiter watches only its predecessor (no herd effect).
///
/// One `ZkLock` is one ZooKeeper session, shared by every task that uses
/// the handle. Every acquire is its own owner: its own node, named
/// `_c_<guid>-lock-<seq>` with a GUID drawn for that acquisition, so two
/// tasks of one handle queue and exclude each other exactly as two
/// clients do, and a create whose reply was lost is found again by that
/// GUID (Curator's protected mode) without ever adopting a sibling's node.
/// Reentrancy is explicit ([`Guard::reenter`]).
///
/// An acquire that is dropped (cancelled) or fails after sending deletes
/// its node in the background, as Curator does in `finally`: a queued node
/// would otherwise block everybody behind it for as long as the session.
///
/// The lock lives with the session: there is no lease, so a fixed lease is
/// refused ([`Error::Unsupported`]) and no watchdog runs.
/// [`Guard::valid_until`] is a bound: the send time of the last request the
/// server answered + the session timeout - drift, moved forward by a check
/// every third of the session timeout; the server cannot expire the
/// session earlier. When it passes without contact (disconnected, server
/// unreachable) [`Guard::lost`] fires: the server may hand the lock over
/// from then on, well before the client would declare the session expired
/// (1.4 x the timeout). After an expiry the next acquire opens a new
/// session.
///
/// An uncontended acquire is ONE round trip: ZooKeeper answers a session's
/// requests in order, so the children read is sent right behind the create
/// without waiting for its reply, and sees our node. The release is one
/// more (delete). The fencing token is the lock node's czxid.
pub struct ZkLock {
    cfg: Arc<ZkConfig>,
    client: Mutex<zk::Client>,
    reconnecting: tokio::sync::Mutex<()>,
    wakeups: Arc<AtomicU64>,
}

impl std::fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLock")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Opens a session, failing fast naming the endpoint.
async fn open(cfg: &ZkConfig) -> Result<zk::Client> {
    let what = || format!("connecting to {}", cfg.connect);
    // fail_eagerly: give up once every host has refused, instead of
    // cycling through them for a whole session timeout.
    let fut = zk::Client::connector()
        .with_session_timeout(cfg.session_timeout())
        .with_fail_eagerly()
        .connect(&cfg.connect);
    match tokio::time::timeout(cfg.connect_timeout(), fut).await {
        Ok(Ok(c)) => {
            keep_nodelay(&c, &cfg.connect);
            Ok(c)
        }
        Ok(Err(e)) => Err(Error::backend(BACKEND, what(), e)),
        Err(_) => Err(Error::backend(
            BACKEND,
            what(),
            format!("no session within {:?}", cfg.connect_timeout()),
        )),
    }
}

/// Sets `TCP_NODELAY` on the session's socket now and after every
/// reconnection (see [`crate::nodelay`] for why).
fn keep_nodelay(client: &zk::Client, connect: &str) {
    let to = crate::nodelay::endpoints(connect);
    if to.is_empty() {
        return;
    }
    let n = crate::nodelay::apply(&to);
    tracing::debug!(sockets = n, "TCP_NODELAY set");
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            match states.changed().await {
                s if s.is_terminated() => return,
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    crate::nodelay::apply(&to);
                }
                _ => {}
            }
        }
    });
}

impl ZkLock {
    /// What `zookeeper` declares. Fair: waiters queue by sequence number.
    /// Reentrant through [`Guard::reenter`] only (an acquire through the
    /// handle is always a new owner). Survives failover: the lock node is
    /// replicated by the quorum, and the session moves to another server.
    /// No renewal: the lock lives as long as the session. Fencing: the
    /// czxid is in the transaction log, so it survives restarts.
    pub const CAPABILITIES: Capabilities = Capabilities {
        fencing: true,
        reentrant: true,
        fair: true,
        lost_signal: true,
        renewal: false,
        survives_failover: true,
        token_source: TokenSource::Czxid,
    };

    /// Opens a session and creates the root node.
    ///
    /// # Errors
    /// Bad config (naming the key), or an unreachable ensemble (naming
    /// the connect string).
    pub async fn connect(cfg: ZkConfig) -> Result<Self> {
        cfg.validate()?;
        let client = open(&cfg).await?;
        match timed(
            cfg.op_timeout(),
            "mkdir",
            client.mkdir(&cfg.root, &PERSISTENT),
        )
        .await?
        {
            Ok(()) => {}
            Err(e) => {
                return Err(zk_err(
                    format!("creating {} on {}", cfg.root, cfg.connect),
                    e,
                ))
            }
        }
        Ok(Self {
            cfg: Arc::new(cfg),
            client: Mutex::new(client),
            reconnecting: tokio::sync::Mutex::new(()),
            wakeups: Arc::default(),
        })
    }

    /// The directory of `key`'s lock nodes.
    pub fn lock_dir(&self, key: &str) -> String {
        format!("{}/{}", self.cfg.root, node_name(key))
    }

    /// How many watch notifications woke a waiter of this handle so far.
    /// Without a herd effect each release wakes exactly one waiter.
    pub fn watch_wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// The current session's id (for fault injection and tests).
    ///
    /// # Errors
    /// Never in practice (a poisoned lock).
    pub fn session_id(&self) -> Result<i64> {
        Ok(self.current()?.session_id().0)
    }

    fn current(&self) -> Result<zk::Client> {
        self.client
            .lock()
            .map(|c| c.clone())
            .map_err(|_| Error::backend(BACKEND, "session", "session lock poisoned"))
    }

    /// The session, replaced by a new one if it has ended (expired,
    /// closed): Curator does the same after an expiry.
    async fn session(&self) -> Result<zk::Client> {
        let c = self.current()?;
        if !c.state().is_terminated() {
            return Ok(c);
        }
        let _one = self.reconnecting.lock().await;
        let c = self.current()?;
        if !c.state().is_terminated() {
            return Ok(c);
        }
        tracing::warn!(connect = %self.cfg.connect, state = %c.state(), "session ended; opening a new one");
        let fresh = open(&self.cfg).await?;
        if let Ok(mut slot) = self.client.lock() {
            *slot = fresh.clone();
        }
        Ok(fresh)
    }

    /// Creates the container directory of a key (and the root, should an
    /// operator have deleted it).
    async fn make_dir(&self, client: &zk::Client, dir: &str, rt: &mut u32) -> Result<()> {
        let op = self.cfg.op_timeout();
        for _ in 0..2 {
            *rt += 1;
            match timed(op, "create lock dir", client.create(dir, &[], &CONTAINER)).await? {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    *rt += 1;
                    let root = &self.cfg.root;
                    timed(op, "mkdir", client.mkdir(root, &PERSISTENT))
                        .await?
                        .map_err(|e| zk_err(format!("creating {root}"), e))?;
                }
                Err(e) => return Err(zk_err(format!("creating {dir}"), e)),
            }
        }
        Err(Error::backend(
            BACKEND,
            format!("creating {dir}"),
            "its parent keeps vanishing",
        ))
    }

    /// Creates this acquisition's lock node with the children read
    /// pipelined behind it. Returns our node's name, its czxid, and the
    /// children if the read got through. On an error the node may exist:
    /// the caller's [`Pending`] deletes it.
    async fn enqueue(
        &self,
        node: &QueuedNode,
        rt: &mut u32,
        contact: &mut Instant,
    ) -> Result<(String, i64, Option<Vec<String>>)> {
        let op = self.cfg.op_timeout();
        let (client, dir, name_prefix) = (&node.client, node.dir.as_str(), &node.name_prefix);
        let prefix = format!("{dir}/{name_prefix}");
        let mut made_dir = false;
        loop {
            let sent = Instant::now();
            // Before the request exists: a cancellation from here on must
            // look for our node.
            node.sent.store(true, Ordering::Release);
            // Both requests are written to the session when the futures are
            // created, in this order; the server answers them in order.
            let create = client.create(&prefix, &[], &EPHEMERAL_SEQUENTIAL);
            let list = client.list_children(dir);
            *rt += 1;
            let replies = tokio::time::timeout(op, async { tokio::join!(create, list) }).await;
            let Ok((created, listed)) = replies else {
                // The create may have happened: Pending cleans up.
                return Err(Error::indeterminate(
                    BACKEND,
                    format!("create {prefix}"),
                    format!("no reply within {op:?}"),
                ));
            };
            match created {
                Ok((stat, seq)) => {
                    *contact = sent;
                    let name = format!("{name_prefix}{seq}");
                    node.set_path(&format!("{dir}/{name}"));
                    return Ok((name, stat.czxid, listed.ok()));
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    self.make_dir(client, dir, rt).await?;
                }
                Err(e) if lost_connection(&e) => {
                    // Curator's protected mode: the create may have
                    // happened; find it by this acquisition's GUID.
                    await_connected(client, Instant::now() + op).await?;
                    if let Some((name, czxid)) =
                        self.find_mine(client, dir, name_prefix, rt).await?
                    {
                        node.set_path(&format!("{dir}/{name}"));
                        return Ok((name, czxid, None));
                    }
                }
                Err(e) => return Err(zk_err(format!("create {prefix}"), e)),
            }
        }
    }

    /// Our node in `dir`, by its unique name prefix, with its czxid.
    async fn find_mine(
        &self,
        client: &zk::Client,
        dir: &str,
        name_prefix: &str,
        rt: &mut u32,
    ) -> Result<Option<(String, i64)>> {
        let op = self.cfg.op_timeout();
        *rt += 1;
        let children = match timed(op, "getChildren", client.list_children(dir)).await? {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_err(format!("getChildren {dir}"), e)),
        };
        let Some(name) = children.into_iter().find(|c| c.starts_with(name_prefix)) else {
            return Ok(None);
        };
        *rt += 1;
        match timed(op, "exists", client.check_stat(&format!("{dir}/{name}"))).await? {
            Ok(Some(stat)) => Ok(Some((name, stat.czxid))),
            Ok(None) => Ok(None),
            Err(e) => Err(zk_err(format!("exists {dir}/{name}"), e)),
        }
    }

    /// Waits until our node is the lowest, watching only our predecessor.
    /// `Err(None)` when the wait budget ran out.
    #[allow(clippy::too_many_arguments)]
    async fn wait_turn(
        &self,
        client: &zk::Client,
        dir: &str,
        mine: &str,
        mut children: Option<Vec<String>>,
        deadline: Option<Instant>,
        rt: &mut u32,
        contact: &mut Instant,
    ) -> std::result::Result<(), Option<Error>> {
        let op = self.cfg.op_timeout();
        loop {
            let kids = match children.take() {
                Some(k) => k,
                None => {
                    *rt += 1;
                    let sent = Instant::now();
                    match timed(op, "getChildren", client.list_children(dir)).await? {
                        Ok(k) => {
                            *contact = sent;
                            k
                        }
                        Err(e) if lost_connection(&e) => {
                            let until = deadline.unwrap_or(Instant::now()).max(Instant::now() + op);
                            await_connected(client, until).await?;
                            continue;
                        }
                        Err(e) => return Err(Some(zk_err(format!("getChildren {dir}"), e))),
                    }
                }
            };
            let mut queue: Vec<(i64, String)> = kids
                .into_iter()
                .filter_map(|c| sequence_of(&c).map(|s| (s, c)))
                .collect();
            queue.sort_unstable();
            let Some(pos) = queue.iter().position(|(_, c)| c == mine) else {
                return Err(Some(Error::backend(
                    BACKEND,
                    format!("waiting in {dir}"),
                    "our lock node vanished (session expired or node deleted)",
                )));
            };
            if pos == 0 {
                return Ok(());
            }
            let Some(deadline) = deadline else {
                return Err(None);
            };
            if Instant::now() >= deadline {
                return Err(None);
            }
            let predecessor = format!("{dir}/{}", queue[pos - 1].1);
            *rt += 1;
            match timed(
                op,
                "getData + watch",
                client.get_and_watch_data(&predecessor),
            )
            .await?
            {
                Ok((_, _, watcher)) => {
                    let Ok(event) = tokio::time::timeout_at(deadline, watcher.changed()).await
                    else {
                        return Err(None);
                    };
                    self.wakeups.fetch_add(1, Ordering::Relaxed);
                    if event.event_type == zk::EventType::Session
                        && event.session_state.is_terminated()
                    {
                        return Err(Some(Error::backend(
                            BACKEND,
                            format!("waiting in {dir}"),
                            format!("session {}", event.session_state),
                        )));
                    }
                }
                // Gone before we could watch it: look again.
                Err(zk::Error::NoNode) => {}
                Err(e) if lost_connection(&e) => {
                    await_connected(client, deadline.max(Instant::now() + op)).await?;
                }
                Err(e) => return Err(Some(zk_err(format!("getData {predecessor}"), e))),
            }
        }
    }

    /// The raw floor: create + delete of an ephemeral-sequential node on
    /// this handle's session: two round trips, like one lock cycle.
    ///
    /// # Errors
    /// As any request.
    pub async fn floor_round_trip(&self) -> Result<()> {
        let client = self.session().await?;
        let op = self.cfg.op_timeout();
        let dir = self.lock_dir("lockbench:floor");
        let prefix = format!("{dir}/n-");
        let mut rt = 0;
        let mut made_dir = false;
        loop {
            match timed(
                op,
                "create",
                client.create(&prefix, &[], &EPHEMERAL_SEQUENTIAL),
            )
            .await?
            {
                Ok((_, seq)) => {
                    return timed(op, "delete", client.delete(&format!("{prefix}{seq}"), None))
                        .await?
                        .map_err(|e| zk_err("delete", e));
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    self.make_dir(&client, &dir, &mut rt).await?;
                }
                Err(e) => return Err(zk_err(format!("create {prefix}"), e)),
            }
        }
    }

    /// One acquire + release of `key` with the `zookeeper-client` crate's
    /// own lock recipe (`Client::lock` with Curator's prefix), on this
    /// handle's session: the peer the latency workload times next to ours.
    ///
    /// # Errors
    /// As any request.
    pub async fn crate_recipe_cycle(&self, key: &str) -> Result<()> {
        let client = self.session().await?;
        let op = self.cfg.op_timeout();
        let dir = self.lock_dir(key);
        let prefix = zk::LockPrefix::new_curator(&dir, "lock-")
            .map_err(|e| Error::backend("zookeeper-client", "lock prefix", e))?;
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(CONTAINER)
            .map_err(|e| Error::backend("zookeeper-client", "lock options", e))?;
        let lock = tokio::time::timeout(op, client.lock(prefix, b"", options))
            .await
            .map_err(|_| {
                Error::indeterminate("zookeeper-client", "lock", format!("not within {op:?}"))
            })?
            .map_err(|e| zk_err("zookeeper-client lock", e))?;
        let path = lock.lock_path().to_string();
        // Its guard deletes in the background on drop; delete here and
        // wait, as our release does, so both cycles end released. The
        // guard is then forgotten (leaking its path string) so it does
        // not send a second delete.
        let r = timed(op, "delete", client.delete(&path, None)).await;
        std::mem::forget(lock);
        r?.map_err(|e| zk_err("zookeeper-client unlock", e))
    }
}

#[async_trait]
impl DistLock for ZkLock {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    async fn acquire(&self, key: &str, opts: AcquireOptions) -> Result<Guard> {
        if opts.lease.is_some() {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "fixed leases (a ZooKeeper lock lives as long as its session)".into(),
            });
        }
        let client = self.session().await?;
        let invoked_at = Instant::now();
        let node = Arc::new(QueuedNode::new(
            client,
            self.lock_dir(key),
            self.cfg.op_timeout(),
        ));
        // Armed before the create goes out: if this future is dropped at
        // any later await (before the create's reply, while watching the
        // predecessor), the node is deleted in the background.
        let pending = Pending::new(key, node.clone());
        let result = self.take_turn(key, &node, opts.wait, invoked_at).await;
        pending.settle(&result);
        result
    }
}

impl ZkLock {
    /// The recipe proper, for one acquisition's node.
    async fn take_turn(
        &self,
        key: &str,
        node: &QueuedNode,
        wait: Option<Duration>,
        invoked_at: Instant,
    ) -> Result<Guard> {
        let op = self.cfg.op_timeout();
        let client = &node.client;
        let deadline = wait.map(|w| invoked_at + w);
        let mut rt = 0;
        let mut contact = invoked_at;
        let (mine, czxid, children) = self.enqueue(node, &mut rt, &mut contact).await?;
        let path = format!("{}/{mine}", node.dir);
        let waited = self
            .wait_turn(
                client,
                &node.dir,
                &mine,
                children,
                deadline,
                &mut rt,
                &mut contact,
            )
            .await;
        match waited {
            Ok(()) => {}
            Err(None) => {
                // Giving up: our node must go before we say "not acquired"
                // (a try-lock's caller may try again at once, or another
                // client may), or it would block everybody behind it for
                // as long as our session lives. A Timeout disarms Pending,
                // so a failed delete goes on in the background here.
                match timed(op, "delete", client.delete(&path, None)).await {
                    Ok(Ok(())) | Ok(Err(zk::Error::NoNode)) => {}
                    _ => withdraw_in_background(client.clone(), path, op),
                }
                return Err(Error::Timeout {
                    key: key.to_string(),
                    waited: invoked_at.elapsed(),
                });
            }
            // Pending deletes our node, if it is still there.
            Err(Some(e)) => return Err(e),
        }
        let held = Arc::new(ZkHeld {
            client: client.clone(),
            path: path.clone(),
            op,
            keeper: Mutex::new(None),
        });
        let guard = Guard::new(GuardParts {
            key: key.to_string(),
            token: u64::try_from(czxid).ok().map(FencingToken),
            held: held.clone(),
            lease: LeaseMode::Managed,
            invoked_at,
            round_trips: rt,
        });
        let session = client.session_timeout();
        let lease = guard.lease_handle();
        let valid_until = contact + session.saturating_sub(drift(session));
        lease.set_valid_until(valid_until);
        let task = tokio::spawn(keep(client.clone(), path, lease, session, op, valid_until));
        if let Ok(mut k) = held.keeper.lock() {
            *k = Some(task);
        }
        Ok(guard)
    }
}

/// A held lock node.
struct ZkHeld {
    client: zk::Client,
    path: String,
    op: Duration,
    keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for ZkHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkHeld")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for ZkHeld {
    async fn release(&self) -> Result<bool> {
        if let Ok(mut k) = self.keeper.lock() {
            if let Some(t) = k.take() {
                t.abort();
            }
        }
        let what = || format!("delete {}", self.path);
        let mut retried = false;
        loop {
            match timed(self.op, "delete", self.client.delete(&self.path, None)).await {
                Ok(Ok(())) => return Ok(true),
                // With our session alive, only our own earlier delete (whose
                // reply was lost) or an operator removes our node.
                Ok(Err(zk::Error::NoNode)) => return Ok(retried),
                // The ephemeral node went with the session.
                Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => return Ok(false),
                Ok(Err(e)) if lost_connection(&e) && !retried => {
                    retried = true;
                    if let Err(e) = await_connected(&self.client, Instant::now() + self.op).await {
                        // The session ended while we waited: so did the node.
                        if self.client.state().is_terminated() {
                            return Ok(false);
                        }
                        withdraw_in_background(self.client.clone(), self.path.clone(), self.op);
                        return Err(e);
                    }
                }
                Ok(Err(e)) => {
                    withdraw_in_background(self.client.clone(), self.path.clone(), self.op);
                    return Err(zk_err(what(), e));
                }
                Err(e) => {
                    withdraw_in_background(self.client.clone(), self.path.clone(), self.op);
                    return Err(e);
                }
            }
        }
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "lease renewal (a ZooKeeper lock lives as long as its session)".into(),
        })
    }
}

/// The heartbeat in flight: when it was sent, and the server's answer.
type Check = Pin<
    Box<
        dyn Future<
                Output = (
                    Instant,
                    std::result::Result<
                        std::result::Result<Option<zk::Stat>, zk::Error>,
                        tokio::time::error::Elapsed,
                    >,
                ),
            > + Send,
    >,
>;

/// Resolves with the check's outcome, or never if none is in flight.
async fn in_flight(check: &mut Option<Check>) -> <Check as Future>::Output {
    match check.as_mut() {
        Some(c) => c.await,
        None => std::future::pending().await,
    }
}

/// Keeps the guard honest while the lock is held. Every third of the
/// session timeout an `exists` on our node moves `valid_until` to that
/// request's send time + the session timeout - drift: the server heard
/// from us no earlier than that send, and expires a session no sooner than
/// the session timeout after it last heard from it. When `valid_until`
/// passes without such an answer (disconnected, server unreachable or
/// stalled) `lost()` fires at once: from then on the server may have
/// expired the session and handed the lock over, long before the client
/// would declare the session expired itself (1.4 x the timeout). An
/// expired or closed session, or our node gone while the session lives,
/// fires `lost()` too.
async fn keep(
    client: zk::Client,
    path: String,
    lease: LeaseHandle,
    session: Duration,
    op: Duration,
    mut valid_until: Instant,
) {
    let every = session / 3;
    // After a failed check, try again soon: each answer moves the bound.
    let retry = (every / 4).max(Duration::from_millis(20));
    let vouch = session.saturating_sub(drift(session));
    let owner = client.session_id().0;
    let mut states = client.state_watcher();
    let mut next = Instant::now() + every;
    let mut check: Option<Check> = None;
    loop {
        tokio::select! {
            s = states.changed() => {
                if s.is_terminated() {
                    tracing::warn!(%path, state = %s, "session ended: lock lost");
                    lease.mark_lost(LostReason::SessionEnded);
                    return;
                }
                if s == zk::SessionState::Disconnected {
                    tracing::warn!(%path, "disconnected: the lock is lost at valid_until unless the session reconnects first");
                } else {
                    // Reconnected: vouch again at once.
                    next = Instant::now();
                }
            }
            _ = tokio::time::sleep_until(valid_until) => {
                tracing::warn!(%path, ?session, "no answer from the server for the session timeout: the session may have expired, lock lost");
                lease.mark_lost(LostReason::RenewalFailed);
                return;
            }
            _ = tokio::time::sleep_until(next), if check.is_none() => {
                let (c, p) = (client.clone(), path.clone());
                check = Some(Box::pin(async move {
                    let sent = Instant::now();
                    (sent, tokio::time::timeout(op, c.check_stat(&p)).await)
                }));
            }
            (sent, r) = in_flight(&mut check) => {
                check = None;
                next = Instant::now() + every;
                match r {
                    Ok(Ok(Some(stat))) if stat.ephemeral_owner == owner => {
                        valid_until = valid_until.max(sent + vouch);
                        lease.set_valid_until(valid_until);
                    }
                    Ok(Ok(_)) => {
                        tracing::warn!(%path, "our lock node is gone while the session lives");
                        lease.mark_lost(LostReason::NotOwner);
                        return;
                    }
                    Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                        lease.mark_lost(LostReason::SessionEnded);
                        return;
                    }
                    // Connection trouble: the last bound stands.
                    _ => next = Instant::now() + retry,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_safe_and_injective() {
        assert_eq!(node_name("coupon:42"), "coupon:42");
        assert_eq!(node_name("a/b"), "a%2Fb");
        assert_eq!(node_name("."), "%2E");
        assert_eq!(node_name(".."), "%2E%2E");
        assert_eq!(node_name(""), "%");
        assert_ne!(node_name("a%2Fb"), node_name("a/b"));
    }

    #[test]
    fn sequences_parse_only_lock_nodes() {
        assert_eq!(sequence_of("_c_ab-0-lock-0000000042"), Some(42));
        assert_eq!(sequence_of("_c_ab-0-lock-"), None);
        assert_eq!(sequence_of("foreign"), None);
        assert_eq!(sequence_of("x-lock-12a"), None);
    }
}
