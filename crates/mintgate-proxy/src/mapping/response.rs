//! CoAP response -> HTTP response (RFC 8075 section 7): the status table,
//! Content-Format -> Content-Type, Max-Age -> Cache-Control (and
//! Retry-After on 5.03), ETag -> a strong entity tag, Location-Path and
//! Location-Query -> Location.
//!
//! Invariant: a response this proxy cannot understand (not a response
//! code, an unknown critical option, a block-wise answer, a malformed
//! option value) is a 502 [`ProxyError`], never a guess; the payload moves
//! into the HTTP body without a copy.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use mintgate_coap::wire::{decode_uint, Code, OptionNumber};

use super::target::{encode_path, encode_query};
use super::{
    bad, content_type_for, header_from_option, Authority, ProxyError, RequestInfo, ReverseMapping,
    APPLICATION_OSCORE, HC_PREFIX, OSCORE_HEADER, OSCORE_OPTION,
};

/// Max-Age when a response carries none (RFC 7252 section 5.10.5).
pub const DEFAULT_MAX_AGE: u32 = mintgate_coap::cache::DEFAULT_MAX_AGE;

/// Encodes a CoAP ETag (1-8 opaque bytes) as an HTTP strong entity tag.
pub fn etag_to_http(v: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * v.len());
    s.push('"');
    for b in v {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('"');
    s
}

