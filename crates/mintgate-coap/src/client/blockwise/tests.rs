//! Block-wise sequencing: the real sans-IO client and, as the peer, the
//! real server code (Block1 reassembly, Block2 responder) or a scripted
//! server that breaks the rules; virtual time, no sockets.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mintgate_buf::{PartitionConfig, Pool};
use proptest::prelude::*;

use super::*;
use crate::client::{Client, ClientConfig};
use crate::rto::{Basic, TransmissionParams};
use crate::server::block::respond_block2;
use crate::server::{
    classify, finish_response, process_request_blockwise, Answer, Block1Config, Block1Store,
    Handled, Inbound, Request as SrvRequest, Resource, Router,
};
use crate::wire::{MessageWriter, Packet};

fn server_addr() -> SocketAddr {
    "127.0.0.1:5683".parse().unwrap()
}

/// What the server side of a test does with a request datagram.
type Serve<'a> = dyn FnMut(&[u8]) -> Option<Vec<u8>> + 'a;

/// Runs one transfer to the end; returns the step it ended with and the
/// requests it sent (decoded as (code, Block1, Block2, payload length)).
fn run(req: Request, cfg: BlockConfig, serve: &mut Serve<'_>) -> (Step, Vec<Sent>) {
    let params = TransmissionParams::default();
    let mut client = Client::new(
        ClientConfig::new(params),
        Box::new(Basic::new(params, 1)),
        7,
    );
    let now = Instant::now();
    let (mut t, first) = Transfer::new(req, cfg);
    let mut sent = Vec::new();
    client.request(now, server_addr(), first).unwrap();
    for _ in 0..10_000 {
        let mut in_flight = 0;
        while let Some(tx) = client.poll_transmit(now) {
            in_flight += 1;
            let p = Packet::new_checked(&tx.bytes[..]).unwrap();
            let blk = |n| {
                p.option(n)
                    .and_then(|o| o.uint())
                    .and_then(BlockOpt::decode)
            };
            sent.push(Sent {
                code: p.code(),
                block1: blk(OptionNumber::BLOCK1),
                block2: blk(OptionNumber::BLOCK2),
                etag: p.option(OptionNumber::ETAG).is_some(),
                len: p.payload().len(),
                tag: p
                    .option(OptionNumber::REQUEST_TAG)
                    .map(|o| o.value.to_vec()),
            });
            if let Some(r) = serve(&tx.bytes) {
                client.handle_datagram(now, server_addr(), &r);
            }
        }
        assert!(in_flight <= 1, "one block at a time");
        let Some(ev) = client.poll_event() else {
            panic!("the server did not answer");
        };
        match t.on_event(ev).expect("a response") {
            Step::Send(next) => {
                client.request(now, server_addr(), next).unwrap();
            }
            end => return (end, sent),
        }
    }
    panic!("no end after 10000 exchanges");
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    code: Code,
    block1: Option<BlockOpt>,
    block2: Option<BlockOpt>,
    etag: bool,
    len: usize,
    tag: Option<Vec<u8>>,
}

/// The real server: `/v` stores PUT (2.04), answers GET in blocks of
/// `max_block` (2.05, ETag) and POST with the payload (2.04, blocks).
struct Srv {
    router: Router,
    pool: Pool,
    blocks: Mutex<Block1Store>,
    value: Arc<Mutex<Vec<u8>>>,
}

impl Srv {
    fn new(max_block: usize, block1: Block1Config) -> Srv {
        let value: Arc<Mutex<Vec<u8>>> = Arc::default();
        let (g, p) = (value.clone(), value.clone());
        let mut router = Router::new();
        router
            .add(
                Resource::new("v")
                    .get(move |req, rb| respond_block2(req, rb, &g.lock().unwrap(), max_block))
                    .put(move |req, rb| {
                        *p.lock().unwrap() = req.payload().to_vec();
                        rb.set_code(Code::CHANGED);
                    })
                    .post(move |req, rb| {
                        rb.set_code(Code::CHANGED);
                        respond_block2(req, rb, req.payload(), max_block);
                    }),
            )
            .unwrap();
        Srv {
            router,
            pool: Pool::new(&[PartitionConfig {
                block_size: 1400,
                blocks: 16,
            }]),
            blocks: Mutex::new(Block1Store::new(block1)),
            value,
        }
    }

    fn serve(&self, dg: &[u8]) -> Option<Vec<u8>> {
        let Inbound::Request(p) = classify(dg) else {
            return None;
        };
        let req = SrvRequest {
            peer: "127.0.0.1:40000".parse().unwrap(),
            packet: &p,
            identity: None,
        };
        let Handled::Respond(rb) = process_request_blockwise(
            &self.router,
            &self.pool,
            &self.blocks,
            Instant::now(),
            &req,
            64,
            1024,
        ) else {
            return None;
        };
        match finish_response(&self.pool, rb, MessageType::Ack, p.message_id(), p.token()) {
            Answer::Send(o) => Some(o.to_vec()),
            _ => None,
        }
    }
}

