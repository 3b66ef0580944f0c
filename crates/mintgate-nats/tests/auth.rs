//! `[nats]` credentials and TLS against a real nats-server that the test
//! starts on loopback with the matching `authorization` / `tls` config:
//!
//! - a user and password (from a file), a user nkey (its seed from a file)
//!   and a token (from an environment variable) each publish into a
//!   stream, stored once; a wrong password, an nkey the server does not
//!   know and a wrong token are refused and the queue keeps its messages;
//! - TLS with a client certificate the server verifies (a CA and
//!   certificates made here with rcgen): stored once; without the client
//!   certificate, or trusting another CA, nothing gets through.
//!
//! `.creds` files (user JWTs, operator mode) are checked when the section
//! is (config unit tests), not against a server here.
//!
//! Without nats-server the tests are skipped with a message, unless
//! `MINTGATE_REQUIRE_PEERS` is set, in which case they fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{expect_stored_once, publish_through, publisher, tmp};
use mintgate_nats::cluster::{Cluster, Options};
use mintgate_nats::{NatsSection, Target};

/// One nats-server with `extra` config in a fresh folder; `None` when
/// the test is skipped.
fn server(name: &str, extra: String) -> Option<(PathBuf, Cluster)> {
    let dir = tmp(name);
    let opts = Options {
        extra,
        ..Options::default()
    };
    let c = Cluster::start_for_tests_with(&dir.join("server"), 1, opts).expect("nats-server")?;
    Some((dir, c))
}

fn target(c: &Cluster, stream: &str, f: impl FnOnce(&mut NatsSection)) -> Result<Target, String> {
    let mut s = NatsSection {
        servers: c.urls(),
        stream: stream.into(),
        subject: format!("{stream}.{{topic}}"),
        ack_timeout_ms: 1000,
        ..NatsSection::default()
    };
    f(&mut s);
    s.target()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `n` messages through `t`: all acknowledged, the stream holds them once.
fn gets_through(t: &Target, dir: &Path, n: u64) {
    let (p, _) = publisher(t, &dir.join(format!("q-{}", t.stream)), 8);
    publish_through(&p, "sensors/temp0", n, &[], |_| {});
    let st = p.close(Duration::from_secs(5));
    assert_eq!(st.unacked, 0, "{}: {st:?}", t.describe());
    expect_stored_once(t, n);
}

/// A publisher through `t` never gets a message through: it says why
/// (`why` in its last error) and keeps all of them.
fn refused(t: &Target, dir: &Path, why: &str) {
    let (p, _) = publisher(
        t,
        &dir.join(format!("q-refused-{}", common::rand_suffix())),
        8,
    );
    p.enqueue_many("sensors/temp0", (1..=10).map(|i| format!("m{i}")).collect())
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut st = p.status();
    while st.last_error.is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        st = p.status();
    }
    let e = st.last_error.clone().expect("no error said within 10 s");
    assert!(
        e.to_lowercase().contains(why),
        "{}: expected {why:?}, got {st:?}",
        t.describe()
    );
    assert!(!st.connected);
    assert_eq!(st.unacked, 10, "the queue keeps what was not acknowledged");
    p.close(Duration::from_millis(100));
}

