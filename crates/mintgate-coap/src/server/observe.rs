//! Observe (RFC 7641), server side, sans-IO: who observes which resource,
//! with which token, and what the next notification must carry.
//!
//! The registry does not send anything. The server endpoint
//! ([`super::endpoint::Endpoint`]) registers an observer when a GET with
//! `Observe: 0` on an observable resource is answered 2.05, asks
//! [`Registry::plan`] what to send when the resource changes, tells
//! [`Registry::sent`] the message ID it used, and ends a relation (RFC 7641
//! 3.6, 4.5) on `Observe: 1`, on a Reset of any of its recent
//! notifications, on a CON notification never acknowledged, or when a
//! notification is not 2.05.
//!
//! Sequence numbers are per observer, 24 bits, increasing by one per
//! notification from the value in the registration's response. A
//! notification is confirmable when `con_every` non-confirmable ones have
//! gone since the last CON, when `con_interval` has passed (RFC 7641 4.5:
//! at least every 24 hours; the default here is much shorter), and the
//! first one after a registration always is: a registration may come from
//! a spoofed address, and only a CON that is acknowledged shows that the
//! observer is there. While a CON notification is unacknowledged no other
//! notification goes out to that observer; the newest state replaces the
//! one being retransmitted (RFC 7641 4.5.2), so an observer that went away
//! costs its retransmissions only, and its relation ends when they do.
//!
//! Bounds: `max_observers` in all and `max_per_source` per source (an IPv4
//! address or an IPv6 /64, [`Source`]), so one host cannot fill the
//! registry.
//!
//! Reliable transports (RFC 8323: TCP, TLS, WebSockets) share the
//! registry, its bounds and its sequence numbers. Each such connection has
//! a listener index of its own, at or above [`RELIABLE`]: RFC 8323 2 says
//! these transports have no message types, so none of their notifications
//! is confirmable (no CON, no ACK awaited), and their relations end when
//! the connection closes ([`Registry::remove_listener`]).
//!
//! A relation registered through a security layer that protects messages
//! end to end (OSCORE, RFC 8613 4.1.3.5) carries that layer's [`Seal`]:
//! every notification of it is protected, and one that cannot be is not
//! sent (the relation ends). A relation belongs to its seal's owner (or to
//! nobody, when plain): a registration or `Observe: 1` acts only on a
//! relation of the same owner, and a registration whose peer and token name
//! a relation of another owner is refused ([`Full::Taken`]), so a protected
//! relation never gets a plain notification nor a plain one a protected
//! notification.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::source::Source;
use super::ResponseBuilder;
use crate::wire::{OptionNumber, Packet};

/// 2^24: Observe sequence numbers wrap here.
pub const SEQ_MODULO: u32 = 1 << 24;

/// Listener indices from here on are reliable connections (RFC 8323), one
/// index per connection; below are the datagram listeners (UDP, DTLS).
pub const RELIABLE: usize = usize::MAX / 2 + 1;

/// Whether `listener` is a reliable connection (see [`RELIABLE`]).
pub fn is_reliable(listener: usize) -> bool {
    listener >= RELIABLE
}

/// Protects the notifications of a relation registered through a security
/// layer (see the module docs).
pub trait Seal: Send + Sync + fmt::Debug {
    /// Whom the relation belongs to (for OSCORE `oscore:NAME`): the
    /// identity its notifications are rendered for.
    fn owner(&self) -> &str;

    /// Protects `plain`, a whole notification as the resource rendered it
    /// (with its Observe option), into `out`. An error ends the relation
    /// and nothing is sent.
    fn seal(&self, plain: ResponseBuilder, out: &mut ResponseBuilder) -> Result<(), SealFailed>;
}

/// A notification could not be protected (RFC 8613: the sequence numbers
/// are used up, or reserving them failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealFailed;

fn owner(seal: &Option<Arc<dyn Seal>>) -> Option<&str> {
    seal.as_deref().map(|s| s.owner())
}

/// A token, inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token {
    len: u8,
    bytes: [u8; 8],
}

impl Token {
    /// Copies a token (at most 8 bytes are kept; longer ones never pass
    /// the packet check).
    pub fn new(t: &[u8]) -> Token {
        let mut bytes = [0u8; 8];
        let len = t.len().min(8);
        bytes[..len].copy_from_slice(&t[..len]);
        Token {
            len: len as u8,
            bytes,
        }
    }

