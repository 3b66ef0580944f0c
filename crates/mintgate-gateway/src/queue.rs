//! The HTP queue: requests waiting for a handler thread, bounded in bytes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_buf::BlockMut;
use mintgate_sched::PipelineCounters;
use parking_lot::{Condvar, Mutex};

/// One request waiting: the datagram's block and where it came from.
pub struct Job {
    /// The sender.
    pub peer: SocketAddr,
    /// The datagram (already classified as a request).
    pub block: BlockMut,
    /// Index of the listener it arrived on.
    pub listener: usize,
    /// When the Network Receiver read it.
    pub received: Instant,
}

impl Job {
    /// What the job costs against the queue bound: the whole block.
    fn cost(&self) -> usize {
        self.block.capacity()
    }
}

struct State {
    jobs: VecDeque<Job>,
    bytes: usize,
}

/// A FIFO of [`Job`]s holding at most `max_bytes` of blocks.
///
/// Producers push whole batches under one lock; consumers take up to a batch
/// at a time. Gauges `queue_len`/`queue_bytes` are kept in the counters.
pub struct HtpQueue {
    state: Mutex<State>,
    ready: Condvar,
    max_bytes: usize,
    counters: Arc<PipelineCounters>,
    /// Jobs queued, readable without the lock (for spinning consumers).
    len_hint: AtomicUsize,
    spin: Duration,
}

impl HtpQueue {
    /// An empty queue bounded at `max_bytes`.
    pub fn new(max_bytes: usize, counters: Arc<PipelineCounters>) -> HtpQueue {
        HtpQueue {
            state: Mutex::new(State {
                jobs: VecDeque::with_capacity(1024),
                bytes: 0,
            }),
            ready: Condvar::new(),
            max_bytes,
            counters,
            len_hint: AtomicUsize::new(0),
            spin: Duration::ZERO,
        }
    }

    /// Lets an idle consumer poll for up to `spin` before it sleeps: a
    /// sleep and wake-up costs both sides a context switch, which at high
    /// rates costs more than a short poll.
    pub fn with_spin(mut self, spin: Duration) -> HtpQueue {
        self.spin = spin;
        self
    }

    /// The bound in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Moves every job of `batch` that fits onto the queue (counting them as
    /// accepted requests, the paper's R); jobs that do not fit are moved to
    /// `rejected` in order.
    pub fn push_batch(&self, batch: &mut Vec<Job>, rejected: &mut Vec<Job>) {
        if batch.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        let mut pushed = 0;
        for job in batch.drain(..) {
            let c = job.cost();
            if st.bytes + c > self.max_bytes {
                rejected.push(job);
            } else {
                st.bytes += c;
                st.jobs.push_back(job);
                pushed += 1;
            }
        }
        // R is counted before any handler can see the jobs, so H never leads R
        self.counters.nr_requests.fetch_add(pushed as u64, Relaxed);
        self.len_hint.store(st.jobs.len(), Relaxed);
        self.counters.queue_len.store(st.jobs.len() as u64, Relaxed);
        self.counters.queue_bytes.store(st.bytes as u64, Relaxed);
        drop(st);
        // Wake one consumer; it wakes the next if it leaves work behind
        // (see pop_batch). Waking all for every batch costs a context switch
        // per idle thread that then finds nothing.
        if pushed > 0 {
            self.ready.notify_one();
        }
    }

    /// Takes up to `max` jobs into `out`, waiting up to `wait` for the first.
    /// With `share` consumers it takes at most a fair share of what is
    /// queued, so that one thread does not drain the queue while others idle.
    pub fn pop_batch(&self, out: &mut Vec<Job>, max: usize, share: usize, wait: Duration) {
        if !self.spin.is_zero() && self.len_hint.load(Relaxed) == 0 {
            let until = Instant::now() + self.spin;
            while self.len_hint.load(Relaxed) == 0 && Instant::now() < until {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            }
        }
        let mut st = self.state.lock();
        if st.jobs.is_empty() {
            self.ready.wait_for(&mut st, wait);
        }
        let fair = st.jobs.len().div_ceil(share.max(1));
        let n = st.jobs.len().min(max).min(fair.max(1));
        let state = &mut *st;
        for job in state.jobs.drain(..n) {
            state.bytes -= job.cost();
            out.push(job);
        }
        let left = state.jobs.len();
        self.len_hint.store(left, Relaxed);
        self.counters.queue_len.store(left as u64, Relaxed);
        self.counters.queue_bytes.store(state.bytes as u64, Relaxed);
        drop(st);
        if left > 0 && !out.is_empty() {
            self.ready.notify_one();
        }
    }

    /// Wakes every waiting consumer (after a resize or at shutdown).
    pub fn wake_all(&self) {
        let _st = self.state.lock();
        self.ready.notify_all();
    }

    /// True when the queue looked empty at the last push or pop (no lock).
    pub fn is_empty_hint(&self) -> bool {
        self.len_hint.load(Relaxed) == 0
    }

    /// Jobs queued now.
    pub fn len(&self) -> usize {
        self.state.lock().jobs.len()
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mintgate_buf::{Layer, PartitionConfig, Pool};

    #[test]
    fn bound_in_bytes_rejects_in_order_and_fair_share() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 100,
            blocks: 10,
        }]);
        let c = Arc::new(PipelineCounters::default());
        let q = HtpQueue::new(350, c.clone());
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut batch: Vec<Job> = (0..5)
            .map(|i| Job {
                peer,
                block: pool.alloc(Layer::Receive, 1, 0).unwrap(),
                listener: i,
                received: Instant::now(),
            })
            .collect();
        let mut rej = Vec::new();
        q.push_batch(&mut batch, &mut rej);
        assert_eq!(q.len(), 3);
        assert_eq!(
            rej.iter().map(|j| j.listener).collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(c.queue_bytes.load(Relaxed), 300);
        let mut out = Vec::new();
        q.pop_batch(&mut out, 32, 2, Duration::from_millis(1));
        assert_eq!(out.len(), 2, "half of 3, rounded up");
        out.clear();
        q.pop_batch(&mut out, 32, 2, Duration::from_millis(1));
        assert_eq!(out.len(), 1);
        assert_eq!(c.queue_len.load(Relaxed), 0);
        out.clear();
        let t = Instant::now();
        q.pop_batch(&mut out, 32, 1, Duration::from_millis(30));
        assert!(out.is_empty() && t.elapsed() >= Duration::from_millis(25));
    }
}
