//! A thread pool that can grow and shrink while it runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

type Body = Arc<dyn Fn(&Worker) + Send + Sync>;
type Wake = Arc<dyn Fn() + Send + Sync>;

struct Shared {
    name: String,
    target: AtomicUsize,
    shutdown: AtomicBool,
    slots: Mutex<Vec<Slot>>,
    body: Body,
    wake: Wake,
}

struct Slot {
    running: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// What a worker body gets: its index and whether it should return.
pub struct Worker {
    index: usize,
    shared: Arc<Shared>,
    running: Arc<AtomicBool>,
}

impl Worker {
    /// The worker's index, `0..size`.
    pub fn index(&self) -> usize {
        self.index
    }

    /// True once the pool shrank below this worker or is shutting down. The
    /// body must check it between units of work and return when it is set;
    /// blocking waits in the body must time out or be woken by the pool's
    /// wake callback.
    #[inline]
    pub fn should_stop(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
            || self.index >= self.shared.target.load(Ordering::Relaxed)
    }
}

/// A pool of `size` threads running the same body.
///
/// Invariant: the threads running are exactly the indices `0..size`
/// (a worker told to stop may still be finishing its current unit of work).
pub struct ThreadPool {
    shared: Arc<Shared>,
}

impl ThreadPool {
    /// Starts `size` workers named `name-<index>` running `body`. `wake` is
    /// called after every resize so that blocked workers re-check
    /// [`Worker::should_stop`] (e.g. a condvar `notify_all`).
    pub fn new(
        name: &str,
        size: usize,
        body: impl Fn(&Worker) + Send + Sync + 'static,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<ThreadPool> {
        let pool = ThreadPool {
            shared: Arc::new(Shared {
                name: name.to_string(),
                target: AtomicUsize::new(0),
                shutdown: AtomicBool::new(false),
                slots: Mutex::new(Vec::new()),
                body: Arc::new(body),
                wake: Arc::new(wake),
            }),
        };
        pool.resize(size)?;
        Ok(pool)
    }

    /// The number of workers asked for.
    pub fn size(&self) -> usize {
        self.shared.target.load(Ordering::Relaxed)
    }

    /// Changes the number of workers (at least 1). Extra workers finish their
    /// current unit of work and exit; missing ones are started.
    pub fn resize(&self, size: usize) -> std::io::Result<()> {
        let size = size.max(1);
        let mut slots = self.shared.slots.lock();
        self.shared.target.store(size, Ordering::Relaxed);
        for i in 0..size {
            if i == slots.len() {
                slots.push(Slot {
                    running: Arc::new(AtomicBool::new(false)),
                    handle: None,
                });
            }
            let slot = &mut slots[i];
            if slot.running.load(Ordering::Acquire) {
                continue;
            }
            if let Some(h) = slot.handle.take() {
                let _ = h.join();
            }
            let running = Arc::new(AtomicBool::new(true));
            let worker = Worker {
                index: i,
                shared: self.shared.clone(),
                running: running.clone(),
            };
            let handle = std::thread::Builder::new()
                .name(format!("{}-{}", self.shared.name, i))
                .spawn(move || run_worker(worker))?;
            *slot = Slot {
                running,
                handle: Some(handle),
            };
        }
        drop(slots);
        (self.shared.wake)();
        Ok(())
    }

    /// Stops every worker and waits for them.
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        (self.shared.wake)();
        let handles: Vec<_> = self
            .shared
            .slots
            .lock()
            .iter_mut()
            .filter_map(|s| s.handle.take())
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run_worker(w: Worker) {
    loop {
        (w.shared.body)(&w);
        // Exit protocol: decide under the slots lock so that a concurrent
        // resize either sees us running (and keeps us) or not (and restarts us).
        let _slots = w.shared.slots.lock();
        if w.should_stop() {
            w.running.store(false, Ordering::Release);
            return;
        }
        // resized back up while the body was returning: keep going
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait_until(f: impl Fn() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn grows_shrinks_and_regrows() {
        let live = Arc::new(AtomicUsize::new(0));
        let l = live.clone();
        let pool = ThreadPool::new(
            "t",
            3,
            move |w| {
                l.fetch_add(1, Ordering::SeqCst);
                while !w.should_stop() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                l.fetch_sub(1, Ordering::SeqCst);
            },
            || {},
        )
        .unwrap();
        assert!(wait_until(|| live.load(Ordering::SeqCst) == 3));
        pool.resize(1).unwrap();
        assert!(wait_until(|| live.load(Ordering::SeqCst) == 1));
        pool.resize(4).unwrap();
        assert!(wait_until(|| live.load(Ordering::SeqCst) == 4));
        assert_eq!(pool.size(), 4);
        pool.resize(0).unwrap();
        assert_eq!(pool.size(), 1, "never below one worker");
        pool.shutdown();
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }
}
