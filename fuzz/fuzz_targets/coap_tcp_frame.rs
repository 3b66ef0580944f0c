//! The RFC 8323 framing on arbitrary bytes: `frame_len` and
//! `TcpPacket::new_checked` in both framings, every accessor of an accepted
//! frame, its re-encoding (must give the same bytes), the signalling
//! parser, and the translation to RFC 7252; then the server's connection
//! state machine fed the bytes in two pieces.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use mintgate_buf::{PartitionConfig, Pool};
use mintgate_coap::server::tcp::{Connection, ConnectionConfig};
use mintgate_coap::server::{handle_request, Request, Resource, Router};
use mintgate_coap::wire::tcp::frame_len;
use mintgate_coap::wire::{Framing, MessageType, Signal, TcpPacket, TcpRepr};

fn setup() -> &'static (Router, Pool) {
    static S: OnceLock<(Router, Pool)> = OnceLock::new();
    S.get_or_init(|| {
        let mut r = Router::new();
        r.add(Resource::new("r").get(|_, rb| {
            rb.write(b"ok");
        }))
        .unwrap();
        let pool = Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 64,
        }]);
        (r, pool)
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(n)) = frame_len(data) {
        assert!(n >= 2);
    }
    for framing in [Framing::Stream, Framing::WebSocket] {
        let Ok(p) = TcpPacket::new_checked(data, framing) else {
            continue;
        };
        assert!(p.token().len() <= 8);
        let mut last = 0u16;
        for o in p.options() {
            assert!(o.number.0 >= last, "options out of order");
            last = o.number.0;
        }
        let repr = TcpRepr::parse(&p);
        let mut again = Vec::new();
        repr.emit_vec(framing, &mut again).expect("re-encode");
        assert_eq!(again, data, "not canonical");
        if p.is_signal() {
            if let Ok(s) = Signal::parse(&p) {
                let mut v = Vec::new();
                s.emit_vec(framing, p.token(), &mut v);
                let q = TcpPacket::new_checked(&v[..], framing).expect("our signal parses");
                assert_eq!(Signal::parse(&q), Ok(s));
            }
        }
        let mut udp = Vec::new();
        let _ = p.to_udp(MessageType::Con, 1, &mut udp);
        let _ = format!("{p:?}");
    }
    // the connection, fed a CSM and then the bytes in two pieces
    let (router, pool) = setup();
    let mut serve = |req: &Request<'_>, max: usize| handle_request(router, pool, req, 0, max);
    let cfg = ConnectionConfig {
        max_message_size: 1152,
        ..ConnectionConfig::default()
    };
    let now = Instant::now();
    let mut c = Connection::new(Framing::Stream, "127.0.0.1:1".parse().unwrap(), cfg.clone());
    let mut csm = Vec::new();
    // half the inputs offer BERT (RFC 8323 section 6), so a Block option
    // with SZX 7 is served in 1024-byte blocks and answered as one
    Signal::Csm {
        max_message_size: Some(600),
        block_wise: data.len() % 2 == 1,
    }
    .emit_vec(Framing::Stream, &[], &mut csm);
    c.receive(now, &csm, &mut serve);
    let cut = data.first().map_or(0, |b| *b as usize).min(data.len());
    c.receive(now, &data[..cut], &mut serve);
    c.receive(now, &data[cut..], &mut serve);
    c.handle_timeout(now + Duration::from_secs(10));
    assert!(!c.has_partial_frame(), "a half frame outlived its timeout");
    // every frame out parses
    let mut out = c.output();
    while !out.is_empty() {
        let n = frame_len(out).expect("our frame").expect("whole") as usize;
        let f = TcpPacket::new_checked(&out[..n], Framing::Stream).expect("our frame parses");
        assert!(f.is_signal() || n <= 600, "a response over the peer's size");
        out = &out[n..];
    }
    let mut w = Connection::new(Framing::WebSocket, "127.0.0.1:1".parse().unwrap(), cfg);
    let mut wcsm = Vec::new();
    Signal::Csm {
        max_message_size: None,
        block_wise: false,
    }
    .emit_vec(Framing::WebSocket, &[], &mut wcsm);
    w.receive_message(&wcsm, &mut serve);
    w.receive_message(data, &mut serve);
});
