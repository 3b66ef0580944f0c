//! Overload at about ten times capacity from one source (the load
//! generator's clients all send from 127.0.0.1): the gateway sheds and
//! counts, and other sources are still served, because one source may hold
//! only its share of the HTP queue (`pipeline.peer_queue_share`). With the
//! per-source limit off, the same flood leaves the others 5.03s.
//!
//! `mintgate lab overload` runs the full-size experiment (60 s, thousands
//! of clients, a separate process, RSS sampled).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use mintgate_gateway::config::{HandlerCost, PoolMode};
use mintgate_gateway::{resources, Config, Gateway};
use mintgate_loadgen::probe::{run_probes, ProbeResult, ProbeSpec};
use mintgate_loadgen::{LoadSpec, Mode};

/// A gateway of known, small capacity: one handler thread, 2 ms per
/// request (a blocking sensor read), so about 500 requests/s.
fn small_gateway(peer_share: f64) -> Gateway {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(1);
    c.pipeline.queue_bytes = 128 * 1280;
    c.pipeline.peer_queue_share = peer_share;
    c.resources.request_cost = HandlerCost::Block(Duration::from_millis(2));
    c.buffers.partitions = vec![
        mintgate_gateway::config::Partition {
            block_size: 192,
            blocks: 1024,
        },
        mintgate_gateway::config::Partition {
            block_size: 1280,
            blocks: 1024,
        },
    ];
    let router = resources::router_for(&c);
    Gateway::start(c, router).expect("gateway starts")
}

struct Outcome {
    /// The 1/s probe from 127.0.0.2.
    probe: Vec<ProbeResult>,
    /// The second peer, 127.0.0.3: a CON GET every 50 ms.
    peer: Vec<ProbeResult>,
    flood_sent: u64,
}

/// Floods `gw` with 5,000 NON GETs/s (250 clients x 20/s) from 127.0.0.1
/// for `secs` while the probe and the second peer send.
fn flood(gw: &Gateway, secs: u64) -> Outcome {
    let target = gw.local_addrs()[0];
    let mut load = LoadSpec::new(
        target,
        "/request",
        Mode::Open {
            clients: 250,
            rate_per_client: 20.0,
        },
    );
    load.duration = Duration::from_secs(secs);
    load.warmup = Duration::ZERO;
    load.timeout = Duration::from_millis(500);
    let probe = ProbeSpec::new(
        target,
        "127.0.0.2:0".parse().unwrap(),
        "/request",
        Duration::from_secs(secs),
    );
    let mut peer = ProbeSpec::new(
        target,
        "127.0.0.3:0".parse().unwrap(),
        "/request",
        Duration::from_secs(secs),
    );
    peer.interval = Duration::from_millis(50);
    let (p, q) = (
        std::thread::spawn(move || run_probes(&probe).expect("probe runs")),
        std::thread::spawn(move || run_probes(&peer).expect("second peer runs")),
    );
    let report = mintgate_loadgen::run(&load, |_| {}).expect("load runs");
    Outcome {
        probe: p.join().unwrap(),
        peer: q.join().unwrap(),
        flood_sent: report.sent,
    }
}

#[test]
fn a_flooding_source_is_shed_and_counted_and_does_not_starve_others() {
    let gw = small_gateway(0.5);
    let o = flood(&gw, 3);
    let c = gw.counters();
    let handled = c.htp_handled.load(Relaxed);
    let limited = c.nr_peer_limited.load(Relaxed);
    println!(
        "flood sent {}, handled {handled}, peer_limit sheds {limited}, probe {:?}",
        o.flood_sent, o.probe
    );
    assert!(
        o.flood_sent > 4 * handled,
        "the flood was several times capacity: sent {} vs handled {handled}",
        o.flood_sent
    );
    assert!(
        limited > o.flood_sent / 2,
        "most of the flood shed at the per-source limit and counted: {limited} of {}",
        o.flood_sent
    );
    // every probe answered 2.05 within its first two retransmissions
    assert_eq!(o.probe.len(), 3);
    for r in o.probe.iter().chain(&o.peer) {
        assert!(
            r.ok() && r.latency.is_some_and(|l| l < Duration::from_secs(14)),
            "{r:?}"
        );
    }
    // the second peer was served throughout: at least 55 of its 60 requests
    // answered without a single retransmission
    let first_try = o.peer.iter().filter(|r| r.transmissions == 1).count();
    assert!(
        first_try >= o.peer.len() - 5,
        "{first_try} of {}",
        o.peer.len()
    );
    assert_eq!(c.nr_rejected.load(Relaxed), 0, "no 5.03 for a full queue");
}

#[test]
fn without_the_per_source_limit_the_flood_takes_the_queue() {
    let gw = small_gateway(1.0);
    let o = flood(&gw, 2);
    let c = gw.counters();
    assert_eq!(c.nr_peer_limited.load(Relaxed), 0);
    assert!(c.nr_dropped.load(Relaxed) > 0, "NON shed at the full queue");
    let refused = o
        .peer
        .iter()
        .filter(|r| r.code.is_some_and(|c| c.class() == 5))
        .count();
    println!("second peer: {refused} of {} answered 5.03", o.peer.len());
    assert!(
        refused > 0,
        "with no per-source share the second peer meets a full queue"
    );
}
