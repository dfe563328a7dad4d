//! Single-node primitives shared by [`crate::RedisLock`] and RedLock: key
//! names, owner ids, connecting, and the three scripts (acquire with its
//! fencing counter, compare-and-delete, compare-and-pexpire).

use std::sync::LazyLock;
use std::time::Duration;

use distlock::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{IntoConnectionInfo, PushInfo, RedisError, RedisResult, Script};

use crate::config::redact;

/// The fencing token of an acquisition that just took the lock, shared by
/// the acquire scripts.
///
/// The token is `max(last + 1, server time in µs)`, not a bare `INCR`: the
/// lockbench servers (and most lock deployments) keep no persistence, and a
/// restarted server that forgot a bare counter would hand out 1, 2, 3 again
/// (tokens going backwards, which the `tokens_survive_restart` case
/// caught). Seeded from the clock, a forgotten counter restarts above every
/// token handed out before, as long as fewer than one lock per microsecond
/// was taken on the key and the server's clock did not step back. One
/// `TIME` and one `SET` more inside the script: no round trip.
///
/// For the same reason the counter need not live forever: it expires a day
/// after the key was last locked. Before, every key ever locked left its
/// counter behind for good (a probe: 500 keys, 500 counters after every
/// lock and handle was gone; a flash sale locking per user leaves one per
/// user); a key locked again after a day starts from the clock, above
/// every token it had, unless the clock stepped back by more than that.
pub const NEXT_TOKEN: &str = r"
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function next_token(fence, now)
  local n = redis.call('INCR', fence)
  if n < now then
    n = now
    redis.call('SET', fence, string.format('%d', now))
  end
  redis.call('PEXPIRE', fence, 86400000)
  return n
end
";

/// Takes the lock and its fencing token ([`NEXT_TOKEN`]) atomically: the
/// token can never be handed to a client that did not get the lock, nor
/// skipped by one that did.
const ACQUIRE_BODY: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_token(KEYS[2], now_us())}
end
return {0, redis.call('PTTL', KEYS[1])}
";

static ACQUIRE: LazyLock<String> = LazyLock::new(|| format!("{NEXT_TOKEN}{ACQUIRE_BODY}"));

/// Deletes only our own lock, then wakes the waiters of this key.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
";

/// Deletes only our own lock, announcing nothing (for locks whose waiters
/// do not listen, such as RedLock's: a PUBLISH would be wasted work on
/// every node).
const RELEASE_QUIET: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Extends only our own lock.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Drops the waiters at the head of a fair queue that stopped refreshing
/// their place (crashed, paused, cut off): shared by the fair scripts.
/// `now` is the server's clock in ms.
const DROP_STALE_HEADS: &str = r"
local function drop_stale_heads(queue, waiters, now)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then return nil end
    local dl = redis.call('ZSCORE', waiters, head)
    if dl and tonumber(dl) > now then return head end
    redis.call('LPOP', queue)
    redis.call('ZREM', waiters, head)
  end
end
";

/// The fair acquire (Redisson's `RedissonFairLock`, reduced): a FIFO list
/// of waiting entries (`<client id>:<owner>`) and a sorted set of each
/// entry's deadline, both under the key's hash tag. The lock is taken only
/// when it is free AND the queue is empty or we are at its head, so a
/// newcomer never barges past a waiter. With an empty queue this is the
/// plain acquire: one round trip, no write to the queue keys.
///
/// KEYS: lock, fence, queue, waiters. ARGV: owner, px, entry, waiter ttl
/// ms (0 = a try-lock: never queue), the wake channel prefix.
/// Reply: `{1, token}` or `{0, pttl}` (-2: free, but not our turn yet).
///
/// The empty-queue case comes first and is the plain acquire's `SET NX`
/// (4 calls, not 5): the queue's clock work is paid only with a queue.
const ACQUIRE_FAIR_BODY: &str = r"
if not redis.call('LINDEX', KEYS[3], 0) then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, next_token(KEYS[2], now_us())}
  end
