// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! `coap://` URIs (RFC 7252 section 6.4), `coaps://`, and `coap+tcp://`,
//! `coaps+tcp://`, `coap+ws://` and `coaps+ws://` (RFC 8323 section 8):
//! split into a destination and the Uri-Host, Uri-Path and Uri-Query
//! options a request carries.
//!
//! Pure: a host name is kept as a name; resolving it is the caller's I/O.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::OptionNumber;

/// The default CoAP port (RFC 7252 6.1).
pub const DEFAULT_PORT: u16 = 5683;

/// The host of a URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// An IPv4 address or an IPv6 address written in brackets.
    Ip(IpAddr),
    /// A registered name, lower-cased and percent-decoded.
    Name(String),
}

/// A parsed `coap://host[:port]/path?query`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoapUri {
    /// The host.
    pub host: Host,
    /// The port (5683 when absent).
    pub port: u16,
    /// Uri-Host (for a name), Uri-Path and Uri-Query options, in that order.
    pub options: Vec<(OptionNumber, Vec<u8>)>,
}

/// Why a string is not a usable `coap://` URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriError(pub String);

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UriError {}

macro_rules! bail {
    ($($t:tt)*) => { return Err(UriError(format!($($t)*))) };
}

impl std::str::FromStr for CoapUri {
    type Err = UriError;
    fn from_str(s: &str) -> Result<CoapUri, UriError> {
        parse(s)
    }
}

/// The default coaps port (RFC 7252 6.2).
pub const DEFAULT_SECURE_PORT: u16 = 5684;

/// Splits a `coap://host[:port]/path?query` URI into destination and
/// options, following the steps of RFC 7252 section 6.4.
pub fn parse(s: &str) -> Result<CoapUri, UriError> {
    match parse_scheme(s)? {
        (u, Scheme::Coap) => Ok(u),
        (_, Scheme::Coaps) => bail!(
            "unsupported scheme 'coaps' here: only coap:// (CoAP over UDP, no DTLS) is supported"
        ),
        (_, Scheme::CoapTcp | Scheme::CoapsTcp | Scheme::CoapWs | Scheme::CoapsWs) => {
            bail!(
                "unsupported scheme '{}' here: only coap:// (CoAP over UDP) is supported",
                tcp_name(s)
            )
        }
    }
}

/// Like [`parse`], and also takes `coaps://` (CoAP over DTLS, RFC 7252
/// 6.2; port 5684 when absent): true for a coaps URI.
pub fn parse_any(s: &str) -> Result<(CoapUri, bool), UriError> {
    match parse_scheme(s)? {
        (u, Scheme::Coap) => Ok((u, false)),
        (u, Scheme::Coaps) => Ok((u, true)),
        (_, Scheme::CoapTcp | Scheme::CoapsTcp | Scheme::CoapWs | Scheme::CoapsWs) => {
            bail!(
                "unsupported scheme '{}' here: coap:// (CoAP over UDP) or coaps:// (over DTLS)",
                tcp_name(s)
            )
        }
    }
}

/// The scheme (`coap+tcp`, `coap+ws`, ...) as `s` spells it.
fn tcp_name(s: &str) -> &str {
    s.split_once("://").map_or(s, |(scheme, _)| scheme)
}

/// The transport a URI names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `coap://`: UDP.
    Coap,
    /// `coaps://`: DTLS (port 5684 when absent).
    Coaps,
    /// `coap+tcp://`: TCP (RFC 8323 8.1; port 5683 when absent).
    CoapTcp,
    /// `coaps+tcp://`: TLS over TCP (RFC 8323 8.2; port 5684 when absent).
    CoapsTcp,
    /// `coap+ws://`: WebSockets (RFC 8323 8.3; port 80 when absent), at
    /// `/.well-known/coap` on the host.
    CoapWs,
    /// `coaps+ws://`: WebSockets over TLS (RFC 8323 8.4; port 443 when
    /// absent).
    CoapsWs,
}

