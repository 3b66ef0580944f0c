//! Owned-writable and shared-readable views of one pool block.

use crate::account::Layer;
use crate::pool::{Partition, Pool};
use crate::sync::Ordering;
use std::fmt;
use std::ops::{Deref, Range};

/// Beyond this many references to one block, cloning a [`Block`] aborts
/// (as `Arc` does): a count that wrapped would free a block still in use.
const MAX_REFS: u32 = u32::MAX / 2;

/// A uniquely owned, writable pool block.
///
/// Layout: `[ headroom | data (len) | spare ]`. The data region starts at
/// `head`; [`BlockMut::prepend`] grows it backwards into the headroom,
/// [`BlockMut::append`]/[`BlockMut::spare_mut`] grow it forwards.
///
/// Invariant: `head + len <= block_size`; the block is off its free list for
/// as long as this value (or any [`Block`] frozen from it) lives.
pub struct BlockMut {
    pool: Pool,
    part: u32,
    idx: u32,
    head: usize,
    len: usize,
}

impl BlockMut {
    pub(crate) fn new(pool: Pool, part: u32, idx: u32, head: usize) -> BlockMut {
        BlockMut {
            pool,
            part,
            idx,
            head,
            len: 0,
        }
    }

    #[inline]
    fn partition(&self) -> &Partition {
        &self.pool.inner.parts[self.part as usize]
    }

    #[inline]
    fn whole_mut(&mut self) -> &mut [u8] {
        let part = self.partition();
        #[cfg(loom)]
        part.track[self.idx as usize].with_mut(|_| ());
        let size = part.block_size;
        let ptr = part.block_ptr(self.idx);
        // SAFETY: this value uniquely owns block `idx` (see the invariant).
        unsafe { std::slice::from_raw_parts_mut(ptr, size) }
    }

    #[inline]
    fn whole(&self) -> &[u8] {
        let part = self.partition();
        #[cfg(loom)]
        part.track[self.idx as usize].with(|_| ());
        // SAFETY: as in `whole_mut`, and `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(part.block_ptr(self.idx), part.block_size) }
    }

    /// Total bytes of the block.
    pub fn capacity(&self) -> usize {
        self.partition().block_size
    }

    /// Bytes free in front of the data.
    pub fn headroom(&self) -> usize {
        self.head
    }

    /// Bytes free behind the data.
    pub fn tailroom(&self) -> usize {
        self.capacity() - self.head - self.len
    }

    /// Length of the data region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the data region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The data region.
    pub fn as_slice(&self) -> &[u8] {
        let (h, l) = (self.head, self.len);
        &self.whole()[h..h + l]
    }

    /// The data region, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (h, l) = (self.head, self.len);
        &mut self.whole_mut()[h..h + l]
    }

    /// The writable bytes behind the data; commit what was written with
    /// [`BlockMut::commit`]. Writing here is producing, not copying.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let start = self.head + self.len;
        &mut self.whole_mut()[start..]
    }

    /// Extends the data region over `n` bytes already written into
    /// [`BlockMut::spare_mut`].
    ///
    /// # Panics
    /// If `n` exceeds the tailroom.
    pub fn commit(&mut self, n: usize) {
        assert!(n <= self.tailroom(), "commit past the end of the block");
        self.len += n;
    }

    /// Shortens the data region to `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Sets the data region to `range` of the whole block (used after a
    /// receive wrote `n` bytes at the block start).
    ///
    /// # Panics
    /// If the range is outside the block.
    pub fn set_data(&mut self, range: Range<usize>) {
        assert!(range.start <= range.end && range.end <= self.capacity());
        self.head = range.start;
        self.len = range.end - range.start;
    }

    /// The whole block, headroom included, for a receive call to fill.
    pub fn whole_block_mut(&mut self) -> &mut [u8] {
        self.whole_mut()
    }

    /// Copies `src` behind the data, counting the copy against `layer`.
    /// Returns false (and copies nothing) when it does not fit.
    pub fn append(&mut self, layer: Layer, src: &[u8]) -> bool {
        if src.len() > self.tailroom() {
            return false;
        }
        self.spare_mut()[..src.len()].copy_from_slice(src);
        self.len += src.len();
        self.pool.inner.account.record_copy(layer, src.len());
        true
    }

    /// Grows the data region `n` bytes into the headroom and returns those
    /// bytes for the caller's header. `None` when the headroom is short.
    pub fn prepend(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.head {
            return None;
        }
        self.head -= n;
        self.len += n;
        let h = self.head;
        Some(&mut self.whole_mut()[h..h + n])
    }

    /// The pool this block came from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Counts this block's allocation (its whole capacity) against `layer`.
    /// Only for blocks from [`Pool::alloc_uncounted`], once, when they turn
    /// out to carry data; [`Pool::alloc`] has counted its blocks already.
    pub fn count_alloc(&self, layer: Layer) {
        self.pool.inner.account.record_alloc(layer, self.capacity());
    }

    /// Makes the block shared and read-only.
    pub fn freeze(self) -> Block {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped; its pool handle moves into the Block.
        let pool = unsafe { std::ptr::read(&me.pool) };
        Block {
            pool,
            part: me.part,
            idx: me.idx,
            head: me.head as u32,
            len: me.len as u32,
        }
    }
}

