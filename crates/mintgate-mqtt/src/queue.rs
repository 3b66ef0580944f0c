//! The publish queue as a sans-IO state machine (SPEC section 6, paper 004
//! sec. 3.2): it decides which message leaves next; the caller moves bytes
//! and reports acknowledgements and connection losses.
//!
//! Two numbers per message:
//! - its **id**, the queue's own order over all topics: 1, 2, 3, ... per
//!   publisher. The window, the send order and the acknowledgements use it;
//!   it never leaves the process (except as the store's key).
//! - its **seq**, carried in the envelope: 1, 2, 3, ... per publisher *and
//!   topic*, so that a receiver of one topic among several sees no gaps.
//!   A topic's first message gets `seq_base` (1 for a new store; see
//!   [`crate::store`] for stores written when `seq` counted all topics).
//!
//! Invariants, checked by the unit and property tests below:
//! - Ids and each topic's seqs are assigned with no gap and no reuse, also
//!   across restarts (the store keeps the next ones).
//! - A message stays in the queue until its PUBACK (or PUBCOMP) is reported
//!   through [`PubQueue::on_ack`]; a connection loss never drops one.
//! - Messages leave in increasing id order (so each topic in increasing seq
//!   order), first transmissions and retransmissions alike. With window W, a
//!   message with id `i` leaves only when `i < base + W`, where `base` is
//!   the lowest unacknowledged id: at most W are in flight and they are W
//!   consecutive ids at most (W = 1: the next leaves only after the
//!   previous one's ack, the paper's rule, which keeps the broker's copy in
//!   order without any help).
//! - After [`PubQueue::on_disconnect`] everything in flight is sent again, in
//!   order, from `base`: the receiver may see duplicates (at-least-once),
//!   which it drops by sequence number.

use std::collections::{BTreeMap, HashMap};

use crate::payload::Envelope;

/// One queued message, as stored and as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedMessage {
    /// The queue's order (per publisher, over all topics).
    pub id: u64,
    /// Per-publisher, per-topic sequence number (the envelope's `seq`).
    pub seq: u64,
    /// Topic it is published to.
    pub topic: String,
    /// The PUBLISH payload: the JSON [`Envelope`] carrying `seq`.
    pub payload: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Numbered, not yet durable: may not leave (see [`PubQueue::stage`]).
    Staged,
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

/// The next numbers a queue assigns (kept by the store across restarts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Numbering {
    /// The next id.
    pub next_id: u64,
    /// The next seq of each topic that has had a message.
    pub topic_next: HashMap<String, u64>,
    /// The first seq of any other topic.
    pub seq_base: u64,
}

impl Default for Numbering {
    fn default() -> Self {
        Numbering {
            next_id: 1,
            topic_next: HashMap::new(),
            seq_base: 1,
        }
    }
}

/// The queue state: unacknowledged messages and the send window.
#[derive(Debug)]
pub struct PubQueue {
    publisher: String,
    window: u64,
    next_id: u64,
    /// The next seq of each topic that has had a message.
    topic_next: HashMap<String, u64>,
    /// The first seq of a topic not in `topic_next`.
    seq_base: u64,
    /// Every unacknowledged message, by id.
    unacked: BTreeMap<u64, (QueuedMessage, State, u32)>,
    stats: QueueStats,
}

impl PubQueue {
    /// An empty queue for `publisher`: first id 1, every topic's first seq 1.
    /// `window` is clamped to at least 1.
    pub fn new(publisher: impl Into<String>, window: usize) -> PubQueue {
        PubQueue::restore(publisher, window, Numbering::default(), Vec::new())
    }

