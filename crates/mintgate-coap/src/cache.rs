//! A cache of other CoAP servers' responses (RFC 7252 section 5.6),
//! sans-IO: time is passed in, so every rule is tested without sleeping.
//! The gateway's outbound client and the HTTP proxy both keep theirs here.
//!
//! - The key is the origin (the server's address as the caller names it),
//!   the method and every option that is part of the cache key: all but
//!   the NoCacheKey ones (Size1, Size2, ...), ETag (validation), the
//!   preconditions and the Block options (a block-wise client stores the
//!   whole representation).
//! - A response is fresh for its Max-Age (60 s when absent) from the moment
//!   it was received ([`Lookup::Fresh`] gives its age).
//! - Only cacheable response codes are stored (2.05 and errors; not 2.03,
//!   which only refreshes), never a response with Max-Age 0, and only
//!   payloads up to `max_payload`.
//! - A stale entry with an ETag is revalidated rather than fetched again:
//!   the caller sends the ETag, and a 2.03 with the same ETag makes the
//!   entry fresh again for the 2.03's Max-Age ([`Cache::revalidated`]).
//! - At most `capacity` entries and `max_bytes` bytes (payloads, option
//!   values and keys); storing into a full cache evicts the least recently
//!   stored or refreshed entries first.
//! - Stored payloads and option values are copies of their own: a response
//!   whose bytes are slices of a receive buffer never pins that buffer.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::wire::{decode_uint, first_option, Code, OptionNumber};

/// Max-Age when a response has none (RFC 7252 5.10.5).
pub const DEFAULT_MAX_AGE: u32 = 60;

/// A response as a cache keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The response code.
    pub code: Code,
    /// Options in message order.
    pub options: Vec<(OptionNumber, Bytes)>,
    /// The payload.
    pub payload: Bytes,
}

impl Response {
    /// The first value of option `n`.
    pub fn option(&self, n: OptionNumber) -> Option<&[u8]> {
        first_option(&self.options, n)
    }

    /// The same response in buffers of its own (exactly its bytes).
    pub fn detached(&self) -> Response {
        Response {
            code: self.code,
            options: self
                .options
                .iter()
                .map(|(n, v)| (*n, Bytes::copy_from_slice(v)))
                .collect(),
            payload: Bytes::copy_from_slice(&self.payload),
        }
    }

    /// Max-Age in seconds (60 when absent), or None when malformed.
    pub fn max_age(&self) -> Option<u32> {
        match self.option(OptionNumber::MAX_AGE) {
            None => Some(DEFAULT_MAX_AGE),
            Some(v) => decode_uint(v),
        }
    }

    /// Whether a cache may keep this response (RFC 7252 section 5.9: 2.05,
    /// 2.03 and error responses are cacheable; 2.01, 2.02, 2.04 are not).
    pub fn cacheable_code(&self) -> bool {
        let c = self.code;
        c == Code::CONTENT || c == Code::VALID || c.class() == 4 || c.class() == 5
    }

    fn size(&self) -> usize {
        self.payload.len() + self.options.iter().map(|(_, v)| v.len() + 4).sum::<usize>()
    }
}

/// What identifies a cached response.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    origin: String,
    code: u8,
    /// The cache-key options in number order (stable: repeated options
    /// keep their order).
    options: Vec<(u16, Vec<u8>)>,
}

impl CacheKey {
    /// The key of a request with `code` and `options` to `origin`.
    pub fn new(origin: &str, code: Code, options: &[(OptionNumber, Vec<u8>)]) -> CacheKey {
        let mut options: Vec<(u16, Vec<u8>)> = options
            .iter()
            .filter(|(n, _)| is_key_option(*n))
            .map(|(n, v)| (n.0, v.clone()))
            .collect();
        options.sort_by_key(|(n, _)| *n);
        CacheKey {
            origin: origin.to_string(),
            code: code.0,
            options,
        }
    }

    fn size(&self) -> usize {
        self.origin.len() + self.options.iter().map(|(_, v)| v.len() + 4).sum::<usize>()
    }
}

/// Whether option `n` is part of the cache key.
pub fn is_key_option(n: OptionNumber) -> bool {
    !n.is_no_cache_key()
        && !matches!(
            n,
            OptionNumber::ETAG
                | OptionNumber::IF_MATCH
                | OptionNumber::IF_NONE_MATCH
                | OptionNumber::BLOCK1
                | OptionNumber::BLOCK2
        )
}

