//! Message-layer de-duplication (RFC 7252 4.5).
//!
//! A CON is remembered for EXCHANGE_LIFETIME with the response that was sent
//! for it, so that a duplicate gets the very same bytes again; a NON is
//! remembered for NON_LIFETIME so that a duplicate is dropped. Memory is
//! bounded: entries live in insertion order (which is also expiry order, as
//! each kind has one lifetime), and when `capacity` is reached the oldest entry
//! is evicted early. An evicted duplicate is then processed again, which is
//! what an endpoint without de-duplication would do: safe for the idempotent
//! methods, and the bound is configurable for the rest.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What the cache knows of a (peer, message ID).
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'a, R> {
    /// First time: now recorded as in progress.
    New,
    /// A duplicate CON whose response is not ready yet.
    InProgress,
    /// A duplicate CON: send this response again.
    Replay(&'a R),
    /// A duplicate NON (or a CON answered without a cached response): drop.
    Duplicate,
}

#[derive(Debug)]
enum Entry<R> {
    InProgress,
    Done(R),
    Seen,
}

/// Bounded (peer, message ID) cache holding responses of type `R`.
#[derive(Debug)]
pub struct Dedup<R> {
    map: HashMap<(SocketAddr, u16), (Entry<R>, Instant)>,
    order: VecDeque<((SocketAddr, u16), Instant)>,
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
            map: HashMap::with_capacity(capacity.min(1 << 16)),
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity: capacity.max(1),
            con_lifetime,
            non_lifetime,
            evicted_early: 0,
        }
    }

    /// Looks up and, when new, records a message. `confirmable` picks the
    /// lifetime.
    pub fn check(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        confirmable: bool,
    ) -> Seen<'_, R> {
        self.expire(now);
        let key = (peer, mid);
        if self.map.contains_key(&key) {
            return match &self.map[&key].0 {
                Entry::InProgress => Seen::InProgress,
                Entry::Done(r) => Seen::Replay(r),
                Entry::Seen => Seen::Duplicate,
            };
        }
        if self.map.len() >= self.capacity {
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
        self.map.insert(key, (entry, expires));
        self.order.push_back((key, expires));
        Seen::New
    }

    /// Stores the response sent for a CON recorded by [`Dedup::check`].
    /// Ignored if the entry is gone (expired or evicted).
    pub fn complete(&mut self, peer: SocketAddr, mid: u16, response: R) {
        if let Some((e, _)) = self.map.get_mut(&(peer, mid)) {
            *e = Entry::Done(response);
        }
    }

    /// Forgets a message (e.g. its processing was shed before any answer).
    pub fn forget(&mut self, peer: SocketAddr, mid: u16) {
        self.map.remove(&(peer, mid));
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
        while let Some((key, exp)) = self.order.front() {
            // NON entries expire sooner than CON entries inserted just before
            // them, so the front may not be the earliest; it is still a valid
            // bound because every entry is removed no later than its turn.
            if *exp > now {
                break;
            }
            let key = *key;
            let exp = *exp;
            self.order.pop_front();
            if let Some((_, e)) = self.map.get(&key) {
                if *e == exp {
                    self.map.remove(&key);
                }
            }
        }
    }

    fn evict_oldest(&mut self) {
        while let Some((key, exp)) = self.order.pop_front() {
            if let Some((_, e)) = self.map.get(&key) {
                if *e == exp {
                    self.map.remove(&key);
                    self.evicted_early += 1;
                    return;
                }
            }
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
