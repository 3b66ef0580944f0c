//! mintgate's sans-IO CoAP client and server as simulator apps.
//!
//! [`CoapServer`] runs mintgate's server endpoint
//! (`mintgate_coap::server::Endpoint`: classification, (peer, MID)
//! de-duplication with byte-for-byte replay, separate responses, CON
//! retransmissions, Observe, address validation) and its router, with a
//! fixed processing time per request. [`CoapClient`] drives
//! `mintgate_coap::client::Client`, with the chosen RTO controller, through
//! a workload of CON or NON GETs and records one [`Outcome`] per request.
//!
//! Spurious retransmissions: every CON transmission is tagged with its
//! message ID and its index among that message's transmissions; the server
//! app answers with the tag of the copy it answers, so when a response
//! completes an exchange the client app knows which transmission got
//! through. Retransmissions sent after that one were not needed: they are
//! counted as spurious.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mintgate_buf::{PartitionConfig, Pool};
use mintgate_coap::client::{Client, ClientConfig, Event, ExchangeId, Request};
use mintgate_coap::rto::{Algorithm, TransmissionParams};
use mintgate_coap::server::{self, Endpoint, EndpointConfig, Incoming, Responded, Router, Ticket};
use mintgate_coap::wire::{Code, MessageType, OptionNumber, Packet as CoapPacket};

use super::{App, Packet, Send};

/// Counters of a [`CoapServer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests handled (first copies).
    pub requests: u64,
    /// Duplicate CONs answered from the de-duplication cache.
    pub replays: u64,
    /// Duplicates dropped (NON, or CON still in progress).
    pub duplicates: u64,
    /// Datagrams dropped unanswered (malformed, misplaced, no buffer).
    pub dropped: u64,
}

/// A request being processed: ready at, the request, its ticket, its tag.
type Working = (Instant, Vec<u8>, Ticket, u64);

/// Requests in processing at once, at most (one endpoint handler slot
/// each).
const SLOTS: usize = 4096;

/// A CoAP server node: mintgate's server endpoint behind a simulated socket.
pub struct CoapServer {
    router: Router,
    endpoint: std::sync::Arc<Endpoint>,
    processing: Duration,
    next_slot: usize,
    /// Requests being processed, in ready order (the processing time is the
    /// same for all).
    working: VecDeque<Working>,
    stats: ServerStats,
}

impl CoapServer {
    /// A server with `router`, answering each new request after
    /// `processing` (a sensor read, say); duplicates are answered at once.
    /// Every answer is piggybacked, however long the processing (as the
    /// papers' servers answered): no empty ACK and separate response.
    pub fn new(router: Router, processing: Duration) -> CoapServer {
        let cfg = EndpointConfig {
            separate_after: Duration::from_secs(86_400),
            handler_slots: SLOTS,
            ..EndpointConfig::default()
        };
        CoapServer::with_config(router, processing, cfg)
    }

    /// [`CoapServer::new`] with the endpoint's settings. Requests in
    /// processing take the endpoint's `handler_slots` in turn: keep it
    /// above the requests in processing at once (every slot costs a little
    /// on every event, as the endpoint's timers look at all of them).
    pub fn with_config(
        router: Router,
        processing: Duration,
        mut cfg: EndpointConfig,
    ) -> CoapServer {
        cfg.dedup_capacity = cfg.dedup_capacity.min(4096);
        let pool = Pool::new(&[PartitionConfig {
            block_size: 1280,
            blocks: 256,
        }]);
        // the simulation's clock starts at the epoch the simulator picks;
        // Echo timestamps only need a fixed start
        let endpoint = std::sync::Arc::new(Endpoint::new(cfg, pool.clone(), Instant::now()));
        // cached answers hold pool blocks: when the pool runs dry the oldest
        // give theirs back, as in the gateway
        let weak = std::sync::Arc::downgrade(&endpoint);
        pool.set_reclaimer(move || weak.upgrade().map_or(0, |e| e.reclaim(64)));
        CoapServer {
            router,
            endpoint,
            processing,
            next_slot: 0,
            working: VecDeque::new(),
            stats: ServerStats::default(),
        }
    }

