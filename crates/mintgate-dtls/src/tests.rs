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
    // three clients through a table of two: one session is evicted
    let settings = ClientSettings {
        psk: Some(psk("dev1", "k")),
        ..ClientSettings::default()
    };
    let mut clients: Vec<DtlsClient> = (0..3)
        .map(|_| connect(srv.addr, settings.clone()).unwrap())
        .collect();
    assert_eq!(roundtrip(&mut clients[2], b"last"), "echo[dev1]:last");
    let st = srv.server.stats();
    assert_eq!(st.malformed.load(Relaxed), 1);
    assert_eq!(st.unauthenticated.load(Relaxed), 2);
    assert_eq!(st.evicted.load(Relaxed), 1);
    assert_eq!(srv.server.sessions(), 2);
    // the evicted client's records now come from a peer without a session
    clients[0].send(b"gone").unwrap();
    let mut out = [0u8; 64];
    assert_eq!(
        clients[0]
            .recv(&mut out, Duration::from_millis(200))
            .unwrap(),
        None
    );
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
