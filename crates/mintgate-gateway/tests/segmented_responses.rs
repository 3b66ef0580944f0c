//! The Send Handler's segmentation offload seen from a real client: the
//! responses of one flush to one client leave as one `UDP_SEGMENT` train,
//! and a client receiving with UDP GRO gets such trains whole (the load
//! generator splits them); without GRO, or with the offload off, every
//! response arrives as its own datagram. Either way every request is
//! answered once, also when the clients share one socket (each on its own
//! loopback address).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::time::Duration;

use mintgate_gateway::{resources, Config, Gateway};
use mintgate_loadgen::{LoadReport, LoadSpec, Mode};

fn gateway(send_gso: bool) -> Gateway {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.send_gso = send_gso;
    let router = resources::router_for(&c);
    Gateway::start(c, router).expect("gateway starts")
}

/// 4 clients keeping 16 NON GETs each in flight for 1 s.
fn load(gw: &Gateway, gro: bool) -> LoadReport {
    load_with(gw, gro, false)
}

/// The same, the clients on one shared socket or each on its own.
fn load_with(gw: &Gateway, gro: bool, shared_socket: bool) -> LoadReport {
    let mut spec = LoadSpec::new(
        gw.local_addrs()[0],
        "/request",
        Mode::Closed {
            clients: 4,
            window: 16,
        },
    );
    spec.duration = Duration::from_secs(1);
    spec.warmup = Duration::from_millis(200);
    spec.timeout = Duration::from_millis(500);
    spec.gro = gro;
    spec.shared_socket = shared_socket;
    let r = mintgate_loadgen::run(&spec, |_| {}).expect("the load runs");
    eprintln!("gro {gro}, shared socket {shared_socket}: {r:?}");
    assert!(r.received > 1000, "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.errors, 0, "{r:?}");
    assert_eq!(r.unmatched, 0, "every response matched one request: {r:?}");
    r
}

#[test]
fn trains_of_responses_reach_a_gro_client_whole_and_are_all_matched() {
    let gw = gateway(true);
    let with = load(&gw, true);
    assert!(
        with.in_trains > 0,
        "no response arrived in a train: {with:?}"
    );
    let without = load(&gw, false);
    assert_eq!(without.in_trains, 0);
    // one socket for all clients: trains still come whole, and each is
    // matched to the client whose address it was sent to
    let shared = load_with(&gw, true, true);
    assert!(shared.in_trains > 0, "{shared:?}");
}

#[test]
fn without_the_offload_a_gro_client_gets_single_datagrams() {
    let gw = gateway(false);
    let r = load(&gw, true);
    assert_eq!(r.in_trains, 0, "{r:?}");
}
