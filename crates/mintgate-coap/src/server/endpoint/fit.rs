//! Holding an answer to a byte budget (anti-amplification, see
//! [`super::validation`]).
//!
//! A 2.05 whose representation does not fit goes out as one Block2 block
//! (RFC 7959 2.4) small enough to fit, which a client fetches on from, one
//! block per request: RFC 7252 11.3 points there. The block is cut from the
//! encoded response: from the whole representation when the handler sent
//! it whole, at the block a request asked for when the handler ignored
//! Block2, or from inside the block the handler chose (a smaller block
//! size with the block number scaled, as RFC 7959 2.4 allows). The block
//! carries an Echo value, so a client that repeats it (RFC 9175 2.3) is
//! verified by its next request. Anything else that does not fit becomes a
//! 4.01 with Echo, the challenge of RFC 9175 2.4; if even that does not
//! fit, nothing is sent.

use mintgate_buf::{Layer, Pool};

use crate::server::block::BlockOpt;
use crate::server::response::{Outgoing, Tail};
use crate::wire::{decode_uint, Code, MessageWriter, OptionNumber, Packet};

/// What [`fit`] made of an answer.
pub(crate) enum Fitted {
    /// One block of the representation, with Echo.
    Block(Outgoing),
    /// A 4.01 Echo challenge.
    Challenge(Outgoing),
    /// Nothing small enough can be said.
    Nothing,
}

/// Largest message [`fit`] writes.
const SCRATCH: usize = 2048;

/// Cuts `msg`, the answer to a request that asked for block `asked` (or
/// none), to at most `limit` bytes.
pub(crate) fn fit(
    pool: &Pool,
    msg: &Outgoing,
    asked: Option<BlockOpt>,
    limit: usize,
    echo: &[u8],
) -> Fitted {
    let bytes = msg.to_vec();
    let Ok(p) = Packet::new_checked(bytes.as_slice()) else {
        return Fitted::Nothing;
    };
    let limit = limit.min(SCRATCH);
    let mut buf = [0u8; SCRATCH];
    if p.code() == Code::CONTENT && !p.payload().is_empty() {
        if let Some(n) = block_of(&p, asked, limit, echo, &mut buf) {
            if let Some(o) = to_pool(pool, &buf[..n]) {
                return Fitted::Block(o);
            }
            return Fitted::Nothing;
        }
    }
    match challenge(&p, echo, &mut buf) {
        Some(n) if n <= limit => match to_pool(pool, &buf[..n]) {
            Some(o) => Fitted::Challenge(o),
            None => Fitted::Nothing,
        },
        _ => Fitted::Nothing,
    }
}

fn to_pool(pool: &Pool, bytes: &[u8]) -> Option<Outgoing> {
    let mut b = pool.alloc(Layer::Coap, bytes.len(), 0).ok()?;
    b.spare_mut()[..bytes.len()].copy_from_slice(bytes);
    b.commit(bytes.len());
    Some(Outgoing {
        head: b.freeze(),
        tail: Tail::None,
    })
}

fn block_opt(p: &Packet<&[u8]>) -> Option<BlockOpt> {
    p.option(OptionNumber::BLOCK2)
        .filter(|o| o.value.len() <= 3)
        .and_then(|o| decode_uint(o.value))
        .and_then(BlockOpt::decode)
}

