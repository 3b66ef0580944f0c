//! One MQTT connection over rumqttc, 3.1.1 or 5, behind one small interface:
//! the publish queue and the subscriber see [`LinkEvent`]s and never the two
//! protocol versions' types.
//!
//! A [`Conn`] is one attempt: a fresh rumqttc client and event loop whose
//! poll runs in its own task and forwards events over a channel (so the
//! caller can `select!` on it without cancelling a half-written frame).
//! When the connection fails the task ends after reporting the error; the
//! caller drops the `Conn` and makes a new one. Nothing rumqttc would resend
//! on its own survives into the next connection: retransmission is the
//! publish queue's job, so that every `Sent` event of a connection maps to
//! exactly the request that caused it, in order.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

/// The MQTT protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (`mqtt://`).
    V311,
    /// MQTT 5 (`mqtt5://`).
    V5,
}

/// A broker address: `mqtt://HOST[:PORT]` (MQTT 3.1.1) or
/// `mqtt5://HOST[:PORT]` (MQTT 5), `mqtts://` and `mqtts5://` for the same
/// over TLS; `tcp://` is accepted for `mqtt://` and `ssl://` for `mqtts://`.
/// The port defaults to 1883, 8883 over TLS.
///
/// It also carries how to authenticate to that broker ([`Security`]: CA,
/// client certificate, user name and password), which the URL text never
/// holds: every client made from it (publish queue, subscriber, listener)
/// uses the same credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerUrl {
    /// Host name or address (IPv6 without brackets). Over TLS this is the
    /// name the broker's certificate must carry.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Protocol version.
    pub version: Version,
    /// TLS (`mqtts://`, `mqtts5://`, `wss://`, `wss5://`).
    pub tls: bool,
    /// MQTT over WebSockets (`ws://`, `wss://`; `ws5://`, `wss5://` for
    /// MQTT 5): the HTTP path of the upgrade request (`/mqtt`, `/`).
    pub ws_path: Option<String>,
    /// Credentials and trust; not part of the URL's text.
    pub security: Security,
}

/// Longest WebSocket path a broker URL may carry, bytes.
pub const MAX_WS_PATH: usize = 1024;

impl BrokerUrl {
    /// `mqtt://host:port` for a 3.1.1 broker at `addr`.
    pub fn from_addr(addr: std::net::SocketAddr) -> BrokerUrl {
        BrokerUrl {
            host: addr.ip().to_string(),
            port: addr.port(),
            version: Version::V311,
            tls: false,
            ws_path: None,
            security: Security::default(),
        }
    }

    /// The same broker over another protocol version.
    pub fn with_version(mut self, v: Version) -> BrokerUrl {
        self.version = v;
        self
    }

    /// The same broker with these credentials.
    pub fn with_security(mut self, s: Security) -> BrokerUrl {
        self.security = s;
        self
    }

    /// Checks that the security settings fit the URL and can be used now:
    /// the files are read and the TLS configuration built, so that a
    /// missing or malformed file is said before the first connection.
    pub fn check(&self) -> Result<(), String> {
        let s = &self.security;
        if !self.tls && s.tls_requested() {
            return Err(format!(
                "{self}: a CA file or client certificate needs TLS (mqtts://, mqtts5://, wss://)"
            ));
        }
        if s.password.is_some() && s.username.is_none() {
            return Err("a password needs a user name".into());
        }
        if let Some(u) = &s.username {
            if u.len() > 65_535 {
                return Err("the user name is longer than 65535 bytes".into());
            }
        }
        if self.tls {
            s.tls_config()?;
        }
        Ok(())
    }
}

/// A password: never printed (`Debug` shows `***`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `s`.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// Reads a password file: its first line, without the line end. An empty
    /// or unreadable file is an error.
    pub fn from_file(path: &std::path::Path) -> Result<Secret, String> {
        use std::io::Read as _;
        let f = std::fs::File::open(path)
            .map_err(|e| format!("password file {}: {e}", path.display()))?;
        let mut text = String::new();
        // A password is short: read at most 64 KiB of whatever the file is.
        f.take(65_536)
            .read_to_string(&mut text)
            .map_err(|e| format!("password file {}: {e}", path.display()))?;
        let line = text.lines().next().unwrap_or("");
        if line.is_empty() {
            return Err(format!(
                "password file {}: the first line is empty",
                path.display()
            ));
        }
        Ok(Secret(line.to_owned()))
    }

    /// Reads a password from the environment variable `var`.
    pub fn from_env(var: &str) -> Result<Secret, String> {
        match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(Secret(v)),
            Ok(_) => Err(format!("environment variable {var} is empty")),
            Err(e) => Err(format!("environment variable {var}: {e}")),
        }
    }

    /// The password itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How a client proves who it is to the broker and checks who the broker is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Security {
    /// PEM file of the CA certificate(s) the broker's certificate must chain
    /// to; `None`: the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM file of our certificate chain (mutual TLS).
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM file of the private key of `cert_file`.
    pub key_file: Option<std::path::PathBuf>,
    /// User name of the CONNECT.
    pub username: Option<String>,
    /// Password of the CONNECT.
    pub password: Option<Secret>,
}

