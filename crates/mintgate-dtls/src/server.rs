//! The server side: one listener's session table.
//!
//! Every datagram from a peer goes to that peer's session, except a
//! ClientHello of epoch 0, which is answered statelessly first (RFC 6347
//! 4.2.1): the server parses the record ([`crate::hello`]) and, unless the
//! hello carries a valid cookie, sends back a HelloVerifyRequest whose
//! cookie is an HMAC-SHA256 of the peer's address and the hello's fields
//! under a secret that changes every [`ServerSettings::cookie_period`]
//! ([`crate::cookie`]). Until a hello carries a valid cookie nothing is
//! kept and no lock is taken: no OpenSSL object, no table entry, so a
//! flood of hellos from spoofed sources costs one HMAC and one small
//! datagram each, never memory. Only a hello with a valid cookie (the
//! peer has shown that it receives at its address) gets a session; OpenSSL
//! takes that hello as the second one, as after its own `DTLSv1_listen`.
//!
//! Anything else from a peer without a session is dropped and counted.
//! The table is bounded: a source (an IPv4 address, or an IPv6 /64) may
//! have at most [`ServerSettings::max_handshakes_per_source`] handshakes in
//! progress; when the table is full, the oldest handshake in progress
//! makes room for a new one, and an established session never does (the
//! new handshake is refused instead). Sessions idle past the idle timeout
//! and handshakes older than the handshake timeout are dropped by
//! [`DtlsServer::sweep`]. Every drop is counted in [`DtlsStats`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions};
use parking_lot::Mutex;

use crate::cookie::CookieJar;
use crate::hello::{self, ClientHello};
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
    /// Most handshakes in progress at once from one source (an IPv4
    /// address, or an IPv6 /64); a further one is refused until one ends.
    pub max_handshakes_per_source: usize,
    /// How long a cookie secret is used before a new one is drawn; a
    /// cookie stays valid for up to two periods.
    pub cookie_period: Duration,
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
            max_handshakes_per_source: DEFAULT_HANDSHAKES_PER_SOURCE,
            cookie_period: DEFAULT_COOKIE_PERIOD,
        }
    }
}

/// Default of [`ServerSettings::max_handshakes_per_source`].
pub const DEFAULT_HANDSHAKES_PER_SOURCE: usize = 16;
/// Default of [`ServerSettings::cookie_period`].
pub const DEFAULT_COOKIE_PERIOD: Duration = Duration::from_secs(60);

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
    /// Handshakes in progress evicted because the table was full.
    pub evicted: AtomicU64,
    /// HelloVerifyRequests sent (to hellos without a valid cookie).
    pub hello_verify_requests: AtomicU64,
    /// ClientHellos whose cookie was wrong or too old (answered with a
    /// new HelloVerifyRequest).
    pub bad_cookies: AtomicU64,
    /// Handshakes refused although the cookie was valid: the source had
    /// its most handshakes in progress, or the table was full of
    /// established sessions.
    pub handshakes_refused: AtomicU64,
    /// Established sessions dropped after the idle timeout.
    pub expired: AtomicU64,
    /// Sessions the peer closed (close_notify) or broke with an alert.
    pub closed: AtomicU64,
    /// Datagrams that are not DTLS records (bad header), and ClientHellos
    /// the stateless parser refuses (fragmented, malformed).
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
                "DTLS handshakes in progress evicted because the table was full.",
                g(&self.evicted),
                true,
            ),
            (
                "hello_verify_requests_total",
                "DTLS HelloVerifyRequests sent to ClientHellos without a valid cookie.",
                g(&self.hello_verify_requests),
                true,
            ),
            (
                "bad_cookies_total",
                "DTLS ClientHellos with a wrong or expired cookie.",
                g(&self.bad_cookies),
                true,
            ),
            (
                "handshakes_refused_total",
                "DTLS handshakes with a valid cookie refused (source limit, or table full of established sessions).",
                g(&self.handshakes_refused),
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
                "Datagrams on the coaps port that are not DTLS records (or not a ClientHello the server can read).",
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

/// Where handshakes are counted: an IPv4 address, or the /64 prefix of an
/// IPv6 address (one host usually owns a whole /64). An IPv4-mapped IPv6
/// address counts as its IPv4 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address.
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6([u8; 8]),
}

