//! The proxy's HTTP -> CoAP request mapping (RFC 8075): the request
//! target (`resolve_target`, the `/hc/coap://...` form and reverse
//! mappings, `CoapTarget::parse`) and method, headers and body
//! (`map_request`), all from the input.
//!
//! Checked: a resolved target writes back (`CoapTarget::uri`) to a URI
//! that parses to the same target; a mapped request has only options the
//! mapping may add, each within its RFC 7252 length, and encodes as a CoAP
//! message that parses back with the same options and payload; the
//! request facts agree with the method; every refusal is a 4xx/5xx.
//! A request with the OSCORE header field (RFC 8613 section 11) carries
//! the OSCORE option and the body, and is never cached.
#![no_main]

use libfuzzer_sys::arbitrary::{Result as UResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_proxy::http::header::HOST;
use mintgate_proxy::http::{HeaderMap, HeaderValue, Method};
use mintgate_proxy::mapping::{
    map_request, resolve_target, CoapTarget, ReverseMapping, Via, MAPPED_REQUEST_HEADERS,
    OSCORE_OPTION,
};

const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "FETCH",
];

/// Text that is mostly URI characters, with a fair share of `%`, `/`, `?`.
fn uri_text(u: &mut Unstructured<'_>, max: usize) -> UResult<String> {
    let n = u.int_in_range(0..=max)?;
    let mut s = String::new();
    for _ in 0..n {
        let c = match u.int_in_range(0u8..=15)? {
            0 => '%',
            1 => '/',
            2 => '?',
            3 => '&',
            4 => ':',
            5 | 6 => *u.choose(b"0123456789abcdefABCDEF")? as char,
            7 => char::from_u32(u.int_in_range(0x80u32..=0x10FF)?).unwrap_or('?'),
            _ => u.int_in_range(0x21u8..=0x7e)? as char,
        };
        s.push(c);
    }
    Ok(s)
}

fn header_value(u: &mut Unstructured<'_>, name: &str) -> UResult<Vec<u8>> {
    let canned: &[&str] = match name {
        "content-type" => &[
            "text/plain",
            "application/json",
            "application/cbor; x=1",
            "text/plain;charset=utf-8",
            "application/oscore",
        ],
        "oscore" => &["CSU", "AA", "C+U", "CQ", "_-_-"],
        "accept" => &[
            "application/json;q=0.5, text/plain",
            "*/*",
            "text/*;q=0",
            "application/link-format",
        ],
        "if-match" | "if-none-match" => {
            &["*", "\"0a0b\"", "W/\"01\", \"0102030405060708\"", "\"zz\""]
        }
        "cache-control" => &["no-cache", "max-age=0", "no-store, private"],
        _ => &["no-cache"],
    };
    if u.arbitrary()? {
        let mut v = u.choose(canned)?.as_bytes().to_vec();
        if u.arbitrary()? {
            let n = u.int_in_range(0..=12)?;
            v.extend_from_slice(u.bytes(n)?);
        }
        Ok(v)
    } else {
        let n = u.int_in_range(0..=40)?;
        Ok(u.bytes(n)?.to_vec())
    }
}

/// Option numbers `map_request` may produce.
fn allowed(n: OptionNumber) -> bool {
    [
        OptionNumber::URI_HOST,
        OptionNumber::URI_PATH,
        OptionNumber::URI_QUERY,
        OptionNumber::CONTENT_FORMAT,
        OptionNumber::ACCEPT,
        OptionNumber::IF_MATCH,
        OptionNumber::IF_NONE_MATCH,
        OptionNumber::ETAG,
        OSCORE_OPTION,
    ]
    .contains(&n)
}

fn max_len(n: OptionNumber) -> usize {
    match n {
        OptionNumber::URI_HOST | OptionNumber::URI_PATH | OptionNumber::URI_QUERY => 255,
        OSCORE_OPTION => 255,
        OptionNumber::ETAG | OptionNumber::IF_MATCH => 8,
        OptionNumber::IF_NONE_MATCH => 0,
        _ => 2, // Content-Format, Accept: uint 0-65535
    }
}

