//! MQTT over TLS with credentials against a real mosquitto that the test
//! starts with a TLS listener (a CA and certificates made here with rcgen),
//! a password file (`mosquitto_passwd`) and an ACL:
//!
//! - `mintgate publish` / `mintgate subscribe` over TLS with a password
//!   (from a file and from the environment), 1..=N in order;
//! - a wrong password, a wrong CA, an expired certificate and a host name the
//!   certificate does not carry: each a clear error, and the queue keeps its
//!   messages;
//! - a topic the ACL forbids: refused in the PUBACK over MQTT 5 (the queue
//!   drops and counts it, and the next message goes through), dropped by the
//!   broker over 3.1.1;
//! - mutual TLS: a client certificate as the identity, and no certificate;
//! - the broker restarted mid-stream over TLS: nothing lost or reordered;
//! - `mintgate serve --mqtt`'s status topic: `online` retained on connect,
//!   the `offline` will seen by another client when the gateway is killed,
//!   `offline` published by an orderly stop.
//!
//! - MQTT over WebSockets, plain (`ws://`) and over TLS (`wss://`), against
//!   amqtt (PyPI, a broker no one here wrote, in target/py-venv): Debian's
//!   mosquitto 2.0.11 cannot open a websockets listener here.
//!
//! Without mosquitto (or amqtt) the tests are skipped with a message,
//! unless `MINTGATE_REQUIRE_PEERS` is set, in which case they fail.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mintgate_mqtt::broker::{find_mosquitto, Mosquitto};
use mintgate_mqtt::{
    BrokerUrl, Listener, ListenerConfig, ListenerControl, Publisher, PublisherConfig, Qos, Secret,
    Security, SubEvent, Subscriber, SubscriberConfig,
};

fn unique() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-test-{name}-{}", unique()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mosquitto_bin() -> Option<PathBuf> {
    let bin = find_mosquitto();
    let passwd = Path::new("/usr/bin/mosquitto_passwd").is_file();
    if bin.is_none() || !passwd {
        if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
            panic!("mosquitto is not installed and MINTGATE_REQUIRE_PEERS is set (apt-get install mosquitto)");
        }
        eprintln!("skipping: mosquitto is not installed (apt-get install mosquitto)");
        return None;
    }
    bin
}

/// The files of a test PKI: a CA, a server certificate for `localhost`
/// only (so that 127.0.0.1 is a name it does not carry), a client
/// certificate whose common name is `gw-cert`, an unrelated CA, and a CA
/// with the real one's name but another key, and an expired server
/// certificate.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
    impostor_ca: PathBuf,
    expired_cert: PathBuf,
    expired_key: PathBuf,
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
    let key = || KeyPair::generate().unwrap();
    let ca = CertifiedIssuer::self_signed(ca_params("mintgate test CA"), key()).unwrap();
    let other = CertifiedIssuer::self_signed(ca_params("another CA"), key()).unwrap();
    // the same name as the real CA, another key
    let impostor = CertifiedIssuer::self_signed(ca_params("mintgate test CA"), key()).unwrap();
    let leaf = |names: Vec<String>, cn: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        let cert = p.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_pem, server_key) = leaf(vec!["localhost".into()], "localhost");
    // the same, valid only in 2020
    let expired_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let expired_pem = p.signed_by(&expired_key, &ca).unwrap().pem();
    let (client_pem, client_key) = leaf(Vec::new(), "gw-cert");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", &ca.pem()),
        server_cert: write("server.pem", &server_pem),
        server_key: write("server.key", &server_key),
        client_cert: write("client.pem", &client_pem),
        client_key: write("client.key", &client_key),
        other_ca: write("other-ca.pem", &other.pem()),
        impostor_ca: write("impostor-ca.pem", &impostor.pem()),
        expired_cert: write("expired.pem", &expired_pem),
        expired_key: write("expired.key", &expired_key.serialize_pem()),
    }
}

