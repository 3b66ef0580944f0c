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
