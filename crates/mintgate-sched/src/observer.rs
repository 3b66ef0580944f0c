//! The Performance Observer: per-second samples of the pipeline's counters.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Counters every pipeline stage adds to. Monotonic counters only grow;
/// the fields documented as gauges hold a current value.
#[derive(Debug, Default)]
pub struct PipelineCounters {
    /// Datagrams read by the Network Receiver.
    pub nr_datagrams: AtomicU64,
    /// Requests the Network Receiver put on the HTP queue (the paper's R).
    pub nr_requests: AtomicU64,
    /// NON requests dropped because the queue or the pool was full.
    pub nr_dropped: AtomicU64,
    /// CON requests answered 5.03 because the queue was full.
    pub nr_rejected: AtomicU64,
    /// Requests shed (NON dropped, CON answered 5.03) because their source
    /// already held its share of the HTP queue (per-peer limit).
    pub nr_peer_limited: AtomicU64,
    /// Malformed datagrams (answered with Reset or dropped).
    pub nr_malformed: AtomicU64,
    /// Duplicates (replayed or dropped by de-duplication).
    pub nr_duplicates: AtomicU64,
    /// Datagrams dropped for other reasons (misplaced, unexpected, truncated).
    pub nr_ignored: AtomicU64,
    /// Requests the HTP finished (the paper's H).
    pub htp_handled: AtomicU64,
    /// Nanoseconds HTP threads spent handling (busy time, not waiting).
    pub htp_busy_ns: AtomicU64,
    /// Gauge: HTP threads (the paper's N).
    pub htp_threads: AtomicU64,
    /// Gauge: pipeline threads (Network Receivers and handlers) running as
    /// `SCHED_BATCH` now (see [`crate::BatchSwitch`]).
    pub pipeline_batch_threads: AtomicU64,
    /// Times a pipeline thread switched into `SCHED_BATCH`.
    pub pipeline_batch_switches: AtomicU64,
    /// Gauge: requests in the HTP queue (the paper's QS).
    pub queue_len: AtomicU64,
    /// Gauge: bytes held by the HTP queue.
    pub queue_bytes: AtomicU64,
    /// Requests shed by a handler because the pool had no block.
    pub htp_shed: AtomicU64,
    /// Cached responses dropped early to free buffers for receiving.
    pub dedup_evicted: AtomicU64,
    /// Datagrams the Send Handler transmitted.
    pub sh_sent: AtomicU64,
    /// Send errors.
    pub sh_errors: AtomicU64,
}

/// One second (or period) of the pipeline, as deltas and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Seconds since the observer started, at the end of the period.
    pub t: f64,
    /// Length of the period in seconds.
    pub dt: f64,
    /// R_t: requests accepted.
    pub r: u64,
    /// H_t: requests completed.
    pub h: u64,
    /// N_t: HTP threads at the end of the period.
    pub n: u64,
    /// QS_t: queue length at the end of the period.
    pub qs: u64,
    /// Bytes in the queue at the end of the period.
    pub queue_bytes: u64,
    /// Busy thread-seconds spent handling during the period.
    pub busy: f64,
    /// Datagrams received.
    pub datagrams: u64,
    /// Dropped NON + rejected CON + per-peer limited + shed.
    pub dropped: u64,
    /// Malformed datagrams.
    pub malformed: u64,
    /// Duplicates.
    pub duplicates: u64,
    /// Datagrams sent.
    pub sent: u64,
}

#[derive(Clone, Copy, Default)]
struct Totals {
    r: u64,
    h: u64,
    busy_ns: u64,
    datagrams: u64,
    dropped: u64,
    malformed: u64,
    duplicates: u64,
    sent: u64,
}

impl PipelineCounters {
    fn totals(&self) -> Totals {
        Totals {
            r: self.nr_requests.load(Relaxed),
            h: self.htp_handled.load(Relaxed),
            busy_ns: self.htp_busy_ns.load(Relaxed),
            datagrams: self.nr_datagrams.load(Relaxed),
            dropped: self.nr_dropped.load(Relaxed)
                + self.nr_rejected.load(Relaxed)
                + self.nr_peer_limited.load(Relaxed)
                + self.htp_shed.load(Relaxed),
            malformed: self.nr_malformed.load(Relaxed),
            duplicates: self.nr_duplicates.load(Relaxed),
            sent: self.sh_sent.load(Relaxed),
        }
    }
}

struct Inner {
    samples: Mutex<VecDeque<Sample>>,
    capacity: usize,
    stop: AtomicBool,
    stop_lock: Mutex<()>,
    stop_cv: Condvar,
}

