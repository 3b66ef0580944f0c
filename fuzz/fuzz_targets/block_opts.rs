//! Block1/Block2 option values and the client's block-wise reassembly
//! (`client::blockwise::Transfer`, RFC 7959) against a fuzzed server.
//!
//! The input first gives a raw option value: `BlockOpt::decode` must
//! accept exactly the values with a size exponent below 7 and a 20-bit
//! number, and encode them back unchanged. Then it plays the server for one
//! transfer (a GET, or a PUT with a body): each response is either
//! well-behaved (the block asked for) or arbitrary (any code, any Block1 /
//! Block2 / Size2 / ETag bytes, any payload). Checked: every Block1 request
//! carries the next bytes of the body in order, no block is larger than its
//! size, a downloaded body never exceeds `max_body`, a finished block-wise
//! response has no Block options left, and the transfer ends.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{Result as UResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use mintgate_coap::client::blockwise::{BlockConfig, Response, Step, Transfer};
use mintgate_coap::client::Request;
use mintgate_coap::server::block::BlockOpt;
use mintgate_coap::wire::{decode_uint, encode_uint, Code, MessageType, OptionNumber};

const MAX_BODY: usize = 700;

fn uint(v: u32) -> Vec<u8> {
    encode_uint(v, &mut [0; 4]).to_vec()
}

fn opt(r: &Request, n: OptionNumber) -> Option<&[u8]> {
    r.options
        .iter()
        .find(|(o, _)| *o == n)
        .map(|(_, v)| v.as_slice())
}

fn block_in(r: &Request, n: OptionNumber) -> Option<BlockOpt> {
    let v = opt(r, n)?;
    let b = decode_uint(v).and_then(BlockOpt::decode);
    assert!(b.is_some(), "the client sent a bad {n:?}: {v:02x?}");
    b
}

fn check_option_value(u: &mut Unstructured<'_>) -> UResult<()> {
    let v: u32 = u.arbitrary()?;
    match BlockOpt::decode(v) {
        Some(b) => {
            assert_eq!(b.encode(), v);
            assert!((16..=1024).contains(&b.size()));
            assert!(b.num < 1 << 20);
        }
        None => assert!(v & 7 == 7 || v >> 4 >= 1 << 20, "{v:#x} refused"),
    }
    Ok(())
}

/// One response to `req`: well-behaved or arbitrary, as the input says.
fn respond(u: &mut Unstructured<'_>, req: &Request, body: &[u8]) -> UResult<Response> {
    let mut options = Vec::new();
    let mut payload = Vec::new();
    let code;
    if u.ratio(3, 4)? {
        if let Some(b1) = block_in(req, OptionNumber::BLOCK1) {
            code = if b1.more {
                Code::CONTINUE
            } else {
                Code::CHANGED
            };
            let szx = b1.szx.saturating_sub(u.int_in_range(0..=1)?);
            options.push((
                OptionNumber::BLOCK1,
                uint(
                    BlockOpt {
                        num: b1.num,
                        more: b1.more,
                        szx,
                    }
                    .encode(),
                ),
            ));
        } else {
            code = Code::CONTENT;
            let (num, szx) = match block_in(req, OptionNumber::BLOCK2) {
                Some(b) => (b.num, b.szx),
                None => (0, u.int_in_range(0..=6)?),
            };
            let size = 16usize << szx;
            let start = (num as usize * size).min(body.len());
            let end = (start + size).min(body.len());
            let more = end < body.len();
            options.push((
                OptionNumber::BLOCK2,
                uint(BlockOpt { num, more, szx }.encode()),
            ));
            if u.ratio(1, 8)? {
                options.push((OptionNumber::ETAG, vec![u.arbitrary()?]));
            }
            if num == 0 && u.arbitrary()? {
                options.push((OptionNumber::SIZE2, uint(body.len() as u32)));
            }
            payload = body[start..end].to_vec();
        }
    } else {
        code = Code(u.arbitrary()?);
        for _ in 0..u.int_in_range(0..=4)? {
            let n = *u.choose(&[
                OptionNumber::BLOCK1,
                OptionNumber::BLOCK2,
                OptionNumber::SIZE2,
                OptionNumber::ETAG,
                OptionNumber::CONTENT_FORMAT,
            ])?;
            let len = u.int_in_range(0..=5)?;
            options.push((n, u.bytes(len)?.to_vec()));
        }
        let len = u.int_in_range(0..=1100)?;
        payload = vec![0x5a; len];
    }
    Ok(Response {
        code,
        msg_type: MessageType::Ack,
        options: options
            .into_iter()
            .map(|(n, v)| (n, Bytes::from(v)))
            .collect(),
        payload: Bytes::from(payload),
        rtt: Default::default(),
        retransmissions: 0,
        exchanges: 1,
    })
}