/// A mosquitto with a TLS listener, the users `gw` (password `gw-secret`)
/// and `reader` (`reader-secret`), and an ACL: `gw` writes `t/#` and
/// `status/#`, `reader` reads them, `gw-cert` (the client certificate's
/// name) reads and writes `t/#`. With `client_certs`, the listener wants a
/// client certificate and takes its common name as the user name.
fn tls_mosquitto(bin: &Path, dir: &Path, pki: &Pki, client_certs: bool) -> Mosquitto {
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, "").unwrap();
    for (user, pw) in [("gw", "gw-secret"), ("reader", "reader-secret")] {
        let ok = Command::new("/usr/bin/mosquitto_passwd")
            .arg("-b")
            .arg(&passwd)
            .args([user, pw])
            .status()
            .expect("running mosquitto_passwd");
        assert!(ok.success(), "mosquitto_passwd failed");
    }
    let acl = dir.join("acl");
    std::fs::write(
        &acl,
        "user gw\ntopic write t/#\ntopic write status/#\n\
         user reader\ntopic read t/#\ntopic read status/#\n\
         user gw-cert\ntopic readwrite t/#\n",
    )
    .unwrap();
    let mut extra = format!(
        "cafile {}\ncertfile {}\nkeyfile {}\n",
        pki.ca.display(),
        pki.server_cert.display(),
        pki.server_key.display()
    );
    if client_certs {
        extra.push_str("require_certificate true\nuse_identity_as_username true\n");
    }
    extra.push_str(&format!(
        "allow_anonymous false\npassword_file {}\nacl_file {}\n",
        passwd.display(),
        acl.display()
    ));
    Mosquitto::start_with(bin, &dir.join("broker"), &extra).expect("starting mosquitto")
}

fn url_for(m: &Mosquitto, host: &str, v5: bool) -> BrokerUrl {
    let scheme = if v5 { "mqtts5" } else { "mqtts" };
    format!("{scheme}://{host}:{}", m.port()).parse().unwrap()
}

