//! Retransmission-timeout (RTO) controllers for confirmable messages.
//!
//! Modelled on quinn-proto's congestion-controller trait: one trait,
//! [`RtoController`], and one file per algorithm. The client endpoint
//! ([`crate::client::Client`]) owns one controller and asks it, per
//! destination, how long to wait before the first retransmission, how to back
//! off after each one, how many retransmissions to make and how many
//! exchanges may be outstanding at once; it reports every outcome back
//! (an acknowledgement with its round-trip time, or giving up).
//!
//! Every call carries the destination and an `Instant` supplied by the caller,
//! so a controller can keep per-destination estimators and age them (CoCoA,
//! draft-ietf-core-cocoa-03) or aggregate samples over windows of exchanges or
//! time (Adaptive RTO) without reading a clock. Randomness comes from an RNG
//! the controller owns, seeded at construction, so runs are reproducible.
//!
//! Algorithms:
//! - [`Basic`]: RFC 7252 section 4.8, the fixed exponential back-off.
//! - [`Cocoa`]: draft-ietf-core-cocoa-03, strong/weak RTT estimators,
//!   variable back-off, aging.
//! - [`Adaptive`]: Adaptive RTO (as paper 002 uses it), windowed mean RTT
//!   with the loss rate as the EWMA weight.

mod adaptive;
mod basic;
mod cocoa;
mod table;

pub use adaptive::{Adaptive, AdaptiveState, ALPHA_MAX, ALPHA_MIN};
pub use basic::Basic;
pub use cocoa::{backoff_factor, Cocoa, DestState, Estimator, NonQuota};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The congestion-control algorithms, by name: `basic`, `cocoa`,
/// `adaptive` (what `--cc` and the configuration accept).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// RFC 7252 section 4.8 ([`Basic`]).
    #[default]
    Basic,
    /// draft-ietf-core-cocoa-03 ([`Cocoa`]).
    Cocoa,
    /// Adaptive RTO ([`Adaptive`]).
    Adaptive,
}

impl Algorithm {
    /// All of them, in the order reports list them.
    pub const ALL: [Algorithm; 3] = [Algorithm::Basic, Algorithm::Cocoa, Algorithm::Adaptive];

    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Basic => "basic",
            Algorithm::Cocoa => "cocoa",
            Algorithm::Adaptive => "adaptive",
        }
    }

    /// A controller of this kind with RFC 7252 `params`, its randomness
    /// drawn from `seed`.
    pub fn controller(self, params: TransmissionParams, seed: u64) -> Box<dyn RtoController> {
        match self {
            Algorithm::Basic => Box::new(Basic::new(params, seed)),
            Algorithm::Cocoa => Box::new(Cocoa::new(params, seed)),
            Algorithm::Adaptive => Box::new(Adaptive::new(params, seed)),
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Algorithm, String> {
        match s.to_ascii_lowercase().as_str() {
            "basic" => Ok(Algorithm::Basic),
            "cocoa" => Ok(Algorithm::Cocoa),
            "adaptive" => Ok(Algorithm::Adaptive),
            _ => Err(format!(
                "unknown congestion control `{s}` (expected basic, cocoa or adaptive)"
            )),
        }
    }
}

/// Decides the retransmission timeouts of confirmable messages.
///
/// Call protocol (what the client guarantees):
/// 1. When a CON exchange to `dest` starts (its first transmission),
///    [`initial_rto`](Self::initial_rto) gives the timeout before the first
///    retransmission. `in_flight` counts the outstanding exchanges to `dest`
///    including the one being started, so it is at least 1 (CoCoA's blind RTO
///    scales with it).
/// 2. Each time that timeout expires and fewer than
///    [`max_retransmit`](Self::max_retransmit) retransmissions have been
///    made, the message is retransmitted and
///    [`backoff`](Self::backoff) gives the timeout that follows retransmission
///    number `retransmissions` (1 for the first), from the previous timeout.
/// 3. The exchange ends at the message layer with exactly one of:
///    [`on_response`](Self::on_response), when an ACK (empty or piggybacked)
///    or a response arrives, with the time since the *first* transmission and
///    the number of retransmissions made; or
///    [`on_give_up`](Self::on_give_up), when the timeout after the last
///    allowed retransmission expires. A Reset, or an exchange abandoned by the
///    application, reports neither.
/// 4. At most [`nstart`](Self::nstart) exchanges to one destination are
///    outstanding at a time; the client queues the rest.
///
/// Non-confirmable exchanges never reach the controller.
pub trait RtoController: Send {
    /// Timeout before the first retransmission of a CON starting `now`.
    fn initial_rto(&mut self, dest: SocketAddr, now: Instant, in_flight: usize) -> Duration;

    /// Timeout after retransmission number `retransmissions` (1-based), given
    /// the timeout `prev_rto` that just expired.
    fn backoff(
        &mut self,
        dest: SocketAddr,
        now: Instant,
        prev_rto: Duration,
        retransmissions: u32,
    ) -> Duration;

    /// An exchange to `dest` was acknowledged `rtt` after its first
    /// transmission, having been retransmitted `retransmissions` times.
    fn on_response(&mut self, dest: SocketAddr, now: Instant, rtt: Duration, retransmissions: u32);

    /// An exchange to `dest` got no acknowledgement after `retransmissions`
    /// retransmissions (normally `max_retransmit(dest)`).
    fn on_give_up(&mut self, dest: SocketAddr, now: Instant, retransmissions: u32);

    /// Retransmissions made before giving up on a CON to `dest`.
    fn max_retransmit(&self, dest: SocketAddr) -> u32;

    /// Outstanding exchanges allowed to `dest` at once (at least 1).
    fn nstart(&self, dest: SocketAddr) -> usize;

    /// Short name for logs and reports, e.g. `"basic"`.
    fn name(&self) -> &'static str;

    /// The least time between two non-confirmable requests to `dest`, where
    /// the algorithm paces them (CoCoA: one per RTO); the client holds a
    /// NON back in its queue until then. `None`: unpaced.
    fn non_interval(&self, _dest: SocketAddr) -> Option<Duration> {
        None
    }

    /// The estimated RTO towards `dest`, for reports, where the algorithm
    /// keeps one (Basic does not).
    fn current_rto(&self, _dest: SocketAddr) -> Option<Duration> {
        None
    }

    /// The EWMA weight last used for `dest`, where the algorithm adapts it
    /// (Adaptive RTO's alpha), for reports.
    fn ewma_weight(&self, _dest: SocketAddr) -> Option<f64> {
        None
    }
}

/// The transmission parameters of RFC 7252 section 4.8, with the derived
/// time values of section 4.8.2 as methods.
///
/// The defaults are the RFC's. Changing `ack_timeout`, `ack_random_factor`,
/// `max_retransmit` or `max_latency` changes the derived values accordingly,
/// which is what the RFC asks of an implementation that adjusts them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransmissionParams {
    /// ACK_TIMEOUT: base timeout before the first retransmission (2 s).
    pub ack_timeout: Duration,
    /// ACK_RANDOM_FACTOR: the initial timeout is drawn from
    /// `[ack_timeout, ack_timeout * ack_random_factor]` (1.5; must be >= 1).
    pub ack_random_factor: f64,
    /// MAX_RETRANSMIT: retransmissions before giving up (4).
    pub max_retransmit: u32,
    /// NSTART: outstanding interactions per destination (1).
    pub nstart: usize,
    /// DEFAULT_LEISURE: spread of multicast responses (5 s).
    pub default_leisure: Duration,
    /// PROBING_RATE: average data rate towards an unresponsive peer, in
    /// bytes per second (1).
    pub probing_rate: u32,
    /// MAX_LATENCY: longest time a datagram is expected to be in flight
    /// (100 s).
    pub max_latency: Duration,
    /// PROCESSING_DELAY: time a node takes to turn a CON into an ACK
    /// (ACK_TIMEOUT by default).
    pub processing_delay: Duration,
}

