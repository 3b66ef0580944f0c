//! Block-wise requests through the request layer: a body sent with Block1
//! reaches the handler whole, a large response to it is fetched with Block2
//! continuations, and errors come at the first block.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mintgate_buf::{PartitionConfig, Pool};

use super::block::{respond_block2, BlockOpt};
use super::*;
use crate::wire::{MessageWriter, Packet};

fn pool() -> Pool {
    Pool::new(&[
        PartitionConfig {
            block_size: 128,
            blocks: 64,
        },
        PartitionConfig {
            block_size: 1280,
            blocks: 16,
        },
    ])
}

/// `/store`: PUT keeps the body, GET returns it (64-byte blocks), POST
/// answers with it (2.04, 64-byte blocks); `/ro`: GET only.
fn router(stored: Arc<Mutex<Vec<u8>>>) -> Router {
    let (g, p) = (stored.clone(), stored);
    let mut r = Router::new();
    r.add(
        Resource::new("store")
            .get(move |req, rb| {
                let v = g.lock().unwrap();
                respond_block2(req, rb, &v, 64);
            })
            .put(move |req, rb| {
                *p.lock().unwrap() = req.payload().to_vec();
                rb.set_code(Code::CHANGED);
            })
            .post(|req, rb| {
                rb.set_code(Code::CHANGED);
                respond_block2(req, rb, req.payload(), 64);
            }),
    )
    .unwrap();
    r.add(Resource::new("ro").get(|_, rb| {
        rb.write(b"x");
    }))
    .unwrap();
    r
}

fn peer() -> SocketAddr {
    "127.0.0.1:5000".parse().unwrap()
}

struct Rig {
    router: Router,
    pool: Pool,
    blocks: Mutex<Block1Store>,
    stored: Arc<Mutex<Vec<u8>>>,
    now: Instant,
}

/// A response, parsed: code, Block1, Block2, ETag, Size1, payload.
#[derive(Debug)]
struct Resp {
    code: Code,
    block1: Option<BlockOpt>,
    block2: Option<BlockOpt>,
    etag: Option<Vec<u8>>,
    size1: Option<u32>,
    payload: Vec<u8>,
}

impl Rig {
    fn new(cfg: Block1Config) -> Rig {
        let stored = Arc::new(Mutex::new(Vec::new()));
        Rig {
            router: router(stored.clone()),
            pool: pool(),
            blocks: Mutex::new(Block1Store::new(cfg)),
            stored,
            now: Instant::now(),
        }
    }

    fn send(
        &self,
        code: Code,
        path: &str,
        opts: &[(OptionNumber, Vec<u8>)],
        payload: &[u8],
    ) -> Resp {
        let mut buf = vec![0u8; 1400];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, 1, b"tok").unwrap();
        let mut all: Vec<(OptionNumber, Vec<u8>)> = path
            .split('/')
            .map(|s| (OptionNumber::URI_PATH, s.as_bytes().to_vec()))
            .collect();
        all.extend_from_slice(opts);
        all.sort_by_key(|(n, _)| *n);
        for (n, v) in &all {
            w.option(*n, v).unwrap();
        }
        w.payload(payload).unwrap();
        let n = w.finish();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        let req = Request {
            peer: peer(),
            packet: &p,
            identity: None,
        };
        let h = process_request_blockwise(
            &self.router,
            &self.pool,
            &self.blocks,
            self.now,
            &req,
            64,
            DEFAULT_MAX_PAYLOAD,
        );
        let Handled::Respond(rb) = h else {
            panic!("silent")
        };
        let Answer::Send(o) = finish_response(&self.pool, rb, MessageType::Ack, 1, b"tok") else {
            panic!("not sent")
        };
        let bytes = o.to_vec();
        let r = Packet::new_checked(&bytes[..]).unwrap();
        let blk = |n| {
            r.option(n)
                .and_then(|o| o.uint())
                .and_then(BlockOpt::decode)
        };
        Resp {
            code: r.code(),
            block1: blk(OptionNumber::BLOCK1),
            block2: blk(OptionNumber::BLOCK2),
            etag: r.option(OptionNumber::ETAG).map(|o| o.value.to_vec()),
            size1: r.option(OptionNumber::SIZE1).and_then(|o| o.uint()),
            payload: r.payload().to_vec(),
        }
    }

    /// Sends `body` with Block1 in blocks of 2^(szx+4); returns the
    /// responses.
    fn upload(&self, code: Code, path: &str, body: &[u8], szx: u8) -> Vec<Resp> {
        let size = 16usize << szx;
        let n = body.len().div_ceil(size).max(1);
        (0..n)
            .map(|i| {
                let b = BlockOpt {
                    num: i as u32,
                    more: i + 1 < n,
                    szx,
                };
                let end = ((i + 1) * size).min(body.len());
                self.send(
                    code,
                    path,
                    &[(OptionNumber::BLOCK1, uint(b.encode()))],
                    &body[i * size..end],
                )
            })
            .collect()
    }
}