end
local now_micros = now_us()
local now = math.floor(now_micros / 1000)
local head = drop_stale_heads(KEYS[3], KEYS[4], now)
local free = redis.call('EXISTS', KEYS[1]) == 0
if free and (head == nil or head == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], ARGV[3])
  end
  return {1, next_token(KEYS[2], now_micros)}
end
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  if not redis.call('ZSCORE', KEYS[4], ARGV[3]) then
    redis.call('RPUSH', KEYS[3], ARGV[3])
  end
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[3])
  -- Nobody refreshing for a ttl = nobody waiting: the queue goes too.
  redis.call('PEXPIRE', KEYS[3], 2 * ttl)
  redis.call('PEXPIRE', KEYS[4], 2 * ttl)
end
if free then
  -- The head may have missed its wake-up (or just joined): tell it again.
  redis.call('PUBLISH', ARGV[5] .. string.sub(head, 1, 16), head)
  return {0, -2}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// The fair release: compare-and-delete, leave the queue if we are still
/// in it (a waiter that gives up withdraws through this same script), then
/// wake ONLY the head of the queue, on its client's channel.
///
/// KEYS: lock, queue, waiters. ARGV: owner, entry, the wake channel prefix.
///
/// With nobody queued a release is 4 calls (GET, DEL, ZREM, LINDEX): the
/// lock is known free after our own DEL, and the clock is read only when
/// there is a head to check for staleness.
const RELEASE_FAIR_BODY: &str = r"
local ours = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  ours = 1
end
if redis.call('ZREM', KEYS[3], ARGV[2]) == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[2])
end
if (ours == 1 or redis.call('EXISTS', KEYS[1]) == 0)
    and redis.call('LINDEX', KEYS[2], 0) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local head = drop_stale_heads(KEYS[2], KEYS[3], now)
  if head then
    redis.call('PUBLISH', ARGV[3] .. string.sub(head, 1, 16), head)
  end
end
return ours
";

static ACQUIRE_FAIR: LazyLock<String> =
    LazyLock::new(|| format!("{NEXT_TOKEN}{DROP_STALE_HEADS}{ACQUIRE_FAIR_BODY}"));
static ACQUIRE_FAIR_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&ACQUIRE_FAIR));
static RELEASE_FAIR_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{DROP_STALE_HEADS}{RELEASE_FAIR_BODY}")));

/// The length of a client id, the part of a queue entry before `:` that
/// names the client's wake channel (the scripts cut it with `string.sub`).
pub const CLIENT_ID_LEN: usize = 16;

/// A fresh client id for [`FairEntry`]: 64 random bits in hex.
pub fn new_client_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// One acquisition's place in a fair queue: its owner value, the entry
/// the queue holds (`<client id>:<owner>`), and where its client listens.
#[derive(Debug, Clone)]
pub struct FairEntry {
    /// The acquisition's owner value (the lock key's value once held).
    pub owner: String,
    /// `<client id>:<owner>`.
    pub entry: String,
    /// `<prefix>:wake:`; the client's channel is this + its client id.
    pub wake_prefix: String,
}

impl FairEntry {
    /// The entry of `owner` for the client `client_id`.
    pub fn new(prefix: &str, client_id: &str, owner: &str) -> Self {
        Self {
            owner: owner.to_string(),
            entry: format!("{client_id}:{owner}"),
            wake_prefix: wake_prefix(prefix),
        }
    }
}

/// `<prefix>:wake:`, the start of every client's wake channel.
pub fn wake_prefix(prefix: &str) -> String {
    format!("{prefix}:wake:")
}

