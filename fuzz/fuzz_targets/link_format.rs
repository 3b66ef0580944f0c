//! RFC 6690 link-format: the reader (`link_format::parse`) on arbitrary
//! text (input starting with a 0 byte), and the document
//! `/.well-known/core` answers (`Router::well_known_core`) with resources
//! whose attribute values come from the input (device names, units and
//! titles come from config and device metadata) and a filter query from
//! the input (it comes off the network). The whole document must read
//! back as link-format with every attribute value as written, and a
//! filtered document must list a subset of the links, in order, never
//! leaving out one whose attribute equals the filter's value.
#![no_main]

use libfuzzer_sys::arbitrary::{Result as UResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use mintgate_coap::link_format::{self, LinkFormatError};
use mintgate_coap::server::{Resource, Router};

/// A link as the crate's reader gives it, as a tuple.
type Link = (String, Vec<(String, Option<String>)>);

fn read_links(doc: &str) -> Result<Vec<Link>, LinkFormatError> {
    Ok(link_format::parse(doc)?
        .into_iter()
        .map(|l| (l.uri, l.attrs))
        .collect())
}

const KEYS: &[&str] = &["rt", "if", "ct", "sz", "title", "obs", "u", "rel"];

fn text(u: &mut Unstructured<'_>, max: usize) -> UResult<String> {
    let n = u.int_in_range(0..=max)?;
    let mut s = String::new();
    for _ in 0..n {
        // Mostly printable ASCII, with the characters that need quoting.
        let c = match u.int_in_range(0u8..=9)? {
            0 => '"',
            1 => '\\',
            2 => ',',
            3 => ';',
            4 => ' ',
            5 => '*',
            6 => char::from_u32(u.int_in_range(0x80u32..=0x2FFF)?).unwrap_or('?'),
            _ => u.int_in_range(0x21u8..=0x7e)? as char,
        };
        s.push(c);
    }
    Ok(s)
}

type Built = (Vec<(Resource, Link)>, Option<String>);

fn build(u: &mut Unstructured<'_>) -> UResult<Built> {
    let mut rs = Vec::new();
    for i in 0..u.int_in_range(0..=5)? {
        // Paths as the gateway makes them: segments of name characters.
        let mut path = format!("r{i}");
        for _ in 0..u.int_in_range(0..=2)? {
            path.push('/');
            let n = u.int_in_range(1..=6)?;
            for _ in 0..n {
                let c = *u.choose(b"abcXYZ019_-.")?;
                path.push(c as char);
            }
        }
        let mut r = Resource::new(&path);
        let mut attrs = Vec::new();
        for _ in 0..u.int_in_range(0..=4)? {
            let k = *u.choose(KEYS)?;
            if u.ratio(1, 5)? {
                r = r.flag(k);
                attrs.push((k.to_string(), None));
            } else {
                let v = text(u, 12)?;
                r = r.attr(k, &v);
                attrs.push((k.to_string(), Some(v)));
            }
        }
        rs.push((r, (format!("/{path}"), attrs)));
    }
    let filter = if u.arbitrary()? {
        Some(text(u, 16)?)
    } else {
        None
    };
    Ok((rs, filter))
}

fuzz_target!(|data: &[u8]| {
    // Mode 1: the input is a document from another server.
    if let Some((&0, doc)) = data.split_first() {
        if let Ok(doc) = std::str::from_utf8(doc) {
            match link_format::parse(doc) {
                Ok(links) => assert!(links.len() <= doc.matches(',').count() + 1),
                Err(e) => assert!(e.at <= doc.len()),
            }
        }
        return;
    }
    // Mode 2: resources and a filter query from the input.
    let mut u = Unstructured::new(data);
    let Ok((resources, filter)) = build(&mut u) else {
        return;
    };
    let mut router = Router::new();
    let mut written: Vec<Link> = Vec::new();
    for (r, link) in resources {
        if router.add(r).is_ok() {
            written.push(link);
        }
    }
    let full = router.well_known_core(None);
    let links = match read_links(&full) {
        Ok(l) => l,
        Err(e) => panic!("/.well-known/core is not link-format ({e}): {full:?}"),
    };
    // Every link and attribute value reads back exactly as registered.
    assert_eq!(links, written, "document: {full:?}");
    let Some(q) = filter else {
        return;
    };
    let part = router.well_known_core(Some(&q));
    let sub = match read_links(&part) {
        Ok(l) => l,
        Err(e) => panic!("filtered document is not link-format ({e}): {part:?}"),
    };
    let mut from = 0;
    for l in &sub {
        // a subsequence of the full document, in order
        match links[from..].iter().position(|f| f == l) {
            Some(p) => from += p + 1,
            None => panic!("filtered link {l:?} not in {links:?}"),
        }
    }
    match q.split_once('=') {
        None => assert_eq!(sub, links, "a query without = filters nothing"),
        Some((k, v)) if !v.ends_with('*') => {
            // A link holding exactly that value is never filtered out.
            for l in &links {
                let hit = (k == "href" && l.0 == v)
                    || l.1.iter().any(|(a, x)| a == k && x.as_deref() == Some(v));
                assert!(
                    !hit || sub.contains(l),
                    "{l:?} matches {q:?} but was left out"
                );
            }
        }
        Some(_) => {}
    }
});
