//! Properties of the HTTP <-> CoAP mapping on arbitrary requests and
//! responses: it answers or refuses with a 4xx/5xx (502 for responses),
//! never panics, and what it produces stays within CoAP's and HTTP's rules.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use bytes::Bytes;
use mintgate_coap::wire::{Code, OptionNumber};
use mintgate_proxy::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use mintgate_proxy::mapping::{
    map_request, map_response, map_status, resolve_target, Authority, CoapResponse, RequestInfo,
    ResponseContext, ReverseMapping, APPLICATION_OSCORE, KNOWN_RESPONSE_OPTIONS,
    MAPPED_REQUEST_HEADERS, OSCORE_HEADER, OSCORE_OPTION,
};
use proptest::prelude::*;

fn method() -> impl Strategy<Value = Method> {
    prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"])
        .prop_map(|m| Method::from_bytes(m.as_bytes()).unwrap())
}

fn headers() -> impl Strategy<Value = Vec<(HeaderName, String)>> {
    let name = prop::sample::select(MAPPED_REQUEST_HEADERS.to_vec());
    proptest::collection::vec((name, "[ -~]{0,30}"), 0..5)
}

fn option_number() -> impl Strategy<Value = OptionNumber> {
    prop_oneof![
        4 => prop::sample::select(KNOWN_RESPONSE_OPTIONS.to_vec()),
        1 => Just(OptionNumber::BLOCK2),
        1 => any::<u16>().prop_map(OptionNumber),
    ]
}

proptest! {
    #[test]
    fn requests_map_or_are_refused(
        target in "/(hc/coap://|s|hc/)[ -~]{0,40}",
        m in method(),
        hs in headers(),
        body in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let reverse = [ReverseMapping::new("/s", "coap://127.0.0.1/sensors").unwrap()];
        let t = match resolve_target(&target, &reverse) {
            Ok(Some((t, _))) => t,
            Ok(None) => return Ok(()),
            Err(e) => {
                prop_assert!(e.status.is_client_error() || e.status.is_server_error());
                return Ok(());
            }
        };
        let mut h = HeaderMap::new();
        for (n, v) in hs {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.append(n, v);
            }
        }
        match map_request(&m, &h, &t, &body) {
            Ok((req, info)) => {
                prop_assert!(req.code.is_request());
                prop_assert_eq!(info.head, m == Method::HEAD);
                prop_assert!(!info.cacheable || req.code == Code::GET);
                for (n, v) in &req.options {
                    let max = match *n {
                        OptionNumber::ETAG | OptionNumber::IF_MATCH => 8,
                        OptionNumber::CONTENT_FORMAT | OptionNumber::ACCEPT => 2,
                        OptionNumber::IF_NONE_MATCH => 0,
                        _ => 255,
                    };
                    prop_assert!(v.len() <= max, "{:?} {:?}", n, v);
                }
            }
            Err(e) => prop_assert!(e.status.is_client_error() || e.status.is_server_error()),
        }
    }

    #[test]
    fn responses_map_or_are_502(
        code: u8,
        options in proptest::collection::vec((option_number(), proptest::collection::vec(any::<u8>(), 0..10)), 0..6),
        payload in proptest::collection::vec(any::<u8>(), 0..20),
        head: bool,
        conditional: bool,
        age in 0u32..100,
    ) {
        let authority = Authority::new("127.0.0.1", 5683);
        let info = RequestInfo { head, conditional, ..RequestInfo::default() };
        let cx = ResponseContext { authority: &authority, mapping: None, info: &info, age };
        let resp = CoapResponse {
            code: Code(code),
            options: options.into_iter().map(|(n, v)| (n, Bytes::from(v))).collect(),
            payload: Bytes::from(payload.clone()),
        };
        let protected = resp.option(OSCORE_OPTION).is_some();
        let want = map_status(Code(code), conditional, !payload.is_empty());
        match map_response(resp, &cx) {
            Ok(r) => {
                prop_assert_eq!(Some(r.status()), want);
                let bodyless = head
                    || r.status() == StatusCode::NOT_MODIFIED
                    || r.status() == StatusCode::NO_CONTENT;
                prop_assert_eq!(r.body().is_empty(), bodyless || payload.is_empty());
                if let Some(l) = r.headers().get(header::LOCATION) {
                    prop_assert!(l.to_str().unwrap().starts_with("/hc/coap://"));
                }
                // an OSCORE answer goes back with its header field and type
                prop_assert_eq!(r.headers().contains_key(OSCORE_HEADER), protected);
                if protected {
                    prop_assert_eq!(&r.headers()[header::CONTENT_TYPE], APPLICATION_OSCORE);
                }
            }
            Err(e) => prop_assert_eq!(e.status, StatusCode::BAD_GATEWAY),
        }
    }
}
