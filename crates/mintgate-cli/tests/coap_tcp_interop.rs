//! CoAP over TCP (RFC 8323) between `mintgate serve` / `mintgate get` and
//! peers no one here wrote: libcoap's `coap-client-notls` and
//! `coap-server-notls` (Debian libcoap3-bin, 4.3.1) and aiocoap's client
//! (scripts/test.sh installs it into target/py-venv); then the gateway's
//! answers to bad input over a raw socket (no CSM first, a frame over its
//! Max-Message-Size, a half-sent frame) and its per-source bound.
//!
//! Under MINTGATE_REQUIRE_PEERS=1 a missing peer fails the test.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_tcp, free_udp, mintgate, tmp_dir, write_config, Serve};
use mintgate_coap::wire::tcp::frame_len;
use mintgate_coap::wire::{Code, Framing, Signal, TcpPacket};

fn have(cmd: &str, what: &str) -> bool {
    common::have_command(cmd, what)
}

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

/// `mintgate serve` with CoAP over UDP and TCP on loopback; `rest` is more
/// of the `[coap]` table. Returns the server and the TCP address.
fn serve_tcp(tag: &str, rest: &str) -> (Serve, SocketAddr) {
    let dir = tmp_dir(tag);
    let tcp: SocketAddr = format!("127.0.0.1:{}", free_tcp()).parse().unwrap();
    let udp = free_udp();
    let cfg = write_config(&dir, udp, &format!("tcp_bind = [\"{tcp}\"]\n{rest}"));
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );
    (s, tcp)
}

