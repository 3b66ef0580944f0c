//! One CoAP connection over a reliable transport (RFC 8323: TCP, TLS or
//! WebSockets), server side, sans-IO.
//!
//! ```text
//!  bytes ──receive──> frames ──> signals: CSM (theirs), Ping → Pong, Release, Abort
//!                          └──> requests ──serve──> responses ──> output bytes
//!  clock ──handle_timeout──> Abort of a frame left half-sent
//! ```
//!
//! The connection sends its CSM first, holds the peer to the first message
//! being its CSM (section 5.3), takes nothing larger than its own
//! Max-Message-Size (a longer frame is refused with Abort before it is
//! buffered) and sends nothing larger than the peer's. A request is handed
//! to the caller's `serve` in the RFC 7252 form (as a CON with message ID
//! 0), so the same router, resources and access rules answer it as over
//! UDP; its response goes back as a frame with the request's token. There
//! is no de-duplication, no message ID and no retransmission: the transport
//! is reliable. The caller reads and writes the socket, and calls
//! [`Connection::handle_timeout`] now and then.
//!
//! Observe (RFC 7641 over RFC 8323 7.2): the caller registers observers
//! when it answers a GET with Observe, and hands the notifications, in RFC
//! 7252 form, to [`Connection::notify`], which frames them like responses
//! (no message type, no message ID, no ACK).
//!
//! Bounded: the input buffer never holds more than one frame of at most
//! Max-Message-Size bytes; the output buffer holds what the caller has not
//! yet written (the answers to at most one read's worth of requests, and
//! the notifications handed over since the last write).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Answer, Request};
use crate::wire::tcp::DEFAULT_MAX_MESSAGE_SIZE;
use crate::wire::tcp::{frame_from_udp, frame_len, FrameError, Outbox, SignalError};
use crate::wire::{Code, Framing, MessageType, Packet, RawOption, Signal, TcpPacket, TcpRepr};
use bert::Served;

/// Room left in a response frame for its header and options when the
/// payload limit is worked out from the peer's Max-Message-Size.
const RESPONSE_OVERHEAD: usize = 128;

/// Settings of a [`Connection`].
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// The Max-Message-Size of our CSM: no frame larger is taken.
    pub max_message_size: u32,
    /// Largest response payload a handler may produce (further held to the
    /// peer's Max-Message-Size).
    pub max_payload: usize,
    /// A frame begun but not finished within this long aborts the
    /// connection.
    pub frame_timeout: Duration,
    /// Offer BERT (RFC 8323 section 6) in our CSM; used when the peer's
    /// CSM offers it too ([`bert`]).
    pub bert: bool,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            max_message_size: 8192,
            max_payload: super::DEFAULT_MAX_PAYLOAD,
            frame_timeout: Duration::from_secs(5),
            bert: true,
        }
    }
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// We sent an Abort (a malformed frame, a frame over our
    /// Max-Message-Size, no CSM first, a bad CSM, a half-sent frame that
    /// timed out).
    Aborted(AbortReason),
    /// The peer sent an Abort.
    PeerAbort,
    /// The peer sent a Release.
    PeerRelease,
    /// We sent a Release ([`Connection::release`]).
    Released,
}

/// Why we aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// Not a well-formed frame.
    Malformed(FrameError),
    /// A frame longer than our Max-Message-Size.
    TooLarge,
    /// The first message was not a CSM.
    NoCsm,
    /// A signal we cannot take (unknown code, unknown critical option, bad
    /// value).
    BadSignal(SignalError),
    /// A frame begun and left unfinished past the frame timeout.
    Stalled,
}

impl AbortReason {
    /// Diagnostic text sent in the Abort's payload.
    pub fn text(self) -> &'static str {
        match self {
            AbortReason::Malformed(_) => "malformed message",
            AbortReason::TooLarge => "message larger than Max-Message-Size",
            AbortReason::NoCsm => "first message is not a CSM",
            AbortReason::BadSignal(_) => "bad signalling message",
            AbortReason::Stalled => "message not completed in time",
        }
    }
}

