//! RedLock's waiting queue (`redlock.fair`): every master keeps the
//! waiters of a key in a sorted set, ordered by a priority the CLIENT
//! chose once per acquisition (the time it first asked, in µs by its own
//! clock, ties broken by the entry's name), and a release wakes only the
//! head of that queue, on its client's channel.
//!
//! Why a client-chosen priority and not arrival order (the single-node
//! fair lock's list, Redisson's `RedissonFairLock`): the masters see the
//! waiters arrive in different orders, and five FIFO lists would name
//! different heads, so no waiter would hold a quorum of "your turn". The
//! same priority sent to every master gives every master the same order;
//! a waiter that some master has not seen yet (a timed-out request) only
//! misses that master's vote, and re-joins at the same place on its next
//! round. Nothing is asked of the nodes in any order: every round still
//! goes to all of them at once, and each answers on its own.
//!
//! What it asks of the clients:
//! - One setting per key. A client with `fair = false` takes a free key
//!   past the queue and wakes nobody when it releases: safe, but the
//!   queued clients then get the key only on their refresh, and lose it
//!   to the unqueued ones almost every time (a probe: 4 queued and 4
//!   unqueued clients, 13 acquisitions against 1,089, 3 of 4 queued ones
//!   timing out). Mixed settings are a migration's moment, not a
//!   deployment.
//! - Clocks that roughly agree. The priority is the client's own clock:
//!   one running D behind is served as if it had asked D earlier, on every
//!   acquisition. It cannot hold the key longer than its lease, and a
//!   place it stops refreshing is dropped after `waiter_ttl_ms`, but while
//!   it keeps asking it is always first. Exclusion never rests on it.
//!
//! Why a queue at all: with the spec's random retry, every waiter polls
//! every master, and at 16 workers a lost round (five scripts) was spent
//! 3 times per acquisition. Queued, a waiter sleeps until a quorum of the
//! masters has named it, then asks once.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use lockbench_redis::node::{Keys, Reply, NEXT_TOKEN};
use redis::aio::ConnectionLike;
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::Notify;

/// Drops the waiters at the head of a queue that stopped refreshing their
/// place (crashed, paused, cut off). `now` is the server's clock in ms.
const DROP_STALE_HEADS: &str = r"
local function drop_stale_heads(rank, waiters, now)
  while true do
    local head = redis.call('ZRANGE', rank, 0, 0)[1]
    if not head then return nil end
    local dl = redis.call('ZSCORE', waiters, head)
    if dl and tonumber(dl) > now then return head end
    redis.call('ZREM', rank, head)
    redis.call('ZREM', waiters, head)
  end
end
";

/// The acquire on one master. With nobody queued it is the plain
/// `SET NX` (one `EXISTS` more); otherwise we (re)join the queue at our
/// priority first, so a waiter that asks this master late still stands
/// where its priority puts it, and take the key only when it is free and
/// we are the head.
///
/// KEYS: lock, fence, rank (entry → priority), waiters (entry → deadline,
/// ms). ARGV: owner, px, entry, priority, waiter ttl ms (0 = a try-lock:
/// never queue), the wake channel prefix.
/// Reply: `{1, token}` or `{0, pttl}` (-2: free, but not our turn).
const ACQUIRE_BODY: &str = r"
if redis.call('EXISTS', KEYS[3]) == 0 then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, next_token(KEYS[2], now_us())}
  end
end
local now_micros = now_us()
local now = math.floor(now_micros / 1000)
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[3])
  -- Nobody refreshing for a ttl = nobody waiting: the queue goes too.
  redis.call('PEXPIRE', KEYS[3], 2 * ttl)
  redis.call('PEXPIRE', KEYS[4], 2 * ttl)
end
local head = drop_stale_heads(KEYS[3], KEYS[4], now)
local free = redis.call('EXISTS', KEYS[1]) == 0
if free and (head == nil or head == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('ZREM', KEYS[3], head)
    redis.call('ZREM', KEYS[4], head)
  end
  return {1, next_token(KEYS[2], now_micros)}
end
if free then
  -- The head may have missed its wake-up: tell it again.
  redis.call('PUBLISH', ARGV[6] .. string.sub(head, 1, 16), head)
  return {0, -2}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// Compare-and-delete, then either leave the queue (a release, or a
/// waiter that gives up) or keep our place in it (a lost round giving back
/// what it got: the acquire that landed took us out of the queue, and a
/// waiter whose rounds keep timing out on a busy machine would otherwise
/// lose its place on those masters round after round, while later waiters
/// passed it: 96 of them in one 610 ms wait, in a 4-worker run); then
/// wake the head.
///
/// KEYS: lock, rank, waiters. ARGV: owner, entry, the wake channel prefix,
/// our priority, the waiter ttl ms to keep our place for (0: leave).
const RELEASE_BODY: &str = r"
local ours = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  ours = 1
end
local ttl = tonumber(ARGV[5])
-- Nobody queued: no place of ours to drop, nobody to wake.
if ttl == 0 and redis.call('EXISTS', KEYS[2]) == 0 then return ours end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ttl > 0 then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[2])
  redis.call('PEXPIRE', KEYS[2], 2 * ttl)
  redis.call('PEXPIRE', KEYS[3], 2 * ttl)