fn req(code: Code, payload: Vec<u8>) -> Request {
    Request {
        confirmable: true,
        code,
        options: vec![(OptionNumber::URI_PATH, b"v".to_vec())],
        payload,
    }
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 253) as u8).collect()
}

fn done(s: Step) -> Response {
    match s {
        Step::Done(r) => r,
        other => panic!("expected a response, got {other:?}"),
    }
}

/// RFC 9175 3: every block of one upload, and the Block2 requests for its
/// answer, carry one Request-Tag; the next upload another; a request that
/// fits one message or downloads carries none, and a tag the caller set is
/// kept.
#[test]
fn each_upload_has_a_request_tag_of_its_own() {
    let srv = Srv::new(64, Block1Config::default());
    let cfg = BlockConfig {
        block_size: 64,
        ..BlockConfig::default()
    };
    let mut tags = Vec::new();
    for code in [Code::PUT, Code::PUT, Code::POST] {
        let (end, sent) = run(req(code, body(300)), cfg, &mut |d| srv.serve(d));
        let r = done(end);
        assert_eq!(r.code.class(), 2);
        let tag = sent[0]
            .tag
            .clone()
            .expect("the first block carries a Request-Tag");
        assert!(tag.len() <= 8);
        assert!(
            sent.iter().all(|s| s.tag.as_ref() == Some(&tag)),
            "{sent:?}"
        );
        if code == Code::POST {
            // the answer came in blocks too, asked for under the same tag
            assert!(sent.iter().any(|s| s.block2.is_some_and(|b| b.num > 0)));
            assert_eq!(r.payload, body(300));
        }
        tags.push(tag);
    }
    assert!(tags[0] != tags[1] && tags[1] != tags[2], "{tags:?}");
    let (_, sent) = run(req(Code::PUT, body(64)), cfg, &mut |d| srv.serve(d));
    assert_eq!(
        (sent.len(), sent[0].tag.as_ref()),
        (1, None),
        "one message: no tag"
    );
    *srv.value.lock().unwrap() = body(300);
    let (_, sent) = run(req(Code::GET, vec![]), cfg, &mut |d| srv.serve(d));
    assert!(sent.len() > 1 && sent.iter().all(|s| s.tag.is_none()));
    let mut own = req(Code::PUT, body(300));
    own.options
        .push((OptionNumber::REQUEST_TAG, b"mine".to_vec()));
    let (_, sent) = run(own, cfg, &mut |d| srv.serve(d));
    assert!(sent.iter().all(|s| s.tag.as_deref() == Some(&b"mine"[..])));
}

#[test]
fn put_in_blocks_then_get_in_blocks() {
    let srv = Srv::new(256, Block1Config::default());
    let data = body(3000);
    let cfg = BlockConfig {
        block_size: 512,
        ..BlockConfig::default()
    };
    let (end, sent) = run(req(Code::PUT, data.clone()), cfg, &mut |d| srv.serve(d));
    let r = done(end);
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(r.exchanges, 6);
    assert!(r.option(OptionNumber::BLOCK1).is_none());
    let nums: Vec<(u32, bool, usize)> = sent
        .iter()
        .map(|s| {
            let b = s.block1.unwrap();
            (b.num, b.more, s.len)
        })
        .collect();
    assert_eq!(
        nums,
        vec![
            (0, true, 512),
            (1, true, 512),
            (2, true, 512),
            (3, true, 512),
            (4, true, 512),
            (5, false, 440)
        ]
    );
    assert_eq!(*srv.value.lock().unwrap(), data);

    let (end, sent) = run(req(Code::GET, vec![]), cfg, &mut |d| srv.serve(d));
    let r = done(end);
    assert_eq!((r.code, r.exchanges), (Code::CONTENT, 12));
    assert_eq!(r.payload, data);
    assert!(r.option(OptionNumber::ETAG).is_some());
    assert!(r.option(OptionNumber::BLOCK2).is_none() && r.option(OptionNumber::SIZE2).is_none());
    // the first GET has no Block2; then 1, 2, ... in the server's size
    assert_eq!(sent[0].block2, None);
    for (i, s) in sent.iter().enumerate().skip(1) {
        assert_eq!(s.block2.map(|b| (b.num, b.szx)), Some((i as u32, 4)));
    }
}

