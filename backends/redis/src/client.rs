//! The connection the Redis locks talk through, for the three ways teams
//! deploy Redis: one server, a primary behind Sentinel, a Redis Cluster.
//!
//! The lock algorithm is the same on all three; only where a request goes
//! differs. Sentinel: to the primary the sentinels name, found again when
//! the old one refuses writes or stops answering. Cluster: to the master of
//! the key's slot, following `MOVED` and `ASK` (the `redis` crate's cluster
//! client; every key of one lock shares a hash tag, so each script runs on
//! one slot).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, PushInfo, PushKind, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

use crate::config::{redact, Deployment};
use crate::node::{self, ConnectOptions};

/// A connection to wherever the lock's keys live. Cheap to clone; clones
/// share the underlying connections.
#[derive(Clone)]
pub(crate) enum Con {
    /// One server (auto-reconnecting).
    Single(ConnectionManager),
    /// The primary the sentinels name.
    Sentinel(SentinelCon),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Con {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Con::Single(c) => c.req_packed_command(cmd),
            Con::Sentinel(c) => c.req_packed_command(cmd),
            Con::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Con::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Con::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            Con::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Single(c) => c.get_db(),
            Con::Sentinel(c) => c.current().con.get_db(),
            Con::Cluster(c) => c.get_db(),
        }
    }
}

impl Con {
    /// Connects to `deployment`, failing within about twice the connect
    /// timeout with the endpoint named.
    ///
    /// # Errors
    /// [`Error::Config`] for an unparsable address or a master name the
    /// sentinels do not know; [`Error::Backend`] naming the endpoint when
    /// nothing answers.
    pub(crate) async fn connect(
        backend: &'static str,
        deployment: &Deployment,
        opts: ConnectOptions,
    ) -> Result<Self> {
        match deployment {
            Deployment::Single { url } => Ok(Con::Single(node::connect(backend, url, opts).await?)),
            Deployment::Sentinel {
                sentinels,
                master,
                userinfo,
            } => Ok(Con::Sentinel(
                SentinelCon::connect(backend, sentinels, master, userinfo, opts).await?,
            )),
            Deployment::Cluster { nodes } => Ok(Con::Cluster(
                connect_cluster(backend, deployment, nodes, opts).await?,
            )),
        }
    }

    /// `SUBSCRIBE channel` (RESP3: messages arrive as push messages).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.subscribe(channel).await,
            Con::Sentinel(c) => c.subscribe(channel).await,
            Con::Cluster(c) => c.subscribe(channel).await,
        }
    }

    /// `UNSUBSCRIBE channel`.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.unsubscribe(channel).await,
            Con::Sentinel(c) => c.unsubscribe(channel).await,
            Con::Cluster(c) => c.unsubscribe(channel).await,
        }
    }

    /// The slot of `key` on a cluster (asked of the cluster, so it is the
    /// server's own hashing); `None` elsewhere.
    pub(crate) async fn slot_of(&mut self, key: &str) -> RedisResult<Option<u16>> {
        match self {
            Con::Cluster(c) => {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query_async(c)
                    .await?;
                Ok(Some(slot))
            }
            _ => Ok(None),
        }
    }

    /// One `PING`: on a cluster to the master of `slot` (a plain `PING`
    /// would go to every node), elsewhere on the lock's connection.
    pub(crate) async fn ping(&mut self, slot: Option<u16>) -> RedisResult<()> {
        match (self, slot) {
            (Con::Cluster(c), Some(slot)) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                c.route_command(redis::cmd("PING"), route).await.map(|_| ())
            }
            (con, _) => redis::cmd("PING")
                .query_async::<Value>(con)
                .await
                .map(|_| ()),
        }
    }
}

async fn connect_cluster(
    backend: &'static str,
    deployment: &Deployment,
    nodes: &[String],
    opts: ConnectOptions,
) -> Result<ClusterConnection> {
    let shown = deployment.shown();
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
        .connection_timeout(opts.connect_timeout)
        .response_timeout(opts.op_timeout)
        // A lock request that cannot reach its slot's master fails within a
        // few hundred ms instead of the crate's 16 retries with backoff: the
        // acquire loop (or the caller) decides whether to try again.
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(200)
        .tcp_settings(node::tcp_settings());
    if let Some(tx) = opts.push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx);
    }
    let client = builder
        .build()
        .map_err(|e| Error::config("redis.url", format!("{shown}: {e}")))?;
    let limit = opts.connect_timeout * 2;
    match tokio::time::timeout(limit, client.get_async_connection()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(Error::backend(
            backend,
            format!("connecting to the cluster {shown}"),
            e,
        )),
        Err(_) => Err(Error::backend(
            backend,
            format!("connecting to the cluster {shown}"),
            format!("no connection within {limit:?}"),
        )),
    }
}

/// The primary the sentinels name now, and our connection to it.
#[derive(Clone)]
pub(crate) struct Current {
    addr: String,
    con: ConnectionManager,
}

