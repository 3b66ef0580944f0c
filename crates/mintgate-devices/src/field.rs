//! What the field-device drivers (Modbus, OPC UA) share: the counters of a
//! connection that the dashboard and `/metrics` show, a point's latest
//! value and the hook its events go to, and the hand-off of a write from
//! the caller's thread to the connection's thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::driver::{DeviceError, EventFn, LinkState};

/// The counters of one connection.
#[derive(Default)]
pub(crate) struct Counters {
    pub connected: AtomicBool,
    /// Read requests (Modbus) or data change notifications (OPC UA).
    pub polls: AtomicU64,
    pub writes: AtomicU64,
    pub errors: AtomicU64,
    pub connects: AtomicU64,
    pub skipped: AtomicU64,
    /// How late each poll started after it was due (the connection's
    /// thread is its only writer).
    pub lateness: crate::directpath::histogram::Histogram,
    pub last_error: Mutex<Option<String>>,
}

impl Counters {
    /// Counts an error and keeps it as the last one; logs it when it
    /// differs from the one before (a dead device logs once, not at every
    /// attempt).
    pub fn fail(&self, kind: &str, device: &str, endpoint: &str, why: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_error.lock();
        if last.as_deref() != Some(why) {
            tracing::warn!(device, endpoint, error = why, "{kind} request failed");
        }
        *last = Some(why.to_string());
    }

    /// The state for the dashboard and `/metrics`.
    pub fn state(&self, connection: &str, endpoint: &str) -> LinkState {
        LinkState {
            connection: connection.to_string(),
            endpoint: endpoint.to_string(),
            connected: self.connected.load(Ordering::Relaxed),
            polls: self.polls.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            connects: self.connects.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            late_p50_ns: self.lateness.quantile(0.5),
            late_p99_ns: self.lateness.quantile(0.99),
            late_max_ns: self.lateness.max(),
            last_error: self.last_error.lock().clone(),
        }
    }

    /// What a read of a point without a value says.
    pub fn no_value(&self) -> DeviceError {
        DeviceError::Field(match self.last_error.lock().clone() {
            Some(e) => format!("no value: {e}"),
            None => "no value read yet".into(),
        })
    }
}

/// A point's latest value and where its events go.
pub(crate) struct Cell {
    /// The value last read or written, as f64 bits; NaN: none (never read,
    /// or its last read failed).
    value: AtomicU64,
    events: RwLock<Option<EventFn>>,
}

impl Default for Cell {
    fn default() -> Cell {
        Cell {
            value: AtomicU64::new(f64::NAN.to_bits()),
            events: RwLock::new(None),
        }
    }
}

impl Cell {
    /// The value, if there is one.
    pub fn get(&self) -> Option<f64> {
        Some(f64::from_bits(self.value.load(Ordering::Relaxed))).filter(|v| !v.is_nan())
    }

    /// Keeps `v` without an event (a value written).
    pub fn set(&self, v: f64) {
        self.value.store(v.to_bits(), Ordering::Relaxed);
    }

    /// No value any more.
    pub fn clear(&self) {
        self.value.store(f64::NAN.to_bits(), Ordering::Relaxed);
    }

    /// Keeps `v`, read at `t` (ns, [`crate::clock::now_ns`]), and hands it
    /// to the event hook; a value that is not finite clears the cell.
    pub fn publish(&self, v: f64, t: u64) {
        if !v.is_finite() {
            self.clear();
            return;
        }
        self.set(v);
        if let Some(ev) = self.events.read().as_ref() {
            ev(v, t);
        }
    }

    /// Where its events go from now on.
    pub fn hook(&self, events: EventFn) {
        *self.events.write() = Some(events);
    }
}

/// A write handed to a connection's thread, with where its result goes.
pub(crate) struct Write<Op> {
    pub op: Op,
    pub reply: std::sync::mpsc::SyncSender<Result<(), String>>,
}

/// Writes queued for one connection beyond which a write is refused at once.
pub(crate) const WRITE_QUEUE: usize = 64;

/// Queues `op` on `queue`; the receiver of its result.
pub(crate) fn queue<Op>(
    queue: &tokio::sync::mpsc::Sender<Write<Op>>,
    op: Op,
) -> Result<std::sync::mpsc::Receiver<Result<(), String>>, DeviceError> {
    let (reply, answer) = std::sync::mpsc::sync_channel(1);
    queue
        .try_send(Write { op, reply })
        .map_err(|_| DeviceError::Field("too many writes queued for the device".into()))?;
    Ok(answer)
}

/// Waits at most `wait` for a queued write's result.
pub(crate) fn wait(
    answer: std::sync::mpsc::Receiver<Result<(), String>>,
    wait: Duration,
) -> Result<(), DeviceError> {
    match answer.recv_timeout(wait) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(DeviceError::Field(e)),
        Err(_) => Err(DeviceError::Field(format!("no result within {wait:?}"))),
    }
}
