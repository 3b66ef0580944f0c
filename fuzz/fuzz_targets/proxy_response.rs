//! The proxy's CoAP -> HTTP response mapping (`map_response`, RFC 8075)
//! on responses from the input: any code, options (the ones the mapping
//! reads, with any value, and any other number), payload, and request
//! facts (HEAD, conditional, age, reverse mapping or not).
//!
//! Checked: a mapped response has the status `map_status` names, no body
//! for HEAD, 304 and 204, the payload as body otherwise, a Location that
//! is a path under the proxy, a Cache-Control whose max-age never exceeds
//! the CoAP Max-Age; a refusal is 502 Bad Gateway.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{Result as UResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use mintgate_coap::wire::{Code, OptionNumber};
use mintgate_proxy::http::{header, StatusCode};
use mintgate_proxy::mapping::{
    map_response, map_status, Authority, CoapResponse, RequestInfo, ResponseContext,
    ReverseMapping, KNOWN_RESPONSE_OPTIONS,
};

fn run(u: &mut Unstructured<'_>, mapping: &ReverseMapping) -> UResult<()> {
    let code = Code(u.arbitrary()?);
    let mut options = Vec::new();
    for _ in 0..u.int_in_range(0..=6)? {
        // the options the mapping knows, Block2 (refused), or any number
        let n = if u.ratio(6, 8)? {
            *u.choose(&KNOWN_RESPONSE_OPTIONS)?
        } else if u.arbitrary()? {
            OptionNumber::BLOCK2
        } else {
            OptionNumber(u.arbitrary()?)
        };
        let len = u.int_in_range(0..=10)?;
        let v = if n == OptionNumber::LOCATION_PATH && u.arbitrary()? {
            // a Location-Path that lies under the reverse mapping's target
            b"sensors".to_vec()
        } else {
            u.bytes(len)?.to_vec()
        };
        options.push((n, v));
    }
    let plen = u.int_in_range(0..=40)?;
    let payload = u.bytes(plen)?.to_vec();
    let info = RequestInfo {
        head: u.arbitrary()?,
        conditional: u.arbitrary()?,
        ..RequestInfo::default()
    };
    let authority = if u.arbitrary()? {
        mapping.target.authority.clone()
    } else {
        Authority::new("Example.org", u.arbitrary::<u16>()?.max(1))
    };
    let age: u32 = u.int_in_range(0..=120)?;
    let via = u.arbitrary::<bool>()?;
    let cx = ResponseContext {
        authority: &authority,
        mapping: via.then_some(mapping),
        info: &info,
        age,
    };
    let resp = CoapResponse {
        code,
        options: options
            .into_iter()
            .map(|(n, v)| (n, Bytes::from(v)))
            .collect(),
        payload: Bytes::from(payload),
    };
    let want = map_status(code, info.conditional, !resp.payload.is_empty());
    let max_age = resp.max_age();
    let cacheable = resp.cacheable_code();
    let payload = resp.payload.clone();
    match map_response(resp, &cx) {
        Ok(r) => {
            assert_eq!(Some(r.status()), want);
            let empty = info.head
                || r.status() == StatusCode::NOT_MODIFIED
                || r.status() == StatusCode::NO_CONTENT;
            if empty {
                assert!(r.body().is_empty(), "a body on {}", r.status());
            } else {
                assert_eq!(r.body()[..], payload[..]);
            }
            if let Some(loc) = r.headers().get(header::LOCATION) {
                let loc = loc.to_str().expect("Location is text");
                assert!(loc.starts_with('/'), "Location {loc:?}");
            }
            if r.headers().contains_key("oscore") {
                // RFC 8613 section 11: whole, typed, and not for caches
                assert_eq!(r.headers()[header::CONTENT_TYPE], "application/oscore");
                assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
            } else if let Some(cc) = r.headers().get(header::CACHE_CONTROL) {
                assert!(cacheable);
                let cc = cc.to_str().expect("Cache-Control is text");
                let secs: u32 = cc
                    .strip_prefix("max-age=")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("Cache-Control {cc:?}"));
                let m = max_age.expect("a cacheable answer with a bad Max-Age");
                assert!(secs <= m, "max-age {secs} > Max-Age {m}");
            }
        }
        Err(e) => assert_eq!(e.status, StatusCode::BAD_GATEWAY, "{e:?}"),
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    thread_local! {
        static MAPPING: ReverseMapping =
            ReverseMapping::new("/s", "coap://127.0.0.1:5683/sensors").unwrap();
    }
    MAPPING.with(|m| {
        let _ = run(&mut Unstructured::new(data), m);
    });
});
