//! One thread that samples every simulated sensor of the process.
//!
//! A sensor used to have a thread of its own that slept until its next
//! sample. A gateway simulating a hundred sensors at 10 Hz then had a
//! hundred threads, each waking on its own phase, and every sample woke the
//! threads behind it (the Observe notifier, the MQTT bridge, the publish
//! queue) once more: a thousand wake-ups a second per stage, which cost more
//! CPU than the samples themselves.
//!
//! Invariants:
//! - every periodic task fires at multiples of its period on the monotonic
//!   clock ([`crate::clock::now_ns`]) shifted by the process's phase, so
//!   tasks of equal period fire together and the threads behind them wake
//!   once per tick;
//! - the phase is taken from the clock when the thread starts (under a
//!   second): processes on one host, which share the monotonic clock, do
//!   not all fire at the same instants (as gateways on separate hosts do
//!   not);
//! - a task that falls behind (a stalled machine) skips to its next
//!   multiple: it never fires in a burst;
//! - once the [`Running`] guard of a task is dropped, its task is never
//!   called again (dropping waits for a call in progress, unless it is that
//!   very call dropping it);
//! - a task that panics is removed and logged; the others go on.
//!
//! The thread is started on the first task and parks without a timeout
//! while there is none.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{Thread, ThreadId};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::now_ns;
use crate::driver::{DeviceError, Running};

/// A task: called with the instant it fires at ([`now_ns`]).
type Task = Box<dyn FnMut(u64) + Send>;

struct Entry {
    id: u64,
    name: String,
    period: u64,
    next: AtomicU64,
    task: Mutex<Option<Task>>,
    gone: AtomicBool,
}

struct Ticker {
    entries: Mutex<Vec<Arc<Entry>>>,
    thread: Thread,
    next_id: AtomicU64,
    /// This process's phase, ns (under a second).
    phase: u64,
}

static TICKER: OnceLock<Result<Arc<Ticker>, String>> = OnceLock::new();

/// The next instant after `now` that is `phase` past a multiple of
/// `period`.
fn next_multiple(now: u64, period: u64, phase: u64) -> u64 {
    let phase = phase % period;
    if now < phase {
        return phase;
    }
    ((now - phase) / period + 1) * period + phase
}

fn ticker() -> Result<&'static Arc<Ticker>, DeviceError> {
    TICKER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Arc<Ticker>>();
            let handle = std::thread::Builder::new()
                .name("sim-ticker".into())
                .spawn(move || {
                    if let Ok(t) = rx.recv() {
                        run(&t);
                    }
                })
                .map_err(|e| format!("starting thread sim-ticker: {e}"))?;
            let t = Arc::new(Ticker {
                entries: Mutex::new(Vec::new()),
                thread: handle.thread().clone(),
                next_id: AtomicU64::new(1),
                phase: now_ns() % 1_000_000_000,
            });
            tx.send(t.clone())
                .map_err(|_| "the sim-ticker thread ended at its start".to_string())?;
            Ok(t)
        })
        .as_ref()
        .map_err(|e| DeviceError::Io {
            what: e.clone(),
            cause: std::io::Error::other("thread"),
        })
}

fn run(t: &Ticker) {
    let mut due: Vec<Arc<Entry>> = Vec::new();
    loop {
        let now = now_ns();
        due.extend(
            t.entries
                .lock()
                .iter()
                .filter(|e| e.next.load(Ordering::Relaxed) <= now)
                .cloned(),
        );
        for e in due.drain(..) {
            fire(t, &e);
            let after = e.next.load(Ordering::Relaxed) + e.period;
            let now = now_ns();
            // fell behind: the next multiple, never a burst
            let next = if after <= now {
                next_multiple(now, e.period, t.phase)
            } else {
                after
            };
            e.next.store(next, Ordering::Relaxed);
        }
        // The earliest next instant, over tasks fired and not; one fired
        // late or added meanwhile is looked at again at once.
        let now = now_ns();
        let pending = t
            .entries
            .lock()
            .iter()
            .map(|e| e.next.load(Ordering::Relaxed))
            .min();
        match pending {
            Some(next) if next <= now => continue,
            Some(next) => std::thread::park_timeout(Duration::from_nanos(next - now)),
            None => std::thread::park(),
        }
    }
}

fn fire(t: &Ticker, e: &Entry) {
    let mut task = e.task.lock();
    if e.gone.load(Ordering::Relaxed) {
        return;
    }
    let Some(f) = task.as_mut() else { return };
    let at = now_ns();
    if catch_unwind(AssertUnwindSafe(|| f(at))).is_err() {
        tracing::error!(task = %e.name, "a periodic task panicked; it is stopped");
        *task = None;
        e.gone.store(true, Ordering::Relaxed);
        t.entries.lock().retain(|x| x.id != e.id);
    }
}

