//! CoCoA ("CoAP Simple Congestion Control/Advanced",
//! draft-ietf-core-cocoa-03, the last version of the draft).
//!
//! Per destination, two RFC 6298 estimators (alpha 1/8, beta 1/4; on the
//! first sample SRTT = R and RTTVAR = R/2), each giving
//! `E = SRTT + K * RTTVAR`:
//! - *strong* (K = 4), fed by exchanges acknowledged without a
//!   retransmission; after it updates, `RTO = 0.5 * E_strong + 0.5 * RTO`;
//! - *weak* (K = 1), fed by exchanges acknowledged after 1 or 2
//!   retransmissions, timed from the first transmission; after it updates,
//!   `RTO = 0.25 * E_weak + 0.75 * RTO`. Samples after 3 or more
//!   retransmissions are discarded (too ambiguous).
//!
//! The overall RTO starts at 2 s. A destination with no estimate yet gets the
//! *blind* RTO, 2 s times the exchanges in flight to it. The first timeout of
//! an exchange is dithered in `[RTO, 1.5 RTO]`; each retransmission multiplies
//! the timeout by the *variable backoff factor* of the destination's RTO
//! (x3 below 1 s, x2 from 1 to 3 s, x1.5 above 3 s), capped at 32 s.
//! *Aging*: an RTO below 1 s that was not updated for 16 RTOs doubles; one
//! above 3 s not updated for 4 RTOs becomes `1 s + 0.5 RTO` (both repeat
//! while the condition holds).
//!
//! Per-destination state is bounded: at most `capacity` destinations are
//! kept, the least recently used one is dropped first, and a destination
//! unused for `forget_after` starts over blind.
//!
//! Not here: CoCoA's pacing of NON messages (at most one per RTO, and at
//! least 2 of every 16 as CON) needs a hook on the NON send path of the
//! client, which the trait does not have yet.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha12Rng;
use rand::{RngExt, SeedableRng};

use super::table::DestTable;
use super::{RtoController, TransmissionParams};

const INITIAL_RTO: Duration = Duration::from_secs(2);
const BACKOFF_CAP: Duration = Duration::from_secs(32);
const K_STRONG: f64 = 4.0;
const K_WEAK: f64 = 1.0;

/// One RFC 6298 estimator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimator {
    /// Smoothed RTT, seconds.
    pub srtt: f64,
    /// RTT variation, seconds.
    pub rttvar: f64,
}

impl Estimator {
    fn first(r: f64) -> Estimator {
        Estimator {
            srtt: r,
            rttvar: r / 2.0,
        }
    }

    /// RFC 6298 update with alpha 1/8, beta 1/4 (RTTVAR first, with the old
    /// SRTT).
    fn update(&mut self, r: f64) {
        self.rttvar = 0.75 * self.rttvar + 0.25 * (self.srtt - r).abs();
        self.srtt = 0.875 * self.srtt + 0.125 * r;
    }

    fn e(&self, k: f64) -> f64 {
        self.srtt + k * self.rttvar
    }
}

/// What CoCoA knows of one destination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DestState {
    /// The strong estimator, once fed.
    pub strong: Option<Estimator>,
    /// The weak estimator, once fed.
    pub weak: Option<Estimator>,
    /// The overall RTO.
    pub rto: Duration,
    /// When the RTO was last updated by a sample (or aged).
    pub updated: Instant,
}

impl DestState {
    fn new(now: Instant) -> DestState {
        DestState {
            strong: None,
            weak: None,
            rto: INITIAL_RTO,
            updated: now,
        }
    }

    fn has_estimate(&self) -> bool {
        self.strong.is_some() || self.weak.is_some()
    }

    fn age(&mut self, now: Instant) {
        loop {
            let rto = self.rto;
            if rto < Duration::from_secs(1)
                && now.saturating_duration_since(self.updated) >= rto * 16
            {
                self.updated += rto * 16;
                self.rto = rto * 2;
            } else if rto > Duration::from_secs(3)
                && now.saturating_duration_since(self.updated) >= rto * 4
            {
                self.updated += rto * 4;
                self.rto = Duration::from_secs(1) + rto / 2;
            } else {
                return;
            }
        }
    }
}

/// The variable backoff factor for an RTO.
pub fn backoff_factor(rto: Duration) -> f64 {
    if rto < Duration::from_secs(1) {
        3.0
    } else if rto <= Duration::from_secs(3) {
        2.0
    } else {
        1.5
    }
}