/// Writes the largest block that fits in `limit`; its length.
fn block_of(
    p: &Packet<&[u8]>,
    asked: Option<BlockOpt>,
    limit: usize,
    echo: &[u8],
    buf: &mut [u8],
) -> Option<usize> {
    let payload = p.payload();
    // the bytes in hand: representation offset `start`, then `payload`
    let (start, more_after, offset, max_szx, total) = match block_opt(p) {
        Some(b) => {
            let start = b.num as usize * b.size();
            (start, b.more, start, b.szx, None)
        }
        None => {
            let offset = asked.map_or(0, |a| a.num as usize * a.size());
            let szx = asked.map_or(6, |a| a.szx);
            (0, false, offset, szx, Some(payload.len()))
        }
    };
    if offset < start || offset - start >= payload.len() {
        return None;
    }
    let max_szx = asked.map_or(max_szx, |a| a.szx.min(max_szx));
    // with Echo (and Size2 on the first block) if that fits at any size,
    // else bare: a very short request gets its bytes all the same
    for (with_echo, with_size2) in [(true, true), (true, false), (false, false)] {
        for szx in (0..=max_szx).rev() {
            let size = 1usize << (szx + 4);
            let from = offset - start;
            let to = (from + size).min(payload.len());
            let more = to < payload.len() || more_after;
            let b = BlockOpt {
                num: (offset / size) as u32,
                more,
                szx,
            };
            if b.num >= 1 << 20 {
                continue;
            }
            let size2 = total.filter(|_| b.num == 0 && with_size2);
            let echo = if with_echo { echo } else { &[][..] };
            if let Some(n) = write_block(p, b, size2, echo, &payload[from..to], buf) {
                if n <= limit {
                    return Some(n);
                }
            }
        }
    }
    None
}

/// The response's header, token and options (its own Block2, Size2 and
/// Echo replaced), then `block`, `size2`, `echo` and `data`.
fn write_block(
    p: &Packet<&[u8]>,
    block: BlockOpt,
    size2: Option<usize>,
    echo: &[u8],
    data: &[u8],
    buf: &mut [u8],
) -> Option<usize> {
    let mut w = MessageWriter::new(buf, p.msg_type(), p.code(), p.message_id(), p.token()).ok()?;
    let mut added = [false; 3];
    let ours = |i: usize| match i {
        0 => OptionNumber::BLOCK2,
        1 => OptionNumber::SIZE2,
        _ => OptionNumber::ECHO,
    };
    let put = |w: &mut MessageWriter<'_>, i: usize| -> Option<()> {
        match i {
            0 => w.option_uint(OptionNumber::BLOCK2, block.encode()).ok()?,
            1 => match size2 {
                Some(s) => w.option_uint(OptionNumber::SIZE2, s as u32).ok()?,
                None => w,
            },
            _ if echo.is_empty() => w,
            _ => w.option(OptionNumber::ECHO, echo).ok()?,
        };
        Some(())
    };
    for o in p.options() {
        if matches!(
            o.number,
            OptionNumber::BLOCK2 | OptionNumber::SIZE2 | OptionNumber::ECHO
        ) {
            continue;
        }
        for (i, done) in added.iter_mut().enumerate() {
            if !*done && ours(i) < o.number {
                put(&mut w, i)?;
                *done = true;
            }
        }
        w.option(o.number, o.value).ok()?;
    }
    for (i, done) in added.iter_mut().enumerate() {
        if !*done {
            put(&mut w, i)?;
            *done = true;
        }
    }
    w.payload(data).ok()?;
    Some(w.finish())
}

