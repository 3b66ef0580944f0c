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
//! The HTTP listener (`proxy.http`) hands over the connections whose first
//! request is `GET /.well-known/coap` ([`Adopter`], `proxy.coap_ws`), so
//! `coap+ws` also answers on the HTTP port, under the same bounds.
//!
//! Observe (RFC 7641 over RFC 8323 7.2) works on all four: each connection
//! has a listener index of its own in the endpoint's one Observe registry,
//! and its notifications come to it through an [`Outboxes`] entry (see
//! there for how that is bounded). The relations of a connection end when
//! it closes.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_coap::server::observe::{Token, RELIABLE};
use mintgate_coap::server::source::Source;
use mintgate_coap::server::tcp::{AbortReason, Closed, Connection, ConnectionConfig};
use mintgate_coap::server::{Answer, Request};
use mintgate_coap::wire::tcp::FrameError;
use mintgate_coap::wire::{Framing, Packet};
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

/// Answers one request (in RFC 7252 form) with at most the given payload;
/// the last argument is the connection's listener index (for Observe, see
/// [`Outboxes`]).
pub type Serve = Arc<dyn Fn(&Request<'_>, usize, usize) -> Answer + Send + Sync>;

/// Notifications an outbox holds at most (one per relation; see
/// [`Outboxes`]).
pub const OUTBOX_MESSAGES: usize = 16;

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
    /// Host names (besides IP literals and `localhost`) a WebSocket
    /// upgrade's `Host` and `Origin` may carry (`proxy.allowed_hosts`).
    pub allowed_hosts: Vec<String>,
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
    /// Observe notifications sent on connections.
    pub notifications: AtomicU64,
    /// Observe notifications dropped: a newer one for the same relation
    /// replaced it, the outbox was full, or it was larger than the peer's
    /// Max-Message-Size.
    pub notifications_dropped: AtomicU64,
}

impl TcpStats {
    /// The counters, for `/metrics`.
    pub fn collect(&self, m: &mut crate::exposition::Exposition) {
        let v = |a: &AtomicU64| a.load(Relaxed);
        m.families(&[
                ("mintgate_coap_tcp_connections", "CoAP-over-TCP and -WebSocket connections open (coap+tcp, coaps+tcp, coap+ws, coaps+ws).", v(&self.open)),
                ("mintgate_coap_tcp_accepted_total", "CoAP-over-TCP connections accepted.", v(&self.accepted)),
                ("mintgate_coap_tcp_refused_total", "CoAP-over-TCP connections closed at once (over tcp_max_connections or tcp_max_per_source).", v(&self.refused)),
                ("mintgate_coap_tcp_aborted_total", "CoAP-over-TCP connections aborted (malformed frame, frame over Max-Message-Size, no CSM first, bad CSM, stalled frame; over WebSockets also an upgrade refused or not completed in time).", v(&self.aborted)),
                ("mintgate_coap_tcp_requests_total", "Requests answered over CoAP over TCP.", v(&self.requests)),
                ("mintgate_coap_tcp_notifications_total", "Observe notifications sent over CoAP over TCP and WebSockets.", v(&self.notifications)),
                ("mintgate_coap_tcp_notifications_dropped_total", "Observe notifications over CoAP over TCP and WebSockets not sent: superseded by a newer one of the same relation before the connection took it, its outbox full, or larger than the peer's Max-Message-Size.", v(&self.notifications_dropped)),
            ]);
    }
}

/// Observe over the reliable transports: the notifications waiting for
/// their connections, one bounded outbox per open connection, found by the
/// connection's listener index (at or above [`RELIABLE`], the index its
/// relations carry in the endpoint's Observe registry).
///
/// Bounded, and never blocking the notifier: the one notifier thread serves
/// every observer (over UDP too), so it must not wait for a connection
/// whose peer does not read. [`Outboxes::push`] therefore never waits: an
/// outbox keeps one notification per relation (a newer one for the same
/// token replaces the one waiting, as a newer state replaces a notification
/// not yet delivered in RFC 7641 4.5.2) and at most [`OUTBOX_MESSAGES`] in
/// all, dropping the oldest when full; drops are counted. Observe needs
/// only the latest state, so dropping is better than closing here. The
/// connection's thread moves what waits into its connection after each
/// read or tick (so at most one tick, 100 ms, later, and a relation whose
/// resource changes faster gets its newest state once a tick) and writes
/// it under the connection's write timeout (`tcp_frame_timeout_ms`): a
/// peer that does not take it in that time is disconnected, and its
/// relations end. A client that never reads thus holds one outbox and the
/// socket's buffers, never more.
pub struct Outboxes {
    next: AtomicUsize,
    open: Mutex<HashMap<usize, Arc<Mutex<Waiting>>>>,
    stats: Arc<TcpStats>,
    on_close: Box<dyn Fn(usize) + Send + Sync>,
}

