//! The server endpoint: CoAP's message layer on the server side as one
//! sans-IO state machine, in the manner of quinn-proto's `Endpoint`.
//!
//! ```text
//!  datagram ──handle_datagram──> Incoming::Request ──begin/process/respond──> Transmit
//!                 │                                                        (ACK, NON or
//!                 └─> Incoming::{Duplicate, Malformed, Ignored}:            separate CON)
//!                     an answer at once (Reset, cached response) or none
//!  resource changed ──notify──> Transmits (notifications)
//!  clock ──handle_timeout──> poll_transmit: empty ACKs, retransmissions
//! ```
//!
//! The endpoint owns everything RFC 7252, 7641, 7959 and 9175 make a server
//! remember: de-duplication with the cached answer (bounded in entries),
//! message IDs, the empty ACK of a slow CON and its separate response, the
//! retransmission of every CON it sends (RFC 7252 4.2 timing with
//! ACK_RANDOM_FACTOR, from [`crate::rto::TransmissionParams`]), Observe
//! relations and how they end, Block1 reassembly, and address validation
//! against amplification. It reads no clock and touches no socket: every
//! call takes the time, and what to send comes back as [`Transmit`]s.
//!
//! It is shared by reference between threads: each part sits behind its
//! own lock (de-duplication in shards by peer and message ID, one slot per
//! handler for requests in progress), so the receiving and handling
//! threads of a server meet only where the protocol makes them.
//!
//! Invariants:
//! - nothing larger than `amplification_factor` times the request goes to
//!   an address that has not been verified (see [`validation`]); a
//!   notification is held to the size of its registration request;
//! - every CON the endpoint sends is retransmitted until acknowledged or
//!   given up, and a CON notification given up ends its relation;
//! - every table is bounded in entries.

mod fit;
mod retransmit;
pub mod validation;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use mintgate_buf::Pool;
use parking_lot::Mutex;

use self::fit::Fitted;
use self::retransmit::{Carries, Fired, Retransmissions};
use self::validation::{EchoCheck, Validation};
use super::block::BlockOpt;
use super::observe::{observe_request, Ended, Full, ObserveConfig, ObserveRequest, Registry, Seal};
use super::{
    block_request, classify, finish_response, process_request, process_request_blockwise,
    simple_response, Answer, Block1Config, Block1Outcome, Block1Stats, Block1Store, BlockRequest,
    Dedup, DedupSize, DedupStats, DropReason, Handled, Inbound, Outgoing, Request, ResetReason,
    ResponseBuilder, Router, Seen,
};
use crate::rto::TransmissionParams;
use crate::server::response::SEALED_EXTRA;
use crate::wire::{
    decode_uint, empty_message, Code, MessageType, MessageWriter, OptionNumber, Packet,
};

/// De-duplication shards.
const DEDUP_SHARDS: usize = 16;

/// Settings of an [`Endpoint`].
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// (peer, message ID) pairs remembered, at most.
    pub dedup_capacity: usize,
    /// How long a CON is remembered (EXCHANGE_LIFETIME).
    pub exchange_lifetime: Duration,
    /// How long a NON is remembered (NON_LIFETIME).
    pub non_lifetime: Duration,
    /// Timing of the CONs the endpoint sends (RFC 7252 4.8).
    pub transmission: TransmissionParams,
    /// A CON request still in its handler after this long gets an empty
    /// ACK, and its response goes as a separate CON.
    pub separate_after: Duration,
    /// Observe limits and CON cadence.
    pub observe: ObserveConfig,
    /// Block1 reassembly limits.
    pub block1: Block1Config,
    /// To an address not yet verified, nothing larger than this many times
    /// its request; 0 turns the check off.
    pub amplification_factor: u32,
    /// How long an address verified by an Echo round trip is trusted.
    pub verified_lifetime: Duration,
    /// Verified addresses remembered, at most.
    pub verified_capacity: usize,
    /// CON messages waiting for an ACK, at most.
    pub max_pending: usize,
    /// Largest response payload a handler may produce.
    pub max_payload: usize,
    /// Requests that may be in handlers at once (one slot each).
    pub handler_slots: usize,
    /// Seed of the retransmission timer's randomness.
    pub seed: u64,
    /// The Echo secret; `None` draws one at random.
    pub echo_secret: Option<[u8; 32]>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        let t = TransmissionParams::default();
        EndpointConfig {
            dedup_capacity: 16384,
            exchange_lifetime: t.exchange_lifetime(),
            non_lifetime: t.non_lifetime(),
            transmission: t,
            separate_after: Duration::from_secs(1),
            observe: ObserveConfig::default(),
            block1: Block1Config::default(),
            amplification_factor: 3,
            verified_lifetime: Duration::from_secs(600),
            verified_capacity: 4096,
            max_pending: 4096,
            max_payload: super::DEFAULT_MAX_PAYLOAD,
            handler_slots: 256,
            seed: 0x5eed,
            echo_secret: None,
        }
    }
}

