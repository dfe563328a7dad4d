//! etcd's own Lock RPC (the server-side `concurrency.Mutex`), as a peer.

use std::sync::Arc;

use distlock::Result;
use etcd_client::{Client, LockOptions};

use crate::config::EtcdConfig;
use crate::connect::client;
use crate::error::map_err;
use crate::session::Session;

/// Lock + unlock of one name through etcd's Lock RPC (`etcd-client`'s
/// `lock`/`unlock`), on a session lease of its own kept alive like ours:
/// without one the server would grant a fresh lease per call.
pub struct LockRpc {
    client: Client,
    session: Arc<Session>,
    name: String,
}

impl std::fmt::Debug for LockRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRpc")
            .field("name", &self.name)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl LockRpc {
    /// Connects and grants the session lease; the lock lives under
    /// `<prefix>/rpc/<name>` (apart from [`crate::EtcdLock`]'s queues).
    ///
    /// # Errors
    /// As for [`crate::EtcdLock::connect`].
    pub async fn connect(cfg: &EtcdConfig, name: &str) -> Result<Self> {
        let client = client(cfg).await?;
        let session = Session::grant(&client, cfg.session_ttl(), cfg.op_timeout()).await?;
        Ok(Self {
            client,
            session,
            name: format!("{}/rpc/{name}", cfg.prefix),
        })
    }

    /// One cycle: Lock (waits server-side) then Unlock of the returned key.
    ///
    /// # Errors
    /// As any request.
    pub async fn cycle(&self) -> Result<()> {
        let mut c = self.client.lock_client();
        let held = c
            .lock(
                self.name.as_str(),
                Some(LockOptions::new().with_lease(self.session.id)),
            )
            .await
            .map_err(|e| map_err("Lock RPC", e, true))?;
        c.unlock(held.key())
            .await
            .map_err(|e| map_err("Unlock RPC", e, true))?;
        Ok(())
    }
}