else
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if (ours == 1 or redis.call('EXISTS', KEYS[1]) == 0)
    and redis.call('EXISTS', KEYS[2]) == 1 then
  local head = drop_stale_heads(KEYS[2], KEYS[3], now)
  if head then
    redis.call('PUBLISH', ARGV[3] .. string.sub(head, 1, 16), head)
  end
end
return ours
";

static ACQUIRE: LazyLock<String> =
    LazyLock::new(|| compact(&format!("{NEXT_TOKEN}{DROP_STALE_HEADS}{ACQUIRE_BODY}")));
static RELEASE: LazyLock<String> =
    LazyLock::new(|| compact(&format!("{DROP_STALE_HEADS}{RELEASE_BODY}")));

/// The script without comments and indentation: every round sends the
/// source to every master (an `EVAL`), and the server hashes all of it to
/// find its compiled copy, so its size is paid on every lock cycle.
fn compact(src: &str) -> String {
    src.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The length of a client id, the part of an entry before `:` that names
/// the client's wake channel (the scripts cut it with `string.sub`).
const CLIENT_ID_LEN: usize = 16;

/// The queue key names of `keys` (beside the lock, in its hash tag).
fn rank_key(keys: &Keys) -> String {
    format!("{}:rank", keys.lock)
}

fn waiters_key(keys: &Keys) -> String {
    format!("{}:waiting", keys.lock)
}

/// `<prefix>:redlock-wake:`, the start of every client's wake channel.
pub(crate) fn wake_prefix(prefix: &str) -> String {
    format!("{prefix}:redlock-wake:")
}

/// One acquisition's place in the queues.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// `<client id>:<owner>`.
    pub entry: String,
    /// µs since the epoch when the acquisition first asked.
    pub priority: u64,
    pub wake_prefix: Arc<str>,
}

impl Place {
    pub(crate) fn new(client_id: &str, owner: &str, wake_prefix: &Arc<str>) -> Self {
        let priority = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Self {
            entry: format!("{client_id}:{owner}"),
            priority,
            wake_prefix: wake_prefix.clone(),
        }
    }
}

/// The queued acquire on one node, as one `EVAL` of the source (see
/// `lockbench_redis::node::acquire_eval` for why not `EVALSHA`).
///
/// # Errors
/// The client's error.
pub(crate) async fn acquire_eval<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
    px: u64,
    place: &Place,
    waiter_ttl_ms: u64,
) -> RedisResult<Reply> {
    let v: Vec<i64> = redis::cmd("EVAL")
        .arg(ACQUIRE.as_str())
        .arg(4)
        .arg(&keys.lock)
        .arg(&keys.fence)
        .arg(rank_key(keys))
        .arg(waiters_key(keys))
        .arg(owner)
        .arg(px)
        .arg(&place.entry)
        .arg(place.priority)
        .arg(waiter_ttl_ms)
        .arg(&*place.wake_prefix)
        .query_async(con)
        .await?;
    lockbench_redis::node::parse_reply(&v)
}

/// Compare-and-delete that also withdraws `place` (`keep_ttl_ms` 0) or
/// keeps it for that long, and wakes the next waiter, as one `EVAL`; true
/// if the lock was ours.
///
/// # Errors
/// The client's error.
pub(crate) async fn release_eval<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    owner: &str,
    place: &Place,
    keep_ttl_ms: u64,
) -> RedisResult<bool> {
    let n: i64 = redis::cmd("EVAL")
        .arg(RELEASE.as_str())
        .arg(3)
        .arg(&keys.lock)
        .arg(rank_key(keys))
        .arg(waiters_key(keys))
        .arg(owner)
        .arg(&place.entry)
        .arg(&*place.wake_prefix)
        .arg(place.priority)
        .arg(keep_ttl_ms)
        .query_async(con)
        .await?;
    Ok(n == 1)
}

/// A fresh client id: 64 random bits in hex ([`CLIENT_ID_LEN`] digits).
pub(crate) fn new_client_id() -> String {
    let id = format!("{:016x}", rand::random::<u64>());
    debug_assert_eq!(id.len(), CLIENT_ID_LEN);
    id
}