    /// A server with one resource, `/sensor`, answering `GET` with a short
    /// text reading.
    pub fn sensor(processing: Duration) -> CoapServer {
        let mut r = Router::new();
        r.add(
            server::Resource::new("sensor")
                .attr("rt", "temperature")
                .get(|_, rb| {
                    rb.content_format(mintgate_coap::wire::ContentFormat::TEXT_PLAIN)
                        .static_payload(b"21.5");
                }),
        )
        .expect("a fresh router has no paths");
        CoapServer::new(r, processing)
    }

    /// The counters.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// The endpoint (its counters, observers, tables).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The resource at `path` changed: its observers are notified now.
    pub fn notify(&mut self, now: Instant, path: &str, out: &mut Vec<Send>) {
        let mut ts = Vec::new();
        self.endpoint.notify(now, &self.router, path, &mut ts);
        for t in ts {
            out.push(Send {
                dst: t.peer,
                bytes: t.datagram.to_vec(),
                after: Duration::ZERO,
                tag: 0,
            });
        }
    }
}

impl App for CoapServer {
    fn on_packet(&mut self, now: Instant, pkt: &Packet, out: &mut Vec<Send>) {
        let answer = match self.endpoint.handle_datagram(now, pkt.src, 0, &pkt.bytes) {
            Incoming::Request { .. } => {
                let Ok(p) = CoapPacket::new_checked(&pkt.bytes[..]) else {
                    self.stats.dropped += 1;
                    return;
                };
                self.stats.requests += 1;
                let slot = self.next_slot;
                self.next_slot = (self.next_slot + 1) % self.endpoint.config().handler_slots.max(1);
                let ticket = self.endpoint.begin(slot, now, pkt.src, 0, &p, false);
                // a duplicate arriving meanwhile finds it in progress (and
                // is dropped), as in the gateway
                self.working
                    .push_back((now + self.processing, pkt.bytes.clone(), ticket, pkt.tag));
                self.on_timeout(now, out);
                return;
            }
            Incoming::Duplicate(t) => {
                match t {
                    Some(_) => self.stats.replays += 1,
                    None => self.stats.duplicates += 1,
                }
                t
            }
            Incoming::Malformed(t) | Incoming::Ignored(t) => {
                if t.is_none() {
                    self.stats.dropped += 1;
                }
                t
            }
            Incoming::Consumed => None,
        };
        if let Some(t) = answer {
            out.push(Send {
                dst: pkt.src,
                bytes: t.datagram.to_vec(),
                after: Duration::ZERO,
                tag: pkt.tag,
            });
        }
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Vec<Send>) {
        while self.working.front().is_some_and(|w| w.0 <= now) {
            let Some((_, bytes, ticket, tag)) = self.working.pop_front() else {
                break;
            };
            let Ok(p) = CoapPacket::new_checked(&bytes[..]) else {
                continue;
            };
            // As the lab's mintgate server takes these steps (mintgate-lab's
            // buffers/servers.rs): see the note there.
            let req = server::Request {
                peer: ticket.peer(),
                packet: &p,
                identity: None,
            };
            let handled = self.endpoint.process(now, &self.router, &req);
            match self
                .endpoint
                .respond(now, ticket, &self.router, &req, handled)
            {
                Responded::Send(t) => out.push(Send {
                    dst: t.peer,
                    bytes: t.datagram.to_vec(),
                    after: Duration::ZERO,
                    tag,
                }),
                Responded::Silent => {}
                Responded::Exhausted => self.stats.dropped += 1,
            }
        }
        self.endpoint.handle_timeout(now);
        while let Some(t) = self.endpoint.poll_transmit() {
            out.push(Send {
                dst: t.peer,
                bytes: t.datagram.to_vec(),
                after: Duration::ZERO,
                tag: 0,
            });
        }
    }

