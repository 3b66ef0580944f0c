use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mintgate_buf::{PartitionConfig, Pool};

use super::*;
use crate::server::{handle_request, Resource, Router};
use crate::wire::tcp::signal_option;
use crate::wire::{ContentFormat, OptionNumber};

fn pool() -> Pool {
    Pool::new(&[
        PartitionConfig {
            block_size: 128,
            blocks: 64,
        },
        PartitionConfig {
            block_size: 4096,
            blocks: 16,
        },
    ])
}

fn router() -> Router {
    let mut r = Router::new();
    r.add(Resource::new("request").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(b"hello world");
    }))
    .unwrap();
    r.add(
        Resource::new("echo")
            .put(|req, rb| {
                rb.set_code(Code::CHANGED);
                rb.write(req.payload());
            })
            .get(|_, rb| {
                rb.write(&[b'x'; 2000]);
            }),
    )
    .unwrap();
    r
}

fn peer() -> SocketAddr {
    "127.0.0.1:40000".parse().unwrap()
}

fn frame(code: Code, token: &[u8], opts: &[(u16, &[u8])], payload: &[u8]) -> Vec<u8> {
    let r = TcpRepr {
        code,
        token,
        options: opts
            .iter()
            .map(|(n, v)| RawOption {
                number: OptionNumber(*n),
                value: v,
            })
            .collect(),
        payload,
    };
    let mut v = Vec::new();
    r.emit_vec(Framing::Stream, &mut v).unwrap();
    v
}

fn csm(max: u32) -> Vec<u8> {
    let mut v = Vec::new();
    Signal::Csm {
        max_message_size: Some(max),
        block_wise: false,
    }
    .emit_vec(Framing::Stream, &[], &mut v);
    v
}

/// Splits the output into frames (all complete).
fn frames(out: &[u8]) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let mut rest = out;
    while !rest.is_empty() {
        let n = frame_len(rest).unwrap().unwrap() as usize;
        v.push(rest[..n].to_vec());
        rest = &rest[n..];
    }
    v
}

struct Harness {
    conn: Connection,
    router: Router,
    pool: Pool,
    now: Instant,
}

impl Harness {
    fn new(cfg: ConnectionConfig) -> Harness {
        Harness {
            conn: Connection::new(Framing::Stream, peer(), cfg),
            router: router(),
            pool: pool(),
            now: Instant::now(),
        }
    }

    /// Feeds `bytes` in pieces of `step`; returns the frames written since.
    fn feed(&mut self, bytes: &[u8], step: usize) -> Vec<Vec<u8>> {
        let (router, pool) = (&self.router, &self.pool);
        let mut serve = |req: &Request<'_>, max: usize| handle_request(router, pool, req, 0, max);
        for chunk in bytes.chunks(step.max(1)) {
            self.conn.receive(self.now, chunk, &mut serve);
        }
        let f = frames(self.conn.output());
        let n = self.conn.output().len();
        self.conn.consume_output(n);
        f
    }
}

#[test]
fn csm_first_then_requests_answered_in_any_split() {
    for step in [1, 2, 3, 7, 1000] {
        let mut h = Harness::new(ConnectionConfig::default());
        // our CSM is the first thing out, with our Max-Message-Size
        let first = frames(h.conn.output());
        assert_eq!(first.len(), 1);
        let p = TcpPacket::new_checked(&first[0][..], Framing::Stream).unwrap();
        assert_eq!(
            Signal::parse(&p),
            Ok(Signal::Csm {
                max_message_size: Some(8192),
                block_wise: true
            })
        );
        h.conn.consume_output(first[0].len());

        let mut input = csm(4000);
        input.extend(frame(Code::GET, b"t1", &[(11, b"request")], &[]));
        input.extend(frame(Code::PUT, b"t2", &[(11, b"echo")], b"abc"));
        input.extend(frame(Code::GET, &[], &[(11, b"nothing")], &[]));
        let out = h.feed(&input, step);
        assert_eq!(out.len(), 3, "step {step}");
        let r: Vec<_> = out
            .iter()
            .map(|f| TcpPacket::new_checked(&f[..], Framing::Stream).unwrap())
            .collect();
        assert_eq!((r[0].code(), r[0].token()), (Code::CONTENT, &b"t1"[..]));
        assert_eq!(r[0].payload(), b"hello world");
        assert_eq!((r[1].code(), r[1].payload()), (Code::CHANGED, &b"abc"[..]));
        assert_eq!(r[2].code(), Code::NOT_FOUND);
        assert_eq!(h.conn.peer_max_message_size(), 4000);
        assert_eq!(h.conn.stats().requests, 3);
        assert!(!h.conn.has_partial_frame());
        assert_eq!(h.conn.closed(), None);
    }
}

