//! `TCP_NODELAY` on sockets a client crate opens and does not expose.
//!
//! A support crate of the backends, not a backend. Nagle's algorithm holds
//! a small segment back while an earlier one is unacknowledged; a client
//! that writes twice before it reads (a pipelined request, a request split
//! into two writes) then waits for the server's delayed ACK, up to 40 ms on
//! Linux, on a round trip that otherwise takes tens of microseconds. Where a
//! client crate has a setting for it we use the setting (`redis`'s
//! `TcpSettings`, tonic's default for etcd); where it has none
//! (`zookeeper-client` 0.11, `sqlx` 0.9) we find this process's sockets
//! connected to the server (`/proc/self/fd`, `getpeername`) and set the
//! option on them, right after the client connected.
//!
//! ```no_run
//! let peers = lockbench_nodelay::endpoints("postgres://u@127.0.0.2:5432/db");
//! let set = lockbench_nodelay::set_on_sockets_to(&peers);
//! assert!(lockbench_nodelay::sockets_to(&peers).iter().all(|s| s.nodelay));
//! # let _ = set;
//! ```
//!
//! It acts on every socket of the process connected to those servers,
//! whichever client opened it: for a benchmark that is what we want. Linux
//! only (it needs `/proc/self/fd`); elsewhere it finds nothing and does
//! nothing: slower, still correct.

use std::net::{SocketAddr, ToSocketAddrs};

/// One TCP socket of this process connected to a server of interest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    /// Its file descriptor.
    pub fd: i32,
    /// The server end.
    pub peer: SocketAddr,
    /// Whether `TCP_NODELAY` is on.
    pub nodelay: bool,
}

/// Sets `TCP_NODELAY` on every TCP socket of this process connected to one
/// of `peers`; returns on how many it is now on.
pub fn set_on_sockets_to(peers: &[SocketAddr]) -> usize {
    let mut on = 0;
    for s in sockets_to(peers) {
        if s.nodelay || sys::set_nodelay(s.fd) {
            on += 1;
        }
    }
    tracing::debug!(sockets = on, ?peers, "TCP_NODELAY on");
    on
}

/// Every TCP socket of this process connected to one of `peers`, and
/// whether `TCP_NODELAY` is on for it (what the backends' tests check).
pub fn sockets_to(peers: &[SocketAddr]) -> Vec<TcpSocket> {
    if peers.is_empty() {
        return Vec::new();
    }
    let peers: Vec<SocketAddr> = peers.iter().copied().map(canonical).collect();
    sys::socket_fds()
        .into_iter()
        .filter_map(|fd| {
            let peer = canonical(sys::peer(fd)?);
            if !peers.contains(&peer) {
                return None;
            }
            // Fails for a socket that is not TCP (a connected UDP one).
            let nodelay = sys::nodelay(fd)?;
            Some(TcpSocket { fd, peer, nodelay })
        })
        .collect()
}

/// What the backends' tests assert: at least `at_least` TCP sockets of this
/// process are connected to `peers`, and `TCP_NODELAY` is on for every one.
/// `Ok` with how many there are.
///
/// # Errors
/// Too few sockets, or some with Nagle's algorithm still on: a message
/// listing what was found.
pub fn check_sockets_to(peers: &[SocketAddr], at_least: usize) -> Result<usize, String> {
    let found = sockets_to(peers);
    if found.len() < at_least {
        return Err(format!(
            "{} TCP sockets to {peers:?}, expected at least {at_least}: {found:?}",
            found.len()
        ));
    }
    let nagle: Vec<&TcpSocket> = found.iter().filter(|s| !s.nodelay).collect();
    if !nagle.is_empty() {
        return Err(format!(
            "TCP_NODELAY off on {} of {} sockets to {peers:?}: {nagle:?}",
            nagle.len(),
            found.len()
        ));
    }
    Ok(found.len())
}

/// The socket addresses in an endpoint string: one `host:port`, a URL
/// (`scheme://[userinfo@]host:port[/path][?query]`), or a comma-separated
/// list of either (`redis+cluster://h1:p1,h2:p2`, a ZooKeeper connect
/// string with a chroot). Parts without a port, or that do not resolve,
/// are skipped. Resolves names with the system resolver, blocking: call it
/// where connecting blocks anyway.
pub fn endpoints(list: &str) -> Vec<SocketAddr> {
    list.split(',')
        .filter_map(|part| {
            let part = part.trim();
            let part = part.split_once("://").map_or(part, |(_, rest)| rest);
            let part = part.rsplit_once('@').map_or(part, |(_, host)| host);
            let part = part.split(['/', '?']).next().unwrap_or(part);
            part.to_socket_addrs().ok()
        })
        .flatten()
        .collect()
}

/// An IPv4 peer seen through an IPv6 socket (`::ffff:a.b.c.d`) as the IPv4
/// address it is, so either form matches.
fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        SocketAddr::V4(_) => a,
    }
}

#[cfg(unix)]
mod sys {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

