//! Interoperability: libcoap's `coap-client-notls` against `mintgate serve`.

use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have_peer() -> bool {
    common::have_command("coap-client-notls", "Debian libcoap3-bin")
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn serve(addr: &str) -> Server {
    let log = std::env::temp_dir().join(format!(
        "mintgate-serve-{}.log",
        addr.replace([':', '[', ']'], "_")
    ));
    let child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["serve", "--coap", addr, "--threads", "2"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start mintgate serve");
    let mut s = Server(child);
    // wait until it answers
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        if coap(&["-B", "1", "-m", "get"], &format!("coap://{addr}/request"))
            .0
            .contains("hello world")
        {
            return s;
        }
        if let Ok(Some(status)) = s.0.try_wait() {
            panic!(
                "mintgate serve exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "mintgate serve did not answer on {addr} within 15 s; its log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// Runs coap-client-notls; returns (stdout, stderr).
fn coap(args: &[&str], uri: &str) -> (String, String) {
    let out = Command::new("coap-client-notls")
        .args(args)
        .arg(uri)
        .output()
        .expect("run coap-client-notls");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_method_con_and_non() {
    if !have_peer() {
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let _srv = serve(&addr);
    let uri = |p: &str| format!("coap://{addr}/{p}");
    for non in [false, true] {
        let t: &[&str] = if non { &["-N"] } else { &[] };
        let a = |extra: &[&'static str]| -> Vec<&'static str> { [t, extra, &["-B", "3"]].concat() };
        let (o, _) = coap(&a(&["-m", "get"]), &uri("request"));
        assert_eq!(o.trim(), "hello world", "GET non={non}");
        let (o, e) = coap(&a(&["-m", "put", "-e", "stored value"]), &uri("echo"));
        assert!(
            !o.contains("4.") && !e.contains("4."),
            "PUT non={non}: {o} {e}"
        );
        let (o, _) = coap(&a(&["-m", "get"]), &uri("echo"));
        assert_eq!(o.trim(), "stored value", "GET after PUT non={non}");
        let (o, _) = coap(&a(&["-m", "post", "-e", "posted"]), &uri("echo"));
        assert_eq!(o.trim(), "posted", "POST non={non}");
        let (o, e) = coap(&a(&["-m", "delete"]), &uri("echo"));
        assert!(
            !o.contains("4.") && !e.contains("4."),
            "DELETE non={non}: {o} {e}"
        );
        let (o, _) = coap(&a(&["-m", "get"]), &uri("echo"));
        assert_eq!(o.trim(), "", "GET after DELETE non={non}");
        let (o, e) = coap(&a(&["-m", "get"]), &uri("no/such/path"));
        assert!(
            format!("{o}{e}").contains("4.04"),
            "4.04 non={non}: {o} {e}"
        );
        let (o, e) = coap(&a(&["-m", "put", "-e", "x"]), &uri("request"));
        assert!(
            format!("{o}{e}").contains("4.05"),
            "4.05 non={non}: {o} {e}"
        );
    }
    let (o, _) = coap(&["-B", "3", "-m", "get"], &uri(".well-known/core"));
    assert!(o.contains("</request>") && o.contains("</echo>"), "{o}");
}

#[test]
fn ipv6_get() {
    if !have_peer() {
        return;
    }
    let port = free_port();
    let _srv = serve(&format!("[::1]:{port}"));
    let (o, _) = coap(
        &["-B", "3", "-m", "get"],
        &format!("coap://[::1]:{port}/request"),
    );
    assert_eq!(o.trim(), "hello world");
}

/// aiocoap's command-line client from the suite's venv (scripts/test.sh
/// installs it), if there.
fn aiocoap_client() -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/py-venv/bin/aiocoap-client");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
        "aiocoap-client is required (MINTGATE_REQUIRE_PEERS is set) but not in target/py-venv"
    );
    eprintln!("skipping aiocoap: target/py-venv/bin/aiocoap-client is missing");
    None
}

/// Every default resource reaches clients whose address `mintgate serve`
/// has not verified, within 3x their requests (RFC 9175 2.4): libcoap
/// (from 127.0.0.2, so that nothing else verifies its address) and aiocoap
/// get the same bytes as mintgate's own client, block by block.
#[test]
fn unverified_peers_get_every_default_resource() {
    if !have_peer() {
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = std::env::temp_dir().join(format!("mintgate-serve-ampl-{}.log", std::process::id()));
    let child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args([
            "serve",
            "--coap",
            &addr,
            "--threads",
            "2",
            "--metrics",
            &metrics,
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start mintgate serve");
    let _srv = Server(child);
    let uri = |p: &str| format!("coap://{addr}/{p}");
    let end = Instant::now() + Duration::from_secs(15);
    while !coap(&["-B", "1", "-m", "get"], &uri("request"))
        .0
        .contains("hello world")
    {
        assert!(Instant::now() < end, "mintgate serve did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    // 3,000 bytes in /echo (a PUT's answer is small: nothing to verify)
    let body: String = (0..3000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let file = std::env::temp_dir().join(format!("mintgate-ampl-{}.txt", std::process::id()));
    std::fs::write(&file, &body).unwrap();
    let (o, e) = coap(
        &[
            "-B",
            "5",
            "-m",
            "put",
            "-b",
            "512",
            "-f",
            file.to_str().unwrap(),
        ],
        &uri("echo"),
    );
    assert!(!o.contains("4.") && !e.contains("4."), "PUT: {o} {e}");
    let paths = [
        ".well-known/core",
        "request",
        "echo",
        "sensors/temp0",
        "actuators/led0",
    ];
    // libcoap from an address of its own
    let mut libcoap = Vec::new();
    for p in paths {
        let (o, e) = coap(&["-a", "127.0.0.2", "-B", "10", "-m", "get"], &uri(p));
        assert!(!o.is_empty(), "libcoap GET /{p}: nothing ({e})");
        libcoap.push(o);
    }
    // aiocoap from 127.0.0.1, which nothing has verified yet
    let mut aio = Vec::new();
    if let Some(client) = aiocoap_client() {
        for p in paths {
            let out = Command::new(&client)
                .arg(uri(p))
                .output()
                .expect("run aiocoap-client");
            assert!(
                out.status.success(),
                "aiocoap GET /{p}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            aio.push(String::from_utf8_lossy(&out.stdout).into_owned());
        }
    }
    // mintgate's own client (it answers Echo, so its address is verified)
    let ours: Vec<String> = paths
        .iter()
        .map(|p| {
            let out = Command::new(env!("CARGO_BIN_EXE_mintgate"))
                .args(["get", &uri(p)])
                .output()
                .expect("mintgate get");
            assert!(out.status.success(), "mintgate get /{p}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    for (i, p) in paths.iter().enumerate() {
        if p.starts_with("sensors") {
            // a live value: a number from every client
            for got in [&libcoap[i], &ours[i]].into_iter().chain(aio.get(i)) {
                assert!(got.trim().parse::<f64>().is_ok(), "/{p}: {got:?}");
            }
            continue;
        }
        assert_eq!(libcoap[i].trim(), ours[i].trim(), "libcoap /{p}");
        if let Some(a) = aio.get(i) {
            assert_eq!(a.trim(), ours[i].trim(), "aiocoap /{p}");
        }
    }
    assert_eq!(ours[2].trim(), body);
    // the large answers to the unverified peers went as small blocks
    let text = http_get(&metrics, "/metrics");
    // each peer's first large answer (/.well-known/core) is cut to a block
    // with Echo; libcoap 4.3 and aiocoap 0.4.7 both repeat the Echo, which
    // verifies their addresses, so the rest comes whole
    let blocks = metric(&text, "mintgate_coap_amplification_blocks_total");
    let verified = metric(&text, "mintgate_coap_echo_verified_total");
    println!("answers cut to a block: {blocks}, addresses verified by Echo: {verified}");
    let peers = if aio.is_empty() { 1.0 } else { 2.0 };
    assert!(blocks >= peers, "{blocks} answers cut to blocks");
    assert!(verified >= peers, "{verified} Echo verifications");
    let _ = std::fs::remove_file(&file);
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("metrics listener");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the metrics"))
}
