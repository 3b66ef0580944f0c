//! Block-wise transfer (RFC 7959), Block2 on the server side: a handler
//! with a representation larger than one message answers block by block,
//! statelessly: each request names the block it wants, the handler renders
//! the representation again and sends that slice, with an ETag so that a
//! client can tell when the representation changed between blocks. The
//! same ETag lets a client (or a cache) validate what it holds: a GET
//! carrying it is answered 2.03 Valid (RFC 7252 5.10.6).
//!
//! Block1 (request bodies in blocks) is in [`super::block1`].

use super::resource::Request;
use super::response::ResponseBuilder;
use crate::wire::{Code, OptionNumber};

/// A Block1/Block2 option value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockOpt {
    /// Block number (20 bits).
    pub num: u32,
    /// More blocks follow.
    pub more: bool,
    /// Size exponent: blocks of 2^(szx + 4) bytes (0..=6).
    pub szx: u8,
}

impl BlockOpt {
    /// Decodes an option value; `None` for the reserved size exponent 7 or
    /// a number beyond 20 bits.
    pub fn decode(v: u32) -> Option<BlockOpt> {
        let szx = (v & 7) as u8;
        if szx == 7 || v >> 4 >= 1 << 20 {
            return None;
        }
        Some(BlockOpt {
            num: v >> 4,
            more: v & 8 != 0,
            szx,
        })
    }

    /// Encodes as the option's uint value.
    pub fn encode(self) -> u32 {
        (self.num << 4) | ((self.more as u32) << 3) | (self.szx as u32 & 7)
    }

    /// Bytes per block.
    pub fn size(self) -> usize {
        1 << (self.szx + 4)
    }
}

/// The size exponent of the largest block not above `bytes` (16..=1024).
pub fn szx_for(bytes: usize) -> u8 {
    (0..=6u8)
        .rev()
        .find(|s| 1usize << (s + 4) <= bytes)
        .unwrap_or(0)
}

/// A 4-byte ETag of `body` (FNV-1a), to tell versions apart.
pub fn etag(body: &[u8]) -> [u8; 4] {
    let h = body.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ *b as u32).wrapping_mul(0x0100_0193)
    });
    h.to_be_bytes()
}

