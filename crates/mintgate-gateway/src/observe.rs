//! Observe (RFC 7641) in the gateway: the registry of observers (from
//! `mintgate_coap::server::observe`), the set of resources changed since
//! the notifier thread last ran, and the [`Notifier`] handle that devices
//! and the direct path use to say "this resource changed".
//!
//! [`Notifier::notify`] never sends: it marks the path and wakes the
//! `coap-notify` thread, so it is cheap enough for a driver thread or the
//! direct path's worker. That thread renders each changed resource once
//! per observer through its GET handler and sends the notifications (see
//! `pipeline::notify_path`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use mintgate_coap::server::observe::{ObserveConfig, Registry};
use parking_lot::{Condvar, Mutex};

/// Observe counters.
#[derive(Debug, Default)]
pub struct ObserveCounters {
    /// Registrations accepted (re-registrations included).
    pub registered: AtomicU64,
    /// Registrations refused because the registry was full.
    pub refused: AtomicU64,
    /// Observers removed (Observe: 1, Reset, unacknowledged CON, error).
    pub removed: AtomicU64,
    /// Notifications sent (first transmissions).
    pub notifications: AtomicU64,
    /// Of which confirmable.
    pub confirmable: AtomicU64,
}

/// What the pipeline shares about Observe.
pub struct ObserveState {
    /// The observers.
    pub registry: Mutex<Registry>,
    dirty: Mutex<BTreeSet<String>>,
    wake: Condvar,
    /// Counters.
    pub counters: ObserveCounters,
}

impl ObserveState {
    /// An empty state.
    pub fn new(cfg: ObserveConfig) -> ObserveState {
        ObserveState {
            registry: Mutex::new(Registry::new(cfg)),
            dirty: Mutex::new(BTreeSet::new()),
            wake: Condvar::new(),
            counters: ObserveCounters::default(),
        }
    }

    /// Marks `path` (without leading `/`) changed and wakes the notifier.
    pub fn mark(&self, path: &str) {
        let path = path.trim_start_matches('/');
        let mut d = self.dirty.lock();
        if !d.contains(path) {
            d.insert(path.to_string());
        }
        drop(d);
        self.wake.notify_one();
    }

    /// Waits at most `limit` for changed paths; returns and clears them.
    pub fn take_dirty(&self, limit: Duration) -> Vec<String> {
        let mut d = self.dirty.lock();
        if d.is_empty() {
            self.wake.wait_for(&mut d, limit);
        }
        std::mem::take(&mut *d).into_iter().collect()
    }

    /// Observers registered now.
    pub fn observers(&self) -> usize {
        self.registry.lock().len()
    }
}

/// A cloneable handle that tells the gateway a resource changed, so that
/// its observers are notified.
#[derive(Clone)]
pub struct Notifier {
    pub(crate) state: Arc<ObserveState>,
}

impl Notifier {
    /// `path` (e.g. `sensors/temp0`, leading `/` optional) has a new
    /// representation. Cheap and non-blocking apart from a short lock.
    pub fn notify(&self, path: &str) {
        self.state.mark(path);
    }

    /// Observers registered now, in all.
    pub fn observers(&self) -> usize {
        self.state.observers()
    }

    /// The Observe counters.
    pub fn counters(&self) -> &ObserveCounters {
        &self.state.counters
    }

    /// Adds one removal to the counters (used by the pipeline).
    pub(crate) fn count_removed(state: &ObserveState, n: usize) {
        state.counters.removed.fetch_add(n as u64, Relaxed);
    }
}

/// The Observe counters in the Prometheus text format.
pub(crate) fn render_metrics(o: &ObserveState, out: &mut String) {
    use std::fmt::Write as _;
    let c = &o.counters;
    for (name, help, v) in [
        (
            "mintgate_observe_observers",
            "Observe registrations now (RFC 7641).",
            o.observers() as u64,
        ),
        (
            "mintgate_observe_registered_total",
            "Observe registrations accepted.",
            c.registered.load(Relaxed),
        ),
        (
            "mintgate_observe_refused_total",
            "Observe registrations refused (registry full).",
            c.refused.load(Relaxed),
        ),
        (
            "mintgate_observe_removed_total",
            "Observers removed (Observe: 1, Reset, unacknowledged CON, error).",
            c.removed.load(Relaxed),
        ),
        (
            "mintgate_observe_notifications_total",
            "Notifications sent (first transmissions).",
            c.notifications.load(Relaxed),
        ),
        (
            "mintgate_observe_confirmable_total",
            "Confirmable notifications sent.",
            c.confirmable.load(Relaxed),
        ),
    ] {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    }
}
