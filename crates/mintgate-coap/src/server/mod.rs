//! The server side of the message and request layers, sans-IO.
//!
//! [`classify`] decides what a datagram is, with the RFC 7252 rules for
//! malformed and empty messages; [`Dedup`] remembers (peer, message ID) pairs;
//! [`handle_request`] routes a request to its [`Resource`] and builds the
//! answer with a [`ResponseBuilder`] in a pooled block;
//! [`process_request_blockwise`] first puts a request body sent in blocks
//! back together ([`Block1Store`], RFC 7959). The gateway adds the sockets,
//! queues and threads around these.

pub mod block;
pub mod block1;
mod dedup;
pub mod endpoint;
pub mod observe;
mod resource;
mod response;
pub mod source;
pub mod tcp;

pub use block1::{Block1Config, Block1Outcome, Block1Stats, Block1Store};
pub use dedup::{Dedup, DedupSize, DedupStats, Seen, Weigh, DEFAULT_BYTES_PER_ENTRY};
pub use endpoint::{
    Datagram, Endpoint, EndpointConfig, EndpointStats, Incoming, Responded, Ticket, Transmit,
};
pub use resource::{Handler, PathTaken, Request, Resource, Router};
pub use response::{BuildError, Outgoing, ResponseBuilder, Tail, OPTION_SPACE, RESPONSE_HEADROOM};
pub use source::Source;

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use mintgate_buf::Pool;

use crate::wire::{Code, ContentFormat, MessageType, OptionNumber, Packet, ParseError};
use block::BlockOpt;

/// Why a datagram was dropped without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Not a CoAP message we can read (too short, unknown version).
    Unreadable,
    /// A malformed NON, ACK or RST (answered by silence).
    FormatError,
    /// An Empty NON, or an ACK/RST with a request code.
    Misplaced,
    /// A response arriving at the server socket that nothing waits for.
    UnexpectedResponse,
}

/// What [`classify`] found.
#[derive(Debug)]
pub enum Inbound<'a> {
    /// A request (CON or NON) for the handlers.
    Request(Packet<&'a [u8]>),
    /// Answer at once with this 4-byte Reset (malformed CON, CoAP ping, or
    /// an unexpected CON response).
    Reset([u8; 4], ResetReason),
    /// A peer's ACK for one of our CON messages.
    Ack(u16),
    /// A peer's Reset of one of our messages.
    PeerReset(u16),
    /// Drop, counting the reason.
    Drop(DropReason),
}

/// Why a Reset is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetReason {
    /// A CON that failed the format check (RFC 7252 4.2).
    FormatError(ParseError),
    /// An Empty CON: CoAP ping (RFC 7252 4.3).
    Ping,
    /// A CON response nobody is waiting for.
    UnexpectedResponse,
}

/// Classifies a received datagram by the message-layer rules of RFC 7252.
pub fn classify(datagram: &[u8]) -> Inbound<'_> {
    let p = match Packet::new_checked(datagram) {
        Ok(p) => p,
        Err(e) if e.has_header() => {
            let (_, ty, _, mid) = Packet::<&[u8]>::peek_header(datagram).unwrap_or((
                0,
                MessageType::Non,
                Code::EMPTY,
                0,
            ));
            return if ty == MessageType::Con {
                Inbound::Reset(
                    crate::wire::empty_message(MessageType::Rst, mid),
                    ResetReason::FormatError(e),
                )
            } else {
                Inbound::Drop(DropReason::FormatError)
            };
        }
        Err(_) => return Inbound::Drop(DropReason::Unreadable),
    };
    let code = p.code();
    let mid = p.message_id();
    match p.msg_type() {
        MessageType::Ack if code.is_empty() => Inbound::Ack(mid),
        MessageType::Rst if code.is_empty() => Inbound::PeerReset(mid),
        MessageType::Ack | MessageType::Rst if code.is_request() => {
            Inbound::Drop(DropReason::Misplaced)
        }
        MessageType::Rst => Inbound::Drop(DropReason::FormatError),
        MessageType::Ack => Inbound::Drop(DropReason::UnexpectedResponse),
        MessageType::Con if code.is_empty() => Inbound::Reset(
            crate::wire::empty_message(MessageType::Rst, mid),
            ResetReason::Ping,
        ),
        MessageType::Non if code.is_empty() => Inbound::Drop(DropReason::Misplaced),
        MessageType::Con | MessageType::Non if code.is_request() => Inbound::Request(p),
        MessageType::Con => Inbound::Reset(
            crate::wire::empty_message(MessageType::Rst, mid),
            ResetReason::UnexpectedResponse,
        ),
        MessageType::Non => Inbound::Drop(DropReason::UnexpectedResponse),
    }
}

