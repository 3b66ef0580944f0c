//! Who may write: the `[access]` policy for requests that change state
//! (PUT, POST, DELETE, PATCH, iPATCH) on the gateway's CoAP resources and
//! links.
//!
//! | `access.write` | a CoAP write is allowed when it carries |
//! |---|---|
//! | absent (the default) | nothing, from loopback only; a write from any other source (or through the HTTP proxy) is refused 4.03 with a text saying how to choose a mode |
//! | `"open"` | nothing |
//! | `"token"` | an Access-Token option ([`ACCESS_TOKEN`]) equal to one of `access.tokens` |
//! | `"dtls"` | a DTLS identity (the peer authenticated by the coaps listener), one of `access.identities` when that list is not empty |
//! | `"oscore"` | OSCORE protection (RFC 8613) verified with one of `[[oscore.contexts]]`, whose name is in `access.identities` as `oscore:NAME` when that list is not empty |
//!
//! The mode is absent until the owner chooses one: a fresh install takes
//! writes from loopback only ([`WriteMode::Unset`], refusal counted as
//! `write_mode_unset`), so that `mintgate serve` on `[::]:5683` does not
//! hand every host on the network its actuators and links.
//!
//! Whatever the mode, a write to an admin resource ([`ADMIN_PATHS`]: the
//! direct path's `/links`) from a source that is not on loopback is refused
//! unless `access.admin_remote` is set or the write was authenticated (a
//! valid token or DTLS identity). Refusals are answered 4.01 Unauthorized
//! (no or wrong credentials) or 4.03 Forbidden (an admin write from the
//! network, a DTLS identity not in the list, no mode chosen), and counted
//! by reason
//! (`mintgate_access_refused_total`). Reads are never checked.
//!
//! The HTTP proxy applies the same policy to HTTP writes (a bearer token in
//! `Authorization`, 401 otherwise) and passes the token on to the gateway's
//! own CoAP endpoint in the Access-Token option.
//!
//! Requests the HTTP proxy forwards reach the CoAP endpoint from the
//! proxy's upstream socket, on loopback when proxy and gateway share a
//! host. They carry their HTTP client's origin, not the proxy's: a source
//! registered with [`AccessPolicy::add_proxy_source`] (`mintgate serve
//! --http` registers its own proxy's upstream socket) is never taken as
//! loopback, so a write to `/links` through the proxy needs what any
//! remote write needs.
//!
//! [`AccessPolicy::check`] takes the DTLS identity as an `Option`: requests
//! that arrived over plain UDP have none.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::RwLock;

use mintgate_coap::server::{Request, ResponseBuilder};
use mintgate_coap::wire::{Code, ContentFormat, OptionNumber};
use serde::{Deserialize, Serialize};

/// The CoAP option carrying an access token: number 65002, from the
/// experimental range (RFC 7252 12.2), elective (a server that does not know
/// it ignores it) and unsafe to forward (a proxy that does not know it must
/// not pass the credential on). Opaque, 1..=255 bytes.
pub const ACCESS_TOKEN: OptionNumber = OptionNumber::ACCESS_TOKEN;

/// Resources whose writes administer the gateway (first path segment).
pub const ADMIN_PATHS: &[&str] = &["links"];

/// `access.write`: what a write must carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Not chosen (the key is absent, as on a fresh install): writes are
    /// taken from loopback only, so that a gateway put on a network is not
    /// writable by everyone on it before its owner has said so. Not
    /// spelled in a file.
    #[default]
    #[serde(skip)]
    Unset,
    /// Nothing (admin writes from loopback only, see `admin_remote`).
    Open,
    /// A token: CoAP Access-Token option, HTTP bearer token.
    Token,
    /// A DTLS identity (coaps only; HTTP writes are refused).
    Dtls,
    /// An OSCORE-protected request (RFC 8613) verified by one of
    /// `[[oscore.contexts]]` (HTTP writes are refused).
    Oscore,
}

impl WriteMode {
    /// Whether the owner has not chosen a mode yet.
    pub fn is_unset(&self) -> bool {
        *self == WriteMode::Unset
    }
}

/// What a write refused for want of a chosen `access.write` is told, HTTP
/// and CoAP alike.
pub const UNSET_WHY: &str = "writes from other hosts (and through the HTTP proxy) are refused \
until the gateway's owner chooses who may write: set access.write = \"open\", \"token\", \
\"dtls\" or \"oscore\" in the [access] section of the config (see docs/security.md)";

