//! The publish queue as a sans-IO state machine (paper 004
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
//!
//! Bounds ([`Limits`], applied by [`PubQueue::offer`]): at most
//! `max_messages` unacknowledged messages of at most `max_bytes` (topic and
//! payload). When a new message does not fit, `when_full` decides: drop the
//! oldest messages that are neither in flight nor staged (counted in
//! [`QueueStats::dropped_full`]; their ids are handed to the caller through
//! [`PubQueue::take_dropped`] to be removed from the store), or refuse the new
//! one ([`QueueStats::refused_full`]). A refused message takes no number, so
//! the seqs of what is accepted stay gapless; a dropped one leaves a gap in
//! its topic's seqs that a receiver sees.
//!
//! Payloads in memory: the queue keeps an index of every unacknowledged
//! message (id, seq, size, state) but the payloads of only the oldest
//! `resident` ones ([`PubQueue::set_resident`]; unlimited by default). The
//! others are in the store; [`PubQueue::wants_load`] says which to read
//! next and [`PubQueue::fill`] hands them in. So a queue of 100,000 messages
//! after a long outage or at a restart holds a few hundred payloads.

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
    /// The PUBLISH payload: the JSON [`Envelope`] carrying `seq`, or the
    /// body as it is when [`QueuedMessage::bare`].
    pub payload: Vec<u8>,
    /// Published with the retain flag (the broker keeps the topic's latest
    /// for late subscribers).
    pub retain: bool,
    /// The payload is the body itself, without the envelope: `seq` and the
    /// publisher travel only as MQTT 5 user properties (a 3.1.1 receiver
    /// cannot order or de-duplicate it).
    pub bare: bool,
    /// When it was enqueued, ms since the Unix epoch (the envelope's `ts`).
    pub ts: u64,
}

/// How one message is published: [`PubQueue::offer_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// With the retain flag.
    pub retain: bool,
    /// The body as it is, without the envelope ([`QueuedMessage::bare`]).
    pub bare: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Numbered, not yet durable: may not leave (see [`PubQueue::stage`]).
    Staged,
    Waiting,
    InFlight,
}

/// What [`PubQueue::offer`] does when a message does not fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// Drop the oldest messages that wait (not in flight, not staged).
    #[default]
    DropOldest,
    /// Refuse the new message.
    RefuseNew,
}

impl std::str::FromStr for WhenFull {
    type Err = String;
    fn from_str(s: &str) -> Result<WhenFull, String> {
        match s {
            "drop-oldest" => Ok(WhenFull::DropOldest),
            "refuse-new" => Ok(WhenFull::RefuseNew),
            _ => Err(format!("{s:?} is not \"drop-oldest\" or \"refuse-new\"")),
        }
    }
}

/// The queue's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most unacknowledged messages.
    pub max_messages: u64,
    /// Most bytes (topic and payload) of unacknowledged messages.
    pub max_bytes: u64,
    /// What to do with a message that does not fit.
    pub when_full: WhenFull,
}

impl Limits {
    /// No bound.
    pub const UNLIMITED: Limits = Limits {
        max_messages: u64::MAX,
        max_bytes: u64::MAX,
        when_full: WhenFull::RefuseNew,
    };
}

/// Counters of what the queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages dropped (oldest first) to make room under [`Limits`].
    pub dropped_full: u64,
    /// New messages refused because they did not fit under [`Limits`].
    pub refused_full: u64,
    /// New messages refused because the store could not write them (disk
    /// full); counted by the caller through [`PubQueue::count_refused_disk`].
    pub refused_disk: u64,
    /// Acknowledgements that refused the message (an MQTT 5 reason code of
    /// 0x80 or more): the message is dropped, not sent again.
    pub refused_by_broker: u64,
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

/// One unacknowledged message in the index.
#[derive(Debug)]
struct Entry {
    /// Topic and payload bytes (what [`Limits::max_bytes`] counts).
    bytes: u64,
    state: State,
    sends: u32,
    /// The message, when its payload is in memory.
    msg: Option<Box<QueuedMessage>>,
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
    unacked: BTreeMap<u64, Entry>,
    stats: QueueStats,
    limits: Limits,
    /// Bytes of the unacknowledged messages.
    bytes: u64,
    /// Most payloads kept in memory.
    resident_max: usize,
    /// Payloads in memory now.
    resident: usize,
    /// Ids dropped under the limits, not yet taken by the caller.
    dropped: Vec<u64>,
}