/// The outcome of [`handle_request`].
#[derive(Debug)]
pub enum Answer {
    /// Send this.
    Send(Outgoing),
    /// Send nothing (a NON carrying an unrecognized critical option).
    Silent,
    /// No pool block was free: the request is shed.
    Exhausted,
}

/// Default largest payload a handler may produce in one response.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024;

/// Which option, if any, makes the request unprocessable: an unrecognized
/// critical option, or a recognized critical one with a value length outside
/// its range (RFC 7252 5.4.1, 5.4.3).
pub fn bad_critical_option(p: &Packet<&[u8]>) -> Option<OptionNumber> {
    p.options()
        .find(|o| {
            o.number.is_critical()
                && match o.number.def() {
                    None => true,
                    Some(d) => !d.len_ok(o.value.len()),
                }
        })
        .map(|o| o.number)
}

/// What the request layer made of a request.
// The builder is large (inline option space) but is moved once per request;
// boxing it would put a heap allocation on the hot path.
#[allow(clippy::large_enum_variant)]
pub enum Handled {
    /// A response, to be finished with the type and message ID the caller
    /// picks (piggybacked ACK, separate CON, or NON).
    Respond(ResponseBuilder),
    /// Send nothing (a NON carrying an unrecognized critical option).
    Silent,
}

/// Routes `req` and runs its handler. Errors map to 4.02, 4.04, 4.05,
/// 4.15 and 5.05 as RFC 7252 says; the handler sees a builder whose first
/// block, taken at the first payload byte, holds at least `payload_hint`
/// bytes (it grows, up to `max_payload`). Pool exhaustion shows when the
/// response is finished.
pub fn process_request(
    router: &Router,
    pool: &Pool,
    req: &Request<'_>,
    payload_hint: usize,
    max_payload: usize,
) -> Handled {
    let p = req.packet;
    let con = p.msg_type() == MessageType::Con;
    let mut rb = ResponseBuilder::in_pool(pool, payload_hint).with_limit(max_payload);
    if let Some(bad) = bad_critical_option(p) {
        if !con {
            return Handled::Silent;
        }
        rb.set_code(Code::BAD_OPTION)
            .content_format(ContentFormat::TEXT_PLAIN);
        let mut msg = [0u8; 48];
        let n = fmt_into(
            &mut msg,
            format_args!("unrecognized critical option {}", bad.0),
        );
        rb.write(&msg[..n]);
    } else if p.option(OptionNumber::PROXY_URI).is_some()
        || p.option(OptionNumber::PROXY_SCHEME).is_some()
    {
        rb.set_code(Code::PROXYING_NOT_SUPPORTED);
    } else if is_well_known_core(p) {
        if p.code() != Code::GET {
            rb.set_code(Code::METHOD_NOT_ALLOWED);
        } else if req
            .accept()
            .is_some_and(|a| a != ContentFormat::LINK_FORMAT)
        {
            rb.set_code(Code::NOT_ACCEPTABLE);
        } else {
            let filter = req.query().next();
            let doc = router.well_known_core(filter);
            rb.content_format(ContentFormat::LINK_FORMAT);
            // block-wise when asked for, or when larger than a block
            block::respond_block2(req, &mut rb, doc.as_bytes(), max_payload.clamp(16, 1024));
        }
    } else {
        match router.find(req) {
            None => {
                rb.set_code(Code::NOT_FOUND);
            }
            Some(r) => match r.handler(p.code()) {
                None => {
                    rb.set_code(Code::METHOD_NOT_ALLOWED);
                }
                Some(_) if !r.accepts_format(req.content_format()) => {
                    rb.set_code(Code::UNSUPPORTED_CONTENT_FORMAT);
                }
                Some(_) if p.code() == Code::GET && !r.can_answer(req.accept()) => {
                    rb.set_code(Code::NOT_ACCEPTABLE);
                }
                Some(_) if !r.precondition_holds(req) => {
                    rb.set_code(Code::PRECONDITION_FAILED);
                }
                Some(h) => h(req, &mut rb),
            },
        }
    }
    Handled::Respond(rb)
}

/// How a request takes part in a block-wise transfer (RFC 7959).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockRequest {
    /// Not at all: an ordinary request.
    None,
    /// One block of a request body (Block1).
    Block1(BlockOpt),
    /// A Block1 option with the reserved size exponent 7 (answered 4.00,
    /// RFC 7959 2.2).
    BadBlock1,
    /// A request for a later block of the response to a request with a
    /// body: Block2 with num > 0 on a method other than GET, no Block1 and
    /// no payload (RFC 7959 3.3).
    Continuation,
}

