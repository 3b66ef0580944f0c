//! The driver trait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Where a driver delivers what it senses: the value and the instant it was
/// taken, in [`crate::clock::now_ns`] nanoseconds (for a GPIO edge, the
/// kernel's timestamp). Called on the driver's own thread; it must not block
/// for long.
pub type EventFn = Arc<dyn Fn(f64, u64) + Send + Sync>;

/// Whether a device senses or acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Produces values (read, and events when started).
    Sensor,
    /// Takes values (written; reading gives the last value written).
    Actuator,
}

/// What can go wrong with a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// An I/O error from the device file.
    #[error("{what}: {cause}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The cause (in the message, not a separate source: a chain of
        /// errors would say it twice).
        cause: std::io::Error,
    },
    /// The device file did not hold a number.
    #[error("{path}: `{text}` is not a number")]
    NotANumber {
        /// The file.
        path: String,
        /// What it held (truncated).
        text: String,
    },
    /// A sensor was written to.
    #[error("the device is a sensor and cannot be written")]
    NotWritable,
    /// A GPIO operation failed.
    #[error("gpio: {0}")]
    Gpio(String),
    /// The device declaration is wrong or incomplete.
    #[error("device `{name}`: {why}")]
    Config {
        /// The device.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// No device with that name.
    #[error("no device named `{0}`")]
    NotFound(String),
    /// A device with that name already exists.
    #[error("a device named `{0}` already exists")]
    Exists(String),
    /// A field device (Modbus) did not answer, or answered with an error.
    #[error("{0}")]
    Field(String),
}

/// The state of the connection behind a field device's point, for the
/// dashboard and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkState {
    /// The connection's name (the `[[devices.list]]` entry).
    pub connection: String,
    /// Where it goes (`host:port`).
    pub endpoint: String,
    /// Whether it is connected now.
    pub connected: bool,
    /// Read requests made.
    pub polls: u64,
    /// Write requests made.
    pub writes: u64,
    /// Requests that failed after their retries, exception responses
    /// among them.
    pub errors: u64,
    /// Connection attempts.
    pub connects: u64,
    /// Polls skipped because the one before took longer than a period.
    pub skipped: u64,
    /// How late polls started after they were due: median, 99th
    /// percentile and most, in ns (log-linear buckets, 12.5 % wide).
    pub late_p50_ns: u64,
    /// See `late_p50_ns`.
    pub late_p99_ns: u64,
    /// See `late_p50_ns`.
    pub late_max_ns: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// A device driver. Implementations are shared between threads: reads and
/// writes may come from CoAP handlers, the direct path worker and the
/// driver's own event thread at once.
pub trait Driver: Send + Sync + 'static {
    /// A short name of the driver (`sim-sensor`, `attr`, `gpio-in`, ...).
    fn kind(&self) -> &'static str;
    /// Sensor or actuator.
    fn direction(&self) -> Direction;
    /// The current value (an actuator gives the last value written).
    fn read(&self) -> Result<f64, DeviceError>;
    /// Sets an actuator.
    fn write(&self, _value: f64) -> Result<(), DeviceError> {
        Err(DeviceError::NotWritable)
    }
    /// Sets an actuator from the direct path's worker, which must not wait
    /// on a remote device: a driver whose `write` waits for a device's
    /// answer (Modbus) queues the write here and returns, counting a
    /// failure in its own state. The default is `write`.
    fn submit(&self, value: f64) -> Result<(), DeviceError> {
        self.write(value)
    }
    /// Starts delivering values to `events` (sampling ticks, edges). The
    /// returned guard stops the delivery when dropped; `None` means the
    /// driver produces no events of its own.
    fn start(&self, _events: EventFn) -> Result<Option<Running>, DeviceError> {
        Ok(None)
    }
    /// The connection behind the device, for a field device.
    fn link(&self) -> Option<LinkState> {
        None
    }
}

/// A driver's event thread, or its task on a shared thread; dropping it
/// stops the thread (or the task) and waits for it.
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Running {
    /// Spawns `body` on a thread named `name`; `body` must return soon after
    /// the flag it is given turns true (it is checked by the body, so the
    /// body's longest wait bounds how long dropping takes).
    pub fn spawn(
        name: &str,
        body: impl FnOnce(Arc<AtomicBool>) + Send + 'static,
    ) -> Result<Running, DeviceError> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || body(s))
            .map_err(|source| DeviceError::Io {
                what: format!("starting thread {name}"),
                cause: source,
            })?;
        Ok(Running {
            stop,
            thread: Some(thread),
            on_drop: None,
        })
    }

    /// A guard that calls `stop` when dropped (a task on a shared thread,
    /// such as [`crate::ticker::every`]); `stop` must return only once the
    /// task can no longer be called.
    pub fn on_drop(stop: impl FnOnce() + Send + Sync + 'static) -> Running {
        Running {
            stop: Arc::default(),
            thread: None,
            on_drop: Some(Box::new(stop)),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

/// Waits until `deadline` (ns on the monotonic clock) or until `stop` turns
/// true, in slices of at most 50 ms; returns false when stopped.
pub(crate) fn sleep_until(deadline: u64, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = crate::clock::now_ns();
        if now >= deadline {
            return true;
        }
        let left = (deadline - now).min(50_000_000);
        std::thread::park_timeout(std::time::Duration::from_nanos(left));
    }
}
