//! OSCORE (RFC 8613) on the gateway: protected requests verified before the
//! router, answers protected back, the identity handlers see, the
//! `access.write = "oscore"` policy, replays and tampering refused, and the
//! Echo round trip that rebuilds the replay window after a restart
//! (Appendix B.1.2) with the sender sequence number never reused; Observe
//! inside OSCORE (4.1.3.5); block-wise inside OSCORE and outside it, on
//! the server's side and the client's (4.1.3.4).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

use mintgate_coap::oscore::{Context, Error, Notifications, OscoreOption, Params, RequestId};
use mintgate_coap::server::Resource;
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_gateway::access::WriteMode;
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::oscore::ContextConfig;
use mintgate_gateway::{resources, Config, Gateway};

const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-oscore-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(d: &Path) -> Config {
    std::fs::write(d.join("secret.hex"), format!("{SECRET}\n")).unwrap();
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(2);
    c.access.write = WriteMode::Oscore;
    c.oscore.state = d.join("state");
    c.oscore.seq_step = 4;
    c.oscore.contexts = vec![ContextConfig {
        name: "client1".into(),
        master_secret_file: Some(d.join("secret.hex")),
        master_salt: "9e7ca92223786340".into(),
        sender_id: "01".into(),
        recipient_id: "".into(),
        ..ContextConfig::default()
    }];
    c
}

/// The value of the observable test resource `temp`.
static TEMP: AtomicU32 = AtomicU32::new(0);

fn start(c: Config) -> (Gateway, SocketAddr) {
    let mut router = resources::router_for(&c);
    router
        .add(Resource::new("temp").flag("obs").get(|_, rb| {
            rb.write(TEMP.load(SeqCst).to_string().as_bytes());
        }))
        .unwrap();
    router
        .add(
            Resource::new("whoami")
                .get(|req, rb| {
                    let who = req.identity.unwrap_or("(plain)").to_owned();
                    rb.write(who.as_bytes());
                })
                .put(|req, rb| {
                    rb.set_code(Code::CHANGED).write(req.packet.payload());
                }),
        )
        .unwrap();
    router
        .add(
            Resource::new("big")
                .get(|req, rb| {
                    mintgate_coap::server::block::respond_block2(req, rb, &BIG, 1024);
                })
                .post(|req, rb| {
                    let p = req.packet.payload();
                    let sum: u64 = p.iter().map(|&b| u64::from(b)).sum();
                    rb.set_code(Code::CHANGED)
                        .write(format!("{} {sum}", p.len()).as_bytes());
                }),
        )
        .unwrap();
    let gw = Gateway::start(c, router).expect("gateway starts");
    let a = gw.local_addrs()[0];
    (gw, a)
}

/// The representation of `big`: three blocks of 1024 bytes and a part.
const BIG: [u8; 3500] = {
    let mut b = [0u8; 3500];
    let mut i = 0;
    while i < b.len() {
        b[i] = b'a' + (i % 26) as u8;
        i += 1;
    }
    b
};

fn client() -> Context {
    Context::new(&Params {
        master_secret: mintgate_gateway::oscore::parse_hex(SECRET).unwrap(),
        master_salt: mintgate_gateway::oscore::parse_hex("9e7ca92223786340").unwrap(),
        sender_id: vec![],
        recipient_id: vec![1],
        id_context: None,
    })
    .unwrap()
}

/// A client with a key and kid the gateway does not have.
fn stranger() -> Context {
    Context::new(&Params {
        master_secret: vec![7; 16],
        sender_id: vec![9],
        recipient_id: vec![1],
        ..Params::default()
    })
    .unwrap()
}

fn request(code: Code, mid: u16, opts: &[(OptionNumber, &[u8])], payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 1400];
    let mut w =
        MessageWriter::new(&mut b, MessageType::Con, code, mid, &mid.to_be_bytes()).unwrap();
    w.option(OptionNumber::URI_PATH, b"whoami").unwrap();
    for (n, v) in opts {
        w.option(*n, v).unwrap();
    }
    w.payload(payload).unwrap();
    let n = w.finish();
    b.truncate(n);
    b
}

