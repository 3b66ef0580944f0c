//! The unit per-source limits are kept for: an IPv4 address, or the /64
//! prefix of an IPv6 address. One host usually owns a whole /64, so counting
//! single IPv6 addresses (or ports) would let it take any share it likes.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The source of a datagram for per-source limits: its IPv4 address (also
/// when IPv4-mapped in IPv6), or the /64 prefix of its IPv6 address. The
/// port does not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source(IpAddr);

impl Source {
    /// The source `peer` belongs to.
    pub fn of(peer: &SocketAddr) -> Source {
        match peer.ip().to_canonical() {
            IpAddr::V6(a) => Source(IpAddr::V6(Ipv6Addr::from(
                u128::from(a) & !((1u128 << 64) - 1),
            ))),
            v4 => Source(v4),
        }
    }

    /// The IPv4 address, or the IPv6 /64 prefix with its host bits zero.
    pub fn addr(&self) -> IpAddr {
        self.0
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_do_not_count_and_ipv6_counts_by_64() {
        let s = |t: &str| Source::of(&t.parse().unwrap());
        assert_eq!(s("192.0.2.1:1"), s("192.0.2.1:2"));
        assert_ne!(s("192.0.2.1:1"), s("192.0.2.2:1"));
        assert_eq!(s("[::ffff:192.0.2.1]:9"), s("192.0.2.1:1"));
        assert_eq!(s("[2001:db8::1]:1"), s("[2001:db8::ffff:2]:7"));
        assert_ne!(s("[2001:db8::1]:1"), s("[2001:db8:0:1::1]:1"));
        assert_eq!(s("[2001:db8::1]:1").to_string(), "2001:db8::/64");
        assert_eq!(s("192.0.2.1:1").to_string(), "192.0.2.1");
    }
}
