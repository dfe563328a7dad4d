//! Connecting a client to the cluster.

use distlock::{Error, Result};
use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};

use crate::config::EtcdConfig;
use crate::error::{map_err, BACKEND};

/// Connects a client to `cfg.endpoints` (requests balanced over them).
pub(crate) async fn client(cfg: &EtcdConfig) -> Result<Client> {
    cfg.validate()?;
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.connect_timeout())
        .with_timeout(cfg.op_timeout())
        // A member cut off from the leader refuses at once instead of
        // letting requests (watches above all) hang.
        .with_require_leader(true);
    if cfg.endpoints.iter().any(|e| e.starts_with("https://")) {
        let mut tls = TlsOptions::new();
        if !cfg.ca_file.is_empty() {
            // The path stays out of the message: it is a TLS path.
            let pem = std::fs::read(&cfg.ca_file)
                .map_err(|e| Error::config("etcd.ca_file", format!("cannot read it: {e}")))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        opts = opts.with_tls(tls);
    }
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