/// The fair acquire script as a command (`EVALSHA`), to send alone or in a
/// pipeline (with `WAIT`); `waiter_ttl_ms = 0` for a try-lock.
pub fn acquire_fair_cmd(keys: &Keys, me: &FairEntry, px: u64, waiter_ttl_ms: u64) -> redis::Cmd {
    let mut c = redis::cmd("EVALSHA");
    c.arg(ACQUIRE_FAIR_SCRIPT.get_hash())
        .arg(4)
        .arg(&keys.lock)
        .arg(&keys.fence)
        .arg(&keys.queue)
        .arg(&keys.waiters)
        .arg(&me.owner)
        .arg(px)
        .arg(&me.entry)
        .arg(waiter_ttl_ms)
        .arg(&me.wake_prefix);
    c
}

/// The fair acquire script (to load it after a `NOSCRIPT`).
pub fn acquire_fair_script() -> &'static Script {
    &ACQUIRE_FAIR_SCRIPT
}

/// One fair acquire attempt; see [`acquire_fair_cmd`].
///
/// # Errors
/// The client's error.
pub async fn acquire_fair<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    me: &FairEntry,
    px: u64,
    waiter_ttl_ms: u64,
) -> RedisResult<Reply> {
    let v: Vec<i64> = ACQUIRE_FAIR_SCRIPT
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.waiters)
        .arg(&me.owner)
        .arg(px)
        .arg(&me.entry)
        .arg(waiter_ttl_ms)
        .arg(&me.wake_prefix)
        .invoke_async(con)
        .await?;
    parse_reply(&v)
}

/// Fair compare-and-delete that also withdraws our queue entry and wakes
/// the next waiter; true if the lock was ours.
///
/// # Errors
/// The client's error.
pub async fn release_fair<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    me: &FairEntry,
) -> RedisResult<bool> {
    let n: i64 = RELEASE_FAIR_SCRIPT
        .key(&keys.lock)
        .key(&keys.queue)
        .key(&keys.waiters)
        .arg(&me.owner)
        .arg(&me.entry)
        .arg(&me.wake_prefix)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&ACQUIRE));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
static RELEASE_QUIET_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_QUIET));
static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));

/// The acquire script (for pipelining it with `WAIT`).
pub fn acquire_script() -> &'static Script {
    &ACQUIRE_SCRIPT
}

/// The Redis keys of one lock.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The lock itself (value = owner id).
    pub lock: String,
    /// The per-key fencing counter.
    pub fence: String,
    /// The pub/sub channel releases are announced on (the unfair lock).
    pub channel: String,
    /// The fair lock's FIFO list of waiting entries.
    pub queue: String,
    /// The fair lock's waiting entries by deadline (ms, server clock).
    pub waiters: String,
}

impl Keys {
    /// Hash-tagged by the user's key so all of them share a cluster slot.
    pub fn new(prefix: &str, key: &str) -> Self {
        let tag = hash_tag(key);
        Self {
            lock: format!("{prefix}:{{{tag}}}:lock"),
            fence: format!("{prefix}:{{{tag}}}:fence"),
            channel: format!("{prefix}:{{{tag}}}:released"),
            queue: format!("{prefix}:{{{tag}}}:queue"),
            waiters: format!("{prefix}:{{{tag}}}:waiters"),
        }
    }
}

/// The user's key as the content of a hash tag. Redis Cluster hashes what
/// lies between the first `{` and the first `}` after it, and the WHOLE
/// name when that is empty: the empty key, or one starting with `}`, put
/// each of the lock's keys in its own slot (CROSSSLOT on every acquire).
/// So `}` is escaped (`%7D`), `%` too (`%25`) to keep distinct keys
/// distinct, and the empty key is `%`, which no escaped key is. Keys with
/// neither character keep their name as it was.
fn hash_tag(key: &str) -> std::borrow::Cow<'_, str> {
    if key.is_empty() {
        return "%".into();
    }
    if !key.contains(['%', '}']) {
        return key.into();
    }
    key.replace('%', "%25").replace('}', "%7D").into()
}

/// A fresh owner id: 128 random bits, one per ACQUISITION (never per client
/// or handle), so a late release, renewal or withdrawal of one acquisition
/// can never match a later one.
pub fn new_owner() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What one node said to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// We got it; the key's fencing counter after our increment.
    Acquired {
        /// The counter value.
        token: u64,
    },
    /// Somebody holds it; its remaining TTL in ms (-1: no expiry, -2: gone).
    Held {
        /// `PTTL` of the lock key.
        pttl_ms: i64,
    },
}

