//! The open-loop send schedule of one worker thread.
//!
//! Each of the worker's `n` clients sends once per `period`, the clients'
//! phases spread evenly over the period, so the worker's sends form one
//! sequence: send `s` belongs to client `s % n` and is due at
//! `start + s * period / n`. Being a pure function of the time, the schedule
//! keeps its rate whatever the responses do (that is what makes it open
//! loop), and a worker that wakes late catches up by sending everything due.

use std::time::{Duration, Instant};

/// Where the worker is in its sequence of sends.
#[derive(Debug)]
pub struct Schedule {
    start: Instant,
    /// Nanoseconds per send of one client.
    period_ns: u128,
    /// Clients sharing the schedule (>= 1).
    n: u64,
    /// The next send not yet taken.
    next: u64,
}

impl Schedule {
    /// A schedule of `n` clients (at least 1) sending `rate` times per second
    /// each, the first send due at `start`.
    ///
    /// `rate` must be positive and finite (checked by the caller).
    pub fn new(start: Instant, rate: f64, n: usize) -> Schedule {
        Schedule {
            start,
            period_ns: ((1e9 / rate).round() as u128).max(1),
            n: n.max(1) as u64,
            next: 0,
        }
    }

    /// When send `s` is due.
    fn due_at(&self, s: u64) -> Instant {
        let off = s as u128 * self.period_ns / self.n as u128;
        self.start + Duration::from_nanos(off.min(u64::MAX as u128) as u64)
    }

    /// When the next send not yet taken is due.
    pub fn next_due(&self) -> Instant {
        self.due_at(self.next)
    }

    /// Takes the next send if it is due by `now` and before `end`, returning
    /// its client (index among the schedule's clients).
    pub fn take_due(&mut self, now: Instant, end: Instant) -> Option<usize> {
        let at = self.due_at(self.next);
        if at > now || at >= end {
            return None;
        }
        let client = (self.next % self.n) as usize;
        self.next += 1;
        Some(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_clients_evenly_and_keeps_rate() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(100);
        // 4 clients x 10/s: one send every 25 ms, round robin.
        let mut s = Schedule::new(t0, 10.0, 4);
        assert_eq!(s.next_due(), t0);
        let mut got = Vec::new();
        while let Some(c) = s.take_due(t0 + Duration::from_millis(99), far) {
            got.push(c);
        }
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(s.next_due(), t0 + Duration::from_millis(100));
        // One second later in total: exactly 10 sends per client were due.
        let mut per = [1; 4]; // the round already taken
        while let Some(c) = s.take_due(t0 + Duration::from_millis(999), far) {
            per[c] += 1;
        }
        assert_eq!(per, [10; 4]);
    }

    #[test]
    fn late_wakeup_catches_up_and_end_stops() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, 1000.0, 1);
        let end = t0 + Duration::from_millis(10);
        // Woken 50 ms late: only the 10 sends before `end` go out.
        let mut n = 0;
        while s.take_due(t0 + Duration::from_millis(60), end).is_some() {
            n += 1;
        }
        assert_eq!(n, 10);
    }

    #[test]
    fn fractional_rates() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, 0.5, 2);
        assert_eq!(s.take_due(t0, t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(s.next_due(), t0 + Duration::from_secs(1));
        assert_eq!(
            s.take_due(
                t0 + Duration::from_millis(999),
                t0 + Duration::from_secs(10)
            ),
            None
        );
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(1), t0 + Duration::from_secs(10)),
            Some(1)
        );
        assert_eq!(
            s.take_due(t0 + Duration::from_secs(2), t0 + Duration::from_secs(10)),
            Some(0)
        );
    }
}
