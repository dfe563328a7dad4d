//! One RESP3 connection per lock client (to one server, the Sentinel
//! primary, or each cluster node): commands and release notifications
//! (pub/sub pushes) share it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::Result;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;

use crate::client::Con;
use crate::config::RedisConfig;
use crate::node::{self, map_err, ConnectOptions};

pub(crate) const BACKEND: &str = "redis";

#[derive(Default)]
struct Channels {
    /// Per channel: the wake-up and how many local waiters listen.
    map: HashMap<String, (Arc<Notify>, usize)>,
}

/// Routes release messages to the local waiters of each key (the unfair
/// lock: every waiter of the key), and turn messages to the one waiting
/// acquisition they name (the fair lock).
#[derive(Default)]
pub(crate) struct Notifier {
    channels: Mutex<Channels>,
    /// Fair waiters of this client, by owner value. `notify_one` keeps a
    /// permit, so a turn announced between a waiter's try and its sleep
    /// is not lost.
    turns: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A fair waiter's registration; unregisters when the acquire ends,
/// however it ends.
pub(crate) struct Turn {
    notifier: Arc<Notifier>,
    owner: String,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Ok(mut t) = self.notifier.turns.lock() {
            t.remove(&self.owner);
        }
    }
}

impl Notifier {
    /// Registers the fair acquisition `owner` for its turn messages.
    pub(crate) fn await_turn(self: &Arc<Self>, owner: &str) -> Turn {
        let notify = Arc::new(Notify::new());
        if let Ok(mut t) = self.turns.lock() {
            t.insert(owner.to_string(), notify.clone());
        }
        Turn {
            notifier: self.clone(),
            owner: owner.to_string(),
            notify,
        }
    }

    /// A turn message: the payload is the queue entry `<client>:<owner>`.
    fn turn(&self, entry: &[u8]) {
        let entry = String::from_utf8_lossy(entry);
        let owner = entry.split_once(':').map_or(&*entry, |(_, o)| o);
        if let Ok(t) = self.turns.lock() {
            if let Some(n) = t.get(owner) {
                n.notify_one();
            }
        }
    }

    fn wake(&self, channel: &str) {
        if let Ok(c) = self.channels.lock() {
            if let Some((n, _)) = c.map.get(channel) {
                n.notify_waiters();
            }
        }
    }

    fn wake_all(&self) {
        if let Ok(c) = self.channels.lock() {
            for (n, _) in c.map.values() {
                n.notify_waiters();
            }
        }
        if let Ok(t) = self.turns.lock() {
            for n in t.values() {
                n.notify_one();
            }
        }
    }

    /// Registers a waiter; returns its wake-up and whether it is the first
    /// (the one that must SUBSCRIBE).
    pub(crate) fn join(&self, channel: &str) -> (Arc<Notify>, bool) {
        let Ok(mut c) = self.channels.lock() else {
            return (Arc::new(Notify::new()), false);
        };
        let e = c
            .map
            .entry(channel.to_string())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        e.1 += 1;
        (e.0.clone(), e.1 == 1)
    }

    /// Unregisters a waiter; true if it was the last (UNSUBSCRIBE).
    pub(crate) fn leave(&self, channel: &str) -> bool {
        let Ok(mut c) = self.channels.lock() else {
            return false;
        };
        match c.map.get_mut(channel) {
            Some(e) if e.1 > 1 => {
                e.1 -= 1;
                false
            }
            Some(_) => {
                c.map.remove(channel);
                true
            }
            None => false,
        }
    }
}

/// A connected client: the connection (auto-reconnecting, RESP3) and the
/// notifier fed by its push messages.
#[derive(Clone)]
pub(crate) struct Conn {
    pub con: Con,
    pub notifier: Arc<Notifier>,
    pub cfg: Arc<RedisConfig>,
    /// This client's id in fair queue entries (`<client id>:<owner>`).
    pub client_id: Arc<str>,
    /// Subscribed (once, on the first fair wait) to this client's wake
    /// channel, where a release names the waiter whose turn it is.
    wake_subscribed: Arc<tokio::sync::OnceCell<()>>,
}

impl Conn {
    /// Connects, failing within `connect_timeout_ms` with the endpoint named.
    pub(crate) async fn connect(backend: &'static str, cfg: RedisConfig) -> Result<Self> {
        cfg.validate()?;
        let deployment = cfg.deployment()?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
        let con = Con::connect(
            backend,
            &deployment,
            ConnectOptions {
                connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
                op_timeout: cfg.response_timeout(),
                push: Some(tx),
                lazy: false,
                tls_ca: cfg.tls_ca()?,
            },
        )
        .await?;
        let notifier = Arc::new(Notifier::default());
        let weak = Arc::downgrade(&notifier);
        let client_id: Arc<str> = node::new_client_id().into();
        let wake_channel = Self::wake_channel_of(&cfg, &client_id);
        tokio::spawn(async move {
            while let Some(push) = rx.recv().await {
                let Some(n) = weak.upgrade() else { return };
                match push.kind {
                    PushKind::Message => match (push.data.first(), push.data.get(1)) {
                        (Some(Value::BulkString(ch)), Some(Value::BulkString(entry)))
                            if ch.as_slice() == wake_channel.as_bytes() =>
                        {
                            n.turn(entry)
                        }
                        (Some(Value::BulkString(ch)), _) => n.wake(&String::from_utf8_lossy(ch)),
                        _ => {}
                    },
                    // Messages may have been missed: let every waiter retry.
                    PushKind::Disconnection => n.wake_all(),
                    _ => {}
                }
            }
        });
        Ok(Self {
            con,
            notifier,
            cfg: Arc::new(cfg),
            client_id,
            wake_subscribed: Arc::new(tokio::sync::OnceCell::new()),
        })
    }

    fn wake_channel_of(cfg: &RedisConfig, client_id: &str) -> String {
        format!("{}{client_id}", node::wake_prefix(&cfg.key_prefix))
    }

    /// Whether this client already listens on its wake channel.
    pub(crate) fn wake_ready(&self) -> bool {
        self.wake_subscribed.initialized()
    }

    /// Subscribes to this client's wake channel unless it already is;
    /// true if this call sent the `SUBSCRIBE` (one round trip, once per
    /// client: reconnections and failovers subscribe again by themselves).
    ///
    /// # Errors
    /// As any request.
    pub(crate) async fn subscribe_wake(&self, backend: &'static str) -> Result<bool> {
        let mut sent = false;
        self.wake_subscribed
            .get_or_try_init(|| async {
                let ch = Self::wake_channel_of(&self.cfg, &self.client_id);
                let mut con = self.con.clone();
                sent = true;
                distlock::with_deadline(
                    backend,
                    || format!("SUBSCRIBE {ch}"),
                    self.cfg.op_timeout(),
                    async {
                        con.subscribe(&ch)
                            .await
                            .map_err(|e| map_err(backend, "SUBSCRIBE", e))
                    },
                )
                .await
            })
            .await?;
        Ok(sent)
    }

    /// The raw floor of a lock cycle: two PINGs, one after the other, on
    /// this same connection (on a cluster, to the master of `slot`), sent
    /// exactly as the lock's own calls are: on a clone of the connection,
    /// bounded by its response timeout and by no timer of ours (see
    /// `RedisHeld`: a second timer per call measurably slows a cycle, so
    /// the floor must not pay one the lock does not).
    pub(crate) async fn ping_twice(&self, slot: Option<u16>) -> Result<()> {
        for _ in 0..2 {
            let mut con = self.con.clone();
            con.ping(slot)
                .await
                .map_err(|e| map_err(BACKEND, "PING", e))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}
