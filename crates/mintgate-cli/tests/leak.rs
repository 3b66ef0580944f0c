//! A leak check of the whole process: `mintgate serve` under valgrind's
//! memcheck for a few seconds while requests come in (GET, PUT, POST on
//! /echo, a malformed datagram, a ping), then SIGTERM. Memcheck must report
//! no definitely lost block and no memory error.
//!
//! Needs valgrind (Debian package `valgrind`, installed by scripts/test.sh);
//! skipped when it is missing unless MINTGATE_REQUIRE_PEERS is set.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// valgrind's exit code when it found an error (a definite leak included).
const ERROR_EXIT: i32 = 97;

fn have_valgrind() -> bool {
    let found = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "valgrind is required (MINTGATE_REQUIRE_PEERS is set) but not on PATH"
        );
        eprintln!("skipping: valgrind (Debian package valgrind) is not on PATH");
    }
    found
}

/// One request; the answer's bytes, if any came within `wait`.
fn exchange(sock: &UdpSocket, to: SocketAddr, req: &[u8], wait: Duration) -> Option<Vec<u8>> {
    sock.set_read_timeout(Some(wait)).unwrap();
    sock.send_to(req, to).ok()?;
    let mut buf = [0u8; 1500];
    let n = sock.recv(&mut buf).ok()?;
    Some(buf[..n].to_vec())
}

/// A CON request with one Uri-Path segment and an optional payload.
fn con(code: u8, mid: u16, path: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut m = vec![0x40, code];
    m.extend_from_slice(&mid.to_be_bytes());
    m.push(0xB0 | path.len() as u8);
    m.extend_from_slice(path);
    if !payload.is_empty() {
        m.push(0xFF);
        m.extend_from_slice(payload);
    }
    m
}

#[test]
fn serve_under_valgrind_has_no_definite_leak() {
    if !have_valgrind() {
        return;
    }
    let started = Instant::now();
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let log = std::env::temp_dir().join(format!("mintgate-valgrind-{}.log", std::process::id()));
    let mut child = Command::new("valgrind")
        .arg("--leak-check=full")
        .arg("--errors-for-leak-kinds=definite")
        .arg(format!("--error-exitcode={ERROR_EXIT}"))
        .arg(format!("--log-file={}", log.display()))
        .arg(env!("CARGO_BIN_EXE_mintgate"))
        .args(["--log", "warn", "serve", "--coap", &to.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start valgrind");
    let pid = child.id();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();

    // under memcheck start-up takes seconds
    let mut mid = 1u16;
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        let r = exchange(
            &sock,
            to,
            &con(0x01, mid, b"request", &[]),
            Duration::from_millis(500),
        );
        mid += 1;
        if r.is_some_and(|a| a.ends_with(b"hello world")) {
            break;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("valgrind exited early ({st:?}); see {}", log.display());
        }
        assert!(Instant::now() < end, "no answer under valgrind within 40 s");
    }
    let wait = Duration::from_secs(2);
    let mut answered = 0;
    for i in 0..10u16 {
        let body = format!("value {i}");
        let reqs = [
            con(0x03, mid, b"echo", body.as_bytes()), // PUT
            con(0x01, mid + 1, b"echo", &[]),         // GET
            con(0x02, mid + 2, b"echo", b"posted"),   // POST
            con(0x01, mid + 3, b"request", &[]),      // GET
            con(0x01, mid + 3, b"request", &[]),      // its duplicate: replayed
        ];
        mid += 4;
        for r in &reqs {
            answered += exchange(&sock, to, r, wait).is_some() as usize;
        }
    }
    // a ping (Reset expected) and a malformed CON (Reset expected)
    answered += exchange(&sock, to, &[0x40, 0x00, 0x12, 0x34], wait).is_some() as usize;
    answered += exchange(&sock, to, &[0x40, 0x01, 0x12, 0x35, 0xFF], wait).is_some() as usize;
    assert!(answered >= 45, "only {answered} of 52 requests answered");

    // SAFETY: signalling our own child (valgrind passes it to the program).
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("no exit within 30 s of SIGTERM; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let report = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!(
        "{}\n(valgrind run took {:.1} s)",
        report
            .lines()
            .filter(|l| l.contains("lost:") || l.contains("ERROR SUMMARY"))
            .collect::<Vec<_>>()
            .join("\n"),
        started.elapsed().as_secs_f64()
    );
    assert_ne!(
        status.code(),
        Some(ERROR_EXIT),
        "memcheck found errors or definite leaks:\n{report}"
    );
    assert!(status.success(), "{status:?}\n{report}");
    assert!(
        report.contains("definitely lost: 0 bytes") || report.contains("no leaks are possible"),
        "no clean leak summary:\n{report}"
    );
    let _ = std::fs::remove_file(&log);
}
