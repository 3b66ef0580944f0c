//! Resources, the router, and /.well-known/core (RFC 6690).

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;

use super::response::ResponseBuilder;
use crate::wire::{Code, ContentFormat, OptionNumber, Packet, RawOption};

/// A request as a handler sees it: a checked view of the datagram, borrowed.
pub struct Request<'a> {
    /// Who sent it.
    pub peer: SocketAddr,
    /// The message.
    pub packet: &'a Packet<&'a [u8]>,
    /// The authenticated identity of the sender when the request came over
    /// a secured transport (coaps: the DTLS session's PSK identity or the
    /// common name of the client certificate) or was protected with OSCORE
    /// (`oscore:NAME`, the gateway's context name; it takes precedence);
    /// `None` over plain CoAP.
    pub identity: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// The method code.
    pub fn method(&self) -> Code {
        self.packet.code()
    }

    /// The Uri-Path segments.
    pub fn path(&self) -> impl Iterator<Item = &'a str> + 'a {
        let p: &'a Packet<&'a [u8]> = self.packet;
        p.options()
            .filter(|o| o.number == OptionNumber::URI_PATH)
            .map(|o| std::str::from_utf8(o.value).unwrap_or("\u{fffd}"))
    }

    /// The path joined with `/` (allocates; for logs and errors).
    pub fn path_string(&self) -> String {
        let mut s = String::new();
        for seg in self.path() {
            s.push('/');
            s.push_str(seg);
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }

    /// The Uri-Query items.
    pub fn query(&self) -> impl Iterator<Item = &'a str> + 'a {
        let p: &'a Packet<&'a [u8]> = self.packet;
        p.options()
            .filter(|o| o.number == OptionNumber::URI_QUERY)
            .filter_map(|o| std::str::from_utf8(o.value).ok())
    }

    /// The first option with `number`.
    pub fn option(&self, number: OptionNumber) -> Option<RawOption<'a>> {
        let p: &'a Packet<&'a [u8]> = self.packet;
        p.options().find(|o| o.number == number)
    }

    /// Content-Format of the payload, if given.
    pub fn content_format(&self) -> Option<ContentFormat> {
        self.option(OptionNumber::CONTENT_FORMAT)
            .and_then(|o| o.uint())
            .map(|v| ContentFormat(v as u16))
    }

    /// The Content-Format asked for in the answer (Accept), if given.
    pub fn accept(&self) -> Option<ContentFormat> {
        // options are in ascending order: stop past Accept (17)
        self.packet
            .options()
            .take_while(|o| o.number <= OptionNumber::ACCEPT)
            .find(|o| o.number == OptionNumber::ACCEPT)
            .and_then(|o| o.uint())
            .map(|v| ContentFormat(v as u16))
    }

    /// The payload.
    pub fn payload(&self) -> &'a [u8] {
        let p: &'a Packet<&'a [u8]> = self.packet;
        p.payload()
    }
}

/// A method handler: fills in the response (code defaults to 2.05 Content).
pub type Handler = Arc<dyn Fn(&Request<'_>, &mut ResponseBuilder) + Send + Sync>;

/// The entity-tag of a resource's current representation (what its GET
/// sends as ETag), for conditional requests.
pub type EtagFn = Arc<dyn Fn() -> Option<Vec<u8>> + Send + Sync>;

const METHODS: [Code; 4] = [Code::GET, Code::POST, Code::PUT, Code::DELETE];

/// A resource: a path, its link attributes and its method handlers.
#[derive(Clone)]
pub struct Resource {
    path: String,
    attrs: Vec<(String, Option<String>)>,
    handlers: [Option<Handler>; 4],
    accepts: Option<Vec<ContentFormat>>,
    etag: Option<EtagFn>,
}

/// What a request's If-Match / If-None-Match options (RFC 7252 5.10.8)
/// ask of a resource that exists.
fn precondition_holds(req: &Request<'_>, current: impl FnOnce() -> Option<Vec<u8>>) -> bool {
    // options are in ascending order: If-Match (1) and If-None-Match (5)
    // come first, so a request without them costs a look at its first
    // option or two
    let mut tags: Vec<&[u8]> = Vec::new();
    for o in req
        .packet
        .options()
        .take_while(|o| o.number <= OptionNumber::IF_NONE_MATCH)
    {
        if o.number == OptionNumber::IF_NONE_MATCH {
            // only if there is no representation: the resource exists
            return false;
        }
        if o.number == OptionNumber::IF_MATCH {
            tags.push(o.value);
        }
    }
    // an empty If-Match matches any representation; else one of the tags
    // must be the current one
    tags.is_empty()
        || tags.iter().any(|t| t.is_empty())
        || current().is_some_and(|now| tags.contains(&now.as_slice()))
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resource")
            .field("path", &self.path)
            .field("attrs", &self.attrs)
            .field("methods", &self.methods())
            .finish()
    }
}

