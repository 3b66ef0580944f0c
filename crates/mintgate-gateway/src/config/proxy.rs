//! `[proxy]`: the HTTP -> CoAP proxy's settings, as plain data.

use super::*;

// Field for field like mintgate_proxy::ProxyConfig, but in the TOML's
// plain types (ms, strings): this crate does not depend on mintgate-proxy.
/// `[proxy]`: the HTTP -> CoAP proxy (RFC 8075). Plain data: the CLI checks
/// it and turns it into `mintgate_proxy::ProxyConfig` (whose defaults these
/// mirror; a CLI test keeps the two in step).
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
    fn default() -> Self {
        ProxySection {
            http: None,
            h3: None,
            threads: 1,
            allow: Vec::new(),
            reverse: Vec::new(),
            bearer_tokens: Vec::new(),
            rate_per_client: 0.0,
            rate_burst: 100,
            max_body: 64 * 1024,
            max_uri: 2048,
            request_timeout_ms: 60_000,
            max_inflight: 1024,
            max_queue_per_upstream: 256,
            nstart: 1,
            congestion: "basic".into(),
            cache_entries: 1024,
            cache_max_payload: 16 * 1024,
            server_timing: true,
            max_connections: 1024,
            max_connections_per_source: 64,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            upstream_bind: None,
            allowed_hosts: Vec::new(),
            tls_cert: None,
            tls_key: None,
            tls_dir: "mintgate-tls".into(),
            client_ca: None,
            session_cache: 4096,
            early_data: true,
            coap_ws: true,
            oscore: Vec::new(),
        }
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
