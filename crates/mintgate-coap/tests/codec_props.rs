//! Property tests for the CoAP wire codec, `classify` and `Dedup`.
//!
//! (a) round trip of every message `MessageWriter` can build;
//! (b) `Packet::new_checked` on arbitrary bytes: no panic, and an accepted
//!     datagram re-encodes to exactly the same bytes (the encoding is
//!     canonical, see `arbitrary_bytes_never_panic_and_reencode_exactly`);
//! (c) each message-format error as a generated family;
//! (d) `classify` on arbitrary bytes;
//! (e) `Dedup` against a reference model in virtual time, and its bounds
//!     (entries, queue slots, bytes) under any sequence of calls;
//! (f) the Block1/Block2 option values (RFC 7959 2.2) as uint options in
//!     messages, and `block_request` on arbitrary datagrams.
//!
//! Library bugs these properties found are kept as regression tests at the
//! end of the file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};

use mintgate_coap::server::block::BlockOpt;
use mintgate_coap::server::{
    block_request, classify, BlockRequest, Dedup, Inbound, ResetReason, Seen,
};
use mintgate_coap::wire::{
    empty_message, head_len, Code, MessageType, MessageWriter, OptionNumber, Packet, ParseError,
    WriteError,
};

// ---------------------------------------------------------------------------
// Model of a message and its encoding
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct Msg {
    ty: MessageType,
    code: Code,
    mid: u16,
    token: Vec<u8>,
    options: Vec<(u16, Vec<u8>)>,
    payload: Vec<u8>,
}

impl Msg {
    fn head_len(&self) -> usize {
        head_len(
            self.token.len(),
            self.options.iter().map(|(n, v)| (*n, v.len())),
            self.payload.len(),
        )
    }

    /// Encodes into a buffer of `head_len + payload.len()` bytes exactly.
    fn encode(&self) -> Vec<u8> {
        let len = self.head_len() + self.payload.len();
        let mut buf = vec![0u8; len];
        let n = self
            .write_into(&mut buf)
            .expect("an exactly sized buffer must be large enough");
        assert_eq!(n, len, "written length differs from head_len + payload");
        buf
    }

    fn write_into(&self, buf: &mut [u8]) -> Result<usize, WriteError> {
        let mut w = MessageWriter::new(buf, self.ty, self.code, self.mid, &self.token)?;
        for (n, v) in &self.options {
            w.option(OptionNumber(*n), v)?;
        }
        w.payload(&self.payload)?;
        Ok(w.finish())
    }

    /// Byte offsets where each option starts, plus the end of the last one.
    fn option_bounds(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut pos = 4 + self.token.len();
        let mut prev = 0u16;
        out.push(pos);
        for (n, v) in &self.options {
            let one = head_len(0, [(*n - prev, v.len())], 0) - 4;
            pos += one;
            prev = *n;
            out.push(pos);
        }
        out
    }
}

/// Reads every field through the public accessors.
fn decode(p: &Packet<&[u8]>) -> Msg {
    Msg {
        ty: p.msg_type(),
        code: p.code(),
        mid: p.message_id(),
        token: p.token().to_vec(),
        options: p
            .options()
            .map(|o| (o.number.0, o.value.to_vec()))
            .collect(),
        payload: p.payload().to_vec(),
    }
}

fn ty_from(b: u8) -> MessageType {
    MessageType::from_bits(b)
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn msg_type() -> impl Strategy<Value = MessageType> {
    (0u8..4).prop_map(ty_from)
}

/// Request (0.01-0.31) or response (2.xx, 4.xx, 5.xx) codes; never Empty and
/// never a reserved class.
fn non_empty_code() -> impl Strategy<Value = Code> {
    prop_oneof![
        (1u8..=31).prop_map(|d| Code::new(0, d)),
        (select(vec![2u8, 4, 5]), 0u8..=31).prop_map(|(c, d)| Code::new(c, d)),
    ]
}

fn token() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=8)
}

