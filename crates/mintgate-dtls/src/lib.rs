//! CoAP over DTLS 1.2 ("coaps", RFC 7252 section 9) on OpenSSL.
//!
//! OpenSSL does the record layer and the handshake; this crate drives one
//! OpenSSL session per peer over an in-memory datagram stream
//! ([`session::DgramIo`]: each read hands OpenSSL exactly one received
//! datagram, each write is one datagram to send), so that the caller keeps
//! its own sockets, batching and threads:
//!
//! - [`server::DtlsServer`]: the session table of a listener (bounded per
//!   source and in all, idle sessions expire, evictions counted), with a
//!   stateless cookie exchange (HelloVerifyRequest, [`hello`], [`cookie`])
//!   so that a hello from a spoofed source costs no state and gets only a
//!   small answer, pre-shared keys and/or X.509 certificates, decryption of
//!   received records into CoAP datagrams and encryption of answers.
//! - [`client::DtlsClient`]: one client session on a connected UDP socket
//!   (blocking, with deadlines), for the command-line client and the labs.
//!
//! Cipher suites (RFC 7252 9.1.3.1/9.1.3.3 name the CCM_8 ones as mandatory):
//! see [`CIPHERS`].

// Records come off the network: no panic may be reachable from them.

pub mod client;
pub mod cookie;
pub mod hello;
pub mod pki;
pub mod server;
pub mod session;

use std::path::PathBuf;
use std::time::Duration;

use openssl::ssl::{SslContextBuilder, SslFiletype, SslOptions, SslVerifyMode, SslVersion};

pub use client::{ClientContext, ClientSettings, DtlsClient};
pub use server::{DtlsServer, DtlsStats, ServerSettings, Source};

/// The cipher suites offered and accepted, in order of preference:
/// TLS_PSK_WITH_AES_128_CCM_8 and TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8 (the
/// two RFC 7252 requires), then the GCM and CCM (16-byte tag) variants, and
/// ECDHE-RSA for RSA certificates.
pub const CIPHERS: &str = "PSK-AES128-CCM8:ECDHE-ECDSA-AES128-CCM8:\
PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-CCM:\
ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-CCM:\
ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384";

/// Default path MTU assumed for records (RFC 7252 4.6 suggests 1280-byte
/// IPv6 packets; 1280 minus IPv6 and UDP headers).
pub const DEFAULT_MTU: u32 = 1232;

/// One pre-shared key and the identity it belongs to.
#[derive(Clone, PartialEq, Eq)]
pub struct Psk {
    /// The PSK identity (at most 128 bytes).
    pub identity: Vec<u8>,
    /// The key (1 to 64 bytes).
    pub key: Vec<u8>,
}

impl std::fmt::Debug for Psk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never print the key
        f.debug_struct("Psk")
            .field("identity", &String::from_utf8_lossy(&self.identity))
            .field("key", &format_args!("<{} bytes>", self.key.len()))
            .finish()
    }
}

/// Longest PSK identity accepted (OpenSSL's PSK_MAX_IDENTITY_LEN).
pub const MAX_IDENTITY_LEN: usize = 128;
/// Longest key accepted (OpenSSL's PSK_MAX_PSK_LEN is 256; 64 is plenty).
pub const MAX_KEY_LEN: usize = 64;

impl Psk {
    /// Checks the lengths; `key` as given by [`parse_key`].
    pub fn new(identity: &str, key: Vec<u8>) -> Result<Psk, DtlsError> {
        if identity.is_empty() || identity.len() > MAX_IDENTITY_LEN {
            return Err(DtlsError::Config(format!(
                "a PSK identity must be 1 to {MAX_IDENTITY_LEN} bytes"
            )));
        }
        if identity.contains('\0') {
            return Err(DtlsError::Config(
                "a PSK identity must not contain NUL".into(),
            ));
        }
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(DtlsError::Config(format!(
                "a pre-shared key must be 1 to {MAX_KEY_LEN} bytes"
            )));
        }
        Ok(Psk {
            identity: identity.as_bytes().to_vec(),
            key,
        })
    }
}

