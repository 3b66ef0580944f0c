//! A log-linear latency histogram with bounded relative error.
//!
//! Values (nanoseconds) below `2^SUB_BITS` get one bucket each; above, every
//! power of two is split into `2^SUB_BITS` equal sub-buckets, so a value is
//! reported with a relative error below `2^-SUB_BITS` (< 0.8 %). The bucket
//! array is allocated once; [`Histogram::record`] never allocates.

/// Sub-bucket bits: 128 sub-buckets per power of two.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets needed to cover every `u64`.
const BUCKETS: usize = ((64 - SUB_BITS + 1) as usize) << SUB_BITS;

/// Counts of values by bucket, plus exact count, sum and maximum.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    count: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

/// The bucket holding `v`.
fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // position of the top bit, >= SUB_BITS
    let mantissa = v >> (e - SUB_BITS); // in [SUB, 2 * SUB)
    (((e - SUB_BITS + 1) as u64) * SUB + (mantissa - SUB)) as usize
}

/// The largest value that falls into bucket `b`.
fn highest_in(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let k = b / SUB; // >= 1
    let m = b % SUB;
    let shift = (k - 1) as u32;
    let low = (SUB + m) << shift;
    low + ((1u64 << shift) - 1)
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            sum: 0,
            max: 0,
        }
    }

    /// Adds one value.
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.count += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The largest value recorded (exact), 0 when empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The mean (exact), 0 when empty.
    pub fn mean(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            (self.sum / self.count as u128) as u64
        }
    }

    /// The value at quantile `q` (0..=1): the highest value of the bucket
    /// holding the `ceil(q * count)`-th smallest value, capped at the exact
    /// maximum; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return highest_in(b).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_u64() {
        for v in 0..10_000u64 {
            let b = index(v);
            assert!(highest_in(b) >= v);
            if b > 0 {
                assert!(highest_in(b - 1) < v, "v={v}");
            }
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
        assert_eq!(highest_in(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn relative_error_is_bounded() {
        let mut v = 1u64;
        while v < u64::MAX / 3 {
            let hi = highest_in(index(v));
            assert!(hi >= v);
            assert!((hi - v) as f64 <= v as f64 / SUB as f64, "v={v} hi={hi}");
            v = v * 3 + 1;
        }
    }

    #[test]
    fn percentiles_of_uniform_values() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 1000); // 1 us .. 100 ms
        }
        let close = |got: u64, want: u64| {
            let err = (got as f64 - want as f64).abs() / want as f64;
            assert!(err < 0.01, "got {got}, want {want}");
        };
        close(h.quantile(0.5), 50_000_000);
        close(h.quantile(0.9), 90_000_000);
        close(h.quantile(0.99), 99_000_000);
        close(h.quantile(0.999), 99_900_000);
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(h.max(), 100_000_000);
        assert_eq!(h.count(), 100_000);
        assert_eq!(h.mean(), 50_000_500);
        assert!(h.quantile(0.5) <= h.quantile(0.99));
    }

    #[test]
    fn empty_and_single_and_merge() {
        let mut a = Histogram::new();
        assert_eq!(a.quantile(0.99), 0);
        assert_eq!(a.mean(), 0);
        a.record(42);
        assert_eq!(a.quantile(0.0), 42);
        assert_eq!(a.quantile(0.99), 42);
        let mut b = Histogram::new();
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.max(), 1_000_000);
        assert_eq!(a.quantile(0.5), 42);
        assert_eq!(a.quantile(0.51), 1_000_000);
    }
}