/// Option deltas covering the inline (0-12), 1-byte (13-268) and 2-byte
/// (269-65804) extended encodings and their boundaries.
fn delta() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..=12,
        3 => 13u32..=268,
        1 => 269u32..=65535,
        2 => select(vec![0u32, 12, 13, 14, 268, 269, 270, 65535]),
    ]
}

/// Value lengths 0..=1100, with the encoding boundaries made likely.
fn value_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..=12,
        2 => select(vec![12usize, 13, 14, 268, 269, 270, 300]),
        1 => 13usize..=300,
        1 => 0usize..=1100,
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    value_len().prop_flat_map(|n| vec(any::<u8>(), n))
}

/// A sorted option list (repeats allowed: delta 0), numbers 0..=65535.
fn options() -> impl Strategy<Value = Vec<(u16, Vec<u8>)>> {
    vec((delta(), value()), 0..8).prop_map(|ds| {
        let mut out = Vec::new();
        let mut num = 0u32;
        for (d, v) in ds {
            if num + d > u16::MAX as u32 {
                break;
            }
            num += d;
            out.push((num as u16, v));
        }
        out
    })
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => Just(Vec::new()),
        3 => vec(any::<u8>(), 1..=32),
        1 => vec(any::<u8>(), 1..=1100),
    ]
}

/// Any non-Empty message the writer can build.
fn message() -> impl Strategy<Value = Msg> {
    (
        msg_type(),
        non_empty_code(),
        any::<u16>(),
        token(),
        options(),
        payload(),
    )
        .prop_map(|(ty, code, mid, token, options, payload)| Msg {
            ty,
            code,
            mid,
            token,
            options,
            payload,
        })
}

/// An Empty message: 0.00, no token, options or payload.
fn empty_msg() -> impl Strategy<Value = Msg> {
    (msg_type(), any::<u16>()).prop_map(|(ty, mid)| Msg {
        ty,
        code: Code::EMPTY,
        mid,
        token: Vec::new(),
        options: Vec::new(),
        payload: Vec::new(),
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, u8),
    Remove(Index),
    Truncate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<Index>().prop_map(Mutation::Remove),
        1 => any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if b.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(i, bit) => {
                let i = i.index(b.len());
                b[i] ^= 1 << bit;
            }
            Mutation::Set(i, v) => {
                let i = i.index(b.len());
                b[i] = *v;
            }
            Mutation::Insert(i, v) => {
                let i = i.index(b.len() + 1);
                b.insert(i, *v);
            }
            Mutation::Remove(i) => {
                let i = i.index(b.len());
                b.remove(i);
            }
            Mutation::Truncate(i) => {
                let i = i.index(b.len());
                b.truncate(i);
            }
        }
    }
    b
}

/// Arbitrary datagrams, biased towards ones that get past the header check.
fn datagram() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // pure noise
        2 => vec(any::<u8>(), 0..48),
        // version 1, any type/TKL, Empty or any code, noise behind
        3 => (
            0u8..4,
            0u8..16,
            prop_oneof![Just(0u8), any::<u8>()],
            any::<u16>(),
            vec(any::<u8>(), 0..48),
        )
            .prop_map(|(t, tkl, code, mid, tail)| {
                let mut b = vec![0x40 | (t << 4) | tkl, code];
                b.extend_from_slice(&mid.to_be_bytes());
                b.extend(tail);
                b
            }),
        // valid messages with a few mutations
        4 => (prop_oneof![4 => message(), 1 => empty_msg()], vec(mutation(), 0..4))
            .prop_map(|(m, muts)| apply(m.encode(), &muts)),
    ]
}