    /// The token bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// What a request asks of Observe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObserveRequest {
    /// No Observe option (or not a GET).
    None,
    /// GET with `Observe: 0`.
    Register,
    /// GET with `Observe: 1`.
    Deregister,
}

/// Reads the Observe option of a GET (other values are ignored, as RFC
/// 7641 2 says of unknown values).
pub fn observe_request(p: &Packet<&[u8]>) -> ObserveRequest {
    if p.code() != crate::wire::Code::GET {
        return ObserveRequest::None;
    }
    match p.option(OptionNumber::OBSERVE).map(|o| o.uint()) {
        Some(Some(0)) => ObserveRequest::Register,
        Some(Some(1)) => ObserveRequest::Deregister,
        _ => ObserveRequest::None,
    }
}

/// Settings.
#[derive(Clone, Copy, Debug)]
pub struct ObserveConfig {
    /// Most observers in all (a registration beyond is answered without
    /// Observe, i.e. as a plain GET).
    pub max_observers: usize,
    /// A CON notification after this many NON ones (1 = every one CON).
    pub con_every: u32,
    /// A CON notification at least this often per observer.
    pub con_interval: Duration,
    /// Most observers per source (IPv4 address or IPv6 /64).
    pub max_per_source: usize,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        ObserveConfig {
            max_observers: 1024,
            con_every: 5,
            con_interval: Duration::from_secs(60),
            max_per_source: 64,
        }
    }
}

/// One observer.
#[derive(Clone, Debug)]
pub struct Observer {
    /// The client.
    pub peer: SocketAddr,
    /// Its token.
    pub token: Token,
    /// Which listener (socket) it registered on.
    pub listener: usize,
    /// Sequence number of the last message sent.
    pub seq: u32,
    /// NON notifications since the last CON.
    pub since_con: u32,
    /// When the last CON went (or the registration).
    pub last_con: Instant,
    /// Message IDs of the last notifications, newest first (a Reset of
    /// any of them ends the relation).
    pub recent_mids: [Option<u16>; RECENT_MIDS],
    /// Message ID of the CON notification waiting for its ACK.
    pub con_mid: Option<u16>,
    /// Length of the registration request: notifications to a source not
    /// verified are held to a multiple of it (anti-amplification).
    pub request_len: usize,
    /// The Accept option of the registration: notifications use the same
    /// representation (RFC 7641 3.2).
    pub accept: Option<u16>,
    /// What protects its notifications, when it was registered through a
    /// security layer.
    pub seal: Option<Arc<dyn Seal>>,
}

/// A notification to send.
#[derive(Clone, Debug)]
pub struct Notification {
    /// To whom.
    pub peer: SocketAddr,
    /// With this token.
    pub token: Token,
    /// From this listener.
    pub listener: usize,
    /// The Observe value to carry.
    pub seq: u32,
    /// CON (true) or NON.
    pub confirmable: bool,
    /// The registration's Accept option.
    pub accept: Option<u16>,
    /// The CON notification still unacknowledged, if any: the new one
    /// replaces it instead of going out at once.
    pub replaces: Option<u16>,
    /// Length of the registration request.
    pub request_len: usize,
    /// The relation's [`Seal`], if any: the notification goes out only
    /// through it.
    pub seal: Option<Arc<dyn Seal>>,
}

/// Message IDs of recent notifications kept per observer.
pub const RECENT_MIDS: usize = 4;

/// Why an observation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ended {
    /// The client sent `Observe: 1`.
    Deregistered,
    /// The client answered a notification with a Reset.
    Reset,
    /// A CON notification was never acknowledged.
    Unacknowledged,
    /// A notification was not 2.05 (the resource is gone or failed).
    NotContent,
    /// Its reliable connection (TCP, TLS, WebSockets) closed.
    Closed,
    /// A notification could not be protected ([`Seal`]).
    Unprotected,
}

impl Ended {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Ended; 6] = [
        Ended::Deregistered,
        Ended::Reset,
        Ended::Unacknowledged,
        Ended::NotContent,
        Ended::Closed,
        Ended::Unprotected,
    ];

    /// A short name for metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Ended::Deregistered => "deregistered",
            Ended::Reset => "reset",
            Ended::Unacknowledged => "unacknowledged",
            Ended::NotContent => "not_content",
            Ended::Closed => "closed",
            Ended::Unprotected => "unprotected",
        }
    }
}

/// The observers of every resource.
///
/// Invariants: one observer per (peer, token) in all; `count` is the
/// number of observers; a path with no observers has no entry;
/// `per_source` holds the number of observers of each source that has any.
#[derive(Debug, Default)]
pub struct Registry {
    cfg: ObserveConfig,
    by_path: HashMap<String, Vec<Observer>>,
    count: usize,
    per_source: HashMap<Source, usize>,
}

