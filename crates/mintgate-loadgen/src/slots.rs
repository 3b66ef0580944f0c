//! Outstanding requests of one worker: a fixed table of slots, `cap` per
//! client, allocated once.
//!
//! Every slot is in exactly one of two intrusive lists, linked through
//! `next` (and `prev`): its client's free list, or the worker's outstanding
//! list in send order. Requests are appended at the tail with a timestamp no
//! older than the tail's (the worker's clock is monotonic), so the oldest
//! outstanding request is always at the head and, the timeout being the same
//! for all, expiry only ever looks at the head. Acquire, complete, release and
//! expire are O(1) and never allocate; only a Reset (matched by message ID,
//! not token) scans the client's `cap` slots.

use std::time::Instant;

use crate::template::Token;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    sent_at: Instant,
    mid: u16,
    gen: u16,
    busy: bool,
    measured: bool,
    prev: u32,
    next: u32,
}

/// A request that got its answer or ran out of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    /// When it was sent.
    pub sent_at: Instant,
    /// Sent during the measured period.
    pub measured: bool,
}

/// The slot table.
pub struct Slots {
    slots: Vec<Slot>,
    cap: u32,
    /// Head of each client's free list.
    free: Vec<u32>,
    head: u32,
    tail: u32,
    outstanding: usize,
}

impl Slots {
    /// `clients` clients with `cap` slots each (1..=65536, so a slot index
    /// fits the token), all free.
    pub fn new(clients: usize, cap: usize, now: Instant) -> Slots {
        debug_assert!((1..=1 << 16).contains(&cap));
        let cap = cap as u32;
        let total = clients * cap as usize;
        let mut slots = Vec::with_capacity(total);
        for i in 0..total as u32 {
            let last = i % cap == cap - 1;
            slots.push(Slot {
                sent_at: now,
                mid: 0,
                gen: 0,
                busy: false,
                measured: false,
                prev: NIL,
                next: if last { NIL } else { i + 1 },
            });
        }
        Slots {
            slots,
            cap,
            free: (0..clients as u32).map(|c| c * cap).collect(),
            head: NIL,
            tail: NIL,
            outstanding: 0,
        }
    }

    /// Slots per client.
    pub fn cap(&self) -> usize {
        self.cap as usize
    }

    /// Requests outstanding.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// When the oldest outstanding request was sent.
    pub fn oldest(&self) -> Option<Instant> {
        (self.head != NIL).then(|| self.slots[self.head as usize].sent_at)
    }

    /// Takes a free slot of `client` for a request with `mid` sent at
    /// `sent_at` (no older than any request already outstanding); `None`
    /// when all of the client's slots are busy.
    pub fn acquire(
        &mut self,
        client: usize,
        mid: u16,
        sent_at: Instant,
        measured: bool,
    ) -> Option<Token> {
        let i = self.free[client];
        if i == NIL {
            return None;
        }
        let tail = self.tail;
        let s = &mut self.slots[i as usize];
        self.free[client] = s.next;
        s.gen = s.gen.wrapping_add(1);
        s.mid = mid;
        s.sent_at = sent_at;
        s.measured = measured;
        s.busy = true;
        s.prev = tail;
        s.next = NIL;
        let token = Token {
            slot: (i % self.cap) as u16,
            gen: s.gen,
        };
        if tail == NIL {
            self.head = i;
        } else {
            self.slots[tail as usize].next = i;
        }
        self.tail = i;
        self.outstanding += 1;
        Some(token)
    }

    /// Completes the request of `client` that `token` names, if it is still
    /// outstanding (same generation) and, when `mid` is given (a piggybacked
    /// ACK), carries that message ID.
    pub fn complete(&mut self, client: usize, token: Token, mid: Option<u16>) -> Option<Done> {
        if token.slot as u32 >= self.cap {
            return None;
        }
        let i = client as u32 * self.cap + token.slot as u32;
        let s = self.slots.get(i as usize)?;
        if !s.busy || s.gen != token.gen || mid.is_some_and(|m| m != s.mid) {
            return None;
        }
        Some(self.finish(client, i))
    }

    /// Completes the outstanding request of `client` with message ID `mid`.
    pub fn complete_by_mid(&mut self, client: usize, mid: u16) -> Option<Done> {
        let base = client as u32 * self.cap;
        let i = (base..base + self.cap).find(|&i| {
            let s = &self.slots[i as usize];
            s.busy && s.mid == mid
        })?;
        Some(self.finish(client, i))
    }

