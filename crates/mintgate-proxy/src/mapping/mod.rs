// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! The HTTP <-> CoAP mapping of RFC 8075 as pure functions: no I/O, no
//! clock, nothing async. The servers (HTTP/1.1, HTTP/2, HTTP/3) all go
//! through these.
//!
//! - Target: the default form `/hc/coap://host[:port]/path?query` (the RFC's
//!   `/hc/{+tu}` template; a percent-encoded target is accepted too) and
//!   configured reverse mappings (`/prefix/rest` to `coap://host/base/rest`,
//!   longest prefix first, on segment boundaries).
//! - Method: GET, HEAD (as GET, body dropped), POST, PUT, DELETE, FETCH,
//!   PATCH, iPATCH; anything else 501.
//! - Request headers: Content-Type -> Content-Format (415 when it has no
//!   Content-Format), Accept -> Accept, If-Match -> If-Match, If-None-Match:
//!   `*` -> If-None-Match, If-None-Match with entity tags on GET/HEAD -> ETag
//!   options (validation), Cache-Control: no-cache/no-store -> bypass the
//!   cache.
//! - Response: the status table of RFC 8075 section 7, Content-Format ->
//!   Content-Type (`application/coap-payload; cf=N` when it has no media
//!   type), Max-Age -> Cache-Control (and Retry-After on 5.03), ETag -> ETag
//!   (strong, hex), Location-Path/Location-Query -> Location (back through
//!   the reverse mapping when the location lies under it), 2.03 -> 304 when
//!   the request was conditional.
//! - A response that cannot be understood (not a response code, a critical
//!   option this proxy does not know, a block-wise answer, a malformed
//!   option value) is 502.
//!
//! Invariant: every function here returns an error value rather than
//! panicking on any input, however malformed; [`ProxyError`] carries the
//! HTTP status to answer with.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use mintgate_coap::wire::{decode_uint, encode_uint, Code, OptionNumber};

/// The CoAP default port (RFC 7252 section 6.1).
pub const COAP_PORT: u16 = 5683;
/// The path prefix of the default mapping (RFC 8075 section 5.3).
pub const HC_PREFIX: &str = "/hc/";
/// Max-Age when a response carries none (RFC 7252 section 5.10.5).
pub const DEFAULT_MAX_AGE: u32 = mintgate_coap::cache::DEFAULT_MAX_AGE;

/// An HTTP error the proxy answers with instead of a mapped response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyError {
    /// The status.
    pub status: StatusCode,
    /// A one-line explanation, sent as the text/plain body.
    pub message: String,
    /// Seconds for a Retry-After header (429, 503).
    pub retry_after: Option<u32>,
}

impl ProxyError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ProxyError {
        ProxyError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same with a Retry-After.
    pub fn retry_after(mut self, secs: u32) -> ProxyError {
        self.retry_after = Some(secs);
        self
    }

    /// The HTTP response for this error: the status, a text/plain body with
    /// the message, Retry-After when set.
    pub fn to_response(&self) -> Response<Bytes> {
        let mut body = self.message.clone();
        body.push('\n');
        let mut r = Response::new(Bytes::from(body));
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"mintgate\""),
            );
        }
        r
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ProxyError {}

fn bad(status: StatusCode, msg: impl Into<String>) -> ProxyError {
    ProxyError::new(status, msg)
}

/// A CoAP server's host and port, normalised: host lower-case, IPv6
/// without brackets. Compared as text: `localhost:5683` and
/// `127.0.0.1:5683` are different authorities.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Authority {
    /// Host name, IPv4 address or IPv6 address (no brackets), lower-case.
    pub host: String,
    /// UDP port.
    pub port: u16,
}

impl Authority {
    /// A new authority, normalising the host.
    pub fn new(host: &str, port: u16) -> Authority {
        Authority {
            host: normalise_host(host),
            port,
        }
    }

    /// The host is an IP literal (no name resolution needed).
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.host.parse().ok()
    }
}

