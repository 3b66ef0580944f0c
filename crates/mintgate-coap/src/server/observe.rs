//! Observe (RFC 7641), server side, sans-IO: who observes which resource,
//! with which token, and what the next notification must carry.
//!
//! The registry does not send anything. The gateway registers an observer
//! when a GET with `Observe: 0` on an observable resource is answered 2.05,
//! asks [`Registry::plan`] what to send when the resource changes, tells
//! [`Registry::sent`] the message ID it used, and removes observers on a
//! Reset, on `Observe: 1`, on a CON notification never acknowledged, or
//! when a notification is not 2.05.
//!
//! Sequence numbers are per observer, 24 bits, increasing by one per
//! notification from the value in the registration's response. A
//! notification is confirmable when `con_every` non-confirmable ones have
//! gone since the last CON, or when `con_interval` has passed (RFC 7641
//! 4.5: at least every 24 hours; the default here is much shorter, so that
//! a client that went away is found out and dropped).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::wire::{OptionNumber, Packet};

/// 2^24: Observe sequence numbers wrap here.
pub const SEQ_MODULO: u32 = 1 << 24;

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
}

impl Default for ObserveConfig {
    fn default() -> Self {
        ObserveConfig {
            max_observers: 1024,
            con_every: 10,
            con_interval: Duration::from_secs(60),
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
    /// Message ID of the last notification (to match a Reset).
    pub last_mid: Option<u16>,
    /// The Accept option of the registration: notifications use the same
    /// representation (RFC 7641 3.2).
    pub accept: Option<u16>,
}

/// A notification to send.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// The observers of every resource.
///
/// Invariants: one observer per (peer, token) in all; `count` is the
/// number of observers; a path with no observers has no entry.
#[derive(Debug, Default)]
pub struct Registry {
    cfg: ObserveConfig,
    by_path: HashMap<String, Vec<Observer>>,
    count: usize,
}

/// The registry is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

impl Registry {
    /// An empty registry.
    pub fn new(cfg: ObserveConfig) -> Registry {
        Registry {
            cfg,
            by_path: HashMap::new(),
            count: 0,
        }
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
    /// `path` that asked for the Content-Format `accept`; returns the
    /// Observe value for the response.
    pub fn register(
        &mut self,
        path: &str,
        peer: SocketAddr,
        token: &[u8],
        listener: usize,
        accept: Option<u16>,
        now: Instant,
    ) -> Result<u32, Full> {
        let token = Token::new(token);
        let existing = self.take(peer, token);
        if existing.is_none() && self.count >= self.cfg.max_observers {
            return Err(Full);
        }
        let seq = existing.map_or(1, |o| (o.seq + 1) % SEQ_MODULO);
        self.by_path
            .entry(path.to_string())
            .or_default()
            .push(Observer {
                peer,
                token,
                listener,
                seq,
                since_con: 0,
                last_con: now,
                last_mid: None,
                accept,
            });
        self.count += 1;
        Ok(seq)
    }

    fn take(&mut self, peer: SocketAddr, token: Token) -> Option<Observer> {
        let mut found = None;
        self.by_path.retain(|_, v| {
            if let Some(i) = v.iter().position(|o| o.peer == peer && o.token == token) {
                found = Some(v.swap_remove(i));
            }
            !v.is_empty()
        });
        if found.is_some() {
            self.count -= 1;
        }
        found
    }

    /// Removes the observer (peer, token); returns whether there was one.
    pub fn deregister(&mut self, peer: SocketAddr, token: &[u8]) -> bool {
        self.take(peer, Token::new(token)).is_some()
    }

    /// Removes the observer whose last notification had message ID `mid`
    /// (a Reset from `peer`, or a CON never acknowledged).
    pub fn remove_by_mid(&mut self, peer: SocketAddr, mid: u16) -> Option<Observer> {
        let key = self
            .by_path
            .values()
            .flatten()
            .find(|o| o.peer == peer && o.last_mid == Some(mid))
            .map(|o| o.token)?;
        self.take(peer, key)
    }

    /// Removes every observer of `path` (the resource is gone).
    pub fn remove_path(&mut self, path: &str) -> Vec<Observer> {
        let v = self.by_path.remove(path).unwrap_or_default();
        self.count -= v.len();
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
                let con = o.since_con + 1 >= cfg.con_every.max(1)
                    || now.saturating_duration_since(o.last_con) >= cfg.con_interval;
                if con {
                    o.since_con = 0;
                    o.last_con = now;
                } else {
                    o.since_con += 1;
                }
                Notification {
                    peer: o.peer,
                    token: o.token,
                    listener: o.listener,
                    seq: o.seq,
                    confirmable: con,
                    accept: o.accept,
                }
            })
            .collect()
    }

    /// Records the message ID a notification went with.
    pub fn sent(&mut self, path: &str, peer: SocketAddr, token: Token, mid: u16) {
        if let Some(o) = self
            .by_path
            .get_mut(path)
            .and_then(|v| v.iter_mut().find(|o| o.peer == peer && o.token == token))
        {
            o.last_mid = Some(mid);
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
        });
        let t0 = Instant::now();
        assert_eq!(r.register("s/t", peer(1), b"ab", 0, None, t0), Ok(1));
        assert_eq!(r.register("s/t", peer(2), b"ab", 0, None, t0), Ok(1));
        assert_eq!(r.register("s/u", peer(3), b"x", 0, None, t0), Err(Full));
        // re-registration keeps one entry and moves the sequence on
        assert_eq!(r.register("s/t", peer(1), b"ab", 0, None, t0), Ok(2));
        assert_eq!(r.len(), 2);
        let cons: Vec<bool> = (0..6)
            .map(|_| {
                r.plan("s/t", t0)
                    .iter()
                    .find(|n| n.peer == peer(1))
                    .unwrap()
                    .confirmable
            })
            .collect();
        assert_eq!(cons, vec![false, false, true, false, false, true]);
        let n = r.plan("s/t", t0 + Duration::from_secs(61));
        assert!(n.iter().all(|n| n.confirmable), "the interval forces a CON");
        assert_eq!(n.iter().find(|n| n.peer == peer(1)).unwrap().seq, 9);
        r.sent("s/t", peer(2), Token::new(b"ab"), 77);
        assert!(
            r.remove_by_mid(peer(1), 77).is_none(),
            "the MID is peer 2's"
        );
        assert_eq!(r.remove_by_mid(peer(2), 77).map(|o| o.peer), Some(peer(2)));
        assert!(r.deregister(peer(1), b"ab"));
        assert!(!r.deregister(peer(1), b"ab"));
        assert!(r.is_empty());
        assert!(r.plan("s/t", t0).is_empty());
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
        fn count_matches_entries(ops in proptest::collection::vec((0u8..4, 0u16..4, 0u8..3), 0..60)) {
            let mut r = Registry::new(ObserveConfig { max_observers: 5, ..ObserveConfig::default() });
            let t = Instant::now();
            for (op, p, tok) in ops {
                let path = if tok == 0 { "a" } else { "b" };
                match op {
                    0 | 1 => { let _ = r.register(path, peer(p), &[tok], 0, None, t); }
                    2 => { r.deregister(peer(p), &[tok]); }
                    _ => { r.remove_path(path); }
                }
                let entries: usize = ["a", "b"].iter().map(|p| r.observers(p).len()).sum();
                prop_assert_eq!(entries, r.len());
                prop_assert!(r.len() <= 5);
            }
        }
    }
}
