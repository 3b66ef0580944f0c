//! The direct path from sensor to output (paper 001, "Kernel-level Direct
//! Path for Fast Processing of Sensing Data in IoT", Park, Choi and Jeon).
//!
//! ```text
//! driver event ──push──> lock-free ring ──pop──> worker (high priority)
//! (value, time)          (bounded; a full          └─ link table: input -> filters -> outputs
//!                         ring counts overflow)
//! ```
//!
//! The input side is the interrupt handler's half: [`Injector::push`]
//! stamps the event and writes one 32-byte record into the ring
//! (`crossbeam_queue::ArrayQueue`, bounded, lock-free, many producers), and
//! wakes the worker only if it is parked. The worker runs at the highest
//! priority the process may take (`SCHED_FIFO` where permitted, else the
//! lowest nice value allowed) and does the rest: look up the links of the
//! event's input, run their filters, fire their outputs. Nothing on that
//! path makes a system call of its own, takes a blocking lock or allocates;
//! an output may (an attribute-file actuator writes a file).
//!
//! How the worker waits for the next event ([`WaitMode`]):
//! - `spin`: polls the ring; the lowest hand-off latency, one core busy all
//!   the time;
//! - `park`: sleeps on a futex; no CPU at idle, each event pays a wake-up;
//! - `spin-then-park:D`: polls for D after the last event,
//!   then sleeps: bursts get the spinning latency, idle costs nothing;
//! - `predict:M` (the default, 30 us): learns the gap between events (up
//!   to 100 ms) and sleeps until M before
//!   the next one is due, then polls: periodic inputs get the polling
//!   latency for about M of CPU per event; a late or irregular event gets
//!   the sleeping latency.
//!
//! Counted continuously ([`Stats`]): events pushed, ring overflows,
//! events processed, filter passes and drops, outputs fired and failed,
//! and three latency histograms: inside the worker (event in hand →
//! filters → outputs done, the paper's kernel-side measure, which began
//! inside the work item), end to end (push → outputs done, the hand-off
//! and the pop included) and from the sensing instant (e.g. the
//! kernel's GPIO edge timestamp) to outputs done.

pub mod expr;
pub mod filter;
pub mod histogram;
pub mod link;
pub mod output;

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use mintgate_sched::priority::{self, Applied, Priority};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::clock::now_ns;
pub use filter::{Filter, FilterSpec, FilterState};
pub use histogram::Histogram;
pub use link::{LinkSpec, OutputSpec};
pub use output::{NotifyHook, OutputFactory, OutputSink};

/// One event in the ring: 32 bytes, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    /// The input (device) it comes from.
    pub input: u32,
    /// The sensed value.
    pub value: f64,
    /// When it was sensed ([`crate::clock::now_ns`]; for a GPIO edge, the
    /// kernel's timestamp).
    pub src_ns: u64,
    /// When it entered the ring.
    pub enq_ns: u64,
}

/// How the worker waits for events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Poll the ring without ever sleeping.
    Spin,
    /// Sleep whenever the ring is empty.
    Park,
    /// Poll for this long after the last event, then sleep.
    SpinThenPark(Duration),
    /// Learn the gap between events; sleep until this margin before the
    /// next one is expected, then poll until it comes (or until twice the
    /// margin past the expected time, then sleep until woken). For periodic
    /// inputs (sampled sensors): the polling latency at a fraction of the
    /// CPU; irregular inputs get the sleeping latency.
    Predict(Duration),
}

impl std::fmt::Display for WaitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitMode::Spin => write!(f, "spin"),
            WaitMode::Park => write!(f, "park"),
            WaitMode::SpinThenPark(d) => {
                write!(f, "spin-then-park:{}", crate::parse::fmt_duration(*d))
            }
            WaitMode::Predict(d) => write!(f, "predict:{}", crate::parse::fmt_duration(*d)),
        }
    }
}

impl std::str::FromStr for WaitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<WaitMode, String> {
        match s.trim() {
            "spin" => Ok(WaitMode::Spin),
            "park" => Ok(WaitMode::Park),
            other => {
                if let Some(d) = other.strip_prefix("spin-then-park:") {
                    Ok(WaitMode::SpinThenPark(crate::parse::duration(d)?))
                } else if let Some(d) = other.strip_prefix("predict:") {
                    Ok(WaitMode::Predict(crate::parse::duration(d)?))
                } else {
                    Err(format!(
                        "`{other}`: expected spin, park, spin-then-park:DURATION or predict:MARGIN"
                    ))
                }
            }
        }
    }
}