/// Decodes an entity tag made by [`etag_to_http`]. `weak_ok` accepts a
/// `W/` prefix (weak comparison, If-None-Match). `None` when it cannot be
/// one of ours.
pub fn etag_from_http(t: &str, weak_ok: bool) -> Option<Vec<u8>> {
    let t = t.trim();
    let t = match t.strip_prefix("W/") {
        Some(rest) if weak_ok => rest,
        Some(_) => return None,
        None => t,
    };
    let hex = t.strip_prefix('"')?.strip_suffix('"')?;
    if hex.is_empty() || hex.len() > 16 || hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A CoAP response received upstream (the core's cache representation).
pub use mintgate_coap::cache::Response as CoapResponse;

/// Options of a response this proxy understands; any other critical option
/// makes the response unintelligible (RFC 7252 section 5.4.1).
pub const KNOWN_RESPONSE_OPTIONS: [OptionNumber; 9] = [
    OSCORE_OPTION,
    OptionNumber::ETAG,
    OptionNumber::OBSERVE,
    OptionNumber::LOCATION_PATH,
    OptionNumber::CONTENT_FORMAT,
    OptionNumber::MAX_AGE,
    OptionNumber::LOCATION_QUERY,
    OptionNumber::SIZE2,
    OptionNumber::SIZE1,
];

fn known_response_option(n: OptionNumber) -> bool {
    KNOWN_RESPONSE_OPTIONS.contains(&n)
}

/// The HTTP status for a CoAP response code (RFC 8075 section 7).
/// `conditional`: the HTTP request carried entity tags to validate.
/// `None` for codes that are not responses.
pub fn map_status(code: Code, conditional: bool, has_payload: bool) -> Option<StatusCode> {
    use StatusCode as S;
    let s = match (code.class(), code.detail()) {
        (2, 1) => S::CREATED,
        (2, 2) | (2, 4) if !has_payload => S::NO_CONTENT,
        (2, 2) | (2, 4) => S::OK,
        (2, 3) if conditional => S::NOT_MODIFIED,
        (2, 3) => S::OK,
        (2, 5) => S::OK,
        (2, 31) => return None,
        (2, _) => S::OK,
        (4, 0) => S::BAD_REQUEST,
        // 401 needs a WWW-Authenticate challenge the CoAP server cannot give.
        (4, 1) => S::FORBIDDEN,
        (4, 2) => S::BAD_REQUEST,
        (4, 3) => S::FORBIDDEN,
        (4, 4) => S::NOT_FOUND,
        // 405 needs an Allow header CoAP cannot give.
        (4, 5) => S::BAD_REQUEST,
        (4, 6) => S::NOT_ACCEPTABLE,
        (4, 8) => S::BAD_REQUEST,
        (4, 12) => S::PRECONDITION_FAILED,
        (4, 13) => S::PAYLOAD_TOO_LARGE,
        (4, 15) => S::UNSUPPORTED_MEDIA_TYPE,
        (4, _) => S::BAD_REQUEST,
        (5, 0) => S::INTERNAL_SERVER_ERROR,
        (5, 1) => S::NOT_IMPLEMENTED,
        (5, 2) => S::BAD_GATEWAY,
        (5, 3) => S::SERVICE_UNAVAILABLE,
        (5, 4) => S::GATEWAY_TIMEOUT,
        (5, 5) => S::INTERNAL_SERVER_ERROR,
        (5, _) => S::INTERNAL_SERVER_ERROR,
        _ => return None,
    };
    Some(s)
}

/// Where the response's Location points, in HTTP terms: through the
/// reverse mapping when the location lies under its target path, otherwise
/// in the default `/hc/` form.
pub fn location_for(
    authority: &Authority,
    loc_path: &[Vec<u8>],
    loc_query: &[Vec<u8>],
    mapping: Option<&ReverseMapping>,
) -> String {
    let q = if loc_query.is_empty() {
        String::new()
    } else {
        format!("?{}", encode_query(loc_query))
    };
    if let Some(m) = mapping {
        let base = &m.target.path;
        if let Some(rest) = loc_path
            .strip_prefix(base.as_slice())
            .filter(|_| m.target.authority == *authority)
        {
            return format!("{}{}{q}", m.prefix, encode_path(rest));
        }
    }
    format!("{HC_PREFIX}coap://{authority}{}{q}", encode_path(loc_path))
}

/// What else the response mapping needs.
#[derive(Clone, Copy, Debug)]
pub struct ResponseContext<'a> {
    /// The upstream the response came from.
    pub authority: &'a Authority,
    /// The reverse mapping the request came through, if any.
    pub mapping: Option<&'a ReverseMapping>,
    /// The request's facts.
    pub info: &'a RequestInfo,
    /// Seconds the response has spent in the cache (subtracted from
    /// Max-Age; 0 when fresh from upstream).
    pub age: u32,
}

/// Maps a CoAP response to the HTTP response. Err (502) when the response
/// cannot be understood. The payload becomes the HTTP body as it is (moved,
/// not copied).
pub fn map_response(
    resp: CoapResponse,
    cx: &ResponseContext<'_>,
) -> Result<Response<Bytes>, ProxyError> {
    let unintelligible = |why: String| {
        bad(
            StatusCode::BAD_GATEWAY,
            format!("unintelligible CoAP response: {why}"),
        )
    };
    let status = map_status(resp.code, cx.info.conditional, !resp.payload.is_empty())
        .ok_or_else(|| unintelligible(format!("code {} is not a response", resp.code)))?;
    let mut headers = HeaderMap::new();
    let mut loc_path = Vec::new();
    let mut loc_query = Vec::new();
    let mut etag: Option<&[u8]> = None;
    let mut cf: Option<u16> = None;
    let mut oscore: Option<&[u8]> = None;
    for (n, v) in &resp.options {
        match *n {
            OSCORE_OPTION if oscore.is_some() || v.len() > 255 => {
                return Err(unintelligible("bad OSCORE option".into()))
            }
            OSCORE_OPTION => oscore = Some(v),
            OptionNumber::BLOCK2 | OptionNumber::BLOCK1 => {
                return Err(unintelligible(
                    "block-wise transfer is not supported".into(),
                ))
            }
            OptionNumber::CONTENT_FORMAT => {
                let c = decode_uint(v)
                    .filter(|c| *c <= u16::MAX as u32)
                    .ok_or_else(|| unintelligible("bad Content-Format".into()))?;
                cf = Some(c as u16);
            }
            OptionNumber::ETAG => {
                if v.is_empty() || v.len() > 8 {
                    return Err(unintelligible("bad ETag length".into()));
                }
                etag.get_or_insert(v);
            }
            OptionNumber::LOCATION_PATH => loc_path.push(v.to_vec()),
            OptionNumber::LOCATION_QUERY => loc_query.push(v.to_vec()),
            OptionNumber::MAX_AGE if v.len() > 4 => {
                return Err(unintelligible("bad Max-Age".into()))
            }
            n if n.is_critical() && !known_response_option(n) => {
                return Err(unintelligible(format!("unknown critical option {}", n.0)))
            }
            _ => {}
        }
    }
    if let Some(c) = cf {
        let ct = content_type_for(c);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(&ct).map_err(|_| unintelligible("content type".into()))?,
        );
    }
    if let Some(e) = etag {
        if let Ok(v) = HeaderValue::from_str(&etag_to_http(e)) {
            headers.insert(header::ETAG, v);
        }
    }
    if let Some(o) = oscore {
        // RFC 8613 section 11: the protected answer goes back whole; it
        // is not for caches
        headers.insert(OSCORE_HEADER, header_from_option(o));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(APPLICATION_OSCORE),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    } else if resp.cacheable_code() {
        let max_age = resp
            .max_age()
            .ok_or_else(|| unintelligible("bad Max-Age".into()))?
            .saturating_sub(cx.age);
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_str(&format!("max-age={max_age}"))
                .map_err(|_| unintelligible("max-age".into()))?,
        );
        if cx.age > 0 {
            headers.insert(header::AGE, HeaderValue::from(cx.age));
        }
        if resp.code == Code::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(max_age));
        }
    }
    if !loc_path.is_empty() || !loc_query.is_empty() {
        let loc = location_for(cx.authority, &loc_path, &loc_query, cx.mapping);
        headers.insert(
            header::LOCATION,
            HeaderValue::from_str(&loc).map_err(|_| unintelligible("location".into()))?,
        );
    }
    let body =
        if cx.info.head || status == StatusCode::NOT_MODIFIED || status == StatusCode::NO_CONTENT {
            Bytes::new()
        } else {
            resp.payload
        };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}