fn exchange(s: &UdpSocket, to: SocketAddr, msg: &[u8]) -> Vec<u8> {
    s.send_to(msg, to).unwrap();
    let mut out = [0u8; 1500];
    let (n, _) = s.recv_from(&mut out).expect("an answer");
    out[..n].to_vec()
}

/// (outer code, inner code, inner payload, inner message).
fn protected(
    c: &mut Context,
    s: &UdpSocket,
    to: SocketAddr,
    plain: &[u8],
) -> (Code, Code, Vec<u8>, Vec<u8>, Vec<u8>, RequestId) {
    let (out, id) = c.protect_request(plain).unwrap();
    let answer = exchange(s, to, &out);
    let outer = Packet::new_checked(&answer[..]).unwrap().code();
    let inner = c.unprotect_response(&answer, &id).unwrap_or_else(|e| {
        let p = Packet::new_checked(&answer[..]).unwrap();
        panic!(
            "the answer does not verify ({e}): {} {}",
            p.code(),
            String::from_utf8_lossy(p.payload())
        )
    });
    let p = Packet::new_checked(&inner[..]).unwrap();
    let (code, pl) = (p.code(), p.payload().to_vec());
    (outer, code, pl, inner, out, id)
}

fn socket() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s
}

fn plain_answer(s: &UdpSocket, to: SocketAddr, msg: &[u8]) -> (Code, Vec<u8>) {
    let a = exchange(s, to, msg);
    let p = Packet::new_checked(&a[..]).unwrap();
    assert!(
        p.option(OptionNumber(9)).is_none(),
        "a refusal is not protected"
    );
    (p.code(), p.payload().to_vec())
}

#[test]
fn protected_requests_reach_handlers_with_the_oscore_identity() {
    let d = dir("serve");
    let (gw, to) = start(config(&d));
    let s = socket();
    let mut c = client();

    let (outer, code, body, _, _, _) = protected(&mut c, &s, to, &request(Code::GET, 1, &[], b""));
    assert_eq!(outer, Code::CHANGED, "the outer code of a protected answer");
    assert_eq!(code, Code::CONTENT);
    assert_eq!(body, b"oscore:client1");

    // an answer far larger than the request (the link-format document)
    // comes whole: a verified request is not held to the amplification
    // limit, whose Echo challenge would make the client replay itself
    let mut b = vec![0u8; 64];
    let mut w = MessageWriter::new(&mut b, MessageType::Con, Code::GET, 9, &[9]).unwrap();
    w.option(OptionNumber::URI_PATH, b".well-known").unwrap();
    w.option(OptionNumber::URI_PATH, b"core").unwrap();
    let n = w.finish();
    let fresh = socket();
    let (_, code, body, _, _, _) = protected(&mut c, &fresh, to, &b[..n]);
    assert_eq!(code, Code::CONTENT);
    assert!(
        body.len() > 3 * (n + 16) && body.starts_with(b"</request>"),
        "{}",
        String::from_utf8_lossy(&body)
    );

    // writes: protected ones pass, plain ones are refused
    let (_, code, body, _, _, _) = protected(&mut c, &s, to, &request(Code::PUT, 2, &[], b"on"));
    assert_eq!((code, body.as_slice()), (Code::CHANGED, &b"on"[..]));
    let (code, _) = plain_answer(&s, to, &request(Code::PUT, 3, &[], b"on"));
    assert_eq!(code, Code::UNAUTHORIZED);
    // reads stay open
    let (code, body) = plain_answer(&s, to, &request(Code::GET, 4, &[], b""));
    assert_eq!((code, body.as_slice()), (Code::CONTENT, &b"(plain)"[..]));

    // a replay under a new message ID is refused 4.01
    let (replay, _) = c.protect_request(&request(Code::GET, 5, &[], b"")).unwrap();
    let _ = exchange(&s, to, &replay);
    let mut again = replay.clone();
    again[2..4].copy_from_slice(&6u16.to_be_bytes());
    let (code, body) = plain_answer(&s, to, &again);
    assert_eq!(code, Code::UNAUTHORIZED);
    assert_eq!(body, b"Replay detected");

    // a duplicate (same message ID) gets the cached protected answer
    let dup = exchange(&s, to, &replay);
    assert_eq!(Packet::new_checked(&dup[..]).unwrap().code(), Code::CHANGED);

    // tampered ciphertext: 4.00
    let (mut bad, _) = c.protect_request(&request(Code::GET, 7, &[], b"")).unwrap();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let (code, _) = plain_answer(&s, to, &bad);
    assert_eq!(code, Code::BAD_REQUEST);

    // an unknown kid: 4.01
    let mut stranger = stranger();
    let (m, _) = stranger
        .protect_request(&request(Code::GET, 8, &[], b""))
        .unwrap();
    let (code, body) = plain_answer(&s, to, &m);
    assert_eq!(
        (code, body.as_slice()),
        (Code::UNAUTHORIZED, &b"Security context not found"[..])
    );

    let metrics = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(
        metrics.contains("mintgate_oscore_requests_total{result=\"replay\"} 1"),
        "{metrics}"
    );
    gw.shutdown();
}