/// The CoCoA controller.
#[derive(Debug)]
pub struct Cocoa {
    params: TransmissionParams,
    rng: ChaCha12Rng,
    dests: DestTable<DestState>,
}

impl Cocoa {
    /// CoCoA with RFC 7252 `params` (MAX_RETRANSMIT, NSTART), keeping at
    /// most 1024 destinations, each forgotten after 10 minutes unused.
    pub fn new(params: TransmissionParams, seed: u64) -> Cocoa {
        Cocoa::with_limits(params, seed, 1024, Duration::from_secs(600))
    }

    /// CoCoA with explicit bounds on the per-destination state.
    pub fn with_limits(
        params: TransmissionParams,
        seed: u64,
        capacity: usize,
        forget_after: Duration,
    ) -> Cocoa {
        Cocoa {
            params,
            rng: ChaCha12Rng::seed_from_u64(seed),
            dests: DestTable::new(capacity, forget_after),
        }
    }

    /// The state of `dest`, if kept.
    pub fn state(&self, dest: SocketAddr) -> Option<&DestState> {
        self.dests.get(dest)
    }

    /// Destinations kept now.
    pub fn destinations(&self) -> usize {
        self.dests.len()
    }

    /// The state of `dest` at `now`: aged, or fresh when unknown, forgotten
    /// or evicted.
    fn touch(&mut self, dest: SocketAddr, now: Instant) -> &mut DestState {
        let s = self.dests.touch(dest, now, || DestState::new(now));
        s.age(now);
        s
    }
}

impl RtoController for Cocoa {
    fn initial_rto(&mut self, dest: SocketAddr, now: Instant, in_flight: usize) -> Duration {
        let s = self.touch(dest, now);
        let base = if s.has_estimate() {
            s.rto
        } else {
            INITIAL_RTO * in_flight.max(1) as u32
        };
        base.mul_f64(self.rng.random_range(1.0..=1.5))
    }

    fn backoff(
        &mut self,
        dest: SocketAddr,
        now: Instant,
        prev_rto: Duration,
        _retransmissions: u32,
    ) -> Duration {
        let rto = self.touch(dest, now).rto;
        prev_rto.mul_f64(backoff_factor(rto)).min(BACKOFF_CAP)
    }

    fn on_response(&mut self, dest: SocketAddr, now: Instant, rtt: Duration, retransmissions: u32) {
        let s = self.touch(dest, now);
        let r = rtt.as_secs_f64();
        let old = s.rto.as_secs_f64();
        let (slot, k, weight) = match retransmissions {
            0 => (&mut s.strong, K_STRONG, 0.5),
            1 | 2 => (&mut s.weak, K_WEAK, 0.25),
            _ => return,
        };
        let e = match slot {
            Some(e) => {
                e.update(r);
                *e
            }
            None => *slot.insert(Estimator::first(r)),
        };
        let new = weight * e.e(k) + (1.0 - weight) * old;
        s.rto = Duration::from_secs_f64(new);
        s.updated = now;
    }

    fn on_give_up(&mut self, dest: SocketAddr, now: Instant, _retransmissions: u32) {
        self.touch(dest, now);
    }

    fn max_retransmit(&self, _dest: SocketAddr) -> u32 {
        self.params.max_retransmit
    }

    fn nstart(&self, _dest: SocketAddr) -> usize {
        self.params.nstart.max(1)
    }

    fn name(&self) -> &'static str {
        "cocoa"
    }

    fn current_rto(&self, dest: SocketAddr) -> Option<Duration> {
        self.state(dest).map(|s| s.rto)
    }

    fn non_interval(&self, dest: SocketAddr) -> Option<Duration> {
        // NON sending rate at most 1 / RTO (draft-ietf-core-cocoa-03 4.3)
        Some(self.state(dest).map_or(INITIAL_RTO, |s| s.rto))
    }
}

/// CoCoA's rule for messages that elicit no response (e.g. Observe
/// notifications): of any 16 consecutive ones to a destination, at least 2
/// are sent confirmable, so that RTT samples keep coming.
///
/// Ask [`NonQuota::next_must_be_con`] before each such message and report
/// what was sent with [`NonQuota::sent`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NonQuota {
    /// The last 16 messages, newest in bit 0: 1 = CON.
    history: u16,
}

