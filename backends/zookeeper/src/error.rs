//! Error mapping shared by every module of the crate: which ZooKeeper
//! errors leave a request's outcome unknown, and our deadline on each
//! request.

use std::future::Future;
use std::time::Duration;

use distlock::{Error, Result};
use zookeeper_client as zk;

pub(crate) const BACKEND: &str = "zookeeper";

/// Whether `e` says the request's fate is unknown: the connection broke
/// (the crate reports a connection that stopped answering as a custom
/// error, not `ConnectionLoss`) rather than the server answering.
pub(crate) fn lost_connection(e: &zk::Error) -> bool {
    use zk::Error as E;
    !matches!(
        e,
        E::NoNode
            | E::NodeExists
            | E::BadVersion
            | E::NotEmpty
            | E::NoAuth
            | E::InvalidAcl
            | E::NoChildrenForEphemerals
            | E::BadArguments(_)
            | E::SessionExpired
            | E::SessionMoved
            | E::ClientClosed
            | E::AuthFailed
    )
}

/// A ZooKeeper error as ours; a lost connection leaves the request's
/// outcome unknown.
pub(crate) fn zk_err(context: impl Into<String>, e: zk::Error) -> Error {
    if lost_connection(&e) {
        Error::indeterminate(BACKEND, context, e)
    } else {
        Error::backend(BACKEND, context, e)
    }
}

/// Runs one request under `limit`. The outer error is our deadline (the
/// outcome is unknown); the inner result is ZooKeeper's answer, left for
/// the caller to interpret (`NoNode` is often an answer, not a failure).
pub(crate) async fn timed<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = std::result::Result<T, zk::Error>>,
) -> Result<std::result::Result<T, zk::Error>> {
    tokio::time::timeout(limit, fut).await.map_err(|_| {
        Error::indeterminate(
            BACKEND,
            what.to_string(),
            format!("no reply within {limit:?}"),
        )
    })
}