impl Default for TransmissionParams {
    fn default() -> Self {
        TransmissionParams {
            ack_timeout: Duration::from_secs(2),
            ack_random_factor: 1.5,
            max_retransmit: 4,
            nstart: 1,
            default_leisure: Duration::from_secs(5),
            probing_rate: 1,
            max_latency: Duration::from_secs(100),
            processing_delay: Duration::from_secs(2),
        }
    }
}

impl TransmissionParams {
    /// RFC 7252's first timeout of a CON: `ack_timeout` times a random
    /// factor in `[1, ack_random_factor]`. A factor of 1 (or a nonsensical
    /// one below it, or NaN) means no randomisation.
    pub fn initial_timeout(&self, rng: &mut impl rand::RngExt) -> Duration {
        let factor = self.ack_random_factor;
        if factor > 1.0 && factor.is_finite() {
            self.ack_timeout.mul_f64(rng.random_range(1.0..=factor))
        } else {
            self.ack_timeout
        }
    }

    /// `ack_timeout * (2^max_retransmit - 1) * ack_random_factor`
    /// (45 s with the defaults): the longest time from the first to the last
    /// transmission of a CON.
    pub fn max_transmit_span(&self) -> Duration {
        self.ack_timeout
            .mul_f64(((1u64 << self.max_retransmit.min(32)) - 1) as f64 * self.ack_random_factor)
    }

    /// `ack_timeout * (2^(max_retransmit + 1) - 1) * ack_random_factor`
    /// (93 s with the defaults): the longest time from the first
    /// transmission of a CON until the sender gives up.
    pub fn max_transmit_wait(&self) -> Duration {
        self.ack_timeout.mul_f64(
            ((1u64 << (self.max_retransmit.min(32) + 1)) - 1) as f64 * self.ack_random_factor,
        )
    }

    /// `2 * max_latency + processing_delay` (202 s): the longest round trip.
    pub fn max_rtt(&self) -> Duration {
        2 * self.max_latency + self.processing_delay
    }

    /// `max_transmit_span + 2 * max_latency + processing_delay` (247 s): how
    /// long a CON's message ID must not be reused, and how long a receiver
    /// remembers it for de-duplication.
    pub fn exchange_lifetime(&self) -> Duration {
        self.max_transmit_span() + 2 * self.max_latency + self.processing_delay
    }

    /// `max_transmit_span + max_latency` (145 s): the same for a NON.
    pub fn non_lifetime(&self) -> Duration {
        self.max_transmit_span() + self.max_latency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_values_match_rfc7252_section_4_8_2() {
        let p = TransmissionParams::default();
        assert_eq!(p.max_transmit_span(), Duration::from_secs(45));
        assert_eq!(p.max_transmit_wait(), Duration::from_secs(93));
        assert_eq!(p.max_rtt(), Duration::from_secs(202));
        assert_eq!(p.exchange_lifetime(), Duration::from_secs(247));
        assert_eq!(p.non_lifetime(), Duration::from_secs(145));
    }

    #[test]
    fn derived_values_follow_changed_params() {
        let p = TransmissionParams {
            ack_timeout: Duration::from_secs(1),
            ack_random_factor: 1.0,
            max_retransmit: 2,
            ..TransmissionParams::default()
        };
        assert_eq!(p.max_transmit_span(), Duration::from_secs(3));
        assert_eq!(p.max_transmit_wait(), Duration::from_secs(7));
        assert_eq!(p.non_lifetime(), Duration::from_secs(103));
    }
}
