//! coaps (CoAP over DTLS 1.2, RFC 7252 section 9): the `[coaps]` section
//! and its listeners' metrics. The sessions themselves are
//! [`mintgate_dtls::DtlsServer`]s; the pipeline ([`crate::pipeline`])
//! decrypts what a coaps listener receives, queues the CoAP requests like
//! any other (same HTP queue, handler pool and router), and encrypts the
//! answers back to the session. Handlers see the peer's DTLS identity in
//! [`mintgate_coap::server::Request::identity`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use mintgate_dtls::{parse_key, CertFiles, DtlsStats, Psk, ServerSettings};
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// `[coaps]`: CoAP over DTLS listeners. Off while `bind` is empty.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoapsSection {
    /// UDP addresses to serve coaps on (usually port 5684).
    pub bind: Vec<SocketAddr>,
    /// TCP addresses to serve `coaps+tcp` on (RFC 8323: CoAP over TLS,
    /// usually port 5684/tcp): the certificate (`cert`, `key`) and client
    /// certificate (`client_ca`, `require_client_cert`) settings below,
    /// the connection limits of `[coap]` (`tcp_*`).
    pub tcp_bind: Vec<SocketAddr>,
    /// TCP addresses to serve `coaps+ws` on (RFC 8323 section 4: CoAP over
    /// WebSockets over TLS, path `/.well-known/coap`, ALPN `http/1.1`):
    /// the same certificate settings and `[coap]` limits as `tcp_bind`.
    pub ws_bind: Vec<SocketAddr>,
    /// PSK identity of the pre-shared key `psk_key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psk_identity: Option<String>,
    /// The pre-shared key: text, or `0x` and hex digits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psk_key: Option<String>,
    /// More identities and their keys (`identity = "key"`).
    pub psk_keys: BTreeMap<String, String>,
    /// PEM certificate chain of the server (certificate mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: refuse clients without a valid certificate.
    pub require_client_cert: bool,
    /// Largest datagram the server's records may take.
    pub mtu: u32,
    /// Most DTLS sessions at once per listener.
    pub max_sessions: usize,
    /// Seconds without traffic after which a session is dropped.
    pub idle_timeout_s: u64,
    /// Seconds a handshake may take.
    pub handshake_timeout_s: u64,
    /// Most handshakes in progress at once from one source (IPv4 address
    /// or IPv6 /64).
    pub max_handshakes_per_source: usize,
}

impl Default for CoapsSection {
    fn default() -> Self {
        CoapsSection {
            bind: Vec::new(),
            tcp_bind: Vec::new(),
            ws_bind: Vec::new(),
            psk_identity: None,
            psk_key: None,
            psk_keys: BTreeMap::new(),
            cert: None,
            key: None,
            client_ca: None,
            require_client_cert: true,
            mtu: mintgate_dtls::DEFAULT_MTU,
            max_sessions: 1024,
            idle_timeout_s: 300,
            handshake_timeout_s: 10,
            max_handshakes_per_source: mintgate_dtls::server::DEFAULT_HANDSHAKES_PER_SOURCE,
        }
    }
}

impl CoapsSection {
    /// Whether any coaps listener (DTLS over UDP) is configured.
    pub fn enabled(&self) -> bool {
        !self.bind.is_empty()
    }

