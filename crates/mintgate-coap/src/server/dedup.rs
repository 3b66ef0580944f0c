//! Message-layer de-duplication (RFC 7252 4.5).
//!
//! A CON is remembered for EXCHANGE_LIFETIME with the response that was sent
//! for it, so that a duplicate gets the very same bytes again; a NON is
//! remembered for NON_LIFETIME so that a duplicate is dropped. Memory is
//! bounded: entries are queued in insertion order, and when `capacity`
//! entries are held, or the cached responses weigh more than `max_bytes`
//! ([`Weigh`]), the oldest entries are evicted early. An evicted duplicate is
//! then processed again, which is what an endpoint without de-duplication
//! would do: safe for the idempotent methods, and the bound is configurable
//! for the rest.
//!
//! Invariants:
//! - An entry is never reported past its own lifetime. The queue is only in
//!   insertion order (a NON lives shorter than a CON queued before it), so
//!   lookups also check the entry's expiry, and the queue sweep removes each
//!   entry no later than its turn.
//! - The map and the queue are kept in step on every path: each entry of the
//!   map has exactly one live slot in the queue (same key and generation);
//!   other slots are stale (left by [`Dedup::forget`] or by a renewal) and
//!   are counted. When the queue holds more than twice `capacity` slots it is
//!   compacted to the live ones, so it never holds more than
//!   `2 * capacity + 1`, whatever the sequence of calls. Both tables give
//!   their memory back when they are mostly empty.
//! - `bytes` is the sum of the cached responses' weights and is at most
//!   `max_bytes` after every call.

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

/// How many bytes a cached response holds, for the byte bound of
/// [`Dedup`].
pub trait Weigh {
    /// Bytes this response keeps alive while cached.
    fn weight(&self) -> usize;
}

impl Weigh for () {
    fn weight(&self) -> usize {
        0
    }
}

impl Weigh for u32 {
    fn weight(&self) -> usize {
        std::mem::size_of::<u32>()
    }
}

impl Weigh for Vec<u8> {
    fn weight(&self) -> usize {
        self.capacity()
    }
}

impl Weigh for &'static str {
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Weigh for super::Outgoing {
    fn weight(&self) -> usize {
        self.len()
    }
}

/// Default byte bound per entry of `capacity` ([`Dedup::new`]): room for a
/// response of the largest default datagram (1,280 bytes) in every entry.
pub const DEFAULT_BYTES_PER_ENTRY: usize = 1280;

/// Below this many slots a table is not shrunk.
const MIN_SLOTS: usize = 64;

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

/// One map entry: what is known, when it expires, and the generation of its
/// live queue slot.
#[derive(Debug)]
struct Slot<R> {
    entry: Entry<R>,
    expires: Instant,
    gen: u64,
}

/// Sizes of a [`Dedup`], for tests and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupSize {
    /// Entries held (the map's length).
    pub entries: usize,
    /// Queue slots, live and stale.
    pub queued: usize,
    /// Slots the map has allocated.
    pub map_capacity: usize,
    /// Slots the queue has allocated.
    pub queue_capacity: usize,
    /// Bytes of cached responses (their [`Weigh::weight`]).
    pub bytes: usize,
}

/// Counters of a [`Dedup`], increasing over its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupStats {
    /// Entries dropped before their lifetime because `capacity` entries were
    /// held (or asked for by [`Dedup::evict`]).
    pub evicted_early: u64,
    /// Entries dropped before their lifetime because the cached responses
    /// weighed more than `max_bytes`.
    pub evicted_bytes: u64,
    /// Responses not cached at all: heavier alone than `max_bytes`.
    pub too_heavy: u64,
    /// Entries forgotten ([`Dedup::forget`]).
    pub forgotten: u64,
    /// Times the queue was compacted to its live slots.
    pub compactions: u64,
}

/// Bounded (peer, message ID) cache holding responses of type `R`.
#[derive(Debug)]
pub struct Dedup<R> {
    map: KeyMap<Slot<R>>,
    order: VecDeque<(Key, Instant, u64)>,
    capacity: usize,
    max_bytes: usize,
    bytes: usize,
    next_gen: u64,
    con_lifetime: Duration,
    non_lifetime: Duration,
    stats: DedupStats,
}