/// The warning `mintgate serve` and `mintgate proxy` log once at start when
/// `access.write` is not chosen and one of `listeners` is not on loopback
/// (an unspecified address counts as not on loopback).
pub fn unset_warning(access: &AccessSection, listeners: &[SocketAddr]) -> Option<String> {
    if !access.write.is_unset() {
        return None;
    }
    let open: Vec<String> = listeners
        .iter()
        .filter(|a| !a.ip().to_canonical().is_loopback())
        .map(SocketAddr::to_string)
        .collect();
    (!open.is_empty()).then(|| {
        format!(
            "listening on {} with access.write not chosen: writes from other hosts and \
             through the HTTP proxy are refused (4.03 / 403) until [access] write = \
             \"open\", \"token\", \"dtls\" or \"oscore\" is set; reads are served \
             (docs/security.md)",
            open.join(", ")
        )
    })
}

/// `[access]`: who may write.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessSection {
    /// What a write must carry: `"open"`, `"token"` or `"dtls"`; absent:
    /// [`WriteMode::Unset`].
    #[serde(skip_serializing_if = "WriteMode::is_unset")]
    pub write: WriteMode,
    /// Tokens accepted for writes (`write = "token"`).
    pub tokens: Vec<String>,
    /// DTLS identities (PSK identity or certificate subject) allowed to
    /// write (`write = "dtls"`); empty = any authenticated peer.
    pub identities: Vec<String>,
    /// Let unauthenticated writes to admin resources (`/links`) come from
    /// sources that are not on loopback.
    pub admin_remote: bool,
    /// Local addresses of HTTP proxies' upstream sockets (a `mintgate
    /// proxy` in another process with `proxy.upstream_bind`): requests from
    /// them are never taken as loopback. `mintgate serve --http` registers
    /// its own proxy without this.
    pub proxy_sources: Vec<SocketAddr>,
}

impl AccessSection {
    /// Checks the keys.
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        let v = |key, why: String| Err(crate::config::ConfigError::Value { key, why });
        if self.write == WriteMode::Token && self.tokens.is_empty() {
            return v(
                "access.tokens",
                "write = \"token\" needs at least one token".into(),
            );
        }
        if let Some(t) = self
            .tokens
            .iter()
            .find(|t| t.is_empty() || t.len() > 255 || t.chars().any(char::is_whitespace))
        {
            return v(
                "access.tokens",
                format!(
                    "a token must be 1..=255 bytes without spaces (one is {} bytes)",
                    t.len()
                ),
            );
        }
        if let Some(a) = self.proxy_sources.iter().find(|a| {
            a.port() == 0 || !(a.ip().is_unspecified() || a.ip().to_canonical().is_loopback())
        }) {
            return v(
                "access.proxy_sources",
                format!("{a}: give the proxy's upstream_bind, a loopback or unspecified address with its port"),
            );
        }
        if self.write.is_unset() && !self.tokens.is_empty() {
            return v(
                "access.tokens",
                "tokens are used only with write = \"token\": set access.write".into(),
            );
        }
        if self.identities.iter().any(String::is_empty) {
            return v("access.identities", "an identity may not be empty".into());
        }
        Ok(())
    }

    /// Whether `presented` is one of the tokens, compared in constant time
    /// per candidate (no early exit on the first differing byte).
    pub fn token_ok(&self, presented: &[u8]) -> bool {
        self.tokens
            .iter()
            .fold(false, |ok, t| ok | ct_eq(t.as_bytes(), presented))
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Why a write was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No token or identity where one is needed.
    NoCredentials,
    /// A token that is not one of `access.tokens`.
    BadToken,
    /// A DTLS identity not in `access.identities`.
    UnknownIdentity,
    /// An unauthenticated admin write from a source not on loopback.
    NotLoopback,
    /// A write from a source not on loopback while `access.write` is not
    /// chosen.
    WriteModeUnset,
}

impl Refusal {
    /// Every reason, for the metrics.
    pub const ALL: [Refusal; 5] = [
        Refusal::NoCredentials,
        Refusal::BadToken,
        Refusal::UnknownIdentity,
        Refusal::NotLoopback,
        Refusal::WriteModeUnset,
    ];

