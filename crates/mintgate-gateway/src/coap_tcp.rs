//! CoAP over TCP (RFC 8323, `coap+tcp`): the listeners and connection
//! threads around the sans-IO [`Connection`].
//!
//! One accept thread per `coap.tcp_bind` address and one thread per open
//! connection, bounded in all (`tcp_max_connections`) and per source
//! (`tcp_max_per_source`, an IPv4 address or an IPv6 /64): a connection
//! over either bound is closed as soon as it is accepted, and counted. A
//! connection reads with a short timeout so that a half-sent frame
//! (`tcp_frame_timeout_ms`), an idle peer (`tcp_idle_timeout_s`) and
//! shutdown are noticed; writes time out too, so a peer that never reads
//! holds at most one read's worth of answers before it is dropped.
//! Requests are answered by the same router, resources and access rules
//! as over UDP (the caller's `serve`).
//!
//! `coaps+tcp` (RFC 8323 section 4.2) is the same over TLS (rustls, TLS
//! 1.2 and 1.3, ALPN `coap`): the handshake runs in the connection's thread
//! under the same read timeouts, so a peer that stalls it is dropped like
//! one that stalls a frame (no CSM within the frame timeout). A verified
//! client certificate's common name is the requests' identity, as a DTLS
//! one is over coaps.
//!
//! `coap+ws` (RFC 8323 section 4: CoAP over WebSockets, `coap.ws_bind`)
//! shares all of this: the accept loop, the connection bounds, the
//! timeouts and the counters. A connection first completes an HTTP/1.1
//! upgrade (tungstenite's sync handshake) for the path `/.well-known/coap`
//! with the subprotocol `coap` (RFC 8323 4.3; anything else gets 404 or
//! 400), within `tcp_frame_timeout_ms` and [`WS_MAX_HANDSHAKE`] bytes;
//! then each binary WebSocket message is one CoAP message without the
//! length field, held to our Max-Message-Size by tungstenite's own message
//! and frame limits. `coaps+ws` (`coaps.ws_bind`) is the same over TLS.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_coap::server::source::Source;
use mintgate_coap::server::tcp::{AbortReason, Closed, Connection, ConnectionConfig};
use mintgate_coap::server::{Answer, Request};
use mintgate_coap::wire::tcp::FrameError;
use mintgate_coap::wire::Framing;
use parking_lot::Mutex;

/// Bytes a WebSocket client may send before its upgrade is complete (the
/// HTTP request and anything it sends before our answer).
pub const WS_MAX_HANDSHAKE: usize = 16 * 1024;

/// What a listener speaks.
#[derive(Clone)]
pub enum Transport {
    /// `coap+tcp`.
    Tcp,
    /// `coaps+tcp`: TLS with this configuration.
    Tls(Arc<rustls::ServerConfig>),
    /// `coap+ws`: WebSockets at `/.well-known/coap`.
    Ws,
    /// `coaps+ws`: WebSockets over TLS with this configuration.
    Wss(Arc<rustls::ServerConfig>),
}

impl Transport {
    fn name(&self) -> &'static str {
        match self {
            Transport::Tcp => "coap-tcp",
            Transport::Tls(_) => "coaps-tcp",
            Transport::Ws => "coap-ws",
            Transport::Wss(_) => "coaps-ws",
        }
    }
}

/// Answers one request (in RFC 7252 form) with at most the given payload.
pub type Serve = Arc<dyn Fn(&Request<'_>, usize) -> Answer + Send + Sync>;

/// How often a connection thread wakes to check its timers and shutdown.
const TICK: Duration = Duration::from_millis(100);

/// Limits of the CoAP-over-TCP listeners.
#[derive(Clone, Debug)]
pub struct TcpSettings {
    /// Connections open at once, in all.
    pub max_connections: usize,
    /// Connections open at once per source.
    pub max_per_source: usize,
    /// The connection's settings (Max-Message-Size, frame timeout).
    pub connection: ConnectionConfig,
    /// Nothing received for this long: Release and close.
    pub idle_timeout: Duration,
}

/// Counters of the CoAP-over-TCP listeners.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Connections accepted and served.
    pub accepted: AtomicU64,
    /// Connections closed at once: over a connection bound.
    pub refused: AtomicU64,
    /// Connections we aborted (malformed, too large, no CSM, stalled).
    pub aborted: AtomicU64,
    /// Requests answered.
    pub requests: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
}

