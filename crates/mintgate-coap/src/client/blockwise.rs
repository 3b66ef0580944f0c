//! Block-wise transfers (RFC 7959) for the client, as a sans-IO layer above
//! [`Client`](super::Client): one [`Transfer`] turns a request into the
//! sequence of block exchanges it needs and puts the answer back together.
//!
//! The caller starts each [`Request`] the transfer hands out as an ordinary
//! exchange and feeds the exchange's response back with
//! [`Transfer::on_response`]; the transfer answers with the next request,
//! the whole response, or why it failed.
//!
//! - Upload (Block1): a payload larger than the block size goes in blocks,
//!   block 0 with Size1, every block (and the Block2 requests for the
//!   answer that follow) with one Request-Tag (RFC 9175 3) fresh for this
//!   upload, unless the request carries its own: a server then never takes
//!   the blocks of two uploads to the same resource for one body. A 2.31 (or any 2.xx) to a non-final block asks for
//!   the next one; its Block1 may name a smaller block size, which is used
//!   from the next byte on (RFC 7959 2.5). An error response ends the
//!   transfer with that response.
//! - Download (Block2): a response carrying Block2 with M=1 is followed by
//!   requests for the next blocks (the same request without payload, Block1,
//!   Size1 and ETag, plus Block2), in the server's block size, or a smaller
//!   one when the client asks for one. Every block must carry the ETag of
//!   block 0: when it changes the representation changed under the
//!   transfer, which starts over (at most `max_restarts` times). Each block
//!   must start where the previous one ended.
//! - The result has the whole payload and the options of the last response
//!   without Block1, Block2 and Size2, so it reads like one response.
//!
//! Nothing here reads a clock or a socket.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;

use super::{Event, Request};
use crate::server::block::{szx_for, BlockOpt};
use crate::wire::{decode_uint, encode_uint, first_option, Code, MessageType, OptionNumber};

/// Settings of block-wise transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockConfig {
    /// The block size used for request bodies and asked for in responses:
    /// a power of two, 16..=1024 (others are rounded down).
    pub block_size: usize,
    /// Ask for `block_size` in responses from the first request on (a
    /// Block2 option with num 0 in a GET); otherwise the server picks.
    pub ask_block2: bool,
    /// Largest response body accepted, bytes.
    pub max_body: usize,
    /// Restarts allowed when the representation changes mid-transfer.
    pub max_restarts: u32,
}

impl Default for BlockConfig {
    fn default() -> Self {
        BlockConfig {
            block_size: 1024,
            ask_block2: false,
            max_body: 16 << 20,
            max_restarts: 3,
        }
    }
}

/// A response, as the transfer saw it or put it together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The code of the last response.
    pub code: Code,
    /// How the last response came.
    pub msg_type: MessageType,
    /// The options of the last response (without Block1, Block2 and Size2
    /// when the transfer was block-wise).
    pub options: Vec<(OptionNumber, Bytes)>,
    /// The whole payload.
    pub payload: Bytes,
    /// Round-trip times of the exchanges, summed.
    pub rtt: Duration,
    /// Retransmissions over all exchanges.
    pub retransmissions: u32,
    /// Exchanges the transfer took (1 when not block-wise).
    pub exchanges: u32,
}

impl Response {
    /// The first value of option `n`.
    pub fn option(&self, n: OptionNumber) -> Option<&[u8]> {
        first_option(&self.options, n)
    }
}

/// Why a block-wise transfer failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockError {
    /// The response body is larger than `max_body`.
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The representation kept changing (ETag) during the transfer.
    Changed {
        /// Restarts made.
        restarts: u32,
    },
    /// The server broke the block-wise rules.
    Protocol(String),
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockError::TooLarge { limit } => {
                write!(f, "the response body exceeds {limit} bytes")
            }
            BlockError::Changed { restarts } => write!(
                f,
                "the representation changed during the block-wise transfer ({restarts} restarts)"
            ),
            BlockError::Protocol(why) => write!(f, "block-wise transfer: {why}"),
        }
    }
}

impl std::error::Error for BlockError {}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Start this request as the next exchange.
    Send(Request),
    /// The transfer is over: this is the response.
    Done(Response),
    /// The transfer failed.
    Failed(BlockError),
}

/// Upload progress.
struct Up {
    /// The request body.
    body: Vec<u8>,
    /// Offset of the block in flight.
    offset: usize,
    /// Size exponent of the block in flight.
    szx: u8,
}

/// Download progress.
struct Down {
    body: Vec<u8>,
    etag: Option<Vec<u8>>,
    restarts: u32,
}

/// One block-wise request. See the [module documentation](self).
pub struct Transfer {
    cfg: BlockConfig,
    /// The request without payload, Block1, Size1 and Block2.
    base: Request,
    up: Option<Up>,
    down: Option<Down>,
    rtt: Duration,
    retransmissions: u32,
    exchanges: u32,
    /// The server's last Echo value (RFC 9175 2.3): every later request of
    /// the transfer carries it.
    echo: Option<Vec<u8>>,
    /// The request handed out last (sent again with Echo after a 4.01
    /// challenge).
    last: Option<Request>,
    /// Echo challenges answered (a server that keeps challenging is
    /// given up on).
    challenges: u32,
}