type Waiting = VecDeque<(Token, Vec<u8>)>;

impl Outboxes {
    /// No connection yet; `on_close` is called with a connection's listener
    /// index when it closes (its Observe relations end).
    pub fn new(stats: Arc<TcpStats>, on_close: impl Fn(usize) + Send + Sync + 'static) -> Self {
        Outboxes {
            next: AtomicUsize::new(0),
            open: Mutex::new(HashMap::new()),
            stats,
            on_close: Box::new(on_close),
        }
    }

    /// An outbox for a new connection, closed when dropped.
    pub fn open(self: &Arc<Self>) -> Outbox {
        // RELIABLE is a power of two: the low bits number the connections
        let id = RELIABLE | (self.next.fetch_add(1, Relaxed) & (RELIABLE - 1));
        let waiting = Arc::new(Mutex::new(VecDeque::new()));
        self.open.lock().insert(id, waiting.clone());
        Outbox {
            id,
            waiting,
            owner: self.clone(),
        }
    }

    /// Connections with an outbox now.
    pub fn len(&self) -> usize {
        self.open.lock().len()
    }

    /// True when no connection has an outbox.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Leaves notification `udp` (RFC 7252 form) for connection `id`;
    /// never waits. Nothing happens when the connection has closed.
    pub fn push(&self, id: usize, udp: Vec<u8>) {
        let Some(w) = self.open.lock().get(&id).cloned() else {
            return;
        };
        let Ok(token) = Packet::new_checked(&udp[..]).map(|p| Token::new(p.token())) else {
            return;
        };
        let mut w = w.lock();
        let mut dropped = 0;
        if let Some(i) = w.iter().position(|(t, _)| *t == token) {
            w.remove(i);
            dropped += 1;
        }
        w.push_back((token, udp));
        while w.len() > OUTBOX_MESSAGES {
            w.pop_front();
            dropped += 1;
        }
        drop(w);
        self.stats.notifications_dropped.fetch_add(dropped, Relaxed);
    }
}

/// One connection's outbox (see [`Outboxes`]); dropping it closes it and
/// ends the connection's Observe relations.
pub struct Outbox {
    id: usize,
    waiting: Arc<Mutex<Waiting>>,
    owner: Arc<Outboxes>,
}

impl Outbox {
    /// The connection's listener index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Moves the notifications waiting into `c`, counting them; returns
    /// how many it took.
    pub fn deliver(&self, c: &mut Connection) -> usize {
        let waiting = std::mem::take(&mut *self.waiting.lock());
        let mut sent = 0;
        for (_, m) in &waiting {
            if c.notify(m) {
                sent += 1;
            }
        }
        let stats = &self.owner.stats;
        stats.notifications.fetch_add(sent as u64, Relaxed);
        stats
            .notifications_dropped
            .fetch_add((waiting.len() - sent) as u64, Relaxed);
        sent
    }

    /// Notifications waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().len()
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.owner.open.lock().remove(&self.id);
        (self.owner.on_close)(self.id);
    }
}

/// The running listeners.
pub struct TcpServer {
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<TcpStats>,
    shared: Arc<Shared>,
}

/// Takes connections another listener accepted into a [`TcpServer`]:
/// the HTTP listener hands over a WebSocket upgrade to `/.well-known/coap`
/// (RFC 8323 4), its request still unread, so CoAP over WebSockets shares
/// the HTTP port. Cheap to clone.
#[derive(Clone)]
pub struct Adopter(Arc<Shared>);

