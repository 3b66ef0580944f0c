//! Who a datagram comes from, for the limits kept per source.
//!
//! A host on IPv4 has one address; a host on IPv6 is normally given a whole
//! /64, so counting each IPv6 address apart would let one host take any
//! number of shares. [`SourceKey`] is therefore the IPv4 address, or the
//! first 64 bits of the IPv6 address (an IPv4-mapped IPv6 address counts as
//! its IPv4 address). The port never matters: one host opens as many ports
//! as it likes.

use std::net::{IpAddr, SocketAddr};

/// An IPv4 address or an IPv6 /64 prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKey {
    /// An IPv4 host.
    V4([u8; 4]),
    /// The /64 an IPv6 host sits in.
    V6([u8; 8]),
}

impl SourceKey {
    /// The key of `peer`'s address.
    pub fn of(peer: &SocketAddr) -> SourceKey {
        SourceKey::of_ip(peer.ip())
    }

    /// The key of an address.
    pub fn of_ip(ip: IpAddr) -> SourceKey {
        match ip {
            IpAddr::V4(a) => SourceKey::V4(a.octets()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => SourceKey::V4(v4.octets()),
                None => {
                    let mut p = [0u8; 8];
                    p.copy_from_slice(&a.octets()[..8]);
                    SourceKey::V6(p)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_interface_ids_do_not_count() {
        let a: SocketAddr = "192.0.2.1:1000".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:2000".parse().unwrap();
        let c: SocketAddr = "192.0.2.2:1000".parse().unwrap();
        assert_eq!(SourceKey::of(&a), SourceKey::of(&b));
        assert_ne!(SourceKey::of(&a), SourceKey::of(&c));
        let x: SocketAddr = "[2001:db8:1:2::1]:5683".parse().unwrap();
        let y: SocketAddr = "[2001:db8:1:2:ffff::9]:9".parse().unwrap();
        let z: SocketAddr = "[2001:db8:1:3::1]:5683".parse().unwrap();
        assert_eq!(SourceKey::of(&x), SourceKey::of(&y));
        assert_ne!(SourceKey::of(&x), SourceKey::of(&z));
        let m: SocketAddr = "[::ffff:192.0.2.1]:7".parse().unwrap();
        assert_eq!(SourceKey::of(&m), SourceKey::of(&a));
    }
}
