//! One acquisition's queue key: its name (reserved to it alone), what we
//! know of it on the server, and how it is taken back, exactly once.
//!
//! The same object is the [`distlock::Pending`] withdrawal of an acquire in
//! flight and the [`HeldLock`] of the guard it becomes: whoever comes first
//! (the guard's release, the withdrawal of a failed or cancelled acquire)
//! deletes the key; later calls find nothing left to do.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::{Error, HeldLock, Result};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::task::JoinHandle;

use crate::error::{map_err, BACKEND};
use crate::session::{revoke_in_background, Session};

/// Queue-key names a handle has in use, so each name is reused once its
/// key is known gone, and never by two acquisitions at once.
///
/// Reuse is for speed: etcd keeps a deleted key in its index until the
/// next compaction and every queue read walks those, so a fresh name per
/// acquisition would make each read slower than the last (the Lock RPC,
/// too, reuses `<name>/<lease>`). Uniqueness is for safety: the acquire
/// transaction adopts a key that already exists under its name, which is
/// right only if no other live acquisition can own that name. So a name is
/// reserved from before its put until its delete is confirmed, and two
/// acquisitions in flight on one key through one handle get `<lease>`,
/// `<lease>-1`, ...: the free list of each (key, lease) is the lowest
/// suffix not in use.
#[derive(Debug, Default)]
pub(crate) struct Names(Mutex<HashSet<String>>);

impl Names {
    /// Reserves the first free name `base`, `base-1`, `base-2`, ...
    pub(crate) fn reserve(&self, base: String) -> String {
        let Ok(mut set) = self.0.lock() else {
            // Poisoned: never reuse a name, which is always safe.
            return format!("{base}-r{:016x}", rand::random::<u64>());
        };
        if set.insert(base.clone()) {
            return base;
        }
        let mut n = 1u64;
        loop {
            let name = format!("{base}-{n:x}");
            if set.insert(name.clone()) {
                return name;
            }
            n += 1;
        }
    }

    /// Gives `name` back: its key is known gone and no request of ours can
    /// still create it.
    fn free(&self, name: &str) {
        if let Ok(mut set) = self.0.lock() {
            set.remove(name);
        }
    }

    /// How many names are reserved (tests).
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.0.lock().map_or(0, |s| s.len())
    }
}

/// What we know of our key on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    /// No put sent yet: nothing to take back.
    Unsent,
    /// A put may have landed (sent, reply not seen); its create revision is
    /// unknown.
    Unknown,
    /// Our key, created at this revision.
    Created(i64),
    /// Taken back (or handed to a background task that will): final.
    Done,
}

/// One acquisition's queue key; see the module docs.
pub(crate) struct QueueKey {
    client: Client,
    names: Arc<Names>,
    name: String,
    state: Mutex<KeyState>,
    /// The lease of a fixed-lease lock: revoked once the key is taken back.
    own_lease: Option<i64>,
    /// The session a watchdog-mode lock reports to once held.
    session: Option<Arc<Session>>,
    /// A fixed lease's end, enforced: revokes the lease when it is due.
    expiry: Mutex<Option<JoinHandle<()>>>,
    /// How long a put we gave up on may still land (see [`late_puts`]).
    op_timeout: Duration,
}

