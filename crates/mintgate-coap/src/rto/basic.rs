//! Basic: the retransmission behaviour of RFC 7252 section 4.8.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha12Rng;
use rand::SeedableRng;

use super::{RtoController, TransmissionParams};

/// RFC 7252 4.8: the first timeout is a random duration in
/// `[ACK_TIMEOUT, ACK_TIMEOUT * ACK_RANDOM_FACTOR]`, doubled on each
/// retransmission, up to `MAX_RETRANSMIT` retransmissions, `NSTART`
/// outstanding exchanges per destination.
///
/// Keeps no per-destination state: every destination is treated the same and
/// nothing is learnt from round-trip times.
#[derive(Debug)]
pub struct Basic {
    params: TransmissionParams,
    rng: ChaCha12Rng,
}

impl Basic {
    /// A controller with `params`, drawing its random initial timeouts from
    /// an RNG seeded with `seed` (same seed, same timeouts).
    pub fn new(params: TransmissionParams, seed: u64) -> Basic {
        Basic {
            params,
            rng: ChaCha12Rng::seed_from_u64(seed),
        }
    }
}

impl RtoController for Basic {
    // Same signatures as Adaptive's and Cocoa's: one trait, three controllers.
    fn initial_rto(&mut self, _dest: SocketAddr, _now: Instant, _in_flight: usize) -> Duration {
        self.params.initial_timeout(&mut self.rng)
    }

    fn backoff(
        &mut self,
        _dest: SocketAddr,
        _now: Instant,
        prev_rto: Duration,
        _retransmissions: u32,
    ) -> Duration {
        prev_rto.saturating_mul(2)
    }

    fn on_response(
        &mut self,
        _dest: SocketAddr,
        _now: Instant,
        _rtt: Duration,
        _retransmissions: u32,
    ) {
    }

    fn on_give_up(&mut self, _dest: SocketAddr, _now: Instant, _retransmissions: u32) {}

    fn max_retransmit(&self, _dest: SocketAddr) -> u32 {
        self.params.max_retransmit
    }

    fn nstart(&self, _dest: SocketAddr) -> usize {
        self.params.nstart.max(1)
    }

    fn name(&self) -> &'static str {
        "basic"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest() -> SocketAddr {
        "192.0.2.1:5683".parse().unwrap()
    }

    #[test]
    fn initial_rto_is_within_ack_timeout_times_random_factor() {
        let mut b = Basic::new(TransmissionParams::default(), 7);
        let now = Instant::now();
        let mut lo = Duration::MAX;
        let mut hi = Duration::ZERO;
        for _ in 0..1000 {
            let r = b.initial_rto(dest(), now, 1);
            assert!(
                r >= Duration::from_secs(2) && r <= Duration::from_secs(3),
                "{r:?}"
            );
            lo = lo.min(r);
            hi = hi.max(r);
        }
        // The draw covers the range rather than sitting at one end.
        assert!(lo < Duration::from_millis(2100) && hi > Duration::from_millis(2900));
    }

    #[test]
    fn same_seed_same_timeouts() {
        let now = Instant::now();
        let mut a = Basic::new(TransmissionParams::default(), 42);
        let mut b = Basic::new(TransmissionParams::default(), 42);
        for _ in 0..10 {
            assert_eq!(a.initial_rto(dest(), now, 1), b.initial_rto(dest(), now, 1));
        }
    }

    #[test]
    fn backoff_doubles_and_factor_one_is_exact() {
        let p = TransmissionParams {
            ack_random_factor: 1.0,
            nstart: 0,
            ..TransmissionParams::default()
        };
        let mut b = Basic::new(p, 1);
        let now = Instant::now();
        let r0 = b.initial_rto(dest(), now, 1);
        assert_eq!(r0, Duration::from_secs(2));
        assert_eq!(b.backoff(dest(), now, r0, 1), Duration::from_secs(4));
        assert_eq!(b.max_retransmit(dest()), 4);
        // NSTART 0 would block every exchange; it is read as 1.
        assert_eq!(b.nstart(dest()), 1);
    }
}