impl Scheme {
    /// The port when the URI gives none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Coap | Scheme::CoapTcp => DEFAULT_PORT,
            Scheme::Coaps | Scheme::CoapsTcp => DEFAULT_SECURE_PORT,
            Scheme::CoapWs => 80,
            Scheme::CoapsWs => 443,
        }
    }
}

/// Like [`parse`], for every scheme of [`Scheme`].
pub fn parse_scheme(s: &str) -> Result<(CoapUri, Scheme), UriError> {
    let Some((scheme, rest)) = s.split_once("://") else {
        bail!("expected coap://host[:port]/path");
    };
    let kind = if scheme.eq_ignore_ascii_case("coap") {
        Scheme::Coap
    } else if scheme.eq_ignore_ascii_case("coaps") {
        Scheme::Coaps
    } else if scheme.eq_ignore_ascii_case("coap+tcp") {
        Scheme::CoapTcp
    } else if scheme.eq_ignore_ascii_case("coaps+tcp") {
        Scheme::CoapsTcp
    } else if scheme.eq_ignore_ascii_case("coap+ws") {
        Scheme::CoapWs
    } else if scheme.eq_ignore_ascii_case("coaps+ws") {
        Scheme::CoapsWs
    } else {
        bail!(
            "unsupported scheme '{scheme}': coap:// (CoAP over UDP), coaps:// (over DTLS), \
             coap+tcp:// (over TCP), coaps+tcp:// (over TLS), coap+ws:// (over WebSockets) or \
             coaps+ws:// (over WebSockets and TLS)"
        );
    };
    if rest.contains('#') {
        bail!("a CoAP URI must not have a fragment ('#...')");
    }
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_query) = rest.split_at(auth_end);
    if authority.contains('@') {
        bail!("user information ('user@') is not allowed in a CoAP URI");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            bail!("missing ']' after the IPv6 address");
        };
        if addr.contains('%') {
            bail!("IPv6 zone identifiers are not supported");
        }
        let Ok(ip) = addr.parse::<Ipv6Addr>() else {
            bail!("'{addr}' is not an IPv6 address");
        };
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => bail!("unexpected '{p}' after the IPv6 address"),
            },
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, p) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if h.is_empty() {
            bail!("missing host");
        }
        if h.contains(':') {
            bail!("an IPv6 address must be written in brackets, e.g. coap://[::1]/");
        }
        let host = match h.parse::<Ipv4Addr>() {
            Ok(ip) => Host::Ip(IpAddr::V4(ip)),
            Err(_) => {
                let name = percent_decode(h).map_err(|e| UriError(format!("in the host: {e}")))?;
                let Ok(name) = String::from_utf8(name) else {
                    bail!("the host name is not UTF-8");
                };
                let name = name.to_ascii_lowercase();
                if name.is_empty() || name.len() > 255 {
                    bail!("host name must be 1 to 255 bytes long");
                }
                Host::Name(name)
            }
        };
        (host, p)
    };
    let port = match port {
        None | Some("") => kind.default_port(),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => bail!("invalid port '{p}' (1-65535)"),
        },
    };

    let mut options = Vec::new();
    if let Host::Name(name) = &host {
        options.push((OptionNumber::URI_HOST, name.clone().into_bytes()));
    }
    let (path, query) = match path_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_query, None),
    };
    if !path.is_empty() && path != "/" {
        let segments = path.strip_prefix('/').unwrap_or(path);
        for seg in segments.split('/') {
            let v = percent_decode(seg)
                .map_err(|e| UriError(format!("in path segment '{seg}': {e}")))?;
            if v.len() > 255 {
                bail!("path segment '{seg}' is longer than 255 bytes");
            }
            options.push((OptionNumber::URI_PATH, v));
        }
    }
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        for arg in q.split('&') {
            let v = percent_decode(arg)
                .map_err(|e| UriError(format!("in query parameter '{arg}': {e}")))?;
            if v.len() > 255 {
                bail!("query parameter '{arg}' is longer than 255 bytes");
            }
            options.push((OptionNumber::URI_QUERY, v));
        }
    }
    Ok((
        CoapUri {
            host,
            port,
            options,
        },
        kind,
    ))
}

