//! `[proxy]`: the proxy's section of the configuration file, owned here
//! beside the [`ProxyConfig`] it becomes. The gateway's configuration
//! embeds it as it is, and the CLI turns it into a [`ProxyConfig`] with
//! [`ProxySection::to_config`].

use std::net::SocketAddr;
use std::time::Duration;

use mintgate_coap::rto::Algorithm;
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, ProxyConfig, TlsConfig, WriteAuth};
use crate::mapping::{Authority, ReverseMapping};

/// `[proxy]`: the HTTP -> CoAP proxy (RFC 8075) as the TOML file says it:
/// plain types (milliseconds, strings). [`ProxySection::to_config`] checks
/// it and makes the [`ProxyConfig`] the proxy runs with; its defaults are
/// [`ProxyConfig`]'s.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySection {
    /// TCP address for HTTP/1.1 and HTTP/2 (cleartext); off when absent.
    pub http: Option<SocketAddr>,
    /// UDP address for HTTP/3 over QUIC; off when absent.
    pub h3: Option<SocketAddr>,
    /// Runtime worker threads of the proxy.
    pub threads: usize,
    /// Upstream CoAP servers allowed, `host:port`; empty = the gateway's
    /// own CoAP endpoint only. Anything else gets 403.
    pub allow: Vec<String>,
    /// Reverse mappings: `{ prefix = "/sensors", target = "coap://127.0.0.1:5683/sensors" }`.
    pub reverse: Vec<ProxyReverse>,
    /// Bearer tokens accepted (`Authorization: Bearer ...`); empty = none needed.
    pub bearer_tokens: Vec<String>,
    /// Requests per second per client IP address (0 = unlimited).
    pub rate_per_client: f64,
    /// Burst above that rate.
    pub rate_burst: u32,
    /// Largest request body, bytes (413 above).
    pub max_body: usize,
    /// Longest request target, bytes (414 above).
    pub max_uri: usize,
    /// Time a proxied request may take in all, ms (504 after).
    pub request_timeout_ms: u64,
    /// Upstream requests in flight or queued over all upstreams (503 above).
    pub max_inflight: usize,
    /// Upstream requests in flight or queued per upstream (503 above).
    pub max_queue_per_upstream: usize,
    /// Exchanges in flight per upstream (NSTART).
    pub nstart: usize,
    /// Congestion control of the upstream CoAP client: basic, cocoa or adaptive.
    pub congestion: String,
    /// Responses cached at most (0 = no cache).
    pub cache_entries: usize,
    /// Largest payload cached, bytes.
    pub cache_max_payload: usize,
    /// Add `Server-Timing: coap;dur=MS` to proxied responses.
    pub server_timing: bool,
    /// Connections served at once, per listener.
    pub max_connections: usize,
    /// Connections served at once per source (IPv4 address, IPv6 /64), per
    /// listener.
    pub max_connections_per_source: usize,
    /// Time a new connection has to deliver its first request head (after
    /// the HTTP/2 preface), and any request head or body once begun, ms.
    pub header_timeout_ms: u64,
    /// A connection with no request in flight is closed after this, ms
    /// (HTTP/1.1 keep-alive, HTTP/2, QUIC idle timeout).
    pub idle_timeout_ms: u64,
    /// Local address of the upstream CoAP socket (absent: `[::]:0`, any
    /// port). A fixed one lets a gateway in another process list it in
    /// `access.proxy_sources`.
    pub upstream_bind: Option<SocketAddr>,
    /// Host names (besides IP literals and `localhost`) that requests to
    /// the dashboard, on this and the metrics listener, and writes through
    /// the proxy may carry in `Host`; others get 403 (DNS rebinding). `"*"`:
    /// any.
    pub allowed_hosts: Vec<String>,
    /// HTTP/3 certificate chain (PEM); with `tls_key`. Absent: self-signed.
    pub tls_cert: Option<std::path::PathBuf>,
    /// HTTP/3 private key (PEM).
    pub tls_key: Option<std::path::PathBuf>,
    /// Where a generated self-signed certificate is kept.
    pub tls_dir: std::path::PathBuf,
    /// CA certificates (PEM) that HTTP/3 client certificates must chain to
    /// (mutual TLS); absent = no client certificates.
    pub client_ca: Option<std::path::PathBuf>,
    /// TLS session tickets remembered (each accepted once).
    pub session_cache: usize,
    /// Accept 0-RTT early data (safe methods only; others 425).
    pub early_data: bool,
    /// The HTTP listener hands WebSocket upgrades to `/.well-known/coap`
    /// to the gateway's CoAP over WebSockets (RFC 8323 4), so `coap+ws`
    /// shares the HTTP port (`serve` only).
    pub coap_ws: bool,
    /// OSCORE towards upstreams: `{ upstream = "ADDR:PORT", context =
    /// "FILE" }`, the context file as `mintgate get --oscore` takes it.
    pub oscore: Vec<ProxyOscore>,
}

/// One `[[proxy.reverse]]` mapping.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyReverse {
    /// Path prefix, e.g. `/sensors`.
    pub prefix: String,
    /// CoAP base URI, e.g. `coap://127.0.0.1:5683/sensors`.
    pub target: String,
}