/// Answers `req` with `body`, block-wise when it does not fit in
/// `max_block` bytes or the client asked for a block: sets Block2, ETag and
/// (on the first block) Size2, and writes the slice. A GET always gets the
/// ETag, and a GET that carries it (without asking for a later block) is
/// answered 2.03 Valid with no payload. A block number past the end is
/// answered 4.02 Bad Option, the reserved size exponent 7 4.00 Bad Request
/// (RFC 7959 2.2). The caller sets Content-Format.
pub fn respond_block2(req: &Request<'_>, rb: &mut ResponseBuilder, body: &[u8], max_block: usize) {
    let limit = szx_for(max_block);
    let asked = match req.option(OptionNumber::BLOCK2).map(|o| o.uint()) {
        None => None,
        Some(Some(v)) => match BlockOpt::decode(v) {
            Some(b) => Some(b),
            None => {
                rb.set_code(Code::BAD_REQUEST);
                return;
            }
        },
        Some(None) => {
            rb.set_code(Code::BAD_OPTION);
            return;
        }
    };
    let tag = etag(body);
    let get = req.method() == Code::GET;
    if get && asked.is_none_or(|b| b.num == 0) {
        let p = req.packet;
        if p.options()
            .any(|o| o.number == OptionNumber::ETAG && o.value == tag)
        {
            rb.set_code(Code::VALID).option(OptionNumber::ETAG, &tag);
            return;
        }
    }
    if asked.is_none() && body.len() <= 1 << (limit + 4) {
        if get {
            rb.option(OptionNumber::ETAG, &tag);
        }
        rb.write(body);
        return;
    }
    let (num, szx) = match asked {
        Some(b) if b.szx > limit => {
            // a smaller block size than asked: renumber to keep the offset
            let off = b.num as usize * b.size();
            ((off >> (limit + 4)) as u32, limit)
        }
        Some(b) => (b.num, b.szx),
        None => (0, limit),
    };
    let size = 1usize << (szx + 4);
    let start = num as usize * size;
    if start >= body.len() && !(start == 0 && body.is_empty()) {
        rb.set_code(Code::BAD_OPTION);
        return;
    }
    let end = (start + size).min(body.len());
    let more = end < body.len();
    rb.option(OptionNumber::ETAG, &tag);
    rb.option_uint(OptionNumber::BLOCK2, BlockOpt { num, more, szx }.encode());
    if num == 0 {
        rb.option_uint(OptionNumber::SIZE2, body.len() as u32);
    }
    rb.write(&body[start..end]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{MessageType, MessageWriter, Packet};
    use mintgate_buf::{PartitionConfig, Pool};
    use proptest::prelude::*;

    fn get(block2: Option<u32>) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::GET, 1, b"t").unwrap();
        w.option(OptionNumber::URI_PATH, b"h").unwrap();
        if let Some(v) = block2 {
            w.option_uint(OptionNumber::BLOCK2, v).unwrap();
        }
        let n = w.finish();
        buf[..n].to_vec()
    }

    fn answer(
        pool: &Pool,
        body: &[u8],
        block2: Option<u32>,
        max: usize,
    ) -> (Code, Vec<u8>, Option<BlockOpt>, Option<u32>) {
        let dg = get(block2);
        let p = Packet::new_checked(&dg[..]).unwrap();
        let req = Request {
            peer: "127.0.0.1:1".parse().unwrap(),
            packet: &p,
            identity: None,
        };
        let mut rb = ResponseBuilder::in_pool(pool, 1100);
        respond_block2(&req, &mut rb, body, max);
        let code = rb.code();
        let o = rb.finish(MessageType::Ack, 1, b"t").unwrap();
        let bytes = o.to_vec();
        let r = Packet::new_checked(&bytes[..]).unwrap();
        let blk = r
            .option(OptionNumber::BLOCK2)
            .and_then(|o| o.uint())
            .and_then(BlockOpt::decode);
        let size2 = r.option(OptionNumber::SIZE2).and_then(|o| o.uint());
        (code, r.payload().to_vec(), blk, size2)
    }

    fn pool() -> Pool {
        Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 8,
        }])
    }

    #[test]
    fn small_bodies_go_whole_and_bad_blocks_get_4_02() {
        let p = pool();
        let (c, body, blk, _) = answer(&p, b"short", None, 1024);
        assert_eq!(
            (c, body.as_slice(), blk),
            (Code::CONTENT, &b"short"[..], None)
        );
        assert_eq!(
            answer(
                &p,
                b"short",
                Some(
                    BlockOpt {
                        num: 5,
                        more: false,
                        szx: 0
                    }
                    .encode()
                ),
                1024
            )
            .0,
            Code::BAD_OPTION
        );
        assert_eq!(
            answer(&p, b"short", Some(7), 1024).0,
            Code::BAD_REQUEST,
            "szx 7 is reserved (RFC 7959 2.2)"
        );
    }

    proptest! {
        #[test]
        fn block_values_round_trip(num in 0u32..(1 << 20), more: bool, szx in 0u8..7) {
            let b = BlockOpt { num, more, szx };
            prop_assert_eq!(BlockOpt::decode(b.encode()), Some(b));
        }

        #[test]
        fn blocks_reassemble_the_body(len in 0usize..5000, max in 16usize..1100, first_szx in 0u8..7) {
            let p = pool();
            let body: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut got = Vec::new();
            let mut req = Some(BlockOpt { num: 0, more: false, szx: first_szx }.encode());
            for _ in 0..400 {
                let (code, part, blk, size2) = answer(&p, &body, req, max);
                prop_assert_eq!(code, Code::CONTENT);
                got.extend_from_slice(&part);
                let Some(b) = blk else { break };
                prop_assert!(b.size() <= max.max(16));
                if b.num == 0 { prop_assert_eq!(size2, Some(len as u32)); }
                if !b.more { break; }
                req = Some(BlockOpt { num: b.num + 1, more: false, szx: b.szx }.encode());
            }
            prop_assert_eq!(got, body);
        }
    }
}
