//! Arbitrary datagrams through `classify` and, for requests, `handle_request`
//! with a small router and pool. Every answer must parse back, carry the
//! request's token, and go back as a piggybacked ACK (CON) or a NON; no pool
//! block may leak.
#![no_main]

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use mintgate_buf::{PartitionConfig, Pool};
use mintgate_coap::server::{
    classify, handle_request, Answer, Inbound, Request, Resource, Router, DEFAULT_MAX_PAYLOAD,
};
use mintgate_coap::wire::{Code, ContentFormat, MessageType, Packet};

const NON_MID: u16 = 0x7777;

fn router() -> Router {
    let mut r = Router::new();
    r.add(
        Resource::new("request")
            .get(|_, rb| {
                rb.content_format(ContentFormat::TEXT_PLAIN)
                    .static_payload(b"hello world");
            })
            .attr("rt", "mintgate.hello")
            .attr("ct", "0"),
    )
    .unwrap();
    r.add(
        Resource::new("echo")
            .put(|req, rb| {
                rb.set_code(Code::CHANGED);
                if let Some(cf) = req.content_format() {
                    rb.content_format(cf);
                }
                rb.write(req.payload());
            })
            .attr("rt", "mintgate.echo"),
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

thread_local! {
    static STATE: (Router, Pool) = (router(), pool());
}

fuzz_target!(|data: &[u8]| {
    let Inbound::Request(p) = classify(data) else {
        return;
    };
    STATE.with(|(router, pool)| {
        let peer: SocketAddr = "[::1]:5683".parse().unwrap();
        let req = Request {
            peer,
            packet: &p,
            identity: None,
        };
        let con = p.msg_type() == MessageType::Con;
        match handle_request(router, pool, &req, NON_MID, DEFAULT_MAX_PAYLOAD) {
            Answer::Send(out) => {
                let bytes = out.to_vec();
                assert_eq!(bytes.len(), out.len());
                let a = match Packet::new_checked(&bytes[..]) {
                    Ok(a) => a,
                    Err(e) => panic!("answer does not parse: {e:?} {bytes:02x?}"),
                };
                if con {
                    assert_eq!(a.msg_type(), MessageType::Ack);
                    assert_eq!(a.message_id(), p.message_id());
                } else {
                    assert_eq!(a.msg_type(), MessageType::Non);
                    assert_eq!(a.message_id(), NON_MID);
                }
                assert_eq!(a.token(), p.token());
                assert!(a.code().is_response(), "answer code {:?}", a.code());
                assert!(a.payload().len() <= DEFAULT_MAX_PAYLOAD);
                let _ = a.options().count();
            }
            Answer::Silent => assert!(!con, "a CON was answered by silence"),
            Answer::Exhausted => panic!("pool exhausted with one request in flight"),
        }
        assert_eq!(pool.outstanding(), 0, "pool block leaked");
    });
});