/// Samples a [`PipelineCounters`] every period on its own thread (the
/// Performance Profile group) and keeps the last `capacity` samples.
pub struct Observer {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Observer {
    /// Starts sampling `counters` every `period`; `on_sample` runs on the
    /// observer thread with the history after each new sample (the VTA
    /// controller hooks in here).
    pub fn start(
        counters: Arc<PipelineCounters>,
        period: Duration,
        capacity: usize,
        mut on_sample: impl FnMut(&VecDeque<Sample>) + Send + 'static,
    ) -> std::io::Result<Observer> {
        let inner = Arc::new(Inner {
            samples: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity: capacity.max(10),
            stop: AtomicBool::new(false),
            stop_lock: Mutex::new(()),
            stop_cv: Condvar::new(),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("observer".into())
            .spawn(move || {
                let start = Instant::now();
                let mut prev = counters.totals();
                let mut prev_t = start;
                let mut next = start + period;
                loop {
                    {
                        let mut g = i.stop_lock.lock();
                        while !i.stop.load(Relaxed) && Instant::now() < next {
                            i.stop_cv.wait_until(&mut g, next);
                        }
                    }
                    if i.stop.load(Relaxed) {
                        return;
                    }
                    let now = Instant::now();
                    let cur = counters.totals();
                    let s = Sample {
                        t: (now - start).as_secs_f64(),
                        dt: (now - prev_t).as_secs_f64(),
                        r: cur.r - prev.r,
                        h: cur.h - prev.h,
                        n: counters.htp_threads.load(Relaxed),
                        qs: counters.queue_len.load(Relaxed),
                        queue_bytes: counters.queue_bytes.load(Relaxed),
                        busy: (cur.busy_ns - prev.busy_ns) as f64 / 1e9,
                        datagrams: cur.datagrams - prev.datagrams,
                        dropped: cur.dropped - prev.dropped,
                        malformed: cur.malformed - prev.malformed,
                        duplicates: cur.duplicates - prev.duplicates,
                        sent: cur.sent - prev.sent,
                    };
                    prev = cur;
                    prev_t = now;
                    next += period;
                    if next < now {
                        next = now + period; // fell behind (suspended): do not burst
                    }
                    let mut q = i.samples.lock();
                    if q.len() == i.capacity {
                        q.pop_front();
                    }
                    q.push_back(s);
                    on_sample(&q);
                }
            })?;
        Ok(Observer {
            inner,
            thread: Some(thread),
        })
    }

    /// A cheap handle that reads the samples from elsewhere (e.g. the
    /// metrics endpoint) while the observer runs.
    pub fn handle(&self) -> ObserverHandle {
        ObserverHandle {
            inner: self.inner.clone(),
        }
    }

    /// The samples kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.inner.samples.lock().iter().copied().collect()
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<Sample> {
        self.inner.samples.lock().back().copied()
    }

    /// Stops the observer thread.
    pub fn stop(&mut self) {
        self.inner.stop.store(true, Relaxed);
        {
            let _g = self.inner.stop_lock.lock();
            self.inner.stop_cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads an [`Observer`]'s samples; cloneable, usable from any thread.
#[derive(Clone)]
pub struct ObserverHandle {
    inner: Arc<Inner>,
}

impl ObserverHandle {
    /// The samples kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.inner.samples.lock().iter().copied().collect()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_deltas_with_gauges_and_bounded() {
        let c = Arc::new(PipelineCounters::default());
        let seen = Arc::new(AtomicU64::new(0));
        let s2 = seen.clone();
        let mut obs = Observer::start(c.clone(), Duration::from_millis(20), 10, move |q| {
            s2.store(q.len() as u64, Relaxed);
        })
        .unwrap();
        c.nr_requests.fetch_add(5, Relaxed);
        c.htp_handled.fetch_add(3, Relaxed);
        c.htp_threads.store(2, Relaxed);
        std::thread::sleep(Duration::from_millis(400));
        obs.stop();
        let samples = obs.samples();
        assert_eq!(samples.len(), 10, "capacity bound");
        assert!(seen.load(Relaxed) >= 10);
        // the whole history sums to what was counted, minus what fell off
        assert!(samples.iter().map(|s| s.r).sum::<u64>() <= 5);
        assert!(samples.iter().all(|s| s.n == 2));
        assert!(samples.windows(2).all(|w| w[0].t < w[1].t));
    }
}
