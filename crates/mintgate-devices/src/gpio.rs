//! Linux GPIO character devices (`/dev/gpiochipN`) through `gpiocdev`,
//! uAPI v2.
//!
//! - [`GpioIn`]: an input line with edge detection on both edges; once
//!   started, a thread waits for edge events and delivers 1 (rising) or 0
//!   (falling) with the kernel's `CLOCK_MONOTONIC` timestamp of the edge,
//!   the clock [`crate::clock::now_ns`] reads, so edge-to-output latency
//!   can be measured from the interrupt on.
//! - [`GpioOut`]: an output line; writing 0 sets it inactive, anything else
//!   active.
//!
//! A chip is named by its path (`/dev/gpiochip0`), its device name
//! (`gpiochip0`) or its label (as gpio-sim and most drivers set one); a
//! line by its offset or its name.

use std::path::PathBuf;
use std::time::Duration;

use gpiocdev::line::{EdgeDetection, EdgeKind, EventClock, Value};
use gpiocdev::Request;

use crate::driver::{DeviceError, Direction, Driver, EventFn, Running};

/// A line: its offset or its name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum LineRef {
    /// The offset on the chip.
    Offset(u32),
    /// The line's name (looked up on the chip, or on every chip when no chip is given).
    Name(String),
}

fn gpio_err(what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::Gpio(format!("{what}: {e}"))
}

/// Finds the chip path and line offset (the finder's GPIO part).
pub fn resolve(chip: Option<&str>, line: &LineRef) -> Result<(PathBuf, u32), DeviceError> {
    let chip_path = match chip {
        None => None,
        Some(c) if c.starts_with('/') => Some(PathBuf::from(c)),
        Some(c) => {
            let dev = PathBuf::from("/dev").join(c);
            if dev.exists() {
                Some(dev)
            } else {
                let chips =
                    gpiocdev::chip::chips().map_err(|e| gpio_err("listing GPIO chips", e))?;
                let found = chips.into_iter().find(|p| {
                    gpiocdev::Chip::from_path(p)
                        .and_then(|ch| ch.info())
                        .is_ok_and(|i| i.label == c || i.name == c)
                });
                Some(found.ok_or_else(|| {
                    DeviceError::Gpio(format!("no GPIO chip named or labelled `{c}`"))
                })?)
            }
        }
    };
    match (chip_path, line) {
        (Some(p), LineRef::Offset(o)) => Ok((p, *o)),
        (Some(p), LineRef::Name(n)) => {
            let ch = gpiocdev::Chip::from_path(&p).map_err(|e| gpio_err("opening the chip", e))?;
            let info = ch.find_line_info(n).ok_or_else(|| {
                DeviceError::Gpio(format!("no line named `{n}` on {}", p.display()))
            })?;
            Ok((p, info.offset))
        }
        (None, LineRef::Name(n)) => gpiocdev::find_named_line(n)
            .map(|f| (f.chip, f.info.offset))
            .ok_or_else(|| DeviceError::Gpio(format!("no GPIO line named `{n}`"))),
        (None, LineRef::Offset(o)) => Err(DeviceError::Gpio(format!(
            "line {o} needs a chip (a path, gpiochipN or a label)"
        ))),
    }
}

/// An input line with edge events.
pub struct GpioIn {
    req: std::sync::Arc<Request>,
    offset: u32,
}

impl GpioIn {
    /// Requests `offset` on `chip` as an input with both-edge detection,
    /// timestamps on `CLOCK_MONOTONIC`, and an optional debounce period.
    pub fn open(
        chip: &std::path::Path,
        offset: u32,
        debounce: Option<Duration>,
    ) -> Result<GpioIn, DeviceError> {
        let mut b = Request::builder();
        b.on_chip(chip)
            .with_consumer("mintgate")
            .with_line(offset)
            .as_input()
            .with_edge_detection(EdgeDetection::BothEdges)
            .with_event_clock(EventClock::Monotonic);
        if let Some(d) = debounce {
            b.with_debounce_period(d);
        }
        let req = b.request().map_err(|e| {
            gpio_err(
                &format!("requesting {}:{offset} as input", chip.display()),
                e,
            )
        })?;
        Ok(GpioIn {
            req: std::sync::Arc::new(req),
            offset,
        })
    }
}

