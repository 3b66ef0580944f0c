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

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_coap::server::source::Source;
use mintgate_coap::server::tcp::{Closed, Connection, ConnectionConfig};
use mintgate_coap::server::{Answer, Request};
use mintgate_coap::wire::Framing;
use parking_lot::Mutex;

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
                ("mintgate_coap_tcp_connections", "CoAP-over-TCP connections open.", v(&self.open)),
                ("mintgate_coap_tcp_accepted_total", "CoAP-over-TCP connections accepted.", v(&self.accepted)),
                ("mintgate_coap_tcp_refused_total", "CoAP-over-TCP connections closed at once (over tcp_max_connections or tcp_max_per_source).", v(&self.refused)),
                ("mintgate_coap_tcp_aborted_total", "CoAP-over-TCP connections aborted (malformed frame, frame over Max-Message-Size, no CSM first, bad CSM, stalled frame).", v(&self.aborted)),
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
    /// `coaps+tcp`: the TLS server configuration.
    tls: Option<Arc<rustls::ServerConfig>>,
    serve: Serve,
    stop: Arc<AtomicBool>,
    stats: Arc<TcpStats>,
    /// Open connections per source.
    sources: Mutex<HashMap<Source, usize>>,
}

impl TcpServer {
    /// Binds every address and starts the accept threads; with `tls`, the
    /// listeners speak `coaps+tcp`.
    pub fn start(
        binds: &[SocketAddr],
        settings: TcpSettings,
        tls: Option<Arc<rustls::ServerConfig>>,
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
        let scheme = if tls.is_some() {
            "coaps-tcp"
        } else {
            "coap-tcp"
        };
        let sh = Arc::new(Shared {
            settings,
            tls,
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
                    .name("coap-tcp-conn".into())
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
    match &sh.tls {
        None => run(sh, s, peer, |_| None),
        Some(cfg) => {
            let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) else {
                return;
            };
            let tls = rustls::StreamOwned::new(conn, s);
            run(sh, tls, peer, |t: &rustls::StreamOwned<_, TcpStream>| {
                t.conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| common_name(c.as_ref()))
            });
        }
    }
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

impl Shut for rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    fn shut(&mut self) {
        self.conn.send_close_notify();
        let _ = self.conn.complete_io(&mut self.sock);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
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
    let serve = &*sh.serve;
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
                let before = c.stats().requests;
                c.receive(now, &buf[..n], &mut |r, max| {
                    let r = Request {
                        peer: r.peer,
                        packet: r.packet,
                        identity: r.identity.or(who.as_deref()),
                    };
                    serve(&r, max)
                });
                sh.stats
                    .requests
                    .fetch_add(c.stats().requests - before, Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                c.handle_timeout(now);
                if now.duration_since(last) >= set.idle_timeout {
                    c.release();
                }
            }
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
    if let Some(Closed::Aborted(why)) = c.closed() {
        sh.stats.aborted.fetch_add(1, Relaxed);
        tracing::debug!(%peer, ?why, "coap+tcp connection aborted");
    }
    s.shut();
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
