//! Bounded per-destination state shared by the controllers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// At most `capacity` destinations; the least recently used goes first, and
/// one unused for `forget_after` starts over.
#[derive(Debug)]
pub(crate) struct DestTable<S> {
    map: HashMap<SocketAddr, (S, Instant)>,
    capacity: usize,
    forget_after: Duration,
}

impl<S> DestTable<S> {
    pub(crate) fn new(capacity: usize, forget_after: Duration) -> DestTable<S> {
        DestTable {
            map: HashMap::new(),
            capacity: capacity.max(1),
            forget_after,
        }
    }

    /// The state of `dest`, fresh from `new` when unknown, forgotten or
    /// evicted; marks it used at `now`.
    pub(crate) fn touch(
        &mut self,
        dest: SocketAddr,
        now: Instant,
        new: impl FnOnce() -> S,
    ) -> &mut S {
        if self
            .map
            .get(&dest)
            .is_some_and(|(_, used)| now.saturating_duration_since(*used) >= self.forget_after)
        {
            self.map.remove(&dest);
        }
        if !self.map.contains_key(&dest) && self.map.len() >= self.capacity {
            if let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(a, _)| *a)
            {
                self.map.remove(&oldest);
            }
        }
        let e = self.map.entry(dest).or_insert_with(|| (new(), now));
        e.1 = now;
        &mut e.0
    }

    pub(crate) fn get(&self, dest: SocketAddr) -> Option<&S> {
        self.map.get(&dest).map(|(s, _)| s)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