struct SentinelInner {
    backend: &'static str,
    sentinels: Vec<String>,
    master: String,
    userinfo: String,
    opts: ConnectOptions,
    current: Mutex<Current>,
    /// Serialises re-discovery; holds when it was last asked.
    asked: tokio::sync::Mutex<Instant>,
    /// Channels to subscribe again on a new primary.
    channels: Mutex<HashSet<String>>,
    /// Dropped with the last handle: stops the `+switch-master` watcher.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// A connection to the primary behind Sentinel that follows failovers.
///
/// Two ways, as in Redisson: a watcher subscribed to a sentinel's
/// `+switch-master` event switches as soon as the sentinels announce a new
/// primary; and, for the events it misses, a request answered `READONLY`
/// (the old primary, now a replica), or that cannot reach the primary,
/// makes it ask the sentinels again. A
/// `READONLY` refusal ran nothing, so that one request is sent again to the
/// new primary; a lost connection or a timeout is not retried (the request
/// may have run), the caller sees the error and the acquisition is in doubt.
#[derive(Clone)]
pub(crate) struct SentinelCon(Arc<SentinelInner>);

/// Within this, a second re-discovery is not attempted (every request that
/// fails during a failover would otherwise ask the sentinels).
const REDISCOVER_EVERY: Duration = Duration::from_millis(100);

fn wants_rediscovery(e: &RedisError) -> bool {
    is_readonly(e)
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown)
}

fn is_readonly(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.to_string().contains("READONLY")
}

/// What the sentinels say about the master.
pub(crate) enum Answer {
    /// `host:port`.
    Master(String),
    /// Every sentinel that answered does not know the name.
    UnknownName,
}

impl SentinelCon {
    async fn connect(
        backend: &'static str,
        sentinels: &[String],
        master: &str,
        userinfo: &str,
        opts: ConnectOptions,
    ) -> Result<Self> {
        let listed = sentinels
            .iter()
            .map(|s| redact(s))
            .collect::<Vec<_>>()
            .join(", ");
        let addr = match discover(sentinels, master, opts.connect_timeout).await {
            Ok(Answer::Master(addr)) => addr,
            Ok(Answer::UnknownName) => {
                return Err(Error::config(
                    "redis.master_name",
                    format!("no sentinel of [{listed}] monitors a master named {master:?}"),
                ))
            }
            Err(e) => {
                return Err(Error::backend(
                    backend,
                    format!("asking the sentinels [{listed}] for {master:?}"),
                    e,
                ))
            }
        };
        let con = connect_primary(backend, &addr, userinfo, master, &opts).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let me = Self(Arc::new(SentinelInner {
            backend,
            sentinels: sentinels.to_vec(),
            master: master.to_string(),
            userinfo: userinfo.to_string(),
            opts,
            current: Mutex::new(Current { addr, con }),
            asked: tokio::sync::Mutex::new(Instant::now()),
            channels: Mutex::new(HashSet::new()),
            _stop: stop,
        }));
        tokio::spawn(watch_switches(Arc::downgrade(&me.0), stopped));
        Ok(me)
    }

    pub(crate) fn current(&self) -> Current {
        match self.0.current.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The primary's address as last discovered (for tests and errors).
    pub(crate) fn primary(&self) -> String {
        self.current().addr
    }

    /// Asks the sentinels again after a request to `seen` failed; true if
    /// requests now go to another primary.
    async fn follow(&self, seen: &str, announced: bool) -> bool {
        let inner = &self.0;
        let mut asked = inner.asked.lock().await;
        if self.current().addr != seen {
            return true; // another request already followed the failover
        }
        if !announced && asked.elapsed() < REDISCOVER_EVERY {
            return false;
        }
        *asked = Instant::now();
        let addr = match discover(&inner.sentinels, &inner.master, inner.opts.connect_timeout).await
        {
            Ok(Answer::Master(addr)) if addr != seen => addr,
            Ok(_) => return false,
            Err(e) => {
                tracing::warn!(master = %inner.master, error = %e, "sentinels did not answer");
                return false;
            }
        };
        let con = match connect_primary(
            inner.backend,
            &addr,
            &inner.userinfo,
            &inner.master,
            &inner.opts,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%addr, error = %e, "new primary not usable yet");
                return false;
            }
        };
        tracing::info!(master = %inner.master, from = %seen, to = %addr, "following a failover");
        let channels: Vec<String> = match inner.channels.lock() {
            Ok(c) => c.iter().cloned().collect(),
            Err(_) => Vec::new(),
        };
        for ch in channels {
            let mut c = con.clone();
            let _ = tokio::time::timeout(inner.opts.op_timeout, c.subscribe(&ch)).await;
        }
        if let Ok(mut cur) = inner.current.lock() {
            *cur = Current { addr, con };
        }
        // Releases announced on the old primary are gone: let every local
        // waiter try again now instead of at its fallback timer.
        if let Some(tx) = &inner.opts.push {
            let _ = tx.send(PushInfo {
                kind: PushKind::Disconnection,
                data: Vec::new(),
            });
        }
        true
    }

    async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        if let Ok(mut c) = self.0.channels.lock() {
            c.insert(channel.to_string());
        }
        self.current().con.subscribe(channel).await
    }

    async fn unsubscribe(&self, channel: &str) -> RedisResult<()> {
        if let Ok(mut c) = self.0.channels.lock() {
            c.remove(channel);
        }
        self.current().con.unsubscribe(channel).await
    }

    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let seen = self.current();
            let mut con = seen.con.clone();
            match con.req_packed_command(cmd).await {
                Err(e) if wants_rediscovery(&e) => {
                    let moved = self.follow(&seen.addr, false).await;
                    if moved && is_readonly(&e) {
                        let mut con = self.current().con;
                        con.req_packed_command(cmd).await
                    } else {
                        Err(e)
                    }
                }
                r => r,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let seen = self.current();
            let mut con = seen.con.clone();
            match con.req_packed_commands(pipeline, offset, count).await {
                Err(e) if wants_rediscovery(&e) => {
                    // A pipeline may have run in part: never sent again.
                    self.follow(&seen.addr, false).await;
                    Err(e)
                }
                r => r,
            }
        })
    }
}