fn level(v: Value) -> f64 {
    match v {
        Value::Active => 1.0,
        Value::Inactive => 0.0,
    }
}

impl Driver for GpioIn {
    fn kind(&self) -> &'static str {
        "gpio-in"
    }

    fn direction(&self) -> Direction {
        Direction::Sensor
    }

    fn read(&self) -> Result<f64, DeviceError> {
        self.req
            .value(self.offset)
            .map(level)
            .map_err(|e| gpio_err("reading the line", e))
    }

    fn start(&self, events: EventFn) -> Result<Option<Running>, DeviceError> {
        let req = self.req.clone();
        Running::spawn("gpio-edges", move |stop| {
            // the interrupt side: above normal threads where permitted
            let applied = mintgate_sched::priority::set_current_thread_priority(
                mintgate_sched::priority::Priority::Realtime(60),
            );
            tracing::debug!(?applied, "GPIO edge thread started");
            let mut failures = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match req.wait_edge_event(Duration::from_millis(50)) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(e) => {
                        failures += 1;
                        if failures == 1 {
                            tracing::warn!(error = %e, "waiting for GPIO edge events failed");
                        }
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                }
                match req.read_edge_event() {
                    Ok(ev) => {
                        let v = if ev.kind == EdgeKind::Rising {
                            1.0
                        } else {
                            0.0
                        };
                        events(v, ev.timestamp_ns);
                    }
                    Err(e) => tracing::warn!(error = %e, "reading a GPIO edge event failed"),
                }
            }
        })
        .map(Some)
    }
}

/// An output line.
pub struct GpioOut {
    req: Request,
    offset: u32,
    last: std::sync::atomic::AtomicU64,
}

impl GpioOut {
    /// Requests `offset` on `chip` as an output, initially inactive.
    pub fn open(chip: &std::path::Path, offset: u32) -> Result<GpioOut, DeviceError> {
        let req = Request::builder()
            .on_chip(chip)
            .with_consumer("mintgate")
            .with_line(offset)
            .as_output(Value::Inactive)
            .request()
            .map_err(|e| {
                gpio_err(
                    &format!("requesting {}:{offset} as output", chip.display()),
                    e,
                )
            })?;
        Ok(GpioOut {
            req,
            offset,
            last: Default::default(),
        })
    }
}

impl Driver for GpioOut {
    fn kind(&self) -> &'static str {
        "gpio-out"
    }

    fn direction(&self) -> Direction {
        Direction::Actuator
    }

    fn read(&self) -> Result<f64, DeviceError> {
        Ok(f64::from_bits(
            self.last.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }

    fn write(&self, value: f64) -> Result<(), DeviceError> {
        let v = if value == 0.0 {
            Value::Inactive
        } else {
            Value::Active
        };
        self.req
            .set_value(self.offset, v)
            .map_err(|e| gpio_err("setting the line", e))?;
        self.last
            .store(level(v).to_bits(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Why GPIO tests cannot run here, or `None` when gpio-sim is usable
/// (configfs mounted with the gpio-sim directory, as root).
pub fn gpio_sim_unavailable() -> Option<String> {
    let cfg = std::path::Path::new("/sys/kernel/config/gpio-sim");
    if !std::path::Path::new("/sys/kernel/config").exists() {
        return Some("configfs is not mounted at /sys/kernel/config (the kernel may lack CONFIG_CONFIGFS_FS)".into());
    }
    if !cfg.exists() {
        return Some("/sys/kernel/config/gpio-sim is missing (the kernel lacks CONFIG_GPIO_SIM or the module is not loaded)".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("gpio-sim needs root to create simulated chips".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_errors_are_clear() {
        let e = resolve(None, &LineRef::Offset(3)).unwrap_err().to_string();
        assert!(e.contains("needs a chip"), "{e}");
        let e = resolve(Some("no-such-chip-label"), &LineRef::Offset(0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no-such-chip-label") || e.contains("chips"),
            "{e}"
        );
        let e = GpioIn::open(std::path::Path::new("/dev/null-gpiochip"), 0, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("requesting /dev/null-gpiochip:0 as input"),
            "{e}"
        );
    }
}
