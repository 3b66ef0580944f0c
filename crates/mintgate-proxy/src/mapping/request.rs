//! HTTP request -> CoAP request (RFC 8075 sections 6 and 7): the method,
//! the headers that have CoAP options (Content-Type, Accept, If-Match,
//! If-None-Match, Cache-Control), and the body. A request with the
//! `OSCORE` header field is an OSCORE message, forwarded as it is
//! ([`super::oscore`]).
//!
//! Invariant: a request either maps or is answered with a [`ProxyError`]
//! (400 for a malformed header, 414 for a Uri-Path or Uri-Query value over
//! 255 bytes, 415 for a Content-Type without a Content-Format, 501 for a
//! method CoAP lacks); headers not listed in
//! [`MAPPED_REQUEST_HEADERS`] are never read.

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};
use mintgate_coap::wire::{encode_uint, Code, OptionNumber};

use super::{bad, content_format_for, etag_from_http, CoapTarget, ProxyError};

/// A CoAP request to make upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoapRequest {
    /// The method code.
    pub code: Code,
    /// Options, any order (the client sorts them).
    pub options: Vec<(OptionNumber, Vec<u8>)>,
    /// The payload.
    pub payload: Vec<u8>,
}

/// What the response mapping needs to know about the request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// The HTTP method was HEAD: answer without a body.
    pub head: bool,
    /// The request carried entity tags to validate (If-None-Match on
    /// GET/HEAD): 2.03 maps to 304.
    pub conditional: bool,
    /// The client asked not to be served from a cache (no-cache, max-age=0,
    /// Pragma: no-cache).
    pub no_cache: bool,
    /// The client asked that the response not be stored (no-store).
    pub no_store: bool,
    /// Entity tags the client validates (If-None-Match), decoded.
    pub etags: Vec<Vec<u8>>,
    /// The request may be served from and stored in the cache (GET or HEAD
    /// without preconditions).
    pub cacheable: bool,
}

/// Maps an HTTP method to a CoAP method code (HEAD is GET).
pub fn map_method(m: &Method) -> Result<Code, ProxyError> {
    Ok(match m.as_str() {
        "GET" | "HEAD" => Code::GET,
        "POST" => Code::POST,
        "PUT" => Code::PUT,
        "DELETE" => Code::DELETE,
        "FETCH" => Code::FETCH,
        "PATCH" => Code::PATCH,
        "IPATCH" | "iPATCH" => Code::IPATCH,
        other => {
            return Err(bad(
                StatusCode::NOT_IMPLEMENTED,
                format!("{other} has no CoAP equivalent"),
            ))
        }
    })
}

/// Whether early data (TLS 0-RTT) may carry this method: only safe and
/// idempotent ones (RFC 8470 section 5.1; RFC 9110 section 9.2).
pub fn safe_for_early_data(m: &Method) -> bool {
    matches!(m.as_str(), "GET" | "HEAD" | "OPTIONS")
}

fn header_str<'a>(h: &'a HeaderMap, name: &HeaderName) -> Result<Option<String>, ProxyError> {
    let mut all: Vec<&'a str> = Vec::new();
    for v in h.get_all(name) {
        all.push(v.to_str().map_err(|_| {
            bad(
                StatusCode::BAD_REQUEST,
                format!("the {name} header is not text"),
            )
        })?);
    }
    Ok(if all.is_empty() {
        None
    } else {
        Some(all.join(","))
    })
}

/// The request headers [`map_request`] reads (others are not mapped).
pub const MAPPED_REQUEST_HEADERS: [HeaderName; 7] = [
    super::oscore::OSCORE_HEADER,
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::CACHE_CONTROL,
    header::PRAGMA,
];