    /// The descriptors of this process that are sockets.
    pub(crate) fn socket_fds() -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| {
                let fd = e.file_name().to_str()?.parse::<i32>().ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                target
                    .to_string_lossy()
                    .starts_with("socket:[")
                    .then_some(fd)
            })
            .collect()
    }

    fn len_of<T>() -> libc::socklen_t {
        libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(libc::socklen_t::MAX)
    }

    // Every call below takes a descriptor that may have been closed, or
    // closed and reused, since `socket_fds` listed it: the call then fails
    // (EBADF, ENOTSOCK, ENOTCONN) or reads or sets an option of another
    // socket of ours, which is harmless for TCP_NODELAY.

    /// The address of the other end of socket `fd`, if it is connected.
    pub(crate) fn peer(fd: i32) -> Option<SocketAddr> {
        // SAFETY: sockaddr_storage is plain data, valid when all zeroes.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = len_of::<libc::sockaddr_storage>();
        // SAFETY: getpeername writes at most `len` bytes to `ss`, which is
        // that large, and the new length to `len`.
        let r = unsafe {
            libc::getpeername(
                fd,
                std::ptr::from_mut(&mut ss).cast::<libc::sockaddr>(),
                &mut len,
            )
        };
        if r != 0 {
            return None;
        }
        match i32::from(ss.ss_family) {
            libc::AF_INET => {
                // SAFETY: the kernel wrote a sockaddr_in (family AF_INET);
                // sockaddr_storage is large and aligned enough for any.
                let a = unsafe { &*std::ptr::from_ref(&ss).cast::<libc::sockaddr_in>() };
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: as above, a sockaddr_in6 (family AF_INET6).
                let a = unsafe { &*std::ptr::from_ref(&ss).cast::<libc::sockaddr_in6>() };
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }

    /// Whether `TCP_NODELAY` is on; `None` if `fd` is not a TCP socket.
    pub(crate) fn nodelay(fd: i32) -> Option<bool> {
        let mut v: libc::c_int = 0;
        let mut len = len_of::<libc::c_int>();
        // SAFETY: getsockopt writes at most `len` bytes to `v`, which is
        // that large.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                std::ptr::from_mut(&mut v).cast::<libc::c_void>(),
                &mut len,
            )
        };
        (r == 0).then_some(v != 0)
    }

    /// Turns `TCP_NODELAY` on; true if it worked.
    pub(crate) fn set_nodelay(fd: i32) -> bool {
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads `len` bytes from a live c_int.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                std::ptr::from_ref(&one).cast::<libc::c_void>(),
                len_of::<libc::c_int>(),
            )
        };
        r == 0
    }
}

#[cfg(not(unix))]
mod sys {
    use std::net::SocketAddr;

    pub(crate) fn socket_fds() -> Vec<i32> {
        Vec::new()
    }
    pub(crate) fn peer(_fd: i32) -> Option<SocketAddr> {
        None
    }
    pub(crate) fn nodelay(_fd: i32) -> Option<bool> {
        None
    }
    pub(crate) fn set_nodelay(_fd: i32) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::net::TcpListener;

    #[test]
    fn endpoint_strings() {
        let e = |s| endpoints(s);
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(e("127.0.0.2:2100"), vec![a("127.0.0.2:2100")]);
        assert_eq!(
            e("127.0.0.2:2100,127.0.0.3:2101/chroot"),
            vec![a("127.0.0.2:2100"), a("127.0.0.3:2101")]
        );
        assert_eq!(
            e("postgres://u:secret@127.0.0.4:5432/db?sslmode=disable"),
            vec![a("127.0.0.4:5432")]
        );
        assert_eq!(
            e("redis+sentinel://:pw@127.0.0.5:1,127.0.0.6:2/mymaster"),
            vec![a("127.0.0.5:1"), a("127.0.0.6:2")]
        );
        assert_eq!(e("http://[::1]:2379"), vec![a("[::1]:2379")]);
        assert!(e("no-port-here").is_empty());
    }

    #[test]
    fn finds_reads_and_sets_the_option() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (_accepted, _) = server.accept().unwrap();
        client.set_nodelay(false).unwrap();
        let found = sockets_to(&[addr]);
        assert_eq!(found.len(), 1, "exactly our client's socket: {found:?}");
        assert!(!found[0].nodelay);
        let e = check_sockets_to(&[addr], 1).unwrap_err();
        assert!(e.contains("TCP_NODELAY off on 1 of 1"), "{e}");
        assert_eq!(set_on_sockets_to(&[addr]), 1);
        assert!(client.nodelay().unwrap(), "set on the client's own socket");
        assert!(sockets_to(&[addr])[0].nodelay);
        assert_eq!(check_sockets_to(&[addr], 1), Ok(1));
        assert!(check_sockets_to(&[addr], 2).is_err(), "too few");
        // Another port: not ours to touch.
        let other = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1));
        assert!(sockets_to(&[other]).is_empty());
    }
}