    /// A queue continuing after a restart: `numbers` are the next numbers to
    /// assign, `unacked` the messages the store still holds (any order; they
    /// are all sent again). Numbers lower than a held message's are corrected
    /// upwards.
    pub fn restore(
        publisher: impl Into<String>,
        window: usize,
        numbers: Numbering,
        unacked: Vec<QueuedMessage>,
    ) -> PubQueue {
        let Numbering {
            next_id,
            mut topic_next,
            seq_base,
        } = numbers;
        let seq_base = seq_base.max(1);
        for m in &unacked {
            let n = topic_next.entry(m.topic.clone()).or_insert(seq_base);
            *n = (*n).max(m.seq + 1);
        }
        let unacked: BTreeMap<_, _> = unacked
            .into_iter()
            .map(|m| (m.id, (m, State::Waiting, 0)))
            .collect();
        let next_id = unacked
            .keys()
            .next_back()
            .map_or(next_id, |&last| next_id.max(last + 1))
            .max(1);
        PubQueue {
            publisher: publisher.into(),
            window: window.max(1) as u64,
            next_id,
            topic_next,
            seq_base,
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

    /// The id the next enqueued message gets.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The seq the next message enqueued for `topic` gets.
    pub fn next_seq(&self, topic: &str) -> u64 {
        self.topic_next.get(topic).copied().unwrap_or(self.seq_base)
    }

    /// The next numbers to assign (what a store keeps).
    pub fn numbering(&self) -> Numbering {
        Numbering {
            next_id: self.next_id,
            topic_next: self.topic_next.clone(),
            seq_base: self.seq_base,
        }
    }

    /// The lowest unacknowledged id, if any.
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

    /// Assigns the next id and the topic's next seq to `body` and queues it
    /// for `topic`, ready to leave. The returned copy is what the caller
    /// persists; it must be durable before the caller reports the message
    /// as accepted, and before it transmits anything (a receiver could
    /// otherwise get a number that a crash then gives to another message).
    pub fn enqueue(&mut self, topic: &str, body: &str, ts_ms: u64) -> QueuedMessage {
        let m = self.stage(topic, body, ts_ms);
        self.mark_durable(m.id);
        m
    }

    /// Like [`PubQueue::enqueue`], but the message may not leave until
    /// [`PubQueue::mark_durable`] covers its id: the caller writes it to the
    /// store meanwhile (on another thread, several enqueues in one commit)
    /// while the queue goes on sending and taking acks for earlier ones.
    pub fn stage(&mut self, topic: &str, body: &str, ts_ms: u64) -> QueuedMessage {
        let id = self.next_id;
        self.next_id += 1;
        let next = match self.topic_next.get_mut(topic) {
            Some(n) => n,
            None => self
                .topic_next
                .entry(topic.to_owned())
                .or_insert(self.seq_base),
        };
        let seq = *next;
        *next += 1;
        let env = Envelope {
            publisher: self.publisher.clone(),
            seq,
            ts: ts_ms,
            msg: body.to_owned(),
        };
        let m = QueuedMessage {
            id,
            seq,
            topic: topic.to_owned(),
            payload: env.encode(),
        };
        self.unacked.insert(id, (m.clone(), State::Staged, 0));
        self.stats.enqueued += 1;
        m
    }

    /// Every staged message with an id up to `upto` is durable now: it may
    /// leave.
    pub fn mark_durable(&mut self, upto: u64) {
        for (_, s, _) in self.unacked.range_mut(..=upto).map(|(_, v)| v).rev() {
            match s {
                State::Staged => *s = State::Waiting,
                // Staged ones are always the newest: nothing below is.
                _ => break,
            }
        }
    }

    /// Messages numbered but not yet durable.
    pub fn staged(&self) -> usize {
        self.unacked
            .values()
            .rev()
            .take_while(|(_, s, _)| *s == State::Staged)
            .count()
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
            .take_while(|(_, s, _)| *s != State::Staged)
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
    /// message `id`. Returns true when it removed the message; an ack for a
    /// message not in flight is counted as stale and ignored.
    pub fn on_ack(&mut self, id: u64) -> bool {
        match self.unacked.get(&id) {
            Some((_, State::InFlight, _)) => {
                self.unacked.remove(&id);
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
            if *s == State::InFlight {
                *s = State::Waiting;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::decode;
    use proptest::prelude::*;

    /// The ids of what may leave now.
    fn seqs(q: &mut PubQueue) -> Vec<u64> {
        std::iter::from_fn(|| q.poll_transmit().map(|m| m.id)).collect()
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
        let mut b = PubQueue::restore("p", 1, a.numbering(), vec![m2.clone(), m1.clone()]);
        assert_eq!((b.next_id(), b.next_seq("t"), b.next_seq("u")), (3, 3, 1));
        assert_eq!(b.poll_transmit(), Some(m1));
        assert!(b.on_ack(1));
        assert_eq!(b.poll_transmit(), Some(m2));
        assert_eq!(b.enqueue("t", "z", 0).seq, 3);
        // Numbers older than the stored messages are corrected upwards.
        let c = PubQueue::restore(
            "p",
            1,
            Numbering::default(),
            vec![QueuedMessage {
                id: 9,
                seq: 4,
                topic: "t".into(),
                payload: vec![],
            }],
        );
        assert_eq!((c.next_id(), c.next_seq("t"), c.next_seq("u")), (10, 5, 1));
    }

    #[test]
    fn staged_messages_wait_for_durability() {
        let mut q = PubQueue::new("p", 4);
        q.enqueue("t", "a", 0);
        for _ in 0..3 {
            q.stage("t", "b", 0);
        }
        assert_eq!(q.staged(), 3);
        assert_eq!(seqs(&mut q), vec![1], "only the durable one");
        q.mark_durable(3);
        assert_eq!((q.staged(), seqs(&mut q)), (1, vec![2, 3]));
        q.on_disconnect();
        assert_eq!(q.staged(), 1, "a disconnect does not make it durable");
        assert_eq!(seqs(&mut q), vec![1, 2, 3]);
        q.mark_durable(4);
        assert_eq!(seqs(&mut q), vec![4]);
    }

    #[test]
    fn each_topic_has_its_own_sequence() {
        let mut q = PubQueue::new("p", 1);
        let got: Vec<(u64, u64)> = ["a", "b", "a", "c", "b", "a"]
            .iter()
            .map(|t| {
                let m = q.enqueue(t, "", 0);
                assert_eq!(decode(&m.payload).unwrap().seq, m.seq);
                (m.id, m.seq)
            })
            .collect();
        assert_eq!(got, vec![(1, 1), (2, 1), (3, 2), (4, 1), (5, 2), (6, 3)]);
        // They leave in id order, whatever the topic.
        let mut order = Vec::new();
        while let Some(m) = q.poll_transmit() {
            order.push((m.topic, m.seq));
            assert!(q.on_ack(m.id));
        }
        assert_eq!(
            order,
            [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2), ("a", 3)]
                .map(|(t, s)| (t.to_string(), s))
        );
        // A store from before per-topic numbering: every topic continues
        // above the old numbers.
        let q = PubQueue::restore(
            "p",
            1,
            Numbering {
                next_id: 50,
                topic_next: HashMap::new(),
                seq_base: 50,
            },
            Vec::new(),
        );
        assert_eq!((q.next_id(), q.next_seq("a")), (50, 50));
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Enqueue to topic k.
        Enqueue(usize),
        /// Stage for topic k (durable later).
        Stage(usize),
        /// Everything staged is durable now.
        Durable,
        Poll,
        /// Ack the k-th in-flight message (mod count).
        Ack(usize),
        /// A duplicate ack of an arbitrary sequence.
        StaleAck(u64),
        Disconnect,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0usize..3).prop_map(Op::Enqueue),
            2 => (0usize..3).prop_map(Op::Stage),
            1 => Just(Op::Durable),
            4 => Just(Op::Poll),
            4 => (0usize..8).prop_map(Op::Ack),
            1 => (0u64..40).prop_map(Op::StaleAck),
            1 => Just(Op::Disconnect),
        ]
    }

    proptest! {
        /// Whatever the interleaving of enqueues (to three topics), sends,
        /// (out-of-order) acks and disconnects: every message is acked
        /// exactly once in the end, transmissions on one connection are in
        /// increasing order and within the window, each topic's seqs are
        /// 1, 2, 3, ..., and nothing is lost.
        #[test]
        fn queue_invariants(window in 1usize..6, ops in proptest::collection::vec(op(), 0..200)) {
            let mut q = PubQueue::new("p", window);
            let mut in_flight: Vec<u64> = Vec::new();
            let mut acked = std::collections::BTreeSet::new();
            let mut last_sent_on_conn = 0u64;
            let mut enqueued = 0u64;
            let mut per_topic = [0u64; 3];
            // The lowest id not yet durable, if any.
            let mut staged_from: Option<u64> = None;
            let mut drive = |q: &mut PubQueue, op: &Op,
                             in_flight: &mut Vec<u64>,
                             acked: &mut std::collections::BTreeSet<u64>,
                             last: &mut u64, enq: &mut u64| -> Result<(), TestCaseError> {
                match op {
                    Op::Enqueue(k) | Op::Stage(k) => {
                        let m = if matches!(op, Op::Stage(_)) {
                            q.stage(&format!("t{k}"), "b", 0)
                        } else {
                            // Durable with everything before it (the store
                            // commits in order).
                            let m = q.stage(&format!("t{k}"), "b", 0);
                            q.mark_durable(m.id);
                            m
                        };
                        *enq += 1;
                        per_topic[*k] += 1;
                        prop_assert_eq!(m.id, *enq);
                        prop_assert_eq!(m.seq, per_topic[*k]);
                        staged_from.get_or_insert(m.id);
                        if !matches!(op, Op::Stage(_)) {
                            staged_from = None;
                        }
                    }
                    Op::Durable => {
                        q.mark_durable(*enq);
                        staged_from = None;
                    }
                    Op::Poll => {
                        while let Some(m) = q.poll_transmit() {
                            prop_assert!(m.id > *last, "sent {} after {}", m.id, last);
                            prop_assert!(staged_from.is_none_or(|f| m.id < f), "{} sent before durable", m.id);
                            *last = m.id;
                            prop_assert!(!acked.contains(&m.id));
                            let base = q.base().unwrap();
                            prop_assert!(m.id < base + window as u64);
                            in_flight.push(m.id);
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
            drive(&mut q, &Op::Durable, &mut in_flight, &mut acked, &mut last_sent_on_conn, &mut enqueued)?;
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
