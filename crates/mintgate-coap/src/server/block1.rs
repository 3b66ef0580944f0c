//! Block-wise transfer (RFC 7959), Block1 on the server side: a PUT or POST
//! whose payload arrives in blocks is put back together before its handler
//! runs, so the handler sees one request with the whole payload (the
//! "atomic" server of RFC 7959 section 2.5).
//!
//! [`Block1Store`] is sans-IO: the caller passes each block request and the
//! current `Instant`, and gets back what to answer ([`Block1Outcome`]).
//!
//! - A transfer is identified by the peer, the method and the request
//!   options that name the target (Uri-Host, Uri-Port, Uri-Path, Uri-Query)
//!   plus Request-Tag (RFC 9175), not by the token: RFC 7959 lets a client
//!   use a new token for every block, and libcoap does.
//! - Block 0 starts a transfer (replacing one with the same key). A later
//!   block is stored at its byte offset (num x size, so a client may change
//!   the block size on the way, as the server's 2.31 may ask); a block
//!   repeated under a new message ID overwrites the same bytes. Blocks may
//!   come out of order: the received byte ranges are tracked (at most
//!   [`MAX_RANGES`] separate ones).
//! - A non-final block is answered 2.31 Continue with Block1 (num, M=1);
//!   to block 0 the server names its own block size when it is smaller.
//! - The final block (M=0) completes the transfer when every byte before it
//!   has arrived; otherwise 4.08 Request Entity Incomplete, as for a block
//!   of a transfer that is unknown or has timed out.
//! - Size limits: a body beyond `max_body` (by its Size1 or by the blocks
//!   themselves) is refused 4.13 Request Entity Too Large with Size1 =
//!   `max_body`; when all transfers together would hold more than
//!   `max_bytes`, or `max_transfers` are open, the newcomer gets 5.03 with
//!   Max-Age (seconds until the oldest transfer times out). Each peer has at
//!   most `per_peer` transfers: a further one evicts that peer's oldest.
//! - A transfer idle for `timeout` is dropped ([`Block1Store::expire`]).
//! - A completed body is kept (finished transfers are evicted first when
//!   room is needed) until it has been idle for `timeout`, so that a
//!   response too large for one message can be fetched block-wise by
//!   requests that repeat the method with Block2 and no payload (RFC 7959
//!   section 3.3): [`Block1Store::continuation`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::block::{szx_for, BlockOpt};
use crate::wire::{Code, MessageWriter, OptionNumber, Packet};

/// Request-Tag (RFC 9175): tells concurrent block-wise transfers of the same
/// resource apart.
pub const REQUEST_TAG: OptionNumber = OptionNumber(292);

/// Separate byte ranges a transfer may have before it is refused as
/// incomplete (out-of-order blocks leave gaps).
pub const MAX_RANGES: usize = 8;

/// Largest message a reassembled request may make (the wire format's limit
/// in this implementation).
const MAX_MESSAGE: usize = u16::MAX as usize;

/// Limits of Block1 reassembly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block1Config {
    /// Largest body of one transfer, bytes.
    pub max_body: usize,
    /// Bytes all transfers (partial and kept) may hold together.
    pub max_bytes: usize,
    /// Transfers open at once, all peers together.
    pub max_transfers: usize,
    /// Transfers open at once per peer.
    pub per_peer: usize,
    /// A transfer idle this long is dropped.
    pub timeout: Duration,
    /// The block size the server asks for (a power of two, 16..=1024).
    pub block_size: usize,
}

impl Default for Block1Config {
    fn default() -> Self {
        Block1Config {
            max_body: 64_000,
            max_bytes: 1 << 20,
            max_transfers: 256,
            per_peer: 4,
            timeout: Duration::from_secs(60),
            block_size: 1024,
        }
    }
}

/// Counters, increasing over the store's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Block1Stats {
    /// Transfers started (block 0 with M=1).
    pub started: u64,
    /// Transfers completed (the handler ran on the whole body).
    pub completed: u64,
    /// Blocks answered 2.31 Continue.
    pub continued: u64,
    /// Answers 4.08 Request Entity Incomplete.
    pub incomplete: u64,
    /// Answers 4.13 Request Entity Too Large.
    pub too_large: u64,
    /// Answers 5.03 (no room for another transfer).
    pub busy: u64,
    /// Answers 4.00 (a block of the wrong size).
    pub bad: u64,
    /// Transfers dropped after `timeout` idle (partial ones only).
    pub expired: u64,
    /// Transfers evicted for room (a peer's oldest, or kept bodies).
    pub evicted: u64,
    /// Block2 requests served from a kept body.
    pub continuations: u64,
}

