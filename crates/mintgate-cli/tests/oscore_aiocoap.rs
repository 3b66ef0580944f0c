//! OSCORE (RFC 8613) between mintgate and a stack no one here wrote:
//! aiocoap (PyPI, with its `oscore` extra, in target/py-venv; scripts/test.sh
//! installs it). aiocoap-client GETs, PUTs and observes (RFC 8613 4.1.3.5)
//! through `mintgate serve` with `access.write = "oscore"`, over UDP, CoAP
//! over TCP and CoAP over WebSockets, with bodies of several blocks inside
//! the protection (4.1.3.4.1); `mintgate get/put --oscore` talks to
//! aiocoap-fileserver, block-wise too. Without aiocoap those
//! tests are skipped, unless MINTGATE_REQUIRE_PEERS is set: then they fail.
//! `mintgate observe --oscore` against the same server needs no peer.

mod common;

use common::{output_text, Kill};

use std::io::BufRead;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-oscore-aio-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mintgate(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run mintgate")
}

fn run(cmd: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("30")
        .arg(cmd)
        .args(args)
        .output()
        .expect("run aiocoap-client")
}

/// Waits until `probe` answers (a plain GET with mintgate's client).
fn wait_for(uri: &str, child: &mut Child, log: &Path, d: &Path) {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        let o = mintgate(&["get", uri, "--timeout", "1s"], d);
        if o.status.code() != Some(5) {
            return;
        }
        if let Ok(Some(s)) = child.try_wait() {
            panic!(
                "server exited ({s}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no answer from {uri} in 20 s: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

const SECRET: &str = "1112131415161718191a1b1c1d1e1f20";

/// `mintgate serve` in `d` with `access.write = "oscore"`, the OSCORE
/// context `aio` (Sender ID 01, Recipient ID 0a) and a simulated sensor
/// `temp0` rising about 1.3 a sample, a sample every 200 ms (a sine of
/// period 10,000 s, rising for its first 2,500 s); aiocoap's credentials
/// for the context are in `d/creds.json`, mintgate's (`observe/get
/// --oscore`) in `d/mg.toml`. Returns the server, its CoAP port, the
/// credentials file and its metrics port.
/// A `mintgate serve` with one OSCORE context for aiocoap, on UDP,
/// `coap+tcp` and `coap+ws`.
struct Served {
    _server: Kill,
    /// The UDP and `coap+tcp` port.
    port: u16,
    /// The `coap+ws` port.
    ws: u16,
    /// The metrics port.
    metrics: u16,
    /// aiocoap credentials for `coap://` (`creds.json`), `coap+tcp://`
    /// (`creds-tcp.json`) and `coap+ws://` (`creds-ws.json`): one file
    /// each, as aiocoap 0.4.17 follows no reference from one URI pattern
    /// to another's context.
    creds: PathBuf,
    creds_tcp: PathBuf,
    creds_ws: PathBuf,
}

fn serve_oscore(d: &Path) -> Served {
    let port = loop {
        // the same number free for UDP and TCP
        let p = free_port();
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            break p;
        }
    };
    let ws = common::free_tcp();
    let metrics = common::free_tcp();
    std::fs::write(
        d.join("gw.toml"),
        format!(
            "[coap]\nbind = [\"127.0.0.1:{port}\"]\ntcp_bind = [\"127.0.0.1:{port}\"]\n\
             ws_bind = [\"127.0.0.1:{ws}\"]\n[access]\nwrite = \"oscore\"\n\
             [oscore]\nstate = \"state\"\n\
             [[oscore.contexts]]\nname = \"aio\"\nmaster_secret_env = \"MG_TEST_OSCORE_SECRET\"\n\
             master_salt = \"9e7ca92223786340\"\nsender_id = \"01\"\nrecipient_id = \"0a\"\n\
             [[oscore.contexts]]\nname = \"mg\"\nmaster_secret_env = \"MG_TEST_OSCORE_SECRET\"\n\
             master_salt = \"9e7ca92223786340\"\nsender_id = \"02\"\nrecipient_id = \"0b\"\n\
             [[devices.list]]\nname = \"temp0\"\nkind = \"sim-sensor\"\n\
             signal = \"sine(0, 2000, 10000s)\"\nperiod = \"200ms\"\n"
        ),
    )
    .unwrap();
    std::fs::create_dir_all(d.join("ctx")).unwrap();
    std::fs::write(
        d.join("ctx/settings.json"),
        format!(
            "{{\"sender-id_hex\": \"0a\", \"recipient-id_hex\": \"01\", \
             \"secret_hex\": \"{SECRET}\", \"salt_hex\": \"9e7ca92223786340\"}}"
        ),
    )
    .unwrap();
    let creds_for = |file: &str, prefix: String| {
        let f = d.join(file);
        std::fs::write(
            &f,
            format!(
                "{{\"{prefix}/*\": {{\"oscore\": {{\"basedir\": \"{}/\"}}}}}}",
                d.join("ctx").display()
            ),
        )
        .unwrap();
        f
    };
    let creds = creds_for("creds.json", format!("coap://127.0.0.1:{port}"));
    let creds_tcp = creds_for("creds-tcp.json", format!("coap+tcp://127.0.0.1:{port}"));
    let creds_ws = creds_for("creds-ws.json", format!("coap+ws://127.0.0.1:{ws}"));
    std::fs::write(d.join("mg.hex"), format!("{SECRET}\n")).unwrap();
    std::fs::write(
        d.join("mg.toml"),
        "name = \"mg\"\nmaster_secret_file = \"mg.hex\"\nmaster_salt = \"9e7ca92223786340\"\n\
         sender_id = \"0b\"\nrecipient_id = \"02\"\n",
    )
    .unwrap();
    let log = d.join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["serve", "-c", "gw.toml", "--threads", "2", "--metrics"])
        .arg(format!("127.0.0.1:{metrics}"))
        .env("MG_TEST_OSCORE_SECRET", SECRET)
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start mintgate serve");
    wait_for(
        &format!("coap://127.0.0.1:{port}/request"),
        &mut child,
        &log,
        d,
    );
    Served {
        _server: Kill(child),
        port,
        ws,
        metrics,
        creds,
        creds_tcp,
        creds_ws,
    }
}

/// aiocoap-client PUTs `big` to `put` (credentials, URI) and GETs it back
/// from `get`, both protected.
fn aiocoap_puts_and_gets(client: &Path, d: &Path, big: &str, put: (&str, &str), get: (&str, &str)) {
    std::fs::write(d.join("big.txt"), big).unwrap();
    let at = format!("@{}", d.join("big.txt").display());
    let o = run(
        client,
        &["--credentials", put.0, "-m", "PUT", "--payload", &at, put.1],
    );
    assert!(o.status.success(), "protected PUT: {}", output_text(&o));
    let o = run(client, &["--credentials", get.0, get.1]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout) == big,
        "{}",
        output_text(&o)
    );
}

