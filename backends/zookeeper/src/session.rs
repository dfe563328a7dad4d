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
        Ok(Err(e)) => Err(Error::backend(
            BACKEND,
            what(),
            format!("{e} ({})", each_host(&cfg.connect).await),
        )),
        Err(_) => Err(Error::backend(
            BACKEND,
            what(),
            format!(
                "no session within {:?} ({})",
                cfg.connect_timeout(),
                each_host(&cfg.connect).await
            ),
        )),
    }
}

/// What each host of the connect string does, for an error where the
/// crate says only "no available hosts": refused, silent, or answering TCP
/// but not as ZooKeeper (a Redis or etcd port given by mistake).
async fn each_host(connect: &str) -> String {
    let (hosts, _) = crate::config::hosts_and_chroot(connect);
    let limit = std::time::Duration::from_secs(1);
    let said = futures::future::join_all(hosts.into_iter().map(|h| async move {
        match tokio::time::timeout(limit, tokio::net::TcpStream::connect(h)).await {
            Ok(Ok(_)) => format!("{h} accepts TCP but opened no ZooKeeper session"),
            Ok(Err(e)) => format!("{h}: {e}"),
            Err(_) => format!("{h}: no TCP answer within {limit:?}"),
        }
    }))
    .await;
    said.join("; ")
}

/// Sets `TCP_NODELAY` on the session's socket now and after every
/// reconnection.
///
/// The crate leaves Nagle's algorithm on (zookeeper-client 0.11.2,
/// `session/connection.rs`: a bare `TcpStream::connect`). Our acquire
/// writes the children read right behind the create; with Nagle on, the
/// kernel holds that second small segment until the server ACKs the
/// first, which it does with the create's reply after the fsync: the
/// "pipelined" read costs a whole extra round trip (`examples/rt_probe.rs`
/// measured it). The crate does not expose its socket, so
/// `lockbench-nodelay` finds our sockets connected to the ensemble.
fn keep_nodelay(client: &zk::Client, connect: &str) {
    let to = lockbench_nodelay::endpoints(connect);
    if to.is_empty() {
        return;
    }
    lockbench_nodelay::set_on_sockets_to(&to);
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            match states.changed().await {
                s if s.is_terminated() => return,
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    lockbench_nodelay::set_on_sockets_to(&to);
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
