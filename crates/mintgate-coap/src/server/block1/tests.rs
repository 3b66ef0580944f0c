//! Block1 reassembly in virtual time: in order, out of order, repeated and
//! missing blocks, size limits, byte and transfer bounds, timeouts, and
//! fairness between sources.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::wire::{MessageType, MessageWriter};

/// Peer `n`: a source of its own (127.0.0.(1 + n)).
fn peer(n: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1 + n as u8], 40000 + n))
}

/// Port `port` of IPv4 host 10.0.0.`host`.
fn host(host: u8, port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, host], port))
}

/// Checks every invariant of the store, walking all its transfers.
fn check_invariants(s: &Block1Store) {
    let cfg = s.cfg;
    let sum: usize = s.transfers.values().map(|t| t.charged).sum();
    assert_eq!(sum, s.bytes, "bytes is the sum of the charges");
    assert!(s.bytes <= cfg.max_bytes, "{} > max_bytes", s.bytes);
    assert!(s.transfers.len() <= cfg.max_transfers.max(1));
    let mut by_source: HashMap<Source, Use> = HashMap::new();
    for (k, t) in &s.transfers {
        let u = by_source.entry(Source::of(&k.peer)).or_default();
        u.transfers += 1;
        u.bytes += t.charged;
        assert!(t.body.len() <= t.charged, "the charge covers the body");
        assert!(
            t.charged <= 2 * t.body.len(),
            "nothing charged ahead of twice what came"
        );
    }
    assert_eq!(by_source, s.sources, "per-source sums");
    for u in s.sources.values() {
        assert!(u.transfers <= cfg.per_peer.max(1));
        assert!(u.bytes <= cfg.per_source_bytes);
    }
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
        per_source_bytes: 1000,
        max_transfers: 3,
        timeout: Duration::from_secs(30),
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    // a completed, kept body of 600 (charged 256, 512, then 600 = Size1)
    let d = body(600);
    for b in blocks_of(600, 4) {
        feed(
            &mut s,
            t0,
            peer(1),
            &put_block("kept", b"t", &d, b, Some(600), None),
        );
    }
    assert_eq!((s.len(), s.bytes()), (1, 600));
    // a new one announcing 1000: Size1 reserves nothing, block 0 is charged
    // 256 and fits; block 1 takes it to 512, and the kept body makes room
    let big = body(1000);
    let t1 = t0 + Duration::from_secs(1);
    for num in 0..2 {
        let o = feed(
            &mut s,
            t1,
            peer(2),
            &put_block("x", b"t", &big, blk(num, true, 4), Some(1000), None),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    assert_eq!((s.len(), s.bytes()), (1, 512));
    assert_eq!(s.stats().evicted_kept, 1);
    // a lighter source starts next to it
    let t11 = t0 + Duration::from_secs(11);
    let o = feed(
        &mut s,
        t11,
        peer(3),
        &put_block("y", b"t", &big, blk(0, true, 4), Some(1000), None),
    );
    assert_eq!(code_of(&o), Some(Code::CONTINUE));
    // the heaviest source's block 2 needs 488 more (to Size1): there is no
    // room and nobody heavier to take it from: 5.03, and its transfer goes
    let o = feed(
        &mut s,
        t11,
        peer(2),
        &put_block("x", b"t", &big, blk(2, true, 4), Some(1000), None),
    );
    assert_eq!(
        o,
        Block1Outcome::Reply {
            code: Code::SERVICE_UNAVAILABLE,
            block1: None,
            size1: None,
            max_age: Some(30),
        },
        "retry when the other transfer has timed out"
    );
    assert_eq!((s.stats().busy, s.stats().busy_global), (1, 1));
    assert_eq!((s.len(), s.bytes()), (1, 256));
    check_invariants(&s);
    // transfers count too: fill up to 3 with small ones, one per source;
    // a fourth source is no lighter than any (all hold one): 5.03
    let small = body(32);
    for p in [4, 5] {
        let o = feed(
            &mut s,
            t11,
            peer(p),
            &put_block("z", b"t", &small, blk(0, true, 0), None, None),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    let o = feed(
        &mut s,
        t11,
        peer(6),
        &put_block("z", b"t", &small, blk(0, true, 0), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::SERVICE_UNAVAILABLE));
    assert_eq!(s.stats().busy_global, 2);
    assert!(s.len() <= 3 && s.bytes() <= 1000);
    check_invariants(&s);
}

/// The case: one host opens transfers on many ports, each with a
/// large Size1, and stalls. They are one source: at most `per_peer`
/// transfers, nothing reserved for Size1, and another host's upload of the
/// largest body completes.
#[test]
fn stalled_transfers_from_one_host_on_many_ports_do_not_starve_another_host() {
    let mut s = Block1Store::new(Block1Config::default());
    let t0 = Instant::now();
    let limit = s.config().max_body;
    let junk = body(limit);
    for port in 1..=20u16 {
        let o = feed(
            &mut s,
            t0 + Duration::from_millis(port as u64),
            host(1, 50000 + port),
            &put_block(
                "echo",
                b"t",
                &junk,
                blk(0, true, 6),
                Some(limit as u32),
                None,
            ),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
        check_invariants(&s);
    }
    // before: 18 of these reserved 18 x 64,000 bytes, the whole budget
    assert_eq!(
        s.source_use(&host(1, 1)),
        (4, 4 * 1024),
        "per source, not per port"
    );
    assert_eq!((s.len(), s.bytes()), (4, 4 * 1024));
    assert_eq!(s.stats().evicted_own, 16);
    // they go on sending (62 blocks each), still one source within its share
    for port in 17..=20u16 {
        for num in 1..62 {
            let o = feed(
                &mut s,
                t0 + Duration::from_secs(1),
                host(1, 50000 + port),
                &put_block(
                    "echo",
                    b"t",
                    &junk,
                    blk(num, true, 6),
                    Some(limit as u32),
                    None,
                ),
            );
            assert_eq!(code_of(&o), Some(Code::CONTINUE), "port {port} block {num}");
        }
    }
    check_invariants(&s);
    assert!(s.source_use(&host(1, 1)).1 <= s.config().per_source_bytes);
    // another host uploads the largest body allowed, 10 s later
    let mine = body(limit);
    let t1 = t0 + Duration::from_secs(10);
    let bl = blocks_of(limit, 6);
    let mut last = None;
    for b in &bl {
        last = Some(feed(
            &mut s,
            t1,
            host(2, 5683),
            &put_block("echo", b"mine", &mine, *b, Some(limit as u32), None),
        ));
        check_invariants(&s);
    }
    assert_eq!(completed(last.unwrap()).0, mine);
    assert_eq!(s.stats().busy, 0);
}

/// Many hosts (IPv6 /64s, each address of which is the same source) fill
/// the whole budget with stalled transfers; a quiet IPv4 host's upload
/// still completes, taking room from the heaviest sources only.
#[test]
fn a_quiet_source_gets_through_a_budget_full_of_other_sources() {
    let cfg = Block1Config::default();
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let junk = body(cfg.max_body);
    let attacker = |net: u16, addr: u16| {
        SocketAddr::from((
            std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, net, 0, 0, 0, addr),
            40000 + addr,
        ))
    };
    // 8 /64s, 10 addresses each, every one sending 40 blocks and stalling
    for net in 0..8 {
        for a in 1..=10 {
            for num in 0..40 {
                feed(
                    &mut s,
                    t0 + Duration::from_millis(u64::from(net * 10 + a)),
                    attacker(net, a),
                    &put_block("echo", b"t", &junk, blk(num, true, 6), Some(64000), None),
                );
            }
        }
    }
    check_invariants(&s);
    assert_eq!(s.sources(), 8, "a /64 is one source");
    assert!(
        s.bytes() > cfg.max_bytes - 64 * 1024,
        "the budget is nearly full: {}",
        s.bytes()
    );
    let before = s.stats();
    let mine = body(cfg.max_body);
    let mut last = None;
    for b in blocks_of(mine.len(), 6) {
        last = Some(feed(
            &mut s,
            t0 + Duration::from_secs(5),
            host(9, 1),
            &put_block("echo", b"q", &mine, b, Some(64000), None),
        ));
        check_invariants(&s);
    }
    assert_eq!(completed(last.unwrap()).0, mine);
    let after = s.stats();
    assert!(after.evicted_heaviest > before.evicted_heaviest);
    assert_eq!(
        after.busy, before.busy,
        "the quiet source was never refused"
    );
}

/// When room is short, the heaviest source loses its transfer idle longest
/// first, then the next heaviest (ties: the lower address), and a source
/// that would only trade places with the heaviest is refused.
#[test]
fn eviction_takes_from_the_heaviest_source_first() {
    let cfg = Block1Config {
        max_bytes: 8192,
        per_source_bytes: 8192,
        ..Block1Config::default()
    };
    let mut s = Block1Store::new(cfg);
    let t0 = Instant::now();
    let d = body(64000);
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // blocks of 1024: 2 blocks are charged 2048, 1 block 1024
    let start = |s: &mut Block1Store, when, from, path: &str, blocks: u32| {
        for num in 0..blocks {
            let o = feed(
                s,
                when,
                from,
                &put_block(path, b"t", &d, blk(num, true, 6), None, None),
            );
            assert_eq!(code_of(&o), Some(Code::CONTINUE), "{from} {path} {num}");
        }
    };
    let (a, b, c) = (host(1, 1), host(2, 1), host(3, 1));
    start(&mut s, at(0), a, "a1", 2);
    start(&mut s, at(1), a, "a2", 2);
    start(&mut s, at(2), b, "b", 2);
    start(&mut s, at(3), c, "c", 1);
    assert_eq!(s.bytes(), 7168);
    let holds = |s: &Block1Store| {
        let mut v: Vec<(SocketAddr, Vec<u8>)> = s
            .transfers
            .keys()
            .map(|k| (k.peer, k.target[4..].to_vec()))
            .filter(|(p, _)| [a, b, c].contains(p))
            .collect();
        v.sort();
        v
    };
    let names = |v: &[&str]| -> Vec<Vec<u8>> { v.iter().map(|x| x.as_bytes().to_vec()).collect() };
    // quiet sources D.. start one block each
    start(&mut s, at(10), host(10, 1), "d", 1);
    assert_eq!(s.stats().evicted, 0, "8192 fits");
    // a newcomer needing 1024 when 8192 are held takes a whole transfer
    // (2048 or 1024) from the heaviest source; every other one fits
    let expect = [
        (11, vec!["a2", "b", "c"]), // A (4096) is heaviest: its idle-longest, a1
        (12, vec!["a2", "b", "c"]),
        (13, vec!["b", "c"]), // A and B tie at 2048: the lower address
        (14, vec!["b", "c"]),
        (15, vec!["c"]), // B
        (16, vec!["c"]),
        (17, vec![]), // everyone at 1024: C has the lowest address
    ];
    for (h, left) in expect {
        start(&mut s, at(u64::from(h)), host(h, 1), "q", 1);
        let got: Vec<Vec<u8>> = holds(&s).into_iter().map(|(_, t)| t).collect();
        let mut want = names(&left);
        want.sort();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        assert_eq!(got_sorted, want, "after host {h}");
        check_invariants(&s);
    }
    assert_eq!(s.stats().evicted_heaviest, 4);
    // D..N hold 1024 each (8 of them, 8192): D's second block would make
    // it the heaviest, and nobody holds more than D: 5.03
    let o = feed(
        &mut s,
        at(20),
        host(10, 1),
        &put_block("d", b"t", &d, blk(1, true, 6), None, None),
    );
    assert_eq!(code_of(&o), Some(Code::SERVICE_UNAVAILABLE));
    assert_eq!(s.stats().busy_global, 1);
    check_invariants(&s);
}

/// Request-Tag (RFC 9175 3): the same client, resource and method with
/// another tag is another transfer; a tag longer than 8 bytes is ignored
/// as an unrecognized elective option would be.
#[test]
fn request_tag_tells_transfers_of_one_client_apart() {
    let mut s = Block1Store::new(Block1Config::default());
    let t0 = Instant::now();
    let (x, y) = (body(100), body(100).iter().map(|v| !v).collect::<Vec<u8>>());
    for (d, tag) in [(&x, &b"\x01"[..]), (&y, &b"\x02"[..])] {
        let o = feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"t", d, blk(0, true, 2), None, Some(tag)),
        );
        assert_eq!(code_of(&o), Some(Code::CONTINUE));
    }
    assert_eq!(s.len(), 2);
    // a block under a tag never seen: no transfer
    let o = feed(
        &mut s,
        t0,
        peer(1),
        &put_block("echo", b"t", &x, blk(1, false, 2), None, Some(b"\x03")),
    );
    assert_eq!(code_of(&o), Some(Code::REQUEST_ENTITY_INCOMPLETE));
    for (d, tag) in [(&y, &b"\x02"[..]), (&x, &b"\x01"[..])] {
        let o = feed(
            &mut s,
            t0,
            peer(1),
            &put_block("echo", b"t", d, blk(1, false, 2), None, Some(tag)),
        );
        assert_eq!(&completed(o).0, d);
    }
    // 9 bytes: not a Request-Tag, so the same transfer as no tag at all
    let long = [7u8; 9];
    let o = feed(
        &mut s,
        t0,
        peer(2),
        &put_block("echo", b"t", &x, blk(0, true, 2), None, Some(&long)),
    );
    assert_eq!(code_of(&o), Some(Code::CONTINUE));
    let o = feed(
        &mut s,
        t0,
        peer(2),
        &put_block("echo", b"t", &x, blk(1, false, 2), None, None),
    );
    assert_eq!(completed(o).0, x);
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
            per_source_bytes: 3000,
            timeout: Duration::from_secs(2),
            block_size: 256,
        };
        // peers 2k and 2k+1 are two ports of one host: one source
        let peer = |p: u16| SocketAddr::from(([127, 0, 0, 1 + (p / 2) as u8], 40000 + p));
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
            check_invariants(&s);
            for t in s.transfers.values() {
                prop_assert!(t.charged <= cfg.per_source_bytes.min(cfg.max_body));
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