/// Finds out, in one pass over the options up to Block1, whether and how `p` is part of
/// a block-wise transfer. A Block1 value longer than 3 bytes is left to
/// [`process_request`] (4.02, like any critical option of a bad length).
pub fn block_request(p: &Packet<&[u8]>) -> BlockRequest {
    let mut block1 = None;
    let mut later_block2 = false;
    // options come in ascending order: nothing to look at past Block1
    for o in p.options().take_while(|o| o.number <= OptionNumber::BLOCK1) {
        if o.number == OptionNumber::BLOCK1 && o.value.len() <= 3 {
            block1 = crate::wire::decode_uint(o.value).map(BlockOpt::decode);
        } else if o.number == OptionNumber::BLOCK2 && o.value.len() <= 3 {
            later_block2 = crate::wire::decode_uint(o.value)
                .and_then(BlockOpt::decode)
                .is_some_and(|b| b.num > 0);
        }
    }
    match block1 {
        Some(Some(b)) => BlockRequest::Block1(b),
        Some(None) => BlockRequest::BadBlock1,
        None if later_block2 && p.code() != Code::GET && p.payload().is_empty() => {
            BlockRequest::Continuation
        }
        None => BlockRequest::None,
    }
}

/// Whether `req` would reach a handler that accepts its payload: only then
/// are its blocks worth collecting (otherwise the first block gets the
/// error [`process_request`] gives).
pub fn reaches_handler(router: &Router, req: &Request<'_>) -> bool {
    let p = req.packet;
    bad_critical_option(p).is_none()
        && p.option(OptionNumber::PROXY_URI).is_none()
        && p.option(OptionNumber::PROXY_SCHEME).is_none()
        && !is_well_known_core(p)
        && router.find(req).is_some_and(|r| {
            r.handler(p.code()).is_some() && r.accepts_format(req.content_format())
        })
}

/// Handles `datagram`, a request rebuilt by the [`Block1Store`], as if it
/// came from `peer`.
fn process_rebuilt(
    router: &Router,
    pool: &Pool,
    peer: SocketAddr,
    identity: Option<&str>,
    datagram: &[u8],
    payload_hint: usize,
    max_payload: usize,
) -> Handled {
    match Packet::new_checked(datagram) {
        Ok(p) => process_request(
            router,
            pool,
            &Request {
                peer,
                packet: &p,
                identity,
            },
            payload_hint,
            max_payload,
        ),
        Err(_) => {
            let mut rb = ResponseBuilder::in_pool(pool, 0);
            rb.set_code(Code::INTERNAL_SERVER_ERROR);
            Handled::Respond(rb)
        }
    }
}

/// The answer a block gets at once (2.31 Continue, 4.00, 4.08, 4.13, 5.03,
/// with its Block1, Size1 and Max-Age), or `None` when the outcome is a
/// request to handle.
pub fn reply_to_block(pool: &Pool, outcome: &Block1Outcome) -> Option<ResponseBuilder> {
    let Block1Outcome::Reply {
        code,
        block1,
        size1,
        max_age,
    } = *outcome
    else {
        return None;
    };
    let mut rb = ResponseBuilder::in_pool(pool, 0);
    rb.set_code(code);
    if let Some(b) = block1 {
        rb.option_uint(OptionNumber::BLOCK1, b.encode());
    }
    if let Some(s) = size1 {
        rb.option_uint(OptionNumber::SIZE1, s);
    }
    if let Some(a) = max_age {
        rb.max_age(a);
    }
    Some(rb)
}

/// Answers a block of a request body as the [`Block1Store`] decided:
/// 2.31 or an error at once, or the handler's response to the whole body
/// with the final Block1 added.
pub fn respond_block1(
    router: &Router,
    pool: &Pool,
    req: &Request<'_>,
    outcome: Block1Outcome,
    payload_hint: usize,
    max_payload: usize,
) -> Handled {
    let (mut handled, block1) = match outcome {
        Block1Outcome::Reply { .. } => {
            return reply_to_block(pool, &outcome).map_or(Handled::Silent, Handled::Respond)
        }
        Block1Outcome::Whole { block1 } => (
            process_request(router, pool, req, payload_hint, max_payload),
            block1,
        ),
        Block1Outcome::Complete { datagram, block1 } => (
            process_rebuilt(
                router,
                pool,
                req.peer,
                req.identity,
                &datagram,
                payload_hint,
                max_payload,
            ),
            block1,
        ),
    };
    if let Handled::Respond(rb) = &mut handled {
        rb.option_uint(OptionNumber::BLOCK1, block1.encode());
    }
    handled
}

