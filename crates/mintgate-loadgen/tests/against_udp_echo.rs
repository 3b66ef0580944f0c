//! Short, bounded loads against tiny in-test CoAP responders on 127.0.0.1.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mintgate_coap::wire::{Code, MessageType, MessageWriter, Packet};
use mintgate_loadgen::{run, LoadReport, LoadSpec, Mode};

/// A responder thread answering GETs with 2.05 "hello world" (piggybacked
/// for CON), except every `drop_every`-th request (0: none). Stops when the
/// returned flag is set.
struct Responder {
    addr: SocketAddr,
    /// Every source a request came from.
    peers: Arc<Mutex<HashSet<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Responder {
    fn start(drop_every: u64) -> Responder {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let peers = Arc::new(Mutex::new(HashSet::new()));
        let seen_peers = peers.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            let mut out = [0u8; 64];
            let mut seen = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(req) = Packet::new_checked(&buf[..n]) else {
                    continue;
                };
                if req.code() != Code::GET {
                    continue;
                }
                seen_peers.lock().unwrap().insert(peer);
                seen += 1;
                if drop_every > 0 && seen.is_multiple_of(drop_every) {
                    continue;
                }
                let ty = match req.msg_type() {
                    MessageType::Con => MessageType::Ack,
                    _ => MessageType::Non,
                };
                let mid = if ty == MessageType::Ack {
                    req.message_id()
                } else {
                    req.message_id().wrapping_add(0x8000)
                };
                let mut w =
                    MessageWriter::new(&mut out, ty, Code::CONTENT, mid, req.token()).unwrap();
                w.payload(b"hello world").unwrap();
                let len = w.finish();
                let _ = sock.send_to(&out[..len], peer);
            }
        });
        Responder {
            addr,
            peers,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn spec(addr: SocketAddr, mode: Mode, confirmable: bool) -> LoadSpec {
    let mut s = LoadSpec::new(addr, "/request", mode);
    s.confirmable = confirmable;
    s.duration = Duration::from_millis(1000);
    s.warmup = Duration::from_millis(200);
    s.timeout = Duration::from_millis(300);
    s
}

fn check_consistent(r: &LoadReport) {
    assert!(r.sent > 0, "{r:?}");
    assert!(r.received <= r.sent, "{r:?}");
    assert_eq!(r.received + r.lost, r.sent, "every request completes once");
    assert!(r.errors <= r.received);
    assert!(r.latency.p50 <= r.latency.p90);
    assert!(r.latency.p90 <= r.latency.p99);
    assert!(r.latency.p99 <= r.latency.p999);
    assert!(r.latency.p999 <= r.latency.max);
    let in_bins = r.per_second.iter().sum::<u64>() as f64;
    assert!((in_bins - r.requests_per_sec * r.measured.as_secs_f64()).abs() < 1.0);
}

#[test]
fn closed_loop_con_against_a_full_responder() {
    let srv = Responder::start(0);
    let mut s = spec(
        srv.addr,
        Mode::Closed {
            clients: 4,
            window: 2,
        },
        true,
    );
    s.threads = 2;
    let mut calls = 0;
    let r = run(&s, |_| calls += 1).unwrap();
    check_consistent(&r);
    assert!(calls >= 2, "progress is reported");
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.errors, 0);
    assert!(r.requests_per_sec > 100.0, "{r:?}");
    assert!(r.latency.p50 > Duration::ZERO);
}

#[test]
fn open_loop_non_keeps_its_rate() {
    let srv = Responder::start(0);
    let s = spec(
        srv.addr,
        Mode::Open {
            clients: 20,
            rate_per_client: 50.0,
        },
        false,
    );
    let r = run(&s, |_| {}).unwrap();
    check_consistent(&r);
    // 20 x 50/s for 1 s: 1000 sends, give or take the phase boundaries.
    assert!((950..=1050).contains(&r.sent), "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
    assert!((900.0..=1100.0).contains(&r.requests_per_sec), "{r:?}");
}

#[test]
fn dropping_every_second_request_loses_half() {
    let srv = Responder::start(2);
    let s = spec(
        srv.addr,
        Mode::Open {
            clients: 10,
            rate_per_client: 100.0,
        },
        false,
    );
    let r = run(&s, |_| {}).unwrap();
    check_consistent(&r);
    let loss = r.loss_ratio();
    assert!((0.45..=0.55).contains(&loss), "loss {loss}: {r:?}");
}

#[test]
fn nothing_listening_loses_everything_and_ends() {
    // Bind and drop: the port is (almost certainly) closed now.
    let addr = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut s = spec(
        addr,
        Mode::Closed {
            clients: 2,
            window: 1,
        },
        false,
    );
    s.duration = Duration::from_millis(500);
    s.warmup = Duration::ZERO;
    let t0 = std::time::Instant::now();
    let r = run(&s, |_| {}).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "bounded");
    assert_eq!(r.received, 0);
    assert_eq!(r.lost, r.sent);
    assert!(r.sent > 0);
}