fn run(u: &mut Unstructured<'_>) -> UResult<()> {
    check_option_value(u)?;
    let cfg = BlockConfig {
        block_size: 16 << u.int_in_range(0..=6)?,
        ask_block2: u.arbitrary()?,
        max_body: MAX_BODY,
        max_restarts: 2,
    };
    let put = u.arbitrary()?;
    let up_len = if put { u.int_in_range(0..=600)? } else { 0 };
    let up: Vec<u8> = (0..up_len).map(|i| i as u8).collect();
    let down_len = u.int_in_range(0..=1000)?;
    let down: Vec<u8> = (0..down_len).map(|i| (i * 7) as u8).collect();
    let req = Request {
        confirmable: true,
        code: if put { Code::PUT } else { Code::GET },
        options: vec![(OptionNumber::URI_PATH, b"x".to_vec())],
        payload: up.clone(),
    };
    let (mut t, mut next) = Transfer::new(req, cfg);
    let mut uploaded = 0usize;
    for _ in 0..200 {
        if let Some(b1) = block_in(&next, OptionNumber::BLOCK1) {
            assert_eq!(b1.num as usize * b1.size(), uploaded, "Block1 out of order");
            assert!(next.payload.len() <= b1.size());
            if !b1.more {
                assert_eq!(
                    uploaded + next.payload.len(),
                    up.len(),
                    "the last block is short"
                );
            }
            assert_eq!(
                next.payload[..],
                up[uploaded..uploaded + next.payload.len()]
            );
            assert!(b1.size() <= cfg.block_size.max(16));
            if b1.more {
                assert_eq!(next.payload.len(), b1.size(), "a non-final block not full");
            }
        }
        if let Some(b2) = block_in(&next, OptionNumber::BLOCK2) {
            assert!(!b2.more, "M set in a request's Block2");
            assert!(next.payload.is_empty() || b2.num == 0);
        }
        let resp = respond(u, &next, &down)?;
        match t.on_response(resp) {
            Step::Send(r) => {
                if block_in(&next, OptionNumber::BLOCK1).is_some() {
                    uploaded += next.payload.len();
                }
                next = r;
            }
            Step::Done(r) => {
                if r.exchanges > 1 {
                    for n in [
                        OptionNumber::BLOCK1,
                        OptionNumber::BLOCK2,
                        OptionNumber::SIZE2,
                    ] {
                        assert!(
                            r.option(n).is_none(),
                            "{n:?} left in a reassembled response"
                        );
                    }
                }
                // one raw response (at most 1100 bytes here) or a body put
                // together from blocks (at most MAX_BODY)
                assert!(r.payload.len() <= MAX_BODY.max(1100));
                if r.exchanges > 1 && r.code.class() == 2 && !put {
                    assert!(r.payload.len() <= MAX_BODY, "reassembled past max_body");
                }
                return Ok(());
            }
            Step::Failed(e) => {
                assert!(!e.to_string().is_empty());
                return Ok(());
            }
        }
    }
    panic!("the transfer did not end within 200 exchanges");
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