impl Adopter {
    /// Serves `s`, from `peer`, as a connection accepted by the server's
    /// own listener: the same bounds (a connection over them is closed and
    /// counted as refused), timeouts and counters. False when refused.
    pub fn adopt(&self, s: TcpStream, peer: SocketAddr) -> bool {
        let sh = &self.0;
        // under the lock that `stop` takes to join them: a connection is
        // either refused here or joined there, never left running
        let mut adopted = sh.adopted.lock();
        if sh.stop.load(Relaxed) {
            return false;
        }
        let Some(slot) = admit(sh, peer) else {
            sh.stats.refused.fetch_add(1, Relaxed);
            return false;
        };
        adopted.retain(|t| !t.is_finished());
        match spawn_connection(sh, s, peer, slot) {
            Some(t) => {
                adopted.push(t);
                true
            }
            None => false,
        }
    }
}

struct Shared {
    settings: TcpSettings,
    transport: Transport,
    serve: Serve,
    outboxes: Arc<Outboxes>,
    stop: Arc<AtomicBool>,
    stats: Arc<TcpStats>,
    /// Open connections per source.
    sources: Mutex<HashMap<Source, usize>>,
    /// Threads of the connections taken by an [`Adopter`], joined by
    /// [`TcpServer::stop`] (the finished ones are dropped at each adoption).
    adopted: Mutex<Vec<JoinHandle<()>>>,
}

/// Serves one admitted connection on a thread of its own, which holds its
/// slot until the connection ends; `None` (logged) when no thread starts.
fn spawn_connection(
    sh: &Arc<Shared>,
    s: TcpStream,
    peer: SocketAddr,
    slot: Slot,
) -> Option<JoinHandle<()>> {
    let sh2 = sh.clone();
    std::thread::Builder::new()
        .name(format!("{}-conn", sh.transport.name()))
        .spawn(move || {
            let _slot = slot;
            serve_connection(&sh2, s, peer);
        })
        .map_err(|e| tracing::warn!(error = %e, "cannot start a connection thread"))
        .ok()
}

