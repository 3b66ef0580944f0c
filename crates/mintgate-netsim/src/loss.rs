//! Loss models.

use rand::rngs::ChaCha12Rng;
use rand::{RngExt, SeedableRng};

/// Decides, datagram by datagram, which are lost.
///
/// With `burst <= 1` losses are independent with probability `rate`. With a
/// mean burst length `burst > 1` it is a two-state Gilbert-Elliott chain: in
/// the bad state every datagram is lost, in the good state none; the bad
/// state is left with probability `1 / burst` (so bursts last `burst` on
/// average) and entered with the probability that makes the long-run loss
/// rate equal `rate`.
#[derive(Debug)]
pub struct LossModel {
    rate: f64,
    p_enter_bad: f64,
    p_leave_bad: f64,
    bursty: bool,
    bad: bool,
    rng: ChaCha12Rng,
}

impl LossModel {
    /// A model losing `rate` (0..=1) of the datagrams in bursts of mean
    /// length `burst`, from `seed`.
    pub fn new(rate: f64, burst: f64, seed: u64) -> LossModel {
        let rate = rate.clamp(0.0, 1.0);
        let bursty = burst > 1.0 && rate > 0.0 && rate < 1.0;
        let p_leave_bad = if bursty { 1.0 / burst } else { 1.0 };
        // stationary P(bad) = p_enter / (p_enter + p_leave) = rate
        let p_enter_bad = if bursty {
            (rate * p_leave_bad / (1.0 - rate)).min(1.0)
        } else {
            rate
        };
        LossModel {
            rate,
            p_enter_bad,
            p_leave_bad,
            bursty,
            bad: false,
            rng: ChaCha12Rng::seed_from_u64(seed),
        }
    }

    /// The long-run loss rate.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether the next datagram is lost.
    pub fn lose(&mut self) -> bool {
        if !self.bursty {
            return self.rate > 0.0 && self.rng.random::<f64>() < self.rate;
        }
        let p = if self.bad {
            1.0 - self.p_leave_bad
        } else {
            self.p_enter_bad
        };
        self.bad = self.rng.random::<f64>() < p;
        self.bad
    }

    /// A uniform draw in `[-1, 1]` from the same seeded stream (for jitter).
    pub fn symmetric(&mut self) -> f64 {
        self.rng.random_range(-1.0..=1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(m: &mut LossModel, n: usize) -> (f64, f64) {
        let (mut lost, mut bursts, mut prev) = (0usize, 0usize, false);
        for _ in 0..n {
            let l = m.lose();
            if l {
                lost += 1;
                if !prev {
                    bursts += 1;
                }
            }
            prev = l;
        }
        (
            lost as f64 / n as f64,
            if bursts > 0 {
                lost as f64 / bursts as f64
            } else {
                0.0
            },
        )
    }

    #[test]
    fn independent_loss_matches_the_rate() {
        let (rate, _) = run(&mut LossModel::new(0.10, 1.0, 7), 200_000);
        assert!((rate - 0.10).abs() < 0.005, "{rate}");
        assert_eq!(run(&mut LossModel::new(0.0, 1.0, 7), 1000).0, 0.0);
        assert_eq!(run(&mut LossModel::new(1.0, 1.0, 7), 1000).0, 1.0);
    }

    #[test]
    fn bursty_loss_keeps_the_rate_and_the_mean_burst_length() {
        let (rate, burst) = run(&mut LossModel::new(0.15, 4.0, 9), 400_000);
        assert!((rate - 0.15).abs() < 0.01, "{rate}");
        assert!((burst - 4.0).abs() < 0.3, "{burst}");
    }

    #[test]
    fn same_seed_same_losses() {
        let a: Vec<bool> = {
            let mut m = LossModel::new(0.3, 3.0, 42);
            (0..500).map(|_| m.lose()).collect()
        };
        let b: Vec<bool> = {
            let mut m = LossModel::new(0.3, 3.0, 42);
            (0..500).map(|_| m.lose()).collect()
        };
        assert_eq!(a, b);
    }
}