#[test]
fn ping_gets_pong_with_its_token_and_empty_is_ignored() {
    let mut h = Harness::new(ConnectionConfig::default());
    h.feed(&[], 1);
    let mut input = csm(1152);
    input.extend(frame(Code::EMPTY, &[], &[], &[]));
    input.extend(frame(
        Code::PING,
        b"pp",
        &[(signal_option::CUSTODY.0, b"")],
        &[],
    ));
    let out = h.feed(&input, 5);
    assert_eq!(out.len(), 1); // the Pong (our CSM went before)
    let p = TcpPacket::new_checked(&out[0][..], Framing::Stream).unwrap();
    assert_eq!(Signal::parse(&p), Ok(Signal::Pong { custody: true }));
    assert_eq!(p.token(), b"pp");
    assert_eq!(h.conn.stats().ignored, 1);
}

fn assert_aborted(out: &[Vec<u8>], h: &Harness, why: AbortReason) {
    let last = out.last().expect("an Abort");
    let p = TcpPacket::new_checked(&last[..], Framing::Stream).unwrap();
    assert_eq!(p.code(), Code::ABORT);
    assert_eq!(p.payload(), why.text().as_bytes());
    assert_eq!(h.conn.closed(), Some(Closed::Aborted(why)));
}

#[test]
fn a_request_before_the_csm_aborts() {
    let mut h = Harness::new(ConnectionConfig::default());
    let out = h.feed(&frame(Code::GET, b"t", &[(11, b"request")], &[]), 100);
    assert_aborted(&out, &h, AbortReason::NoCsm);
    assert_eq!(h.conn.stats().requests, 0);
    // nothing more is taken
    let out = h.feed(&csm(1152), 100);
    assert!(out.is_empty());
}

#[test]
fn a_frame_over_max_message_size_aborts_before_it_is_buffered() {
    let mut h = Harness::new(ConnectionConfig {
        max_message_size: 1152,
        ..ConnectionConfig::default()
    });
    let mut input = csm(1152);
    let big = frame(Code::PUT, b"t", &[(11, b"echo")], &[7; 2000]);
    // only its header is sent: the length alone is enough to refuse it
    input.extend_from_slice(&big[..4]);
    let out = h.feed(&input, 1);
    assert_aborted(&out, &h, AbortReason::TooLarge);
    assert!(h.conn.inbuf.capacity() < 64, "the large frame was buffered");
}

#[test]
fn a_csm_with_an_unknown_critical_option_aborts_naming_it() {
    let mut h = Harness::new(ConnectionConfig::default());
    let out = h.feed(&frame(Code::CSM, &[], &[(9, b"")], &[]), 3);
    let p = TcpPacket::new_checked(&out.last().unwrap()[..], Framing::Stream).unwrap();
    assert_eq!(
        Signal::parse(&p),
        Ok(Signal::Abort {
            bad_csm_option: Some(9),
            diagnostic: b"bad signalling message"
        })
    );
    assert!(matches!(
        h.conn.closed(),
        Some(Closed::Aborted(AbortReason::BadSignal(_)))
    ));
}

