//! A Modbus RTU bus: one serial port (RS-485, RS-232), shared by every
//! device declared on it. The bus has a thread of its own that owns the
//! port and carries out the devices' requests one at a time, in the order
//! they come, with the silent interval between frames that the Modbus over
//! Serial Line Specification V1.02 asks for (3.5 character times; 1.75 ms
//! above 19200 baud). A device's own thread hands its request over and
//! waits for the answer, so its polling and timeouts stay its own.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tokio_modbus::client::Context;
use tokio_modbus::slave::SlaveContext;
use tokio_modbus::Slave;
use tokio_serial::SerialPortBuilderExt;

use super::client::{exec, Attempt, Data, Op};
use crate::driver::{DeviceError, Running};

/// Parity of a serial line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Parity {
    /// No parity bit.
    None,
    /// Even parity (the specification's default).
    Even,
    /// Odd parity.
    Odd,
}

/// How the serial line is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SerialLine {
    /// Bits per second.
    pub baud: u32,
    /// Parity.
    pub parity: Parity,
    /// Stop bits, 1 or 2.
    pub stop_bits: u8,
}

impl SerialLine {
    /// The silent interval between frames: 3.5 characters of 11 bits, or
    /// 1.75 ms above 19200 baud.
    pub fn frame_gap(&self) -> Duration {
        if self.baud > 19_200 {
            Duration::from_micros(1750)
        } else {
            Duration::from_nanos(38_500_000_000 / u64::from(self.baud.max(1)))
        }
    }
}

struct Request {
    unit: u8,
    op: Op,
    timeout: Duration,
    reply: oneshot::Sender<Result<Data, Attempt>>,
}

/// A serial bus in use; closed when the last device on it is dropped.
pub struct Bus {
    requests: mpsc::Sender<Request>,
    stop: Arc<Notify>,
    _thread: Running,
}

impl Drop for Bus {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// Requests waiting for one bus beyond which a device's request fails at once.
const QUEUE: usize = 256;

type Buses = Mutex<HashMap<String, (SerialLine, Weak<Bus>)>>;

static BUSES: LazyLock<Buses> = LazyLock::new(Buses::default);

impl Bus {
    /// The bus on serial port `path`, opened (its thread started) by the
    /// first device on it; a device asking for other line settings than
    /// the bus has is refused.
    pub fn get(path: &str, line: SerialLine) -> Result<Arc<Bus>, DeviceError> {
        let mut buses = BUSES.lock();
        if let Some((l, b)) = buses.get(path) {
            if let Some(b) = b.upgrade() {
                if *l != line {
                    return Err(DeviceError::Field(format!(
                        "{path} is in use at {l:?}: every device on one bus needs the same baud, parity and stop_bits"
                    )));
                }
                return Ok(b);
            }
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let stop = Arc::new(Notify::new());
        let (p, s) = (path.to_string(), stop.clone());
        let name = format!("rtu-{}", path.rsplit('/').next().unwrap_or(path));
        let thread = Running::spawn(&name, move |_| {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                tracing::error!(port = %p, "cannot start the serial bus's runtime");
                return;
            };
            rt.block_on(async {
                tokio::select! {
                    _ = s.notified() => {}
                    _ = serve(&p, line, rx) => {}
                }
            });
        })?;
        let bus = Arc::new(Bus {
            requests: tx,
            stop,
            _thread: thread,
        });
        buses.retain(|_, (_, b)| b.strong_count() > 0);
        buses.insert(path.to_string(), (line, Arc::downgrade(&bus)));
        Ok(bus)
    }

    /// One request to `unit`, waited for at most `timeout` once on the
    /// wire (the time it waits for the bus is not counted: other devices'
    /// requests are not this one's fault).
    pub(crate) async fn call(&self, unit: u8, op: &Op, timeout: Duration) -> Result<Data, Attempt> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .try_send(Request {
                unit,
                op: op.clone(),
                timeout,
                reply,
            })
            .map_err(|_| Attempt::Failed("the serial bus has too many requests waiting".into()))?;
        answer
            .await
            .unwrap_or_else(|_| Err(Attempt::Failed("the serial bus stopped".into())))
    }
}