// ---------------------------------------------------------------------------
// (a) round trip
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Whatever MessageWriter builds parses back to the same fields, options
    /// in order, and its length is `head_len + payload.len()`.
    #[test]
    fn writer_output_parses_back_to_the_same_fields(m in message()) {
        let bytes = m.encode();
        prop_assert_eq!(bytes.len(), m.head_len() + m.payload.len());
        let p = Packet::new_checked(&bytes[..]).map_err(|e| {
            TestCaseError::fail(format!("writer output rejected: {e:?}"))
        })?;
        prop_assert_eq!(decode(&p), m.clone());
        prop_assert_eq!(p.payload_offset(), bytes.len() - m.payload.len());
        // One byte less than head_len + payload is always too small.
        let mut short = vec![0u8; bytes.len() - 1];
        prop_assert_eq!(m.write_into(&mut short), Err(WriteError::NoSpace));
    }

    /// Empty messages (ACK, RST, ping) round trip through `empty_message`.
    #[test]
    fn empty_messages_round_trip(m in empty_msg()) {
        let bytes = m.encode();
        prop_assert_eq!(&bytes[..], &empty_message(m.ty, m.mid)[..]);
        let p = Packet::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(decode(&p), m);
    }
}

// ---------------------------------------------------------------------------
// (b) arbitrary bytes
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8192))]

    /// `new_checked` never panics; an accepted datagram can be walked without
    /// panicking, and re-encoding its fields reproduces the input exactly.
    ///
    /// Why exact re-encoding holds (the encoding is canonical): the header
    /// fields, token and payload are copied verbatim; an option's delta and
    /// length each have exactly one accepted form, because nibble 0-12 means
    /// 0-12, nibble 13 means 13 + one byte (13-268) and nibble 14 means
    /// 269 + two bytes (269-65804): the three ranges are disjoint, so there is
    /// no "extended encoding of a small value"; nibble 15 is rejected; the
    /// option order is fixed by the deltas; a payload marker must be followed
    /// by at least one byte, so "no payload" has the single form "no marker";
    /// and an Empty message must be exactly the 4-byte header. The writer
    /// picks the same (only) form for each.
    #[test]
    fn arbitrary_bytes_never_panic_and_reencode_exactly(bytes in datagram()) {
        let Ok(p) = Packet::new_checked(&bytes[..]) else { return Ok(()) };
        let _ = format!("{p:?}");
        let m = decode(&p);
        prop_assert!(m.token.len() <= 8);
        let mut last = 0u16;
        for (n, _) in &m.options {
            prop_assert!(*n >= last, "options out of order");
            last = *n;
        }
        prop_assert!(!m.code.is_reserved());
        if m.code.is_empty() {
            prop_assert_eq!(bytes.len(), 4);
        }
        let re = m.encode();
        prop_assert_eq!(re, bytes);
    }

    /// Same for raw noise of any length up to 2 KiB (no bias at all).
    #[test]
    fn noise_never_panics(bytes in vec(any::<u8>(), 0..2048)) {
        if let Ok(p) = Packet::new_checked(&bytes[..]) {
            prop_assert_eq!(decode(&p).encode(), bytes);
        }
    }
}

// ---------------------------------------------------------------------------
// (c) format errors, each as a generated family
// ---------------------------------------------------------------------------

