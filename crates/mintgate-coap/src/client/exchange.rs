//! The state of one exchange.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::wire::MAX_TOKEN_LEN;

/// A token of 0-8 bytes, stored inline so that it can key a map without
/// allocating.
///
/// Invariant: `len <= 8` and the bytes past `len` are zero, so equality and
/// hashing see only the token itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Token {
    len: u8,
    bytes: [u8; MAX_TOKEN_LEN],
}

impl Token {
    /// The first `len` (at most 8) bytes of `random`.
    pub(super) fn new(random: [u8; MAX_TOKEN_LEN], len: usize) -> Token {
        let len = len.min(MAX_TOKEN_LEN);
        let mut bytes = [0; MAX_TOKEN_LEN];
        bytes[..len].copy_from_slice(&random[..len]);
        Token {
            len: len as u8,
            bytes,
        }
    }

    /// A received token; `None` when longer than 8 bytes.
    pub(super) fn from_slice(t: &[u8]) -> Option<Token> {
        if t.len() > MAX_TOKEN_LEN {
            return None;
        }
        let mut bytes = [0; MAX_TOKEN_LEN];
        bytes[..t.len()].copy_from_slice(t);
        Some(Token {
            len: t.len() as u8,
            bytes,
        })
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }
}

/// Where an exchange is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Waiting for an NSTART slot at its destination; not sent. Its timer,
    /// if any, is the end of a NON pacing interval.
    Queued,
    /// A CON that was sent and awaits its ACK; `rto` is the timeout running
    /// now. Holds a slot.
    AwaitingAck { rto: Duration },
    /// Awaiting the response only: a NON request (`holds_slot`), or a CON
    /// already acknowledged by an empty ACK (no longer outstanding, so it
    /// holds no slot).
    AwaitingResponse { holds_slot: bool },
}

impl State {
    /// Whether the exchange counts against NSTART at its destination.
    pub(super) fn holds_slot(self) -> bool {
        match self {
            State::Queued => false,
            State::AwaitingAck { .. } => true,
            State::AwaitingResponse { holds_slot } => holds_slot,
        }
    }
}

/// One request and what is known about its fate.
#[derive(Debug)]
pub(super) struct Exchange {
    pub(super) dest: SocketAddr,
    pub(super) confirmable: bool,
    pub(super) token: Token,
    /// Assigned when the exchange starts (meaningless while queued).
    pub(super) mid: u16,
    /// The encoded request, resent byte for byte on retransmission.
    pub(super) bytes: Vec<u8>,
    /// The first transmission (the request time while queued).
    pub(super) first_tx: Instant,
    /// When the running timer expires; `None` while queued, unless the
    /// exchange is a NON held back by pacing.
    pub(super) deadline: Option<Instant>,
    /// Retransmissions made so far.
    pub(super) retransmissions: u32,
    pub(super) state: State,
}
