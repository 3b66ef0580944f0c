//! The proxy's settings, as the rest of the crate uses them.
//!
//! The TOML form is [`crate::section::ProxySection`] (`[proxy]`, see
//! `docs/config.md`), which makes a [`ProxyConfig`]. Every field
//! has a default, and [`ProxyConfig::validate`] checks ranges and
//! cross-field rules before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use mintgate_coap::rto::Algorithm;

use crate::mapping::{Authority, ReverseMapping};

// crate::section::ProxySection holds these fields in the file's plain
// types (milliseconds, strings) and makes this with `to_config`.
/// Everything the proxy needs besides its listening addresses.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyConfig {
    /// Upstream CoAP hosts requests may go to, as `host:port`. Anything else
    /// is refused with 403. Empty means nothing is allowed (the CLI fills in
    /// the gateway's own CoAP endpoint by default).
    pub allow: Vec<Authority>,
    /// Configured reverse mappings (`/prefix/...` to a CoAP base URI). Their
    /// targets must be allowed too.
    pub reverse: Vec<ReverseMapping>,
    /// Bearer tokens accepted in `Authorization: Bearer ...`; empty = no
    /// authentication required.
    pub bearer_tokens: Vec<String>,
    /// Requests per second each client (by IP address) may make on average.
    /// 0 = unlimited.
    pub rate_per_client: f64,
    /// Requests a client may make in a burst above that rate.
    pub rate_burst: u32,
    /// Largest request body accepted (413 above), bytes.
    pub max_body: usize,
    /// Longest request target (path and query) accepted (414 above), bytes.
    pub max_uri: usize,
    /// Overall time one proxied request may take, upstream retransmissions
    /// included (504 after it).
    pub request_timeout: Duration,
    /// Upstream exchanges in flight or queued, over all upstreams, beyond
    /// which requests get 503.
    pub max_inflight: usize,
    /// Upstream exchanges in flight or queued per upstream host beyond which
    /// requests get 503 (the queue behind NSTART).
    pub max_queue_per_upstream: usize,
    /// Exchanges in flight at once per upstream host (RFC 7252 NSTART).
    pub nstart: usize,
    /// Retransmission-timeout controller of the upstream CoAP client.
    pub congestion: Algorithm,
    /// Entries the response cache holds at most (0 disables the cache).
    pub cache_entries: usize,
    /// Largest payload the cache stores, bytes.
    pub cache_max_payload: usize,
    /// Add `Server-Timing: coap;dur=MS` (the upstream exchange's time) to
    /// proxied responses.
    pub server_timing: bool,
    /// HTTP/1.1 and HTTP/2: most connections served at once (more are
    /// closed on accept).
    pub max_connections: usize,
    /// Connections served at once per source (IPv4 address or IPv6 /64),
    /// per listener (more are closed on accept); `max_connections` bounds
    /// it too.
    pub max_connections_per_source: usize,
    /// Time a new connection has to send its first request head (after the
    /// HTTP/2 preface for HTTP/2); an HTTP/1.1 request head, once begun,
    /// and a request body, once its head is in, have as long.
    pub header_timeout: Duration,
    /// A connection with no request in flight is closed after this long
    /// (HTTP/1.1 keep-alive, HTTP/2, QUIC idle timeout).
    pub idle_timeout: Duration,
    /// TLS settings for HTTP/3 (and mutual TLS).
    pub tls: TlsConfig,
    /// What writes (any method but GET, HEAD and OPTIONS) need.
    pub write_auth: WriteAuth,
    /// Names a write's `Host` may carry besides IP literals and
    /// `localhost` (`mintgate_coap::uri::host_allowed`; `"*"`: any).
    pub allowed_hosts: Vec<String>,
    /// OSCORE contexts of upstreams (RFC 8613): requests to these go
    /// protected, by the proxy as the OSCORE client.
    pub upstream_oscore: crate::upstream::UpstreamOscore,
}

/// What an HTTP write needs (the gateway's `[access]` policy, HTTP side).
#[derive(Clone, Debug, PartialEq, Default)]
pub enum WriteAuth {
    /// Nothing beyond what every request needs.
    #[default]
    Open,
    /// `Authorization: Bearer T` with T one of `tokens` (401 otherwise). T
    /// also passes the `bearer_tokens` check, and goes on in the CoAP
    /// Access-Token option to the upstreams in `forward_to` only (the
    /// gateway's own endpoint), never to another server.
    Bearer {
        /// Accepted tokens.
        tokens: Vec<String>,
        /// Upstreams that get the token.
        forward_to: Vec<Authority>,
    },
    /// Refused (401): writes need a credential HTTP cannot carry (a DTLS
    /// identity).
    Refuse,
    /// Taken from clients on loopback only (403 for others, with `why`):
    /// the gateway's owner has not chosen a write policy yet.
    LoopbackOnly {
        /// The refusal's text, which says how to choose.
        why: String,
    },
}