impl TcpStats {
    /// The counters in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let v = |a: &AtomicU64| a.load(Relaxed);
        crate::metrics::write_families(
            out,
            &[
                ("mintgate_coap_tcp_connections", "CoAP-over-TCP and -WebSocket connections open (coap+tcp, coaps+tcp, coap+ws, coaps+ws).", v(&self.open)),
                ("mintgate_coap_tcp_accepted_total", "CoAP-over-TCP connections accepted.", v(&self.accepted)),
                ("mintgate_coap_tcp_refused_total", "CoAP-over-TCP connections closed at once (over tcp_max_connections or tcp_max_per_source).", v(&self.refused)),
                ("mintgate_coap_tcp_aborted_total", "CoAP-over-TCP connections aborted (malformed frame, frame over Max-Message-Size, no CSM first, bad CSM, stalled frame; over WebSockets also an upgrade refused or not completed in time).", v(&self.aborted)),
                ("mintgate_coap_tcp_requests_total", "Requests answered over CoAP over TCP.", v(&self.requests)),
            ],
        );
    }
}

/// The running listeners.
pub struct TcpServer {
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<TcpStats>,
}

struct Shared {
    settings: TcpSettings,
    transport: Transport,
    serve: Serve,
    stop: Arc<AtomicBool>,
    stats: Arc<TcpStats>,
    /// Open connections per source.
    sources: Mutex<HashMap<Source, usize>>,
}

impl TcpServer {
    /// Binds every address and starts the accept threads, speaking
    /// `transport`.
    pub fn start(
        binds: &[SocketAddr],
        settings: TcpSettings,
        transport: Transport,
        serve: Serve,
        stats: Arc<TcpStats>,
    ) -> io::Result<TcpServer> {
        let listeners = binds
            .iter()
            .map(|a| {
                // blocking: a connection is taken the moment it comes;
                // stop() wakes the thread with a connection of its own
                TcpListener::bind(a)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let addrs = listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<io::Result<Vec<_>>>()?;
        let stop = Arc::new(AtomicBool::new(false));
        let scheme = transport.name();
        let sh = Arc::new(Shared {
            settings,
            transport,
            serve,
            stop: stop.clone(),
            stats: stats.clone(),
            sources: Mutex::new(HashMap::new()),
        });
        let mut threads = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let sh = sh.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{scheme}-{i}"))
                    .spawn(move || accept_loop(&sh, l))?,
            );
        }
        Ok(TcpServer {
            addrs,
            stop,
            threads,
            stats,
        })
    }

    /// The bound addresses (with the ports the OS chose for `:0`).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<TcpStats> {
        &self.stats
    }

    /// Stops accepting; open connections get a Release and close within a
    /// tick.
    pub fn stop(&mut self) {
        self.stop.store(true, Relaxed);
        for a in &self.addrs {
            let mut to = *a;
            if to.ip().is_unspecified() {
                to.set_ip(match to {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            let _ = TcpStream::connect_timeout(&to, Duration::from_secs(1));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(sh: &Arc<Shared>, l: TcpListener) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Relaxed) {
        match l.accept() {
            Ok(_) if sh.stop.load(Relaxed) => break,
            Ok((s, peer)) => {
                conns.retain(|t| !t.is_finished());
                let Some(slot) = admit(sh, peer) else {
                    sh.stats.refused.fetch_add(1, Relaxed);
                    drop(s);
                    continue;
                };
                let sh2 = sh.clone();
                match std::thread::Builder::new()
                    .name(format!("{}-conn", sh.transport.name()))
                    .spawn(move || {
                        let _slot = slot;
                        serve_connection(&sh2, s, peer);
                    }) {
                    Ok(t) => conns.push(t),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start a coap+tcp connection thread")
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "coap+tcp accept");
                std::thread::sleep(TICK / 2);
            }
        }
    }
    for t in conns {
        let _ = t.join();
    }
}

/// A place among the open connections, given back when dropped.
struct Slot {
    sh: Arc<Shared>,
    source: Source,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.sh.sources.lock();
        if let Some(n) = m.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.source);
            }
        }
        self.sh.stats.open.fetch_sub(1, Relaxed);
    }
}

