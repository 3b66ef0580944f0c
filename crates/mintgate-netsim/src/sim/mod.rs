//! A network simulator in virtual time, deterministic for a given seed.
//!
//! Nodes are joined by directed links, each with a propagation delay, a
//! jitter, a serialisation rate with a bounded FIFO queue, and a loss model
//! ([`crate::loss::LossModel`], independent or Gilbert-Elliott). Packets are
//! routed hop by hop along shortest paths. A node may run an [`App`]: the
//! real sans-IO CoAP client and server of `mintgate-coap` run as apps
//! ([`coap`]), so what is simulated is the protocol code mintgate ships, not
//! a model of it. Nodes without an app only forward.
//!
//! Time is a [`Duration`] since the simulation's start; apps see it as an
//! [`Instant`] (`epoch + now`), the form the sans-IO cores take. Nothing
//! reads a clock, every random draw comes from a seeded stream, and events
//! at the same instant run in the order they were scheduled, so a run is a
//! function of its configuration and seed.
//!
//! Packets carry simulator metadata beside their bytes: a tag that an app
//! can set and that answers inherit, which is how the CoAP client app tells
//! which transmission of a request a response answers (and so counts
//! spurious retransmissions) without looking into the protocol.

pub mod chain;
pub mod coap;
mod link;

pub use link::{LinkConfig, LinkStats};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use link::Link;

/// Index of a node in a [`Sim`].
pub type NodeId = usize;

/// A datagram in flight.
#[derive(Clone, Debug)]
pub struct Packet {
    /// The sender's address.
    pub src: SocketAddr,
    /// The receiver's address.
    pub dst: SocketAddr,
    /// The UDP payload.
    pub bytes: Vec<u8>,
    /// Simulator metadata: set by the sending app, or inherited from the
    /// packet an answer was produced for.
    pub tag: u64,
}

/// What an app asks the simulator to send.
#[derive(Clone, Debug)]
pub struct Send {
    /// Destination address (any node's).
    pub dst: SocketAddr,
    /// The UDP payload.
    pub bytes: Vec<u8>,
    /// Delay before the packet enters the first link (processing time).
    pub after: Duration,
    /// Metadata carried with the packet.
    pub tag: u64,
}

/// Something running on a node: the simulated counterpart of a process with
/// one UDP socket.
pub trait App {
    /// A datagram addressed to this node arrived at `now`; push answers to
    /// `out`.
    fn on_packet(&mut self, now: Instant, pkt: &Packet, out: &mut Vec<Send>);
    /// The deadline returned by [`App::next_timeout`] was reached.
    fn on_timeout(&mut self, now: Instant, out: &mut Vec<Send>);
    /// When the app next needs [`App::on_timeout`], if ever.
    fn next_timeout(&mut self) -> Option<Instant>;
    /// Called once when the simulation starts.
    fn on_start(&mut self, now: Instant, out: &mut Vec<Send>) {
        self.on_timeout(now, out);
    }
    /// Whether the app has finished its work (the run may stop when every
    /// app with work is done).
    fn done(&self) -> bool {
        true
    }
    /// Downcasting, for reading an app's results after a run.
    fn as_any(&self) -> &dyn std::any::Any;
}

struct Node {
    addr: SocketAddr,
    app: Option<Box<dyn App>>,
    /// The instant of the live timer event, if any (older ones are stale).
    timer: Option<Duration>,
}

#[derive(Debug)]
enum Ev {
    /// A packet reaches `node` (its destination or a forwarding hop).
    Arrive(NodeId, Packet),
    /// A packet leaves `node`'s app after its processing delay.
    Emit(NodeId, Packet),
    /// `node`'s app timer.
    Timer(NodeId),
}

/// Counters of a whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Packets handed to the network by apps.
    pub sent: u64,
    /// Packets delivered to their destination app.
    pub delivered: u64,
    /// Packets lost on a link (the loss model).
    pub lost: u64,
    /// Packets dropped because a link's queue was full.
    pub queue_drops: u64,
    /// Packets with no route or no app at the destination.
    pub unroutable: u64,
}

