//! The acquire recipe: create our node with the children read pipelined
//! behind it, wait for our turn watching only our predecessor (its release
//! marker means our turn; a plain deletion means read the children again),
//! then hand out the guard; and [`DistLock`] for [`ZkLock`] on top of it.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    drift, AcquireOptions, Capabilities, DistLock, Error, FencingToken, Guard, GuardParts,
    LeaseMode, Result,
};
use tokio::sync::broadcast;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{lost_connection, timed, zk_err, BACKEND};
use crate::held::{keep, ZkHeld};
use crate::hub::{await_none_ahead, Deleted, Heard};
use crate::lock::ZkLock;
use crate::node::{sequence_of, withdraw_in_background, QueuedNode, EPHEMERAL_SEQUENTIAL};
use crate::session::await_connected;

impl ZkLock {
    /// Creates this acquisition's lock node with the children read
    /// pipelined behind it. Returns our node's name, its czxid, and the
    /// children if the read got through. On an error the node may exist:
    /// the caller's [`distlock::Pending`] deletes it.
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

    /// Checks that our node is still there, dating the session's last
    /// contact from this request.
    async fn confirm_mine(
        &self,
        client: &zk::Client,
        dir: &str,
        mine: &str,
        rt: &mut u32,
        contact: &mut Instant,
    ) -> std::result::Result<(), Option<Error>> {
        let path = format!("{dir}/{mine}");
        *rt += 1;
        let sent = Instant::now();
        match timed(self.cfg.op_timeout(), "exists", client.check_stat(&path)).await? {
            Ok(Some(_)) => {
                *contact = sent;
                Ok(())
            }
            Ok(None) => Err(Some(Error::backend(
                BACKEND,
                format!("waiting in {dir}"),
                "our lock node vanished (session expired or node deleted)",
            ))),
            Err(e) => Err(Some(zk_err(format!("exists {path}"), e))),
        }
    }

    /// Our turn, learnt from a watch event rather than a reply: after a
    /// long wait, one request on our node dates the session again
    /// (`valid_until` counts from the last reply).
    async fn turn_heard(
        &self,
        client: &zk::Client,
        dir: &str,
        mine: &str,
        rt: &mut u32,
        contact: &mut Instant,
    ) -> std::result::Result<(), Option<Error>> {
        if contact.elapsed() > client.session_timeout() / 3 {
            self.confirm_mine(client, dir, mine, rt, contact).await?;
        }
        Ok(())
    }

