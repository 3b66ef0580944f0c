//! Block1 reassembly in virtual time: in order, out of order, repeated and
//! missing blocks, size limits, byte and transfer bounds, timeouts.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::wire::{MessageType, MessageWriter};

fn peer(n: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 40000 + n))
}

/// A PUT of block `b` of `body` to `path` (size1 on block 0 when given).
fn put_block(
    path: &str,
    token: &[u8],
    body: &[u8],
    b: BlockOpt,
    size1: Option<u32>,
    tag: Option<&[u8]>,
) -> Vec<u8> {
    let start = (b.num as usize * b.size()).min(body.len());
    let end = (start + b.size()).min(body.len());
    put_raw(path, token, &body[start..end], b.encode(), size1, tag)
}

fn put_raw(
    path: &str,
    token: &[u8],
    payload: &[u8],
    block1: u32,
    size1: Option<u32>,
    tag: Option<&[u8]>,
) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::PUT, 7, token).unwrap();
    w.path_options(OptionNumber::URI_PATH, path).unwrap();
    w.option_uint(OptionNumber::CONTENT_FORMAT, 0).unwrap();
    w.option_uint(OptionNumber::BLOCK1, block1).unwrap();
    if let Some(s) = size1 {
        w.option_uint(OptionNumber::SIZE1, s).unwrap();
    }
    if let Some(t) = tag {
        w.option(REQUEST_TAG, t).unwrap();
    }
    w.payload(payload).unwrap();
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn feed(s: &mut Block1Store, now: Instant, from: SocketAddr, dg: &[u8]) -> Block1Outcome {
    let p = Packet::new_checked(dg).unwrap();
    let b = p
        .option(OptionNumber::BLOCK1)
        .and_then(|o| o.uint())
        .and_then(BlockOpt::decode)
        .expect("test datagrams carry a valid Block1");
    s.on_block(now, from, &p, b)
}

fn blk(num: u32, more: bool, szx: u8) -> BlockOpt {
    BlockOpt { num, more, szx }
}

fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn code_of(o: &Block1Outcome) -> Option<Code> {
    match o {
        Block1Outcome::Reply { code, .. } => Some(*code),
        _ => None,
    }
}

/// The payload and options of a completed transfer's rebuilt request.
fn completed(o: Block1Outcome) -> (Vec<u8>, Vec<u16>, Vec<u8>) {
    match o {
        Block1Outcome::Complete { datagram, .. } => {
            let p = Packet::new_checked(&datagram[..]).expect("rebuilt request parses");
            (
                p.payload().to_vec(),
                p.options().map(|o| o.number.0).collect(),
                p.token().to_vec(),
            )
        }
        other => panic!("expected a completed transfer, got {other:?}"),
    }
}

/// Block numbers 0..n of `len` bytes in blocks of 2^(szx+4).
fn blocks_of(len: usize, szx: u8) -> Vec<BlockOpt> {
    let size = 16usize << szx;
    let n = len.div_ceil(size).max(1);
    (0..n as u32)
        .map(|i| blk(i, (i as usize) < n - 1, szx))
        .collect()
}

#[test]
fn in_order_blocks_continue_then_complete_with_the_whole_body() {
    let mut s = Block1Store::new(Block1Config::default());
    let t0 = Instant::now();
    let data = body(1000);
    let bl = blocks_of(data.len(), 2); // 64-byte blocks: 16 of them
    assert_eq!(bl.len(), 16);
    for b in &bl[..15] {
        let o = feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"tk", &data, *b, Some(1000), None),
        );
        assert_eq!(
            o,
            Block1Outcome::Reply {
                code: Code::CONTINUE,
                block1: Some(blk(b.num, true, 2)),
                size1: None,
                max_age: None
            }
        );
    }
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"fin", &data, bl[15], None, None),
    );
    let (payload, opts, token) = completed(o);
    assert_eq!(payload, data);
    assert_eq!(token, b"fin", "the final block's token answers");
    assert!(
        !opts.contains(&OptionNumber::BLOCK1.0) && !opts.contains(&OptionNumber::SIZE1.0),
        "{opts:?}"
    );
    assert!(opts.contains(&OptionNumber::URI_PATH.0) && opts.contains(&12));
    let st = s.stats();
    assert_eq!((st.started, st.completed, st.continued), (1, 1, 15));
    // the body is kept for Block2 continuations, and counted
    assert_eq!(s.len(), 1);
    assert_eq!(s.bytes(), 1000, "Size1 sized the body up front");
}