/// Decodes `%XX` escapes.
fn percent_decode(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            match (hex_digit(b.get(i + 1)), hex_digit(b.get(i + 2))) {
                (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                _ => return Err(format!("bad percent-encoding at '{}'", &s[i..])),
            }
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    Ok(out)
}

/// The value of one hex digit.
fn hex_digit(c: Option<&u8>) -> Option<u8> {
    c.and_then(|c| (*c as char).to_digit(16)).map(|d| d as u8)
}

/// Whether an HTTP request's authority (its `Host` header, or the
/// `:authority` of HTTP/2 and HTTP/3; RFC 3986 `host[:port]` syntax, as
/// in `coap://` URIs) names this gateway, against DNS rebinding: a web
/// page on `evil.example` whose name is made to resolve to the gateway's
/// address (or to 127.0.0.1 on the gateway's own host) makes the browser
/// send `Host: evil.example`, and is refused here.
///
/// Allowed: no authority at all (not a browser); any IP literal (a page
/// can only be served under an IP literal by that address itself, so no
/// rebinding is possible; the listener's own address and loopback are of
/// this kind); `localhost`; and the names in `allowed` (compared without
/// case or a trailing dot, a port in an entry ignored; `"*"` allows every
/// name). Anything else, a malformed value included, is refused.
pub fn host_allowed(authority: Option<&str>, allowed: &[String]) -> bool {
    let Some(a) = authority else {
        return true;
    };
    let Some(host) = authority_host(a) else {
        return false;
    };
    if host.parse::<IpAddr>().is_ok() || host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    allowed
        .iter()
        .any(|e| e == "*" || authority_host(e).is_some_and(|n| n.eq_ignore_ascii_case(host)))
}

/// The host of an HTTP authority `host[:port]` or `[v6][:port]`, without
/// a trailing dot; `None` when malformed (empty, a bad port, userinfo, a
/// path, a character other than letters, digits, `-`, `.`, `_`).
pub fn authority_host(a: &str) -> Option<&str> {
    let a = a.trim();
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        h.parse::<Ipv6Addr>().ok()?;
        (h, after.strip_prefix(':'))
    } else {
        match a.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return None;
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    ok.then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(u: &CoapUri) -> Vec<(u16, String)> {
        u.options
            .iter()
            .map(|(n, v)| (n.0, String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    #[test]
    fn parses_ipv4_ipv6_and_names() {
        let u = parse("coap://127.0.0.1:5699/request").unwrap();
        assert_eq!(u.host, Host::Ip("127.0.0.1".parse().unwrap()));
        assert_eq!(u.port, 5699);
        assert_eq!(opts(&u), vec![(11, "request".into())]);

        let u = parse("coap://[::1]/a/b?x=1&y=%20z").unwrap();
        assert_eq!(u.host, Host::Ip("::1".parse().unwrap()));
        assert_eq!(u.port, 5683);
        assert_eq!(
            opts(&u),
            vec![
                (11, "a".into()),
                (11, "b".into()),
                (15, "x=1".into()),
                (15, "y= z".into())
            ]
        );

        let u = parse("COAP://Example.COM:61616").unwrap();
        assert_eq!(u.host, Host::Name("example.com".into()));
        assert_eq!(opts(&u), vec![(3, "example.com".into())]);
        assert_eq!(parse("coap://[::1]:7/").unwrap().port, 7);
    }

    #[test]
    fn percent_decodes_path_segments_and_keeps_empty_ones() {
        let u = parse("coap://h/a%2Fb/%C3%A9/").unwrap();
        assert_eq!(
            opts(&u)[1..],
            [(11, "a/b".into()), (11, "é".into()), (11, "".into())]
        );
    }

    #[test]
    fn coaps_takes_port_5684_by_default() {
        let (u, secure) = parse_any("coaps://127.0.0.1/request").unwrap();
        assert!(secure);
        assert_eq!(u.port, 5684);
        assert_eq!(opts(&u), [(11, "request".into())]);
        let (u, secure) = parse_any("COAP://h:7/").unwrap();
        assert!(!secure);
        assert_eq!(u.port, 7);
        assert_eq!(parse_any("coaps://[::1]:9/").unwrap().0.port, 9);
    }

    #[test]
    fn coap_tcp_takes_port_5683_by_default() {
        let (u, k) = parse_scheme("coap+tcp://127.0.0.1/a?b").unwrap();
        assert_eq!((k, u.port), (Scheme::CoapTcp, 5683));
        let (tls, k) = parse_scheme("COAPS+TCP://localhost/a").unwrap();
        assert_eq!((k, tls.port), (Scheme::CoapsTcp, 5684));
        assert!(parse_any("coaps+tcp://h/")
            .unwrap_err()
            .to_string()
            .contains("'coaps+tcp' here"));
        assert_eq!(opts(&u), [(11, "a".into()), (15, "b".into())]);
        assert_eq!(parse_scheme("COAP+TCP://[::1]:9/").unwrap().0.port, 9);
        assert_eq!(parse_scheme("coaps://h/").unwrap().1, Scheme::Coaps);
        let e = parse_any("coap+tcp://h/").unwrap_err().to_string();
        assert!(e.contains("'coap+tcp' here"), "{e}");
        assert!(parse("coap+tcp://h/").is_err());
    }

    #[test]
    fn coap_ws_takes_the_http_ports_by_default() {
        let (u, k) = parse_scheme("coap+ws://127.0.0.1/a").unwrap();
        assert_eq!((k, u.port), (Scheme::CoapWs, 80));
        let (u, k) = parse_scheme("COAPS+WS://example.org:8443/a").unwrap();
        assert_eq!((k, u.port), (Scheme::CoapsWs, 8443));
        assert_eq!(parse_scheme("coaps+ws://h/").unwrap().0.port, 443);
        assert!(parse_any("coap+ws://h/")
            .unwrap_err()
            .to_string()
            .contains("'coap+ws' here"));
    }

    #[test]
    fn rejects_bad_uris_with_reasons() {
        for (uri, why) in [
            ("http://h/", "unsupported scheme"),
            ("coaps://h/", "unsupported scheme 'coaps' here"),
            ("ftp://h/", "unsupported scheme 'ftp'"),
            ("h/path", "expected coap://"),
            ("coap:///path", "missing host"),
            ("coap://h:0/", "invalid port"),
            ("coap://h:99999/", "invalid port"),
            ("coap://h:x/", "invalid port"),
            ("coap://[::1/", "missing ']'"),
            ("coap://[zz]/", "not an IPv6 address"),
            ("coap://::1/", "in brackets"),
            ("coap://h/a%zz", "percent-encoding"),
            ("coap://h/a%4", "percent-encoding"),
            ("coap://h/a#frag", "fragment"),
            ("coap://u@h/", "user information"),
        ] {
            let e = parse(uri).unwrap_err().to_string();
            assert!(e.contains(why), "{uri}: {e}");
        }
    }

    #[test]
    fn hosts_against_dns_rebinding() {
        let none: Vec<String> = Vec::new();
        let named = vec!["Gateway.example.".to_owned(), "lab:8080".to_owned()];
        for ok in [
            None,
            Some("127.0.0.1:8080"),
            Some("127.0.0.1"),
            Some("[::1]:8080"),
            Some("[::ffff:127.0.0.1]"),
            Some("192.0.2.7:80"),
            Some("localhost:8080"),
            Some("LOCALHOST"),
        ] {
            assert!(host_allowed(ok, &none), "{ok:?}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "",
            ":8080",
            "[::1",
            "[evil]:80",
            "user@127.0.0.1",
            "127.0.0.1:99999",
            "127.0.0.1/x",
            "gateway.example",
        ] {
            assert!(!host_allowed(Some(bad), &none), "{bad}");
        }
        for ok in ["gateway.example", "GATEWAY.example.:8443", "lab", "lab:1"] {
            assert!(host_allowed(Some(ok), &named), "{ok}");
        }
        assert!(!host_allowed(Some("other.example"), &named));
        assert!(host_allowed(Some("other.example"), &["*".to_owned()]));
    }
}
