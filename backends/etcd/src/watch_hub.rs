//! One long-lived watch per lock queue per [`crate::EtcdLock`], shared by
//! the handle's waiters (issue #19).
//!
//! Why: a watch opened per wait starts behind the current revision as soon
//! as other waiters' writes move it on, and etcd serves such a watch from
//! its "unsynced" set, caught up only every 100 ms (`watchResyncPeriod`).
//! A watch that stays open is in the "synced" set, where a delete is sent
//! out as it commits. Measured with `tests/handover.rs` (release invoked ->
//! next acquire done, 4 worker handles on one key, 4 runs on a loaded
//! 2-core machine): before, p50 2.4-3.8 ms, p99 15-50 ms (4-20x), 4.1-4.4
//! round trips per acquire (a queue read and a new watch per wait, and a
//! re-check after it); with the hub, p50 1.1-1.6 ms, p99 3.1-7.3 ms
//! (2.8-4.6x), 1.0 round trips, 2x the hand-overs per second.
//!
//! - A feed is ONE watch on a queue's whole range (`[dir, dir_end)`, deletes
//!   only), opened when a waiter first has to wait (never on an uncontended
//!   acquire) and kept while the handle has waiters on that queue, and for
//!   [`LINGER`] after the last one leaves: contention comes in bursts, and
//!   a fresh feed costs its opener a round trip (plus a queue read when the
//!   revision moved meanwhile). An idle feed costs one watcher on the
//!   server and a small message per delete in that queue.
//! - Every delete is offered to every local subscriber of the feed. A
//!   waiter hands the hub the set of keys ahead of it; the hub takes out
//!   those it sees deleted and wakes the waiter only when the last one
//!   goes (or the waiter's own key does), so a waiter watching every key
//!   ahead of it needs no re-read when its turn comes, and sleeps through
//!   the deletes before it. Deletes that come while a waiter is reading
//!   the queue are kept for it (up to [`BACKLOG`]).
//! - Coverage: a subscription is told the revision after which it sees
//!   every delete (the watch's start, or the last delete passed on before
//!   it joined). A waiter whose queue read is at or past that revision
//!   misses nothing; otherwise it reads the queue again, once.
//! - Any end of the watch (cancelled, compacted, an error, the member gone)
//!   closes the feed: its subscribers see the channel closed, re-read the
//!   queue and subscribe again, which opens a new watch (on whichever
//!   member answers). A watch that stalls without ending (a paused member)
//!   is noticed by a waiter's periodic re-check finding a delete it never
//!   passed on, and replaced the same way. A dropped subscription (a
//!   cancelled acquire) simply leaves the feed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::queue::Queue;

/// How long a feed stays open without subscribers.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// Deletes a subscriber that is not waiting (it is reading the queue) may
/// fall behind by before it must re-read.
const BACKLOG: usize = 1024;

/// How a wait on a subscription ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Every key waited for was seen deleted.
    Cleared,
    /// The waiter's own key was deleted.
    Gone,
    /// Neither by the deadline.
    Quiet,
    /// The feed ended, or we fell too far behind: deletes may be missing.
    Broken,
}

/// What one waiter waits for: the hub counts its keys down, so a delete
/// that is not the last of them wakes nobody (issue #19: with 16 worker
/// processes each delete reached 16 waiters; waking each cost a thread
/// hand-off in every process).
#[derive(Debug)]
struct Wait {
    ahead: HashSet<Vec<u8>>,
    /// Deletes at or before this revision are already in the waiter's read.
    seen: i64,
    mine: Vec<u8>,
}

#[derive(Debug, Default)]
struct SubState {
    /// Every delete after this revision is (or will be) passed on.
    started: Option<i64>,
    /// Deletes passed on while nobody waited (the waiter was reading).
    pending: VecDeque<(Arc<[u8]>, i64)>,
    lagged: bool,
    closed: bool,
    wait: Option<Wait>,
    outcome: Option<Turn>,
}

impl SubState {
    /// Takes a delete in; `true` if the waiter must wake.
    fn offer(&mut self, key: &Arc<[u8]>, rev: i64) -> bool {
        let Some(w) = self.wait.as_mut() else {
            if self.pending.len() >= BACKLOG {
                self.lagged = true;
            } else {
                self.pending.push_back((key.clone(), rev));
            }
            return false;
        };
        if self.outcome.is_some() || rev <= w.seen {
            return false;
        }
        if **key == *w.mine {
            self.outcome = Some(Turn::Gone);
            return true;
        }
        if w.ahead.remove(&**key) && w.ahead.is_empty() {
            self.outcome = Some(Turn::Cleared);
            return true;
        }
        false
    }
}

