//! A log-linear latency histogram in nanoseconds, written by one thread
//! and read by any: 8 buckets per power of two (12.5 % resolution), values
//! below 8 ns exact.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// The histogram.
///
/// Invariant: only one thread calls [`Histogram::record`] (the direct
/// path's worker), so plain loads and stores keep every counter exact
/// without read-modify-write instructions; readers may see a record half
/// applied (count updated, bucket not yet), never a torn counter.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = (v >> (e - SUB_BITS)) as usize & (SUB - 1);
    (e - SUB_BITS + 1) as usize * SUB + sub
}

/// The smallest value that falls in bucket `i`.
fn lower(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let e = (i / SUB) as u32 + SUB_BITS - 1;
    ((SUB + i % SUB) as u64) << (e - SUB_BITS)
}

impl Histogram {
    /// Records one value (single writer; see the type's invariant).
    #[inline]
    pub fn record(&self, ns: u64) {
        let b = &self.buckets[index(ns)];
        b.store(b.load(Relaxed) + 1, Relaxed);
        self.sum
            .store(self.sum.load(Relaxed).wrapping_add(ns), Relaxed);
        if ns > self.max.load(Relaxed) {
            self.max.store(ns, Relaxed);
        }
        self.count.store(self.count.load(Relaxed) + 1, Relaxed);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Largest value recorded.
    pub fn max(&self) -> u64 {
        self.max.load(Relaxed)
    }

    /// Mean value (0 when empty).
    pub fn mean(&self) -> f64 {
        let c = self.count();
        if c == 0 {
            0.0
        } else {
            self.sum.load(Relaxed) as f64 / c as f64
        }
    }

    /// Sum of the values recorded, in nanoseconds.
    pub fn sum(&self) -> u64 {
        self.sum.load(Relaxed)
    }

    /// Counts for a Prometheus histogram with upper bounds `bounds`
    /// (nanoseconds, increasing): entry `k` counts the values above
    /// `bounds[k - 1]` and at most `bounds[k]`. A bucket of this histogram
    /// is counted under the first bound its largest value does not exceed,
    /// so a bound that falls inside a bucket (12.5 % wide) undercounts by
    /// that bucket; values above the last bound are left to `+Inf`
    /// (`count()` minus the sum of the entries).
    pub fn counts_at(&self, bounds: &[u64]) -> Vec<u64> {
        let mut out = vec![0u64; bounds.len()];
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Relaxed);
            if n == 0 {
                continue;
            }
            let top = if i + 1 < BUCKETS {
                lower(i + 1) - 1
            } else {
                u64::MAX
            };
            if let Some(k) = bounds.iter().position(|&bound| top <= bound) {
                out[k] += n;
            }
        }
        out
    }

    /// The `q` quantile (0..=1): the middle of the bucket holding it, so
    /// within 6.25 % of the true value (0 when empty).
    pub fn quantile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = lower(i);
                let hi = if i + 1 < BUCKETS {
                    lower(i + 1)
                } else {
                    u64::MAX
                };
                return lo + (hi - lo) / 2;
            }
        }
        self.max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_at_bounds_put_each_value_under_its_bound() {
        let h = Histogram::default();
        for v in [3, 7, 100, 1_000, 1_000_000, u64::MAX / 2] {
            h.record(v);
        }
        // 7 and below are exact; 100 lies in [96, 104), 1000 in [960, 1024)
        let c = h.counts_at(&[7, 100, 2_000, 10_000_000]);
        assert_eq!(c, vec![2, 0, 2, 1], "100 has 103 in its bucket, above 100");
        assert_eq!(
            h.count() - c.iter().sum::<u64>(),
            1,
            "one above every bound"
        );
        assert_eq!(h.counts_at(&[103]), vec![3]);
    }

    #[test]
    fn buckets_tile_the_range() {
        for i in 0..BUCKETS - 1 {
            assert!(lower(i) < lower(i + 1), "{i}");
            assert_eq!(index(lower(i)), i, "{i}");
            assert_eq!(index(lower(i + 1) - 1), i, "{i}");
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    proptest! {
        #[test]
        fn quantiles_are_within_the_bucket_resolution(mut v in proptest::collection::vec(1u64..10_000_000, 1..300), q in 0.01f64..1.0) {
            let h = Histogram::default();
            for x in &v {
                h.record(*x);
            }
            v.sort_unstable();
            let rank = ((q * v.len() as f64).ceil() as usize).max(1);
            let exact = v[rank - 1] as f64;
            let got = h.quantile(q) as f64;
            prop_assert!((got - exact).abs() <= exact * 0.0625 + 1.0, "q {} exact {} got {}", q, exact, got);
            prop_assert_eq!(h.count(), v.len() as u64);
            prop_assert_eq!(h.max(), *v.last().unwrap());
        }
    }
}
