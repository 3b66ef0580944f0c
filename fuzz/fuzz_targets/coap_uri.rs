//! `coap://` URI parsing (`mintgate_coap::uri::parse`, RFC 7252 section
//! 6.4) on arbitrary text. An accepted URI must give options in order
//! (Uri-Host, Uri-Path, Uri-Query), none over 255 bytes, a non-zero port,
//! and written back fully percent-encoded it must parse to the same value.
//! The same text as an HTTP authority (`uri::host_allowed`, the check
//! against DNS rebinding): no panic, and a name it allows with no list is
//! an IP literal or `localhost`.
#![no_main]

use std::fmt::Write as _;

use libfuzzer_sys::fuzz_target;
use mintgate_coap::uri::{host_allowed, parse, CoapUri, Host};
use mintgate_coap::wire::OptionNumber;

/// Every byte as `%XX`: nothing in it can be read as a delimiter.
fn enc(v: &[u8]) -> String {
    let mut s = String::with_capacity(v.len() * 3);
    for b in v {
        let _ = write!(s, "%{b:02X}");
    }
    s
}

fn write_back(u: &CoapUri) -> String {
    let host = match &u.host {
        Host::Ip(std::net::IpAddr::V4(a)) => a.to_string(),
        Host::Ip(std::net::IpAddr::V6(a)) => format!("[{a}]"),
        Host::Name(n) => enc(n.as_bytes()),
    };
    let mut s = format!("coap://{host}:{}", u.port);
    let of = |n: OptionNumber| {
        u.options
            .iter()
            .filter(move |(o, _)| *o == n)
            .map(|(_, v)| enc(v))
            .collect::<Vec<_>>()
    };
    let path = of(OptionNumber::URI_PATH);
    if !path.is_empty() {
        s.push('/');
        s.push_str(&path.join("/"));
    }
    let query = of(OptionNumber::URI_QUERY);
    if !query.is_empty() {
        s.push('?');
        s.push_str(&query.join("&"));
    }
    s
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if host_allowed(Some(s), &[]) {
        let h = s.trim();
        let h = match h.strip_prefix('[') {
            Some(r) => r.split_once(']').map(|(h, _)| h).unwrap_or(""),
            None => h.split(':').next().unwrap_or(""),
        };
        let h = h.strip_suffix('.').unwrap_or(h);
        assert!(
            h.parse::<std::net::IpAddr>().is_ok() || h.eq_ignore_ascii_case("localhost"),
            "{s:?} allowed without a list"
        );
    }
    assert!(host_allowed(Some(s), &["*".to_owned()]) || !host_allowed(Some(s), &[]));
    let u = match parse(s) {
        Ok(u) => u,
        Err(e) => {
            assert!(!e.0.is_empty(), "an error without a reason");
            return;
        }
    };
    assert_ne!(u.port, 0);
    let mut last = 0u16;
    for (n, v) in &u.options {
        assert!(
            [
                OptionNumber::URI_HOST,
                OptionNumber::URI_PATH,
                OptionNumber::URI_QUERY
            ]
            .contains(n),
            "unexpected option {n:?}"
        );
        assert!(n.0 >= last, "options out of order: {:?}", u.options);
        last = n.0;
        assert!(v.len() <= 255, "option {n:?} of {} bytes", v.len());
    }
    let host_opts = u
        .options
        .iter()
        .filter(|(n, _)| *n == OptionNumber::URI_HOST)
        .count();
    match &u.host {
        Host::Name(n) => {
            assert_eq!(host_opts, 1);
            assert!(!n.is_empty() && n.len() <= 255);
            assert_eq!(n, &n.to_ascii_lowercase(), "host name not lower-cased");
        }
        Host::Ip(_) => assert_eq!(host_opts, 0, "Uri-Host for an IP literal"),
    }
    let back = write_back(&u);
    match parse(&back) {
        Ok(u2) => assert_eq!(u2, u, "{s:?} -> {back:?}"),
        Err(e) => panic!("{s:?} written back as {back:?} does not parse: {e}"),
    }
});
