//! Partitions of fixed-size blocks and their O(1) free lists.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use crate::account::{Accounting, Layer};
use crate::block::BlockMut;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The most partitions a pool may have. Allocation scans the partitions in
/// order, so a long list only slows every allocation down; a config asking
/// for more is refused ([`Pool::check`]).
pub const MAX_PARTITIONS: usize = 256;

/// Shape of one partition: `blocks` blocks of `block_size` bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionConfig {
    /// Bytes per block (headroom included).
    pub block_size: usize,
    /// Number of blocks; the partition never holds more.
    pub blocks: u32,
}

/// No block of the requested size is free. The request must be shed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exhausted {
    /// The size that was asked for.
    pub requested: usize,
}

impl fmt::Display for Exhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "buffer pool exhausted (no free block of {} bytes)",
            self.requested
        )
    }
}

impl std::error::Error for Exhausted {}

/// A pool shape that cannot be built: what [`Pool::check`] refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfigError(String);

impl fmt::Display for PoolConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PoolConfigError {}

/// Counters of one partition, as seen at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionStats {
    /// Bytes per block.
    pub block_size: usize,
    /// Blocks in the partition.
    pub blocks: u32,
    /// Blocks free now.
    pub free: u32,
    /// The fewest blocks that were ever free at once.
    pub min_free: u32,
    /// Allocation requests this partition could not serve.
    pub exhausted: u64,
}

const EMPTY: u32 = u32::MAX;

/// One slab with its free list: a Treiber stack of block indices whose head
/// carries a generation tag against ABA. LIFO order keeps the hottest blocks
/// in use, so the resident set grows only as far as the load needs.
pub(crate) struct Partition {
    pub(crate) block_size: usize,
    blocks: u32,
    /// The slab, `block_size * blocks` bytes from `Box::into_raw` (freed in
    /// `Drop`). Kept as a raw pointer so that a pointer to any block is
    /// derived from the whole allocation, never from a reference to one
    /// byte of it, and no `&`/`&mut` to the slab ever exists while blocks
    /// are written through `BlockMut`.
    mem: NonNull<u8>,
    mem_len: usize,
    /// `tag << 32 | index` of the top free block (`EMPTY` index when none).
    head: AtomicU64,
    next: Box<[AtomicU32]>,
    pub(crate) refs: Box<[AtomicU32]>,
    /// Blocks on the free list, counted so that it never underflows: a push
    /// adds before it publishes the block, a pop subtracts after it took
    /// one, so every subtraction follows its block's addition.
    free: AtomicU32,
    min_free: AtomicU32,
    exhausted: AtomicU64,
    /// Under loom, one cell per block that every access to the block's
    /// bytes goes through, so that the model checker sees a write racing
    /// with an access from another thread (a block handed out twice, or
    /// reused before the last reader let go).
    #[cfg(loom)]
    pub(crate) track: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: the slab is only reached through `BlockMut` (unique: the index is
// off the free list while it lives) or `Block` (shared, read-only); the free
// list itself is atomics only. The slab pointer is owned like a `Box<[u8]>`.
unsafe impl Sync for Partition {}
unsafe impl Send for Partition {}

impl Drop for Partition {
    fn drop(&mut self) {
        let slab = std::ptr::slice_from_raw_parts_mut(self.mem.as_ptr(), self.mem_len);
        // SAFETY: `mem`/`mem_len` came from `Box::into_raw` of a `Box<[u8]>`
        // of that length, and no block outlives its partition (every block
        // holds the pool).
        drop(unsafe { Box::from_raw(slab) });
    }
}

impl Partition {
    /// A partition of `cfg`'s shape, which [`check_one`] accepted.
    fn new(cfg: PartitionConfig) -> Partition {
        let n = cfg.blocks as usize;
        let mem_len = cfg.block_size * n;
        // zeroed memory comes from calloc: pages are touched only when used
        let slab: *mut [u8] = Box::into_raw(vec![0u8; mem_len].into_boxed_slice());
        // SAFETY: Box::into_raw never returns null
        let mem = unsafe { NonNull::new_unchecked(slab.cast::<u8>()) };
        let next: Box<[AtomicU32]> = (0..cfg.blocks)
            .map(|i| AtomicU32::new(if i + 1 < cfg.blocks { i + 1 } else { EMPTY }))
            .collect();
        let refs = (0..n).map(|_| AtomicU32::new(0)).collect();
        let head = if n == 0 { EMPTY } else { 0 };
        Partition {
            block_size: cfg.block_size,
            blocks: cfg.blocks,
            mem,
            mem_len,
            head: AtomicU64::new(head as u64),
            next,
            refs,
            free: AtomicU32::new(cfg.blocks),
            min_free: AtomicU32::new(cfg.blocks),
            exhausted: AtomicU64::new(0),
            #[cfg(loom)]
            track: (0..n).map(|_| loom::cell::UnsafeCell::new(())).collect(),
        }
    }

    fn pop(&self) -> Option<u32> {
        let mut cur = self.head.load(Ordering::Acquire);
        loop {
            let idx = cur as u32;
            if idx == EMPTY {
                return None;
            }
            let next = self.next[idx as usize].load(Ordering::Relaxed);
            let tag = (cur >> 32).wrapping_add(1);
            let new = (tag << 32) | next as u64;
            match self
                .head
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // the push that published `idx` counted it before, so
                    // this never goes below zero
                    let before = self.free.fetch_sub(1, Ordering::Relaxed);
                    debug_assert!(before > 0, "free count underflow");
                    self.min_free
                        .fetch_min(before.saturating_sub(1), Ordering::Relaxed);
                    return Some(idx);
                }
                Err(actual) => cur = actual,
            }
        }
    }