impl NonQuota {
    /// Whether the next message must be CON for the last 16 to hold at
    /// least 2 CONs.
    pub fn next_must_be_con(&self) -> bool {
        // any 16-message window that ends with the next one holds the 15
        // newest sent messages: with fewer than 2 CONs among them, this one
        // must be CON (greedy: 2 CONs in every 15 messages at most)
        (self.history & 0x7fff).count_ones() < 2
    }

    /// Records a message sent as CON (`true`) or NON.
    pub fn sent(&mut self, confirmable: bool) {
        self.history = (self.history << 1) | u16::from(confirmable);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn close(a: Duration, b_secs: f64) -> bool {
        (a.as_secs_f64() - b_secs).abs() < 1e-6
    }

    #[test]
    fn any_sixteen_non_response_messages_hold_two_cons() {
        let mut q = NonQuota::default();
        let mut sent = Vec::new();
        for _ in 0..200 {
            let con = q.next_must_be_con();
            q.sent(con);
            sent.push(con);
        }
        for w in sent.windows(16) {
            assert!(w.iter().filter(|c| **c).count() >= 2, "{w:?}");
        }
        // and no more CONs than needed: 2 per 15 in the long run
        let cons = sent.iter().filter(|c| **c).count();
        assert!(cons <= 2 * 200 / 15 + 2, "{cons}");
        // voluntary CONs count towards the quota
        let mut q = NonQuota::default();
        for _ in 0..16 {
            q.sent(true);
        }
        assert!(!q.next_must_be_con());
    }

    #[test]
    fn nons_are_paced_at_one_per_rto() {
        let mut c = Cocoa::new(TransmissionParams::default(), 1);
        let t0 = Instant::now();
        assert_eq!(c.non_interval(dest(1)), Some(Duration::from_secs(2)));
        c.on_response(dest(1), t0, ms(100), 0);
        let rto = c.state(dest(1)).unwrap().rto;
        assert_eq!(c.non_interval(dest(1)), Some(rto));
        assert!(rto < Duration::from_secs(2));
    }

    #[test]
    fn strong_sample_blends_half_of_e_strong_into_the_rto() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(TransmissionParams::default(), 1);
        c.on_response(dest(1), t0, ms(100), 0);
        // first sample: SRTT 0.1, RTTVAR 0.05, E = 0.1 + 4 * 0.05 = 0.3
        let s = *c.state(dest(1)).unwrap();
        assert_eq!(
            s.strong,
            Some(Estimator {
                srtt: 0.1,
                rttvar: 0.05
            })
        );
        assert!(close(s.rto, 0.5 * 0.3 + 0.5 * 2.0), "{:?}", s.rto);
        // second sample, RFC 6298: RTTVAR = 3/4 * 0.05 + 1/4 * |0.1 - 0.3|, SRTT = 7/8 * 0.1 + 1/8 * 0.3
        c.on_response(dest(1), t0, ms(300), 0);
        let e = c.state(dest(1)).unwrap().strong.unwrap();
        assert!((e.rttvar - (0.75 * 0.05 + 0.25 * 0.2)).abs() < 1e-12);
        assert!((e.srtt - (0.875 * 0.1 + 0.125 * 0.3)).abs() < 1e-12);
    }