#[test]
fn a_smaller_block_size_is_asked_for_and_honoured() {
    let srv = Srv::new(1024, Block1Config::default());
    *srv.value.lock().unwrap() = body(300);
    let cfg = BlockConfig {
        block_size: 64,
        ask_block2: true,
        ..BlockConfig::default()
    };
    let (end, sent) = run(req(Code::GET, vec![]), cfg, &mut |d| srv.serve(d));
    assert_eq!(done(end).payload, body(300));
    assert_eq!(sent.len(), 5);
    assert!(sent.iter().all(|s| s.block2.unwrap().szx == 2));
}

#[test]
fn the_server_shrinks_the_upload_blocks() {
    let srv = Srv::new(
        1024,
        Block1Config {
            block_size: 128,
            ..Block1Config::default()
        },
    );
    let data = body(1024 + 300);
    let (end, sent) = run(
        req(Code::PUT, data.clone()),
        BlockConfig::default(),
        &mut |d| srv.serve(d),
    );
    assert_eq!(done(end).code, Code::CHANGED);
    let b: Vec<(u32, u8)> = sent
        .iter()
        .map(|s| s.block1.map(|b| (b.num, b.szx)).unwrap())
        .collect();
    // 1024 bytes at szx 6, then from byte 1024 on in 128-byte blocks: 8, 9, 10
    assert_eq!(b, vec![(0, 6), (8, 3), (9, 3), (10, 3)]);
    assert_eq!(*srv.value.lock().unwrap(), data);
}

#[test]
fn a_post_with_a_large_answer_uploads_then_downloads() {
    let srv = Srv::new(128, Block1Config::default());
    let data = body(1500);
    let (end, sent) = run(
        req(Code::POST, data.clone()),
        BlockConfig::default(),
        &mut |d| srv.serve(d),
    );
    let r = done(end);
    assert_eq!((r.code, r.payload.len()), (Code::CHANGED, 1500));
    assert_eq!(r.payload, data);
    // 2 upload blocks, then block 1.. of the answer, without payload
    assert_eq!(sent.len(), 2 + 11);
    for s in &sent[2..] {
        assert_eq!((s.code, s.block1, s.len), (Code::POST, None, 0));
    }
}

#[test]
fn an_error_during_upload_ends_it_with_that_error() {
    let srv = Srv::new(
        1024,
        Block1Config {
            max_body: 1000,
            ..Block1Config::default()
        },
    );
    let (end, sent) = run(
        req(Code::PUT, body(5000)),
        BlockConfig::default(),
        &mut |d| srv.serve(d),
    );
    let r = done(end);
    assert_eq!(r.code, Code::REQUEST_ENTITY_TOO_LARGE);
    assert_eq!(r.option(OptionNumber::SIZE1), Some(&[0x03, 0xe8][..]));
    assert_eq!(sent.len(), 1, "stopped at the first block");
}

#[test]
fn a_changing_representation_restarts_then_gives_up() {
    // the value changes at every `every`-th GET, up to the `until`-th
    for (every, until, want_ok) in [(5usize, 12, true), (1, 30, false)] {
        let srv = Srv::new(64, Block1Config::default());
        *srv.value.lock().unwrap() = body(640);
        let mut n = 0;
        let (end, sent) = run(req(Code::GET, vec![]), BlockConfig::default(), &mut |d| {
            n += 1;
            if n % every == 0 && n < until {
                let mut v = srv.value.lock().unwrap();
                v[0] = v[0].wrapping_add(1);
            }
            srv.serve(d)
        });
        if want_ok {
            let r = done(end);
            assert_eq!(r.payload[1..], body(640)[1..]);
            assert!(
                sent.iter()
                    .filter(|s| s.block2.is_some_and(|b| b.num == 0))
                    .count()
                    >= 1,
                "restarted from block 0"
            );
            assert!(!sent.iter().any(|s| s.etag), "no ETag on continuations");
        } else {
            assert_eq!(end, Step::Failed(BlockError::Changed { restarts: 3 }));
        }
    }
}

#[test]
fn too_large_bodies_are_refused() {
    let srv = Srv::new(64, Block1Config::default());
    *srv.value.lock().unwrap() = body(1000);
    let cfg = BlockConfig {
        max_body: 999,
        ..BlockConfig::default()
    };
    let (end, sent) = run(req(Code::GET, vec![]), cfg, &mut |d| srv.serve(d));
    assert_eq!(end, Step::Failed(BlockError::TooLarge { limit: 999 }));
    assert_eq!(sent.len(), 1, "Size2 told at once");
}

/// Block n -> (Block2 value, payload length, ETag).
type Script = dyn Fn(u32) -> (u32, usize, u8);

