//! The whole server endpoint, fed a script of hostile events: datagrams
//! from a few sources (requests, duplicates, ACKs and Resets of what it
//! sent, garbage), time passing, timeouts and notifications. Invariants:
//! every datagram it sends parses as CoAP; nothing sent in answer to a
//! datagram from an unverified source is larger than
//! `amplification_factor` times that datagram (RFC 9175 2.4); its tables
//! stay within their bounds; no pool block outlives the endpoint.
#![no_main]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use mintgate_buf::{PartitionConfig, Pool};
use mintgate_coap::server::{
    Endpoint, EndpointConfig, Incoming, Request, Resource, Router, Transmit,
};
use mintgate_coap::wire::{Code, ContentFormat, MessageType, Packet};

const FACTOR: usize = 3;

fn router() -> Router {
    let mut r = Router::new();
    r.add(Resource::new("small").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(b"21.5");
    }))
    .unwrap();
    r.add(Resource::new("big").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(&[b'x'; 900]);
    }))
    .unwrap();
    r.add(Resource::new("obs").flag("obs").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(&[b'o'; 300]);
    }))
    .unwrap();
    r.add(Resource::new("echo").put(|req, rb| {
        rb.set_code(Code::CHANGED);
        rb.write(req.payload());
    }))
    .unwrap();
    r
}

fn peer(i: u8) -> SocketAddr {
    match i % 4 {
        3 => "[2001:db8::1]:5683".parse().unwrap(),
        n => SocketAddr::from(([192, 0, 2, n + 1], 40000)),
    }
}

/// Checks one datagram the endpoint sends; returns its message ID and type.
fn check(t: &Transmit) -> (u16, MessageType) {
    let v = t.datagram.to_vec();
    assert_eq!(v.len(), t.datagram.len());
    match Packet::new_checked(&v[..]) {
        Ok(p) => (p.message_id(), p.msg_type()),
        Err(e) => panic!("sent datagram does not parse: {e:?} {v:02x?}"),
    }
}

struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        a
    }
}

thread_local! {
    static ROUTER: Router = router();
}

fuzz_target!(|data: &[u8]| {
    let pool = Pool::new(&[
        PartitionConfig {
            block_size: 256,
            blocks: 32,
        },
        PartitionConfig {
            block_size: 2048,
            blocks: 16,
        },
    ]);
    let start = Instant::now();
    let mut cfg = EndpointConfig {
        dedup_capacity: 64,
        handler_slots: 2,
        max_pending: 16,
        verified_capacity: 2,
        seed: 1,
        echo_secret: Some([7; 32]),
        ..EndpointConfig::default()
    };
    cfg.amplification_factor = FACTOR as u32;
    cfg.observe.max_observers = 8;
    cfg.observe.max_per_source = 2;
    let (max_observers, max_pending) = (cfg.observe.max_observers, cfg.max_pending);
    let ep = Endpoint::new(cfg, pool.clone(), start);
    let mut now = start;
    // the last message the endpoint sent to each peer, to ACK or Reset
    let mut last: [Option<(u16, MessageType)>; 4] = [None; 4];
    let mut s = Script(data);
    ROUTER.with(|router| {
        while let Some(op) = s.byte() {
            let who = s.byte().unwrap_or(0) % 4;
            let from = peer(who);
            match op % 5 {
                // a datagram
                0 | 1 => {
                    let n = usize::from(s.byte().unwrap_or(0));
                    let dg = s.bytes(n).to_vec();
                    let sent = match ep.handle_datagram(now, from, 0, &dg) {
                        Incoming::Request { .. } => {
                            let Ok(p) = Packet::new_checked(&dg[..]) else {
                                panic!("a request that does not parse");
                            };
                            let t = ep.begin(0, now, from, 0, &p, false);
                            let req = Request {
                                peer: from,
                                packet: &p,
                                identity: None,
                            };
                            let h = ep.process(now, router, &req);
                            ep.respond(now, t, router, &req, h).transmit()
                        }
                        Incoming::Duplicate(t) | Incoming::Malformed(t) | Incoming::Ignored(t) => {
                            t
                        }
                        Incoming::Consumed => None,
                    };
                    if let Some(t) = sent {
                        assert_eq!(t.peer, from);
                        let m = check(&t);
                        last[usize::from(who)] = Some(m);
                        if !ep.is_verified(now, &from) {
                            assert!(
                                t.datagram.len() <= FACTOR * dg.len(),
                                "{} bytes sent for {} from an unverified source",
                                t.datagram.len(),
                                dg.len()
                            );
                        }
                    }
                }
                // an ACK or a Reset of the last message sent to this peer
                2 => {
                    if let Some((mid, _)) = last[usize::from(who)] {
                        let ty = if s.byte().unwrap_or(0) & 1 == 0 { 0x60 } else { 0x70 };
                        let dg = [ty, 0, (mid >> 8) as u8, mid as u8];
                        let _ = ep.handle_datagram(now, from, 0, &dg);
                    }
                }
                // time passes; timers fire
                3 => {
                    now += Duration::from_millis(u64::from(s.byte().unwrap_or(0)) * 250);
                    ep.handle_timeout(now);
                }
                // the observed resource changes
                _ => {
                    let mut out = Vec::new();
                    ep.notify(now, router, "obs", &mut out);
                    for t in &out {
                        let m = check(t);
                        let i = (0..4).find(|&i| peer(i) == t.peer).unwrap();
                        last[usize::from(i)] = Some(m);
                    }
                }
            }
            while let Some(t) = ep.poll_transmit() {
                check(&t);
            }
            if let Some(due) = ep.poll_timeout() {
                assert!(due <= now + Duration::from_secs(3600), "a timer an hour away");
            }
            assert!(ep.observers() <= max_observers);
            assert!(ep.pending() <= max_pending);
        }
    });
    drop(ep);
    assert_eq!(pool.outstanding(), 0, "pool block leaked");
});