/// Why a registration was refused (it is answered as a plain GET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// `max_observers` in all.
    Total,
    /// `max_per_source` for this source.
    Source,
    /// The peer and token name a relation of another owner (plain against
    /// protected, or another security context).
    Taken,
}

impl Registry {
    /// An empty registry.
    pub fn new(cfg: ObserveConfig) -> Registry {
        Registry {
            cfg,
            by_path: HashMap::new(),
            count: 0,
            per_source: HashMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ObserveConfig {
        &self.cfg
    }

    /// Observers in all.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when nobody observes anything.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Observers of `path`.
    pub fn observers(&self, path: &str) -> &[Observer] {
        self.by_path.get(path).map_or(&[], |v| v.as_slice())
    }

    /// Registers (or re-registers: same peer and token) an observer of
    /// `path` that asked for the Content-Format `accept` in a request of
    /// `request_len` bytes; returns the Observe value for the response.
    /// `seal` protects its notifications (`None`: a plain relation); refused
    /// with [`Full::Taken`] when the peer and token name a relation of
    /// another owner.
    #[allow(clippy::too_many_arguments)]
    pub fn register(
        &mut self,
        path: &str,
        peer: SocketAddr,
        token: &[u8],
        listener: usize,
        accept: Option<u16>,
        request_len: usize,
        now: Instant,
        seal: Option<Arc<dyn Seal>>,
    ) -> Result<u32, Full> {
        let token = Token::new(token);
        if self
            .find(peer, token)
            .is_some_and(|o| owner(&o.seal) != owner(&seal))
        {
            return Err(Full::Taken);
        }
        let existing = self.take(peer, token);
        if existing.is_none() {
            if self.count >= self.cfg.max_observers {
                return Err(Full::Total);
            }
            let src = Source::of(&peer);
            if self.per_source.get(&src).copied().unwrap_or(0) >= self.cfg.max_per_source {
                return Err(Full::Source);
            }
        }
        let seq = existing.map_or(1, |o| (o.seq + 1) % SEQ_MODULO);
        *self.per_source.entry(Source::of(&peer)).or_insert(0) += 1;
        self.by_path
            .entry(path.to_string())
            .or_default()
            .push(Observer {
                peer,
                token,
                listener,
                seq,
                // the first notification is confirmable
                since_con: self.cfg.con_every.max(1),
                last_con: now,
                recent_mids: [None; RECENT_MIDS],
                con_mid: None,
                request_len,
                accept,
                seal,
            });
        self.count += 1;
        Ok(seq)
    }

    fn find(&self, peer: SocketAddr, token: Token) -> Option<&Observer> {
        self.by_path
            .values()
            .flatten()
            .find(|o| o.peer == peer && o.token == token)
    }

    fn take(&mut self, peer: SocketAddr, token: Token) -> Option<Observer> {
        let mut found = None;
        self.by_path.retain(|_, v| {
            if let Some(i) = v.iter().position(|o| o.peer == peer && o.token == token) {
                found = Some(v.swap_remove(i));
            }
            !v.is_empty()
        });
        if let Some(o) = &found {
            self.count -= 1;
            self.uncount(&o.peer);
        }
        found
    }

    fn uncount(&mut self, peer: &SocketAddr) {
        let src = Source::of(peer);
        if let Some(n) = self.per_source.get_mut(&src) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&src);
            }
        }
    }

    /// Observers of the source (IPv4 address or IPv6 /64) of `peer`.
    pub fn of_source(&self, peer: &SocketAddr) -> usize {
        self.per_source.get(&Source::of(peer)).copied().unwrap_or(0)
    }

    /// Removes the observer (peer, token); returns whether there was one.
    pub fn deregister(&mut self, peer: SocketAddr, token: &[u8]) -> bool {
        self.take(peer, Token::new(token)).is_some()
    }

    /// Removes the observer (peer, token) if it belongs to `owner` (the
    /// [`Seal::owner`] of a protected relation, `None` for a plain one):
    /// an `Observe: 1` acts only on a relation of its own kind.
    pub fn deregister_as(&mut self, peer: SocketAddr, token: &[u8], who: Option<&str>) -> bool {
        let token = Token::new(token);
        if self
            .find(peer, token)
            .is_some_and(|o| owner(&o.seal) == who)
        {
            return self.take(peer, token).is_some();
        }
        false
    }

    /// Removes the observer one of whose recent notifications (or the CON
    /// one outstanding) had message ID `mid`: `peer` answered it with a
    /// Reset.
    pub fn remove_by_mid(&mut self, peer: SocketAddr, mid: u16) -> Option<Observer> {
        let key = self
            .by_path
            .values()
            .flatten()
            .find(|o| {
                o.peer == peer && (o.con_mid == Some(mid) || o.recent_mids.contains(&Some(mid)))
            })
            .map(|o| o.token)?;
        self.take(peer, key)
    }

    /// `peer` acknowledged the CON notification `mid`: the next
    /// notification goes out at once again. False when no observer waited
    /// for that ACK.
    pub fn acked(&mut self, peer: SocketAddr, token: Token, mid: u16) -> bool {
        for o in self.by_path.values_mut().flatten() {
            if o.peer == peer && o.token == token && o.con_mid == Some(mid) {
                o.con_mid = None;
                return true;
            }
        }
        false
    }

    /// Removes every observer that registered on `listener` (a reliable
    /// connection that closed); returns how many there were.
    pub fn remove_listener(&mut self, listener: usize) -> usize {
        let mut gone = Vec::new();
        self.by_path.retain(|_, v| {
            v.retain(|o| {
                let keep = o.listener != listener;
                if !keep {
                    gone.push(o.peer);
                }
                keep
            });
            !v.is_empty()
        });
        self.count -= gone.len();
        for p in &gone {
            self.uncount(p);
        }
        gone.len()
    }

    /// Removes every observer of `path` (the resource is gone).
    pub fn remove_path(&mut self, path: &str) -> Vec<Observer> {
        let v = self.by_path.remove(path).unwrap_or_default();
        self.count -= v.len();
        for o in &v {
            self.uncount(&o.peer);
        }
        v
    }

    /// The notifications to send for a change of `path` now, with their
    /// sequence numbers advanced.
    pub fn plan(&mut self, path: &str, now: Instant) -> Vec<Notification> {
        let cfg = self.cfg;
        let Some(v) = self.by_path.get_mut(path) else {
            return Vec::new();
        };
        v.iter_mut()
            .map(|o| {
                o.seq = (o.seq + 1) % SEQ_MODULO;
                // a replacement for the CON in flight stays confirmable;
                // a reliable connection has no CON at all
                let con = !is_reliable(o.listener)
                    && (o.con_mid.is_some()
                        || o.since_con + 1 >= cfg.con_every.max(1)
                        || now.saturating_duration_since(o.last_con) >= cfg.con_interval);
                if con {
                    o.since_con = 0;
                    o.last_con = now;
                } else {
                    o.since_con = o.since_con.saturating_add(1);
                }
                Notification {
                    peer: o.peer,
                    token: o.token,
                    listener: o.listener,
                    seq: o.seq,
                    confirmable: con,
                    accept: o.accept,
                    replaces: o.con_mid,
                    request_len: o.request_len,
                    seal: o.seal.clone(),
                }
            })
            .collect()
    }

    /// Records the message ID a notification went with (for a CON, the one
    /// whose ACK is now awaited).
    pub fn sent(&mut self, path: &str, peer: SocketAddr, token: Token, mid: u16, con: bool) {
        if let Some(o) = self
            .by_path
            .get_mut(path)
            .and_then(|v| v.iter_mut().find(|o| o.peer == peer && o.token == token))
        {
            o.recent_mids.rotate_right(1);
            o.recent_mids[0] = Some(mid);
            if con {
                o.con_mid = Some(mid);
            }
        }
    }
}