/// Parses the acquire script's `{1, token}` / `{0, pttl}`.
///
/// # Errors
/// A reply of any other shape.
pub fn parse_reply(v: &[i64]) -> RedisResult<Reply> {
    match v {
        [1, token] => Ok(Reply::Acquired {
            token: u64::try_from(*token).unwrap_or(0),
        }),
        [0, pttl] => Ok(Reply::Held { pttl_ms: *pttl }),
        other => Err(RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected acquire reply",
            format!("{other:?}"),
        ))),
    }
}

/// One acquire attempt on one node.
///
/// # Errors
/// The client's error.
pub async fn acquire<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
    px: u64,
) -> RedisResult<Reply> {
    let v: Vec<i64> = ACQUIRE_SCRIPT
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(owner)
        .arg(px)
        .invoke_async(con)
        .await?;
    parse_reply(&v)
}

/// [`acquire`] as one `EVAL` of the script's source: a single request that
/// never needs the load-and-retry an `EVALSHA` answered `NOSCRIPT` calls
/// for, so it completes even if nobody polls its answer (RedLock's
/// slowest nodes, after a quorum has answered).
///
/// # Errors
/// The client's error.
pub async fn acquire_eval<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
    px: u64,
) -> RedisResult<Reply> {
    let v: Vec<i64> = redis::cmd("EVAL")
        .arg(ACQUIRE.as_str())
        .arg(2)
        .arg(&keys.lock)
        .arg(&keys.fence)
        .arg(owner)
        .arg(px)
        .query_async(con)
        .await?;
    parse_reply(&v)
}

/// [`release_quiet`] as one `EVAL` (see [`acquire_eval`]).
///
/// # Errors
/// The client's error.
pub async fn release_quiet_eval<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
) -> RedisResult<bool> {
    let n: i64 = redis::cmd("EVAL")
        .arg(RELEASE_QUIET)
        .arg(1)
        .arg(&keys.lock)
        .arg(owner)
        .query_async(con)
        .await?;
    Ok(n == 1)
}

/// Compare-and-delete on one node; true if the lock was ours.
///
/// # Errors
/// The client's error.
pub async fn release<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
) -> RedisResult<bool> {
    let n: i64 = RELEASE_SCRIPT
        .key(&keys.lock)
        .arg(owner)
        .arg(&keys.channel)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// Compare-and-delete on one node without announcing the release; true if
/// the lock was ours.
///
/// # Errors
/// The client's error.
pub async fn release_quiet<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
) -> RedisResult<bool> {
    let n: i64 = RELEASE_QUIET_SCRIPT
        .key(&keys.lock)
        .arg(owner)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// Compare-and-pexpire on one node; true if the lock was ours.
///
/// # Errors
/// The client's error.
pub async fn renew<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
    px: u64,
) -> RedisResult<bool> {
    let n: i64 = RENEW_SCRIPT
        .key(&keys.lock)
        .arg(owner)
        .arg(px)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// Maps a client error: a timeout or a dropped connection after sending
/// leaves the outcome unknown; a refused connection does not.
pub fn map_err(backend: &'static str, context: impl Into<String>, e: RedisError) -> Error {
    // Refused: nothing was sent, so nothing happened (the crate counts a
    // refusal as a dropped connection).
    if e.is_connection_refusal() {
        Error::backend(backend, context, e)
    } else if e.is_timeout() || e.is_connection_dropped() {
        Error::indeterminate(backend, context, e)
    } else {
        Error::backend(backend, context, e)
    }
}

/// The TCP settings of every connection the Redis locks (and their peers
/// and probes) open: `TCP_NODELAY` on. The `redis` crate leaves Nagle's
/// algorithm on unless told (`TcpSettings::default()`), which holds a
/// second small write back until the server ACKs the first.
pub fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for `url` whose connections (and reconnections) have
/// [`tcp_settings`].
///
/// # Errors
/// An unparsable URL.
pub fn client(url: impl IntoConnectionInfo) -> RedisResult<redis::Client> {
    redis::Client::open(url.into_connection_info()?.set_tcp_settings(tcp_settings()))
}

/// How to connect to one node.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Deadline for connecting.
    pub connect_timeout: Duration,
    /// Deadline of each request (the client's response timeout).
    pub op_timeout: Duration,
    /// RESP3 push messages (pub/sub) go here; implies RESP3.
    pub push: Option<tokio::sync::mpsc::UnboundedSender<PushInfo>>,
    /// Return a client that connects on first use instead of failing when
    /// the node is down now (RedLock tolerates a minority of dead nodes).
    pub lazy: bool,
    /// For a `rediss://` URL: the PEM of the CA to verify the server
    /// with, instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
}

