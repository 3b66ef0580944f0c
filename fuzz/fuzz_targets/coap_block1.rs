//! Sequences of datagrams through the block-wise request path
//! (`process_request_blockwise`, RFC 7959) with small Block1 limits: each
//! input is split into datagrams (a length byte, then that many bytes),
//! sent from one of two peers, with virtual time advancing by a byte per
//! datagram. Every answer must parse and carry the request's token; the
//! store's bounds must hold after every request; no pool block may leak.
#![no_main]

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use mintgate_buf::{PartitionConfig, Pool};
use mintgate_coap::server::block::respond_block2;
use mintgate_coap::server::{
    classify, finish_response, process_request_blockwise, Answer, Block1Config, Block1Store,
    Handled, Inbound, Request, Resource, Router,
};
use mintgate_coap::wire::{Code, MessageType, Packet};

const CFG: Block1Config = Block1Config {
    max_body: 2000,
    max_bytes: 3000,
    max_transfers: 3,
    per_peer: 2,
    timeout: Duration::from_secs(5),
    block_size: 64,
    per_source_bytes: 2000,
};

fn router() -> Router {
    let mut r = Router::new();
    r.add(
        Resource::new("echo")
            .put(|_, rb| {
                rb.set_code(Code::CHANGED);
            })
            .post(|req, rb| {
                rb.set_code(Code::CHANGED);
                respond_block2(req, rb, req.payload(), 64);
            }),
    )
    .unwrap();
    r
}

fn pool() -> Pool {
    Pool::new(&[
        PartitionConfig {
            block_size: 128,
            blocks: 8,
        },
        PartitionConfig {
            block_size: 1280,
            blocks: 8,
        },
    ])
}

fuzz_target!(|data: &[u8]| {
    let router = router();
    let pool = pool();
    let store = Mutex::new(Block1Store::new(CFG));
    let peers: [SocketAddr; 2] = [
        "[::1]:5683".parse().unwrap(),
        "127.0.0.1:9".parse().unwrap(),
    ];
    let t0 = Instant::now();
    let mut now = t0;
    let mut rest = data;
    for i in 0..64 {
        let Some((&len, tail)) = rest.split_first() else {
            break;
        };
        let len = (len as usize).min(tail.len());
        let (dg, tail) = tail.split_at(len);
        rest = tail;
        now += Duration::from_millis(len as u64 * 20);
        let Inbound::Request(p) = classify(dg) else {
            continue;
        };
        let req = Request {
            peer: peers[i % 2],
            packet: &p,
            identity: None,
        };
        let h = process_request_blockwise(&router, &pool, &store, now, &req, 64, 1024);
        if let Handled::Respond(rb) = h {
            match finish_response(&pool, rb, MessageType::Ack, p.message_id(), p.token()) {
                Answer::Send(o) => {
                    let bytes = o.to_vec();
                    let a = Packet::new_checked(&bytes[..]).expect("answer parses");
                    assert_eq!(a.token(), p.token());
                    assert!(a.code().is_response());
                }
                Answer::Silent => {}
                Answer::Exhausted => panic!("pool exhausted with one request in flight"),
            }
        }
        let s = store.lock().unwrap();
        assert!(s.bytes() <= CFG.max_bytes && s.len() <= CFG.max_transfers);
        drop(s);
        assert_eq!(pool.outstanding(), 0, "pool block leaked");
    }
    let mut s = store.lock().unwrap();
    s.expire(now + CFG.timeout);
    assert!(s.is_empty() && s.bytes() == 0);
});
