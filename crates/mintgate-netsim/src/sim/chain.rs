//! The paper's network (paper 002, Fig. 6), ready to run: CoAP clients
//! behind a border router, then a line of CoAP servers one radio hop apart.
//!
//! ```text
//!  client(s) --serial-- border router --radio-- server 2 --radio-- server 3 --radio-- server 4
//! ```
//!
//! The paper ran this in Cooja (Z1 motes 45 m apart, 802.15.4, the client
//! behind the border router's serial line). Here each radio hop is a
//! [`LinkConfig`] with a delay and jitter (channel access and processing),
//! a 250 kbit/s serialisation rate with the headers an 802.15.4/6LoWPAN
//! frame adds, a bounded queue, and loss. The clients' links to the border
//! router are fast and lossless.
//!
//! What "`loss` %" means: a message crossing the whole chain, border router
//! to the farthest server or back, is lost with that probability; it is
//! spread evenly over the radio hops (each hop loses `1 - (1 - loss)^(1/h)`).
//! A request and its response both cross it, so an exchange fails and is
//! retransmitted with probability about `1 - (1 - loss)^2`.
//!
//! Calibration (documented here, checked by the lab): with the defaults,
//! RFC 7252's Basic controller sees a mean RTT of about 330 ms at 5 % loss,
//! the paper's Table 1 (3320.8 ms over 10 intervals). The base RTT of the
//! chain without loss is about 30 ms; the rest is Basic's 2-3 s timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use mintgate_coap::rto::Algorithm;

use super::coap::{CoapClient, CoapServer, Outcome, ServerStats, Workload};
use super::{LinkConfig, NodeId, Sim, SimStats};

/// The scenario's settings.
#[derive(Clone, Debug)]
pub struct ChainConfig {
    /// CoAP servers in the line after the border router (the paper: 3).
    pub servers: usize,
    /// Which server the clients ask, 1-based from the border router (the
    /// paper's farthest, 3).
    pub target: usize,
    /// End-to-end loss across all radio hops to the farthest server, per
    /// direction, 0..=1.
    pub loss: f64,
    /// Mean loss-burst length per hop (1: independent).
    pub burst: f64,
    /// Delay of each radio hop (channel access, processing).
    pub hop_delay: Duration,
    /// Jitter of each radio hop, uniform in ± this.
    pub hop_jitter: Duration,
    /// Radio bit rate (802.15.4: 250 kbit/s).
    pub radio_bps: u64,
    /// Bytes each frame adds to the CoAP message on the air.
    pub frame_overhead: usize,
    /// Frames that may wait at a radio hop.
    pub queue_limit: usize,
    /// Delay of the clients' (serial) link to the border router.
    pub serial_delay: Duration,
    /// Time a server takes to answer a new request.
    pub processing: Duration,
    /// Clients sharing the chain.
    pub clients: usize,
    /// Requests each client completes.
    pub requests: usize,
    /// The clients' congestion control.
    pub algorithm: Algorithm,
    /// Seed of every random stream in the run.
    pub seed: u64,
}

impl Default for ChainConfig {
    fn default() -> Self {
        ChainConfig {
            servers: 3,
            target: 3,
            loss: 0.05,
            burst: 1.0,
            hop_delay: Duration::from_micros(3_000),
            hop_jitter: Duration::from_micros(2_500),
            radio_bps: 250_000,
            frame_overhead: 31,
            queue_limit: 8,
            serial_delay: Duration::from_millis(1),
            processing: Duration::from_millis(2),
            clients: 1,
            requests: 1000,
            algorithm: Algorithm::Basic,
            seed: 1,
        }
    }
}

