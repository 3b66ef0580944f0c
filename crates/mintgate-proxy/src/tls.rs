//! Certificates and rustls configurations for HTTP/3 (QUIC needs TLS 1.3).
//!
//! - The server's certificate comes from the configured PEM files, or is a
//!   self-signed one generated on first use (names `localhost`, `127.0.0.1`,
//!   `::1`) and kept in `self_signed_dir` (`cert.pem`, `key.pem` with mode
//!   0600), so that clients can pin it across restarts.
//! - Early data: the server accepts 0-RTT only with stateful resumption,
//!   where each session ticket is stored by the server and taken out on use
//!   (rustls' `ServerSessionMemoryCache`), so a replayed ClientHello finds
//!   no ticket and its early data is refused by TLS itself. What early data
//!   can carry is further limited by the proxy (safe methods only; 425).
//! - Mutual TLS: with `client_ca`, clients must present a certificate that
//!   chains to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::TlsConfig;

/// ALPN of HTTP/3.
pub const ALPN_H3: &[u8] = b"h3";

/// The crypto provider used throughout (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server certificate chain and key, and where they came from.
pub struct ServerCert {
    /// The chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
    /// The certificate file.
    pub cert_path: PathBuf,
    /// Whether it was generated just now.
    pub generated: bool,
}

/// Loads the configured certificate, or the self-signed one in
/// `self_signed_dir`, generating it when absent.
pub fn load_or_generate(cfg: &TlsConfig) -> anyhow::Result<ServerCert> {
    if let (Some(c), Some(k)) = (&cfg.cert, &cfg.key) {
        return Ok(ServerCert {
            chain: load_certs(c)?,
            key: load_key(k)?,
            cert_path: c.clone(),
            generated: false,
        });
    }
    let dir = &cfg.self_signed_dir;
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    if cert_path.exists() && key_path.exists() {
        return Ok(ServerCert {
            chain: load_certs(&cert_path)?,
            key: load_key(&key_path)?,
            cert_path,
            generated: false,
        });
    }
    let ck = rcgen::generate_simple_self_signed(vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ])
    .context("generating a self-signed certificate")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&cert_path, ck.cert.pem())
        .with_context(|| format!("writing {}", cert_path.display()))?;
    write_private(&key_path, ck.signing_key.serialize_pem().as_bytes())?;
    Ok(ServerCert {
        chain: vec![ck.cert.der().clone()],
        key: PrivateKeyDer::try_from(ck.signing_key.serialize_der())
            .map_err(|e| anyhow!("the generated key: {e}"))?,
        cert_path,
        generated: true,
    })
}

fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(data)
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads every certificate of a PEM file.
pub fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing certificates in {}", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

/// Reads the first private key of a PEM file.
pub fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading a private key from {}", path.display()))
}

/// The server's TLS configuration for QUIC: TLS 1.3, ALPN h3, stateful
/// resumption with `session_cache` single-use tickets, 0-RTT when enabled,
/// client certificates required when `client_ca` is set.
pub fn server_config(cfg: &TlsConfig, cert: &ServerCert) -> anyhow::Result<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with ring")?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in load_certs(ca)? {
                roots
                    .add(c)
                    .with_context(|| format!("a CA certificate in {}", ca.display()))?;
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .context("building the client certificate verifier")?;
            builder.with_client_cert_verifier(v)
        }
        None => builder.with_no_client_auth(),
    };
    let mut c = builder
        .with_single_cert(cert.chain.clone(), cert.key.clone_key())
        .context("the server certificate and key do not fit together")?;
    c.alpn_protocols = vec![ALPN_H3.to_vec()];
    c.session_storage = rustls::server::ServerSessionMemoryCache::new(cfg.session_cache.max(1));
    // QUIC requires either 0 or u32::MAX here (RFC 9001 section 4.6.1).
    c.max_early_data_size = if cfg.early_data { u32::MAX } else { 0 };
    c.send_half_rtt_data = cfg.early_data;
    Ok(c)
}

/// How a client checks the server's certificate.
#[derive(Clone, Debug)]
pub enum Roots {
    /// Trust these certificates (CA or the self-signed server certificate).
    Certs(Vec<CertificateDer<'static>>),
    /// Trust anything (testing only; `--insecure`).
    Insecure,
}

/// A client TLS configuration for HTTP/3: TLS 1.3, ALPN h3, session
/// resumption and early data enabled, an optional client certificate.
pub fn client_config(
    roots: &Roots,
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> anyhow::Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with ring")?;
    let builder = match roots {
        Roots::Certs(certs) => {
            let mut store = RootCertStore::empty();
            for c in certs {
                store.add(c.clone()).context("a trusted certificate")?;
            }
            builder.with_root_certificates(store)
        }
        Roots::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider()))),
    };
    let mut c = match client_cert {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .context("the client certificate and key do not fit together")?,
        None => builder.with_no_client_auth(),
    };
    c.alpn_protocols = vec![ALPN_H3.to_vec()];
    c.enable_early_data = true;
    Ok(c)
}

/// Accepts any server certificate (signatures are still checked, so the
/// handshake is well-formed; the identity is not).
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
