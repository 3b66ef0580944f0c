//! A sans-IO CoAP client endpoint (RFC 7252 sections 4 and 5.3.2).
//!
//! In the style of quinn-proto: [`Client`] owns no socket and reads no clock.
//! The caller feeds it requests, received datagrams and the current time,
//! and drains datagrams to send ([`Client::poll_transmit`]), application
//! events ([`Client::poll_event`]) and the next instant at which
//! [`Client::handle_timeout`] must be called ([`Client::poll_timeout`]).
//!
//! Behaviour:
//! - A confirmable (CON) request is retransmitted as its [`RtoController`]
//!   decides until an ACK, a response or a Reset arrives, or gives up with
//!   [`Event::Timeout`] after the controller's `max_retransmit`.
//! - A non-confirmable (NON) request is sent once and times out after
//!   [`ClientConfig::non_timeout`].
//! - ACK and Reset match a request by (peer, message ID); responses match by
//!   (peer, token). A piggybacked response completes the exchange at once; an
//!   empty ACK stops retransmission and the exchange then waits up to
//!   [`ClientConfig::separate_timeout`] for a separate response, which is
//!   acknowledged with an empty ACK when it is confirmable.
//! - At most the controller's `nstart(dest)` exchanges to one destination are
//!   outstanding (awaiting an ACK, or a NON awaiting its response); further
//!   requests wait in a FIFO queue and start when a slot frees.
//! - Where the controller paces non-confirmable requests
//!   ([`RtoController::non_interval`]; CoCoA: one per RTO), a NON waits in
//!   that queue until the interval since the previous NON to the same
//!   destination has passed.
//! - Confirmable and non-confirmable messages from a peer are de-duplicated by
//!   (peer, message ID) for EXCHANGE_LIFETIME / NON_LIFETIME; a duplicate CON
//!   gets the same empty ACK or Reset again and produces no event.
//! - Malformed datagrams are dropped and counted; nothing in a datagram can
//!   make the client panic.
//!
//! Tokens are random (from an RNG seeded by the caller), 4 to 8 bytes, and
//! unique among the live exchanges to one peer. Message IDs start at a random
//! value and increase by one per new message, skipping IDs still in use
//! towards the same peer.

pub mod blockwise;
mod exchange;
pub mod tcp;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::ChaCha12Rng;
use rand::{RngExt, SeedableRng};

use crate::rto::{RtoController, TransmissionParams};
use crate::wire::{head_len, Code, MessageType, MessageWriter, OptionNumber, Packet, WriteError};

use exchange::{Exchange, State, Token};

/// Identifies one request/response exchange of a [`Client`]; never reused by
/// that client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExchangeId(u64);

impl fmt::Display for ExchangeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A request to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// CON (retransmitted until acknowledged) or NON.
    pub confirmable: bool,
    /// The method: a request code (0.01-0.31).
    pub code: Code,
    /// Options in any order; they are sorted by number, keeping the relative
    /// order of repeated options (Uri-Path segments stay in order).
    pub options: Vec<(OptionNumber, Vec<u8>)>,
    /// The payload (may be empty).
    pub payload: Vec<u8>,
}

/// A datagram to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub dest: SocketAddr,
    /// The encoded CoAP message.
    pub bytes: Vec<u8>,
}

/// What happened to an exchange. Every exchange ends with exactly one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The response arrived.
    Response {
        /// The exchange.
        id: ExchangeId,
        /// The response code (class 2, 4 or 5).
        code: Code,
        /// How the response came: ACK (piggybacked), CON or NON (separate).
        msg_type: MessageType,
        /// The options, in message order (values share the datagram's
        /// buffer when it came through [`Client::handle_datagram_bytes`]).
        options: Vec<(OptionNumber, Bytes)>,
        /// The payload (empty when none).
        payload: Bytes,
        /// From the first transmission of the request to the response.
        rtt: Duration,
        /// Retransmissions of the request that were made.
        retransmissions: u32,
    },
    /// No response: a CON was never acknowledged, or the response did not
    /// come within the configured time.
    Timeout {
        /// The exchange.
        id: ExchangeId,
    },
    /// The peer answered the request with a Reset.
    Reset {
        /// The exchange.
        id: ExchangeId,
    },
}