/// What a run of the chain produced.
#[derive(Clone, Debug)]
pub struct ChainRun {
    /// Per client, its completed requests in completion order.
    pub outcomes: Vec<Vec<Outcome>>,
    /// Per client: retransmissions made (all), spurious ones, requests given
    /// up.
    pub retransmissions: Vec<u64>,
    /// Per client, spurious retransmissions.
    pub spurious: Vec<u64>,
    /// The target server's counters.
    pub server: ServerStats,
    /// The network's counters.
    pub net: SimStats,
    /// Virtual time the run took.
    pub elapsed: Duration,
    /// Whether every client finished within the time limit.
    pub finished: bool,
}

impl ChainRun {
    /// Mean RTT over every completed request of every client.
    pub fn mean_rtt(&self) -> Duration {
        let (sum, n) = self
            .outcomes
            .iter()
            .flatten()
            .fold((Duration::ZERO, 0u32), |(s, n), o| (s + o.rtt, n + 1));
        if n == 0 {
            Duration::ZERO
        } else {
            sum / n
        }
    }
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8], 5683))
}

fn client_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 1, i as u8], 40_000 + i as u16))
}

/// Builds the network of `cfg`; returns it with the client nodes and the
/// target server node.
pub fn build(cfg: &ChainConfig) -> (Sim, Vec<NodeId>, NodeId) {
    assert!(cfg.servers >= 1 && (1..=cfg.servers).contains(&cfg.target));
    assert!(cfg.clients >= 1 && cfg.clients < 250 && cfg.servers < 250);
    let mut sim = Sim::new(cfg.seed);
    let br = sim.add_node(addr(1), None);
    let mut prev = br;
    let mut target = br;
    let hop_loss = 1.0 - (1.0 - cfg.loss.clamp(0.0, 1.0)).powf(1.0 / cfg.servers as f64);
    let radio = LinkConfig {
        delay: cfg.hop_delay,
        jitter: cfg.hop_jitter,
        loss: hop_loss,
        burst: cfg.burst,
        rate_bps: cfg.radio_bps,
        overhead_bytes: cfg.frame_overhead,
        queue_limit: cfg.queue_limit,
    };
    for s in 1..=cfg.servers {
        let node = sim.add_node(
            addr(s + 1),
            Some(Box::new(CoapServer::sensor(cfg.processing))),
        );
        sim.connect(prev, node, radio);
        if s == cfg.target {
            target = node;
        }
        prev = node;
    }
    let dest = sim.addr(target);
    let mut clients = Vec::with_capacity(cfg.clients);
    for c in 0..cfg.clients {
        let work = Workload::sequential(dest, "sensor", cfg.requests);
        let seed = super::splitmix(cfg.seed.wrapping_add(c as u64).wrapping_mul(31) ^ 0xc11e);
        let node = sim.add_node(
            client_addr(c + 1),
            Some(Box::new(CoapClient::new(work, cfg.algorithm, seed))),
        );
        sim.connect(node, br, LinkConfig::delay(cfg.serial_delay));
        clients.push(node);
    }
    (sim, clients, target)
}

/// Builds and runs the chain until every client has completed its requests
/// (or a generous limit of virtual time passes).
pub fn run(cfg: &ChainConfig) -> ChainRun {
    let (mut sim, clients, target) = build(cfg);
    // each request is repeated until it succeeds; even at 100 % loss the
    // run ends at this limit
    let limit = Duration::from_secs(600) * cfg.requests.max(1) as u32;
    let finished = sim.run(limit);
    let mut run = ChainRun {
        outcomes: Vec::new(),
        retransmissions: Vec::new(),
        spurious: Vec::new(),
        server: sim
            .app_as::<CoapServer>(target)
            .map(|s| s.stats())
            .unwrap_or_default(),
        net: sim.stats(),
        elapsed: sim.now(),
        finished,
    };
    for &c in &clients {
        if let Some(app) = sim.app_as::<CoapClient>(c) {
            run.outcomes.push(app.outcomes().to_vec());
            run.retransmissions.push(app.retransmissions());
            run.spurious.push(app.spurious());
        }
    }
    run
}