#[derive(Debug, Default)]
struct Sub {
    state: Mutex<SubState>,
    wake: Notify,
}

struct FeedState {
    /// `false` once the feed has ended: no new subscribers.
    open: bool,
    subs: Vec<Arc<Sub>>,
    /// Every delete after this revision is (or will be) passed on; `None`
    /// until the watch is open.
    after: Option<i64>,
}

struct Feed {
    state: Mutex<FeedState>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Feed {
    fn subscribe(&self) -> Option<Subscription> {
        let mut s = self.state.lock().ok()?;
        if !s.open {
            return None;
        }
        let sub = Arc::new(Sub::default());
        if let Ok(mut st) = sub.state.lock() {
            st.started = s.after;
        }
        s.subs.push(sub.clone());
        Some(Subscription { sub })
    }

    fn subscribers(&self) -> usize {
        self.state.lock().map_or(0, |s| {
            // The feed holds one reference; a live subscription the other.
            s.subs.iter().filter(|x| Arc::strong_count(x) > 1).count()
        })
    }

    /// Passes the watch's start on.
    fn started(&self, rev: i64) {
        if let Ok(mut s) = self.state.lock() {
            s.after = Some(s.after.map_or(rev, |a| a.max(rev)));
            for sub in &s.subs {
                if let Ok(mut st) = sub.state.lock() {
                    st.started.get_or_insert(rev);
                }
                sub.wake.notify_one();
            }
        }
    }

    /// Passes a delete on, waking only the waiters it decides.
    fn deleted(&self, key: &Arc<[u8]>, rev: i64) {
        if let Ok(mut s) = self.state.lock() {
            s.after = Some(s.after.map_or(rev, |a| a.max(rev)));
            s.subs.retain(|x| Arc::strong_count(x) > 1);
            for sub in &s.subs {
                let wake = sub.state.lock().is_ok_and(|mut st| st.offer(key, rev));
                if wake {
                    sub.wake.notify_one();
                }
            }
        }
    }

    fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.open = false;
            for sub in s.subs.drain(..) {
                if let Ok(mut st) = sub.state.lock() {
                    st.closed = true;
                }
                sub.wake.notify_one();
            }
        }
    }
}

type Feeds = Mutex<HashMap<String, Arc<Feed>>>;

/// The feeds of one handle, by queue directory.
pub(crate) struct WatchHub {
    client: Client,
    feeds: Arc<Feeds>,
    op_timeout: Duration,
    linger: Duration,
}

impl std::fmt::Debug for WatchHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.feeds.lock().map_or(0, |m| m.len());
        f.debug_struct("WatchHub").field("feeds", &n).finish()
    }
}

/// One waiter's view of a feed.
#[derive(Debug)]
pub(crate) struct Subscription {
    sub: Arc<Sub>,
}

impl Subscription {
    /// The revision after which this subscription sees every delete,
    /// waiting for the watch to open if it is not yet; `None` if it did
    /// not open by `until` or ended.
    pub(crate) async fn after(&mut self, until: Instant) -> Option<i64> {
        loop {
            let woken = self.sub.wake.notified();
            {
                let st = self.sub.state.lock().ok()?;
                if let Some(rev) = st.started {
                    return Some(rev);
                }
                if st.closed {
                    return None;
                }
            }
            if tokio::time::timeout_at(until, woken).await.is_err() {
                return self.sub.state.lock().ok()?.started;
            }
        }
    }

    /// Waits until every key in `ahead` is seen deleted after revision
    /// `seen`, or `mine` is, or `until`. Keys seen deleted are taken out
    /// of `ahead`; the rest are left in it for the caller to re-check.
    pub(crate) async fn wait(
        &mut self,
        until: Instant,
        ahead: &mut HashSet<Vec<u8>>,
        seen: i64,
        mine: &[u8],
    ) -> Turn {
        {
            let Ok(mut st) = self.sub.state.lock() else {
                return Turn::Broken;
            };
            st.outcome = None;
            st.wait = Some(Wait {
                ahead: std::mem::take(ahead),
                seen,
                mine: mine.to_vec(),
            });
            // What came while the waiter was reading.
            for (key, rev) in std::mem::take(&mut st.pending) {
                st.offer(&key, rev);
            }
        }
        let turn = loop {
            let woken = self.sub.wake.notified();
            {
                let Ok(mut st) = self.sub.state.lock() else {
                    break Turn::Broken;
                };
                if let Some(t) = st.outcome.take() {
                    break t;
                }
                if st.lagged {
                    tracing::debug!("fell behind the queue's watch");
                }
                if st.closed || st.lagged {
                    break Turn::Broken;
                }
            }
            if tokio::time::timeout_at(until, woken).await.is_err() {
                break self
                    .sub
                    .state
                    .lock()
                    .ok()
                    .and_then(|mut st| st.outcome.take())
                    .unwrap_or(Turn::Quiet);
            }
        };
        if let Ok(mut st) = self.sub.state.lock() {
            if let Some(w) = st.wait.take() {
                *ahead = w.ahead;
            }
        }
        turn
    }
}