impl Default for ProxySection {
    /// [`ProxyConfig`]'s defaults, in the file's units; off (no listener),
    /// one runtime thread, any upstream port, `coap_ws` on.
    fn default() -> Self {
        let d = ProxyConfig::default();
        let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        ProxySection {
            http: None,
            h3: None,
            threads: 1,
            allow: Vec::new(),
            reverse: Vec::new(),
            bearer_tokens: d.bearer_tokens,
            rate_per_client: d.rate_per_client,
            rate_burst: d.rate_burst,
            max_body: d.max_body,
            max_uri: d.max_uri,
            request_timeout_ms: ms(d.request_timeout),
            max_inflight: d.max_inflight,
            max_queue_per_upstream: d.max_queue_per_upstream,
            nstart: d.nstart,
            congestion: d.congestion.name().to_owned(),
            cache_entries: d.cache_entries,
            cache_max_payload: d.cache_max_payload,
            server_timing: d.server_timing,
            max_connections: d.max_connections,
            max_connections_per_source: d.max_connections_per_source,
            header_timeout_ms: ms(d.header_timeout),
            idle_timeout_ms: ms(d.idle_timeout),
            upstream_bind: None,
            allowed_hosts: d.allowed_hosts,
            tls_cert: d.tls.cert,
            tls_key: d.tls.key,
            tls_dir: d.tls.self_signed_dir,
            client_ca: d.tls.client_ca,
            session_cache: d.tls.session_cache,
            early_data: d.tls.early_data,
            coap_ws: true,
            oscore: Vec::new(),
        }
    }
}

impl ProxySection {
    /// The [`ProxyConfig`] this section describes, checked
    /// ([`ProxyConfig::validate`]); `default_allow` when `allow` is empty.
    /// Writes are open and no upstream is protected: the caller sets
    /// `write_auth` and `upstream_oscore` from the gateway's `[access]` and
    /// `oscore` (which need files and state this crate does not read).
    /// Errors name the key.
    pub fn to_config(&self, default_allow: &[Authority]) -> Result<ProxyConfig, ConfigError> {
        let bad = |key, e: &dyn std::fmt::Display| ConfigError {
            key,
            why: e.to_string(),
        };
        let mut allow = Vec::new();
        for a in &self.allow {
            allow.push(a.parse::<Authority>().map_err(|e| bad("allow", &e))?);
        }
        if allow.is_empty() {
            allow = default_allow.to_vec();
        }
        let mut reverse = Vec::new();
        for r in &self.reverse {
            reverse
                .push(ReverseMapping::new(&r.prefix, &r.target).map_err(|e| bad("reverse", &e))?);
        }
        let congestion: Algorithm = self.congestion.parse().map_err(|e| bad("congestion", &e))?;
        let cfg = ProxyConfig {
            allow,
            reverse,
            bearer_tokens: self.bearer_tokens.clone(),
            rate_per_client: self.rate_per_client,
            rate_burst: self.rate_burst,
            max_body: self.max_body,
            max_uri: self.max_uri,
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            max_inflight: self.max_inflight,
            max_queue_per_upstream: self.max_queue_per_upstream,
            nstart: self.nstart,
            congestion,
            cache_entries: self.cache_entries,
            cache_max_payload: self.cache_max_payload,
            server_timing: self.server_timing,
            max_connections: self.max_connections,
            max_connections_per_source: self.max_connections_per_source,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            tls: TlsConfig {
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
                self_signed_dir: self.tls_dir.clone(),
                client_ca: self.client_ca.clone(),
                session_cache: self.session_cache,
                early_data: self.early_data,
            },
            write_auth: WriteAuth::Open,
            allowed_hosts: self.allowed_hosts.clone(),
            upstream_oscore: Default::default(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// One `[[proxy.oscore]]`: requests the proxy sends to `upstream` go
/// protected with the context in `context` (RFC 8613), the proxy being the
/// OSCORE client.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProxyOscore {
    /// The upstream's address (an IP address and port, as the proxy
    /// resolves the target to).
    pub upstream: SocketAddr,
    /// The context file (`[[oscore.contexts]]` keys; its sequence number
    /// in NAME.seq beside it).
    pub context: std::path::PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_section_is_the_default_config() {
        let own: Vec<Authority> = vec!["127.0.0.1:5683".parse().unwrap()];
        let from_section = ProxySection::default().to_config(&own).unwrap();
        let want = ProxyConfig {
            allow: own.clone(),
            ..ProxyConfig::default()
        };
        assert_eq!(from_section, want);
    }

    #[test]
    fn errors_name_the_key() {
        let own: Vec<Authority> = Vec::new();
        let s = ProxySection {
            allow: vec!["no port".into()],
            ..ProxySection::default()
        };
        assert_eq!(s.to_config(&own).unwrap_err().key, "allow");
        let s = ProxySection {
            congestion: "fast".into(),
            ..ProxySection::default()
        };
        assert_eq!(s.to_config(&own).unwrap_err().key, "congestion");
        let s = ProxySection {
            reverse: vec![ProxyReverse {
                prefix: "x".into(),
                target: "http://a/".into(),
            }],
            ..ProxySection::default()
        };
        assert_eq!(s.to_config(&own).unwrap_err().key, "reverse");
        let s = ProxySection {
            nstart: 0,
            ..ProxySection::default()
        };
        assert_eq!(s.to_config(&own).unwrap_err().key, "nstart");
    }

    #[test]
    fn the_section_reads_from_toml_with_its_keys() {
        let s: ProxySection =
            toml::from_str("http = \"127.0.0.1:8080\"\nheader_timeout_ms = 600\n").unwrap();
        assert_eq!(s.http, Some("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(
            s.to_config(&[]).unwrap().header_timeout,
            Duration::from_millis(600)
        );
        assert!(toml::from_str::<ProxySection>("nope = 1\n").is_err());
    }
}
