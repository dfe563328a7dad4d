//! The session: opening one (failing fast, with `TCP_NODELAY` kept on its
//! socket) and waiting for it to be connected again.

use distlock::{Error, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::BACKEND;

/// Opens a session, failing fast naming the endpoint.
pub(crate) async fn open(cfg: &ZkConfig) -> Result<zk::Client> {
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

/// Waits until the session is connected again, up to `until`.
pub(crate) async fn await_connected(client: &zk::Client, until: Instant) -> Result<()> {
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
