//! Throwaway X.509 material for tests and labs: a CA and certificates it
//! signs (ECDSA P-256, so that TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8 applies),
//! written as PEM files.

use std::path::{Path, PathBuf};

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509Name, X509};

use crate::{ssl_err, CertFiles, DtlsError};

/// Paths of a generated set.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// The CA certificate (trust anchor for both sides).
    pub ca: PathBuf,
    /// Server certificate (CN and subjectAltName: `localhost`, 127.0.0.1, ::1).
    pub server_cert: PathBuf,
    /// Server key.
    pub server_key: PathBuf,
    /// Client certificate (CN given to [`generate`]).
    pub client_cert: PathBuf,
    /// Client key.
    pub client_key: PathBuf,
}

impl TestPki {
    /// The server's side: its certificate and key, the CA for clients.
    pub fn server_files(&self) -> CertFiles {
        CertFiles {
            chain: Some(self.server_cert.clone()),
            key: Some(self.server_key.clone()),
            ca: Some(self.ca.clone()),
        }
    }

    /// The client's side: its certificate and key, the CA for the server.
    pub fn client_files(&self) -> CertFiles {
        CertFiles {
            chain: Some(self.client_cert.clone()),
            key: Some(self.client_key.clone()),
            ca: Some(self.ca.clone()),
        }
    }
}

fn key() -> Result<PKey<Private>, DtlsError> {
    let g = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).map_err(ssl_err("EC group"))?;
    let k = EcKey::generate(&g).map_err(ssl_err("generating a key"))?;
    PKey::from_ec_key(k).map_err(ssl_err("generating a key"))
}

fn name(cn: &str) -> Result<X509Name, DtlsError> {
    let mut n = X509Name::builder().map_err(ssl_err("name"))?;
    n.append_entry_by_nid(Nid::COMMONNAME, cn)
        .map_err(ssl_err("name"))?;
    Ok(n.build())
}

fn cert(
    cn: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    server: bool,
) -> Result<X509, DtlsError> {
    let e = ssl_err("building a certificate");
    let mut b = X509::builder().map_err(ssl_err("building a certificate"))?;
    b.set_version(2).map_err(ssl_err("version"))?;
    let mut serial = BigNum::new().map_err(ssl_err("serial"))?;
    serial
        .rand(64, MsbOption::MAYBE_ZERO, false)
        .map_err(ssl_err("serial"))?;
    let serial = serial.to_asn1_integer().map_err(ssl_err("serial"))?;
    b.set_serial_number(&serial).map_err(ssl_err("serial"))?;
    let subject = name(cn)?;
    b.set_subject_name(&subject).map_err(ssl_err("subject"))?;
    match issuer {
        Some((ca, _)) => b.set_issuer_name(ca.subject_name()),
        None => b.set_issuer_name(&subject),
    }
    .map_err(ssl_err("issuer"))?;
    b.set_pubkey(key).map_err(ssl_err("public key"))?;
    let from = Asn1Time::days_from_now(0).map_err(ssl_err("validity"))?;
    let until = Asn1Time::days_from_now(30).map_err(ssl_err("validity"))?;
    b.set_not_before(&from).map_err(ssl_err("validity"))?;
    b.set_not_after(&until).map_err(ssl_err("validity"))?;
    if issuer.is_none() {
        b.append_extension(
            BasicConstraints::new()
                .critical()
                .ca()
                .build()
                .map_err(ssl_err("extension"))?,
        )
        .map_err(ssl_err("extension"))?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()
                .map_err(ssl_err("extension"))?,
        )
        .map_err(ssl_err("extension"))?;
    } else {
        b.append_extension(
            KeyUsage::new()
                .critical()
                .digital_signature()
                .key_agreement()
                .build()
                .map_err(ssl_err("extension"))?,
        )
        .map_err(ssl_err("extension"))?;
        let mut eku = ExtendedKeyUsage::new();
        if server {
            eku.server_auth();
        } else {
            eku.client_auth();
        }
        b.append_extension(eku.build().map_err(ssl_err("extension"))?)
            .map_err(ssl_err("extension"))?;
        if server {
            let ctx = b.x509v3_context(issuer.map(|(c, _)| c.as_ref()), None);
            let san = SubjectAlternativeName::new()
                .dns("localhost")
                .ip("127.0.0.1")
                .ip("::1")
                .build(&ctx)
                .map_err(ssl_err("subjectAltName"))?;
            b.append_extension(san).map_err(ssl_err("extension"))?;
        }
    }
    let signer = issuer.map_or(key, |(_, k)| k);
    b.sign(signer, MessageDigest::sha256()).map_err(e)?;
    Ok(b.build())
}

fn write(dir: &Path, file: &str, pem: Vec<u8>) -> Result<PathBuf, DtlsError> {
    let p = dir.join(file);
    std::fs::write(&p, pem)?;
    Ok(p)
}

/// Generates a CA, a server certificate and a client certificate with
/// common name `client_cn` into `dir` (created if missing).
pub fn generate(dir: &Path, client_cn: &str) -> Result<TestPki, DtlsError> {
    std::fs::create_dir_all(dir)?;
    let ca_key = key()?;
    let ca = cert("mintgate test CA", &ca_key, None, false)?;
    let s_key = key()?;
    let s = cert("localhost", &s_key, Some((&ca, &ca_key)), true)?;
    let c_key = key()?;
    let c = cert(client_cn, &c_key, Some((&ca, &ca_key)), false)?;
    let pem = |x: &X509| x.to_pem().map_err(ssl_err("PEM"));
    let kpem = |k: &PKey<Private>| k.private_key_to_pem_pkcs8().map_err(ssl_err("PEM"));
    Ok(TestPki {
        ca: write(dir, "ca.pem", pem(&ca)?)?,
        server_cert: write(dir, "server.pem", pem(&s)?)?,
        server_key: write(dir, "server.key", kpem(&s_key)?)?,
        client_cert: write(dir, "client.pem", pem(&c)?)?,
        client_key: write(dir, "client.key", kpem(&c_key)?)?,
    })
}