/// The simulator: nodes, links, an event queue and a virtual clock.
pub struct Sim {
    epoch: Instant,
    now: Duration,
    seq: u64,
    events: BinaryHeap<Reverse<(Duration, u64)>>,
    payloads: HashMap<u64, Ev>,
    nodes: Vec<Node>,
    links: HashMap<(NodeId, NodeId), Link>,
    next_hop: Vec<Vec<Option<NodeId>>>,
    by_addr: HashMap<SocketAddr, NodeId>,
    stats: SimStats,
    seed: u64,
    scratch: Vec<Send>,
}

impl Sim {
    /// An empty network whose random streams derive from `seed`.
    pub fn new(seed: u64) -> Sim {
        Sim {
            epoch: Instant::now(),
            now: Duration::ZERO,
            seq: 0,
            events: BinaryHeap::new(),
            payloads: HashMap::new(),
            nodes: Vec::new(),
            links: HashMap::new(),
            next_hop: Vec::new(),
            by_addr: HashMap::new(),
            stats: SimStats::default(),
            seed,
            scratch: Vec::new(),
        }
    }

    /// Adds a node reachable at `addr`, running `app` (or only forwarding).
    pub fn add_node(&mut self, addr: SocketAddr, app: Option<Box<dyn App>>) -> NodeId {
        let id = self.nodes.len();
        assert!(
            self.by_addr.insert(addr, id).is_none(),
            "two simulated nodes share {addr}"
        );
        self.nodes.push(Node {
            addr,
            app,
            timer: None,
        });
        self.next_hop.clear();
        id
    }

    /// Joins `a` and `b` with a link in each direction, both configured as
    /// `cfg` (each direction with its own random streams).
    pub fn connect(&mut self, a: NodeId, b: NodeId, cfg: LinkConfig) {
        self.connect_one_way(a, b, cfg);
        self.connect_one_way(b, a, cfg);
    }

    /// Adds the directed link `from` -> `to`.
    pub fn connect_one_way(&mut self, from: NodeId, to: NodeId, cfg: LinkConfig) {
        let salt = (from as u64) << 32 | to as u64;
        let seed = splitmix(self.seed ^ splitmix(salt));
        self.links.insert((from, to), Link::new(cfg, seed));
        self.next_hop.clear();
    }

    /// The node's address.
    pub fn addr(&self, node: NodeId) -> SocketAddr {
        self.nodes[node].addr
    }

    /// The app on `node`, for reading results.
    pub fn app(&self, node: NodeId) -> Option<&dyn App> {
        self.nodes[node].app.as_deref()
    }