impl Security {
    fn tls_requested(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Builds the TLS client configuration: reads the CA (or the system's
    /// roots) and the client certificate and key. Errors name the file.
    pub fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        use rustls_pki_types::pem::PemObject as _;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                let certs = read_pem_certs(path, "CA file")?;
                for c in certs {
                    roots
                        .add(c)
                        .map_err(|e| format!("CA file {}: {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for c in found.certs {
                    // Some system stores hold certificates webpki cannot
                    // parse; the others still count.
                    let _ = roots.add(c);
                }
                if roots.is_empty() {
                    return Err(format!(
                        "no system root certificates could be loaded{}; give a CA file",
                        found
                            .errors
                            .first()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    ));
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> =
                    read_pem_certs(cert, "client certificate file")?;
                let bytes = read_bounded(key, "client key file")?;
                let k = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                    format!(
                        "client key file {}: no private key in it ({e})",
                        key.display()
                    )
                })?;
                builder.with_client_auth_cert(chain, k).map_err(|e| {
                    format!(
                        "client certificate {} and key {}: {e}",
                        cert.display(),
                        key.display()
                    )
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err("a client certificate needs its key, and a key its certificate".into())
            }
        };
        Ok(Arc::new(config))
    }
}

/// Reads a PEM or key file of at most 1 MiB.
fn read_bounded(path: &std::path::Path, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take((1 << 20) + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if bytes.len() > 1 << 20 {
        return Err(format!("{what} {}: larger than 1 MiB", path.display()));
    }
    Ok(bytes)
}

fn read_pem_certs(
    path: &std::path::Path,
    what: &str,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    use rustls_pki_types::pem::PemObject as _;
    let bytes = read_bounded(path, what)?;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// Says what a failed connection attempt means, in words a user can act on:
/// which side of TLS failed and why, or which CONNACK refusal.
fn describe_v4(e: &rumqttc::ConnectionError) -> (String, bool) {
    use rumqttc::{ConnectReturnCode as C, ConnectionError as E};
    match e {
        E::ConnectionRefused(code) => {
            let why = match code {
                C::BadUserNamePassword => "bad user name or password",
                C::NotAuthorized => "not authorised",
                C::RefusedProtocolVersion => "protocol version not accepted",
                C::BadClientId => "client id rejected",
                C::ServiceUnavailable => "service unavailable",
                C::Success => "success?",
            };
            (
                format!("the broker refused the connection (CONNACK): {why}"),
                true,
            )
        }
        other => (describe_other(other), false),
    }
}

fn describe_v5(e: &rumqttc::v5::ConnectionError) -> (String, bool) {
    use rumqttc::v5::ConnectionError as E;
    match e {
        E::ConnectionRefused(code) => (
            format!("the broker refused the connection (CONNACK): {code:?}"),
            true,
        ),
        other => (describe_other(other), false),
    }
}

/// A TLS failure anywhere in `e`'s chain of causes in words, or `e` as it
/// says itself. tokio-rustls carries rustls' errors inside I/O errors, and
/// an alert can come after our side of the handshake is done (over TLS 1.3
/// a server that wants a client certificate says so then), wrapped again in
/// rumqttc's state errors.
fn describe_other(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return describe_rustls_error(r);
        }
        if let Some(r) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return describe_rustls_error(r);
        }
        if let Some(rumqttc::TlsError::DNSName(_)) = err.downcast_ref::<rumqttc::TlsError>() {
            return format!("TLS: the host is not a valid server name ({e})");
        }
        cur = err.source();
    }
    e.to_string()
}

fn describe_rustls_error(r: &rustls::Error) -> String {
    use rustls::{AlertDescription as A, CertificateError as CE, Error as R};
    match r {
        R::InvalidCertificate(CE::UnknownIssuer | CE::BadSignature) => {
            "TLS: the broker's certificate is not signed by a trusted CA (wrong CA file?)".into()
        }
        R::InvalidCertificate(CE::NotValidForName)
        | R::InvalidCertificate(CE::NotValidForNameContext { .. }) => {
            "TLS: the broker's certificate is not valid for the host name in the broker URL".into()
        }
        R::InvalidCertificate(CE::Expired) | R::InvalidCertificate(CE::ExpiredContext { .. }) => {
            "TLS: the broker's certificate has expired".into()
        }
        R::InvalidCertificate(CE::NotValidYet)
        | R::InvalidCertificate(CE::NotValidYetContext { .. }) => {
            "TLS: the broker's certificate is not valid yet (check the clock)".into()
        }
        R::AlertReceived(A::CertificateRequired) => {
            "TLS: the broker requires a client certificate".into()
        }
        R::AlertReceived(a @ (A::BadCertificate | A::UnknownCA | A::CertificateUnknown)) => {
            format!("TLS: the broker refused our client certificate ({a:?})")
        }
        R::AlertReceived(a) => format!("TLS: the broker refused the handshake ({a:?})"),
        other => format!("TLS handshake: {other}"),
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ws = self.ws_path.is_some();
        let scheme = match (self.version, self.tls, ws) {
            (Version::V311, false, false) => "mqtt",
            (Version::V5, false, false) => "mqtt5",
            (Version::V311, true, false) => "mqtts",
            (Version::V5, true, false) => "mqtts5",
            (Version::V311, false, true) => "ws",
            (Version::V5, false, true) => "ws5",
            (Version::V311, true, true) => "wss",
            (Version::V5, true, true) => "wss5",
        };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)?;
        }
        f.write_str(self.ws_path.as_deref().unwrap_or(""))
    }
}

