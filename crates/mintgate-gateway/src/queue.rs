//! The HTP queue: requests waiting for a handler thread, bounded in bytes
//! in all and per source (so that one flooding client cannot take the whole
//! queue and starve the others).
//!
//! With a per-source limit the queue is two FIFOs. A request from a source
//! that has nothing queued goes to the first, `jobs`; a source's further
//! requests go to the second, `bulk`, served only when `jobs` is empty. So
//! `jobs` holds at most one request per source, and a source's requests
//! are still taken in the order they came (its request in `jobs`, when it
//! has one, is its oldest). When the queue is full, a request from a
//! source with nothing queued pushes out the newest request in `bulk`: a
//! flood from thousands of sources, each indistinguishable from a real
//! client, leaves every source about one request in `jobs` and a quiet
//! client's request is answered within the time `jobs` takes to drain.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
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
    /// The sender's DTLS identity (coaps listeners only).
    pub identity: Option<Arc<str>>,
}

impl Job {
    /// What the job costs against the queue bound: the whole block.
    fn cost(&self) -> usize {
        self.block.capacity()
    }
}

/// Why [`HtpQueue::push_batch`] refused a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// The queue holds `max_bytes` already.
    QueueFull,
    /// The job's source holds its share of the queue already.
    PeerLimit,
}

