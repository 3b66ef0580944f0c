//! Message-layer de-duplication (RFC 7252 4.5).
//!
//! A CON is remembered for EXCHANGE_LIFETIME with the response that was sent
//! for it, so that a duplicate gets the very same bytes again; a NON is
//! remembered for NON_LIFETIME so that a duplicate is dropped. Memory is
//! bounded: entries are queued in insertion order, and when `capacity` is
//! reached the oldest entry is evicted early. An evicted duplicate is then
//! processed again, which is what an endpoint without de-duplication would
//! do: safe for the idempotent methods, and the bound is configurable for the
//! rest.
//!
//! Invariant: an entry is never reported past its own lifetime. The queue
//! is only in insertion order (a NON lives shorter than a CON queued before
//! it), so lookups also check the entry's expiry, and the queue sweep removes
//! each entry no later than its turn.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What the cache knows of a (peer, message ID).
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'a, R> {
    /// First time (or first time since the entry expired): now recorded.
    New,
    /// A duplicate CON whose response is not ready yet.
    InProgress,
    /// A duplicate CON: send this response again.
    Replay(&'a R),
    /// A duplicate NON: drop.
    Duplicate,
}

#[derive(Debug)]
enum Entry<R> {
    InProgress,
    Done(R),
    Seen,
}

/// (peer, message ID) packed into two words: the address as 128 bits (IPv4
/// v4-mapped), then scope, port and MID. Cheaper to hash and compare than a
/// `(SocketAddr, u16)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key(u128, u64);

impl Key {
    fn new(peer: &SocketAddr, mid: u16) -> Key {
        let (ip, scope) = match peer {
            SocketAddr::V4(v4) => (u128::from(v4.ip().to_ipv6_mapped()), 0),
            SocketAddr::V6(v6) => (u128::from(*v6.ip()), v6.scope_id() as u64),
        };
        Key(
            ip,
            (scope << 32) | ((peer.port() as u64) << 16) | mid as u64,
        )
    }
}

/// A multiply-rotate mixer for [`Key`]s. Not DoS-resistant by itself, which
/// is acceptable because the table is bounded by `capacity` whatever the keys
/// are: colliding keys can at worst slow their own lookups.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(26) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u128(&mut self, v: u128) {
        self.write_u64(v as u64);
        self.write_u64((v >> 64) as u64);
    }
}

type KeyMap<V> = HashMap<Key, V, BuildHasherDefault<KeyHasher>>;

/// Bounded (peer, message ID) cache holding responses of type `R`.
#[derive(Debug)]
pub struct Dedup<R> {
    map: KeyMap<(Entry<R>, Instant)>,
    order: VecDeque<(Key, Instant)>,
    capacity: usize,
    con_lifetime: Duration,
    non_lifetime: Duration,
    evicted_early: u64,
}

impl<R> Dedup<R> {
    /// A cache of at most `capacity` entries; CON entries live
    /// `con_lifetime` (EXCHANGE_LIFETIME), NON entries `non_lifetime`.
    pub fn new(capacity: usize, con_lifetime: Duration, non_lifetime: Duration) -> Dedup<R> {
        Dedup {
            map: KeyMap::with_capacity_and_hasher(capacity.min(1 << 16), Default::default()),
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity: capacity.max(1),
            con_lifetime,
            non_lifetime,
            evicted_early: 0,
        }
    }