/// What a connection has seen (per connection; the caller sums them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Requests handed to `serve`.
    pub requests: u64,
    /// Responses sent.
    pub responses: u64,
    /// Pings answered.
    pub pings: u64,
    /// Notifications sent.
    pub notifications: u64,
    /// Notifications not sent: larger than the peer's Max-Message-Size, or
    /// the connection was closing.
    pub notifications_dropped: u64,
    /// Messages ignored (0.00 Empty, responses, Pongs).
    pub ignored: u64,
}

/// The server side of one RFC 8323 connection.
pub struct Connection {
    framing: Framing,
    peer: SocketAddr,
    cfg: ConnectionConfig,
    inbuf: Vec<u8>,
    out: Outbox,
    scratch: Vec<u8>,
    peer_max: u32,
    peer_csm: bool,
    /// The peer's CSM offered Block-wise transfer (BERT).
    peer_bert: bool,
    partial_since: Option<Instant>,
    closed: Option<Closed>,
    stats: ConnectionStats,
}

impl Connection {
    /// A new connection with `peer`; our CSM is the first output.
    pub fn new(framing: Framing, peer: SocketAddr, cfg: ConnectionConfig) -> Connection {
        let mut out = Outbox::new();
        Signal::Csm {
            max_message_size: Some(cfg.max_message_size),
            block_wise: cfg.bert,
        }
        .emit_vec(framing, &[], out.buf());
        out.end_message();
        Connection {
            framing,
            peer,
            cfg,
            inbuf: Vec::new(),
            out,
            scratch: Vec::new(),
            peer_max: DEFAULT_MAX_MESSAGE_SIZE,
            peer_csm: false,
            peer_bert: false,
            partial_since: None,
            closed: None,
            stats: ConnectionStats::default(),
        }
    }

    /// The peer.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The peer's Max-Message-Size (1152 until its CSM says otherwise).
    pub fn peer_max_message_size(&self) -> u32 {
        self.peer_max
    }

    /// Whether the peer's CSM has come.
    pub fn peer_csm_received(&self) -> bool {
        self.peer_csm
    }

    /// Why the connection ended, once it has: write out the rest of
    /// [`Connection::output`], then close.
    pub fn closed(&self) -> Option<Closed> {
        self.closed
    }

    /// The counts so far.
    pub fn stats(&self) -> ConnectionStats {
        self.stats
    }

    // As ClientConnection's (client/tcp.rs): see the note there.
    /// Bytes to write to the transport (all of them, in order).
    pub fn output(&self) -> &[u8] {
        self.out.bytes()
    }

    /// The first whole message of the output (over WebSockets, one binary
    /// WebSocket message); [`Connection::consume_output`] its length once
    /// sent.
    pub fn next_message(&self) -> Option<&[u8]> {
        self.out.next_message()
    }

    /// Drops the first `n` bytes of the output, written.
    pub fn consume_output(&mut self, n: usize) {
        self.out.consume(n);
    }

    /// Whether a frame has begun and not yet ended.
    pub fn has_partial_frame(&self) -> bool {
        !self.inbuf.is_empty()
    }

