//! Server and client against each other over loopback UDP.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::server::{DtlsServer, ServerSettings};
use crate::{parse_key, ClientSettings, DtlsClient, DtlsError, Psk};

/// A UDP loop around a [`DtlsServer`] that answers every datagram with
/// "echo:" and the datagram, tagged with the peer's identity.
struct Echo {
    addr: SocketAddr,
    server: Arc<DtlsServer>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(settings: ServerSettings) -> Echo {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let server = Arc::new(DtlsServer::new(settings).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (srv, st) = (server.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut dg = vec![0u8; 65536];
            let mut buf = vec![0u8; 65536];
            while !st.load(Relaxed) {
                let Ok((n, peer)) = sock.recv_from(&mut dg) else {
                    srv.sweep(Instant::now(), &mut |p, d| {
                        let _ = sock.send_to(d, p);
                    });
                    continue;
                };
                let mut answers = Vec::new();
                srv.handle_datagram(
                    Instant::now(),
                    peer,
                    &dg[..n],
                    &mut buf,
                    &mut |pt, id| {
                        let mut a = format!("echo[{}]:", id.map_or("-", |s| s)).into_bytes();
                        a.extend_from_slice(pt);
                        answers.push(a);
                    },
                    &mut |d| {
                        let _ = sock.send_to(d, peer);
                    },
                );
                for a in answers {
                    srv.send(peer, &a, &mut |d| {
                        let _ = sock.send_to(d, peer);
                    });
                }
            }
        });
        Echo {
            addr,
            server,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn psk(id: &str, key: &str) -> Psk {
    Psk::new(id, parse_key(key).unwrap()).unwrap()
}

fn connect(addr: SocketAddr, settings: ClientSettings) -> Result<DtlsClient, DtlsError> {
    connect_within(addr, settings, Duration::from_secs(5))
}

fn connect_within(
    addr: SocketAddr,
    settings: ClientSettings,
    t: Duration,
) -> Result<DtlsClient, DtlsError> {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(addr).unwrap();
    DtlsClient::connect(s, settings, Instant::now() + t)
}

fn roundtrip(c: &mut DtlsClient, msg: &[u8]) -> String {
    c.send(msg).unwrap();
    let mut out = [0u8; 2048];
    let n = c
        .recv(&mut out, Duration::from_secs(5))
        .unwrap()
        .expect("an answer");
    String::from_utf8_lossy(&out[..n]).into_owned()
}

#[test]
fn psk_handshake_data_and_identity() {
    let srv = Echo::start(ServerSettings {
        psk: vec![psk("dev1", "secretkey"), psk("dev2", "0x0102030405")],
        ..ServerSettings::default()
    });
    let mut c = connect(
        srv.addr,
        ClientSettings {
            psk: Some(psk("dev1", "secretkey")),
            ..ClientSettings::default()
        },
    )
    .unwrap();
    // RFC 7252's mandatory PSK suite is the first choice of both sides
    assert_eq!(c.cipher(), Some("PSK-AES128-CCM8"));
    assert_eq!(roundtrip(&mut c, b"hello"), "echo[dev1]:hello");
    assert_eq!(roundtrip(&mut c, &[7u8; 1000]).len(), 1011);
    let mut c2 = connect(
        srv.addr,
        ClientSettings {
            psk: Some(psk("dev2", "0x0102030405")),
            ..ClientSettings::default()
        },
    )
    .unwrap();
    assert_eq!(roundtrip(&mut c2, b"x"), "echo[dev2]:x");
    let st = srv.server.stats();
    assert_eq!(st.handshakes.load(Relaxed), 2);
    assert_eq!(st.sessions.load(Relaxed), 2);
    assert_eq!(st.decrypted.load(Relaxed), 3);
}

#[test]
fn wrong_key_and_unknown_identity_fail_clearly() {
    let srv = Echo::start(ServerSettings {
        psk: vec![psk("dev1", "secretkey")],
        handshake_timeout: Duration::from_millis(500),
        ..ServerSettings::default()
    });
    for (id, key) in [("dev1", "wrongkey"), ("nobody", "secretkey")] {
        let e = connect_within(
            srv.addr,
            ClientSettings {
                psk: Some(psk(id, key)),
                ..ClientSettings::default()
            },
            Duration::from_millis(1500),
        )
        .err()
        .expect("the handshake must fail");
        assert!(
            matches!(e, DtlsError::Handshake(_)),
            "{id}/{key}: expected a handshake failure, got {e}"
        );
    }
    // the unknown identity fails at once (alert); the wrong key is a
    // Finished the server cannot decrypt, dropped silently as DTLS does,
    // so that handshake ends at the handshake timeout; neither stays
    let st = srv.server.stats();
    let end = Instant::now() + Duration::from_secs(3);
    while srv.server.sessions() > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(srv.server.sessions(), 0);
    assert_eq!(st.handshake_failures.load(Relaxed), 1);
    assert_eq!(st.handshake_timeouts.load(Relaxed), 1);
    assert_eq!(st.handshakes.load(Relaxed), 0);
}

#[test]
fn certificates_both_ways_and_name_check() {
    let dir = std::env::temp_dir().join(format!("mintgate-dtls-pki-{}", std::process::id()));
    let pki = crate::pki::generate(&dir, "sensor-7").unwrap();
    let srv = Echo::start(ServerSettings {
        certs: pki.server_files(),
        require_client_cert: true,
        ..ServerSettings::default()
    });
    let mut c = connect(
        srv.addr,
        ClientSettings {
            certs: pki.client_files(),
            server_name: Some("127.0.0.1".into()),
            ..ClientSettings::default()
        },
    )
    .unwrap();
    assert_eq!(c.cipher(), Some("ECDHE-ECDSA-AES128-CCM8"));
    assert_eq!(roundtrip(&mut c, b"hi"), "echo[sensor-7]:hi");
    // a name the certificate is not for
    let e = connect(
        srv.addr,
        ClientSettings {
            certs: pki.client_files(),
            server_name: Some("elsewhere.example".into()),
            ..ClientSettings::default()
        },
    )
    .err()
    .expect("wrong name must fail");
    assert!(matches!(e, DtlsError::Handshake(_)), "{e}");
    // no client certificate while the server requires one
    let e = connect(
        srv.addr,
        ClientSettings {
            certs: crate::CertFiles {
                ca: Some(pki.ca.clone()),
                ..Default::default()
            },
            ..ClientSettings::default()
        },
    )
    .err()
    .expect("missing client certificate must fail");
    assert!(matches!(e, DtlsError::Handshake(_)), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that requires client certificates refuses pre-shared-key
/// clients too, though it has keys; without the requirement they come in.
#[test]
fn a_required_client_certificate_refuses_psk_clients() {
    let dir = std::env::temp_dir().join(format!("mintgate-dtls-pki-psk-{}", std::process::id()));
    let pki = crate::pki::generate(&dir, "sensor-8").unwrap();
    let with = |require| {
        Echo::start(ServerSettings {
            psk: vec![psk("sensor-1", "change-me")],
            certs: pki.server_files(),
            require_client_cert: require,
            ..ServerSettings::default()
        })
    };
    let as_psk = || ClientSettings {
        psk: Some(psk("sensor-1", "change-me")),
        ..ClientSettings::default()
    };
    let strict = with(true);
    let e = connect_within(strict.addr, as_psk(), Duration::from_secs(3))
        .err()
        .expect("a PSK client must be refused where a certificate is required");
    assert!(
        matches!(e, DtlsError::Handshake(_) | DtlsError::Timeout),
        "{e}"
    );
    let lax = with(false);
    let mut c = connect(lax.addr, as_psk()).unwrap();
    assert_eq!(roundtrip(&mut c, b"hi"), "echo[sensor-1]:hi");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn junk_is_dropped_and_counted_and_the_table_is_bounded() {
    let srv = Echo::start(ServerSettings {
        psk: vec![psk("dev1", "k")],
        max_sessions: 2,
        ..ServerSettings::default()
    });
    let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
    // not a record; a record with no session; an application record
    for d in [
        &b"hello"[..],
        &[23, 0xfe, 0xfd, 0, 1, 0, 0, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4][..],
        &[22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2][..],
    ] {
        junk.send_to(d, srv.addr).unwrap();
    }
    // three clients through a table of two: the third is refused, since
    // established sessions are never evicted for a handshake
    let settings = ClientSettings {
        psk: Some(psk("dev1", "k")),
        ..ClientSettings::default()
    };
    let mut clients: Vec<DtlsClient> = (0..2)
        .map(|_| connect(srv.addr, settings.clone()).unwrap())
        .collect();
    let third = connect_within(srv.addr, settings.clone(), Duration::from_millis(700));
    assert!(third.is_err(), "a third session got in");
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(roundtrip(c, b"still"), "echo[dev1]:still", "client {i}");
    }
    let st = srv.server.stats();
    assert_eq!(st.malformed.load(Relaxed), 1);
    assert_eq!(st.unauthenticated.load(Relaxed), 2);
    assert_eq!(st.evicted.load(Relaxed), 0);
    assert!(st.handshakes_refused.load(Relaxed) >= 1);
    assert_eq!(srv.server.sessions(), 2);
    // one closes: the next client gets its place
    clients.pop().unwrap().close();
    let end = Instant::now() + Duration::from_secs(2);
    while srv.server.sessions() > 1 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut next = connect(srv.addr, settings).unwrap();
    assert_eq!(roundtrip(&mut next, b"in"), "echo[dev1]:in");
}

#[test]
fn idle_sessions_expire() {
    let srv = Echo::start(ServerSettings {
        psk: vec![psk("dev1", "k")],
        idle_timeout: Duration::from_millis(100),
        ..ServerSettings::default()
    });
    let mut c = connect(
        srv.addr,
        ClientSettings {
            psk: Some(psk("dev1", "k")),
            ..ClientSettings::default()
        },
    )
    .unwrap();
    assert_eq!(roundtrip(&mut c, b"a"), "echo[dev1]:a");
    let end = Instant::now() + Duration::from_secs(3);
    while srv.server.sessions() > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(srv.server.sessions(), 0);
    assert_eq!(srv.server.stats().expired.load(Relaxed), 1);
}

#[test]
fn bad_keys_and_settings_are_refused() {
    assert!(parse_key("0x0g").is_err());
    assert!(parse_key("0x123").is_err());
    assert_eq!(parse_key("0xA0ff").unwrap(), vec![0xa0, 0xff]);
    assert_eq!(parse_key("abc").unwrap(), b"abc".to_vec());
    assert!(Psk::new("", b"k".to_vec()).is_err());
    assert!(Psk::new("id", Vec::new()).is_err());
    assert!(DtlsServer::new(ServerSettings::default()).is_err());
    assert!(crate::client::ClientContext::new(ClientSettings::default()).is_err());
}

mod cookies {
    //! The stateless cookie exchange, driven datagram by datagram.

    use super::*;
    use crate::hello::{parse_client_hello, write_client_hello, HelloFields, HELLO_VERIFY_REQUEST};
    use crate::server::{Handled, Source};

    fn server(per_source: usize, max_sessions: usize) -> DtlsServer {
        DtlsServer::new(ServerSettings {
            psk: vec![psk("dev1", "k")],
            max_handshakes_per_source: per_source,
            max_sessions,
            ..ServerSettings::default()
        })
        .unwrap()
    }

    /// Feeds `d` from `peer`; returns what was done and what was sent.
    fn handle(
        srv: &DtlsServer,
        now: Instant,
        peer: SocketAddr,
        d: &[u8],
    ) -> (Handled, Vec<Vec<u8>>) {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        let h = srv.handle_datagram(now, peer, d, &mut buf, &mut |_, _| {}, &mut |r| {
            out.push(r.to_vec())
        });
        (h, out)
    }

    fn first_hello(random: u8, seq: u64) -> HelloFields {
        HelloFields {
            record_seq: seq,
            random: [random; 32],
            ..HelloFields::default()
        }
    }

    /// The cookie of a HelloVerifyRequest.
    fn cookie_of(hvr: &[u8]) -> Vec<u8> {
        assert_eq!(hvr[0], 22);
        assert_eq!(hvr[13], HELLO_VERIFY_REQUEST);
        let n = hvr[13 + 12 + 2] as usize;
        hvr[13 + 12 + 3..13 + 12 + 3 + n].to_vec()
    }

    /// The second hello of `peer`, with the cookie the server gave it.
    fn second_hello(srv: &DtlsServer, now: Instant, peer: SocketAddr, random: u8) -> Vec<u8> {
        let f = first_hello(random, 0);
        let (h, out) = handle(srv, now, peer, &write_client_hello(&f));
        assert_eq!(h, Handled::Handshake);
        assert_eq!(out.len(), 1);
        write_client_hello(&HelloFields {
            record_seq: 1,
            message_seq: 1,
            cookie: cookie_of(&out[0]),
            ..f
        })
    }

    #[test]
    fn cookieless_hellos_from_many_sources_cost_no_state() {
        let srv = server(16, 1024);
        let now = Instant::now();
        for i in 0..5000u32 {
            let peer = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 4000));
            let d = write_client_hello(&first_hello(i as u8, u64::from(i)));
            let (h, out) = handle(&srv, now, peer, &d);
            assert_eq!(h, Handled::Handshake);
            // one small answer: the record sequence number repeated, a
            // 32-byte cookie, no bigger than the hello
            assert_eq!(out.len(), 1);
            let hvr = &out[0];
            assert_eq!(&hvr[5..11], &d[5..11]);
            assert_eq!(cookie_of(hvr).len(), 32);
            assert!(hvr.len() <= d.len());
        }
        let st = srv.stats();
        assert_eq!(st.hello_verify_requests.load(Relaxed), 5000);
        assert_eq!(srv.sessions(), 0);
        assert_eq!(st.sessions.load(Relaxed), 0);
        // fragments and garbage in a hello's clothes are dropped, unanswered
        let mut frag = write_client_hello(&first_hello(1, 0));
        frag[13 + 8] = 5;
        let (h, out) = handle(&srv, now, "10.9.9.9:1".parse().unwrap(), &frag);
        assert_eq!((h, out.len()), (Handled::Dropped, 0));
        assert_eq!(st.malformed.load(Relaxed), 1);
    }

    #[test]
    fn a_valid_cookie_opens_a_session_a_wrong_or_stolen_one_does_not() {
        let srv = server(16, 1024);
        let now = Instant::now();
        let peer: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        let second = second_hello(&srv, now, peer, 7);
        // from another address or port, the same cookie is worth nothing
        for thief in ["192.0.2.2:5000", "192.0.2.1:5001"] {
            let (h, out) = handle(&srv, now, thief.parse().unwrap(), &second);
            assert_eq!(h, Handled::Handshake);
            assert_eq!(out.len(), 1, "a new HelloVerifyRequest");
            assert_eq!(out[0][13], HELLO_VERIFY_REQUEST);
        }
        // a changed cookie neither
        let mut bad = second.clone();
        let h = parse_client_hello(&second).unwrap();
        let at = h.cookie.as_ptr() as usize - second.as_ptr() as usize;
        bad[at] ^= 1;
        let (_, out) = handle(&srv, now, peer, &bad);
        assert_eq!(out[0][13], HELLO_VERIFY_REQUEST);
        assert_eq!(srv.stats().bad_cookies.load(Relaxed), 3);
        assert_eq!(srv.sessions(), 0);
        // the right one: a session, and OpenSSL's first flight (a
        // ServerHello, message 1, repeating the record sequence number)
        let (h, out) = handle(&srv, now, peer, &second);
        assert_eq!(h, Handled::Handshake);
        assert_eq!(srv.sessions(), 1);
        assert_eq!(srv.handshakes_from(Source::of(peer)), 1);
        assert!(!out.is_empty());
        assert_eq!(out[0][0], 22);
        assert_eq!(out[0][13], 2, "ServerHello");
        assert_eq!(&out[0][13 + 4..13 + 6], &[0, 1], "message_seq 1");
        assert_eq!(&out[0][5..11], &second[5..11]);
        // the same hello again is a retransmission: same session
        let (h, _) = handle(&srv, now, peer, &second);
        assert_eq!(h, Handled::Handshake);
        assert_eq!(srv.sessions(), 1);
        assert_eq!(srv.handshakes_from(Source::of(peer)), 1);
        // past the handshake timeout the sweep drops it, and the source
        // has no handshake left
        srv.sweep(now + Duration::from_secs(11), &mut |_, _| {});
        assert_eq!(srv.sessions(), 0);
        assert_eq!(srv.handshakes_from(Source::of(peer)), 0);
        assert_eq!(srv.stats().handshake_timeouts.load(Relaxed), 1);
    }

    #[test]
    fn handshakes_are_capped_per_ipv4_address_and_ipv6_slash_64() {
        let srv = server(3, 1024);
        let now = Instant::now();
        let open = |peer: &str, r: u8| {
            let peer: SocketAddr = peer.parse().unwrap();
            let d = second_hello(&srv, now, peer, r);
            handle(&srv, now, peer, &d).0
        };
        for port in 1..=5u16 {
            open(&format!("198.51.100.9:{port}"), port as u8);
        }
        // IPv6: other hosts of the same /64 count together
        for host in 1..=4u16 {
            open(&format!("[2001:db8:0:1::{host}]:7000"), host as u8);
        }
        let st = srv.stats();
        assert_eq!(srv.sessions(), 6);
        assert_eq!(st.handshakes_refused.load(Relaxed), 3);
        assert_eq!(
            srv.handshakes_from(Source::of("198.51.100.9:1".parse().unwrap())),
            3
        );
        // another address, another /64, an IPv4-mapped address of the
        // full IPv4 source
        assert_eq!(open("198.51.100.10:1", 1), Handled::Handshake);
        assert_eq!(open("[2001:db8:0:2::1]:7000", 1), Handled::Handshake);
        assert_eq!(open("[::ffff:198.51.100.9]:9", 9), Handled::Dropped);
        assert_eq!(srv.sessions(), 8);
    }

    #[test]
    fn a_full_table_evicts_the_oldest_handshake_never_a_session() {
        let srv = server(16, 2);
        let t0 = Instant::now();
        let a: SocketAddr = "203.0.113.1:1".parse().unwrap();
        let b: SocketAddr = "203.0.113.2:1".parse().unwrap();
        let c: SocketAddr = "203.0.113.3:1".parse().unwrap();
        for (i, p) in [a, b].into_iter().enumerate() {
            let t = t0 + Duration::from_millis(i as u64);
            let d = second_hello(&srv, t, p, i as u8);
            handle(&srv, t, p, &d);
        }
        let d = second_hello(&srv, t0, c, 3);
        assert_eq!(
            handle(&srv, t0 + Duration::from_millis(5), c, &d).0,
            Handled::Handshake
        );
        assert_eq!(srv.sessions(), 2);
        assert_eq!(srv.stats().evicted.load(Relaxed), 1);
        assert_eq!(srv.handshakes_from(Source::of(a)), 0, "the oldest went");
    }

    #[test]
    fn a_cookie_survives_one_secret_change_not_two() {
        let period = Duration::from_secs(60);
        let srv = DtlsServer::new(ServerSettings {
            psk: vec![psk("dev1", "k")],
            cookie_period: period,
            ..ServerSettings::default()
        })
        .unwrap();
        let t0 = Instant::now();
        let p1: SocketAddr = "192.0.2.10:1".parse().unwrap();
        let p2: SocketAddr = "192.0.2.11:1".parse().unwrap();
        let early = second_hello(&srv, t0, p1, 1);
        let late = second_hello(&srv, t0, p2, 2);
        // after one change the old cookie still opens a session
        handle(&srv, t0 + period + Duration::from_secs(1), p1, &early);
        assert_eq!(srv.cookie_rotations(), 1);
        assert_eq!(srv.sessions(), 1);
        // after a second change it is refused (answered with a new one)
        let (_, out) = handle(&srv, t0 + period * 2 + Duration::from_secs(2), p2, &late);
        assert_eq!(srv.cookie_rotations(), 2);
        assert_eq!(out[0][13], HELLO_VERIFY_REQUEST);
        assert_eq!(srv.sessions(), 1);
    }

    /// Cookieless hellos from 512 loopback addresses while a client
    /// handshakes and an established session talks: nothing is kept for
    /// the flood, both clients are served.
    #[test]
    fn a_spoofed_flood_leaves_real_clients_alone() {
        let srv = Echo::start(ServerSettings {
            psk: vec![psk("dev1", "k")],
            max_sessions: 8,
            ..ServerSettings::default()
        });
        let settings = ClientSettings {
            psk: Some(psk("dev1", "k")),
            ..ClientSettings::default()
        };
        let mut talker = connect(srv.addr, settings.clone()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (st, addr) = (stop.clone(), srv.addr);
        let flood = std::thread::spawn(move || {
            let socks: Vec<UdpSocket> = (0..512u32)
                .filter_map(|i| {
                    UdpSocket::bind((std::net::Ipv4Addr::new(127, 3, (i >> 8) as u8, i as u8), 0))
                        .ok()
                })
                .collect();
            let mut sent = 0u64;
            let end = Instant::now() + Duration::from_secs(5);
            'outer: for round in 0u64.. {
                for (i, s) in socks.iter().enumerate() {
                    if st.load(Relaxed) || Instant::now() > end || sent >= 200_000 {
                        break 'outer;
                    }
                    // about 5,000 per second: what a debug build serves
                    // without dropping the real clients' datagrams
                    if i % 8 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let d = write_client_hello(&HelloFields {
                        record_seq: round,
                        random: [(i as u8) ^ (round as u8); 32],
                        ..HelloFields::default()
                    });
                    if s.send_to(&d, addr).is_ok() {
                        sent += 1;
                    }
                }
            }
            (socks.len(), sent)
        });
        std::thread::sleep(Duration::from_millis(100));
        // for 1.5 s (the flood's first 5,000 hellos or so)
        let t0 = Instant::now();
        let mut clients = 0;
        for i in 0..300 {
            if t0.elapsed() > Duration::from_millis(1500) {
                break;
            }
            clients += 1;
            let mut c = connect(srv.addr, settings.clone()).unwrap();
            assert_eq!(roundtrip(&mut c, b"new"), "echo[dev1]:new", "client {i}");
            c.close();
            for _ in 0..20 {
                assert_eq!(roundtrip(&mut talker, b"on"), "echo[dev1]:on");
            }
        }
        stop.store(true, Relaxed);
        let (sources, sent) = flood.join().unwrap();
        assert!(sources >= 256, "only {sources} loopback sources bound");
        let st = srv.server.stats();
        assert!(sent >= 2000, "the flood sent only {sent}");
        // (a few may have been dropped by the kernel)
        let end = Instant::now() + Duration::from_secs(2);
        while st.hello_verify_requests.load(Relaxed) < sent * 9 / 10 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(st.hello_verify_requests.load(Relaxed) >= sent * 9 / 10);
        assert!(srv.server.sessions() <= 2, "the flood got sessions");
        assert_eq!(st.handshakes_refused.load(Relaxed), 0);
        assert_eq!(st.evicted.load(Relaxed), 0);
        assert_eq!(st.handshakes.load(Relaxed), 1 + clients);
    }
}