fn method_index(c: Code) -> Option<usize> {
    METHODS.iter().position(|m| *m == c)
}

impl Resource {
    /// A resource at `path` (leading `/` optional) with no handlers yet.
    pub fn new(path: &str) -> Resource {
        Resource {
            path: path.trim_start_matches('/').to_string(),
            attrs: Vec::new(),
            handlers: Default::default(),
            accepts: None,
            etag: None,
        }
    }

    fn on(
        mut self,
        m: Code,
        f: impl Fn(&Request<'_>, &mut ResponseBuilder) + Send + Sync + 'static,
    ) -> Self {
        if let Some(i) = method_index(m) {
            self.handlers[i] = Some(Arc::new(f));
        }
        self
    }

    /// Handles GET.
    pub fn get(
        self,
        f: impl Fn(&Request<'_>, &mut ResponseBuilder) + Send + Sync + 'static,
    ) -> Self {
        self.on(Code::GET, f)
    }

    /// Handles POST.
    pub fn post(
        self,
        f: impl Fn(&Request<'_>, &mut ResponseBuilder) + Send + Sync + 'static,
    ) -> Self {
        self.on(Code::POST, f)
    }

    /// Handles PUT.
    pub fn put(
        self,
        f: impl Fn(&Request<'_>, &mut ResponseBuilder) + Send + Sync + 'static,
    ) -> Self {
        self.on(Code::PUT, f)
    }

    /// Handles DELETE.
    pub fn delete(
        self,
        f: impl Fn(&Request<'_>, &mut ResponseBuilder) + Send + Sync + 'static,
    ) -> Self {
        self.on(Code::DELETE, f)
    }

    /// Adds a link attribute (`rt`, `if`, `ct`, `title`, `sz`, ...).
    pub fn attr(mut self, name: &str, value: &str) -> Self {
        self.attrs.push((name.to_string(), Some(value.to_string())));
        self
    }

    /// Adds a value-less link attribute (e.g. `obs`).
    pub fn flag(mut self, name: &str) -> Self {
        self.attrs.push((name.to_string(), None));
        self
    }

    /// Restricts the Content-Formats accepted in PUT/POST payloads; any
    /// other gets 4.15 before the handler runs.
    pub fn accepts(mut self, formats: &[ContentFormat]) -> Self {
        self.accepts = Some(formats.to_vec());
        self
    }

    /// Gives the entity-tag of the current representation, so that a
    /// request with If-Match can name it. Without one, an If-Match that
    /// names a tag never holds (no tag is current); an empty If-Match and
    /// If-None-Match need none.
    pub fn etag(mut self, f: impl Fn() -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        self.etag = Some(Arc::new(f));
        self
    }

    /// Whether the request's If-Match / If-None-Match options (RFC 7252
    /// 5.10.8) hold for this resource, which exists; when they do not, the
    /// request gets 4.12 Precondition Failed and its handler does not run.
    pub fn precondition_holds(&self, req: &Request<'_>) -> bool {
        precondition_holds(req, || self.etag.as_ref().and_then(|f| f()))
    }

    /// Whether it is observable (has the `obs` link attribute): a GET with
    /// `Observe: 0` registers the client for notifications (RFC 7641).
    pub fn is_observable(&self) -> bool {
        self.attrs.iter().any(|(k, _)| k == "obs")
    }

    /// The path without leading `/`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The methods with a handler.
    pub fn methods(&self) -> Vec<Code> {
        METHODS
            .iter()
            .zip(self.handlers.iter())
            .filter(|(_, h)| h.is_some())
            .map(|(m, _)| *m)
            .collect()
    }

    /// The handler for `m`, if any.
    pub fn handler(&self, m: Code) -> Option<&Handler> {
        method_index(m).and_then(|i| self.handlers[i].as_ref())
    }

    /// Whether a GET asking for `accept` (the Accept option; None: not
    /// asked) can be answered: any format when the resource lists none in
    /// its `ct` attribute, else one it lists. When not, the request gets
    /// 4.06 Not Acceptable (RFC 7252 5.10.4) and its handler does not run.
    pub fn can_answer(&self, accept: Option<ContentFormat>) -> bool {
        let Some(want) = accept else {
            return true;
        };
        match self.attrs.iter().find(|(k, _)| k == "ct") {
            Some((_, Some(list))) => list
                .split_ascii_whitespace()
                .any(|f| f.parse::<u16>() == Ok(want.0)),
            _ => true,
        }
    }

    /// Whether a payload of format `cf` (None: not stated) is accepted.
    pub fn accepts_format(&self, cf: Option<ContentFormat>) -> bool {
        match (&self.accepts, cf) {
            (None, _) | (Some(_), None) => true,
            (Some(list), Some(cf)) => list.contains(&cf),
        }
    }

    fn write_link(&self, out: &mut String) {
        let _ = write!(out, "</{}>", self.path);
        for (k, v) in &self.attrs {
            match v {
                None => {
                    let _ = write!(out, ";{k}");
                }
                Some(v) if is_token(v) && (k == "ct" || k == "sz") => {
                    let _ = write!(out, ";{k}={v}");
                }
                Some(v) => {
                    // quoted-string: a backslash escapes the next character,
                    // so backslashes are escaped as well as quotes
                    let _ = write!(out, ";{k}=\"");
                    for c in v.chars() {
                        if c == '"' || c == '\\' {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                    out.push('"');
                }
            }
        }
    }

    fn matches_filter(&self, name: &str, pattern: &str) -> bool {
        let matches = |v: &str| match pattern.strip_suffix('*') {
            Some(prefix) => v.starts_with(prefix),
            None => v == pattern,
        };
        if name == "href" {
            return matches(&format!("/{}", self.path));
        }
        self.attrs.iter().any(|(k, v)| {
            k == name
                && match v {
                    None => pattern.is_empty() || pattern == "*",
                    // relation types and rt/if may hold several space-separated values
                    Some(v) => matches(v) || v.split(' ').any(matches),
                }
        })
    }
}

fn is_token(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// FNV-1a over path segments, separated by 0xFF (which UTF-8 never has).
fn path_hash<'s>(segs: impl Iterator<Item = &'s [u8]>) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for s in segs {
        for b in s.iter().chain(std::iter::once(&0xFFu8)) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// A resource already exists at that path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTaken(pub String);

impl fmt::Display for PathTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a resource already exists at /{}", self.0)
    }
}

impl std::error::Error for PathTaken {}

/// The resource table. Lookup hashes the request's Uri-Path options in place
/// (no allocation) and confirms segment by segment.
#[derive(Clone, Debug, Default)]
pub struct Router {
    resources: Vec<Resource>,
    index: HashMap<u64, Vec<usize>>,
}

impl Router {
    /// An empty router (`/.well-known/core` is always answered).
    pub fn new() -> Router {
        Router::default()
    }

    fn reindex(&mut self) {
        self.index.clear();
        for (i, r) in self.resources.iter().enumerate() {
            let h = path_hash(segments(&r.path));
            self.index.entry(h).or_default().push(i);
        }
    }

    /// Adds a resource.
    pub fn add(&mut self, r: Resource) -> Result<(), PathTaken> {
        if self.resources.iter().any(|x| x.path == r.path) || r.path == ".well-known/core" {
            return Err(PathTaken(r.path));
        }
        self.resources.push(r);
        self.reindex();
        Ok(())
    }

    /// Removes the resource at `path`; returns it if it existed.
    pub fn remove(&mut self, path: &str) -> Option<Resource> {
        let path = path.trim_start_matches('/');
        let i = self.resources.iter().position(|r| r.path == path)?;
        let r = self.resources.remove(i);
        self.reindex();
        Some(r)
    }

    /// All resources.
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// The resource addressed by `req`'s Uri-Path.
    pub fn find(&self, req: &Request<'_>) -> Option<&Resource> {
        let p = req.packet;
        let segs = || {
            p.options()
                .filter(|o| o.number == OptionNumber::URI_PATH)
                .map(|o| o.value)
        };
        let h = path_hash(segs());
        let cands = self.index.get(&h)?;
        cands
            .iter()
            .map(|i| &self.resources[*i])
            .find(|r| segments(&r.path).eq(segs()))
    }

    /// The RFC 6690 link-format document, filtered by at most one
    /// `name=value` query (value may end in `*` for a prefix match).
    pub fn well_known_core(&self, filter: Option<&str>) -> String {
        let filter = filter.and_then(|q| q.split_once('='));
        let mut out = String::new();
        for r in &self.resources {
            if let Some((k, v)) = filter {
                if !r.matches_filter(k, v) {
                    continue;
                }
            }
            if !out.is_empty() {
                out.push(',');
            }
            r.write_link(&mut out);
        }
        out
    }
}

fn segments(path: &str) -> impl Iterator<Item = &[u8]> {
    let empty = path.is_empty();
    path.split('/').filter(move |_| !empty).map(str::as_bytes)
}
