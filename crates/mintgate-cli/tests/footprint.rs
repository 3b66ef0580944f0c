//! The footprint of a real `mintgate serve` process with the default
//! configuration: resident memory idle and under a short saturating load
//! within the bounds (16 MiB, 64 MiB), every pool block back within
//! 10 s of the load stopping, and a clean exit on SIGTERM. The bounds are
//! loose for a short run; `mintgate lab footprint` prints the figures of
//! the release build.
//!
//! This runs the debug executable, whose code alone makes about 12 MiB of
//! file pages resident (the release one, 3.3 MiB): the idle bound is
//! checked on the anonymous memory (RssAnon: heap, stacks, touched pool
//! pages), the loaded bound on the whole VmHWM.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mintgate_lab::footprint::{metric_sum, proc_mem, IDLE_TARGET, LOAD_TARGET};
use mintgate_loadgen::{LoadSpec, Mode};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A CON GET /request; true when `hello world` came back.
fn get(to: SocketAddr, mid: u16) -> bool {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut req = vec![0x40, 0x01];
    req.extend_from_slice(&mid.to_be_bytes());
    req.push(0xB7);
    req.extend_from_slice(b"request");
    if s.send_to(&req, to).is_err() {
        return false;
    }
    let mut buf = [0u8; 256];
    matches!(s.recv(&mut buf), Ok(n) if buf[..n].ends_with(b"hello world"))
}

fn outstanding(metrics: SocketAddr) -> f64 {
    metric_sum(metrics, "mintgate_pool_outstanding_blocks")
        .expect("the metrics endpoint answers")
        .expect("mintgate_pool_outstanding_blocks is exposed")
}

#[test]
fn serve_stays_within_its_memory_bounds_and_returns_every_block() {
    let coap: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["--log", "warn", "serve", "--coap"])
        .arg(coap.to_string())
        .arg("--metrics")
        .arg(metrics.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mintgate serve");
    let mut server = Server(child);
    let pid = server.0.id();
    let end = Instant::now() + Duration::from_secs(20);
    let mut mid = 1;
    while !get(coap, mid) {
        assert!(Instant::now() < end, "mintgate serve did not answer");
        mid += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let idle = proc_mem(pid).expect("/proc status of the server");
    eprintln!("idle: {idle:?}");
    assert!(idle.anon > 0 && idle.anon <= IDLE_TARGET, "idle {idle:?}");

    // a short saturating load: 8 clients keeping 16 NON requests each in flight
    let mut spec = LoadSpec::new(
        coap,
        "/request",
        Mode::Closed {
            clients: 8,
            window: 16,
        },
    );
    spec.duration = Duration::from_secs(3);
    spec.warmup = Duration::from_millis(500);
    let report = mintgate_loadgen::run(&spec, |_| {}).expect("the load runs");
    let loaded = proc_mem(pid).expect("/proc status of the server");
    eprintln!(
        "after load: {loaded:?}, {:.0} answers/s",
        report.requests_per_sec
    );
    assert!(report.received > 0, "no answer under load");
    assert!(loaded.hwm <= LOAD_TARGET, "under load {loaded:?}");

    // every block back within 10 s (the receiver lets go of its spare
    // blocks after 100 ms without datagrams)
    let stop = Instant::now();
    let mut left = outstanding(metrics);
    while left != 0.0 && stop.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        left = outstanding(metrics);
    }
    assert_eq!(left, 0.0, "blocks still outstanding 10 s after the load");

    // SIGTERM: a clean stop
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = server.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < end, "no exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