impl Source {
    /// The source `peer` belongs to.
    pub fn of(peer: SocketAddr) -> Source {
        match peer.ip() {
            IpAddr::V4(a) => Source::V4(a.octets()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let o = a.octets();
                    let mut p = [0u8; 8];
                    p.copy_from_slice(&o[..8]);
                    Source::V6(p)
                }
            },
        }
    }
}

struct Slot {
    session: Mutex<Session>,
    created: Instant,
    /// Nanoseconds since the server's epoch of the last datagram.
    last: AtomicU64,
    /// Set (under the table lock) when the handshake completes.
    established: AtomicBool,
    /// The `random` of the ClientHello that opened it: the same hello
    /// again is a retransmission, another one a new connection.
    random: [u8; 32],
    source: Source,
}

/// The sessions, and the handshakes in progress per source (only sources
/// with at least one).
#[derive(Default)]
struct Table {
    sessions: HashMap<SocketAddr, Arc<Slot>>,
    handshaking: HashMap<Source, usize>,
}

impl Table {
    fn handshakes_of(&self, source: Source) -> usize {
        self.handshaking.get(&source).copied().unwrap_or(0)
    }

    fn handshake_ended(&mut self, source: Source) {
        if let Some(n) = self.handshaking.get_mut(&source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.handshaking.remove(&source);
            }
        }
    }
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
    /// Set on an SSL whose opening hello's cookie the server checked.
    checked_index: Index<Ssl, bool>,
    cookies: CookieJar,
    table: Mutex<Table>,
    epoch: Instant,
    stats: Arc<DtlsStats>,
}