    /// The app on `node` as its concrete type.
    pub fn app_as<T: 'static>(&self, node: NodeId) -> Option<&T> {
        self.app(node).and_then(|a| a.as_any().downcast_ref::<T>())
    }

    /// Time elapsed in the simulation.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// The instant apps see for the simulation's start.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Run counters.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Counters of the directed link `from` -> `to`.
    pub fn link_stats(&self, from: NodeId, to: NodeId) -> Option<LinkStats> {
        self.links.get(&(from, to)).map(|l| l.stats)
    }

    /// Runs until every app reports [`App::done`] and nothing is left to
    /// happen, or until `limit` of virtual time has passed. Returns whether
    /// all apps finished.
    pub fn run(&mut self, limit: Duration) -> bool {
        if self.next_hop.is_empty() {
            self.route();
        }
        if self.now == Duration::ZERO && self.seq == 0 {
            for n in 0..self.nodes.len() {
                self.with_app(n, |app, now, out| app.on_start(now, out));
            }
        }
        while let Some(&Reverse((at, key))) = self.events.peek() {
            if self.all_done() {
                return true;
            }
            if at > limit {
                self.now = limit;
                return false;
            }
            self.events.pop();
            self.now = at;
            let Some(ev) = self.payloads.remove(&key) else {
                continue;
            };
            match ev {
                Ev::Timer(n) => {
                    if self.nodes[n].timer == Some(at) {
                        self.nodes[n].timer = None;
                        self.with_app(n, |app, now, out| app.on_timeout(now, out));
                    }
                }
                Ev::Emit(n, pkt) => self.forward(n, pkt),
                Ev::Arrive(n, pkt) => {
                    if pkt.dst == self.nodes[n].addr {
                        if self.nodes[n].app.is_some() {
                            self.stats.delivered += 1;
                            self.with_app(n, |app, now, out| app.on_packet(now, &pkt, out));
                        } else {
                            self.stats.unroutable += 1;
                        }
                    } else {
                        self.forward(n, pkt);
                    }
                }
            }
        }
        self.all_done()
    }

    fn all_done(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| n.app.as_ref().is_none_or(|a| a.done()))
    }

    fn schedule(&mut self, at: Duration, ev: Ev) {
        let key = self.seq;
        self.seq += 1;
        self.payloads.insert(key, ev);
        self.events.push(Reverse((at, key)));
    }

    /// Calls into node `n`'s app, then turns what it asked for into events
    /// and re-arms its timer.
    fn with_app(&mut self, n: NodeId, f: impl FnOnce(&mut dyn App, Instant, &mut Vec<Send>)) {
        let now = self.epoch + self.now;
        let mut out = std::mem::take(&mut self.scratch);
        let Some(app) = self.nodes[n].app.as_deref_mut() else {
            return;
        };
        f(app, now, &mut out);
        let next = app.next_timeout();
        let src = self.nodes[n].addr;
        for s in out.drain(..) {
            self.stats.sent += 1;
            let pkt = Packet {
                src,
                dst: s.dst,
                bytes: s.bytes,
                tag: s.tag,
            };
            self.schedule(self.now + s.after, Ev::Emit(n, pkt));
        }
        self.scratch = out;
        if let Some(t) = next {
            let at = t.saturating_duration_since(self.epoch).max(self.now);
            if self.nodes[n].timer != Some(at) {
                self.nodes[n].timer = Some(at);
                self.schedule(at, Ev::Timer(n));
            }
        } else {
            self.nodes[n].timer = None;
        }
    }

    /// Puts `pkt`, now at node `n`, on the link towards its destination.
    fn forward(&mut self, n: NodeId, pkt: Packet) {
        let Some(&dst) = self.by_addr.get(&pkt.dst) else {
            self.stats.unroutable += 1;
            return;
        };
        if dst == n {
            // addressed to itself: deliver at once
            self.schedule(self.now, Ev::Arrive(n, pkt));
            return;
        }
        let Some(hop) = self.next_hop[n][dst] else {
            self.stats.unroutable += 1;
            return;
        };
        let Some(link) = self.links.get_mut(&(n, hop)) else {
            self.stats.unroutable += 1;
            return;
        };
        match link.transmit(self.now, &pkt.bytes) {
            link::Fate::Arrives(at) => self.schedule(at, Ev::Arrive(hop, pkt)),
            link::Fate::Lost => self.stats.lost += 1,
            link::Fate::QueueFull => self.stats.queue_drops += 1,
        }
    }

    /// Shortest-path next hops (breadth-first, ties to the lower node id, so
    /// routes are deterministic).
    fn route(&mut self) {
        let n = self.nodes.len();
        let mut adj = vec![Vec::new(); n];
        for &(a, b) in self.links.keys() {
            adj[a].push(b);
        }
        for v in &mut adj {
            v.sort_unstable();
        }
        self.next_hop = vec![vec![None; n]; n];
        for src in 0..n {
            // first hop on the way from src to each node
            let mut first: Vec<Option<NodeId>> = vec![None; n];
            let mut seen = vec![false; n];
            seen[src] = true;
            let mut q = VecDeque::new();
            for &b in &adj[src] {
                if !seen[b] {
                    seen[b] = true;
                    first[b] = Some(b);
                    q.push_back(b);
                }
            }
            while let Some(v) = q.pop_front() {
                for &w in &adj[v] {
                    if !seen[w] {
                        seen[w] = true;
                        first[w] = first[v];
                        q.push_back(w);
                    }
                }
            }
            self.next_hop[src] = first;
        }
    }
}

/// A 64-bit mixing function (splitmix64's finaliser) for deriving
/// independent seeds.
pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod endpoint_tests;
#[cfg(test)]
mod tests;
