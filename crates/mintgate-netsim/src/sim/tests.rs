use std::time::Duration;

use mintgate_coap::rto::Algorithm;

use super::chain::{self, ChainConfig};
use super::coap::{CoapClient, CoapServer, Workload};
use super::*;

fn cfg(loss: f64, algorithm: Algorithm, requests: usize, seed: u64) -> ChainConfig {
    ChainConfig {
        loss,
        algorithm,
        requests,
        seed,
        ..ChainConfig::default()
    }
}

#[test]
fn lossless_chain_completes_every_request_without_retransmissions() {
    for alg in Algorithm::ALL {
        let run = chain::run(&cfg(0.0, alg, 200, 3));
        assert!(run.finished, "{alg}");
        assert_eq!(run.outcomes[0].len(), 200, "{alg}");
        assert_eq!(run.retransmissions[0], 0, "{alg}");
        assert_eq!(run.server.requests, 200);
        assert_eq!(run.net.lost, 0);
        // the host path (70 ms +- 60 ms each way), the serial line (about
        // 6 ms per message), six radio crossings of 4 ms +- 1 ms plus 2.2-2.4
        // ms of airtime, 2 ms processing: about 194 ms on average
        let rtt = run.mean_rtt();
        assert!(
            rtt > Duration::from_millis(180) && rtt < Duration::from_millis(210),
            "{alg}: {rtt:?}"
        );
        // every request index exactly once
        let mut idx: Vec<usize> = run.outcomes[0].iter().map(|o| o.index).collect();
        idx.sort_unstable();
        assert_eq!(idx, (0..200).collect::<Vec<_>>());
    }
}

#[test]
fn same_seed_same_run_and_another_seed_differs() {
    let a = chain::run(&cfg(0.10, Algorithm::Cocoa, 300, 42));
    let b = chain::run(&cfg(0.10, Algorithm::Cocoa, 300, 42));
    let c = chain::run(&cfg(0.10, Algorithm::Cocoa, 300, 43));
    assert_eq!(a.outcomes, b.outcomes);
    assert_eq!(a.net, b.net);
    assert_ne!(a.outcomes, c.outcomes);
}

#[test]
fn losses_follow_the_configured_exchange_loss() {
    // 15 %: an exchange (request and response over 3 hops each) fails with
    // probability 0.15
    let run = chain::run(&cfg(0.15, Algorithm::Basic, 1000, 5));
    let s = run.net;
    assert!(run.finished);
    // every request was retried until it succeeded
    assert_eq!(run.outcomes[0].len(), 1000);
    let exchanges_failed: u64 = run.retransmissions[0];
    // q = 0.15; retransmissions per request = q / (1 - q) = 0.176 on
    // average (the loss per direction, 1 - (1 - 0.15)^(1/2) = 7.8 %, would
    // make it 0.38)
    let per_req = exchanges_failed as f64 / 1000.0;
    assert!((0.14..0.22).contains(&per_req), "{per_req}");
    assert!(s.lost > 0 && s.queue_drops == 0, "{s:?}");
}

#[test]
fn basic_retransmits_after_two_to_three_seconds() {
    let run = chain::run(&cfg(0.10, Algorithm::Basic, 400, 9));
    for o in &run.outcomes[0] {
        match o.retransmissions {
            // the base RTT is at most about 2 x 130 ms + 60 ms
            0 => assert!(o.rtt < Duration::from_millis(350), "{o:?}"),
            1 => assert!(
                o.rtt >= Duration::from_secs(2) && o.rtt < Duration::from_millis(3350),
                "{o:?}"
            ),
            _ => assert!(o.rtt >= Duration::from_secs(6), "{o:?}"),
        }
    }
    assert!(run.outcomes[0].iter().any(|o| o.retransmissions == 1));
}

#[test]
fn adaptive_reports_alpha_and_cocoa_an_rto() {
    let a = chain::run(&cfg(0.10, Algorithm::Adaptive, 300, 2));
    let last = a.outcomes[0].last().unwrap();
    eprintln!("{last:?} mean {:?}", a.mean_rtt());
    let alpha = last
        .alpha
        .expect("adaptive has an alpha after its first window");
    assert!((1.0 / 64.0..=0.5).contains(&alpha), "{alpha}");
    assert!(last.rto.unwrap() < Duration::from_millis(500));
    let c = chain::run(&cfg(0.10, Algorithm::Cocoa, 300, 2));
    let last = c.outcomes[0].last().unwrap();
    assert!(last.alpha.is_none());
    assert!(last.rto.unwrap() < Duration::from_millis(500));
}

