//! Address validation against amplification (RFC 9175 2.4, RFC 7252 11.3;
//! QUIC's three-times rule, RFC 9000 8, as the model).
//!
//! A UDP source address can be forged, so an answer much larger than its
//! request turns the server into an amplifier aimed at whoever owns that
//! address. Until a source has shown that it receives what is sent to it,
//! nothing larger than `factor` times the request goes to it. A source
//! shows it with an Echo round trip: the server puts an Echo value in a
//! response (a 4.01 challenge, or a small first block), the client repeats
//! it in its next request, and only someone who received the response
//! knows it. The value is stateless: a timestamp and a truncated
//! HMAC-SHA-256 of it and the client's IP address under a secret of this
//! endpoint, so challenges cost no memory. A verified address is trusted
//! for `verified_lifetime` (a bounded table; when full, the entry closest
//! to expiry makes room).
//!
//! Only the Echo round trip verifies. A client that never repeats Echo
//! keeps getting blocks cut to the factor (`fit.rs`) for every
//! request: what else it sends (its token, its message IDs, the next block
//! number) is its own choice or can be guessed, so it proves nothing about
//! receipt, and growing the budget on it would hand a spoofed source the
//! amplification this module exists to deny.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of an Echo value: a 4-byte timestamp and an 8-byte MAC.
pub const ECHO_LEN: usize = 12;

/// Echo values older than this are not accepted.
pub const ECHO_LIFETIME: Duration = Duration::from_secs(300);

pub(crate) struct Validation {
    /// HMAC-SHA-256 keyed with the secret, cloned for each value.
    keyed: Hmac<Sha256>,
    epoch: Instant,
    lifetime: Duration,
    capacity: usize,
    verified: HashMap<IpAddr, Instant>,
}

/// What an Echo option in a request showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EchoCheck {
    /// A value this endpoint made for this address, fresh.
    Valid,
    /// Not ours, another address's, or too old.
    Invalid,
}

impl Validation {
    pub fn new(
        secret: [u8; 32],
        epoch: Instant,
        lifetime: Duration,
        capacity: usize,
    ) -> Validation {
        // a 32-byte key is always accepted; the fallback is never taken
        let keyed = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret)
            .unwrap_or_else(|_| <Hmac<Sha256> as KeyInit>::new(&Default::default()));
        Validation {
            keyed,
            epoch,
            lifetime,
            capacity: capacity.max(1),
            verified: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.verified.len()
    }

    fn mac(&self, ip: IpAddr, stamp: [u8; 4]) -> [u8; 8] {
        let mut m = self.keyed.clone();
        m.update(&stamp);
        match ip {
            IpAddr::V4(a) => m.update(&a.octets()),
            IpAddr::V6(a) => m.update(&a.octets()),
        }
        let full = m.finalize().into_bytes();
        let mut out = [0u8; 8];
        out.copy_from_slice(&full[..8]);
        out
    }

    /// An Echo value for `peer`, made at `now`.
    pub fn echo_for(&self, now: Instant, peer: &SocketAddr) -> [u8; ECHO_LEN] {
        let secs = now.saturating_duration_since(self.epoch).as_secs() as u32;
        let stamp = secs.to_be_bytes();
        let mut v = [0u8; ECHO_LEN];
        v[..4].copy_from_slice(&stamp);
        v[4..].copy_from_slice(&self.mac(peer.ip(), stamp));
        v
    }

    /// Checks an Echo value a request from `peer` carried.
    pub fn check(&self, now: Instant, peer: &SocketAddr, value: &[u8]) -> EchoCheck {
        if value.len() != ECHO_LEN {
            return EchoCheck::Invalid;
        }
        let stamp = [value[0], value[1], value[2], value[3]];
        let made = u32::from_be_bytes(stamp) as u64;
        let secs = now.saturating_duration_since(self.epoch).as_secs();
        if made > secs || secs - made > ECHO_LIFETIME.as_secs() {
            return EchoCheck::Invalid;
        }
        // constant-time comparison through the MAC crate
        let mut m = self.keyed.clone();
        m.update(&stamp);
        match peer.ip() {
            IpAddr::V4(a) => m.update(&a.octets()),
            IpAddr::V6(a) => m.update(&a.octets()),
        }
        match m.verify_truncated_left(&value[4..]) {
            Ok(()) => EchoCheck::Valid,
            Err(_) => EchoCheck::Invalid,
        }
    }

    /// Trusts `peer`'s address until `now + lifetime`.
    pub fn verify(&mut self, now: Instant, peer: &SocketAddr) {
        let ip = peer.ip();
        if self.verified.len() >= self.capacity && !self.verified.contains_key(&ip) {
            self.verified.retain(|_, until| *until > now);
            if self.verified.len() >= self.capacity {
                if let Some(k) = self
                    .verified
                    .iter()
                    .min_by_key(|(_, until)| **until)
                    .map(|(k, _)| *k)
                {
                    self.verified.remove(&k);
                }
            }
        }
        self.verified.insert(ip, now + self.lifetime);
    }

    /// Whether `peer`'s address is trusted now.
    pub fn is_verified(&self, now: Instant, peer: &SocketAddr) -> bool {
        self.verified
            .get(&peer.ip())
            .is_some_and(|until| *until > now)
    }

    /// Forgets expired entries.
    pub fn expire(&mut self, now: Instant) {
        self.verified.retain(|_, until| *until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_round_trip_and_forgeries() {
        let t0 = Instant::now();
        let mut v = Validation::new([7; 32], t0, Duration::from_secs(600), 2);
        let a: SocketAddr = "192.0.2.1:40000".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:40000".parse().unwrap();
        let e = v.echo_for(t0 + Duration::from_secs(5), &a);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(v.check(later, &a, &e), EchoCheck::Valid);
        // another port of the same host: the address is what was reached
        let a2: SocketAddr = "192.0.2.1:40001".parse().unwrap();
        assert_eq!(v.check(later, &a2, &e), EchoCheck::Valid);
        assert_eq!(v.check(later, &b, &e), EchoCheck::Invalid);
        let mut forged = e;
        forged[11] ^= 1;
        assert_eq!(v.check(later, &a, &forged), EchoCheck::Invalid);
        assert_eq!(v.check(later, &a, &e[..11]), EchoCheck::Invalid);
        assert_eq!(
            v.check(t0 + Duration::from_secs(306), &a, &e),
            EchoCheck::Invalid,
            "too old"
        );
        // another secret does not accept it
        let w = Validation::new([8; 32], t0, Duration::from_secs(600), 2);
        assert_eq!(w.check(later, &a, &e), EchoCheck::Invalid);

        assert!(!v.is_verified(later, &a));
        v.verify(later, &a);
        assert!(v.is_verified(later, &a2));
        assert!(!v.is_verified(later + Duration::from_secs(601), &a));
        // bounded
        for i in 0..10u8 {
            let p = SocketAddr::from(([198, 51, 100, i], 1));
            v.verify(later + Duration::from_secs(i as u64), &p);
            assert!(v.len() <= 2);
        }
    }
}
