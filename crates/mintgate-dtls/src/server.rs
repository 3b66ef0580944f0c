//! The server side: one listener's session table.
//!
//! Every datagram from a peer goes to that peer's session. A peer without
//! a session may only open one with a ClientHello; anything else from it is
//! dropped and counted. OpenSSL answers the first ClientHello with a
//! HelloVerifyRequest carrying a cookie bound to the peer's address (RFC
//! 6347 4.2.1), so an address that cannot receive gets back one small
//! datagram, never the server's certificate flight. The table is bounded:
//! when it is full, the session that is still handshaking and oldest goes
//! first, else the one idle longest; sessions idle past the idle timeout
//! and handshakes older than the handshake timeout are dropped by
//! [`DtlsServer::sweep`]. Every drop is counted in [`DtlsStats`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::ex_data::Index;
use openssl::sha::Sha256;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions};
use parking_lot::Mutex;

use crate::session::{Progress, Session, SessionError};
use crate::{base_context, load_certs, ssl_err, CertFiles, DtlsError, Psk};

/// Settings of a coaps listener.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    /// Identities and their keys (PSK mode, RFC 7252 9.1.3.1).
    pub psk: Vec<Psk>,
    /// Certificate, key and optional client CA (certificate mode, 9.1.3.3).
    pub certs: CertFiles,
    /// With a client CA: refuse clients without a valid certificate,
    /// pre-shared-key clients included (else a client may still use a PSK).
    pub require_client_cert: bool,
    /// Largest datagram the server's records may take.
    pub mtu: u32,
    /// Most sessions held at once (handshaking ones included).
    pub max_sessions: usize,
    /// An established session with no traffic this long is dropped.
    pub idle_timeout: Duration,
    /// A handshake not complete after this long is dropped.
    pub handshake_timeout: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            psk: Vec::new(),
            certs: CertFiles::default(),
            require_client_cert: false,
            mtu: crate::DEFAULT_MTU,
            max_sessions: 1024,
            idle_timeout: Duration::from_secs(300),
            handshake_timeout: crate::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// Counters of one coaps listener (all since start, except the gauges).
#[derive(Default, Debug)]
pub struct DtlsStats {
    /// Sessions held now (gauge).
    pub sessions: AtomicU64,
    /// Established sessions now (gauge).
    pub established: AtomicU64,
    /// Handshakes completed.
    pub handshakes: AtomicU64,
    /// Handshakes that failed (wrong key, bad certificate, alert).
    pub handshake_failures: AtomicU64,
    /// Handshakes dropped unfinished after the handshake timeout.
    pub handshake_timeouts: AtomicU64,
    /// Sessions evicted because the table was full.
    pub evicted: AtomicU64,
    /// Established sessions dropped after the idle timeout.
    pub expired: AtomicU64,
    /// Sessions the peer closed (close_notify) or broke with an alert.
    pub closed: AtomicU64,
    /// Datagrams that are not DTLS records (bad header).
    pub malformed: AtomicU64,
    /// Records from a peer without a session that are not a ClientHello.
    pub unauthenticated: AtomicU64,
    /// Application records an established session dropped (bad MAC,
    /// replay, wrong epoch) or that carried no data.
    pub dropped_records: AtomicU64,
    /// CoAP datagrams decrypted.
    pub decrypted: AtomicU64,
    /// CoAP datagrams encrypted.
    pub encrypted: AtomicU64,
    /// Answers with no session to go to (it was dropped meanwhile).
    pub no_session: AtomicU64,
}

