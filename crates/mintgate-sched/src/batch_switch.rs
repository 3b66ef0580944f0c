//! When the pipeline's threads give up wake-up preemption.
//!
//! A Network Receiver thread sleeps until a datagram arrives. At a normal
//! scheduling policy the arrival wakes it and it preempts whatever runs on
//! the CPU the kernel picks, very often the sender itself (a load generator,
//! a proxy, a client on the same machine) in the middle of a batch of sends.
//! The receiver then reads the few datagrams that are there, sleeps, and is
//! woken again by the next one: on the 2-core benchmark machine, under 100
//! CON clients, about 30,000 wake-ups a second, each a context switch for
//! both sides, with 4 datagrams per receive call.
//!
//! As `SCHED_BATCH` the receiver, once woken, waits for the running thread
//! to sleep (or for the next tick) instead: the sender finishes its batch,
//! and the receiver reads it whole. That trades latency for throughput: at
//! light load, where a CPU is nearly always free, it only makes a request
//! wait behind whatever shares its CPU (the median rose by 15-50 us at
//! 10,000-30,000 requests/s in our runs). So the receiver switches to
//! batch only above a datagram rate, and back below three quarters of it.
//!
//! The handler threads switch with it: a handler woken by the receiver's
//! push then does not preempt the receiver in the middle of its batch
//! either (in six alternating pairs under the same CON load: throughput
//! +4 % median, p99 about 0.6x).
//!
//! [`BatchSwitch`] is the decision alone, sans IO: it is fed the running
//! total of datagrams received and the time, and says when to switch. Each
//! thread keeps its own and switches itself.

use std::time::{Duration, Instant};

/// How often the rate is measured.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Longest window that is judged.
pub const MAX_WINDOW: Duration = Duration::from_millis(400);

/// Decides, from the datagram rate, whether a pipeline thread should run as
/// `SCHED_BATCH`. Switches on at `above` datagrams per second or more over
/// one window of at least [`WINDOW`], off below three quarters of it. A
/// window longer than [`MAX_WINDOW`] (the thread was blocked) is not judged:
/// its average would describe load that may be long gone.
///
/// Each thread keeps its own, so a window runs from the thread's previous
/// look to this one.
#[derive(Clone, Debug)]
pub struct BatchSwitch {
    /// Datagrams per second; 0 = never switch.
    above: u64,
    start: Instant,
    start_total: u64,
    on: bool,
    last_rate: f64,
}

impl BatchSwitch {
    /// A switch that is off, measuring from `now` and `total` datagrams.
    pub fn new(above: u64, now: Instant, total: u64) -> BatchSwitch {
        BatchSwitch {
            above,
            start: now,
            start_total: total,
            on: false,
            last_rate: 0.0,
        }
    }

    /// Datagrams per second over the last window judged.
    pub fn last_rate(&self) -> f64 {
        self.last_rate
    }

    /// True while the thread should be in batch.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Feeds the running total of datagrams at `now`; returns the new state
    /// when it changes (at most once per [`WINDOW`]).
    pub fn update(&mut self, now: Instant, total: u64) -> Option<bool> {
        if self.above == 0 {
            return None;
        }
        let dt = now.saturating_duration_since(self.start);
        if dt < WINDOW {
            return None;
        }
        let rate = total.saturating_sub(self.start_total) as f64 / dt.as_secs_f64();
        self.start = now;
        self.start_total = total;
        if dt > MAX_WINDOW {
            return None;
        }
        self.last_rate = rate;
        let want = if self.on {
            rate >= self.above as f64 * 0.75
        } else {
            rate >= self.above as f64
        };
        if want == self.on {
            return None;
        }
        self.on = want;
        Some(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `rate` datagrams/s for `secs` in steps of 10 ms; returns the
    /// switches seen, with their times in ms from `t0`.
    fn drive(
        s: &mut BatchSwitch,
        t0: Instant,
        now: &mut Instant,
        total: &mut u64,
        rate: u64,
        ms: u64,
    ) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        for _ in 0..ms / 10 {
            *now += Duration::from_millis(10);
            *total += rate / 100;
            if let Some(on) = s.update(*now, *total) {
                out.push(((*now - t0).as_millis() as u64, on));
            }
        }
        out
    }

    #[test]
    fn switches_on_above_the_rate_and_off_below_three_quarters() {
        let t0 = Instant::now();
        let (mut now, mut total) = (t0, 0);
        let mut s = BatchSwitch::new(50_000, t0, 0);
        // light load: never
        assert!(drive(&mut s, t0, &mut now, &mut total, 30_000, 2_000).is_empty());
        assert!(!s.is_on());
        // heavy load: on at the end of the first whole window
        let sw = drive(&mut s, t0, &mut now, &mut total, 120_000, 1_000);
        assert_eq!(sw, vec![(2_100, true)]);
        // between 3/4 and the threshold: stays on (hysteresis)
        assert!(drive(&mut s, t0, &mut now, &mut total, 40_000, 1_000).is_empty());
        assert!(s.is_on());
        // below 3/4: off within one window, and stays off
        let sw = drive(&mut s, t0, &mut now, &mut total, 30_000, 1_000);
        assert_eq!(sw, vec![(4_100, false)]);
        assert!(!s.is_on());
        // between 3/4 and the threshold from off: stays off
        assert!(drive(&mut s, t0, &mut now, &mut total, 40_000, 1_000).is_empty());
    }

    #[test]
    fn zero_never_switches_and_a_long_gap_is_not_judged() {
        let t0 = Instant::now();
        let mut s = BatchSwitch::new(0, t0, 0);
        assert_eq!(s.update(t0 + Duration::from_secs(1), 10_000_000), None);
        // a thread blocked for 10 s: the average over the gap is not used,
        // the next whole window is
        let mut s = BatchSwitch::new(1_000, t0, 0);
        assert_eq!(s.update(t0 + Duration::from_secs(10), 50_000), None);
        assert!(!s.is_on());
        let t = t0 + Duration::from_secs(10);
        assert_eq!(s.update(t + Duration::from_millis(200), 50_300), Some(true));
        assert!((s.last_rate() - 1_500.0).abs() < 1e-6);
        // updates inside a window are not judged
        assert_eq!(s.update(t + Duration::from_millis(250), 50_300), None);
        assert!(s.is_on());
        // on, then blocked 1 s with nothing: the gap decides nothing either
        assert_eq!(s.update(t + Duration::from_millis(1_250), 50_300), None);
        assert!(s.is_on());
        assert_eq!(
            s.update(t + Duration::from_millis(1_400), 50_300),
            Some(false)
        );
    }
}