/// What goes on the wire.
#[derive(Clone, Debug)]
pub enum Datagram {
    /// An encoded message in pool blocks.
    Message(Outgoing),
    /// A 4-byte empty message (ACK, Reset).
    Empty([u8; 4]),
}

impl Datagram {
    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        match self {
            Datagram::Message(o) => o.len(),
            Datagram::Empty(e) => e.len(),
        }
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy as one vector (tests and simulators).
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Datagram::Message(o) => o.to_vec(),
            Datagram::Empty(e) => e.to_vec(),
        }
    }
}

/// A datagram to send.
#[derive(Clone, Debug)]
pub struct Transmit {
    /// To whom.
    pub peer: SocketAddr,
    /// From which of the server's sockets (the one the exchange came in on).
    pub listener: usize,
    /// What.
    pub datagram: Datagram,
}

/// What [`Endpoint::handle_datagram`] found.
#[derive(Debug)]
pub enum Incoming {
    /// A new request: run it ([`Endpoint::begin`], [`Endpoint::process`],
    /// [`Endpoint::respond`]).
    Request {
        /// Confirmable.
        con: bool,
        /// Its message ID.
        mid: u16,
    },
    /// A duplicate: the cached answer to send again, or none (a NON, or a
    /// CON still in its handler).
    Duplicate(Option<Transmit>),
    /// Not a message to process: answered with a Reset (a malformed CON) or
    /// dropped.
    Malformed(Option<Transmit>),
    /// Nothing to process: a ping (answered with a Reset), a misplaced or
    /// unexpected message, or an ACK/Reset nothing waited for.
    Ignored(Option<Transmit>),
    /// An ACK or Reset of a message the endpoint sent.
    Consumed,
}

/// What [`Endpoint::respond`] made of a handled request.
#[derive(Debug)]
pub enum Responded {
    /// Send this.
    Send(Transmit),
    /// Nothing to send: a NON the request layer answers with silence, or an
    /// answer too large for an unverified source with nothing smaller to say.
    Silent,
    /// No pool block was free for the answer: the request is shed.
    Exhausted,
}

impl Responded {
    /// The transmission, if any.
    pub fn transmit(self) -> Option<Transmit> {
        match self {
            Responded::Send(t) => Some(t),
            _ => None,
        }
    }
}

/// A request in a handler, from [`Endpoint::begin`] to
/// [`Endpoint::respond`].
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    slot: usize,
    peer: SocketAddr,
    listener: usize,
    mid: u16,
    con: bool,
    request_len: usize,
    verified: bool,
    asked: Option<BlockOpt>,
}

impl Ticket {
    /// The request's source.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the request's source counts as verified (an Echo round trip,
    /// or a transport that verified it).
    pub fn verified(&self) -> bool {
        self.verified
    }
}

#[derive(Clone, Copy)]
struct InFlight {
    peer: SocketAddr,
    mid: u16,
    listener: usize,
    since: Instant,
    acked: bool,
}

/// Counters, increasing over the endpoint's life (gauges are read from the
/// tables).
#[derive(Debug, Default)]
pub struct EndpointStats {
    /// Observe registrations accepted (re-registrations included).
    pub observe_registered: AtomicU64,
    /// Registrations refused: the registry was full.
    pub observe_refused_total: AtomicU64,
    /// Registrations refused: the source had its share.
    pub observe_refused_source: AtomicU64,
    /// Registrations refused: the peer and token named a relation of
    /// another owner (plain against OSCORE, or another context).
    pub observe_refused_taken: AtomicU64,
    /// Relations ended, by [`Ended`] in [`Ended::ALL`] order.
    pub observe_ended: [AtomicU64; Ended::ALL.len()],
    /// Notifications sent (first transmissions).
    pub notifications: AtomicU64,
    /// Of which confirmable.
    pub notifications_con: AtomicU64,
    /// Notifications that replaced an unacknowledged CON one.
    pub notifications_replaced: AtomicU64,
    /// Empty ACKs sent for slow handlers.
    pub empty_acks: AtomicU64,
    /// CON retransmissions (separate responses and notifications).
    pub retransmissions: AtomicU64,
    /// CON messages given up unacknowledged.
    pub gave_up: AtomicU64,
    /// Answers cut to a Block2 block for an unverified source.
    pub amplification_blocks: AtomicU64,
    /// Echo challenges (4.01) sent instead of an answer too large.
    pub amplification_challenges: AtomicU64,
    /// Answers not sent at all: nothing small enough could be said.
    pub amplification_dropped: AtomicU64,
    /// Requests whose Echo verified their address.
    pub echo_verified: AtomicU64,
    /// Requests with an Echo that was not valid.
    pub echo_invalid: AtomicU64,
    /// Requests shed: no buffer for the answer.
    pub exhausted: AtomicU64,
}

