//! coaps listeners on the Interaction pipeline: DTLS sessions in front of
//! the same de-duplication, queue, handler pool and router as plain CoAP.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mintgate_coap::server::Resource;
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_dtls::{ClientSettings, DtlsClient, Psk};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

fn config() -> Config {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.coaps.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.coaps.psk_identity = Some("sensor-1".into());
    c.coaps.psk_key = Some("key-one".into());
    c.coaps
        .psk_keys
        .insert("sensor-2".into(), "0x6b65792d74776f".into()); // "key-two"
    c.pipeline.pool = PoolMode::Fixed(2);
    c.buffers.partitions = vec![mintgate_gateway::config::Partition {
        block_size: 1280,
        blocks: 512,
    }];
    c
}

fn start(c: Config) -> (Gateway, SocketAddr, SocketAddr) {
    let mut router = resources::router_for(&c);
    // answers with the DTLS identity the handler sees
    router
        .add(Resource::new("whoami").get(|req, rb| {
            let who = req.identity.unwrap_or("(plain)").to_owned();
            rb.write(who.as_bytes());
        }))
        .unwrap();
    let gw = Gateway::start(c, router).expect("gateway starts");
    let plain = gw.local_addrs()[0];
    let secure = gw.coaps_addrs()[0];
    assert_ne!(plain, secure);
    (gw, plain, secure)
}

fn session(addr: SocketAddr, id: &str, key: &[u8]) -> DtlsClient {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(addr).unwrap();
    DtlsClient::connect(
        s,
        ClientSettings {
            psk: Some(Psk::new(id, key.to_vec()).unwrap()),
            ..ClientSettings::default()
        },
        Instant::now() + Duration::from_secs(5),
    )
    .expect("handshake")
}

fn request(ty: MessageType, code: Code, mid: u16, path: &str, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 1400];
    let mut w = MessageWriter::new(&mut b, ty, code, mid, &mid.to_be_bytes()).unwrap();
    w.path_options(OptionNumber::URI_PATH, path).unwrap();
    w.payload(payload).unwrap();
    let n = w.finish();
    b.truncate(n);
    b
}

/// Sends `req` over the session; returns (type, code, payload) of the answer.
fn ask(c: &mut DtlsClient, req: &[u8]) -> (MessageType, Code, Vec<u8>) {
    c.send(req).unwrap();
    let mut out = [0u8; 2048];
    let n = c
        .recv(&mut out, Duration::from_secs(3))
        .unwrap()
        .expect("an answer over DTLS");
    let p = Packet::new_checked(&out[..n]).expect("a CoAP message");
    (p.msg_type(), p.code(), p.payload().to_vec())
}

#[test]
fn every_resource_answers_over_coaps_with_the_identity_visible() {
    let (gw, plain, secure) = start(config());
    let mut c = session(secure, "sensor-1", b"key-one");
    let (ty, code, body) = ask(
        &mut c,
        &request(MessageType::Con, Code::GET, 1, "request", b""),
    );
    assert_eq!((ty, code), (MessageType::Ack, Code::CONTENT));
    assert_eq!(body, b"hello world");
    // PUT then GET on /echo; NON too
    let (_, code, _) = ask(
        &mut c,
        &request(MessageType::Con, Code::PUT, 2, "echo", b"over dtls"),
    );
    assert_eq!(code, Code::CHANGED);
    let (ty, _, body) = ask(
        &mut c,
        &request(MessageType::Non, Code::GET, 3, "echo", b""),
    );
    assert_eq!((ty, body.as_slice()), (MessageType::Non, &b"over dtls"[..]));
    let (_, _, who) = ask(
        &mut c,
        &request(MessageType::Con, Code::GET, 4, "whoami", b""),
    );
    assert_eq!(who, b"sensor-1");
    // a duplicate CON gets the cached answer, encrypted again
    let (_, _, again) = ask(
        &mut c,
        &request(MessageType::Con, Code::GET, 4, "whoami", b""),
    );
    assert_eq!(again, b"sensor-1");
    assert!(gw.counters().nr_duplicates.load(Relaxed) >= 1);
    // the second identity, with its hex key
    let mut c2 = session(secure, "sensor-2", b"key-two");
    let (_, _, who) = ask(
        &mut c2,
        &request(MessageType::Con, Code::GET, 1, "whoami", b""),
    );
    assert_eq!(who, b"sensor-2");
    // the plain listener is still plain, with no identity
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    u.send_to(
        &request(MessageType::Con, Code::GET, 9, "whoami", b""),
        plain,
    )
    .unwrap();
    let mut b = [0u8; 512];
    let n = u.recv(&mut b).unwrap();
    assert_eq!(Packet::new_checked(&b[..n]).unwrap().payload(), b"(plain)");
    // plain CoAP sent to the coaps port is not a DTLS record: dropped, counted
    u.send_to(
        &request(MessageType::Con, Code::GET, 10, "request", b""),
        secure,
    )
    .unwrap();
    u.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(u.recv(&mut b).is_err(), "no answer to plain CoAP on coaps");
    let st = gw.dtls_servers()[0].stats().clone();
    assert_eq!(st.handshakes.load(Relaxed), 2);
    assert_eq!(st.malformed.load(Relaxed), 1);
    assert!(st.decrypted.load(Relaxed) >= 6);
    assert!(st.encrypted.load(Relaxed) >= 6);
    let m = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(m.contains("mintgate_coaps_handshakes_total 2"), "{m}");
    assert!(m.contains("mintgate_coaps_sessions 2"), "{m}");
}

#[test]
fn a_coaps_config_without_keys_or_with_half_a_key_is_refused() {
    let mut c = config();
    c.coaps.psk_identity = None;
    c.coaps.psk_key = None;
    c.coaps.psk_keys.clear();
    let e = Gateway::start(c, resources::router_for(&Config::default()))
        .err()
        .expect("no keys");
    assert!(e.to_string().contains("pre-shared key"), "{e}");
    let mut c = config();
    c.coaps.psk_key = None;
    let e = c.validate().expect_err("half a key");
    assert!(e.to_string().contains("coaps.psk_key"), "{e}");
    let mut c = config();
    c.coaps.cert = Some("/nonexistent/cert.pem".into());
    c.coaps.key = Some("/nonexistent/key.pem".into());
    let e = Gateway::start(c, resources::router_for(&Config::default()))
        .err()
        .expect("missing certificate file");
    assert!(e.to_string().contains("/nonexistent/cert.pem"), "{e}");
}