impl Serialize for WaitMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for WaitMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `[directpath]`: the direct path's settings.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DirectPathConfig {
    /// Events the ring holds; a push into a full ring is counted as an
    /// overflow and the event dropped.
    pub ring_capacity: usize,
    /// How the worker waits: `"spin"`, `"park"`, `"spin-then-park:50us"` or
    /// `"predict:30us"` (the default).
    pub wait: WaitMode,
    /// `SCHED_FIFO` level asked for the worker (1-99); 0 leaves the worker
    /// at normal priority. Where refused, the lowest nice value allowed.
    pub priority: u8,
    /// Links created at start, in the link syntax
    /// (`"temp0 | threshold(25, 23) -> actuator(led0)"`).
    pub links: Vec<String>,
    /// Links the direct path holds at most (configured and added through
    /// `/links` together); adding one more is refused. Each link runs on
    /// the worker at every event of its input.
    pub max_links: usize,
}

/// The largest `directpath.max_links` accepted.
pub const MAX_LINKS_LIMIT: usize = 65_536;

impl Default for DirectPathConfig {
    fn default() -> Self {
        DirectPathConfig {
            ring_capacity: 4096,
            wait: WaitMode::Predict(Duration::from_micros(30)),
            priority: 50,
            links: Vec::new(),
            max_links: 256,
        }
    }
}

/// A link's identity.
pub type LinkId = u64;

/// A resolved link: input id, filters, outputs.
pub struct Link {
    /// Its identity (assigned by [`DirectPath::add_link`]).
    pub id: LinkId,
    /// The input id events carry.
    pub input: u32,
    /// How it reads in the link syntax.
    pub text: String,
    /// Filters, in order.
    pub filters: Vec<Filter>,
    /// Outputs.
    pub outputs: Vec<Arc<dyn OutputSink>>,
}

/// A value alone on its cache line(s), so that a counter one thread
/// writes does not slow down the thread that writes its neighbour.
#[repr(align(128))]
#[derive(Default, Debug)]
pub struct Line<T>(pub T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Counters and latency histograms, updated continuously. The producers
/// write `pushed` and `overflow`; the worker writes the rest. Each counter
/// has a cache line of its own.
#[derive(Default)]
pub struct Stats {
    /// Events offered to the ring (an event of an input with no link is
    /// not: see `skipped`).
    pub pushed: Line<AtomicU64>,
    /// Events of inputs with no link, dropped by the producer before the
    /// ring (written by the producers; counted in the snapshot's
    /// `unlinked`).
    pub skipped: Line<AtomicU64>,
    /// Events refused by a full ring (dropped, never silently).
    pub overflow: Line<AtomicU64>,
    /// Events taken from the ring by the worker.
    pub processed: Line<AtomicU64>,
    /// Events whose input had no link when the worker took them (a link
    /// removed after the push).
    pub unlinked: Line<AtomicU64>,
    /// (event, link) pairs that passed every filter.
    pub passed: Line<AtomicU64>,
    /// (event, link) pairs a filter stopped.
    pub filtered: Line<AtomicU64>,
    /// Outputs fired successfully.
    pub fired: Line<AtomicU64>,
    /// Outputs that failed.
    pub output_errors: Line<AtomicU64>,
    /// Times the worker went to sleep.
    pub parks: Line<AtomicU64>,
    /// Event in hand (after the pop) → outputs done, per event, ns.
    pub worker_ns: Histogram,
    /// Push → outputs done, per event, ns.
    pub e2e_ns: Histogram,
    /// Sensed → outputs done, per event, ns.
    pub source_ns: Histogram,
}

/// A copy of the counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`Stats::pushed`].
    pub pushed: u64,
    /// See [`Stats::overflow`].
    pub overflow: u64,
    /// See [`Stats::processed`].
    pub processed: u64,
    /// See [`Stats::unlinked`].
    pub unlinked: u64,
    /// See [`Stats::passed`].
    pub passed: u64,
    /// See [`Stats::filtered`].
    pub filtered: u64,
    /// See [`Stats::fired`].
    pub fired: u64,
    /// See [`Stats::output_errors`].
    pub output_errors: u64,
    /// See [`Stats::parks`].
    pub parks: u64,
    /// Worker latency p50, ns (bucket middle).
    pub worker_p50_ns: u64,
    /// Worker latency p99, ns.
    pub worker_p99_ns: u64,
    /// End-to-end latency p50, ns.
    pub e2e_p50_ns: u64,
    /// End-to-end latency p99, ns.
    pub e2e_p99_ns: u64,
    /// End-to-end latency max, ns.
    pub e2e_max_ns: u64,
}