/// RFC 7641 3.4, the client's rule: is a notification with Observe value
/// `v2` received at `t2` newer than the one with `v1` at `t1`?
pub fn fresher(v1: u32, t1: Instant, v2: u32, t2: Instant) -> bool {
    let (v1, v2) = (v1 % SEQ_MODULO, v2 % SEQ_MODULO);
    (v1 < v2 && v2 - v1 < 1 << 23)
        || (v1 > v2 && v1 - v2 > 1 << 23)
        || t2.saturating_duration_since(t1) > Duration::from_secs(128)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peer(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn register_notify_and_leave() {
        let mut r = Registry::new(ObserveConfig {
            max_observers: 2,
            con_every: 3,
            con_interval: Duration::from_secs(60),
            max_per_source: 8,
        });
        let t0 = Instant::now();
        assert_eq!(
            r.register("s/t", peer(1), b"ab", 0, None, 20, t0, None),
            Ok(1)
        );
        assert_eq!(
            r.register("s/t", peer(2), b"ab", 0, None, 20, t0, None),
            Ok(1)
        );
        assert_eq!(
            r.register("s/u", peer(3), b"x", 0, None, 20, t0, None),
            Err(Full::Total)
        );
        // re-registration keeps one entry and moves the sequence on
        assert_eq!(
            r.register("s/t", peer(1), b"ab", 0, None, 20, t0, None),
            Ok(2)
        );
        assert_eq!(r.len(), 2);
        assert_eq!(r.of_source(&peer(1)), 2, "one host, two ports");
        let cons: Vec<bool> = (0..7)
            .map(|_| {
                r.plan("s/t", t0)
                    .iter()
                    .find(|n| n.peer == peer(1))
                    .unwrap()
                    .confirmable
            })
            .collect();
        // the first is CON, then every third
        assert_eq!(cons, vec![true, false, false, true, false, false, true]);
        let n = r.plan("s/t", t0 + Duration::from_secs(61));
        assert!(n.iter().all(|n| n.confirmable), "the interval forces a CON");
        assert_eq!(n.iter().find(|n| n.peer == peer(1)).unwrap().seq, 10);
        r.sent("s/t", peer(2), Token::new(b"ab"), 77, false);
        r.sent("s/t", peer(2), Token::new(b"ab"), 78, true);
        assert!(
            r.remove_by_mid(peer(1), 77).is_none(),
            "the MID is peer 2's"
        );
        // a CON in flight makes the next one replace it
        let n = r.plan("s/t", t0);
        let p2 = n.iter().find(|n| n.peer == peer(2)).unwrap();
        assert_eq!((p2.replaces, p2.confirmable), (Some(78), true));
        assert!(r.acked(peer(2), Token::new(b"ab"), 78));
        assert!(!r.acked(peer(2), Token::new(b"ab"), 78));
        // an older NON's MID still ends it
        assert_eq!(r.remove_by_mid(peer(2), 77).map(|o| o.peer), Some(peer(2)));
        assert!(r.deregister(peer(1), b"ab"));
        assert!(!r.deregister(peer(1), b"ab"));
        assert!(r.is_empty());
        assert_eq!(r.of_source(&peer(1)), 0);
        assert!(r.plan("s/t", t0).is_empty());
    }

    #[test]
    fn a_source_has_its_share() {
        let mut r = Registry::new(ObserveConfig {
            max_observers: 100,
            max_per_source: 3,
            ..ObserveConfig::default()
        });
        let t = Instant::now();
        for p in 0..3 {
            assert!(r.register("a", peer(p), b"t", 0, None, 20, t, None).is_ok());
        }
        assert_eq!(
            r.register("a", peer(9), b"t", 0, None, 20, t, None),
            Err(Full::Source)
        );
        let other = SocketAddr::from(([127, 0, 0, 2], 1));
        assert!(r.register("a", other, b"t", 0, None, 20, t, None).is_ok());
        r.remove_path("a");
        assert!(r.register("a", peer(9), b"t", 0, None, 20, t, None).is_ok());
    }

    #[test]
    fn a_reliable_connection_gets_no_con_and_its_close_ends_its_relations() {
        let mut r = Registry::new(ObserveConfig {
            max_observers: 4,
            con_every: 1,
            con_interval: Duration::ZERO,
            max_per_source: 3,
        });
        let t = Instant::now();
        let (tcp, other) = (RELIABLE + 7, RELIABLE + 8);
        assert!(is_reliable(tcp) && !is_reliable(0));
        assert_eq!(
            r.register("a", peer(1), b"x", tcp, None, 20, t, None),
            Ok(1)
        );
        assert_eq!(
            r.register("b", peer(1), b"y", tcp, None, 20, t, None),
            Ok(1)
        );
        assert_eq!(
            r.register("a", peer(2), b"x", other, None, 20, t, None),
            Ok(1)
        );
        // the source is full across UDP and TCP alike
        assert_eq!(
            r.register("a", peer(3), b"x", 0, None, 20, t, None),
            Err(Full::Source)
        );
        // con_every 1 makes every UDP notification CON; none over TCP
        for round in 0..3u32 {
            let n = r.plan("a", t);
            assert_eq!(n.len(), 2);
            assert!(n.iter().all(|n| !n.confirmable && n.replaces.is_none()));
            assert!(n.iter().all(|n| n.seq == round + 2), "{n:?}");
        }
        assert_eq!(r.remove_listener(tcp), 2);
        assert_eq!(r.len(), 1);
        assert!(r.observers("b").is_empty());
        assert_eq!(r.of_source(&peer(1)), 1, "peer 2's relation stays");
        assert_eq!(r.remove_listener(tcp), 0);
        assert_eq!(r.register("a", peer(3), b"x", 0, None, 20, t, None), Ok(1));
        assert!(r.plan("a", t).iter().any(|n| n.confirmable), "UDP: CON");
    }

    #[derive(Debug)]
    struct Named(&'static str);
    impl Seal for Named {
        fn owner(&self) -> &str {
            self.0
        }
        fn seal(&self, _: ResponseBuilder, _: &mut ResponseBuilder) -> Result<(), SealFailed> {
            Err(SealFailed)
        }
    }

    #[test]
    fn a_relation_is_acted_on_only_by_requests_of_its_owner() {
        let mut r = Registry::new(ObserveConfig::default());
        let t = Instant::now();
        let a: Arc<dyn Seal> = Arc::new(Named("oscore:a"));
        let b: Arc<dyn Seal> = Arc::new(Named("oscore:b"));
        let reg = |r: &mut Registry, tok: &[u8], s: &Option<Arc<dyn Seal>>| {
            r.register("x", peer(1), tok, 0, None, 20, t, s.clone())
        };
        assert_eq!(reg(&mut r, b"p", &Some(a.clone())), Ok(1));
        // plain, or another context, with the same peer and token: refused
        assert_eq!(reg(&mut r, b"p", &None), Err(Full::Taken));
        assert_eq!(reg(&mut r, b"p", &Some(b.clone())), Err(Full::Taken));
        assert!(!r.deregister_as(peer(1), b"p", None));
        assert!(!r.deregister_as(peer(1), b"p", Some("oscore:b")));
        // its own owner re-registers (the number goes on) and deregisters
        assert_eq!(reg(&mut r, b"p", &Some(a.clone())), Ok(2));
        let n = r.plan("x", t);
        assert_eq!(n[0].seal.as_ref().map(|s| s.owner()), Some("oscore:a"));
        assert!(r.deregister_as(peer(1), b"p", Some("oscore:a")));
        // a plain relation is not ended by a protected Observe: 1
        assert_eq!(reg(&mut r, b"q", &None), Ok(1));
        assert_eq!(reg(&mut r, b"q", &Some(a)), Err(Full::Taken));
        assert!(!r.deregister_as(peer(1), b"q", Some("oscore:a")));
        assert!(r.plan("x", t).iter().all(|n| n.seal.is_none()));
        assert!(r.deregister_as(peer(1), b"q", None));
        assert!(r.is_empty());
    }

    #[test]
    fn freshness_follows_rfc_7641() {
        let t = Instant::now();
        assert!(fresher(1, t, 2, t));
        assert!(!fresher(2, t, 1, t));
        assert!(fresher(SEQ_MODULO - 1, t, 0, t), "wrap-around");
        assert!(!fresher(5, t, 5, t));
        assert!(
            fresher(9, t, 1, t + Duration::from_secs(129)),
            "128 s apart: newer anyway"
        );
    }

    proptest! {
        #[test]
        fn count_matches_entries(ops in proptest::collection::vec((0u8..5, 0u16..4, 0u8..3), 0..60)) {
            let mut r = Registry::new(ObserveConfig { max_observers: 5, max_per_source: 3, ..ObserveConfig::default() });
            let t = Instant::now();
            for (op, p, tok) in ops {
                let path = if tok == 0 { "a" } else { "b" };
                match op {
                    // odd ports register over a reliable connection each
                    0 | 1 => {
                        let li = if p % 2 == 1 { RELIABLE + p as usize } else { 0 };
                        let _ = r.register(path, peer(p), &[tok], li, None, 20, t, None);
                    }
                    2 => { r.deregister(peer(p), &[tok]); }
                    3 => { r.remove_path(path); }
                    _ => { r.remove_listener(RELIABLE + p as usize); }
                }
                let entries: usize = ["a", "b"].iter().map(|p| r.observers(p).len()).sum();
                prop_assert_eq!(entries, r.len());
                prop_assert!(r.len() <= 5);
                let by_source: usize = [1u16].iter().map(|p| r.of_source(&peer(*p))).sum();
                prop_assert_eq!(by_source, r.len(), "all peers are one host");
                prop_assert!(r.len() <= 3);
            }
        }
    }
}
