//! Connecting a client to the cluster.

use distlock::Result;
use etcd_client::{Client, ConnectOptions};

use crate::config::EtcdConfig;
use crate::error::{map_err, BACKEND};

/// Connects a client to `cfg.endpoints` (requests balanced over them).
pub(crate) async fn client(cfg: &EtcdConfig) -> Result<Client> {
    cfg.validate()?;
    let opts = ConnectOptions::new()
        .with_connect_timeout(cfg.connect_timeout())
        .with_timeout(cfg.op_timeout())
        // A member cut off from the leader refuses at once instead of
        // letting requests (watches above all) hang.
        .with_require_leader(true);
    distlock::with_deadline(
        BACKEND,
        || format!("connecting to {}", cfg.endpoints_shown()),
        cfg.connect_timeout(),
        async {
            Client::connect(&cfg.endpoints, Some(opts))
                .await
                .map_err(|e| map_err(format!("connecting to {}", cfg.endpoints_shown()), e, false))
        },
    )
    .await
}