#[test]
fn after_a_restart_an_echo_rebuilds_the_window_and_no_nonce_is_reused() {
    let d = dir("restart");
    let (gw, to) = start(config(&d));
    let s = socket();
    let mut c = client();
    let (_, code, _, _, _, _) = protected(&mut c, &s, to, &request(Code::GET, 1, &[], b""));
    assert_eq!(code, Code::CONTENT);
    // the server has used no sequence number yet (answers reuse the
    // request's nonce), but its file marks the context as used
    gw.shutdown();

    let (gw, to) = start(config(&d));
    let (_, code, _, inner, _, _) = protected(&mut c, &s, to, &request(Code::GET, 2, &[], b""));
    assert_eq!(code, Code::UNAUTHORIZED, "first request after the restart");
    let echo = Packet::new_checked(&inner[..])
        .unwrap()
        .option(OptionNumber::ECHO)
        .expect("an Echo option")
        .value
        .to_vec();
    let (_, code, body, _, _, _) = protected(
        &mut c,
        &s,
        to,
        &request(Code::GET, 3, &[(OptionNumber::ECHO, &echo)], b""),
    );
    assert_eq!(
        (code, body.as_slice()),
        (Code::CONTENT, &b"oscore:client1"[..])
    );
    let seq = |d: &Path| -> u64 {
        std::fs::read_to_string(d.join("state/client1.seq"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let first_limit = seq(&d);
    assert_eq!(
        first_limit, 4,
        "the challenge's number was reserved before use"
    );
    gw.shutdown();

    // a second restart: the next challenge uses a number at or above the
    // limit written before, never one that may have gone out already
    let (gw, to) = start(config(&d));
    let (msg, id) = c.protect_request(&request(Code::GET, 4, &[], b"")).unwrap();
    let answer = exchange(&s, to, &msg);
    let p = Packet::new_checked(&answer[..]).unwrap();
    let ov = p.option(OptionNumber(9)).unwrap().value;
    let piv = mintgate_coap::oscore::OscoreOption::decode(ov)
        .unwrap()
        .partial_iv
        .expect("the challenge has a Partial IV of its own");
    let n = piv.iter().fold(0u64, |a, b| (a << 8) | *b as u64);
    assert!(
        n >= first_limit,
        "sequence number {n} reused after a restart"
    );
    assert!(c.unprotect_response(&answer, &id).is_ok());
    assert_eq!(seq(&d), first_limit + 4);
    gw.shutdown();
}

#[test]
fn bad_contexts_are_refused_with_the_key_named() {
    let d = dir("bad");
    let mut c = config(&d);
    c.oscore.contexts[0].master_secret_file = None;
    let e = c.validate_to_start().err();
    assert!(e.is_none(), "secrets are read at start: {e:?}");
    let e = Gateway::start(c.clone(), resources::router_for(&c))
        .err()
        .unwrap();
    assert!(e.to_string().contains("master_secret_file"), "{e}");

    let mut c = config(&d);
    c.oscore.contexts[0].sender_id = "0102030405060708".into();
    let e = Gateway::start(c.clone(), resources::router_for(&c))
        .err()
        .unwrap();
    assert!(e.to_string().contains("7 bytes"), "{e}");

    let mut c = config(&d);
    c.oscore.contexts.push(c.oscore.contexts[0].clone());
    assert!(c.validate().unwrap_err().to_string().contains("used twice"));

    let mut c = config(&d);
    c.oscore.contexts.clear();
    assert!(c
        .validate_to_start()
        .unwrap_err()
        .to_string()
        .contains("oscore.contexts"));
}

/// A GET of `temp` with `Observe: obs` and the token `tk`.
fn observe_get(mid: u16, tk: &[u8], obs: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let mut w = MessageWriter::new(&mut b, MessageType::Con, Code::GET, mid, tk).unwrap();
    w.option_uint(OptionNumber::OBSERVE, obs).unwrap();
    w.option(OptionNumber::URI_PATH, b"temp").unwrap();
    let n = w.finish();
    b.truncate(n);
    b
}

/// The next message on `s` within `wait` (a CON acknowledged), if any.
fn next_message(s: &UdpSocket, wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut out = [0u8; 1500];
    let r = s.recv_from(&mut out);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let (n, _) = r.ok()?;
    let p = Packet::new_checked(&out[..n]).unwrap();
    if p.msg_type() == MessageType::Con {
        let ack = mintgate_coap::wire::empty_message(MessageType::Ack, p.message_id());
        s.send(&ack).ok();
    }
    Some(out[..n].to_vec())
}

/// RFC 8613 4.1.3.5: a protected GET with Observe registers a relation
/// whose every notification is protected with a Partial IV of the
/// gateway's own and verifies in order at the client; plain requests with
/// the same token neither take it over nor end it; a protected `Observe: 1`
/// ends it.
#[test]
fn a_protected_observation_gets_protected_notifications_in_order() {
    let d = dir("observe");
    let (gw, to) = start(config(&d));
    let s = socket();
    s.connect(to).unwrap();
    let mut c = client();
    TEMP.store(20, SeqCst);
    let (reg, id) = c.protect_request(&observe_get(1, b"ob", 0)).unwrap();
    s.send(&reg).unwrap();
    let first = next_message(&s, Duration::from_secs(3)).expect("an answer");
    let p = Packet::new_checked(&first[..]).unwrap();
    assert_eq!(p.code(), Code::CONTENT, "outer 2.05 for a notification");
    assert!(p.option(OptionNumber::OBSERVE).is_some(), "outer Observe");
    let mut seen = Notifications::default();
    let inner = c.unprotect_notification(&first, &id, &mut seen).unwrap();
    assert_eq!(Packet::new_checked(&inner[..]).unwrap().payload(), b"20");
    assert_eq!(gw.notifier().observers(), 1);

    let mut last_piv = None;
    for v in 21..=23u32 {
        TEMP.store(v, SeqCst);
        gw.notifier().notify("temp");
        let n = next_message(&s, Duration::from_secs(3)).expect("a notification");
        let p = Packet::new_checked(&n[..]).unwrap();
        assert_eq!(p.token(), b"ob");
        let piv = OscoreOption::decode(p.option(OptionNumber(9)).unwrap().value)
            .unwrap()
            .partial_iv
            .expect("a Partial IV of its own")
            .to_vec();
        assert!(last_piv.as_ref().is_none_or(|l: &Vec<u8>| piv > *l));
        last_piv = Some(piv);
        let inner = c.unprotect_notification(&n, &id, &mut seen).unwrap();
        assert_eq!(
            Packet::new_checked(&inner[..]).unwrap().payload(),
            v.to_string().as_bytes()
        );
        // a copy of it is refused
        assert_eq!(
            c.unprotect_notification(&n, &id, &mut seen),
            Err(Error::Replay)
        );
    }

    // plain requests with the same token from the same address
    s.send(&observe_get(10, b"ob", 0)).unwrap();
    let a = next_message(&s, Duration::from_secs(3)).expect("an answer");
    let p = Packet::new_checked(&a[..]).unwrap();
    assert!(p.option(OptionNumber(9)).is_none() && p.option(OptionNumber::OBSERVE).is_none());
    s.send(&observe_get(11, b"ob", 1)).unwrap();
    next_message(&s, Duration::from_secs(3)).expect("an answer");
    assert_eq!(gw.notifier().observers(), 1, "the relation is still there");
    TEMP.store(24, SeqCst);
    gw.notifier().notify("temp");
    let n = next_message(&s, Duration::from_secs(3)).expect("a notification");
    let inner = c
        .unprotect_notification(&n, &id, &mut seen)
        .expect("still protected");
    assert_eq!(Packet::new_checked(&inner[..]).unwrap().payload(), b"24");

    // a protected Observe: 1 ends it
    let (dereg, did) = c.protect_request(&observe_get(12, b"ob", 1)).unwrap();
    s.send(&dereg).unwrap();
    let a = next_message(&s, Duration::from_secs(3)).expect("an answer");
    assert!(c.unprotect_response(&a, &did).is_ok());
    assert_eq!(gw.notifier().observers(), 0);
    gw.notifier().notify("temp");
    let end = Instant::now() + Duration::from_millis(400);
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        assert!(
            next_message(&s, left.max(Duration::from_millis(1))).is_none(),
            "a notification after the deregistration"
        );
    }
    let metrics = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(
        metrics.contains("mintgate_oscore_notifications_total{result=\"protected\"} 4"),
        "{metrics}"
    );
    gw.shutdown();
}

fn message(
    code: Code,
    mid: u16,
    token: &[u8],
    opts: &[(OptionNumber, Vec<u8>)],
    payload: &[u8],
) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let mut w = MessageWriter::new(&mut b, MessageType::Con, code, mid, token).unwrap();
    let mut opts = opts.to_vec();
    opts.sort_by_key(|(n, _)| *n);
    for (n, v) in &opts {
        w.option(*n, v).unwrap();
    }
    if !payload.is_empty() {
        w.payload(payload).unwrap();
    }
    let n = w.finish();
    b.truncate(n);
    b
}

fn uint(v: u32) -> Vec<u8> {
    let mut b = [0u8; 4];
    mintgate_coap::wire::encode_uint(v, &mut b).to_vec()
}

/// Inner block-wise (RFC 8613 4.1.3.4.1): a representation of several
/// blocks is fetched with one protected request per block, each answered
/// with its inner Block2 inside the protection; a full 1024-byte block and
/// its overhead fit one protected message.
#[test]
fn inner_blocks_each_come_protected_and_make_the_whole_body() {
    let d = dir("inner-blocks");
    let (gw, to) = start(config(&d));
    let s = socket();
    let mut c = client();
    let mut body = Vec::new();
    for num in 0..4u32 {
        let plain = message(
            Code::GET,
            20 + num as u16,
            &[],
            &[
                (OptionNumber::URI_PATH, b"big".to_vec()),
                (OptionNumber::BLOCK2, uint(num << 4 | 6)),
            ],
            b"",
        );
        let (outer, code, part, inner, _, _) = protected(&mut c, &s, to, &plain);
        assert_eq!((outer, code), (Code::CHANGED, Code::CONTENT), "block {num}");
        let p = Packet::new_checked(&inner[..]).unwrap();
        let b2 = p
            .option(OptionNumber::BLOCK2)
            .and_then(|o| mintgate_coap::wire::decode_uint(o.value))
            .expect("an inner Block2");
        assert_eq!(b2 >> 4, num);
        assert_eq!(b2 & 8 != 0, num < 3, "More on every block but the last");
        assert_eq!(part.len(), if num < 3 { 1024 } else { 3500 - 3072 });
        body.extend_from_slice(&part);
    }
    assert_eq!(body, BIG);
    gw.shutdown();
}

/// Outer block-wise (RFC 8613 4.1.3.4.2): an OSCORE message cut into
/// blocks outside its protection (as a proxy may) is put back together,
/// then verified once; the blocks before the last get plain 2.31s, the
/// last the protected answer with the outer Block1. A missing block makes
/// the transfer incomplete (4.08), never a decryption of a fragment.
#[test]
fn an_oscore_message_in_outer_blocks_is_verified_whole() {
    let d = dir("outer-blocks");
    let (gw, to) = start(config(&d));
    let s = socket();
    let mut c = client();
    let body: Vec<u8> = (0..2500u32).map(|i| (i * 7 % 251) as u8).collect();
    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
    let plain = message(
        Code::POST,
        1,
        &[],
        &[(OptionNumber::URI_PATH, b"big".to_vec())],
        &body,
    );
    let (whole, id) = c.protect_request(&plain).unwrap();
    let wp = Packet::new_checked(&whole[..]).unwrap();
    let outer_opts: Vec<(OptionNumber, Vec<u8>)> =
        wp.options().map(|o| (o.number, o.value.to_vec())).collect();
    let ciphertext = wp.payload().to_vec();
    assert!(ciphertext.len() > 2048);
    let blocks: Vec<&[u8]> = ciphertext.chunks(1024).collect();
    let cut = |num: usize, tag: &[u8]| {
        let more = num + 1 < blocks.len();
        let mut opts = outer_opts.clone();
        opts.push((
            OptionNumber::BLOCK1,
            uint((num as u32) << 4 | u32::from(more) << 3 | 6),
        ));
        opts.push((OptionNumber::REQUEST_TAG, tag.to_vec()));
        let mid = 100 + 16 * u16::from(tag[1]) + num as u16;
        message(Code::POST, mid, &[num as u8], &opts, blocks[num])
    };

    // a block that would end past MAX_UNFRAGMENTED_SIZE: 4.13 with the
    // size, nothing stored
    let mut far = outer_opts.clone();
    far.push((OptionNumber::BLOCK1, uint(4 << 4 | 1 << 3 | 6)));
    let (code, _) = plain_answer(&s, to, &message(Code::POST, 90, &[9], &far, blocks[0]));
    assert_eq!(code, Code::REQUEST_ENTITY_TOO_LARGE);
    // outer blocks of a context the gateway does not have: refused at
    // once (4.01), not stored
    let mut stranger = stranger();
    let (sm, _) = stranger.protect_request(&plain).unwrap();
    let sp = Packet::new_checked(&sm[..]).unwrap();
    let mut sopts: Vec<(OptionNumber, Vec<u8>)> =
        sp.options().map(|o| (o.number, o.value.to_vec())).collect();
    sopts.push((OptionNumber::BLOCK1, uint(1 << 3 | 6)));
    let (code, _) = plain_answer(
        &s,
        to,
        &message(Code::POST, 91, &[9], &sopts, &sp.payload()[..1024]),
    );
    assert_eq!(code, Code::UNAUTHORIZED);

    // block 1 missing: the last block finds the transfer incomplete
    let (code, _) = plain_answer(&s, to, &cut(0, b"t1"));
    assert_eq!(code, Code::CONTINUE);
    let (code, _) = plain_answer(&s, to, &cut(blocks.len() - 1, b"t1"));
    assert_eq!(code, Code::REQUEST_ENTITY_INCOMPLETE);

    // all blocks: 2.31, 2.31, then the protected answer
    for num in 0..blocks.len() - 1 {
        let (code, _) = plain_answer(&s, to, &cut(num, b"t2"));
        assert_eq!(code, Code::CONTINUE, "block {num}");
    }
    let answer = exchange(&s, to, &cut(blocks.len() - 1, b"t2"));
    let ap = Packet::new_checked(&answer[..]).unwrap();
    assert_eq!(ap.code(), Code::CHANGED);
    let b1 = ap
        .option(OptionNumber::BLOCK1)
        .and_then(|o| mintgate_coap::wire::decode_uint(o.value))
        .expect("the outer Block1 of the last block");
    assert_eq!((b1 >> 4) as usize, blocks.len() - 1);
    assert_eq!(b1 & 8, 0);
    let inner = c
        .unprotect_response(&answer, &id)
        .expect("the answer verifies");
    let ip = Packet::new_checked(&inner[..]).unwrap();
    assert_eq!(ip.code(), Code::CHANGED);
    assert_eq!(ip.payload(), format!("2500 {sum}").as_bytes());
    gw.shutdown();
}

/// A proxy of the test's own (RFC 8613 4.1.3.4.2 lets proxies do this)
/// between a client and the gateway: it forwards each protected request and
/// cuts the protected answer into outer Block2 blocks of 64 bytes, serving
/// the later blocks from what it kept when the same request comes again
/// with an outer Block2. Returns its address; it ends after `life`.
fn cutting_proxy(gateway: SocketAddr, life: Duration) -> SocketAddr {
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    front
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let addr = front.local_addr().unwrap();
    std::thread::spawn(move || {
        let back = socket();
        let end = Instant::now() + life;
        // the answer being served: code, options, protected payload
        let mut kept: Option<mintgate_coap::oscore::client::Inner> = None;
        let mut buf = [0u8; 2048];
        while Instant::now() < end {
            let Ok((n, client)) = front.recv_from(&mut buf) else {
                continue;
            };
            let req = Packet::new_checked(&buf[..n]).unwrap();
            let asked = req
                .option(OptionNumber::BLOCK2)
                .and_then(|o| mintgate_coap::wire::decode_uint(o.value))
                .map_or(0, |v| v >> 4);
            if asked == 0 {
                let answer = exchange(&back, gateway, &buf[..n]);
                let a = Packet::new_checked(&answer[..]).unwrap();
                kept = Some((
                    a.code(),
                    a.options().map(|o| (o.number, o.value.to_vec())).collect(),
                    a.payload().to_vec(),
                ));
            }
            let (code, opts, body) = kept.as_ref().unwrap();
            let start = (asked as usize * 64).min(body.len());
            let end_at = (start + 64).min(body.len());
            let more = end_at < body.len();
            let mut opts = opts.clone();
            opts.push((
                OptionNumber::BLOCK2,
                uint(asked << 4 | u32::from(more) << 3 | 2),
            ));
            opts.sort_by_key(|(n, _)| *n);
            let mut out = vec![0u8; 2048];
            let mut w = MessageWriter::new(
                &mut out,
                MessageType::Ack,
                *code,
                req.message_id(),
                req.token(),
            )
            .unwrap();
            for (n, v) in &opts {
                w.option(*n, v).unwrap();
            }
            w.payload(&body[start..end_at]).unwrap();
            let len = w.finish();
            front.send_to(&out[..len], client).unwrap();
        }
    });
    addr
}

/// The client side of outer blocks (RFC 8613 4.1.3.4.2): an answer that a
/// proxy cut into outer Block2 blocks is put back together by asking for
/// each block with the same protected request, and verified once whole;
/// here under inner blocks too (each inner block of `big` a protected
/// request, each of its answers in 17 outer blocks).
#[test]
fn a_client_puts_outer_blocks_together_before_it_verifies() {
    use mintgate_coap::client::blockwise::BlockConfig;
    use mintgate_coap::client::{ClientConfig, Request};
    use mintgate_coap::oscore::client::Sealer;
    use mintgate_coap::rto::{Basic, TransmissionParams};
    use mintgate_gateway::outbound::Outbound;

    let d = dir("outer-block2");
    let (gw, to) = start(config(&d));
    let proxy = cutting_proxy(to, Duration::from_secs(20));
    let p = TransmissionParams::default();
    let mut out = Outbound::new(
        false,
        ClientConfig::new(p),
        Box::new(Basic::new(p, 3)),
        3,
        BlockConfig::default(),
    )
    .unwrap();
    let mut c = client();
    let got = out
        .request_sealed(
            proxy,
            Request {
                confirmable: true,
                code: Code::GET,
                options: vec![(OptionNumber::URI_PATH, b"big".to_vec())],
                payload: Vec::new(),
            },
            &mut Sealer::new(&mut c),
            Instant::now() + Duration::from_secs(15),
        )
        .expect("the whole body, verified");
    assert_eq!(got.response.code, Code::CONTENT);
    assert!(got.response.payload[..] == BIG[..]);
    // every outer block is an exchange: each of the three full inner
    // blocks (1024 bytes and the protection) alone is 17 of 64 bytes
    assert!(
        out.stats().exchanges >= 3 * 17,
        "{} exchanges",
        out.stats().exchanges
    );
    gw.shutdown();
}