/// Calls `task` every `period` (at least 100 us) on the shared thread, at
/// multiples of the period; dropping the guard stops it. `name` is for the
/// log.
pub fn every(
    name: &str,
    period: Duration,
    task: impl FnMut(u64) + Send + 'static,
) -> Result<Running, DeviceError> {
    let t = ticker()?;
    let period = (period.as_nanos() as u64).max(100_000);
    let entry = Arc::new(Entry {
        id: t.next_id.fetch_add(1, Ordering::Relaxed),
        name: name.to_string(),
        period,
        next: AtomicU64::new(next_multiple(now_ns(), period, t.phase)),
        task: Mutex::new(Some(Box::new(task))),
        gone: AtomicBool::new(false),
    });
    t.entries.lock().push(entry.clone());
    t.thread.unpark();
    let ticker_id: ThreadId = t.thread.id();
    Ok(Running::on_drop(move || {
        entry.gone.store(true, Ordering::Relaxed);
        if let Ok(t) = ticker() {
            t.entries.lock().retain(|x| x.id != entry.id);
        }
        if std::thread::current().id() == ticker_id {
            // Dropped from a task: its own call may be in progress on this
            // thread (`gone` stops any later one); another's is not.
            if let Some(mut task) = entry.task.try_lock() {
                *task = None;
            }
        } else {
            // Waits for a call in progress on the ticker's thread.
            *entry.task.lock() = None;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn tasks_of_one_period_fire_together_and_stop_when_dropped() {
        let stamps: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
        let mut guards = Vec::new();
        for i in 0..3 {
            let s = stamps.clone();
            guards.push(
                every("test", Duration::from_millis(20), move |at| {
                    s.lock().push((i, at))
                })
                .unwrap(),
            );
        }
        // (another test's panic may hold the shared thread a while)
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while stamps.lock().len() < 12 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(guards);
        let n = stamps.lock().len();
        assert!(n >= 12, "3 tasks at 20 ms fired {n} times in 5 s");
        // The three fire in the same ticks, at the process's phase past a
        // multiple of the period: the median call is within 5 ms of it
        // (a loaded machine makes single calls late).
        let period = 20_000_000;
        let phase = ticker().unwrap().phase % period;
        let mut late: Vec<u64> = stamps
            .lock()
            .iter()
            .map(|(_, at)| (at - phase) % period)
            .collect();
        late.sort_unstable();
        let median = late[late.len() / 2];
        assert!(
            median < 5_000_000,
            "the median call came {median} ns after its instant"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            stamps.lock().len(),
            n,
            "a task fired after its guard was dropped"
        );
    }

    #[test]
    fn a_panicking_task_is_removed_and_the_others_go_on() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let _bad = every("bad", Duration::from_millis(5), |_| panic!("boom")).unwrap();
        let _good = every("good", Duration::from_millis(5), move |_| {
            c.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        // (the panic hook may take a while to print a backtrace)
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while calls.load(Ordering::Relaxed) < 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(calls.load(Ordering::Relaxed) >= 5, "the others stopped");
    }

    #[test]
    fn a_task_may_drop_its_own_guard() {
        let slot: Arc<Mutex<Option<Running>>> = Arc::default();
        let (dropped, after) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (s, d, a) = (slot.clone(), dropped.clone(), after.clone());
        let g = every("self", Duration::from_millis(5), move |_| {
            if d.load(Ordering::Relaxed) {
                a.fetch_add(1, Ordering::Relaxed);
            } else if let Some(g) = s.lock().take() {
                d.store(true, Ordering::Relaxed);
                drop(g);
            }
        })
        .unwrap();
        *slot.lock() = Some(g);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !dropped.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(dropped.load(Ordering::Relaxed), "the task never ran");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            after.load(Ordering::Relaxed),
            0,
            "called after dropping itself"
        );
    }

    #[test]
    fn next_multiple_is_strictly_after() {
        assert_eq!(next_multiple(0, 10, 0), 10);
        assert_eq!(next_multiple(9, 10, 0), 10);
        assert_eq!(next_multiple(10, 10, 0), 20);
        assert_eq!(next_multiple(10, 10, 3), 13);
        assert_eq!(next_multiple(13, 10, 3), 23);
        assert_eq!(next_multiple(2, 10, 3), 3);
        assert_eq!(next_multiple(2, 10, 23), 3);
    }
}