/// A key as written on the command line or in the config: `0x` followed by
/// hex digits is the bytes they spell; anything else is the text's own bytes
/// (as libcoap's `-k` takes it).
pub fn parse_key(s: &str) -> Result<Vec<u8>, DtlsError> {
    let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) else {
        return Ok(s.as_bytes().to_vec());
    };
    if hex.is_empty() || hex.len() % 2 != 0 {
        return Err(DtlsError::Config(
            "a 0x key needs an even, non-zero number of hex digits".into(),
        ));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&hex[i..i + 2], 16)
                .map_err(|_| DtlsError::Config(format!("'{}' is not hex", &hex[i..i + 2])))
        })
        .collect()
}

/// Certificate material of one side (RFC 7252 9.1.3.3, X.509).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate chain (own certificate first).
    pub chain: Option<PathBuf>,
    /// PEM private key of the certificate.
    pub key: Option<PathBuf>,
    /// PEM CA certificates that peers' certificates must chain to; with it
    /// the peer must present a valid certificate.
    pub ca: Option<PathBuf>,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum DtlsError {
    /// Bad settings (lengths, missing files, a key without a certificate).
    #[error("{0}")]
    Config(String),
    /// OpenSSL refused something (a file it cannot read, a cipher list).
    #[error("{context}: {cause}")]
    Ssl {
        /// What was being done.
        context: String,
        /// OpenSSL's error stack (in the message, not a separate source: a
        /// chain of errors would say it twice).
        cause: openssl::error::ErrorStack,
    },
    /// The handshake failed (wrong key, untrusted certificate, an alert).
    #[error("DTLS handshake failed: {0}")]
    Handshake(String),
    /// No handshake or answer within the deadline.
    #[error("DTLS: no answer within the timeout")]
    Timeout,
    /// The peer closed the session (close_notify or a fatal alert).
    #[error("DTLS session closed by the peer")]
    Closed,
    /// A socket error.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) fn ssl_err(context: &str) -> impl FnOnce(openssl::error::ErrorStack) -> DtlsError + '_ {
    move |cause| DtlsError::Ssl {
        context: context.to_string(),
        cause,
    }
}

/// Settings common to both sides: DTLS 1.2 only, the cipher list, no MTU
/// queries (the in-memory stream has no path MTU; [`session`] sets it).
pub(crate) fn base_context(b: &mut SslContextBuilder) -> Result<(), DtlsError> {
    b.set_min_proto_version(Some(SslVersion::DTLS1_2))
        .map_err(ssl_err("setting the DTLS version"))?;
    b.set_max_proto_version(Some(SslVersion::DTLS1_2))
        .map_err(ssl_err("setting the DTLS version"))?;
    b.set_cipher_list(CIPHERS)
        .map_err(ssl_err("setting the cipher list"))?;
    b.set_options(SslOptions::NO_QUERY_MTU | SslOptions::NO_TICKET);
    b.set_groups_list("P-256:X25519:P-384")
        .map_err(ssl_err("setting the ECDHE groups"))?;
    Ok(())
}

/// Loads a certificate chain, key and trusted CAs into `b`. With `ca`, the
/// peer's certificate is verified (and required when `require`).
pub(crate) fn load_certs(
    b: &mut SslContextBuilder,
    files: &CertFiles,
    require: bool,
) -> Result<(), DtlsError> {
    match (&files.chain, &files.key) {
        (Some(c), Some(k)) => {
            b.set_certificate_chain_file(c)
                .map_err(ssl_err(&format!("reading the certificate {}", c.display())))?;
            b.set_private_key_file(k, SslFiletype::PEM)
                .map_err(ssl_err(&format!("reading the private key {}", k.display())))?;
            b.check_private_key()
                .map_err(ssl_err("the private key does not match the certificate"))?;
        }
        (None, None) => {}
        _ => {
            return Err(DtlsError::Config(
                "a certificate needs its private key and the other way round".into(),
            ))
        }
    }
    if let Some(ca) = &files.ca {
        b.set_ca_file(ca)
            .map_err(ssl_err(&format!("reading the CA file {}", ca.display())))?;
        let mut mode = SslVerifyMode::PEER;
        if require {
            mode |= SslVerifyMode::FAIL_IF_NO_PEER_CERT;
        }
        b.set_verify(mode);
    } else {
        b.set_verify(SslVerifyMode::NONE);
    }
    Ok(())
}

/// How long a handshake may take before its session is dropped.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests;