/// [`process_request`] with block-wise request bodies: a request carrying
/// Block1 goes through `blocks` (locked only while the store is consulted,
/// never while a handler runs), and a Block2 continuation of a completed
/// body is handled with that body. Requests without Block1 or Block2 take
/// the plain path and never touch the lock.
pub fn process_request_blockwise(
    router: &Router,
    pool: &Pool,
    blocks: &Mutex<Block1Store>,
    now: Instant,
    req: &Request<'_>,
    payload_hint: usize,
    max_payload: usize,
) -> Handled {
    let lock = || blocks.lock().unwrap_or_else(|e| e.into_inner());
    match block_request(req.packet) {
        BlockRequest::None => process_request(router, pool, req, payload_hint, max_payload),
        BlockRequest::BadBlock1 => {
            let mut rb = ResponseBuilder::in_pool(pool, 0);
            rb.set_code(Code::BAD_REQUEST);
            Handled::Respond(rb)
        }
        BlockRequest::Block1(b) if reaches_handler(router, req) => {
            let outcome = lock().on_block(now, req.peer, req.packet, b);
            respond_block1(router, pool, req, outcome, payload_hint, max_payload)
        }
        BlockRequest::Block1(_) => process_request(router, pool, req, payload_hint, max_payload),
        BlockRequest::Continuation => {
            let rebuilt = lock().continuation(now, req.peer, req.packet);
            match rebuilt {
                Some(d) => process_rebuilt(
                    router,
                    pool,
                    req.peer,
                    req.identity,
                    &d,
                    payload_hint,
                    max_payload,
                ),
                None => process_request(router, pool, req, payload_hint, max_payload),
            }
        }
    }
}

/// Encodes a handled response; a response that overflowed its limits
/// becomes 5.00 Internal Server Error.
pub fn finish_response(
    pool: &Pool,
    rb: ResponseBuilder,
    ty: MessageType,
    mid: u16,
    token: &[u8],
) -> Answer {
    match rb.finish(ty, mid, token) {
        Ok(o) => Answer::Send(o),
        Err(BuildError::Exhausted) => Answer::Exhausted,
        Err(_) => match simple_response(pool, ty, mid, token, Code::INTERNAL_SERVER_ERROR, None) {
            Some(o) => Answer::Send(o),
            None => Answer::Exhausted,
        },
    }
}

/// [`process_request`] then [`finish_response`] as a piggybacked ACK for a
/// CON, or a NON with `non_mid` for a NON.
// The same arguments as process_request, which it wraps (non_mid in place
// of payload_hint).
pub fn handle_request(
    router: &Router,
    pool: &Pool,
    req: &Request<'_>,
    non_mid: u16,
    max_payload: usize,
) -> Answer {
    let p = req.packet;
    let (ty, mid) = if p.msg_type() == MessageType::Con {
        (MessageType::Ack, p.message_id())
    } else {
        (MessageType::Non, non_mid)
    };
    match process_request(router, pool, req, 64, max_payload) {
        Handled::Respond(rb) => finish_response(pool, rb, ty, mid, p.token()),
        Handled::Silent => Answer::Silent,
    }
}

fn is_well_known_core(p: &Packet<&[u8]>) -> bool {
    let mut segs = p
        .options()
        .filter(|o| o.number == OptionNumber::URI_PATH)
        .map(|o| o.value);
    segs.next() == Some(b".well-known") && segs.next() == Some(b"core") && segs.next().is_none()
}

/// Formats into a stack buffer, truncating; returns the length.
fn fmt_into(buf: &mut [u8], args: std::fmt::Arguments<'_>) -> usize {
    use std::io::Write;
    let mut c = std::io::Cursor::new(buf);
    let _ = c.write_fmt(args);
    c.position() as usize
}

/// Builds a response with no payload outside a handler (e.g. 5.03 with
/// Max-Age when the HTP queue is full).
pub fn simple_response(
    pool: &Pool,
    ty: MessageType,
    mid: u16,
    token: &[u8],
    code: Code,
    max_age: Option<u32>,
) -> Option<Outgoing> {
    let mut rb = ResponseBuilder::in_pool(pool, 0);
    rb.set_code(code);
    if let Some(a) = max_age {
        rb.max_age(a);
    }
    rb.finish(ty, mid, token).ok()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod block_tests;