#[test]
fn malformed_frames_abort() {
    let mut h = Harness::new(ConnectionConfig::default());
    let mut input = csm(1152);
    input.extend([0x09, 0x01]); // token length 9
    let out = h.feed(&input, 100);
    assert_aborted(&out, &h, AbortReason::Malformed(FrameError::TokenLength(9)));
}

#[test]
fn a_half_sent_frame_times_out() {
    let mut h = Harness::new(ConnectionConfig {
        frame_timeout: Duration::from_secs(2),
        ..ConnectionConfig::default()
    });
    let mut input = csm(1152);
    let req = frame(Code::GET, b"t", &[(11, b"request")], &[]);
    input.extend_from_slice(&req[..3]);
    h.feed(&input, 100);
    assert!(h.conn.has_partial_frame());
    assert_eq!(h.conn.poll_timeout(), Some(h.now + Duration::from_secs(2)));
    h.conn.handle_timeout(h.now + Duration::from_secs(1));
    assert_eq!(h.conn.closed(), None);
    h.conn.handle_timeout(h.now + Duration::from_secs(2));
    let out = frames(h.conn.output());
    assert_aborted(&out, &h, AbortReason::Stalled);
}

#[test]
fn responses_are_held_to_the_peer_max_message_size() {
    let mut h = Harness::new(ConnectionConfig {
        max_payload: 4096,
        ..ConnectionConfig::default()
    });
    // the peer takes 1152 bytes: the 2000-byte answer of /echo cannot go
    let mut input = csm(1152);
    input.extend(frame(Code::GET, b"a", &[(11, b"echo")], &[]));
    input.extend(csm(8000));
    input.extend(frame(Code::GET, b"b", &[(11, b"echo")], &[]));
    let out = h.feed(&input, 100);
    let small = TcpPacket::new_checked(&out[1][..], Framing::Stream).unwrap();
    assert_eq!(small.code(), Code::INTERNAL_SERVER_ERROR);
    assert!(out[1].len() <= 1152);
    let big = TcpPacket::new_checked(&out[2][..], Framing::Stream).unwrap();
    assert_eq!((big.code(), big.payload().len()), (Code::CONTENT, 2000));
}

#[test]
fn peer_release_and_abort_end_the_connection() {
    for (sig, want) in [
        (
            Signal::Release {
                alternative_address: None,
                hold_off: Some(5),
            },
            Closed::PeerRelease,
        ),
        (
            Signal::Abort {
                bad_csm_option: None,
                diagnostic: b"bye",
            },
            Closed::PeerAbort,
        ),
    ] {
        let mut h = Harness::new(ConnectionConfig::default());
        let mut input = csm(1152);
        sig.emit_vec(Framing::Stream, &[], &mut input);
        input.extend(frame(Code::GET, b"t", &[(11, b"request")], &[]));
        h.feed(&input, 100);
        assert_eq!(h.conn.closed(), Some(want));
        assert_eq!(h.conn.stats().requests, 0, "a request after {want:?}");
    }
    let mut h = Harness::new(ConnectionConfig::default());
    h.conn.release();
    let out = frames(h.conn.output());
    assert_eq!(
        TcpPacket::new_checked(&out[1][..], Framing::Stream)
            .unwrap()
            .code(),
        Code::RELEASE
    );
    assert_eq!(h.conn.closed(), Some(Closed::Released));
}

