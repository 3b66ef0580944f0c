//! `mintgate get|put|post|delete` against libcoap's `coap-server-notls`.
//!
//! Each test starts its own server on a free loopback port and kills it when
//! done, also when the test fails (the [`Server`] guard). Without
//! `coap-server-notls` on PATH the libcoap tests are skipped with a message,
//! unless `MINTGATE_REQUIRE_PEERS` is set, in which case they fail.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const PEER: &str = "coap-server-notls";

/// A running `coap-server-notls`, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn uri(&self, path: &str) -> String {
        format!("coap://127.0.0.1:{}{path}", self.port)
    }
}

fn on_path(exe: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(exe).is_file()))
}

/// Starts the server, or returns `None` (test skipped) when it is not
/// installed and peers are not required.
fn server() -> Option<Server> {
    if !on_path(PEER) {
        if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
            panic!(
                "{PEER} is not on PATH and MINTGATE_REQUIRE_PEERS is set (install libcoap3-bin)"
            );
        }
        eprintln!("skipping: {PEER} is not on PATH (install libcoap3-bin to run this test)");
        return None;
    }
    // A port found free may be taken before the server binds it: retry.
    for _ in 0..5 {
        let port = free_udp_port();
        let child = Command::new(PEER)
            .args(["-A", "127.0.0.1", "-p", &port.to_string(), "-d", "10"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning coap-server-notls");
        let mut s = Server { child, port };
        if wait_ready(&mut s) {
            return Some(s);
        }
    }
    panic!("{PEER} did not come up");
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("binding a probe socket")
        .port()
}

/// Pings the server (empty CON, answered by a Reset) until it answers.
fn wait_ready(s: &mut Server) -> bool {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let dest: SocketAddr = ([127, 0, 0, 1], s.port).into();
    let ping = [0x40, 0x00, 0x12, 0x34];
    let until = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 64];
    while Instant::now() < until {
        if s.child.try_wait().ok().flatten().is_some() {
            return false;
        }
        let _ = sock.send_to(&ping, dest);
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            if n >= 4 && buf[0] >> 4 == 0x7 && buf[2..4] == ping[2..4] {
                return true;
            }
        }
    }
    false
}

