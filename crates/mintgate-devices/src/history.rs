//! The latest value and a bounded history per device (Resource
//! Management's local store).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// One recorded value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    /// Wall-clock milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The value.
    pub value: f64,
}

/// The latest value (lock-free to read) and the last `capacity` records.
///
/// Invariant: the history never holds more than `capacity` records; the
/// oldest goes when a new one comes. `updates` counts every record ever
/// pushed, so `updates - len` were evicted.
pub struct History {
    capacity: usize,
    latest: AtomicU64,
    updates: AtomicU64,
    buf: Mutex<VecDeque<Record>>,
}

impl History {
    /// An empty history keeping at most `capacity` records (at least 1).
    pub fn new(capacity: usize) -> History {
        let capacity = capacity.max(1);
        History {
            capacity,
            latest: AtomicU64::new(f64::NAN.to_bits()),
            updates: AtomicU64::new(0),
            buf: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
        }
    }

    /// Records `value` now.
    pub fn push(&self, value: f64) {
        self.push_at(crate::clock::unix_ms(), value);
    }

    /// Records `value` at `unix_ms`.
    pub fn push_at(&self, unix_ms: u64, value: f64) {
        let mut b = self.buf.lock();
        if b.len() == self.capacity {
            b.pop_front();
        }
        b.push_back(Record { unix_ms, value });
        self.latest.store(value.to_bits(), Ordering::Release);
        self.updates.fetch_add(1, Ordering::Relaxed);
    }

    /// The latest value (`None` before the first).
    pub fn latest(&self) -> Option<f64> {
        let v = f64::from_bits(self.latest.load(Ordering::Acquire));
        (self.updates.load(Ordering::Relaxed) > 0).then_some(v)
    }

    /// Records pushed since creation.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// The most records kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The records pushed since the history had `mark` updates (at most
    /// what it still holds), oldest first, and the update count now: pass
    /// that back as the next `mark`.
    pub fn since(&self, mark: u64) -> (Vec<Record>, u64) {
        let b = self.buf.lock();
        let now = self.updates.load(Ordering::Relaxed);
        let n = (now.saturating_sub(mark) as usize).min(b.len());
        (b.iter().skip(b.len() - n).copied().collect(), now)
    }

    /// The records, oldest first (at most the last `limit`).
    pub fn records(&self, limit: usize) -> Vec<Record> {
        let b = self.buf.lock();
        let skip = b.len().saturating_sub(limit);
        b.iter().skip(skip).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn keeps_the_last_capacity_records(cap in 1usize..50, vals in proptest::collection::vec(-1e6f64..1e6, 0..200)) {
            let h = History::new(cap);
            for (i, v) in vals.iter().enumerate() {
                h.push_at(i as u64, *v);
            }
            let recs = h.records(usize::MAX);
            prop_assert_eq!(recs.len(), vals.len().min(cap));
            let tail = &vals[vals.len() - recs.len()..];
            prop_assert!(recs.iter().zip(tail).all(|(r, v)| r.value == *v));
            prop_assert_eq!(h.latest(), vals.last().copied());
            prop_assert_eq!(h.updates(), vals.len() as u64);
            prop_assert_eq!(h.records(3).len(), recs.len().min(3));
            let mark = (vals.len() / 2) as u64;
            let (new, now) = h.since(mark);
            prop_assert_eq!(now, vals.len() as u64);
            prop_assert_eq!(new.len(), (vals.len() - mark as usize).min(recs.len()));
            prop_assert!(new.iter().zip(&recs[recs.len() - new.len()..]).all(|(a, b)| a == b));
        }
    }
}
