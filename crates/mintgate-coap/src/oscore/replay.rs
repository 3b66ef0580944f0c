//! The replay window of RFC 8613 7.4: a sliding window over received
//! Partial IVs (as RFC 4303 3.4.3 does it for IPsec), [`WINDOW`] wide.
//!
//! The width is ours to choose (RFC 8613 7.4 leaves it to the
//! implementation). A server that verifies requests on several threads
//! takes one client's requests out of the order they came in: a thread
//! preempted while it holds one request lets the others answer that
//! client's later ones, and a 64-wide window (RFC 4303's default) then
//! refuses the held request as too old although it is the first of its
//! number. 1,024 numbers tolerate about 0.3 s of such a stall at 3,600
//! requests/s from one client. Every number in the window is still taken
//! once: the width changes which late requests are accepted, never whether
//! a replay is refused.
//!
//! The bitmap is a ring (as RFC 6479 suggests): bit `seq % WINDOW` stands
//! for `seq` while `seq` is in the window, so moving the window clears the
//! bits it passes instead of shifting them all.

/// Width of the window, a multiple of 64.
pub const WINDOW: u64 = 1024;

const WORDS: usize = (WINDOW / 64) as usize;

/// Which of the last [`WINDOW`] sequence numbers were seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    /// Highest sequence number accepted, and whether any was.
    top: Option<u64>,
    /// Bit `s % WINDOW` set: `s` was seen, for `s` in `top - WINDOW + 1 ..=
    /// top`.
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: None,
            bits: [0; WORDS],
        }
    }
}

impl ReplayWindow {
    /// A window that has seen nothing.
    pub fn new() -> ReplayWindow {
        ReplayWindow::default()
    }

    /// A window that accepts only numbers above `seq` (after a restart that
    /// learnt `seq` from a fresh request, RFC 8613 B.1.2).
    pub fn starting_after(seq: u64) -> ReplayWindow {
        ReplayWindow {
            top: Some(seq),
            bits: [u64::MAX; WORDS],
        }
    }

    fn bit(seq: u64) -> (usize, u64) {
        let i = seq % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn seen(&self, seq: u64) -> bool {
        let (w, m) = Self::bit(seq);
        self.bits[w] & m != 0
    }

    fn mark(&mut self, seq: u64) {
        let (w, m) = Self::bit(seq);
        self.bits[w] |= m;
    }

    /// Whether `seq` would be accepted (new and not below the window).
    pub fn check(&self, seq: u64) -> bool {
        match self.top {
            None => true,
            Some(top) if seq > top => true,
            Some(top) => top - seq < WINDOW && !self.seen(seq),
        }
    }

    /// Records `seq` as seen (call after the message verified).
    pub fn accept(&mut self, seq: u64) {
        match self.top {
            None => {
                self.bits = [0; WORDS];
                self.mark(seq);
                self.top = Some(seq);
            }
            Some(top) if seq > top => {
                if seq - top >= WINDOW {
                    self.bits = [0; WORDS];
                } else {
                    // the numbers the window now covers anew were not seen
                    for s in top + 1..seq {
                        let (w, m) = Self::bit(s);
                        self.bits[w] &= !m;
                    }
                }
                self.mark(seq);
                self.top = Some(seq);
            }
            Some(top) => {
                if top - seq < WINDOW {
                    self.mark(seq);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn replays_and_old_numbers_refused() {
        let mut w = ReplayWindow::new();
        assert!(w.check(5));
        w.accept(5);
        assert!(!w.check(5));
        assert!(w.check(3));
        w.accept(3);
        assert!(!w.check(3));
        assert!(w.check(4));
        w.accept(5000);
        assert!(!w.check(5000));
        assert!(!w.check(5), "below the window");
        assert!(!w.check(5000 - WINDOW));
        assert!(w.check(5000 - WINDOW + 1));
        let s = ReplayWindow::starting_after(10);
        assert!(!s.check(10) && !s.check(0) && s.check(11));
    }

    #[test]
    fn a_request_held_back_by_a_stalled_thread_is_still_taken() {
        // one request waits while 1,000 later ones of its client are
        // verified: it was never seen and is taken, once
        let mut w = ReplayWindow::new();
        for s in (0..100).chain(101..1101) {
            assert!(w.check(s));
            w.accept(s);
        }
        assert!(w.check(100));
        w.accept(100);
        assert!(!w.check(100));
    }

    #[test]
    fn moving_the_window_forgets_what_fell_out_of_it() {
        // bit s % WINDOW stood for s; after a move by less than the width
        // it must stand for the new number, unseen
        let mut w = ReplayWindow::new();
        w.accept(7);
        w.accept(7 + WINDOW - 1);
        assert!(!w.check(7), "7 is still in the window and was seen");
        w.accept(7 + WINDOW + 5);
        assert!(!w.check(7), "7 fell below the window");
        assert!(w.check(7 + WINDOW), "same bit as 7, never seen");
        assert!(w.check(7 + WINDOW + 4));
        assert!(!w.check(7 + WINDOW - 1));
    }

    proptest! {
        /// Against a model that remembers every number: a number is taken
        /// exactly when it is new and within WINDOW of the highest taken.
        #[test]
        fn agrees_with_a_set(seqs in proptest::collection::vec(
            prop_oneof![0u64..3000, 0u64..40, (0u64..4).prop_map(|k| k * WINDOW)],
            1..400,
        )) {
            let mut w = ReplayWindow::new();
            let mut seen = std::collections::BTreeSet::new();
            for s in seqs {
                let top = seen.iter().next_back().copied();
                let expect = match top {
                    None => true,
                    Some(t) if s > t => true,
                    Some(t) => t - s < WINDOW && !seen.contains(&s),
                };
                prop_assert_eq!(w.check(s), expect, "seq {}", s);
                if expect {
                    w.accept(s);
                    seen.insert(s);
                }
            }
        }
    }
}