#[test]
fn invalid_specs_are_rejected() {
    let addr: SocketAddr = "127.0.0.1:5683".parse().unwrap();
    let zero = spec(
        addr,
        Mode::Closed {
            clients: 0,
            window: 1,
        },
        false,
    );
    assert!(run(&zero, |_| {}).is_err());
    let rate = spec(
        addr,
        Mode::Open {
            clients: 1,
            rate_per_client: f64::NAN,
        },
        false,
    );
    assert!(run(&rate, |_| {}).is_err());
    let huge = spec(
        addr,
        Mode::Closed {
            clients: 10_000_000,
            window: 1,
        },
        false,
    );
    let e = run(&huge, |_| {}).unwrap_err();
    assert!(e.to_string().contains("file descriptors"), "{e}");
}

#[test]
fn gso_trains_arrive_as_separate_datagrams_and_are_all_answered() {
    let srv = Responder::start(0);
    let mut s = spec(
        srv.addr,
        Mode::Closed {
            clients: 2,
            window: 16,
        },
        false,
    );
    s.gso = true;
    let r = run(&s, |_| {}).unwrap();
    check_consistent(&r);
    // the responder parses every datagram as one CoAP request: had a train
    // reached it unsplit, it would not have been answered
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.errors, 0);
    assert!(r.received > 100, "{r:?}");
}

#[test]
fn shared_socket_clients_each_send_from_their_own_loopback_address() {
    let srv = Responder::start(0);
    let mut s = spec(
        srv.addr,
        Mode::Closed {
            clients: 50,
            window: 1,
        },
        true,
    );
    s.shared_socket = true;
    s.threads = 2;
    let r = run(&s, |_| {}).unwrap();
    check_consistent(&r);
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.errors, 0);
    assert_eq!(r.unmatched, 0, "{r:?}");
    assert!(r.received > 1000, "{r:?}");
    let peers = srv.peers.lock().unwrap().clone();
    let ips: HashSet<_> = peers.iter().map(|p| p.ip()).collect();
    assert_eq!(peers.len(), 50, "one endpoint per client: {peers:?}");
    assert_eq!(ips.len(), 50, "each client its own address: {ips:?}");
    assert!(ips
        .iter()
        .all(|ip| ip.is_loopback() && *ip != srv.addr.ip()));
}

#[test]
fn shared_socket_open_loop_counts_losses_per_client() {
    // every 7th request unanswered: lost, the rest matched to their clients
    let srv = Responder::start(7);
    let mut s = spec(
        srv.addr,
        Mode::Open {
            clients: 40,
            rate_per_client: 50.0,
        },
        false,
    );
    s.shared_socket = true;
    let r = run(&s, |_| {}).unwrap();
    check_consistent(&r);
    assert!(r.lost > 0 && r.received > 0, "{r:?}");
    let ratio = r.loss_ratio();
    assert!(
        (0.10..0.19).contains(&ratio),
        "1 in 7 dropped, got {ratio}: {r:?}"
    );
    assert_eq!(srv.peers.lock().unwrap().len(), 40);
}

#[test]
fn shared_socket_needs_an_ipv4_loopback_target_and_no_gso() {
    let mode = Mode::Closed {
        clients: 2,
        window: 1,
    };
    let mut v6 = spec("[::1]:5683".parse().unwrap(), mode, false);
    v6.shared_socket = true;
    let e = run(&v6, |_| {}).unwrap_err();
    assert!(e.to_string().contains("IPv4 loopback"), "{e}");
    let mut gso = spec("127.0.0.1:5683".parse().unwrap(), mode, false);
    gso.shared_socket = true;
    gso.gso = true;
    let e = run(&gso, |_| {}).unwrap_err();
    assert!(e.to_string().contains("GSO"), "{e}");
}