impl TcpServer {
    /// Binds every address and starts the accept threads, speaking
    /// `transport`; Observe notifications come through `outboxes`.
    pub fn start(
        binds: &[SocketAddr],
        settings: TcpSettings,
        transport: Transport,
        serve: Serve,
        outboxes: Arc<Outboxes>,
    ) -> io::Result<TcpServer> {
        let stats = outboxes.stats.clone();
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
            outboxes,
            stop: stop.clone(),
            stats: stats.clone(),
            sources: Mutex::new(HashMap::new()),
            adopted: Mutex::new(Vec::new()),
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
            shared: sh,
        })
    }

    /// What takes connections accepted elsewhere into this server.
    pub fn adopter(&self) -> Adopter {
        Adopter(self.shared.clone())
    }

    /// The bound addresses (with the ports the OS chose for `:0`).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<TcpStats> {
        &self.stats
    }

    /// Stops accepting; open connections, adopted ones included, get a
    /// Release and close within a tick, and are joined before this returns.
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
        let adopted = std::mem::take(&mut *self.shared.adopted.lock());
        for t in adopted {
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
                if let Some(t) = spawn_connection(sh, s, peer, slot) {
                    conns.push(t);
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
    let ob = sh.outboxes.open();
    match &sh.transport {
        Transport::Tcp => run(sh, s, peer, &ob, |_| None),
        Transport::Ws => run_ws(sh, s, peer, &ob, |_| None),
        Transport::Tls(cfg) => {
            if let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) {
                run(sh, TlsStream::new(conn, s), peer, &ob, tls_identity);
            }
        }
        Transport::Wss(cfg) => {
            if let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) {
                run_ws(sh, TlsStream::new(conn, s), peer, &ob, tls_identity);
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
/// function), answering its requests as the peer `who` on connection
/// `conn` (its listener index), and counts them.
fn feed(
    sh: &Shared,
    c: &mut Connection,
    who: Option<&str>,
    conn: usize,
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
        serve(&r, max, conn)
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
/// way); Observe notifications come from `ob`.
fn run<S: Read + Write + Shut>(
    sh: &Shared,
    mut s: S,
    peer: SocketAddr,
    ob: &Outbox,
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
                // what was planned before these requests goes before
                // their answers (an Observe: 1 is followed by nothing)
                ob.deliver(&mut c);
                feed(sh, &mut c, who.as_deref(), ob.id(), |c, serve| {
                    c.receive(now, &buf[..n], serve)
                });
            }
            Err(e) if would_block(&e) => tick(sh, &mut c, now, last),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "coap over tcp/tls: read");
                break;
            }
        }
        if ob.deliver(&mut c) > 0 {
            last = now;
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
/// subprotocol, which the answer then names. Against web pages (a browser
/// lets any page open a WebSocket anywhere, and read the answers): an
/// upgrade that carries an `Origin` (browsers always send one; CoAP
/// clients such as aiocoap and mintgate's send none) must come from the
/// origin it is made to, and `Host` must be an IP literal, `localhost` or
/// one of `allowed` (against DNS rebinding); else 403.
// the shape of tungstenite's handshake Callback, called once per upgrade
#[allow(clippy::result_large_err)]
fn ws_upgrade(
    req: &tungstenite::handshake::server::Request,
    mut resp: tungstenite::handshake::server::Response,
    allowed: &[String],
) -> Result<tungstenite::handshake::server::Response, tungstenite::handshake::server::ErrorResponse>
{
    use tungstenite::http::{HeaderValue, Response, StatusCode};
    let refuse = |code: StatusCode, why: &str| {
        let mut r = Response::new(Some(format!("{why}\n")));
        *r.status_mut() = code;
        r
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("\u{fffd}"))
    };
    let host = header("host");
    if !mintgate_coap::uri::host_allowed(host, allowed) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "this Host is not one of the gateway's names (proxy.allowed_hosts)",
        ));
    }
    if let Some(origin) = header("origin") {
        let same = origin
            .split_once("://")
            .is_some_and(|(_, rest)| Some(rest.trim_end_matches('/')) == host);
        if !same {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                "CoAP over WebSockets is not open to web pages of other origins",
            ));
        }
    }
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
/// WebSocket message; Observe notifications come from `ob`.
fn run_ws<S: Read + Write + Shut>(
    sh: &Shared,
    s: S,
    peer: SocketAddr,
    ob: &Outbox,
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
    let allowed = &set.allowed_hosts;
    // the shape of tungstenite's handshake Callback
    #[allow(clippy::result_large_err)]
    let check =
        |req: &tungstenite::handshake::server::Request, resp| ws_upgrade(req, resp, allowed);
    let mut hs = tungstenite::accept_hdr_with_config(metered, check, Some(cfg));
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
                ob.deliver(&mut c);
                feed(sh, &mut c, who.as_deref(), ob.id(), |c, serve| {
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
        if ob.deliver(&mut c) > 0 {
            last = now;
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

#[cfg(test)]
mod tests {
    use super::*;
    use mintgate_coap::server::tcp::ConnectionConfig;
    use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Signal};

    /// A 2.05 notification in RFC 7252 form with Observe `seq`.
    fn note(token: &[u8], seq: u32) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let mut w =
            MessageWriter::new(&mut buf, MessageType::Non, Code::CONTENT, 7, token).unwrap();
        w.option_uint(OptionNumber::OBSERVE, seq).unwrap();
        w.payload(b"21.5").unwrap();
        let n = w.finish();
        buf[..n].to_vec()
    }

    /// A connection handed over by another listener is joined when the
    /// server stops: `stop` returns with its slot given back.
    #[test]
    fn stop_joins_adopted_connections() {
        let (o, _) = outboxes();
        let settings = TcpSettings {
            max_connections: 4,
            max_per_source: 4,
            connection: ConnectionConfig::default(),
            idle_timeout: Duration::from_secs(60),
            allowed_hosts: Vec::new(),
        };
        let serve: Serve = Arc::new(|_, _, _| Answer::Silent);
        let mut srv = TcpServer::start(
            &["127.0.0.1:0".parse().unwrap()],
            settings,
            Transport::Tcp,
            serve,
            o,
        )
        .unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let (s, peer) = other.accept().unwrap();
        assert!(srv.adopter().adopt(s, peer));
        assert_eq!(srv.stats().open.load(Relaxed), 1);
        srv.stop();
        assert_eq!(srv.stats().open.load(Relaxed), 0, "stop returned first");
        // and nothing is adopted once stopped
        let client2 = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let (s, peer) = other.accept().unwrap();
        assert!(!srv.adopter().adopt(s, peer));
        drop((client, client2));
    }

    fn outboxes() -> (Arc<Outboxes>, Arc<Mutex<Vec<usize>>>) {
        let closed: Arc<Mutex<Vec<usize>>> = Arc::default();
        let c = closed.clone();
        let o = Arc::new(Outboxes::new(Arc::default(), move |id| c.lock().push(id)));
        (o, closed)
    }

    /// A connection whose peer sent its CSM, with our CSM written.
    fn connection() -> Connection {
        let mut c = Connection::new(
            Framing::Stream,
            "127.0.0.1:9".parse().unwrap(),
            ConnectionConfig::default(),
        );
        let mut csm = Vec::new();
        Signal::Csm {
            max_message_size: None,
            block_wise: false,
        }
        .emit_vec(Framing::Stream, &[], &mut csm);
        c.receive(Instant::now(), &csm, &mut |_, _| Answer::Silent);
        let n = c.output().len();
        c.consume_output(n);
        c
    }

    /// The Observe values framed in `c`'s output, by token.
    fn sent(c: &Connection) -> Vec<(Vec<u8>, u32)> {
        let mut v = Vec::new();
        let mut rest = c.output();
        while let Ok(Some(n)) = mintgate_coap::wire::tcp::frame_len(rest) {
            let p =
                mintgate_coap::wire::TcpPacket::new_checked(&rest[..n as usize], Framing::Stream)
                    .unwrap();
            let seq = p
                .options()
                .find(|o| o.number == OptionNumber::OBSERVE)
                .and_then(|o| mintgate_coap::wire::decode_uint(o.value))
                .unwrap();
            v.push((p.token().to_vec(), seq));
            rest = &rest[n as usize..];
        }
        v
    }

    #[test]
    fn a_connection_that_never_takes_its_notifications_holds_a_bounded_outbox() {
        let (o, _) = outboxes();
        let ob = o.open();
        assert!(is_reliable_id(ob.id()));
        // the connection's thread is stuck (its peer never reads): the
        // notifier goes on pushing and is never held up
        for seq in 0..10_000u32 {
            o.push(ob.id(), note(&[(seq % 40) as u8], seq));
        }
        assert_eq!(ob.waiting(), OUTBOX_MESSAGES);
        assert_eq!(
            o.stats.notifications_dropped.load(Relaxed),
            10_000 - OUTBOX_MESSAGES as u64
        );
        // what is left is the newest, each relation's latest
        let mut c = connection();
        assert_eq!(ob.deliver(&mut c), OUTBOX_MESSAGES);
        let got = sent(&c);
        let want: Vec<(Vec<u8>, u32)> = (10_000 - OUTBOX_MESSAGES as u32..10_000)
            .map(|s| (vec![(s % 40) as u8], s))
            .collect();
        assert_eq!(got, want);
        assert_eq!(o.stats.notifications.load(Relaxed), OUTBOX_MESSAGES as u64);
        assert_eq!(ob.waiting(), 0);
    }

    #[test]
    fn a_newer_notification_replaces_the_waiting_one_of_its_relation() {
        let (o, _) = outboxes();
        let ob = o.open();
        for seq in 2..6 {
            o.push(ob.id(), note(b"a", seq));
        }
        o.push(ob.id(), note(b"b", 2));
        assert_eq!(ob.waiting(), 2);
        let mut c = connection();
        ob.deliver(&mut c);
        assert_eq!(sent(&c), vec![(b"a".to_vec(), 5), (b"b".to_vec(), 2)]);
        assert_eq!(o.stats.notifications_dropped.load(Relaxed), 3);
    }

    #[test]
    fn a_closed_connection_ends_its_relations_and_takes_nothing_more() {
        let (o, closed) = outboxes();
        let (a, b) = (o.open(), o.open());
        assert_ne!(a.id(), b.id());
        assert_eq!(o.len(), 2);
        let id = a.id();
        o.push(id, note(b"a", 2));
        drop(a);
        assert_eq!(*closed.lock(), vec![id], "told once, with its id");
        assert_eq!(o.len(), 1);
        // a notification planned before the close finds no one
        o.push(id, note(b"a", 3));
        assert_eq!(b.waiting(), 0);
        assert_eq!(o.stats.notifications_dropped.load(Relaxed), 0);
        drop(b);
        assert!(o.is_empty());
        assert_eq!(closed.lock().len(), 2);
    }

    fn is_reliable_id(id: usize) -> bool {
        mintgate_coap::server::observe::is_reliable(id)
    }
}
