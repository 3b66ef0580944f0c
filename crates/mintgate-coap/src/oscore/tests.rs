//! RFC 8613 Appendix C test vectors, and properties.

use proptest::prelude::*;

use super::context::{self, info};
use super::*;

fn h(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";
const SALT: &str = "9e7ca92223786340";
const ID_CTX: &str = "37cbf3210017a2d3";

fn params(salt: &str, sender: &str, recipient: &str, ctx: Option<&str>) -> Params {
    Params {
        master_secret: h(SECRET),
        master_salt: h(salt),
        sender_id: h(sender),
        recipient_id: h(recipient),
        id_context: ctx.map(h),
    }
}

fn check(p: &Params, sk: &str, rk: &str, iv: &str, snonce: &str, rnonce: &str) {
    let d = derive(p).unwrap();
    assert_eq!(d.sender_key.to_vec(), h(sk), "sender key");
    assert_eq!(d.recipient_key.to_vec(), h(rk), "recipient key");
    assert_eq!(d.common_iv.to_vec(), h(iv), "common IV");
    assert_eq!(nonce(&d.common_iv, &p.sender_id, &[0]).to_vec(), h(snonce));
    assert_eq!(
        nonce(&d.common_iv, &p.recipient_id, &[0]).to_vec(),
        h(rnonce)
    );
}

/// C.1: key derivation with Master Salt, client (C.1.1) and server (C.1.2).
#[test]
fn c1_key_derivation_with_master_salt() {
    assert_eq!(info(&[], None, "Key", 16), h("8540f60a634b657910"));
    assert_eq!(info(&[1], None, "Key", 16), h("854101f60a634b657910"));
    assert_eq!(info(&[], None, "IV", 13), h("8540f60a6249560d"));
    check(
        &params(SALT, "", "01", None),
        "f0910ed7295e6ad4b54fc793154302ff",
        "ffb14e093c94c9cac9471648b4f98710",
        "4622d4dd6d944168eefb54987c",
        "4622d4dd6d944168eefb54987c",
        "4722d4dd6d944169eefb54987c",
    );
    check(
        &params(SALT, "01", "", None),
        "ffb14e093c94c9cac9471648b4f98710",
        "f0910ed7295e6ad4b54fc793154302ff",
        "4622d4dd6d944168eefb54987c",
        "4722d4dd6d944169eefb54987c",
        "4622d4dd6d944168eefb54987c",
    );
}

/// C.2: key derivation without Master Salt (C.2.1 client, C.2.2 server).
#[test]
fn c2_key_derivation_without_master_salt() {
    assert_eq!(info(&[0], None, "Key", 16), h("854100f60a634b657910"));
    check(
        &params("", "00", "01", None),
        "321b26943253c7ffb6003b0b64d74041",
        "e57b5635815177cd679ab4bcec9d7dda",
        "be35ae297d2dace910c52e99f9",
        "bf35ae297d2dace910c52e99f9",
        "bf35ae297d2dace810c52e99f9",
    );
    check(
        &params("", "01", "00", None),
        "e57b5635815177cd679ab4bcec9d7dda",
        "321b26943253c7ffb6003b0b64d74041",
        "be35ae297d2dace910c52e99f9",
        "bf35ae297d2dace810c52e99f9",
        "bf35ae297d2dace910c52e99f9",
    );
}

/// C.3: key derivation with ID Context (C.3.1 client).
#[test]
fn c3_key_derivation_with_id_context() {
    check(
        &params(SALT, "", "01", Some(ID_CTX)),
        "af2a1300a5e95788b356336eeecd2b92",
        "e39a0c7c77b43f03b4b39ab9a268699f",
        "2ca58fb85ff1b81c0b7181b85e",
        "2ca58fb85ff1b81c0b7181b85e",
        "2da58fb85ff1b81d0b7181b85e",
    );
}

fn protect_at(p: &Params, seq: u64, plain: &str) -> (Vec<u8>, RequestId) {
    let mut c = Context::new(p).unwrap();
    c.set_sender_seq(seq);
    c.protect_request(&h(plain)).unwrap()
}

/// The server side of a vector: the request verifies back to `plain`.
fn server_opens(p: &Params, protected: &[u8], plain: &str) {
    let mut s = Context::new(p).unwrap();
    let u = s.unprotect_request(protected).unwrap();
    assert_eq!(u.message, h(plain));
    assert_eq!(s.unprotect_request(protected).unwrap_err(), Error::Replay);
}

/// C.4: request, key ID empty (client of C.1), sequence number 20.
#[test]
fn c4_protected_request() {
    assert_eq!(
        aad(&[], &[0x14]),
        h("8368456e63727970743040488501810a40411440")
    );
    let plain = "44015d1f00003974396c6f63616c686f737483747631";
    let (out, req) = protect_at(&params(SALT, "", "01", None), 20, plain);
    assert_eq!(
        out,
        h("44025d1f00003974396c6f63616c686f7374620914ff612f1092f1776f1c1668b3825e")
    );
    assert_eq!(req.nonce.to_vec(), h("4622d4dd6d944168eefb549868"));
    server_opens(&params(SALT, "01", "", None), &out, plain);
}

/// C.5: request with a non-empty key ID (client of C.2).
#[test]
fn c5_protected_request_with_kid() {
    let plain = "440171c30000b932396c6f63616c686f737483747631";
    let (out, _) = protect_at(&params("", "00", "01", None), 20, plain);
    assert_eq!(
        out,
        h("440271c30000b932396c6f63616c686f737463091400ff4ed339a5a379b0b8bc731fffb0")
    );
    server_opens(&params("", "01", "00", None), &out, plain);
}

/// C.6: request with a kid context (client of C.3).
#[test]
fn c6_protected_request_with_kid_context() {
    let plain = "44012f8eef9bbf7a396c6f63616c686f737483747631";
    let (out, _) = protect_at(&params(SALT, "", "01", Some(ID_CTX)), 20, plain);
    assert_eq!(
        out,
        h("44022f8eef9bbf7a396c6f63616c686f73746b19140837cbf3210017a2d3ff72cd7273fd331ac45cffbe55c3")
    );
    server_opens(&params(SALT, "01", "", Some(ID_CTX)), &out, plain);
}

fn c7_request() -> RequestId {
    let d = derive(&params(SALT, "01", "", None)).unwrap();
    RequestId {
        kid: vec![],
        piv: vec![0x14],
        nonce: nonce(&d.common_iv, &[], &[0x14]),
    }
}

/// C.7: response to C.4's request, reusing the request's nonce.
#[test]
fn c7_protected_response() {
    let plain = "64455d1f00003974ff48656c6c6f20576f726c6421";
    let mut s = Context::new(&params(SALT, "01", "", None)).unwrap();
    let out = s.protect_response(&h(plain), &c7_request(), false).unwrap();
    assert_eq!(
        out,
        h("64445d1f0000397490ffdbaad1e9a7e7b2a813d3c31524378303cdafae119106")
    );
    let c = Context::new(&params(SALT, "", "01", None)).unwrap();
    assert_eq!(c.unprotect_response(&out, &c7_request()).unwrap(), h(plain));
}

/// C.8: response with a Partial IV of its own (sequence number 0).
#[test]
fn c8_protected_response_with_partial_iv() {
    let plain = "64455d1f00003974ff48656c6c6f20576f726c6421";
    let mut s = Context::new(&params(SALT, "01", "", None)).unwrap();
    let out = s.protect_response(&h(plain), &c7_request(), true).unwrap();
    assert_eq!(
        out,
        h("64445d1f00003974920100ff4d4c13669384b67354b2b6175ff4b8658c666a6cf88e")
    );
    assert_eq!(s.sender_seq(), 1);
    let c = Context::new(&params(SALT, "", "01", None)).unwrap();
    assert_eq!(c.unprotect_response(&out, &c7_request()).unwrap(), h(plain));
}

#[test]
fn option_values() {
    for (v, piv, ctx, kid) in [
        ("", None, None, None),
        ("0914", Some("14"), None, Some("")),
        ("091400", Some("14"), None, Some("00")),
        ("19140837cbf3210017a2d3", Some("14"), Some(ID_CTX), Some("")),
        ("0100", Some("00"), None, None),
    ] {
        let b = h(v);
        let (piv, ctx, kid) = (piv.map(h), ctx.map(h), kid.map(h));
        let o = OscoreOption::decode(&b).unwrap();
        assert_eq!(o.partial_iv, piv.as_deref());
        assert_eq!(o.kid_context, ctx.as_deref());
        assert_eq!(o.kid, kid.as_deref());
        let mut e = Vec::new();
        o.encode(&mut e).unwrap();
        assert_eq!(e, b);
    }
    for bad in ["20", "06", "0a", "11", "1105", "02ff", "0001"] {
        assert_eq!(
            OscoreOption::decode(&h(bad)),
            Err(Error::BadOption),
            "{bad}"
        );
    }
}

#[test]
fn tampering_and_wrong_context_refused() {
    let plain = "44015d1f00003974396c6f63616c686f737483747631";
    let (mut out, _) = protect_at(&params(SALT, "", "01", None), 20, plain);
    let mut other = Context::new(&params(SALT, "01", "02", None)).unwrap();
    assert_eq!(
        other.unprotect_request(&out).unwrap_err(),
        Error::UnknownContext
    );
    let last = out.len() - 1;
    out[last] ^= 1;
    let mut s = Context::new(&params(SALT, "01", "", None)).unwrap();
    assert_eq!(s.unprotect_request(&out).unwrap_err(), Error::Decrypt);
    // a failed request does not advance the window: the genuine one passes
    out[last] ^= 1;
    assert!(s.unprotect_request(&out).is_ok());
}

#[test]
fn echo_recovery_after_a_lost_window() {
    let plain = "44015d1f00003974396c6f63616c686f737483747631";
    let mut c = Context::new(&params(SALT, "", "01", None)).unwrap();
    let mut s = Context::new(&params(SALT, "01", "", None)).unwrap();
    s.forget_replay_window();
    let (req, _) = c.protect_request(&h(plain)).unwrap();
    let Err(Error::EchoRequired(_)) = s.unprotect_request(&req) else {
        panic!("no Echo challenge");
    };
    let echo = s.echo_challenge();
    // the client repeats the request with the Echo value as an inner option
    let mut buf = [0u8; 64];
    let mut w = crate::wire::MessageWriter::new(
        &mut buf,
        crate::wire::MessageType::Con,
        crate::wire::Code::GET,
        2,
        &[1],
    )
    .unwrap();
    w.option(crate::wire::OptionNumber::URI_PATH, b"tv1")
        .unwrap();
    w.option(crate::wire::OptionNumber::ECHO, &echo).unwrap();
    let n = w.finish();
    let (again, _) = c.protect_request(&buf[..n]).unwrap();
    assert!(s.unprotect_request(&again).is_ok());
    // the first one is now below the window
    assert_eq!(s.unprotect_request(&req).unwrap_err(), Error::Replay);
}

struct Log(std::sync::Arc<std::sync::Mutex<Vec<u64>>>);
impl SeqStore for Log {
    fn persist(&mut self, limit: u64) -> std::io::Result<()> {
        self.0.lock().unwrap().push(limit);
        Ok(())
    }
}

#[test]
fn sequence_numbers_reserved_before_use() {
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut c = Context::new(&params(SALT, "", "01", None))
        .unwrap()
        .with_store(Box::new(Log(log.clone())), 7, 4);
    let plain = h("44015d1f00003974396c6f63616c686f737483747631");
    for _ in 0..5 {
        c.protect_request(&plain).unwrap();
    }
    // 7..11 reserved before 7 was used, 11..15 before 11
    assert_eq!(*log.lock().unwrap(), vec![11, 15]);
    assert_eq!(c.sender_seq(), 12);
    assert_eq!(context::partial_iv(0), ([0, 0, 0, 0, 0], 1));
    assert_eq!(context::partial_iv(0x0102), ([1, 2, 0, 0, 0], 2));
}

fn any_request() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..=8),
        1u8..=4,
        prop::collection::vec(
            (
                "[a-z]{0,12}",
                prop::sample::select(vec![3u16, 11, 12, 15, 17, 252, 292]),
            ),
            0..5,
        ),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(con, token, code, mut opts, payload)| {
            opts.sort_by_key(|(_, n)| *n);
            let mut buf = vec![0u8; 1024];
            let ty = if con {
                crate::wire::MessageType::Con
            } else {
                crate::wire::MessageType::Non
            };
            let mut w =
                crate::wire::MessageWriter::new(&mut buf, ty, crate::wire::Code(code), 7, &token)
                    .unwrap();
            for (v, n) in &opts {
                w.option(crate::wire::OptionNumber(*n), v.as_bytes())
                    .unwrap();
            }
            if !payload.is_empty() {
                w.payload(&payload).unwrap();
            }
            let n = w.finish();
            buf.truncate(n);
            buf
        })
}

