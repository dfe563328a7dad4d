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
//! - Every delete is passed to every local subscriber of the feed (a
//!   broadcast channel); each waiter keeps the set of keys ahead of it and
//!   takes out those it sees deleted. A handle has few waiters per key
//!   (one per worker process is the norm), so sharing by filtering in the
//!   waiter is cheaper than routing by key, and a waiter watching every key
//!   ahead of it needs no re-read when its turn comes.
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
//!   cancelled acquire) simply leaves the channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::queue::Queue;

/// How long a feed stays open without subscribers.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// Deletes a subscriber may fall behind by before it must re-read.
const BACKLOG: usize = 1024;

/// What a feed passes on.
#[derive(Debug, Clone)]
enum Note {
    /// The watch is open: every delete after this revision follows.
    Started(i64),
    /// `key` was deleted at revision `rev`.
    Deleted { key: Arc<[u8]>, rev: i64 },
}

/// What a subscriber gets next.
#[derive(Debug)]
pub(crate) enum Next {
    /// `key` was deleted at revision `rev`.
    Deleted { key: Arc<[u8]>, rev: i64 },
    /// Nothing until the deadline.
    Quiet,
    /// The feed ended, or we fell too far behind: deletes may be missing.
    Broken,
}

struct FeedState {
    /// `None` once the feed has ended: no new subscribers.
    tx: Option<broadcast::Sender<Note>>,
    /// Every delete after this revision is (or will be) on `tx`; `None`
    /// until the watch is open.
    after: Option<i64>,
}

struct Feed {
    state: Mutex<FeedState>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Feed {
    fn subscribe(&self) -> Option<Subscription> {
        let s = self.state.lock().ok()?;
        Some(Subscription {
            rx: s.tx.as_ref()?.subscribe(),
            after: s.after,
        })
    }

    fn subscribers(&self) -> usize {
        self.state
            .lock()
            .map_or(0, |s| s.tx.as_ref().map_or(0, |tx| tx.receiver_count()))
    }

    /// Passes `note` on; the revision it covers up to moves with it.
    fn pass(&self, note: Note) {
        if let Ok(mut s) = self.state.lock() {
            let rev = match &note {
                Note::Started(rev) | Note::Deleted { rev, .. } => *rev,
            };
            s.after = Some(s.after.map_or(rev, |a| a.max(rev)));
            if let Some(tx) = &s.tx {
                // No subscriber right now is fine.
                let _ = tx.send(note);
            }
        }
    }

    fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.tx = None;
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
    rx: broadcast::Receiver<Note>,
    after: Option<i64>,
}

impl Subscription {
    /// The revision after which this subscription sees every delete,
    /// waiting for the watch to open if it is not yet; `None` if it did
    /// not open by `until` or ended.
    pub(crate) async fn after(&mut self, until: Instant) -> Option<i64> {
        while self.after.is_none() {
            match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Ok(Note::Started(rev))) => self.after = Some(rev),
                // Deletes come only after the start.
                Ok(Ok(Note::Deleted { .. })) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
        self.after
    }

    /// The next delete, or why there is none by `until`.
    pub(crate) async fn next(&mut self, until: Instant) -> Next {
        loop {
            return match tokio::time::timeout_at(until, self.rx.recv()).await {
                Err(_) => Next::Quiet,
                Ok(Ok(Note::Deleted { key, rev })) => Next::Deleted { key, rev },
                Ok(Ok(Note::Started(_))) => continue,
                Ok(Err(RecvError::Lagged(n))) => {
                    tracing::debug!(missed = n, "fell behind the queue's watch");
                    Next::Broken
                }
                Ok(Err(RecvError::Closed)) => Next::Broken,
            };
        }
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
        let (tx, rx) = broadcast::channel(BACKLOG);
        let feed = Arc::new(Feed {
            state: Mutex::new(FeedState {
                tx: Some(tx),
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
        Some((Subscription { rx, after: None }, true))
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
            feed.pass(Note::Started(rev));
        }
        for ev in resp.events() {
            if ev.event_type() != EventType::Delete {
                continue;
            }
            if let Some(kv) = ev.kv() {
                feed.pass(Note::Deleted {
                    key: Arc::from(kv.key()),
                    rev: kv.mod_revision(),
                });
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

    /// Against a real etcd: one watch per queue however many subscribe;
    /// deletes in the queue (only) are passed on with their revisions,
    /// covering everything after the watch's start; a dropped subscription
    /// leaves the feed; a reset closes it for its subscribers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_watch_per_queue_passes_its_deletes_on() {
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

        let key = format!("{}k1", queue.dir);
        kv.put(key.as_str(), "", None).await.unwrap();
        kv.put(format!("{}k1", other.dir), "", None).await.unwrap();
        kv.delete(format!("{}k1", other.dir), None).await.unwrap();
        let del = kv.delete(key.as_str(), None).await.unwrap();
        let rev = del.header().unwrap().revision();
        for s in [&mut a, &mut b] {
            match s.next(until).await {
                Next::Deleted { key: k, rev: r } => {
                    assert_eq!(&*k, key.as_bytes());
                    assert_eq!(r, rev);
                }
                n => panic!("expected the delete, got {n:?}"),
            }
        }
        // A late joiner is told it covers from that delete on.
        let c = hub.join(&queue).unwrap();
        assert_eq!(c.after, Some(rev));
        drop(c);
        drop(b);
        assert_eq!(receivers(&hub, &queue), 1, "a dropped subscription stayed");
        hub.reset(&queue);
        assert!(matches!(a.next(until).await, Next::Broken));
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