/// `n` bytes of text that differ from place to place.
fn body(n: usize, seed: u8) -> String {
    (0..n)
        .map(|i| char::from(b'a' + ((i * 7 + usize::from(seed)) % 26) as u8))
        .collect()
}

/// The numbers among `lines`, checked to rise strictly.
fn rising(lines: &[String]) -> Vec<f64> {
    let v: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .collect();
    assert!(
        v.windows(2).all(|w| w[1] > w[0]),
        "values do not rise: {lines:?}"
    );
    v
}

/// A metric of the server's `/metrics`.
fn server_metric(port: u16, name: &str) -> f64 {
    let (_, _, text) = common::http(port, "GET", "/metrics", &[], b"");
    common::metric(&text, name).unwrap_or(-1.0)
}

#[test]
fn aiocoap_client_gets_and_puts_through_mintgate_serve() {
    let Some(client) = common::aiocoap_bin("aiocoap-client") else {
        return;
    };
    let d = dir("client");
    let srv = serve_oscore(&d);
    let port = srv.port;
    let uri = |p: &str| format!("coap://127.0.0.1:{port}/{p}");
    let c = srv.creds.to_str().unwrap();

    let o = run(&client, &["--credentials", c, &uri("request")]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "hello world");

    let o = run(
        &client,
        &[
            "--credentials",
            c,
            "-m",
            "PUT",
            "--payload",
            "on",
            &uri("echo"),
        ],
    );
    assert!(o.status.success(), "protected PUT: {}", output_text(&o));
    let o = run(&client, &["--credentials", c, &uri("echo")]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "on",
        "{}",
        output_text(&o)
    );

    // the same PUT unprotected is refused by access.write = "oscore"
    let o = run(&client, &["-m", "PUT", "--payload", "off", &uri("echo")]);
    assert!(!o.status.success(), "{}", output_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("4.01")
            || String::from_utf8_lossy(&o.stderr).contains("4.01"),
        "{}",
        output_text(&o)
    );

    // block-wise inside OSCORE (RFC 8613 4.1.3.4.1): aiocoap puts a body
    // of three blocks, each a protected request, and gets it back in
    // protected blocks; mintgate's client reads it the same way
    let verified = server_metric(srv.metrics, VERIFIED);
    let big = body(3000, 1);
    aiocoap_puts_and_gets(&client, &d, &big, (c, &uri("echo")), (c, &uri("echo")));
    assert!(
        server_metric(srv.metrics, VERIFIED) >= verified + 6.0,
        "fewer protected requests than blocks"
    );
    let m = mintgate(&["get", &uri("echo"), "--oscore", "mg.toml"], &d);
    assert!(m.status.success(), "{}", output_text(&m));
    assert!(String::from_utf8_lossy(&m.stdout) == big);

    let m = mintgate(&["get", &uri("request")], &d);
    assert!(m.status.success());
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
}