/// What to answer to a block.
#[derive(Debug, PartialEq, Eq)]
pub enum Block1Outcome {
    /// Answer at once with this code, and the Block1, Size1 and Max-Age
    /// options given.
    Reply {
        /// 2.31, 4.00, 4.08, 4.13 or 5.03.
        code: Code,
        /// Block1 for the answer (2.31).
        block1: Option<BlockOpt>,
        /// Size1 for the answer (4.13).
        size1: Option<u32>,
        /// Max-Age for the answer (5.03).
        max_age: Option<u32>,
    },
    /// The request was whole in its one block (block 0, M=0): handle it as
    /// it is and answer with this Block1.
    Whole {
        /// Block1 for the answer.
        block1: BlockOpt,
    },
    /// The body is complete: handle `datagram` (the final block's message
    /// with the whole body as payload and without Block1 and Size1) and
    /// answer with this Block1.
    Complete {
        /// The reassembled request.
        datagram: Vec<u8>,
        /// Block1 for the answer.
        block1: BlockOpt,
    },
}

impl Block1Outcome {
    fn reply(code: Code) -> Block1Outcome {
        Block1Outcome::Reply {
            code,
            block1: None,
            size1: None,
            max_age: None,
        }
    }
}

/// (peer, method, target options) of a transfer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    peer: SocketAddr,
    code: u8,
    /// Number (2 bytes), length (2 bytes) and value of each option that
    /// names the target, in message order.
    target: Vec<u8>,
}

impl Key {
    fn new(peer: SocketAddr, p: &Packet<&[u8]>) -> Key {
        let mut target = Vec::new();
        for o in p.options().filter(|o| is_target_option(o.number)) {
            target.extend_from_slice(&o.number.0.to_be_bytes());
            target.extend_from_slice(&(o.value.len() as u16).to_be_bytes());
            target.extend_from_slice(o.value);
        }
        Key {
            peer,
            code: p.code().0,
            target,
        }
    }
}

fn is_target_option(n: OptionNumber) -> bool {
    matches!(
        n,
        OptionNumber::URI_HOST
            | OptionNumber::URI_PORT
            | OptionNumber::URI_PATH
            | OptionNumber::URI_QUERY
            | REQUEST_TAG
    )
}

struct Transfer {
    /// Bytes at their offsets; `len()` is the highest end received.
    body: Vec<u8>,
    /// Received byte ranges, sorted, merged, at most [`MAX_RANGES`].
    have: Vec<(usize, usize)>,
    /// Last block received (or last continuation served).
    last: Instant,
    /// Order of creation, for eviction.
    seq: u64,
    /// Complete: kept for Block2 continuations only.
    done: bool,
    /// Bytes charged against `max_bytes`: the capacity asked for the body.
    charged: usize,
}

impl Transfer {
    /// Adds `[start, end)` to the received ranges; false when that would
    /// make more than [`MAX_RANGES`] separate ones.
    fn add_range(&mut self, start: usize, end: usize) -> bool {
        let mut merged = (start, end);
        let mut out: Vec<(usize, usize)> = Vec::with_capacity(self.have.len() + 1);
        for &(s, e) in &self.have {
            if e < merged.0 || s > merged.1 {
                out.push((s, e));
            } else {
                merged = (merged.0.min(s), merged.1.max(e));
            }
        }
        out.push(merged);
        out.sort_unstable();
        if out.len() > MAX_RANGES {
            return false;
        }
        self.have = out;
        true
    }
}

/// Block1 reassembly state of a server. See the [module documentation](self).
///
/// Invariants: `bytes` is the sum of the transfers' `charged` and never
/// above `max_bytes` after a call returns; at most `max_transfers`
/// transfers, at most `per_peer` per peer.
pub struct Block1Store {
    cfg: Block1Config,
    transfers: HashMap<Key, Transfer>,
    bytes: usize,
    next_seq: u64,
    stats: Block1Stats,
}

impl Block1Store {
    /// An empty store with these limits.
    pub fn new(cfg: Block1Config) -> Block1Store {
        Block1Store {
            cfg,
            transfers: HashMap::new(),
            bytes: 0,
            next_seq: 0,
            stats: Block1Stats::default(),
        }
    }