impl DtlsStats {
    /// (name, help, value, is a counter) of every field, for the metrics.
    pub fn fields(&self) -> Vec<(&'static str, &'static str, u64, bool)> {
        let g = |a: &AtomicU64| a.load(Relaxed);
        vec![
            ("sessions", "DTLS sessions held.", g(&self.sessions), false),
            (
                "sessions_established",
                "DTLS sessions established.",
                g(&self.established),
                false,
            ),
            (
                "handshakes_total",
                "DTLS handshakes completed.",
                g(&self.handshakes),
                true,
            ),
            (
                "handshake_failures_total",
                "DTLS handshakes failed (wrong key, bad certificate, alert).",
                g(&self.handshake_failures),
                true,
            ),
            (
                "handshake_timeouts_total",
                "DTLS handshakes dropped unfinished.",
                g(&self.handshake_timeouts),
                true,
            ),
            (
                "sessions_evicted_total",
                "DTLS sessions evicted because the table was full.",
                g(&self.evicted),
                true,
            ),
            (
                "sessions_expired_total",
                "DTLS sessions dropped after the idle timeout.",
                g(&self.expired),
                true,
            ),
            (
                "sessions_closed_total",
                "DTLS sessions closed or broken by the peer.",
                g(&self.closed),
                true,
            ),
            (
                "malformed_total",
                "Datagrams on the coaps port that are not DTLS records.",
                g(&self.malformed),
                true,
            ),
            (
                "unauthenticated_total",
                "Records from peers without a session that are not a ClientHello.",
                g(&self.unauthenticated),
                true,
            ),
            (
                "dropped_records_total",
                "Records an established session dropped (bad MAC, replay) or that held no data.",
                g(&self.dropped_records),
                true,
            ),
            (
                "decrypted_total",
                "CoAP datagrams decrypted.",
                g(&self.decrypted),
                true,
            ),
            (
                "encrypted_total",
                "CoAP datagrams encrypted.",
                g(&self.encrypted),
                true,
            ),
            (
                "no_session_total",
                "Answers dropped because their session was gone.",
                g(&self.no_session),
                true,
            ),
        ]
    }
}

struct Slot {
    session: Mutex<Session>,
    created: Instant,
    /// Nanoseconds since the server's epoch of the last datagram.
    last: AtomicU64,
    established: AtomicBool,
}

/// Receives each decrypted CoAP datagram and the session's identity.
pub type Deliver<'a> = dyn FnMut(&[u8], Option<&Arc<str>>) + 'a;

/// What [`DtlsServer::handle_datagram`] did with a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// Part of a handshake (or an answer to one was sent).
    Handshake,
    /// Application datagrams were delivered.
    Data(usize),
    /// Dropped and counted.
    Dropped,
}

/// A coaps listener's sessions. See the [module documentation](self).
pub struct DtlsServer {
    ctx: SslContext,
    settings: ServerSettings,
    peer_index: Index<Ssl, SocketAddr>,
    table: Mutex<HashMap<SocketAddr, Arc<Slot>>>,
    epoch: Instant,
    stats: Arc<DtlsStats>,
}

const COOKIE_LEN: usize = 16;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION: u8 = 23;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// DTLS record header: type, version, epoch, sequence number, length.
const RECORD_HEADER: usize = 13;

