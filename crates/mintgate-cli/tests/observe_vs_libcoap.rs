//! Observe (RFC 7641) end to end: libcoap's `coap-client-notls -s` observing
//! a sensor of `mintgate serve`, and `mintgate observe` against both
//! `mintgate serve` and libcoap's `coap-server-notls`.
//!
//! Without libcoap on PATH the libcoap parts are skipped with a message,
//! unless `MINTGATE_REQUIRE_PEERS` is set, in which case they fail.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

struct Proc {
    child: Child,
    port: u16,
    _dir: Option<TempDir>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn on_path(exe: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(exe).is_file()))
}

fn peer_or_skip(exe: &str) -> bool {
    if on_path(exe) {
        return true;
    }
    if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
        panic!("{exe} is not on PATH and MINTGATE_REQUIRE_PEERS is set (install libcoap3-bin)");
    }
    eprintln!("skipping: {exe} is not on PATH (install libcoap3-bin to run this test)");
    false
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a probe socket")
        .port()
}

/// Pings (empty CON, answered by a Reset) until the server answers.
fn ready(p: &mut Proc) -> bool {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let dest: SocketAddr = ([127, 0, 0, 1], p.port).into();
    let ping = [0x40, 0x00, 0x43, 0x21];
    let until = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 64];
    while Instant::now() < until {
        if p.child.try_wait().ok().flatten().is_some() {
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

/// `mintgate serve` with a sensor sampled every 100 ms.
fn serve() -> Proc {
    for attempt in 0..5 {
        let port = free_udp_port();
        let dir = std::env::temp_dir().join(format!(
            "mintgate-observe-test-{}-{attempt}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("gw.toml");
        std::fs::write(
            &cfg,
            "[pipeline]\npool = \"fixed:2\"\n\
             [directpath]\npriority = 0\n\
             [[devices.list]]\nname = \"temp0\"\nkind = \"sim-sensor\"\n\
             signal = \"walk(20, 0.5, 0, 40)\"\nperiod = \"100ms\"\nunit = \"Cel\"\n\
             [[devices.list]]\nname = \"led0\"\nkind = \"sim-actuator\"\n",
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .args(["serve", "--coap", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&cfg)
            .args(["--log", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning mintgate serve");
        let mut p = Proc {
            child,
            port,
            _dir: Some(TempDir(dir)),
        };
        if ready(&mut p) {
            return p;
        }
    }
    panic!("mintgate serve did not come up");
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .expect("running a command")
}

#[test]
fn libcoap_client_observes_our_sensor() {
    if !peer_or_skip("coap-client-notls") {
        return;
    }
    let s = serve();
    let uri = format!("coap://127.0.0.1:{}/sensors/temp0", s.port);
    // -s 3: observe for 3 s; -A 50: JSON, one object per notification
    let o = run(Command::new("coap-client-notls").args(["-s", "3", "-A", "50", &uri]));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "coap-client: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let n = out.matches("{\"n\":\"temp0\"").count();
    // 3 s of 100 ms samples: about 30; a loaded machine may delay some
    assert!(n >= 10, "{n} notifications: {out}");
    let values: Vec<f64> = out
        .split("\"v\":")
        .skip(1)
        .map(|s| s.split([',', '}']).next().unwrap().parse().unwrap())
        .collect();
    assert!(
        values.iter().all(|v| (0.0..=40.0).contains(v)),
        "{values:?}"
    );
    assert!(
        values.windows(2).any(|w| w[0] != w[1]),
        "the walk moves: {values:?}"
    );
}

#[test]
fn mintgate_observe_counts_and_orders_notifications() {
    let s = serve();
    let uri = format!("coap://127.0.0.1:{}/sensors/temp0", s.port);
    let o = run(Command::new(env!("CARGO_BIN_EXE_mintgate")).args([
        "observe",
        &uri,
        "--count",
        "4",
        "--json",
        "--duration",
        "20s",
    ]));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let seqs: Vec<u64> = lines
        .iter()
        .map(|l| {
            l.split("\"observe\":")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
    assert!(lines[0].contains("\"type\":\"ACK\""), "{}", lines[0]);

    // a resource that is not observable: exit 7
    let o = run(Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["observe", &format!("coap://127.0.0.1:{}/request", s.port)]));
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // nothing there: 4.04, exit 3
    let o = run(Command::new(env!("CARGO_BIN_EXE_mintgate")).args([
        "observe",
        &format!("coap://127.0.0.1:{}/sensors/none", s.port),
    ]));
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("4.04"));
}

#[test]
fn mintgate_observe_against_libcoap_server() {
    if !peer_or_skip("coap-server-notls") {
        return;
    }
    for _ in 0..5 {
        let port = free_udp_port();
        let child = Command::new("coap-server-notls")
            .args(["-A", "127.0.0.1", "-p", &port.to_string(), "-d", "10"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning coap-server-notls");
        let mut p = Proc {
            child,
            port,
            _dir: None,
        };
        if !ready(&mut p) {
            continue;
        }
        // libcoap's /time is observable and changes every second
        let o = run(Command::new(env!("CARGO_BIN_EXE_mintgate")).args([
            "observe",
            &format!("coap://127.0.0.1:{port}/time"),
            "--count",
            "3",
            "-v",
            "--duration",
            "20s",
        ]));
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(out.lines().all(|l| l.contains(" obs ")), "{out}");
        return;
    }
    panic!("coap-server-notls did not come up");
}

/// Nothing listening is said at once (ICMP port unreachable), and
/// `--timeout` bounds the wait for a server that never answers; both exit
/// 5 (no peer needed).
#[test]
fn observe_fails_fast_when_nothing_answers() {
    let port = common::closed_port(false);
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["observe", &format!("coap://127.0.0.1:{port}/x")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("port unreachable"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args([
            "observe",
            "--timeout",
            "1s",
            &format!("coap://127.0.0.1:{port}/x"),
        ])
        .output()
        .unwrap();
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("no answer to the registration"), "{err}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(20),
        "{took:?}"
    );
    // the registration did reach the silent server
    silent.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    assert!(silent.recv(&mut buf).is_ok(), "no registration arrived");
    // a --duration that ends before any answer is no success either
    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args([
            "observe",
            "--duration",
            "1s",
            &format!("coap://127.0.0.1:{port}/x"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("no answer to the registration"), "{err}");
}

/// Ctrl-C (SIGINT) ends `mintgate observe` like --count: it deregisters
/// (a GET with Observe: 1 reaches the server) and exits 0. The server is a
/// bare socket of the test's, so the deregistration is seen on the wire.
#[test]
fn observe_deregisters_on_ctrl_c() {
    use mintgate_coap::wire::{Code, OptionNumber, Packet};
    use std::io::{BufRead, BufReader};

    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    server
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["observe", &format!("coap://127.0.0.1:{port}/s")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    // the registration: answer it with a notification (ACK 2.05, Observe 5)
    let (n, from) = server.recv_from(&mut buf).expect("no registration");
    let reg = Packet::new_checked(&buf[..n]).unwrap();
    assert_eq!(reg.code(), Code::GET);
    assert_eq!(
        reg.option(OptionNumber::OBSERVE).and_then(|o| o.uint()),
        Some(0)
    );
    let token = reg.token().to_vec();
    let mid = reg.message_id();
    let mut ack = vec![0x60 | token.len() as u8, 0x45, (mid >> 8) as u8, mid as u8];
    ack.extend_from_slice(&token);
    ack.extend_from_slice(&[0x61, 0x05, 0xFF]);
    ack.extend_from_slice(b"21.5");
    server.send_to(&ack, from).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "21.5");
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    // the deregistration: a GET with Observe: 1 and the same token
    let end = Instant::now() + Duration::from_secs(10);
    let mut deregistered = false;
    while Instant::now() < end && !deregistered {
        let Ok((n, from)) = server.recv_from(&mut buf) else {
            break;
        };
        let p = Packet::new_checked(&buf[..n]).unwrap();
        if p.code() == Code::GET
            && p.token() == token.as_slice()
            && p.option(OptionNumber::OBSERVE).and_then(|o| o.uint()) == Some(1)
        {
            deregistered = true;
            // answer it, so that the client need not retransmit
            let mid = p.message_id();
            let mut a = vec![0x60 | token.len() as u8, 0x45, (mid >> 8) as u8, mid as u8];
            a.extend_from_slice(&token);
            let _ = server.send_to(&a, from);
        }
    }
    let st = child.wait().unwrap();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    assert!(deregistered, "no deregistration after SIGINT; {err}");
    assert_eq!(st.code(), Some(0), "{err}");
}
