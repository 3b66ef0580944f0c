//! A loom model of the pool's free list and of shared blocks' reference
//! counts. Built and run only with `RUSTFLAGS="--cfg loom"` (scripts/test.sh
//! does so, in release, with the preemption bound below unless
//! LOOM_MAX_PREEMPTIONS says otherwise):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p mintgate-buf --release --test loom
//! ```
//!
//! Under loom every access to a block's bytes goes through a loom cell of
//! that block, so the checker fails a model in which a block is written
//! while another thread may still read or write it (handed out twice,
//! reused before its last reader let go); the counters are checked in every
//! interleaving explored.
#![cfg(loom)]

use loom::thread;
use mintgate_buf::{Layer, PartitionConfig, Pool};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

fn pool(blocks: u32) -> Pool {
    Pool::new(&[PartitionConfig {
        block_size: 16,
        blocks,
    }])
}

/// Allocates, spinning (with loom's yield) while the pool is exhausted.
fn alloc_spin(p: &Pool) -> mintgate_buf::BlockMut {
    loop {
        if let Ok(b) = p.alloc(Layer::Other, 1, 0) {
            return b;
        }
        thread::yield_now();
    }
}

/// After the threads: the free list holds every block exactly once (a
/// corrupted list hands a block out twice, or loses one).
fn drain_distinct(p: &Pool) {
    let blocks: u32 = p.stats().iter().map(|s| s.blocks).sum();
    let all: Vec<_> = (0..blocks)
        .map(|_| p.alloc(Layer::Other, 1, 0).expect("every block is free"))
        .collect();
    assert!(
        p.alloc(Layer::Other, 1, 0).is_err(),
        "a block handed out twice"
    );
    let mut at: Vec<_> = all.iter().map(|b| b.as_slice().as_ptr() as usize).collect();
    at.sort_unstable();
    at.dedup();
    assert_eq!(at.len(), all.len(), "a block handed out twice");
}

fn free_in_range(p: &Pool) {
    for s in p.stats() {
        assert!(s.free <= s.blocks, "free count out of range: {s:?}");
        assert!(s.min_free <= s.blocks, "{s:?}");
    }
}

/// A pop that takes the block a concurrent push is publishing, on an
/// exhausted pool: the free count never underflows.
#[test]
fn loom_pop_overtaking_push_on_an_exhausted_pool() {
    model(|| {
        let p = pool(1);
        let held = p.alloc(Layer::Other, 1, 0).unwrap();
        assert!(p.alloc(Layer::Other, 1, 0).is_err());
        let freer = thread::spawn(move || drop(held));
        let p2 = p.clone();
        let taker = thread::spawn(move || {
            let mut b = alloc_spin(&p2);
            free_in_range(&p2);
            b.spare_mut()[0] = 7;
            b.commit(1);
        });
        freer.join().unwrap();
        taker.join().unwrap();
        free_in_range(&p);
        assert_eq!(p.outstanding(), 0);
        assert_eq!(p.stats()[0].free, 1);
        drain_distinct(&p);
    });
}

/// One thread takes a block and gives it back while another takes both
/// blocks of a two-block pool and frees them (the pattern that defeats an
/// untagged Treiber stack: the head popped and pushed back between the
/// first thread's read of it and its exchange): no block ever has two
/// owners, and the counts add up in every interleaving.
#[test]
fn loom_free_list_hands_each_block_to_one_owner() {
    model(|| {
        let p = pool(2);
        let p1 = p.clone();
        let one = thread::spawn(move || {
            if let Ok(mut b) = p1.alloc(Layer::Other, 1, 0) {
                b.spare_mut()[0] = 1;
                b.commit(1);
                free_in_range(&p1);
                assert_eq!(b.as_slice(), &[1]);
            }
        });
        let p2 = p.clone();
        let two = thread::spawn(move || {
            let a = p2.alloc(Layer::Other, 1, 0);
            let b = p2.alloc(Layer::Other, 1, 0);
            for (mut x, v) in [(a, 2u8), (b, 3u8)]
                .into_iter()
                .filter_map(|(r, v)| r.ok().map(|x| (x, v)))
            {
                x.spare_mut()[0] = v;
                x.commit(1);
                assert_eq!(x.as_slice(), &[v]);
            }
            free_in_range(&p2);
        });
        one.join().unwrap();
        two.join().unwrap();
        assert_eq!(p.outstanding(), 0);
        assert_eq!(p.stats()[0].free, 2);
        drain_distinct(&p);
    });
}

/// A frozen block shared by two threads goes back to the free list only
/// after both let go, and the next owner's writes come after their reads.
#[test]
fn loom_shared_block_returns_after_its_last_reader() {
    model(|| {
        let p = pool(1);
        let mut b = p.alloc(Layer::Other, 1, 0).unwrap();
        b.spare_mut()[..2].copy_from_slice(&[1, 2]);
        b.commit(2);
        let shared = b.freeze();
        let other = shared.clone();
        let reader = thread::spawn(move || {
            assert_eq!(&*other, &[1, 2]);
            drop(other);
        });
        let p2 = p.clone();
        let next_owner = thread::spawn(move || {
            let mut b = alloc_spin(&p2);
            b.spare_mut()[0] = 5;
            b.commit(1);
            free_in_range(&p2);
        });
        assert_eq!(&shared[1..], &[2]);
        drop(shared);
        reader.join().unwrap();
        next_owner.join().unwrap();
        assert_eq!(p.outstanding(), 0);
        assert_eq!(p.stats()[0].free, 1);
        drain_distinct(&p);
    });
}