impl<R> Dedup<R> {
    /// A cache of at most `capacity` entries whose responses weigh at most
    /// `capacity` x [`DEFAULT_BYTES_PER_ENTRY`] together; CON entries live
    /// `con_lifetime` (EXCHANGE_LIFETIME), NON entries `non_lifetime`.
    pub fn new(capacity: usize, con_lifetime: Duration, non_lifetime: Duration) -> Dedup<R> {
        let capacity = capacity.max(1);
        Dedup {
            map: KeyMap::with_capacity_and_hasher(capacity.min(1 << 16), Default::default()),
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity,
            max_bytes: capacity.saturating_mul(DEFAULT_BYTES_PER_ENTRY),
            bytes: 0,
            next_gen: 0,
            con_lifetime,
            non_lifetime,
            stats: DedupStats::default(),
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries dropped before their lifetime because of the capacity bound
    /// (or [`Dedup::evict`]).
    pub fn evicted_early(&self) -> u64 {
        self.stats.evicted_early
    }

    /// The counters.
    pub fn stats(&self) -> DedupStats {
        self.stats
    }

    /// The sizes of the tables now.
    pub fn size(&self) -> DedupSize {
        DedupSize {
            entries: self.map.len(),
            queued: self.order.len(),
            map_capacity: self.map.capacity(),
            queue_capacity: self.order.capacity(),
            bytes: self.bytes,
        }
    }

    /// The bound on entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The bound on the bytes of cached responses.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

impl<R: Weigh> Dedup<R> {
    /// The same cache with its cached responses bounded to `max_bytes`
    /// together instead.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Dedup<R> {
        self.max_bytes = max_bytes;
        self.trim_bytes();
        self
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
        if self.map.len() >= self.capacity && !self.map.contains_key(&key) && self.evict_oldest() {
            self.stats.evicted_early += 1;
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
        let gen = self.next_gen;
        let slot = Slot {
            entry,
            expires,
            gen,
        };
        let fresh = match self.map.entry(key) {
            MapEntry::Occupied(o) if o.get().expires > now => false,
            MapEntry::Occupied(mut o) => {
                // expired while waiting behind longer-lived entries: renew;
                // its old queue slot is stale from now on
                let old = o.insert(slot);
                if let Entry::Done(r) = &old.entry {
                    self.bytes -= r.weight();
                }
                true
            }
            MapEntry::Vacant(v) => {
                v.insert(slot);
                true
            }
        };
        if !fresh {
            // a duplicate: a second lookup, off the common path
            return match self.map.get(&key).map(|s| &s.entry) {
                Some(Entry::InProgress) | None => Seen::InProgress,
                Some(Entry::Done(r)) => Seen::Replay(r),
                Some(Entry::Seen) => Seen::Duplicate,
            };
        }
        self.next_gen += 1;
        self.push(key, expires, gen);
        Seen::New
    }

    /// Stores the response sent for a CON recorded by [`Dedup::check`].
    /// Ignored if the entry is gone (expired or evicted). A response heavier
    /// alone than `max_bytes` is not kept: the entry goes, so a duplicate is
    /// processed again.
    pub fn complete(&mut self, peer: SocketAddr, mid: u16, response: R) {
        let key = Key::new(&peer, mid);
        let w = response.weight();
        if w > self.max_bytes {
            if self.remove(&key) {
                self.stats.too_heavy += 1;
            }
            return;
        }
        let Some(slot) = self.map.get_mut(&key) else {
            return;
        };
        if let Entry::Done(old) = &slot.entry {
            self.bytes -= old.weight();
        }
        slot.entry = Entry::Done(response);
        self.bytes += w;
        self.trim_bytes();
    }

    /// Forgets a message (e.g. its processing was shed before any answer).
    pub fn forget(&mut self, peer: SocketAddr, mid: u16) {
        if self.remove(&Key::new(&peer, mid)) {
            self.stats.forgotten += 1;
            self.shrink();
        }
    }

    /// Drops up to `n` of the oldest entries before their lifetime (to give
    /// back the buffers their cached responses hold); returns how many went.
    pub fn evict(&mut self, n: usize) -> usize {
        let mut gone = 0;
        while gone < n && self.evict_oldest() {
            gone += 1;
        }
        self.stats.evicted_early += gone as u64;
        self.shrink();
        gone
    }

    /// Checks the invariants of the [type documentation](Dedup) (for tests:
    /// it walks both tables). Returns what is wrong, if anything.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.map.len() > self.capacity {
            return Err(format!(
                "{} entries > capacity {}",
                self.map.len(),
                self.capacity
            ));
        }
        if self.order.len() > 2 * self.capacity + 1 {
            return Err(format!(
                "{} queue slots > 2 x capacity {} + 1",
                self.order.len(),
                self.capacity
            ));
        }
        let live = self
            .order
            .iter()
            .filter(|(k, _, g)| self.map.get(k).is_some_and(|s| s.gen == *g))
            .count();
        if live != self.map.len() {
            return Err(format!(
                "{live} live queue slots for {} entries",
                self.map.len()
            ));
        }
        let bytes: usize = self
            .map
            .values()
            .map(|s| match &s.entry {
                Entry::Done(r) => r.weight(),
                _ => 0,
            })
            .sum();
        if bytes != self.bytes {
            return Err(format!("bytes {} but entries weigh {bytes}", self.bytes));
        }
        if self.bytes > self.max_bytes {
            return Err(format!(
                "bytes {} > max_bytes {}",
                self.bytes, self.max_bytes
            ));
        }
        Ok(())
    }

    /// Queues a live slot, first compacting the queue when the stale slots
    /// would take it past twice the capacity.
    fn push(&mut self, key: Key, expires: Instant, gen: u64) {
        if self.order.len() >= 2 * self.capacity {
            let map = &self.map;
            self.order
                .retain(|(k, _, g)| map.get(k).is_some_and(|s| s.gen == *g));
            self.stats.compactions += 1;
        }
        self.order.push_back((key, expires, gen));
    }

    fn expire(&mut self, now: Instant) {
        let mut swept = false;
        while let Some(&(key, exp, gen)) = self.order.front() {
            if exp > now {
                break;
            }
            self.order.pop_front();
            self.remove_if_current(key, gen);
            swept = true;
        }
        if swept {
            self.shrink();
        }
    }

    /// Drops the oldest live entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((key, _, gen)) = self.order.pop_front() {
            if self.remove_if_current(key, gen) {
                return true;
            }
        }
        false
    }

    /// Drops the oldest entries until the cached responses fit `max_bytes`.
    fn trim_bytes(&mut self) {
        while self.bytes > self.max_bytes && self.evict_oldest() {
            self.stats.evicted_bytes += 1;
        }
    }

    /// Removes `key`'s entry, whatever its queue slot; its slot turns stale.
    fn remove(&mut self, key: &Key) -> bool {
        match self.map.remove(key) {
            Some(s) => {
                self.unweigh(&s);
                true
            }
            None => false,
        }
    }

    /// Removes `key` if its entry is the one queued with `gen` (a forgotten
    /// and re-added or renewed key has a newer one). One lookup.
    fn remove_if_current(&mut self, key: Key, gen: u64) -> bool {
        match self.map.entry(key) {
            MapEntry::Occupied(o) if o.get().gen == gen => {
                let s = o.remove();
                self.unweigh(&s);
                true
            }
            _ => false,
        }
    }

    fn unweigh(&mut self, s: &Slot<R>) {
        if let Entry::Done(r) = &s.entry {
            self.bytes -= r.weight();
        }
    }

    /// Gives memory back when a table uses under a quarter of its slots
    /// (to twice what it holds, so that shrinking again takes as many
    /// removals as it copied: amortized O(1)).
    fn shrink(&mut self) {
        if self.map.capacity() > MIN_SLOTS && self.map.capacity() / 4 > self.map.len() {
            self.map.shrink_to((2 * self.map.len()).max(MIN_SLOTS));
        }
        if self.order.capacity() > MIN_SLOTS && self.order.capacity() / 4 > self.order.len() {
            let map = &self.map;
            self.order
                .retain(|(k, _, g)| map.get(k).is_some_and(|s| s.gen == *g));
            self.order.shrink_to((2 * self.order.len()).max(MIN_SLOTS));
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

    /// The flood of the issue: distinct NONs, each shed (forgotten) at once.
    /// Before, every forget left its queue slot behind until NON_LIFETIME,
    /// about 50 bytes a datagram; now both tables stay within their bound.
    #[test]
    fn a_million_forgotten_messages_leave_the_tables_bounded() {
        let t0 = Instant::now();
        let cap = 1024;
        let mut d: Dedup<()> = Dedup::new(cap, Duration::from_secs(247), Duration::from_secs(145));
        let mut worst = DedupSize::default();
        for i in 0..1_000_000u32 {
            // all within NON_LIFETIME: nothing expires on its own
            let now = t0 + Duration::from_micros(u64::from(i));
            let p = SocketAddr::from((
                [10, 0, (i >> 24) as u8, (i >> 16) as u8],
                1 + (i % 60000) as u16,
            ));
            assert_eq!(d.check(now, p, i as u16, false), Seen::New);
            d.forget(p, i as u16);
            let s = d.size();
            worst.queued = worst.queued.max(s.queued);
            worst.queue_capacity = worst.queue_capacity.max(s.queue_capacity);
            worst.map_capacity = worst.map_capacity.max(s.map_capacity);
        }
        assert!(d.is_empty());
        assert!(worst.queued <= 2 * cap + 1, "{worst:?}");
        assert!(worst.queue_capacity <= 4 * cap + 1, "{worst:?}");
        assert!(worst.map_capacity <= 4 * cap, "{worst:?}");
        assert_eq!(d.stats().forgotten, 1_000_000);
        assert!(d.stats().compactions > 0);
        d.check_invariants().unwrap();
    }

    /// Distinct messages kept (not forgotten) go by the capacity bound, and
    /// once they have expired both tables give their memory back.
    #[test]
    fn distinct_messages_stay_within_capacity_and_memory_comes_back() {
        let t0 = Instant::now();
        let cap = 4096;
        let mut d: Dedup<Vec<u8>> =
            Dedup::new(cap, Duration::from_secs(247), Duration::from_secs(145));
        for i in 0..200_000u32 {
            let now = t0 + Duration::from_micros(u64::from(i));
            let p = SocketAddr::from((
                [10, 1, (i >> 24) as u8, (i >> 16) as u8],
                1 + (i % 60000) as u16,
            ));
            let con = i % 3 == 0;
            assert_eq!(d.check(now, p, i as u16, con), Seen::New);
            if con {
                d.complete(p, i as u16, vec![0; 40]);
            }
            assert!(d.len() <= cap);
            assert!(d.size().queued <= 2 * cap + 1);
        }
        let full = d.size();
        assert_eq!(full.entries, cap);
        // the map may double once when deleted slots fill it (hashbrown
        // grows rather than rehash in place above half full)
        assert!(
            full.map_capacity <= 4 * cap && full.queue_capacity <= 4 * cap + 1,
            "{full:?}"
        );
        // past EXCHANGE_LIFETIME everything has expired; the next lookup
        // sweeps it and shrinks both tables
        let later = t0 + Duration::from_secs(300);
        assert_eq!(d.check(later, peer(1), 1, false), Seen::New);
        let s = d.size();
        assert_eq!((s.entries, s.queued, s.bytes), (1, 1, 0));
        assert!(
            s.map_capacity <= 2 * MIN_SLOTS && s.queue_capacity <= 2 * MIN_SLOTS,
            "{s:?}"
        );
        d.check_invariants().unwrap();
    }

    #[test]
    fn cached_responses_are_bounded_in_bytes_oldest_first() {
        let t0 = Instant::now();
        let mut d: Dedup<Vec<u8>> =
            Dedup::new(100, Duration::from_secs(247), Duration::from_secs(145))
                .with_max_bytes(1000);
        for mid in 0..20 {
            assert_eq!(d.check(t0, peer(1), mid, true), Seen::New);
            d.complete(peer(1), mid, vec![mid as u8; 300]);
            d.check_invariants().unwrap();
            assert!(d.size().bytes <= 1000);
        }
        // three responses of 300 fit in 1000: the last three are kept
        assert_eq!(d.size().bytes, 900);
        assert_eq!(
            d.check(t0, peer(1), 19, true),
            Seen::Replay(&vec![19u8; 300])
        );
        assert_eq!(
            d.check(t0, peer(1), 17, true),
            Seen::Replay(&vec![17u8; 300])
        );
        assert_eq!(
            d.check(t0, peer(1), 16, true),
            Seen::New,
            "evicted for bytes"
        );
        assert_eq!(d.stats().evicted_bytes, 17);
        // a response heavier alone than the bound is not kept at all
        assert_eq!(d.check(t0, peer(2), 1, true), Seen::New);
        d.complete(peer(2), 1, vec![0; 1001]);
        assert_eq!(d.stats().too_heavy, 1);
        assert_eq!(d.check(t0, peer(2), 1, true), Seen::New);
        d.check_invariants().unwrap();
    }

    #[test]
    fn forget_then_readd_at_the_same_instant_keeps_one_live_slot() {
        let t0 = Instant::now();
        let mut d: Dedup<()> = Dedup::new(2, Duration::from_secs(247), Duration::from_secs(145));
        for _ in 0..100 {
            assert_eq!(d.check(t0, peer(1), 5, false), Seen::New);
            d.forget(peer(1), 5);
            d.check_invariants().unwrap();
        }
        assert_eq!(d.check(t0, peer(1), 5, false), Seen::New);
        assert_eq!(d.check(t0, peer(2), 6, false), Seen::New);
        // the third entry evicts the oldest live one, not a stale slot
        assert_eq!(d.check(t0, peer(3), 7, false), Seen::New);
        assert_eq!(d.check(t0, peer(2), 6, false), Seen::Duplicate);
        assert_eq!(d.check(t0, peer(1), 5, false), Seen::New);
        d.check_invariants().unwrap();
    }
}