/// Listens for the sentinels' `+switch-master` announcement of our master
/// (on the first sentinel that answers, another if it goes) and follows it
/// at once, until the last handle is dropped.
async fn watch_switches(
    inner: std::sync::Weak<SentinelInner>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    use futures::StreamExt as _;
    loop {
        let Some((sentinels, master, limit)) = inner.upgrade().map(|i| {
            (
                i.sentinels.clone(),
                i.master.clone(),
                i.opts.connect_timeout,
            )
        }) else {
            return;
        };
        let mut stream = None;
        for s in &sentinels {
            let subscribe = async {
                let mut ps = node::client(s.as_str())?.get_async_pubsub().await?;
                ps.subscribe("+switch-master").await?;
                Ok::<_, RedisError>(ps)
            };
            if let Ok(Ok(ps)) = tokio::time::timeout(limit, subscribe).await {
                stream = Some(ps.into_on_message());
                break;
            }
        }
        let Some(mut stream) = stream else {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
            }
        };
        loop {
            let msg = tokio::select! {
                _ = &mut stopped => return,
                msg = stream.next() => msg,
            };
            // The sentinel went away: watch through another.
            let Some(msg) = msg else { break };
            // "<name> <old ip> <old port> <new ip> <new port>"
            let payload: String = msg.get_payload().unwrap_or_default();
            if payload.split(' ').next() != Some(master.as_str()) {
                continue;
            }
            let Some(con) = inner.upgrade().map(SentinelCon) else {
                return;
            };
            let seen = con.current().addr;
            con.follow(&seen, true).await;
        }
    }
}

/// Asks each sentinel in turn for the master's address.
pub(crate) async fn discover(
    sentinels: &[String],
    master: &str,
    limit: Duration,
) -> std::result::Result<Answer, String> {
    let mut errors = Vec::new();
    let mut unknown = 0;
    for s in sentinels {
        let ask = async {
            let client = node::client(s.as_str())?;
            let cfg = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(limit))
                .set_response_timeout(Some(limit));
            let mut con = client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut con)
                .await
        };
        match tokio::time::timeout(limit * 2, ask).await {
            Ok(Ok(Some((host, port)))) => return Ok(Answer::Master(format!("{host}:{port}"))),
            Ok(Ok(None)) => unknown += 1,
            Ok(Err(e)) => errors.push(format!("{}: {e}", redact(s))),
            Err(_) => errors.push(format!("{}: no answer within {:?}", redact(s), limit * 2)),
        }
    }
    if unknown > 0 {
        return Ok(Answer::UnknownName);
    }
    Err(errors.join("; "))
}

/// Connects to the primary at `addr` and checks it says it is one: right
/// after a failover a sentinel may still name a node that is a replica.
async fn connect_primary(
    backend: &'static str,
    addr: &str,
    userinfo: &str,
    master: &str,
    opts: &ConnectOptions,
) -> Result<ConnectionManager> {
    let url = format!("redis://{userinfo}{addr}");
    let mut con = node::connect(backend, &url, opts.clone()).await?;
    let role: Vec<Value> =
        tokio::time::timeout(opts.op_timeout, redis::cmd("ROLE").query_async(&mut con))
            .await
            .map_err(|_| Error::indeterminate(backend, format!("ROLE of {addr}"), "no answer"))?
            .map_err(|e| Error::backend(backend, format!("ROLE of {addr}"), e))?;
    match role.first() {
        Some(Value::BulkString(b)) if b.as_slice() == b"master" => Ok(con),
        Some(Value::SimpleString(s)) if s == "master" => Ok(con),
        other => Err(Error::backend(
            backend,
            format!("connecting to the primary of {master:?}"),
            format!("the sentinels name {addr}, which reports role {other:?}"),
        )),
    }
}