#[test]
fn user_password_nkey_and_token_get_through_and_wrong_ones_are_refused() {
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let Some((dir, c)) = server(
        "auth",
        format!(
            "authorization {{\n  users = [\n    {{ user: gw, password: \"gw-secret-24\" }}\n    \
             {{ nkey: {} }}\n  ]\n}}\n",
            user.public_key()
        ),
    ) else {
        return;
    };
    let pw = write(&dir, "gw.pass", "gw-secret-24\n");
    let bad_pw = write(&dir, "bad.pass", "not-it\n");
    let seed = write(&dir, "gw.nk", &format!("{}\n", user.seed().unwrap()));
    let other_seed = write(&dir, "stranger.nk", &stranger.seed().unwrap());

    let t = target(&c, "UP", |s| {
        s.user = "gw".into();
        s.password_file = pw.clone();
    })
    .unwrap();
    gets_through(&t, &dir, 200);
    let t = target(&c, "NK", |s| s.nkey_seed_file = seed.clone()).unwrap();
    assert!(t.describe().contains("nkey"));
    gets_through(&t, &dir, 200);

    let t = target(&c, "UP", |s| {
        s.user = "gw".into();
        s.password_file = bad_pw.clone();
    })
    .unwrap();
    refused(&t, &dir, "authorization violation");
    let t = target(&c, "NK", |s| s.nkey_seed_file = other_seed.clone()).unwrap();
    refused(&t, &dir, "authorization violation");
    let t = target(&c, "ANON", |_| {}).unwrap();
    refused(&t, &dir, "authorization violation");
    drop(c);

    // a token, from the environment
    let Some((dir2, c)) = server(
        "token",
        "authorization {\n  token: \"tok-24-abc\"\n}\n".into(),
    ) else {
        return;
    };
    std::env::set_var("MINTGATE_TEST_NATS_TOKEN_24", "tok-24-abc");
    std::env::set_var("MINTGATE_TEST_NATS_BAD_TOKEN_24", "tok-24-xyz");
    let t = target(&c, "TOK", |s| {
        s.token_env = "MINTGATE_TEST_NATS_TOKEN_24".into()
    })
    .unwrap();
    gets_through(&t, &dir2, 200);
    let t = target(&c, "TOK", |s| {
        s.token_env = "MINTGATE_TEST_NATS_BAD_TOKEN_24".into()
    })
    .unwrap();
    refused(&t, &dir2, "authorization violation");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

/// A CA, a server certificate for 127.0.0.1 and localhost, a client
/// certificate, and another CA; written to `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let ca_params = |cn: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.distinguished_name.push(DnType::CommonName, cn);
        p
    };
    let ca = CertifiedIssuer::self_signed(
        ca_params("mintgate nats test CA"),
        KeyPair::generate().unwrap(),
    )
    .unwrap();
    let other = CertifiedIssuer::self_signed(ca_params("another CA"), KeyPair::generate().unwrap())
        .unwrap();
    let leaf = |names: Vec<String>, cn: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        (p.signed_by(&key, &ca).unwrap().pem(), key.serialize_pem())
    };
    let (server_pem, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()], "localhost");
    let (client_pem, client_key) = leaf(Vec::new(), "gw-cert");
    Pki {
        ca: write(dir, "ca.pem", &ca.pem()),
        server_cert: write(dir, "server.pem", &server_pem),
        server_key: write(dir, "server.key", &server_key),
        client_cert: write(dir, "client.pem", &client_pem),
        client_key: write(dir, "client.key", &client_key),
        other_ca: write(dir, "other-ca.pem", &other.pem()),
    }
}

#[test]
fn tls_with_a_client_certificate_gets_through_and_without_it_nothing_does() {
    let pki_dir = tmp("pki");
    let pki = make_pki(&pki_dir);
    let Some((dir, c)) = server(
        "tls",
        format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display()
        ),
    ) else {
        return;
    };
    let t = target(&c, "TLS", |s| {
        s.ca_file = pki.ca.clone();
        s.cert_file = pki.client_cert.clone();
        s.key_file = pki.client_key.clone();
    })
    .unwrap();
    assert!(t.describe().contains("client certificate"));
    gets_through(&t, &dir, 200);

    // no client certificate: the server ends the handshake
    let t = target(&c, "TLS", |s| s.ca_file = pki.ca.clone()).unwrap();
    refused(&t, &dir, "");
    // a CA the server's certificate does not chain to
    let t = target(&c, "TLS", |s| {
        s.ca_file = pki.other_ca.clone();
        s.cert_file = pki.client_cert.clone();
        s.key_file = pki.client_key.clone();
    })
    .unwrap();
    refused(&t, &dir, "unknownissuer");
    // plain text to a TLS server
    let t = target(&c, "TLS", |_| {}).unwrap();
    refused(&t, &dir, "");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&pki_dir);
}
