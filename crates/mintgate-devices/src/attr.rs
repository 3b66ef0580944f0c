//! Sysfs-style attribute files: one number in a text file, as
//! `/sys/class/gpio/gpioN/value` holds `0` or `1`.
//!
//! Two ways to access them, the two user-space paths of paper 001's Fig. 3:
//! - [`AttrMode::Reopen`]: every read is open/read/close and every write
//!   open/write/close (what a simple user API does per call);
//! - [`AttrMode::KeepOpen`]: the file is opened once, reads are `pread` at
//!   offset 0 and writes `pwrite` at offset 0 (the optimized user path).
//!
//! Values are written as text followed by a newline; integral values
//! without a fraction (`1`, not `1.0`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::clock::now_ns;
use crate::driver::{sleep_until, DeviceError, Direction, Driver, EventFn, Running};

/// How the file is accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrMode {
    /// open/read/close and open/write/close per access.
    Reopen,
    /// Opened once; `pread`/`pwrite` per access.
    KeepOpen,
}

/// An attribute file as a sensor or an actuator.
pub struct AttrFile {
    path: PathBuf,
    direction: Direction,
    file: Option<File>,
    /// Length of the last text written through the open file, to cut off
    /// what a shorter value would leave behind in a regular file.
    last_len: AtomicUsize,
    poll: Option<Duration>,
}

fn io(what: &str, path: &Path, source: std::io::Error) -> DeviceError {
    DeviceError::Io {
        what: format!("{what} {}", path.display()),
        cause: source,
    }
}

/// Formats `v` as the file holds it; returns the length used in `buf`.
pub fn format_value(v: f64, buf: &mut [u8; 40]) -> usize {
    let mut c = std::io::Cursor::new(&mut buf[..]);
    // `{v:?}`, not `{v}`: Display writes 1e300 or 1e-300 out in full,
    // which does not fit the buffer and was cut off; Debug switches to
    // exponent notation (at most 24 bytes) and reads back exactly.
    let _ = if v.fract() == 0.0 && v.abs() < 1e15 {
        writeln!(c, "{}", v as i64)
    } else {
        writeln!(c, "{v:?}")
    };
    c.position() as usize
}

/// Parses what an attribute file holds.
pub fn parse_value(bytes: &[u8], path: &Path) -> Result<f64, DeviceError> {
    let text = std::str::from_utf8(bytes).unwrap_or("").trim();
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| DeviceError::NotANumber {
            path: path.display().to_string(),
            text: text.chars().take(32).collect(),
        })
}

