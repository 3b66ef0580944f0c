//! OSCORE messages over HTTP (RFC 8613 section 11): an HTTP request with
//! the `OSCORE` header field carries a protected CoAP request, which the
//! proxy forwards untouched, and the protected answer goes back the same
//! way. The proxy holds no key and reads nothing inside.
//!
//! - Request: POST (or FETCH) with `OSCORE: <option value in base64url,
//!   no padding>` (`AA` for an empty option) and the ciphertext as the
//!   body, `Content-Type: application/oscore` or none. It becomes a CoAP
//!   request with the same code, the OSCORE option, the body as payload and
//!   Uri-Host when the target names one; nothing else: the path, query,
//!   Accept and the rest travel inside the ciphertext (the target's own path
//!   is not sent, the server would ignore an outer one), and the
//!   `application/oscore` media type has no Content-Format by design.
//! - Response: a CoAP response with an OSCORE option maps to its status as
//!   any other, with the `OSCORE` header field, `Content-Type:
//!   application/oscore`, `Cache-Control: no-cache`, and the payload as the
//!   body.
//!
//! Invariant: a malformed `OSCORE` header field (not base64url, over 255
//! bytes decoded), another method, or another Content-Type is a 4xx
//! [`ProxyError`]; nothing here panics on any input.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use mintgate_coap::wire::{Code, OptionNumber};

use super::{bad, CoapRequest, CoapTarget, ProxyError, RequestInfo};

/// The CoAP OSCORE option (RFC 8613 section 2).
pub const OSCORE_OPTION: OptionNumber = mintgate_coap::oscore::OSCORE;

/// The HTTP header field that carries it.
pub const OSCORE_HEADER: HeaderName = HeaderName::from_static("oscore");

/// The media type of an OSCORE body.
pub const APPLICATION_OSCORE: &str = "application/oscore";

/// Longest OSCORE option value (its registered maximum length).
const MAX_OPTION: usize = 255;

/// Whether the request carries an OSCORE message.
pub fn is_oscore(headers: &HeaderMap) -> bool {
    headers.contains_key(OSCORE_HEADER)
}

/// The OSCORE option value of an `OSCORE` header field value: base64url
/// without padding, `AA` (a single zero byte) standing for the empty value.
pub fn option_from_header(v: &[u8]) -> Result<Vec<u8>, ProxyError> {
    let malformed = |why: &str| {
        bad(
            StatusCode::BAD_REQUEST,
            format!("the OSCORE header field {why} (RFC 8613 section 11.1)"),
        )
    };
    if v.len() < 2 || v.len() > MAX_OPTION.div_ceil(3) * 4 {
        return Err(malformed("has a length no option value has"));
    }
    let raw = URL_SAFE_NO_PAD
        .decode(v)
        .map_err(|_| malformed("is not base64url without padding"))?;
    if raw.len() > MAX_OPTION {
        return Err(malformed("is over 255 bytes decoded"));
    }
    Ok(if raw == [0] { Vec::new() } else { raw })
}

/// The `OSCORE` header field value for an option value.
pub fn header_from_option(v: &[u8]) -> HeaderValue {
    let text = if v.is_empty() {
        "AA".to_owned()
    } else {
        URL_SAFE_NO_PAD.encode(v)
    };
    // base64url is visible ASCII: always a valid header value
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("AA"))
}

