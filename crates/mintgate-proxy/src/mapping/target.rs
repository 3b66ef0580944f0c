//! Which CoAP resource an HTTP request names: the default form
//! `/hc/coap://host[:port]/path?query` (RFC 8075 section 5.3, percent-encoded
//! or not) and configured reverse mappings (longest prefix first, on segment
//! boundaries), with the authority, percent-coding and path/query pieces
//! they are made of.
//!
//! Invariant: a target either parses into host, port, Uri-Path and
//! Uri-Query values or is refused with a [`ProxyError`] (400, or 501 for a
//! scheme other than `coap`); a path under neither form is no target at
//! all (`Ok(None)`), and nothing here panics on any input.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use http::StatusCode;

use super::{bad, ProxyError};

/// The CoAP default port (RFC 7252 section 6.1).
pub const COAP_PORT: u16 = 5683;
/// The path prefix of the default mapping (RFC 8075 section 5.3).
pub const HC_PREFIX: &str = "/hc/";

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

pub(super) fn encode_path(segs: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for seg in segs {
        s.push('/');
        s.push_str(&pct_encode(seg, false));
    }
    s
}

pub(super) fn encode_query(q: &[Vec<u8>]) -> String {
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
