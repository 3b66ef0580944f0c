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
    // a 6,000-byte representation: its first 1024-byte block, then the
    // rest in one BERT message (RFC 8323 section 6), over TCP and over
    // WebSockets; libcoap (no BERT) fetches the same in 1024-byte blocks
    let body: String = (0..6000).map(|i| (b'A' + (i % 26) as u8) as char).collect();
    let dir = tmp_dir("tcp-bert");
    let f = dir.join("body.txt");
    std::fs::write(&f, &body).unwrap();
    let out = mintgate(&[
        "put",
        "--payload-file",
        f.to_str().unwrap(),
        &format!("coap+tcp://{tcp}/echo"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = mintgate(&["get", "--verbose", &format!("coap+tcp://{tcp}/echo")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), body);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("6000 bytes in 2 messages (BERT)"), "{e}");
    if have("coap-client-notls", "libcoap3-bin") {
        let got = libcoap("get", &format!("coap+tcp://{tcp}/echo"), None);
        assert_eq!(got.trim_end(), body);
    }
}

/// Appends what `s` sends within `limit` to `buf`; true when it closed
/// (end of stream or an error) first.
fn read_into(s: &mut TcpStream, buf: &mut Vec<u8>, limit: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let end = Instant::now() + limit;
    let mut chunk = [0u8; 4096];
    while Instant::now() < end {
        match s.read(&mut chunk) {
            Ok(0) => return true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Reads frames from `s` until it closes or `limit` passes.
fn read_frames(s: &mut TcpStream, limit: Duration) -> Vec<Vec<u8>> {
    let mut buf = Vec::new();
    read_into(s, &mut buf, limit);
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
            block_wise: true
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

#[test]
fn mintgate_client_over_ws_against_serve() {
    let (_s, ws) = serve_ws("ws-mintgate", "");
    let uri = |p: &str| format!("coap+ws://{ws}/{p}");
    // three requests on one connection, each answered over WebSockets
    let out = mintgate(&["get", "--verbose", "--count", "3", &uri("request")]);
    assert!(out.status.success(), "{out:?}");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(o.matches("hello world").count(), 3, "{o}");
    assert_eq!(e.matches("<- WebSocket 2.05").count(), 3, "{e}");
    let out = mintgate(&["put", "-e", "over ws", &uri("echo")]);
    assert!(out.status.success(), "{out:?}");
    let out = mintgate(&["get", &uri("echo")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "over ws");
    let out = mintgate(&["get", &uri("no/such")]);
    assert_eq!(out.status.code(), Some(3), "4.04: {out:?}");
    // a plain TCP listener is not a WebSocket one: the upgrade fails
    let (_t, tcp) = serve_tcp("ws-not-tcp", "");
    let out = mintgate(&[
        "get",
        "--timeout",
        "3s",
        &format!("coap+ws://{tcp}/request"),
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("WebSocket upgrade"),
        "{out:?}"
    );
}

/// CoAP over WebSockets on the HTTP listener (`proxy.http`, with
/// `proxy.coap_ws` on by default): aiocoap and mintgate's client upgrade
/// at /.well-known/coap on the port that serves HTTP, and HTTP requests go
/// on being answered there; no `coap.ws_bind` is set. With `coap_ws =
/// false` the upgrade is the proxy's 404.
#[test]
fn coap_over_websockets_shares_the_http_port() {
    let dir = tmp_dir("ws-on-http");
    let web = free_tcp();
    let udp = free_udp();
    let cfg = write_config(&dir, udp, &format!("[proxy]\nhttp = \"127.0.0.1:{web}\"\n"));
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );
    common::wait_tcp(web, Duration::from_secs(10));
    let uri = |p: &str| format!("coap+ws://127.0.0.1:{web}/{p}");
    if let Some(aio) = aiocoap_client() {
        aiocoap_get_put_get(&aio, &uri);
    }
    let out = mintgate(&["get", "--count", "2", &uri("request")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("hello world")
            .count(),
        2
    );
    let (st, _, body) = common::http(
        web,
        "GET",
        &format!("/hc/coap://127.0.0.1:{udp}/request"),
        &[],
        b"",
    );
    assert_eq!((st, body.trim()), (200, "hello world"));
    // an HTTP GET of the path without an upgrade gets no CoAP: the
    // WebSocket server refuses the handshake
    let (st, _, _) = common::http(web, "GET", "/.well-known/coap", &[], b"");
    assert_ne!(st, 200);
    // web pages: another origin, or a Host that is not the gateway's (DNS
    // rebinding), is refused; the gateway's own origin is not
    let upgrade = |extra: &str| {
        let mut t = TcpStream::connect(("127.0.0.1", web)).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            t,
            "GET /.well-known/coap HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Protocol: coap\r\n{extra}\r\n"
        )
        .unwrap();
        let mut head = [0u8; 12];
        t.read_exact(&mut head).unwrap();
        String::from_utf8_lossy(&head[9..12]).into_owned()
    };
    let own = format!("Host: 127.0.0.1:{web}\r\n");
    assert_eq!(
        upgrade(&format!("{own}Origin: http://evil.example\r\n")),
        "403"
    );
    assert_eq!(upgrade("Host: evil.example:8080\r\n"), "403");
    assert_eq!(
        upgrade(&format!("{own}Origin: http://127.0.0.1:{web}\r\n")),
        "101"
    );
    assert_eq!(upgrade(&own), "101");
    s.terminate(Duration::from_secs(10));

    let web = free_tcp();
    let udp = free_udp();
    let cfg = write_config(
        &dir,
        udp,
        &format!("[proxy]\nhttp = \"127.0.0.1:{web}\"\ncoap_ws = false\n"),
    );
    let mut s = Serve::start(&cfg, &dir.join("serve2.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );
    common::wait_tcp(web, Duration::from_secs(10));
    let out = mintgate(&[
        "get",
        "--timeout",
        "3s",
        &format!("coap+ws://127.0.0.1:{web}/request"),
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404"),
        "{out:?}"
    );
    s.terminate(Duration::from_secs(10));
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
    let mut got = Vec::new();
    let closed = read_into(s, &mut got, limit);
    (closed, String::from_utf8_lossy(&got).into_owned())
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

// ---- Observe over TCP and WebSockets (RFC 8323 7.2 with RFC 7641)

/// `mintgate serve` with a simulated sensor (`sensors/temp0`) whose value
/// moves every `period` (e.g. `500ms`), `coap+tcp` and `coap+ws` listeners and `/metrics`,
/// all on loopback; `rest` is more of the `[coap]` table. Returns the server, the TCP and WebSocket addresses and
/// the metrics port.
fn serve_sensor(tag: &str, period: &str, rest: &str) -> (Serve, SocketAddr, SocketAddr, u16) {
    let dir = tmp_dir(tag);
    let tcp: SocketAddr = format!("127.0.0.1:{}", free_tcp()).parse().unwrap();
    let ws: SocketAddr = format!("127.0.0.1:{}", free_tcp()).parse().unwrap();
    let metrics = free_tcp();
    let udp = free_udp();
    let cfg = write_config(
        &dir,
        udp,
        &format!(
            "tcp_bind = [\"{tcp}\"]\nws_bind = [\"{ws}\"]\n{rest}\
             [[devices.list]]\nname = \"temp0\"\nkind = \"sim-sensor\"\n\
             signal = \"walk(20, 0.5, 0, 40)\"\nperiod = \"{period}\"\n"
        ),
    );
    let mut s = Serve::start(
        &cfg,
        &dir.join("serve.log"),
        &["--metrics", &format!("127.0.0.1:{metrics}")],
    );
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );
    (s, tcp, ws, metrics)
}

/// The Observe figures of `/metrics`: relations now, and relations ended
/// by (deregistration, connection closed).
fn observe_metrics(port: u16) -> (f64, f64, f64) {
    let (_, _, text) = common::http(port, "GET", "/metrics", &[], b"");
    let m = |n: &str| common::metric(&text, n).unwrap_or(-1.0);
    (
        m("mintgate_observe_observers"),
        m("mintgate_observe_ended_total{reason=\"deregistered\"}"),
        m("mintgate_observe_ended_total{reason=\"closed\"}"),
    )
}

/// Polls `/metrics` (every 50 ms, at most `limit`) until `ok` holds for
/// the Observe figures; they are returned either way.
fn wait_metrics(
    port: u16,
    limit: Duration,
    ok: impl Fn((f64, f64, f64)) -> bool,
) -> (f64, f64, f64) {
    let end = Instant::now() + limit;
    loop {
        let m = observe_metrics(port);
        if ok(m) || Instant::now() >= end {
            return m;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts an observing client with its output piped, killed on drop.
fn start_observer(cmd: &mut Command) -> Child9 {
    Child9(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the observing client"),
    )
}

#[test]
fn libcoap_client_observes_a_sensor_over_tcp() {
    if !have("coap-client-notls", "Debian libcoap3-bin") {
        return;
    }
    let (_s, tcp, _, metrics) = serve_sensor("tcp-observe-libcoap", "500ms", "");
    assert_eq!(observe_metrics(metrics).0, 0.0);
    // -s 5: observe for 5 s; -A 50: ask for JSON, one object a message
    let mut child = start_observer(
        Command::new("coap-client-notls")
            .args(["-s", "5", "-A", "50", "-m", "get"])
            .arg(format!("coap+tcp://{tcp}/sensors/temp0")),
    );
    // the relation is there while the client runs
    let during = wait_metrics(metrics, Duration::from_secs(4), |m| m.0 == 1.0);
    assert_eq!(during.0, 1.0, "relations while observing: {during:?}");
    let end = Instant::now() + Duration::from_secs(15);
    while child.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "coap-client-notls did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let values: Vec<f64> = out
        .split("\"v\":")
        .skip(1)
        .map(|s| s.split([',', '}']).next().unwrap().trim().parse().unwrap())
        .collect();
    // the response and a notification about every 500 ms for 5 s
    assert!(values.len() >= 4, "{} messages: {out}", values.len());
    assert!(
        values.windows(2).any(|w| w[0] != w[1]),
        "the values change: {values:?}"
    );
    // the client is gone: so is its relation (deregistered or closed)
    let after = wait_metrics(metrics, Duration::from_secs(5), |m| m.0 == 0.0);
    assert_eq!(after.0, 0.0, "relations after: {after:?}");
    assert_eq!(after.1 + after.2, 1.0, "ended once: {after:?}");
    eprintln!(
        "libcoap over tcp: {} messages, ended {after:?}",
        values.len()
    );
}

#[test]
fn aiocoap_observes_a_sensor_over_ws_and_the_close_ends_the_relation() {
    let Some(py) = common::venv_python("aiocoap") else {
        return;
    };
    if common::venv_python("websockets").is_none() {
        return;
    }
    let (_s, _, ws, metrics) = serve_sensor("ws-observe-aiocoap", "500ms", "");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/observe_aiocoap.py");
    let mut child = start_observer(
        Command::new(py)
            .arg(script)
            .arg(format!("coap+ws://{ws}/sensors/temp0")),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // the response, then three notifications (one every 500 ms)
    let end = Instant::now() + Duration::from_secs(15);
    let mut lines = Vec::new();
    while lines.len() < 4 {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.0.kill();
                let mut e = String::new();
                let _ = child.0.stderr.take().unwrap().read_to_string(&mut e);
                panic!("{lines:?} within 15 s; stderr: {e}");
            }
        }
    }
    assert!(lines[0].starts_with("first 2.05 Content "), "{lines:?}");
    let seqs: Vec<u32> = lines
        .iter()
        .map(|l| l.split(' ').nth(if l.starts_with("first") { 3 } else { 1 }))
        .map(|s| s.unwrap().parse().unwrap())
        .collect();
    assert!(
        lines[1..].iter().all(|l| l.starts_with("note ")),
        "{lines:?}"
    );
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "Observe rises: {lines:?}"
    );
    let values: Vec<&str> = lines
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert!(
        values.windows(2).any(|w| w[0] != w[1]),
        "the values change: {lines:?}"
    );
    assert_eq!(observe_metrics(metrics).0, 1.0);
    // the client goes away without a word: the connection's close ends it
    let _ = child.0.kill();
    let _ = child.0.wait();
    let after = wait_metrics(metrics, Duration::from_secs(5), |m| m.0 == 0.0);
    assert_eq!(after.0, 0.0, "relations after: {after:?}");
    assert_eq!(after.2, 1.0, "ended by the close: {after:?}");
}

/// A GET of sensors/temp0 in stream framing with token `token` and, when
/// given, the Observe value `observe`.
fn observe_get(token: &[u8], observe: Option<u8>) -> Vec<u8> {
    use mintgate_coap::wire::{OptionNumber, RawOption, TcpRepr};
    let obs = observe.map(|v| if v == 0 { vec![] } else { vec![v] });
    let mut options = Vec::new();
    if let Some(v) = &obs {
        options.push(RawOption {
            number: OptionNumber::OBSERVE,
            value: &v[..],
        });
    }
    for seg in ["sensors", "temp0"] {
        options.push(RawOption {
            number: OptionNumber::URI_PATH,
            value: seg.as_bytes(),
        });
    }
    let mut v = Vec::new();
    TcpRepr {
        code: Code::GET,
        token,
        options,
        payload: &[],
    }
    .emit_vec(Framing::Stream, &mut v)
    .unwrap();
    v
}

/// (code, token, Observe value) of each frame read from `s` within
/// `limit`; bytes of a frame not complete yet stay in `buf`.
fn read_messages(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    limit: Duration,
) -> Vec<(Code, Vec<u8>, Option<u32>)> {
    use mintgate_coap::wire::{decode_uint, OptionNumber};
    read_into(s, buf, limit);
    let mut v = Vec::new();
    while let Ok(Some(n)) = frame_len(buf) {
        let n = n as usize;
        if n > buf.len() {
            break;
        }
        let f: Vec<u8> = buf.drain(..n).collect();
        let p = TcpPacket::new_checked(&f[..], Framing::Stream).unwrap();
        let obs = p
            .options()
            .find(|o| o.number == OptionNumber::OBSERVE)
            .and_then(|o| decode_uint(o.value));
        v.push((p.code(), p.token().to_vec(), obs));
    }
    v
}

#[test]
fn observe_over_tcp_keeps_the_source_cap_and_ends_on_observe_1_and_on_close() {
    let (_s, tcp, _, metrics) =
        serve_sensor("tcp-observe-raw", "500ms", "observe_max_per_source = 2\n");
    let mut c = TcpStream::connect(tcp).unwrap();
    let mut m = our_csm();
    for t in [b"a", b"b", b"c"] {
        m.extend(observe_get(t, Some(0)));
    }
    c.write_all(&m).unwrap();
    let mut buf = Vec::new();
    let got = read_messages(&mut c, &mut buf, Duration::from_millis(2200));
    assert_eq!(got.first().map(|m| m.0), Some(Code::CSM));
    assert!(got[1..].iter().all(|m| m.0 == Code::CONTENT), "{got:?}");
    // a and b are registered, c is over the source's share: a plain answer
    // and nothing after it
    let of = |tok: &[u8]| -> Vec<Option<u32>> {
        got.iter().filter(|m| m.1 == tok).map(|m| m.2).collect()
    };
    assert_eq!(of(b"c"), [None], "{got:?}");
    // then notifications (about one every 500 ms) for a and b, rising
    for tok in [b"a", b"b"] {
        let seqs: Vec<u32> = of(tok).into_iter().map(|s| s.unwrap()).collect();
        assert!(seqs.len() >= 3, "{got:?}");
        assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{got:?}");
    }
    // Observe: 1 ends a; b goes on
    c.write_all(&observe_get(b"a", Some(1))).unwrap();
    let got = read_messages(&mut c, &mut buf, Duration::from_millis(1500));
    // the answer (no Observe option), and nothing for a after it
    let answer = got
        .iter()
        .position(|m| m.1 == b"a" && m.2.is_none())
        .expect("answered");
    let rest = &got[answer + 1..];
    assert!(rest.iter().all(|m| m.1 == b"b"), "{got:?}");
    assert!(rest.len() >= 2, "{got:?}");
    let (_, _, text) = common::http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(
        common::metric(&text, "mintgate_observe_refused_source_total"),
        Some(1.0)
    );
    let m = observe_metrics(metrics);
    assert_eq!((m.0, m.1, m.2), (1.0, 1.0, 0.0), "{m:?}");
    // the close ends b
    drop(c);
    let m = wait_metrics(metrics, Duration::from_secs(3), |m| m.0 == 0.0);
    assert_eq!((m.0, m.1, m.2), (0.0, 1.0, 1.0), "{m:?}");
}

#[test]
fn a_tcp_observer_that_never_reads_gets_at_most_one_notification_a_tick() {
    // a sensor sampled every millisecond: up to 1,000 notifications a second
    let (_s, tcp, _, metrics) = serve_sensor("tcp-observe-stuck", "1ms", "");
    let mut c = TcpStream::connect(tcp).unwrap();
    let mut m = our_csm();
    m.extend(observe_get(b"s", Some(0)));
    c.write_all(&m).unwrap();
    let during = wait_metrics(metrics, Duration::from_secs(5), |m| m.0 == 1.0);
    assert_eq!(during.0, 1.0, "{during:?}");
    // never read from for 2 s: what waits for the connection is its one
    // relation's newest notification, written once a tick (100 ms); the
    // rest is dropped and counted, nothing piles up
    let t = Instant::now();
    let figures = || {
        let (_, _, text) = common::http(metrics, "GET", "/metrics", &[], b"");
        let m = |n: &str| common::metric(&text, n).unwrap();
        (
            m("mintgate_coap_tcp_notifications_total"),
            m("mintgate_coap_tcp_notifications_dropped_total"),
        )
    };
    let (sent0, dropped0) = figures();
    std::thread::sleep(Duration::from_secs(2));
    let (sent1, dropped1) = figures();
    let ticks = t.elapsed().as_millis() as f64 / 100.0;
    let (sent, dropped) = (sent1 - sent0, dropped1 - dropped0);
    eprintln!(
        "never-reading observer: {sent} notifications written, {dropped} dropped in {ticks} ticks"
    );
    assert!(
        sent >= 1.0 && sent <= ticks + 2.0,
        "{sent} written in {ticks} ticks"
    );
    assert!(dropped > sent, "{dropped} dropped, {sent} written");
    // serving goes on, Observe included, and the close ends the relation
    let mut d = TcpStream::connect(tcp).unwrap();
    let mut m = our_csm();
    m.extend(observe_get(b"t", Some(0)));
    d.write_all(&m).unwrap();
    let mut buf = Vec::new();
    let got = read_messages(&mut d, &mut buf, Duration::from_millis(500));
    assert!(got.iter().filter(|m| m.1 == b"t").count() >= 2, "{got:?}");
    drop((c, d));
    let after = wait_metrics(metrics, Duration::from_secs(3), |m| m.0 == 0.0);
    assert_eq!((after.0, after.2), (0.0, 2.0), "{after:?}");
}

/// A client that begins the CoAP-over-WebSockets request line on the HTTP
/// port and stops (`GET /.well-known/co`, then nothing) holds its slot for
/// one header timeout counted from the accept, not longer: the listener's
/// peek gives up at that deadline, the connection is closed and counted as
/// a header timeout, and its slot serves the next client.
#[test]
fn a_stalled_partial_coap_ws_request_line_is_closed_at_the_header_timeout() {
    let dir = tmp_dir("ws-peek-stall");
    let (web, udp, metrics) = (free_tcp(), free_udp(), free_tcp());
    let cfg = write_config(
        &dir,
        udp,
        &format!(
            "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [proxy]\nhttp = \"127.0.0.1:{web}\"\nheader_timeout_ms = 600\n\
             max_connections_per_source = 2\n"
        ),
    );
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );
    common::wait_tcp(web, Duration::from_secs(10));
    let timeouts = || {
        let (_, _, m) = common::http(metrics, "GET", "/metrics", &[], b"");
        common::metric(
            &m,
            "mintgate_proxy_connections_closed_total{reason=\"header_timeouts\"}",
        )
        .unwrap_or_else(|| panic!("no header_timeouts in {m}"))
    };
    let before = timeouts();
    // both of this source's slots, each stalled inside the prefix
    let t0 = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut t = TcpStream::connect(("127.0.0.1", web)).unwrap();
            t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            t.write_all(b"GET /.well-known/co").unwrap();
            t
        })
        .collect();
    // while they hold the slots, a third connection is refused at once
    let (st, _, _) = common::http(web, "GET", "/healthz", &[], b"");
    assert_eq!(st, 0, "the source's two slots are taken");
    for t in &mut stalled {
        let mut b = [0u8; 64];
        // closed (EOF or reset) by the gateway, not by our read timeout
        match t.read(&mut b) {
            Ok(0) | Err(_) => {}
            Ok(n) => panic!("answered {:?}", String::from_utf8_lossy(&b[..n])),
        }
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(4),
        "closed after {waited:?}"
    );
    assert!(timeouts() >= before + 2.0, "{}", s.log_text());
    // the slots are back: a whole request is answered
    let (st, _, _) = common::http(web, "GET", "/healthz", &[], b"");
    assert_eq!(st, 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
