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
//!   `max_body` (or the per-source share, when smaller).
//! - Memory: a transfer is charged for the capacity its body holds, which
//!   grows with the blocks received (doubling, at most twice the highest
//!   byte received, capped by Size1): a large Size1 reserves nothing it has
//!   not received.
//! - Fairness between sources ([`Source`]: an IPv4 address or an IPv6 /64,
//!   not ip:port, so one host on many ports is one source): each source has
//!   at most `per_peer` transfers (a further one evicts that source's
//!   oldest) and `per_source_bytes` (beyond it the source's own other
//!   transfers go, idle longest first). When all transfers together would
//!   hold more than `max_bytes`, or `max_transfers` are open, room is made
//!   by evicting completed bodies kept for Block2 first, then unfinished
//!   transfers of the heaviest source (by bytes, or by transfers for the
//!   count), idle longest first, as long as that source holds more than the
//!   newcomer's: so an upload from a quiet source always gets through, and a
//!   source that is itself the heaviest gets 5.03 with Max-Age (seconds
//!   until the oldest transfer times out). Every outcome is counted
//!   ([`Block1Stats`]).
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
use super::Source;
use crate::wire::{Code, MessageWriter, OptionNumber, Packet};

/// Request-Tag (RFC 9175): tells concurrent block-wise transfers of the same
/// resource apart.
pub const REQUEST_TAG: OptionNumber = OptionNumber::REQUEST_TAG;

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
    /// Transfers open at once per source (an IPv4 address or an IPv6 /64,
    /// whatever the ports).
    pub per_peer: usize,
    /// Bytes one source's transfers may hold together (its share of
    /// `max_bytes`).
    pub per_source_bytes: usize,
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
            per_source_bytes: 256 << 10,
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
    /// Answers 5.03 (no room for another transfer): `busy_source` +
    /// `busy_global`.
    pub busy: u64,
    /// 5.03 because the source's own share was full of the transfer itself.
    pub busy_source: u64,
    /// 5.03 because everything was full and the newcomer's source was not
    /// lighter than the heaviest other one.
    pub busy_global: u64,
    /// Answers 4.00 (a block of the wrong size).
    pub bad: u64,
    /// Transfers dropped after `timeout` idle (partial ones only).
    pub expired: u64,
    /// Transfers evicted for room: `evicted_own` + `evicted_kept` +
    /// `evicted_heaviest`.
    pub evicted: u64,
    /// A source's own transfers evicted for its newer ones (over
    /// `per_peer` or `per_source_bytes`).
    pub evicted_own: u64,
    /// Completed bodies kept for Block2 evicted for room.
    pub evicted_kept: u64,
    /// Unfinished transfers of the heaviest source evicted for a lighter
    /// source's.
    pub evicted_heaviest: u64,
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
        // a Request-Tag of a length outside 0..=8 is unrecognized (RFC 7252
        // 5.4.3), and an unrecognized elective option is ignored
        for o in p
            .options()
            .filter(|o| is_target_option(o.number))
            .filter(|o| o.number != REQUEST_TAG || o.value.len() <= 8)
        {
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

/// What one source holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Use {
    transfers: usize,
    bytes: usize,
}

/// Why a transfer was evicted.
#[derive(Clone, Copy)]
enum Why {
    Own,
    Kept,
    Heaviest,
}

/// Block1 reassembly state of a server. See the [module documentation](self).
///
/// Invariants: `bytes` is the sum of the transfers' `charged` and never
/// above `max_bytes` after a call returns; at most `max_transfers`
/// transfers; per source at most `per_peer` transfers and
/// `per_source_bytes` bytes, and `sources` holds exactly the sums of the
/// transfers of each source that has any.
pub struct Block1Store {
    cfg: Block1Config,
    transfers: HashMap<Key, Transfer>,
    sources: HashMap<Source, Use>,
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
            sources: HashMap::new(),
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

    /// Sources holding transfers.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Transfers and bytes held for `peer`'s source ([`Source`]).
    pub fn source_use(&self, peer: &SocketAddr) -> (usize, usize) {
        self.sources
            .get(&Source::of(peer))
            .map_or((0, 0), |u| (u.transfers, u.bytes))
    }

    /// The largest body accepted: `max_body`, or a source's whole share
    /// when that is smaller.
    fn body_limit(&self) -> usize {
        self.cfg
            .max_body
            .min(self.cfg.per_source_bytes)
            .min(self.cfg.max_bytes)
    }

