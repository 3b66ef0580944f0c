//! A counting global allocator, for measuring heap use where buffers are not
//! the pool's (the HTTP proxy runs on hyper and tokio, which allocate from
//! the heap).
//!
//! A binary opts in with
//! `#[global_allocator] static A: mintgate_buf::heap::CountingAlloc = mintgate_buf::heap::CountingAlloc;`.
//! Counting is off until [`start`]; while off, an allocation costs one
//! relaxed atomic load more than the system allocator's. While on, every
//! allocation of every thread of the process adds its size to one total
//! (a `realloc` counts as an allocation of the new size, which is what a
//! growing buffer costs), so a measurement must keep other threads quiet.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The system allocator, counting while [`start`]ed.
pub struct CountingAlloc;

static ON: AtomicBool = AtomicBool::new(false);
static BYTES: AtomicU64 = AtomicU64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

#[inline]
fn count(size: usize) {
    if ON.load(Relaxed) {
        BYTES.fetch_add(size as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; counting touches
// only atomics and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

/// Heap allocations counted between [`start`] and [`stop`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCount {
    /// Bytes allocated.
    pub bytes: u64,
    /// Allocation calls.
    pub allocs: u64,
}

/// Zeroes the totals and starts counting.
pub fn start() {
    BYTES.store(0, Relaxed);
    ALLOCS.store(0, Relaxed);
    ON.store(true, Relaxed);
}

/// Stops counting and returns what was counted since [`start`].
pub fn stop() -> HeapCount {
    ON.store(false, Relaxed);
    HeapCount {
        bytes: BYTES.load(Relaxed),
        allocs: ALLOCS.load(Relaxed),
    }
}

/// Whether this process's global allocator is [`CountingAlloc`] (checked by
/// counting one allocation of a known size). Stops any count under way.
pub fn installed() -> bool {
    start();
    let b = std::hint::black_box(vec![0u8; 4096]);
    drop(b);
    stop().bytes >= 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static A: CountingAlloc = CountingAlloc;

    #[test]
    fn counts_only_between_start_and_stop() {
        assert!(installed());
        let before = std::hint::black_box(vec![1u8; 1000]);
        start();
        let v = std::hint::black_box(vec![2u8; 3000]);
        let mut w: Vec<u8> = Vec::with_capacity(10);
        w.extend_from_slice(&[3u8; 100]); // grows: counted at its new size
        let c = stop();
        let after = std::hint::black_box(vec![4u8; 5000]);
        assert!(c.bytes >= 3000 + 10 + 100, "{c:?}");
        assert!(c.allocs >= 3, "{c:?}");
        // off: nothing more is counted, by this thread or any other
        assert_eq!(stop(), c);
        drop((before, v, w, after));
    }
}