impl AttrFile {
    /// An attribute file at `path`. With [`AttrMode::KeepOpen`] the file is
    /// opened now (read-only for a sensor, read-write for an actuator), so a
    /// missing file is reported here. A sensor with `poll` is read every
    /// `poll` once started and delivers each value that changed.
    pub fn open(
        path: impl Into<PathBuf>,
        direction: Direction,
        mode: AttrMode,
        poll: Option<Duration>,
    ) -> Result<AttrFile, DeviceError> {
        let path = path.into();
        let file = match mode {
            AttrMode::Reopen => {
                std::fs::metadata(&path).map_err(|e| io("opening", &path, e))?;
                None
            }
            AttrMode::KeepOpen => Some(
                OpenOptions::new()
                    .read(true)
                    .write(direction == Direction::Actuator)
                    .open(&path)
                    .map_err(|e| io("opening", &path, e))?,
            ),
        };
        Ok(AttrFile {
            path,
            direction,
            file,
            last_len: AtomicUsize::new(0),
            poll,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the file is accessed.
    pub fn mode(&self) -> AttrMode {
        if self.file.is_some() {
            AttrMode::KeepOpen
        } else {
            AttrMode::Reopen
        }
    }

    fn read_now(&self) -> Result<f64, DeviceError> {
        let mut buf = [0u8; 64];
        let n = match &self.file {
            Some(f) => f.read_at(&mut buf, 0),
            None => File::open(&self.path).and_then(|mut f| f.read(&mut buf)),
        }
        .map_err(|e| io("reading", &self.path, e))?;
        parse_value(&buf[..n], &self.path)
    }

    fn write_now(&self, v: f64) -> Result<(), DeviceError> {
        let mut buf = [0u8; 40];
        let n = format_value(v, &mut buf);
        match &self.file {
            Some(f) => {
                f.write_at(&buf[..n], 0)
                    .map_err(|e| io("writing", &self.path, e))?;
                // a regular file keeps the tail of a longer earlier value
                if self.last_len.swap(n, Ordering::Relaxed) > n {
                    let _ = f.set_len(n as u64);
                }
                Ok(())
            }
            None => OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&self.path)
                .and_then(|mut f| f.write_all(&buf[..n]))
                .map_err(|e| io("writing", &self.path, e)),
        }
    }
}

impl Driver for AttrFile {
    fn kind(&self) -> &'static str {
        "attr"
    }

    fn direction(&self) -> Direction {
        self.direction
    }

    fn read(&self) -> Result<f64, DeviceError> {
        self.read_now()
    }

    fn write(&self, value: f64) -> Result<(), DeviceError> {
        if self.direction == Direction::Sensor {
            return Err(DeviceError::NotWritable);
        }
        self.write_now(value)
    }

    fn start(&self, events: EventFn) -> Result<Option<Running>, DeviceError> {
        let (Some(poll), Direction::Sensor) = (self.poll, self.direction) else {
            return Ok(None);
        };
        // the poller uses its own handle, in the same mode
        let me = AttrFile::open(self.path.clone(), self.direction, self.mode(), None)?;
        let period = poll.max(Duration::from_micros(100)).as_nanos() as u64;
        Running::spawn("attr-poll", move |stop| {
            let mut last: Option<f64> = None;
            let mut next = now_ns();
            let mut warned = false;
            while sleep_until(next, &stop) {
                match me.read_now() {
                    Ok(v) if last != Some(v) => {
                        last = Some(v);
                        events(v, now_ns());
                        warned = false;
                    }
                    Ok(_) => {}
                    Err(e) if !warned => {
                        tracing::warn!(error = %e, "attribute file poll failed");
                        warned = true;
                    }
                    Err(_) => {}
                }
                next = now_ns().max(next + period);
            }
        })
        .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mintgate-attr-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Found by the device_values fuzz target: large and tiny values were
    /// written cut off at 40 bytes and read back as another number.
    #[test]
    fn any_finite_value_reads_back_exactly() {
        for v in [
            12.5,
            -0.1,
            5.888884444444445e39,
            1e300,
            -1.234e-300,
            f64::MAX,
            f64::MIN_POSITIVE,
            3.0,
        ] {
            let mut buf = [0u8; 40];
            let n = format_value(v, &mut buf);
            assert_eq!(buf[n - 1], b'\n', "{v}: not a whole line");
            assert_eq!(
                parse_value(&buf[..n], Path::new("v")).unwrap().to_bits(),
                v.to_bits()
            );
        }
    }

    proptest::proptest! {
        /// What an attribute file holds: any bytes parse to a finite value
        /// or a clear error; a value written back reads back the same.
        #[test]
        fn parse_value_is_total_and_round_trips(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48), v in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO) {
            if let Ok(x) = parse_value(&bytes, Path::new("v")) {
                proptest::prop_assert!(x.is_finite());
            }
            let mut buf = [0u8; 40];
            let n = format_value(v, &mut buf);
            proptest::prop_assert_eq!(parse_value(&buf[..n], Path::new("v")).unwrap().to_bits(), (v + 0.0).to_bits());
        }
    }

    #[test]
    fn both_modes_read_and_write_the_same_file() {
        let d = tmp("modes");
        let p = d.join("value");
        std::fs::write(&p, "0\n").unwrap();
        for mode in [AttrMode::Reopen, AttrMode::KeepOpen] {
            let a = AttrFile::open(&p, Direction::Actuator, mode, None).unwrap();
            assert_eq!(a.mode(), mode);
            a.write(12.5).unwrap();
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "12.5\n");
            a.write(1.0).unwrap();
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "1\n", "{mode:?}");
            assert_eq!(a.read().unwrap(), 1.0);
            let s = AttrFile::open(&p, Direction::Sensor, mode, None).unwrap();
            assert_eq!(s.read().unwrap(), 1.0);
            assert!(matches!(s.write(2.0), Err(DeviceError::NotWritable)));
        }
        std::fs::write(&p, "on\n").unwrap();
        let s = AttrFile::open(&p, Direction::Sensor, AttrMode::KeepOpen, None).unwrap();
        let e = s.read().unwrap_err().to_string();
        assert!(e.contains("`on` is not a number"), "{e}");
        let e = AttrFile::open(d.join("missing"), Direction::Sensor, AttrMode::Reopen, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_polled_sensor_delivers_changes_only() {
        let d = tmp("poll");
        let p = d.join("value");
        std::fs::write(&p, "5\n").unwrap();
        let s = AttrFile::open(
            &p,
            Direction::Sensor,
            AttrMode::Reopen,
            Some(Duration::from_millis(2)),
        )
        .unwrap();
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let run = s.start(Arc::new(move |v, _| s2.lock().push(v))).unwrap();
        let wait = |n: usize| {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while seen.lock().len() < n && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait(1);
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&p, "6\n").unwrap();
        wait(2);
        drop(run);
        assert_eq!(*seen.lock(), vec![5.0, 6.0]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