const VERIFIED: &str = "mintgate_oscore_requests_total{result=\"verified\"}";

/// OSCORE over CoAP over TCP and over WebSockets (RFC 8323 with RFC 8613):
/// aiocoap puts a block-wise body protected over `coap+tcp`, reads it back
/// over `coap+ws`, and observes over `coap+tcp` with protected
/// notifications; an unprotected write over TCP is refused as over UDP.
#[test]
fn aiocoap_uses_oscore_over_coap_tcp_and_websockets() {
    let Some(client) = common::aiocoap_bin("aiocoap-client") else {
        return;
    };
    let d = dir("tcp");
    let srv = serve_oscore(&d);
    let (port, ws) = (srv.port, srv.ws);
    let tcp_uri = |p: &str| format!("coap+tcp://127.0.0.1:{port}/{p}");
    let ws_uri = |p: &str| format!("coap+ws://127.0.0.1:{ws}/{p}");
    let (ct, cw) = (
        srv.creds_tcp.to_str().unwrap(),
        srv.creds_ws.to_str().unwrap(),
    );

    let big = body(2500, 2);
    aiocoap_puts_and_gets(
        &client,
        &d,
        &big,
        (ct, &tcp_uri("echo")),
        (cw, &ws_uri("echo")),
    );
    let o = run(&client, &["--credentials", cw, &ws_uri("request")]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "hello world");
    assert!(server_metric(srv.metrics, VERIFIED) >= 4.0);

    let o = run(
        &client,
        &["-m", "PUT", "--payload", "off", &tcp_uri("echo")],
    );
    let text = output_text(&o);
    assert!(text.contains("4.01"), "{text}");

    // mintgate's own client protects over both transports too: a body in
    // one protected TCP message, read back in inner blocks over WebSockets
    let big = body(5000, 4);
    let o = mintgate(
        &["put", &tcp_uri("echo"), "-e", &big, "--oscore", "mg.toml"],
        &d,
    );
    assert!(o.status.success(), "{}", output_text(&o));
    let o = mintgate(&["get", &ws_uri("echo"), "--oscore", "mg.toml"], &d);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout) == big,
        "{}",
        output_text(&o)
    );
    // a wrong key: refused, nothing printed as if it were the answer
    std::fs::write(d.join("bad.hex"), "00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::write(
        d.join("bad.toml"),
        "master_secret_file = \"bad.hex\"\nmaster_salt = \"9e7ca92223786340\"\n\
         sender_id = \"0b\"\nrecipient_id = \"02\"\n",
    )
    .unwrap();
    // numbers above those "mg" used, so that the Partial IV is fresh and
    // the ciphertext is what the server refuses (RFC 8613 8.2)
    std::fs::write(d.join("bad.seq"), "1000\n").unwrap();
    let o = mintgate(&["get", &tcp_uri("echo"), "--oscore", "bad.toml"], &d);
    assert!(!o.status.success(), "{}", output_text(&o));
    assert!(o.stdout.is_empty(), "{}", output_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("refused the OSCORE request: 4.00"),
        "{}",
        output_text(&o)
    );

    let notified = server_metric(
        srv.metrics,
        "mintgate_oscore_notifications_total{result=\"protected\"}",
    );
    aiocoap_observes(
        &format!("coap+tcp://127.0.0.1:{port}/sensors/temp0"),
        &srv.creds_tcp,
    );
    assert!(
        server_metric(
            srv.metrics,
            "mintgate_oscore_notifications_total{result=\"protected\"}"
        ) >= notified + 4.0
    );
}