const CONTENT_APPLICATION: u8 = 23;

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
        if settings.max_handshakes_per_source == 0 {
            return Err(DtlsError::Config(
                "max_handshakes_per_source must be at least 1".into(),
            ));
        }
        let mut b = SslContextBuilder::new(SslMethod::dtls())
            .map_err(ssl_err("creating the DTLS context"))?;
        base_context(&mut b)?;
        b.set_mode(SslMode::RELEASE_BUFFERS);
        // No renegotiation: a session's only hello is the one whose cookie
        // the server checked.
        b.set_options(
            SslOptions::COOKIE_EXCHANGE
                | SslOptions::CIPHER_SERVER_PREFERENCE
                | SslOptions::NO_RENEGOTIATION,
        );
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
        let checked_index =
            Ssl::new_ex_index::<bool>().map_err(ssl_err("allocating the cookie index"))?;
        // The cookie exchange is done before OpenSSL sees a hello (see the
        // module documentation): OpenSSL is asked to approve only a cookie
        // the server already checked, and never to make one.
        b.set_cookie_generate_cb(|_ssl, _buf| Err(ErrorStack::get()));
        b.set_cookie_verify_cb(move |ssl, _cookie| {
            ssl.ex_data(checked_index).copied().unwrap_or(false)
        });
        let now = Instant::now();
        let cookies = CookieJar::new(now, settings.cookie_period)
            .map_err(ssl_err("drawing the cookie secret"))?;
        Ok(DtlsServer {
            ctx: b.build(),
            settings,
            checked_index,
            cookies,
            table: Mutex::new(Table::default()),
            epoch: now,
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
        self.table.lock().sessions.len()
    }

    /// Handshakes in progress now from `source`.
    pub fn handshakes_from(&self, source: Source) -> usize {
        self.table.lock().handshakes_of(source)
    }

    /// Cookie secrets drawn since start, the first not counted.
    pub fn cookie_rotations(&self) -> u64 {
        self.cookies.rotations()
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
        if datagram.len() < hello::RECORD_HEADER
            || !(20..=25).contains(&datagram[0])
            || datagram[1] != 0xfe
        {
            s.malformed.fetch_add(1, Relaxed);
            return Handled::Dropped;
        }
        if hello::is_initial_client_hello(datagram) {
            return self.client_hello(now, peer, datagram, buf, app, send);
        }
        let existing = self.table.lock().sessions.get(&peer).cloned();
        match existing {
            Some(slot) => self.feed(now, peer, &slot, datagram, buf, app, send),
            None => {
                s.unauthenticated.fetch_add(1, Relaxed);
                Handled::Dropped
            }
        }
    }

    /// A ClientHello of epoch 0: answered statelessly unless its cookie is
    /// valid; then it goes to its session, or opens one.
    // Takes handle_datagram's arguments as they are and hands them on to
    // feed: the context of one datagram, passed down unchanged.
    fn client_hello(
        &self,
        now: Instant,
        peer: SocketAddr,
        datagram: &[u8],
        buf: &mut [u8],
        app: &mut Deliver<'_>,
        send: &mut dyn FnMut(&[u8]),
    ) -> Handled {
        let s = &self.stats;
        let Ok(hello) = hello::parse_client_hello(datagram) else {
            s.malformed.fetch_add(1, Relaxed);
            return Handled::Dropped;
        };
        self.cookies.rotate_if_due(now);
        if !self.cookies.verify(peer, &hello) {
            if !hello.cookie.is_empty() {
                s.bad_cookies.fetch_add(1, Relaxed);
            }
            self.hello_verify_request(peer, &hello, send);
            return Handled::Handshake;
        }
        // The peer receives at its address: from here on it may cost state.
        let existing = self.table.lock().sessions.get(&peer).cloned();
        if let Some(slot) = existing {
            if slot.random == *hello.random {
                // the same hello again (our first flight was lost): the
                // session retransmits when its timer runs out
                return self.feed(now, peer, &slot, datagram, buf, app, send);
            }
            // a new connection from the same address and port (a client
            // that restarted, RFC 6347 4.2.8): its cookie shows it is the
            // peer, so the old session goes
            if self.remove(peer, &slot) {
                s.closed.fetch_add(1, Relaxed);
            }
        }
        self.open(now, peer, &hello, datagram, send)
    }

    fn hello_verify_request(
        &self,
        peer: SocketAddr,
        hello: &ClientHello<'_>,
        send: &mut dyn FnMut(&[u8]),
    ) {
        let cookie = self.cookies.make(peer, hello);
        let mut out = [0u8; hello::MAX_HELLO_VERIFY_REQUEST];
        if let Some(n) = hello::write_hello_verify_request(hello, &cookie, &mut out) {
            send(&out[..n]);
            self.stats.hello_verify_requests.fetch_add(1, Relaxed);
        }
    }

    /// Whether a handshake from `source` may start now; `evict` makes room
    /// in a full table by dropping the oldest handshake in progress.
    fn admit(&self, t: &mut Table, source: Source, evict: bool) -> bool {
        if t.handshakes_of(source) >= self.settings.max_handshakes_per_source {
            return false;
        }
        if t.sessions.len() < self.settings.max_sessions {
            return true;
        }
        // full: the oldest handshake in progress may go, never an
        // established session
        let victim = t
            .sessions
            .iter()
            .filter(|(_, s)| !s.established.load(Relaxed))
            .min_by_key(|(_, s)| s.created)
            .map(|(p, s)| (*p, s.source));
        let Some((p, src)) = victim else {
            return false;
        };
        if evict {
            t.sessions.remove(&p);
            t.handshake_ended(src);
            self.stats.evicted.fetch_add(1, Relaxed);
        }
        true
    }

    /// Opens a session for `peer` with a hello whose cookie is valid.
    fn open(
        &self,
        now: Instant,
        peer: SocketAddr,
        hello: &ClientHello<'_>,
        datagram: &[u8],
        send: &mut dyn FnMut(&[u8]),
    ) -> Handled {
        let source = Source::of(peer);
        // a quick look first, so that a refused source costs no SSL object
        if !self.admit(&mut self.table.lock(), source, false) {
            self.stats.handshakes_refused.fetch_add(1, Relaxed);
            return Handled::Dropped;
        }
        let mut ssl = match Ssl::new(&self.ctx) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create a DTLS session");
                return Handled::Dropped;
            }
        };
        ssl.set_ex_data(self.checked_index, true);
        ssl.set_accept_state();
        let session = match Session::new(ssl, self.settings.mtu) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create a DTLS session");
                return Handled::Dropped;
            }
        };
        let slot = Arc::new(Slot {
            session: Mutex::new(session),
            created: now,
            last: AtomicU64::new(self.since_epoch(now)),
            established: AtomicBool::new(false),
            random: *hello.random,
            source,
        });
        // the session is locked before it is in the table, so that the
        // hello goes in before any later datagram of the peer
        let mut sess = slot.session.lock();
        {
            let mut t = self.table.lock();
            if !self.admit(&mut t, source, true) {
                drop(t);
                self.stats.handshakes_refused.fetch_add(1, Relaxed);
                return Handled::Dropped;
            }
            if let Some(old) = t.sessions.insert(peer, slot.clone()) {
                // another thread opened one meanwhile: this hello wins
                if old.established.load(Relaxed) {
                    self.stats.established.fetch_sub(1, Relaxed);
                } else {
                    t.handshake_ended(old.source);
                }
            }
            *t.handshaking.entry(source).or_insert(0) += 1;
            self.stats.sessions.store(t.sessions.len() as u64, Relaxed);
        }
        let r = sess.accept_hello(datagram);
        sess.drain(send);
        drop(sess);
        match r {
            Ok(Progress::Established) => {
                self.mark_established(peer, &slot);
                Handled::Handshake
            }
            Ok(_) => Handled::Handshake,
            Err(e) => {
                tracing::debug!(%peer, error = ?e, "DTLS handshake failed");
                self.stats.handshake_failures.fetch_add(1, Relaxed);
                self.remove(peer, &slot);
                Handled::Handshake
            }
        }
    }

    /// Feeds a datagram to `peer`'s session.
    #[allow(clippy::too_many_arguments)]
    fn feed(
        &self,
        now: Instant,
        peer: SocketAddr,
        slot: &Arc<Slot>,
        datagram: &[u8],
        buf: &mut [u8],
        app: &mut Deliver<'_>,
        send: &mut dyn FnMut(&[u8]),
    ) -> Handled {
        let s = &self.stats;
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
                drop(sess);
                self.mark_established(peer, slot);
                Handled::Handshake
            }
            Ok(Progress::Handshaking) => Handled::Handshake,
            Ok(Progress::Data(n)) => {
                if !was && sess.is_established() {
                    // established by a datagram that also carried data
                    drop(sess);
                    self.mark_established(peer, slot);
                }
                Handled::Data(n)
            }
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
                self.remove(peer, slot);
                if matches!(e, SessionError::Closed) {
                    Handled::Dropped
                } else {
                    Handled::Handshake
                }
            }
        }
    }

    /// The handshake of `slot` completed: counted, and it no longer counts
    /// against its source (under the table lock, so that a concurrent
    /// removal counts it exactly once).
    fn mark_established(&self, peer: SocketAddr, slot: &Arc<Slot>) {
        self.stats.handshakes.fetch_add(1, Relaxed);
        let mut t = self.table.lock();
        let held = t.sessions.get(&peer).is_some_and(|s| Arc::ptr_eq(s, slot));
        if held && !slot.established.swap(true, Relaxed) {
            t.handshake_ended(slot.source);
            self.stats.established.fetch_add(1, Relaxed);
        }
    }

    /// Drops `slot` if it is still `peer`'s session; true if it was
    /// established.
    fn remove(&self, peer: SocketAddr, slot: &Arc<Slot>) -> bool {
        let mut t = self.table.lock();
        let mut was = false;
        if t.sessions.get(&peer).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            t.sessions.remove(&peer);
            if slot.established.load(Relaxed) {
                self.stats.established.fetch_sub(1, Relaxed);
                was = true;
            } else {
                t.handshake_ended(slot.source);
            }
        }
        self.stats.sessions.store(t.sessions.len() as u64, Relaxed);
        was
    }

    /// Encrypts one CoAP datagram for `peer`; the record goes to `send`.
    /// False (and counted) when the peer has no established session.
    pub fn send(&self, peer: SocketAddr, plaintext: &[u8], send: &mut dyn FnMut(&[u8])) -> bool {
        let Some(slot) = self.table.lock().sessions.get(&peer).cloned() else {
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
        let slot = self.table.lock().sessions.get(&peer).cloned()?;
        let s = slot.session.lock();
        s.identity().cloned()
    }

    /// Periodic upkeep: draws a new cookie secret when its period is over,
    /// retransmits handshake flights whose timer ran out, drops handshakes
    /// past the handshake timeout and sessions idle past the idle timeout
    /// (with close_notify). Call every 100 ms or so.
    pub fn sweep(&self, now: Instant, send: &mut dyn FnMut(SocketAddr, &[u8])) {
        self.cookies.rotate_if_due(now);
        let slots: Vec<(SocketAddr, Arc<Slot>)> = self
            .table
            .lock()
            .sessions
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