    #[test]
    fn weak_samples_blend_a_quarter_and_three_retransmissions_are_discarded() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(TransmissionParams::default(), 1);
        c.on_response(dest(1), t0, ms(2500), 1);
        let s = *c.state(dest(1)).unwrap();
        assert!(s.strong.is_none());
        // E_weak = 2.5 + 1 * 1.25 = 3.75
        assert!(close(s.rto, 0.25 * 3.75 + 0.75 * 2.0), "{:?}", s.rto);
        let before = s.rto;
        c.on_response(dest(1), t0, ms(9000), 3);
        assert_eq!(
            c.state(dest(1)).unwrap().rto,
            before,
            "3 retransmissions: no sample"
        );
        c.on_response(dest(1), t0, ms(3000), 2);
        assert_ne!(
            c.state(dest(1)).unwrap().rto,
            before,
            "2 retransmissions: weak sample"
        );
    }

    #[test]
    fn blind_rto_scales_with_parallel_exchanges_and_is_dithered() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(TransmissionParams::default(), 7);
        for _ in 0..100 {
            let one = c.initial_rto(dest(1), t0, 1);
            assert!(one >= ms(2000) && one <= ms(3000), "{one:?}");
            let three = c.initial_rto(dest(2), t0, 3);
            assert!(three >= ms(6000) && three <= ms(9000), "{three:?}");
        }
        // once there is an estimate, the RTO (not the blind value) is dithered
        c.on_response(dest(1), t0, ms(100), 0);
        let rto = c.state(dest(1)).unwrap().rto;
        for _ in 0..100 {
            let t = c.initial_rto(dest(1), t0, 3);
            assert!(
                t >= rto && t <= rto.mul_f64(1.5) + Duration::from_nanos(1),
                "{t:?} vs {rto:?}"
            );
        }
    }

    #[test]
    fn variable_backoff_bands_and_the_32_s_cap() {
        assert_eq!(backoff_factor(ms(500)), 3.0);
        assert_eq!(backoff_factor(ms(1000)), 2.0);
        assert_eq!(backoff_factor(ms(3000)), 2.0);
        assert_eq!(backoff_factor(ms(3001)), 1.5);
        let t0 = Instant::now();
        let mut c = Cocoa::new(TransmissionParams::default(), 1);
        // RTO 1.15 s after a 100 ms strong sample: factor 2
        c.on_response(dest(1), t0, ms(100), 0);
        assert_eq!(c.backoff(dest(1), t0, ms(1500), 1), ms(3000));
        assert_eq!(
            c.backoff(dest(1), t0, ms(20_000), 2),
            Duration::from_secs(32)
        );
        // a fast destination: several small samples push the RTO below 1 s: factor 3
        for _ in 0..10 {
            c.on_response(dest(2), t0, ms(50), 0);
        }
        assert!(c.state(dest(2)).unwrap().rto < ms(1000));
        assert_eq!(c.backoff(dest(2), t0, ms(400), 1), ms(1200));
    }

    #[test]
    fn aging_moves_stale_rtos_back_towards_one_to_three_seconds() {
        let t0 = Instant::now();
        let mut c = Cocoa::new(TransmissionParams::default(), 1);
        for _ in 0..20 {
            c.on_response(dest(1), t0, ms(20), 0);
        }
        let small = c.state(dest(1)).unwrap().rto;
        assert!(small < ms(1000));
        // not updated for 16 RTOs: doubles
        c.on_give_up(dest(1), t0 + small * 16, 4);
        assert_eq!(c.state(dest(1)).unwrap().rto, small * 2);
        // a large RTO not updated for 4 RTOs: 1 s + RTO / 2
        let mut big = Cocoa::new(TransmissionParams::default(), 1);
        big.on_response(dest(3), t0, Duration::from_secs(20), 1);
        let r = big.state(dest(3)).unwrap().rto;
        assert!(r > Duration::from_secs(3), "{r:?}");
        big.on_give_up(dest(3), t0 + r * 4, 4);
        assert_eq!(
            big.state(dest(3)).unwrap().rto,
            Duration::from_secs(1) + r / 2
        );
        // and not before
        let mut fresh = Cocoa::new(TransmissionParams::default(), 1);
        fresh.on_response(dest(3), t0, Duration::from_secs(20), 1);
        fresh.on_give_up(dest(3), t0 + r * 4 - ms(1), 4);
        assert_eq!(fresh.state(dest(3)).unwrap().rto, r);
    }

    #[test]
    fn state_is_bounded_and_forgotten_when_unused() {
        let t0 = Instant::now();
        let mut c =
            Cocoa::with_limits(TransmissionParams::default(), 1, 3, Duration::from_secs(60));
        for p in 1..=4u16 {
            c.on_response(dest(p), t0 + ms(p as u64), ms(100), 0);
        }
        assert_eq!(c.destinations(), 3);
        assert!(c.state(dest(1)).is_none(), "least recently used went first");
        // unused for the forget period: blind again
        let later = t0 + Duration::from_secs(61);
        let t = c.initial_rto(dest(2), later, 1);
        assert!(t >= ms(2000), "{t:?}");
        assert!(!c.state(dest(2)).unwrap().has_estimate());
        assert_eq!(c.name(), "cocoa");
        assert_eq!(c.max_retransmit(dest(2)), 4);
    }
}