fn admit(sh: &Arc<Shared>, peer: SocketAddr) -> Option<Slot> {
    let source = Source::of(&peer);
    let mut m = sh.sources.lock();
    let total: usize = m.values().sum();
    let mine = m.get(&source).copied().unwrap_or(0);
    if total >= sh.settings.max_connections || mine >= sh.settings.max_per_source {
        return None;
    }
    m.insert(source, mine + 1);
    sh.stats.open.fetch_add(1, Relaxed);
    sh.stats.accepted.fetch_add(1, Relaxed);
    Some(Slot {
        sh: sh.clone(),
        source,
    })
}

/// Writes out what the connection has to say; false when the peer does
/// not take it within the write timeout.
fn flush(s: &mut impl Write, c: &mut Connection) -> bool {
    let n = c.output().len();
    if n == 0 {
        return true;
    }
    let ok = s.write_all(c.output()).and_then(|()| s.flush()).is_ok();
    c.consume_output(n);
    ok
}

fn serve_connection(sh: &Shared, s: TcpStream, peer: SocketAddr) {
    let set = &sh.settings;
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    if s.set_read_timeout(Some(TICK)).is_err()
        || s.set_write_timeout(Some(set.connection.frame_timeout))
            .is_err()
    {
        return;
    }
    match &sh.transport {
        Transport::Tcp => run(sh, s, peer, |_| None),
        Transport::Ws => run_ws(sh, s, peer, |_| None),
        Transport::Tls(cfg) => {
            if let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) {
                run(sh, TlsStream::new(conn, s), peer, tls_identity);
            }
        }
        Transport::Wss(cfg) => {
            if let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) {
                run_ws(sh, TlsStream::new(conn, s), peer, tls_identity);
            }
        }
    }
}

type TlsStream = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// Who a TLS peer proved to be: its verified certificate's common name.
fn tls_identity(t: &TlsStream) -> Option<String> {
    t.conn
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| common_name(c.as_ref()))
}

/// The common name of a DER certificate (the subject when it has none).
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .map(str::to_owned);
    Some(cn.unwrap_or_else(|| subject.to_string()))
}

/// Shuts a stream's connection down (TCP: both ways; TLS: close_notify
/// first).
trait Shut {
    fn shut(&mut self);
}

