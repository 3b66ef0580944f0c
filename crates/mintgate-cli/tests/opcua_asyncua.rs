//! OPC UA devices of `mintgate serve` against a server no one here wrote:
//! asyncua's (PyPI, installed by scripts/test.sh into target/py-venv;
//! tests/opcua_peer.py gives it known variables and lets the test change
//! and read them in the server's own address space). The gateway reads
//! nodes of every kind through its subscription over CoAP GET, an observer
//! sees a change the test makes, PUTs write nodes the test reads back, a
//! direct-path link writes a node when another crosses a threshold, the
//! server is stopped and started again; and with Basic256Sha256 (Sign, and
//! SignAndEncrypt) on certificates made here by openssl, a user and
//! password are taken and a wrong password and an untrusted server are
//! reported.
//!
//! Under MINTGATE_REQUIRE_PEERS=1 a missing asyncua (or openssl) fails the
//! test.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    closed_port, coap_get, field_link, free_tcp, free_udp, http, metric, mintgate, observe, text,
    tmp_dir, venv_python, wait_until, write_config, PyPeer, Serve,
};

fn python() -> Option<PathBuf> {
    venv_python("asyncua")
}

fn start_peer(py: &Path, port: Option<u16>, args: &[&str]) -> PyPeer {
    PyPeer::start(py, "opcua_peer.py", port, args)
}

fn url(p: &PyPeer) -> String {
    format!("opc.tcp://127.0.0.1:{}/mintgate/", p.port)
}

fn node(name: &str, rest: &str) -> String {
    format!("[[devices.list.nodes]]\nname = \"{name}\"\n{rest}\n")
}