impl DtlsServer {
    /// Builds the OpenSSL context. Needs at least one PSK or a certificate.
    pub fn new(settings: ServerSettings) -> Result<DtlsServer, DtlsError> {
        if settings.psk.is_empty() && settings.certs.chain.is_none() {
            return Err(DtlsError::Config(
                "coaps needs a pre-shared key (psk_identity and psk_key) or a certificate and key"
                    .into(),
            ));
        }
        if settings.max_sessions == 0 {
            return Err(DtlsError::Config("max_sessions must be at least 1".into()));
        }
        let mut b = SslContextBuilder::new(SslMethod::dtls())
            .map_err(ssl_err("creating the DTLS context"))?;
        base_context(&mut b)?;
        b.set_mode(SslMode::RELEASE_BUFFERS);
        b.set_options(SslOptions::COOKIE_EXCHANGE | SslOptions::CIPHER_SERVER_PREFERENCE);
        load_certs(&mut b, &settings.certs, settings.require_client_cert)?;
        // A PSK handshake carries no client certificate, so OpenSSL's
        // FAIL_IF_NO_PEER_CERT does not stop it: where a client certificate
        // is required, pre-shared keys are not served at all.
        let certs_only = settings.require_client_cert && settings.certs.ca.is_some();
        if !settings.psk.is_empty() && !certs_only {
            let keys: HashMap<Vec<u8>, Vec<u8>> = settings
                .psk
                .iter()
                .map(|p| (p.identity.clone(), p.key.clone()))
                .collect();
            b.set_psk_server_callback(move |_ssl, identity, out| {
                let Some(key) = identity.and_then(|i| keys.get(i)) else {
                    return Ok(0); // unknown identity: the handshake fails
                };
                let n = key.len().min(out.len());
                out[..n].copy_from_slice(&key[..n]);
                Ok(n)
            });
        }
        let peer_index =
            Ssl::new_ex_index::<SocketAddr>().map_err(ssl_err("allocating the peer index"))?;
        let mut secret = [0u8; 32];
        openssl::rand::rand_bytes(&mut secret).map_err(ssl_err("drawing the cookie secret"))?;
        let cookie = move |peer: Option<&SocketAddr>| -> [u8; COOKIE_LEN] {
            let mut h = Sha256::new();
            h.update(&secret);
            if let Some(p) = peer {
                match p.ip() {
                    std::net::IpAddr::V4(a) => h.update(&a.octets()),
                    std::net::IpAddr::V6(a) => h.update(&a.octets()),
                }
                h.update(&p.port().to_be_bytes());
            }
            let d = h.finish();
            let mut c = [0u8; COOKIE_LEN];
            c.copy_from_slice(&d[..COOKIE_LEN]);
            c
        };
        let verify = cookie;
        b.set_cookie_generate_cb(move |ssl, buf| {
            let c = cookie(ssl.ex_data(peer_index));
            let n = COOKIE_LEN.min(buf.len());
            buf[..n].copy_from_slice(&c[..n]);
            Ok(n)
        });
        b.set_cookie_verify_cb(move |ssl, got| {
            let want = verify(ssl.ex_data(peer_index));
            // constant time: the cookie is a MAC
            got.len() == COOKIE_LEN && openssl::memcmp::eq(got, &want)
        });
        Ok(DtlsServer {
            ctx: b.build(),
            settings,
            peer_index,
            table: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            stats: Arc::new(DtlsStats::default()),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<DtlsStats> {
        &self.stats
    }

    /// The settings.
    pub fn settings(&self) -> &ServerSettings {
        &self.settings
    }

    /// Sessions held now.
    pub fn sessions(&self) -> usize {
        self.table.lock().len()
    }

    fn since_epoch(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Handles one datagram from `peer`: handshake records are answered
    /// through `send`, decrypted CoAP datagrams go to `app` with the
    /// session's identity. Never panics on any input.
    pub fn handle_datagram(
        &self,
        now: Instant,
        peer: SocketAddr,
        datagram: &[u8],
        buf: &mut [u8],
        app: &mut Deliver<'_>,
        send: &mut dyn FnMut(&[u8]),
    ) -> Handled {
        let s = &self.stats;
        if datagram.len() < RECORD_HEADER
            || !(20..=25).contains(&datagram[0])
            || datagram[1] != 0xfe
        {
            s.malformed.fetch_add(1, Relaxed);
            return Handled::Dropped;
        }
        let existing = self.table.lock().get(&peer).cloned();
        let slot = match existing {
            Some(slot) => slot,
            None => {
                let hello = datagram[0] == CONTENT_HANDSHAKE
                    && datagram[3..5] == [0, 0]
                    && datagram.get(RECORD_HEADER) == Some(&HANDSHAKE_CLIENT_HELLO);
                if !hello {
                    s.unauthenticated.fetch_add(1, Relaxed);
                    return Handled::Dropped;
                }
                match self.open(now, peer) {
                    Some(slot) => slot,
                    None => return Handled::Dropped,
                }
            }
        };
        slot.last.store(self.since_epoch(now), Relaxed);
        let mut sess = slot.session.lock();
        let was = sess.is_established();
        let identity = sess.identity().cloned();
        let mut delivered = 0u64;
        let r = {
            let mut deliver = |pt: &[u8]| {
                delivered += 1;
                app(pt, identity.as_ref());
            };
            if was {
                sess.feed(datagram, buf, &mut deliver)
            } else {
                // the identity is known only once established
                let mut pending: Vec<Vec<u8>> = Vec::new();
                let r = sess.feed(datagram, buf, &mut |pt: &[u8]| pending.push(pt.to_vec()));
                if !pending.is_empty() {
                    let id = sess.identity().cloned();
                    for pt in &pending {
                        delivered += 1;
                        app(pt, id.as_ref());
                    }
                }
                r
            }
        };
        sess.drain(send);
        s.decrypted.fetch_add(delivered, Relaxed);
        match r {
            Ok(Progress::Established) => {
                slot.established.store(true, Relaxed);
                s.handshakes.fetch_add(1, Relaxed);
                s.established.fetch_add(1, Relaxed);
                Handled::Handshake
            }
            Ok(Progress::Handshaking) => Handled::Handshake,
            Ok(Progress::Data(n)) => Handled::Data(n),
            Ok(Progress::Nothing) => {
                if was && datagram[0] == CONTENT_APPLICATION {
                    s.dropped_records.fetch_add(1, Relaxed);
                }
                Handled::Dropped
            }
            Err(e) => {
                drop(sess);
                if was {
                    s.closed.fetch_add(1, Relaxed);
                } else {
                    tracing::debug!(%peer, error = ?e, "DTLS handshake failed");
                    s.handshake_failures.fetch_add(1, Relaxed);
                }
                self.remove(peer, &slot);
                if matches!(e, SessionError::Closed) {
                    Handled::Dropped
                } else {
                    Handled::Handshake
                }
            }
        }
    }

    /// Opens a session for `peer`, making room first.
    fn open(&self, now: Instant, peer: SocketAddr) -> Option<Arc<Slot>> {
        let mut ssl = match Ssl::new(&self.ctx) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create a DTLS session");
                return None;
            }
        };
        ssl.set_ex_data(self.peer_index, peer);
        ssl.set_accept_state();
        let session = match Session::new(ssl, self.settings.mtu) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create a DTLS session");
                return None;
            }
        };
        let slot = Arc::new(Slot {
            session: Mutex::new(session),
            created: now,
            last: AtomicU64::new(self.since_epoch(now)),
            established: AtomicBool::new(false),
        });
        let mut t = self.table.lock();
        while t.len() >= self.settings.max_sessions {
            // the oldest handshake first, else the longest idle session
            let victim = t
                .iter()
                .filter(|(_, s)| !s.established.load(Relaxed))
                .min_by_key(|(_, s)| s.created)
                .or_else(|| t.iter().min_by_key(|(_, s)| s.last.load(Relaxed)))
                .map(|(p, s)| (*p, s.established.load(Relaxed)));
            let Some((p, est)) = victim else { break };
            t.remove(&p);
            if est {
                self.stats.established.fetch_sub(1, Relaxed);
            }
            self.stats.evicted.fetch_add(1, Relaxed);
        }
        t.insert(peer, slot.clone());
        self.stats.sessions.store(t.len() as u64, Relaxed);
        Some(slot)
    }