impl EndpointStats {
    /// Relations ended for `why`.
    pub fn ended(&self, why: Ended) -> u64 {
        self.observe_ended[Ended::ALL.iter().position(|e| *e == why).unwrap_or(0)].load(Relaxed)
    }

    fn end(&self, why: Ended) {
        self.end_many(why, 1);
    }

    fn end_many(&self, why: Ended, n: u64) {
        self.observe_ended[Ended::ALL.iter().position(|e| *e == why).unwrap_or(0)]
            .fetch_add(n, Relaxed);
    }
}

/// An answer remembered for a CON's duplicates.
#[derive(Clone, Debug)]
struct Cached {
    out: Outgoing,
    /// Its source was verified when it was answered (an Echo round trip or
    /// the transport), so a duplicate gets it whatever its size. Otherwise
    /// a duplicate gets it only within `amplification_factor` times the
    /// duplicate's own size: a duplicate needs only the 4-byte header of
    /// the first request, so replaying unchecked would let a spoofed source
    /// turn 4 bytes into a whole answer, again and again.
    free: bool,
}

impl super::Weigh for Cached {
    fn weight(&self) -> usize {
        self.out.len()
    }
}

/// The CoAP server endpoint. See the module docs.
pub struct Endpoint {
    cfg: EndpointConfig,
    pool: Pool,
    dedup: Box<[Mutex<Dedup<Cached>>]>,
    next_mid: AtomicU16,
    slots: Box<[Mutex<Option<InFlight>>]>,
    pending: Mutex<Retransmissions>,
    observe: Mutex<Registry>,
    blocks: StdMutex<Block1Store>,
    validation: Mutex<Validation>,
    queue: Mutex<VecDeque<Transmit>>,
    stats: EndpointStats,
}

