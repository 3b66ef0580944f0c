// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! Reading RFC 6690 link-format documents, as `/.well-known/core` answers
//! them: `<URI>;name;name=token;name="quoted, \"text\""`, links separated
//! by commas. A backslash in a quoted value escapes the next character
//! (RFC 6690 section 2 takes quoted-string from RFC 2616).
//!
//! Strict and total: any text gives the links or an error with the byte
//! offset where reading stopped; no whitespace is allowed between the
//! parts (none of the servers we talk to writes any).

use std::fmt;

/// One link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The target, as written between `<` and `>`.
    pub uri: String,
    /// Attributes in order: name and value (`None` for a bare `;obs`).
    pub attrs: Vec<(String, Option<String>)>,
}

impl Link {
    /// The value of the first attribute `name` (`Some("")` for a bare one).
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref().unwrap_or(""))
    }
}

/// Why a document is not link-format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkFormatError {
    /// Byte offset where reading stopped.
    pub at: usize,
    /// What was expected there.
    pub why: &'static str,
}

impl fmt::Display for LinkFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not link-format at byte {}: {}", self.at, self.why)
    }
}

impl std::error::Error for LinkFormatError {}

/// Characters an attribute name may not hold.
fn name_char(c: char) -> bool {
    !c.is_whitespace() && !c.is_control() && !"=;,\"<>".contains(c)
}

/// Reads a whole document; an empty one has no links.
pub fn parse(doc: &str) -> Result<Vec<Link>, LinkFormatError> {
    let mut it = doc.char_indices().peekable();
    let end = doc.len();
    let err = |at: Option<(usize, char)>, why| LinkFormatError {
        at: at.map_or(end, |(i, _)| i),
        why,
    };
    let mut links = Vec::new();
    if doc.is_empty() {
        return Ok(links);
    }
    loop {
        match it.next() {
            Some((_, '<')) => {}
            other => return Err(err(other, "expected `<`")),
        }
        let mut uri = String::new();
        loop {
            match it.next() {
                Some((_, '>')) => break,
                Some((i, '<')) => return Err(err(Some((i, '<')), "`<` inside a URI")),
                Some((_, c)) => uri.push(c),
                None => return Err(err(None, "missing `>`")),
            }
        }
        let mut attrs = Vec::new();
        while it.next_if(|(_, c)| *c == ';').is_some() {
            let mut name = String::new();
            while let Some((_, c)) = it.next_if(|(_, c)| name_char(*c)) {
                name.push(c);
            }
            if name.is_empty() {
                return Err(err(it.peek().copied(), "expected an attribute name"));
            }
            if it.next_if(|(_, c)| *c == '=').is_none() {
                attrs.push((name, None));
                continue;
            }
            let mut value = String::new();
            if it.next_if(|(_, c)| *c == '"').is_some() {
                loop {
                    match it.next() {
                        Some((_, '"')) => break,
                        Some((_, '\\')) => match it.next() {
                            Some((_, c)) => value.push(c),
                            None => return Err(err(None, "a backslash at the end")),
                        },
                        Some((_, c)) => value.push(c),
                        None => return Err(err(None, "missing closing `\"`")),
                    }
                }
            } else {
                while let Some((i, c)) = it.next_if(|(_, c)| *c != ';' && *c != ',') {
                    if c == '"' || c.is_whitespace() || c.is_control() {
                        return Err(err(Some((i, c)), "bad character in a value"));
                    }
                    value.push(c);
                }
            }
            attrs.push((name, Some(value)));
        }
        links.push(Link { uri, attrs });
        match it.next() {
            None => return Ok(links),
            Some((_, ',')) => {}
            other => return Err(err(other, "expected `;`, `,` or the end")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{Resource, Router};
    use proptest::prelude::*;

    #[test]
    fn reads_links_attributes_and_escapes() {
        let l = parse(r#"</a/b>;rt="x y";ct=0;obs,</c>;title="q\"\\,;""#).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].uri, "/a/b");
        assert_eq!(l[0].attr("rt"), Some("x y"));
        assert_eq!(l[0].attr("ct"), Some("0"));
        assert_eq!(l[0].attr("obs"), Some(""));
        assert_eq!(l[1].attr("title"), Some("q\"\\,;"));
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn refuses_what_is_not_link_format() {
        for (doc, at) in [
            ("/a", 0),
            ("</a", 3),
            ("</a>;", 5),
            ("</a>;t=\"x", 9),
            ("</a>;t=\"x\\", 10),
            ("</a>x", 4),
            ("</a>,", 5),
            ("</a>;t=a b", 8),
        ] {
            assert_eq!(parse(doc).unwrap_err().at, at, "{doc:?}");
        }
    }

    fn value() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[ -~\\\\\"é,;]{0,12}").unwrap()
    }

    proptest! {
        /// Any text: links or an error inside the text, never a panic.
        #[test]
        fn total_on_any_text(s in ".{0,64}") {
            match parse(&s) {
                Ok(links) => prop_assert!(links.len() <= s.matches(',').count() + 1),
                Err(e) => prop_assert!(e.at <= s.len()),
            }
        }

        /// What `/.well-known/core` writes reads back exactly: every link,
        /// every attribute value, whatever characters it holds.
        #[test]
        fn well_known_core_reads_back(
            res in proptest::collection::vec(
                ("[a-z0-9_.-]{1,8}(/[a-z0-9_.-]{1,8}){0,2}",
                 proptest::collection::vec((prop::sample::select(vec!["rt", "if", "ct", "sz", "title", "obs"]), proptest::option::of(value())), 0..4)),
                0..5),
        ) {
            let mut router = Router::new();
            let mut want = Vec::new();
            for (path, attrs) in res {
                let mut r = Resource::new(&path);
                for (k, v) in &attrs {
                    r = match v {
                        Some(v) => r.attr(k, v),
                        None => r.flag(k),
                    };
                }
                if router.add(r).is_ok() {
                    want.push(Link {
                        uri: format!("/{path}"),
                        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                    });
                }
            }
            let doc = router.well_known_core(None);
            prop_assert_eq!(parse(&doc), Ok(want), "{}", doc);
        }
    }
}