impl FromStr for BrokerUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "bad broker URL {s:?}: expected mqtt://HOST[:PORT], mqtt5://HOST[:PORT], \
                 mqtts://HOST[:PORT], mqtts5://HOST[:PORT], ws://HOST[:PORT][/PATH] or \
                 wss://HOST[:PORT][/PATH] (ws5://, wss5:// for MQTT 5 over WebSockets)"
            )
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(bad)?;
        let (version, tls, ws) = match scheme.to_ascii_lowercase().as_str() {
            "mqtt" | "tcp" => (Version::V311, false, false),
            "mqtt5" => (Version::V5, false, false),
            "mqtts" | "ssl" => (Version::V311, true, false),
            "mqtts5" => (Version::V5, true, false),
            "ws" => (Version::V311, false, true),
            "ws5" => (Version::V5, false, true),
            "wss" => (Version::V311, true, true),
            "wss5" => (Version::V5, true, true),
            _ => return Err(bad()),
        };
        // a WebSocket URL may carry a path: the upgrade request's
        let (rest, ws_path) = match rest.find('/') {
            Some(i) if ws => {
                let path = &rest[i..];
                if path.len() > MAX_WS_PATH
                    || !path
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && !matches!(b, b'#' | b'\\'))
                {
                    return Err(format!(
                        "bad broker URL {s:?}: the path must be at most {MAX_WS_PATH} printable \
                         ASCII characters, without '#'"
                    ));
                }
                (&rest[..i], Some(path.to_owned()))
            }
            _ if ws => (rest, Some("/".to_owned())),
            _ => (rest.trim_end_matches('/'), None),
        };
        if rest.is_empty() || rest.contains('/') || rest.contains('@') || rest.contains('?') {
            return Err(bad());
        }
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, after) = r.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(bad)?),
            };
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!(
                    "bad broker URL {s:?}: [{h}] is not an IPv6 address"
                ));
            }
            (h.to_owned(), port)
        } else {
            let (h, port) = match rest.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => return Err(bad()),
                None => (rest, None),
            };
            if h.is_empty() {
                return Err(bad());
            }
            if h.len() > 253 || !h.bytes().all(is_host_name_byte) {
                return Err(format!(
                    "bad broker URL {s:?}: host {h:?} is not an IPv4 address or a host name \
                     (letters, digits, '-', '.', '_'; an IPv6 address goes in brackets)"
                ));
            }
            (h.to_owned(), port)
        };
        let port = match port {
            None if ws && tls => 443,
            None if ws => 80,
            None if tls => 8883,
            None => 1883,
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?,
        };
        Ok(BrokerUrl {
            host,
            port,
            version,
            tls,
            ws_path,
            security: Security::default(),
        })
    }
}

/// What a host name or IPv4 address in a broker URL may be made of.
fn is_host_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')
}

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// After a refused CONNECT (credentials, authorisation) the next attempt
/// waits at least this long, doubling up to [`REFUSED_BACKOFF_MAX`]: a
/// broker that said no will likely say it again until someone acts.
const REFUSED_BACKOFF_MIN: Duration = Duration::from_secs(1);
const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Back-off between connection attempts, from [`BACKOFF_MIN`] doubling:
/// given the current back-off and whether the attempt ended in a refused
/// CONNECT, the wait before the next attempt and the back-off after it.
pub(crate) fn next_backoff(backoff: Duration, refused: bool) -> (Duration, Duration) {
    if refused {
        let wait = backoff.max(REFUSED_BACKOFF_MIN);
        (wait, (wait * 2).min(REFUSED_BACKOFF_MAX))
    } else {
        (backoff, (backoff * 2).min(BACKOFF_MAX))
    }
}

/// The first back-off, and the one after a successful connection.
pub(crate) const FIRST_BACKOFF: Duration = BACKOFF_MIN;

/// Quality of service of a publish or subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    /// At most once.
    AtMostOnce,
    /// At least once (PUBACK).
    AtLeastOnce,
    /// Exactly once (PUBREC/PUBREL/PUBCOMP).
    ExactlyOnce,
}

impl Qos {
    /// From 0, 1, 2.
    pub fn from_level(l: u8) -> Option<Qos> {
        match l {
            0 => Some(Qos::AtMostOnce),
            1 => Some(Qos::AtLeastOnce),
            2 => Some(Qos::ExactlyOnce),
            _ => None,
        }
    }

    /// 0, 1 or 2.
    pub fn level(self) -> u8 {
        match self {
            Qos::AtMostOnce => 0,
            Qos::AtLeastOnce => 1,
            Qos::ExactlyOnce => 2,
        }
    }

    fn v4(self) -> rumqttc::QoS {
        match self {
            Qos::AtMostOnce => rumqttc::QoS::AtMostOnce,
            Qos::AtLeastOnce => rumqttc::QoS::AtLeastOnce,
            Qos::ExactlyOnce => rumqttc::QoS::ExactlyOnce,
        }
    }

    fn v5(self) -> rumqttc::v5::mqttbytes::QoS {
        use rumqttc::v5::mqttbytes::QoS;
        match self {
            Qos::AtMostOnce => QoS::AtMostOnce,
            Qos::AtLeastOnce => QoS::AtLeastOnce,
            Qos::ExactlyOnce => QoS::ExactlyOnce,
        }
    }
}