fn normalise_host(h: &str) -> String {
    let h = h.trim_start_matches('[').trim_end_matches(']');
    if let Ok(v6) = h.parse::<Ipv6Addr>() {
        return v6.to_string();
    }
    if let Ok(v4) = h.parse::<Ipv4Addr>() {
        return v4.to_string();
    }
    h.to_ascii_lowercase()
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for Authority {
    type Err = String;
    /// `host:port`, `[v6]:port`, or a host alone (port 5683).
    fn from_str(s: &str) -> Result<Authority, String> {
        let (host, port) = split_host_port(s).map_err(|e| format!("`{s}`: {e}"))?;
        if host.is_empty() {
            return Err(format!("`{s}`: empty host"));
        }
        Ok(Authority::new(host, port.unwrap_or(COAP_PORT)))
    }
}

impl From<std::net::SocketAddr> for Authority {
    fn from(a: std::net::SocketAddr) -> Authority {
        Authority::new(&a.ip().to_string(), a.port())
    }
}

/// Splits `host[:port]` / `[v6][:port]`.
fn split_host_port(s: &str) -> Result<(&str, Option<u16>), &'static str> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or("unclosed `[`")?;
        let host = &rest[..end];
        if host.parse::<Ipv6Addr>().is_err() {
            return Err("not an IPv6 address inside [ ]");
        }
        let after = &rest[end + 1..];
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err("junk after `]`"),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    // IPv6 without brackets is refused: a port would be ambiguous.
    if host.contains(':') && !s.starts_with('[') {
        return Err("an IPv6 address needs [ ]");
    }
    if !host.contains(':') && !host.chars().all(|c| is_name_char(c) || c == '%') {
        return Err("bad character in host");
    }
    let port = match port {
        None => None,
        Some("") => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| "bad port")?),
    };
    if port == Some(0) {
        return Err("port 0");
    }
    Ok((host, port))
}

/// A character of a host name as the proxy accepts it (after
/// percent-decoding; before it, `%` too).
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._".contains(c)
}

/// A parsed `coap://` target URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoapTarget {
    /// Where the request goes.
    pub authority: Authority,
    /// Uri-Path option values (percent-decoded segments), in order.
    pub path: Vec<Vec<u8>>,
    /// Uri-Query option values (percent-decoded), in order.
    pub query: Vec<Vec<u8>>,
}

impl CoapTarget {
    /// The authority requests go to.
    pub fn authority(&self) -> Authority {
        self.authority.clone()
    }

    /// Parses `coap://host[:port][/path][?query]` (RFC 7252 section 6.4).
    /// `coaps` and other schemes are refused (501 and 400).
    pub fn parse(uri: &str) -> Result<CoapTarget, ProxyError> {
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "the target is not a coap:// URI"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "coap" => {}
            "coaps" | "coap+tcp" | "coaps+tcp" | "coap+ws" | "coaps+ws" => {
                return Err(bad(
                    StatusCode::NOT_IMPLEMENTED,
                    format!("the {scheme} scheme is not supported (coap only)"),
                ))
            }
            _ => {
                return Err(bad(
                    StatusCode::BAD_REQUEST,
                    format!("`{scheme}` is not a CoAP scheme"),
                ))
            }
        }
        let rest = rest.split('#').next().unwrap_or("");
        let (before_q, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (auth, path) = match before_q.find('/') {
            Some(i) => (&before_q[..i], &before_q[i..]),
            None => (before_q, ""),
        };
        if auth.contains('@') {
            return Err(bad(
                StatusCode::BAD_REQUEST,
                "user information is not allowed in a CoAP URI",
            ));
        }
        let (host, port) = split_host_port(auth)
            .map_err(|e| bad(StatusCode::BAD_REQUEST, format!("bad host in target: {e}")))?;
        if host.is_empty() {
            return Err(bad(StatusCode::BAD_REQUEST, "the target has no host"));
        }
        let host = pct_decode(host)
            .and_then(|h| String::from_utf8(h).ok())
            .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "bad percent-encoding in host"))?;
        // What the percent-encoding hid must be a host too: an IP address
        // or a name the resolver can look up (`d%01x` is neither, and
        // could not be written back as a URI).
        if host.parse::<std::net::IpAddr>().is_err() && !host.chars().all(is_name_char) {
            return Err(bad(
                StatusCode::BAD_REQUEST,
                "bad host in target: bad character in host (after percent-decoding)",
            ));
        }
        let mut segs = Vec::new();
        if !(path.is_empty() || path == "/") {
            for s in path[1..].split('/') {
                segs.push(
                    pct_decode(s).ok_or_else(|| {
                        bad(StatusCode::BAD_REQUEST, "bad percent-encoding in path")
                    })?,
                );
            }
        }
        let mut q = Vec::new();
        if let Some(query) = query {
            if !query.is_empty() {
                for s in query.split('&') {
                    q.push(pct_decode(s).ok_or_else(|| {
                        bad(StatusCode::BAD_REQUEST, "bad percent-encoding in query")
                    })?);
                }
            }
        }
        Ok(CoapTarget {
            authority: Authority::new(&host, port.unwrap_or(COAP_PORT)),
            path: segs,
            query: q,
        })
    }

    /// The URI again, percent-encoding what needs it.
    pub fn uri(&self) -> String {
        let mut s = format!("coap://{}", self.authority);
        s.push_str(&encode_path(&self.path));
        if !self.query.is_empty() {
            s.push('?');
            s.push_str(&encode_query(&self.query));
        }
        s
    }
}