/// Maps an HTTP request that carries an OSCORE message (see [`is_oscore`])
/// to the CoAP request for `target`: the option, the body, Uri-Host.
pub fn map_oscore_request(
    method: &Method,
    headers: &HeaderMap,
    target: &CoapTarget,
    body: &[u8],
) -> Result<(CoapRequest, RequestInfo), ProxyError> {
    let code = match method.as_str() {
        "POST" => Code::POST,
        "FETCH" => Code::FETCH,
        m => {
            return Err(bad(
                StatusCode::BAD_REQUEST,
                format!(
                    "an OSCORE message comes as POST (or FETCH), not {m} (RFC 8613 section 11.1)"
                ),
            ))
        }
    };
    let mut values = headers.get_all(OSCORE_HEADER).iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return Err(bad(
            StatusCode::BAD_REQUEST,
            "one OSCORE header field, not several",
        ));
    };
    let option = option_from_header(v.as_bytes())?;
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        let essence = ct.split(';').next().unwrap_or_default().trim();
        if !essence.eq_ignore_ascii_case(APPLICATION_OSCORE) {
            return Err(bad(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "an OSCORE message is sent as Content-Type: {APPLICATION_OSCORE}, not `{ct}`"
                ),
            ));
        }
    }
    let mut options = Vec::with_capacity(2);
    if target.authority.ip().is_none() {
        options.push((
            OptionNumber::URI_HOST,
            target.authority.host.as_bytes().to_vec(),
        ));
    }
    options.push((OSCORE_OPTION, option));
    Ok((
        CoapRequest {
            code,
            options,
            payload: body.to_vec(),
        },
        RequestInfo {
            no_cache: true,
            no_store: true,
            ..RequestInfo::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_rfc_example_values() {
        // RFC 8613 section 11.5: option 09 25 is `CSU`, the empty one `AA`
        assert_eq!(option_from_header(b"CSU").unwrap(), vec![0x09, 0x25]);
        assert_eq!(header_from_option(&[0x09, 0x25]), "CSU");
        assert_eq!(option_from_header(b"AA").unwrap(), Vec::<u8>::new());
        assert_eq!(header_from_option(&[]), "AA");
    }

    #[test]
    fn malformed_values_are_400() {
        for bad in [&b""[..], b"A", b"CS=", b"C+U", b"C/U", b"C U"] {
            let e = option_from_header(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
        let long = URL_SAFE_NO_PAD.encode([1u8; 256]);
        assert_eq!(
            option_from_header(long.as_bytes()).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        let longest = URL_SAFE_NO_PAD.encode([1u8; 255]);
        assert_eq!(option_from_header(longest.as_bytes()).unwrap().len(), 255);
    }

    fn target(uri: &str) -> CoapTarget {
        CoapTarget::parse(uri).unwrap()
    }

    #[test]
    fn a_request_carries_the_option_and_the_body_only() {
        let mut h = HeaderMap::new();
        h.insert(OSCORE_HEADER, HeaderValue::from_static("CSU"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/oscore"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let (r, info) = map_oscore_request(
            &Method::POST,
            &h,
            &target("coap://sensor.example:5683/orders?x=1"),
            b"\x09\x07\x01",
        )
        .unwrap();
        assert_eq!(r.code, Code::POST);
        assert_eq!(
            r.options,
            vec![
                (OptionNumber::URI_HOST, b"sensor.example".to_vec()),
                (OSCORE_OPTION, vec![0x09, 0x25]),
            ]
        );
        assert_eq!(r.payload, b"\x09\x07\x01");
        assert!(!info.cacheable && info.no_store);
        let (r, _) =
            map_oscore_request(&Method::POST, &h, &target("coap://127.0.0.1:5683/"), b"x").unwrap();
        assert_eq!(r.options, vec![(OSCORE_OPTION, vec![0x09, 0x25])]);
    }

    #[test]
    fn other_methods_types_and_repeated_fields_are_refused() {
        let t = target("coap://127.0.0.1/");
        let mut h = HeaderMap::new();
        h.insert(OSCORE_HEADER, HeaderValue::from_static("CSU"));
        let e = map_oscore_request(&Method::GET, &h, &t, b"").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let mut ct = h.clone();
        ct.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let e = map_oscore_request(&Method::POST, &ct, &t, b"").unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let mut two = h.clone();
        two.append(OSCORE_HEADER, HeaderValue::from_static("AA"));
        let e = map_oscore_request(&Method::POST, &two, &t, b"").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        // no Content-Type at all is taken
        assert!(map_oscore_request(&Method::POST, &h, &t, b"").is_ok());
    }

    proptest! {
        /// Every option value survives the header field and back; any
        /// header bytes decode or are refused, never panic.
        #[test]
        fn option_values_round_trip(v in proptest::collection::vec(any::<u8>(), 0..=255)) {
            let h = header_from_option(&v);
            let back = option_from_header(h.as_bytes()).unwrap();
            // a lone zero byte is the empty value's spelling
            let expect = if v == [0] { Vec::new() } else { v };
            prop_assert_eq!(back, expect);
        }

        #[test]
        fn arbitrary_header_bytes_never_panic(v in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(o) = option_from_header(&v) {
                prop_assert!(o.len() <= MAX_OPTION);
            }
        }
    }
}