#[test]
fn websocket_messages_are_one_frame_each() {
    let mut c = Connection::new(Framing::WebSocket, peer(), ConnectionConfig::default());
    let (router, pool) = (router(), pool());
    let mut serve = |req: &Request<'_>, max: usize| handle_request(&router, &pool, req, 0, max);
    let mut ours = c.output().to_vec();
    assert_eq!(ours[0] >> 4, 0, "Len 0 over WebSockets");
    c.consume_output(ours.len());
    c.receive_message(&ws_csm(), &mut serve);
    let get = TcpRepr {
        code: Code::GET,
        token: b"w",
        options: vec![RawOption {
            number: OptionNumber::URI_PATH,
            value: b"request",
        }],
        payload: &[],
    };
    let mut m = Vec::new();
    get.emit_vec(Framing::WebSocket, &mut m).unwrap();
    c.receive_message(&m, &mut serve);
    ours = c.output().to_vec();
    let p = TcpPacket::new_checked(&ours[..], Framing::WebSocket).unwrap();
    assert_eq!(
        (p.code(), p.payload()),
        (Code::CONTENT, &b"hello world"[..])
    );
}

#[test]
fn websocket_output_keeps_each_message_apart() {
    // nothing written between them: the CSM, a Pong and an answer queue up,
    // and each must leave as its own WebSocket message
    let mut c = Connection::new(Framing::WebSocket, peer(), ConnectionConfig::default());
    let (router, pool) = (router(), pool());
    let mut serve = |req: &Request<'_>, max: usize| handle_request(&router, &pool, req, 0, max);
    c.receive_message(&ws_csm(), &mut serve);
    let mut m = Vec::new();
    Signal::Ping { custody: false }.emit_vec(Framing::WebSocket, b"p", &mut m);
    c.receive_message(&m, &mut serve);
    m.clear();
    TcpRepr {
        code: Code::GET,
        token: b"w",
        options: vec![RawOption {
            number: OptionNumber::URI_PATH,
            value: b"request",
        }],
        payload: &[],
    }
    .emit_vec(Framing::WebSocket, &mut m)
    .unwrap();
    c.receive_message(&m, &mut serve);
    let mut codes = Vec::new();
    while let Some(msg) = c.next_message() {
        let msg = msg.to_vec();
        let p = TcpPacket::new_checked(&msg[..], Framing::WebSocket).unwrap();
        codes.push((p.code(), p.token().to_vec()));
        c.consume_output(msg.len());
    }
    assert_eq!(
        codes,
        vec![
            (Code::CSM, vec![]),
            (Code::PONG, b"p".to_vec()),
            (Code::CONTENT, b"w".to_vec())
        ]
    );
    assert!(c.output().is_empty());
}

/// A client's CSM in WebSocket framing (no options).
fn ws_csm() -> Vec<u8> {
    let mut v = Vec::new();
    Signal::Csm {
        max_message_size: None,
        block_wise: false,
    }
    .emit_vec(Framing::WebSocket, &[], &mut v);
    v
}

/// A 2.05 notification in RFC 7252 form (NON, a message ID), with Observe
/// `seq` and a payload of `len` bytes.
fn udp_notification(token: &[u8], seq: u32, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len + 64];
    let mut w =
        crate::wire::MessageWriter::new(&mut buf, MessageType::Non, Code::CONTENT, 0x1234, token)
            .unwrap();
    w.option_uint(OptionNumber::OBSERVE, seq).unwrap();
    w.payload(&vec![b'n'; len]).unwrap();
    let n = w.finish();
    buf.truncate(n);
    buf
}

