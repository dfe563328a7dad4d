//! Loopback addresses and free ports.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{FleetError, Result};

/// Default ports of the servers we run: never handed out, so a fleet can
/// never be confused with (or collide with) a system service.
const DEFAULT_PORTS: &[u16] = &[2181, 2379, 2380, 2888, 3888, 5432, 6379, 8080, 26379];

static NEXT_ADDR: AtomicU32 = AtomicU32::new(0);

/// The loopback address for the `n`-th node handed out by this process:
/// 127.0.0.2 .. 127.0.0.254, then round again. Never anything outside 127/8.
pub fn loopback_addr() -> Ipv4Addr {
    let n = NEXT_ADDR.fetch_add(1, Ordering::Relaxed);
    Ipv4Addr::new(127, 0, 0, 2 + (n % 253) as u8)
}

/// Hands out ports from a base, skipping default ports and any port that is
/// already bound on the address.
#[derive(Debug)]
pub struct PortAllocator;

static NEXT_PORT: AtomicU32 = AtomicU32::new(0);

impl PortAllocator {
    /// The base port: `LOCKBENCH_PORT_BASE`, default 21000. Processes spread
    /// out from it by pid so parallel test binaries rarely probe the same port.
    ///
    /// # Errors
    /// [`FleetError::NoPort`] naming the variable when it is not a port
    /// (it was ignored: servers started where the user had said not to).
    pub fn base() -> Result<u16> {
        match std::env::var("LOCKBENCH_PORT_BASE") {
            Err(_) => Ok(21000),
            Ok(v) => v
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| {
                    FleetError::NoPort(format!("LOCKBENCH_PORT_BASE={v:?} is not a port (1-65535)"))
                }),
        }
    }

    /// A free port on `addr`.
    ///
    /// # Errors
    /// [`FleetError::NoPort`] if 2000 candidates were all taken.
    pub fn free_port(addr: Ipv4Addr) -> Result<u16> {
        let base = u32::from(Self::base()?);
        let spread = (std::process::id() % 97) * 40;
        for _ in 0..2000 {
            let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
            let port = base + (spread + n) % 20000;
            let Ok(port) = u16::try_from(port) else {
                continue;
            };
            if DEFAULT_PORTS.contains(&port) {
                continue;
            }
            if TcpListener::bind(SocketAddr::from((addr, port))).is_ok() {
                return Ok(port);
            }
        }
        Err(FleetError::NoPort(format!("on {addr} from base {base}")))
    }
}

/// A second address for a server, as a port forward or a proxy gives one:
/// every connection to `listener` is relayed to `target`, in a task of the
/// current runtime, until the runtime ends. For tests of what a client
/// does with one server under two names, or on an address family the
/// server does not listen on (IPv6).
pub fn forward(listener: tokio::net::TcpListener, target: SocketAddr) {
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
}