impl WatchHub {
    pub(crate) fn new(client: Client, op_timeout: Duration) -> Self {
        Self {
            client,
            feeds: Arc::default(),
            op_timeout,
            linger: LINGER,
        }
    }

    /// A subscription to the queue's feed if one is open already; never
    /// opens one (an acquire that may turn out uncontended calls this
    /// before its queue read, at no cost).
    pub(crate) fn join(&self, queue: &Queue) -> Option<Subscription> {
        let feeds = self.feeds.lock().ok()?;
        feeds.get(&queue.dir)?.subscribe()
    }

    /// A subscription to the queue's feed, opening the feed if there is
    /// none; `true` if this call opened it (one round trip for the caller
    /// to count).
    pub(crate) fn subscribe(&self, queue: &Queue) -> Option<(Subscription, bool)> {
        let mut feeds = self.feeds.lock().ok()?;
        if let Some(sub) = feeds.get(&queue.dir).and_then(|f| f.subscribe()) {
            return Some((sub, false));
        }
        let sub = Arc::new(Sub::default());
        let feed = Arc::new(Feed {
            state: Mutex::new(FeedState {
                open: true,
                subs: vec![sub.clone()],
                after: None,
            }),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(run(
            Arc::downgrade(&self.feeds),
            feed.clone(),
            self.client.clone(),
            queue.dir.clone(),
            queue.dir_end.clone(),
            self.op_timeout,
            self.linger,
        ));
        if let Ok(mut t) = feed.task.lock() {
            *t = Some(task);
        }
        feeds.insert(queue.dir.clone(), feed);
        Some((Subscription { sub }, true))
    }

    /// Closes the queue's feed so the next subscriber opens a new watch
    /// (maybe on another member): a waiter's re-check found a delete this
    /// one never passed on in a whole re-check period, as a watch on a
    /// paused member does. Its subscribers re-read and subscribe anew.
    pub(crate) fn reset(&self, queue: &Queue) {
        let feed = self
            .feeds
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&queue.dir));
        if let Some(feed) = feed {
            feed.close();
            if let Ok(mut t) = feed.task.lock() {
                if let Some(t) = t.take() {
                    t.abort();
                }
            }
        }
    }
}

impl Drop for WatchHub {
    fn drop(&mut self) {
        if let Ok(mut feeds) = self.feeds.lock() {
            for (_, feed) in feeds.drain() {
                feed.close();
                if let Ok(mut t) = feed.task.lock() {
                    if let Some(t) = t.take() {
                        t.abort();
                    }
                }
            }
        }
    }
}

/// Removes `feed` from the hub (if it is still the one for `dir`) and
/// closes it, so the next waiter opens a new one.
fn retire(feeds: &Weak<Feeds>, dir: &str, feed: &Arc<Feed>) {
    if let Some(feeds) = feeds.upgrade() {
        if let Ok(mut m) = feeds.lock() {
            if m.get(dir).is_some_and(|f| Arc::ptr_eq(f, feed)) {
                m.remove(dir);
            }
        }
    }
    feed.close();
}

/// Whether the feed has had no subscriber for `linger`; if so it is
/// retired, under the hub's lock so no subscriber can join meanwhile.
fn retire_if_idle(
    feeds: &Weak<Feeds>,
    dir: &str,
    feed: &Arc<Feed>,
    idle_since: Instant,
    linger: Duration,
) -> bool {
    if idle_since.elapsed() < linger {
        return false;
    }
    let Some(feeds) = feeds.upgrade() else {
        return true;
    };
    let Ok(mut m) = feeds.lock() else {
        return true;
    };
    let idle = feed.subscribers() == 0;
    if idle {
        if m.get(dir).is_some_and(|f| Arc::ptr_eq(f, feed)) {
            m.remove(dir);
        }
        feed.close();
    }
    idle
}

