//! `mintgate netem` in front of `mintgate serve`, driven by `mintgate get`.

use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(args: &[&str]) -> Kill {
    Kill(
        Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mintgate"),
    )
}

fn get(uri: &str, extra: &[&str]) -> (i32, String, Duration) {
    let t = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["get", uri])
        .args(extra)
        .output()
        .expect("run mintgate get");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        t.elapsed(),
    )
}

fn wait_answer(uri: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if get(uri, &["--timeout", "1s"]).1.contains("hello world") {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{uri} never answered");
}

#[test]
fn delay_shows_in_the_round_trip_and_full_loss_times_out() {
    let (sp, rp, lp) = (port(), port(), port());
    let _srv = spawn(&[
        "serve",
        "--coap",
        &format!("127.0.0.1:{sp}"),
        "--pool",
        "fixed:1",
    ]);
    wait_answer(&format!("coap://127.0.0.1:{sp}/request"));
    let fwd = format!("127.0.0.1:{sp}");
    let _relay = spawn(&[
        "netem",
        "--listen",
        &format!("127.0.0.1:{rp}"),
        "--forward",
        &fwd,
        "--delay",
        "60ms",
    ]);
    let uri = format!("coap://127.0.0.1:{rp}/request");
    wait_answer(&uri);
    let (code, out, took) = get(&uri, &[]);
    assert_eq!((code, out.trim()), (0, "hello world"));
    assert!(
        took >= Duration::from_millis(120),
        "two 60 ms legs, took {took:?}"
    );
    let _lossy = spawn(&[
        "netem",
        "--listen",
        &format!("127.0.0.1:{lp}"),
        "--forward",
        &fwd,
        "--loss",
        "100%",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let (code, _, _) = get(
        &format!("coap://127.0.0.1:{lp}/request"),
        &["--timeout", "1s"],
    );
    assert_eq!(code, 5, "everything dropped: no response");
}

#[test]
fn tcp_relay_delays_each_way_and_refuses_loss() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let fwd = server.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Some(Ok(mut s)) = server.incoming().next() {
            let mut r = s.try_clone().unwrap();
            let _ = std::io::copy(&mut r, &mut s);
        }
    });
    let rp = port();
    let listen = format!("127.0.0.1:{rp}");
    let _relay = spawn(&[
        "netem",
        "--tcp",
        "--listen",
        &listen,
        "--forward",
        &fwd,
        "--delay",
        "30ms",
    ]);
    let end = Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        match TcpStream::connect(&listen) {
            Ok(c) => break c,
            Err(e) if Instant::now() > end => panic!("relay never listened: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    c.read_exact(&mut b).unwrap();
    let took = t.elapsed();
    assert_eq!(&b, b"ping");
    assert!(
        took >= Duration::from_millis(60),
        "two 30 ms legs: {took:?}"
    );

    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["netem", "--tcp", "--listen", "127.0.0.1:0"])
        .args(["--forward", &fwd, "--loss", "5%"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--tcp models delay only"), "{err}");
}

/// Arguments that cannot work are usage errors, not a relay that loops or
/// a loss model that divides by zero.
#[test]
fn a_relay_to_itself_and_bursts_under_one_are_refused() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .arg("netem")
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[
        "--listen",
        "127.0.0.1:25800",
        "--forward",
        "127.0.0.1:25800",
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("send to itself"));
    let o = run(&[
        "--listen",
        "127.0.0.1:25800",
        "--forward",
        "127.0.0.1:25801",
        "--burst",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