    /// The limits.
    pub fn config(&self) -> &Block1Config {
        &self.cfg
    }

    /// Transfers held (partial and kept).
    pub fn len(&self) -> usize {
        self.transfers.len()
    }

    /// Whether no transfer is held.
    pub fn is_empty(&self) -> bool {
        self.transfers.is_empty()
    }

    /// Bytes held by all transfers.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The counters.
    pub fn stats(&self) -> Block1Stats {
        self.stats
    }

    /// Drops transfers idle for `timeout` at `now`; returns how many went.
    pub fn expire(&mut self, now: Instant) -> usize {
        let timeout = self.cfg.timeout;
        let before = self.transfers.len();
        let mut freed = 0;
        let mut expired = 0;
        self.transfers.retain(|_, t| {
            let keep = now.saturating_duration_since(t.last) < timeout;
            if !keep {
                freed += t.charged;
                expired += u64::from(!t.done);
            }
            keep
        });
        self.bytes -= freed;
        self.stats.expired += expired;
        before - self.transfers.len()
    }

    fn remove(&mut self, key: &Key) -> Option<Transfer> {
        let t = self.transfers.remove(key)?;
        self.bytes -= t.charged;
        Some(t)
    }

    /// Drops the transfer of the oldest `seq` among those `pick` selects.
    fn evict_oldest(&mut self, pick: impl Fn(&Key, &Transfer) -> bool) -> bool {
        let victim = self
            .transfers
            .iter()
            .filter(|(k, t)| pick(k, t))
            .min_by_key(|(_, t)| t.seq)
            .map(|(k, _)| k.clone());
        match victim {
            Some(k) => {
                self.remove(&k);
                self.stats.evicted += 1;
                true
            }
            None => false,
        }
    }

    /// Seconds until the oldest transfer times out (at least 1).
    fn retry_after(&self, now: Instant) -> u32 {
        let soonest = self
            .transfers
            .values()
            .map(|t| {
                self.cfg
                    .timeout
                    .saturating_sub(now.saturating_duration_since(t.last))
            })
            .min()
            .unwrap_or(Duration::ZERO);
        soonest.as_secs().clamp(1, u32::MAX as u64) as u32
    }

    fn too_large(&mut self) -> Block1Outcome {
        self.stats.too_large += 1;
        Block1Outcome::Reply {
            code: Code::REQUEST_ENTITY_TOO_LARGE,
            block1: None,
            size1: Some(self.cfg.max_body.min(u32::MAX as usize) as u32),
            max_age: None,
        }
    }

    fn incomplete(&mut self) -> Block1Outcome {
        self.stats.incomplete += 1;
        Block1Outcome::reply(Code::REQUEST_ENTITY_INCOMPLETE)
    }

    fn busy(&mut self, now: Instant) -> Block1Outcome {
        self.stats.busy += 1;
        Block1Outcome::Reply {
            code: Code::SERVICE_UNAVAILABLE,
            block1: None,
            size1: None,
            max_age: Some(self.retry_after(now)),
        }
    }

    /// Makes room for `extra` more bytes, evicting kept bodies of other
    /// transfers (oldest first) when needed, and charges them; false when
    /// `max_bytes` does not allow it.
    fn make_room(&mut self, extra: usize, key: &Key) -> bool {
        while self.bytes + extra > self.cfg.max_bytes {
            if !self.evict_oldest(|k, t| t.done && k != key) {
                return false;
            }
        }
        self.bytes += extra;
        true
    }

