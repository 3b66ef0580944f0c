use std::net::SocketAddr;

use mintgate_buf::{Layer, PartitionConfig, Pool};

use super::*;
use crate::wire::{MessageWriter, Packet};

fn pool() -> Pool {
    Pool::new(&[
        PartitionConfig {
            block_size: 128,
            blocks: 64,
        },
        PartitionConfig {
            block_size: 1280,
            blocks: 16,
        },
    ])
}

fn router() -> Router {
    let mut r = Router::new();
    r.add(
        Resource::new("request")
            .get(|_, rb| {
                rb.content_format(ContentFormat::TEXT_PLAIN)
                    .static_payload(b"hello world");
            })
            .attr("rt", "mintgate.hello")
            .attr("ct", "0"),
    )
    .unwrap();
    r.add(
        Resource::new("/sensors/temp")
            .get(|_, rb| {
                rb.write(b"21.5");
            })
            .put(|req, rb| {
                rb.set_code(Code::CHANGED);
                rb.write(req.payload());
            })
            .accepts(&[ContentFormat::TEXT_PLAIN])
            .etag(|| Some(vec![0x21, 0x05]))
            .attr("rt", "temperature-c")
            .flag("obs"),
    )
    .unwrap();
    r
}

fn req(
    ty: MessageType,
    code: Code,
    mid: u16,
    token: &[u8],
    path: &str,
    extra: &[(u16, &[u8])],
    payload: &[u8],
) -> Vec<u8> {
    let mut buf = vec![0u8; 512];
    let mut w = MessageWriter::new(&mut buf, ty, code, mid, token).unwrap();
    let mut opts: Vec<(u16, Vec<u8>)> = extra.iter().map(|(n, v)| (*n, v.to_vec())).collect();
    for seg in path
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
    {
        opts.push((11, seg.as_bytes().to_vec()));
    }
    opts.sort_by_key(|o| o.0);
    for (n, v) in &opts {
        w.option(OptionNumber(*n), v).unwrap();
    }
    w.payload(payload).unwrap();
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn peer() -> SocketAddr {
    "[::1]:40000".parse().unwrap()
}

fn answer(dgram: &[u8]) -> Option<Vec<u8>> {
    let p = match classify(dgram) {
        Inbound::Request(p) => p,
        other => panic!("not a request: {other:?}"),
    };
    let r = Request {
        peer: peer(),
        packet: &p,
        identity: None,
    };
    match handle_request(&router(), &pool(), &r, 0x7777, DEFAULT_MAX_PAYLOAD) {
        Answer::Send(o) => Some(o.to_vec()),
        Answer::Silent => None,
        Answer::Exhausted => panic!("exhausted"),
    }
}

#[test]
fn con_get_is_piggybacked_with_same_mid_and_token() {
    let out = answer(&req(
        MessageType::Con,
        Code::GET,
        0x1234,
        b"ab",
        "/request",
        &[],
        b"",
    ))
    .unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(p.msg_type(), MessageType::Ack);
    assert_eq!(p.message_id(), 0x1234);
    assert_eq!(p.token(), b"ab");
    assert_eq!(p.code(), Code::CONTENT);
    assert_eq!(p.payload(), b"hello world");
    assert_eq!(
        p.option(OptionNumber::CONTENT_FORMAT).unwrap().value,
        &[] as &[u8]
    );
}

#[test]
fn if_match_and_if_none_match_are_preconditions() {
    let put = |conds: &[(u16, &[u8])]| {
        let out = answer(&req(
            MessageType::Con,
            Code::PUT,
            7,
            b"t",
            "/sensors/temp",
            conds,
            b"22",
        ))
        .unwrap();
        let p = Packet::new_checked(&out[..]).unwrap();
        (p.code(), p.payload().to_vec())
    };
    let changed = (Code::CHANGED, b"22".to_vec());
    let failed = (Code::PRECONDITION_FAILED, Vec::new());
    assert_eq!(put(&[]), changed);
    // the current tag, any tag (empty), one of several
    assert_eq!(put(&[(1, &[0x21, 0x05])]), changed);
    assert_eq!(put(&[(1, &[])]), changed);
    assert_eq!(put(&[(1, &[0xde, 0xad]), (1, &[0x21, 0x05])]), changed);
    // a stale tag: 4.12 and the handler does not run
    assert_eq!(put(&[(1, &[0xde, 0xad])]), failed);
    // only if it does not exist: it does
    assert_eq!(put(&[(5, &[])]), failed);
    // a resource without a tag: no named tag is current
    let out = answer(&req(
        MessageType::Con,
        Code::GET,
        8,
        b"t",
        "/request",
        &[(1, &[1])],
        b"",
    ))
    .unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(p.code(), Code::PRECONDITION_FAILED);
}

#[test]
fn accept_outside_a_resources_ct_is_not_acceptable() {
    let get = |path: &str, accept: Option<u8>| {
        let a = accept.map(|a| [a]);
        let extra: Vec<(u16, &[u8])> = a.iter().map(|a| (17u16, &a[..])).collect();
        let out = answer(&req(
            MessageType::Con,
            Code::GET,
            9,
            b"t",
            path,
            &extra,
            b"",
        ))
        .unwrap();
        Packet::new_checked(&out[..]).unwrap().code()
    };
    // /request lists ct=0
    assert_eq!(get("/request", None), Code::CONTENT);
    assert_eq!(get("/request", Some(0)), Code::CONTENT);
    assert_eq!(get("/request", Some(60)), Code::NOT_ACCEPTABLE);
    // no ct attribute: the handler decides
    assert_eq!(get("/sensors/temp", Some(60)), Code::CONTENT);
    // /.well-known/core is link-format (40)
    assert_eq!(get("/.well-known/core", Some(40)), Code::CONTENT);
    assert_eq!(get("/.well-known/core", Some(50)), Code::NOT_ACCEPTABLE);
}

#[test]
fn well_known_core_goes_block_wise_when_asked() {
    // Block2 num 0, szx 0: 16-byte blocks
    let out = answer(&req(
        MessageType::Con,
        Code::GET,
        10,
        b"t",
        "/.well-known/core",
        &[(23, &[0x00])],
        b"",
    ))
    .unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(p.code(), Code::CONTENT);
    assert_eq!(p.payload().len(), 16);
    let b2 = p
        .option(OptionNumber::BLOCK2)
        .and_then(|o| o.uint())
        .unwrap();
    assert_eq!(b2 & 0x08, 0x08, "more blocks follow");
}

#[test]
fn non_get_gets_non_response_with_fresh_mid() {
    let out = answer(&req(
        MessageType::Non,
        Code::GET,
        0x1234,
        b"t",
        "/sensors/temp",
        &[],
        b"",
    ))
    .unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(p.msg_type(), MessageType::Non);
    assert_eq!(p.message_id(), 0x7777);
    assert_eq!(p.payload(), b"21.5");
}

#[test]
fn error_codes_where_they_belong() {
    let code = |d: Vec<u8>| {
        Packet::new_checked(&answer(&d).unwrap()[..])
            .unwrap()
            .code()
    };
    assert_eq!(
        code(req(MessageType::Con, Code::GET, 1, b"", "/nope", &[], b"")),
        Code::NOT_FOUND
    );
    assert_eq!(
        code(req(
            MessageType::Con,
            Code::POST,
            1,
            b"",
            "/request",
            &[],
            b"x"
        )),
        Code::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        code(req(
            MessageType::Con,
            Code::FETCH,
            1,
            b"",
            "/request",
            &[],
            b""
        )),
        Code::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        code(req(
            MessageType::Con,
            Code::PUT,
            1,
            b"",
            "/sensors/temp",
            &[(12, &[50])],
            b"{}"
        )),
        Code::UNSUPPORTED_CONTENT_FORMAT
    );
    assert_eq!(
        code(req(
            MessageType::Con,
            Code::PUT,
            1,
            b"",
            "/sensors/temp",
            &[(12, &[])],
            b"22"
        )),
        Code::CHANGED
    );
    assert_eq!(
        code(req(
            MessageType::Con,
            Code::GET,
            1,
            b"",
            "/request",
            &[(35, b"coap://x/")],
            b""
        )),
        Code::PROXYING_NOT_SUPPORTED
    );
    assert_eq!(
        code(req(
            MessageType::Con,
            Code::POST,
            1,
            b"",
            "/.well-known/core",
            &[],
            b""
        )),
        Code::METHOD_NOT_ALLOWED
    );
}

#[test]
fn unrecognized_critical_option_is_402_for_con_and_silence_for_non() {
    let d = req(
        MessageType::Con,
        Code::GET,
        1,
        b"",
        "/request",
        &[(9, b"x")],
        b"",
    );
    let out = answer(&d).unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(p.code(), Code::BAD_OPTION);
    assert!(std::str::from_utf8(p.payload()).unwrap().contains('9'));
    let d = req(
        MessageType::Non,
        Code::GET,
        1,
        b"",
        "/request",
        &[(9, b"x")],
        b"",
    );
    assert!(answer(&d).is_none());
    // critical option with a length outside its range is unrecognized too
    let d = req(
        MessageType::Con,
        Code::GET,
        1,
        b"",
        "/request",
        &[(7, b"123")],
        b"",
    );
    assert_eq!(
        Packet::new_checked(&answer(&d).unwrap()[..])
            .unwrap()
            .code(),
        Code::BAD_OPTION
    );
    // an unknown elective option is ignored
    let d = req(
        MessageType::Con,
        Code::GET,
        1,
        b"",
        "/request",
        &[(2, b"x")],
        b"",
    );
    assert_eq!(
        Packet::new_checked(&answer(&d).unwrap()[..])
            .unwrap()
            .code(),
        Code::CONTENT
    );
}

#[test]
fn well_known_core_lists_and_filters() {
    let out = answer(&req(
        MessageType::Con,
        Code::GET,
        1,
        b"",
        "/.well-known/core",
        &[],
        b"",
    ))
    .unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(
        p.option(OptionNumber::CONTENT_FORMAT).unwrap().uint(),
        Some(40)
    );
    let doc = std::str::from_utf8(p.payload()).unwrap();
    assert_eq!(
        doc,
        "</request>;rt=\"mintgate.hello\";ct=0,</sensors/temp>;rt=\"temperature-c\";obs"
    );
    let out = answer(&req(
        MessageType::Con,
        Code::GET,
        1,
        b"",
        "/.well-known/core",
        &[(15, b"rt=temp*")],
        b"",
    ))
    .unwrap();
    let p = Packet::new_checked(&out[..]).unwrap();
    assert_eq!(p.payload(), b"</sensors/temp>;rt=\"temperature-c\";obs");
}

#[test]
fn classify_message_layer_rules() {
    // too short and unknown version: silence
    assert!(matches!(
        classify(&[0x40, 1]),
        Inbound::Drop(DropReason::Unreadable)
    ));
    assert!(matches!(
        classify(&[0x80, 1, 0, 1]),
        Inbound::Drop(DropReason::Unreadable)
    ));
    // malformed CON (token length 9): Reset with its MID
    match classify(&[0x49, 1, 0xAB, 0xCD, 0, 0, 0, 0, 0, 0, 0, 0, 0]) {
        Inbound::Reset(r, ResetReason::FormatError(_)) => {
            let p = Packet::new_checked(&r[..]).unwrap();
            assert_eq!((p.msg_type(), p.message_id()), (MessageType::Rst, 0xABCD));
        }
        other => panic!("{other:?}"),
    }
    // malformed NON: silence
    assert!(matches!(
        classify(&[0x59, 1, 0, 1]),
        Inbound::Drop(DropReason::FormatError)
    ));
    // payload marker with no payload
    assert!(matches!(
        classify(&[0x40, 1, 0, 1, 0xFF]),
        Inbound::Reset(_, ResetReason::FormatError(ParseError::EmptyPayload))
    ));
    // ping
    assert!(matches!(
        classify(&[0x40, 0, 0, 9]),
        Inbound::Reset(_, ResetReason::Ping)
    ));
    // empty ACK / RST
    assert!(matches!(classify(&[0x60, 0, 0, 9]), Inbound::Ack(9)));
    assert!(matches!(classify(&[0x70, 0, 0, 9]), Inbound::PeerReset(9)));
    // empty NON is misplaced
    assert!(matches!(
        classify(&[0x50, 0, 0, 9]),
        Inbound::Drop(DropReason::Misplaced)
    ));
    // a CON response at the server is rejected with a Reset
    assert!(matches!(
        classify(&[0x40, 0x45, 0, 9]),
        Inbound::Reset(_, ResetReason::UnexpectedResponse)
    ));
    // reserved class 7
    assert!(matches!(
        classify(&[0x40, 0xE0, 0, 9]),
        Inbound::Reset(_, ResetReason::FormatError(ParseError::ReservedCode(_)))
    ));
}

#[test]
fn static_payload_is_sent_by_reference_and_inline_payload_is_copied_once() {
    let pool = pool();
    let d = req(MessageType::Con, Code::GET, 1, b"", "/request", &[], b"");
    let p = Packet::new_checked(&d[..]).unwrap();
    let r = Request {
        peer: peer(),
        packet: &p,
        identity: None,
    };
    let before = pool.accounting().total();
    let Answer::Send(o) = handle_request(&router(), &pool, &r, 0, DEFAULT_MAX_PAYLOAD) else {
        panic!()
    };
    assert!(matches!(o.tail, Tail::Static(_)));
    let acc = pool.accounting().total().since(&before);
    assert_eq!(
        acc.copy_bytes, 0,
        "static payload sent by reference, head encoded in place"
    );
    assert_eq!(acc.allocs, 1, "only the head block");
    drop(o);
    // inline: the payload is written once, the head prepended in front of it
    let d = req(
        MessageType::Con,
        Code::GET,
        1,
        b"",
        "/sensors/temp",
        &[],
        b"",
    );
    let p = Packet::new_checked(&d[..]).unwrap();
    let r = Request {
        peer: peer(),
        packet: &p,
        identity: None,
    };
    let before = pool.accounting().total();
    let Answer::Send(o) = handle_request(&router(), &pool, &r, 0, DEFAULT_MAX_PAYLOAD) else {
        panic!()
    };
    assert!(matches!(o.tail, Tail::None));
    let acc = pool.accounting().total().since(&before);
    let wire = o.to_vec();
    let plen = Packet::new_checked(&wire[..]).unwrap().payload().len();
    assert!(plen > 0);
    assert_eq!(
        acc.copy_bytes as usize, plen,
        "payload written once, head encoded in place"
    );
    assert_eq!(acc.allocs, 1);
    drop(o);
    assert_eq!(pool.outstanding(), 0);
    let _ = Layer::Handler;
}

#[test]
fn a_head_larger_than_the_headroom_goes_to_its_own_block() {
    let pool = pool();
    let mut rb = ResponseBuilder::in_pool(&pool, 100);
    rb.write(b"payload");
    for _ in 0..4 {
        rb.option(OptionNumber::LOCATION_PATH, &[b'a'; 30]);
    }
    let o = rb.finish(MessageType::Ack, 5, b"12345678").unwrap();
    assert!(matches!(o.tail, Tail::Shared(_)));
    let v = o.to_vec();
    let p = Packet::new_checked(&v[..]).unwrap();
    assert_eq!(p.payload(), b"payload");
    assert_eq!(p.options().count(), 4);
}

#[test]
fn exhausted_pool_sheds() {
    let pool = Pool::new(&[PartitionConfig {
        block_size: 1280,
        blocks: 1,
    }]);
    let _hold = pool.alloc(Layer::Other, 1, 0).unwrap();
    let d = req(MessageType::Con, Code::GET, 1, b"", "/request", &[], b"");
    let p = Packet::new_checked(&d[..]).unwrap();
    let r = Request {
        peer: peer(),
        packet: &p,
        identity: None,
    };
    assert!(matches!(
        handle_request(&router(), &pool, &r, 0, DEFAULT_MAX_PAYLOAD),
        Answer::Exhausted
    ));
}

#[test]
fn payload_grows_into_a_larger_block_up_to_the_limit() {
    let pool = pool();
    let mut rb = ResponseBuilder::in_pool(&pool, 0).with_limit(1000);
    rb.write(&[b'x'; 10]);
    rb.write(&[b'y'; 500]);
    assert!(!rb.overflowed());
    assert_eq!(rb.payload().len(), 510);
    rb.write(&[b'z'; 600]);
    assert!(rb.overflowed());
    let o = rb.finish(MessageType::Ack, 1, b"");
    assert!(o.is_err());
    let mut rb = ResponseBuilder::in_pool(&pool, 0).with_limit(1000);
    rb.write(&[b'q'; 700]);
    let v = rb.finish(MessageType::Ack, 1, b"").unwrap().to_vec();
    assert_eq!(Packet::new_checked(&v[..]).unwrap().payload().len(), 700);
}

/// Found by the link_format fuzz target: a value ending in a backslash
/// escaped the closing quote and ran into the next attribute.
#[test]
fn link_format_escapes_backslashes_and_quotes() {
    let mut r = Router::new();
    r.add(Resource::new("a").attr("title", "x\\").attr("rt", "q\"r"))
        .unwrap();
    r.add(Resource::new("b").attr("title", "plain")).unwrap();
    assert_eq!(
        r.well_known_core(None),
        "</a>;title=\"x\\\\\";rt=\"q\\\"r\",</b>;title=\"plain\""
    );
}