fn mintgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running mintgate")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("mintgate killed by a signal")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn put_get_post_delete_con_and_non() {
    let Some(s) = server() else { return };
    let uri = s.uri("/request");

    let o = mintgate(&["put", &uri, "-e", "hello world"]);
    assert_eq!(code(&o), 0, "put: {}", stderr(&o));

    let o = mintgate(&["get", &uri]);
    assert_eq!(
        (code(&o), stdout(&o).as_str()),
        (0, "hello world"),
        "{}",
        stderr(&o)
    );

    let o = mintgate(&["get", &uri, "--non", "-v"]);
    assert_eq!((code(&o), stdout(&o).as_str()), (0, "hello world"));
    let e = stderr(&o);
    assert!(e.contains("-> NON GET"), "{e}");
    assert!(e.contains("<- NON 2.05 Content"), "{e}");

    let o = mintgate(&["put", &uri, "-e", "changed", "--format", "text", "-v"]);
    assert_eq!(code(&o), 0);
    assert!(stderr(&o).contains("<- ACK 2.04 Changed"), "{}", stderr(&o));

    let o = mintgate(&["post", &s.uri("/posted"), "-e", "x", "-v"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("2.01 Created"), "{}", stderr(&o));

    let o = mintgate(&["get", &uri, "--json"]);
    assert_eq!(code(&o), 0);
    let j = stdout(&o);
    assert!(
        j.starts_with("{\"code\":\"2.05\",\"name\":\"Content\",\"type\":\"ACK\""),
        "{j}"
    );
    assert!(j.trim_end().ends_with("\"payload\":\"changed\"}"), "{j}");

    let o = mintgate(&["delete", &uri]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    let o = mintgate(&["get", &uri]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("4.04 Not Found"), "{}", stderr(&o));
}

#[test]
fn not_found_and_bad_option_exit_3() {
    let Some(s) = server() else { return };
    let o = mintgate(&["get", &s.uri("/no/such%20thing")]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("4.04 Not Found"), "{}", stderr(&o));
    // An unknown critical option (9) is rejected with 4.02.
    let o = mintgate(&["get", &s.uri("/"), "-O", "9,x"]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("4.02 Bad Option"), "{}", stderr(&o));
}

#[test]
fn separate_response_from_async_resource() {
    let Some(s) = server() else { return };
    // libcoap's /async?N answers with an empty ACK, then a CON response
    // after N seconds.
    let o = mintgate(&["get", &s.uri("/async?1"), "-v"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("<- CON 2.05 Content"), "{}", stderr(&o));
    assert!(!stdout(&o).is_empty());
}

#[test]
fn well_known_core_by_host_name() {
    let Some(s) = server() else { return };
    let uri = format!("coap://localhost:{}/.well-known/core", s.port);
    let o = mintgate(&["get", &uri, "--timeout", "5s"]);
    // localhost may resolve to ::1 first, where nothing listens: then the
    // answer is "no response", never a wrong one.
    match code(&o) {
        0 => assert!(stdout(&o).contains("</async>"), "{}", stdout(&o)),
        5 => {}
        c => panic!("exit {c}: {}", stderr(&o)),
    }
}

#[test]
fn no_response_exits_5() {
    // Nothing listens: the ICMP port unreachable ends the wait at once.
    let port = free_udp_port();
    let o = mintgate(&["get", &format!("coap://127.0.0.1:{port}/x")]);
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains("no response"), "{}", stderr(&o));

    // A socket that never answers: the overall timeout.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let t0 = Instant::now();
    let o = mintgate(&[
        "get",
        &format!("coap://127.0.0.1:{port}/x"),
        "--timeout",
        "800ms",
    ]);
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(t0.elapsed() >= Duration::from_millis(800));
    assert!(t0.elapsed() < Duration::from_secs(5));
    let o = mintgate(&[
        "get",
        &format!("coap://127.0.0.1:{port}/x"),
        "--non",
        "--timeout",
        "300ms",
    ]);
    assert_eq!(code(&o), 5);
}

#[test]
fn reset_exits_6() {
    // A peer that rejects everything with a Reset.
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = peer.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        let mut buf = [0u8; 1500];
        if let Ok((n, from)) = peer.recv_from(&mut buf) {
            if n >= 4 {
                let rst = [0x70, 0x00, buf[2], buf[3]];
                let _ = peer.send_to(&rst, from);
            }
        }
    });
    let o = mintgate(&["get", &format!("coap://127.0.0.1:{port}/x")]);
    assert_eq!(code(&o), 6, "{}", stderr(&o));
    assert!(stderr(&o).contains("Reset"), "{}", stderr(&o));
    h.join().unwrap();
}

#[test]
fn bad_uri_exits_1_and_usage_error_exits_2() {
    let o = mintgate(&["get", "http://127.0.0.1/x"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("bad URI"), "{}", stderr(&o));
    let o = mintgate(&["get", "coap://127.0.0.1:99999/x"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("invalid port"), "{}", stderr(&o));
    let o = mintgate(&["get", "coap://127.0.0.1/", "--format", "nonsense"]);
    assert_eq!(code(&o), 2);
    let o = mintgate(&["get"]);
    assert_eq!(code(&o), 2);
    let o = mintgate(&["get", "--help"]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("5  no response within the timeout"));
}

#[test]
fn cocoa_and_adaptive_controllers_talk_to_libcoap() {
    let Some(s) = server() else { return };
    let uri = s.uri("/request");
    for cc in ["cocoa", "adaptive"] {
        let value = format!("via {cc}");
        let o = mintgate(&["put", &uri, "-e", &value, "--cc", cc]);
        assert_eq!(code(&o), 0, "put with {cc}: {}", stderr(&o));
        let o = mintgate(&["get", &uri, "--cc", cc, "-v"]);
        assert_eq!((code(&o), stdout(&o)), (0, value.clone()), "{}", stderr(&o));
        assert!(stderr(&o).contains("<- ACK 2.05 Content"), "{}", stderr(&o));
    }
}
