//! A Modbus TCP device's connection: one thread of its own (a
//! current-thread Tokio runtime), so that a slow or dead device delays
//! nothing but itself. It polls each [`ReadGroup`] on its period, carries
//! out the writes the point drivers hand it (before any poll that is due),
//! times every request out, retries it on a fresh connection, and keeps
//! the counters the dashboard and `/metrics` show.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_modbus::client::{Context, Reader, Writer};
use tokio_modbus::Slave;

use super::{plan, Layout, PointSpec, ReadGroup, Table, ValueType};
use crate::driver::{DeviceError, Direction, Driver, EventFn, LinkState, Running};
use crate::field::{Cell, Counters, Write, WRITE_QUEUE};

/// Where and how to reach a device.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The device's name (its points are `NAME.POINT`).
    pub name: String,
    /// `host:port`, or the serial port's path for RTU.
    pub host: String,
    /// RTU: the serial line's settings (`host` is then the port).
    pub serial: Option<super::bus::SerialLine>,
    /// The unit identifier (slave id) put in every request.
    pub unit_id: u8,
    /// Most time one request (or a connect) may take.
    pub timeout: Duration,
    /// Further attempts of a request that timed out or whose connection
    /// failed (an exception response is an answer: it is not retried).
    pub retries: u32,
}

struct Point {
    spec: PointSpec,
    layout: Layout,
    cell: Cell,
}

/// A request the connection thread carries out.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    Read(Table, u16, u16),
    WriteCoil(u16, bool),
    WriteRegister(u16, u16),
    WriteRegisters(u16, Vec<u16>),
    MaskRegister(u16, u16, u16),
}

pub(crate) enum Data {
    Bits(Vec<bool>),
    Words(Vec<u16>),
    Written,
}

/// Why one attempt of a request failed.
pub(crate) enum Attempt {
    /// An exception response: an answer, not retried.
    Exception(String),
    /// No answer, a broken connection or a garbled frame: retried.
    Failed(String),
}

struct Shared {
    ep: Endpoint,
    points: Vec<Point>,
    counters: Counters,
    stop: Notify,
}

/// A running connection; its thread stops when the last point driver
/// holding it is dropped.
pub struct Connection {
    shared: Arc<Shared>,
    writes: mpsc::Sender<Write<Op>>,
    _thread: Running,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // wakes the thread even from a request in flight; the Running guard
        // then joins it
        self.shared.stop.notify_one();
    }
}

impl Connection {
    /// Starts the connection of `ep` polling `points` (each with its
    /// period); returns one driver per point, in order.
    pub fn start(
        ep: Endpoint,
        points: Vec<(PointSpec, Duration)>,
    ) -> Result<Vec<PointDriver>, DeviceError> {
        let periods: Vec<Duration> = points.iter().map(|(_, d)| *d).collect();
        let specs: Vec<PointSpec> = points.into_iter().map(|(p, _)| p).collect();
        let groups = plan(&specs, &periods);
        let shared = Arc::new(Shared {
            ep,
            points: specs
                .into_iter()
                .map(|spec| Point {
                    layout: spec.layout(),
                    spec,
                    cell: Cell::default(),
                })
                .collect(),
            counters: Counters::default(),
            stop: Notify::new(),
        });
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let bus = match shared.ep.serial {
            Some(line) => Some(super::bus::Bus::get(&shared.ep.host, line)?),
            None => None,
        };
        let s = shared.clone();
        let thread = Running::spawn(&format!("mb-{}", shared.ep.name), move |_stop| {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    s.fail(&format!("cannot start the connection's runtime: {e}"));
                    return;
                }
            };
            rt.block_on(async {
                let mut link = Link {
                    s: &s,
                    ctx: None,
                    bus,
                };
                tokio::select! {
                    _ = s.stop.notified() => {}
                    _ = link.run(groups, rx) => {}
                }
            });
        })?;
        let conn = Arc::new(Connection {
            shared,
            writes: tx,
            _thread: thread,
        });
        Ok((0..conn.shared.points.len())
            .map(|idx| PointDriver {
                conn: conn.clone(),
                idx,
            })
            .collect())
    }

    fn state(&self) -> LinkState {
        self.shared
            .counters
            .state(&self.shared.ep.name, &self.shared.ep.host)
    }
}

impl Shared {
    fn fail(&self, why: &str) {
        self.counters
            .fail("modbus", &self.ep.name, &self.ep.host, why);
    }
}