    pub(crate) fn push(&self, idx: u32) {
        // counted before it is published: a pop that takes `idx` at once
        // then finds the count it subtracts from
        self.free.fetch_add(1, Ordering::Relaxed);
        let mut cur = self.head.load(Ordering::Acquire);
        loop {
            self.next[idx as usize].store(cur as u32, Ordering::Relaxed);
            let tag = (cur >> 32).wrapping_add(1);
            let new = (tag << 32) | idx as u64;
            match self
                .head
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Raw pointer to the first byte of block `idx`, valid for
    /// `block_size` bytes of reads and writes (derived from the whole slab).
    ///
    /// # Panics
    /// If `idx` is not a block of this partition (never, for the indices
    /// `BlockMut` and `Block` hold, which came off the free list).
    #[inline]
    pub(crate) fn block_ptr(&self, idx: u32) -> *mut u8 {
        assert!(idx < self.blocks, "block index out of range");
        // SAFETY: idx < blocks, so the offset is within the slab of
        // block_size * blocks bytes (which check_one kept below isize::MAX).
        unsafe { self.mem.as_ptr().add(idx as usize * self.block_size) }
    }

    fn stats(&self) -> PartitionStats {
        PartitionStats {
            block_size: self.block_size,
            blocks: self.blocks,
            free: self.free.load(Ordering::Relaxed),
            min_free: self.min_free.load(Ordering::Relaxed),
            exhausted: self.exhausted.load(Ordering::Relaxed),
        }
    }
}

/// One partition's part of [`Pool::check`].
fn check_one(c: &PartitionConfig) -> Result<(), PoolConfigError> {
    let bad = |why: &str| {
        Err(PoolConfigError(format!(
            "partition of {} blocks of {} bytes: {why}",
            c.blocks, c.block_size
        )))
    };
    if c.block_size == 0 {
        return bad("block_size must be positive");
    }
    // a shared view keeps its offset and length as u32
    if c.block_size > u32::MAX as usize {
        return bad("block_size must be at most 4294967295");
    }
    if c.blocks == EMPTY {
        return bad("blocks must be below 4294967295");
    }
    match c.block_size.checked_mul(c.blocks as usize) {
        Some(n) if n <= isize::MAX as usize => Ok(()),
        _ => bad("block_size * blocks does not fit the address space"),
    }
}

/// Gives blocks back to the pool on demand; returns how many it released.
type Reclaimer = Box<dyn Fn() -> usize + Send + Sync>;

pub(crate) struct PoolInner {
    pub(crate) parts: Box<[Partition]>,
    pub(crate) account: Accounting,
    reclaim: OnceLock<Reclaimer>,
}

thread_local! {
    /// Set while this thread runs the reclaimer, so that an allocation made
    /// from inside it fails instead of recursing.
    static RECLAIMING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A set of fixed-block partitions. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("partitions", &self.stats())
            .finish()
    }
}

impl Pool {
    /// Builds a pool. Partitions are sorted by block size; memory is reserved
    /// now but pages are only touched as blocks are used.
    ///
    /// # Panics
    /// If [`Pool::check`] refuses `parts`.
    pub fn new(parts: &[PartitionConfig]) -> Pool {
        if let Err(e) = Pool::check(parts) {
            panic!("{e}");
        }
        let mut cfgs = parts.to_vec();
        cfgs.sort_by_key(|c| c.block_size);
        Pool {
            inner: Arc::new(PoolInner {
                parts: cfgs.into_iter().map(Partition::new).collect(),
                account: Accounting::default(),
                reclaim: OnceLock::new(),
            }),
        }
    }