impl Event {
    /// The exchange the event belongs to.
    pub fn id(&self) -> ExchangeId {
        match self {
            Event::Response { id, .. } | Event::Timeout { id } | Event::Reset { id } => *id,
        }
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The code is not a request method (0.01-0.31).
    NotARequest(Code),
    /// The encoded message would exceed [`ClientConfig::max_message_size`]
    /// (one exchange is one message: [`blockwise::Transfer`] splits larger
    /// payloads into blocks).
    TooLarge {
        /// Encoded size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// An option value longer than the format can carry (65535 bytes here).
    OptionTooLong(OptionNumber),
    /// The encoder refused the message.
    Encode(WriteError),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::NotARequest(c) => write!(f, "{c} is not a request method"),
            RequestError::TooLarge { size, max } => write!(
                f,
                "request of {size} bytes exceeds the {max}-byte message limit \
                 (send it block-wise: client::blockwise)"
            ),
            RequestError::OptionTooLong(n) => write!(f, "value of option {} is too long", n.0),
            RequestError::Encode(e) => write!(f, "cannot encode the request: {e}"),
        }
    }
}

impl std::error::Error for RequestError {}

/// Client settings besides the retransmission controller.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// Supplies EXCHANGE_LIFETIME and NON_LIFETIME, for how long received
    /// message IDs are remembered. Retransmission itself follows the
    /// controller.
    pub params: TransmissionParams,
    /// How long a NON request waits for its response.
    pub non_timeout: Duration,
    /// How long a CON request, once acknowledged by an empty ACK, waits for
    /// the separate response.
    pub separate_timeout: Duration,
    /// Token length in bytes, 4 to 8 (values outside are clamped).
    pub token_len: usize,
    /// Largest request message in bytes (RFC 7252 4.6 suggests 1152 when the
    /// path MTU is unknown).
    pub max_message_size: usize,
}

impl ClientConfig {
    /// Defaults derived from `params`: NON requests wait MAX_TRANSMIT_WAIT
    /// (as long as a CON may take to give up), separate responses
    /// EXCHANGE_LIFETIME; 8-byte tokens; 1152-byte messages.
    pub fn new(params: TransmissionParams) -> ClientConfig {
        ClientConfig {
            params,
            non_timeout: params.max_transmit_wait(),
            separate_timeout: params.exchange_lifetime(),
            token_len: 8,
            max_message_size: 1152,
        }
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig::new(TransmissionParams::default())
    }
}

/// Counters, monotonically increasing over the client's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests accepted by [`Client::request`].
    pub requests: u64,
    /// First transmissions of requests.
    pub transmissions: u64,
    /// Retransmissions of CON requests.
    pub retransmissions: u64,
    /// Exchanges ended by a response.
    pub responses: u64,
    /// Exchanges ended without a response.
    pub timeouts: u64,
    /// Exchanges ended by a Reset from the peer.
    pub resets: u64,
    /// Datagrams passed to [`Client::handle_datagram`].
    pub datagrams_received: u64,
    /// Datagrams that were not well-formed CoAP (dropped).
    pub malformed: u64,
    /// Messages from a peer seen before (same peer and message ID).
    pub duplicates: u64,
    /// Well-formed messages that matched no exchange: late or duplicate
    /// ACKs and Resets, responses with an unknown token, requests and pings.
    pub unmatched: u64,
    /// Empty ACKs sent for confirmable responses.
    pub acks_sent: u64,
    /// Resets sent (unmatched confirmable messages, pings).
    pub resets_sent: u64,
    /// Bytes of response payload and option values copied into events
    /// (datagrams given to [`Client::handle_datagram_bytes`] are sliced,
    /// not copied).
    pub bytes_copied: u64,
}

/// What was answered to a received CON or NON, replayed for its duplicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    Nothing,
    Ack,
    Rst,
}

/// Per-destination NSTART bookkeeping; dropped when idle.
#[derive(Default)]
struct Dest {
    /// Exchanges holding a slot (see [`State::holds_slot`]).
    outstanding: usize,
    /// Exchanges waiting for a slot, oldest first.
    queue: VecDeque<ExchangeId>,
}