/// Settings of one connection.
#[derive(Clone, Debug)]
pub struct ConnOptions {
    /// Client identifier.
    pub client_id: String,
    /// Clean session (3.1.1) / clean start with no session expiry (5).
    pub clean_session: bool,
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// Most outgoing QoS 1/2 publishes rumqttc keeps unacknowledged.
    pub inflight: u16,
    /// Largest packet accepted or sent, bytes. Over MQTT 5 the broker is
    /// told, and keeps larger messages from us; over 3.1.1 a larger one
    /// ends the connection (and a persistent session gets it again on the
    /// next), so the default is generous.
    pub max_packet: usize,
    /// The last will the broker publishes when the connection ends
    /// without a DISCONNECT.
    pub will: Option<Will>,
    /// MQTT 5, with `clean_session` off: how long the broker keeps the
    /// session (subscriptions and the messages queued for them) after a
    /// disconnect. At most `u32::MAX` seconds (about 136 years, which MQTT
    /// 5 means as never). Over 3.1.1 the broker alone decides.
    pub session_expiry: Duration,
}

/// [`ConnOptions::session_expiry`] when not chosen: a day.
pub const DEFAULT_SESSION_EXPIRY: Duration = Duration::from_secs(86_400);

/// The MQTT 5 properties of a publish-queue PUBLISH ([`Conn::publish_with`]).
#[derive(Clone, Copy, Debug)]
pub struct PublishMeta<'a> {
    /// The publisher id (user property [`USER_PROP_PUBLISHER`]).
    pub publisher: &'a str,
    /// The message's sequence on its topic (user property [`USER_PROP_SEQ`]).
    pub seq: u64,
    /// Message expiry interval, seconds.
    pub expiry_s: Option<u32>,
}

/// Name of the MQTT 5 user property carrying the publisher id.
pub const USER_PROP_PUBLISHER: &str = "pub";
/// Name of the MQTT 5 user property carrying the sequence number.
pub const USER_PROP_SEQ: &str = "seq";

/// A last will: what the broker publishes for us when we vanish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Will {
    /// Its topic.
    pub topic: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its QoS.
    pub qos: Qos,
    /// Whether the broker keeps it as the topic's retained message.
    pub retain: bool,
}

/// [`ConnOptions::max_packet`]'s default: 16 MiB.
pub const DEFAULT_MAX_PACKET: usize = 16 << 20;

impl ConnOptions {
    /// Defaults for `client_id`: clean session, 5 s keep-alive, inflight 1.
    pub fn new(client_id: impl Into<String>) -> ConnOptions {
        ConnOptions {
            client_id: client_id.into(),
            clean_session: true,
            keep_alive: Duration::from_secs(5),
            inflight: 1,
            max_packet: DEFAULT_MAX_PACKET,
            will: None,
            session_expiry: DEFAULT_SESSION_EXPIRY,
        }
    }
}

/// What a connection reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// CONNACK received (accepted).
    Connected {
        /// The broker kept our session.
        session_present: bool,
    },
    /// A PUBLISH with this packet id was written (one per publish request,
    /// in request order).
    Sent(u16),
    /// The publish with this packet id is complete: PUBACK (QoS 1) or
    /// PUBCOMP (QoS 2). For MQTT 5, `Err` carries a failure reason code.
    Acked(u16, Result<(), String>),
    /// A message arrived on a subscription.
    Message {
        /// Its topic (lossy UTF-8).
        topic: String,
        /// Its payload.
        payload: Vec<u8>,
        /// MQTT 5: the publisher id and sequence its user properties carry
        /// ([`USER_PROP_PUBLISHER`], [`USER_PROP_SEQ`]), when both are there
        /// and well-formed.
        origin: Option<(String, u64)>,
    },
    /// A message of a transport that wants to hear when the application
    /// is done with it ([`Backend::settle`] with `token`): a JetStream
    /// consumer's, acknowledged once delivered in order or dropped as a
    /// duplicate, so that a durable consumer resumes where it stopped.
    Held {
        /// Its topic (a subject).
        topic: String,
        /// Its payload.
        payload: Vec<u8>,
        /// What [`Backend::settle`] takes.
        token: u64,
    },
    /// SUBACK: whether every filter was granted.
    SubAck(bool),
    /// Something else (pings, our own acks).
    Other,
}

enum Client {
    V4(rumqttc::AsyncClient),
    V5(rumqttc::v5::AsyncClient),
    Other(Box<dyn Backend>),
}

/// Another transport behind a [`Conn`] (the JetStream output of
/// `mintgate-nats`): what the publish queue and the subscriber ask of it.
/// Its events come over the channel given to [`Conn::custom`], with the
/// same rules as MQTT's: the first is `Connected` or an error, each
/// [`Backend::publish`] yields one `Sent(token)` in call order and later
/// one `Acked(token, ..)`, and an error ends the connection.
pub trait Backend: Send {
    /// Hands one queued message over without waiting (its `id` and the
    /// publisher's id name it for de-duplication).
    fn publish(&self, m: &crate::queue::QueuedMessage) -> Result<(), String>;
    /// Starts a subscription without waiting (`SubAck` when it is set up).
    fn subscribe(&self, filter: &str) -> Result<(), String>;
    /// The application is done with the [`LinkEvent::Held`] message
    /// `token` (delivered, or dropped as a duplicate or undecodable).
    fn settle(&self, token: u64);
    /// Ends the connection in an orderly way, without waiting.
    fn disconnect(&self);
}