/// Connects to one node, failing within `connect_timeout` with the endpoint
/// named (unless `lazy`).
///
/// # Errors
/// [`Error::Config`] for an unparsable URL, [`Error::Backend`] naming the
/// endpoint when it cannot be reached.
pub async fn connect(
    backend: &'static str,
    url: &str,
    opts: ConnectOptions,
) -> Result<ConnectionManager> {
    let shown = redact(url);
    let mut info: redis::ConnectionInfo = url
        .into_connection_info()
        .map_err(|e| Error::config("redis.url", format!("{shown}: {e}")))?
        .set_tcp_settings(tcp_settings());
    let mut mcfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(Some(opts.op_timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    if let Some(tx) = opts.push {
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        info = info.set_redis_settings(settings);
        mcfg = mcfg.set_push_sender(tx).set_automatic_resubscription();
    }
    let client = match opts.tls_ca {
        Some(ca) => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca),
            },
        ),
        None => redis::Client::open(info),
    }
    .map_err(|e| Error::config("redis.url", format!("{shown}: {e}")))?;
    if opts.lazy {
        return ConnectionManager::new_lazy_with_config(client, mcfg)
            .map_err(|e| Error::backend(backend, format!("connecting to {shown}"), e));
    }
    match tokio::time::timeout(
        opts.connect_timeout * 2,
        ConnectionManager::new_with_config(client, mcfg),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(Error::backend(backend, format!("connecting to {shown}"), e)),
        Err(_) => Err(Error::backend(
            backend,
            format!("connecting to {shown}"),
            format!("no connection within {:?}", opts.connect_timeout * 2),
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    /// What Redis Cluster hashes of a name (cluster spec, "Hash tags"):
    /// between the first `{` and the first `}` after it, if not empty.
    fn hashed(name: &str) -> &str {
        if let Some(open) = name.find('{') {
            if let Some(len) = name[open + 1..].find('}') {
                if len > 0 {
                    return &name[open + 1..open + 1 + len];
                }
            }
        }
        name
    }

    #[test]
    fn a_locks_keys_share_one_hash_tag_whatever_the_key() {
        let users = [
            "", "}", "}abc", "}{a}", "a}b{c", "{", "{}", "x{}", "{tag}", "%", "%25", "%7D",
            "a%7Db", "a}b", "plain", "ключ",
        ];
        let mut locks = Vec::new();
        for u in users {
            let k = Keys::new("lockbench", u);
            let tag = hashed(&k.lock);
            assert_ne!(tag, k.lock, "{u:?}: {} is hashed whole", k.lock);
            for name in [&k.fence, &k.channel, &k.queue, &k.waiters] {
                assert_eq!(hashed(name), tag, "{u:?}: {name} and {} differ", k.lock);
            }
            locks.push(k.lock);
        }
        let mut distinct = locks.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            locks.len(),
            "two keys share a lock: {locks:?}"
        );
        // The common case keeps its name.
        assert_eq!(Keys::new("lockbench", "k").lock, "lockbench:{k}:lock");
    }
}