/// The client endpoint. See the [module documentation](self).
///
/// Invariants:
/// - every live exchange is in `exchanges` and its (dest, token) in
///   `by_token`; a started one that may still get an ACK or Reset also has
///   its (dest, message ID) in `by_mid`;
/// - `dests[d].outstanding` is the number of live exchanges to `d` whose
///   state holds a slot, never above the controller's `nstart(d)`, and the
///   queue is non-empty only while the slots are all taken;
/// - each exchange with a deadline has an entry with that instant in
///   `timers` (stale entries are skipped when popped).
pub struct Client {
    config: ClientConfig,
    rto: Box<dyn RtoController>,
    rng: ChaCha12Rng,
    next_id: u64,
    next_mid: u16,
    exchanges: HashMap<ExchangeId, Exchange>,
    by_mid: HashMap<(SocketAddr, u16), ExchangeId>,
    by_token: HashMap<(SocketAddr, Token), ExchangeId>,
    dests: HashMap<SocketAddr, Dest>,
    timers: BinaryHeap<Reverse<(Instant, ExchangeId)>>,
    seen: HashMap<(SocketAddr, u16), (Instant, Reply)>,
    seen_order: VecDeque<(Instant, (SocketAddr, u16))>,
    /// When the last NON request went to each destination, for controllers
    /// that pace NONs (CoCoA: at most one per RTO); pruned after a minute.
    non_sent: HashMap<SocketAddr, Instant>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: ClientStats,
}

impl Client {
    /// A client with `config`, retransmitting as `rto` decides, drawing
    /// tokens and the first message ID from an RNG seeded with `seed`.
    pub fn new(config: ClientConfig, rto: Box<dyn RtoController>, seed: u64) -> Client {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let next_mid = rng.random();
        Client {
            config,
            rto,
            rng,
            next_id: 0,
            next_mid,
            exchanges: HashMap::new(),
            by_mid: HashMap::new(),
            by_token: HashMap::new(),
            dests: HashMap::new(),
            timers: BinaryHeap::new(),
            seen: HashMap::new(),
            seen_order: VecDeque::new(),
            non_sent: HashMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ClientStats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The retransmission-timeout controller, for reports.
    pub fn rto_controller(&self) -> &dyn RtoController {
        self.rto.as_ref()
    }

    /// The counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Live exchanges (queued or in flight) that have not produced their
    /// event yet.
    pub fn live_exchanges(&self) -> usize {
        self.exchanges.len()
    }

    /// Starts an exchange with `dest`: sends the request now, or queues it
    /// when NSTART exchanges to `dest` are already outstanding.
    pub fn request(
        &mut self,
        now: Instant,
        dest: SocketAddr,
        req: Request,
    ) -> Result<ExchangeId, RequestError> {
        if !req.code.is_request() {
            return Err(RequestError::NotARequest(req.code));
        }
        let mut options = req.options;
        options.sort_by_key(|(n, _)| *n);
        if let Some((n, _)) = options.iter().find(|(_, v)| v.len() > u16::MAX as usize) {
            return Err(RequestError::OptionTooLong(*n));
        }
        let token = self.new_token(dest);
        let size = head_len(
            token.len(),
            options.iter().map(|(n, v)| (n.0, v.len())),
            req.payload.len(),
        ) + req.payload.len();
        if size > self.config.max_message_size {
            return Err(RequestError::TooLarge {
                size,
                max: self.config.max_message_size,
            });
        }
        let ty = if req.confirmable {
            MessageType::Con
        } else {
            MessageType::Non
        };
        let mut bytes = vec![0u8; size];
        // The message ID is patched in when the exchange starts.
        let mut w = MessageWriter::new(&mut bytes, ty, req.code, 0, token.as_slice())
            .map_err(RequestError::Encode)?;
        for (n, v) in &options {
            w.option(*n, v).map_err(RequestError::Encode)?;
        }
        w.payload(&req.payload).map_err(RequestError::Encode)?;
        let written = w.finish();
        bytes.truncate(written);

        let id = ExchangeId(self.next_id);
        self.next_id += 1;
        self.stats.requests += 1;
        self.exchanges.insert(
            id,
            Exchange {
                dest,
                confirmable: req.confirmable,
                token,
                mid: 0,
                bytes,
                first_tx: now,
                deadline: None,
                retransmissions: 0,
                state: State::Queued,
            },
        );
        self.by_token.insert((dest, token), id);
        self.dests.entry(dest).or_default().queue.push_back(id);
        self.start_queued(now, dest);
        Ok(id)
    }

    /// The next datagram to send, if any. Call until `None` after every
    /// other call.
    pub fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next application event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called;
    /// `None` when no exchange is waiting on a timer.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(Reverse((t, id))) = self.timers.peek().copied() {
            if self.is_current_timer(t, id) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
    }

    /// Fires every timer due at `now`: retransmissions, give-ups and
    /// response timeouts.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.prune_seen(now);
        while let Some(Reverse((t, id))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            if !self.is_current_timer(t, id) {
                continue;
            }
            self.fire(now, id);
        }
    }

