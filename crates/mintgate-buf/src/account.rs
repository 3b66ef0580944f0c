//! Per-layer accounting of bytes allocated and copied.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The layer on whose behalf bytes were allocated or copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    /// Network receive: blocks that datagrams are received into.
    Receive = 0,
    /// CoAP encoding and decoding (headers, options, tokens).
    Coap = 1,
    /// Application handlers producing payloads.
    Handler = 2,
    /// Transmission (scatter-gather header blocks, batching).
    Send = 3,
    /// Proxies (HTTP, HTTP/3).
    Proxy = 4,
    /// Anything else (caches, tests).
    Other = 5,
}

impl Layer {
    /// Every layer, in index order.
    pub const ALL: [Layer; 6] = [
        Layer::Receive,
        Layer::Coap,
        Layer::Handler,
        Layer::Send,
        Layer::Proxy,
        Layer::Other,
    ];

    /// A short lower-case name, used in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Receive => "receive",
            Layer::Coap => "coap",
            Layer::Handler => "handler",
            Layer::Send => "send",
            Layer::Proxy => "proxy",
            Layer::Other => "other",
        }
    }
}

#[derive(Default)]
struct LayerCounters {
    allocs: AtomicU64,
    alloc_bytes: AtomicU64,
    copies: AtomicU64,
    copy_bytes: AtomicU64,
}

/// Counters of allocations and copies, one set per [`Layer`].
///
/// Counters only grow; readers take [`Accounting::snapshot`]s and subtract.
#[derive(Default)]
pub struct Accounting {
    layers: [LayerCounters; 6],
}

/// A point-in-time copy of one layer's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerSnapshot {
    /// Number of blocks allocated.
    pub allocs: u64,
    /// Bytes of block capacity allocated.
    pub alloc_bytes: u64,
    /// Number of copy operations.
    pub copies: u64,
    /// Bytes copied.
    pub copy_bytes: u64,
}

impl LayerSnapshot {
    /// Counter-wise difference `self - earlier`.
    pub fn since(&self, earlier: &LayerSnapshot) -> LayerSnapshot {
        LayerSnapshot {
            allocs: self.allocs - earlier.allocs,
            alloc_bytes: self.alloc_bytes - earlier.alloc_bytes,
            copies: self.copies - earlier.copies,
            copy_bytes: self.copy_bytes - earlier.copy_bytes,
        }
    }
}

impl Accounting {
    /// Records an allocation of `bytes` of capacity by `layer`.
    #[inline]
    pub fn record_alloc(&self, layer: Layer, bytes: usize) {
        let c = &self.layers[layer as usize];
        c.allocs.fetch_add(1, Relaxed);
        c.alloc_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Records a copy of `bytes` by `layer`.
    #[inline]
    pub fn record_copy(&self, layer: Layer, bytes: usize) {
        let c = &self.layers[layer as usize];
        c.copies.fetch_add(1, Relaxed);
        c.copy_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// The counters of one layer.
    pub fn snapshot(&self, layer: Layer) -> LayerSnapshot {
        let c = &self.layers[layer as usize];
        LayerSnapshot {
            allocs: c.allocs.load(Relaxed),
            alloc_bytes: c.alloc_bytes.load(Relaxed),
            copies: c.copies.load(Relaxed),
            copy_bytes: c.copy_bytes.load(Relaxed),
        }
    }

    /// The sum over all layers.
    pub fn total(&self) -> LayerSnapshot {
        Layer::ALL
            .iter()
            .map(|l| self.snapshot(*l))
            .fold(LayerSnapshot::default(), |a, b| LayerSnapshot {
                allocs: a.allocs + b.allocs,
                alloc_bytes: a.alloc_bytes + b.alloc_bytes,
                copies: a.copies + b.copies,
                copy_bytes: a.copy_bytes + b.copy_bytes,
            })
    }
}
