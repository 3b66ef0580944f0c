//! The pool under contention: many threads against an exhausted pool,
//! unique blocks written whole and checked before they go back, shared
//! blocks read on other threads, and the counters watched all along. Also
//! run under AddressSanitizer by scripts/test.sh.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mintgate_buf::{Block, BlockMut, Layer, PartitionConfig, Pool};

const THREADS: usize = 16;
const ROUNDS: usize = 10_000;

fn shape() -> Vec<PartitionConfig> {
    vec![
        PartitionConfig {
            block_size: 64,
            blocks: 24,
        },
        PartitionConfig {
            block_size: 128,
            blocks: 8,
        },
    ]
}

/// Fills the whole block past its headroom with `v`.
fn fill(b: &mut BlockMut, v: u8) {
    let n = b.tailroom();
    b.spare_mut().fill(v);
    b.commit(n);
}

/// Every byte is `v`: the block was nobody else's while we held it.
fn intact(bytes: &[u8], v: u8) -> bool {
    !bytes.is_empty() && bytes.iter().all(|&x| x == v)
}

struct Xorshift(u64);
impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn exhausted_pool_under_many_threads_keeps_blocks_apart_and_counts_right() {
    let pool = Pool::new(&shape());
    let total: u64 = pool.stats().iter().map(|s| s.blocks as u64).sum();
    // frozen blocks handed from thread to thread (bounded: at most 4 wait)
    let mailbox: Arc<Mutex<Vec<(Block, u8)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let shared_reads = Arc::new(AtomicU64::new(0));

    // watches the counters while the workers run
    let watcher = {
        let (pool, done) = (pool.clone(), done.clone());
        std::thread::spawn(move || {
            let mut looks = 0u64;
            while !done.load(Ordering::Relaxed) && looks < 5_000_000 {
                for s in pool.stats() {
                    assert!(s.free <= s.blocks, "free count out of range: {s:?}");
                }
                assert!(pool.outstanding() <= total);
                looks += 1;
            }
            looks
        })
    };

    // every thread first holds more than its share, all at once (a
    // barrier), so that each partition runs dry even when the scheduler
    // would otherwise run the threads one after another
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, mailbox) = (pool.clone(), mailbox.clone());
            let (refused, shared_reads) = (refused.clone(), shared_reads.clone());
            let start = start.clone();
            std::thread::spawn(move || {
                let mut grab = Vec::new();
                for size in [8, 8, 8, 100, 100] {
                    match pool.alloc(Layer::Other, size, 4) {
                        Ok(b) => grab.push(b),
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                start.wait();
                drop(grab);
                let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                let mut held: Vec<(BlockMut, u8)> = Vec::new();
                let mut frozen: Vec<(Block, u8)> = Vec::new();
                for i in 0..ROUNDS {
                    let v = (t * 31 + i) as u8;
                    match pool.alloc(Layer::Other, 8 + (rng.next() % 100) as usize, 4) {
                        Ok(mut b) => {
                            fill(&mut b, v);
                            match rng.next() % 4 {
                                0 => {
                                    // share it: one view kept, one posted
                                    let f = b.freeze();
                                    let mut m = mailbox.lock().unwrap();
                                    if m.len() < 4 {
                                        m.push((f.slice(1..f.len()), v));
                                    }
                                    drop(m);
                                    frozen.push((f, v));
                                }
                                1 => held.push((b, v)),
                                _ => assert!(intact(b.as_slice(), v)),
                            }
                        }
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // take a block another thread shared, check it, drop it
                    let got = mailbox.lock().unwrap().pop();
                    if let Some((b, v)) = got {
                        assert!(intact(&b, v), "a shared block changed under its reader");
                        shared_reads.fetch_add(1, Ordering::Relaxed);
                    }
                    // keep at most one of each (and the mailbox four), so
                    // that the pool runs dry and refills over and over
                    if held.len() > 1 {
                        let (b, v) = held.remove((rng.next() % 2) as usize);
                        assert!(
                            intact(b.as_slice(), v),
                            "a held block was written by another"
                        );
                    }
                    if frozen.len() > 1 {
                        let (b, v) = frozen.remove(0);
                        assert!(intact(&b, v), "a frozen block was written by another");
                    }
                }
                for (b, v) in &held {
                    assert!(intact(b.as_slice(), v.to_owned()));
                }
                for (b, v) in &frozen {
                    assert!(intact(b, *v));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    mailbox.lock().unwrap().clear();
    done.store(true, Ordering::Relaxed);
    let looks = watcher.join().unwrap();

    assert_eq!(pool.outstanding(), 0, "every block came back");
    for s in pool.stats() {
        assert_eq!(s.free, s.blocks, "{s:?}");
        assert_eq!(s.min_free, 0, "the pool ran dry: {s:?}");
        assert!(s.exhausted > 0, "{s:?}");
    }
    let refused = refused.load(Ordering::Relaxed);
    assert!(refused > 0, "the pool was exhausted at times");
    assert!(shared_reads.load(Ordering::Relaxed) > 0);
    assert!(looks > 0);
    eprintln!(
        "{THREADS} threads x {ROUNDS} rounds: {refused} allocations refused, {} shared blocks read elsewhere, {looks} looks at the counters",
        shared_reads.load(Ordering::Relaxed)
    );
}

#[test]
fn one_block_pool_handed_back_and_forth() {
    // the tightest case: every allocation but one fails, every free is
    // taken at once by a thread spinning on the pool
    let pool = Pool::new(&[PartitionConfig {
        block_size: 32,
        blocks: 1,
    }]);
    let workers: Vec<_> = (0..8u8)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut got = 0u32;
                let mut tries = 0u32;
                while got < 500 && tries < 50_000_000 {
                    tries += 1;
                    if let Ok(mut b) = pool.alloc(Layer::Other, 1, 0) {
                        fill(&mut b, t);
                        let s = pool.stats()[0];
                        assert!(s.free <= 1, "{s:?}");
                        assert!(intact(b.as_slice(), t));
                        got += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
                got
            })
        })
        .collect();
    let got: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(got, 8 * 500, "every thread got its turns");
    let s = pool.stats()[0];
    assert_eq!((s.free, s.min_free), (1, 0));
}

#[test]
fn bad_shapes_are_refused_with_a_reason() {
    let one = |block_size, blocks| PartitionConfig { block_size, blocks };
    let e = |p: &[PartitionConfig]| Pool::check(p).unwrap_err().to_string();
    assert!(e(&[]).contains("at least one"));
    let many = vec![one(64, 1); mintgate_buf::MAX_PARTITIONS + 1];
    assert!(e(&many).contains("at most 256"), "{}", e(&many));
    assert!(Pool::check(&many[..mintgate_buf::MAX_PARTITIONS]).is_ok());
    assert!(e(&[one(0, 4)]).contains("block_size must be positive"));
    assert!(e(&[one(64, u32::MAX)]).contains("blocks"));
    assert!(e(&[one(usize::MAX / 2, 4)]).contains("block_size"));
    assert!(e(&[one(u32::MAX as usize, u32::MAX - 1)]).contains("address space"));
    // 256 partitions alias nothing: every block of every partition distinct
    let p = Pool::new(&many[..mintgate_buf::MAX_PARTITIONS]);
    let blocks: Vec<_> = (0..mintgate_buf::MAX_PARTITIONS)
        .map(|i| {
            let mut b = p.alloc(Layer::Other, 1, 0).unwrap();
            fill(&mut b, i as u8);
            b
        })
        .collect();
    assert!(p.alloc(Layer::Other, 1, 0).is_err());
    for (i, b) in blocks.iter().enumerate() {
        assert!(intact(b.as_slice(), i as u8));
    }
}