impl std::fmt::Debug for QueueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueKey")
            .field("name", &self.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl QueueKey {
    /// A key under `name` (reserved in `names` by the caller) on a session
    /// lease or on a fixed lease of its own.
    pub(crate) fn new(
        client: Client,
        names: Arc<Names>,
        name: String,
        session: Option<Arc<Session>>,
        own_lease: Option<i64>,
        op_timeout: Duration,
    ) -> Self {
        Self {
            client,
            names,
            name,
            state: Mutex::new(KeyState::Unsent),
            own_lease,
            session,
            expiry: Mutex::new(None),
            op_timeout,
        }
    }

    /// The etcd key.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn state(&self) -> KeyState {
        self.state.lock().map_or(KeyState::Done, |s| *s)
    }

    fn set_state(&self, from: impl Fn(KeyState) -> bool, to: KeyState) {
        if let Ok(mut s) = self.state.lock() {
            if from(*s) {
                *s = to;
            }
        }
    }

    /// The put is about to go out: from here on it may land.
    pub(crate) fn sending(&self) {
        self.set_state(|s| s == KeyState::Unsent, KeyState::Unknown);
    }

    /// The put's reply came: our key exists with create revision `rev`.
    pub(crate) fn created(&self, rev: i64) {
        self.set_state(|s| s != KeyState::Done, KeyState::Created(rev));
    }

    /// Arms the revoke at a fixed lease's end.
    pub(crate) fn set_expiry(&self, task: JoinHandle<()>) {
        if let Ok(mut t) = self.expiry.lock() {
            if let Some(old) = t.replace(task) {
                old.abort();
            }
        }
    }

    /// Takes back whatever this acquisition has on the server, once (every
    /// later call returns `Ok(false)` at once). `Ok(true)` = our key was
    /// there and is now deleted.
    ///
    /// Deletes are conditional on OUR create revision, so a late one (a
    /// retry, a background attempt) can never remove a newer key that
    /// reuses the name. Where the revision is unknown (a put whose reply
    /// was lost) the delete is by name: safe because the name stays
    /// reserved to this acquisition until no put of it can land any more,
    /// so whatever is under it is ours (see [`late_puts`]).
    pub(crate) async fn take_back(&self) -> Result<bool> {
        let state = match self.state.lock() {
            Ok(mut s) => std::mem::replace(&mut *s, KeyState::Done),
            // Poisoned: do nothing rather than risk a wrong delete; the
            // name stays reserved, the lease ends the key.
            Err(_) => KeyState::Done,
        };
        if let Ok(mut t) = self.expiry.lock() {
            if let Some(t) = t.take() {
                t.abort();
            }
        }
        // `Done` is set before the delete goes out, so that no second call
        // sends one too; if this future is dropped before the delete is
        // answered (a cancelled release or withdrawal), the delete may never
        // have been sent, and every later call would find `Done`: the key
        // stayed on the live session's lease, blocking the key for good
        // (a probe: 10 of 30 cancelled releases). The guard hands it to
        // the background instead.
        let mut unfinished = Unfinished {
            key: self,
            state: Some(state),
        };
        let r = match state {
            KeyState::Done => return Ok(false),
            KeyState::Unsent => {
                self.names.free(&self.name);
                Ok(false)
            }
            KeyState::Created(rev) => {
                if let Some(s) = &self.session {
                    s.unregister(&self.name, rev);
                }
                self.delete_mine(rev).await
            }
            KeyState::Unknown => self.delete_unknown().await,
        };
        unfinished.state = None;
        // After the delete: revoking first would delete the key too and
        // leave us unable to tell whether it was still ours.
        if let Some(id) = self.own_lease {
            revoke_in_background(&self.client, id);
        }
        r
    }

    /// `Txn(create_revision(name) == rev) then delete`, a few quick tries
    /// (the balanced channel keeps picking a dead member for a while after
    /// it died, and a waiter queued behind this key stalls until it is
    /// gone), then in the background.
    async fn delete_mine(&self, rev: i64) -> Result<bool> {
        let mut kv = self.client.kv_client();
        let mut retried = false;
        let mut last = None;
        let t0 = std::time::Instant::now();
        for i in 0..5 {
            if i > 0 {
                // Quick tries are for a member that refuses at once; one
                // that does not answer (paused, cut off) has had a whole
                // request deadline: the caller is not kept for 5 of them.
                if t0.elapsed() >= self.op_timeout {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(rand::random_range(5..25))).await;
            }
            match kv.txn(delete_if_mine(&self.name, rev)).await {
                Ok(r) => {
                    // Ours is gone either way, and no request of ours can
                    // bring it back: the name is free again.
                    self.names.free(&self.name);
                    return match (r.succeeded(), retried) {
                        (true, _) => Ok(true),
                        (false, false) => Ok(false),
                        // An earlier try may have deleted it: say we cannot tell.
                        (false, true) => Err(Error::indeterminate(
                            BACKEND,
                            format!("release {}", self.name),
                            "a failed first delete may have removed the key",
                        )),
                    };
                }
                Err(e) => {
                    tracing::debug!(key = %self.name, error = %e, "delete failed; trying again");
                    retried = true;
                    last = Some(e);
                }
            }
        }
        // A key on the session lease would otherwise stay for as long as
        // the session lives, blocking every waiter behind it.
        self.in_background(Some(rev));
        Err(match last {
            Some(e) => map_err(format!("release {}", self.name), e, true),
            None => Error::indeterminate(BACKEND, format!("release {}", self.name), "no reply"),
        })
    }

    /// A delete by name now (so a retry of the acquisition does not queue
    /// behind our own key), and the watch for a late put in the background.
    async fn delete_unknown(&self) -> Result<bool> {
        let mut kv = self.client.kv_client();
        let t0 = std::time::Instant::now();
        for i in 0..3 {
            if i > 0 {
                if t0.elapsed() >= self.op_timeout {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(rand::random_range(5..25))).await;
            }
            match kv.delete(self.name.as_str(), None).await {
                Ok(r) => {
                    self.spawn(late_puts(
                        self.client.clone(),
                        self.names.clone(),
                        self.name.clone(),
                        self.op_timeout,
                    ));
                    return Ok(r.deleted() > 0);
                }
                Err(e) => {
                    tracing::debug!(key = %self.name, error = %e, "withdrawing failed; trying again")
                }
            }
        }
        self.in_background(None);
        Err(Error::indeterminate(
            BACKEND,
            format!("withdrawing {}", self.name),
            "no delete went through; retrying in the background",
        ))
    }

    /// Keeps deleting in the background: by revision (`Some`) or, for an
    /// unknown one, by name and then watching for a late put.
    fn in_background(&self, rev: Option<i64>) {
        self.keep_deleting(rev, false);
    }

    /// [`Self::in_background`], the first try at once when `at_once`.
    fn keep_deleting(&self, rev: Option<i64>, at_once: bool) {
        let (client, names, name, op_timeout) = (
            self.client.clone(),
            self.names.clone(),
            self.name.clone(),
            self.op_timeout,
        );
        self.spawn(async move {
            let kv = client.kv_client();
            let done = until_done(at_once, || {
                // A cheap handle on the same channel, owned by the attempt.
                let (mut kv, name) = (kv.clone(), name.clone());
                async move {
                    match rev {
                        Some(rev) => kv.txn(delete_if_mine(&name, rev)).await.is_ok(),
                        None => kv.delete(name.as_str(), None).await.is_ok(),
                    }
                }
            })
            .await;
            if done {
                match rev {
                    Some(_) => names.free(&name),
                    None => late_puts(client, names, name, op_timeout).await,
                }
                return;
            }
            // The name stays reserved: never reused while its key may live.
            tracing::error!(key = %name, "could not delete a lock key in 10 minutes; it lives until its lease ends");
        });
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(task);
        }
    }
}