proptest! {
    /// protect then unprotect gives the request back, and the response to
    /// it comes back too.
    #[test]
    fn round_trip(req in any_request(), seq in 0u64..(1 << 40), ctx in any::<bool>(), fresh in any::<bool>()) {
        let id_ctx = ctx.then_some(ID_CTX);
        let mut c = Context::new(&params(SALT, "0a0b", "", id_ctx)).unwrap();
        let mut s = Context::new(&params(SALT, "", "0a0b", id_ctx)).unwrap();
        c.set_sender_seq(seq);
        let (out, id) = c.protect_request(&req).unwrap();
        let u = s.unprotect_request(&out).unwrap();
        prop_assert_eq!(&u.message, &req);
        prop_assert_eq!(&u.request, &id);
        let resp = s.protect_response(&req, &u.request, fresh).unwrap();
        prop_assert_eq!(c.unprotect_response(&resp, &id).unwrap(), req);
    }

    /// Hostile bytes never panic, and never verify.
    #[test]
    fn garbage_refused(b in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut s = Context::new(&params(SALT, "01", "", None)).unwrap();
        prop_assert!(s.unprotect_request(&b).is_err());
    }
}

/// A GET with `Observe: 0` and token `t`, or a 2.05 notification with
/// `Observe: obs` and `payload` when `obs` is given.
fn observe_msg(t: &[u8], obs: Option<u32>, payload: &[u8]) -> Vec<u8> {
    use crate::wire::{Code, MessageType, MessageWriter, OptionNumber};
    let mut buf = vec![0u8; 256];
    let code = if obs.is_some() {
        Code::CONTENT
    } else {
        Code::GET
    };
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, 9, t).unwrap();
    w.option_uint(OptionNumber::OBSERVE, obs.unwrap_or(0))
        .unwrap();
    if obs.is_none() {
        w.option(OptionNumber::URI_PATH, b"temp").unwrap();
    }
    if !payload.is_empty() {
        w.payload(payload).unwrap();
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

/// RFC 8613 4.1.3.5 and 7.4.1: the registration keeps its Observe inside
/// and out; the first answer reuses the request's nonce, each later
/// notification has a Partial IV of the server's own; the client takes them
/// in order only, and neither a replayed nor an older one.
#[test]
fn observe_notifications_verify_in_order_and_replays_are_refused() {
    use crate::wire::{OptionNumber, Packet};
    let mut c = Context::new(&params(SALT, "0a", "01", None)).unwrap();
    let mut s = Context::new(&params(SALT, "01", "0a", None)).unwrap();
    s.set_sender_seq(40);
    let (reg, id) = c.protect_request(&observe_msg(b"tk", None, b"")).unwrap();
    let outer = Packet::new_checked(&reg[..]).unwrap();
    assert_eq!(outer.code(), crate::wire::Code::FETCH);
    assert_eq!(outer.option(OptionNumber::OBSERVE).unwrap().uint(), Some(0));
    let u = s.unprotect_request(&reg).unwrap();
    let inner = Packet::new_checked(&u.message[..]).unwrap();
    assert_eq!(
        inner.option(OptionNumber::OBSERVE).and_then(|o| o.uint()),
        Some(0),
        "the server sees the registration"
    );
    let mut seen = Notifications::default();
    let first = s
        .protect_response(&observe_msg(b"tk", Some(1), b"20.5"), &u.request, false)
        .unwrap();
    assert_eq!(s.sender_seq(), 40, "the first answer used no number");
    let mut notes = Vec::new();
    for (i, v) in ["20.6", "20.7", "20.8"].iter().enumerate() {
        let n = s
            .protect_response(
                &observe_msg(b"tk", Some(2 + i as u32), v.as_bytes()),
                &u.request,
                true,
            )
            .unwrap();
        let p = Packet::new_checked(&n[..]).unwrap();
        assert_eq!(p.code(), crate::wire::Code::CONTENT);
        assert_eq!(
            p.option(OptionNumber::OBSERVE).unwrap().uint(),
            Some(2 + i as u32),
            "the outer Observe carries the number"
        );
        let o = option_of(&p).unwrap().unwrap();
        assert_eq!(o.partial_iv, Some(&[40 + i as u8][..]));
        notes.push(n);
    }
    let m = c.unprotect_notification(&first, &id, &mut seen).unwrap();
    let p = Packet::new_checked(&m[..]).unwrap();
    assert_eq!(p.payload(), b"20.5");
    assert_eq!(seen.number(), None);
    // a copy of the first answer later is a replay
    let m = c.unprotect_notification(&notes[0], &id, &mut seen).unwrap();
    let p = Packet::new_checked(&m[..]).unwrap();
    assert_eq!(p.payload(), b"20.6");
    assert_eq!(
        p.option(OptionNumber::OBSERVE).map(|o| o.value.len()),
        Some(0),
        "the inner Observe is empty"
    );
    assert_eq!(
        c.unprotect_notification(&first, &id, &mut seen),
        Err(Error::Replay)
    );
    assert_eq!(
        c.unprotect_notification(&notes[2], &id, &mut seen)
            .map(|m| Packet::new_checked(&m[..]).unwrap().payload().to_vec()),
        Ok(b"20.8".to_vec())
    );
    // older and replayed ones are refused, after they verified
    assert_eq!(
        c.unprotect_notification(&notes[1], &id, &mut seen),
        Err(Error::Replay)
    );
    assert_eq!(
        c.unprotect_notification(&notes[2], &id, &mut seen),
        Err(Error::Replay)
    );
    assert_eq!(seen.number(), Some(42));
    // a notification bound to another registration does not verify
    let (_, other) = c.protect_request(&observe_msg(b"tk", None, b"")).unwrap();
    let n = s
        .protect_response(&observe_msg(b"tk", Some(9), b"x"), &u.request, true)
        .unwrap();
    assert_eq!(
        c.unprotect_notification(&n, &other, &mut Notifications::default()),
        Err(Error::Decrypt)
    );
}

proptest! {
    /// Notifications arriving in any order, some twice: the client delivers
    /// exactly those whose Partial IV is above every one delivered before.
    #[test]
    fn notifications_are_delivered_in_increasing_order_only(
        order in prop::collection::vec(0usize..12, 1..40),
    ) {
        let mut c = Context::new(&params(SALT, "0a", "01", None)).unwrap();
        let mut s = Context::new(&params(SALT, "01", "0a", None)).unwrap();
        let (reg, id) = c.protect_request(&observe_msg(b"t", None, b"")).unwrap();
        let u = s.unprotect_request(&reg).unwrap();
        let notes: Vec<Vec<u8>> = (0..12u32)
            .map(|i| s.protect_response(&observe_msg(b"t", Some(i + 2), &[i as u8]), &u.request, true).unwrap())
            .collect();
        let mut seen = Notifications::default();
        let mut last: Option<usize> = None;
        for i in order {
            let got = c.unprotect_notification(&notes[i], &id, &mut seen);
            if last.is_none_or(|l| i > l) {
                let m = got.unwrap();
                let p = crate::wire::Packet::new_checked(&m[..]).unwrap();
                prop_assert_eq!(p.payload(), &[i as u8][..]);
                last = Some(i);
            } else {
                prop_assert_eq!(got, Err(Error::Replay));
            }
        }
    }
}

/// The client's sealer opens the answer to the request it sealed last,
/// and nothing else: not an answer bound to an earlier request, not one
/// before anything was sealed.
#[test]
fn a_sealer_opens_only_the_answer_to_its_last_request() {
    use crate::client::Request;
    use crate::wire::{Code, MessageType, MessageWriter, OptionNumber};
    let mut c = Context::new(&params(SALT, "", "01", None)).unwrap();
    let mut s = Context::new(&params(SALT, "01", "", None)).unwrap();
    let mut sealer = client::Sealer::new(&mut c);
    assert_eq!(
        sealer.open(Code::CHANGED, &[], b"").unwrap_err(),
        Error::Malformed
    );
    let get = |block: u32| Request {
        confirmable: true,
        code: Code::GET,
        options: vec![
            (OptionNumber::URI_PATH, b"big".to_vec()),
            (OptionNumber::BLOCK2, vec![(block << 4 | 6) as u8]),
        ],
        payload: Vec::new(),
    };
    let mut answer_to = |outer: &Request, body: &[u8]| {
        let mut b = vec![0u8; 256];
        let mut w = MessageWriter::new(&mut b, MessageType::Con, outer.code, 1, &[]).unwrap();
        for (n, v) in &outer.options {
            w.option(*n, v).unwrap();
        }
        w.payload(&outer.payload).unwrap();
        let n = w.finish();
        let u = s.unprotect_request(&b[..n]).unwrap();
        let inner = crate::wire::Packet::new_checked(&u.message[..]).unwrap();
        assert_eq!(inner.code(), Code::GET);
        assert!(inner.option(OptionNumber::BLOCK2).is_some(), "inner Block2");
        let mut r = vec![0u8; 256];
        let mut w = MessageWriter::new(&mut r, MessageType::Ack, Code::CONTENT, 1, &[]).unwrap();
        w.payload(body).unwrap();
        let n = w.finish();
        let p = s.protect_response(&r[..n], &u.request, false).unwrap();
        let pp = crate::wire::Packet::new_checked(&p[..]).unwrap();
        let opts: Vec<(OptionNumber, Vec<u8>)> =
            pp.options().map(|o| (o.number, o.value.to_vec())).collect();
        (pp.code(), opts, pp.payload().to_vec())
    };
    let first = sealer.seal(&get(0)).unwrap();
    assert!(
        first
            .options
            .iter()
            .all(|(n, _)| *n != OptionNumber::BLOCK2),
        "Block2 goes inside"
    );
    let (code, opts, payload) = answer_to(&first, b"block 0");
    let second = sealer.seal(&get(1)).unwrap();
    let (code2, opts2, payload2) = answer_to(&second, b"block 1");
    let o1: Vec<(OptionNumber, &[u8])> = opts.iter().map(|(n, v)| (*n, &v[..])).collect();
    let o2: Vec<(OptionNumber, &[u8])> = opts2.iter().map(|(n, v)| (*n, &v[..])).collect();
    // the first answer is bound to the first request's nonce: refused now
    assert_eq!(
        sealer.open(code, &o1, &payload).unwrap_err(),
        Error::Decrypt
    );
    let (c2, _, p2) = sealer.open(code2, &o2, &payload2).unwrap();
    assert_eq!((c2, p2.as_slice()), (Code::CONTENT, &b"block 1"[..]));
}

/// Outer blocks of an answer are taken only in order and only up to
/// MAX_UNFRAGMENTED_SIZE; the request for the next block is the protected
/// request again with the next outer Block2.
#[test]
fn outer_blocks_come_in_order_and_bounded() {
    use crate::client::{Event, ExchangeId, Request};
    use crate::wire::{Code, MessageType, OptionNumber};
    use bytes::Bytes;
    let sent = Request {
        confirmable: true,
        code: Code::POST,
        options: vec![(OSCORE, vec![0x09, 0x01])],
        payload: b"ciphertext".to_vec(),
    };
    // ExchangeId has no public constructor: take one from a real exchange
    let mut cl = crate::client::Client::new(
        crate::client::ClientConfig::new(crate::rto::TransmissionParams::default()),
        Box::new(crate::rto::Basic::new(
            crate::rto::TransmissionParams::default(),
            1,
        )),
        1,
    );
    let id: ExchangeId = cl
        .request(
            std::time::Instant::now(),
            "127.0.0.1:5683".parse().unwrap(),
            sent.clone(),
        )
        .unwrap();
    let block = |num: u32, more: bool, len: usize| Event::Response {
        id,
        code: Code::CHANGED,
        msg_type: MessageType::Ack,
        options: vec![
            (OSCORE, Bytes::new()),
            (
                OptionNumber::BLOCK2,
                Bytes::from(
                    crate::wire::encode_uint(num << 4 | u32::from(more) << 3 | 2, &mut [0; 4])
                        .to_vec(),
                ),
            ),
        ],
        payload: Bytes::from(vec![7u8; len]),
        rtt: std::time::Duration::ZERO,
        retransmissions: 0,
    };
    let mut ob = client::OuterBlocks::default();
    match ob.on_event(&sent, block(0, true, 64)).unwrap() {
        client::Outer::Next(r) => {
            assert_eq!(r.payload, sent.payload, "the same protected request");
            assert!(r
                .options
                .iter()
                .any(|(n, v)| *n == OptionNumber::BLOCK2 && v == &vec![0x12]));
        }
        other => panic!("{other:?}"),
    }
    // block 2 before block 1: refused
    assert!(ob.on_event(&sent, block(2, true, 64)).is_err());
    // in order, the last one makes the whole answer without Block2
    let mut ob = client::OuterBlocks::default();
    let _ = ob.on_event(&sent, block(0, true, 64)).unwrap();
    match ob.on_event(&sent, block(1, false, 10)).unwrap() {
        client::Outer::Whole(Event::Response {
            options, payload, ..
        }) => {
            assert_eq!(payload.len(), 74);
            assert!(options.iter().all(|(n, _)| *n != OptionNumber::BLOCK2));
        }
        other => panic!("{other:?}"),
    }
    // beyond MAX_UNFRAGMENTED_SIZE: refused
    let mut ob = client::OuterBlocks::default();
    let mut refused = false;
    for num in 0..(client::MAX_UNFRAGMENTED_SIZE / 64 + 2) as u32 {
        if ob.on_event(&sent, block(num, true, 64)).is_err() {
            refused = true;
            assert_eq!(num as usize, client::MAX_UNFRAGMENTED_SIZE / 64);
            break;
        }
    }
    assert!(refused);
}