fn run(u: &mut Unstructured<'_>, reverse: &[ReverseMapping]) -> UResult<()> {
    let path = if u.arbitrary()? {
        format!("/hc/{}", uri_text(u, 80)?)
    } else {
        let p = *u.choose(&["/s", "/n", "/x", "/hc", ""])?;
        format!("{p}{}", uri_text(u, 60)?)
    };
    let method = Method::from_bytes(u.choose(METHODS)?.as_bytes()).unwrap_or(Method::GET);
    let mut headers = HeaderMap::new();
    for _ in 0..u.int_in_range(0..=5)? {
        // the headers the mapping reads, and one it must ignore
        let name = if u.ratio(1, 8)? {
            HOST
        } else {
            u.choose(&MAPPED_REQUEST_HEADERS)?.clone()
        };
        let v = header_value(u, name.as_str())?;
        if let Ok(v) = HeaderValue::from_bytes(&v) {
            headers.append(name, v);
        }
    }
    let body_len = u.int_in_range(0..=64)?;
    let body = u.bytes(body_len)?.to_vec();

    let target = match resolve_target(&path, reverse) {
        Ok(Some((t, via))) => {
            if let Via::Reverse(i) = via {
                assert!(i < reverse.len());
                assert!(path.starts_with(&reverse[i].prefix));
            }
            let back = t.uri();
            match CoapTarget::parse(&back) {
                Ok(t2) => assert_eq!(t2, t, "{path:?} -> {back:?}"),
                Err(e) => panic!("{path:?}: the target {back:?} does not parse: {e}"),
            }
            t
        }
        Ok(None) => {
            assert!(!path.starts_with("/hc/"));
            return Ok(());
        }
        Err(e) => {
            assert!(
                e.status.is_client_error() || e.status.is_server_error(),
                "{e:?}"
            );
            return Ok(());
        }
    };
    let (req, info) = match map_request(&method, &headers, &target, &body) {
        Ok(r) => r,
        Err(e) => {
            assert!(
                e.status.is_client_error() || e.status.is_server_error(),
                "{e:?}"
            );
            return Ok(());
        }
    };
    assert!(req.code.is_request());
    assert_eq!(req.payload, body);
    assert_eq!(info.head, method == Method::HEAD);
    assert!(!info.cacheable || req.code == Code::GET);
    assert_eq!(info.conditional, !info.etags.is_empty());
    assert!(!info.no_store || info.no_cache);
    let oscore = req.options.iter().any(|(n, _)| *n == OSCORE_OPTION);
    assert_eq!(oscore, headers.contains_key("oscore"));
    assert!(!oscore || (info.no_store && !info.cacheable));
    for (n, v) in &req.options {
        assert!(allowed(*n), "unexpected option {n:?}");
        assert!(v.len() <= max_len(*n), "{n:?} of {} bytes", v.len());
        if *n == OptionNumber::ETAG || (*n == OptionNumber::IF_MATCH && !v.is_empty()) {
            assert!(!v.is_empty(), "empty {n:?}");
        }
    }
    // It goes on the wire as one message and reads back the same.
    let mut opts = req.options.clone();
    opts.sort_by_key(|(n, _)| n.0);
    let mut buf = vec![0u8; 4096];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, req.code, 1, &[7]).expect("header");
    for (n, v) in &opts {
        w.option(*n, v).expect("option fits");
    }
    w.payload(&req.payload).expect("payload fits");
    let len = w.finish();
    let p = Packet::new_checked(&buf[..len]).expect("the mapped request parses");
    let back: Vec<(OptionNumber, Vec<u8>)> =
        p.options().map(|o| (o.number, o.value.to_vec())).collect();
    assert_eq!(back, opts);
    assert_eq!(p.payload(), &req.payload[..]);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    thread_local! {
        static REVERSE: Vec<ReverseMapping> = vec![
            ReverseMapping::new("/s", "coap://127.0.0.1:5683/sensors").unwrap(),
            ReverseMapping::new("/n", "coap://Example.ORG/a%2Fb?k=1").unwrap(),
            ReverseMapping::new("/n/deeper", "coap://[::1]:7000").unwrap(),
        ];
    }
    REVERSE.with(|r| {
        let _ = run(&mut Unstructured::new(data), r);
    });
});
