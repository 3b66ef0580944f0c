//! One direction of a simulated link.
//!
//! Common random numbers: with independent losses, a packet's fate (lost or
//! not, and its jitter) is drawn from the link's seed, a hash of the
//! packet's bytes and how many identical packets the link carried before,
//! not from one stream shared by all packets in order. Two runs that differ
//! only in the algorithm under test (say, one sends an extra spurious
//! retransmission) then see the same fate for the same message, so their
//! difference measures the algorithms rather than how a different number of
//! packets shifted a random stream. Each packet's loss probability is still
//! exactly the configured rate. Bursty (Gilbert-Elliott) loss depends on the
//! sequence by nature and uses the model's own stream.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::loss::LossModel;

/// How a directed link behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Propagation and processing delay of every packet.
    pub delay: Duration,
    /// Each packet's delay varies uniformly in `delay ± jitter` (never
    /// below zero). Jitter may reorder packets, as on a real radio hop.
    pub jitter: Duration,
    /// Loss probability of each packet, 0..=1.
    pub loss: f64,
    /// Mean loss-burst length: 1 or less for independent losses, more for
    /// Gilbert-Elliott bursts with the same long-run rate.
    pub burst: f64,
    /// Serialisation rate in bits/s; 0 for none (infinitely fast).
    pub rate_bps: u64,
    /// Bytes added to each packet on the air (link, network and transport
    /// headers), counted by the serialisation rate.
    pub overhead_bytes: usize,
    /// Packets that may wait for the link (excluding the one being sent);
    /// more are dropped. Only meaningful with a rate.
    pub queue_limit: usize,
}

impl LinkConfig {
    /// A link with only a fixed delay: no jitter, loss, rate or queue limit.
    pub fn delay(delay: Duration) -> LinkConfig {
        LinkConfig {
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
            burst: 1.0,
            rate_bps: 0,
            overhead_bytes: 0,
            queue_limit: usize::MAX,
        }
    }
}

/// Counters of one directed link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets offered to the link.
    pub offered: u64,
    /// Packets that crossed it.
    pub carried: u64,
    /// Packets lost by the loss model.
    pub lost: u64,
    /// Packets dropped at a full queue.
    pub queue_drops: u64,
    /// Longest queue seen (packets waiting, excluding the one on the air).
    pub max_queue: usize,
}

pub(super) enum Fate {
    Arrives(Duration),
    Lost,
    QueueFull,
}

pub(super) struct Link {
    cfg: LinkConfig,
    /// The sequential model, for bursty loss only.
    bursty: Option<LossModel>,
    seed: u64,
    /// Copies of each distinct packet (by hash) offered so far.
    copies: HashMap<u64, u32>,
    /// When each packet accepted by the link finishes serialisation, oldest
    /// first; those still in the future are queued or on the air.
    departures: VecDeque<Duration>,
    pub(super) stats: LinkStats,
}

impl Link {
    pub(super) fn new(cfg: LinkConfig, seed: u64) -> Link {
        Link {
            cfg,
            bursty: (cfg.burst > 1.0).then(|| LossModel::new(cfg.loss, cfg.burst, seed)),
            seed,
            copies: HashMap::new(),
            departures: VecDeque::new(),
            stats: LinkStats::default(),
        }
    }

    /// Two uniform draws in [0, 1) for this copy of `bytes`.
    fn draws(&mut self, bytes: &[u8]) -> (f64, f64) {
        let h = hash(bytes);
        if self.copies.len() >= 1 << 20 {
            self.copies.clear();
        }
        let n = self.copies.entry(h).or_insert(0);
        *n += 1;
        let a = super::splitmix(self.seed ^ super::splitmix(h ^ u64::from(*n)));
        let b = super::splitmix(a);
        (unit(a), unit(b))
    }

    /// Offers `bytes` at `now`.
    pub(super) fn transmit(&mut self, now: Duration, bytes: &[u8]) -> Fate {
        let len = bytes.len();
        self.stats.offered += 1;
        let mut done = now;
        let bits = ((len + self.cfg.overhead_bytes) * 8) as u64;
        if let Some(tx_ns) = (bits * 1_000_000_000).checked_div(self.cfg.rate_bps) {
            while self.departures.front().is_some_and(|&d| d <= now) {
                self.departures.pop_front();
            }
            // one of the pending departures is on the air, the rest wait
            let waiting = self.departures.len().saturating_sub(1);
            if waiting >= self.cfg.queue_limit && !self.departures.is_empty() {
                self.stats.queue_drops += 1;
                return Fate::QueueFull;
            }
            self.stats.max_queue = self.stats.max_queue.max(self.departures.len());
            let tx = Duration::from_nanos(tx_ns);
            let start = self.departures.back().copied().unwrap_or(now).max(now);
            done = start + tx;
            self.departures.push_back(done);
        }
        let (u_loss, u_jitter) = self.draws(bytes);
        let lost = match &mut self.bursty {
            Some(m) => m.lose(),
            None => u_loss < self.cfg.loss,
        };
        // a lost packet still took its time on the air
        if lost {
            self.stats.lost += 1;
            return Fate::Lost;
        }
        self.stats.carried += 1;
        let j = self.cfg.jitter.as_secs_f64();
        let d = if j > 0.0 {
            let off = (2.0 * u_jitter - 1.0) * j;
            Duration::from_secs_f64((self.cfg.delay.as_secs_f64() + off).max(0.0))
        } else {
            self.cfg.delay
        };
        Fate::Arrives(done + d)
    }
}

/// FNV-1a over the bytes, then mixed.
fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    super::splitmix(h)
}

/// The top 53 bits as a uniform draw in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}
