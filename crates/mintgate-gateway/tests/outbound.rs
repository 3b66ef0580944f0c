//! The outbound client against an in-process gateway over loopback UDP:
//! block-wise both ways, and the network cache (fresh hits without a
//! datagram, revalidation with the ETag, invalidation by a PUT).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_coap::cache::Cache;
use mintgate_coap::client::blockwise::BlockConfig;
use mintgate_coap::client::{ClientConfig, Request};
use mintgate_coap::rto::{Basic, TransmissionParams};
use mintgate_coap::server::block::respond_block2;
use mintgate_coap::server::Resource;
use mintgate_coap::wire::{decode_uint, Code, OptionNumber};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::outbound::{Outbound, Source};
use mintgate_gateway::{resources, Config, Gateway};

fn gateway() -> (Gateway, SocketAddr) {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(2);
    c.buffers.partitions = vec![
        mintgate_gateway::config::Partition {
            block_size: 192,
            blocks: 512,
        },
        mintgate_gateway::config::Partition {
            block_size: 1280,
            blocks: 256,
        },
    ];
    let gw = Gateway::start(c.clone(), resources::router_for(&c)).unwrap();
    let a = gw.local_addrs()[0];
    (gw, a)
}

fn outbound(block: BlockConfig) -> Outbound {
    let p = TransmissionParams::default();
    Outbound::new(
        false,
        ClientConfig::new(p),
        Box::new(Basic::new(p, 3)),
        3,
        block,
    )
    .unwrap()
}

fn req(code: Code, path: &str, payload: Vec<u8>) -> Request {
    Request {
        confirmable: true,
        code,
        options: vec![(OptionNumber::URI_PATH, path.as_bytes().to_vec())],
        payload,
    }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn a_large_value_goes_up_and_comes_back_whole() {
    let (_gw, addr) = gateway();
    let data: Vec<u8> = (0..30_000).map(|i| b'a' + (i % 26) as u8).collect();
    for size in [1024, 128] {
        let mut o = outbound(BlockConfig {
            block_size: size,
            ask_block2: size < 1024,
            ..BlockConfig::default()
        });
        let put = o
            .request(addr, req(Code::PUT, "echo", data.clone()), deadline())
            .unwrap();
        assert_eq!(put.response.code, Code::CHANGED);
        assert_eq!(put.response.exchanges as usize, data.len().div_ceil(size));
        // the first large answer to this address is cut to a small first
        // block carrying Echo (anti-amplification); repeating the Echo
        // verifies the address, and the blocks grow back to `size` as soon
        // as the offset allows: a few more exchanges, then none
        for extra in [7, 0] {
            let got = o
                .request(addr, req(Code::GET, "echo", vec![]), deadline())
                .unwrap();
            assert_eq!(got.response.code, Code::CONTENT);
            assert_eq!(got.response.payload, data, "block size {size}");
            let n = got.response.exchanges as usize;
            let want = data.len().div_ceil(size);
            assert!(
                (want..=want + extra).contains(&n),
                "block size {size}: {n} exchanges for {want} blocks"
            );
        }
    }
}

#[test]
fn the_cache_answers_fresh_revalidates_stale_and_forgets_after_a_put() {
    let (gw, addr) = gateway();
    // /tick: Max-Age 1 s, ETag of its value; counts the GETs it handles
    let calls = Arc::new(AtomicU64::new(0));
    let value = Arc::new(parking_lot::Mutex::new(b"v1".to_vec()));
    let (c2, v2, v3) = (calls.clone(), value.clone(), value.clone());
    gw.add_resource(
        Resource::new("tick")
            .get(move |req, rb| {
                c2.fetch_add(1, Relaxed);
                rb.max_age(1);
                respond_block2(req, rb, &v2.lock(), 1024);
            })
            .put(move |req, rb| {
                *v3.lock() = req.payload().to_vec();
                rb.set_code(Code::CHANGED);
            }),
    )
    .unwrap();
    let mut o = outbound(BlockConfig::default()).with_cache(Cache::new(16, 4096));
    let get = |o: &mut Outbound| {
        o.request(addr, req(Code::GET, "tick", vec![]), deadline())
            .unwrap()
    };
    let first = get(&mut o);
    assert_eq!(
        (first.source, first.response.payload.as_ref()),
        (Source::Network, &b"v1"[..])
    );
    let sent = o.client().stats().transmissions;
    let hit = get(&mut o);
    assert_eq!(hit.source, Source::Cache { age: 0 });
    assert_eq!(&hit.response.payload[..], b"v1");
    assert_eq!(
        hit.response
            .options
            .iter()
            .find(|(n, _)| *n == OptionNumber::MAX_AGE)
            .and_then(|(_, v)| decode_uint(v)),
        Some(1)
    );
    assert_eq!(
        o.client().stats().transmissions,
        sent,
        "no datagram for a hit"
    );
    assert_eq!(calls.load(Relaxed), 1);
    // wait until the entry is stale (Max-Age 1 s): revalidated by its ETag
    std::thread::sleep(Duration::from_millis(1100));
    let again = get(&mut o);
    assert_eq!(again.source, Source::Revalidated);
    assert_eq!(again.response.code, Code::CONTENT);
    assert_eq!(&again.response.payload[..], b"v1");
    assert_eq!(
        calls.load(Relaxed),
        2,
        "the server was asked, with the ETag"
    );
    // a PUT through the same client drops the entry: the next GET is fresh
    o.request(addr, req(Code::PUT, "tick", b"v2".to_vec()), deadline())
        .unwrap();
    let after = get(&mut o);
    assert_eq!(
        (after.source, after.response.payload.as_ref()),
        (Source::Network, &b"v2"[..])
    );
    let s = o.stats();
    assert_eq!((s.cache_hits, s.revalidated, s.network), (1, 1, 3));
}