/// Exact per-event latencies, captured on request (for the lab).
struct Capture {
    worker: Vec<u32>,
    e2e: Vec<u32>,
    cap: usize,
}

struct Shared {
    ring: ArrayQueue<Event>,
    sleeping: AtomicBool,
    stop: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
    table: RwLock<Arc<Vec<Arc<Link>>>>,
    /// The inputs the table has links for, read by the producers.
    linked: LinkedInputs,
    version: AtomicU64,
    next_id: AtomicU64,
    stats: Stats,
    hook: Arc<RwLock<Option<NotifyHook>>>,
    factories: RwLock<HashMap<String, OutputFactory>>,
    capturing: AtomicBool,
    capture: Mutex<Option<Capture>>,
    applied: Mutex<Option<Applied>>,
    cpu_clock: Mutex<Option<libc::clockid_t>>,
    last_error: Mutex<Option<String>>,
    wait: WaitMode,
}

/// The direct path: ring, worker, link table. Dropping it stops the worker.
pub struct DirectPath {
    sh: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

/// The producer side, cheap to clone: what a driver's event callback holds.
#[derive(Clone)]
pub struct Injector {
    sh: Arc<Shared>,
}

impl Injector {
    /// Writes one event into the ring (the interrupt-handler half). Returns
    /// false, counting an overflow, when the ring is full. Wakes the worker
    /// only when it sleeps.
    #[inline]
    pub fn push(&self, input: u32, value: f64, src_ns: u64) -> bool {
        let ev = Event {
            input,
            value,
            src_ns,
            enq_ns: now_ns(),
        };
        self.push_event(ev)
    }

    /// Writes a prepared event (its `enq_ns` as given).
    #[inline]
    pub fn push_event(&self, ev: Event) -> bool {
        let sh = &*self.sh;
        if !sh.linked.may_have(ev.input) {
            // Nothing would fire: the worker is not woken for it (with many
            // polled points and few links, waking it for each value cost
            // more than everything else the gateway did).
            sh.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        sh.stats.pushed.fetch_add(1, Ordering::Relaxed);
        if sh.ring.push(ev).is_err() {
            sh.stats.overflow.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Pairs with the fence in `park`: either the worker sees the event
        // before it sleeps, or we see that it sleeps and wake it.
        fence(Ordering::SeqCst);
        if sh.sleeping.load(Ordering::Relaxed) {
            if let Some(t) = sh.thread.get() {
                t.unpark();
            }
        }
        true
    }
}

impl DirectPath {
    /// Starts the worker with `cfg` (its `links` are not read here: links
    /// name devices, so the device manager resolves them).
    pub fn start(cfg: &DirectPathConfig) -> std::io::Result<DirectPath> {
        if cfg.priority > 99 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("directpath.priority {} is outside 0..=99", cfg.priority),
            ));
        }
        let sh = Arc::new(Shared {
            ring: ArrayQueue::new(cfg.ring_capacity.max(2)),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            table: RwLock::new(Arc::new(Vec::new())),
            linked: LinkedInputs::default(),
            version: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            stats: Stats::default(),
            hook: Arc::new(RwLock::new(None)),
            factories: RwLock::new(HashMap::new()),
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
            applied: Mutex::new(None),
            cpu_clock: Mutex::new(None),
            last_error: Mutex::new(None),
            wait: cfg.wait,
        });
        let w = sh.clone();
        let prio = cfg.priority;
        let worker = std::thread::Builder::new()
            .name("directpath".into())
            .spawn(move || worker(&w, prio))?;
        let _ = sh.thread.set(worker.thread().clone());
        // wait (briefly) until the worker has applied its priority
        let until = now_ns() + 2_000_000_000;
        while sh.applied.lock().is_none() && now_ns() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(DirectPath {
            sh,
            worker: Some(worker),
        })
    }

    /// A producer handle.
    pub fn injector(&self) -> Injector {
        Injector {
            sh: self.sh.clone(),
        }
    }

    /// The ring's capacity.
    pub fn capacity(&self) -> usize {
        self.sh.ring.capacity()
    }

    /// Events waiting in the ring now.
    pub fn queued(&self) -> usize {
        self.sh.ring.len()
    }

    /// How the worker waits.
    pub fn wait_mode(&self) -> WaitMode {
        self.sh.wait
    }

