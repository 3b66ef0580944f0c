// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! The receiving side, sans-IO: de-duplicate and restore the order of each
//! stream, a stream being one publisher's messages on one topic (publishers
//! number each topic separately, [`crate::queue`]).
//!
//! Feed every received [`Envelope`] with its topic to [`Reorder::push`];
//! take what is ready with [`Reorder::poll_deliver`]. Invariants (tested
//! below):
//! - For each stream, deliveries have strictly increasing `seq`; each
//!   `seq` is delivered at most once (duplicates from at-least-once delivery
//!   are counted and dropped).
//! - Without gaps the delivered sequence is exactly `first, first+1, ...`.
//! - Where a stream starts: at `first_seq` when configured (a receiver that
//!   was there before the publisher, and wants to hear of anything lost
//!   before its first arrival); by default at the first sequence it sees (a
//!   receiver joining a running stream). A first arrival above 1 is then
//!   held for `join_wait` in case lower numbers arrive just after it (a
//!   window above 1 may reorder); the stream starts at the lowest seen.
//! - A gap (a missing `seq` with later ones buffered) is waited for at most
//!   `gap_timeout` (checked in [`Reorder::poll_timeout`]) or until
//!   `max_buffer` messages are held for that publisher; then delivery skips
//!   ahead and the skipped numbers are counted in [`ReorderStats::skipped`]
//!   and reported on the next [`Delivery`]. A message arriving after its
//!   number was skipped is dropped and counted as a duplicate (it is never
//!   delivered out of order).
//! - Memory is bounded: at most `max_buffer` envelopes per stream and
//!   `max_publishers` streams (messages of further streams are rejected and
//!   counted).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::payload::Envelope;

/// How a [`Reorder`] behaves.
#[derive(Clone, Copy, Debug)]
pub struct ReorderConfig {
    /// The first sequence expected on every stream; `None` (the default):
    /// start at the first one seen (after `join_wait`).
    pub first_seq: Option<u64>,
    /// With `first_seq: None`, how long a stream's first arrival, when it is
    /// not 1, waits for lower numbers before the stream starts.
    pub join_wait: Duration,
    /// Longest wait for a missing sequence; `None`: wait as long as the
    /// buffer has room.
    pub gap_timeout: Option<Duration>,
    /// Most envelopes held per stream while waiting for a gap.
    pub max_buffer: usize,
    /// Most streams (publisher and topic) tracked.
    pub max_publishers: usize,
}

impl Default for ReorderConfig {
    fn default() -> Self {
        ReorderConfig {
            first_seq: None,
            join_wait: Duration::from_millis(100),
            gap_timeout: Some(Duration::from_secs(10)),
            max_buffer: 65_536,
            max_publishers: 10_000,
        }
    }
}

/// One in-order message handed to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The topic it came on.
    pub topic: String,
    /// The message.
    pub env: Envelope,
    /// Sequence numbers given up on just before this one (0 normally).
    pub skipped_before: u64,
}

/// What happened to one pushed envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Push {
    /// It was the next expected: deliverable now (maybe with buffered ones).
    InOrder,
    /// It arrived ahead of a gap and is held.
    Buffered,
    /// Already delivered or already held: dropped.
    Duplicate,
    /// Too many streams: dropped.
    Rejected,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReorderStats {
    /// Envelopes pushed.
    pub received: u64,
    /// Delivered in order.
    pub delivered: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Arrived ahead of a gap and were held (arrivals out of order).
    pub reordered: u64,
    /// Sequence numbers given up on.
    pub skipped: u64,
    /// Dropped because of `max_publishers` (streams).
    pub rejected: u64,
}

#[derive(Debug)]
struct Stream {
    topic: String,
    next: u64,
    held: BTreeMap<u64, Envelope>,
    /// When the current gap was first seen (held non-empty).
    gap_since: Option<Instant>,
    /// Still collecting its first arrivals, until then (`first_seq: None`).
    joining_until: Option<Instant>,
}