/// A take-back whose future was dropped before its delete was answered:
/// the delete goes on in the background, first try at once.
struct Unfinished<'a> {
    key: &'a QueueKey,
    /// What was taken; `None` once the take-back ran to its end.
    state: Option<KeyState>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        match self.state.take() {
            Some(KeyState::Created(rev)) => self.key.keep_deleting(Some(rev), true),
            Some(KeyState::Unknown) => self.key.keep_deleting(None, true),
            _ => {}
        }
    }
}

/// `Txn(create_revision(name) == rev) then delete(name)`: deletes our key
/// and never a newer one under the same name.
fn delete_if_mine(name: &str, rev: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(name, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(name, None)])
}

/// After a put whose reply was lost was taken back by name: the put may
/// still be in the server's pipeline (the client gave up on it, the server
/// did not) and land after our delete. Delete by name again after 100 ms,
/// 1 s and twice the request deadline (each delete retried until it goes
/// through, see [`until_done`]), keeping the name reserved meanwhile
/// so nothing else of ours can be under it; then give the name back. Should
/// a put land later still, the next acquisition under the name adopts its
/// key (its acquire transaction finds it) — ours, on our lease, ordered by
/// its create revision like any queue key — or the lease ends it.
async fn late_puts(client: Client, names: Arc<Names>, name: String, op_timeout: Duration) {
    let kv = client.kv_client();
    let mut at = Duration::ZERO;
    for check in [
        Duration::from_millis(100),
        Duration::from_secs(1),
        (op_timeout * 2).max(Duration::from_secs(2)),
    ] {
        tokio::time::sleep(check.saturating_sub(at)).await;
        at = check;
        let ok = until_done(true, || {
            let (mut kv, name) = (kv.clone(), name.clone());
            async move {
                match kv.delete(name.as_str(), None).await {
                    Ok(r) => {
                        if r.deleted() > 0 {
                            tracing::debug!(key = %name, "deleted a queue key whose put landed late");
                        }
                        true
                    }
                    Err(_) => false,
                }
            }
        })
        .await;
        if !ok {
            tracing::error!(key = %name, "could not check for a late put in 10 minutes; the name stays reserved");
            return;
        }
    }
    names.free(&name);
}

/// Runs `attempt` until it says done: every 100-500 ms for the first 30 s
/// (a waiter queued behind the key stalls until it is gone, so retry
/// briskly through an election), then every 2 s up to 10 minutes. A key
/// left behind lives as long as the session that keeps its lease alive, so
/// giving up after a few failed tries blocked the lock for everyone: 5
/// tries in ~1 s, all during a minority partition of 3 s, left a late put
/// at the head of the queue and a 4-worker run waiting for good.
async fn until_done<F, Fut>(at_once: bool, mut attempt: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    for i in 0u32.. {
        if i > 0 || !at_once {
            let pause = if start.elapsed() < Duration::from_secs(30) {
                Duration::from_millis(100) * (i + 1).min(5)
            } else {
                Duration::from_secs(2)
            };
            tokio::time::sleep(pause).await;
        }
        if attempt().await {
            return true;
        }
        if start.elapsed() >= Duration::from_secs(600) {
            break;
        }
    }
    false
}

