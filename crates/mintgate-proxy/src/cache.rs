//! The response cache (RFC 7252 section 5.6), keyed like CoAP's: the
//! upstream, the method and every option that is part of the cache key.
//!
//! - A response is fresh for its Max-Age (60 s when absent) from the moment
//!   it was received; a fresh entry is served with `Age` and the remaining
//!   `max-age`.
//! - Only cacheable response codes are stored (2.05, and errors), never a
//!   response with Max-Age 0, and only payloads up to a size bound.
//! - A stale entry with an ETag is revalidated rather than fetched again:
//!   the caller sends the ETag, and a 2.03 with the same ETag refreshes the
//!   entry's freshness from the 2.03's Max-Age.
//! - At most `capacity` entries; inserting into a full cache evicts the
//!   least recently inserted or refreshed entry.
//!
//! Time is passed in (`now`), so every rule is tested without sleeping.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use mintgate_coap::wire::{Code, OptionNumber};

use crate::mapping::{Authority, CoapRequest, CoapResponse};

/// What identifies a cached response.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    authority: Authority,
    code: u8,
    /// The cache-key options in number order (stable: repeated options
    /// keep their order).
    options: Vec<(u16, Vec<u8>)>,
}

impl CacheKey {
    /// The key of `req` to `authority`: every option except NoCacheKey ones,
    /// ETag (validation) and the preconditions.
    pub fn new(authority: &Authority, req: &CoapRequest) -> CacheKey {
        let mut options: Vec<(u16, Vec<u8>)> = req
            .options
            .iter()
            .filter(|(n, _)| {
                !n.is_no_cache_key()
                    && *n != OptionNumber::ETAG
                    && *n != OptionNumber::IF_MATCH
                    && *n != OptionNumber::IF_NONE_MATCH
            })
            .map(|(n, v)| (n.0, v.clone()))
            .collect();
        options.sort_by_key(|(n, _)| *n);
        CacheKey {
            authority: authority.clone(),
            code: req.code.0,
            options,
        }
    }
}

struct Entry {
    resp: CoapResponse,
    stored: Instant,
    max_age: Duration,
    /// Bumped on every insert or refresh; the eviction queue holds the
    /// generation it saw, so stale queue items are skipped.
    generation: u64,
}

/// The outcome of a lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A fresh response and its age in whole seconds.
    Fresh(CoapResponse, u32),
    /// A stale entry that can be revalidated with this ETag.
    Stale(Vec<u8>),
    /// Nothing usable.
    Miss,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Fresh entries served.
    pub hits: u64,
    /// Lookups that found nothing usable.
    pub misses: u64,
    /// Stale entries offered for revalidation.
    pub stale: u64,
    /// Entries refreshed by a 2.03.
    pub revalidated: u64,
    /// Entries evicted for room.
    pub evictions: u64,
}

/// The cache. Invariant: `entries.len() <= capacity`, and every live entry
/// has exactly one queue item carrying its current generation.
pub struct Cache {
    capacity: usize,
    max_payload: usize,
    entries: HashMap<CacheKey, Entry>,
    order: VecDeque<(CacheKey, u64)>,
    next_gen: u64,
    stats: CacheStats,
}