/// What a message costs against [`Limits::max_bytes`].
fn cost(topic: &str, payload: &[u8]) -> u64 {
    (topic.len() + payload.len()) as u64
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
        let index: Vec<(u64, u64)> = unacked
            .iter()
            .map(|m| (m.id, cost(&m.topic, &m.payload)))
            .collect();
        let mut q = PubQueue::restore_index(
            publisher,
            window,
            Numbering {
                next_id,
                topic_next,
                seq_base,
            },
            &index,
        );
        q.fill(unacked);
        q
    }

    /// A queue continuing after a restart from the store's index: the id
    /// and size of every message it holds, payloads not read (they come
    /// through [`PubQueue::wants_load`] and [`PubQueue::fill`]). The topics'
    /// next seqs are the store's (`numbers`).
    pub fn restore_index(
        publisher: impl Into<String>,
        window: usize,
        numbers: Numbering,
        index: &[(u64, u64)],
    ) -> PubQueue {
        let Numbering {
            next_id,
            topic_next,
            seq_base,
        } = numbers;
        let unacked: BTreeMap<u64, Entry> = index
            .iter()
            .map(|&(id, bytes)| {
                (
                    id,
                    Entry {
                        bytes,
                        state: State::Waiting,
                        sends: 0,
                        msg: None,
                    },
                )
            })
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
            seq_base: seq_base.max(1),
            bytes: unacked.values().map(|e| e.bytes).sum(),
            unacked,
            stats: QueueStats::default(),
            limits: Limits::UNLIMITED,
            resident_max: usize::MAX,
            resident: 0,
            dropped: Vec::new(),
        }
    }

    /// Sets the bounds; a queue restored above them is trimmed at once
    /// when they say drop-oldest (the ids through
    /// [`PubQueue::take_dropped`]).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
        if limits.when_full == WhenFull::DropOldest {
            while self.len() as u64 > limits.max_messages || self.bytes > limits.max_bytes {
                if !self.drop_oldest() {
                    break;
                }
            }
        }
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Keeps at most `n` payloads (at least the window) in memory; the
    /// others are read again from the store when their turn comes. Only
    /// for a queue whose store can read them back.
    pub fn set_resident(&mut self, n: usize) {
        self.resident_max = n.max(self.window as usize);
        // The payloads in memory stay the oldest ones.
        for e in self.unacked.values_mut().skip(self.resident_max) {
            if e.msg.take().is_some() {
                self.resident -= 1;
            }
        }
    }

    /// Payloads in memory now.
    pub fn resident(&self) -> usize {
        self.resident
    }

    /// Bytes (topic and payload) of the unacknowledged messages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The payloads to read from the store next: from id `from` on, at most
    /// `n` of them; `None` when none is needed now (all the oldest are in
    /// memory, or memory holds `resident` already, or the first missing one
    /// is not in the store yet).
    pub fn wants_load(&self) -> Option<(u64, usize)> {
        // Refill when half the room is free, so reads come in chunks.
        let room = self.resident_max.saturating_sub(self.resident);
        let (&id, e) = self.unacked.iter().find(|(_, e)| e.msg.is_none())?;
        let needed_now = self.base().is_some_and(|b| id < b + self.window);
        if e.state == State::Staged || (room < self.resident_max / 2 && !needed_now) || room == 0 {
            return None;
        }
        Some((id, room))
    }

    /// Payloads read from the store (any order); ids no longer queued (acked
    /// or dropped meanwhile) are ignored, and so are those beyond the room.
    pub fn fill(&mut self, msgs: Vec<QueuedMessage>) {
        for m in msgs {
            if self.resident >= self.resident_max {
                break;
            }
            if let Some(e) = self.unacked.get_mut(&m.id) {
                if e.msg.is_none() {
                    e.msg = Some(Box::new(m));
                    self.resident += 1;
                }
            }
        }
    }

    /// The ids dropped under the limits since the last call (for the store
    /// to forget).
    pub fn take_dropped(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dropped)
    }

    /// Counts `n` messages refused because the store could not take them.
    pub fn count_refused_disk(&mut self, n: u64) {
        self.stats.refused_disk += n;
    }

    /// Drops the oldest message that waits (not in flight, not staged);
    /// false when there is none.
    fn drop_oldest(&mut self) -> bool {
        let Some(id) = self
            .unacked
            .iter()
            .find(|(_, e)| e.state == State::Waiting)
            .map(|(&id, _)| id)
        else {
            return false;
        };
        self.remove(id);
        self.stats.dropped_full += 1;
        self.dropped.push(id);
        true
    }

    /// Removes message `id` from the index.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.unacked.remove(&id)?;
        self.bytes -= e.bytes;
        if e.msg.is_some() {
            self.resident -= 1;
        }
        Some(e)
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
            .filter(|e| e.state == State::InFlight)
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
        let m = self.numbered(topic, body, ts_ms);
        self.admit(m)
    }

    /// Like [`PubQueue::stage`] under the queue's [`Limits`]: `None` when the
    /// message is refused (it takes no number). Messages dropped to make
    /// room are counted and their ids kept for [`PubQueue::take_dropped`].
    pub fn offer(&mut self, topic: &str, body: &str, ts_ms: u64) -> Option<QueuedMessage> {
        self.offer_with(topic, body, ts_ms, Flags::default())
    }

    /// [`PubQueue::offer`] of a message published as `flags` say.
    pub fn offer_with(
        &mut self,
        topic: &str,
        body: &str,
        ts_ms: u64,
        flags: Flags,
    ) -> Option<QueuedMessage> {
        let mut m = self.numbered(topic, body, ts_ms);
        m.retain = flags.retain;
        if flags.bare {
            m.bare = true;
            m.payload = body.as_bytes().to_vec();
        }
        let c = cost(&m.topic, &m.payload);
        let fits = |q: &PubQueue| {
            (q.len() as u64) < q.limits.max_messages
                && q.bytes.saturating_add(c) <= q.limits.max_bytes
        };
        if c > self.limits.max_bytes || self.limits.max_messages == 0 {
            self.stats.refused_full += 1;
            return None;
        }
        while !fits(self) {
            if self.limits.when_full == WhenFull::RefuseNew || !self.drop_oldest() {
                self.stats.refused_full += 1;
                return None;
            }
        }
        Some(self.admit(m))
    }

    /// The message `body` for `topic` would be, with the next numbers (not
    /// taken yet).
    fn numbered(&self, topic: &str, body: &str, ts_ms: u64) -> QueuedMessage {
        let seq = self.next_seq(topic);
        let env = Envelope {
            publisher: self.publisher.clone(),
            seq,
            ts: ts_ms,
            msg: body.to_owned(),
        };
        QueuedMessage {
            id: self.next_id,
            seq,
            topic: topic.to_owned(),
            payload: env.encode(),
            retain: false,
            bare: false,
            ts: ts_ms,
        }
    }

    /// Takes `m`'s numbers and queues it, staged.
    fn admit(&mut self, m: QueuedMessage) -> QueuedMessage {
        self.next_id = m.id + 1;
        match self.topic_next.get_mut(&m.topic) {
            Some(n) => *n = m.seq + 1,
            None => {
                self.topic_next.insert(m.topic.clone(), m.seq + 1);
            }
        }
        let bytes = cost(&m.topic, &m.payload);
        // In memory while every older one is and there is room; otherwise
        // read back from the store when its turn comes.
        let keep = self.resident < self.resident_max
            && self
                .unacked
                .values()
                .next_back()
                .is_none_or(|e| e.msg.is_some());
        if keep {
            self.resident += 1;
        }
        self.bytes += bytes;
        self.unacked.insert(
            m.id,
            Entry {
                bytes,
                state: State::Staged,
                sends: 0,
                msg: keep.then(|| Box::new(m.clone())),
            },
        );
        self.stats.enqueued += 1;
        m
    }

    /// Takes back staged messages whose durable write failed: `msgs`, the
    /// newest messages of the queue, in id order (id, topic, seq). Their
    /// numbers are given out again, so no receiver sees a gap.
    pub fn unstage(&mut self, msgs: &[(u64, String, u64)]) {
        for (id, topic, seq) in msgs.iter().rev() {
            if self
                .unacked
                .get(id)
                .is_some_and(|e| e.state == State::Staged)
            {
                self.remove(*id);
                self.stats.enqueued -= 1;
                self.next_id = self.next_id.min(*id);
                self.topic_next.insert(topic.clone(), *seq);
            }
        }
    }

    /// Every staged message with an id up to `upto` is durable now: it may
    /// leave.
    pub fn mark_durable(&mut self, upto: u64) {
        for e in self.unacked.range_mut(..=upto).map(|(_, v)| v).rev() {
            match e.state {
                State::Staged => e.state = State::Waiting,
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
            .take_while(|e| e.state == State::Staged)
            .count()
    }

    /// The next message to put on the wire, if the window allows one; it is
    /// marked in flight. Call until `None` after every enqueue, ack,
    /// reconnection and [`PubQueue::fill`]. `None` also when the next one's
    /// payload is not in memory ([`PubQueue::wants_load`] says which).
    pub fn poll_transmit(&mut self) -> Option<QueuedMessage> {
        let base = self.base()?;
        let limit = base.saturating_add(self.window);
        let e = self
            .unacked
            .range_mut(base..limit)
            .map(|(_, v)| v)
            .take_while(|e| e.state != State::Staged)
            .find(|e| e.state == State::Waiting)?;
        let m = e.msg.as_deref()?.clone();
        e.state = State::InFlight;
        e.sends += 1;
        self.stats.transmitted += 1;
        if e.sends > 1 {
            self.stats.retransmitted += 1;
        }
        Some(m)
    }

    /// Reports that the broker refused message `id` in its acknowledgement
    /// (an MQTT 5 reason code of 0x80 or more, e.g. "not authorized" for a
    /// topic its ACL forbids). Sending it again would be refused again and
    /// hold up every message behind it, so it is removed like an
    /// acknowledged one and counted in [`QueueStats::refused_by_broker`].
    /// True when it removed the message.
    pub fn on_refused(&mut self, id: u64) -> bool {
        let done = self.take_in_flight(id);
        if done {
            self.stats.refused_by_broker += 1;
        }
        done
    }

    /// Removes message `id` if it is in flight; otherwise counts a stale
    /// acknowledgement.
    fn take_in_flight(&mut self, id: u64) -> bool {
        if self
            .unacked
            .get(&id)
            .is_some_and(|e| e.state == State::InFlight)
        {
            self.remove(id);
            true
        } else {
            self.stats.stale_acks += 1;
            false
        }
    }

    /// Reports the acknowledgement (PUBACK for QoS 1, PUBCOMP for QoS 2) of
    /// message `id`. Returns true when it removed the message; an ack for a
    /// message not in flight is counted as stale and ignored.
    pub fn on_ack(&mut self, id: u64) -> bool {
        let done = self.take_in_flight(id);
        if done {
            self.stats.acked += 1;
        }
        done
    }

    /// Reports that the connection was lost: whatever was in flight waits to
    /// be sent again, from the lowest sequence on.
    pub fn on_disconnect(&mut self) {
        self.stats.disconnects += 1;
        for e in self.unacked.values_mut() {
            if e.state == State::InFlight {
                e.state = State::Waiting;
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
                retain: false,
                bare: false,
                ts: 0,
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

    fn limited(window: usize, max_messages: u64, max_bytes: u64, when_full: WhenFull) -> PubQueue {
        let mut q = PubQueue::new("p", window);
        q.set_limits(Limits {
            max_messages,
            max_bytes,
            when_full,
        });
        q
    }

    /// The ids in the queue, oldest first.
    fn ids(q: &PubQueue) -> Vec<u64> {
        q.unacked.keys().copied().collect()
    }

    #[test]
    fn drop_oldest_keeps_the_newest_in_order_and_counts_exactly() {
        let mut q = limited(2, 5, u64::MAX, WhenFull::DropOldest);
        for i in 0..3 {
            q.offer("t", &format!("{i}"), 0).unwrap();
            q.mark_durable(q.next_id() - 1);
        }
        // 1 and 2 in flight: never dropped (the broker may have them).
        assert_eq!(seqs(&mut q), vec![1, 2]);
        for i in 3..12 {
            assert!(q.offer("t", &format!("{i}"), 0).is_some());
            q.mark_durable(q.next_id() - 1);
        }
        assert_eq!(ids(&q), vec![1, 2, 10, 11, 12]);
        let s = q.stats();
        assert_eq!((s.dropped_full, s.refused_full, s.enqueued), (7, 0, 12));
        assert_eq!(q.take_dropped(), vec![3, 4, 5, 6, 7, 8, 9]);
        assert!(q.take_dropped().is_empty());
        // What survives leaves in order; seqs show the gap to a receiver.
        assert!(q.on_ack(1) && q.on_ack(2));
        let mut out = Vec::new();
        while let Some(m) = q.poll_transmit() {
            out.push(m.seq);
            assert!(q.on_ack(m.id));
        }
        assert_eq!(out, vec![10, 11, 12]);
    }

    #[test]
    fn refuse_new_keeps_the_oldest_and_takes_no_number() {
        let mut q = limited(1, 3, u64::MAX, WhenFull::RefuseNew);
        for i in 0..3 {
            assert!(q.offer("t", &format!("{i}"), 0).is_some());
        }
        for i in 3..10 {
            assert!(q.offer("t", &format!("{i}"), 0).is_none());
        }
        assert_eq!(ids(&q), vec![1, 2, 3]);
        assert_eq!(q.next_seq("t"), 4, "refused ones take no seq");
        let s = q.stats();
        assert_eq!((s.dropped_full, s.refused_full, s.enqueued), (0, 7, 3));
        q.mark_durable(3);
        let m = q.poll_transmit().unwrap();
        assert!(q.on_ack(m.id));
        assert_eq!(q.offer("t", "x", 0).map(|m| (m.id, m.seq)), Some((4, 4)));
    }

    #[test]
    fn the_byte_bound_counts_topic_and_payload() {
        let one = {
            let mut q = PubQueue::new("p", 1);
            let m = q.enqueue("t", "0123456789", 0);
            (m.topic.len() + m.payload.len()) as u64
        };
        let mut q = limited(1, 1000, 3 * one, WhenFull::DropOldest);
        for _ in 0..5 {
            q.offer("t", "0123456789", 0).unwrap();
            q.mark_durable(q.next_id() - 1);
        }
        assert_eq!(
            (q.len(), q.bytes(), q.stats().dropped_full),
            (3, 3 * one, 2)
        );
        // Larger than the whole bound: refused, nothing dropped for it.
        let big = "x".repeat(4 * one as usize);
        assert!(q.offer("t", &big, 0).is_none());
        assert_eq!((q.len(), q.stats().refused_full), (3, 1));
        // A restored queue above the bound is trimmed at once.
        let mut r = PubQueue::restore_index(
            "p",
            1,
            Numbering::default(),
            &[(1, 10), (2, 10), (3, 10), (4, 10)],
        );
        r.set_limits(Limits {
            max_messages: 2,
            max_bytes: u64::MAX,
            when_full: WhenFull::DropOldest,
        });
        assert_eq!((ids(&r), r.take_dropped()), (vec![3, 4], vec![1, 2]));
    }

    #[test]
    fn unstage_gives_the_numbers_back() {
        let mut q = PubQueue::new("p", 1);
        q.enqueue("a", "", 0);
        let b = q.stage("a", "", 0);
        let c = q.stage("b", "", 0);
        q.unstage(&[(b.id, b.topic, b.seq), (c.id, c.topic, c.seq)]);
        assert_eq!(
            (q.len(), q.next_id(), q.next_seq("a"), q.next_seq("b")),
            (1, 2, 2, 1)
        );
        assert_eq!(q.stats().enqueued, 1);
    }

    #[test]
    fn a_refusing_ack_drops_the_message_and_the_queue_moves_on() {
        let mut q = PubQueue::new("p", 1);
        for _ in 0..3 {
            q.enqueue("t", "", 0);
        }
        assert_eq!(seqs(&mut q), vec![1]);
        assert!(q.on_refused(1));
        assert!(!q.on_refused(1), "once");
        assert_eq!(seqs(&mut q), vec![2], "the next one leaves");
        assert!(q.on_ack(2));
        let s = q.stats();
        assert_eq!((s.refused_by_broker, s.acked, q.len()), (1, 1, 1));
    }

    #[test]
    fn payloads_beyond_the_resident_bound_wait_for_a_load() {
        let mut q = PubQueue::new("p", 2);
        q.set_resident(4);
        let all: Vec<QueuedMessage> = (0..10)
            .map(|i| q.enqueue("t", &format!("{i}"), 0))
            .collect();
        assert_eq!(q.resident(), 4);
        assert_eq!(q.wants_load(), None, "no room");
        let mut order = Vec::new();
        for _ in 0..100 {
            if let Some((from, n)) = q.wants_load() {
                let chunk: Vec<_> = all
                    .iter()
                    .filter(|m| m.id >= from)
                    .take(n)
                    .cloned()
                    .collect();
                q.fill(chunk);
            }
            assert!(q.resident() <= 4);
            while let Some(m) = q.poll_transmit() {
                order.push(m.id);
                assert!(q.on_ack(m.id));
            }
        }
        assert_eq!(order, (1..=10).collect::<Vec<_>>());
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
        /// Under bounds, whatever the interleaving of offers, sends, acks and
        /// disconnects: the queue never holds more than its bounds; every
        /// numbered message ends acked or dropped (counted exactly, never one
        /// in flight); with refuse-new nothing is dropped and every refusal is
        /// counted; what survives leaves in id order.
        #[test]
        fn bounded_queue_invariants(
            window in 1usize..4,
            max_messages in 1u64..12,
            max_bytes in 60u64..600,
            refuse in any::<bool>(),
            ops in proptest::collection::vec(0u8..5, 0..300),
        ) {
            let when_full = if refuse { WhenFull::RefuseNew } else { WhenFull::DropOldest };
            let mut q = limited(window, max_messages, max_bytes, when_full);
            let (mut offered, mut refused) = (0u64, 0u64);
            let mut in_flight: Vec<u64> = Vec::new();
            let mut acked = Vec::new();
            let mut dropped = Vec::new();
            let mut last_sent = 0;
            for (i, op) in ops.iter().chain(std::iter::repeat_n(&9, 200)).enumerate() {
                match op {
                    0 | 1 => {
                        offered += 1;
                        let body = "x".repeat(i % 40);
                        match q.offer("t", &body, 0) {
                            Some(m) => q.mark_durable(m.id),
                            None => refused += 1,
                        }
                        dropped.extend(q.take_dropped());
                    }
                    2 => while let Some(m) = q.poll_transmit() {
                        prop_assert!(m.id > last_sent);
                        last_sent = m.id;
                        in_flight.push(m.id);
                    },
                    3 => if !in_flight.is_empty() {
                        let id = in_flight.remove(0);
                        prop_assert!(q.on_ack(id));
                        acked.push(id);
                    },
                    4 => { q.on_disconnect(); in_flight.clear(); last_sent = 0; }
                    _ => {
                        // drain
                        while let Some(m) = q.poll_transmit() { in_flight.push(m.id); }
                        if let Some(id) = (!in_flight.is_empty()).then(|| in_flight.remove(0)) {
                            prop_assert!(q.on_ack(id));
                            acked.push(id);
                        }
                    }
                }
                prop_assert!(q.len() as u64 <= max_messages);
                prop_assert!(q.bytes() <= max_bytes);
                for d in &dropped { prop_assert!(!in_flight.contains(d)); }
            }
            prop_assert!(q.is_empty());
            let s = q.stats();
            prop_assert_eq!(s.refused_full, refused);
            prop_assert_eq!(s.dropped_full, dropped.len() as u64);
            prop_assert_eq!(s.enqueued, offered - refused);
            if refuse { prop_assert!(dropped.is_empty()); }
            let mut all: Vec<u64> = acked.iter().chain(&dropped).copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (1..=offered - refused).collect::<Vec<_>>());
            let mut sorted = acked.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), acked.len(), "acked once each");
        }

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
