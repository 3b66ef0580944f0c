//! Properties of `coap://` URI parsing (`mintgate_coap::uri`): total on
//! any text, and a URI built from options (fully percent-encoded) parses
//! back to exactly those options.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mintgate_coap::uri::{host_allowed, parse, Host};
use mintgate_coap::wire::OptionNumber;
use proptest::prelude::*;

fn enc(v: &[u8]) -> String {
    v.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "%{b:02x}");
        s
    })
}

fn host() -> impl Strategy<Value = Host> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|a| Host::Ip(IpAddr::V4(Ipv4Addr::from(a)))),
        any::<[u16; 8]>().prop_map(|a| Host::Ip(IpAddr::V6(Ipv6Addr::from(a)))),
        "[a-z][a-z0-9.-]{0,20}".prop_map(Host::Name),
    ]
}

/// Parts whose URI form is unambiguous: a lone empty segment or query
/// part is written as nothing at all.
fn parts() -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 0..4)
        .prop_filter("a lone empty part", |p| p.as_slice() != [Vec::<u8>::new()])
}

proptest! {
    #[test]
    fn any_text_parses_or_says_why(s in "(coap://)?[ -~]{0,40}") {
        match parse(&s) {
            Ok(u) => {
                prop_assert_ne!(u.port, 0);
                prop_assert!(u.options.iter().all(|(_, v)| v.len() <= 255));
            }
            Err(e) => prop_assert!(!e.0.is_empty()),
        }
    }

    #[test]
    fn built_uris_parse_to_their_options(h in host(), port in 1u16.., path in parts(), query in parts()) {
        let hs = match &h {
            Host::Ip(IpAddr::V4(a)) => a.to_string(),
            Host::Ip(IpAddr::V6(a)) => format!("[{a}]"),
            Host::Name(n) => n.clone(),
        };
        let mut s = format!("coap://{hs}:{port}");
        for seg in &path {
            s.push('/');
            s.push_str(&enc(seg));
        }
        if !query.is_empty() {
            s.push('?');
            s.push_str(&query.iter().map(|q| enc(q)).collect::<Vec<_>>().join("&"));
        }
        let u = parse(&s).unwrap();
        // a name that happens to be an IPv4 address is one
        let want_host = match h {
            Host::Name(n) => match n.parse::<Ipv4Addr>() {
                Ok(a) => Host::Ip(IpAddr::V4(a)),
                Err(_) => Host::Name(n),
            },
            h => h,
        };
        prop_assert_eq!(&u.host, &want_host);
        prop_assert_eq!(u.port, port);
        let mut want = Vec::new();
        if let Host::Name(n) = &want_host {
            want.push((OptionNumber::URI_HOST, n.as_bytes().to_vec()));
        }
        want.extend(path.into_iter().map(|v| (OptionNumber::URI_PATH, v)));
        want.extend(query.into_iter().map(|v| (OptionNumber::URI_QUERY, v)));
        prop_assert_eq!(u.options, want, "{}", s);
    }

    /// The Host check is total, allows every IP literal and `localhost`
    /// with any port, and a name only when listed (or `"*"`).
    #[test]
    fn host_check_allows_literals_and_listed_names_only(
        h in host(),
        port in proptest::option::of(any::<u16>()),
        junk in "\\PC{0,40}",
    ) {
        let _ = host_allowed(Some(&junk), &[]);
        let text = match &h {
            Host::Ip(IpAddr::V6(a)) => format!("[{a}]"),
            Host::Ip(a) => a.to_string(),
            Host::Name(n) => n.clone(),
        };
        let a = match port {
            Some(p) => format!("{text}:{p}"),
            None => text.clone(),
        };
        let literal = matches!(h, Host::Ip(_)) || text == "localhost";
        prop_assert_eq!(host_allowed(Some(&a), &[]), literal, "{}", a);
        prop_assert!(host_allowed(Some(&a), &[text.to_uppercase()]), "{}", a);
        prop_assert!(literal || !host_allowed(Some(&a), &[format!("x{text}")]), "{}", a);
        prop_assert!(host_allowed(Some(&a), &["*".to_owned()]));
    }
}
