//! `TCP_NODELAY` on the `zookeeper-client` crate's session sockets.
//!
//! The crate leaves Nagle's algorithm on. Our acquire writes the children
//! read right behind the create; with Nagle on, the kernel holds that
//! second small segment until the server ACKs the first, which it does
//! with the create's reply after the fsync: the "pipelined" read costs a
//! whole extra round trip. The crate does not expose its socket, so we
//! find our process's TCP sockets connected to the ensemble
//! (`/proc/net/tcp` inode -> `/proc/self/fd`) and set the option on them.
//! Linux only, IPv4 only; elsewhere it does nothing (slower, still correct).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4, ToSocketAddrs};

/// The IPv4 endpoints of a connect string (`host:port,...[/chroot]`).
pub(crate) fn endpoints(connect: &str) -> Vec<SocketAddrV4> {
    let hosts = connect.split('/').next().unwrap_or_default();
    hosts
        .split(',')
        .filter_map(|h| h.trim().to_socket_addrs().ok())
        .flatten()
        .filter_map(|a| match a {
            std::net::SocketAddr::V4(v4) => Some(v4),
            std::net::SocketAddr::V6(_) => None,
        })
        .collect()
}

/// `0100007F:1F90` (as the kernel prints it) -> 127.0.0.1:8080.
fn parse_proc_addr(s: &str) -> Option<SocketAddrV4> {
    let (ip, port) = s.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // The kernel prints the address word in host order of a big-endian value.
    Some(SocketAddrV4::new(Ipv4Addr::from(u32::from_be(ip)), port))
}

/// Sets `TCP_NODELAY` on every established socket of this process
/// connected to one of `to`; returns how many it set.
pub(crate) fn apply(to: &[SocketAddrV4]) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return 0;
    };
    let inodes: HashSet<&str> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local remote st ... inode (field 9); 01 = ESTABLISHED.
            let remote = parse_proc_addr(f.get(2)?)?;
            (f.get(3) == Some(&"01") && to.contains(&remote)).then_some(*f.get(9)?)
        })
        .collect();
    if inodes.is_empty() {
        return 0;
    }
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut set = 0;
    for e in fds.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        else {
            continue;
        };
        if !inodes.contains(inode) {
            continue;
        }
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live
        // c_int. If the fd was closed and reused since we listed it, the
        // call fails (not a socket) or sets a harmless option on another
        // TCP socket of ours.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                std::ptr::from_ref(&one).cast::<libc::c_void>(),
                libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
            )
        };
        if r == 0 {
            set += 1;
        }
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_address_format() {
        let a = parse_proc_addr("0100007F:1F90").unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(a, "127.0.0.1:8080".parse().unwrap());
        }
        assert!(parse_proc_addr("zz").is_none());
    }

    #[test]
    fn connect_string_endpoints() {
        let e = endpoints("127.0.0.2:2100,127.0.0.3:2101/chroot");
        assert_eq!(
            e,
            vec![
                "127.0.0.2:2100".parse().unwrap(),
                "127.0.0.3:2101".parse().unwrap()
            ]
        );
    }
}