    /// The priority the worker got.
    pub fn applied_priority(&self) -> Option<Applied> {
        *self.sh.applied.lock()
    }

    /// CPU time the worker has used so far (`None` if the kernel did not
    /// give its CPU clock).
    pub fn worker_cpu(&self) -> Option<Duration> {
        let clk = (*self.sh.cpu_clock.lock())?;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: the clock id belongs to the worker thread, which lives as
        // long as `self` (it is joined in drop).
        let r = unsafe { libc::clock_gettime(clk, &mut ts) };
        (r == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// Adds a link; it takes effect at the worker's next event.
    pub fn add_link(
        &self,
        input: u32,
        text: String,
        filters: Vec<Filter>,
        outputs: Vec<Arc<dyn OutputSink>>,
    ) -> LinkId {
        let id = self.sh.next_id.fetch_add(1, Ordering::Relaxed);
        let link = Arc::new(Link {
            id,
            input,
            text,
            filters,
            outputs,
        });
        let mut t = self.sh.table.write();
        let mut next = (**t).clone();
        next.push(link);
        self.sh.linked.set(&next);
        *t = Arc::new(next);
        self.sh.version.fetch_add(1, Ordering::Release);
        id
    }

    /// Removes a link; returns whether it existed.
    pub fn remove_link(&self, id: LinkId) -> bool {
        self.remove_links_where(|l| l.id == id) > 0
    }

    /// Removes every link `pred` selects; returns how many went.
    pub fn remove_links_where(&self, pred: impl Fn(&Link) -> bool) -> usize {
        let mut t = self.sh.table.write();
        let next: Vec<Arc<Link>> = t.iter().filter(|l| !pred(l)).cloned().collect();
        let gone = t.len() - next.len();
        if gone > 0 {
            self.sh.linked.set(&next);
            *t = Arc::new(next);
            self.sh.version.fetch_add(1, Ordering::Release);
        }
        gone
    }

    /// The links now.
    pub fn links(&self) -> Vec<Arc<Link>> {
        self.sh.table.read().iter().cloned().collect()
    }

    /// Sets the hook `notify(NAME)` outputs call.
    pub fn set_notify_hook(&self, hook: NotifyHook) {
        *self.sh.hook.write() = Some(hook);
    }

    /// The shared hook slot (for building `notify` outputs).
    pub fn notify_slot(&self) -> Arc<RwLock<Option<NotifyHook>>> {
        self.sh.hook.clone()
    }

    /// Registers an output kind (`mqtt`, ...) for `KIND(ARG)` outputs.
    pub fn register_output_kind(&self, kind: &str, factory: OutputFactory) {
        self.sh
            .factories
            .write()
            .insert(kind.to_ascii_lowercase(), factory);
    }

    /// Builds a `KIND(ARG)` output through its registered factory.
    pub fn custom_output(&self, kind: &str, arg: &str) -> Result<Arc<dyn OutputSink>, String> {
        let f = self
            .sh
            .factories
            .read()
            .get(kind)
            .cloned()
            .ok_or_else(|| {
                let known: Vec<String> = self.sh.factories.read().keys().cloned().collect();
                format!(
                    "no output kind `{kind}` is registered (built in: actuator, notify, log; registered: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )
            })?;
        f(arg)
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.sh.stats
    }

    /// A snapshot of the counters and latency quantiles.
    pub fn snapshot(&self) -> StatsSnapshot {
        let s = &self.sh.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            pushed: l(&s.pushed),
            overflow: l(&s.overflow),
            processed: l(&s.processed),
            unlinked: l(&s.unlinked) + l(&s.skipped),
            passed: l(&s.passed),
            filtered: l(&s.filtered),
            fired: l(&s.fired),
            output_errors: l(&s.output_errors),
            parks: l(&s.parks),
            worker_p50_ns: s.worker_ns.quantile(0.5),
            worker_p99_ns: s.worker_ns.quantile(0.99),
            e2e_p50_ns: s.e2e_ns.quantile(0.5),
            e2e_p99_ns: s.e2e_ns.quantile(0.99),
            e2e_max_ns: s.e2e_ns.max(),
        }
    }

    /// The last output error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.sh.last_error.lock().clone()
    }

    /// Starts recording the exact latency of the next `n` events.
    pub fn start_capture(&self, n: usize) {
        *self.sh.capture.lock() = Some(Capture {
            worker: Vec::with_capacity(n),
            e2e: Vec::with_capacity(n),
            cap: n,
        });
        self.sh.capturing.store(true, Ordering::Release);
    }

    /// Stops recording; returns (worker ns, end-to-end ns) per event.
    pub fn take_capture(&self) -> (Vec<u32>, Vec<u32>) {
        self.sh.capturing.store(false, Ordering::Release);
        match self.sh.capture.lock().take() {
            Some(c) => (c.worker, c.e2e),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// Waits (at most `limit`) until the ring is empty and the worker has
    /// processed every event pushed before the call.
    pub fn drain(&self, limit: Duration) -> bool {
        let until = now_ns() + limit.as_nanos() as u64;
        let s = &self.sh.stats;
        loop {
            let accepted = s.pushed.load(Ordering::Acquire) - s.overflow.load(Ordering::Acquire);
            if s.processed.load(Ordering::Acquire) >= accepted {
                return true;
            }
            if now_ns() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for DirectPath {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.worker.take() {
            w.thread().unpark();
            let _ = w.join();
        }
    }
}

/// The worker's own view of the link table, with the filters' state.
#[derive(Default)]
struct Runtime {
    links: Vec<(Arc<Link>, Vec<FilterState>)>,
    by_input: Vec<Vec<usize>>,
}

impl Runtime {
    /// Rebuilds from `table`, keeping the filter state of links that stay.
    fn rebuild(&mut self, table: &[Arc<Link>]) {
        let mut old: HashMap<LinkId, Vec<FilterState>> =
            self.links.drain(..).map(|(l, st)| (l.id, st)).collect();
        self.by_input.clear();
        for l in table {
            let st = old
                .remove(&l.id)
                .unwrap_or_else(|| vec![FilterState::default(); l.filters.len()]);
            let i = l.input as usize;
            if self.by_input.len() <= i {
                self.by_input.resize_with(i + 1, Vec::new);
            }
            self.by_input[i].push(self.links.len());
            self.links.push((l.clone(), st));
        }
    }

    #[inline]
    fn process(&mut self, ev: &Event, sh: &Shared) {
        let s = &sh.stats;
        let Some(idx) = self
            .by_input
            .get(ev.input as usize)
            .filter(|v| !v.is_empty())
        else {
            bump(&s.unlinked);
            return;
        };
        'links: for &i in idx {
            let (link, states) = &mut self.links[i];
            let mut v = ev.value;
            for (f, st) in link.filters.iter().zip(states.iter_mut()) {
                match f.apply(st, v, ev) {
                    Some(nv) => v = nv,
                    None => {
                        bump(&s.filtered);
                        continue 'links;
                    }
                }
            }
            bump(&s.passed);
            for o in &link.outputs {
                match o.fire(v, ev) {
                    Ok(()) => bump(&s.fired),
                    Err(e) => {
                        bump(&s.output_errors);
                        if let Some(mut g) = sh.last_error.try_lock() {
                            *g = Some(format!("{}: {e}", o.describe()));
                        }
                    }
                }
            }
        }
    }
}

/// Adds one to a counter only the worker writes (no read-modify-write).
/// Which inputs have links: one bit per input below [`LinkedInputs::BITS`];
/// inputs above it always count as linked (their events go to the worker,
/// which knows). Rewritten whole, word by word, under the table's write
/// lock; a word's store is atomic, so an input whose links stay never
/// reads as unlinked while another changes.
struct LinkedInputs {
    words: Box<[AtomicU64]>,
}

impl Default for LinkedInputs {
    fn default() -> Self {
        LinkedInputs {
            words: (0..Self::BITS / 64).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl LinkedInputs {
    const BITS: u32 = 4096;

    fn may_have(&self, input: u32) -> bool {
        input >= Self::BITS
            || self.words[(input / 64) as usize].load(Ordering::Acquire) & (1 << (input % 64)) != 0
    }

    fn set(&self, table: &[Arc<Link>]) {
        let mut next = vec![0u64; self.words.len()];
        for l in table.iter().filter(|l| l.input < Self::BITS) {
            next[(l.input / 64) as usize] |= 1 << (l.input % 64);
        }
        for (w, n) in self.words.iter().zip(next) {
            w.store(n, Ordering::Release);
        }
    }
}

#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

fn worker(sh: &Shared, prio: u8) {
    let applied = if prio == 0 {
        priority::current_thread_priority()
    } else {
        priority::set_current_thread_priority(Priority::Realtime(prio))
    };
    // Timed sleeps (predict mode) end when asked, not up to 50 us later.
    // SAFETY: prctl on the calling thread with a plain integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let mut clk: libc::clockid_t = 0;
    // SAFETY: asks for the calling thread's CPU clock into a local.
    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clk) } == 0 {
        *sh.cpu_clock.lock() = Some(clk);
    }
    tracing::debug!(?applied, wait = %sh.wait, "direct path worker started");
    *sh.applied.lock() = Some(applied);
    let mut rt = Runtime::default();
    let mut version = u64::MAX;
    let mut idle_since: Option<u64> = None;
    let mut arrivals = Arrivals::default();
    let s = &sh.stats;
    loop {
        if let Some(ev) = sh.ring.pop() {
            // The worker's part starts with the event in hand, as the
            // paper's kernel-side timing started inside the work item: the
            // hand-off (pop included) is in the end-to-end figure.
            let t0 = now_ns();
            // Checked after the pop: a link added before an event was
            // pushed is seen by that event (the push publishes the version).
            let v = sh.version.load(Ordering::Acquire);
            if v != version {
                let table = sh.table.read().clone();
                rt.rebuild(&table);
                version = v;
            }
            rt.process(&ev, sh);
            let t1 = now_ns();
            // one writer: a plain release store, read by `drain`
            s.processed
                .store(s.processed.load(Ordering::Relaxed) + 1, Ordering::Release);
            let (w, e) = (t1.saturating_sub(t0), t1.saturating_sub(ev.enq_ns));
            s.worker_ns.record(w);
            s.e2e_ns.record(e);
            s.source_ns.record(t1.saturating_sub(ev.src_ns));
            if sh.capturing.load(Ordering::Relaxed) {
                if let Some(mut g) = sh.capture.try_lock() {
                    if let Some(c) = g.as_mut().filter(|c| c.worker.len() < c.cap) {
                        c.worker.push(w.min(u32::MAX as u64) as u32);
                        c.e2e.push(e.min(u32::MAX as u64) as u32);
                    }
                }
            }
            arrivals.saw(ev.enq_ns);
            idle_since = None;
            continue;
        }
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        match sh.wait {
            WaitMode::Spin => std::hint::spin_loop(),
            WaitMode::Park => park(sh, None),
            WaitMode::SpinThenPark(d) => {
                let now = now_ns();
                let since = *idle_since.get_or_insert(now);
                if now.saturating_sub(since) >= d.as_nanos() as u64 {
                    park(sh, None);
                    idle_since = None;
                } else {
                    std::hint::spin_loop();
                }
            }
            WaitMode::Predict(margin) => {
                let m = margin.as_nanos() as u64;
                match arrivals.next() {
                    Some(next) => {
                        let now = now_ns();
                        if now + m < next {
                            // asleep until just before the expected event
                            // (a producer still wakes us earlier)
                            park(sh, Some(Duration::from_nanos(next - m - now)));
                        } else if now < next + 2 * m {
                            std::hint::spin_loop();
                        } else {
                            // late: sleep until an event wakes us
                            park(sh, None);
                            arrivals.missed();
                        }
                    }
                    None => park(sh, None),
                }
            }
        }
    }
}

/// The worker's estimate of when the next event comes (predict mode): an
/// average of the gaps between arrivals, forgotten after a miss or a gap
/// over 100 ms.
#[derive(Default)]
struct Arrivals {
    last: Option<u64>,
    gap: Option<u64>,
}

impl Arrivals {
    fn saw(&mut self, t: u64) {
        if let Some(l) = self.last {
            let g = t.saturating_sub(l);
            self.gap = if g > 100_000_000 {
                None
            } else {
                Some(match self.gap {
                    None => g,
                    Some(a) => a - a / 8 + g / 8,
                })
            };
        }
        self.last = Some(t);
    }

    fn next(&self) -> Option<u64> {
        Some(self.last? + self.gap?)
    }

    fn missed(&mut self) {
        self.last = None;
    }
}

/// Sleeps until a producer wakes us, `for_at_most` passes, or 100 ms
/// pass (a safety net).
fn park(sh: &Shared, for_at_most: Option<Duration>) {
    sh.sleeping.store(true, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    if sh.ring.is_empty() && !sh.stop.load(Ordering::Relaxed) {
        bump(&sh.stats.parks);
        let d = for_at_most.map_or(Duration::from_millis(100), |d| {
            d.min(Duration::from_millis(100))
        });
        std::thread::park_timeout(d);
    }
    sh.sleeping.store(false, Ordering::Relaxed);
}

#[cfg(test)]
mod tests;