    /// The label of `mintgate_access_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoCredentials => "no_credentials",
            Refusal::BadToken => "bad_token",
            Refusal::UnknownIdentity => "unknown_identity",
            Refusal::NotLoopback => "admin_not_loopback",
            Refusal::WriteModeUnset => "write_mode_unset",
        }
    }

    /// The CoAP answer: 4.01 when credentials would help, 4.03 when not.
    pub fn code(self) -> Code {
        match self {
            Refusal::NoCredentials | Refusal::BadToken => Code::UNAUTHORIZED,
            Refusal::UnknownIdentity | Refusal::NotLoopback | Refusal::WriteModeUnset => {
                Code::FORBIDDEN
            }
        }
    }

    fn why(self, mode: WriteMode) -> &'static str {
        match (self, mode) {
            (Refusal::NoCredentials, WriteMode::Dtls) => "writes need a DTLS identity (coaps)",
            (Refusal::NoCredentials, WriteMode::Oscore) => "writes need OSCORE protection",
            (Refusal::NoCredentials, _) => "writes need an Access-Token option (65002)",
            (Refusal::BadToken, _) => "the access token is not valid",
            (Refusal::UnknownIdentity, WriteMode::Oscore) => "this OSCORE context may not write",
            (Refusal::UnknownIdentity, _) => "this DTLS identity may not write",
            (Refusal::NotLoopback, _) => "admin writes are taken from loopback only",
            (Refusal::WriteModeUnset, _) => UNSET_WHY,
        }
    }
}

/// Is `code` a method that changes state?
pub fn is_write(code: Code) -> bool {
    matches!(
        code,
        Code::PUT | Code::POST | Code::DELETE | Code::PATCH | Code::IPATCH
    )
}

/// The write policy in force, with its refusal counters.
#[derive(Debug, Default)]
pub struct AccessPolicy {
    cfg: AccessSection,
    refused: [AtomicU64; Refusal::ALL.len()],
    /// Local sockets of HTTP proxies forwarding to this gateway; requests
    /// from them are never taken as loopback.
    proxied: RwLock<Vec<SocketAddr>>,
}

impl AccessPolicy {
    /// The policy of `[access]`.
    pub fn new(cfg: AccessSection) -> AccessPolicy {
        AccessPolicy {
            proxied: RwLock::new(cfg.proxy_sources.clone()),
            cfg,
            refused: Default::default(),
        }
    }

    /// Registers the local address of a proxy's upstream socket (bound to
    /// an unspecified address or to a loopback one): CoAP requests from
    /// it were made on behalf of HTTP clients, and are judged as remote.
    pub fn add_proxy_source(&self, addr: SocketAddr) {
        let mut p = self.proxied.write();
        if !p.contains(&addr) {
            p.push(addr);
        }
    }

    /// Whether `peer` is a registered proxy's upstream socket: a loopback
    /// address with its port (and its address, unless it was bound to an
    /// unspecified one). A peer not on loopback is remote anyway.
    pub fn is_proxied(&self, peer: SocketAddr) -> bool {
        let ip = peer.ip().to_canonical();
        ip.is_loopback()
            && self.proxied.read().iter().any(|p| {
                p.port() == peer.port() && (p.ip().is_unspecified() || p.ip().to_canonical() == ip)
            })
    }

    /// The settings.
    pub fn config(&self) -> &AccessSection {
        &self.cfg
    }

    /// Decides a write from `peer` to a resource (`admin`: one of
    /// [`ADMIN_PATHS`]) carrying `token` (the Access-Token option) and,
    /// when it came over DTLS, the peer's `identity`. Does not count.
    pub fn decide(
        &self,
        peer: IpAddr,
        admin: bool,
        token: Option<&[u8]>,
        identity: Option<&str>,
    ) -> Result<(), Refusal> {
        self.decide_local(
            peer.to_canonical().is_loopback(),
            admin,
            token,
            identity,
            None,
        )
    }