#[test]
fn spurious_retransmissions_are_counted_when_the_rto_is_too_short() {
    // a path whose RTT (about 400 ms) exceeds Basic's first timeout only
    // rarely, but with one very slow server every retransmission is
    // spurious: the first copy always gets through
    let mut sim = Sim::new(7);
    let server = sim.add_node(
        SocketAddr::from(([10, 0, 0, 2], 5683)),
        Some(Box::new(CoapServer::sensor(Duration::from_millis(2500)))),
    );
    let dest = sim.addr(server);
    let client = sim.add_node(
        SocketAddr::from(([10, 0, 0, 1], 40000)),
        Some(Box::new(CoapClient::new(
            Workload::sequential(dest, "sensor", 20),
            Algorithm::Basic,
            7,
        ))),
    );
    sim.connect(
        client,
        server,
        LinkConfig::delay(Duration::from_millis(200)),
    );
    assert!(sim.run(Duration::from_secs(3600)));
    let app = sim.app_as::<CoapClient>(client).unwrap();
    assert_eq!(app.outcomes().len(), 20);
    // RTT 2.9 s > the first timeout (2-3 s) most of the time
    assert!(app.retransmissions() > 0);
    assert_eq!(app.spurious(), app.retransmissions());
    let srv = sim.app_as::<CoapServer>(server).unwrap().stats();
    assert_eq!(srv.requests, 20);
    // a duplicate arriving while the first copy is processed is dropped,
    // one arriving later is answered from the cache
    assert_eq!(srv.replays + srv.duplicates, app.retransmissions());
    assert!(srv.duplicates > 0);
}

#[test]
fn a_full_queue_drops_and_counts() {
    let mut sim = Sim::new(1);
    let a = sim.add_node(SocketAddr::from(([10, 0, 0, 1], 1)), None);
    let b = sim.add_node(SocketAddr::from(([10, 0, 0, 2], 1)), None);
    sim.connect(
        a,
        b,
        LinkConfig {
            rate_bps: 8_000, // 1 ms per byte
            queue_limit: 2,
            ..LinkConfig::delay(Duration::from_millis(1))
        },
    );
    sim.route();
    let pkt = |n| Packet {
        src: sim.addr(a),
        dst: sim.addr(b),
        bytes: vec![0; 10],
        tag: n,
    };
    let pkts: Vec<Packet> = (0..5).map(pkt).collect();
    for p in pkts {
        sim.forward(a, p);
    }
    // one on the air, two waiting, two dropped
    let st = sim.link_stats(a, b).unwrap();
    assert_eq!(st.queue_drops, 2);
    assert_eq!(st.offered, 5);
    assert_eq!(sim.stats().queue_drops, 2);
    // b has no app: the three that cross are unroutable at the end
    let mut sim2 = sim;
    sim2.add_node(SocketAddr::from(([10, 0, 0, 3], 1)), Some(Box::new(Never)));
    sim2.run(Duration::from_secs(1));
    assert_eq!(sim2.stats().unroutable, 3);
}

/// An app that never finishes, to keep a run going until its limit.
struct Never;

impl App for Never {
    fn on_packet(&mut self, _: Instant, _: &Packet, _: &mut Vec<Send>) {}
    fn on_timeout(&mut self, _: Instant, _: &mut Vec<Send>) {}
    fn next_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn done(&self) -> bool {
        false
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn the_exchange_loss_splits_evenly_over_two_directions() {
    for p in [0.0, 0.05, 0.10, 0.15, 1.0] {
        let d = chain::direction_loss(p);
        assert!(
            ((1.0 - d) * (1.0 - d) - (1.0 - p)).abs() < 1e-12,
            "{p}: {d}"
        );
    }
    // and the lab's relay gets half the lossless RTT each way
    let base = chain::base_rtt(&ChainConfig::default());
    assert!(
        base > Duration::from_millis(180) && base < Duration::from_millis(210),
        "{base:?}"
    );
}