fn encode_path(segs: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for seg in segs {
        s.push('/');
        s.push_str(&pct_encode(seg, false));
    }
    s
}

fn encode_query(q: &[Vec<u8>]) -> String {
    q.iter()
        .map(|v| pct_encode(v, true))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-decodes `s`. `None` on a `%` not followed by two hex digits.
pub fn pct_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut it = b.iter();
    while let Some(&c) = it.next() {
        if c == b'%' {
            let hi = it.next().and_then(|c| (*c as char).to_digit(16));
            let lo = it.next().and_then(|c| (*c as char).to_digit(16));
            match (hi, lo) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Percent-encodes everything but unreserved characters, sub-delims, `:`
/// and `@` (and, in a query, `/` and `?`); `&` is always encoded in a query
/// value and `/` always in a path segment.
pub fn pct_encode(v: &[u8], query: bool) -> String {
    let mut s = String::with_capacity(v.len());
    for &c in v {
        let keep = c.is_ascii_alphanumeric()
            || b"-._~!$'()*+,;=:@".contains(&c)
            || (query && (c == b'/' || c == b'?'));
        if keep {
            s.push(c as char);
        } else {
            s.push_str(&format!("%{c:02X}"));
        }
    }
    s
}

/// A configured reverse mapping: requests under `prefix` go to `target`
/// with the rest of their path appended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReverseMapping {
    /// Path prefix, starting with `/`, no trailing `/` (except `/` itself is
    /// not allowed: it would swallow every path).
    pub prefix: String,
    /// The CoAP base URI (its query, if any, comes first).
    pub target: CoapTarget,
}

impl ReverseMapping {
    /// Checks and builds a mapping from `prefix` and a `coap://` URI.
    pub fn new(prefix: &str, target: &str) -> Result<ReverseMapping, String> {
        let p = prefix.trim_end_matches('/');
        if !p.starts_with('/') || p.is_empty() {
            return Err(format!(
                "reverse prefix `{prefix}` must start with / and not be / alone"
            ));
        }
        if p == "/hc" || p.starts_with(HC_PREFIX) {
            return Err(format!(
                "reverse prefix `{prefix}` collides with the default /hc/ form"
            ));
        }
        // `mintgate serve` answers these beside the proxy's routes
        if p == "/healthz" || p == "/readyz" {
            return Err(format!(
                "reverse prefix `{prefix}` collides with the health endpoints (/healthz, /readyz)"
            ));
        }
        if !p
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._~/".contains(&c))
            || p.contains("//")
        {
            return Err(format!(
                "reverse prefix `{prefix}` may only hold letters, digits, - . _ ~ and single /"
            ));
        }
        let target = CoapTarget::parse(target).map_err(|e| e.message)?;
        Ok(ReverseMapping {
            prefix: p.to_owned(),
            target,
        })
    }
}

/// How a request named its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The default `/hc/coap://...` form.
    Default,
    /// Through the reverse mapping with this index.
    Reverse(usize),
}

/// Finds the CoAP target of an HTTP request target (path and query, as
/// received). `Ok(None)` when the path is neither under `/hc/` nor under a
/// reverse prefix (the caller answers 404 or passes it to other routes).
pub fn resolve_target(
    path_and_query: &str,
    reverse: &[ReverseMapping],
) -> Result<Option<(CoapTarget, Via)>, ProxyError> {
    if let Some(rest) = path_and_query.strip_prefix(HC_PREFIX) {
        // A percent-encoded target (`/hc/coap%3A%2F%2Fhost%2Fpath`) is
        // decoded once; a plain one is parsed as it is.
        let decoded;
        // (`get`: the first 7 bytes may end inside a multi-byte character)
        let encoded = rest.len() > 7
            && rest
                .get(..7)
                .is_some_and(|p| p.eq_ignore_ascii_case("coap%3a"));
        let uri = if encoded {
            decoded = pct_decode(rest)
                .and_then(|v| String::from_utf8(v).ok())
                .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "bad percent-encoding in target"))?;
            decoded.as_str()
        } else {
            rest
        };
        return CoapTarget::parse(uri).map(|t| Some((t, Via::Default)));
    }
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let best = reverse
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            path == m.prefix
                || (path.starts_with(&m.prefix)
                    && path.as_bytes().get(m.prefix.len()) == Some(&b'/'))
        })
        .max_by_key(|(_, m)| m.prefix.len());
    let Some((i, m)) = best else {
        return Ok(None);
    };
    let mut t = m.target.clone();
    let rest = &path[m.prefix.len()..];
    // `/prefix/` adds no segment, as `coap://host/` has no Uri-Path.
    if let Some(rest) = rest.strip_prefix('/').filter(|r| !r.is_empty()) {
        for s in rest.split('/') {
            t.path.push(
                pct_decode(s)
                    .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "bad percent-encoding in path"))?,
            );
        }
    }
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        for s in q.split('&') {
            t.query
                .push(pct_decode(s).ok_or_else(|| {
                    bad(StatusCode::BAD_REQUEST, "bad percent-encoding in query")
                })?);
        }
    }
    Ok(Some((t, Via::Reverse(i))))
}

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

