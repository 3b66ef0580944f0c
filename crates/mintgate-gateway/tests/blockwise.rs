//! Block-wise transfers (RFC 7959) through the running pipeline, over real
//! loopback UDP: a PUT to `/echo` in blocks (Block1) and the value read
//! back in blocks (Block2), the limits, a missing block, a retransmitted
//! block, and a POST whose large answer is fetched with continuations.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use mintgate_coap::server::block::BlockOpt;
use mintgate_coap::wire::{encode_uint, Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

fn config() -> Config {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(2);
    // these clients ask for fixed block sizes and check the numbers they
    // get back; answers cut for unverified sources (which a client follows
    // at the server's smaller size) are tested in tests/amplification.rs
    c.coap.amplification_factor = 0;
    c.buffers.partitions = vec![
        mintgate_gateway::config::Partition {
            block_size: 192,
            blocks: 1024,
        },
        mintgate_gateway::config::Partition {
            block_size: 1280,
            blocks: 256,
        },
    ];
    c
}

struct Peer {
    sock: UdpSocket,
    mid: u16,
}

/// A response: code, Block1, Block2, ETag, Size1, payload.
#[derive(Debug)]
struct Resp {
    code: Code,
    block1: Option<BlockOpt>,
    block2: Option<BlockOpt>,
    etag: Option<Vec<u8>>,
    size1: Option<u32>,
    payload: Vec<u8>,
}

fn uint(v: u32) -> Vec<u8> {
    encode_uint(v, &mut [0; 4]).to_vec()
}

impl Peer {
    fn new(server: SocketAddr) -> Peer {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        sock.connect(server).unwrap();
        Peer { sock, mid: 100 }
    }

    fn encode(&mut self, code: Code, opts: &[(OptionNumber, Vec<u8>)], payload: &[u8]) -> Vec<u8> {
        self.mid += 1;
        let mut buf = vec![0u8; 1400];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, self.mid, b"bw").unwrap();
        let mut all = vec![(OptionNumber::URI_PATH, b"echo".to_vec())];
        all.extend_from_slice(opts);
        all.sort_by_key(|(n, _)| *n);
        for (n, v) in &all {
            w.option(*n, v).unwrap();
        }
        w.payload(payload).unwrap();
        let n = w.finish();
        buf.truncate(n);
        buf
    }

    fn exchange(&self, dg: &[u8]) -> Resp {
        self.sock.send(dg).unwrap();
        let mut b = [0u8; 2048];
        let n = self.sock.recv(&mut b).expect("a response within 3 s");
        let p = Packet::new_checked(&b[..n]).unwrap();
        assert_eq!(p.message_id(), u16::from_be_bytes([dg[2], dg[3]]));
        let blk = |o| {
            p.option(o)
                .and_then(|o| o.uint())
                .and_then(BlockOpt::decode)
        };
        Resp {
            code: p.code(),
            block1: blk(OptionNumber::BLOCK1),
            block2: blk(OptionNumber::BLOCK2),
            etag: p.option(OptionNumber::ETAG).map(|o| o.value.to_vec()),
            size1: p.option(OptionNumber::SIZE1).and_then(|o| o.uint()),
            payload: p.payload().to_vec(),
        }
    }

    fn request(&mut self, code: Code, opts: &[(OptionNumber, Vec<u8>)], payload: &[u8]) -> Resp {
        let dg = self.encode(code, opts, payload);
        self.exchange(&dg)
    }

    /// `body` in blocks of 2^(szx+4) with Size1; the responses.
    fn upload(&mut self, code: Code, body: &[u8], szx: u8) -> Vec<Resp> {
        let size = 16usize << szx;
        let n = body.len().div_ceil(size);
        (0..n)
            .map(|i| {
                let b = BlockOpt {
                    num: i as u32,
                    more: i + 1 < n,
                    szx,
                };
                let mut opts = vec![(OptionNumber::BLOCK1, uint(b.encode()))];
                if i == 0 {
                    opts.push((OptionNumber::SIZE1, uint(body.len() as u32)));
                }
                self.request(
                    code,
                    &opts,
                    &body[i * size..((i + 1) * size).min(body.len())],
                )
            })
            .collect()
    }

    /// GET /echo block by block; the body and the ETag.
    fn download(&mut self, szx: u8) -> (Vec<u8>, Option<Vec<u8>>) {
        let mut got = Vec::new();
        let mut tag = None;
        for num in 0..1000u32 {
            let b = BlockOpt {
                num,
                more: false,
                szx,
            };
            let r = self.request(Code::GET, &[(OptionNumber::BLOCK2, uint(b.encode()))], b"");
            assert_eq!(r.code, Code::CONTENT);
            assert!(tag.is_none() || tag == r.etag, "the ETag holds");
            tag = r.etag;
            got.extend_from_slice(&r.payload);
            let b2 = r.block2.expect("Block2 answer");
            assert_eq!(b2.num, num);
            if !b2.more {
                return (got, tag);
            }
        }
        panic!("more than 1000 blocks");
    }
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'0' + (i % 10) as u8).collect()
}

