//! Bench probes on a handle's session: the raw floor of one lock cycle,
//! and the `zookeeper-client` crate's own lock recipe as a peer.

use distlock::{Error, Result};
use zookeeper_client as zk;

use crate::error::{timed, zk_err};
use crate::lock::ZkLock;
use crate::node::{CONTAINER, EPHEMERAL_SEQUENTIAL};

impl ZkLock {
    /// The raw floor: create + delete of an ephemeral-sequential node on
    /// this handle's session: two round trips, like one lock cycle.
    ///
    /// # Errors
    /// As any request.
    pub async fn floor_round_trip(&self) -> Result<()> {
        let client = self.session().await?;
        let op = self.cfg.op_timeout();
        let dir = self.lock_dir("lockbench:floor");
        let prefix = format!("{dir}/n-");
        let mut rt = 0;
        let mut made_dir = false;
        loop {
            match timed(
                op,
                "create",
                client.create(&prefix, &[], &EPHEMERAL_SEQUENTIAL),
            )
            .await?
            {
                Ok((_, seq)) => {
                    return timed(op, "delete", client.delete(&format!("{prefix}{seq}"), None))
                        .await?
                        .map_err(|e| zk_err("delete", e));
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    self.make_dir(&client, &dir, &mut rt).await?;
                }
                Err(e) => return Err(zk_err(format!("create {prefix}"), e)),
            }
        }
    }

    /// One acquire + release of `key` with the `zookeeper-client` crate's
    /// own lock recipe (`Client::lock` with Curator's prefix), on this
    /// handle's session: the peer the latency workload times next to ours.
    ///
    /// # Errors
    /// As any request.
    pub async fn crate_recipe_cycle(&self, key: &str) -> Result<()> {
        let client = self.session().await?;
        let op = self.cfg.op_timeout();
        let dir = self.lock_dir(key);
        let prefix = zk::LockPrefix::new_curator(&dir, "lock-")
            .map_err(|e| Error::backend("zookeeper-client", "lock prefix", e))?;
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(CONTAINER)
            .map_err(|e| Error::backend("zookeeper-client", "lock options", e))?;
        let lock = tokio::time::timeout(op, client.lock(prefix, b"", options))
            .await
            .map_err(|_| {
                Error::indeterminate("zookeeper-client", "lock", format!("not within {op:?}"))
            })?
            .map_err(|e| zk_err("zookeeper-client lock", e))?;
        let path = lock.lock_path().to_string();
        // Its guard deletes in the background on drop; delete here and
        // wait, as our release does, so both cycles end released. The
        // guard is then forgotten (leaking its path string) so it does
        // not send a second delete.
        let r = timed(op, "delete", client.delete(&path, None)).await;
        std::mem::forget(lock);
        r?.map_err(|e| zk_err("zookeeper-client unlock", e))
    }
}