    /// Looks up and, when new, records a message. `confirmable` picks the
    /// lifetime. One hash lookup in the common case.
    pub fn check(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        confirmable: bool,
    ) -> Seen<'_, R> {
        self.expire(now);
        let key = Key::new(&peer, mid);
        if self.map.len() >= self.capacity && !self.map.contains_key(&key) {
            self.evict_oldest();
        }
        let life = if confirmable {
            self.con_lifetime
        } else {
            self.non_lifetime
        };
        let entry = if confirmable {
            Entry::InProgress
        } else {
            Entry::Seen
        };
        let expires = now + life;
        match self.map.entry(key) {
            MapEntry::Occupied(o) if o.get().1 > now => match &o.into_mut().0 {
                Entry::InProgress => Seen::InProgress,
                Entry::Done(r) => Seen::Replay(r),
                Entry::Seen => Seen::Duplicate,
            },
            MapEntry::Occupied(mut o) => {
                // expired while waiting behind longer-lived entries: renew;
                // its old queue position no longer matches and is skipped
                o.insert((entry, expires));
                self.order.push_back((key, expires));
                Seen::New
            }
            MapEntry::Vacant(v) => {
                v.insert((entry, expires));
                self.order.push_back((key, expires));
                Seen::New
            }
        }
    }

    /// Stores the response sent for a CON recorded by [`Dedup::check`].
    /// Ignored if the entry is gone (expired or evicted).
    pub fn complete(&mut self, peer: SocketAddr, mid: u16, response: R) {
        if let Some((e, _)) = self.map.get_mut(&Key::new(&peer, mid)) {
            *e = Entry::Done(response);
        }
    }

    /// Forgets a message (e.g. its processing was shed before any answer).
    pub fn forget(&mut self, peer: SocketAddr, mid: u16) {
        self.map.remove(&Key::new(&peer, mid));
    }

    /// Drops up to `n` of the oldest entries before their lifetime (to give
    /// back the buffers their cached responses hold); returns how many went.
    pub fn evict(&mut self, n: usize) -> usize {
        let before = self.evicted_early;
        for _ in 0..n {
            if self.map.is_empty() {
                break;
            }
            self.evict_oldest();
        }
        (self.evicted_early - before) as usize
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries dropped before their lifetime because of the capacity bound.
    pub fn evicted_early(&self) -> u64 {
        self.evicted_early
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(key, exp)) = self.order.front() {
            if exp > now {
                break;
            }
            self.order.pop_front();
            self.remove_if_current(key, exp);
        }
    }

    fn evict_oldest(&mut self) {
        while let Some((key, exp)) = self.order.pop_front() {
            if self.remove_if_current(key, exp) {
                self.evicted_early += 1;
                return;
            }
        }
    }

    /// Removes `key` if its entry is the one queued with `exp` (a forgotten
    /// and re-added or renewed key has a newer one). One lookup.
    fn remove_if_current(&mut self, key: Key, exp: Instant) -> bool {
        match self.map.entry(key) {
            MapEntry::Occupied(o) if o.get().1 == exp => {
                o.remove();
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn con_duplicate_replays_after_completion_until_lifetime() {
        let t0 = Instant::now();
        let mut d: Dedup<&'static str> =
            Dedup::new(16, Duration::from_secs(247), Duration::from_secs(145));
        assert_eq!(d.check(t0, peer(1), 7, true), Seen::New);
        assert_eq!(d.check(t0, peer(1), 7, true), Seen::InProgress);
        d.complete(peer(1), 7, "resp");
        assert_eq!(
            d.check(t0 + Duration::from_secs(246), peer(1), 7, true),
            Seen::Replay(&"resp")
        );
        // another peer with the same MID is a different message
        assert_eq!(d.check(t0, peer(2), 7, true), Seen::New);
        assert_eq!(
            d.check(t0 + Duration::from_secs(248), peer(1), 7, true),
            Seen::New
        );
    }

    #[test]
    fn non_duplicate_dropped_for_non_lifetime() {
        let t0 = Instant::now();
        let mut d: Dedup<()> = Dedup::new(16, Duration::from_secs(247), Duration::from_secs(145));
        assert_eq!(d.check(t0, peer(1), 9, false), Seen::New);
        assert_eq!(
            d.check(t0 + Duration::from_secs(144), peer(1), 9, false),
            Seen::Duplicate
        );
        assert_eq!(
            d.check(t0 + Duration::from_secs(146), peer(1), 9, false),
            Seen::New
        );
    }

    #[test]
    fn a_non_behind_a_longer_lived_con_still_expires_on_time() {
        let t0 = Instant::now();
        let mut d: Dedup<()> = Dedup::new(16, Duration::from_secs(247), Duration::from_secs(145));
        assert_eq!(d.check(t0, peer(1), 1, true), Seen::New);
        assert_eq!(d.check(t0, peer(2), 2, false), Seen::New);
        let later = t0 + Duration::from_secs(146);
        assert_eq!(
            d.check(later, peer(2), 2, false),
            Seen::New,
            "past NON_LIFETIME"
        );
        assert_eq!(
            d.check(later, peer(2), 2, false),
            Seen::Duplicate,
            "renewed"
        );
        assert_eq!(d.check(later, peer(1), 1, true), Seen::InProgress);
    }

    #[test]
    fn capacity_bound_evicts_oldest() {
        let t0 = Instant::now();
        let mut d: Dedup<()> = Dedup::new(3, Duration::from_secs(247), Duration::from_secs(145));
        for mid in 0..5 {
            assert_eq!(d.check(t0, peer(1), mid, true), Seen::New);
        }
        assert_eq!(d.len(), 3);
        assert_eq!(d.evicted_early(), 2);
        assert_eq!(d.check(t0, peer(1), 4, true), Seen::InProgress);
        assert_eq!(d.check(t0, peer(1), 0, true), Seen::New);
    }
}