impl Shut for TcpStream {
    fn shut(&mut self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

impl Shut for TlsStream {
    fn shut(&mut self) {
        self.conn.send_close_notify();
        let _ = self.conn.complete_io(&mut self.sock);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Hands `c` what came in (`input` calls the connection with the serve
/// function), answering its requests as the peer `who`, and counts them.
fn feed(
    sh: &Shared,
    c: &mut Connection,
    who: Option<&str>,
    input: impl FnOnce(&mut Connection, &mut dyn FnMut(&Request<'_>, usize) -> Answer),
) {
    let serve = &*sh.serve;
    let before = c.stats().requests;
    input(c, &mut |r, max| {
        let r = Request {
            peer: r.peer,
            packet: r.packet,
            identity: r.identity.or(who),
        };
        serve(&r, max)
    });
    sh.stats
        .requests
        .fetch_add(c.stats().requests - before, Relaxed);
}

/// A read that timed out: the connection's timers and the idle bound.
fn tick(sh: &Shared, c: &mut Connection, now: Instant, last: Instant) {
    c.handle_timeout(now);
    if now.duration_since(last) >= sh.settings.idle_timeout {
        c.release();
    }
}

/// Counts a connection that ended in our Abort.
fn count_end(sh: &Shared, c: &Connection, peer: SocketAddr) {
    if let Some(Closed::Aborted(why)) = c.closed() {
        sh.stats.aborted.fetch_add(1, Relaxed);
        tracing::debug!(%peer, ?why, "coap over tcp/ws connection aborted");
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// The connection's loop over stream `s`; `identity` says who the peer
/// proved to be (read after each receive: a TLS handshake completes on the
/// way).
fn run<S: Read + Write + Shut>(
    sh: &Shared,
    mut s: S,
    peer: SocketAddr,
    identity: impl Fn(&S) -> Option<String>,
) {
    let set = &sh.settings;
    let mut c = Connection::new(Framing::Stream, peer, set.connection.clone());
    let mut buf = vec![0u8; 4096];
    let mut last = Instant::now();
    let mut who: Option<String> = None;
    let mut ok = flush(&mut s, &mut c);
    while ok && c.closed().is_none() {
        if sh.stop.load(Relaxed) {
            c.release();
            break;
        }
        let now = Instant::now();
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                last = now;
                if who.is_none() {
                    who = identity(&s);
                }
                feed(sh, &mut c, who.as_deref(), |c, serve| {
                    c.receive(now, &buf[..n], serve)
                });
            }
            Err(e) if would_block(&e) => tick(sh, &mut c, now, last),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "coap over tcp/tls: read");
                break;
            }
        }
        ok = flush(&mut s, &mut c);
    }
    if ok {
        flush(&mut s, &mut c);
    }
    count_end(sh, &c, peer);
    s.shut();
}

/// A stream that counts the bytes read and refuses to read past `budget`
/// (the WebSocket upgrade's size bound).
struct Metered<S> {
    inner: S,
    read: u64,
    budget: u64,
}

impl<S: Read> Read for Metered<S> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        let room = self.budget.saturating_sub(self.read);
        if room == 0 {
            return Err(io::Error::other("WebSocket upgrade request too large"));
        }
        let take = b.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut b[..take])?;
        self.read += n as u64;
        Ok(n)
    }
}

impl<S: Write> Write for Metered<S> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.inner.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The upgrade check of RFC 8323 4.3: the well-known path and the `coap`
/// subprotocol, which the answer then names.
// the shape of tungstenite's handshake Callback, called once per upgrade
#[allow(clippy::result_large_err)]
fn ws_upgrade(
    req: &tungstenite::handshake::server::Request,
    mut resp: tungstenite::handshake::server::Response,
) -> Result<tungstenite::handshake::server::Response, tungstenite::handshake::server::ErrorResponse>
{
    use tungstenite::http::{HeaderValue, Response, StatusCode};
    let refuse = |code: StatusCode, why: &str| {
        let mut r = Response::new(Some(format!("{why}\n")));
        *r.status_mut() = code;
        r
    };
    if req.uri().path() != "/.well-known/coap" {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "CoAP over WebSockets is at /.well-known/coap",
        ));
    }
    let coap = req
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == "coap");
    if !coap {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "the WebSocket subprotocol coap is required (RFC 8323 4.3)",
        ));
    }
    resp.headers_mut()
        .insert("sec-websocket-protocol", HeaderValue::from_static("coap"));
    Ok(resp)
}

/// Sends each whole message the connection has as one binary WebSocket
/// message; false when the peer does not take them.
fn send_ws<S: Read + Write>(ws: &mut tungstenite::WebSocket<S>, c: &mut Connection) -> bool {
    while let Some(m) = c.next_message() {
        let n = m.len();
        let sent = ws.send(tungstenite::Message::binary(m.to_vec()));
        c.consume_output(n);
        if sent.is_err() {
            return false;
        }
    }
    true
}