/// The connection thread's side.
struct Link<'a> {
    s: &'a Shared,
    /// TCP: the connection, when up.
    ctx: Option<Context>,
    /// RTU: the bus the device is on.
    bus: Option<Arc<super::bus::Bus>>,
}

pub(crate) async fn exec(ctx: &mut Context, op: &Op) -> tokio_modbus::Result<Data> {
    Ok(match op {
        Op::Read(Table::Coil, a, n) => ctx.read_coils(*a, *n).await?.map(Data::Bits),
        Op::Read(Table::DiscreteInput, a, n) => {
            ctx.read_discrete_inputs(*a, *n).await?.map(Data::Bits)
        }
        Op::Read(Table::Holding, a, n) => {
            ctx.read_holding_registers(*a, *n).await?.map(Data::Words)
        }
        Op::Read(Table::Input, a, n) => ctx.read_input_registers(*a, *n).await?.map(Data::Words),
        Op::WriteCoil(a, v) => ctx.write_single_coil(*a, *v).await?.map(|_| Data::Written),
        Op::WriteRegister(a, v) => ctx
            .write_single_register(*a, *v)
            .await?
            .map(|_| Data::Written),
        Op::WriteRegisters(a, v) => ctx
            .write_multiple_registers(*a, v)
            .await?
            .map(|_| Data::Written),
        Op::MaskRegister(a, and, or) => ctx
            .masked_write_register(*a, *and, *or)
            .await?
            .map(|_| Data::Written),
    })
}