/// The source a per-peer share is kept for: the IPv4 address, or the /64
/// prefix of an IPv6 address (one host usually owns a whole /64, so
/// counting single IPv6 addresses would let it take any share it likes).
/// IPv4-mapped IPv6 addresses count as their IPv4 address.
pub fn peer_key(peer: &SocketAddr) -> IpAddr {
    match peer.ip().to_canonical() {
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

struct State {
    /// Requests of sources that had nothing queued: served first (all
    /// requests, without a per-source limit).
    jobs: VecDeque<Job>,
    /// Further requests of sources that had something queued already:
    /// served when `jobs` is empty, so that a flood queued ahead does not
    /// delay everyone else's requests (with per-source limits only).
    bulk: VecDeque<Job>,
    bytes: usize,
    /// Bytes queued per source; a source with nothing queued has no entry,
    /// so the table never holds more entries than the queue holds jobs.
    peers: HashMap<IpAddr, usize>,
}

impl State {
    /// Gives back what `job` held of the bound (and, with per-source
    /// tracking, of its source's share) as it leaves the queue.
    fn release(&mut self, job: &Job, per_source: bool) {
        let c = job.cost();
        self.bytes -= c;
        if per_source {
            let key = peer_key(&job.peer);
            if let Some(held) = self.peers.get_mut(&key) {
                *held = held.saturating_sub(c);
                if *held == 0 {
                    self.peers.remove(&key);
                }
            }
        }
    }
}

/// A FIFO of [`Job`]s holding at most `max_bytes` of blocks.
///
/// Producers push whole batches under one lock; consumers take up to a batch
/// at a time. Gauges `queue_len`/`queue_bytes` are kept in the counters.
pub struct HtpQueue {
    state: Mutex<State>,
    ready: Condvar,
    max_bytes: usize,
    /// Bytes one source may hold (`max_bytes` when unlimited).
    peer_max_bytes: usize,
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
                bulk: VecDeque::new(),
                bytes: 0,
                peers: HashMap::new(),
            }),
            ready: Condvar::new(),
            max_bytes,
            peer_max_bytes: max_bytes,
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

    /// Lets one source (see [`peer_key`]) hold at most `share` (0 < share
    /// <= 1) of the bound; 1 puts no per-source limit. With a limit, a
    /// source's requests beyond its oldest queued one wait behind the
    /// requests of sources with nothing else queued (see the module docs).
    pub fn with_peer_share(mut self, share: f64) -> HtpQueue {
        let share = if share.is_finite() {
            share.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.peer_max_bytes = ((self.max_bytes as f64 * share) as usize).max(1);
        self
    }

    /// The bound in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The bound per source in bytes.
    pub fn peer_max_bytes(&self) -> usize {
        self.peer_max_bytes
    }

    /// Sources with requests queued now.
    pub fn peers(&self) -> usize {
        self.state.lock().peers.len()
    }

    /// Moves every job of `batch` that fits onto the queue (counting them as
    /// accepted requests, the paper's R); jobs that do not fit, in all or in
    /// their source's share, are moved to `rejected` in order, with why.
    /// With a per-source limit, a job whose source has nothing queued makes
    /// room on a full queue by pushing out the newest jobs of `bulk`, which
    /// go to `rejected` as [`Shed::QueueFull`] (their acceptance stays
    /// counted in R; the caller answers and counts them as shed).
    pub fn push_batch(&self, batch: &mut Vec<Job>, rejected: &mut Vec<(Job, Shed)>) {
        if batch.is_empty() {
            return;
        }
        let limited = self.peer_max_bytes < self.max_bytes;
        let mut st = self.state.lock();
        let mut pushed = 0;
        for job in batch.drain(..) {
            let c = job.cost();
            let key = peer_key(&job.peer);
            let held = if limited {
                st.peers.get(&key).copied().unwrap_or(0)
            } else {
                0
            };
            if st.bytes + c > self.max_bytes && limited && held == 0 {
                // a source with nothing queued: room from the newest of the
                // bulk, if there is any
                while st.bytes + c > self.max_bytes {
                    let Some(old) = st.bulk.pop_back() else {
                        break;
                    };
                    st.release(&old, true);
                    rejected.push((old, Shed::QueueFull));
                }
            }
            if st.bytes + c > self.max_bytes {
                rejected.push((job, Shed::QueueFull));
                continue;
            }
            let mut heavy = false;
            if limited {
                if held + c > self.peer_max_bytes {
                    rejected.push((job, Shed::PeerLimit));
                    continue;
                }
                st.peers.insert(key, held + c);
                heavy = held > 0;
            }
            st.bytes += c;
            if heavy {
                st.bulk.push_back(job);
            } else {
                st.jobs.push_back(job);
            }
            pushed += 1;
        }
        let queued = st.jobs.len() + st.bulk.len();
        // R is counted before any handler can see the jobs, so H never leads
        // R (jobs pushed out stay counted in R, and are counted shed too)
        self.counters.nr_requests.fetch_add(pushed as u64, Relaxed);
        self.len_hint.store(queued, Relaxed);
        self.counters.queue_len.store(queued as u64, Relaxed);
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
        if st.jobs.is_empty() && st.bulk.is_empty() {
            self.ready.wait_for(&mut st, wait);
        }
        let queued = st.jobs.len() + st.bulk.len();
        let fair = queued.div_ceil(share.max(1));
        let n = queued.min(max).min(fair.max(1));
        let state = &mut *st;
        let limited = self.peer_max_bytes < self.max_bytes;
        let light = n.min(state.jobs.len());
        let start = out.len();
        out.extend(state.jobs.drain(..light));
        out.extend(state.bulk.drain(..n - light));
        for job in &out[start..] {
            state.release(job, limited);
        }
        let left = state.jobs.len() + state.bulk.len();
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
        let st = self.state.lock();
        st.jobs.len() + st.bulk.len()
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
                identity: None,
            })
            .collect();
        let mut rej = Vec::new();
        q.push_batch(&mut batch, &mut rej);
        assert_eq!(q.len(), 3);
        assert_eq!(
            rej.iter()
                .map(|(j, why)| (j.listener, *why))
                .collect::<Vec<_>>(),
            vec![(3, Shed::QueueFull), (4, Shed::QueueFull)]
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

    #[test]
    fn one_source_holds_at_most_its_share_and_the_table_empties() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 100,
            blocks: 20,
        }]);
        let c = Arc::new(PipelineCounters::default());
        let q = HtpQueue::new(1000, c).with_peer_share(0.3);
        assert_eq!(q.peer_max_bytes(), 300);
        let job = |peer: &str| Job {
            peer: peer.parse().unwrap(),
            block: pool.alloc(Layer::Receive, 1, 0).unwrap(),
            listener: 0,
            received: Instant::now(),
            identity: None,
        };
        // a flooder on two ports of one address: one source
        let mut batch: Vec<Job> = (0..5)
            .map(|i| job(&format!("127.0.0.1:{}", 1000 + i)))
            .collect();
        // IPv6 addresses of one /64 are one source; another /64 is not
        batch.push(job("[2001:db8::1]:5"));
        batch.push(job("[2001:db8::2]:5"));
        batch.push(job("[2001:db8::3]:5"));
        batch.push(job("[2001:db8::4]:5"));
        batch.push(job("[2001:db8:0:1::1]:5"));
        batch.push(job("[::ffff:127.0.0.2]:9"));
        let mut rej = Vec::new();
        q.push_batch(&mut batch, &mut rej);
        let shed: Vec<(String, Shed)> = rej.iter().map(|(j, w)| (j.peer.to_string(), *w)).collect();
        assert_eq!(
            shed,
            vec![
                ("127.0.0.1:1003".to_string(), Shed::PeerLimit),
                ("127.0.0.1:1004".to_string(), Shed::PeerLimit),
                ("[2001:db8::4]:5".to_string(), Shed::PeerLimit),
            ]
        );
        assert_eq!(q.len(), 8);
        assert_eq!(
            q.peers(),
            4,
            "127.0.0.1, 2001:db8::/64, 2001:db8:0:1::/64, 127.0.0.2"
        );
        // the whole bound still applies: 200 bytes left
        let mut more = vec![job("10.0.0.1:1"), job("10.0.0.2:1"), job("10.0.0.3:1")];
        rej.clear();
        q.push_batch(&mut more, &mut rej);
        assert_eq!(rej.len(), 1);
        assert_eq!(rej[0].1, Shed::QueueFull);
        let mut out = Vec::new();
        while !q.is_empty() {
            q.pop_batch(&mut out, 3, 1, Duration::from_millis(1));
        }
        assert_eq!(out.len(), 10);
        assert_eq!(q.peers(), 0, "no entry outlives its source's last job");
        // a source may fill its share again once drained
        drop(out);
        let mut again: Vec<Job> = (0..3).map(|i| job(&format!("127.0.0.1:{i}"))).collect();
        rej.clear();
        q.push_batch(&mut again, &mut rej);
        assert!(rej.is_empty());
    }

    #[test]
    fn a_light_source_goes_ahead_of_a_heavy_one() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 100,
            blocks: 32,
        }]);
        let c = Arc::new(PipelineCounters::default());
        // 6400 bytes: a source holding more than 100 is heavy
        let q = HtpQueue::new(6400, c).with_peer_share(0.5);
        let job = |peer: &str, i: usize| Job {
            peer: peer.parse().unwrap(),
            block: pool.alloc(Layer::Receive, 1, 0).unwrap(),
            listener: i,
            received: Instant::now(),
            identity: None,
        };
        let mut batch: Vec<Job> = (0..10).map(|i| job("127.0.0.1:7", i)).collect();
        batch.push(job("127.0.0.2:7", 100));
        batch.push(job("127.0.0.1:7", 10));
        let mut rej = Vec::new();
        q.push_batch(&mut batch, &mut rej);
        assert!(rej.is_empty());
        let mut out = Vec::new();
        q.pop_batch(&mut out, 3, 1, Duration::from_millis(1));
        let order: Vec<usize> = out.iter().map(|j| j.listener).collect();
        assert_eq!(
            order,
            vec![0, 100, 1],
            "the flood's first, the light one, then the bulk"
        );
        out.clear();
        while !q.is_empty() {
            q.pop_batch(&mut out, 32, 1, Duration::from_millis(1));
        }
        let rest: Vec<usize> = out.iter().map(|j| j.listener).collect();
        assert_eq!(rest, (2..=10).collect::<Vec<_>>(), "the bulk in order");
        assert_eq!(q.peers(), 0);
    }

    #[test]
    fn on_a_full_queue_a_source_with_nothing_queued_pushes_out_the_newest_bulk() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 100,
            blocks: 64,
        }]);
        let c = Arc::new(PipelineCounters::default());
        // room for 20 jobs; one source may hold 10
        let q = HtpQueue::new(2000, c).with_peer_share(0.5);
        let job = |peer: String, i: usize| Job {
            peer: peer.parse().unwrap(),
            block: pool.alloc(Layer::Receive, 1, 0).unwrap(),
            listener: i,
            received: Instant::now(),
            identity: None,
        };
        // ten sources, two requests each: the queue is full, and each
        // source has one request in `jobs` and one in `bulk`
        let mut batch: Vec<Job> = (0..20)
            .map(|i| job(format!("10.0.0.{}:7", i % 10), i))
            .collect();
        let mut rej = Vec::new();
        q.push_batch(&mut batch, &mut rej);
        assert!(rej.is_empty());
        // a source already queued is shed as before
        let mut more = vec![job("10.0.0.3:7".into(), 99)];
        q.push_batch(&mut more, &mut rej);
        assert_eq!(
            rej.iter()
                .map(|(j, w)| (j.listener, *w))
                .collect::<Vec<_>>(),
            vec![(99, Shed::QueueFull)]
        );
        rej.clear();
        // a quiet source gets in, in place of the newest bulk request
        let mut quiet = vec![job("127.0.0.2:9".into(), 1000)];
        q.push_batch(&mut quiet, &mut rej);
        assert_eq!(
            rej.iter()
                .map(|(j, w)| (j.listener, *w))
                .collect::<Vec<_>>(),
            vec![(19, Shed::QueueFull)]
        );
        assert_eq!(q.len(), 20);
        // served after the other sources' first requests, ahead of the bulk,
        // and every source's requests in their order
        let mut out = Vec::new();
        while !q.is_empty() {
            q.pop_batch(&mut out, 32, 1, Duration::from_millis(1));
        }
        let order: Vec<usize> = out.iter().map(|j| j.listener).collect();
        let mut want: Vec<usize> = (0..10).collect();
        want.push(1000);
        want.extend(10..19);
        assert_eq!(order, want);
        assert_eq!(
            q.peers(),
            0,
            "the pushed-out source's bytes were given back"
        );
    }
}