/// Certificates for the HTTP/3 listener.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TlsConfig {
    /// PEM certificate chain; with `key`. When both are absent a self-signed
    /// certificate is generated in `self_signed_dir` on first use.
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// Where a generated self-signed certificate and key are kept.
    pub self_signed_dir: PathBuf,
    /// PEM CA certificates; when set, HTTP/3 clients must present a
    /// certificate signed by one of them (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// TLS session tickets the server remembers for resumption and 0-RTT;
    /// each is accepted once (replay protection of the TLS layer).
    pub session_cache: usize,
    /// Accept 0-RTT early data from returning clients.
    pub early_data: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            allow: Vec::new(),
            reverse: Vec::new(),
            bearer_tokens: Vec::new(),
            rate_per_client: 0.0,
            rate_burst: 100,
            max_body: 64 * 1024,
            max_uri: 2048,
            request_timeout: Duration::from_secs(60),
            max_inflight: 1024,
            max_queue_per_upstream: 256,
            nstart: 1,
            congestion: Algorithm::Basic,
            cache_entries: 1024,
            cache_max_payload: 16 * 1024,
            server_timing: true,
            max_connections: 1024,
            max_connections_per_source: 64,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            tls: TlsConfig {
                self_signed_dir: PathBuf::from("mintgate-tls"),
                session_cache: 4096,
                early_data: true,
                ..TlsConfig::default()
            },
            write_auth: WriteAuth::Open,
            allowed_hosts: Vec::new(),
            upstream_oscore: Default::default(),
        }
    }
}

/// A setting out of range.
#[derive(Debug, thiserror::Error)]
#[error("invalid proxy setting {key}: {why}")]
pub struct ConfigError {
    /// The setting's name as in `[proxy]`.
    pub key: &'static str,
    /// What is wrong.
    pub why: String,
}

impl ProxyConfig {
    /// Checks ranges and cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = |key, why: String| Err(ConfigError { key, why });
        if self.rate_per_client.is_nan() || self.rate_per_client < 0.0 {
            return e(
                "rate_per_client",
                "must be 0 (unlimited) or positive".into(),
            );
        }
        if self.rate_per_client > 0.0 && self.rate_burst == 0 {
            return e("rate_burst", "must be at least 1 with a rate limit".into());
        }
        for (key, v) in [
            ("max_inflight", self.max_inflight),
            ("max_queue_per_upstream", self.max_queue_per_upstream),
            ("nstart", self.nstart),
            ("max_connections", self.max_connections),
            (
                "max_connections_per_source",
                self.max_connections_per_source,
            ),
            ("max_uri", self.max_uri),
        ] {
            if v == 0 {
                return e(key, "must be positive".into());
            }
        }
        if self.nstart > 1024 {
            return e("nstart", format!("{} is above 1024", self.nstart));
        }
        for (key, d) in [
            ("header_timeout_ms", self.header_timeout),
            ("idle_timeout_ms", self.idle_timeout),
        ] {
            if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
                return e(
                    key,
                    format!("{} ms is outside 100..=3600000", d.as_millis()),
                );
            }
        }
        if self.request_timeout.is_zero() {
            return e("request_timeout", "must be positive".into());
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return e("tls", "cert and key go together".into());
        }
        if let Some(h) = self
            .allowed_hosts
            .iter()
            .find(|h| *h != "*" && mintgate_coap::uri::authority_host(h).is_none())
        {
            return e(
                "allowed_hosts",
                format!("{h:?} is not a host name (letters, digits, '-', '.', '_'), an IP literal or \"*\""),
            );
        }
        if self.bearer_tokens.iter().any(|t| t.is_empty()) {
            return e("bearer_tokens", "a token may not be empty".into());
        }
        for r in &self.reverse {
            if !self.allow.contains(&r.target.authority()) {
                return e(
                    "reverse",
                    format!(
                        "the target of {} ({}) is not in allow",
                        r.prefix,
                        r.target.authority()
                    ),
                );
            }
        }
        Ok(())
    }
}

/// Addresses an HTTP front end listens on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listen {
    /// HTTP/1.1 and HTTP/2 (cleartext, prior knowledge) over TCP.
    pub http: Option<SocketAddr>,
    /// HTTP/3 over QUIC (UDP).
    pub h3: Option<SocketAddr>,
}