fn header(ty: MessageType, tkl: u8, code: u8, mid: u16) -> Vec<u8> {
    let mut b = vec![0x40 | ((ty as u8) << 4) | tkl, code];
    b.extend_from_slice(&mid.to_be_bytes());
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// TKL 9-15 is rejected whatever follows (RFC 7252 3).
    #[test]
    fn token_length_9_to_15_rejected(
        ty in msg_type(), tkl in 9u8..=15, code in any::<u8>(), mid in any::<u16>(),
        tail in vec(any::<u8>(), 0..40),
    ) {
        let mut b = header(ty, tkl, code, mid);
        b.extend(tail);
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::TokenLength(tkl)));
    }

    /// A payload marker at the very end is a format error.
    #[test]
    fn payload_marker_without_payload_rejected(mut m in message()) {
        m.payload.clear();
        let mut b = m.encode();
        b.push(0xFF);
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::EmptyPayload));
    }

    /// Nibble 15 in an option delta (length any but 15, which is the marker)
    /// or in an option length (after a complete delta extension) is rejected,
    /// wherever the option sits and whatever follows it.
    #[test]
    fn nibble_15_rejected(
        mut m in message(),
        in_delta in any::<bool>(),
        other in 0u8..=14,
        ext in vec(any::<u8>(), 2),
        tail in vec(any::<u8>(), 0..40),
    ) {
        m.payload.clear();
        let mut b = m.encode();
        if in_delta {
            b.push(0xF0 | other);
        } else {
            b.push((other << 4) | 0x0F);
            match other {
                13 => b.push(ext[0]),
                14 => b.extend_from_slice(&ext),
                _ => {}
            }
        }
        b.extend(tail);
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::ReservedNibble));
    }

    /// Cutting a message inside its token or inside any option (not on an
    /// option boundary) is rejected as truncated.
    #[test]
    fn truncated_token_or_option_rejected(m in message(), at in any::<Index>()) {
        let b = m.encode();
        let bounds = m.option_bounds();
        let opts_end = *bounds.last().unwrap();
        // cut points: inside the token (4 < cut < 4 + tkl), or strictly
        // inside an option
        let cuts: Vec<usize> = (5..opts_end).filter(|c| !bounds.contains(c)).collect();
        prop_assume!(!cuts.is_empty());
        let cut = cuts[at.index(cuts.len())];
        prop_assert_eq!(
            Packet::new_checked(&b[..cut]).err(),
            Some(ParseError::Truncated),
            "cut at {} of {:?}", cut, bounds
        );
    }

    /// An Empty (0.00) message with any byte after the header is rejected,
    /// whatever its TKL says.
    #[test]
    fn empty_code_with_extra_bytes_rejected(
        ty in msg_type(), tkl in 0u8..=8, mid in any::<u16>(),
        extra in vec(any::<u8>(), 1..40),
    ) {
        let mut b = header(ty, tkl, 0, mid);
        b.extend(extra);
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::EmptyWithContent));
    }

    /// Versions 0, 2 and 3 are rejected (to be ignored silently).
    #[test]
    fn unknown_version_rejected(
        v in select(vec![0u8, 2, 3]), rest in 0u8..64,
        tail in vec(any::<u8>(), 3..40),
    ) {
        let mut b = vec![(v << 6) | rest];
        b.extend(tail);
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::UnknownVersion(v)));
    }

    /// Fewer than 4 bytes are rejected.
    #[test]
    fn short_rejected(b in vec(any::<u8>(), 0..4)) {
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::TooShort));
    }

    /// Code classes 1, 6 and 7 are rejected.
    #[test]
    fn reserved_code_classes_rejected(
        ty in msg_type(), tkl in 0u8..=8, class in select(vec![1u8, 6, 7]),
        detail in 0u8..32, mid in any::<u16>(), tail in vec(any::<u8>(), 0..40),
    ) {
        let code = Code::new(class, detail);
        let mut b = header(ty, tkl, code.0, mid);
        b.extend(tail);
        prop_assert_eq!(Packet::new_checked(&b[..]).err(), Some(ParseError::ReservedCode(code)));
    }

    /// An option number past 65535 (sum of deltas) is rejected.
    #[test]
    fn option_number_overflow_rejected(
        mut m in message(), over in 1u32..=(65804 - 65535), tail in vec(any::<u8>(), 0..8),
    ) {
        m.payload.clear();
        let last = m.options.last().map(|o| o.0 as u32).unwrap_or(0);
        let delta = 65535 - last + over; // >= 269 unless last is close to 65535
        prop_assume!(delta >= 269);
        let mut b = m.encode();
        b.push(0xE0);
        b.extend_from_slice(&((delta - 269) as u16).to_be_bytes());
        b.extend(tail);
        prop_assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::OptionNumberOverflow)
        );
    }
}