/// One waiting acquisition: which masters have named it since its last
/// round, and its wake-up.
struct Waiting {
    named_by: u64,
    notify: Arc<Notify>,
}

/// Routes the wake messages of every master to the waiting acquisition
/// they name. A waiter is woken once a quorum of DISTINCT masters has
/// named it: the releasing holder's round reaches all masters at once, so
/// the quorum's messages come within a fraction of a round trip, and a
/// waiter woken by the first one alone would find the others still held,
/// lose the round and give back what it got.
pub(crate) struct Wakes {
    quorum: usize,
    waiting: Mutex<HashMap<String, Waiting>>,
}

/// A waiter's registration; unregisters when the acquire ends, however it
/// ends.
pub(crate) struct Turn {
    wakes: Arc<Wakes>,
    owner: String,
    pub notify: Arc<Notify>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Ok(mut w) = self.wakes.waiting.lock() {
            w.remove(&self.owner);
        }
    }
}

impl Turn {
    /// Forgets who named us: called as a round starts, since only a
    /// release after it says the key is free now.
    pub(crate) fn reset(&self) {
        if let Ok(mut w) = self.wakes.waiting.lock() {
            if let Some(x) = w.get_mut(&self.owner) {
                x.named_by = 0;
            }
        }
    }
}

impl Wakes {
    pub(crate) fn new(quorum: usize) -> Self {
        Self {
            quorum,
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// Registers the acquisition `owner` for its wake messages.
    pub(crate) fn await_turn(self: &Arc<Self>, owner: &str) -> Turn {
        let notify = Arc::new(Notify::new());
        if let Ok(mut w) = self.waiting.lock() {
            w.insert(
                owner.to_string(),
                Waiting {
                    named_by: 0,
                    notify: notify.clone(),
                },
            );
        }
        Turn {
            wakes: self.clone(),
            owner: owner.to_string(),
            notify,
        }
    }

    /// Master `node` named `entry` (`<client>:<owner>`).
    fn named(&self, node: usize, entry: &[u8]) {
        let entry = String::from_utf8_lossy(entry);
        let owner = entry.split_once(':').map_or(&*entry, |(_, o)| o);
        if let Ok(mut w) = self.waiting.lock() {
            if let Some(x) = w.get_mut(owner) {
                x.named_by |= 1u64 << (node % 64);
                if x.named_by.count_ones() as usize >= self.quorum {
                    // A permit: a wake between a round and the sleep counts.
                    x.notify.notify_one();
                }
            }
        }
    }

    /// Messages may have been lost (a connection dropped): every waiter
    /// asks again.
    fn wake_all(&self) {
        if let Ok(w) = self.waiting.lock() {
            for x in w.values() {
                x.notify.notify_one();
            }
        }
    }

    /// Feeds the push messages of master `node`, whose wake channel is
    /// `channel`, until its connection is gone.
    pub(crate) fn listen(
        self: &Arc<Self>,
        node: usize,
        channel: String,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<PushInfo>,
    ) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(push) = rx.recv().await {
                let Some(w) = weak.upgrade() else { return };
                match push.kind {
                    PushKind::Message => {
                        if let (Some(Value::BulkString(ch)), Some(Value::BulkString(entry))) =
                            (push.data.first(), push.data.get(1))
                        {
                            if ch.as_slice() == channel.as_bytes() {
                                w.named(node, entry);
                            }
                        }
                    }
                    PushKind::Disconnection => w.wake_all(),
                    _ => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    #[test]
    fn compacting_keeps_the_code_and_drops_the_rest() {
        assert_eq!(
            compact("\nlocal a = 1\n  -- why\n  if a then\n    return a\n  end\n"),
            "local a = 1\nif a then\nreturn a\nend"
        );
        assert!(ACQUIRE.len() < NEXT_TOKEN.len() + DROP_STALE_HEADS.len() + ACQUIRE_BODY.len());
    }

    #[tokio::test]
    async fn a_waiter_wakes_only_once_a_quorum_of_distinct_masters_named_it() {
        let wakes = Arc::new(Wakes::new(3));
        let turn = wakes.await_turn("o1");
        let woken = || futures::FutureExt::now_or_never(turn.notify.notified()).is_some();
        wakes.named(0, b"c:o1");
        wakes.named(0, b"c:o1");
        wakes.named(1, b"c:o1");
        wakes.named(2, b"c:o2");
        assert!(!woken(), "two masters are no quorum");
        wakes.named(4, b"c:o1");
        assert!(woken());
        turn.reset();
        wakes.named(2, b"c:o1");
        assert!(!woken(), "a new round starts counting again");
    }
}