#[test]
fn a_single_final_block_is_whole_and_keeps_no_state() {
    let mut s = Block1Store::new(Block1Config::default());
    let o = feed(
        &mut s,
        Instant::now(),
        peer(1),
        &put_block("echo", b"t", b"tiny", blk(0, false, 6), None, None),
    );
    assert_eq!(
        o,
        Block1Outcome::Whole {
            block1: blk(0, false, 6)
        }
    );
    assert!(s.is_empty());
    assert_eq!(s.bytes(), 0);
}

#[test]
fn a_missing_block_makes_the_final_one_4_08_and_ends_the_transfer() {
    let mut s = Block1Store::new(Block1Config::default());
    let t0 = Instant::now();
    let data = body(64 * 4);
    let bl = blocks_of(data.len(), 2);
    for b in [bl[0], bl[1]] {
        let o = feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"t", &data, b, None, None),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    // block 2 never comes
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &data, bl[3], None, None),
    );
    assert_eq!(code_of(&o), Some(Code::REQUEST_ENTITY_INCOMPLETE));
    assert!(s.is_empty(), "an incomplete transfer is dropped");
    assert_eq!(s.stats().incomplete, 1);
    assert_eq!(s.bytes(), 0);
}

#[test]
fn a_block_of_an_unknown_or_expired_transfer_is_4_08() {
    let cfg = Block1Config {
        timeout: Duration::from_secs(10),
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let data = body(64 * 3);
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &data, blk(1, true, 2), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::REQUEST_ENTITY_INCOMPLETE));
    feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &data, blk(0, true, 2), None, None),
    );
    // 9.999 s idle: still there
    let o = feed(
        &mut s,
        t0 + Duration::from_millis(9_999),
        peer(1),
        &put_block("echo", b"t", &data, blk(1, true, 2), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::CONTINUE));
    // the idle time counts from the last block: 10 s after it, gone
    let o = feed(
        &mut s,
        t0 + Duration::from_millis(19_999),
        peer(1),
        &put_block("echo", b"t", &data, blk(2, false, 2), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::REQUEST_ENTITY_INCOMPLETE));
    assert_eq!(s.stats().expired, 1);
    assert!(s.is_empty());
    assert_eq!(s.bytes(), 0);
}

#[test]
fn expire_drops_idle_transfers_without_traffic() {
    let cfg = Block1Config {
        timeout: Duration::from_secs(5),
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let data = body(64 * 3);
    for (i, p) in [peer(1), peer(2)].into_iter().enumerate() {
        feed(
            &mut s,
            t0 + Duration::from_secs(i as u64 * 2),
            p,
            &put_block("echo", b"t", &data, blk(0, true, 2), None, None),
        );
    }
    assert_eq!(s.len(), 2);
    assert_eq!(s.expire(t0 + Duration::from_millis(4_999)), 0);
    assert_eq!(s.expire(t0 + Duration::from_secs(5)), 1);
    assert_eq!(s.expire(t0 + Duration::from_secs(7)), 1);
    assert!(s.is_empty());
    assert_eq!(s.bytes(), 0);
}

#[test]
fn size_limits_give_4_13_with_size1() {
    let cfg = Block1Config {
        max_body: 200,
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let data = body(300);
    // announced too large
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &data, blk(0, true, 2), Some(300), None),
    );
    let too_large = Block1Outcome::Reply {
        code: Code::REQUEST_ENTITY_TOO_LARGE,
        block1: None,
        size1: Some(200),
        max_age: None,
    };
    assert_eq!(o, too_large);
    assert!(s.is_empty());
    // not announced, found out on the way: block 3 ends at byte 256
    for b in blocks_of(300, 2).into_iter().take(3) {
        let o = feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"t", &data, b, None, None),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &data, blk(3, true, 2), None, None),
    );
    assert_eq!(o, too_large);
    assert!(s.is_empty(), "the transfer is dropped");
    assert_eq!(s.bytes(), 0);
    assert_eq!(s.stats().too_large, 2);
}