// ---------------------------------------------------------------------------
// (d) classify
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8192))]

    /// `classify` never panics; it answers a Reset only for a CON header (and
    /// then with that message ID), and every readable CON is either a request
    /// or gets a Reset (RFC 7252 4.2, 4.3).
    #[test]
    fn classify_resets_only_con(bytes in datagram()) {
        let hdr = Packet::<&[u8]>::peek_header(&bytes);
        let readable = matches!(hdr, Some((1, _, _, _)));
        match classify(&bytes) {
            Inbound::Reset(rst, why) => {
                let (_, ty, _, mid) = hdr.expect("Reset for a datagram without header");
                prop_assert!(readable, "Reset for an unreadable datagram");
                prop_assert_eq!(ty, MessageType::Con, "Reset for a non-CON header");
                prop_assert_eq!(rst, empty_message(MessageType::Rst, mid));
                let back = Packet::new_checked(&rst[..]).unwrap();
                prop_assert_eq!(back.msg_type(), MessageType::Rst);
                prop_assert_eq!(back.message_id(), mid);
                if let ResetReason::FormatError(e) = why {
                    prop_assert!(e.has_header());
                    prop_assert_eq!(Packet::new_checked(&bytes[..]).err(), Some(e));
                }
            }
            Inbound::Request(p) => {
                prop_assert!(matches!(p.msg_type(), MessageType::Con | MessageType::Non));
                prop_assert!(p.code().is_request());
            }
            Inbound::Ack(mid) => {
                let (_, ty, code, m) = hdr.unwrap();
                prop_assert_eq!(ty, MessageType::Ack);
                prop_assert!(code.is_empty());
                prop_assert_eq!(mid, m);
            }
            Inbound::PeerReset(mid) => {
                let (_, ty, code, m) = hdr.unwrap();
                prop_assert_eq!(ty, MessageType::Rst);
                prop_assert!(code.is_empty());
                prop_assert_eq!(mid, m);
            }
            Inbound::Drop(_) => {
                if let Some((_, ty, _, _)) = hdr {
                    prop_assert!(
                        !(readable && ty == MessageType::Con),
                        "a readable CON was dropped silently"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// (e) Dedup against a reference model
// ---------------------------------------------------------------------------

const CON_LIFE: Duration = Duration::from_secs(247);
const NON_LIFE: Duration = Duration::from_secs(145);

#[derive(Clone, Debug)]
enum Op {
    Check { peer: u8, mid: u16, con: bool },
    Complete { peer: u8, mid: u16, resp: u32 },
    Advance(Duration),
}

fn op(con: impl Strategy<Value = bool> + Clone + 'static) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, 0u16..4, con).prop_map(|(peer, mid, con)| Op::Check { peer, mid, con }),
        2 => (0u8..3, 0u16..4, any::<u32>())
            .prop_map(|(peer, mid, resp)| Op::Complete { peer, mid, resp }),
        3 => prop_oneof![
            (0u64..3_000).prop_map(Duration::from_millis),
            (0u64..=300).prop_map(Duration::from_secs),
            select(vec![NON_LIFE, CON_LIFE, CON_LIFE - NON_LIFE]),
        ]
        .prop_map(Op::Advance),
    ]
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ModelEntry {
    InProgress,
    Done(u32),
    Seen,
}

/// No capacity bound; every entry has its own expiry time.
#[derive(Default)]
struct Model {
    map: HashMap<(u8, u16), (ModelEntry, Instant)>,
}

impl Model {
    fn check(
        &mut self,
        now: Instant,
        key: (u8, u16),
        con: bool,
        life: (Duration, Duration),
    ) -> Seen<'_, u32> {
        self.map.retain(|_, (_, exp)| *exp > now);
        if self.map.contains_key(&key) {
            return match &self.map[&key].0 {
                ModelEntry::InProgress => Seen::InProgress,
                ModelEntry::Done(r) => Seen::Replay(r),
                ModelEntry::Seen => Seen::Duplicate,
            };
        }
        let (entry, l) = if con {
            (ModelEntry::InProgress, life.0)
        } else {
            (ModelEntry::Seen, life.1)
        };
        self.map.insert(key, (entry, now + l));
        Seen::New
    }

    fn complete(&mut self, now: Instant, key: (u8, u16), resp: u32) {
        if let Some((e, exp)) = self.map.get_mut(&key) {
            if *exp > now {
                *e = ModelEntry::Done(resp);
            }
        }
    }
}

fn peer_addr(p: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 5683 + p as u16))
}

fn run_dedup_model(
    ops: &[Op],
    con_life: Duration,
    non_life: Duration,
) -> Result<(), TestCaseError> {
    // Capacity above the number of operations: the bound is never reached.
    let cap = ops.len() + 1;
    let mut d: Dedup<u32> = Dedup::new(cap, con_life, non_life);
    let mut model = Model::default();
    let mut now = Instant::now();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Check { peer, mid, con } => {
                let got = d.check(now, peer_addr(peer), mid, con);
                let want = model.check(now, (peer, mid), con, (con_life, non_life));
                prop_assert_eq!(got, want, "op #{} {:?}", i, op);
            }
            Op::Complete { peer, mid, resp } => {
                d.complete(peer_addr(peer), mid, resp);
                model.complete(now, (peer, mid), resp);
            }
            Op::Advance(dt) => now += dt,
        }
        prop_assert!(d.len() <= cap);
    }
    prop_assert_eq!(d.evicted_early(), 0);
    Ok(())
}

