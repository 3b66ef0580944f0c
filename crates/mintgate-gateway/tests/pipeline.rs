//! The Interaction pipeline over real loopback UDP sockets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mintgate_coap::server::{Resource, Router};
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

fn config(bind: &str) -> Config {
    let mut c = Config::default();
    c.coap.bind = vec![bind.parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(2);
    // keep the test pools small
    c.buffers.partitions = vec![
        mintgate_gateway::config::Partition {
            block_size: 192,
            blocks: 2048,
        },
        mintgate_gateway::config::Partition {
            block_size: 1280,
            blocks: 512,
        },
    ];
    c
}

fn start(c: Config, r: Router) -> (Gateway, SocketAddr) {
    let gw = Gateway::start(c, r).expect("gateway starts");
    let addr = gw.local_addrs()[0];
    (gw, addr)
}

fn client(server: SocketAddr) -> UdpSocket {
    let bind = if server.is_ipv6() {
        "[::1]:0"
    } else {
        "127.0.0.1:0"
    };
    let s = UdpSocket::bind(bind).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    s.connect(server).unwrap();
    s
}

fn request(
    ty: MessageType,
    code: Code,
    mid: u16,
    token: &[u8],
    path: &str,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = vec![0u8; 1400];
    let mut w = MessageWriter::new(&mut b, ty, code, mid, token).unwrap();
    w.path_options(OptionNumber::URI_PATH, path).unwrap();
    w.payload(payload).unwrap();
    let n = w.finish();
    b.truncate(n);
    b
}

fn recv(s: &UdpSocket) -> Option<Vec<u8>> {
    let mut b = [0u8; 2048];
    s.recv(&mut b).ok().map(|n| b[..n].to_vec())
}

fn recv_within(s: &UdpSocket, t: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(t)).unwrap();
    let r = recv(s);
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    r
}

fn slow_router(delay: Duration) -> Router {
    let mut r = resources::default_router();
    r.add(Resource::new("slow").get(move |_, rb| {
        std::thread::sleep(delay);
        rb.write(b"slow answer");
    }))
    .unwrap();
    r
}

#[test]
fn con_get_is_piggybacked_and_a_duplicate_gets_the_same_bytes() {
    let (gw, addr) = start(config("127.0.0.1:0"), resources::default_router());
    let s = client(addr);
    let req = request(MessageType::Con, Code::GET, 0x4242, b"tk", "request", b"");
    s.send(&req).unwrap();
    let first = recv(&s).expect("response");
    let p = Packet::new_checked(&first[..]).unwrap();
    assert_eq!(
        (p.msg_type(), p.code(), p.message_id(), p.token()),
        (MessageType::Ack, Code::CONTENT, 0x4242, &b"tk"[..])
    );
    assert_eq!(p.payload(), b"hello world");
    s.send(&req).unwrap();
    let again = recv(&s).expect("replayed response");
    assert_eq!(first, again, "byte for byte");
    let c = gw.counters();
    // The handler counts its batch after the send: the answer can arrive
    // before the count does.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while c.htp_handled.load(Relaxed) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        c.htp_handled.load(Relaxed),
        1,
        "the duplicate is not handled again"
    );
    assert_eq!(c.nr_duplicates.load(Relaxed), 1);
}

#[test]
fn non_get_gets_a_non_response_and_a_duplicate_is_dropped() {
    let (gw, addr) = start(config("127.0.0.1:0"), resources::default_router());
    let s = client(addr);
    let req = request(MessageType::Non, Code::GET, 7, b"n", "request", b"");
    s.send(&req).unwrap();
    let r = recv(&s).expect("response");
    let p = Packet::new_checked(&r[..]).unwrap();
    assert_eq!(
        (p.msg_type(), p.token(), p.payload()),
        (MessageType::Non, &b"n"[..], &b"hello world"[..])
    );
    s.send(&req).unwrap();
    assert!(recv_within(&s, Duration::from_millis(300)).is_none());
    assert_eq!(gw.counters().nr_duplicates.load(Relaxed), 1);
}