#[test]
fn put_in_blocks_then_get_in_blocks() {
    let gw = Gateway::start(config(), resources::router_for(&config())).unwrap();
    let mut p = Peer::new(gw.local_addrs()[0]);
    let data = body(5000);
    let rs = p.upload(Code::PUT, &data, 2);
    assert_eq!(rs.len(), 79);
    for (i, r) in rs[..78].iter().enumerate() {
        assert_eq!(
            (r.code, r.block1),
            (
                Code::CONTINUE,
                Some(BlockOpt {
                    num: i as u32,
                    more: true,
                    szx: 2
                })
            )
        );
    }
    let last = rs.last().unwrap();
    assert_eq!(last.code, Code::CHANGED);
    assert_eq!(last.block1.map(|b| (b.num, b.more)), Some((78, false)));
    let (got, tag) = p.download(2);
    assert_eq!(got, data);
    // a GET with no Block2 option starts at block 0 in 1024-byte blocks
    let r = p.request(Code::GET, &[], b"");
    assert_eq!(
        (
            r.code,
            r.block2.map(|b| (b.num, b.more, b.size())),
            r.payload.len()
        ),
        (Code::CONTENT, Some((0, true, 1024)), 1024)
    );
    // the ETag validates
    let r = p.request(
        Code::GET,
        &[(OptionNumber::ETAG, tag.clone().unwrap())],
        b"",
    );
    assert_eq!((r.code, r.etag), (Code::VALID, tag));
    let m = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(m.contains("mintgate_block1_completed_total 1\n"), "{m}");
    assert!(m.contains("mintgate_block1_continue_total 78\n"), "{m}");
}

#[test]
fn the_server_asks_for_its_block_size() {
    let mut c = config();
    // a 1024-byte block fits a datagram, but the server asks for 512-byte
    // ones (the largest power of two with 128 bytes of room for the head)
    c.coap.max_datagram = 1100;
    let gw = Gateway::start(c.clone(), resources::router_for(&c)).unwrap();
    let mut p = Peer::new(gw.local_addrs()[0]);
    let data = body(1024 + 512 + 10);
    let b0 = BlockOpt {
        num: 0,
        more: true,
        szx: 6,
    };
    let r = p.request(
        Code::PUT,
        &[(OptionNumber::BLOCK1, uint(b0.encode()))],
        &data[..1024],
    );
    assert_eq!(r.code, Code::CONTINUE);
    assert_eq!(r.block1.map(|b| (b.num, b.szx)), Some((0, 5)));
    // go on at byte 1024 = block 2 of 512
    for (num, more) in [(2u32, true), (3, false)] {
        let b = BlockOpt { num, more, szx: 5 };
        let end = ((num as usize + 1) * 512).min(data.len());
        let r = p.request(
            Code::PUT,
            &[(OptionNumber::BLOCK1, uint(b.encode()))],
            &data[num as usize * 512..end],
        );
        assert_eq!(r.code, if more { Code::CONTINUE } else { Code::CHANGED });
    }
    assert_eq!(p.download(5).0, data);
}