/// Echo challenges answered in one transfer, at most.
const MAX_CHALLENGES: u32 = 2;

/// A Request-Tag this process has not used before (RFC 9175 3.4): a
/// counter from a random start, so that two processes (two CLI runs that
/// get the same port) do not repeat each other's either. Four bytes: they
/// come round after 2^32 uploads.
fn fresh_request_tag() -> Vec<u8> {
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(rand::random::<u64>);
    let v = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
    (v as u32).to_be_bytes().to_vec()
}

fn uint(v: u32) -> Vec<u8> {
    encode_uint(v, &mut [0; 4]).to_vec()
}

fn block_of<V: AsRef<[u8]>>(
    options: &[(OptionNumber, V)],
    n: OptionNumber,
) -> Option<Option<BlockOpt>> {
    first_option(options, n).map(|v| decode_uint(v).and_then(BlockOpt::decode))
}

impl Transfer {
    /// Plans `req`; returns the transfer and the first request to send.
    pub fn new(req: Request, cfg: BlockConfig) -> (Transfer, Request) {
        let szx = szx_for(cfg.block_size);
        let mut base = req;
        let body = std::mem::take(&mut base.payload);
        base.options.retain(|(n, _)| {
            *n != OptionNumber::BLOCK1 && *n != OptionNumber::SIZE1 && *n != OptionNumber::BLOCK2
        });
        let mut t = Transfer {
            cfg,
            base,
            up: None,
            down: None,
            rtt: Duration::ZERO,
            retransmissions: 0,
            exchanges: 0,
            echo: None,
            last: None,
            challenges: 0,
        };
        let first = if body.len() > 16usize << szx {
            let total = body.len();
            if !t
                .base
                .options
                .iter()
                .any(|(n, _)| *n == OptionNumber::REQUEST_TAG)
            {
                t.base
                    .options
                    .push((OptionNumber::REQUEST_TAG, fresh_request_tag()));
            }
            t.up = Some(Up {
                body,
                offset: 0,
                szx,
            });
            let mut r = t.upload_request();
            r.options.push((OptionNumber::SIZE1, uint(total as u32)));
            r
        } else {
            let mut r = t.base.clone();
            r.payload = body;
            if cfg.ask_block2 && r.code == Code::GET {
                r.options.push((
                    OptionNumber::BLOCK2,
                    uint(
                        BlockOpt {
                            num: 0,
                            more: false,
                            szx,
                        }
                        .encode(),
                    ),
                ));
            }
            r
        };
        t.last = Some(first.clone());
        (t, first)
    }

    /// `r` with the server's Echo value, remembered as the last request.
    fn out(&mut self, mut r: Request) -> Step {
        r.options.retain(|(n, _)| *n != OptionNumber::ECHO);
        if let Some(e) = &self.echo {
            r.options.push((OptionNumber::ECHO, e.clone()));
        }
        self.last = Some(r.clone());
        Step::Send(r)
    }

    /// The request carrying the upload's block in flight.
    fn upload_request(&self) -> Request {
        let mut r = self.base.clone();
        if let Some(up) = &self.up {
            let size = 16usize << up.szx;
            let end = (up.offset + size).min(up.body.len());
            let b = BlockOpt {
                num: (up.offset / size) as u32,
                more: end < up.body.len(),
                szx: up.szx,
            };
            r.options.push((OptionNumber::BLOCK1, uint(b.encode())));
            r.payload = up.body[up.offset..end].to_vec();
        }
        r
    }

    /// The request for the block of the response starting at `offset`.
    fn download_request(&self, offset: usize, szx: u8) -> Request {
        let mut r = self.base.clone();
        r.options.retain(|(n, _)| *n != OptionNumber::ETAG);
        let num = (offset >> (szx + 4)) as u32;
        r.options.push((
            OptionNumber::BLOCK2,
            uint(
                BlockOpt {
                    num,
                    more: false,
                    szx,
                }
                .encode(),
            ),
        ));
        r
    }

    /// Feeds the response event of the exchange last sent; other events
    /// (timeout, reset) end the transfer with the caller.
    pub fn on_event(&mut self, ev: Event) -> Option<Step> {
        match ev {
            // The event's fields into a Response of the same names: a field
            // list, not logic.
            Event::Response {
                code,
                msg_type,
                options,
                payload,
                rtt,
                retransmissions,
                ..
            } => Some(self.on_response(Response {
                code,
                msg_type,
                options,
                payload,
                rtt,
                retransmissions,
                exchanges: 1,
            })),
            _ => None,
        }
    }