/// The loop of a `coap+ws` connection over stream `s`: the upgrade
/// (bounded in time and bytes), then one CoAP message per binary
/// WebSocket message.
fn run_ws<S: Read + Write + Shut>(
    sh: &Shared,
    s: S,
    peer: SocketAddr,
    identity: impl Fn(&S) -> Option<String>,
) {
    use tungstenite::handshake::HandshakeError;
    use tungstenite::{Error as WsError, Message};
    let set = &sh.settings;
    let max = set.connection.max_message_size as usize;
    let cfg = tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let deadline = Instant::now() + set.connection.frame_timeout;
    let metered = Metered {
        inner: s,
        read: 0,
        budget: WS_MAX_HANDSHAKE as u64,
    };
    let mut hs = tungstenite::accept_hdr_with_config(metered, ws_upgrade, Some(cfg));
    let mut ws = loop {
        match hs {
            Ok(ws) => break ws,
            Err(HandshakeError::Interrupted(mut mid)) => {
                if Instant::now() >= deadline || sh.stop.load(Relaxed) {
                    // a stalled upgrade: dropped like a stalled frame
                    sh.stats.aborted.fetch_add(1, Relaxed);
                    mid.get_mut().get_mut().inner.shut();
                    return;
                }
                hs = mid.handshake();
            }
            Err(HandshakeError::Failure(e)) => {
                tracing::debug!(%peer, error = %e, "coap+ws upgrade refused");
                sh.stats.aborted.fetch_add(1, Relaxed);
                return;
            }
        }
    };
    ws.get_mut().budget = u64::MAX;
    let who = identity(&ws.get_ref().inner);
    let mut c = Connection::new(Framing::WebSocket, peer, set.connection.clone());
    let mut last = Instant::now();
    // bytes read since the last whole message, and since when: a message
    // begun and not finished within the frame timeout is aborted
    let (mut at_msg, mut partial_since) = (ws.get_ref().read, None::<Instant>);
    let mut ok = send_ws(&mut ws, &mut c);
    while ok && c.closed().is_none() {
        if sh.stop.load(Relaxed) {
            c.release();
            break;
        }
        let now = Instant::now();
        let r = ws.read();
        if !matches!(&r, Err(WsError::Io(e)) if would_block(e)) {
            at_msg = ws.get_ref().read;
            partial_since = None;
        }
        match r {
            Ok(Message::Binary(m)) => {
                last = now;
                feed(sh, &mut c, who.as_deref(), |c, serve| {
                    c.receive_message(&m, serve)
                });
            }
            Ok(Message::Text(_)) => {
                // RFC 8323 4.4: CoAP travels in binary messages only
                c.abort(AbortReason::Malformed(FrameError::WebSocketLength));
            }
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => last = now,
            Ok(Message::Close(_)) => break,
            Err(WsError::Io(e)) if would_block(&e) => {
                if ws.get_ref().read > at_msg {
                    let since = *partial_since.get_or_insert(now);
                    if now.duration_since(since) >= set.connection.frame_timeout {
                        c.abort(AbortReason::Stalled);
                    }
                }
                tick(sh, &mut c, now, last);
            }
            Err(WsError::Capacity(_)) => c.abort(AbortReason::TooLarge),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "coap+ws: read");
                if matches!(
                    e,
                    WsError::Protocol(_) | WsError::Utf8 | WsError::AttackAttempt
                ) {
                    sh.stats.aborted.fetch_add(1, Relaxed);
                }
                break;
            }
        }
        ok = send_ws(&mut ws, &mut c);
    }
    if ok {
        send_ws(&mut ws, &mut c);
        let _ = ws.close(None);
        let _ = ws.flush();
    }
    count_end(sh, &c, peer);
    ws.get_mut().inner.shut();
}

/// The TLS configuration of the `coaps+tcp` listeners: `chain` and `key`
/// (PEM files), TLS 1.2 and 1.3, ALPN `coap`; with `client_ca`, client
/// certificates are verified against it (and required when `require`).
pub fn tls_config(
    chain: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
    require: bool,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| format!("a CA certificate in {}: {e}", ca.display()))?;
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let v = if require {
                v
            } else {
                v.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(
                v.build()
                    .map_err(|e| format!("the client certificate verifier: {e}"))?,
            )
        }
        None => builder.with_no_client_auth(),
    };
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("reading a private key from {}: {e}", key.display()))?;
    let mut cfg = builder
        .with_single_cert(certs(chain)?, key)
        .map_err(|e| format!("the certificate and key: {e}"))?;
    cfg.alpn_protocols = vec![b"coap".to_vec()];
    Ok(Arc::new(cfg))
}

/// The certificates of a PEM file, at least one.
fn certs(p: &std::path::Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let v: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(p)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("reading certificates from {}: {e}", p.display()))?;
    if v.is_empty() {
        return Err(format!("no certificate in {}", p.display()));
    }
    Ok(v)
}

/// The TLS configuration of a `coaps+tcp` client (`mintgate get
/// coaps+tcp://...`): the server's certificate must chain to `ca` (PEM)
/// and name the host; with `cert` and `key`, a client certificate; TLS 1.2
/// and 1.3, ALPN `coap` (RFC 8323 4.1).
pub fn client_tls_config(
    ca: &std::path::Path,
    cert_key: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca)? {
        roots
            .add(c)
            .map_err(|e| format!("a CA certificate in {}: {e}", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots);
    let mut cfg = match cert_key {
        Some((chain, key)) => {
            let k = rustls::pki_types::PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("reading a private key from {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(certs(chain)?, k)
                .map_err(|e| format!("the client certificate and key: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"coap".to_vec()];
    Ok(Arc::new(cfg))
}