impl Endpoint {
    /// An endpoint answering from `pool`; `now` starts its clock (Echo
    /// timestamps count from it).
    pub fn new(cfg: EndpointConfig, pool: Pool, now: Instant) -> Endpoint {
        let shard_cap = cfg.dedup_capacity.div_ceil(DEDUP_SHARDS).max(1);
        let secret = cfg.echo_secret.unwrap_or_else(rand::random);
        Endpoint {
            dedup: (0..DEDUP_SHARDS)
                .map(|_| {
                    Mutex::new(Dedup::new(
                        shard_cap,
                        cfg.exchange_lifetime,
                        cfg.non_lifetime,
                    ))
                })
                .collect(),
            next_mid: AtomicU16::new((cfg.seed ^ (cfg.seed >> 16)) as u16),
            slots: (0..cfg.handler_slots.max(1))
                .map(|_| Mutex::new(None))
                .collect(),
            pending: Mutex::new(Retransmissions::new(
                cfg.transmission,
                cfg.max_pending,
                cfg.seed,
            )),
            observe: Mutex::new(Registry::new(cfg.observe)),
            blocks: StdMutex::new(Block1Store::new(cfg.block1)),
            validation: Mutex::new(Validation::new(
                secret,
                now,
                cfg.verified_lifetime,
                cfg.verified_capacity,
            )),
            queue: Mutex::new(VecDeque::new()),
            stats: EndpointStats::default(),
            pool,
            cfg,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// The buffer pool answers are built in.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// A fresh message ID for a message the endpoint originates.
    pub fn next_mid(&self) -> u16 {
        self.next_mid.fetch_add(1, Relaxed)
    }

    fn shard(&self, peer: &SocketAddr, mid: u16) -> &Mutex<Dedup<Cached>> {
        let h = (mid as usize) ^ (peer.port() as usize).rotate_left(5);
        &self.dedup[h % DEDUP_SHARDS]
    }

    /// Classifies and de-duplicates a datagram from `peer` that came in on
    /// `listener`.
    pub fn handle_datagram(
        &self,
        now: Instant,
        peer: SocketAddr,
        listener: usize,
        datagram: &[u8],
    ) -> Incoming {
        let small = |bytes: [u8; 4]| {
            Some(Transmit {
                peer,
                listener,
                datagram: Datagram::Empty(bytes),
            })
        };
        let (con, mid) = match classify(datagram) {
            Inbound::Request(p) => (p.msg_type() == MessageType::Con, p.message_id()),
            Inbound::Reset(rst, ResetReason::FormatError(_)) => {
                return Incoming::Malformed(small(rst))
            }
            Inbound::Reset(rst, _) => return Incoming::Ignored(small(rst)),
            Inbound::Ack(mid) => return self.on_ack(peer, mid, false),
            Inbound::PeerReset(mid) => return self.on_ack(peer, mid, true),
            Inbound::Drop(DropReason::FormatError | DropReason::Unreadable) => {
                return Incoming::Malformed(None)
            }
            Inbound::Drop(_) => return Incoming::Ignored(None),
        };
        let cached = match self.shard(&peer, mid).lock().check(now, peer, mid, con) {
            Seen::New => return Incoming::Request { con, mid },
            Seen::Replay(c) => c.clone(),
            Seen::InProgress | Seen::Duplicate => return Incoming::Duplicate(None),
        };
        let limit = (self.cfg.amplification_factor as usize).saturating_mul(datagram.len());
        if !cached.free
            && limit > 0
            && cached.out.len() > limit
            && !self.validation.lock().is_verified(now, &peer)
        {
            self.stats.amplification_dropped.fetch_add(1, Relaxed);
            return Incoming::Duplicate(None);
        }
        Incoming::Duplicate(Some(Transmit {
            peer,
            listener,
            datagram: Datagram::Message(cached.out),
        }))
    }

    /// An ACK (or, with `reset`, a Reset) of message `mid` from `peer`.
    fn on_ack(&self, peer: SocketAddr, mid: u16, reset: bool) -> Incoming {
        let pending = self.pending.lock().remove(peer, mid);
        let mut reg = self.observe.lock();
        match (pending.map(|p| p.carries), reset) {
            (Some(Carries::Notification(token)), false) => {
                reg.acked(peer, token, mid);
                Incoming::Consumed
            }
            (Some(Carries::Response), _) => Incoming::Consumed,
            // a Reset of any recent notification ends the relation (RFC 7641 3.6)
            (_, true) => {
                if reg.remove_by_mid(peer, mid).is_some() {
                    self.stats.end(Ended::Reset);
                    Incoming::Consumed
                } else {
                    Incoming::Ignored(None)
                }
            }
            (None, false) => Incoming::Ignored(None),
        }
    }

    /// The queue of a server is full, for all or for this request's source:
    /// a NON is forgotten, a CON gets 5.03 with Max-Age (cached for its
    /// duplicates). `None` when nothing is to be sent.
    pub fn shed(
        &self,
        peer: SocketAddr,
        listener: usize,
        packet: &Packet<&[u8]>,
        max_age: u32,
    ) -> Option<Transmit> {
        let mid = packet.message_id();
        let mut shard = self.shard(&peer, mid).lock();
        if packet.msg_type() != MessageType::Con {
            shard.forget(peer, mid);
            return None;
        }
        match simple_response(
            &self.pool,
            MessageType::Ack,
            mid,
            packet.token(),
            Code::SERVICE_UNAVAILABLE,
            Some(max_age),
        ) {
            Some(o) => {
                shard.complete(
                    peer,
                    mid,
                    Cached {
                        out: o.clone(),
                        free: false,
                    },
                );
                Some(Transmit {
                    peer,
                    listener,
                    datagram: Datagram::Message(o),
                })
            }
            None => {
                shard.forget(peer, mid);
                None
            }
        }
    }

    /// Starts a request in handler slot `slot` (one per thread that runs
    /// handlers); `transport_verified` says the transport already proved
    /// the address (a DTLS session). Checks the request's Echo.
    pub fn begin(
        &self,
        slot: usize,
        now: Instant,
        peer: SocketAddr,
        listener: usize,
        packet: &Packet<&[u8]>,
        transport_verified: bool,
    ) -> Ticket {
        let con = packet.msg_type() == MessageType::Con;
        let mid = packet.message_id();
        let slot = slot % self.slots.len();
        if con {
            *self.slots[slot].lock() = Some(InFlight {
                peer,
                mid,
                listener,
                since: now,
                acked: false,
            });
        }
        let mut verified = transport_verified || self.cfg.amplification_factor == 0;
        if !verified {
            if let Some(e) = packet.option(OptionNumber::ECHO) {
                let mut v = self.validation.lock();
                match v.check(now, &peer, e.value) {
                    EchoCheck::Valid => {
                        v.verify(now, &peer);
                        self.stats.echo_verified.fetch_add(1, Relaxed);
                        verified = true;
                    }
                    EchoCheck::Invalid => {
                        self.stats.echo_invalid.fetch_add(1, Relaxed);
                    }
                }
            }
        }
        let asked = packet
            .option(OptionNumber::BLOCK2)
            .filter(|o| o.value.len() <= 3)
            .and_then(|o| decode_uint(o.value))
            .and_then(BlockOpt::decode);
        Ticket {
            slot,
            peer,
            listener,
            mid,
            con,
            request_len: packet.as_bytes().len(),
            verified,
            asked,
        }
    }

    /// Routes the request and runs its handler, with block-wise request
    /// bodies put together in the endpoint's store.
    pub fn process(&self, now: Instant, router: &Router, req: &Request<'_>) -> Handled {
        process_request_blockwise(
            router,
            &self.pool,
            &self.blocks,
            now,
            req,
            64,
            self.cfg.max_payload,
        )
    }

    /// A response builder for an answer made outside a handler (an access
    /// refusal, say).
    pub fn builder(&self) -> ResponseBuilder {
        ResponseBuilder::in_pool(&self.pool, 64).with_limit(self.cfg.max_payload)
    }

    /// A builder for the protected form of an answer (OSCORE, RFC 8613):
    /// its payload holds the plain answer's code, options and payload plus
    /// a tag, so it may exceed the plain limit by [`SEALED_EXTRA`]. A plain
    /// answer of a full block (an inner Block2 of `max_payload` bytes)
    /// still goes out protected, in one message.
    pub fn sealed_builder(&self) -> ResponseBuilder {
        ResponseBuilder::in_pool(&self.pool, 64).with_limit(self.cfg.max_payload + SEALED_EXTRA)
    }

    /// Outer block-wise (RFC 8613 4.1.3.4.2): a request carrying Block1
    /// outside its protection (an OSCORE message a proxy cut into blocks)
    /// is put back together in the endpoint's Block1 store, under the same
    /// bounds as any upload, before it is verified. `None` when `p` has no
    /// Block1; otherwise what to do: answer at once (2.31 for a block that
    /// is not the last, 4.08, 4.13, 5.03: [`super::reply_to_block`]), or verify
    /// the request whole (`Whole`: `p` itself; `Complete`: the message put
    /// together) and answer it with the Block1 given.
    pub fn outer_block1(
        &self,
        now: Instant,
        peer: SocketAddr,
        p: &Packet<&[u8]>,
    ) -> Option<Block1Outcome> {
        match block_request(p) {
            BlockRequest::Block1(b) => Some(
                self.blocks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_block(now, peer, p, b),
            ),
            BlockRequest::BadBlock1 => Some(Block1Outcome::Reply {
                code: Code::BAD_REQUEST,
                block1: None,
                size1: None,
                max_age: None,
            }),
            BlockRequest::None | BlockRequest::Continuation => None,
        }
    }

    /// Finishes a request: registers or deregisters an observer, picks the
    /// message type and ID (a piggybacked ACK, a separate CON when the
    /// empty ACK went already, or a NON), caches the answer for duplicates,
    /// holds it to the amplification limit, and returns what to send.
    pub fn respond(
        &self,
        now: Instant,
        ticket: Ticket,
        router: &Router,
        req: &Request<'_>,
        mut handled: Handled,
    ) -> Responded {
        let p = req.packet;
        if let Handled::Respond(rb) = &mut handled {
            // a verified source's notifications are not held to a size
            let request_len = if ticket.verified {
                usize::MAX / 4
            } else {
                ticket.request_len
            };
            self.observe_on_request(now, router, req, ticket.listener, request_len, rb, None);
        }
        let acked = ticket.con
            && self.slots[ticket.slot]
                .lock()
                .take()
                .is_some_and(|f| f.acked);
        let (ty, mid) = match (ticket.con, acked) {
            (false, _) => (MessageType::Non, self.next_mid()),
            (true, false) => (MessageType::Ack, ticket.mid),
            (true, true) => (MessageType::Con, self.next_mid()),
        };
        let answer = match handled {
            Handled::Respond(rb) => finish_response(&self.pool, rb, ty, mid, p.token()),
            Handled::Silent => Answer::Silent,
        };
        let o = match answer {
            Answer::Send(o) => o,
            Answer::Silent => return Responded::Silent,
            Answer::Exhausted => {
                self.stats.exhausted.fetch_add(1, Relaxed);
                self.shard(&ticket.peer, ticket.mid)
                    .lock()
                    .forget(ticket.peer, ticket.mid);
                return Responded::Exhausted;
            }
        };
        let Some(o) = self.hold_to_limit(
            now,
            &ticket.peer,
            ticket.verified,
            ticket.request_len,
            ticket.asked,
            o,
        ) else {
            if ticket.con {
                self.shard(&ticket.peer, ticket.mid)
                    .lock()
                    .forget(ticket.peer, ticket.mid);
            }
            return Responded::Silent;
        };
        if ticket.con {
            self.shard(&ticket.peer, ticket.mid).lock().complete(
                ticket.peer,
                ticket.mid,
                Cached {
                    out: o.clone(),
                    free: ticket.verified,
                },
            );
        }
        if acked {
            let gave_up = self.pending.lock().insert(
                now,
                ticket.peer,
                mid,
                ticket.listener,
                o.clone(),
                Carries::Response,
            );
            if let Some(f) = gave_up {
                self.fired(f);
            }
        }
        Responded::Send(Transmit {
            peer: ticket.peer,
            listener: ticket.listener,
            datagram: Datagram::Message(o),
        })
    }

    /// `o` as it may go to `peer`: whole when the address is verified or it
    /// fits `amplification_factor * request_len`, else cut (see [`fit`]).
    fn hold_to_limit(
        &self,
        now: Instant,
        peer: &SocketAddr,
        verified: bool,
        request_len: usize,
        asked: Option<BlockOpt>,
        o: Outgoing,
    ) -> Option<Outgoing> {
        let factor = self.cfg.amplification_factor as usize;
        let limit = factor.saturating_mul(request_len);
        if verified || factor == 0 || o.len() <= limit {
            return Some(o);
        }
        let v = self.validation.lock();
        if v.is_verified(now, peer) {
            return Some(o);
        }
        let echo = v.echo_for(now, peer);
        drop(v);
        match fit::fit(&self.pool, &o, asked, limit, &echo) {
            Fitted::Block(b) => {
                self.stats.amplification_blocks.fetch_add(1, Relaxed);
                Some(b)
            }
            Fitted::Challenge(c) => {
                self.stats.amplification_challenges.fetch_add(1, Relaxed);
                Some(c)
            }
            Fitted::Nothing => {
                self.stats.amplification_dropped.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Observe on a request the handler answered: a GET with `Observe: 0`
    /// on an observable resource answered 2.05 registers the client (its
    /// relation owned by `seal`, `None`: plain) and the response carries
    /// the Observe value; `Observe: 1` deregisters it. A plain call for a
    /// request with an OSCORE option does nothing: its Observe is inside,
    /// and is acted on through [`Endpoint::observe_sealed`].
    #[allow(clippy::too_many_arguments)]
    fn observe_on_request(
        &self,
        now: Instant,
        router: &Router,
        req: &Request<'_>,
        listener: usize,
        request_len: usize,
        rb: &mut ResponseBuilder,
        seal: Option<Arc<dyn Seal>>,
    ) {
        if seal.is_none() && req.packet.option(crate::oscore::OSCORE).is_some() {
            return;
        }
        match observe_request(req.packet) {
            ObserveRequest::None => {}
            ObserveRequest::Deregister => {
                let who = seal.as_deref().map(|s| s.owner());
                if self
                    .observe
                    .lock()
                    .deregister_as(req.peer, req.packet.token(), who)
                {
                    self.stats.end(Ended::Deregistered);
                }
            }
            ObserveRequest::Register => {
                if rb.code() != Code::CONTENT {
                    return;
                }
                let Some(r) = router.find(req).filter(|r| r.is_observable()) else {
                    return;
                };
                let accept = req
                    .option(OptionNumber::ACCEPT)
                    .and_then(|o| o.uint())
                    .map(|v| v as u16);
                let got = self.observe.lock().register(
                    r.path(),
                    req.peer,
                    req.packet.token(),
                    listener,
                    accept,
                    request_len,
                    now,
                    seal,
                );
                match got {
                    Ok(seq) => {
                        rb.option_uint(OptionNumber::OBSERVE, seq);
                        self.stats.observe_registered.fetch_add(1, Relaxed);
                    }
                    // answered as a plain GET, without Observe
                    Err(Full::Total) => {
                        self.stats.observe_refused_total.fetch_add(1, Relaxed);
                    }
                    Err(Full::Source) => {
                        self.stats.observe_refused_source.fetch_add(1, Relaxed);
                    }
                    Err(Full::Taken) => {
                        self.stats.observe_refused_taken.fetch_add(1, Relaxed);
                    }
                }
            }
        }
    }

    /// Observe for a request that a security layer verified end to end
    /// (OSCORE, RFC 8613 4.1.3.5): `req` is the inner request and `rb` its
    /// plain answer, before it is protected. A GET with `Observe: 0`
    /// registers a relation whose notifications go out only through `seal`
    /// (each protected, [`Seal::seal`]), and `rb` gets the Observe value;
    /// `Observe: 1` ends the relation if `seal`'s owner holds it. The
    /// protected answer then goes to [`Endpoint::respond`] with the outer
    /// request, whose Observe the endpoint does not act on.
    pub fn observe_sealed(
        &self,
        now: Instant,
        router: &Router,
        req: &Request<'_>,
        ticket: &Ticket,
        rb: &mut ResponseBuilder,
        seal: Arc<dyn Seal>,
    ) {
        let request_len = if ticket.verified {
            usize::MAX / 4
        } else {
            ticket.request_len
        };
        self.observe_on_request(
            now,
            router,
            req,
            ticket.listener,
            request_len,
            rb,
            Some(seal),
        );
    }

    /// Observe for a request that came over a reliable connection (RFC
    /// 8323: TCP, TLS, WebSockets) whose listener index is `connection`
    /// (at or above [`super::observe::RELIABLE`], one per connection): a
    /// GET with `Observe: 0` registers in the same registry, under the
    /// same bounds, as over UDP, and `rb` gets the Observe value; `Observe:
    /// 1` deregisters. The connection's handshake verified the address, so
    /// notifications are not held to the request's size, and none is
    /// confirmable: notifications for `connection` come out of
    /// [`Endpoint::notify`] as NON messages for the caller to frame and
    /// send on that connection. [`Endpoint::end_connection`] when it
    /// closes. A relation registered by a protected request (OSCORE) has
    /// its notifications sealed by `seal`, as over UDP
    /// ([`Endpoint::observe_sealed`]).
    pub fn observe_reliable(
        &self,
        now: Instant,
        router: &Router,
        req: &Request<'_>,
        connection: usize,
        rb: &mut ResponseBuilder,
        seal: Option<Arc<dyn Seal>>,
    ) {
        debug_assert!(super::observe::is_reliable(connection));
        self.observe_on_request(now, router, req, connection, usize::MAX / 4, rb, seal);
    }

    /// The reliable connection `connection` closed: its relations end
    /// (counted as [`Ended::Closed`]); returns how many there were.
    pub fn end_connection(&self, connection: usize) -> usize {
        let n = self.observe.lock().remove_listener(connection);
        self.stats.end_many(Ended::Closed, n as u64);
        n
    }

    /// The resource at `path` changed: renders its GET answer for each
    /// observer and appends the notifications to `out`. A CON notification
    /// still unacknowledged is replaced by the new one (sent at its next
    /// retransmission); a notification other than 2.05 ends the relation.
    pub fn notify(&self, now: Instant, router: &Router, path: &str, out: &mut Vec<Transmit>) {
        let plan = self.observe.lock().plan(path, now);
        let mut dg = [0u8; 512];
        for n in plan {
            // the GET the handler answers, with the observer's token
            let len = match MessageWriter::new(
                &mut dg,
                MessageType::Non,
                Code::GET,
                0,
                n.token.as_slice(),
            )
            .and_then(|mut w| {
                w.path_options(OptionNumber::URI_PATH, path)?;
                if let Some(cf) = n.accept {
                    w.option_uint(OptionNumber::ACCEPT, cf.into())?;
                }
                Ok(w.finish())
            }) {
                Ok(l) => l,
                Err(_) => continue,
            };
            let Ok(p) = Packet::new_checked(&dg[..len]) else {
                continue;
            };
            // a protected relation's resource renders for its owner
            let req = Request {
                peer: n.peer,
                packet: &p,
                identity: n.seal.as_deref().map(|s| s.owner()),
            };
            let Handled::Respond(mut rb) =
                process_request(router, &self.pool, &req, 64, self.cfg.max_payload)
            else {
                continue;
            };
            let ok = rb.code() == Code::CONTENT;
            if ok {
                rb.option_uint(OptionNumber::OBSERVE, n.seq);
            }
            // a protected relation gets its notification protected, or
            // none: it ends
            if let Some(seal) = &n.seal {
                let mut out = self.sealed_builder();
                if seal.seal(rb, &mut out).is_err() {
                    if self.observe.lock().deregister(n.peer, n.token.as_slice()) {
                        self.stats.end(Ended::Unprotected);
                    }
                    continue;
                }
                rb = out;
            }
            // a reliable connection frames it without a message ID: none
            // is taken from the datagram listeners' space
            let reliable = super::observe::is_reliable(n.listener);
            let mid = if reliable { 0 } else { self.next_mid() };
            let ty = if n.confirmable {
                MessageType::Con
            } else {
                MessageType::Non
            };
            let Answer::Send(o) = finish_response(&self.pool, rb, ty, mid, n.token.as_slice())
            else {
                continue;
            };
            let Some(o) = self.hold_to_limit(now, &n.peer, false, n.request_len, None, o) else {
                continue;
            };
            if !ok {
                if self.observe.lock().deregister(n.peer, n.token.as_slice()) {
                    self.stats.end(Ended::NotContent);
                }
            } else if !reliable {
                self.observe
                    .lock()
                    .sent(path, n.peer, n.token, mid, n.confirmable);
            }
            if let Some(old) = n.replaces.filter(|_| ok) {
                let replaced = self.pending.lock().replace(n.peer, old, mid, o.clone());
                if replaced {
                    self.stats.notifications_replaced.fetch_add(1, Relaxed);
                    continue;
                }
            }
            if n.confirmable {
                let gave_up = self.pending.lock().insert(
                    now,
                    n.peer,
                    mid,
                    n.listener,
                    o.clone(),
                    Carries::Notification(n.token),
                );
                if let Some(f) = gave_up {
                    self.fired(f);
                }
                self.stats.notifications_con.fetch_add(1, Relaxed);
            }
            self.stats.notifications.fetch_add(1, Relaxed);
            out.push(Transmit {
                peer: n.peer,
                listener: n.listener,
                datagram: Datagram::Message(o),
            });
        }
    }

    fn fired(&self, f: Fired) {
        match f {
            Fired::Retransmit(peer, listener, msg) => {
                self.stats.retransmissions.fetch_add(1, Relaxed);
                self.queue.lock().push_back(Transmit {
                    peer,
                    listener,
                    datagram: Datagram::Message(msg),
                });
            }
            Fired::GaveUp(peer, carries) => {
                self.stats.gave_up.fetch_add(1, Relaxed);
                // an unacknowledged CON notification ends the relation
                if let Carries::Notification(token) = carries {
                    if self.observe.lock().deregister(peer, token.as_slice()) {
                        self.stats.end(Ended::Unacknowledged);
                    }
                }
            }
        }
    }

    /// Does what is due at `now`: empty ACKs for requests in slow handlers,
    /// retransmissions and give-ups of CONs, expiry of Block1 transfers and
    /// verified addresses. What to send is then in [`poll_transmit`].
    ///
    /// [`poll_transmit`]: Endpoint::poll_transmit
    pub fn handle_timeout(&self, now: Instant) {
        for slot in self.slots.iter() {
            let mut g = slot.lock();
            if let Some(f) = g.as_mut() {
                if !f.acked && now.saturating_duration_since(f.since) >= self.cfg.separate_after {
                    f.acked = true;
                    self.stats.empty_acks.fetch_add(1, Relaxed);
                    self.queue.lock().push_back(Transmit {
                        peer: f.peer,
                        listener: f.listener,
                        datagram: Datagram::Empty(empty_message(MessageType::Ack, f.mid)),
                    });
                }
            }
        }
        let mut fired = Vec::new();
        self.pending.lock().fire(now, &mut fired);
        for f in fired {
            self.fired(f);
        }
        {
            let mut b = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
            if !b.is_empty() {
                b.expire(now);
            }
        }
        self.validation.lock().expire(now);
    }

    /// The next datagram to send, if any.
    pub fn poll_transmit(&self) -> Option<Transmit> {
        self.queue.lock().pop_front()
    }

    /// When [`handle_timeout`] should be called next (at the latest).
    ///
    /// [`handle_timeout`]: Endpoint::handle_timeout
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.pending.lock().next_due();
        for slot in self.slots.iter() {
            if let Some(f) = slot.lock().as_ref().filter(|f| !f.acked) {
                let due = f.since + self.cfg.separate_after;
                t = Some(t.map_or(due, |t| t.min(due)));
            }
        }
        t
    }

    /// Gives back buffers held by cached answers, oldest first, after an
    /// allocation failed; returns how many entries went. Shards that are
    /// busy are skipped, never waited for (the pool calls this on the
    /// allocating thread, which may hold a shard's lock).
    pub fn reclaim(&self, per_shard: usize) -> usize {
        self.dedup
            .iter()
            .filter_map(|d| d.try_lock().map(|mut d| d.evict(per_shard)))
            .sum()
    }

    /// Observers registered now.
    pub fn observers(&self) -> usize {
        self.observe.lock().len()
    }

    /// CON messages waiting for an ACK now.
    pub fn pending(&self) -> usize {
        self.pending.lock().len()
    }

    /// Addresses verified now.
    pub fn verified_addresses(&self) -> usize {
        self.validation.lock().len()
    }

    /// Whether `peer`'s address is verified at `now`.
    pub fn is_verified(&self, now: Instant, peer: &SocketAddr) -> bool {
        self.validation.lock().is_verified(now, peer)
    }

    /// Entries held for de-duplication now.
    pub fn dedup_len(&self) -> usize {
        self.dedup.iter().map(|d| d.lock().len()).sum()
    }

    /// The de-duplication tables' sizes and counters, summed over shards.
    pub fn dedup_summary(&self) -> (DedupSize, DedupStats) {
        let (mut z, mut c) = (DedupSize::default(), DedupStats::default());
        for d in self.dedup.iter() {
            let d = d.lock();
            let (s, t) = (d.size(), d.stats());
            z.entries += s.entries;
            z.queued += s.queued;
            z.map_capacity += s.map_capacity;
            z.queue_capacity += s.queue_capacity;
            z.bytes += s.bytes;
            c.evicted_early += t.evicted_early;
            c.evicted_bytes += t.evicted_bytes;
            c.too_heavy += t.too_heavy;
            c.forgotten += t.forgotten;
            c.compactions += t.compactions;
        }
        (z, c)
    }

    /// Block1 counters, transfers held and bytes held.
    pub fn block1(&self) -> (Block1Stats, usize, usize) {
        let b = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        (b.stats(), b.len(), b.bytes())
    }
}

#[cfg(test)]
mod tests;
