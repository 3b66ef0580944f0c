//! The publish queue as a sans-IO state machine (SPEC section 6, paper 004
//! sec. 3.2): it decides which message leaves next; the caller moves bytes
//! and reports acknowledgements and connection losses.
//!
//! Invariants, checked by the unit and property tests below:
//! - Sequence numbers are assigned 1, 2, 3, ... per publisher, with no gap and
//!   no reuse, also across restarts (the store keeps the next one).
//! - A message stays in the queue until its PUBACK (or PUBCOMP) is reported
//!   through [`PubQueue::on_ack`]; a connection loss never drops one.
//! - Messages leave in increasing sequence order, first transmissions and
//!   retransmissions alike. With window W, a message with sequence `s` leaves
//!   only when `s < base + W`, where `base` is the lowest unacknowledged
//!   sequence: at most W are in flight and they are W consecutive numbers at
//!   most (W = 1: the next leaves only after the previous one's ack, the
//!   paper's rule, which keeps the broker's copy in order without any help).
//! - After [`PubQueue::on_disconnect`] everything in flight is sent again, in
//!   order, from `base`: the receiver may see duplicates (at-least-once),
//!   which it drops by sequence number.

use std::collections::BTreeMap;

use crate::payload::Envelope;

/// One queued message, as stored and as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedMessage {
    /// Per-publisher sequence number.
    pub seq: u64,
    /// Topic it is published to.
    pub topic: String,
    /// The PUBLISH payload: the JSON [`Envelope`] carrying `seq`.
    pub payload: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    InFlight,
}

/// Counters of what the queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages enqueued (by this instance, not counting restored ones).
    pub enqueued: u64,
    /// First transmissions and retransmissions handed out.
    pub transmitted: u64,
    /// Of those, retransmissions (after a connection loss).
    pub retransmitted: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Acks for sequences not in flight (late or duplicated), ignored.
    pub stale_acks: u64,
    /// Connection losses reported.
    pub disconnects: u64,
}

/// The queue state: unacknowledged messages and the send window.
#[derive(Debug)]
pub struct PubQueue {
    publisher: String,
    window: u64,
    next_seq: u64,
    /// Every unacknowledged message, by sequence.
    unacked: BTreeMap<u64, (QueuedMessage, State, u32)>,
    stats: QueueStats,
}

impl PubQueue {
    /// An empty queue for `publisher` whose first sequence is 1. `window` is
    /// clamped to at least 1.
    pub fn new(publisher: impl Into<String>, window: usize) -> PubQueue {
        PubQueue::restore(publisher, window, 1, Vec::new())
    }

    /// A queue continuing after a restart: `next_seq` is the next number to
    /// assign, `unacked` the messages the store still holds (any order; they
    /// are all sent again).
    pub fn restore(
        publisher: impl Into<String>,
        window: usize,
        next_seq: u64,
        unacked: Vec<QueuedMessage>,
    ) -> PubQueue {
        let unacked: BTreeMap<_, _> = unacked
            .into_iter()
            .map(|m| (m.seq, (m, State::Waiting, 0)))
            .collect();
        let next_seq = unacked
            .keys()
            .next_back()
            .map_or(next_seq, |&last| next_seq.max(last + 1))
            .max(1);
        PubQueue {
            publisher: publisher.into(),
            window: window.max(1) as u64,
            next_seq,
            unacked,
            stats: QueueStats::default(),
        }
    }

    /// The publisher id the envelopes carry.
    pub fn publisher(&self) -> &str {
        &self.publisher
    }

    /// The send window.
    pub fn window(&self) -> usize {
        self.window as usize
    }

    /// The sequence the next enqueued message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The lowest unacknowledged sequence, if any.
    pub fn base(&self) -> Option<u64> {
        self.unacked.keys().next().copied()
    }

    /// Unacknowledged messages (waiting or in flight).
    pub fn len(&self) -> usize {
        self.unacked.len()
    }

    /// Nothing left to send or to be acknowledged.
    pub fn is_empty(&self) -> bool {
        self.unacked.is_empty()
    }