    /// The TLS configuration of the `coaps+tcp` listeners.
    pub fn tcp_tls(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, String> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Err(
                "coaps.tcp_bind needs a certificate (coaps.cert and coaps.key): TLS here has \
                 no pre-shared keys"
                    .into(),
            );
        };
        crate::coap_tcp::tls_config(
            cert,
            key,
            self.client_ca.as_deref(),
            self.require_client_cert,
        )
    }

    /// The TLS configuration of the `coaps+ws` listeners: as `coaps+tcp`'s,
    /// with ALPN `http/1.1` (the WebSocket upgrade is HTTP/1.1).
    pub fn ws_tls(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, String> {
        let mut c = (*self
            .tcp_tls()
            .map_err(|e| e.replace("tcp_bind", "ws_bind"))?)
        .clone();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(std::sync::Arc::new(c))
    }

    /// The DTLS server settings; checks every key.
    pub fn settings(&self) -> Result<ServerSettings, ConfigError> {
        let v = |key, why: String| ConfigError::Value { key, why };
        let mut psk = Vec::new();
        match (&self.psk_identity, &self.psk_key) {
            (Some(id), Some(k)) => {
                let key = parse_key(k).map_err(|e| v("coaps.psk_key", e.to_string()))?;
                let key_len = key.len();
                psk.push(Psk::new(id, key).map_err(|e| {
                    // name the key whose value is wrong
                    let which = if key_len == 0 || key_len > mintgate_dtls::MAX_KEY_LEN {
                        "coaps.psk_key"
                    } else {
                        "coaps.psk_identity"
                    };
                    v(which, e.to_string())
                })?);
                if self.psk_keys.contains_key(id) {
                    return Err(v(
                        "coaps.psk_keys",
                        format!("{id:?} is also coaps.psk_identity: give its key once"),
                    ));
                }
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(v(
                    "coaps.psk_key",
                    "psk_identity is set but psk_key is not (mintgate serve also takes it \
                     from the MINTGATE_PSK_KEY variable)"
                        .into(),
                ))
            }
            (None, Some(_)) => {
                return Err(v(
                    "coaps.psk_identity",
                    "psk_key is set but psk_identity is not".into(),
                ))
            }
        }
        for (id, k) in &self.psk_keys {
            let key = parse_key(k).map_err(|e| v("coaps.psk_keys", format!("{id}: {e}")))?;
            psk.push(Psk::new(id, key).map_err(|e| v("coaps.psk_keys", format!("{id}: {e}")))?);
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(v(
                "coaps.cert",
                "cert and key must be given together".into(),
            ));
        }
        if !self.tcp_bind.is_empty() {
            self.tcp_tls().map_err(|e| v("coaps.tcp_bind", e))?;
        }
        if !self.ws_bind.is_empty() {
            self.ws_tls().map_err(|e| v("coaps.ws_bind", e))?;
        }
        if self.enabled() && psk.is_empty() && self.cert.is_none() {
            return Err(v(
                "coaps",
                "a coaps listener needs a pre-shared key (psk_identity and psk_key, or \
                 psk_keys) or a certificate (cert and key)"
                    .into(),
            ));
        }
        if !(256..=65507).contains(&self.mtu) {
            return Err(v(
                "coaps.mtu",
                format!("{} is outside 256..=65507", self.mtu),
            ));
        }
        if !(1..=1 << 20).contains(&self.max_sessions) {
            return Err(v(
                "coaps.max_sessions",
                format!("{} is outside 1..=1048576", self.max_sessions),
            ));
        }
        if !(1..=self.max_sessions).contains(&self.max_handshakes_per_source) {
            return Err(v(
                "coaps.max_handshakes_per_source",
                format!(
                    "{} is outside 1..=max_sessions ({})",
                    self.max_handshakes_per_source, self.max_sessions
                ),
            ));
        }
        if self.idle_timeout_s == 0 || self.handshake_timeout_s == 0 {
            return Err(v(
                "coaps.idle_timeout_s",
                "idle_timeout_s and handshake_timeout_s must be at least 1".into(),
            ));
        }
        Ok(ServerSettings {
            psk,
            certs: CertFiles {
                chain: self.cert.clone(),
                key: self.key.clone(),
                ca: self.client_ca.clone(),
            },
            require_client_cert: self.require_client_cert,
            mtu: self.mtu,
            max_sessions: self.max_sessions,
            idle_timeout: Duration::from_secs(self.idle_timeout_s),
            handshake_timeout: Duration::from_secs(self.handshake_timeout_s),
            max_handshakes_per_source: self.max_handshakes_per_source,
            cookie_period: mintgate_dtls::server::DEFAULT_COOKIE_PERIOD,
        })
    }
}

/// The counters of the coaps listeners (summed), as `mintgate_coaps_*`.
pub fn collect(stats: &[&DtlsStats], m: &mut crate::exposition::Exposition) {
    let Some(first) = stats.first() else {
        return;
    };
    let mut fields = first.fields();
    for s in &stats[1..] {
        for (f, (_, _, v, _)) in fields.iter_mut().zip(s.fields()) {
            f.2 += v;
        }
    }
    for (name, help, v, counter) in fields {
        let name = format!("mintgate_coaps_{name}");
        if counter {
            m.counter(&name, help, v);
        } else {
            m.gauge(&name, help, v);
        }
    }
}