    /// Takes bytes read from a TCP or TLS stream (any split).
    pub fn receive(
        &mut self,
        now: Instant,
        data: &[u8],
        serve: &mut dyn FnMut(&Request<'_>, usize) -> Answer,
    ) {
        debug_assert_eq!(self.framing, Framing::Stream);
        let mut data = data;
        while self.closed.is_none() && !data.is_empty() {
            // a frame's header first, then exactly its length: the buffer
            // never holds more than one frame
            let want = match frame_len(&self.inbuf) {
                Err(e) => return self.abort(AbortReason::Malformed(e)),
                Ok(None) => self.inbuf.len() + 1,
                Ok(Some(n)) if n > self.cfg.max_message_size as u64 => {
                    return self.abort(AbortReason::TooLarge)
                }
                Ok(Some(n)) => n as usize,
            };
            let take = (want - self.inbuf.len()).min(data.len());
            self.inbuf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if let Ok(Some(n)) = frame_len(&self.inbuf) {
                if n > self.cfg.max_message_size as u64 {
                    return self.abort(AbortReason::TooLarge);
                }
                if n as usize == self.inbuf.len() {
                    let frame = std::mem::take(&mut self.inbuf);
                    self.frame(&frame, serve);
                    self.inbuf = frame;
                    self.inbuf.clear();
                    continue;
                }
            }
        }
        if self.inbuf.is_empty() {
            self.partial_since = None;
        } else if self.partial_since.is_none() {
            self.partial_since = Some(now);
        }
    }

    /// Takes one WebSocket message (one frame, Len 0).
    pub fn receive_message(
        &mut self,
        msg: &[u8],
        serve: &mut dyn FnMut(&Request<'_>, usize) -> Answer,
    ) {
        debug_assert_eq!(self.framing, Framing::WebSocket);
        if self.closed.is_some() {
            return;
        }
        if msg.len() > self.cfg.max_message_size as usize {
            return self.abort(AbortReason::TooLarge);
        }
        self.frame(msg, serve);
    }

    /// Aborts a frame left half-sent past the frame timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(t) = self.partial_since {
            if self.closed.is_none() && now.duration_since(t) >= self.cfg.frame_timeout {
                self.abort(AbortReason::Stalled);
            }
        }
    }