/// A source of [`Conn`]s other than MQTT: the publish queue's driver
/// calls [`Uplink::start`] for every connection attempt (inside its tokio
/// runtime) instead of connecting to [`crate::PublisherConfig::broker`].
pub trait Uplink: Send + Sync + fmt::Debug {
    /// Starts one connection attempt for publisher `publisher`.
    fn start(&self, publisher: &str) -> Conn;
    /// Where it goes, for logs.
    fn describe(&self) -> String;
}

/// One connection attempt; see the module docs.
pub struct Conn {
    client: Client,
    events: mpsc::UnboundedReceiver<Result<LinkEvent, String>>,
    task: tokio::task::JoinHandle<()>,
    refused: Arc<AtomicBool>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The transport for `url` (TCP, TLS, WebSockets, WebSockets over TLS),
/// or the reason it cannot be built.
fn transport(url: &BrokerUrl) -> Result<rumqttc::Transport, String> {
    let tls = || {
        url.security
            .tls_config()
            .map(rumqttc::TlsConfiguration::Rustls)
    };
    Ok(match (url.tls, url.ws_path.is_some()) {
        (false, false) => rumqttc::Transport::Tcp,
        (true, false) => rumqttc::Transport::tls_with_config(tls()?),
        (false, true) => rumqttc::Transport::Ws,
        (true, true) => rumqttc::Transport::wss_with_config(tls()?),
    })
}

/// What rumqttc takes as the broker's address: the host, or for
/// WebSockets the whole URL of the upgrade request.
fn broker_addr(url: &BrokerUrl) -> String {
    match &url.ws_path {
        None => url.host.clone(),
        Some(path) => {
            let scheme = if url.tls { "wss" } else { "ws" };
            if url.host.contains(':') {
                format!("{scheme}://[{}]:{}{path}", url.host, url.port)
            } else {
                format!("{scheme}://{}:{}{path}", url.host, url.port)
            }
        }
    }
}

impl Conn {
    /// Starts connecting to `url` (must be called inside a tokio runtime).
    /// The first event is `Connected` or an error.
    pub fn start(url: &BrokerUrl, o: &ConnOptions) -> Conn {
        let (tx, events) = mpsc::unbounded_channel();
        let cap = o.inflight as usize + 16;
        let refused = Arc::new(AtomicBool::new(false));
        let flag = refused.clone();
        // A TLS configuration that cannot be built (a CA file gone since the
        // start) fails this attempt like a connection error would.
        let (transport, setup_error) = match transport(url) {
            Ok(t) => (t, None),
            Err(e) => (rumqttc::Transport::Tcp, Some(e)),
        };
        let creds = url
            .security
            .username
            .as_ref()
            .map(|u| (u.clone(), url.security.password.clone()));
        match url.version {
            Version::V311 => {
                // The V5 arm below takes the same steps: rumqttc's v4 and v5
                // options, clients and event loops are distinct types with no
                // common trait.
                let mut mo = rumqttc::MqttOptions::new(&o.client_id, broker_addr(url), url.port);
                mo.set_keep_alive(o.keep_alive.max(Duration::from_secs(1)))
                    .set_clean_session(o.clean_session)
                    .set_inflight(o.inflight.max(1))
                    .set_max_packet_size(o.max_packet, o.max_packet)
                    .set_request_channel_capacity(cap)
                    .set_transport(transport);
                if let Some((u, p)) = creds {
                    mo.set_credentials(u, p.as_ref().map_or("", Secret::expose));
                }
                if let Some(w) = &o.will {
                    mo.set_last_will(rumqttc::LastWill::new(
                        &w.topic,
                        w.payload.clone(),
                        w.qos.v4(),
                        w.retain,
                    ));
                }
                let (client, mut el) = rumqttc::AsyncClient::new(mo, cap);
                // One small packet per round trip: no Nagle delays. (rumqttc's
                // MQTT 5 client has no such option.)
                let mut net = rumqttc::NetworkOptions::new();
                net.set_tcp_nodelay(true);
                el.set_network_options(net);
                let task = tokio::spawn(async move {
                    if let Some(e) = setup_error {
                        let _ = tx.send(Err(e));
                        return;
                    }
                    loop {
                        let ev = el.poll().await;
                        let stop = ev.is_err();
                        let ev = ev.map(v4_event).map_err(|e| {
                            let (msg, refused) = describe_v4(&e);
                            flag.store(refused, Ordering::Relaxed);
                            msg
                        });
                        if tx.send(ev).is_err() || stop {
                            return;
                        }
                    }
                });
                Conn {
                    client: Client::V4(client),
                    events,
                    task,
                    refused,
                }
            }
            Version::V5 => {
                let mut mo =
                    rumqttc::v5::MqttOptions::new(&o.client_id, broker_addr(url), url.port);
                mo.set_keep_alive(o.keep_alive.max(Duration::from_secs(1)))
                    .set_clean_start(o.clean_session)
                    .set_max_packet_size(Some(o.max_packet as u32))
                    .set_outgoing_inflight_upper_limit(o.inflight.max(1))
                    .set_request_channel_capacity(cap)
                    .set_transport(transport);
                if let Some((u, p)) = creds {
                    mo.set_credentials(u, p.as_ref().map_or("", Secret::expose));
                }
                if let Some(w) = &o.will {
                    mo.set_last_will(rumqttc::v5::mqttbytes::v5::LastWill::new(
                        &w.topic,
                        w.payload.clone(),
                        w.qos.v5(),
                        w.retain,
                        None,
                    ));
                }
                if !o.clean_session {
                    let s = o.session_expiry.as_secs().min(u64::from(u32::MAX)) as u32;
                    mo.set_session_expiry_interval(Some(s));
                }
                let (client, mut el) = rumqttc::v5::AsyncClient::new(mo, cap);
                let task = tokio::spawn(async move {
                    if let Some(e) = setup_error {
                        let _ = tx.send(Err(e));
                        return;
                    }
                    loop {
                        let ev = el.poll().await;
                        let stop = ev.is_err();
                        let ev = ev.map(v5_event).map_err(|e| {
                            let (msg, refused) = describe_v5(&e);
                            flag.store(refused, Ordering::Relaxed);
                            msg
                        });
                        if tx.send(ev).is_err() || stop {
                            return;
                        }
                    }
                });
                Conn {
                    client: Client::V5(client),
                    events,
                    task,
                    refused,
                }
            }
        }
    }