    /// Waits until our node is the lowest: from the directory's deletions
    /// (`heard`, see [`crate::hub`]), or, where that stream cannot be had,
    /// watching only our predecessor. `Err(None)` when the wait budget ran
    /// out.
    #[allow(clippy::too_many_arguments)]
    async fn wait_turn(
        &self,
        client: &zk::Client,
        dir: &str,
        mine: &str,
        mut children: Option<Vec<String>>,
        mut heard: Option<broadcast::Receiver<Deleted>>,
        deadline: Option<Instant>,
        rt: &mut u32,
        contact: &mut Instant,
    ) -> std::result::Result<(), Option<Error>> {
        let op = self.cfg.op_timeout();
        let mut use_hub = self.cfg.directory_watch;
        let mut feeds_lost = 0;
        // The nodes still ahead when a re-check was due (see `Recheck`).
        let mut expected: Option<HashSet<String>> = None;
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
            if use_hub {
                let Some(rx) = heard.as_mut() else {
                    // AddWatch, then the children read, in one pipeline: a
                    // session's requests are processed in order, so the
                    // read is answered after the watch is registered and no
                    // deletion falls between the two.
                    let added = client.watch(dir, zk::AddWatchMode::PersistentRecursive);
                    let listed = client.list_children(dir);
                    *rt += 1;
                    let sent = Instant::now();
                    let Ok((added, listed)) =
                        tokio::time::timeout(op, async { tokio::join!(added, listed) }).await
                    else {
                        continue;
                    };
                    match added {
                        Ok(w) => {
                            let (rx, fresh) = self.hub.adopt(client, dir, w);
                            heard = Some(rx);
                            if fresh {
                                if let Ok(k) = listed {
                                    *contact = sent;
                                    children = Some(k);
                                }
                            }
                        }
                        Err(e) => {
                            tracing::debug!(%dir, error = %e, "AddWatch refused; watching the predecessor");
                            use_hub = false;
                        }
                    }
                    continue;
                };
                let mut ahead: HashSet<String> =
                    queue[..pos].iter().map(|(_, c)| c.clone()).collect();
                if let Some(heard_of) = expected.take() {
                    if heard_of.iter().any(|n| !ahead.contains(n)) {
                        // A node ahead went and the feed never said so.
                        tracing::debug!(%dir, "directory watch missed a deletion; adding a new one");
                        self.hub.reset(dir);
                        heard = None;
                        continue;
                    }
                }
                let recheck = Instant::now() + client.session_timeout() / 3;
                match await_none_ahead(rx, &mut ahead, mine, recheck, deadline).await {
                    Heard::NoneAhead => {
                        self.wakeups.fetch_add(1, Ordering::Relaxed);
                        return self.turn_heard(client, dir, mine, rt, contact).await;
                    }
                    Heard::Relist => {
                        self.wakeups.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Heard::Recheck => {
                        expected = Some(ahead);
                        continue;
                    }
                    Heard::Closed => {
                        // The feed ended (a disconnection): a new watch on the
                        // session as it is now, or, past a few, the
                        // predecessor.
                        feeds_lost += 1;
                        use_hub = feeds_lost < 3;
                        heard = None;
                        continue;
                    }
                    Heard::Deadline => return Err(None),
                }
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
                    if event.event_type == zk::EventType::NodeDataChanged {
                        // Only a release writes a lock node's data, in the
                        // transaction that deletes it (`held::RELEASED`):
                        // our predecessor held the lock, so every node
                        // before it was gone, and no node can come between
                        // it and ours (sequences only grow). Ours is first.
                        return self.turn_heard(client, dir, mine, rt, contact).await;
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
        let deadline = wait.map(|w| distlock::deadline_after(invoked_at, w));
        let mut rt = 0;
        let mut contact = invoked_at;
        // Subscribed before the create: if this session already watches
        // the key, every deletion after our children read reaches us.
        let heard = deadline
            .filter(|_| self.cfg.directory_watch)
            .and_then(|_| self.hub.listen(client, &node.dir));
        let (mine, czxid, children) = self.enqueue(node, &mut rt, &mut contact).await?;
        let path = format!("{}/{mine}", node.dir);
        let waited = self
            .wait_turn(
                client,
                &node.dir,
                &mine,
                children,
                heard,
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

/// Whether `e` is a passing state: no reply in time, or no connection (a
/// server stalled, a leader lost, the session moving). Within the wait
/// budget it is a wait, not an answer (a newcomer gave up 2.7-3.1 s into
/// a leader pause with 20 s to go).
fn passing(e: &Error) -> bool {
    e.is_indeterminate()
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
        distlock::check_key(BACKEND, key)?;
        if opts.lease.is_some() {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "fixed leases (a ZooKeeper lock lives as long as its session)".into(),
            });
        }
        let invoked_at = Instant::now();
        let deadline = opts.wait.map(|w| distlock::deadline_after(invoked_at, w));
        // An attempt that failed in doubt has its node taken back by its
        // `Pending`, found by its GUID; a new one queues.
        distlock::retry_within_budget(
            key,
            deadline,
            passing,
            |e, tries| {
                let nap = Duration::from_millis(50u64 << tries.min(4));
                tracing::debug!(%key, error = %e, "acquire waits through a passing failure");
                nap
            },
            // Getting a session sends nothing for this key: its error (a
            // session that ended could not be opened again) is returned as
            // it is.
            || async {
                let client = self.session().await?;
                Ok(Arc::new(QueuedNode::new(
                    client,
                    self.lock_dir(key),
                    self.cfg.op_timeout(),
                )))
            },
            // `Pending` is armed before the create goes out: if this future
            // is dropped at any later await (before the create's reply,
            // while watching the predecessor), the node is deleted in the
            // background. Every attempt keeps the acquire's own start and
            // budget.
            |node: Arc<QueuedNode>| async move {
                self.take_turn(key, &node, opts.wait, invoked_at).await
            },
        )
        .await
    }
}