    fn next_timeout(&mut self) -> Option<Instant> {
        let w = self.working.front().map(|w| w.0);
        match (w, self.endpoint.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What a [`CoapClient`] does.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The server.
    pub dest: SocketAddr,
    /// The Uri-Path, `/`-separated, e.g. `sensor`.
    pub path: String,
    /// Requests to complete.
    pub requests: usize,
    /// Requests the application keeps outstanding (the client's NSTART
    /// still limits what is on the wire).
    pub concurrency: usize,
    /// CON (retransmitted) or NON requests.
    pub confirmable: bool,
    /// When the first request is made, after the simulation's start.
    pub start_after: Duration,
    /// Pause between a completion and the next request.
    pub gap: Duration,
    /// Issue a request again after it timed out (the paper sends each
    /// request until it succeeds); otherwise count it as failed.
    pub retry_timeouts: bool,
}

impl Workload {
    /// `requests` sequential CON GETs of `path` on `dest`, each repeated
    /// until it succeeds.
    pub fn sequential(dest: SocketAddr, path: &str, requests: usize) -> Workload {
        Workload {
            dest,
            path: path.to_string(),
            requests,
            concurrency: 1,
            confirmable: true,
            start_after: Duration::ZERO,
            gap: Duration::ZERO,
            retry_timeouts: true,
        }
    }
}

/// One completed request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Which request of the workload (0-based).
    pub index: usize,
    /// When its successful exchange began (first transmission), since the
    /// simulation's start.
    pub started: Duration,
    /// Round-trip time of the successful exchange, from its first
    /// transmission.
    pub rtt: Duration,
    /// Retransmissions made by the successful exchange.
    pub retransmissions: u32,
    /// Of those, retransmissions sent after the copy that got through: not
    /// needed.
    pub spurious: u32,
    /// Exchanges that timed out before this one succeeded.
    pub timeouts: u32,
    /// The controller's RTO estimate for the destination after the exchange
    /// (CoCoA, Adaptive).
    pub rto: Option<Duration>,
    /// Adaptive RTO's alpha after the exchange.
    pub alpha: Option<f64>,
}

struct Live {
    index: usize,
    timeouts: u32,
    mid: Option<u16>,
}

/// A CoAP client node: `mintgate_coap::client::Client` running a
/// [`Workload`].
pub struct CoapClient {
    client: Client,
    work: Workload,
    epoch: Option<Instant>,
    next_index: usize,
    live: HashMap<ExchangeId, Live>,
    /// Requests waiting to be (re)issued: (index, earlier timeouts, not
    /// before).
    pending: VecDeque<(usize, u32, Instant)>,
    /// Transmissions so far per CON message ID.
    tx_count: HashMap<u16, u32>,
    outcomes: Vec<Outcome>,
    failed: usize,
    retransmissions: u64,
    spurious: u64,
}

impl CoapClient {
    /// A client using congestion control `algorithm`, all its randomness
    /// from `seed`.
    pub fn new(work: Workload, algorithm: Algorithm, seed: u64) -> CoapClient {
        let params = TransmissionParams::default();
        let rto = algorithm.controller(params, super::splitmix(seed ^ 0x5eed));
        let client = Client::new(ClientConfig::new(params), rto, seed);
        CoapClient {
            client,
            work,
            epoch: None,
            next_index: 0,
            live: HashMap::new(),
            pending: VecDeque::new(),
            tx_count: HashMap::new(),
            outcomes: Vec::new(),
            failed: 0,
            retransmissions: 0,
            spurious: 0,
        }
    }

    /// Completed requests, in completion order.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// Requests given up (timed out, with retries off).
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// All retransmissions made, including those of exchanges that timed
    /// out.
    pub fn retransmissions(&self) -> u64 {
        self.retransmissions
    }

    /// Retransmissions that were not needed (see the module docs).
    pub fn spurious(&self) -> u64 {
        self.spurious
    }

    /// The underlying client's counters.
    pub fn client_stats(&self) -> mintgate_coap::client::ClientStats {
        self.client.stats()
    }

    fn request(&self) -> Request {
        Request {
            confirmable: self.work.confirmable,
            code: Code::GET,
            options: self
                .work
                .path
                .split('/')
                .filter(|s| !s.is_empty())
                .map(|s| (OptionNumber::URI_PATH, s.as_bytes().to_vec()))
                .collect(),
            payload: Vec::new(),
        }
    }