#[async_trait]
impl HeldLock for QueueKey {
    /// One round trip: delete our key if it still has our create revision;
    /// it did = the lock was still ours.
    async fn release(&self) -> Result<bool> {
        self.take_back().await
    }

    async fn renew(&self, _lease: Duration) -> Result<bool> {
        // Never called: a watchdog-mode lock rides on the session lease,
        // which the session keeps alive for all of them at once.
        Err(Error::Unsupported {
            backend: BACKEND,
            what: "renewing one lock (the session lease is kept alive as a whole)".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_while_reserved_and_reused_once_free() {
        let n = Names::default();
        let a = n.reserve("q/1".into());
        let b = n.reserve("q/1".into());
        let c = n.reserve("q/1".into());
        assert_eq!(
            (a.as_str(), b.as_str(), c.as_str()),
            ("q/1", "q/1-1", "q/1-2")
        );
        n.free(&b);
        assert_eq!(
            n.reserve("q/1".into()),
            "q/1-1",
            "the free suffix is taken first"
        );
        n.free(&a);
        n.free(&b);
        n.free(&c);
        assert_eq!(n.in_use(), 0);
        assert_eq!(n.reserve("q/1".into()), "q/1");
    }

    /// A background delete keeps trying past the 5 tries (~1 s) that a
    /// minority partition of 3 s outlasted: here it fails 8 times (~3 s of
    /// the brisk schedule) and still goes through.
    #[tokio::test]
    async fn a_background_delete_outlasts_a_few_seconds_of_failures() {
        let tries = std::sync::atomic::AtomicU32::new(0);
        let t0 = std::time::Instant::now();
        let done = until_done(true, || {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { n >= 8 }
        })
        .await;
        assert!(done);
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 9);
        assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    /// Against a real etcd: a take-back that comes late (a release after the
    /// key went, a background retry) finds a NEWER key under its name and
    /// leaves it alone, because it deletes by our create revision only.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_delete_never_removes_a_newer_key_under_the_same_name() {
        let fleet = fleet::EtcdFleet::single().unwrap();
        let client = Client::connect(fleet.endpoints(), None).await.unwrap();
        let mut kv = client.kv_client();
        let names = Arc::new(Names::default());
        let name = names.reserve("t/q/0000000000000001".into());
        let old = QueueKey::new(
            client.clone(),
            names.clone(),
            name.clone(),
            None,
            None,
            Duration::from_secs(2),
        );
        old.sending();
        let r1 = kv.put(name.as_str(), "", None).await.unwrap();
        old.created(r1.header().unwrap().revision());
        // Our key goes behind our back, and a newer one takes its name.
        kv.delete(name.as_str(), None).await.unwrap();
        let r2 = kv
            .put(name.as_str(), "", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        assert!(
            !old.take_back().await.unwrap(),
            "a late delete claimed a newer key"
        );
        let now = kv.get(name.as_str(), None).await.unwrap();
        assert_eq!(
            now.kvs().first().map(|kv| kv.create_revision()),
            Some(r2),
            "a late delete removed a newer key under the same name"
        );
        // Once taken back, the name is free again, and a second take-back
        // (a guard's release after the withdrawal) does nothing.
        assert_eq!(names.in_use(), 0);
        assert!(!old.take_back().await.unwrap());
        assert_eq!(kv.get(name.as_str(), None).await.unwrap().count(), 1);

        // A put whose reply was lost: taken back by name, and the name is
        // kept out of use until a late landing can no longer happen.
        let name = names.reserve("t/q/0000000000000002".into());
        let lost = QueueKey::new(
            client.clone(),
            names.clone(),
            name.clone(),
            None,
            None,
            Duration::from_millis(500),
        );
        lost.sending();
        kv.put(name.as_str(), "", None).await.unwrap();
        assert!(lost.take_back().await.unwrap());
        assert_eq!(kv.get(name.as_str(), None).await.unwrap().count(), 0);
        // The put "lands late", after our delete.
        kv.put(name.as_str(), "", None).await.unwrap();
        assert_eq!(
            names.reserve("t/q/0000000000000002".into()),
            "t/q/0000000000000002-1",
            "the name of an unknown put was reused at once"
        );
        // Polled, not read once at 300 ms: the 100 ms check may miss a
        // put that took longer to land on a loaded machine, and the 1 s one
        // then removes it. Without the checks it stays for good.
        let until = tokio::time::Instant::now() + Duration::from_millis(1_500);
        while kv.get(name.as_str(), None).await.unwrap().count() > 0
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            kv.get(name.as_str(), None).await.unwrap().count(),
            0,
            "a late-landing put was left in the queue"
        );
        let until = tokio::time::Instant::now() + Duration::from_secs(4);
        while names.in_use() != 1 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            names.in_use(),
            1,
            "the name was not given back after the late-put checks"
        );
    }
}