impl Cache {
    /// A cache of at most `capacity` entries with payloads of at most
    /// `max_payload` bytes (capacity 0: nothing is ever stored).
    pub fn new(capacity: usize, max_payload: usize) -> Cache {
        Cache {
            capacity,
            max_payload,
            entries: HashMap::new(),
            order: VecDeque::new(),
            next_gen: 0,
            stats: CacheStats::default(),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Looks `key` up at `now`.
    pub fn lookup(&mut self, key: &CacheKey, now: Instant) -> Lookup {
        match self.entries.get(key) {
            Some(e) => {
                let age = now.saturating_duration_since(e.stored);
                if age < e.max_age {
                    self.stats.hits += 1;
                    Lookup::Fresh(e.resp.clone(), age.as_secs() as u32)
                } else if let Some(tag) = e.resp.option(OptionNumber::ETAG) {
                    self.stats.stale += 1;
                    Lookup::Stale(tag.to_vec())
                } else {
                    self.stats.misses += 1;
                    Lookup::Miss
                }
            }
            None => {
                self.stats.misses += 1;
                Lookup::Miss
            }
        }
    }

    /// Stores `resp` for `key` received at `now`, when it may be stored.
    /// Returns whether it was.
    pub fn store(&mut self, key: CacheKey, resp: &CoapResponse, now: Instant) -> bool {
        if self.capacity == 0
            || !resp.cacheable_code()
            || resp.code == Code::VALID
            || resp.payload.len() > self.max_payload
        {
            return false;
        }
        let max_age = match resp.max_age() {
            Some(0) | None => return false,
            Some(s) => Duration::from_secs(s.into()),
        };
        self.insert(key, resp.clone(), now, max_age);
        true
    }

    /// Applies a 2.03 Valid answering a revalidation of `key`: when its ETag
    /// matches the stored one, the entry becomes fresh again for the 2.03's
    /// Max-Age and is returned; otherwise the entry is dropped.
    pub fn revalidated(
        &mut self,
        key: &CacheKey,
        valid: &CoapResponse,
        now: Instant,
    ) -> Option<CoapResponse> {
        let tag = valid.option(OptionNumber::ETAG);
        let e = self.entries.get(key)?;
        if tag.is_none() || tag != e.resp.option(OptionNumber::ETAG) {
            self.entries.remove(key);
            return None;
        }
        let max_age = Duration::from_secs(valid.max_age().unwrap_or(0).into());
        let mut resp = e.resp.clone();
        // The 2.03's Max-Age replaces the stored one.
        resp.options.retain(|(n, _)| *n != OptionNumber::MAX_AGE);
        if let Some(v) = valid.option(OptionNumber::MAX_AGE) {
            resp.options.push((OptionNumber::MAX_AGE, v.to_vec()));
        }
        self.stats.revalidated += 1;
        if max_age.is_zero() {
            self.entries.remove(key);
        } else {
            self.insert(key.clone(), resp.clone(), now, max_age);
        }
        Some(resp)
    }

    /// Drops `key` (e.g. after an unsafe method on the same resource).
    pub fn invalidate(&mut self, key: &CacheKey) {
        self.entries.remove(key);
    }

    fn insert(&mut self, key: CacheKey, resp: CoapResponse, now: Instant, max_age: Duration) {
        self.next_gen += 1;
        let generation = self.next_gen;
        if !self.entries.contains_key(&key) {
            while self.entries.len() >= self.capacity {
                let Some((k, g)) = self.order.pop_front() else {
                    break;
                };
                if self.entries.get(&k).is_some_and(|e| e.generation == g) {
                    self.entries.remove(&k);
                    self.stats.evictions += 1;
                }
            }
        }
        self.order.push_back((key.clone(), generation));
        self.entries.insert(
            key,
            Entry {
                resp,
                stored: now,
                max_age,
                generation,
            },
        );
        // Keep the queue from growing without bound through refreshes of the
        // same keys: compact when it holds far more items than entries.
        if self.order.len() > 4 * self.capacity.max(16) {
            let entries = &self.entries;
            self.order
                .retain(|(k, g)| entries.get(k).is_some_and(|e| e.generation == *g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str) -> CoapRequest {
        CoapRequest {
            code: Code::GET,
            options: vec![(OptionNumber::URI_PATH, path.as_bytes().to_vec())],
            payload: vec![],
        }
    }

    fn resp(code: Code, max_age: Option<u32>, etag: Option<&[u8]>, body: &str) -> CoapResponse {
        let mut options = Vec::new();
        if let Some(e) = etag {
            options.push((OptionNumber::ETAG, e.to_vec()));
        }
        if let Some(m) = max_age {
            let mut b = [0u8; 4];
            options.push((
                OptionNumber::MAX_AGE,
                mintgate_coap::wire::encode_uint(m, &mut b).to_vec(),
            ));
        }
        CoapResponse {
            code,
            options,
            payload: body.as_bytes().to_vec(),
        }
    }

    fn auth() -> Authority {
        Authority::new("127.0.0.1", 5683)
    }

    #[test]
    fn fresh_until_max_age_then_miss() {
        let mut c = Cache::new(8, 1024);
        let t0 = Instant::now();
        let k = CacheKey::new(&auth(), &req("a"));
        assert_eq!(c.lookup(&k, t0), Lookup::Miss);
        assert!(c.store(k.clone(), &resp(Code::CONTENT, Some(10), None, "x"), t0));
        match c.lookup(&k, t0 + Duration::from_secs(3)) {
            Lookup::Fresh(r, age) => {
                assert_eq!(r.payload, b"x");
                assert_eq!(age, 3);
            }
            other => panic!("expected fresh, got {other:?}"),
        }
        assert_eq!(c.lookup(&k, t0 + Duration::from_secs(10)), Lookup::Miss);
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (1, 2));
    }

    #[test]
    fn default_max_age_is_60s_and_zero_is_not_stored() {
        let mut c = Cache::new(8, 1024);
        let t0 = Instant::now();
        let k = CacheKey::new(&auth(), &req("a"));
        assert!(c.store(k.clone(), &resp(Code::CONTENT, None, None, "x"), t0));
        assert!(matches!(
            c.lookup(&k, t0 + Duration::from_secs(59)),
            Lookup::Fresh(..)
        ));
        assert_eq!(c.lookup(&k, t0 + Duration::from_secs(60)), Lookup::Miss);
        let k2 = CacheKey::new(&auth(), &req("b"));
        assert!(!c.store(k2.clone(), &resp(Code::CONTENT, Some(0), None, "x"), t0));
        assert_eq!(c.lookup(&k2, t0), Lookup::Miss);
    }

    #[test]
    fn uncacheable_codes_and_big_payloads_are_not_stored() {
        let mut c = Cache::new(8, 4);
        let t0 = Instant::now();
        let k = CacheKey::new(&auth(), &req("a"));
        assert!(!c.store(k.clone(), &resp(Code::CHANGED, Some(10), None, "x"), t0));
        assert!(!c.store(k.clone(), &resp(Code::CREATED, Some(10), None, "x"), t0));
        assert!(!c.store(k.clone(), &resp(Code::CONTENT, Some(10), None, "12345"), t0));
        assert!(c.store(k.clone(), &resp(Code::NOT_FOUND, Some(10), None, ""), t0));
        assert!(c.is_empty() || c.len() == 1);
    }

    #[test]
    fn key_separates_paths_accept_and_authorities_not_etags() {
        let a = req("a");
        let mut a_accept = a.clone();
        a_accept.options.push((OptionNumber::ACCEPT, vec![50]));
        let mut a_etag = a.clone();
        a_etag.options.push((OptionNumber::ETAG, vec![1, 2]));
        let k = CacheKey::new(&auth(), &a);
        assert_ne!(k, CacheKey::new(&auth(), &req("b")));
        assert_ne!(k, CacheKey::new(&auth(), &a_accept));
        assert_ne!(k, CacheKey::new(&Authority::new("::1", 5683), &a));
        assert_eq!(k, CacheKey::new(&auth(), &a_etag));
        // Path order matters.
        let mut ab = req("a");
        ab.options.push((OptionNumber::URI_PATH, b"b".to_vec()));
        let mut ba = req("b");
        ba.options.push((OptionNumber::URI_PATH, b"a".to_vec()));
        assert_ne!(CacheKey::new(&auth(), &ab), CacheKey::new(&auth(), &ba));
    }

    #[test]
    fn stale_with_etag_is_revalidated_by_a_matching_2_03() {
        let mut c = Cache::new(8, 1024);
        let t0 = Instant::now();
        let k = CacheKey::new(&auth(), &req("a"));
        c.store(
            k.clone(),
            &resp(Code::CONTENT, Some(5), Some(b"\x01\x02"), "body"),
            t0,
        );
        let t1 = t0 + Duration::from_secs(6);
        assert_eq!(c.lookup(&k, t1), Lookup::Stale(vec![1, 2]));
        let r = c
            .revalidated(&k, &resp(Code::VALID, Some(30), Some(b"\x01\x02"), ""), t1)
            .expect("refreshed");
        assert_eq!(r.payload, b"body");
        assert_eq!(r.max_age(), Some(30));
        assert!(matches!(
            c.lookup(&k, t1 + Duration::from_secs(29)),
            Lookup::Fresh(..)
        ));
        // A 2.03 with another ETag drops the entry.
        let t2 = t1 + Duration::from_secs(31);
        assert_eq!(c.lookup(&k, t2), Lookup::Stale(vec![1, 2]));
        assert!(c
            .revalidated(&k, &resp(Code::VALID, Some(30), Some(b"\x09"), ""), t2)
            .is_none());
        assert_eq!(c.lookup(&k, t2), Lookup::Miss);
    }

    #[test]
    fn capacity_is_a_bound_and_oldest_goes_first() {
        let mut c = Cache::new(3, 1024);
        let t0 = Instant::now();
        for i in 0..10 {
            let k = CacheKey::new(&auth(), &req(&format!("r{i}")));
            c.store(k, &resp(Code::CONTENT, Some(100), None, "x"), t0);
            assert!(c.len() <= 3);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.stats().evictions, 7);
        let oldest = CacheKey::new(&auth(), &req("r6"));
        let newest = CacheKey::new(&auth(), &req("r9"));
        assert_eq!(c.lookup(&oldest, t0), Lookup::Miss);
        assert!(matches!(c.lookup(&newest, t0), Lookup::Fresh(..)));
        // Refreshing one key many times does not grow the queue unboundedly.
        for _ in 0..1000 {
            c.store(
                newest.clone(),
                &resp(Code::CONTENT, Some(100), None, "y"),
                t0,
            );
        }
        assert!(c.order.len() <= 4 * 16 + 1);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn zero_capacity_stores_nothing() {
        let mut c = Cache::new(0, 1024);
        let k = CacheKey::new(&auth(), &req("a"));
        assert!(!c.store(
            k.clone(),
            &resp(Code::CONTENT, Some(10), None, "x"),
            Instant::now()
        ));
        assert_eq!(c.lookup(&k, Instant::now()), Lookup::Miss);
    }
}