impl Link<'_> {
    async fn connect(&mut self) -> Result<(), String> {
        let ep = &self.s.ep;
        let c = &self.s.counters;
        c.connects.fetch_add(1, Ordering::Relaxed);
        let attempt = async {
            let addr = tokio::net::lookup_host(&ep.host)
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("the name resolves to no address"))?;
            let stream = tokio::net::TcpStream::connect(addr).await?;
            let _ = stream.set_nodelay(true);
            Ok::<_, std::io::Error>(tokio_modbus::client::tcp::attach_slave(
                stream,
                Slave(ep.unit_id),
            ))
        };
        match tokio::time::timeout(ep.timeout, attempt).await {
            Ok(Ok(ctx)) => {
                self.ctx = Some(ctx);
                Ok(())
            }
            Ok(Err(e)) => Err(format!("connecting to {}: {e}", ep.host)),
            Err(_) => Err(format!(
                "connecting to {}: no answer within {:?}",
                ep.host, ep.timeout
            )),
        }
    }

    /// One attempt over TCP: connects first when needed; a broken or
    /// timed-out connection is dropped (a late answer would be taken for
    /// the next request's), so that the next attempt connects anew.
    async fn attempt_tcp(&mut self, op: &Op) -> Result<Data, Attempt> {
        let ep = &self.s.ep;
        if self.ctx.is_none() {
            self.connect().await.map_err(Attempt::Failed)?;
        }
        let Some(ctx) = self.ctx.as_mut() else {
            return Err(Attempt::Failed("not connected".into()));
        };
        let why = match tokio::time::timeout(ep.timeout, exec(ctx, op)).await {
            Ok(Ok(Ok(d))) => return Ok(d),
            Ok(Ok(Err(code))) => {
                return Err(Attempt::Exception(format!("{op:?}: exception {code}")))
            }
            Ok(Err(e)) => format!("{op:?}: {e}"),
            Err(_) => format!("{op:?}: no answer within {:?}", ep.timeout),
        };
        self.ctx = None;
        Err(Attempt::Failed(why))
    }

    /// One request with the device's timeout and retries.
    async fn request(&mut self, op: &Op) -> Result<Data, String> {
        let ep = &self.s.ep;
        let mut why = String::new();
        for _ in 0..=ep.retries {
            let r = match &self.bus {
                Some(bus) => bus.call(ep.unit_id, op, ep.timeout).await,
                None => self.attempt_tcp(op).await,
            };
            let connected = &self.s.counters.connected;
            match r {
                Ok(d) => {
                    connected.store(true, Ordering::Relaxed);
                    return Ok(d);
                }
                Err(Attempt::Exception(e)) => {
                    connected.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                Err(Attempt::Failed(e)) => {
                    connected.store(false, Ordering::Relaxed);
                    why = e;
                }
            }
        }
        Err(why)
    }

    async fn poll(&mut self, g: &ReadGroup) {
        let c = &self.s.counters;
        c.polls.fetch_add(1, Ordering::Relaxed);
        let r = self.request(&Op::Read(g.table, g.start, g.count)).await;
        let t = crate::clock::now_ns();
        let n = usize::from(g.count);
        let short = match &r {
            Ok(Data::Bits(b)) => b.len() < n,
            Ok(Data::Words(w)) => w.len() < n,
            Ok(Data::Written) => true,
            Err(_) => false,
        };
        let r = if short {
            Err(format!("{n} items asked, fewer answered"))
        } else {
            r
        };
        let data = match r {
            Ok(d) => d,
            Err(e) => {
                // the values go before the error is counted: whoever sees
                // the count sees no stale value
                for &i in &g.points {
                    self.s.points[i].cell.clear();
                }
                self.s.fail(&e);
                return;
            }
        };
        for &i in &g.points {
            let p = &self.s.points[i];
            let off = usize::from(p.spec.address - g.start);
            let v = match &data {
                Data::Bits(b) => Some(p.layout.decode_bit(b[off])),
                Data::Words(w) => p.layout.decode(&w[off..]),
                Data::Written => None,
            };
            // a float register holding NaN or infinity: no value
            p.cell.publish(v.unwrap_or(f64::NAN), t);
        }
    }

    /// Polls each group every period and carries out the writes handed in
    /// (before any poll that is due).
    async fn run(&mut self, groups: Vec<ReadGroup>, mut writes: mpsc::Receiver<Write<Op>>) {
        let start = Instant::now();
        let mut due: Vec<Instant> = vec![start; groups.len()];
        loop {
            let next = due
                .iter()
                .min()
                .copied()
                .unwrap_or(start + Duration::from_secs(3600));
            tokio::select! {
                biased;
                w = writes.recv() => {
                    let Some(w) = w else { return };
                    self.s.counters.writes.fetch_add(1, Ordering::Relaxed);
                    let r = self.request(&w.op).await.map(|_| ());
                    if let Err(e) = &r {
                        self.s.fail(e);
                    }
                    let _ = w.reply.try_send(r);
                    continue;
                }
                _ = tokio::time::sleep_until(next.checked_sub(TIMER_SLACK).unwrap_or(next)) => {}
            }
            // tokio's timer rounds up to whole milliseconds, which made the
            // median poll 1.8 ms late: it wakes us TIMER_SLACK early and the
            // rest is slept to the microsecond (this thread runs this one
            // connection, so nothing else waits meanwhile)
            let left = next.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
            let now = Instant::now();
            for (g, d) in groups.iter().zip(due.iter_mut()) {
                if *d > now {
                    continue;
                }
                let late = Instant::now().saturating_duration_since(*d);
                self.s
                    .counters
                    .lateness
                    .record(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
                self.poll(g).await;
                *d += g.period;
                let after = Instant::now();
                if *d <= after {
                    // a whole period missed (a slow answer, a timeout):
                    // skip ahead rather than poll in a burst
                    let missed = (after - *d).as_nanos() / g.period.as_nanos().max(1) + 1;
                    self.s
                        .counters
                        .skipped
                        .fetch_add(missed as u64, Ordering::Relaxed);
                    *d += g.period * u32::try_from(missed).unwrap_or(u32::MAX);
                }
            }
        }
    }
}

/// How much earlier than a poll is due the connection's tokio timer (whole
/// milliseconds, rounded up) wakes its thread, which sleeps the rest
/// precisely.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// One point of a Modbus device, as a device's driver.
pub struct PointDriver {
    conn: Arc<Connection>,
    idx: usize,
}

impl PointDriver {
    fn point(&self) -> &Point {
        &self.conn.shared.points[self.idx]
    }

    /// The request that writes `value` to the point.
    fn write_op(&self, value: f64) -> Result<Op, String> {
        let p = &self.point().spec;
        let l = self.point().layout;
        match (p.table, p.value_type()) {
            (Table::Coil, _) => Ok(Op::WriteCoil(p.address, l.raw_for(value)? != 0.0)),
            (Table::Holding, ValueType::Bool) => {
                let bit = 1u16 << p.bit.unwrap_or(0).min(15);
                let bit = match p.byte_order {
                    super::Order::Big => bit,
                    super::Order::Little => bit.swap_bytes(),
                };
                let or = if l.raw_for(value)? != 0.0 { bit } else { 0 };
                Ok(Op::MaskRegister(p.address, !bit, or))
            }
            (Table::Holding, _) => {
                let words = l.encode(value)?;
                Ok(match words[..] {
                    [w] => Op::WriteRegister(p.address, w),
                    _ => Op::WriteRegisters(p.address, words),
                })
            }
            _ => Err("the point is read-only".into()),
        }
    }
}

impl PointDriver {
    /// Hands the write of `value` to the connection thread; the receiver
    /// of its result.
    fn queue(
        &self,
        value: f64,
    ) -> Result<std::sync::mpsc::Receiver<Result<(), String>>, DeviceError> {
        if !self.point().spec.writable {
            return Err(DeviceError::NotWritable);
        }
        let op = self.write_op(value).map_err(field_err)?;
        crate::field::queue(&self.conn.writes, op)
    }
}

fn field_err(why: String) -> DeviceError {
    DeviceError::Field(why)
}

impl Driver for PointDriver {
    fn kind(&self) -> &'static str {
        "modbus"
    }

    fn direction(&self) -> Direction {
        if self.point().spec.writable {
            Direction::Actuator
        } else {
            Direction::Sensor
        }
    }

    fn read(&self) -> Result<f64, DeviceError> {
        self.point()
            .cell
            .get()
            .ok_or_else(|| self.conn.shared.counters.no_value())
    }

    fn write(&self, value: f64) -> Result<(), DeviceError> {
        let answer = self.queue(value)?;
        let ep = &self.conn.shared.ep;
        // every attempt may take a connect and a request
        let wait = ep.timeout * 2 * (ep.retries + 1) + Duration::from_millis(100);
        crate::field::wait(answer, wait)?;
        self.point().cell.set(value);
        Ok(())
    }

    fn submit(&self, value: f64) -> Result<(), DeviceError> {
        // the connection thread counts a failure; nobody waits for it
        self.queue(value).map(drop)?;
        self.point().cell.set(value);
        Ok(())
    }

    fn start(&self, events: EventFn) -> Result<Option<Running>, DeviceError> {
        self.point().cell.hook(events);
        Ok(None)
    }

    fn link(&self) -> Option<LinkState> {
        Some(self.conn.state())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(table: Table, ty: ValueType) -> PointSpec {
        PointSpec {
            name: "p".into(),
            table,
            address: 9,
            ty: Some(ty),
            bit: None,
            byte_order: super::super::Order::Big,
            word_order: super::super::Order::Little,
            scale: 0.1,
            offset: 0.0,
            unit: None,
            period: None,
            writable: true,
        }
    }

    #[test]
    fn writes_pick_the_function_the_point_needs() {
        let ep = Endpoint {
            name: "dead".into(),
            // nothing listens on port 1 of loopback: every request fails
            host: "127.0.0.1:1".into(),
            serial: None,
            unit_id: 1,
            timeout: Duration::from_millis(200),
            retries: 0,
        };
        let mut bit = point(Table::Holding, ValueType::Bool);
        bit.bit = Some(4);
        bit.scale = 1.0;
        let mut coil = point(Table::Coil, ValueType::Bool);
        coil.scale = 1.0;
        let pts = vec![
            coil,
            point(Table::Holding, ValueType::I16),
            point(Table::Holding, ValueType::U32),
            bit,
        ];
        let d = Connection::start(
            ep,
            pts.into_iter()
                .map(|p| (p, Duration::from_secs(60)))
                .collect(),
        )
        .unwrap();
        assert_eq!(d[0].write_op(1.0), Ok(Op::WriteCoil(9, true)));
        assert_eq!(d[1].write_op(-2.0), Ok(Op::WriteRegister(9, 0xFFEC)));
        // word order little: the low register first
        assert_eq!(d[2].write_op(6553.7), Ok(Op::WriteRegisters(9, vec![1, 1])));
        assert_eq!(d[3].write_op(1.0), Ok(Op::MaskRegister(9, !0x10, 0x10)));
        assert_eq!(d[3].write_op(0.0), Ok(Op::MaskRegister(9, !0x10, 0)));
        assert!(d[1].write_op(1e9).is_err());
        // a dead device: the write fails within its bound, and says why
        let t = std::time::Instant::now();
        let e = d[1].write(1.0).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:1"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
        let e = d[1].read().unwrap_err().to_string();
        assert!(e.contains("no value"), "{e}");
        // the direct path's way: queued, not waited for; the failure counted
        let t = std::time::Instant::now();
        d[2].submit(1.0).unwrap();
        assert!(t.elapsed() < Duration::from_millis(50));
        assert!(d[2].submit(1e12).is_err());
        let st = d[0].link().unwrap();
        assert!(!st.connected && st.errors >= 1 && st.writes >= 1, "{st:?}");
    }
}