/// Maps an HTTP request (method, headers, body) to the CoAP request for
/// `target`.
pub fn map_request(
    method: &Method,
    headers: &HeaderMap,
    target: &CoapTarget,
    body: &[u8],
) -> Result<(CoapRequest, RequestInfo), ProxyError> {
    if super::oscore::is_oscore(headers) {
        return super::oscore::map_oscore_request(method, headers, target, body);
    }
    let code = map_method(method)?;
    let mut info = RequestInfo {
        head: method == Method::HEAD,
        ..RequestInfo::default()
    };
    let mut options: Vec<(OptionNumber, Vec<u8>)> = Vec::new();
    if target.authority.ip().is_none() {
        options.push((
            OptionNumber::URI_HOST,
            target.authority.host.as_bytes().to_vec(),
        ));
    }
    for s in &target.path {
        if s.len() > 255 {
            return Err(bad(
                StatusCode::URI_TOO_LONG,
                "a path segment is over 255 bytes",
            ));
        }
        options.push((OptionNumber::URI_PATH, s.clone()));
    }
    for q in &target.query {
        if q.len() > 255 {
            return Err(bad(
                StatusCode::URI_TOO_LONG,
                "a query part is over 255 bytes",
            ));
        }
        options.push((OptionNumber::URI_QUERY, q.clone()));
    }
    let mut b = [0u8; 4];
    if let Some(ct) = header_str(headers, &header::CONTENT_TYPE)? {
        let cf = content_format_for(&ct).ok_or_else(|| {
            bad(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Type `{ct}` has no CoAP Content-Format"),
            )
        })?;
        options.push((
            OptionNumber::CONTENT_FORMAT,
            encode_uint(cf.into(), &mut b).to_vec(),
        ));
    }
    if let Some(acc) = header_str(headers, &header::ACCEPT)? {
        if let Some(cf) = best_accept(&acc) {
            options.push((
                OptionNumber::ACCEPT,
                encode_uint(cf.into(), &mut b).to_vec(),
            ));
        }
    }
    if let Some(im) = header_str(headers, &header::IF_MATCH)? {
        let im = im.trim();
        if im == "*" {
            options.push((OptionNumber::IF_MATCH, Vec::new()));
        } else {
            let mut any = false;
            for t in split_etags(im) {
                if let Some(v) = etag_from_http(t, false) {
                    options.push((OptionNumber::IF_MATCH, v));
                    any = true;
                }
            }
            if !any {
                // No listed tag can be a current CoAP ETag: the condition
                // is false (RFC 9110 section 13.1.1).
                return Err(bad(
                    StatusCode::PRECONDITION_FAILED,
                    "If-Match lists no entity tag of this proxy",
                ));
            }
        }
    }
    if let Some(inm) = header_str(headers, &header::IF_NONE_MATCH)? {
        let inm = inm.trim();
        if inm == "*" {
            options.push((OptionNumber::IF_NONE_MATCH, Vec::new()));
        } else if code == Code::GET {
            for t in split_etags(inm) {
                if let Some(v) = etag_from_http(t, true) {
                    if !info.etags.contains(&v) {
                        options.push((OptionNumber::ETAG, v.clone()));
                        info.etags.push(v);
                    }
                }
            }
            info.conditional = !info.etags.is_empty();
        } else {
            return Err(bad(
                StatusCode::NOT_IMPLEMENTED,
                "If-None-Match with entity tags is supported on GET and HEAD only",
            ));
        }
    }
    let cc = header_str(headers, &header::CACHE_CONTROL)?
        .unwrap_or_default()
        .to_ascii_lowercase();
    for d in cc.split(',').map(str::trim) {
        match d {
            "no-cache" | "max-age=0" => info.no_cache = true,
            "no-store" => {
                info.no_cache = true;
                info.no_store = true;
            }
            _ => {}
        }
    }
    if let Some(p) = header_str(headers, &header::PRAGMA)? {
        if p.to_ascii_lowercase().contains("no-cache") {
            info.no_cache = true;
        }
    }
    info.cacheable = code == Code::GET
        && !options
            .iter()
            .any(|(n, _)| *n == OptionNumber::IF_MATCH || *n == OptionNumber::IF_NONE_MATCH);
    Ok((
        CoapRequest {
            code,
            options,
            payload: body.to_vec(),
        },
        info,
    ))
}

fn split_etags(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|t| !t.is_empty())
}

/// The Content-Format to ask for: the mapped media type with the highest
/// q-value (the first among equals); `None` for `*/*` alone or when nothing
/// maps.
fn best_accept(accept: &str) -> Option<u16> {
    let mut best: Option<(f32, u16)> = None;
    for item in accept.split(',') {
        let mut q = 1.0f32;
        let mut media = Vec::new();
        for (i, p) in item.split(';').enumerate() {
            let p = p.trim();
            if i > 0 {
                if let Some(v) = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                    q = v.parse().unwrap_or(0.0);
                    continue;
                }
            }
            media.push(p);
        }
        if q <= 0.0 {
            continue;
        }
        if let Some(cf) = content_format_for(&media.join(";")) {
            if best.is_none_or(|(bq, _)| q > bq) {
                best = Some((q, cf));
            }
        }
    }
    best.map(|(_, cf)| cf)
}