#[test]
fn notifications_are_framed_without_type_and_held_to_the_peer_max() {
    for framing in [Framing::Stream, Framing::WebSocket] {
        let mut c = Connection::new(framing, peer(), ConnectionConfig::default());
        let csm_len = c.output().len();
        c.consume_output(csm_len);
        // nothing before the peer's CSM
        assert!(!c.notify(&udp_notification(b"ob", 2, 4)));
        let mut peer_csm = Vec::new();
        Signal::Csm {
            max_message_size: Some(1152),
            block_wise: false,
        }
        .emit_vec(framing, &[], &mut peer_csm);
        let mut serve = |_: &Request<'_>, _: usize| Answer::Silent;
        match framing {
            Framing::Stream => c.receive(Instant::now(), &peer_csm, &mut serve),
            Framing::WebSocket => c.receive_message(&peer_csm, &mut serve),
        }
        assert!(c.notify(&udp_notification(b"ob", 3, 4)));
        // larger than the peer takes: not sent, and not cut
        assert!(!c.notify(&udp_notification(b"ob", 4, 2000)));
        assert!(c.notify(&udp_notification(b"ob", 5, 5)));
        assert!(!c.notify(b"\x40"), "not a message");
        let mut got = Vec::new();
        while let Some(m) = c.next_message() {
            let m = m.to_vec();
            let p = TcpPacket::new_checked(&m[..], framing).unwrap();
            let seq = p
                .options()
                .find(|o| o.number == OptionNumber::OBSERVE)
                .and_then(|o| crate::wire::decode_uint(o.value));
            got.push((p.code(), p.token().to_vec(), seq, p.payload().len()));
            c.consume_output(m.len());
        }
        assert_eq!(
            got,
            vec![
                (Code::CONTENT, b"ob".to_vec(), Some(3), 4),
                (Code::CONTENT, b"ob".to_vec(), Some(5), 5)
            ],
            "{framing:?}"
        );
        assert_eq!(
            (c.stats().notifications, c.stats().notifications_dropped),
            (2, 3)
        );
        c.release();
        assert!(!c.notify(&udp_notification(b"ob", 6, 4)), "closing");
    }
}

/// The body of `bert_router`'s `big`: 20,000 bytes that tell their offsets
/// apart.
fn big_body() -> Vec<u8> {
    (0..20_000u32).map(|i| (i % 251) as u8).collect()
}

/// What `up` saw: each block's (NUM, M, SZX, length), and the bytes.
type Seen = std::sync::Arc<std::sync::Mutex<(Vec<(u32, bool, u8, usize)>, Vec<u8>)>>;

/// `big` (GET, block-wise in 1024-byte blocks, RFC 7959 only) and `up`
/// (PUT with Block1: records each block's (NUM, M, SZX, length) and the
/// bytes, 2.31 while more follow).
fn bert_router(seen: Seen) -> Router {
    let mut r = Router::new();
    r.add(Resource::new("big").get(|req, rb| {
        crate::server::block::respond_block2(req, rb, &big_body(), 1024);
    }))
    .unwrap();
    r.add(Resource::new("up").put(move |req, rb| {
        let v = req
            .packet
            .option(OptionNumber::BLOCK1)
            .and_then(|o| o.uint())
            .unwrap_or(0);
        let (num, more, szx) = (v >> 4, v & 8 != 0, (v & 7) as u8);
        let mut s = seen.lock().unwrap();
        s.0.push((num, more, szx, req.payload().len()));
        s.1.extend_from_slice(req.payload());
        rb.set_code(if more { Code::CONTINUE } else { Code::CHANGED });
        rb.option_uint(OptionNumber::BLOCK1, v);
    }))
    .unwrap();
    r
}

fn bert_csm(max: u32, block_wise: bool) -> Vec<u8> {
    let mut v = Vec::new();
    Signal::Csm {
        max_message_size: Some(max),
        block_wise,
    }
    .emit_vec(Framing::Stream, &[], &mut v);
    v
}

fn block_value(p: &TcpPacket<&[u8]>, n: OptionNumber) -> Option<u32> {
    p.options().find(|o| o.number == n).and_then(|o| o.uint())
}