    fn remove(&self, peer: SocketAddr, slot: &Arc<Slot>) {
        let mut t = self.table.lock();
        if t.get(&peer).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            t.remove(&peer);
            if slot.established.load(Relaxed) {
                self.stats.established.fetch_sub(1, Relaxed);
            }
        }
        self.stats.sessions.store(t.len() as u64, Relaxed);
    }

    /// Encrypts one CoAP datagram for `peer`; the record goes to `send`.
    /// False (and counted) when the peer has no established session.
    pub fn send(&self, peer: SocketAddr, plaintext: &[u8], send: &mut dyn FnMut(&[u8])) -> bool {
        let Some(slot) = self.table.lock().get(&peer).cloned() else {
            self.stats.no_session.fetch_add(1, Relaxed);
            return false;
        };
        let mut sess = slot.session.lock();
        if !sess.is_established() {
            self.stats.no_session.fetch_add(1, Relaxed);
            return false;
        }
        let ok = sess.write(plaintext).is_ok();
        sess.drain(send);
        if ok {
            self.stats.encrypted.fetch_add(1, Relaxed);
        }
        ok
    }

    /// The identity of `peer`'s established session, if any.
    pub fn identity(&self, peer: SocketAddr) -> Option<Arc<str>> {
        let slot = self.table.lock().get(&peer).cloned()?;
        let s = slot.session.lock();
        s.identity().cloned()
    }

    /// Periodic upkeep: retransmits handshake flights whose timer ran out,
    /// drops handshakes past the handshake timeout and sessions idle past
    /// the idle timeout (with close_notify). Call every 100 ms or so.
    pub fn sweep(&self, now: Instant, send: &mut dyn FnMut(SocketAddr, &[u8])) {
        let slots: Vec<(SocketAddr, Arc<Slot>)> = self
            .table
            .lock()
            .iter()
            .map(|(p, s)| (*p, s.clone()))
            .collect();
        let idle_ns = self.settings.idle_timeout.as_nanos() as u64;
        let now_ns = self.since_epoch(now);
        for (peer, slot) in slots {
            let est = slot.established.load(Relaxed);
            if est {
                if now_ns.saturating_sub(slot.last.load(Relaxed)) >= idle_ns {
                    let mut s = slot.session.lock();
                    s.close();
                    s.drain(&mut |d| send(peer, d));
                    drop(s);
                    self.remove(peer, &slot);
                    self.stats.expired.fetch_add(1, Relaxed);
                }
            } else if now.saturating_duration_since(slot.created) >= self.settings.handshake_timeout
            {
                self.remove(peer, &slot);
                self.stats.handshake_timeouts.fetch_add(1, Relaxed);
            } else if let Some(mut s) = slot.session.try_lock() {
                s.handle_timeout();
                s.drain(&mut |d| send(peer, d));
            }
        }
    }
}
