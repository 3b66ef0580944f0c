//! Interoperability: libcoap's `coap-client-notls` against `mintgate serve`.

use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have_peer() -> bool {
    let found = Command::new("coap-client-notls")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "coap-client-notls is required (MINTGATE_REQUIRE_PEERS is set) but not on PATH"
        );
        eprintln!("skipping: coap-client-notls (Debian libcoap3-bin) is not on PATH");
    }
    found
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