    /// A connection over another transport: `backend` takes the requests,
    /// `events` brings its events, `task` (aborted on drop) runs it, and
    /// `refused` says that the server refused our credentials.
    pub fn custom(
        backend: Box<dyn Backend>,
        events: mpsc::UnboundedReceiver<Result<LinkEvent, String>>,
        task: tokio::task::JoinHandle<()>,
        refused: Arc<AtomicBool>,
    ) -> Conn {
        Conn {
            client: Client::Other(backend),
            events,
            task,
            refused,
        }
    }

    /// Whether the connection ended because the broker refused the CONNECT
    /// (bad credentials, not authorised): worth retrying only slowly.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// The next event; `Err` ends the connection (also when the poll task
    /// is gone). Cancel-safe.
    pub async fn next(&mut self) -> Result<LinkEvent, String> {
        match self.events.recv().await {
            Some(ev) => ev,
            None => Err("connection task ended".into()),
        }
    }

    /// The next event if one is ready now (to handle bursts in one go).
    pub fn try_next(&mut self) -> Option<Result<LinkEvent, String>> {
        self.events.try_recv().ok()
    }

    /// Queues a PUBLISH without waiting.
    pub fn publish(&self, topic: &str, qos: Qos, payload: Vec<u8>) -> Result<(), String> {
        self.publish_retained(topic, qos, false, payload)
    }

    /// Queues a PUBLISH, retained or not, without waiting.
    pub fn publish_retained(
        &self,
        topic: &str,
        qos: Qos,
        retain: bool,
        payload: Vec<u8>,
    ) -> Result<(), String> {
        match &self.client {
            Client::V4(c) => c
                .try_publish(topic, qos.v4(), retain, payload)
                .map_err(|e| e.to_string()),
            Client::V5(c) => c
                .try_publish(topic, qos.v5(), retain, payload)
                .map_err(|e| e.to_string()),
            Client::Other(_) => Err("this transport publishes queued messages only".into()),
        }
    }

    /// Queues the publish of one message of the publish queue (over MQTT
    /// with `meta`: [`Conn::publish_with`]).
    pub fn publish_queued(
        &self,
        m: crate::queue::QueuedMessage,
        qos: Qos,
        meta: &PublishMeta<'_>,
    ) -> Result<(), String> {
        match &self.client {
            Client::Other(b) => b.publish(&m),
            _ => self.publish_with(&m.topic, qos, m.retain, m.payload, meta),
        }
    }