impl Drop for BlockMut {
    fn drop(&mut self) {
        release(&self.pool, self.part, self.idx);
    }
}

impl fmt::Debug for BlockMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockMut")
            .field("capacity", &self.capacity())
            .field("head", &self.head)
            .field("len", &self.len)
            .finish()
    }
}

fn release(pool: &Pool, part: u32, idx: u32) {
    let p = &pool.inner.parts[part as usize];
    if p.refs[idx as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
        p.push(idx);
    }
}

/// A shared, immutable view of (part of) a pool block. Cloning bumps a
/// refcount kept in the partition; the block returns to its free list when the
/// last clone drops.
pub struct Block {
    pool: Pool,
    part: u32,
    idx: u32,
    head: u32,
    len: u32,
}

impl Block {
    /// A sub-view `range` of this view, sharing the block.
    ///
    /// # Panics
    /// If the range is outside this view.
    pub fn slice(&self, range: Range<usize>) -> Block {
        assert!(range.start <= range.end && range.end <= self.len as usize);
        let mut b = self.clone();
        b.head = self.head + range.start as u32;
        b.len = (range.end - range.start) as u32;
        b
    }

    /// The pool this block came from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let p = &self.pool.inner.parts[self.part as usize];
        #[cfg(loom)]
        p.track[self.idx as usize].with(|_| ());
        // SAFETY: shared views never write; the block is off the free list
        // while any view exists.
        unsafe {
            std::slice::from_raw_parts(
                p.block_ptr(self.idx).add(self.head as usize),
                self.len as usize,
            )
        }
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Clone for Block {
    fn clone(&self) -> Block {
        // Relaxed, as `Arc` does: the clone is made from a live reference,
        // so the block cannot be freed meanwhile.
        let before = self.pool.inner.parts[self.part as usize].refs[self.idx as usize]
            .fetch_add(1, Ordering::Relaxed);
        if before > MAX_REFS {
            std::process::abort();
        }
        Block {
            pool: self.pool.clone(),
            part: self.part,
            idx: self.idx,
            head: self.head,
            len: self.len,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        release(&self.pool, self.part, self.idx);
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block").field("len", &self.len).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pool::PartitionConfig;

    fn pool() -> Pool {
        Pool::new(&[
            PartitionConfig {
                block_size: 64,
                blocks: 4,
            },
            PartitionConfig {
                block_size: 256,
                blocks: 2,
            },
        ])
    }

    #[test]
    fn smallest_fitting_partition_then_fallthrough_then_exhausted() {
        let p = pool();
        let small: Vec<_> = (0..4)
            .map(|_| p.alloc(Layer::Other, 10, 0).unwrap())
            .collect();
        assert!(small.iter().all(|b| b.capacity() == 64));
        let spill = p.alloc(Layer::Other, 10, 0).unwrap();
        assert_eq!(spill.capacity(), 256);
        let _spill2 = p.alloc(Layer::Other, 10, 0).unwrap();
        let err = p.alloc(Layer::Other, 10, 0).unwrap_err();
        assert_eq!(err.requested, 10);
        assert!(p.alloc(Layer::Other, 1000, 0).is_err());
        assert_eq!(p.outstanding(), 6);
        drop(small);
        drop(spill);
        assert_eq!(p.outstanding(), 1);
        let st = p.stats();
        assert_eq!(st[0].min_free, 0);
        assert!(st[0].exhausted >= 1);
    }

    #[test]
    fn prepend_keeps_payload_in_place_and_counts_only_copies() {
        let p = pool();
        let mut b = p.alloc(Layer::Handler, 64, 16).unwrap();
        b.spare_mut()[..5].copy_from_slice(b"hello");
        b.commit(5);
        let payload_addr = b.as_slice().as_ptr();
        b.prepend(4).unwrap().copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(b.as_slice(), &[1, 2, 3, 4, b'h', b'e', b'l', b'l', b'o']);
        assert_eq!(unsafe { payload_addr.sub(4) }, b.as_slice().as_ptr());
        assert!(b.prepend(13).is_none());
        assert!(b.append(Layer::Handler, b"!!"));
        let acc = p.accounting().snapshot(Layer::Handler);
        assert_eq!(acc.alloc_bytes, 64);
        assert_eq!(acc.copy_bytes, 2);
    }

    #[test]
    fn reclaimer_frees_cached_blocks_on_exhaustion_once() {
        use std::sync::{Arc, Mutex};
        let p = pool();
        // A cache holding every 256-byte block, and a reclaimer that empties it.
        let cache: Arc<Mutex<Vec<Block>>> = Arc::default();
        for _ in 0..2 {
            cache
                .lock()
                .unwrap()
                .push(p.alloc(Layer::Coap, 200, 0).unwrap().freeze());
        }
        assert!(p.alloc(Layer::Coap, 200, 0).is_err(), "no reclaimer yet");
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // the pool only weakly, as a real owner does: a strong handle in
        // its own reclaimer would keep it alive for ever (a leak that
        // AddressSanitizer reports)
        let (c2, k2, p2) = (cache.clone(), calls.clone(), Arc::downgrade(&p.inner));
        p.set_reclaimer(move || {
            k2.fetch_add(1, Ordering::Relaxed);
            // an allocation from inside the reclaimer fails, never recurses
            let p2 = Pool {
                inner: p2.upgrade().unwrap(),
            };
            assert!(p2.alloc(Layer::Coap, 200, 0).is_err());
            let mut c = c2.lock().unwrap();
            let n = c.len().min(1);
            let keep = c.len() - n;
            c.truncate(keep);
            n
        });
        let got = p.alloc(Layer::Coap, 200, 0).expect("one block reclaimed");
        assert_eq!(
            (calls.load(Ordering::Relaxed), cache.lock().unwrap().len()),
            (1, 1)
        );
        let _second = p
            .alloc(Layer::Coap, 200, 0)
            .expect("the last one reclaimed");
        assert!(
            p.alloc(Layer::Coap, 200, 0).is_err(),
            "nothing left to reclaim"
        );
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        drop(got);
    }

    #[test]
    fn uncounted_blocks_count_only_when_told() {
        let p = pool();
        let spare = p.alloc_uncounted(10, 0).unwrap();
        let used = p.alloc_uncounted(100, 0).unwrap();
        assert_eq!(p.outstanding(), 2, "uncounted blocks are still outstanding");
        assert_eq!(p.accounting().total().allocs, 0);
        used.count_alloc(Layer::Receive);
        drop(spare);
        let r = p.accounting().snapshot(Layer::Receive);
        assert_eq!((r.allocs, r.alloc_bytes), (1, 256));
        drop(used);
        assert_eq!(p.outstanding(), 0);
        assert!(p.alloc_uncounted(1000, 0).is_err());
    }

    #[test]
    fn frozen_block_returns_after_last_clone() {
        let p = pool();
        let mut b = p.alloc(Layer::Other, 64, 0).unwrap();
        assert!(b.append(Layer::Other, b"abcdef"));
        let f = b.freeze();
        let g = f.slice(2..4);
        assert_eq!(&*g, b"cd");
        drop(f);
        assert_eq!(p.outstanding(), 1);
        drop(g);
        assert_eq!(p.outstanding(), 0);
    }

    #[test]
    fn concurrent_alloc_free_keeps_count() {
        let p = Pool::new(&[PartitionConfig {
            block_size: 32,
            blocks: 8,
        }]);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Ok(mut b) = p.alloc(Layer::Other, 8, 0) {
                            b.spare_mut()[0] = 1;
                            b.commit(1);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(p.outstanding(), 0);
        assert_eq!(p.stats()[0].free, 8);
    }
}
