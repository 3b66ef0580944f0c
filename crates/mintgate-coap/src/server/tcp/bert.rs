//! BERT (RFC 8323 section 6): block-wise transfer with blocks of several
//! kilobytes over a reliable transport. A Block1 or Block2 option with SZX
//! 7 stands for blocks of 1024 bytes whose NUM counts 1024-byte units, and
//! one message carries as many of them as the peer's Max-Message-Size
//! allows (the last one may be shorter).
//!
//! Handlers know RFC 7959 only, so the connection turns one BERT request
//! into consecutive 1024-byte (SZX 6) requests to `serve` and their
//! answers into one BERT answer:
//!
//! - Block2: blocks NUM, NUM+1, ... of SZX 6 are asked for while more
//!   follow, the answers keep their code and ETag, and the payload stays
//!   within `units` blocks; the first answer's options go back with Block2
//!   (NUM, M of the last block taken, SZX 7). A first answer that is not
//!   block-wise in 1024-byte blocks (an error, a whole representation, a
//!   smaller block size, RFC 7959 2.4) goes back as it is.
//! - Block1: the payload, 1024-byte blocks but the last, is handed over
//!   block by block with SZX 6 (M set on all but the last, which keeps the
//!   request's M); an answer other than 2.31 Continue before the last ends
//!   it there; the last answer goes back with its Block1 rewritten to the
//!   request's (NUM, M, SZX 7).
//!
//! Bounded: `units` comes from the smaller of the two Max-Message-Sizes,
//! and a Block1 payload is one frame, itself within ours.

use crate::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};

use super::super::{Answer, Request};

/// Bytes per BERT unit.
pub const UNIT: usize = 1024;

/// What serving a BERT request came to.
pub enum Served {
    /// Send this response (a whole CoAP message over UDP's framing).
    Send(Vec<u8>),
    /// Nothing to send.
    Silent,
    /// A pool block was missing.
    Exhausted,
}

/// The BERT option of a request (Block1 or Block2 with SZX 7), if any.
pub fn bert_option(p: &Packet<&[u8]>) -> Option<(OptionNumber, u32)> {
    [OptionNumber::BLOCK2, OptionNumber::BLOCK1]
        .into_iter()
        .find_map(|n| {
            p.option(n)
                .and_then(|o| o.uint())
                .filter(|v| v & 7 == 7)
                .map(|v| (n, v))
        })
}

