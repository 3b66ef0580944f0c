//! The Thread Pool Manager: the four thread groups of paper 000's
//! middleware (Application Service, Resource Management, Interaction,
//! Performance Profile).
//!
//! | group | policy |
//! |---|---|
//! | Application Service | one thread per service, grows with the services, no queue |
//! | Resource Management | at most `cores` workers sharing a queue of 100 tasks; a full queue refuses |
//! | Interaction | the Handler Thread Pool, sized by VTA (owned by the gateway, registered here) |
//! | Performance Profile | the one Performance Observer thread (registered here) |
//!
//! The manager owns the first two groups and counts all four, so that the
//! metrics and the dashboard can show where the process's threads are.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

/// The four groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// User services, rules, bridges: a thread each.
    ApplicationService,
    /// Device drivers and resource stores: a bounded pool with a queue.
    ResourceManagement,
    /// The Interaction layer's Handler Thread Pool.
    Interaction,
    /// The Performance Observer.
    PerformanceProfile,
}

impl Group {
    /// Every group.
    pub const ALL: [Group; 4] = [
        Group::ApplicationService,
        Group::ResourceManagement,
        Group::Interaction,
        Group::PerformanceProfile,
    ];

    /// Lower-case name for metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Group::ApplicationService => "application_service",
            Group::ResourceManagement => "resource_management",
            Group::Interaction => "interaction",
            Group::PerformanceProfile => "performance_profile",
        }
    }
}

/// The Resource Management queue is full: the task was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl std::fmt::Display for QueueFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the resource management queue is full")
    }
}

impl std::error::Error for QueueFull {}

type Task = Box<dyn FnOnce() + Send>;

struct RmState {
    tasks: VecDeque<Task>,
    idle: usize,
}

struct Inner {
    rm: Mutex<RmState>,
    rm_ready: Condvar,
    rm_threads: AtomicUsize,
    rm_max: usize,
    rm_queue: usize,
    rm_rejected: AtomicU64,
    rm_done: AtomicU64,
    app_running: AtomicUsize,
    interaction: AtomicUsize,
    profile: AtomicUsize,
    stop: AtomicBool,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

/// Threads and queue of each group, at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Threads in the group now.
    pub threads: usize,
    /// Tasks waiting (Resource Management only).
    pub queued: usize,
    /// Tasks refused because the queue was full (Resource Management only).
    pub rejected: u64,
    /// Tasks completed (Resource Management only).
    pub completed: u64,
}

/// The Thread Pool Manager. Cheap to clone.
#[derive(Clone)]
pub struct ThreadPoolManager {
    inner: Arc<Inner>,
}