fn run(cmd: &mut Command) -> (String, String, bool) {
    let out = cmd.output().expect("run the client");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

fn libcoap(method: &str, uri: &str, payload: Option<&str>) -> String {
    let mut c = Command::new("coap-client-notls");
    c.args(["-B", "5", "-m", method]);
    if let Some(p) = payload {
        c.args(["-e", p]);
    }
    let (o, e, _) = run(c.arg(uri));
    format!("{o}{e}")
}

#[test]
fn libcoap_client_over_tcp_against_serve() {
    if !have("coap-client-notls", "Debian libcoap3-bin") {
        return;
    }
    let (_s, tcp) = serve_tcp("tcp-libcoap", "");
    let uri = |p: &str| format!("coap+tcp://{tcp}/{p}");
    assert_eq!(libcoap("get", &uri("request"), None).trim(), "hello world");
    let o = libcoap("put", &uri("echo"), Some("over tcp"));
    assert!(!o.contains("4.") && !o.contains("5."), "PUT: {o}");
    assert_eq!(libcoap("get", &uri("echo"), None).trim(), "over tcp");
    assert_eq!(
        libcoap("post", &uri("echo"), Some("posted")).trim(),
        "posted"
    );
    assert!(libcoap("get", &uri("no/such"), None).contains("4.04"));
    assert!(libcoap("put", &uri("request"), Some("x")).contains("4.05"));
    let wk = libcoap("get", &uri(".well-known/core"), None);
    assert!(wk.contains("</request>") && wk.contains("</echo>"), "{wk}");
}

#[test]
fn aiocoap_client_over_tcp_against_serve() {
    let Some(aio) = aiocoap_client() else {
        return;
    };
    let (_s, tcp) = serve_tcp("tcp-aiocoap", "");
    aiocoap_get_put_get(&aio, &|p| format!("coap+tcp://{tcp}/{p}"));
}

/// aiocoap-client's GET /request, PUT /echo, GET /echo at `uri(path)`.
fn aiocoap_get_put_get(aio: &std::path::Path, uri: &dyn Fn(&str) -> String) {
    let (o, e, ok) = run(Command::new(aio).arg(uri("request")));
    assert!(ok, "{e}");
    assert_eq!(o.trim(), "hello world");
    let (_, e, ok) = run(Command::new(aio)
        .args(["-m", "PUT", "--payload", "from aiocoap"])
        .arg(uri("echo")));
    assert!(ok, "PUT: {e}");
    let (o, e, ok) = run(Command::new(aio).arg(uri("echo")));
    assert!(ok, "{e}");
    assert_eq!(o.trim(), "from aiocoap");
}

struct Child9(Child);

impl Drop for Child9 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn mintgate_client_over_tcp_against_libcoap_server() {
    if !have("coap-server-notls", "Debian libcoap3-bin") {
        return;
    }
    let port = free_tcp();
    let _srv = Child9(
        Command::new("coap-server-notls")
            .args(["-A", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start coap-server-notls"),
    );
    common::wait_tcp(port, Duration::from_secs(10));
    let uri = |p: &str| format!("coap+tcp://127.0.0.1:{port}/{p}");
    let out = mintgate(&["get", &uri(""), "--timeout", "5s"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("libcoap"),
        "{out:?}"
    );
    let out = mintgate(&[
        "put",
        &uri("example_data"),
        "-e",
        "from mintgate",
        "--timeout",
        "5s",
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = mintgate(&[
        "get",
        &uri("example_data"),
        "--timeout",
        "5s",
        "--count",
        "3",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from mintgate\n".repeat(3)
    );
    let out = mintgate(&["get", &uri("no/such"), "--timeout", "5s"]);
    assert_eq!(out.status.code(), Some(3), "4.04 exits 3: {out:?}");
}

#[test]
fn mintgate_client_over_tcp_against_serve() {
    let (_s, tcp) = serve_tcp("tcp-mintgate", "");
    let out = mintgate(&["get", &format!("coap+tcp://{tcp}/request"), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let j = String::from_utf8_lossy(&out.stdout);
    assert!(
        j.contains("\"code\":\"2.05\"") && j.contains("hello world"),
        "{j}"
    );
}

/// Reads frames from `s` until it closes or `limit` passes.
fn read_frames(s: &mut TcpStream, limit: Duration) -> Vec<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + limit;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while Instant::now() < end {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let mut v = Vec::new();
    let mut rest = &buf[..];
    while let Ok(Some(n)) = frame_len(rest) {
        let n = n as usize;
        if n > rest.len() {
            break;
        }
        v.push(rest[..n].to_vec());
        rest = &rest[n..];
    }
    v
}

fn codes(frames: &[Vec<u8>]) -> Vec<Code> {
    frames
        .iter()
        .map(|f| {
            TcpPacket::new_checked(&f[..], Framing::Stream)
                .unwrap()
                .code()
        })
        .collect()
}

fn our_csm() -> Vec<u8> {
    let mut v = Vec::new();
    Signal::Csm {
        max_message_size: Some(1152),
        block_wise: false,
    }
    .emit_vec(Framing::Stream, &[], &mut v);
    v
}

#[test]
fn bad_input_over_tcp_is_aborted_and_connections_are_bounded() {
    let (s, tcp) = serve_tcp(
        "tcp-bad",
        "tcp_max_per_source = 2\ntcp_max_message_size = 1152\ntcp_frame_timeout_ms = 300\n",
    );
    // a request before any CSM: CSM, then Abort, then the close
    let mut c = TcpStream::connect(tcp).unwrap();
    c.write_all(&[0x51, 0x01, 0xAA, 0xB1, b'a', 0xFF, b'h', b'i'])
        .unwrap();
    let f = read_frames(&mut c, Duration::from_secs(3));
    assert_eq!(codes(&f), [Code::CSM, Code::ABORT], "no CSM first");
    let p = TcpPacket::new_checked(&f[0][..], Framing::Stream).unwrap();
    assert_eq!(
        Signal::parse(&p),
        Ok(Signal::Csm {
            max_message_size: Some(1152),
            block_wise: false
        })
    );

    // a frame that announces 70,000 bytes: refused from its header
    let mut c = TcpStream::connect(tcp).unwrap();
    let mut m = our_csm();
    m.extend([0xE1, 0x00, 0x10, Code::PUT.0, 0x01]);
    c.write_all(&m).unwrap();
    assert_eq!(
        codes(&read_frames(&mut c, Duration::from_secs(3))),
        [Code::CSM, Code::ABORT],
        "too large"
    );

    // a Ping is answered with a Pong carrying its token; a half-sent frame
    // is aborted after tcp_frame_timeout_ms
    let mut c = TcpStream::connect(tcp).unwrap();
    let mut m = our_csm();
    Signal::Ping { custody: false }.emit_vec(Framing::Stream, b"pg", &mut m);
    m.extend([0x51, 0x01]);
    c.write_all(&m).unwrap();
    let f = read_frames(&mut c, Duration::from_secs(3));
    assert_eq!(codes(&f), [Code::CSM, Code::PONG, Code::ABORT], "stalled");
    assert_eq!(
        TcpPacket::new_checked(&f[1][..], Framing::Stream)
            .unwrap()
            .token(),
        b"pg"
    );

    // two connections from one source are served, a third is closed at once
    // (the aborted ones above gave their places back when the server
    // closed them)
    std::thread::sleep(Duration::from_millis(300));
    let mut a = TcpStream::connect(tcp).unwrap();
    let mut b = TcpStream::connect(tcp).unwrap();
    let mut cc = TcpStream::connect(tcp).unwrap();
    assert!(
        read_frames(&mut cc, Duration::from_secs(2)).is_empty(),
        "third served"
    );
    for s in [&mut a, &mut b] {
        s.write_all(&our_csm()).unwrap();
        s.write_all(&[
            0x81, 0x01, 0x07, 0xB7, b'r', b'e', b'q', b'u', b'e', b's', b't',
        ])
        .unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(
            codes(&read_frames(s, Duration::from_secs(3))),
            [Code::CSM, Code::CONTENT]
        );
    }
    drop(s);
}

// ---- CoAP over WebSockets (RFC 8323 section 4, `coap+ws`)

/// `mintgate serve --coap-ws` on loopback; `rest` is more of the `[coap]`
/// table. Returns the server and the WebSocket listener's address.
fn serve_ws(tag: &str, rest: &str) -> (Serve, SocketAddr) {
    let dir = tmp_dir(tag);
    let ws: SocketAddr = format!("127.0.0.1:{}", free_tcp()).parse().unwrap();
    let udp = free_udp();
    let cfg = write_config(&dir, udp, rest);
    let mut s = Serve::start(
        &cfg,
        &dir.join("serve.log"),
        &["--coap-ws", &ws.to_string()],
    );
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );
    (s, ws)
}

#[test]
fn aiocoap_client_over_ws_against_serve() {
    let Some(aio) = aiocoap_client() else {
        return;
    };
    let (_s, ws) = serve_ws("ws-aiocoap", "");
    let uri = |p: &str| format!("coap+ws://{ws}/{p}");
    aiocoap_get_put_get(&aio, &uri);
    let (o, e, _) = run(Command::new(&aio).arg(uri("no/such")));
    assert!(format!("{o}{e}").contains("4.04"), "4.04: {o}{e}");
    let (o, e, ok) = run(Command::new(&aio).arg(uri(".well-known/core")));
    assert!(ok, "{e}");
    assert!(o.contains("</request>") && o.contains("</echo>"), "{o}");
}

/// A WebSocket client of our own making's connection, upgraded with
/// `protocol` (None: no Sec-WebSocket-Protocol) at `path`.
fn ws_connect(
    ws: SocketAddr,
    path: &str,
    protocol: Option<&str>,
) -> Result<tungstenite::WebSocket<TcpStream>, String> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{ws}{path}").into_client_request().unwrap();
    if let Some(p) = protocol {
        req.headers_mut()
            .insert("sec-websocket-protocol", p.parse().unwrap());
    }
    let s = TcpStream::connect(ws).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    match tungstenite::client(req, s) {
        Ok((c, _)) => Ok(c),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
            Err(r.status().as_u16().to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The CoAP codes of the binary messages read until the close (at most
/// `limit`).
fn ws_codes(c: &mut tungstenite::WebSocket<TcpStream>, limit: Duration) -> Vec<Code> {
    let end = Instant::now() + limit;
    let mut v = Vec::new();
    while Instant::now() < end {
        match c.read() {
            Ok(tungstenite::Message::Binary(m)) => v.push(
                TcpPacket::new_checked(&m[..], Framing::WebSocket)
                    .unwrap()
                    .code(),
            ),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    v
}

fn ws_csm() -> tungstenite::Message {
    let mut v = Vec::new();
    Signal::Csm {
        max_message_size: Some(1152),
        block_wise: false,
    }
    .emit_vec(Framing::WebSocket, &[], &mut v);
    tungstenite::Message::binary(v)
}

/// GET /request in WebSocket framing (Len 0, token "t").
fn ws_get() -> tungstenite::Message {
    tungstenite::Message::binary([&[0x01, Code::GET.0, b't', 0xB7][..], b"request"].concat())
}

/// Whether the server closes `s` (EOF or reset) within `limit`, and what
/// it said first.
fn closed_within(s: &mut TcpStream, limit: Duration) -> (bool, String) {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + limit;
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    while Instant::now() < end {
        match s.read(&mut b) {
            Ok(0) => return (true, String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (true, String::from_utf8_lossy(&got).into_owned()),
        }
    }
    (false, String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn bad_input_over_ws_is_refused_or_aborted_and_serving_goes_on() {
    let (s, ws) = serve_ws(
        "ws-bad",
        "tcp_max_message_size = 1152\ntcp_frame_timeout_ms = 300\n",
    );
    // the upgrade: the well-known path and the coap subprotocol, or no
    assert_eq!(
        ws_connect(ws, "/other", Some("coap")).err().as_deref(),
        Some("404")
    );
    assert_eq!(
        ws_connect(ws, "/.well-known/coap", None).err().as_deref(),
        Some("400"),
        "no subprotocol"
    );
    assert_eq!(
        ws_connect(ws, "/.well-known/coap", Some("mqtt"))
            .err()
            .as_deref(),
        Some("400"),
        "wrong subprotocol"
    );
    // no upgrade at all: a CoAP-over-TCP CSM, a plain HTTP GET
    let mut c = TcpStream::connect(ws).unwrap();
    c.write_all(&our_csm()).unwrap();
    assert!(closed_within(&mut c, Duration::from_secs(3)).0, "raw CoAP");
    let mut c = TcpStream::connect(ws).unwrap();
    c.write_all(b"GET /.well-known/coap HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (closed, said) = closed_within(&mut c, Duration::from_secs(3));
    assert!(closed && !said.contains(" 101 "), "no upgrade: {said}");
    // an upgrade request that never ends (stalled) or is too long
    let mut c = TcpStream::connect(ws).unwrap();
    c.write_all(b"GET /.well-known/coap HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut c, Duration::from_secs(3)).0, "stalled");
    assert!(t.elapsed() >= Duration::from_millis(250));
    let mut c = TcpStream::connect(ws).unwrap();
    let long = format!(
        "GET /.well-known/coap HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n",
        "a".repeat(20_000)
    );
    let _ = c.write_all(long.as_bytes());
    assert!(closed_within(&mut c, Duration::from_secs(3)).0, "too long");

    // upgraded: a request before the CSM gets CSM, Abort, close
    let mut c = ws_connect(ws, "/.well-known/coap", Some("coap")).unwrap();
    c.send(ws_get()).unwrap();
    assert_eq!(
        ws_codes(&mut c, Duration::from_secs(3)),
        [Code::CSM, Code::ABORT],
        "no CSM first"
    );
    // a message over our Max-Message-Size (1152): Abort
    let mut c = ws_connect(ws, "/.well-known/coap", Some("coap")).unwrap();
    c.send(ws_csm()).unwrap();
    let mut big = vec![0x01, Code::PUT.0, b't', 0xFF];
    big.resize(1153, b'x');
    c.send(tungstenite::Message::binary(big)).unwrap();
    assert_eq!(
        ws_codes(&mut c, Duration::from_secs(3)),
        [Code::CSM, Code::ABORT],
        "too large"
    );
    // a text message: Abort
    let mut c = ws_connect(ws, "/.well-known/coap", Some("coap")).unwrap();
    c.send(ws_csm()).unwrap();
    c.send(tungstenite::Message::text("hello")).unwrap();
    assert_eq!(
        ws_codes(&mut c, Duration::from_secs(3)),
        [Code::CSM, Code::ABORT],
        "text"
    );

    // serving goes on: CSM, a GET, a Ping, each message on its own
    let mut c = ws_connect(ws, "/.well-known/coap", Some("coap")).unwrap();
    c.send(ws_csm()).unwrap();
    c.send(ws_get()).unwrap();
    let mut ping = Vec::new();
    Signal::Ping { custody: false }.emit_vec(Framing::WebSocket, b"pg", &mut ping);
    c.send(tungstenite::Message::binary(ping)).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        match c.read().unwrap() {
            tungstenite::Message::Binary(m) => got.push(m.to_vec()),
            _ => continue,
        }
    }
    let p = TcpPacket::new_checked(&got[1][..], Framing::WebSocket).unwrap();
    assert_eq!(
        (p.code(), p.payload()),
        (Code::CONTENT, &b"hello world"[..])
    );
    let p = TcpPacket::new_checked(&got[2][..], Framing::WebSocket).unwrap();
    assert_eq!((p.code(), p.token()), (Code::PONG, &b"pg"[..]));
    drop(s);
}
