//! Stateless cookies (RFC 6347 4.2.1): `Cookie = HMAC(Secret, Client-IP,
//! Client-Parameters)`, with HMAC-SHA256 over the client's address and
//! port and the ClientHello fields it must repeat
//! ([`ClientHello::cookie_input`]). The secret is drawn at random and
//! replaced every period; a cookie made with the one before stays valid
//! for one more period, so a client that got its HelloVerifyRequest just
//! before a change still comes in (as Scandium and RFC 6347 suggest).
//!
//! Reading the keys takes no lock: they sit behind an [`ArcSwap`], and the
//! thread that finds the period over (one compare-and-swap decides which)
//! draws the next secret and swaps it in.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::hello::ClientHello;

/// Length of the cookies made (a whole SHA-256 output).
pub const COOKIE_LEN: usize = 32;

type Key = Hmac<Sha256>;

struct Keys {
    current: Key,
    previous: Option<Key>,
}

/// The secrets of one listener. See the [module documentation](self).
pub struct CookieJar {
    keys: ArcSwap<Keys>,
    epoch: Instant,
    /// When (ns since `epoch`) the current secret is to be replaced.
    next_ns: AtomicU64,
    period: Duration,
    rotations: AtomicU64,
}

/// A key of SHA-256's block size (64 bytes) from OpenSSL's random
/// generator.
fn fresh_key() -> Result<Key, openssl::error::ErrorStack> {
    let mut secret = [0u8; 64];
    openssl::rand::rand_bytes(&mut secret)?;
    Ok(<Key as hmac::digest::KeyInit>::new(&secret.into()))
}

impl CookieJar {
    /// A jar with a fresh secret, replaced every `period` from `now`.
    pub fn new(now: Instant, period: Duration) -> Result<CookieJar, openssl::error::ErrorStack> {
        let period = period.max(Duration::from_millis(1));
        Ok(CookieJar {
            keys: ArcSwap::from_pointee(Keys {
                current: fresh_key()?,
                previous: None,
            }),
            epoch: now,
            next_ns: AtomicU64::new(period.as_nanos() as u64),
            period,
            rotations: AtomicU64::new(0),
        })
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Secrets drawn since start, the first one not counted.
    pub fn rotations(&self) -> u64 {
        self.rotations.load(Relaxed)
    }

    /// Replaces the secret if its period is over. The one replaced stays
    /// valid for one period more, unless the change comes so late (no
    /// hello and no sweep for a whole period) that its time is over too.
    pub fn rotate_if_due(&self, now: Instant) {
        let now_ns = self.ns(now);
        let due = self.next_ns.load(Relaxed);
        if now_ns < due {
            return;
        }
        let period_ns = self.period.as_nanos() as u64;
        if self
            .next_ns
            .compare_exchange(due, now_ns + period_ns, Relaxed, Relaxed)
            .is_err()
        {
            return; // another thread does it
        }
        let key = match fresh_key() {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "cannot draw a new DTLS cookie secret; keeping the old one");
                return;
            }
        };
        let old = self.keys.load();
        let previous = (now_ns < due.saturating_add(period_ns)).then(|| old.current.clone());
        self.keys.store(Arc::new(Keys {
            current: key,
            previous,
        }));
        self.rotations.fetch_add(1, Relaxed);
    }

    fn mac(key: &Key, peer: SocketAddr, hello: &ClientHello<'_>) -> Key {
        let mut m = key.clone();
        match peer.ip() {
            IpAddr::V4(a) => {
                m.update(&[4]);
                m.update(&a.octets());
            }
            IpAddr::V6(a) => {
                m.update(&[6]);
                m.update(&a.octets());
            }
        }
        m.update(&peer.port().to_be_bytes());
        hello.cookie_input(&mut |b| m.update(b));
        m
    }

    /// The cookie for `hello` from `peer` under the current secret.
    pub fn make(&self, peer: SocketAddr, hello: &ClientHello<'_>) -> [u8; COOKIE_LEN] {
        let keys = self.keys.load();
        Self::mac(&keys.current, peer, hello)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `hello`'s cookie is the one the current or the previous
    /// secret makes for it (compared in constant time).
    pub fn verify(&self, peer: SocketAddr, hello: &ClientHello<'_>) -> bool {
        if hello.cookie.len() != COOKIE_LEN {
            return false;
        }
        let keys = self.keys.load();
        std::iter::once(&keys.current)
            .chain(keys.previous.as_ref())
            .any(|k| Self::mac(k, peer, hello).verify_slice(hello.cookie).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hello::{parse_client_hello, write_client_hello, HelloFields};

    fn hello_with(cookie: &[u8], random: u8) -> Vec<u8> {
        write_client_hello(&HelloFields {
            random: [random; 32],
            cookie: cookie.to_vec(),
            message_seq: 1,
            ..HelloFields::default()
        })
    }

    #[test]
    fn a_cookie_binds_the_address_port_and_hello_and_outlives_one_rotation_only() {
        let t0 = Instant::now();
        let period = Duration::from_secs(60);
        let jar = CookieJar::new(t0, period).unwrap();
        let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let first = hello_with(&[], 1);
        let c = jar.make(peer, &parse_client_hello(&first).unwrap());
        let second = hello_with(&c, 1);
        let h = parse_client_hello(&second).unwrap();
        assert!(jar.verify(peer, &h));
        // another port, another address, another random, a cut cookie
        assert!(!jar.verify("192.0.2.7:40001".parse().unwrap(), &h));
        assert!(!jar.verify("192.0.2.8:40000".parse().unwrap(), &h));
        assert!(!jar.verify("[::ffff:192.0.2.7]:40000".parse().unwrap(), &h));
        let other = hello_with(&c, 2);
        assert!(!jar.verify(peer, &parse_client_hello(&other).unwrap()));
        let short = hello_with(&c[..16], 1);
        assert!(!jar.verify(peer, &parse_client_hello(&short).unwrap()));
        // the hello's other fields are covered too
        let mut f = HelloFields {
            random: [1; 32],
            cookie: c.to_vec(),
            message_seq: 1,
            ..HelloFields::default()
        };
        f.cipher_suites.push(0xc0a9);
        let more_suites = write_client_hello(&f);
        assert!(!jar.verify(peer, &parse_client_hello(&more_suites).unwrap()));
        // not yet due: nothing changes
        jar.rotate_if_due(t0 + period / 2);
        assert_eq!(jar.rotations(), 0);
        // one rotation: still valid, a new cookie differs
        jar.rotate_if_due(t0 + period);
        assert_eq!(jar.rotations(), 1);
        assert!(jar.verify(peer, &h));
        assert_ne!(jar.make(peer, &h), c);
        // the second: the first secret is gone
        jar.rotate_if_due(t0 + period * 2);
        assert_eq!(jar.rotations(), 2);
        assert!(!jar.verify(peer, &h));
    }

    #[test]
    fn a_late_rotation_keeps_no_secret_past_its_time() {
        let t0 = Instant::now();
        let period = Duration::from_secs(10);
        let jar = CookieJar::new(t0, period).unwrap();
        let peer: SocketAddr = "[2001:db8::1]:5684".parse().unwrap();
        let c = jar.make(peer, &parse_client_hello(&hello_with(&[], 3)).unwrap());
        let second = hello_with(&c, 3);
        assert!(jar.verify(peer, &parse_client_hello(&second).unwrap()));
        // nothing for two periods: the first secret would have retired at
        // 10 s and expired at 20 s
        jar.rotate_if_due(t0 + Duration::from_secs(25));
        assert!(!jar.verify(peer, &parse_client_hello(&second).unwrap()));
    }
}