/// A 4.01 with Echo and nothing else, of the same type, ID and token.
fn challenge(p: &Packet<&[u8]>, echo: &[u8], buf: &mut [u8]) -> Option<usize> {
    let mut w = MessageWriter::new(
        buf,
        p.msg_type(),
        Code::UNAUTHORIZED,
        p.message_id(),
        p.token(),
    )
    .ok()?;
    w.option(OptionNumber::ECHO, echo).ok()?;
    Some(w.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ContentFormat, MessageType};
    use mintgate_buf::PartitionConfig;

    fn pool() -> Pool {
        Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 16,
        }])
    }

    fn response(
        pool: &Pool,
        code: Code,
        opts: &[(OptionNumber, &[u8])],
        payload: &[u8],
    ) -> Outgoing {
        let mut buf = [0u8; 2048];
        let mut w = MessageWriter::new(&mut buf, MessageType::Ack, code, 0x1234, b"tk").unwrap();
        for (n, v) in opts {
            w.option(*n, v).unwrap();
        }
        w.payload(payload).unwrap();
        let n = w.finish();
        to_pool(pool, &buf[..n]).unwrap()
    }

    #[test]
    fn a_large_representation_becomes_its_first_block() {
        let pool = pool();
        let body: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let cf = [ContentFormat::TEXT_PLAIN.0 as u8];
        let o = response(
            &pool,
            Code::CONTENT,
            &[
                (OptionNumber::ETAG, b"abcd"),
                (OptionNumber::CONTENT_FORMAT, &cf),
            ],
            &body,
        );
        let echo = [9u8; 12];
        let Fitted::Block(b) = fit(&pool, &o, None, 3 * 20, &echo) else {
            panic!("a block fits");
        };
        let v = b.to_vec();
        assert!(v.len() <= 60, "{} bytes", v.len());
        let p = Packet::new_checked(v.as_slice()).unwrap();
        assert_eq!(p.code(), Code::CONTENT);
        assert_eq!(p.message_id(), 0x1234);
        assert_eq!(p.token(), b"tk");
        let blk = block_opt(&p).unwrap();
        assert_eq!((blk.num, blk.more), (0, true));
        assert_eq!(p.payload(), &body[..blk.size()]);
        assert_eq!(p.option(OptionNumber::ETAG).unwrap().value, b"abcd");
        assert_eq!(p.option(OptionNumber::ECHO).unwrap().value, &echo);
        assert_eq!(p.option(OptionNumber::SIZE2).unwrap().uint(), Some(1000));
        // a bigger budget gives a bigger block
        let Fitted::Block(b2) = fit(&pool, &o, None, 400, &echo) else {
            panic!("fits");
        };
        let v2 = b2.to_vec();
        let p2 = Packet::new_checked(v2.as_slice()).unwrap();
        assert!(block_opt(&p2).unwrap().size() > blk.size());
    }

    #[test]
    fn later_blocks_come_from_the_offset_asked_for() {
        let pool = pool();
        let body: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let o = response(&pool, Code::CONTENT, &[], &body);
        let asked = BlockOpt {
            num: 3,
            more: false,
            szx: 1,
        };
        let Fitted::Block(b) = fit(&pool, &o, Some(asked), 200, &[1; 12]) else {
            panic!("fits");
        };
        let v = b.to_vec();
        let p = Packet::new_checked(v.as_slice()).unwrap();
        let blk = block_opt(&p).unwrap();
        assert_eq!((blk.num, blk.szx), (3, 1));
        assert_eq!(p.payload(), &body[96..128]);
        // a handler's own block 1 of 512 bytes, cut to 16-byte blocks
        let b512 = BlockOpt {
            num: 1,
            more: false,
            szx: 5,
        };
        let o = response(
            &pool,
            Code::CONTENT,
            &[(OptionNumber::BLOCK2, &[(b512.encode() & 0xff) as u8][..])],
            &body[512..1000],
        );
        let f = fit(&pool, &o, Some(b512), 40, &[1; 12]);
        let Fitted::Block(b) = f else {
            panic!("fits");
        };
        let v = b.to_vec();
        let p = Packet::new_checked(v.as_slice()).unwrap();
        let blk = block_opt(&p).unwrap();
        assert_eq!((blk.num, blk.szx, blk.more), (32, 0, true));
        assert_eq!(p.payload(), &body[512..528]);
    }

    #[test]
    fn errors_become_a_challenge_or_nothing() {
        let pool = pool();
        let o = response(&pool, Code::NOT_FOUND, &[], &[b'x'; 300]);
        let Fitted::Challenge(c) = fit(&pool, &o, None, 60, &[5; 12]) else {
            panic!("a challenge fits");
        };
        let v = c.to_vec();
        let p = Packet::new_checked(v.as_slice()).unwrap();
        assert_eq!(p.code(), Code::UNAUTHORIZED);
        assert_eq!(p.option(OptionNumber::ECHO).unwrap().value, &[5; 12]);
        assert!(p.payload().is_empty());
        assert!(matches!(
            fit(&pool, &o, None, 12, &[5; 12]),
            Fitted::Nothing
        ));
    }
}