/// A scripted server answering GET block n with `f(n)`: (Block2 value,
/// payload length, ETag).
fn scripted(f: impl Fn(u32) -> (u32, usize, u8)) -> impl FnMut(&[u8]) -> Option<Vec<u8>> {
    move |dg| {
        let p = Packet::new_checked(dg).unwrap();
        let num = p
            .option(OptionNumber::BLOCK2)
            .and_then(|o| o.uint())
            .and_then(BlockOpt::decode)
            .map_or(0, |b| b.num);
        let (b2, len, tag) = f(num);
        let mut buf = vec![0u8; 1400];
        let mut w = MessageWriter::new(
            &mut buf,
            MessageType::Ack,
            Code::CONTENT,
            p.message_id(),
            p.token(),
        )
        .unwrap();
        w.option(OptionNumber::ETAG, &[tag]).unwrap();
        w.option_uint(OptionNumber::BLOCK2, b2).unwrap();
        w.payload(&vec![b'x'; len]).unwrap();
        let n = w.finish();
        buf.truncate(n);
        Some(buf)
    }
}

#[test]
fn rule_breaking_servers_fail_the_transfer() {
    let b = |num, more| BlockOpt { num, more, szx: 2 }.encode();
    let cases: Vec<(Box<Script>, &str)> = vec![
        (
            Box::new(move |_| (b(0, true), 64, 1)),
            "starts at byte 0, expected 64",
        ),
        (Box::new(move |n| (b(n + 1, true), 64, 1)), "expected 0"),
        (Box::new(move |n| (b(n, true), 10, 1)), "not its size"),
        (Box::new(|_| (0x0f, 64, 1)), "bad Block2"),
    ];
    for (f, why) in cases {
        let (end, _) = run(
            req(Code::GET, vec![]),
            BlockConfig::default(),
            &mut scripted(f),
        );
        match end {
            Step::Failed(BlockError::Protocol(m)) => assert!(m.contains(why), "{m} vs {why}"),
            other => panic!("{why}: {other:?}"),
        }
    }
    // a 2.31 to the final block
    let (end, _) = run(
        req(Code::PUT, body(100)),
        BlockConfig {
            block_size: 64,
            ..BlockConfig::default()
        },
        &mut |dg| {
            let p = Packet::new_checked(dg).unwrap();
            let mut buf = vec![0u8; 64];
            let w = MessageWriter::new(
                &mut buf,
                MessageType::Ack,
                Code::CONTINUE,
                p.message_id(),
                p.token(),
            )
            .unwrap();
            let n = w.finish();
            buf.truncate(n);
            Some(buf)
        },
    );
    assert_eq!(
        end,
        Step::Failed(BlockError::Protocol(
            "2.31 Continue to the final block".into()
        ))
    );
}

#[test]
fn small_requests_are_one_exchange_without_block_options() {
    let srv = Srv::new(1024, Block1Config::default());
    let (end, sent) = run(
        req(Code::PUT, body(1024)),
        BlockConfig::default(),
        &mut |d| srv.serve(d),
    );
    assert_eq!(done(end).exchanges, 1);
    assert_eq!((sent[0].block1, sent[0].len), (None, 1024));
    // timeouts and resets are the caller's
    let (mut t, _) = Transfer::new(req(Code::GET, vec![]), BlockConfig::default());
    assert!(t
        .on_event(Event::Timeout {
            id: crate::client::ExchangeId(0)
        })
        .is_none());
}

proptest! {
    /// Any body, any client and server block sizes: up and back down whole,
    /// in strictly increasing blocks, one exchange at a time.
    #[test]
    fn any_sizes_round_trip(len in 0usize..6000, client in 0u8..7, server_up in 0u8..7, server_down in 0u8..7, ask: bool) {
        let srv = Srv::new(16 << server_down, Block1Config { block_size: 16 << server_up, ..Block1Config::default() });
        let data = body(len);
        let cfg = BlockConfig { block_size: 16 << client, ask_block2: ask, ..BlockConfig::default() };
        let (end, sent) = run(req(Code::PUT, data.clone()), cfg, &mut |d| srv.serve(d));
        prop_assert_eq!(done(end).code, Code::CHANGED);
        prop_assert_eq!(&*srv.value.lock().unwrap(), &data);
        let mut offset = 0;
        for s in &sent {
            if let Some(b) = s.block1 {
                prop_assert_eq!(b.num as usize * b.size(), offset);
                offset += s.len;
            }
        }
        prop_assert!(sent.len() == 1 || offset == len);
        let (end, sent) = run(req(Code::GET, vec![]), cfg, &mut |d| srv.serve(d));
        let r = done(end);
        prop_assert_eq!(r.payload, data);
        // block offsets strictly increase; never larger than the client's size
        // after the first answer
        let mut last = None;
        for (i, s) in sent.iter().enumerate() {
            match s.block2 {
                Some(b) => {
                    let off = b.num as usize * b.size();
                    prop_assert!(last.is_none_or(|l| off > l), "{:?}", sent);
                    prop_assert!(b.size() <= 16 << client);
                    last = Some(off);
                }
                None => prop_assert_eq!(i, 0),
            }
        }
    }
}