impl ThreadPoolManager {
    /// A manager whose Resource Management group has at most `cores`
    /// workers and a queue of `queue` tasks (the paper: cores and 100).
    pub fn new(cores: usize, queue: usize) -> ThreadPoolManager {
        ThreadPoolManager {
            inner: Arc::new(Inner {
                rm: Mutex::new(RmState {
                    tasks: VecDeque::new(),
                    idle: 0,
                }),
                rm_ready: Condvar::new(),
                rm_threads: AtomicUsize::new(0),
                rm_max: cores.max(1),
                rm_queue: queue,
                rm_rejected: AtomicU64::new(0),
                rm_done: AtomicU64::new(0),
                app_running: AtomicUsize::new(0),
                interaction: AtomicUsize::new(0),
                profile: AtomicUsize::new(0),
                stop: AtomicBool::new(false),
                handles: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The paper's sizes: `cores` Resource Management workers, queue 100.
    pub fn with_defaults() -> ThreadPoolManager {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        ThreadPoolManager::new(cores, 100)
    }

    /// Runs `task` on the Resource Management group. A worker is started
    /// when none is idle and the group is below its maximum; otherwise the
    /// task waits in the queue, and a full queue refuses it.
    pub fn submit(&self, task: impl FnOnce() + Send + 'static) -> Result<(), QueueFull> {
        let i = &self.inner;
        let mut st = i.rm.lock();
        if st.idle == 0 && i.rm_threads.load(Relaxed) < i.rm_max {
            i.rm_threads.fetch_add(1, Relaxed);
            let inner = i.clone();
            let first: Task = Box::new(task);
            drop(st);
            let spawned = std::thread::Builder::new()
                .name("resource-mgmt".into())
                .spawn(move || rm_worker(&inner, Some(first)));
            return match spawned {
                Ok(h) => {
                    i.handles.lock().push(h);
                    Ok(())
                }
                Err(_) => {
                    i.rm_threads.fetch_sub(1, Relaxed);
                    i.rm_rejected.fetch_add(1, Relaxed);
                    Err(QueueFull)
                }
            };
        }
        if st.tasks.len() >= i.rm_queue {
            i.rm_rejected.fetch_add(1, Relaxed);
            return Err(QueueFull);
        }
        st.tasks.push_back(Box::new(task));
        drop(st);
        i.rm_ready.notify_one();
        Ok(())
    }

    /// Starts an Application Service: a thread of its own for as long as
    /// `service` runs (the group grows with the services; no queue).
    pub fn spawn_service(
        &self,
        name: &str,
        service: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<JoinHandle<()>> {
        let inner = self.inner.clone();
        inner.app_running.fetch_add(1, Relaxed);
        let i2 = inner.clone();
        std::thread::Builder::new()
            .name(format!("app-{name}"))
            .spawn(move || {
                struct Done(Arc<Inner>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.app_running.fetch_sub(1, Relaxed);
                    }
                }
                let _done = Done(i2);
                service();
            })
            .inspect_err(|_| {
                inner.app_running.fetch_sub(1, Relaxed);
            })
    }

    /// Records the Interaction group's (HTP) thread count.
    pub fn set_interaction_threads(&self, n: usize) {
        self.inner.interaction.store(n, Relaxed);
    }

    /// Records the Performance Profile group's thread count.
    pub fn set_profile_threads(&self, n: usize) {
        self.inner.profile.store(n, Relaxed);
    }

    /// The counts of one group.
    pub fn stats(&self, g: Group) -> GroupStats {
        let i = &self.inner;
        match g {
            Group::ApplicationService => GroupStats {
                threads: i.app_running.load(Relaxed),
                ..GroupStats::default()
            },
            Group::ResourceManagement => GroupStats {
                threads: i.rm_threads.load(Relaxed),
                queued: i.rm.lock().tasks.len(),
                rejected: i.rm_rejected.load(Relaxed),
                completed: i.rm_done.load(Relaxed),
            },
            Group::Interaction => GroupStats {
                threads: i.interaction.load(Relaxed),
                ..GroupStats::default()
            },
            Group::PerformanceProfile => GroupStats {
                threads: i.profile.load(Relaxed),
                ..GroupStats::default()
            },
        }
    }

    /// Stops the Resource Management workers after the queued tasks ran.
    /// Application Services end on their own.
    pub fn shutdown(&self) {
        self.inner.stop.store(true, Relaxed);
        {
            let _g = self.inner.rm.lock();
            self.inner.rm_ready.notify_all();
        }
        let handles: Vec<_> = self.inner.handles.lock().drain(..).collect();
        for h in handles {
            let _ = h.join();
        }
    }
}

fn rm_worker(i: &Inner, mut next: Option<Task>) {
    loop {
        if let Some(t) = next.take() {
            // a panicking task must not take the worker (and its count) along
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(t));
            i.rm_done.fetch_add(1, Relaxed);
        }
        let mut st = i.rm.lock();
        loop {
            if let Some(t) = st.tasks.pop_front() {
                next = Some(t);
                break;
            }
            if i.stop.load(Relaxed) {
                i.rm_threads.fetch_sub(1, Relaxed);
                return;
            }
            st.idle += 1;
            i.rm_ready.wait(&mut st);
            st.idle -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn resource_management_is_bounded_by_cores_and_its_queue() {
        let m = ThreadPoolManager::new(2, 3);
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut accepted = 0;
        let mut refused = 0;
        for _ in 0..8 {
            let r = release_rx.clone();
            let d = done_tx.clone();
            match m.submit(move || {
                let _ = r.lock().recv_timeout(Duration::from_secs(5));
                let _ = d.send(());
            }) {
                Ok(()) => accepted += 1,
                Err(QueueFull) => refused += 1,
            }
        }
        // 2 running + 3 queued; the other 3 refused
        assert_eq!((accepted, refused), (5, 3));
        let s = m.stats(Group::ResourceManagement);
        assert_eq!((s.threads, s.queued, s.rejected), (2, 3, 3));
        for _ in 0..accepted {
            release_tx.send(()).unwrap();
        }
        for _ in 0..accepted {
            done_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        m.shutdown();
        let s = m.stats(Group::ResourceManagement);
        assert_eq!((s.threads, s.completed), (0, 5));
    }

    #[test]
    fn a_panicking_task_does_not_kill_the_group() {
        let m = ThreadPoolManager::new(1, 10);
        m.submit(|| panic!("task failure")).unwrap();
        let (tx, rx) = mpsc::channel();
        m.submit(move || tx.send(7).unwrap()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 7);
        m.shutdown();
    }

    #[test]
    fn application_services_each_get_a_thread_and_are_counted() {
        let m = ThreadPoolManager::new(1, 1);
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let hs: Vec<_> = (0..3)
            .map(|k| {
                let rx = rx.clone();
                m.spawn_service(&format!("s{k}"), move || {
                    let _ = rx.lock().recv_timeout(Duration::from_secs(5));
                })
                .unwrap()
            })
            .collect();
        assert_eq!(m.stats(Group::ApplicationService).threads, 3);
        for _ in 0..3 {
            tx.send(()).unwrap();
        }
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(m.stats(Group::ApplicationService).threads, 0);
        m.set_interaction_threads(4);
        m.set_profile_threads(1);
        assert_eq!(m.stats(Group::Interaction).threads, 4);
        assert_eq!(m.stats(Group::PerformanceProfile).threads, 1);
    }
}