    /// Queues a PUBLISH of the publish queue without waiting. Over MQTT 5 it
    /// carries `meta` as properties: the user properties `pub` (the
    /// publisher id) and `seq` (its sequence on the topic), so that a
    /// receiver can order and de-duplicate a bare payload too, and the
    /// message expiry interval. Over 3.1.1 `meta` is not sent.
    pub fn publish_with(
        &self,
        topic: &str,
        qos: Qos,
        retain: bool,
        payload: Vec<u8>,
        meta: &PublishMeta<'_>,
    ) -> Result<(), String> {
        match &self.client {
            Client::V4(_) | Client::Other(_) => self.publish_retained(topic, qos, retain, payload),
            Client::V5(c) => {
                let props = rumqttc::v5::mqttbytes::v5::PublishProperties {
                    message_expiry_interval: meta.expiry_s,
                    user_properties: vec![
                        (USER_PROP_PUBLISHER.into(), meta.publisher.into()),
                        (USER_PROP_SEQ.into(), meta.seq.to_string()),
                    ],
                    ..Default::default()
                };
                c.try_publish_with_properties(topic, qos.v5(), retain, payload, props)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Queues a SUBSCRIBE without waiting.
    pub fn subscribe(&self, filter: &str, qos: Qos) -> Result<(), String> {
        match &self.client {
            Client::V4(c) => c.try_subscribe(filter, qos.v4()).map_err(|e| e.to_string()),
            Client::V5(c) => c.try_subscribe(filter, qos.v5()).map_err(|e| e.to_string()),
            Client::Other(b) => b.subscribe(filter),
        }
    }

    /// Says that the application is done with a [`LinkEvent::Held`]
    /// message (nothing over MQTT).
    pub fn settle(&self, token: u64) {
        if let Client::Other(b) = &self.client {
            b.settle(token);
        }
    }

    /// Queues a DISCONNECT without waiting.
    pub fn disconnect(&self) {
        let _ = match &self.client {
            Client::V4(c) => c.try_disconnect().map_err(|e| e.to_string()),
            Client::V5(c) => c.try_disconnect().map_err(|e| e.to_string()),
            Client::Other(b) => {
                b.disconnect();
                Ok(())
            }
        };
    }
}

fn outgoing(o: rumqttc::Outgoing) -> LinkEvent {
    match o {
        rumqttc::Outgoing::Publish(pkid) => LinkEvent::Sent(pkid),
        _ => LinkEvent::Other,
    }
}

fn v4_event(e: rumqttc::Event) -> LinkEvent {
    use rumqttc::{Event, Packet};
    match e {
        Event::Outgoing(o) => outgoing(o),
        Event::Incoming(p) => match p {
            Packet::ConnAck(c) => LinkEvent::Connected {
                session_present: c.session_present,
            },
            Packet::PubAck(a) => LinkEvent::Acked(a.pkid, Ok(())),
            Packet::PubComp(a) => LinkEvent::Acked(a.pkid, Ok(())),
            Packet::Publish(p) => LinkEvent::Message {
                topic: p.topic.clone(),
                payload: p.payload.to_vec(),
                origin: None,
            },
            Packet::SubAck(s) => LinkEvent::SubAck(
                s.return_codes
                    .iter()
                    .all(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_))),
            ),
            _ => LinkEvent::Other,
        },
    }
}

fn v5_event(e: rumqttc::v5::Event) -> LinkEvent {
    use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PubCompReason, SubscribeReasonCode};
    use rumqttc::v5::Event;
    match e {
        Event::Outgoing(o) => outgoing(o),
        Event::Incoming(p) => match p {
            Packet::ConnAck(c) => LinkEvent::Connected {
                session_present: c.session_present,
            },
            Packet::PubAck(a) => LinkEvent::Acked(
                a.pkid,
                match a.reason {
                    PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
                    r => Err(format!("PUBACK reason {r:?}")),
                },
            ),
            Packet::PubComp(a) => LinkEvent::Acked(
                a.pkid,
                match a.reason {
                    PubCompReason::Success => Ok(()),
                    r => Err(format!("PUBCOMP reason {r:?}")),
                },
            ),
            Packet::Publish(p) => LinkEvent::Message {
                topic: String::from_utf8_lossy(&p.topic).into_owned(),
                payload: p.payload.to_vec(),
                origin: p
                    .properties
                    .as_ref()
                    .and_then(|pp| origin(&pp.user_properties)),
            },
            Packet::SubAck(s) => LinkEvent::SubAck(
                s.return_codes
                    .iter()
                    .all(|c| matches!(c, SubscribeReasonCode::Success(_))),
            ),
            _ => LinkEvent::Other,
        },
    }
}

/// The (publisher, seq) of MQTT 5 user properties, when both are there
/// and well-formed (the publisher 1..=[`crate::payload::MAX_PUBLISHER_LEN`]
/// bytes, the seq a number from 1). Total: never panics.
pub fn origin(props: &[(String, String)]) -> Option<(String, u64)> {
    let get = |k: &str| props.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    let publisher = get(USER_PROP_PUBLISHER)?;
    let seq: u64 = get(USER_PROP_SEQ)?.parse().ok()?;
    let n = publisher.len();
    (seq >= 1 && (1..=crate::payload::MAX_PUBLISHER_LEN).contains(&n))
        .then(|| (publisher.clone(), seq))
}

/// Checks a topic name for publishing: 1..=65535 bytes, no wildcard, no NUL.
pub fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic.len() > 65_535 {
        return Err(format!(
            "topic must be 1..=65535 bytes, got {}",
            topic.len()
        ));
    }
    if topic.contains(['+', '#', '\0']) {
        return Err(format!("topic {topic:?} may not contain '+', '#' or NUL"));
    }
    Ok(())
}

