//! The ZooKeeper fleet and the conformance subject, shared by the test files.

#![allow(dead_code)] // each test file uses its own subset

use std::sync::Arc;
use std::time::Duration;

use distlock::testing::Subject;
use distlock::{DistLock, Error, Result};
use fleet::ZkFleet;
use lockbench_zookeeper::{ZkConfig, ZkLock};
use zookeeper_client as zk;

pub struct Zk {
    pub cfg: ZkConfig,
    pub fleet: ZkFleet,
}

pub fn cfg_for(fleet: &ZkFleet, session_ms: u64) -> ZkConfig {
    let mut cfg = ZkConfig::new(fleet.connect_string());
    cfg.session_timeout_ms = session_ms;
    cfg
}

impl Zk {
    pub fn standalone() -> Self {
        let fleet = ZkFleet::standalone().unwrap();
        Self {
            cfg: cfg_for(&fleet, 2_000),
            fleet,
        }
    }

    pub fn ensemble() -> Self {
        let fleet = ZkFleet::ensemble(3).unwrap();
        Self {
            cfg: cfg_for(&fleet, 4_000),
            fleet,
        }
    }
}

/// A plain client for looking behind the lock's back.
pub async fn admin(connect: &str) -> zk::Client {
    zk::Client::connect(connect).await.unwrap()
}

#[async_trait::async_trait]
impl Subject for Zk {
    async fn client(&self) -> Result<Arc<dyn DistLock>> {
        Ok(Arc::new(ZkLock::connect(self.cfg.clone()).await?))
    }

    async fn sabotage(&self, key: &str) -> Result<()> {
        let lock = ZkLock::connect(self.cfg.clone()).await?;
        let dir = lock.lock_dir(key);
        let c = admin(&self.fleet.connect_string()).await;
        for child in c.list_children(&dir).await.unwrap_or_default() {
            let _ = c.delete(&format!("{dir}/{child}"), None).await;
        }
        Ok(())
    }

    fn watchdog_lease(&self) -> Duration {
        Duration::from_millis(self.cfg.session_timeout_ms)
    }

    async fn unreachable_client(&self) -> (String, Result<Arc<dyn DistLock>>) {
        let connect = "127.0.0.1:1".to_string();
        let r = ZkLock::connect(ZkConfig::new(connect.clone())).await;
        (connect, r.map(|l| Arc::new(l) as Arc<dyn DistLock>))
    }

    /// Kills every server (-9), then starts them again on the same
    /// addresses with their data dirs (snapshot + transaction log, where
    /// the czxid tokens live), and waits until each serves.
    async fn restart_servers(&self) -> Result<()> {
        let fleet = &self.fleet;
        tokio::task::block_in_place(|| {
            let fail = |e: fleet::FleetError| Error::backend("zookeeper fleet", "restart", e);
            // All down first: a whole-ensemble restart, not a rolling one,
            // so nothing survives in a running peer's memory.
            for n in &fleet.nodes {
                n.kill().map_err(fail)?;
            }
            for n in &fleet.nodes {
                n.restart().map_err(fail)?;
            }
            for i in 0..fleet.nodes.len() {
                fleet
                    .wait_serving(i, Duration::from_secs(30))
                    .map_err(fail)?;
            }
            Ok(())
        })
    }
}

pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// A TCP proxy in front of one server that can black-hole either
/// direction, as a partition does: bytes are neither delivered nor
/// refused, the sockets stay open. Healing closes every connection that
/// saw the cut (the client reconnects, as after a real partition).
pub struct Proxy {
    pub addr: String,
    up: Arc<tokio::sync::watch::Sender<bool>>,
    down: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until either closes, or the direction is cut;
/// then holds everything until the cut heals, and returns (closing).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            biased;
            _ = async { cut.wait_for(|c| *c).await.is_ok() } => {
                let _ = cut.wait_for(|c| !*c).await;
                return;
            }
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => if to.write_all(&buf[..n]).await.is_err() { return },
            },
        }
    }
}

impl Proxy {
    pub async fn start(upstream: String) -> Proxy {
        let ip = fleet::loopback_addr();
        let port = fleet::PortAllocator::free_port(ip).unwrap();
        let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
        let (up, _) = tokio::sync::watch::channel(false);
        let (down, _) = tokio::sync::watch::channel(false);
        let (up, down) = (Arc::new(up), Arc::new(down));
        let (u, d) = (up.clone(), down.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let (ucut, dcut) = (u.subscribe(), d.subscribe());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = pump(cr, sw, ucut) => {}
                        _ = pump(sr, cw, dcut) => {}
                    }
                });
            }
        });
        Proxy {
            addr: format!("{ip}:{port}"),
            up,
            down,
            task,
        }
    }

    /// Nothing gets through either way.
    pub fn cut(&self) {
        self.up.send_replace(true);
        self.down.send_replace(true);
    }

    /// Requests reach the server; its replies are lost.
    pub fn cut_replies(&self) {
        self.down.send_replace(true);
    }

    pub fn heal(&self) {
        self.up.send_replace(false);
        self.down.send_replace(false);
    }
}