#[test]
fn limits_missing_blocks_and_retransmissions() {
    let mut c = config();
    c.coap.block1_max_body = 2000;
    let gw = Gateway::start(c.clone(), resources::router_for(&c)).unwrap();
    let addr = gw.local_addrs()[0];
    let mut p = Peer::new(addr);
    // announced too large: 4.13 with the limit in Size1
    let rs = p.upload(Code::PUT, &body(3000), 4);
    assert_eq!(
        (rs[0].code, rs[0].size1),
        (Code::REQUEST_ENTITY_TOO_LARGE, Some(2000))
    );
    // a missing block: the final one gets 4.08 and nothing is stored
    p.request(Code::PUT, &[], b"before");
    let data = body(64 * 4);
    for num in [0u32, 1, 3] {
        let b = BlockOpt {
            num,
            more: num < 3,
            szx: 2,
        };
        let r = p.request(
            Code::PUT,
            &[(OptionNumber::BLOCK1, uint(b.encode()))],
            &data[num as usize * 64..(num as usize + 1) * 64],
        );
        let want = if num < 3 {
            Code::CONTINUE
        } else {
            Code::REQUEST_ENTITY_INCOMPLETE
        };
        assert_eq!(r.code, want, "block {num}");
    }
    assert_eq!(p.request(Code::GET, &[], b"").payload, b"before");
    // a retransmitted block (same message ID) gets the same answer and
    // does not disturb the transfer
    let data = body(64 * 2 + 5);
    let b0 = BlockOpt {
        num: 0,
        more: true,
        szx: 2,
    };
    let dg = p.encode(
        Code::PUT,
        &[(OptionNumber::BLOCK1, uint(b0.encode()))],
        &data[..64],
    );
    let first = p.exchange(&dg);
    let again = p.exchange(&dg);
    assert_eq!((first.code, again.code), (Code::CONTINUE, Code::CONTINUE));
    for num in [1u32, 2] {
        let b = BlockOpt {
            num,
            more: num < 2,
            szx: 2,
        };
        p.request(
            Code::PUT,
            &[(OptionNumber::BLOCK1, uint(b.encode()))],
            &data[num as usize * 64..((num as usize + 1) * 64).min(data.len())],
        );
    }
    assert_eq!(p.request(Code::GET, &[], b"").payload, data);
    // another client's transfer to the same path is its own
    let mut q = Peer::new(addr);
    let r = q.request(
        Code::PUT,
        &[(
            OptionNumber::BLOCK1,
            uint(
                BlockOpt {
                    num: 1,
                    more: false,
                    szx: 2,
                }
                .encode(),
            ),
        )],
        b"tail",
    );
    assert_eq!(r.code, Code::REQUEST_ENTITY_INCOMPLETE);
    // every answer above is on /metrics, by cause, and the exchanges are
    // remembered for de-duplication
    let m = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    let value = |name: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
    };
    // the 3,000-byte upload: block 0 (Size1 over the limit) and the five
    // blocks past 2,000 bytes get 4.13, the six between them 4.08; then
    // the gap in the second upload, and the other client's lone tail
    assert_eq!(value("mintgate_block1_too_large_total"), 6);
    assert_eq!(value("mintgate_block1_incomplete_total"), 6 + 1 + 1);
    assert_eq!(value("mintgate_block1_busy_source_total"), 0);
    assert_eq!(value("mintgate_block1_evicted_heaviest_total"), 0);
    assert!(value("mintgate_dedup_entries") >= 10, "{m}");
    assert!(value("mintgate_dedup_bytes") > 0, "{m}");
    assert_eq!(value("mintgate_dedup_evicted_early_total"), 0);
}

#[test]
fn a_large_post_answer_comes_back_through_continuations() {
    let gw = Gateway::start(config(), resources::router_for(&config())).unwrap();
    let mut p = Peer::new(gw.local_addrs()[0]);
    let data = body(2500);
    let rs = p.upload(Code::POST, &data, 6);
    let last = rs.last().unwrap();
    assert_eq!(last.code, Code::CHANGED);
    let b2 = last.block2.expect("block-wise answer");
    assert_eq!((b2.num, b2.more, b2.size()), (0, true, 1024));
    let mut got = last.payload.clone();
    for num in 1..10u32 {
        let b = BlockOpt {
            num,
            more: false,
            szx: 6,
        };
        let r = p.request(Code::POST, &[(OptionNumber::BLOCK2, uint(b.encode()))], b"");
        assert_eq!(
            (r.code, r.etag.as_ref()),
            (Code::CHANGED, last.etag.as_ref())
        );
        got.extend_from_slice(&r.payload);
        if !r.block2.unwrap().more {
            break;
        }
    }
    assert_eq!(got, data);
}