    /// When [`Connection::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.partial_since.map(|t| t + self.cfg.frame_timeout)
    }

    /// Queues a notification (`udp`: the message in RFC 7252 form, its
    /// type and message ID are dropped) for the peer; false when it was
    /// not queued (the connection is closing, no CSM has come yet, or the
    /// frame would be larger than the peer's Max-Message-Size: a
    /// notification is never cut, and the next one may fit).
    pub fn notify(&mut self, udp: &[u8]) -> bool {
        let at = self.out.len();
        let queued = self.closed.is_none()
            && self.peer_csm
            && Packet::new_checked(udp)
                .map(|p| frame_from_udp(self.framing, &p, self.out.buf()))
                .is_ok()
            && self.out.len() - at <= self.peer_max as usize;
        if queued {
            self.out.end_message();
            self.stats.notifications += 1;
        } else {
            self.out.truncate(at);
            self.stats.notifications_dropped += 1;
        }
        queued
    }

    /// Sends a Release (shutting down, idle) and ends the connection.
    pub fn release(&mut self) {
        if self.closed.is_none() {
            Signal::Release {
                alternative_address: None,
                hold_off: None,
            }
            .emit_vec(self.framing, &[], self.out.buf());
            self.out.end_message();
            self.inbuf.clear();
            self.partial_since = None;
            self.closed = Some(Closed::Released);
        }
    }

    /// Sends an Abort and ends the connection (also for the transport's
    /// own reasons: a WebSocket message over Max-Message-Size or stalled).
    pub fn abort(&mut self, why: AbortReason) {
        if self.closed.is_some() {
            return;
        }
        let bad_csm_option = match why {
            AbortReason::BadSignal(SignalError::UnknownCritical(n) | SignalError::BadValue(n)) => {
                Some(n.0)
            }
            _ => None,
        };
        Signal::Abort {
            bad_csm_option,
            diagnostic: why.text().as_bytes(),
        }
        .emit_vec(self.framing, &[], self.out.buf());
        self.out.end_message();
        self.inbuf.clear();
        self.partial_since = None;
        self.closed = Some(Closed::Aborted(why));
    }

    fn frame(&mut self, frame: &[u8], serve: &mut dyn FnMut(&Request<'_>, usize) -> Answer) {
        let p = match TcpPacket::new_checked(frame, self.framing) {
            Ok(p) => p,
            Err(e) => return self.abort(AbortReason::Malformed(e)),
        };
        let code = p.code();
        if !self.peer_csm && code != Code::CSM {
            return self.abort(AbortReason::NoCsm);
        }
        if p.is_signal() {
            return self.signal(&p);
        }
        if !code.is_request() {
            // 0.00 Empty is always ignored (RFC 8323 3.4); so are responses:
            // this side sends no requests
            self.stats.ignored += 1;
            return;
        }
        self.stats.requests += 1;
        self.scratch.clear();
        if p.to_udp(MessageType::Con, 0, &mut self.scratch).is_none() {
            return self.abort(AbortReason::TooLarge);
        }
        let Ok(udp) = Packet::new_checked(&self.scratch[..]) else {
            // options and payload passed the same check: unreachable, but
            // answered as a format error rather than trusted
            return self.abort(AbortReason::Malformed(FrameError::Truncated));
        };
        let req = Request {
            peer: self.peer,
            packet: &udp,
            identity: None,
        };
        let limit = (self.peer_max as usize)
            .saturating_sub(RESPONSE_OVERHEAD)
            .clamp(16, self.cfg.max_payload.max(16));
        // the options are looked at only where both sides offered BERT
        let bert = (self.cfg.bert && self.peer_bert)
            .then(|| bert::bert_option(&udp))
            .flatten();
        let answer = match bert {
            Some((which, value)) => {
                // as many 1024-byte blocks as both sides take in a frame
                let cap = (self.peer_max.min(self.cfg.max_message_size) as usize)
                    .saturating_sub(RESPONSE_OVERHEAD);
                bert::serve_bert(&req, which, value, cap / bert::UNIT, limit, serve)
            }
            None => match serve(&req, limit) {
                Answer::Send(o) => Served::Send(o.to_vec()),
                Answer::Silent => Served::Silent,
                Answer::Exhausted => Served::Exhausted,
            },
        };
        let token = p.token();
        match answer {
            Served::Send(bytes) => {
                let at = self.out.len();
                match Packet::new_checked(&bytes[..]) {
                    Ok(r) => frame_from_udp(self.framing, &r, self.out.buf()),
                    Err(_) => self.simple(Code::INTERNAL_SERVER_ERROR, token),
                }
                if self.out.len() - at > self.peer_max as usize {
                    // larger than the peer takes: say so in a few bytes
                    self.out.truncate(at);
                    self.simple(Code::INTERNAL_SERVER_ERROR, token);
                }
                self.out.end_message();
            }
            Served::Exhausted => self.simple(Code::SERVICE_UNAVAILABLE, token),
            Served::Silent => return,
        }
        self.stats.responses += 1;
    }

    /// Appends a response with `code` and no options or payload.
    fn simple(&mut self, code: Code, token: &[u8]) {
        let r = TcpRepr {
            code,
            token,
            options: Vec::<RawOption<'_>>::new(),
            payload: &[],
        };
        let _ = r.emit_vec(self.framing, self.out.buf());
        self.out.end_message();
    }

    fn signal(&mut self, p: &TcpPacket<&[u8]>) {
        let s = match Signal::parse(p) {
            Ok(s) => s,
            Err(e) => return self.abort(AbortReason::BadSignal(e)),
        };
        match s {
            Signal::Csm {
                max_message_size,
                block_wise,
            } => {
                self.peer_csm = true;
                self.peer_bert = block_wise;
                if let Some(m) = max_message_size {
                    // a peer that says it takes less than a bare response
                    // is held to a floor that still lets 5.00 through
                    self.peer_max = m.max(16);
                }
            }
            Signal::Ping { custody } => {
                self.stats.pings += 1;
                // every earlier message is processed already: custody is
                // given when asked for
                Signal::Pong { custody }.emit_vec(self.framing, p.token(), self.out.buf());
                self.out.end_message();
            }
            Signal::Pong { .. } => self.stats.ignored += 1,
            Signal::Release { .. } => self.closed = Some(Closed::PeerRelease),
            Signal::Abort { .. } => self.closed = Some(Closed::PeerAbort),
        }
    }
}

pub mod bert;

#[cfg(test)]
mod tests;