    /// Gives back a slot just acquired whose request could not be sent.
    pub fn release(&mut self, client: usize, token: Token) {
        let _ = self.complete(client, token, None);
    }

    /// Removes the oldest outstanding request if it was sent at or before
    /// `cutoff`, returning its client.
    pub fn expire(&mut self, cutoff: Instant) -> Option<(usize, Done)> {
        if self.head == NIL {
            return None;
        }
        let i = self.head;
        if self.slots[i as usize].sent_at > cutoff {
            return None;
        }
        let client = (i / self.cap) as usize;
        Some((client, self.finish(client, i)))
    }

    /// Unlinks busy slot `i` from the outstanding list and frees it.
    fn finish(&mut self, client: usize, i: u32) -> Done {
        let s = self.slots[i as usize];
        if s.prev == NIL {
            self.head = s.next;
        } else {
            self.slots[s.prev as usize].next = s.next;
        }
        if s.next == NIL {
            self.tail = s.prev;
        } else {
            self.slots[s.next as usize].prev = s.prev;
        }
        let free_head = self.free[client];
        let slot = &mut self.slots[i as usize];
        slot.busy = false;
        slot.prev = NIL;
        slot.next = free_head;
        self.free[client] = i;
        self.outstanding -= 1;
        Done {
            sent_at: s.sent_at,
            measured: s.measured,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn acquire_until_full_then_complete_frees() {
        let t0 = Instant::now();
        let mut s = Slots::new(2, 3, t0);
        let toks: Vec<_> = (0..3).map(|m| s.acquire(1, m, t0, true).unwrap()).collect();
        assert_eq!(s.acquire(1, 9, t0, true), None);
        assert!(s.acquire(0, 9, t0, true).is_some());
        assert_eq!(s.outstanding(), 4);
        // A token of client 1 does not match on client 0.
        assert_eq!(s.complete(0, toks[2], None), None);
        assert!(s.complete(1, toks[1], Some(1)).is_some());
        // Twice: already completed.
        assert_eq!(s.complete(1, toks[1], None), None);
        let again = s.acquire(1, 10, t0, false).unwrap();
        assert_eq!(again.slot, toks[1].slot);
        assert_ne!(again.gen, toks[1].gen, "reuse bumps the generation");
        // The old token is now late.
        assert_eq!(s.complete(1, toks[1], None), None);
        assert_eq!(s.outstanding(), 4);
    }

    #[test]
    fn matching_checks_mid_of_piggybacked_ack_and_bounds() {
        let t0 = Instant::now();
        let mut s = Slots::new(1, 2, t0);
        let t = s.acquire(0, 0x55, t0, true).unwrap();
        assert_eq!(s.complete(0, t, Some(0x56)), None);
        let bogus = Token {
            slot: 7,
            gen: t.gen,
        };
        assert_eq!(s.complete(0, bogus, None), None);
        assert_eq!(
            s.complete(0, t, Some(0x55)),
            Some(Done {
                sent_at: t0,
                measured: true
            })
        );
    }

    #[test]
    fn expiry_is_in_send_order_and_skips_completed() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Slots::new(2, 4, t0);
        let a = s.acquire(0, 1, t0, true).unwrap();
        s.acquire(1, 2, t0 + ms(1), true).unwrap();
        s.acquire(0, 3, t0 + ms(2), false).unwrap();
        assert_eq!(s.oldest(), Some(t0));
        s.complete(0, a, None).unwrap();
        assert_eq!(s.oldest(), Some(t0 + ms(1)));
        assert_eq!(s.expire(t0), None);
        let (c, d) = s.expire(t0 + ms(5)).unwrap();
        assert_eq!((c, d.measured), (1, true));
        let (c, d) = s.expire(t0 + ms(5)).unwrap();
        assert_eq!((c, d.measured), (0, false));
        assert_eq!(s.expire(t0 + ms(5)), None);
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.oldest(), None);
    }

    #[test]
    fn reset_matches_by_mid_and_release_unlinks_tail() {
        let t0 = Instant::now();
        let mut s = Slots::new(1, 4, t0);
        s.acquire(0, 100, t0, true).unwrap();
        let b = s.acquire(0, 101, t0, true).unwrap();
        assert!(s.complete_by_mid(0, 100).is_some());
        assert!(s.complete_by_mid(0, 100).is_none());
        s.release(0, b);
        assert_eq!(s.outstanding(), 0);
        // All four slots are free again.
        for m in 0..4 {
            assert!(s.acquire(0, m, t0, true).is_some());
        }
        assert!(s.acquire(0, 9, t0, true).is_none());
    }
}