/// Media types with a Content-Format, as this proxy maps them (RFC 7252
/// section 12.3 and the CoRE registry's common entries).
const MEDIA: &[(u16, &str)] = &[
    (0, "text/plain;charset=utf-8"),
    (40, "application/link-format"),
    (41, "application/xml"),
    (42, "application/octet-stream"),
    (47, "application/exi"),
    (50, "application/json"),
    (60, "application/cbor"),
    (110, "application/senml+json"),
    (112, "application/senml+cbor"),
];

/// The HTTP Content-Type for a Content-Format.
pub fn content_type_for(cf: u16) -> String {
    match MEDIA.iter().find(|(n, _)| *n == cf) {
        Some((0, _)) => "text/plain; charset=utf-8".to_owned(),
        Some((_, m)) => (*m).to_owned(),
        None => format!("application/coap-payload; cf={cf}"),
    }
}

/// The Content-Format for an HTTP media type (parameters other than
/// `charset` on text/plain and `cf` on application/coap-payload are
/// ignored). `None` when it has none.
pub fn content_format_for(media: &str) -> Option<u16> {
    let mut parts = media.split(';').map(|p| p.trim());
    let ty = parts.next()?.to_ascii_lowercase();
    let params: Vec<(String, String)> = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_ascii_lowercase(),
                v.trim().trim_matches('"').to_ascii_lowercase(),
            )
        })
        .collect();
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    match ty.as_str() {
        "text/plain" => match param("charset") {
            None | Some("utf-8") | Some("us-ascii") => Some(0),
            Some(_) => None,
        },
        "application/coap-payload" => param("cf")?.parse().ok(),
        _ => MEDIA
            .iter()
            .find(|(n, m)| *n != 0 && *m == ty)
            .map(|(n, _)| *n),
    }
}

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
pub const MAPPED_REQUEST_HEADERS: [HeaderName; 6] = [
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

/// A CoAP response received upstream (the core's cache representation).
pub use mintgate_coap::cache::Response as CoapResponse;

/// Options of a response this proxy understands; any other critical option
/// makes the response unintelligible (RFC 7252 section 5.4.1).
pub const KNOWN_RESPONSE_OPTIONS: [OptionNumber; 8] = [
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
    for (n, v) in &resp.options {
        match *n {
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
    if resp.cacheable_code() {
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

#[cfg(test)]
mod tests;