/// Runs one feed: opens the watch, passes its deletes on, ends on any end
/// of the watch or after [`LINGER`] without subscribers.
async fn run(
    feeds: Weak<Feeds>,
    feed: Arc<Feed>,
    client: Client,
    dir: String,
    dir_end: String,
    op_timeout: Duration,
    linger: Duration,
) {
    // No start revision: a watch from a revision already past joins etcd's
    // "unsynced" set and waits up to 100 ms for its first events; from
    // "now" it is synced at once, and the gap before it is the waiters'
    // to close (see `Subscription::after`).
    let opts = WatchOptions::new()
        .with_range(dir_end)
        .with_filters([WatchFilterType::NoPut]);
    let opened = tokio::time::timeout(
        op_timeout,
        client.watch_client().watch(dir.as_str(), Some(opts)),
    )
    .await;
    let mut stream = match opened {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(queue = %dir, error = %e, "opening the queue's watch failed");
            return retire(&feeds, &dir, &feed);
        }
        Err(_) => {
            tracing::debug!(queue = %dir, "opening the queue's watch timed out");
            return retire(&feeds, &dir, &feed);
        }
    };
    // The server's "created" reply must come within the request deadline.
    let mut created_by = Some(Instant::now() + op_timeout);
    let mut idle_since: Option<Instant> = None;
    // On a fixed schedule, not after a quiet spell: a busy queue's deletes
    // must not keep a feed nobody here waits on alive.
    let mut check_at = Instant::now() + linger / 4;
    loop {
        if Instant::now() >= check_at {
            check_at = Instant::now() + linger / 4;
            if feed.subscribers() > 0 {
                idle_since = None;
            } else {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if retire_if_idle(&feeds, &dir, &feed, since, linger) {
                    tracing::debug!(queue = %dir, "queue watch closed after lingering idle");
                    return;
                }
            }
        }
        let wake = created_by.unwrap_or(check_at);
        let msg = match tokio::time::timeout_at(wake, stream.message()).await {
            Ok(m) => m,
            Err(_) if created_by.is_some() => {
                tracing::debug!(queue = %dir, "the queue's watch was not created in time");
                return retire(&feeds, &dir, &feed);
            }
            Err(_) => continue,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                tracing::debug!(queue = %dir, "the queue's watch stream ended");
                return retire(&feeds, &dir, &feed);
            }
            Err(e) => {
                tracing::debug!(queue = %dir, error = %e, "the queue's watch failed");
                return retire(&feeds, &dir, &feed);
            }
        };
        if resp.canceled() {
            tracing::debug!(
                queue = %dir,
                reason = %resp.cancel_reason(),
                compacted = resp.compact_revision(),
                "the queue's watch was cancelled"
            );
            return retire(&feeds, &dir, &feed);
        }
        if resp.created() {
            created_by = None;
            // The watch reports every change after the revision it was
            // created at; without that revision we cannot say what it
            // covers.
            let Some(rev) = resp.header().map(|h| h.revision()) else {
                return retire(&feeds, &dir, &feed);
            };
            feed.started(rev);
        }
        for ev in resp.events() {
            if ev.event_type() != EventType::Delete {
                continue;
            }
            if let Some(kv) = ev.kv() {
                feed.deleted(&Arc::from(kv.key()), kv.mod_revision());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    fn receivers(hub: &WatchHub, queue: &Queue) -> usize {
        hub.feeds
            .lock()
            .unwrap()
            .get(&queue.dir)
            .unwrap()
            .subscribers()
    }

    fn set(keys: &[&str]) -> HashSet<Vec<u8>> {
        keys.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    /// Against a real etcd: one watch per queue however many subscribe; a
    /// waiter is woken only when the last key it waits for is deleted (or
    /// its own key), a delete at or before its read counts for nothing,
    /// deletes that come while it is not waiting are kept for its next
    /// wait, other queues' deletes never reach it; a late joiner covers
    /// from the last delete on; a dropped subscription leaves the feed; a
    /// reset closes it for its subscribers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_watch_per_queue_counts_each_waiters_keys_down() {
        let fleet = fleet::EtcdFleet::single().unwrap();
        let client = Client::connect(fleet.endpoints(), None).await.unwrap();
        let mut kv = client.kv_client();
        let hub = WatchHub::new(client.clone(), Duration::from_secs(2));
        let queue = Queue::new("t", "hub");
        let other = Queue::new("t", "hub/x");
        assert!(hub.join(&queue).is_none(), "join opened a feed");
        let until = Instant::now() + Duration::from_secs(5);
        let (mut a, opened) = hub.subscribe(&queue).unwrap();
        assert!(opened);
        let (mut b, opened) = hub.subscribe(&queue).unwrap();
        assert!(!opened, "a second watch for one queue");
        let start = a.after(until).await.unwrap();
        assert_eq!(b.after(until).await, Some(start));

        let k = |n: &str| format!("{}{n}", queue.dir);
        for n in ["k1", "k2", "k3", "mine"] {
            kv.put(k(n), "", None).await.unwrap();
        }
        kv.put(format!("{}k1", other.dir), "", None).await.unwrap();
        let old = kv.delete(k("k3"), None).await.unwrap();
        let old = old.header().unwrap().revision();
        // b reads (not waiting) while k1 goes: kept for its wait.
        let d1 = kv.delete(k("k1"), None).await.unwrap();
        let d1 = d1.header().unwrap().revision();
        // Another queue's delete of a key of the same name reaches no one.
        kv.delete(format!("{}k1", other.dir), None).await.unwrap();

        // a waits for k2 and k3; k3's delete is in its read (rev <= seen).
        let mut ahead = set(&[&k("k2"), &k("k3")]);
        let short = Instant::now() + Duration::from_millis(300);
        assert_eq!(
            a.wait(short, &mut ahead, old, k("mine").as_bytes()).await,
            Turn::Quiet
        );
        assert_eq!(
            ahead,
            set(&[&k("k2"), &k("k3")]),
            "a delete before the read counted"
        );
        // b waits for k1 and k2: k1 went while it read.
        let mut b_ahead = set(&[&k("k1"), &k("k2")]);
        assert_eq!(
            b.wait(short, &mut b_ahead, old, b"nobody").await,
            Turn::Quiet
        );
        assert_eq!(b_ahead, set(&[&k("k2")]), "the delete kept for the wait");

        let k2 = k("k2");
        let waiter = tokio::spawn(async move {
            let mut ahead = set(&[&k2]);
            let t = b.wait(until, &mut ahead, d1, b"nobody").await;
            (t, ahead.is_empty(), b)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "woken before its key went");
        let d2 = kv.delete(k("k2"), None).await.unwrap();
        let d2 = d2.header().unwrap().revision();
        let (turn, cleared, b) = waiter.await.unwrap();
        assert_eq!(turn, Turn::Cleared);
        assert!(cleared);
        // a still waits for k3 (deleted before its read): never cleared;
        // its own key's delete wakes it.
        kv.delete(k("mine"), None).await.unwrap();
        let mut ahead = set(&[&(k("k3"))]);
        assert_eq!(
            a.wait(until, &mut ahead, old, (k("mine")).as_bytes()).await,
            Turn::Gone
        );

        // A late joiner is told it covers from the last delete on.
        let mut c = hub.join(&queue).unwrap();
        assert!(c.after(until).await.unwrap() > d2);
        drop(c);
        drop(b);
        assert_eq!(receivers(&hub, &queue), 1, "a dropped subscription stayed");
        hub.reset(&queue);
        let mut ahead = set(&["x"]);
        assert_eq!(a.wait(until, &mut ahead, 0, b"y").await, Turn::Broken);
        assert!(hub.join(&queue).is_none(), "a reset feed still joinable");
    }

    /// A feed nobody subscribes to is closed after its linger, even while
    /// other clients' deletes keep coming on its queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unused_feed_closes_after_lingering_on_a_busy_queue() {
        let fleet = fleet::EtcdFleet::single().unwrap();
        let client = Client::connect(fleet.endpoints(), None).await.unwrap();
        let mut hub = WatchHub::new(client.clone(), Duration::from_secs(2));
        hub.linger = Duration::from_millis(400);
        let queue = Queue::new("t", "linger");
        let (mut a, _) = hub.subscribe(&queue).unwrap();
        a.after(Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        drop(a);
        let key = format!("{}busy", queue.dir);
        let mut kv = client.kv_client();
        let t0 = Instant::now();
        while hub.join(&queue).is_some() {
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "an unused feed lived on"
            );
            kv.put(key.as_str(), "", None).await.unwrap();
            kv.delete(key.as_str(), None).await.unwrap();
        }
        assert!(
            t0.elapsed() >= Duration::from_millis(400),
            "closed before its linger"
        );
    }
}
