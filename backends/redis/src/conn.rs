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
use crate::node::{map_err, ConnectOptions};

pub(crate) const BACKEND: &str = "redis";

#[derive(Default)]
struct Channels {
    /// Per channel: the wake-up and how many local waiters listen.
    map: HashMap<String, (Arc<Notify>, usize)>,
}

/// Routes release messages to the local waiters of each key.
#[derive(Default)]
pub(crate) struct Notifier {
    channels: Mutex<Channels>,
}

impl Notifier {
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
        tokio::spawn(async move {
            while let Some(push) = rx.recv().await {
                let Some(n) = weak.upgrade() else { return };
                match push.kind {
                    PushKind::Message => {
                        if let Some(Value::BulkString(ch)) = push.data.first() {
                            n.wake(&String::from_utf8_lossy(ch));
                        }
                    }
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
        })
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
