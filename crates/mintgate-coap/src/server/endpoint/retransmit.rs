//! Confirmable messages the server sent and waits to see acknowledged:
//! separate responses and CON notifications (RFC 7252 4.2, 5.2.2; RFC 7641
//! 4.5).
//!
//! Timing is RFC 7252 4.2 with the parameters of [`TransmissionParams`]: the
//! first timeout is drawn from `[ACK_TIMEOUT, ACK_TIMEOUT *
//! ACK_RANDOM_FACTOR]`, it doubles after each retransmission, and after
//! `MAX_RETRANSMIT` retransmissions the last one is waited for in full before
//! the message is given up (MAX_TRANSMIT_WAIT, 93 s with the defaults).
//!
//! The table is bounded: beyond `capacity` entries the one closest to
//! giving up is given up at once (counted as such).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha12Rng;
use rand::SeedableRng;

use crate::rto::TransmissionParams;
use crate::server::observe::Token;
use crate::server::response::Outgoing;

/// What a pending CON carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Carries {
    /// A separate response.
    Response,
    /// A notification to the observer with this token.
    Notification(Token),
}

/// One CON waiting for its ACK.
pub(crate) struct Pending {
    pub msg: Outgoing,
    pub listener: usize,
    pub next: Instant,
    pub timeout: Duration,
    pub retransmits: u32,
    pub carries: Carries,
}

/// What a timeout did to one entry.
pub(crate) enum Fired {
    /// Send this again.
    Retransmit(SocketAddr, usize, Outgoing),
    /// Given up: never acknowledged.
    GaveUp(SocketAddr, Carries),
}

/// The table, keyed by (peer, message ID).
pub(crate) struct Retransmissions {
    params: TransmissionParams,
    rng: ChaCha12Rng,
    by_key: HashMap<(SocketAddr, u16), Pending>,
    capacity: usize,
}

impl Retransmissions {
    pub fn new(params: TransmissionParams, capacity: usize, seed: u64) -> Retransmissions {
        Retransmissions {
            params,
            rng: ChaCha12Rng::seed_from_u64(seed),
            by_key: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Starts waiting for the ACK of `msg` (just sent). Returns an entry
    /// given up to make room, if any.
    pub fn insert(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        listener: usize,
        msg: Outgoing,
        carries: Carries,
    ) -> Option<Fired> {
        let mut evicted = None;
        if self.by_key.len() >= self.capacity && !self.by_key.contains_key(&(peer, mid)) {
            // the one with the most retransmissions behind it goes
            if let Some(k) = self
                .by_key
                .iter()
                .max_by_key(|(_, p)| (p.retransmits, std::cmp::Reverse(p.next)))
                .map(|(k, _)| *k)
            {
                if let Some(p) = self.by_key.remove(&k) {
                    evicted = Some(Fired::GaveUp(k.0, p.carries));
                }
            }
        }
        let timeout = self.params.initial_timeout(&mut self.rng);
        self.by_key.insert(
            (peer, mid),
            Pending {
                msg,
                listener,
                next: now + timeout,
                timeout,
                retransmits: 0,
                carries,
            },
        );
        evicted
    }

    /// Puts `msg` (message ID `new_mid`) in place of the CON `old_mid` to
    /// `peer`, keeping its timeout and retransmission count (RFC 7641
    /// 4.5.2): it goes out at the next retransmission. False when `old_mid`
    /// is no longer pending (acknowledged or given up meanwhile).
    pub fn replace(&mut self, peer: SocketAddr, old_mid: u16, new_mid: u16, msg: Outgoing) -> bool {
        let Some(mut p) = self.by_key.remove(&(peer, old_mid)) else {
            return false;
        };
        p.msg = msg;
        self.by_key.insert((peer, new_mid), p);
        true
    }

    /// The ACK (or Reset) of `mid` from `peer` arrived.
    pub fn remove(&mut self, peer: SocketAddr, mid: u16) -> Option<Pending> {
        self.by_key.remove(&(peer, mid))
    }

    /// Retransmits what is due and gives up what has had its last chance.
    pub fn fire(&mut self, now: Instant, out: &mut Vec<Fired>) {
        let max = self.params.max_retransmit;
        self.by_key.retain(|(peer, _), p| {
            if now < p.next {
                return true;
            }
            if p.retransmits >= max {
                out.push(Fired::GaveUp(*peer, p.carries.clone()));
                return false;
            }
            p.retransmits += 1;
            p.timeout *= 2;
            p.next = now + p.timeout;
            out.push(Fired::Retransmit(*peer, p.listener, p.msg.clone()));
            true
        });
    }

    /// The earliest time something is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.by_key.values().map(|p| p.next).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::simple_response;
    use crate::wire::{Code, MessageType};
    use mintgate_buf::{PartitionConfig, Pool};

    fn msg(pool: &Pool) -> Outgoing {
        simple_response(pool, MessageType::Con, 1, b"", Code::CONTENT, None).unwrap()
    }

    #[test]
    fn timing_follows_rfc_7252_with_the_random_factor() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 64,
            blocks: 8,
        }]);
        let params = TransmissionParams::default();
        let peer: SocketAddr = "192.0.2.1:5683".parse().unwrap();
        let mut firsts = Vec::new();
        for seed in 0..20 {
            let mut r = Retransmissions::new(params, 16, seed);
            let t0 = Instant::now();
            assert!(r
                .insert(t0, peer, 7, 0, msg(&pool), Carries::Response)
                .is_none());
            let first = r.next_due().unwrap() - t0;
            assert!(first >= Duration::from_secs(2) && first <= Duration::from_secs(3));
            firsts.push(first);
            // walk it to the end: 4 retransmissions, then given up
            let mut sent = 0;
            let t = loop {
                let t = r.next_due().unwrap();
                let mut out = Vec::new();
                r.fire(t, &mut out);
                match out.pop() {
                    Some(Fired::Retransmit(..)) => sent += 1,
                    Some(Fired::GaveUp(p, Carries::Response)) => {
                        assert_eq!(p, peer);
                        break t;
                    }
                    _ => panic!("one entry fires one event"),
                }
            };
            assert_eq!(sent, 4);
            // 31 initial timeouts from the first transmission
            assert_eq!(t - t0, first * 31);
            assert!(t - t0 <= params.max_transmit_wait());
        }
        firsts.dedup();
        assert!(firsts.len() > 1, "the first timeout is randomised");
    }

    #[test]
    fn bounded_and_replaceable() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 64,
            blocks: 8,
        }]);
        let mut r = Retransmissions::new(TransmissionParams::default(), 2, 1);
        let t0 = Instant::now();
        let peer: SocketAddr = "192.0.2.1:5683".parse().unwrap();
        assert!(r
            .insert(t0, peer, 1, 0, msg(&pool), Carries::Response)
            .is_none());
        assert!(r
            .insert(t0, peer, 2, 0, msg(&pool), Carries::Response)
            .is_none());
        assert!(matches!(
            r.insert(t0, peer, 3, 0, msg(&pool), Carries::Response),
            Some(Fired::GaveUp(..))
        ));
        assert_eq!(r.len(), 2);
        assert!(r.replace(peer, 3, 9, msg(&pool)));
        assert!(!r.replace(peer, 3, 10, msg(&pool)));
        assert!(r.remove(peer, 9).is_some());
    }
}