    /// [`decide`](Self::decide) for a source that is (`local`) or is not
    /// taken as loopback.
    fn decide_local(
        &self,
        local: bool,
        admin: bool,
        token: Option<&[u8]>,
        identity: Option<&str>,
        oscore: Option<&str>,
    ) -> Result<(), Refusal> {
        let listed = |id: &str| {
            self.cfg.identities.is_empty() || self.cfg.identities.iter().any(|i| i == id)
        };
        let authenticated = match self.cfg.write {
            WriteMode::Unset if !local => return Err(Refusal::WriteModeUnset),
            WriteMode::Unset | WriteMode::Open => false,
            WriteMode::Token => match token {
                None => return Err(Refusal::NoCredentials),
                Some(t) if !self.cfg.token_ok(t) => return Err(Refusal::BadToken),
                Some(_) => true,
            },
            WriteMode::Dtls => match identity {
                None => return Err(Refusal::NoCredentials),
                Some(id)
                    if !self.cfg.identities.is_empty()
                        && !self.cfg.identities.iter().any(|i| i == id) =>
                {
                    return Err(Refusal::UnknownIdentity)
                }
                Some(_) => true,
            },
            WriteMode::Oscore => match oscore {
                None => return Err(Refusal::NoCredentials),
                Some(id) if !listed(id) => return Err(Refusal::UnknownIdentity),
                Some(_) => true,
            },
        };
        if admin && !authenticated && !self.cfg.admin_remote && !local {
            return Err(Refusal::NotLoopback);
        }
        Ok(())
    }

    /// Checks a CoAP request: reads pass; a write is decided by
    /// [`decide`](Self::decide) and a refusal counted.
    pub fn check(&self, req: &Request<'_>, identity: Option<&str>) -> Result<(), Refusal> {
        self.check_with(req, identity, None)
    }

    /// [`check`](Self::check) for a request that arrived protected with
    /// OSCORE and verified with the context `oscore` (`oscore:NAME`);
    /// `identity` is the DTLS one, if it also came over coaps.
    pub fn check_with(
        &self,
        req: &Request<'_>,
        identity: Option<&str>,
        oscore: Option<&str>,
    ) -> Result<(), Refusal> {
        let p = req.packet;
        if !is_write(p.code()) {
            return Ok(());
        }
        let admin = p
            .options()
            .find(|o| o.number == OptionNumber::URI_PATH)
            .is_some_and(|o| ADMIN_PATHS.iter().any(|a| a.as_bytes() == o.value));
        let token = p
            .options()
            .find(|o| o.number == ACCESS_TOKEN)
            .map(|o| o.value);
        let local = req.peer.ip().to_canonical().is_loopback() && !self.is_proxied(req.peer);
        let r = self.decide_local(local, admin, token, identity, oscore);
        if let Err(why) = r {
            self.count(why);
        }
        r
    }

    /// Counts a refusal made elsewhere.
    pub fn count(&self, why: Refusal) {
        let i = Refusal::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.refused[i].fetch_add(1, Relaxed);
    }

    /// Refusals so far for `why`.
    pub fn refused(&self, why: Refusal) -> u64 {
        let i = Refusal::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.refused[i].load(Relaxed)
    }

    /// Writes the refusal's answer into `rb`.
    pub fn answer(&self, why: Refusal, rb: &mut ResponseBuilder) {
        rb.set_code(why.code())
            .content_format(ContentFormat::TEXT_PLAIN)
            .write(why.why(self.cfg.write).as_bytes());
    }