/// Checks a topic filter for subscribing (MQTT 3.1.1 4.7, 5.0 4.7):
/// 1..=65535 bytes, no NUL, `+` alone in its level, `#` alone in the last.
pub fn check_filter(filter: &str) -> Result<(), String> {
    if filter.is_empty() || filter.len() > 65_535 || filter.contains('\0') {
        return Err(format!(
            "topic filter must be 1..=65535 bytes without NUL, got {filter:?}"
        ));
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, l) in levels.iter().enumerate() {
        if l.contains('#') && (*l != "#" || i + 1 != levels.len()) {
            return Err(format!(
                "topic filter {filter:?}: '#' must be a whole level, the last (a/#)"
            ));
        }
        if l.contains('+') && *l != "+" {
            return Err(format!(
                "topic filter {filter:?}: '+' must be a whole level (a/+/b)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn origin_needs_both_well_formed_properties() {
        let p = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            origin(&p(&[("x", "y"), ("seq", "17"), ("pub", "gw-1")])),
            Some(("gw-1".into(), 17))
        );
        for bad in [
            p(&[("seq", "17")]),
            p(&[("pub", "gw-1")]),
            p(&[("pub", "gw-1"), ("seq", "0")]),
            p(&[("pub", "gw-1"), ("seq", "-1")]),
            p(&[("pub", ""), ("seq", "1")]),
            p(&[("pub", &"x".repeat(129)), ("seq", "1")]),
        ] {
            assert_eq!(origin(&bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn origin_never_panics(props in proptest::collection::vec((".{0,8}", ".{0,24}"), 0..6)) {
            let _ = origin(&props);
        }
    }

    #[test]
    fn filters_follow_the_wildcard_rules() {
        for ok in ["a", "a/b", "#", "+", "a/#", "+/+/c", "/", "a//b", "$SYS/#"] {
            assert!(check_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/#/b", "a#", "a/b#", "a+", "a/+b/c", "#/a", "a\0b"] {
            assert!(check_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_broker_urls() {
        let u: BrokerUrl = "mqtt://127.0.0.1:1884".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.version),
            ("127.0.0.1", 1884, Version::V311)
        );
        let u: BrokerUrl = "mqtt5://localhost".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.version),
            ("localhost", 1883, Version::V5)
        );
        let u: BrokerUrl = "tcp://[::1]:2000/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 2000));
        assert_eq!(u.to_string(), "mqtt://[::1]:2000");
        for bad in [
            "127.0.0.1:1883",
            "http://x",
            "mqtt://",
            "mqtt://h:0",
            "mqtt://h:99999",
            "mqtt://h/x",
            "mqtt://::1:5",
            "ws://h/a#b",
            "ws://h/a b",
            "ws://@h/",
            // found by fuzzing (config_toml): a bracketed host that is not
            // an IPv6 address printed back without its brackets
            "mqtt://[[\0\u{7f}\0-\u{4}(\0]",
            "mqtt://[host]:1883",
            "mqtt://ho st:1883",
            "mqtt://h\u{0}:1883",
            "mqtt://[fe80::1%eth0]",
        ] {
            assert!(bad.parse::<BrokerUrl>().is_err(), "{bad}");
        }
        let e = "mqtt://[x]".parse::<BrokerUrl>().unwrap_err();
        assert!(e.contains("[x] is not an IPv6 address"), "{e}");
        // WebSockets: a path, ports 80 and 443 by default
        let u: BrokerUrl = "ws://h".parse().unwrap();
        assert_eq!(
            (u.port, u.tls, u.ws_path.as_deref()),
            (80, false, Some("/"))
        );
        assert_eq!(u.to_string(), "ws://h:80/");
        let u: BrokerUrl = "wss5://[::1]/mqtt?x=1".parse().unwrap();
        assert_eq!(
            (u.port, u.tls, u.version, u.ws_path.as_deref()),
            (443, true, Version::V5, Some("/mqtt?x=1"))
        );
        assert_eq!(u.to_string(), "wss5://[::1]:443/mqtt?x=1");
        assert_eq!(broker_addr(&u), "wss://[::1]:443/mqtt?x=1");
        let long = format!("ws://h/{}", "a".repeat(MAX_WS_PATH));
        assert!(long.parse::<BrokerUrl>().is_err());
        let u: BrokerUrl = "mqtt://broker_1.example-net.org".parse().unwrap();
        assert_eq!(u.host, "broker_1.example-net.org");
        let u: BrokerUrl = "mqtts://broker.lan".parse().unwrap();
        assert_eq!((u.port, u.tls, u.version), (8883, true, Version::V311));
        assert_eq!(u.to_string(), "mqtts://broker.lan:8883");
        let u: BrokerUrl = "mqtts5://[::1]:9000".parse().unwrap();
        assert_eq!((u.port, u.tls, u.version), (9000, true, Version::V5));
        assert_eq!(u.to_string(), "mqtts5://[::1]:9000");
        let u: BrokerUrl = "ssl://h".parse().unwrap();
        assert_eq!(u.to_string(), "mqtts://h:8883");
    }

    #[test]
    fn security_is_checked_before_connecting() {
        let plain: BrokerUrl = "mqtt://h".parse().unwrap();
        let with_ca = plain.clone().with_security(Security {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Security::default()
        });
        let e = with_ca.check().unwrap_err();
        assert!(e.contains("needs TLS"), "{e}");
        let tls: BrokerUrl = "mqtts://h".parse().unwrap();
        let e = tls
            .clone()
            .with_security(Security {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..Security::default()
            })
            .check()
            .unwrap_err();
        assert!(e.contains("CA file /nonexistent/ca.pem"), "{e}");
        let e = plain
            .with_security(Security {
                password: Some(Secret::new("pw")),
                ..Security::default()
            })
            .check()
            .unwrap_err();
        assert!(e.contains("needs a user name"), "{e}");
        // a file that holds no certificate
        let dir = std::env::temp_dir().join(format!("mg-conn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("empty.pem");
        std::fs::write(&f, "not a certificate\n").unwrap();
        let e = tls
            .with_security(Security {
                ca_file: Some(f.clone()),
                ..Security::default()
            })
            .check()
            .unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let pw = dir.join("pw");
        std::fs::write(&pw, "s3cret\nignored\n").unwrap();
        let s = Secret::from_file(&pw).unwrap();
        assert_eq!(s.expose(), "s3cret");
        assert_eq!(format!("{s:?}"), "***", "never printed");
        std::fs::write(&pw, "\n").unwrap();
        assert!(Secret::from_file(&pw).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn topic_rules() {
        assert!(check_topic("a/b").is_ok());
        assert!(check_topic("").is_err());
        assert!(check_topic("a/+").is_err());
        assert!(check_topic("#").is_err());
    }
}