    /// Feeds the response to the request last handed out.
    pub fn on_response(&mut self, resp: Response) -> Step {
        self.rtt += resp.rtt;
        self.retransmissions += resp.retransmissions;
        self.exchanges += 1;
        // RFC 9175 2.3: a server's Echo goes back in the next request; a
        // 4.01 carrying one is a challenge: the same request again, with it
        if let Some(e) = resp.option(OptionNumber::ECHO) {
            self.echo = Some(e.to_vec());
            if resp.code == Code::UNAUTHORIZED && self.challenges < MAX_CHALLENGES {
                if let Some(last) = self.last.clone() {
                    self.challenges += 1;
                    return self.out(last);
                }
            }
        }
        if let Some(up) = &mut self.up {
            let size = 16usize << up.szx;
            let sent_end = (up.offset + size).min(up.body.len());
            let last = sent_end == up.body.len();
            if resp.code.class() != 2 {
                return self.done(resp, None);
            }
            if !last {
                // continue, in the block size the server names if smaller
                let szx = match block_of(&resp.options, OptionNumber::BLOCK1) {
                    Some(Some(b)) => b.szx.min(up.szx),
                    Some(None) => return fail("a bad Block1 option in a 2.31"),
                    None => up.szx,
                };
                up.offset = sent_end;
                up.szx = szx;
                let r = self.upload_request();
                return self.out(r);
            }
            if resp.code == Code::CONTINUE {
                return fail("2.31 Continue to the final block");
            }
            self.up = None;
        }
        let block2 = match block_of(&resp.options, OptionNumber::BLOCK2) {
            Some(Some(b)) => b,
            Some(None) => return fail("a bad Block2 option"),
            None if self.down.is_some() && resp.code.class() == 2 => {
                return fail("a later block came without Block2");
            }
            None => return self.done(resp, None),
        };
        if resp.code.class() != 2 {
            return self.done(resp, None);
        }
        let etag = resp.option(OptionNumber::ETAG).map(<[u8]>::to_vec);
        let offset = block2.num as usize * block2.size();
        let down = self.down.get_or_insert(Down {
            body: Vec::new(),
            etag: etag.clone(),
            restarts: 0,
        });
        if offset != down.body.len() {
            return fail(&format!(
                "block {} of {} bytes starts at byte {offset}, expected {}",
                block2.num,
                block2.size(),
                down.body.len()
            ));
        }
        if offset == 0 {
            down.etag = etag.clone();
            let announced = resp
                .option(OptionNumber::SIZE2)
                .and_then(decode_uint)
                .unwrap_or(0) as usize;
            if announced > self.cfg.max_body {
                return Step::Failed(BlockError::TooLarge {
                    limit: self.cfg.max_body,
                });
            }
        } else if etag != down.etag {
            // the representation changed: start over
            down.restarts += 1;
            if down.restarts > self.cfg.max_restarts {
                return Step::Failed(BlockError::Changed {
                    restarts: down.restarts - 1,
                });
            }
            down.body.clear();
            down.etag = None;
            let szx = self.next_szx(0, block2.szx);
            let r = self.download_request(0, szx);
            return self.out(r);
        }
        if block2.more && resp.payload.len() != block2.size() {
            return fail(&format!(
                "block {} carries {} bytes, not its size {}",
                block2.num,
                resp.payload.len(),
                block2.size()
            ));
        }
        if down.body.len() + resp.payload.len() > self.cfg.max_body {
            return Step::Failed(BlockError::TooLarge {
                limit: self.cfg.max_body,
            });
        }
        down.body.extend_from_slice(&resp.payload);
        if block2.more {
            let next = down.body.len();
            let szx = self.next_szx(next, block2.szx);
            let r = self.download_request(next, szx);
            return self.out(r);
        }
        let body = self.down.take().map(|d| d.body);
        self.done(resp, body)
    }

    /// The block size to ask for at `offset` after a block of `server_szx`:
    /// the server's (or ours, if smaller); once the transfer carries an
    /// Echo, the server cut the block for a source it had not verified, and
    /// the Echo verifies it, so the largest size up to ours that `offset`
    /// is a multiple of.
    fn next_szx(&self, offset: usize, server_szx: u8) -> u8 {
        let ours = szx_for(self.cfg.block_size);
        let base = server_szx.min(ours);
        if self.echo.is_none() {
            return base;
        }
        (base..=ours)
            .rev()
            .find(|s| offset.is_multiple_of(16usize << s))
            .unwrap_or(base)
    }

    fn done(&mut self, mut resp: Response, body: Option<Vec<u8>>) -> Step {
        if self.exchanges > 1 || body.is_some() {
            resp.options.retain(|(n, _)| {
                *n != OptionNumber::BLOCK1
                    && *n != OptionNumber::BLOCK2
                    && *n != OptionNumber::SIZE2
            });
        }
        if let Some(b) = body {
            resp.payload = Bytes::from(b);
        }
        resp.rtt = self.rtt;
        resp.retransmissions = self.retransmissions;
        resp.exchanges = self.exchanges;
        Step::Done(resp)
    }
}

fn fail(why: &str) -> Step {
    Step::Failed(BlockError::Protocol(why.to_string()))
}

#[cfg(test)]
mod tests;