    /// `mintgate_access_refused_total`.
    pub fn collect(&self, m: &mut crate::exposition::Exposition) {
        m.counters(
            "mintgate_access_refused_total",
            "CoAP writes refused by the [access] policy, by reason.",
            "reason",
            Refusal::ALL.iter().map(|r| (r.label(), self.refused(*r))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(write: WriteMode) -> AccessPolicy {
        AccessPolicy::new(AccessSection {
            write,
            tokens: vec!["s3cret".into(), "other".into()],
            identities: vec!["sensor-1".into()],
            admin_remote: false,
            proxy_sources: Vec::new(),
        })
    }

    /// [`AccessPolicy::check`] of a CON request `code` to the one-segment
    /// path `path` from `peer`, without a DTLS identity.
    fn check_from(p: &AccessPolicy, code: Code, path: &[u8], peer: &str) -> Result<(), Refusal> {
        let mut buf = vec![0u8; 128];
        let mut w = mintgate_coap::wire::MessageWriter::new(
            &mut buf,
            mintgate_coap::wire::MessageType::Con,
            code,
            1,
            b"t",
        )
        .unwrap();
        w.option(OptionNumber::URI_PATH, path).unwrap();
        let n = w.finish();
        let pkt = mintgate_coap::wire::Packet::new_checked(&buf[..n]).unwrap();
        p.check(
            &Request {
                peer: peer.parse().unwrap(),
                packet: &pkt,
                identity: None,
            },
            None,
        )
    }

    #[test]
    fn modes_decide_as_documented() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lan: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let open = policy(WriteMode::Open);
        assert_eq!(open.decide(lan, false, None, None), Ok(()));
        assert_eq!(open.decide(lo, true, None, None), Ok(()));
        assert_eq!(open.decide(mapped, true, None, None), Ok(()));
        assert_eq!(
            open.decide(lan, true, Some(b"s3cret"), None),
            Err(Refusal::NotLoopback),
            "open mode knows no tokens"
        );
        let tok = policy(WriteMode::Token);
        assert_eq!(
            tok.decide(lo, false, None, None),
            Err(Refusal::NoCredentials)
        );
        assert_eq!(
            tok.decide(lo, false, Some(b"s3cre"), None),
            Err(Refusal::BadToken)
        );
        assert_eq!(tok.decide(lan, true, Some(b"other"), None), Ok(()));
        assert_eq!(
            tok.decide(lan, false, None, Some("sensor-1")),
            Err(Refusal::NoCredentials),
            "token mode wants the token"
        );
        let dtls = policy(WriteMode::Dtls);
        assert_eq!(
            dtls.decide(lo, false, Some(b"s3cret"), None),
            Err(Refusal::NoCredentials)
        );
        assert_eq!(dtls.decide(lan, true, None, Some("sensor-1")), Ok(()));
        assert_eq!(
            dtls.decide(lan, false, None, Some("sensor-2")),
            Err(Refusal::UnknownIdentity)
        );
        let mut any = policy(WriteMode::Dtls).cfg;
        any.identities.clear();
        assert_eq!(
            AccessPolicy::new(any).decide(lan, false, None, Some("anyone")),
            Ok(())
        );
        // oscore: a verified OSCORE context, not a DTLS identity or token
        let mut os = policy(WriteMode::Oscore).cfg;
        os.identities = vec!["oscore:sensor-1".into()];
        let os = AccessPolicy::new(os);
        assert_eq!(
            os.decide_local(false, true, Some(b"s3cret"), Some("sensor-1"), None),
            Err(Refusal::NoCredentials)
        );
        assert_eq!(
            os.decide_local(false, true, None, None, Some("oscore:sensor-1")),
            Ok(())
        );
        assert_eq!(
            os.decide_local(false, false, None, None, Some("oscore:other")),
            Err(Refusal::UnknownIdentity)
        );
        assert_eq!(
            dtls.decide_local(false, false, None, None, Some("oscore:sensor-1")),
            Err(Refusal::NoCredentials),
            "dtls mode wants a DTLS identity"
        );
        let mut remote = policy(WriteMode::Open).cfg;
        remote.admin_remote = true;
        assert_eq!(
            AccessPolicy::new(remote).decide(lan, true, None, None),
            Ok(())
        );
        assert_eq!(Refusal::BadToken.code(), Code::UNAUTHORIZED);
        assert_eq!(Refusal::NotLoopback.code(), Code::FORBIDDEN);
    }

    #[test]
    fn a_proxys_upstream_socket_is_not_loopback() {
        let p = policy(WriteMode::Open);
        let up: SocketAddr = "[::]:40000".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        assert!(!p.is_proxied("127.0.0.1:40000".parse().unwrap()));
        p.add_proxy_source(up);
        p.add_proxy_source("127.0.0.2:40002".parse().unwrap());
        for seen in [
            "127.0.0.1:40000",
            "[::1]:40000",
            "[::ffff:127.0.0.1]:40000",
            "127.0.0.2:40002",
        ] {
            assert!(p.is_proxied(seen.parse().unwrap()), "{seen}");
        }
        assert!(!p.is_proxied(other));
        assert!(
            !p.is_proxied("127.0.0.1:40002".parse().unwrap()),
            "bound to 127.0.0.2 only"
        );
        assert!(
            !p.is_proxied("192.0.2.1:40000".parse().unwrap()),
            "remote anyway"
        );
        // Through check: an unauthenticated admin write from the proxy's
        // socket is refused and counted; the same from another loopback
        // port is allowed.
        let post = |peer| check_from(&p, Code::POST, b"links", peer);
        assert_eq!(post("127.0.0.1:40000"), Err(Refusal::NotLoopback));
        assert_eq!(p.refused(Refusal::NotLoopback), 1);
        assert_eq!(post("127.0.0.1:40001"), Ok(()));
        let tok = policy(WriteMode::Token);
        tok.add_proxy_source(up);
        assert_eq!(
            tok.decide_local(false, true, Some(b"s3cret"), None, None),
            Ok(()),
            "a token the proxy forwards still authenticates"
        );
    }

    #[test]
    fn an_unchosen_mode_takes_writes_from_loopback_only() {
        let p = std::sync::Arc::new(AccessPolicy::new(AccessSection::default()));
        assert_eq!(p.config().write, WriteMode::Unset);
        let lo: IpAddr = "127.0.0.2".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let lan: IpAddr = "192.0.2.7".parse().unwrap();
        for ip in [lo, v6, mapped] {
            assert_eq!(p.decide(ip, false, None, None), Ok(()), "{ip}");
            assert_eq!(p.decide(ip, true, None, None), Ok(()), "{ip}: /links");
        }
        for (admin, token, id) in [
            (false, None, None),
            (true, None, None),
            (false, Some(&b"s3cret"[..]), None),
            (false, None, Some("sensor-1")),
        ] {
            assert_eq!(
                p.decide(lan, admin, token, id),
                Err(Refusal::WriteModeUnset),
                "no credential stands for a choice of mode"
            );
        }
        assert_eq!(Refusal::WriteModeUnset.code(), Code::FORBIDDEN);
        // the answer says how to choose
        let why = Refusal::WriteModeUnset.why(WriteMode::Unset);
        for word in ["access.write", "\"open\"", "\"token\"", "\"dtls\""] {
            assert!(why.contains(word), "{why}");
        }
        // a proxied write counts as remote: refused and counted
        let up: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        p.add_proxy_source(up);
        let put = |peer| check_from(&p, Code::PUT, b"actuators", peer);
        assert_eq!(put("127.0.0.1:40000"), Err(Refusal::WriteModeUnset));
        assert_eq!(put("127.0.0.1:40001"), Ok(()));
        assert_eq!(p.refused(Refusal::WriteModeUnset), 1);
        let shared = p.clone();
        let text = crate::exposition::render(crate::exposition::Format::Prometheus, move |m| {
            shared.collect(m)
        });
        assert!(
            text.contains("mintgate_access_refused_total{reason=\"write_mode_unset\"} 1"),
            "{text}"
        );
        // an explicit "open" takes the same write from the network
        let open = policy(WriteMode::Open);
        assert_eq!(open.decide(lan, false, None, None), Ok(()));
    }

    #[test]
    fn the_unset_mode_is_absent_from_files_and_warned_about() {
        let s = AccessSection::default();
        assert!(s.write.is_unset());
        let text = toml::to_string(&s).unwrap();
        assert!(!text.contains("write"), "{text}");
        let back: AccessSection = toml::from_str(&text).unwrap();
        assert!(back.write.is_unset());
        let open: AccessSection = toml::from_str("write = \"open\"").unwrap();
        assert_eq!(open.write, WriteMode::Open);
        assert!(toml::to_string(&open).unwrap().contains("write = \"open\""));
        assert!(
            toml::from_str::<AccessSection>("write = \"unset\"").is_err(),
            "not a mode one can choose"
        );
        let lo: SocketAddr = "127.0.0.1:5683".parse().unwrap();
        let any: SocketAddr = "[::]:5683".parse().unwrap();
        assert_eq!(unset_warning(&s, &[lo]), None);
        let w = unset_warning(&s, &[lo, any]).unwrap();
        assert!(w.contains("[::]:5683") && !w.contains("127.0.0.1"), "{w}");
        assert_eq!(unset_warning(&open, &[any]), None);
        // tokens without a mode are a mistake, said at once
        let t: AccessSection = toml::from_str("tokens = [\"x\"]").unwrap();
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("access.write"));
    }

    #[test]
    fn validation_names_the_key() {
        let mut s = AccessSection {
            write: WriteMode::Token,
            ..Default::default()
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("access.tokens"));
        s.tokens = vec!["a b".into()];
        assert!(s.validate().is_err());
        s.tokens = vec!["x".repeat(256)];
        assert!(s.validate().is_err());
        s.tokens = vec!["ok".into()];
        s.validate().unwrap();
        s.identities = vec![String::new()];
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("access.identities"));
    }
}
