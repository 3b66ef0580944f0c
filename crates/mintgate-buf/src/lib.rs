//! Pooled fixed-block buffers (paper 003, "TCP/IP Using Minimal Resources
//! in IoT Systems", Lee and Shin, JKSCI 2020).
//!
//! A [`Pool`] owns a few *partitions*; each partition is one slab of `blocks`
//! blocks of `block_size` bytes with its own free list and free count (the
//! paper's memory control block). Allocation and free are O(1) and never touch
//! the global allocator: exhaustion is an [`Exhausted`] error, never a panic
//! and never growth.
//!
//! A freshly allocated [`BlockMut`] is uniquely owned and writable. It keeps a
//! *headroom* in front of its data so that an encapsulating layer can
//! [`BlockMut::prepend`] its header without moving the payload: a message is
//! written once and never copied again. [`BlockMut::freeze`] turns it into a
//! [`Block`], an immutable, reference-counted view that can be queued, cached
//! and sent at once without copying (the refcount lives in the partition, so
//! cloning a `Block` does not allocate either).
//!
//! Every allocation and every copy made through this crate is counted per
//! [`Layer`] in the pool's [`Accounting`], so the "n + c bytes allocated, n
//! bytes copied" standard can be read off at run time.

mod account;
mod block;
pub mod heap;
mod pool;

pub use account::{Accounting, Layer, LayerSnapshot};
pub use block::{Block, BlockMut};
pub use pool::{Exhausted, PartitionConfig, PartitionStats, Pool, PoolConfigError, MAX_PARTITIONS};

/// The free lists' and reference counts' atomics: loom's under `--cfg loom`
/// (the model in `tests/loom.rs`), the standard library's otherwise.
mod sync {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
    pub(crate) use std::sync::atomic::Ordering;
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};
}