/// The reorder buffer for any number of streams.
#[derive(Debug)]
pub struct Reorder {
    cfg: ReorderConfig,
    /// By (publisher, topic).
    streams: HashMap<(String, String), Stream>,
    ready: VecDeque<Delivery>,
    stats: ReorderStats,
}

impl Reorder {
    /// An empty buffer.
    pub fn new(cfg: ReorderConfig) -> Reorder {
        Reorder {
            cfg: ReorderConfig {
                max_buffer: cfg.max_buffer.max(1),
                ..cfg
            },
            streams: HashMap::new(),
            ready: VecDeque::new(),
            stats: ReorderStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ReorderStats {
        self.stats
    }

    /// Envelopes held waiting for gaps, all publishers.
    pub fn held(&self) -> usize {
        self.streams.values().map(|s| s.held.len()).sum()
    }

    /// The next sequence expected from `publisher` on `topic` (once the
    /// stream has started).
    pub fn next_expected(&self, publisher: &str, topic: &str) -> Option<u64> {
        self.streams
            .get(&(publisher.to_owned(), topic.to_owned()))
            .filter(|s| s.joining_until.is_none())
            .map(|s| s.next)
    }

    /// Takes one envelope received on `topic` at time `now`.
    pub fn push(&mut self, topic: &str, env: Envelope, now: Instant) -> Push {
        self.stats.received += 1;
        let key = (env.publisher.clone(), topic.to_owned());
        if !self.streams.contains_key(&key) {
            if self.streams.len() >= self.cfg.max_publishers {
                self.stats.rejected += 1;
                return Push::Rejected;
            }
            let (next, joining_until) = match self.cfg.first_seq {
                Some(f) => (f, None),
                // Nothing can come before 1: start at once.
                None if env.seq <= 1 => (env.seq, None),
                None => (env.seq, Some(now + self.cfg.join_wait)),
            };
            self.streams.insert(
                key.clone(),
                Stream {
                    topic: topic.to_owned(),
                    next,
                    held: BTreeMap::new(),
                    gap_since: None,
                    joining_until,
                },
            );
        }
        let Some(st) = self.streams.get_mut(&key) else {
            return Push::Rejected;
        };
        if st.joining_until.is_some() {
            if st.held.contains_key(&env.seq) {
                self.stats.duplicates += 1;
                return Push::Duplicate;
            }
            if env.seq < st.next {
                self.stats.reordered += 1;
            }
            st.next = st.next.min(env.seq);
            st.held.insert(env.seq, env);
            if st.next <= 1 || st.held.len() > self.cfg.max_buffer {
                self.stats.delivered += start(st, &mut self.ready, now);
                return Push::InOrder;
            }
            return Push::Buffered;
        }
        if env.seq < st.next {
            // Below the next expected: delivered before, or given up on.
            self.stats.duplicates += 1;
            return Push::Duplicate;
        }
        if st.held.contains_key(&env.seq) {
            self.stats.duplicates += 1;
            return Push::Duplicate;
        }
        if env.seq == st.next {
            let ready = &mut self.ready;
            st.next += 1;
            ready.push_back(Delivery {
                topic: st.topic.clone(),
                env,
                skipped_before: 0,
            });
            self.stats.delivered += 1;
            self.stats.delivered += drain(st, ready);
            st.gap_since = if st.held.is_empty() { None } else { Some(now) };
            return Push::InOrder;
        }
        st.held.insert(env.seq, env);
        self.stats.reordered += 1;
        st.gap_since.get_or_insert(now);
        if st.held.len() > self.cfg.max_buffer {
            let (d, s) = skip_gap(st, &mut self.ready);
            self.stats.delivered += d;
            self.stats.skipped += s;
            st.gap_since = if st.held.is_empty() { None } else { Some(now) };
        }
        Push::Buffered
    }

    /// Starts the streams whose `join_wait` is over and gives up on gaps
    /// older than `gap_timeout` at `now`.
    pub fn poll_timeout(&mut self, now: Instant) {
        for st in self.streams.values_mut() {
            if st.joining_until.is_some_and(|t| now >= t) {
                self.stats.delivered += start(st, &mut self.ready, now);
            }
        }
        let Some(limit) = self.cfg.gap_timeout else {
            return;
        };
        for st in self.streams.values_mut() {
            while st
                .gap_since
                .is_some_and(|t| now.saturating_duration_since(t) >= limit)
            {
                let (d, s) = skip_gap(st, &mut self.ready);
                self.stats.delivered += d;
                self.stats.skipped += s;
                st.gap_since = if st.held.is_empty() { None } else { Some(now) };
            }
        }
    }

    /// When [`Reorder::poll_timeout`] next has something to do.
    pub fn next_timeout(&self) -> Option<Instant> {
        let gaps = self.cfg.gap_timeout.and_then(|limit| {
            self.streams
                .values()
                .filter_map(|s| s.gap_since)
                .min()
                .map(|t| t + limit)
        });
        let joins = self.streams.values().filter_map(|s| s.joining_until).min();
        match (gaps, joins) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next in-order message, if any.
    pub fn poll_deliver(&mut self) -> Option<Delivery> {
        self.ready.pop_front()
    }
}

/// Ends a stream's join: it starts at the lowest held sequence; returns how
/// many were delivered.
fn start(st: &mut Stream, ready: &mut VecDeque<Delivery>, now: Instant) -> u64 {
    st.joining_until = None;
    if let Some(&first) = st.held.keys().next() {
        st.next = first;
    }
    let d = drain(st, ready);
    st.gap_since = if st.held.is_empty() { None } else { Some(now) };
    d
}

/// Moves held envelopes that are now next onto `ready`; returns how many.
fn drain(st: &mut Stream, ready: &mut VecDeque<Delivery>) -> u64 {
    let mut n = 0;
    while let Some(env) = st.held.remove(&st.next) {
        st.next += 1;
        ready.push_back(Delivery {
            topic: st.topic.clone(),
            env,
            skipped_before: 0,
        });
        n += 1;
    }
    n
}

/// Skips to the lowest held sequence and drains; returns (delivered, skipped).
fn skip_gap(st: &mut Stream, ready: &mut VecDeque<Delivery>) -> (u64, u64) {
    let Some((&first, _)) = st.held.iter().next() else {
        return (0, 0);
    };
    let skipped = first - st.next;
    st.next = first;
    let Some(env) = st.held.remove(&first) else {
        return (0, skipped);
    };
    st.next += 1;
    ready.push_back(Delivery {
        topic: st.topic.clone(),
        env,
        skipped_before: skipped,
    });
    (1 + drain(st, ready), skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn env(p: &str, seq: u64) -> Envelope {
        Envelope {
            publisher: p.into(),
            seq,
            ts: 0,
            msg: String::new(),
        }
    }

    /// The configuration of a receiver that was there first.
    fn from_one() -> ReorderConfig {
        ReorderConfig {
            first_seq: Some(1),
            ..ReorderConfig::default()
        }
    }

    fn delivered(r: &mut Reorder) -> Vec<(String, u64)> {
        std::iter::from_fn(|| r.poll_deliver().map(|d| (d.env.publisher, d.env.seq))).collect()
    }

    #[test]
    fn reorders_and_drops_duplicates_per_publisher() {
        let mut r = Reorder::new(from_one());
        let t = Instant::now();
        assert_eq!(r.push("t", env("a", 2), t), Push::Buffered);
        assert_eq!(r.push("t", env("b", 1), t), Push::InOrder);
        assert_eq!(r.push("t", env("a", 3), t), Push::Buffered);
        assert_eq!(r.push("t", env("a", 3), t), Push::Duplicate);
        assert_eq!(delivered(&mut r), vec![("b".into(), 1)]);
        assert_eq!(r.push("t", env("a", 1), t), Push::InOrder);
        assert_eq!(
            delivered(&mut r),
            vec![("a".into(), 1), ("a".into(), 2), ("a".into(), 3)]
        );
        assert_eq!(r.push("t", env("a", 2), t), Push::Duplicate);
        let s = r.stats();
        assert_eq!(
            (s.received, s.delivered, s.duplicates, s.reordered),
            (6, 4, 2, 2)
        );
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn gap_timeout_skips_and_reports() {
        let cfg = ReorderConfig {
            gap_timeout: Some(Duration::from_secs(5)),
            ..from_one()
        };
        let mut r = Reorder::new(cfg);
        let t = Instant::now();
        r.push("t", env("a", 1), t);
        r.push("t", env("a", 4), t);
        r.push("t", env("a", 5), t);
        assert_eq!(r.next_timeout(), Some(t + Duration::from_secs(5)));
        r.poll_timeout(t + Duration::from_secs(4));
        assert_eq!(delivered(&mut r), vec![("a".into(), 1)]);
        r.poll_timeout(t + Duration::from_secs(5));
        let d: Vec<_> = std::iter::from_fn(|| r.poll_deliver()).collect();
        assert_eq!(d.iter().map(|d| d.env.seq).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(d[0].skipped_before, 2);
        assert_eq!(r.stats().skipped, 2);
        assert_eq!(
            r.push("t", env("a", 2), t),
            Push::Duplicate,
            "late: never out of order"
        );
        assert_eq!(r.next_timeout(), None);
    }

    #[test]
    fn buffer_bound_forces_skip() {
        let cfg = ReorderConfig {
            gap_timeout: None,
            max_buffer: 2,
            ..from_one()
        };
        let mut r = Reorder::new(cfg);
        let t = Instant::now();
        for s in [3, 4, 5] {
            r.push("t", env("a", s), t);
        }
        assert_eq!(
            delivered(&mut r),
            vec![("a".into(), 3), ("a".into(), 4), ("a".into(), 5)]
        );
        assert_eq!(r.stats().skipped, 2);
    }

    #[test]
    fn late_joiner_starts_at_first_seen() {
        let mut r = Reorder::new(ReorderConfig::default());
        let t = Instant::now();
        assert_eq!(r.push("t", env("a", 40), t), Push::Buffered);
        assert_eq!(r.push("t", env("a", 41), t), Push::Buffered);
        assert_eq!(r.next_timeout(), Some(t + Duration::from_millis(100)));
        r.poll_timeout(t + Duration::from_millis(99));
        assert_eq!(delivered(&mut r), vec![]);
        // One number below the first arrival comes within join_wait: the
        // stream starts there.
        assert_eq!(r.push("t", env("a", 39), t), Push::Buffered);
        r.poll_timeout(t + Duration::from_millis(100));
        assert_eq!(
            delivered(&mut r),
            vec![("a".into(), 39), ("a".into(), 40), ("a".into(), 41)]
        );
        assert_eq!(r.push("t", env("a", 42), t), Push::InOrder);
        assert_eq!(r.push("t", env("a", 38), t), Push::Duplicate, "too late");
        assert_eq!(r.stats().skipped, 0);
        assert_eq!(r.next_timeout(), None);
        // A stream whose first arrival is 1 starts at once.
        assert_eq!(r.push("t", env("b", 1), t), Push::InOrder);
        assert_eq!(delivered(&mut r), vec![("a".into(), 42), ("b".into(), 1)]);
    }

    #[test]
    fn each_topic_of_a_publisher_is_its_own_stream() {
        let mut r = Reorder::new(from_one());
        let t = Instant::now();
        // One publisher, two topics, each numbered 1, 2, ...: no gap.
        for (topic, seq) in [("x", 1), ("y", 1), ("y", 2), ("x", 2)] {
            assert_eq!(r.push(topic, env("a", seq), t), Push::InOrder);
        }
        let got: Vec<(String, u64)> =
            std::iter::from_fn(|| r.poll_deliver().map(|d| (d.topic, d.env.seq))).collect();
        assert_eq!(
            got,
            [("x", 1), ("y", 1), ("y", 2), ("x", 2)].map(|(t, s)| (t.to_string(), s))
        );
        assert_eq!(r.next_expected("a", "x"), Some(3));
        assert_eq!(r.next_timeout(), None, "no gap waited for");
    }

    #[test]
    fn publisher_cap() {
        let cfg = ReorderConfig {
            max_publishers: 1,
            ..from_one()
        };
        let mut r = Reorder::new(cfg);
        let t = Instant::now();
        assert_eq!(r.push("t", env("a", 1), t), Push::InOrder);
        assert_eq!(r.push("t", env("b", 1), t), Push::Rejected);
        assert_eq!(r.stats().rejected, 1);
    }

    proptest! {
        /// Any arrival order with any duplicates of 1..=n from two
        /// publishers: each publisher's deliveries are exactly 1..=n, once.
        #[test]
        fn restores_order_exactly_once(
            n in 1u64..80,
            dups in proptest::collection::vec((0u64..80, any::<bool>()), 0..60),
            shuffle_seed in any::<u64>(),
        ) {
            let mut arrivals: Vec<(String, u64)> = Vec::new();
            for p in ["a", "b"] {
                arrivals.extend((1..=n).map(|s| (p.to_string(), s)));
            }
            for (s, b) in dups {
                if s >= 1 && s <= n {
                    arrivals.push((if b { "a" } else { "b" }.to_string(), s));
                }
            }
            // Deterministic Fisher-Yates from the seed.
            let mut x = shuffle_seed | 1;
            for i in (1..arrivals.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                arrivals.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut r = Reorder::new(ReorderConfig { gap_timeout: None, ..from_one() });
            let t = Instant::now();
            let mut out: HashMap<String, Vec<u64>> = HashMap::new();
            for (p, s) in arrivals {
                r.push("t", env(&p, s), t);
                while let Some(d) = r.poll_deliver() {
                    prop_assert_eq!(d.skipped_before, 0);
                    out.entry(d.env.publisher).or_default().push(d.env.seq);
                }
            }
            for p in ["a", "b"] {
                prop_assert_eq!(out.get(p).cloned().unwrap_or_default(), (1..=n).collect::<Vec<_>>());
            }
            prop_assert_eq!(r.held(), 0);
            prop_assert_eq!(r.stats().delivered, 2 * n);
        }

        /// A late joiner: the stream it sees starts anywhere (k) and arrives
        /// shuffled within a window; pushed within join_wait, it is
        /// delivered exactly k..=n.
        #[test]
        fn late_joiner_gets_a_windowed_stream_in_order(
            k in 1u64..50,
            len in 1u64..80,
            window in 1usize..8,
            seed in any::<u64>(),
        ) {
            let mut arrivals: Vec<u64> = (k..k + len).collect();
            // Reorder within blocks of `window`.
            let mut x = seed | 1;
            for block in arrivals.chunks_mut(window) {
                for i in (1..block.len()).rev() {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    block.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
            let mut r = Reorder::new(ReorderConfig::default());
            let t = Instant::now();
            let mut out = Vec::new();
            for s in arrivals {
                r.push("t", env("a", s), t);
                out.extend(std::iter::from_fn(|| r.poll_deliver().map(|d| d.env.seq)));
            }
            r.poll_timeout(t + Duration::from_millis(100));
            out.extend(std::iter::from_fn(|| r.poll_deliver().map(|d| d.env.seq)));
            prop_assert_eq!(out, (k..k + len).collect::<Vec<_>>());
        }

        /// With losses and timeouts: deliveries stay strictly increasing.
        #[test]
        fn never_out_of_order_with_losses(
            seqs in proptest::collection::vec(1u64..200, 0..200),
            ticks in proptest::collection::vec(0u64..3, 0..200),
        ) {
            let mut r = Reorder::new(ReorderConfig {
                gap_timeout: Some(Duration::from_secs(2)),
                max_buffer: 16,
                ..from_one()
            });
            let mut now = Instant::now();
            let mut last = 0u64;
            for (i, s) in seqs.into_iter().enumerate() {
                now += Duration::from_secs(ticks.get(i).copied().unwrap_or(0));
                r.push("t", env("a", s), now);
                r.poll_timeout(now);
                while let Some(d) = r.poll_deliver() {
                    prop_assert!(d.env.seq > last, "{} after {}", d.env.seq, last);
                    prop_assert_eq!(d.env.seq - last - 1, d.skipped_before);
                    last = d.env.seq;
                }
                prop_assert!(r.held() <= 16);
            }
        }
    }
}