    /// Issues whatever the workload allows now, then moves datagrams and
    /// events until both are drained.
    fn pump(&mut self, now: Instant, mut answered_tag: Option<u64>, out: &mut Vec<Send>) {
        loop {
            while let Some(&(index, timeouts, at)) = self.pending.front() {
                if at > now {
                    break;
                }
                self.pending.pop_front();
                match self.client.request(now, self.work.dest, self.request()) {
                    Ok(id) => {
                        let live = Live {
                            index,
                            timeouts,
                            mid: None,
                        };
                        self.live.insert(id, live);
                    }
                    Err(_) => self.failed += 1,
                }
            }
            let mut progressed = false;
            while let Some(t) = self.client.poll_transmit(now) {
                progressed = true;
                let mut tag = 0;
                if let Ok(p) = CoapPacket::new_checked(&t.bytes[..]) {
                    if p.msg_type() == MessageType::Con && p.code().is_request() {
                        let n = self.tx_count.entry(p.message_id()).or_insert(0);
                        *n += 1;
                        if *n > 1 {
                            self.retransmissions += 1;
                        }
                        // tag 0 means "unknown": transmission indexes start at 1
                        tag = (u64::from(p.message_id()) << 32) | u64::from(*n);
                        // the first transmission of a new exchange: remember its MID
                        if *n == 1 {
                            // the client starts exchanges in the order they
                            // were requested, and ids increase with that order
                            if let Some((_, l)) = self
                                .live
                                .iter_mut()
                                .filter(|(_, l)| l.mid.is_none())
                                .min_by_key(|(id, _)| **id)
                            {
                                l.mid = Some(p.message_id());
                            }
                        }
                    }
                }
                out.push(Send {
                    dst: t.dest,
                    bytes: t.bytes,
                    after: Duration::ZERO,
                    tag,
                });
            }
            while let Some(ev) = self.client.poll_event() {
                progressed = true;
                let Some(live) = self.live.remove(&ev.id()) else {
                    continue;
                };
                if let Some(mid) = live.mid {
                    self.tx_count.remove(&mid);
                }
                match ev {
                    Event::Response {
                        rtt,
                        retransmissions,
                        ..
                    } => {
                        let spurious = match (answered_tag.take(), live.mid) {
                            (Some(tag), Some(mid)) if tag >> 32 == u64::from(mid) => {
                                let answered = (tag & 0xffff_ffff) as u32;
                                // transmissions made = retransmissions + 1
                                (retransmissions + 1).saturating_sub(answered)
                            }
                            _ => 0,
                        };
                        self.spurious += u64::from(spurious);
                        let dest = self.work.dest;
                        let ctl = self.client.rto_controller();
                        let started = now
                            .checked_sub(rtt)
                            .and_then(|s| self.epoch.map(|e| s.saturating_duration_since(e)))
                            .unwrap_or_default();
                        self.outcomes.push(Outcome {
                            index: live.index,
                            started,
                            rtt,
                            retransmissions,
                            spurious,
                            timeouts: live.timeouts,
                            rto: ctl.current_rto(dest),
                            alpha: ctl.ewma_weight(dest),
                        });
                        if self.next_index < self.work.requests {
                            self.next_index += 1;
                            self.pending
                                .push_back((self.next_index - 1, 0, now + self.work.gap));
                        }
                    }
                    Event::Timeout { .. } | Event::Reset { .. } => {
                        if self.work.retry_timeouts {
                            self.pending
                                .push_front((live.index, live.timeouts + 1, now));
                        } else {
                            self.failed += 1;
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }
}

impl App for CoapClient {
    fn on_packet(&mut self, now: Instant, pkt: &Packet, out: &mut Vec<Send>) {
        self.client.handle_datagram(now, pkt.src, &pkt.bytes);
        let tag = (pkt.tag != 0).then_some(pkt.tag);
        self.pump(now, tag, out);
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Vec<Send>) {
        self.client.handle_timeout(now);
        self.pump(now, None, out);
    }

    fn on_start(&mut self, now: Instant, _out: &mut Vec<Send>) {
        self.epoch = Some(now);
        // the first requests wait for the start time; each completion then
        // queues the next one
        let n = self.work.requests.min(self.work.concurrency.max(1));
        for _ in 0..n {
            self.next_index += 1;
            self.pending
                .push_back((self.next_index - 1, 0, now + self.work.start_after));
        }
    }

    fn next_timeout(&mut self) -> Option<Instant> {
        let pending = self.pending.front().map(|p| p.2);
        match (self.client.poll_timeout(), pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn done(&self) -> bool {
        self.outcomes.len() + self.failed >= self.work.requests
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