    /// Drops transfers idle for `timeout` at `now`; returns how many went.
    pub fn expire(&mut self, now: Instant) -> usize {
        let timeout = self.cfg.timeout;
        let idle: Vec<Key> = self
            .transfers
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(t.last) >= timeout)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &idle {
            if let Some(t) = self.remove(k) {
                self.stats.expired += u64::from(!t.done);
            }
        }
        idle.len()
    }

    fn remove(&mut self, key: &Key) -> Option<Transfer> {
        let t = self.transfers.remove(key)?;
        self.bytes -= t.charged;
        let src = Source::of(&key.peer);
        if let Some(u) = self.sources.get_mut(&src) {
            u.transfers -= 1;
            u.bytes -= t.charged;
            if u.transfers == 0 {
                self.sources.remove(&src);
            }
        }
        Some(t)
    }

    /// Adds `extra` to the charge of the transfer at `key`.
    fn charge(&mut self, key: &Key, extra: usize) {
        if let Some(t) = self.transfers.get_mut(key) {
            t.charged += extra;
            self.bytes += extra;
            if let Some(u) = self.sources.get_mut(&Source::of(&key.peer)) {
                u.bytes += extra;
            }
        }
    }

    /// Drops, among the transfers `pick` selects, the completed ones first,
    /// then the one idle longest (the oldest on a tie).
    fn evict(&mut self, why: Why, pick: impl Fn(&Key, &Transfer) -> bool) -> bool {
        let victim = self
            .transfers
            .iter()
            .filter(|(k, t)| pick(k, t))
            .min_by_key(|(_, t)| (!t.done, t.last, t.seq))
            .map(|(k, _)| k.clone());
        let Some(k) = victim else {
            return false;
        };
        self.remove(&k);
        self.stats.evicted += 1;
        match why {
            Why::Own => self.stats.evicted_own += 1,
            Why::Kept => self.stats.evicted_kept += 1,
            Why::Heaviest => self.stats.evicted_heaviest += 1,
        }
        true
    }

    /// The source other than `not` holding the most by `weight` (ties go
    /// to the lower address, so the choice is the same on every run).
    fn heaviest(&self, not: Source, weight: impl Fn(&Use) -> usize) -> Option<(Source, usize)> {
        self.sources
            .iter()
            .filter(|(s, _)| **s != not)
            .map(|(s, u)| (*s, weight(u)))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
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
            size1: Some(self.body_limit().min(u32::MAX as usize) as u32),
            max_age: None,
        }
    }

    fn incomplete(&mut self) -> Block1Outcome {
        self.stats.incomplete += 1;
        Block1Outcome::reply(Code::REQUEST_ENTITY_INCOMPLETE)
    }

    fn busy(&mut self, now: Instant, global: bool) -> Block1Outcome {
        self.stats.busy += 1;
        if global {
            self.stats.busy_global += 1;
        } else {
            self.stats.busy_source += 1;
        }
        Block1Outcome::Reply {
            code: Code::SERVICE_UNAVAILABLE,
            block1: None,
            size1: None,
            max_age: Some(self.retry_after(now)),
        }
    }

    /// Makes room for `extra` more bytes for the transfer at `key`, within
    /// its source's share and then within `max_bytes` (see the [module
    /// documentation](self)), and charges them; `Err(global)` when there is
    /// none.
    fn make_room(&mut self, extra: usize, key: &Key) -> Result<(), bool> {
        let src = Source::of(&key.peer);
        let own = |s: &Block1Store| s.sources.get(&src).map_or(0, |u| u.bytes);
        while own(self) + extra > self.cfg.per_source_bytes {
            if !self.evict(Why::Own, |k, _| k != key && Source::of(&k.peer) == src) {
                return Err(false);
            }
        }
        while self.bytes + extra > self.cfg.max_bytes {
            if self.evict(Why::Kept, |k, t| t.done && k != key) {
                continue;
            }
            let mine = own(self);
            match self.heaviest(src, |u| u.bytes) {
                Some((h, b)) if b > mine => {
                    self.evict(Why::Heaviest, |k, _| Source::of(&k.peer) == h);
                }
                _ => return Err(true),
            }
        }
        self.charge(key, extra);
        Ok(())
    }

    /// Makes room for one more transfer of `peer`'s source; false when
    /// there is none.
    fn make_slot(&mut self, peer: SocketAddr) -> bool {
        let src = Source::of(&peer);
        let mine = self.sources.get(&src).map_or(0, |u| u.transfers);
        if mine >= self.cfg.per_peer.max(1) {
            self.evict(Why::Own, |k, _| Source::of(&k.peer) == src);
        }
        while self.transfers.len() >= self.cfg.max_transfers.max(1) {
            if self.evict(Why::Kept, |_, t| t.done) {
                continue;
            }
            let mine = self.sources.get(&src).map_or(0, |u| u.transfers);
            match self.heaviest(src, |u| u.transfers) {
                // strictly more than the newcomer will hold, or the two
                // would only trade places
                Some((h, n)) if n > mine + 1 => {
                    self.evict(Why::Heaviest, |k, _| Source::of(&k.peer) == h);
                }
                _ => return false,
            }
        }
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
        let limit = self.body_limit();
        if end > limit || size1.is_some_and(|s| s > limit) {
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
            if !self.make_slot(peer) {
                return self.busy(now, true);
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
            let u = self.sources.entry(Source::of(&peer)).or_default();
            u.transfers += 1;
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
        // the body's capacity: what has arrived, doubling (so at most twice
        // the highest byte received), never past Size1 or the limit
        let need = if end > charged {
            let cap = size1.unwrap_or(limit).min(limit);
            end.max((charged * 2).min(cap))
        } else {
            charged
        };
        if need > charged {
            if let Err(global) = self.make_room(need - charged, &key) {
                self.remove(&key);
                return self.busy(now, global);
            }
        }
        let Some(t) = self.transfers.get_mut(&key) else {
            return self.incomplete();
        };
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
