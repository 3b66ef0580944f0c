//! The replay window of RFC 8613 7.4: a sliding window over received
//! Partial IVs (as RFC 4303 3.4.3 does it for IPsec), 64 wide.

/// Width of the window.
pub const WINDOW: u64 = 64;

/// Which of the last [`WINDOW`] sequence numbers were seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    /// Highest sequence number accepted, and whether any was.
    top: Option<u64>,
    /// Bit i set: `top - i` was seen.
    bits: u64,
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
            bits: u64::MAX,
        }
    }

    /// Whether `seq` would be accepted (new and not below the window).
    pub fn check(&self, seq: u64) -> bool {
        match self.top {
            None => true,
            Some(top) if seq > top => true,
            Some(top) => {
                let d = top - seq;
                d < WINDOW && self.bits & (1 << d) == 0
            }
        }
    }

    /// Records `seq` as seen (call after the message verified).
    pub fn accept(&mut self, seq: u64) {
        match self.top {
            None => {
                self.top = Some(seq);
                self.bits = 1;
            }
            Some(top) if seq > top => {
                let shift = seq - top;
                self.bits = if shift >= WINDOW {
                    0
                } else {
                    self.bits << shift
                };
                self.bits |= 1;
                self.top = Some(seq);
            }
            Some(top) => {
                let d = top - seq;
                if d < WINDOW {
                    self.bits |= 1 << d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        w.accept(200);
        assert!(!w.check(200));
        assert!(!w.check(5), "below the window");
        assert!(!w.check(200 - WINDOW));
        assert!(w.check(200 - WINDOW + 1));
        let s = ReplayWindow::starting_after(10);
        assert!(!s.check(10) && !s.check(0) && s.check(11));
    }
}