struct Entry {
    resp: Response,
    stored: Instant,
    max_age: Duration,
    /// Bytes charged against `max_bytes`.
    bytes: usize,
    /// Bumped on every insert or refresh; the eviction queue holds the
    /// generation it saw, so stale queue items are skipped.
    generation: u64,
}

/// The outcome of a lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A fresh response and its age in whole seconds.
    Fresh(Response, u32),
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

/// The cache. Invariants: `entries.len() <= capacity`, `bytes <= max_bytes`
/// and is the sum of the entries' bytes, and every live entry has exactly
/// one queue item carrying its current generation.
pub struct Cache {
    capacity: usize,
    max_payload: usize,
    max_bytes: usize,
    entries: HashMap<CacheKey, Entry>,
    order: VecDeque<(CacheKey, u64)>,
    bytes: usize,
    next_gen: u64,
    stats: CacheStats,
}

impl Cache {
    /// A cache of at most `capacity` entries with payloads of at most
    /// `max_payload` bytes (capacity 0: nothing is ever stored), and no
    /// byte bound beyond those two.
    pub fn new(capacity: usize, max_payload: usize) -> Cache {
        Cache {
            capacity,
            max_payload,
            max_bytes: usize::MAX,
            entries: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            next_gen: 0,
            stats: CacheStats::default(),
        }
    }

    /// Bounds the bytes held (payloads, option values and keys).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Cache {
        self.max_bytes = max_bytes;
        self
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
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
    pub fn store(&mut self, key: CacheKey, resp: &Response, now: Instant) -> bool {
        if self.capacity == 0
            || !resp.cacheable_code()
            || resp.code == Code::VALID
            || resp.payload.len() > self.max_payload
            || resp.size() + key.size() > self.max_bytes
        {
            return false;
        }
        let max_age = match resp.max_age() {
            Some(0) | None => return false,
            Some(s) => Duration::from_secs(s.into()),
        };
        self.insert(key, resp.detached(), now, max_age);
        true
    }

    /// Applies a 2.03 Valid answering a revalidation of `key`: when its ETag
    /// matches the stored one, the entry becomes fresh again for the 2.03's
    /// Max-Age and is returned; otherwise the entry is dropped.
    pub fn revalidated(
        &mut self,
        key: &CacheKey,
        valid: &Response,
        now: Instant,
    ) -> Option<Response> {
        let tag = valid.option(OptionNumber::ETAG);
        let e = self.entries.get(key)?;
        if tag.is_none() || tag != e.resp.option(OptionNumber::ETAG) {
            self.invalidate(key);
            return None;
        }
        let max_age = Duration::from_secs(valid.max_age().unwrap_or(0).into());
        let mut resp = e.resp.clone();
        // The 2.03's Max-Age replaces the stored one.
        resp.options.retain(|(n, _)| *n != OptionNumber::MAX_AGE);
        if let Some(v) = valid.option(OptionNumber::MAX_AGE) {
            resp.options
                .push((OptionNumber::MAX_AGE, Bytes::copy_from_slice(v)));
        }
        self.stats.revalidated += 1;
        if max_age.is_zero() {
            self.invalidate(key);
        } else {
            self.insert(key.clone(), resp.clone(), now, max_age);
        }
        Some(resp)
    }

    /// Drops `key` (e.g. after an unsafe method on the same resource).
    pub fn invalidate(&mut self, key: &CacheKey) {
        if let Some(e) = self.entries.remove(key) {
            self.bytes -= e.bytes;
        }
    }

    /// Evicts the oldest entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((k, g)) = self.order.pop_front() {
            if self.entries.get(&k).is_some_and(|e| e.generation == g) {
                self.invalidate(&k);
                self.stats.evictions += 1;
                return true;
            }
        }
        false
    }

    fn insert(&mut self, key: CacheKey, resp: Response, now: Instant, max_age: Duration) {
        self.invalidate(&key);
        let bytes = resp.size() + key.size();
        while (self.entries.len() >= self.capacity || self.bytes + bytes > self.max_bytes)
            && self.evict_oldest()
        {}
        self.next_gen += 1;
        let generation = self.next_gen;
        self.order.push_back((key.clone(), generation));
        self.bytes += bytes;
        self.entries.insert(
            key,
            Entry {
                resp,
                stored: now,
                max_age,
                bytes,
                generation,
            },
        );
        // Keep the queue from growing without bound through refreshes of the
        // same keys: compact when it holds far more items than entries.
        if self.order.len() > 4 * self.entries.len().max(16) {
            let entries = &self.entries;
            self.order
                .retain(|(k, g)| entries.get(k).is_some_and(|e| e.generation == *g));
        }
    }
}

#[cfg(test)]
mod tests;