fn ops_strategy(
    con: impl Strategy<Value = bool> + Clone + 'static,
) -> impl Strategy<Value = Vec<Op>> {
    vec(op(con), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// CON and NON with one shared lifetime: insertion order is expiry order.
    #[test]
    fn dedup_matches_model_single_lifetime(ops in ops_strategy(any::<bool>())) {
        run_dedup_model(&ops, CON_LIFE, CON_LIFE)?;
    }

    /// Only CON messages, RFC 7252 lifetimes.
    #[test]
    fn dedup_matches_model_con_only(ops in ops_strategy(Just(true))) {
        run_dedup_model(&ops, CON_LIFE, NON_LIFE)?;
    }

    /// Only NON messages, RFC 7252 lifetimes.
    #[test]
    fn dedup_matches_model_non_only(ops in ops_strategy(Just(false))) {
        run_dedup_model(&ops, CON_LIFE, NON_LIFE)?;
    }

    /// With a small capacity the cache never holds more than its bound.
    #[test]
    fn dedup_respects_capacity(ops in ops_strategy(any::<bool>()), cap in 1usize..6) {
        let mut d: Dedup<u32> = Dedup::new(cap, CON_LIFE, NON_LIFE);
        let mut now = Instant::now();
        for op in &ops {
            match *op {
                Op::Check { peer, mid, con } => {
                    d.check(now, peer_addr(peer), mid, con);
                }
                Op::Complete { peer, mid, resp } => d.complete(peer_addr(peer), mid, resp),
                Op::Advance(dt) => now += dt,
            }
            prop_assert!(d.len() <= cap);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// CON and NON mixed with the RFC 7252 lifetimes (247 s / 145 s).
    #[test]
    fn dedup_matches_model_mixed_lifetimes(ops in ops_strategy(any::<bool>())) {
        run_dedup_model(&ops, CON_LIFE, NON_LIFE)?;
    }
}

/// Every call of `Dedup`, forgets and early evictions included.
#[derive(Clone, Debug)]
enum FullOp {
    Check { peer: u8, mid: u16, con: bool },
    Complete { peer: u8, mid: u16, len: usize },
    Forget { peer: u8, mid: u16 },
    Evict(usize),
    Advance(Duration),
}

/// A `Seen` as (kind, replayed value) for comparing caches of two types.
fn flat<R>(s: Seen<'_, R>, f: impl Fn(&R) -> u32) -> (u8, Option<u32>) {
    match s {
        Seen::New => (0, None),
        Seen::InProgress => (1, None),
        Seen::Replay(r) => (2, Some(f(r))),
        Seen::Duplicate => (3, None),
    }
}

fn full_op() -> impl Strategy<Value = FullOp> {
    prop_oneof![
        5 => (0u8..4, 0u16..6, any::<bool>())
            .prop_map(|(peer, mid, con)| FullOp::Check { peer, mid, con }),
        3 => (0u8..4, 0u16..6, 0usize..600)
            .prop_map(|(peer, mid, len)| FullOp::Complete { peer, mid, len }),
        3 => (0u8..4, 0u16..6).prop_map(|(peer, mid)| FullOp::Forget { peer, mid }),
        1 => (0usize..4).prop_map(FullOp::Evict),
        2 => prop_oneof![
            (0u64..3_000).prop_map(Duration::from_millis),
            select(vec![NON_LIFE, CON_LIFE, CON_LIFE - NON_LIFE]),
        ]
        .prop_map(FullOp::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the sequence, the map and the queue stay in step (one live
    /// slot per entry, at most 2 x capacity + 1 slots), the entries stay
    /// within `capacity` and the cached bytes within `max_bytes` and equal
    /// to what the entries weigh.
    #[test]
    fn dedup_invariants_hold_under_any_sequence(
        ops in vec(full_op(), 1..150),
        cap in 1usize..8,
        max_bytes in 0usize..1500,
    ) {
        let mut d: Dedup<Vec<u8>> = Dedup::new(cap, CON_LIFE, NON_LIFE).with_max_bytes(max_bytes);
        let mut now = Instant::now();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                FullOp::Check { peer, mid, con } => {
                    d.check(now, peer_addr(peer), mid, con);
                }
                FullOp::Complete { peer, mid, len } => {
                    d.complete(peer_addr(peer), mid, vec![0; len])
                }
                FullOp::Forget { peer, mid } => d.forget(peer_addr(peer), mid),
                FullOp::Evict(n) => {
                    let before = d.len();
                    let gone = d.evict(n);
                    prop_assert_eq!(gone, n.min(before));
                    prop_assert_eq!(d.len(), before - gone);
                }
                FullOp::Advance(dt) => now += dt,
            }
            if let Err(e) = d.check_invariants() {
                return Err(TestCaseError::fail(format!("op #{i} {op:?}: {e}")));
            }
        }
    }

    /// With bounds never reached, forgetting is exactly removal: the cache
    /// agrees with the reference model (which has no queue at all).
    #[test]
    fn dedup_with_forget_matches_model(ops in vec(full_op(), 1..120)) {
        let cap = ops.len() + 1;
        let mut d: Dedup<Vec<u8>> = Dedup::new(cap, CON_LIFE, NON_LIFE).with_max_bytes(usize::MAX);
        let mut model = Model::default();
        let mut now = Instant::now();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                FullOp::Check { peer, mid, con } => {
                    let got = d.check(now, peer_addr(peer), mid, con);
                    let got = flat(got, |r| r.len() as u32);
                    let want = flat(model.check(now, (peer, mid), con, (CON_LIFE, NON_LIFE)), |r| *r);
                    prop_assert_eq!(got, want, "op #{} {:?}", i, op);
                }
                FullOp::Complete { peer, mid, len } => {
                    d.complete(peer_addr(peer), mid, vec![0; len]);
                    model.complete(now, (peer, mid), len as u32);
                }
                FullOp::Forget { peer, mid } => {
                    d.forget(peer_addr(peer), mid);
                    model.map.remove(&(peer, mid));
                }
                FullOp::Evict(_) => {}
                FullOp::Advance(dt) => now += dt,
            }
            prop_assert!(d.check_invariants().is_ok());
        }
        prop_assert_eq!(d.evicted_early(), 0);
    }
}

// ---------------------------------------------------------------------------
// (f) Block options (RFC 7959 2.2)
// ---------------------------------------------------------------------------

proptest! {
    /// Every uint a Block option can carry (0-3 bytes) decodes unless its
    /// size exponent is the reserved 7, and what decodes encodes back to the
    /// same value, through a message and its minimal uint encoding.
    #[test]
    fn block_values_decode_exactly_when_valid(v in 0u32..(1 << 24), which in any::<bool>()) {
        let number = if which { OptionNumber::BLOCK1 } else { OptionNumber::BLOCK2 };
        let mut buf = [0u8; 32];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::PUT, 1, b"").unwrap();
        w.option_uint(number, v).unwrap();
        let n = w.finish();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        let raw = p.option(number).unwrap();
        prop_assert!(raw.value.len() <= 3);
        let got = raw.uint().and_then(BlockOpt::decode);
        prop_assert_eq!(got.is_some(), v & 7 != 7);
        if let Some(b) = got {
            prop_assert_eq!(b.encode(), v);
            prop_assert_eq!((b.num, b.more, b.size()), (v >> 4, v & 8 != 0, 16usize << (v & 7)));
        }
        let kind = block_request(&p);
        if which {
            prop_assert_eq!(kind, got.map_or(BlockRequest::BadBlock1, BlockRequest::Block1));
        } else {
            // a payload-less PUT asking for a later block continues a body
            let later = got.is_some_and(|b| b.num > 0);
            let want = if later { BlockRequest::Continuation } else { BlockRequest::None };
            prop_assert_eq!(kind, want);
        }
    }

    /// Values longer than 3 bytes are not Block values: they never decode
    /// as one (a uint of 4 bytes is past 2^24), and `block_request` leaves
    /// them to the option-length check (4.02).
    #[test]
    fn long_block_values_are_refused(v in (1u32 << 24).., which in any::<bool>()) {
        let number = if which { OptionNumber::BLOCK1 } else { OptionNumber::BLOCK2 };
        prop_assert_eq!(BlockOpt::decode(v), None);
        let mut buf = [0u8; 32];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::POST, 1, b"").unwrap();
        w.option_uint(number, v).unwrap();
        let n = w.finish();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        prop_assert_eq!(block_request(&p), BlockRequest::None);
        prop_assert!(mintgate_coap::server::bad_critical_option(&p).is_some());
    }

    /// `block_request` on arbitrary datagrams never panics and agrees with
    /// the (last) Block1 option of 0-3 bytes.
    #[test]
    fn block_request_on_arbitrary_datagrams(bytes in datagram()) {
        if let Ok(p) = Packet::new_checked(&bytes[..]) {
            let last = p
                .options()
                .filter(|o| o.number == OptionNumber::BLOCK1 && o.value.len() <= 3)
                .last();
            let kind = block_request(&p);
            match last {
                Some(o) => {
                    let want = o
                        .uint()
                        .and_then(BlockOpt::decode)
                        .map_or(BlockRequest::BadBlock1, BlockRequest::Block1);
                    prop_assert_eq!(kind, want);
                }
                None => prop_assert!(matches!(kind, BlockRequest::None | BlockRequest::Continuation)),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Regressions for bugs these properties found (fixed)
// ---------------------------------------------------------------------------

/// RFC 7252 4.1: an Empty message MUST have TKL 0; anything else is a message
/// format error. `check` only tests `len == 4` for code 0.00, so
/// `41 00 12 34` is accepted, and then `Packet::token()` (slice 4..5 of a
/// 4-byte buffer) and `Packet::options()` (slice 5..4) panic.
#[test]
fn regression_empty_code_with_token_length_is_rejected() {
    for tkl in 1u8..=8 {
        for t in 0u8..4 {
            let b = [0x40 | (t << 4) | tkl, 0x00, 0x12, 0x34];
            assert!(Packet::new_checked(&b[..]).is_err(), "accepted {:02x?}", b);
        }
    }
}

/// `Dedup::expire` stops at the first queued entry that is still live, so a
/// NON entry (145 s) queued behind a CON entry (247 s) stays until the CON
/// entry expires: a new NON reusing that message ID after NON_LIFETIME is
/// dropped as a duplicate.
#[test]
fn regression_non_entry_expires_behind_a_con_entry() {
    let t0 = Instant::now();
    let mut d: Dedup<u32> = Dedup::new(16, CON_LIFE, NON_LIFE);
    assert_eq!(d.check(t0, peer_addr(0), 1, true), Seen::New);
    assert_eq!(d.check(t0, peer_addr(0), 2, false), Seen::New);
    let later = t0 + NON_LIFE + Duration::from_secs(1);
    assert_eq!(d.check(later, peer_addr(0), 2, false), Seen::New);
}