#[test]
fn bert_block2_carries_several_kilobytes_a_message() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
    let mut h = Harness::new(ConnectionConfig::default());
    h.router = bert_router(seen);
    let mut out = h.feed(&bert_csm(8192, true), 1000);
    out.clear();
    // 8192 - 128 bytes of room: 7 units of 1024 a message
    let mut body = Vec::new();
    let mut num = 0u32;
    let mut etag = None;
    for round in 0..5 {
        let v = (num << 4) | 7;
        let mut b = [0u8; 4];
        let opt = crate::wire::encode_uint(v, &mut b).to_vec();
        let f = h.feed(
            &frame(Code::GET, b"b", &[(11, b"big"), (23, &opt)], &[]),
            1000,
        );
        assert_eq!(f.len(), 1, "round {round}");
        let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
        assert_eq!(p.code(), Code::CONTENT);
        let b2 = block_value(&p, OptionNumber::BLOCK2).expect("Block2");
        assert_eq!((b2 >> 4, b2 & 7), (num, 7), "NUM in 1024-byte units, SZX 7");
        let tag = p
            .options()
            .find(|o| o.number == OptionNumber::ETAG)
            .map(|o| o.value.to_vec());
        assert!(tag.is_some());
        assert!(etag.is_none() || etag == tag, "one representation");
        etag = tag;
        let more = b2 & 8 != 0;
        if more {
            assert_eq!(p.payload().len(), 7 * 1024, "whole units but the last");
        }
        body.extend_from_slice(p.payload());
        num += (p.payload().len() / 1024) as u32;
        if !more {
            break;
        }
    }
    assert_eq!(body, big_body(), "three messages instead of twenty");
    assert_eq!(num, 19);
}

#[test]
fn bert_block1_hands_over_1024_byte_blocks_and_answers_as_bert() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
    let mut h = Harness::new(ConnectionConfig::default());
    h.router = bert_router(seen.clone());
    h.feed(&bert_csm(8192, true), 1000);
    let data: Vec<u8> = (0..2148u32).map(|i| i as u8).collect();
    let put = |num: u32, more: bool, payload: &[u8]| {
        let v = (num << 4) | (u32::from(more) << 3) | 7;
        let mut b = [0u8; 4];
        let opt = crate::wire::encode_uint(v, &mut b).to_vec();
        frame(Code::PUT, b"u", &[(11, b"up"), (27, &opt)], payload)
    };
    let f = h.feed(&put(0, true, &data[..2048]), 1000);
    let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
    assert_eq!(p.code(), Code::CONTINUE);
    assert_eq!(
        block_value(&p, OptionNumber::BLOCK1),
        Some(8 | 7),
        "NUM 0, M, SZX 7"
    );
    let f = h.feed(&put(2, false, &data[2048..]), 1000);
    let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
    assert_eq!(p.code(), Code::CHANGED);
    assert_eq!(block_value(&p, OptionNumber::BLOCK1), Some((2 << 4) | 7));
    let s = seen.lock().unwrap();
    assert_eq!(
        s.0,
        vec![(0, true, 6, 1024), (1, true, 6, 1024), (2, false, 6, 100)],
        "the handler saw RFC 7959 blocks"
    );
    assert_eq!(s.1, data);
    drop(s);
    // more to come but not whole units: 4.00
    let f = h.feed(&put(3, true, &[1u8; 1000]), 1000);
    let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
    assert_eq!(p.code(), Code::BAD_REQUEST);
}

#[test]
fn without_the_peers_offer_szx_7_is_refused() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
    let mut h = Harness::new(ConnectionConfig::default());
    h.router = bert_router(seen);
    h.feed(&bert_csm(8192, false), 1000);
    let f = h.feed(
        &frame(Code::GET, b"b", &[(11, b"big"), (23, &[7])], &[]),
        1000,
    );
    let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
    assert_eq!(
        p.code(),
        Code::BAD_REQUEST,
        "RFC 7959 2.2: SZX 7 is reserved"
    );
    // and a plain request is still served block-wise in 1024-byte blocks
    let f = h.feed(&frame(Code::GET, b"c", &[(11, b"big")], &[]), 1000);
    let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
    assert_eq!(block_value(&p, OptionNumber::BLOCK2), Some(8 | 6));
    assert_eq!(p.payload().len(), 1024);
}