fn open(path: &str, line: SerialLine) -> Result<Context, String> {
    let parity = match line.parity {
        Parity::None => tokio_serial::Parity::None,
        Parity::Even => tokio_serial::Parity::Even,
        Parity::Odd => tokio_serial::Parity::Odd,
    };
    let stop = if line.stop_bits == 2 {
        tokio_serial::StopBits::Two
    } else {
        tokio_serial::StopBits::One
    };
    let port = tokio_serial::new(path, line.baud)
        .parity(parity)
        .stop_bits(stop)
        .data_bits(tokio_serial::DataBits::Eight)
        .open_native_async()
        .map_err(|e| format!("opening {path}: {e}"))?;
    Ok(tokio_modbus::client::rtu::attach_slave(port, Slave(1)))
}

/// The bus thread: requests one at a time, the frame gap between them; the
/// port reopened after a failure (a late or garbled answer must not be
/// taken for the next request's).
async fn serve(path: &str, line: SerialLine, mut rx: mpsc::Receiver<Request>) {
    let gap = line.frame_gap();
    let mut ctx: Option<Context> = None;
    let mut quiet_from = Instant::now();
    while let Some(r) = rx.recv().await {
        if r.reply.is_closed() {
            continue; // its device gave up waiting
        }
        if ctx.is_none() {
            match open(path, line) {
                Ok(c) => ctx = Some(c),
                Err(e) => {
                    let _ = r.reply.send(Err(Attempt::Failed(e)));
                    continue;
                }
            }
        }
        let Some(c) = ctx.as_mut() else { continue };
        tokio::time::sleep_until(quiet_from + gap).await;
        c.set_slave(Slave(r.unit));
        let result = match tokio::time::timeout(r.timeout, exec(c, &r.op)).await {
            Ok(Ok(Ok(d))) => Ok(d),
            Ok(Ok(Err(code))) => Err(Attempt::Exception(format!("{:?}: exception {code}", r.op))),
            Ok(Err(e)) => Err(Attempt::Failed(format!("{:?}: {e}", r.op))),
            Err(_) => Err(Attempt::Failed(format!(
                "{:?}: no answer within {:?}",
                r.op, r.timeout
            ))),
        };
        if matches!(result, Err(Attempt::Failed(_))) {
            ctx = None;
        }
        quiet_from = Instant::now();
        let _ = r.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_gaps_follow_the_serial_line_specification() {
        let l = |baud| SerialLine {
            baud,
            parity: Parity::Even,
            stop_bits: 1,
        };
        // 3.5 characters of 11 bits
        assert_eq!(l(9600).frame_gap(), Duration::from_nanos(4_010_416));
        assert_eq!(l(19_200).frame_gap(), Duration::from_nanos(2_005_208));
        assert_eq!(l(115_200).frame_gap(), Duration::from_micros(1750));
    }

    #[test]
    fn a_bus_is_shared_and_its_line_settings_must_agree() {
        let line = SerialLine {
            baud: 9600,
            parity: Parity::None,
            stop_bits: 1,
        };
        let a = Bus::get("/dev/mintgate-no-such-tty", line).unwrap();
        let b = Bus::get("/dev/mintgate-no-such-tty", line).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let e = Bus::get(
            "/dev/mintgate-no-such-tty",
            SerialLine {
                baud: 19_200,
                ..line
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("same baud"), "{e}");
        // a port that does not open: the request says why
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(a.call(
            1,
            &Op::Read(super::super::Table::Holding, 0, 1),
            Duration::from_millis(100),
        ));
        match r {
            Err(Attempt::Failed(e)) => {
                assert!(e.contains("opening /dev/mintgate-no-such-tty"), "{e}")
            }
            _ => panic!("a missing port must fail"),
        }
        drop((a, b));
        // the last user gone, the next one opens it anew with its own settings
        assert!(Bus::get(
            "/dev/mintgate-no-such-tty",
            SerialLine {
                baud: 19_200,
                ..line
            }
        )
        .is_ok());
    }
}