    /// Messages sent and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.unacked
            .values()
            .filter(|(_, s, _)| *s == State::InFlight)
            .count()
    }

    /// What the queue did so far.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Assigns the next sequence to `body` and queues it for `topic`. The
    /// returned copy is what the caller persists; it must be durable before
    /// the caller reports the message as accepted.
    pub fn enqueue(&mut self, topic: &str, body: &str, ts_ms: u64) -> QueuedMessage {
        let seq = self.next_seq;
        self.next_seq += 1;
        let env = Envelope {
            publisher: self.publisher.clone(),
            seq,
            ts: ts_ms,
            msg: body.to_owned(),
        };
        let m = QueuedMessage {
            seq,
            topic: topic.to_owned(),
            payload: env.encode(),
        };
        self.unacked.insert(seq, (m.clone(), State::Waiting, 0));
        self.stats.enqueued += 1;
        m
    }

    /// The next message to put on the wire, if the window allows one; it is
    /// marked in flight. Call until `None` after every enqueue, ack and
    /// reconnection.
    pub fn poll_transmit(&mut self) -> Option<QueuedMessage> {
        let base = self.base()?;
        let limit = base.saturating_add(self.window);
        let (m, state, sends) = self
            .unacked
            .range_mut(base..limit)
            .map(|(_, v)| v)
            .find(|(_, s, _)| *s == State::Waiting)?;
        *state = State::InFlight;
        *sends += 1;
        self.stats.transmitted += 1;
        if *sends > 1 {
            self.stats.retransmitted += 1;
        }
        Some(m.clone())
    }

    /// Reports the acknowledgement (PUBACK for QoS 1, PUBCOMP for QoS 2) of
    /// `seq`. Returns true when it removed the message; an ack for a message
    /// not in flight is counted as stale and ignored.
    pub fn on_ack(&mut self, seq: u64) -> bool {
        match self.unacked.get(&seq) {
            Some((_, State::InFlight, _)) => {
                self.unacked.remove(&seq);
                self.stats.acked += 1;
                true
            }
            _ => {
                self.stats.stale_acks += 1;
                false
            }
        }
    }

    /// Reports that the connection was lost: whatever was in flight waits to
    /// be sent again, from the lowest sequence on.
    pub fn on_disconnect(&mut self) {
        self.stats.disconnects += 1;
        for (_, s, _) in self.unacked.values_mut() {
            *s = State::Waiting;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::decode;
    use proptest::prelude::*;

    fn seqs(q: &mut PubQueue) -> Vec<u64> {
        std::iter::from_fn(|| q.poll_transmit().map(|m| m.seq)).collect()
    }

    #[test]
    fn window_one_sends_next_only_after_ack() {
        let mut q = PubQueue::new("p", 1);
        for i in 0..3 {
            q.enqueue("t", &format!("m{i}"), 0);
        }
        assert_eq!(seqs(&mut q), vec![1]);
        assert_eq!(seqs(&mut q), Vec::<u64>::new(), "window full");
        assert!(q.on_ack(1));
        assert_eq!(seqs(&mut q), vec![2]);
        assert!(!q.on_ack(1), "second ack of 1 is stale");
        assert!(!q.on_ack(3), "3 is not in flight");
        assert!(q.on_ack(2));
        assert_eq!(seqs(&mut q), vec![3]);
        assert!(q.on_ack(3));
        assert!(q.is_empty());
        let s = q.stats();
        assert_eq!(
            (s.enqueued, s.transmitted, s.acked, s.stale_acks),
            (3, 3, 3, 2)
        );
    }

    #[test]
    fn payload_carries_publisher_and_seq() {
        let mut q = PubQueue::new("gw-7", 1);
        let m = q.enqueue("a/b", "hello", 42);
        let e = decode(&m.payload).unwrap();
        assert_eq!(
            (e.publisher.as_str(), e.seq, e.ts, e.msg.as_str()),
            ("gw-7", 1, 42, "hello")
        );
        assert_eq!(m.topic, "a/b");
    }

    #[test]
    fn window_slides_over_consecutive_sequences() {
        let mut q = PubQueue::new("p", 3);
        for _ in 0..6 {
            q.enqueue("t", "", 0);
        }
        assert_eq!(seqs(&mut q), vec![1, 2, 3]);
        // Acks out of order: 2 and 3 acked, 1 still out: nothing new may leave.
        assert!(q.on_ack(3));
        assert!(q.on_ack(2));
        assert_eq!(seqs(&mut q), Vec::<u64>::new());
        assert!(q.on_ack(1));
        assert_eq!(seqs(&mut q), vec![4, 5, 6]);
    }

    #[test]
    fn disconnect_resends_in_flight_in_order() {
        let mut q = PubQueue::new("p", 2);
        for _ in 0..4 {
            q.enqueue("t", "", 0);
        }
        assert_eq!(seqs(&mut q), vec![1, 2]);
        assert!(q.on_ack(2));
        q.on_disconnect();
        assert_eq!(q.in_flight(), 0);
        // 1 again, then 3 (2 is acked; window is base 1 + 2).
        assert_eq!(seqs(&mut q), vec![1]);
        assert!(q.on_ack(1));
        assert_eq!(seqs(&mut q), vec![3, 4]);
        assert_eq!(q.stats().retransmitted, 1);
    }

    #[test]
    fn restore_continues_numbering() {
        let mut a = PubQueue::new("p", 1);
        let m1 = a.enqueue("t", "x", 0);
        let m2 = a.enqueue("t", "y", 0);
        let mut b = PubQueue::restore("p", 1, 3, vec![m2.clone(), m1.clone()]);
        assert_eq!(b.next_seq(), 3);
        assert_eq!(b.poll_transmit(), Some(m1));
        assert!(b.on_ack(1));
        assert_eq!(b.poll_transmit(), Some(m2));
        assert_eq!(b.enqueue("t", "z", 0).seq, 3);
        // next_seq older than the stored messages is corrected upwards.
        let c = PubQueue::restore(
            "p",
            1,
            1,
            vec![QueuedMessage {
                seq: 9,
                topic: "t".into(),
                payload: vec![],
            }],
        );
        assert_eq!(c.next_seq(), 10);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Enqueue,
        Poll,
        /// Ack the k-th in-flight message (mod count).
        Ack(usize),
        /// A duplicate ack of an arbitrary sequence.
        StaleAck(u64),
        Disconnect,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Enqueue),
            4 => Just(Op::Poll),
            4 => (0usize..8).prop_map(Op::Ack),
            1 => (0u64..40).prop_map(Op::StaleAck),
            1 => Just(Op::Disconnect),
        ]
    }

    proptest! {
        /// Whatever the interleaving of enqueues, sends, (out-of-order) acks
        /// and disconnects: every message is acked exactly once in the end,
        /// transmissions on one connection are in increasing order and within
        /// the window, and nothing is lost.
        #[test]
        fn queue_invariants(window in 1usize..6, ops in proptest::collection::vec(op(), 0..200)) {
            let mut q = PubQueue::new("p", window);
            let mut in_flight: Vec<u64> = Vec::new();
            let mut acked = std::collections::BTreeSet::new();
            let mut last_sent_on_conn = 0u64;
            let mut enqueued = 0u64;
            let drive = |q: &mut PubQueue, op: &Op,
                             in_flight: &mut Vec<u64>,
                             acked: &mut std::collections::BTreeSet<u64>,
                             last: &mut u64, enq: &mut u64| -> Result<(), TestCaseError> {
                match op {
                    Op::Enqueue => { let m = q.enqueue("t", "b", 0); *enq += 1; prop_assert_eq!(m.seq, *enq); }
                    Op::Poll => {
                        while let Some(m) = q.poll_transmit() {
                            prop_assert!(m.seq > *last, "sent {} after {}", m.seq, last);
                            *last = m.seq;
                            prop_assert!(!acked.contains(&m.seq));
                            let base = q.base().unwrap();
                            prop_assert!(m.seq < base + window as u64);
                            in_flight.push(m.seq);
                            prop_assert!(in_flight.len() <= window);
                        }
                    }
                    Op::Ack(k) => if !in_flight.is_empty() {
                        let s = in_flight.remove(k % in_flight.len());
                        prop_assert!(q.on_ack(s));
                        prop_assert!(acked.insert(s));
                    },
                    Op::StaleAck(s) => {
                        if !in_flight.contains(s) { prop_assert!(!q.on_ack(*s)); }
                    }
                    Op::Disconnect => { q.on_disconnect(); in_flight.clear(); *last = 0; }
                }
                Ok(())
            };
            for o in &ops {
                drive(&mut q, o, &mut in_flight, &mut acked, &mut last_sent_on_conn, &mut enqueued)?;
            }
            // Drain: ack in order until empty; must terminate.
            for _ in 0..(enqueued as usize + 2) * 2 {
                drive(&mut q, &Op::Poll, &mut in_flight, &mut acked, &mut last_sent_on_conn, &mut enqueued)?;
                drive(&mut q, &Op::Ack(0), &mut in_flight, &mut acked, &mut last_sent_on_conn, &mut enqueued)?;
            }
            prop_assert!(q.is_empty());
            prop_assert_eq!(acked.len() as u64, enqueued);
            prop_assert_eq!(acked.iter().copied().collect::<Vec<_>>(), (1..=enqueued).collect::<Vec<_>>());
        }
    }
}