    /// Whether a pool of these partitions can be built: at least one and at
    /// most [`MAX_PARTITIONS`], each with a positive block size of at most
    /// `u32::MAX` bytes, fewer than `u32::MAX` blocks, and a slab
    /// (`block_size * blocks`) that fits the address space.
    pub fn check(parts: &[PartitionConfig]) -> Result<(), PoolConfigError> {
        if parts.is_empty() {
            return Err(PoolConfigError(
                "a pool needs at least one partition".into(),
            ));
        }
        if parts.len() > MAX_PARTITIONS {
            return Err(PoolConfigError(format!(
                "{} partitions; at most {MAX_PARTITIONS} are allowed",
                parts.len()
            )));
        }
        parts.iter().try_for_each(check_one)
    }

    /// Allocates the smallest free block of at least `min_size` bytes, with
    /// `headroom` bytes reserved in front of the (empty) data region.
    ///
    /// A full partition falls through to the next larger one; only when no
    /// partition that fits has a free block is [`Exhausted`] returned.
    pub fn alloc(
        &self,
        layer: Layer,
        min_size: usize,
        headroom: usize,
    ) -> Result<BlockMut, Exhausted> {
        let b = self.take(min_size, headroom)?;
        self.inner.account.record_alloc(layer, b.capacity());
        Ok(b)
    }

    /// Like [`Pool::alloc`], but the allocation is not counted yet: for
    /// buffers handed to the kernel before anyone knows whether a datagram
    /// will land in them (a batched receive posts more blocks than usually
    /// arrive). The caller counts each block that ends up carrying data with
    /// [`BlockMut::count_alloc`]; blocks returned unused were never part of a
    /// message and stay uncounted. The pool's free counts and
    /// [`Pool::outstanding`] see these blocks like any other.
    pub fn alloc_uncounted(&self, min_size: usize, headroom: usize) -> Result<BlockMut, Exhausted> {
        self.take(min_size, headroom)
    }

    /// Installs what the pool calls when no block fits a request: an owner
    /// of cached blocks (e.g. a de-duplication cache) releases some, and the
    /// allocation is tried once more. It runs on the allocating thread, so it
    /// must never wait for a lock an allocating thread may hold (use
    /// `try_lock`). Only the first call has an effect.
    pub fn set_reclaimer(&self, f: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.inner.reclaim.set(Box::new(f));
    }

    fn take(&self, min_size: usize, headroom: usize) -> Result<BlockMut, Exhausted> {
        match self.try_take(min_size, headroom) {
            Err(e) => match self.inner.reclaim.get() {
                Some(f) if !RECLAIMING.with(|r| r.replace(true)) => {
                    let freed = f();
                    RECLAIMING.with(|r| r.set(false));
                    if freed > 0 {
                        self.try_take(min_size, headroom)
                    } else {
                        Err(e)
                    }
                }
                _ => Err(e),
            },
            ok => ok,
        }
    }

    fn try_take(&self, min_size: usize, headroom: usize) -> Result<BlockMut, Exhausted> {
        let need = min_size.max(headroom);
        for (p, part) in self.inner.parts.iter().enumerate() {
            if part.block_size < need {
                continue;
            }
            if let Some(idx) = part.pop() {
                part.refs[idx as usize].store(1, Ordering::Relaxed);
                return Ok(BlockMut::new(self.clone(), p as u32, idx, headroom));
            }
            part.exhausted.fetch_add(1, Ordering::Relaxed);
        }
        Err(Exhausted { requested: need })
    }

    /// The largest block size any partition offers.
    pub fn max_block_size(&self) -> usize {
        self.inner.parts.last().map(|p| p.block_size).unwrap_or(0)
    }

    /// The alloc/copy counters.
    pub fn accounting(&self) -> &Accounting {
        &self.inner.account
    }

    /// Counts a copy of `bytes` on behalf of `layer` made outside a block
    /// method (e.g. into a socket buffer the pool does not own).
    pub fn record_copy(&self, layer: Layer, bytes: usize) {
        self.inner.account.record_copy(layer, bytes);
    }

    /// Per-partition counters.
    pub fn stats(&self) -> Vec<PartitionStats> {
        self.inner.parts.iter().map(Partition::stats).collect()
    }

    /// Blocks currently allocated (not free), over all partitions.
    pub fn outstanding(&self) -> u64 {
        self.stats()
            .iter()
            .map(|s| (s.blocks - s.free) as u64)
            .sum()
    }
}