fn uint(v: u32) -> Vec<u8> {
    let mut b = [0u8; 4];
    crate::wire::encode_uint(v, &mut b).to_vec()
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

#[test]
fn a_put_in_blocks_reaches_the_handler_whole_and_comes_back_in_blocks() {
    let rig = Rig::new(Block1Config::default());
    let data = body(700);
    let rs = rig.upload(Code::PUT, "store", &data, 2);
    assert_eq!(rs.len(), 11);
    for (i, r) in rs[..10].iter().enumerate() {
        assert_eq!(r.code, Code::CONTINUE);
        assert_eq!(
            r.block1,
            Some(BlockOpt {
                num: i as u32,
                more: true,
                szx: 2
            })
        );
        assert!(r.payload.is_empty());
    }
    let last = &rs[10];
    assert_eq!(last.code, Code::CHANGED);
    assert_eq!(
        last.block1,
        Some(BlockOpt {
            num: 10,
            more: false,
            szx: 2
        })
    );
    assert_eq!(
        *rig.stored.lock().unwrap(),
        data,
        "the handler saw it whole, once"
    );

    // GET it back block by block (64-byte blocks), ETag the same throughout
    let mut got = Vec::new();
    let mut tag = None;
    for num in 0..20u32 {
        let opts = if num == 0 {
            vec![]
        } else {
            vec![(
                OptionNumber::BLOCK2,
                uint(
                    BlockOpt {
                        num,
                        more: false,
                        szx: 2,
                    }
                    .encode(),
                ),
            )]
        };
        let r = rig.send(Code::GET, "store", &opts, b"");
        assert_eq!(r.code, Code::CONTENT);
        assert!(tag.is_none() || tag == r.etag);
        tag = r.etag.clone();
        got.extend_from_slice(&r.payload);
        if !r.block2.expect("block-wise").more {
            break;
        }
    }
    assert_eq!(got, data);
    // and the ETag validates
    let r = rig.send(
        Code::GET,
        "store",
        &[(OptionNumber::ETAG, tag.clone().unwrap())],
        b"",
    );
    assert_eq!((r.code, r.etag, r.payload.len()), (Code::VALID, tag, 0));
    let r = rig.send(Code::GET, "store", &[(OptionNumber::ETAG, vec![0; 4])], b"");
    assert_eq!(
        r.code,
        Code::CONTENT,
        "a stale ETag gets the representation"
    );
}

#[test]
fn a_post_in_blocks_gets_its_large_answer_through_block2_continuations() {
    let rig = Rig::new(Block1Config::default());
    let data = body(300);
    let rs = rig.upload(Code::POST, "store", &data, 4);
    let last = rs.last().unwrap();
    assert_eq!(last.code, Code::CHANGED);
    assert_eq!(last.block1.map(|b| (b.num, b.more)), Some((1, false)));
    let b2 = last.block2.expect("the answer is block-wise");
    assert_eq!((b2.num, b2.more, b2.szx), (0, true, 2));
    let mut got = last.payload.clone();
    // RFC 7959 3.3: the same POST, no Block1, no payload, Block2 num > 0
    for num in 1..10u32 {
        let r = rig.send(
            Code::POST,
            "store",
            &[(
                OptionNumber::BLOCK2,
                uint(
                    BlockOpt {
                        num,
                        more: false,
                        szx: 2,
                    }
                    .encode(),
                ),
            )],
            b"",
        );
        assert_eq!(r.code, Code::CHANGED, "block {num}");
        assert_eq!(r.etag, last.etag, "the same representation");
        got.extend_from_slice(&r.payload);
        if !r.block2.unwrap().more {
            break;
        }
    }
    assert_eq!(got, data);
    assert_eq!(rig.blocks.lock().unwrap().stats().continuations, 4);
}

#[test]
fn errors_come_at_the_first_block_and_nothing_is_kept() {
    let rig = Rig::new(Block1Config {
        max_body: 100,
        ..Block1Config::default()
    });
    let first = |code: Code, path: &str, size1: Option<u32>| {
        let mut opts = vec![(
            OptionNumber::BLOCK1,
            uint(
                BlockOpt {
                    num: 0,
                    more: true,
                    szx: 2,
                }
                .encode(),
            ),
        )];
        if let Some(s) = size1 {
            opts.push((OptionNumber::SIZE1, uint(s)));
        }
        rig.send(code, path, &opts, &body(64))
    };
    assert_eq!(first(Code::PUT, "nowhere", None).code, Code::NOT_FOUND);
    assert_eq!(first(Code::PUT, "ro", None).code, Code::METHOD_NOT_ALLOWED);
    let r = first(Code::PUT, "store", Some(5000));
    assert_eq!(
        (r.code, r.size1),
        (Code::REQUEST_ENTITY_TOO_LARGE, Some(100))
    );
    assert!(rig.blocks.lock().unwrap().is_empty());
    // reserved size exponent
    let r = rig.send(
        Code::PUT,
        "store",
        &[(OptionNumber::BLOCK1, vec![0x07])],
        b"x",
    );
    assert_eq!(r.code, Code::BAD_REQUEST);
    // a later block with no transfer
    let r = rig.send(
        Code::PUT,
        "store",
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
    assert!(rig.stored.lock().unwrap().is_empty(), "no handler ran");
}

#[test]
fn block_request_reads_the_options_once() {
    let mk = |code: Code, opts: &[(OptionNumber, Vec<u8>)], payload: &[u8]| {
        let mut buf = vec![0u8; 256];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, 1, b"").unwrap();
        for (n, v) in opts {
            w.option(*n, v).unwrap();
        }
        w.payload(payload).unwrap();
        let n = w.finish();
        buf.truncate(n);
        buf
    };
    let kind = |d: &[u8]| block_request(&Packet::new_checked(d).unwrap());
    let b2 = |num: u32| {
        (
            OptionNumber::BLOCK2,
            uint(
                BlockOpt {
                    num,
                    more: false,
                    szx: 2,
                }
                .encode(),
            ),
        )
    };
    let b1 = (OptionNumber::BLOCK1, uint(0x0e));
    assert_eq!(kind(&mk(Code::GET, &[], b"")), BlockRequest::None);
    assert_eq!(
        kind(&mk(Code::GET, &[b2(3)], b"")),
        BlockRequest::None,
        "GET: plain Block2"
    );
    assert_eq!(kind(&mk(Code::POST, &[b2(0)], b"")), BlockRequest::None);
    assert_eq!(
        kind(&mk(Code::POST, &[b2(1)], b"")),
        BlockRequest::Continuation
    );
    assert_eq!(kind(&mk(Code::POST, &[b2(1)], b"p")), BlockRequest::None);
    assert_eq!(
        kind(&mk(Code::PUT, std::slice::from_ref(&b1), b"p")),
        BlockRequest::Block1(BlockOpt {
            num: 0,
            more: true,
            szx: 6
        })
    );
    assert_eq!(
        kind(&mk(Code::PUT, &[b2(1), b1], b"p")),
        BlockRequest::Block1(BlockOpt {
            num: 0,
            more: true,
            szx: 6
        })
    );
    assert_eq!(
        kind(&mk(Code::PUT, &[(OptionNumber::BLOCK1, vec![0x0f])], b"p")),
        BlockRequest::BadBlock1
    );
    assert_eq!(
        kind(&mk(
            Code::PUT,
            &[(OptionNumber::BLOCK1, vec![1, 2, 3, 4])],
            b"p"
        )),
        BlockRequest::None,
        "too long: 4.02 downstream"
    );
}