#[test]
fn a_block_of_the_wrong_size_is_4_00_and_not_stored() {
    let mut s = Block1Store::new(Block1Config::default());
    let t0 = Instant::now();
    // non-final block shorter than its size
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_raw("echo", b"t", &[1; 10], blk(0, true, 2).encode(), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::BAD_REQUEST));
    // final block longer than its size
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_raw(
            "echo",
            b"t",
            &[1; 80],
            blk(0, false, 2).encode(),
            None,
            None,
        ),
    );
    assert_eq!(code_of(&o), Some(Code::BAD_REQUEST));
    assert!(s.is_empty());
    assert_eq!(s.stats().bad, 2);
}

#[test]
fn the_server_asks_for_smaller_blocks_and_the_offsets_follow() {
    let cfg = Block1Config {
        block_size: 256,
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let data = body(1024 + 600);
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &data, blk(0, true, 6), None, None),
    );
    assert_eq!(
        o,
        Block1Outcome::Reply {
            code: Code::CONTINUE,
            block1: Some(blk(0, true, 4)),
            size1: None,
            max_age: None
        },
        "block 0 of 1024 is kept, 256-byte blocks asked for"
    );
    // the client goes on at byte 1024 = block 4 of 256
    let rest = blocks_of(data.len(), 4);
    let mut last = None;
    for b in &rest[4..] {
        last = Some(feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"t", &data, *b, None, None),
        ));
    }
    assert_eq!(completed(last.unwrap()).0, data);
}