fn with_password(url: BrokerUrl, ca: &Path, user: &str, pw: &str) -> BrokerUrl {
    url.with_security(Security {
        ca_file: Some(ca.to_owned()),
        username: Some(user.into()),
        password: Some(Secret::new(pw)),
        ..Security::default()
    })
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn finish(mut p: Proc, limit: Duration) -> (i32, String, String) {
    let end = Instant::now() + limit;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            let (mut out, mut err) = (String::new(), String::new());
            if let Some(mut s) = p.0.stdout.take() {
                s.read_to_string(&mut out).unwrap();
            }
            if let Some(mut s) = p.0.stderr.take() {
                s.read_to_string(&mut err).unwrap();
            }
            return (status.code().unwrap_or(-1), out, err);
        }
        assert!(
            Instant::now() < end,
            "mintgate did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A listener that forwards (topic, payload) over a channel.
struct Tap {
    rx: mpsc::Receiver<(String, Vec<u8>)>,
    control: ListenerControl,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Tap {
    fn start(url: &BrokerUrl, filter: &str) -> Tap {
        let (listener, control) = Listener::new(ListenerConfig {
            broker: url.clone(),
            filters: vec![filter.to_string()],
            qos: Qos::AtLeastOnce,
            client_id: format!("mg-tap-{}", unique()),
            persistent_session: false,
            session_expiry: mintgate_mqtt::conn::DEFAULT_SESSION_EXPIRY,
        });
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            listener.run(|t, p| {
                let _ = tx.send((t.to_string(), p.to_vec()));
            })
        });
        Tap {
            rx,
            control,
            thread: Some(thread),
        }
    }

    /// The next payload within `limit`.
    fn next(&self, limit: Duration) -> Option<String> {
        self.rx
            .recv_timeout(limit)
            .ok()
            .map(|(_, p)| String::from_utf8_lossy(&p).into_owned())
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.control.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until `p` has given up connecting at least once; its status.
fn first_failure(p: &Publisher) -> mintgate_mqtt::publisher::Status {
    p.wait_until(Duration::from_secs(10), |s| s.last_error.is_some())
}

#[test]
fn tls_with_password_publish_subscribe_and_refusals() {
    let Some(bin) = mosquitto_bin() else { return };
    let dir = tmp("mqtt-tls");
    let pki = make_pki(&dir);
    let broker = tls_mosquitto(&bin, &dir, &pki, false);
    let pwfile = dir.join("gw.pw");
    std::fs::write(&pwfile, "gw-secret\n").unwrap();

    // publish (password from a file) and subscribe (from the environment)
    // through the CLI, window 16, over TLS
    let n = 300u64;
    let sub = Proc(
        Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .args([
                "subscribe",
                "--broker",
                &format!("mqtts://localhost:{}", broker.port()),
            ])
            .arg("--ca-file")
            .arg(&pki.ca)
            .args(["--username", "reader", "--password-env", "MG_TEST_PW"])
            .args([
                "--topic",
                "t/cli",
                "--count",
                &n.to_string(),
                "--first-seq",
                "1",
            ])
            .args(["--timeout", "30s", "--log=warn"])
            .env("MG_TEST_PW", "reader-secret")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // the subscription is in place before the first message goes
    let reader = with_password(
        url_for(&broker, "localhost", false),
        &pki.ca,
        "reader",
        "reader-secret",
    );
    let probe = Tap::start(&reader, "t/cli");
    assert!(probe.control.wait_subscribed(Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(300));
    let publ = Proc(
        Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .args([
                "publish",
                "--broker",
                &format!("mqtts://localhost:{}", broker.port()),
            ])
            .arg("--ca-file")
            .arg(&pki.ca)
            .args(["--username", "gw", "--password-file"])
            .arg(&pwfile)
            .args([
                "--topic",
                "t/cli",
                "--count",
                &n.to_string(),
                "--window",
                "16",
            ])
            .args(["--timeout", "30s", "--json", "--log=warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (code, out, err) = finish(publ, Duration::from_secs(40));
    assert_eq!(code, 0, "publish: {out} {err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["acked_this_run"], n, "{out}");
    let (code, out, err) = finish(sub, Duration::from_secs(40));
    assert_eq!(code, 0, "subscribe: {err}");
    let seqs: Vec<u64> = out
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(seqs, (1..=n).collect::<Vec<_>>(), "in order, each once");
    drop(probe);

    // the password is not on the command line and not in the output
    assert!(!out.contains("gw-secret") && !err.contains("reader-secret"));

    // a wrong password: a refused CONNECT, said as such; the queue keeps
    // the message
    let bad = with_password(url_for(&broker, "localhost", false), &pki.ca, "gw", "wrong");
    let p = Publisher::start(PublisherConfig::new(bad)).unwrap();
    p.enqueue("t/x", "kept").unwrap();
    let st = first_failure(&p);
    let e = st.last_error.clone().unwrap_or_default();
    assert!(
        e.contains("refused the connection") && e.contains("not authorised"),
        "{e}"
    );
    assert!(
        !e.contains("wrong"),
        "the password is not in the error: {e}"
    );
    assert_eq!((st.connected, st.unacked), (false, 1));
    drop(p);

    // a wrong CA, and a host name the certificate does not carry
    let gw = |url: BrokerUrl, ca: &Path| with_password(url, ca, "gw", "gw-secret");
    for (url, want) in [
        (
            gw(url_for(&broker, "localhost", false), &pki.other_ca),
            "not signed by a trusted CA",
        ),
        (
            gw(url_for(&broker, "localhost", false), &pki.impostor_ca),
            "not signed by a trusted CA",
        ),
        (
            gw(url_for(&broker, "127.0.0.1", false), &pki.ca),
            "not valid for the host name",
        ),
    ] {
        let p = Publisher::start(PublisherConfig::new(url)).unwrap();
        p.enqueue("t/x", "kept").unwrap();
        let st = first_failure(&p);
        let e = st.last_error.clone().unwrap_or_default();
        assert!(e.contains(want), "want {want:?}: {e}");
        assert_eq!((st.connected, st.unacked), (false, 1), "{e}");
    }

    // a topic the ACL forbids: MQTT 5 says so in the PUBACK; the queue
    // drops that message (counted), not resending it for ever, and the
    // messages behind it go through, on the same connection
    let tap = Tap::start(&reader, "t/#");
    assert!(tap.control.wait_subscribed(Duration::from_secs(10)));
    let mut cfg = PublisherConfig::new(gw(url_for(&broker, "localhost", true), &pki.ca));
    cfg.window = 4;
    let p = Publisher::start(cfg).unwrap();
    p.enqueue("t/before", "1").unwrap();
    p.enqueue("forbidden/x", "no").unwrap();
    p.enqueue("forbidden/y", "no").unwrap();
    p.enqueue("t/after5", "2").unwrap();
    assert!(p.wait_idle(Duration::from_secs(10)), "{:?}", p.status());
    let st = p.close(Duration::from_secs(1));
    assert_eq!(
        (st.queue.refused_by_broker, st.queue.acked, st.connects),
        (2, 2, 1),
        "{st:?}"
    );
    for want in ["t/before", "t/after5"] {
        let got = tap.rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got.0, want);
    }
    // ... and over MQTT 3.1.1 mosquitto acknowledges it and drops it: a
    // subscriber allowed to read everything sees nothing of it
    let p = Publisher::start(PublisherConfig::new(gw(
        url_for(&broker, "localhost", false),
        &pki.ca,
    )))
    .unwrap();
    p.enqueue("forbidden/x", "dropped").unwrap();
    p.enqueue("t/after", "allowed").unwrap();
    assert!(p.wait_idle(Duration::from_secs(10)), "{:?}", p.status());
    let got = tap.rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(got.0, "t/after", "only the allowed topic arrives");
}

#[test]
fn tls_with_client_certificate() {
    let Some(bin) = mosquitto_bin() else { return };
    let dir = tmp("mqtt-mtls");
    let pki = make_pki(&dir);
    let broker = tls_mosquitto(&bin, &dir, &pki, true);
    let url = url_for(&broker, "localhost", false).with_security(Security {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(pki.client_cert.clone()),
        key_file: Some(pki.client_key.clone()),
        ..Security::default()
    });
    url.check().unwrap();
    let mut cfg = SubscriberConfig::new(url.clone(), "t/mtls");
    cfg.reorder.first_seq = Some(1);
    let mut sub = Subscriber::start(cfg).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut subscribed = false;
    while !subscribed && Instant::now() < end {
        subscribed = matches!(
            sub.recv_timeout(Duration::from_millis(200)),
            Some(SubEvent::Subscribed)
        );
    }
    assert!(subscribed, "no SUBACK with the client certificate");
    let mut pc = PublisherConfig::new(url.clone());
    pc.window = 16;
    let p = Publisher::start(pc).unwrap();
    let n = 200;
    for i in 1..=n {
        p.enqueue("t/mtls", &format!("{i}")).unwrap();
    }
    assert!(p.wait_idle(Duration::from_secs(20)), "{:?}", p.status());
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while got.len() < n && Instant::now() < end {
        if let Some(SubEvent::Delivery(d)) = sub.recv_timeout(Duration::from_millis(200)) {
            assert_eq!(d.skipped_before, 0);
            got.push(d.env.seq);
        }
    }
    assert_eq!(got, (1..=n as u64).collect::<Vec<_>>());

    // without a client certificate the broker turns us away, and the error
    // says so
    let bare = url_for(&broker, "localhost", false).with_security(Security {
        ca_file: Some(pki.ca.clone()),
        ..Security::default()
    });
    let p = Publisher::start(PublisherConfig::new(bare)).unwrap();
    p.enqueue("t/mtls", "kept").unwrap();
    let st = first_failure(&p);
    let e = st.last_error.clone().unwrap_or_default();
    assert!(e.contains("client certificate"), "{e}");
    assert_eq!((st.connected, st.unacked), (false, 1));

    // a certificate without its key is refused before any connection
    let half = url_for(&broker, "localhost", false).with_security(Security {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(pki.client_cert.clone()),
        ..Security::default()
    });
    let e = half.check().unwrap_err();
    assert!(e.contains("needs its key"), "{e}");
}

#[test]
fn expired_broker_certificate_is_said() {
    let Some(bin) = mosquitto_bin() else { return };
    let dir = tmp("mqtt-tls-expired");
    let pki = make_pki(&dir);
    let extra = format!(
        "cafile {}\ncertfile {}\nkeyfile {}\n",
        pki.ca.display(),
        pki.expired_cert.display(),
        pki.expired_key.display()
    );
    let broker = Mosquitto::start_with(&bin, &dir.join("broker"), &extra).expect("mosquitto");
    let url = url_for(&broker, "localhost", false).with_security(Security {
        ca_file: Some(pki.ca.clone()),
        ..Security::default()
    });
    let p = Publisher::start(PublisherConfig::new(url)).unwrap();
    p.enqueue("t/x", "kept").unwrap();
    let st = first_failure(&p);
    let e = st.last_error.clone().unwrap_or_default();
    assert!(e.contains("certificate has expired"), "{e}");
    assert_eq!((st.connected, st.unacked), (false, 1));
}

#[test]
fn broker_restart_over_tls_loses_nothing() {
    let Some(bin) = mosquitto_bin() else { return };
    let dir = tmp("mqtt-tls-restart");
    let pki = make_pki(&dir);
    let mut broker = tls_mosquitto(&bin, &dir, &pki, false);
    let gw = with_password(
        url_for(&broker, "localhost", false),
        &pki.ca,
        "gw",
        "gw-secret",
    );
    let reader = with_password(
        url_for(&broker, "localhost", false),
        &pki.ca,
        "reader",
        "reader-secret",
    );
    // a persistent session: the broker keeps what arrives while we are
    // reconnecting after its restart
    let mut cfg = SubscriberConfig::new(reader, "t/restart");
    cfg.client_id = Some(format!("mg-sub-{}", unique()));
    cfg.persistent_session = true;
    cfg.reorder.first_seq = Some(1);
    cfg.reorder.gap_timeout = Some(Duration::from_secs(30));
    let mut sub = Subscriber::start(cfg).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut subscribed = false;
    while !subscribed && Instant::now() < end {
        subscribed = matches!(
            sub.recv_timeout(Duration::from_millis(200)),
            Some(SubEvent::Subscribed)
        );
    }
    assert!(subscribed);
    let mut pc = PublisherConfig::new(gw);
    pc.window = 16;
    pc.state = Some(dir.join("queue"));
    let p = Publisher::start(pc).unwrap();
    let n = 2000u64;
    let mut got = Vec::new();
    let mut restarted = false;
    let end = Instant::now() + Duration::from_secs(60);
    let mut next = 1;
    while (got.len() as u64) < n && Instant::now() < end {
        // enqueue in steps of 50, restarting the broker a third of the way
        if next <= n && p.status().unacked < 200 {
            let bodies: Vec<String> = (next..(next + 50).min(n + 1))
                .map(|i| i.to_string())
                .collect();
            next += bodies.len() as u64;
            p.enqueue_many("t/restart", bodies).unwrap();
        }
        if !restarted && next > n / 3 {
            broker.restart().expect("restarting mosquitto");
            restarted = true;
        }
        while let Some(ev) = sub.recv_timeout(Duration::from_millis(5)) {
            if let SubEvent::Delivery(d) = ev {
                assert_eq!(d.skipped_before, 0, "a gap before {}", d.env.seq);
                got.push(d.env.seq);
            }
        }
    }
    assert!(restarted);
    assert_eq!(
        got,
        (1..=n).collect::<Vec<_>>(),
        "1..={n} in order, each once"
    );
    assert!(p.status().connects >= 2, "{:?}", p.status());
}

#[test]
fn serve_status_topic_online_will_and_orderly_offline() {
    let Some(bin) = mosquitto_bin() else { return };
    let dir = tmp("mqtt-tls-will");
    let pki = make_pki(&dir);
    let broker = tls_mosquitto(&bin, &dir, &pki, false);
    let pwfile = dir.join("gw.pw");
    std::fs::write(&pwfile, "gw-secret\n").unwrap();
    let coap = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap()
        .port();
    let status = format!("status/{}", unique());
    let cfg = dir.join("gw.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[coap]
bind = ["127.0.0.1:{coap}"]

[mqtt]
enabled = true
broker = "mqtts://localhost:{port}"
ca_file = "{ca}"
username = "gw"
password_file = "{pw}"
state = "{state}"
publish_devices = false
status_topic = "{status}"
status_online = "up"
status_offline = "gone"
"#,
            port = broker.port(),
            ca = pki.ca.display(),
            pw = pwfile.display(),
            state = dir.join("queue").display(),
        ),
    )
    .unwrap();
    let serve = || {
        Proc(
            Command::new(env!("CARGO_BIN_EXE_mintgate"))
                .args(["serve", "--config"])
                .arg(&cfg)
                .args(["--log", "warn"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let reader = with_password(
        url_for(&broker, "localhost", false),
        &pki.ca,
        "reader",
        "reader-secret",
    );
    let tap = Tap::start(&reader, &status);
    assert!(tap.control.wait_subscribed(Duration::from_secs(10)));

    // online on connect; killed (no DISCONNECT): the broker publishes the will
    let mut gw = serve();
    assert_eq!(tap.next(Duration::from_secs(15)).as_deref(), Some("up"));
    gw.0.kill().unwrap();
    gw.0.wait().unwrap();
    assert_eq!(tap.next(Duration::from_secs(10)).as_deref(), Some("gone"));

    // both are retained: a late subscriber sees the latest
    let late = Tap::start(&reader, &status);
    assert_eq!(late.next(Duration::from_secs(10)).as_deref(), Some("gone"));
    drop(late);

    // an orderly stop (SIGTERM) publishes `offline` itself
    let gw = serve();
    assert_eq!(tap.next(Duration::from_secs(15)).as_deref(), Some("up"));
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(gw.0.id() as i32, libc::SIGTERM);
    }
    let (code, _, _) = finish(gw, Duration::from_secs(15));
    assert_eq!(code, 0);
    assert_eq!(tap.next(Duration::from_secs(10)).as_deref(), Some("gone"));
}

/// amqtt from target/py-venv (scripts/test.sh installs it).
fn amqtt_bin() -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-venv/bin/amqtt");
    if bin.is_file() {
        return Some(bin);
    }
    if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
        panic!("amqtt is required (MINTGATE_REQUIRE_PEERS is set) but not in target/py-venv");
    }
    eprintln!("skipping: amqtt is not in target/py-venv (scripts/test.sh installs it)");
    None
}

/// The publish queue over `wss://` (window 16) and a subscriber over
/// `ws://`, both through amqtt's WebSocket listeners: 1..=N in order, and a
/// wrong CA over wss said as such.
#[test]
fn websockets_plain_and_tls_against_amqtt() {
    let Some(bin) = amqtt_bin() else { return };
    let dir = tmp("mqtt-ws");
    let pki = make_pki(&dir);
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (ws, wss) = (port(), port());
    let conf = dir.join("amqtt.yaml");
    std::fs::write(
        &conf,
        format!(
            "listeners:\n  default:\n    type: ws\n    bind: 127.0.0.1:{ws}\n  \
             secure:\n    type: ws\n    bind: 127.0.0.1:{wss}\n    ssl: on\n    \
             certfile: {}\n    keyfile: {}\n\
             sys_interval: 0\nauth:\n  allow-anonymous: true\ntopic-check:\n  enabled: false\n",
            pki.server_cert.display(),
            pki.server_key.display()
        ),
    )
    .unwrap();
    let _broker = Proc(
        Command::new(&bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("amqtt.log")).unwrap())
            .spawn()
            .expect("running amqtt"),
    );
    let listening = |p: u16| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
    let end = Instant::now() + Duration::from_secs(20);
    while !(listening(ws) && listening(wss)) {
        assert!(
            Instant::now() < end,
            "amqtt did not listen: {}",
            std::fs::read_to_string(dir.join("amqtt.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let plain: BrokerUrl = format!("ws://127.0.0.1:{ws}/mqtt").parse().unwrap();
    assert_eq!(plain.to_string(), format!("ws://127.0.0.1:{ws}/mqtt"));
    let secure: BrokerUrl = format!("wss://localhost:{wss}/mqtt").parse().unwrap();
    let secure = secure.with_security(Security {
        ca_file: Some(pki.ca.clone()),
        ..Security::default()
    });

    let mut sc = SubscriberConfig::new(plain, "t/ws");
    sc.reorder.first_seq = Some(1);
    let mut sub = Subscriber::start(sc).unwrap();
    assert!(
        sub.wait_subscribed(Duration::from_secs(10)),
        "no SUBACK over ws://"
    );
    let mut pc = PublisherConfig::new(secure.clone());
    pc.window = 16;
    let p = Publisher::start(pc).unwrap();
    let n = 200u64;
    p.enqueue_many("t/ws", (1..=n).map(|i| format!("{i:04}")).collect())
        .unwrap();
    assert!(p.wait_idle(Duration::from_secs(30)), "{:?}", p.status());
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while (got.len() as u64) < n && Instant::now() < end {
        if let Some(SubEvent::Delivery(d)) = sub.recv_timeout(Duration::from_millis(500)) {
            assert_eq!(d.skipped_before, 0);
            got.push(d.env.seq);
        }
    }
    assert_eq!(got, (1..=n).collect::<Vec<_>>());

    // wss with a CA that did not sign the broker's certificate
    let wrong = secure.with_security(Security {
        ca_file: Some(pki.other_ca.clone()),
        ..Security::default()
    });
    let p = Publisher::start(PublisherConfig::new(wrong)).unwrap();
    p.enqueue("t/ws", "kept").unwrap();
    let st = first_failure(&p);
    let e = st.last_error.clone().unwrap_or_default();
    assert!(e.contains("certificate"), "{e}");
    assert_eq!((st.connected, st.unacked), (false, 1));
    let _ = std::fs::remove_dir_all(&dir);
}