/// `p` again, with option `which` set to `value` and `payload`.
fn rewrite(p: &Packet<&[u8]>, which: OptionNumber, value: u32, payload: &[u8]) -> Vec<u8> {
    let size = p.as_bytes().len() + payload.len() + 8;
    let mut buf = vec![0u8; size];
    let Ok(mut w) = MessageWriter::new(&mut buf, p.msg_type(), p.code(), p.message_id(), p.token())
    else {
        return Vec::new();
    };
    let mut b = [0u8; 4];
    let mut put = false;
    for o in p.options() {
        if o.number == which {
            if !put {
                let _ = w.option(which, crate::wire::encode_uint(value, &mut b));
                put = true;
            }
            continue;
        }
        if !put && o.number > which {
            let _ = w.option(which, crate::wire::encode_uint(value, &mut b));
            put = true;
        }
        let _ = w.option(o.number, o.value);
    }
    if !put {
        let _ = w.option(which, crate::wire::encode_uint(value, &mut b));
    }
    if !payload.is_empty() {
        let _ = w.payload(payload);
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn ask(
    serve: &mut dyn FnMut(&Request<'_>, usize) -> Answer,
    req: &Request<'_>,
    msg: &[u8],
    limit: usize,
) -> Result<Vec<u8>, Served> {
    let Ok(p) = Packet::new_checked(msg) else {
        return Err(Served::Send(Vec::new()));
    };
    let r = Request {
        peer: req.peer,
        packet: &p,
        identity: req.identity,
    };
    match serve(&r, limit) {
        Answer::Send(o) => Ok(o.to_vec()),
        Answer::Silent => Err(Served::Silent),
        Answer::Exhausted => Err(Served::Exhausted),
    }
}

fn block_of(p: &Packet<&[u8]>, n: OptionNumber) -> Option<u32> {
    p.option(n).and_then(|o| o.uint())
}

/// Serves `req`, whose option `which` is the BERT value `value`, with at
/// most `units` 1024-byte blocks in the answer.
pub fn serve_bert(
    req: &Request<'_>,
    which: OptionNumber,
    value: u32,
    units: usize,
    limit: usize,
    serve: &mut dyn FnMut(&Request<'_>, usize) -> Answer,
) -> Served {
    let first = value >> 4;
    let more_in_request = value & 8 != 0;
    let p = req.packet;
    if which == OptionNumber::BLOCK2 {
        let mut head: Option<Vec<u8>> = None;
        let mut payload = Vec::new();
        let mut more = false;
        for i in 0..units.max(1) as u32 {
            let sub = rewrite(p, which, ((first + i) << 4) | 6, p.payload());
            let bytes = match ask(serve, req, &sub, limit) {
                Ok(b) => b,
                Err(s) if i == 0 => return s,
                Err(_) => break,
            };
            let Ok(r) = Packet::new_checked(&bytes[..]) else {
                break;
            };
            let blk = block_of(&r, OptionNumber::BLOCK2);
            match &head {
                None => {
                    if r.code().class() != 2 || blk.map(|v| v & 7) != Some(6) {
                        return Served::Send(bytes);
                    }
                }
                Some(h) => {
                    let h = Packet::new_checked(&h[..]).ok();
                    let same = h.as_ref().is_some_and(|h| {
                        h.code() == r.code()
                            && h.option(OptionNumber::ETAG).map(|o| o.value)
                                == r.option(OptionNumber::ETAG).map(|o| o.value)
                    });
                    if !same || blk.map(|v| (v >> 4, v & 7)) != Some((first + i, 6)) {
                        // the representation changed: what came so far stands
                        break;
                    }
                }
            }
            payload.extend_from_slice(r.payload());
            more = blk.is_some_and(|v| v & 8 != 0);
            if head.is_none() {
                head = Some(bytes);
            }
            if !more {
                break;
            }
        }
        let Some(h) = head else {
            return Served::Silent;
        };
        let Ok(h) = Packet::new_checked(&h[..]) else {
            return Served::Silent;
        };
        return Served::Send(rewrite(
            &h,
            OptionNumber::BLOCK2,
            (first << 4) | (u32::from(more) << 3) | 7,
            &payload,
        ));
    }
    // Block1: 1024-byte blocks but the last
    let body = p.payload();
    if more_in_request && (body.is_empty() || !body.len().is_multiple_of(UNIT)) {
        return bad_request(p);
    }
    let chunks: Vec<&[u8]> = if body.is_empty() {
        vec![&[][..]]
    } else {
        body.chunks(UNIT).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.iter().enumerate() {
        let m = i < last || more_in_request;
        let sub = rewrite(
            p,
            which,
            ((first + i as u32) << 4) | (u32::from(m) << 3) | 6,
            chunk,
        );
        let bytes = match ask(serve, req, &sub, limit) {
            Ok(b) => b,
            Err(s) => return s,
        };
        let Ok(r) = Packet::new_checked(&bytes[..]) else {
            return Served::Silent;
        };
        if i < last && r.code() != Code::CONTINUE {
            return Served::Send(bytes);
        }
        if i == last {
            if block_of(&r, OptionNumber::BLOCK1).is_none() {
                return Served::Send(bytes);
            }
            return Served::Send(rewrite(
                &r,
                OptionNumber::BLOCK1,
                (first << 4) | (u32::from(more_in_request) << 3) | 7,
                r.payload(),
            ));
        }
    }
    Served::Silent
}

/// A 4.00 answer to `p` (a BERT Block1 payload with more to come that is
/// not in whole 1024-byte blocks).
fn bad_request(p: &Packet<&[u8]>) -> Served {
    let mut buf = vec![0u8; 16 + p.token().len()];
    let ty = if p.msg_type() == MessageType::Con {
        MessageType::Ack
    } else {
        MessageType::Non
    };
    match MessageWriter::new(&mut buf, ty, Code::BAD_REQUEST, p.message_id(), p.token()) {
        Ok(w) => {
            let n = w.finish();
            buf.truncate(n);
            Served::Send(buf)
        }
        Err(_) => Served::Silent,
    }
}