#[test]
fn opcua_nodes_read_observed_and_written_against_asyncua() {
    let Some(py) = python() else {
        return;
    };
    let mut peer = start_peer(&py, None, &[]);
    let dead = closed_port(true);
    let dir = tmp_dir("opcua-asyncua");
    let (coap, metrics) = (free_udp(), free_tcp());
    let mut cfg = format!(
        "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
         [directpath]\npriority = 0\n\
         links = [\"ua.count | threshold(5000, 4500) -> actuator(ua.relay)\"]\n\
         [[devices.list]]\nname = \"ua\"\nkind = \"opcua\"\nendpoint = \"{}\"\n\
         timeout = \"5s\"\nperiod = \"50ms\"\npublishing_interval = \"50ms\"\n",
        url(&peer)
    );
    for (name, rest) in [
        ("temp", "node = \"ns=2;s=Temperature\"\nunit = \"Cel\""),
        ("count", "node = \"ns=2;s=Count\""),
        ("level", "node = \"ns=2;s=Level\""),
        ("raw", "node = \"ns=2;i=1001\"\nscale = 0.1\noffset = -40.0"),
        ("run", "node = \"ns=2;s=Running\""),
        (
            "set",
            "node = \"ns=2;s=Setpoint\"\ntype = \"i16\"\nwritable = true",
        ),
        (
            "relay",
            "node = \"ns=2;s=Relay\"\ntype = \"bool\"\nwritable = true",
        ),
        (
            "speed",
            "node = \"ns=2;s=Speed\"\ntype = \"f64\"\nscale = 0.5\nwritable = true",
        ),
        // a string: no number; a node the server does not have
        ("name", "node = \"ns=2;s=Name\""),
        ("nope", "node = \"ns=2;s=Nope\""),
    ] {
        cfg.push_str(&node(name, rest));
    }
    cfg.push_str(&format!(
        "[[devices.list]]\nname = \"dead\"\nkind = \"opcua\"\n\
         endpoint = \"opc.tcp://127.0.0.1:{dead}/\"\ntimeout = \"500ms\"\n{}",
        node("x", "node = \"ns=2;s=Count\"")
    ));
    let cfg = write_config(&dir, coap, &cfg);
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let gw: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(gw, Duration::from_secs(15));
    let get = |path: &str| text(coap_get(gw, path));

    // every kind of value, as the server holds it, through the subscription
    let first = wait_until(Duration::from_secs(15), || get("sensors/ua.count"));
    assert_eq!(first.as_deref(), Some("1234"), "{}", s.log_text());
    for (path, want) in [
        ("sensors/ua.temp", "21.5"),
        ("sensors/ua.level", "0.25"),
        ("sensors/ua.raw", "25"),
        ("sensors/ua.run", "1"),
        ("actuators/ua.set", "0"),
        ("actuators/ua.relay", "0"),
    ] {
        let got = wait_until(Duration::from_secs(5), || get(path));
        assert_eq!(got.as_deref(), Some(want), "{path}");
    }
    // a string node and a missing node: no value (5.03), and why
    assert_eq!(get("sensors/ua.name"), None);
    assert_eq!(get("sensors/ua.nope"), None);
    let row = field_link(metrics, "ua.nope");
    assert_eq!(row["connected"], true, "{row}");
    assert_eq!(get("sensors/dead.x"), None);

    // an observer sees a change the test makes in the server
    let uri = |p: &str| format!("coap://{gw}/{p}");
    let (mut obs, notes) = observe(&uri("sensors/ua.count"));
    let (_, l) = notes
        .recv_timeout(Duration::from_secs(10))
        .expect("the registration's answer");
    assert!(l.contains("1234"), "{l}");
    let changed = Instant::now();
    assert_eq!(peer.cmd("set Count 4321"), "ok");
    let seen = loop {
        let (t, l) = notes
            .recv_timeout(Duration::from_secs(5))
            .expect("a notification of the change");
        if l.contains("4321") {
            break t;
        }
    };
    let _ = obs.kill();
    let _ = obs.wait();
    eprintln!(
        "node change to CoAP notification: {:?} (sampling and publishing 50 ms)",
        seen - changed
    );
    assert!(seen - changed < Duration::from_secs(2));

    // PUTs, read back in the server
    for (path, value, name, want) in [
        ("actuators/ua.set", "777", "Setpoint", "777"),
        ("actuators/ua.relay", "1", "Relay", "True"),
        // scale 0.5: 12.5 is raw 25
        ("actuators/ua.speed", "12.5", "Speed", "25.0"),
    ] {
        let o = mintgate(&["put", &uri(path), "-e", value]);
        assert!(
            o.status.success(),
            "PUT {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(peer.cmd(&format!("get {name}")), want, "{path}");
    }
    // a value an Int16 cannot hold: refused, the server untouched
    let o = mintgate(&["put", &uri("actuators/ua.set"), "-e", "70000"]);
    assert!(!o.status.success());
    assert_eq!(peer.cmd("get Setpoint"), "777");
    // the direct path: Count crosses 5000, the link sets Relay
    let o = mintgate(&["put", &uri("actuators/ua.relay"), "-e", "0"]);
    assert!(o.status.success());
    assert_eq!(peer.cmd("get Relay"), "False");
    let crossed = Instant::now();
    assert_eq!(peer.cmd("set Count 6000"), "ok");
    let on = wait_until(Duration::from_secs(5), || {
        (peer.cmd("get Relay") == "True").then(Instant::now)
    })
    .expect("the link set the relay");
    eprintln!(
        "node crossing to relay set (direct path): {:?}",
        on - crossed
    );

    // counters and state on /metrics and the dashboard
    let m = || http(metrics, "GET", "/metrics", &[], b"").2;
    let t = m();
    let val = |t: &str, name: &str, c: &str| {
        metric(t, &format!("{name}{{connection=\"{c}\"}}")).unwrap_or(-1.0)
    };
    assert_eq!(val(&t, "mintgate_field_connected", "ua"), 1.0, "{t}");
    assert!(val(&t, "mintgate_field_polls_total", "ua") >= 10.0, "{t}");
    assert!(val(&t, "mintgate_field_writes_total", "ua") >= 5.0, "{t}");
    assert_eq!(val(&t, "mintgate_field_connected", "dead"), 0.0, "{t}");
    assert!(val(&t, "mintgate_field_errors_total", "dead") >= 1.0, "{t}");
    let dead_err = field_link(metrics, "dead.x")["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        dead_err.contains(&format!("127.0.0.1:{dead}")),
        "{dead_err}"
    );
    // the two bad nodes are counted (a PUT the type cannot hold is refused
    // before it reaches the server: not a connection error)
    assert!(val(&t, "mintgate_field_errors_total", "ua") >= 2.0, "{t}");

    // the server stops and comes back on its port: reported, then recovered
    // from without a restart of the gateway
    let port = peer.port;
    drop(peer);
    let lost = wait_until(Duration::from_secs(10), || {
        (val(&m(), "mintgate_field_connected", "ua") == 0.0).then_some(())
    });
    assert!(lost.is_some(), "{}", m());
    assert_eq!(get("sensors/ua.count"), None);
    let err = field_link(metrics, "ua.count")["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let restarted = Instant::now();
    let _peer = start_peer(&py, Some(port), &[]);
    let back = wait_until(Duration::from_secs(15), || get("sensors/ua.count"));
    assert_eq!(back.as_deref(), Some("1234"), "a fresh server's value");
    eprintln!("server restart to value back: {:?}", restarted.elapsed());
    assert_eq!(val(&m(), "mintgate_field_connected", "ua"), 1.0);
    assert!(val(&m(), "mintgate_field_connects_total", "ua") >= 2.0);
}

/// A self-signed RSA 2048 certificate and key made by openssl for an OPC
/// UA application: its URI first among the subjectAltNames, then the
/// host names (OPC UA Part 6, 6.2.2). `DIR/WHO.der`, `DIR/WHO.pem` (key).
fn make_cert(dir: &Path, who: &str, uri: &str) -> bool {
    let key = dir.join(format!("{who}.pem"));
    let pem = dir.join(format!("{who}.crt"));
    let ok = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&pem)
        .args(["-subj", &format!("/CN=mintgate test {who}")])
        .args([
            "-addext",
            &format!("subjectAltName=URI:{uri},DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1"),
            "-addext",
            "keyUsage=critical,digitalSignature,nonRepudiation,keyEncipherment,dataEncipherment",
            "-addext",
            "extendedKeyUsage=serverAuth,clientAuth",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok && Command::new("openssl")
        .args(["x509", "-outform", "der", "-in"])
        .arg(&pem)
        .arg("-out")
        .arg(dir.join(format!("{who}.der")))
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn opcua_security_and_users_against_asyncua() {
    let Some(py) = python() else {
        return;
    };
    let dir = tmp_dir("opcua-security");
    if !make_cert(&dir, "server", "urn:mintgate:test-server")
        || !make_cert(&dir, "client", "urn:mintgate:gateway")
    {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "openssl is required (MINTGATE_REQUIRE_PEERS is set) but did not make the certificates"
        );
        eprintln!("skipping: openssl did not make the certificates");
        return;
    }
    let trust = dir.join("trust");
    std::fs::create_dir_all(&trust).unwrap();
    std::fs::copy(dir.join("server.der"), trust.join("plc.der")).unwrap();
    std::fs::write(dir.join("pw"), "s3cret-pw\n").unwrap();
    std::fs::write(dir.join("wrong"), "wr0ng-pw\n").unwrap();
    let mut peer = start_peer(
        &py,
        None,
        &[
            "--certs",
            dir.to_str().unwrap(),
            "--user",
            "alice:s3cret-pw",
        ],
    );
    let (coap, metrics) = (free_udp(), free_tcp());
    let d = dir.display();
    let client = format!("certificate = \"{d}/client.der\"\nprivate_key = \"{d}/client.pem\"\n");
    let dev = |name: &str, rest: &str| {
        format!(
            "[[devices.list]]\nname = \"{name}\"\nkind = \"opcua\"\nendpoint = \"{}\"\n\
             timeout = \"10s\"\nperiod = \"100ms\"\n{rest}\n{}{}",
            url(&peer),
            node("temp", "node = \"ns=2;s=Temperature\""),
            node(
                "speed",
                "node = \"ns=2;s=Speed\"\ntype = \"f64\"\nwritable = true"
            ),
        )
    };
    let mut cfg = format!("[metrics]\nbind = \"127.0.0.1:{metrics}\"\n");
    cfg += &dev(
        "enc",
        &format!(
            "security_policy = \"Basic256Sha256\"\nsecurity_mode = \"SignAndEncrypt\"\n{client}\
             server_certificate = \"{d}/server.der\"\nuser = \"alice\"\npassword_file = \"{d}/pw\""
        ),
    );
    cfg += &dev(
        "sign",
        &format!(
            "security_policy = \"Basic256Sha256\"\nsecurity_mode = \"Sign\"\n{client}\
             trusted_certificates = \"{}\"\nuser = \"alice\"\npassword_file = \"{d}/pw\"",
            trust.display()
        ),
    );
    cfg += &dev(
        "badpw",
        &format!("user = \"alice\"\npassword_file = \"{d}/wrong\""),
    );
    // the client's own certificate given as the server's: not trusted
    cfg += &dev(
        "untrust",
        &format!(
            "security_policy = \"Basic256Sha256\"\n{client}\
             server_certificate = \"{d}/client.der\"\nuser = \"alice\"\npassword_file = \"{d}/pw\""
        ),
    );
    let cfg = write_config(&dir, coap, &cfg);
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let gw: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(gw, Duration::from_secs(15));
    let get = |path: &str| text(coap_get(gw, path));

    // signed and encrypted, and signed only: values read, a write taken
    for dev in ["enc", "sign"] {
        let got = wait_until(Duration::from_secs(20), || {
            get(&format!("sensors/{dev}.temp"))
        });
        assert_eq!(got.as_deref(), Some("21.5"), "{dev}: {}", s.log_text());
    }
    let uri = format!("coap://{gw}/actuators/enc.speed");
    let o = mintgate(&["put", &uri, "-e", "42.25"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(peer.cmd("get Speed"), "42.25");
    let m = http(metrics, "GET", "/metrics", &[], b"").2;
    for c in ["enc", "sign"] {
        assert_eq!(
            metric(
                &m,
                &format!("mintgate_field_connected{{connection=\"{c}\"}}")
            ),
            Some(1.0),
            "{m}"
        );
    }
    // a wrong password, and a server whose certificate is not trusted:
    // no value, and the reason on the dashboard
    let why = |name: &str| {
        wait_until(Duration::from_secs(20), || {
            field_link(metrics, name)["last_error"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
    };
    let e = why("badpw.temp");
    assert!(e.contains("refused user `alice`"), "{e}");
    assert_eq!(get("sensors/badpw.temp"), None);
    let e = why("untrust.temp");
    assert!(
        e.contains("not trusted") && e.contains("CN=mintgate test server"),
        "{e}"
    );
    assert_eq!(get("sensors/untrust.temp"), None);
    // two sessions activated (enc, sign); no password anywhere in the log
    assert_eq!(peer.cmd("sessions"), "2");
    let log = s.log_text();
    assert!(!log.contains("s3cret") && !log.contains("wr0ng"), "{log}");
}

/// An OPC UA server that accepts TCP connections and never answers: every
/// attempt ends at the device's `timeout`, reported (`last_error`, GET
/// 5.03) and counted (`errors`); then a real server takes the port and the
/// gateway reads it without a restart.
#[test]
fn opcua_server_that_never_answers_is_bounded_by_the_timeout_and_recovered_from() {
    let Some(py) = python() else {
        return;
    };
    // accepts (the kernel completes the handshake) and never reads
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    let dir = tmp_dir("opcua-mute");
    let (coap, metrics) = (free_udp(), free_tcp());
    let cfg = format!(
        "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
         [[devices.list]]\nname = \"ua\"\nkind = \"opcua\"\n\
         endpoint = \"opc.tcp://127.0.0.1:{port}/mintgate/\"\n\
         timeout = \"500ms\"\nperiod = \"50ms\"\npublishing_interval = \"50ms\"\n{}",
        node("count", "node = \"ns=2;s=Count\"")
    );
    let cfg = write_config(&dir, coap, &cfg);
    let started = Instant::now();
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let gw: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(gw, Duration::from_secs(15));
    let val = |name: &str| {
        let t = http(metrics, "GET", "/metrics", &[], b"").2;
        metric(&t, &format!("{name}{{connection=\"ua\"}}")).unwrap_or(-1.0)
    };
    let first = wait_until(Duration::from_secs(10), || {
        (val("mintgate_field_errors_total") >= 1.0).then(|| started.elapsed())
    });
    let first = first.unwrap_or_else(|| panic!("no error counted: {}", s.log_text()));
    // the gateway's start plus one bounded attempt
    assert!(
        first < Duration::from_secs(5),
        "first error after {first:?}"
    );
    let err = field_link(metrics, "ua.count")["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(!err.is_empty(), "no last_error");
    assert_eq!(val("mintgate_field_connected"), 0.0);
    assert_eq!(text(coap_get(gw, "sensors/ua.count")), None);
    // more attempts, each ended by the timeout (not one hung for good)
    let more = wait_until(Duration::from_secs(5), || {
        (val("mintgate_field_errors_total") >= 2.0).then_some(())
    });
    assert!(
        more.is_some(),
        "a second attempt: {}",
        val("mintgate_field_errors_total")
    );
    eprintln!(
        "mute server: first error {first:?} after the start, last_error {err:?}, {} errors",
        val("mintgate_field_errors_total")
    );
    drop(mute);
    let back = Instant::now();
    let _peer = start_peer(&py, Some(port), &[]);
    let got = wait_until(Duration::from_secs(15), || {
        text(coap_get(gw, "sensors/ua.count"))
    });
    assert_eq!(got.as_deref(), Some("1234"), "{}", s.log_text());
    eprintln!(
        "a real server on the port: value after {:?}",
        back.elapsed()
    );
    assert_eq!(val("mintgate_field_connected"), 1.0);
}