#[test]
fn malformed_con_gets_reset_malformed_non_and_bad_version_get_silence_ping_gets_reset() {
    let (gw, addr) = start(config("127.0.0.1:0"), resources::default_router());
    let s = client(addr);
    s.send(&[0x49, 0x01, 0x12, 0x34, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        .unwrap(); // TKL 9
    let r = recv(&s).expect("reset");
    let p = Packet::new_checked(&r[..]).unwrap();
    assert_eq!((p.msg_type(), p.message_id()), (MessageType::Rst, 0x1234));
    s.send(&[0x59, 0x01, 0, 1]).unwrap(); // NON, TKL 9
    s.send(&[0x80, 0x01, 0, 2]).unwrap(); // version 2
    s.send(&[0x40]).unwrap(); // too short
    assert!(recv_within(&s, Duration::from_millis(300)).is_none());
    s.send(&[0x40, 0x00, 0xAA, 0xBB]).unwrap(); // ping
    let r = recv(&s).expect("pong");
    let p = Packet::new_checked(&r[..]).unwrap();
    assert_eq!((p.msg_type(), p.message_id()), (MessageType::Rst, 0xAABB));
    assert_eq!(gw.counters().nr_malformed.load(Relaxed), 4);
    // the server still serves
    s.send(&request(
        MessageType::Con,
        Code::GET,
        3,
        b"",
        "request",
        b"",
    ))
    .unwrap();
    assert!(recv(&s).is_some());
}

#[test]
fn slow_handler_gets_an_empty_ack_then_a_separate_con_response() {
    let mut c = config("127.0.0.1:0");
    c.coap.separate_response_after_ms = 50;
    let (gw, addr) = start(c, slow_router(Duration::from_millis(400)));
    let s = client(addr);
    s.send(&request(
        MessageType::Con,
        Code::GET,
        0x0101,
        b"sep",
        "slow",
        b"",
    ))
    .unwrap();
    let ack = recv(&s).expect("empty ack");
    let p = Packet::new_checked(&ack[..]).unwrap();
    assert_eq!(
        (p.msg_type(), p.code(), p.message_id()),
        (MessageType::Ack, Code::EMPTY, 0x0101)
    );
    let resp = recv(&s).expect("separate response");
    let p = Packet::new_checked(&resp[..]).unwrap();
    assert_eq!(
        (p.msg_type(), p.code(), p.token()),
        (MessageType::Con, Code::CONTENT, &b"sep"[..])
    );
    assert_eq!(p.payload(), b"slow answer");
    assert_ne!(p.message_id(), 0x0101);
    // acknowledge it: no retransmission follows
    s.send(&mintgate_coap::wire::empty_message(
        MessageType::Ack,
        p.message_id(),
    ))
    .unwrap();
    assert!(
        recv_within(&s, Duration::from_millis(3200)).is_none(),
        "acknowledged: not retransmitted"
    );
    drop(gw);
}

#[test]
fn unacknowledged_separate_response_is_retransmitted() {
    let mut c = config("127.0.0.1:0");
    c.coap.separate_response_after_ms = 20;
    let (_gw, addr) = start(c, slow_router(Duration::from_millis(100)));
    let s = client(addr);
    s.send(&request(MessageType::Con, Code::GET, 9, b"r", "slow", b""))
        .unwrap();
    let _ack = recv(&s).expect("empty ack");
    let first = recv(&s).expect("separate response");
    let again = recv_within(&s, Duration::from_secs(4)).expect("retransmission after ACK_TIMEOUT");
    assert_eq!(first, again);
}

#[test]
fn full_queue_answers_con_with_503_max_age_and_drops_non_visibly() {
    let mut c = config("127.0.0.1:0");
    c.pipeline.pool = PoolMode::Fixed(1);
    c.pipeline.queue_bytes = 2 * 1280;
    // one client: the whole queue, not its share of it (tests/overload.rs)
    c.pipeline.peer_queue_share = 1.0;
    c.pipeline.handler_batch = 1;
    c.coap.separate_response_after_ms = 60_000;
    let (gw, addr) = start(c, slow_router(Duration::from_millis(150)));
    let s = client(addr);
    for mid in 0..12u16 {
        s.send(&request(
            MessageType::Con,
            Code::GET,
            mid,
            &[mid as u8],
            "slow",
            b"",
        ))
        .unwrap();
    }
    let mut unavailable = 0;
    let mut content = 0;
    let end = Instant::now() + Duration::from_secs(6);
    while unavailable + content < 12 && Instant::now() < end {
        let Some(r) = recv_within(&s, Duration::from_secs(3)) else {
            break;
        };
        let p = Packet::new_checked(&r[..]).unwrap();
        match p.code() {
            Code::SERVICE_UNAVAILABLE => {
                assert_eq!(p.option(OptionNumber::MAX_AGE).unwrap().uint(), Some(2));
                unavailable += 1;
            }
            Code::CONTENT => content += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(unavailable > 0, "some were shed with 5.03");
    assert!(content >= 2, "queued ones were served");
    assert_eq!(unavailable + content, 12);
    assert_eq!(gw.counters().nr_rejected.load(Relaxed), unavailable);
    for mid in 100..112u16 {
        s.send(&request(
            MessageType::Non,
            Code::GET,
            mid,
            &[mid as u8],
            "slow",
            b"",
        ))
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        gw.counters().nr_dropped.load(Relaxed) > 0,
        "NON shed and counted"
    );
}

#[test]
fn ipv6_and_dual_stack() {
    let (_gw, addr) = start(config("[::]:0"), resources::default_router());
    for host in ["[::1]", "127.0.0.1"] {
        let a: SocketAddr = format!("{host}:{}", addr.port()).parse().unwrap();
        let s = client(a);
        s.send(&request(
            MessageType::Con,
            Code::GET,
            1,
            b"6",
            "request",
            b"",
        ))
        .unwrap();
        let r = recv(&s).unwrap_or_else(|| panic!("answer over {host}"));
        assert_eq!(
            Packet::new_checked(&r[..]).unwrap().payload(),
            b"hello world"
        );
    }
}

#[test]
fn handler_pool_resizes_while_serving_and_observer_samples() {
    let (gw, addr) = start(config("127.0.0.1:0"), resources::default_router());
    let s = client(addr);
    let mut answered = 0;
    for (i, n) in [4usize, 1, 3, 2].iter().enumerate() {
        gw.resize_htp(*n).unwrap();
        assert_eq!(gw.htp_threads(), *n);
        for k in 0..50u16 {
            let mid = (i as u16) * 100 + k;
            s.send(&request(
                MessageType::Con,
                Code::GET,
                mid,
                b"",
                "request",
                b"",
            ))
            .unwrap();
            if recv(&s).is_some() {
                answered += 1;
            }
        }
    }
    assert_eq!(answered, 200);
    std::thread::sleep(Duration::from_millis(1100));
    let samples = gw.samples();
    assert!(!samples.is_empty());
    let total_r: u64 = samples.iter().map(|s| s.r).sum();
    let total_h: u64 = samples.iter().map(|s| s.h).sum();
    assert_eq!(total_r, total_h);
    assert!(total_h <= 200 && total_h > 0);
}

#[test]
fn pool_exhaustion_sheds_and_the_pool_recovers() {
    let mut c = config("127.0.0.1:0");
    // receive blocks and response blocks from one small partition
    c.buffers.partitions = vec![mintgate_gateway::config::Partition {
        block_size: 1280,
        blocks: 48,
    }];
    c.coap.dedup_capacity = 1024;
    let (gw, addr) = start(c, resources::default_router());
    let s = client(addr);
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    for mid in 0..2000u16 {
        let _ = s.send(&request(
            MessageType::Con,
            Code::GET,
            mid,
            b"",
            "request",
            b"",
        ));
        while s.recv(&mut buf).is_ok() {}
    }
    std::thread::sleep(Duration::from_millis(300));
    while s.recv(&mut buf).is_ok() {}
    s.set_nonblocking(false).unwrap();
    let cnt = gw.counters();
    assert!(
        cnt.dedup_evicted.load(Relaxed) > 0,
        "cached responses were given back to keep receiving"
    );
    // still answering after the flood
    s.send(&request(
        MessageType::Con,
        Code::GET,
        60000,
        b"z",
        "request",
        b"",
    ))
    .unwrap();
    let r = recv(&s).expect("answered after the flood");
    assert_eq!(Packet::new_checked(&r[..]).unwrap().token(), b"z");
}

fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

#[test]
fn metrics_endpoint_serves_prometheus_text_and_observer_json_that_match_the_counters() {
    let (gw, addr) = start(config("127.0.0.1:0"), resources::default_router());
    let m = mintgate_gateway::metrics::MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        gw.handle(),
    )
    .unwrap();
    let s = client(addr);
    for mid in 0..20u16 {
        s.send(&request(
            MessageType::Con,
            Code::GET,
            mid,
            b"",
            "request",
            b"",
        ))
        .unwrap();
        assert!(recv(&s).is_some());
    }
    s.send(&[0x49, 0x01, 0, 1]).unwrap(); // malformed CON
    assert!(recv(&s).is_some());
    std::thread::sleep(Duration::from_millis(1200)); // one observer sample
    let (head, body) = http_get(m.local_addr(), "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let mut values = std::collections::HashMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, v) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        let v: f64 = v.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        values.insert(name.to_string(), v);
    }
    assert_eq!(values["mintgate_htp_handled_total"], 20.0);
    assert_eq!(values["mintgate_nr_requests_total"], 20.0);
    assert_eq!(values["mintgate_malformed_total"], 1.0);
    assert_eq!(values["mintgate_htp_threads"], 2.0);
    assert_eq!(values["mintgate_threads{group=\"interaction\"}"], 2.0);
    assert_eq!(
        values["mintgate_threads{group=\"performance_profile\"}"],
        1.0
    );
    assert_eq!(values["mintgate_htp_queue_length"], 0.0);
    assert!(values.contains_key("mintgate_dropped_total{reason=\"queue_full_con_503\"}"));
    assert!(values["mintgate_bytes_allocated_total{layer=\"receive\"}"] > 0.0);
    // The observer samples once a second; on a busy machine the sample that
    // covers the last requests may come a little later than 1.2 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (v, h) = loop {
        let (head, body) = http_get(m.local_addr(), "/api/observer");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let samples = v["samples"].as_array().unwrap();
        let h: u64 = samples.iter().map(|s| s["h"].as_u64().unwrap()).sum();
        if h >= 20 || std::time::Instant::now() > deadline {
            break (v, h);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(h, 20, "samples add up to what was handled");
    assert_eq!(v["pool"], "fixed:2");
    let (head, _) = http_get(m.local_addr(), "/nope");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

/// `coap.max_datagram` is the limit, not the receive block's size: a
/// datagram over it is dropped and counted even when the block (the
/// smallest that holds the limit) has room for it.
#[test]
fn datagrams_over_max_datagram_are_dropped_and_counted() {
    let mut c = config("127.0.0.1:0");
    c.coap.max_datagram = 300;
    // whole answers to this unverified client: the subject is the limit
    c.coap.amplification_factor = 0;
    let (gw, addr) = start(c, resources::default_router());
    let s = client(addr);
    let small = request(MessageType::Con, Code::PUT, 1, b"a", "echo", &[b'x'; 200]);
    s.send(&small).unwrap();
    let p = recv(&s).expect("a datagram under the limit is answered");
    assert_eq!(Packet::new_checked(&p[..]).unwrap().code(), Code::CHANGED);
    let big = request(MessageType::Con, Code::PUT, 2, b"b", "echo", &[b'y'; 600]);
    assert!(big.len() > 300 && big.len() < 1280);
    s.send(&big).unwrap();
    assert!(recv_within(&s, Duration::from_millis(500)).is_none());
    assert_eq!(gw.counters().nr_ignored.load(Relaxed), 1);
    // the store still holds the small one
    s.send(&request(MessageType::Con, Code::GET, 3, b"c", "echo", b""))
        .unwrap();
    let p = recv(&s).unwrap();
    assert_eq!(Packet::new_checked(&p[..]).unwrap().payload(), &[b'x'; 200]);
}

#[test]
fn a_handler_that_panics_answers_5_00_and_its_thread_goes_on() {
    let mut r = Router::new();
    r.add(Resource::new("boom").get(|_, _| panic!("a handler bug")))
        .unwrap();
    r.add(Resource::new("ok").get(|_, rb| {
        rb.static_payload(b"fine");
    }))
    .unwrap();
    // one handler thread: if a panic took it, nothing would answer after
    let mut c = config("127.0.0.1:0");
    c.pipeline.pool = PoolMode::Fixed(1);
    let (gw, addr) = start(c, r);
    let s = client(addr);
    for i in 0..3u16 {
        // NON: no empty ACK even if the panic (its backtrace) takes long
        s.send(&request(
            MessageType::Non,
            Code::GET,
            10 + i,
            b"p",
            "boom",
            b"",
        ))
        .unwrap();
        let b = recv(&s).expect("an answer to the panicking handler");
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.code(), Code::INTERNAL_SERVER_ERROR);
        s.send(&request(
            MessageType::Con,
            Code::GET,
            20 + i,
            b"q",
            "ok",
            b"",
        ))
        .unwrap();
        let b = recv(&s).expect("the thread still serves");
        assert_eq!(Packet::new_checked(&b[..]).unwrap().payload(), b"fine");
    }
    assert_eq!(gw.htp_threads(), 1);
    let m = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(m.contains("mintgate_handler_panics_total 3"), "{m}");
}

#[test]
fn separate_responses_are_retransmitted_with_the_random_factor() {
    // ACK_TIMEOUT 200 ms: the first retransmission comes 200..300 ms after
    // the separate response, the next one twice that later
    let mut c = config("127.0.0.1:0");
    c.coap.separate_response_after_ms = 50;
    c.coap.ack_timeout_ms = 200;
    c.coap.max_retransmit = 2;
    let (gw, addr) = start(c, slow_router(Duration::from_millis(150)));
    let s = client(addr);
    s.send(&request(MessageType::Con, Code::GET, 77, b"t", "slow", b""))
        .unwrap();
    let ack = recv(&s).expect("empty ACK");
    assert_eq!(ack.len(), 4);
    let first = recv(&s).expect("separate response");
    let t0 = Instant::now();
    let again = recv(&s).expect("first retransmission");
    let t1 = t0.elapsed();
    assert_eq!(first, again);
    let again2 = recv(&s).expect("second retransmission");
    let t2 = t0.elapsed();
    assert_eq!(first, again2);
    // then given up: nothing more
    assert!(recv_within(&s, Duration::from_millis(1500)).is_none());
    assert!(t1 >= Duration::from_millis(190), "{t1:?}");
    // the timeout doubles: at least 2 x 200 ms (less a timer tick)
    assert!(t2 - t1 >= Duration::from_millis(370), "{t1:?} then {t2:?}");
    let m = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(m.contains("mintgate_coap_con_given_up_total 1"), "{m}");
}