#[test]
fn mintgate_client_gets_and_puts_to_aiocoap_fileserver() {
    let Some(server) = common::aiocoap_bin("aiocoap-fileserver") else {
        return;
    };
    let d = dir("server");
    let port = free_port();
    std::fs::create_dir_all(d.join("files")).unwrap();
    std::fs::create_dir_all(d.join("srv")).unwrap();
    std::fs::write(d.join("files/hello.txt"), "served by aiocoap\n").unwrap();
    std::fs::write(
        d.join("srv/settings.json"),
        format!("{{\"sender-id_hex\": \"01\", \"recipient-id_hex\": \"0b\", \"secret_hex\": \"{SECRET}\"}}"),
    )
    .unwrap();
    std::fs::write(
        d.join("creds.json"),
        format!(
            "{{\":mg\": {{\"oscore\": {{\"basedir\": \"{}/\"}}}}}}",
            d.join("srv").display()
        ),
    )
    .unwrap();
    std::fs::write(d.join("mg.hex"), format!("{SECRET}\n")).unwrap();
    std::fs::write(
        d.join("mg.toml"),
        "name = \"mg\"\nmaster_secret_file = \"mg.hex\"\nsender_id = \"0b\"\nrecipient_id = \"01\"\n",
    )
    .unwrap();
    // a context with the wrong secret: the server cannot verify it
    std::fs::write(d.join("bad.hex"), "00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::write(
        d.join("bad.toml"),
        "master_secret_file = \"bad.hex\"\nsender_id = \"0b\"\nrecipient_id = \"01\"\n",
    )
    .unwrap();
    let log = d.join("fileserver.log");
    let mut child = Command::new(&server)
        .args([
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--credentials",
            "creds.json",
            "--write",
            "files",
        ])
        .current_dir(&d)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start aiocoap-fileserver");
    let uri = |p: &str| format!("coap://127.0.0.1:{port}/{p}");
    wait_for(&uri("hello.txt"), &mut child, &log, &d);
    let _server = Kill(child);

    // mintgate's client verifies the answer: an unprotected one fails
    let o = mintgate(&["get", &uri("hello.txt"), "--oscore", "mg.toml"], &d);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "served by aiocoap\n");

    let o = mintgate(
        &[
            "put",
            &uri("new.txt"),
            "-e",
            "written by mintgate",
            "--oscore",
            "mg.toml",
        ],
        &d,
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        std::fs::read_to_string(d.join("files/new.txt")).unwrap(),
        "written by mintgate"
    );
    // a body of several blocks, each block a protected request (inner
    // block-wise, RFC 8613 4.1.3.4.1), both ways
    let big = body(6000, 3);
    let o = mintgate(
        &["put", &uri("big.txt"), "-e", &big, "--oscore", "mg.toml"],
        &d,
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(std::fs::read_to_string(d.join("files/big.txt")).unwrap() == big);
    let o = mintgate(&["get", &uri("big.txt"), "--oscore", "mg.toml"], &d);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(String::from_utf8_lossy(&o.stdout) == big);

    // the sequence number went to its file before use
    let seq: u64 = std::fs::read_to_string(d.join("mg.seq"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(seq >= 14, "{seq}");

    let o = mintgate(&["get", &uri("hello.txt"), "--oscore", "bad.toml"], &d);
    assert!(
        !o.status.success(),
        "a wrong key was accepted: {}",
        output_text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("refused the OSCORE request"),
        "{}",
        output_text(&o)
    );
}

/// RFC 8613 4.1.3.5 end to end with mintgate's own client:
/// `mintgate observe --oscore` registers with a protected GET and prints
/// only notifications it verified, in order; the server protected each.
#[test]
fn mintgate_observe_oscore_gets_verified_rising_notifications_from_serve() {
    let d = dir("observe-mg");
    let srv = serve_oscore(&d);
    let (port, metrics) = (srv.port, srv.metrics);
    let uri = format!("coap://127.0.0.1:{port}/sensors/temp0");
    let o = Command::new("timeout")
        .arg("30")
        .arg(env!("CARGO_BIN_EXE_mintgate"))
        .args(["observe", &uri, "--oscore", "mg.toml", "--count", "5"])
        .args(["--timeout", "10s", "--duration", "20s", "--json"])
        .current_dir(&d)
        .output()
        .expect("run mintgate observe");
    assert!(o.status.success(), "{}", output_text(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{}", output_text(&o));
    let payloads: Vec<String> = lines
        .iter()
        .map(|l| l["payload"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rising(&payloads).len(), 5, "{payloads:?}");
    assert!(lines.iter().all(|l| l["observe"].is_u64()), "{lines:?}");
    assert!(
        server_metric(
            metrics,
            "mintgate_oscore_notifications_total{result=\"protected\"}"
        ) >= 4.0
    );
    // the deregistration was protected and ended the relation
    assert!(
        common::wait_until(Duration::from_secs(5), || {
            (server_metric(metrics, "mintgate_observe_observers") == 0.0).then_some(())
        })
        .is_some(),
        "the relation outlived the client's Observe: 1"
    );

    // the wrong key: the server cannot verify the registration
    std::fs::write(d.join("bad.hex"), "00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::write(
        d.join("bad.toml"),
        "master_secret_file = \"bad.hex\"\nmaster_salt = \"9e7ca92223786340\"\n\
         sender_id = \"0a\"\nrecipient_id = \"01\"\n",
    )
    .unwrap();
    let o = mintgate(
        &["observe", &uri, "--oscore", "bad.toml", "--timeout", "10s"],
        &d,
    );
    assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));
    assert!(
        o.stdout.iter().all(|b| !b.is_ascii_digit()),
        "{}",
        output_text(&o)
    );
}

/// aiocoap observes through OSCORE (tests/observe_aiocoap.py with the
/// credentials; aiocoap-client --observe of aiocoap 0.4.17 stops after the
/// first answer): its notifications verify in aiocoap, which passes on
/// only what it verified, their Partial IVs and values rise.
#[test]
fn aiocoap_observes_through_mintgate_serve() {
    if common::aiocoap_bin("python").is_none() {
        return;
    }
    let d = dir("observe-aio");
    let srv = serve_oscore(&d);
    aiocoap_observes(
        &format!("coap://127.0.0.1:{}/sensors/temp0", srv.port),
        &srv.creds,
    );
    assert!(
        server_metric(
            srv.metrics,
            "mintgate_oscore_notifications_total{result=\"protected\"}"
        ) >= 4.0
    );
}

/// aiocoap observes `uri` with the credentials `creds`: a first answer
/// and four notifications, verified, with rising Partial IVs and values.
fn aiocoap_observes(uri: &str, creds: &Path) {
    let py = common::aiocoap_bin("python").expect("aiocoap's python");
    // killed once it printed enough or 20 s passed
    let mut child = Command::new(&py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/observe_aiocoap.py"))
        .arg(uri)
        .arg(creds)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start observe_aiocoap.py");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut child = Kill(child);
    let mut lines: Vec<String> = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while lines.iter().filter(|l| l.starts_with("note ")).count() < 4 {
        let Some(left) = end.checked_duration_since(Instant::now()) else {
            break;
        };
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    let _ = child.0.kill();
    let _ = child.0.wait();
    let mut err = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        lines.first().is_some_and(|l| l.starts_with("first 2.05")),
        "{lines:?} {err}"
    );
    // `note PARTIAL-IV VALUE`
    let notes: Vec<(String, String)> = lines[1..]
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!((f.len(), f[0]), (3, "note"), "{l}");
            (f[1].to_owned(), f[2].to_owned())
        })
        .collect();
    assert_eq!(notes.len(), 4, "{lines:?} {err}");
    let pivs: Vec<String> = notes.iter().map(|n| n.0.clone()).collect();
    assert_eq!(rising(&pivs).len(), 4, "Partial IVs {pivs:?}");
    let first = lines[0].rsplit(' ').next().unwrap().to_owned();
    let values: Vec<String> = std::iter::once(first)
        .chain(notes.iter().map(|n| n.1.clone()))
        .collect();
    assert_eq!(rising(&values).len(), 5, "{values:?}");
}