#[test]
fn transfers_are_told_apart_by_peer_method_path_and_request_tag() {
    let mut s = Block1Store::new(Block1Config::default());
    let t0 = Instant::now();
    let a = body(100);
    let b: Vec<u8> = body(100).iter().map(|x| x ^ 0xff).collect();
    let starts = [
        (peer(1), "echo", None, &a),
        (peer(2), "echo", None, &b),
        (peer(1), "other", None, &b),
        (peer(1), "echo", Some(&b"x"[..]), &b),
    ];
    for (p, path, tag, d) in starts {
        let o = feed(
            &mut s,
            t0,
            p,
            &put_block(path, b"t", d, blk(0, true, 2), None, tag),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    assert_eq!(s.len(), 4);
    for (p, path, tag, d) in starts {
        let o = feed(
            &mut s,
            t0,
            p,
            &put_block(path, b"t", d, blk(1, false, 2), None, tag),
        );
        assert_eq!(&completed(o).0, d, "{p} {path} {tag:?}");
    }
}

#[test]
fn a_peer_over_its_share_loses_its_own_oldest_transfer() {
    let cfg = Block1Config {
        per_peer: 2,
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let d = body(100);
    for (i, path) in ["a", "b", "c"].iter().enumerate() {
        feed(
            &mut s,
            t0 + Duration::from_millis(i as u64),
            peer(1),
            &put_block(path, b"t", &d, blk(0, true, 2), None, None),
        );
    }
    feed(
        &mut s,
        t0,
        peer(2),
        &put_block("a", b"t", &d, blk(0, true, 2), None, None),
    );
    assert_eq!(s.len(), 3);
    assert_eq!(s.stats().evicted, 1);
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("a", b"t", &d, blk(1, false, 2), None, None),
    );
    assert_eq!(
        code_of(&o),
        Some(Code::REQUEST_ENTITY_INCOMPLETE),
        "the oldest went"
    );
    for (p, path) in [(peer(1), "c"), (peer(2), "a")] {
        let o = feed(
            &mut s,
            t0,
            p,
            &put_block(path, b"t", &d, blk(1, false, 2), None, None),
        );
        assert_eq!(completed(o).0, d);
    }
}

#[test]
fn no_room_gives_5_03_with_max_age_and_kept_bodies_make_room_first() {
    let cfg = Block1Config {
        max_bytes: 1000,
        max_transfers: 3,
        timeout: Duration::from_secs(30),
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let d = body(600);
    // a completed, kept body of 600
    for b in blocks_of(600, 4) {
        feed(
            &mut s,
            t0,
            peer(1),
            &put_block("kept", b"t", &d, b, Some(600), None),
        );
    }
    assert_eq!((s.len(), s.bytes()), (1, 600));
    // a new one announcing 600 evicts the kept body
    let o = feed(
        &mut s,
        t0 + Duration::from_secs(1),
        peer(2),
        &put_block("x", b"t", &d, blk(0, true, 4), Some(600), None),
    );
    assert_eq!(code_of(&o), Some(Code::CONTINUE));
    assert_eq!((s.len(), s.bytes()), (1, 600));
    // a third announcing 600 does not fit next to a partial one: 5.03
    let o = feed(
        &mut s,
        t0 + Duration::from_secs(11),
        peer(3),
        &put_block("y", b"t", &d, blk(0, true, 4), Some(600), None),
    );
    assert_eq!(
        o,
        Block1Outcome::Reply {
            code: Code::SERVICE_UNAVAILABLE,
            block1: None,
            size1: None,
            max_age: Some(20),
        },
        "retry when the partial transfer has timed out"
    );
    assert_eq!(s.stats().busy, 1);
    // transfers count too: fill up to 3 with small ones (no Size1)
    let small = body(32);
    for p in [4, 5] {
        let o = feed(
            &mut s,
            t0 + Duration::from_secs(11),
            peer(p),
            &put_block("z", b"t", &small, blk(0, true, 0), None, None),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    let o = feed(
        &mut s,
        t0 + Duration::from_secs(11),
        peer(6),
        &put_block("z", b"t", &small, blk(0, true, 0), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::SERVICE_UNAVAILABLE));
    assert!(s.len() <= 3 && s.bytes() <= 1000);
}

#[test]
fn a_completed_body_serves_block2_continuations_until_it_times_out() {
    let cfg = Block1Config {
        timeout: Duration::from_secs(5),
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let d = body(200);
    for b in blocks_of(200, 2) {
        feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"t", &d, b, None, None),
        );
    }
    // the continuation: same method and path, Block2 num 1, no payload
    let cont = |code: Code| {
        let mut buf = vec![0u8; 64];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, 9, b"c").unwrap();
        w.path_options(OptionNumber::URI_PATH, "echo").unwrap();
        w.option_uint(OptionNumber::BLOCK2, blk(1, false, 2).encode())
            .unwrap();
        let n = w.finish();
        buf.truncate(n);
        buf
    };
    let put = cont(Code::PUT);
    let p = Packet::new_checked(&put[..]).unwrap();
    let rebuilt = s
        .continuation(t0 + Duration::from_secs(4), peer(1), &p)
        .expect("kept body");
    let r = Packet::new_checked(&rebuilt[..]).unwrap();
    assert_eq!(r.payload(), &d[..]);
    assert_eq!(r.token(), b"c");
    assert!(r.option(OptionNumber::BLOCK2).is_some());
    // another method, another peer: nothing
    let post = cont(Code::POST);
    let pp = Packet::new_checked(&post[..]).unwrap();
    assert!(s.continuation(t0, peer(1), &pp).is_none());
    assert!(s.continuation(t0, peer(2), &p).is_none());
    // serving it refreshed the idle time: 4 + 4.9 s is still within
    assert!(s
        .continuation(t0 + Duration::from_millis(8_900), peer(1), &p)
        .is_some());
    assert!(s
        .continuation(t0 + Duration::from_millis(13_900), peer(1), &p)
        .is_none());
    assert_eq!(s.stats().continuations, 2);
    assert_eq!(s.bytes(), 0);
}

#[test]
fn ranges_merge_and_are_bounded() {
    let mut t = Transfer {
        body: Vec::new(),
        have: Vec::new(),
        last: Instant::now(),
        seq: 0,
        done: false,
        charged: 0,
    };
    assert!(t.add_range(10, 20));
    assert!(t.add_range(30, 40));
    assert!(t.add_range(20, 30));
    assert_eq!(t.have, vec![(10, 40)]);
    assert!(t.add_range(0, 10));
    assert!(t.add_range(15, 25), "inside: no change");
    assert_eq!(t.have, vec![(0, 40)]);
    for i in 1..MAX_RANGES {
        assert!(t.add_range(100 * i, 100 * i + 10));
    }
    assert_eq!(t.have.len(), MAX_RANGES);
    assert!(!t.add_range(5000, 5010), "one gap too many");
    assert_eq!(t.have.len(), MAX_RANGES, "unchanged when refused");
}

/// What happens to each block of a random schedule.
#[derive(Clone, Debug)]
enum Step {
    /// Send block `i` (of the non-final ones).
    Block(usize),
    /// Let time pass, ms.
    Wait(u64),
}

proptest! {
    /// Non-final blocks in any order, some repeated, then the final one:
    /// the body comes out whole, exactly once.
    #[test]
    fn any_order_and_repeats_reassemble(
        len in 1usize..3000,
        szx in 0u8..7,
        order in proptest::collection::vec(any::<proptest::sample::Index>(), 0..40),
        seed in any::<u64>(),
        window in 1usize..40,
    ) {
        let mut s = Block1Store::new(Block1Config::default());
        let t0 = Instant::now();
        let data = body(len);
        let bl = blocks_of(len, szx);
        let n = bl.len();
        // a permutation of the non-final blocks, plus repeats from `order`
        // (shuffled within windows: small windows leave few gaps, large
        // ones may leave more than the store tracks)
        let mut sched: Vec<usize> = (0..n - 1).collect();
        let mut x = seed | 1;
        for chunk in sched.chunks_mut(window) {
            for i in (1..chunk.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                chunk.swap(i, (x % (i as u64 + 1)) as usize);
            }
        }
        if n > 2 {
            // repeats of any but block 0 (block 0 starts a transfer over)
            for ix in &order { sched.push(1 + ix.index(n - 2)); }
        }
        // block 0 first: it starts the transfer
        if let Some(pos) = sched.iter().position(|&i| i == 0) { sched.swap(0, pos); }
        // the reference: runs of received blocks are the byte ranges
        let mut got = vec![false; n];
        for i in sched {
            got[i] = true;
            let runs = (0..n).filter(|&j| got[j] && (j == 0 || !got[j - 1])).count();
            let o = feed(&mut s, t0, peer(1), &put_block("echo", b"t", &data, bl[i], None, None));
            if runs > MAX_RANGES {
                prop_assert_eq!(code_of(&o), Some(Code::REQUEST_ENTITY_INCOMPLETE));
                prop_assert!(s.is_empty());
                return Ok(());
            }
            prop_assert_eq!(code_of(&o), Some(Code::CONTINUE));
            prop_assert!(s.bytes() <= s.config().max_bytes);
        }
        let o = feed(&mut s, t0, peer(1), &put_block("echo", b"t", &data, bl[n - 1], None, None));
        if n == 1 {
            prop_assert_eq!(o, Block1Outcome::Whole { block1: bl[0] });
        } else {
            prop_assert_eq!(completed(o).0, data);
        }
        prop_assert_eq!(s.stats().completed, 1);
    }

    /// Any block left out (other than the final one) makes the final block
    /// 4.08, and nothing is left behind.
    #[test]
    fn any_missing_block_is_4_08(len in 33usize..3000, szx in 0u8..4, skip in any::<proptest::sample::Index>()) {
        let mut s = Block1Store::new(Block1Config::default());
        let t0 = Instant::now();
        let data = body(len);
        let bl = blocks_of(len, szx);
        let n = bl.len();
        prop_assume!(n >= 3);
        let skip = 1 + skip.index(n - 2); // not block 0 (it starts), not the final one
        for (i, b) in bl.iter().enumerate().take(n - 1) {
            if i != skip {
                feed(&mut s, t0, peer(1), &put_block("echo", b"t", &data, *b, None, None));
            }
        }
        let o = feed(&mut s, t0, peer(1), &put_block("echo", b"t", &data, bl[n - 1], None, None));
        prop_assert_eq!(code_of(&o), Some(Code::REQUEST_ENTITY_INCOMPLETE));
        prop_assert!(s.is_empty());
        prop_assert_eq!(s.bytes(), 0);
    }

    /// Random traffic from several peers to several paths, with time
    /// passing: the bounds hold after every call, and `bytes` is the sum of
    /// what the transfers hold.
    #[test]
    fn bounds_hold_under_random_traffic(
        steps in proptest::collection::vec(
            (0u16..6, 0usize..3, 0u32..40, any::<bool>(), 0u8..7, prop_oneof![Just(None), (0u32..5000).prop_map(Some)], 0u64..3000),
            1..200,
        ),
    ) {
        let cfg = Block1Config {
            max_body: 4000,
            max_bytes: 6000,
            max_transfers: 5,
            per_peer: 2,
            timeout: Duration::from_secs(2),
            block_size: 256,
        };
        let mut s = Block1Store::new(cfg);
        let mut now = Instant::now();
        let data = body(4000 + 1024);
        for (p, path, num, more, szx, size1, wait) in steps {
            now += Duration::from_millis(wait);
            let b = blk(num, more, szx);
            let path = ["a", "b", "c"][path];
            let o = feed(&mut s, now, peer(p), &put_block(path, b"t", &data, b, size1, None));
            if let Block1Outcome::Complete { datagram, .. } = &o {
                let r = Packet::new_checked(&datagram[..]).unwrap();
                let start = (b.num as usize * b.size()).min(data.len());
                let end = start + b.size().min(data.len() - start);
                prop_assert_eq!(r.payload(), &data[..end]);
            }
            prop_assert!(s.bytes() <= cfg.max_bytes, "{} > {}", s.bytes(), cfg.max_bytes);
            prop_assert!(s.len() <= cfg.max_transfers);
            let sum: usize = s.transfers.values().map(|t| t.charged).sum();
            prop_assert_eq!(sum, s.bytes());
            for t in s.transfers.values() {
                prop_assert!(t.body.len() <= t.charged && t.charged <= cfg.max_body);
            }
            for q in 0..6 {
                let n = s.transfers.keys().filter(|k| k.peer == peer(q)).count();
                prop_assert!(n <= cfg.per_peer);
            }
        }
        s.expire(now + Duration::from_secs(2));
        prop_assert!(s.is_empty());
        prop_assert_eq!(s.bytes(), 0);
    }
}

#[test]
fn schedules_with_waits_time_out_in_virtual_time() {
    // a slow client: each block 1.5 s after the previous one, timeout 2 s
    let cfg = Block1Config {
        timeout: Duration::from_secs(2),
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let data = body(64 * 5);
    let bl = blocks_of(data.len(), 2);
    let mut now = Instant::now();
    let sched = [
        Step::Block(0),
        Step::Wait(1500),
        Step::Block(1),
        Step::Wait(1500),
        Step::Block(2),
        Step::Wait(1500),
        Step::Block(3),
        Step::Wait(2000),
        Step::Block(4),
    ];
    let mut last = None;
    for st in sched {
        match st {
            Step::Wait(ms) => now += Duration::from_millis(ms),
            Step::Block(i) => {
                last = Some(feed(
                    &mut s,
                    now,
                    peer(1),
                    &put_block("echo", b"t", &data, bl[i], None, None),
                ))
            }
        }
    }
    assert_eq!(
        code_of(&last.unwrap()),
        Some(Code::REQUEST_ENTITY_INCOMPLETE),
        "2 s of silence before the final block ended the transfer"
    );
}