    /// Processes one datagram received from `src`. A response's payload and
    /// option values are copied out of `datagram` into its [`Event`].
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, datagram: &[u8]) {
        self.receive(now, src, datagram, None);
    }

    /// Processes one datagram received from `src` into a shared buffer: a
    /// response's payload and option values in its [`Event`] are slices of
    /// `datagram`, nothing is copied.
    pub fn handle_datagram_bytes(&mut self, now: Instant, src: SocketAddr, datagram: Bytes) {
        self.receive(now, src, &datagram, Some(&datagram));
    }

    /// `owner`, when given, is the buffer `datagram` lives in.
    fn receive(&mut self, now: Instant, src: SocketAddr, datagram: &[u8], owner: Option<&Bytes>) {
        self.stats.datagrams_received += 1;
        self.prune_seen(now);
        let Ok(pkt) = Packet::new_checked(datagram) else {
            self.stats.malformed += 1;
            return;
        };
        let code = pkt.code();
        match pkt.msg_type() {
            MessageType::Ack if code.is_empty() || code.is_response() => {
                self.on_ack(now, src, &pkt, owner)
            }
            MessageType::Rst if code.is_empty() => self.on_reset(now, src, pkt.message_id()),
            MessageType::Con | MessageType::Non if code.is_response() => {
                self.on_separate(now, src, &pkt, owner)
            }
            MessageType::Con if code.is_empty() || code.is_request() => {
                // A ping, or a request to a client that serves nothing.
                self.stats.unmatched += 1;
                self.send_empty(src, MessageType::Rst, pkt.message_id());
            }
            MessageType::Non if code.is_request() => self.stats.unmatched += 1,
            // ACK with a request code, RST with content, empty NON: all
            // message-format errors (RFC 7252 4.1-4.3).
            _ => self.stats.malformed += 1,
        }
    }

    /// An ACK from `src`: empty (the request arrived, a separate response
    /// follows) or carrying the response.
    fn on_ack(
        &mut self,
        now: Instant,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
        owner: Option<&Bytes>,
    ) {
        let Some(&id) = self.by_mid.get(&(src, pkt.message_id())) else {
            self.stats.unmatched += 1;
            return;
        };
        let Some(ex) = self.exchanges.get(&id) else {
            self.stats.unmatched += 1;
            return;
        };
        // Only a CON is acknowledged; a piggybacked response must also carry
        // the request's token (RFC 7252 5.3.2).
        let acked = ex.confirmable && matches!(ex.state, State::AwaitingAck { .. });
        if !acked || (!pkt.code().is_empty() && pkt.token() != ex.token.as_slice()) {
            self.stats.unmatched += 1;
            return;
        }
        self.acknowledged(now, id);
        if pkt.code().is_empty() {
            let deadline = deadline_after(now, self.config.separate_timeout);
            if let Some(ex) = self.exchanges.get_mut(&id) {
                ex.state = State::AwaitingResponse { holds_slot: false };
                ex.deadline = Some(deadline);
            }
            self.timers.push(Reverse((deadline, id)));
            self.release_slot(now, src);
        } else {
            self.complete(now, id, pkt, owner);
        }
    }

    /// A Reset from `src` rejecting one of our messages.
    fn on_reset(&mut self, now: Instant, src: SocketAddr, mid: u16) {
        let Some(id) = self.by_mid.get(&(src, mid)).copied() else {
            self.stats.unmatched += 1;
            return;
        };
        self.stats.resets += 1;
        self.events.push_back(Event::Reset { id });
        // A Reset is not an acknowledgement: it tells the controller nothing
        // about the path's round-trip time.
        self.finish(now, id);
    }

    /// A CON or NON from `src` carrying a response (a separate response, or
    /// the response to a NON request).
    fn on_separate(
        &mut self,
        now: Instant,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
        owner: Option<&Bytes>,
    ) {
        let mid = pkt.message_id();
        let con = pkt.msg_type() == MessageType::Con;
        if let Some(&(_, reply)) = self.seen.get(&(src, mid)) {
            self.stats.duplicates += 1;
            match reply {
                Reply::Ack => self.send_empty(src, MessageType::Ack, mid),
                Reply::Rst => self.send_empty(src, MessageType::Rst, mid),
                Reply::Nothing => {}
            }
            return;
        }
        let id = Token::from_slice(pkt.token())
            .and_then(|t| self.by_token.get(&(src, t)).copied())
            .filter(|id| {
                self.exchanges
                    .get(id)
                    .is_some_and(|ex| !matches!(ex.state, State::Queued))
            });
        let reply = match (id, con) {
            (Some(_), true) => Reply::Ack,
            (None, true) => Reply::Rst,
            (_, false) => Reply::Nothing,
        };
        self.remember(now, src, mid, con, reply);
        match reply {
            Reply::Ack => self.send_empty(src, MessageType::Ack, mid),
            Reply::Rst => self.send_empty(src, MessageType::Rst, mid),
            Reply::Nothing => {}
        }
        let Some(id) = id else {
            self.stats.unmatched += 1;
            return;
        };
        if self
            .exchanges
            .get(&id)
            .is_some_and(|ex| matches!(ex.state, State::AwaitingAck { .. }))
        {
            // The response overtook the ACK (or the ACK was lost): it
            // acknowledges the request implicitly (RFC 7252 5.3.2).
            self.acknowledged(now, id);
        }
        self.complete(now, id, pkt, owner);
    }

    /// The message layer of CON exchange `id` is done: tell the controller
    /// and stop retransmitting.
    fn acknowledged(&mut self, now: Instant, id: ExchangeId) {
        if let Some(ex) = self.exchanges.get(&id) {
            let rtt = now.saturating_duration_since(ex.first_tx);
            self.rto.on_response(ex.dest, now, rtt, ex.retransmissions);
            self.by_mid.remove(&(ex.dest, ex.mid));
        }
    }

    /// Ends exchange `id` with the response in `pkt`, whose bytes live in
    /// `owner` when given (then sliced, not copied).
    fn complete(
        &mut self,
        now: Instant,
        id: ExchangeId,
        pkt: &Packet<&[u8]>,
        owner: Option<&Bytes>,
    ) {
        let Some(ex) = self.exchanges.get(&id) else {
            return;
        };
        let mut copied = 0;
        let mut take = |part: &[u8]| match owner {
            Some(b) if !part.is_empty() => b.slice_ref(part),
            _ => {
                copied += part.len() as u64;
                Bytes::copy_from_slice(part)
            }
        };
        self.stats.responses += 1;
        self.events.push_back(Event::Response {
            id,
            code: pkt.code(),
            msg_type: pkt.msg_type(),
            options: pkt.options().map(|o| (o.number, take(o.value))).collect(),
            payload: take(pkt.payload()),
            rtt: now.saturating_duration_since(ex.first_tx),
            retransmissions: ex.retransmissions,
        });
        self.stats.bytes_copied += copied;
        self.finish(now, id);
    }

    /// Removes exchange `id` from every table and frees its NSTART slot,
    /// starting the next queued exchange to its destination in it.
    fn finish(&mut self, now: Instant, id: ExchangeId) {
        let Some(ex) = self.exchanges.remove(&id) else {
            return;
        };
        self.by_token.remove(&(ex.dest, ex.token));
        if self.by_mid.get(&(ex.dest, ex.mid)) == Some(&id) {
            self.by_mid.remove(&(ex.dest, ex.mid));
        }
        if ex.state.holds_slot() {
            self.release_slot(now, ex.dest);
        }
    }

    /// Sends exchange `id` for the first time: takes an NSTART slot, assigns
    /// a message ID and arms its timer.
    fn start(&mut self, now: Instant, id: ExchangeId) {
        let Some(ex) = self.exchanges.get(&id) else {
            return;
        };
        let dest = ex.dest;
        let confirmable = ex.confirmable;
        let mid = self.new_mid(dest);
        let in_flight = {
            let d = self.dests.entry(dest).or_default();
            d.outstanding += 1;
            d.outstanding
        };
        let (state, timeout) = if confirmable {
            let rto = self.rto.initial_rto(dest, now, in_flight);
            (State::AwaitingAck { rto }, rto)
        } else {
            (
                State::AwaitingResponse { holds_slot: true },
                self.config.non_timeout,
            )
        };
        let deadline = deadline_after(now, timeout);
        let Some(ex) = self.exchanges.get_mut(&id) else {
            return;
        };
        ex.mid = mid;
        ex.bytes[2..4].copy_from_slice(&mid.to_be_bytes());
        ex.first_tx = now;
        ex.state = state;
        ex.deadline = Some(deadline);
        let bytes = ex.bytes.clone();
        if !confirmable {
            self.non_sent.insert(dest, now);
        }
        self.by_mid.insert((dest, mid), id);
        self.timers.push(Reverse((deadline, id)));
        self.stats.transmissions += 1;
        self.transmits.push_back(Transmit { dest, bytes });
    }

    /// The timer of exchange `id` expired at `now`: retransmit, give up or
    /// time out.
    fn fire(&mut self, now: Instant, id: ExchangeId) {
        let Some(ex) = self.exchanges.get(&id) else {
            return;
        };
        let dest = ex.dest;
        let retransmissions = ex.retransmissions;
        match ex.state {
            State::AwaitingAck { rto } if retransmissions < self.rto.max_retransmit(dest) => {
                let n = retransmissions + 1;
                let next = self.rto.backoff(dest, now, rto, n);
                let deadline = deadline_after(now, next);
                let Some(ex) = self.exchanges.get_mut(&id) else {
                    return;
                };
                ex.retransmissions = n;
                ex.state = State::AwaitingAck { rto: next };
                ex.deadline = Some(deadline);
                let bytes = ex.bytes.clone();
                self.timers.push(Reverse((deadline, id)));
                self.stats.retransmissions += 1;
                self.transmits.push_back(Transmit { dest, bytes });
            }
            State::AwaitingAck { .. } => {
                self.rto.on_give_up(dest, now, retransmissions);
                self.time_out(now, id);
            }
            State::AwaitingResponse { .. } => self.time_out(now, id),
            // A queued NON held back by pacing: its time has come.
            State::Queued => self.start_queued(now, dest),
        }
    }

    fn time_out(&mut self, now: Instant, id: ExchangeId) {
        self.stats.timeouts += 1;
        self.events.push_back(Event::Timeout { id });
        self.finish(now, id);
    }

    /// Frees one NSTART slot at `dest` and starts queued exchanges in the
    /// free slots.
    fn release_slot(&mut self, now: Instant, dest: SocketAddr) {
        if let Some(d) = self.dests.get_mut(&dest) {
            d.outstanding = d.outstanding.saturating_sub(1);
        }
        self.start_queued(now, dest);
    }

    /// Starts queued exchanges to `dest` while it has free NSTART slots;
    /// forgets `dest` once it is idle.
    fn start_queued(&mut self, now: Instant, dest: SocketAddr) {
        let nstart = self.rto.nstart(dest).max(1);
        loop {
            let Some(d) = self.dests.get_mut(&dest) else {
                return;
            };
            if d.outstanding >= nstart {
                return;
            }
            if let Some(&front) = d.queue.front() {
                if let Some(ready) = self.non_ready_at(front, dest) {
                    if ready > now {
                        // paced: wake up when the interval has passed
                        if let Some(ex) = self.exchanges.get_mut(&front) {
                            if ex.deadline != Some(ready) {
                                ex.deadline = Some(ready);
                                self.timers.push(Reverse((ready, front)));
                            }
                        }
                        return;
                    }
                }
            }
            let Some(d) = self.dests.get_mut(&dest) else {
                return;
            };
            match d.queue.pop_front() {
                Some(next) => self.start(now, next),
                None => {
                    if d.outstanding == 0 {
                        self.dests.remove(&dest);
                    }
                    return;
                }
            }
        }
    }

    /// For a queued NON exchange to a destination whose controller paces
    /// NONs, the earliest instant it may be sent; `None` when unpaced.
    fn non_ready_at(&self, id: ExchangeId, dest: SocketAddr) -> Option<Instant> {
        let ex = self.exchanges.get(&id)?;
        if ex.confirmable {
            return None;
        }
        let interval = self.rto.non_interval(dest)?;
        let last = self.non_sent.get(&dest)?;
        Some(deadline_after(*last, interval))
    }

    /// Whether the heap entry (t, id) is the current deadline of a live
    /// exchange.
    fn is_current_timer(&self, t: Instant, id: ExchangeId) -> bool {
        self.exchanges
            .get(&id)
            .is_some_and(|ex| ex.deadline == Some(t))
    }

    /// A random token not used by a live exchange to `dest`.
    fn new_token(&mut self, dest: SocketAddr) -> Token {
        let len = self.config.token_len.clamp(4, 8);
        loop {
            let t = Token::new(self.rng.random(), len);
            if !self.by_token.contains_key(&(dest, t)) {
                return t;
            }
        }
    }

    /// The next message ID not awaiting an ACK or Reset from `dest`.
    fn new_mid(&mut self, dest: SocketAddr) -> u16 {
        // At most 65536 IDs can be in use; the scan is bounded by that.
        for _ in 0..=u16::MAX as u32 {
            let mid = self.next_mid;
            self.next_mid = self.next_mid.wrapping_add(1);
            if !self.by_mid.contains_key(&(dest, mid)) {
                return mid;
            }
        }
        // Every ID is in use towards `dest` (65536 outstanding exchanges,
        // far beyond any NSTART): reuse the next one.
        self.next_mid
    }

    /// Queues an empty ACK or RST with `mid` to `dest`.
    fn send_empty(&mut self, dest: SocketAddr, ty: MessageType, mid: u16) {
        let mut bytes = vec![0u8; crate::wire::HEADER_LEN];
        let Ok(w) = MessageWriter::new(&mut bytes, ty, Code::EMPTY, mid, &[]) else {
            return;
        };
        w.finish();
        match ty {
            MessageType::Ack => self.stats.acks_sent += 1,
            _ => self.stats.resets_sent += 1,
        }
        self.transmits.push_back(Transmit { dest, bytes });
    }

    /// Records a CON or NON received from `src` for de-duplication.
    fn remember(&mut self, now: Instant, src: SocketAddr, mid: u16, con: bool, reply: Reply) {
        let life = if con {
            self.config.params.exchange_lifetime()
        } else {
            self.config.params.non_lifetime()
        };
        let expiry = deadline_after(now, life);
        self.seen.insert((src, mid), (expiry, reply));
        self.seen_order.push_back((expiry, (src, mid)));
    }

    /// Forgets received message IDs whose lifetime is over. Entries are
    /// checked in arrival order, so one may outlive its lifetime by up to
    /// EXCHANGE_LIFETIME - NON_LIFETIME; none is forgotten early.
    fn prune_seen(&mut self, now: Instant) {
        if self.non_sent.len() > 64 {
            self.non_sent
                .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(60));
        }
        while let Some(&(expiry, key)) = self.seen_order.front() {
            if expiry > now {
                break;
            }
            self.seen_order.pop_front();
            if self.seen.get(&key).is_some_and(|(e, _)| *e == expiry) {
                self.seen.remove(&key);
            }
        }
    }
}

/// `now + d`; where that overflows `Instant`, about 136 years from `now`
/// (and `now` itself only if even that overflows).
fn deadline_after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u32::MAX as u64)))
        .unwrap_or(now)
}