    /// Takes one block of a request: `p` from `peer` carrying Block1 `b`.
    /// The caller has checked that the request reaches a handler.
    pub fn on_block(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        p: &Packet<&[u8]>,
        b: BlockOpt,
    ) -> Block1Outcome {
        self.expire(now);
        let size = b.size();
        let payload = p.payload();
        if (b.more && payload.len() != size) || payload.len() > size {
            // RFC 7959 2.2: a non-final block carries exactly the block size
            self.stats.bad += 1;
            return Block1Outcome::reply(Code::BAD_REQUEST);
        }
        let offset = b.num as usize * size;
        let end = offset + payload.len();
        let size1 = p
            .option(OptionNumber::SIZE1)
            .and_then(|o| o.uint())
            .map(|s| s as usize);
        let key = Key::new(peer, p);
        if end > self.cfg.max_body || size1.is_some_and(|s| s > self.cfg.max_body) {
            self.remove(&key);
            return self.too_large();
        }
        if b.num == 0 {
            // block 0 starts over, whatever was there
            self.remove(&key);
            if !b.more {
                self.stats.completed += 1;
                return Block1Outcome::Whole { block1: b };
            }
            let peer_count = self.transfers.keys().filter(|k| k.peer == peer).count();
            if peer_count >= self.cfg.per_peer.max(1) {
                self.evict_oldest(|k, _| k.peer == peer);
            }
            if self.transfers.len() >= self.cfg.max_transfers.max(1)
                && !self.evict_oldest(|_, t| t.done)
            {
                return self.busy(now);
            }
            self.next_seq += 1;
            self.transfers.insert(
                key.clone(),
                Transfer {
                    body: Vec::new(),
                    have: Vec::new(),
                    last: now,
                    seq: self.next_seq,
                    done: false,
                    charged: 0,
                },
            );
            self.stats.started += 1;
        }
        let Some(charged) = self
            .transfers
            .get(&key)
            .filter(|t| !t.done)
            .map(|t| t.charged)
        else {
            return self.incomplete();
        };
        // the body's capacity: the announced size up front, else doubling
        let need = if b.num == 0 {
            size1.unwrap_or(0).max(end).min(self.cfg.max_body)
        } else if end > charged {
            end.max((charged * 2).min(self.cfg.max_body))
        } else {
            charged
        };
        if need > charged && !self.make_room(need - charged, &key) {
            self.remove(&key);
            return self.busy(now);
        }
        let Some(t) = self.transfers.get_mut(&key) else {
            return self.incomplete();
        };
        t.charged = t.charged.max(need);
        t.last = now;
        if t.body.len() < end {
            let more = t.charged - t.body.len();
            t.body.reserve_exact(more);
            t.body.resize(end, 0);
        }
        t.body[offset..end].copy_from_slice(payload);
        if !t.add_range(offset, end) {
            self.remove(&key);
            return self.incomplete();
        }
        if b.more {
            self.stats.continued += 1;
            let szx = if b.num == 0 {
                b.szx.min(szx_for(self.cfg.block_size))
            } else {
                b.szx
            };
            return Block1Outcome::Reply {
                code: Code::CONTINUE,
                block1: Some(BlockOpt {
                    num: b.num,
                    more: true,
                    szx,
                }),
                size1: None,
                max_age: None,
            };
        }
        // the final block: everything before it must be there, nothing after
        let whole = self
            .transfers
            .get(&key)
            .is_some_and(|t| t.have.as_slice() == [(0, end)] && t.body.len() == end);
        if !whole {
            self.remove(&key);
            return self.incomplete();
        }
        let Some(datagram) = self.transfers.get(&key).and_then(|t| rebuild(p, &t.body)) else {
            self.remove(&key);
            return self.too_large();
        };
        if let Some(t) = self.transfers.get_mut(&key) {
            t.done = true;
            t.last = now;
        }
        self.stats.completed += 1;
        Block1Outcome::Complete {
            datagram,
            block1: b,
        }
    }

    /// For a request that asks for a later block of the response (Block2
    /// with num > 0, no Block1) to a transfer this store completed: the
    /// request rebuilt with the kept body, so that the handler renders the
    /// same response again.
    pub fn continuation(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        p: &Packet<&[u8]>,
    ) -> Option<Vec<u8>> {
        self.expire(now);
        let key = Key::new(peer, p);
        let t = self.transfers.get_mut(&key).filter(|t| t.done)?;
        t.last = now;
        let d = rebuild(p, &t.body)?;
        self.stats.continuations += 1;
        Some(d)
    }
}

/// `p` with `body` as its payload, without Block1 and Size1; `None` when
/// that would exceed the message size limit.
fn rebuild(p: &Packet<&[u8]>, body: &[u8]) -> Option<Vec<u8>> {
    let cap = p.payload_offset() + 1 + body.len();
    if cap > MAX_MESSAGE {
        return None;
    }
    let mut out = vec![0u8; cap];
    let mut w =
        MessageWriter::new(&mut out, p.msg_type(), p.code(), p.message_id(), p.token()).ok()?;
    for o in p
        .options()
        .filter(|o| o.number != OptionNumber::BLOCK1 && o.number != OptionNumber::SIZE1)
    {
        w.option(o.number, o.value).ok()?;
    }
    w.payload(body).ok()?;
    let n = w.finish();
    out.truncate(n);
    Some(out)
}

#[cfg(test)]
mod tests;
