//! `lab fieldbus`: what Modbus polling costs and how fast a register change
//! travels (issue 26's targets), against real peers on loopback.
//!
//! The lab starts pymodbus TCP servers (PyPI `pymodbus`, every simulated
//! device in one Python process, `fieldbus_sim.py`), a broker (a private
//! mosquitto when installed, else the gateway's embedded broker) and a
//! `mintgate serve` process (the same executable) that polls DEVICES
//! devices of POINTS contiguous holding registers at HZ. One of the
//! registers (`d0.p0`) is the probe: it is observed by a CoAP client over
//! UDP (Observe, RFC 7641), published by the MQTT bridge to a topic the lab
//! subscribes to, and linked through the direct path to a coil of another
//! simulated device (`d0.p0 | threshold(5000, 4500) -> actuator(relay.coil)`).
//!
//! During the measured window the lab sets the probe register in the
//! simulator at random instants (2 to 4 poll periods apart, from
//! `--seed`), alternately above and below the threshold, each value
//! distinct. The simulator stamps on `CLOCK_MONOTONIC` when the datastore
//! held the new value, when the first poll read it, and when the relay's
//! coil was written; the lab stamps on the same clock when the Observe
//! notification and the MQTT message carrying that value arrived. So each
//! change gives its latency to each of the three ends, and the part after
//! the poll read (poll read to delivery). The targets allow one poll
//! period for the poll to pick the change up: Observe and MQTT within a
//! period + 5 ms at p99, the coil within a period + 1 ms.
//!
//! In the same window: the gateway's CPU and the simulators' (from
//! `/proc/PID/stat`), the points read per second and the polls' lateness
//! (from the gateway's `/metrics`; lateness is the gateway's histogram
//! since its start).
//!
//! Writes `fieldbus.csv` (long form, one row per value: `kind,name,metric,
//! value`; kinds `run`, `device`, `sample`, `latency`) and `fieldbus.svg`
//! (the latency distributions against the targets).

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_coap::wire::OptionNumber;
use mintgate_gateway::observe_client::{Observation, ObserveEvent};
use mintgate_mqtt::{SubEvent, Subscriber, SubscriberConfig};
use rand::{RngExt as _, SeedableRng as _};

use crate::footprint::{free_tcp_port, free_udp_port, scrape, Proc};
use crate::{line, target_line, LabOptions, Summary};

/// The simulators' script, written into the lab's work folder.
const SIM_SCRIPT: &str = include_str!("fieldbus_sim.py");

/// Value above which the probe's threshold link sets the coil.
const HIGH: u16 = 5000;
/// Value below which it clears it.
const LOW: u16 = 4500;
/// Longest a change may take to reach an end before it counts as missed.
const GIVE_UP: Duration = Duration::from_secs(2);
/// Target slack over one poll period: Observe and MQTT.
pub const SLACK_NOTIFY_MS: f64 = 5.0;
/// Target slack over one poll period: the direct path to the coil.
pub const SLACK_COIL_MS: f64 = 1.0;
/// Target: the gateway's CPU, percent of one core.
pub const CPU_TARGET: f64 = 10.0;
/// Target: the polls' lateness at p99, ms.
pub const LATENESS_TARGET_MS: f64 = 5.0;

/// Which broker carries the MQTT bridge's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldbusBroker {
    /// A private mosquitto when installed, else the embedded broker.
    Auto,
    /// A private mosquitto (an error when it is not installed).
    Mosquitto,
    /// The gateway's embedded broker (its CPU is then in the gateway's).
    Embedded,
}

impl std::str::FromStr for FieldbusBroker {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(FieldbusBroker::Auto),
            "mosquitto" => Ok(FieldbusBroker::Mosquitto),
            "embedded" => Ok(FieldbusBroker::Embedded),
            _ => Err(format!(
                "'{s}' is not a broker: auto, mosquitto or embedded"
            )),
        }
    }
}

/// Settings of `lab fieldbus`.
#[derive(Clone)]
pub struct FieldbusOptions {
    /// Output folder and progress.
    pub common: LabOptions,
    /// The `mintgate` executable run as `mintgate serve`.
    pub exe: PathBuf,
    /// A Python with pymodbus (`target/py-venv/bin/python`, as
    /// scripts/test.sh installs it).
    pub python: PathBuf,
    /// Simulated Modbus TCP devices polled (1..=200).
    pub devices: usize,
    /// Holding registers per device, contiguous (1..=1000).
    pub points: usize,
    /// Polls per second of every device (0.1..=1000).
    pub hz: f64,
    /// The measured window.
    pub duration: Duration,
    /// Unmeasured time after the gateway answers (connections, first polls).
    pub warmup: Duration,
    /// Seed of the instants of the changes.
    pub seed: u64,
    /// The broker.
    pub broker: FieldbusBroker,
}

impl FieldbusOptions {
    /// Issue 26's settings: 20 devices x 50 points at 10 Hz (10,000
    /// points/s), 60 s.
    pub fn new(common: LabOptions, exe: PathBuf) -> FieldbusOptions {
        FieldbusOptions {
            common,
            exe,
            python: PathBuf::from("target/py-venv/bin/python"),
            devices: 20,
            points: 50,
            hz: 10.0,
            duration: Duration::from_secs(60),
            warmup: Duration::from_secs(2),
            seed: 1,
            broker: FieldbusBroker::Auto,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=200).contains(&self.devices),
            "--devices must be 1..=200"
        );
        anyhow::ensure!(
            (1..=1000).contains(&self.points),
            "--points must be 1..=1000"
        );
        anyhow::ensure!(
            self.hz.is_finite() && (0.1..=1000.0).contains(&self.hz),
            "--hz must be 0.1..=1000"
        );
        anyhow::ensure!(
            self.duration >= Duration::from_secs(1) && self.duration <= Duration::from_secs(3600),
            "--duration must be 1s..=1h"
        );
        Ok(())
    }

    fn period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.hz)
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock the simulator stamps with.
fn mono_ns() -> u64 {
    mintgate_devices::clock::now_ns()
}

/// Converts `Instant`s (also `CLOCK_MONOTONIC` on Linux, but opaque) to
/// [`mono_ns`] through one pair read at the start.
#[derive(Clone, Copy)]
struct Clock {
    at: Instant,
    ns: u64,
}

impl Clock {
    fn new() -> Clock {
        let at = Instant::now();
        Clock { at, ns: mono_ns() }
    }
    fn ns(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.at) {
            Some(d) => self.ns + d.as_nanos() as u64,
            None => self.ns - self.at.duration_since(t).as_nanos() as u64,
        }
    }
}

/// What the simulator reported.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SimEvent {
    /// (device, address, value, ns)
    Set(usize, u16, u16, u64),
    /// (device, address, ns)
    Read(usize, u16, u64),
    /// (address, value, ns)
    Coil(u16, bool, u64),
}

fn parse_sim_line(l: &str) -> Option<SimEvent> {
    let f: Vec<&str> = l.split_whitespace().collect();
    match f.as_slice() {
        ["set", d, a, v, t] => Some(SimEvent::Set(
            d.parse().ok()?,
            a.parse().ok()?,
            v.parse().ok()?,
            t.parse().ok()?,
        )),
        ["read", d, a, t] => Some(SimEvent::Read(
            d.parse().ok()?,
            a.parse().ok()?,
            t.parse().ok()?,
        )),
        ["coil", a, v, t] => Some(SimEvent::Coil(a.parse().ok()?, *v == "1", t.parse().ok()?)),
        _ => None,
    }
}

/// One change of the probe and when each end saw it (ns on
/// `CLOCK_MONOTONIC`; `None`: not within [`GIVE_UP`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Change {
    /// The value set.
    pub value: u16,
    /// When the simulator held it.
    pub set: u64,
    /// When the first poll after it read it.
    pub read: Option<u64>,
    /// When the Observe notification with it arrived.
    pub observe: Option<u64>,
    /// When the MQTT message with it arrived.
    pub mqtt: Option<u64>,
    /// When the relay's coil was written to the state it implies.
    pub coil: Option<u64>,
}

/// Pairs every set with the first matching arrival at each end after it.
fn match_changes(sim: &[SimEvent], observe: &[(u64, f64)], mqtt: &[(u64, f64)]) -> Vec<Change> {
    let give_up = GIVE_UP.as_nanos() as u64;
    let first = |xs: &[(u64, f64)], t: u64, v: u16| {
        xs.iter()
            .find(|&&(at, x)| at >= t && at <= t + give_up && x == f64::from(v))
            .map(|&(at, _)| at)
    };
    sim.iter()
        .filter_map(|e| match *e {
            SimEvent::Set(0, 0, v, t) => Some((v, t)),
            _ => None,
        })
        .map(|(value, set)| {
            let in_time = |at: u64| at >= set && at <= set + give_up;
            let read = sim.iter().find_map(|e| match *e {
                SimEvent::Read(0, 0, at) if in_time(at) => Some(at),
                _ => None,
            });
            let coil = sim.iter().find_map(|e| match *e {
                SimEvent::Coil(0, on, at) if in_time(at) && on == (value > HIGH) => Some(at),
                _ => None,
            });
            Change {
                value,
                set,
                read,
                observe: first(observe, set, value),
                mqtt: first(mqtt, set, value),
                coil,
            }
        })
        .collect()
}

/// p50, p99 and the most of `ms` (sorted here); zeros when empty.
fn stats(ms: &mut [f64]) -> (f64, f64, f64) {
    if ms.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((ms.len() - 1) as f64 * p).ceil() as usize];
    (q(0.5), q(0.99), ms[ms.len() - 1])
}

/// One end's figures over every change.
#[derive(Clone, Debug)]
pub struct EndStats {
    /// `observe`, `mqtt`, `coil`, `poll_read`.
    pub name: &'static str,
    /// From the register change: every sample, ms.
    pub from_change: Vec<f64>,
    /// From the poll read that picked the change up, ms.
    pub from_read: Vec<f64>,
    /// Changes this end never saw (within 2 s).
    pub missed: usize,
    /// Its target at p99 from the change, ms (none for `poll_read`).
    pub target_ms: Option<f64>,
}

fn end_stats(
    changes: &[Change],
    name: &'static str,
    end: fn(&Change) -> Option<u64>,
    target_ms: Option<f64>,
) -> EndStats {
    let ms = |a: u64, b: u64| (b as f64 - a as f64) / 1e6;
    let mut s = EndStats {
        name,
        from_change: Vec::new(),
        from_read: Vec::new(),
        missed: 0,
        target_ms,
    };
    for c in changes {
        match end(c) {
            Some(at) => {
                s.from_change.push(ms(c.set, at));
                if let (Some(r), true) = (c.read, name != "poll_read") {
                    s.from_read.push(ms(r, at));
                }
            }
            None => s.missed += 1,
        }
    }
    s
}

/// Per-connection values of a metric family (`connection="NAME"`).
fn by_connection(text: &str, family: &str, quantile: Option<&str>) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(family) else {
            continue;
        };
        let Some(labels) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) else {
            continue;
        };
        let (labels, value) = labels;
        if let Some(q) = quantile {
            if !labels.contains(&format!("quantile=\"{q}\"")) {
                continue;
            }
        }
        let Some(conn) = labels
            .split("connection=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            out.insert(conn.to_owned(), v);
        }
    }
    out
}

/// CPU seconds (user + system) of a process, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &st[st.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // after the comm: state is field 3, utime 14, stime 15 (1-based)
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks / hz)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The gateway's configuration for the lab.
fn gateway_toml(
    o: &FieldbusOptions,
    ports: &[u16],
    relay: u16,
    coap: u16,
    metrics: u16,
    mqtt: &str,
    state: &Path,
) -> String {
    let period_us = (1e6 / o.hz).round() as u64;
    let mut t = format!(
        "[coap]\nbind = [\"127.0.0.1:{coap}\"]\n\n[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\n\
         [mqtt]\nenabled = true\n{mqtt}\nstate = \"{}\"\npersist = false\npublish_devices = false\n\n\
         [[mqtt.publish]]\ndevice = \"d0.p0\"\ntopic = \"lab/fieldbus/d0.p0\"\n\n\
         [directpath]\nlinks = [\"d0.p0 | threshold({HIGH}, {LOW}) -> actuator(relay.coil)\"]\n",
        state.display()
    );
    for (i, port) in ports.iter().enumerate() {
        t.push_str(&format!(
            "\n[[devices.list]]\nname = \"d{i}\"\nkind = \"modbus\"\nhost = \"127.0.0.1:{port}\"\n\
             period = \"{period_us}us\"\ntimeout = \"1s\"\nhistory = 16\n"
        ));
        for a in 0..o.points {
            t.push_str(&format!(
                "[[devices.list.points]]\nname = \"p{a}\"\ntable = \"holding\"\naddress = {a}\n"
            ));
        }
    }
    t.push_str(&format!(
        "\n[[devices.list]]\nname = \"relay\"\nkind = \"modbus\"\nhost = \"127.0.0.1:{relay}\"\n\
         period = \"1s\"\ntimeout = \"1s\"\nhistory = 16\n\
         [[devices.list.points]]\nname = \"coil\"\ntable = \"coil\"\naddress = 0\nwritable = true\n"
    ));
    t
}

/// The simulators: a Python process reporting on stdout.
struct Sim {
    proc: Proc,
    stdin: ChildStdin,
    events: Arc<Mutex<Vec<SimEvent>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Sim {
    fn start(
        python: &Path,
        script: &Path,
        ports: &[u16],
        regs: usize,
        relay: u16,
        log: &Path,
    ) -> anyhow::Result<Sim> {
        let list = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut child: Child = Command::new(python)
            .arg(script)
            .arg(list)
            .arg(regs.to_string())
            .arg(relay.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().context("the simulators' stdin")?;
        let stdout = child.stdout.take().context("the simulators' stdout")?;
        let proc = Proc(child);
        let events = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let ev = events.clone();
        let reader = std::thread::Builder::new()
            .name("lab-sim-out".into())
            .spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { break };
                    if l == "ready" {
                        let _ = ready_tx.send(());
                    } else if let Some(e) = parse_sim_line(&l) {
                        ev.lock().expect("sim events").push(e);
                    }
                }
            })?;
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| {
                anyhow::anyhow!(
                    "the pymodbus simulators did not start within 30 s (see {})",
                    log.display()
                )
            })?;
        Ok(Sim {
            proc,
            stdin,
            events,
            reader: Some(reader),
        })
    }

    fn set(&mut self, dev: usize, addr: u16, value: u16) -> anyhow::Result<()> {
        writeln!(self.stdin, "set {dev} {addr} {value}")?;
        self.stdin.flush()?;
        Ok(())
    }

    fn stop(mut self) -> Vec<SimEvent> {
        drop(self.stdin);
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end && matches!(self.proc.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(self.proc);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        std::mem::take(&mut *self.events.lock().expect("sim events"))
    }
}

/// Arrivals of the probe's value at a client: (ns, value).
type Arrivals = Arc<Mutex<Vec<(u64, f64)>>>;

/// Observes `/sensors/d0.p0` until `stop`.
fn observe_thread(
    coap: SocketAddr,
    clock: Clock,
    stop: Arc<AtomicBool>,
    out: Arrivals,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<()>>> {
    let opts = vec![
        (OptionNumber::URI_PATH, b"sensors".to_vec()),
        (OptionNumber::URI_PATH, b"d0.p0".to_vec()),
    ];
    let mut obs = Observation::register(coap, opts, None)?;
    Ok(std::thread::Builder::new()
        .name("lab-observe".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match obs.next_event(Instant::now() + Duration::from_millis(100))? {
                    Some(ObserveEvent::Notification(n)) => {
                        if let Some(v) = std::str::from_utf8(&n.payload)
                            .ok()
                            .and_then(|s| s.trim().parse::<f64>().ok())
                        {
                            out.lock().expect("arrivals").push((clock.ns(n.at), v));
                        }
                    }
                    Some(other) => anyhow::bail!("the observation ended: {other:?}"),
                    None => {}
                }
            }
            obs.deregister(Duration::from_millis(200));
            Ok(())
        })?)
}

/// Reads the MQTT messages of the probe until `stop`.
fn mqtt_thread(
    mut sub: Subscriber,
    clock: Clock,
    stop: Arc<AtomicBool>,
    out: Arrivals,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<()>>> {
    Ok(std::thread::Builder::new()
        .name("lab-mqtt".into())
        .spawn(move || {
            // the bridge publishes every poll: only changes are kept, so
            // memory grows with the changes, not with the polls
            let mut last = None;
            while !stop.load(Ordering::Relaxed) {
                if let Some(SubEvent::Arrival(env, at)) =
                    sub.recv_timeout(Duration::from_millis(100))
                {
                    let v = serde_json::from_str::<serde_json::Value>(&env.msg)
                        .ok()
                        .and_then(|j| j.get("value").and_then(serde_json::Value::as_f64));
                    if let Some(v) = v.filter(|v| last != Some(*v)) {
                        last = Some(v);
                        out.lock().expect("arrivals").push((clock.ns(at), v));
                    }
                }
            }
            Ok(())
        })?)
}

/// Per-device figures over the measured window.
#[derive(Clone, Debug, Default)]
pub struct DeviceRow {
    /// `d0`, …
    pub name: String,
    /// Read requests per second.
    pub requests_per_s: f64,
    /// Points read per second.
    pub points_per_s: f64,
    /// Errors in the window.
    pub errors: f64,
    /// Polls skipped in the window.
    pub skipped: f64,
    /// Poll lateness since the gateway's start, ms: p50, p99, most.
    pub late_ms: (f64, f64, f64),
}

/// Runs the lab. Writes `fieldbus.csv` and `fieldbus.svg`.
pub fn lab_fieldbus(o: &FieldbusOptions) -> anyhow::Result<Summary> {
    o.check()?;
    crate::create_out(&o.common.out)?;
    let progress = &o.common.progress;
    let work = o.common.out.join("fieldbus-work");
    std::fs::create_dir_all(&work)?;
    let ok = Command::new(&o.python)
        .args(["-c", "import pymodbus; print(pymodbus.__version__)"])
        .output()
        .with_context(|| format!("running {}", o.python.display()))?;
    anyhow::ensure!(
        ok.status.success(),
        "pymodbus is missing in {} (scripts/test.sh installs it into target/py-venv; or --python)",
        o.python.display()
    );
    let pymodbus = String::from_utf8_lossy(&ok.stdout).trim().to_owned();
    let script = work.join("fieldbus_sim.py");
    std::fs::write(&script, SIM_SCRIPT)?;

    let mut ports = Vec::with_capacity(o.devices);
    for _ in 0..o.devices {
        ports.push(free_tcp_port()?);
    }
    let relay = free_tcp_port()?;
    progress(&format!(
        "lab fieldbus: starting {} pymodbus {pymodbus} servers and a relay in one process",
        o.devices
    ));
    let mut sim = Sim::start(
        &o.python,
        &script,
        &ports,
        o.points,
        relay,
        &work.join("sim.log"),
    )?;

    let mosquitto_bin = match o.broker {
        FieldbusBroker::Embedded => None,
        FieldbusBroker::Auto => mintgate_mqtt::broker::find_mosquitto(),
        FieldbusBroker::Mosquitto => Some(
            mintgate_mqtt::broker::find_mosquitto()
                .context("mosquitto is not installed (or use --broker embedded)")?,
        ),
    };
    let mut mosquitto = match &mosquitto_bin {
        Some(bin) => Some(
            mintgate_mqtt::broker::Mosquitto::start(bin, &work.join("mosquitto"))
                .context("starting mosquitto")?,
        ),
        None => None,
    };
    let (mqtt_toml, broker_url, broker_name) = match &mosquitto {
        Some(m) => (
            format!("broker = \"mqtt://127.0.0.1:{}\"", m.port()),
            m.url(),
            "mosquitto (private)",
        ),
        None => {
            let (p4, p5) = (free_tcp_port()?, free_tcp_port()?);
            (
                format!(
                    "broker = \"embedded\"\nembedded_listen = \"127.0.0.1:{p4}\"\nembedded_listen5 = \"127.0.0.1:{p5}\""
                ),
                mintgate_mqtt::BrokerUrl::from_addr(([127, 0, 0, 1], p4).into()),
                "embedded (in the gateway's process)",
            )
        }
    };
    let coap = free_udp_port()?;
    let metrics_port = free_tcp_port()?;
    let metrics: SocketAddr = ([127, 0, 0, 1], metrics_port).into();
    let conf = work.join("gateway.toml");
    std::fs::write(
        &conf,
        gateway_toml(
            o,
            &ports,
            relay,
            coap,
            metrics_port,
            &mqtt_toml,
            &work.join("mqtt-state"),
        ),
    )?;
    let mut gw = Proc(
        Command::new(&o.exe)
            .args(["--log", "warn", "serve", "--config"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join("serve.log"))?)
            .spawn()
            .with_context(|| format!("starting {} serve", o.exe.display()))?,
    );
    let gw_pid = gw.0.id();
    let up = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(st)) = gw.0.try_wait() {
            anyhow::bail!(
                "mintgate serve exited ({st}); see {}",
                work.join("serve.log").display()
            );
        }
        if scrape(metrics).is_ok() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < up,
            "mintgate serve did not answer on {metrics} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let clock = Clock::new();
    let stop = Arc::new(AtomicBool::new(false));
    let observed: Arrivals = Arc::default();
    let published: Arrivals = Arc::default();
    let obs = observe_thread(
        ([127, 0, 0, 1], coap).into(),
        clock,
        stop.clone(),
        observed.clone(),
    )?;
    let mut sc = SubscriberConfig::new(broker_url, "lab/fieldbus/d0.p0");
    sc.report_arrivals = true;
    let mut sub = Subscriber::start(sc)?;
    anyhow::ensure!(
        sub.wait_subscribed(Duration::from_secs(15)),
        "the lab's MQTT subscriber got no SUBACK from the {broker_name} broker"
    );
    let mq = mqtt_thread(sub, clock, stop.clone(), published.clone())?;
    progress(&format!(
        "lab fieldbus: mintgate serve (pid {gw_pid}) polls {} devices x {} points at {} Hz; broker {broker_name}; warming up {:?}",
        o.devices, o.points, o.hz, o.warmup
    ));
    std::thread::sleep(o.warmup);
    anyhow::ensure!(
        !observed.lock().expect("arrivals").is_empty(),
        "the Observe client got no notification of d0.p0 in the warm-up"
    );

    // The measured window.
    let period = o.period();
    let mut rng = rand::rngs::ChaCha12Rng::seed_from_u64(o.seed);
    let sim_pid = sim.proc.0.id();
    let broker_pid = mosquitto.as_ref().and_then(|m| m.pid());
    let load_before = loadavg();
    let m0 = scrape(metrics)?;
    let (g0, s0, b0) = (
        cpu_seconds(gw_pid).unwrap_or(0.0),
        cpu_seconds(sim_pid).unwrap_or(0.0),
        broker_pid.and_then(cpu_seconds).unwrap_or(0.0),
    );
    let t0 = Instant::now();
    let end = t0 + o.duration;
    let mut k: u32 = 0;
    let mut next_report = t0 + Duration::from_secs(5);
    loop {
        let gap = period.mul_f64(rng.random_range(2.0..4.0));
        let at = Instant::now() + gap;
        if at >= end {
            std::thread::sleep(end.saturating_duration_since(Instant::now()));
            break;
        }
        std::thread::sleep(gap);
        let i = (k % 1000) as u16;
        let value = if k.is_multiple_of(2) {
            6000 + i
        } else {
            1000 + i
        };
        sim.set(0, 0, value)?;
        k += 1;
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(5);
            let s = t0.elapsed().as_secs_f64();
            let cpu = (cpu_seconds(gw_pid).unwrap_or(0.0) - g0) / s * 100.0;
            progress(&format!(
                "lab fieldbus: {s:.0}/{:.0} s, {k} changes, gateway CPU {cpu:.1} % of one core so far",
                o.duration.as_secs_f64()
            ));
        }
        if let Ok(Some(st)) = gw.0.try_wait() {
            anyhow::bail!("mintgate serve exited during the run ({st})");
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let (g1, s1, b1) = (
        cpu_seconds(gw_pid).unwrap_or(0.0),
        cpu_seconds(sim_pid).unwrap_or(0.0),
        broker_pid.and_then(cpu_seconds).unwrap_or(0.0),
    );
    let m1 = scrape(metrics)?;
    let load_after = loadavg();
    // let the last change arrive everywhere
    std::thread::sleep(GIVE_UP.min(period * 4 + Duration::from_millis(500)));
    stop.store(true, Ordering::Relaxed);
    let obs_result = obs.join();
    let _ = mq.join();
    let events = sim.stop();
    gw.terminate(Duration::from_secs(5));
    if let Some(m) = mosquitto.as_mut() {
        m.stop();
    }
    if let Ok(Err(e)) = obs_result {
        progress(&format!("lab fieldbus: the Observe client: {e}"));
    }

    let observed = std::mem::take(&mut *observed.lock().expect("arrivals"));
    let published = std::mem::take(&mut *published.lock().expect("arrivals"));
    let changes = match_changes(&events, &observed, &published);
    let period_ms = period.as_secs_f64() * 1e3;
    let ends = [
        end_stats(&changes, "poll_read", |c| c.read, None),
        end_stats(
            &changes,
            "observe",
            |c| c.observe,
            Some(period_ms + SLACK_NOTIFY_MS),
        ),
        end_stats(
            &changes,
            "mqtt",
            |c| c.mqtt,
            Some(period_ms + SLACK_NOTIFY_MS),
        ),
        end_stats(
            &changes,
            "coil",
            |c| c.coil,
            Some(period_ms + SLACK_COIL_MS),
        ),
    ];

    // per device
    let groups = o.points.div_ceil(125) as f64;
    let delta = |fam: &str, name: &str| {
        by_connection(&m1, fam, None)
            .get(name)
            .copied()
            .unwrap_or(0.0)
            - by_connection(&m0, fam, None)
                .get(name)
                .copied()
                .unwrap_or(0.0)
    };
    let late = |q: &str| by_connection(&m1, "mintgate_field_poll_lateness_seconds", Some(q));
    let (l50, l99, lmax) = (late("0.5"), late("0.99"), late("1"));
    let rows: Vec<DeviceRow> = (0..o.devices)
        .map(|i| {
            let name = format!("d{i}");
            let req = delta("mintgate_field_polls_total", &name) / secs;
            let ms = |m: &HashMap<String, f64>| m.get(&name).copied().unwrap_or(f64::NAN) * 1e3;
            DeviceRow {
                requests_per_s: req,
                points_per_s: req / groups * o.points as f64,
                errors: delta("mintgate_field_errors_total", &name),
                skipped: delta("mintgate_field_skipped_polls_total", &name),
                late_ms: (ms(&l50), ms(&l99), ms(&lmax)),
                name,
            }
        })
        .collect();
    let req_s: f64 = rows.iter().map(|r| r.requests_per_s).sum();
    let pts_s: f64 = rows.iter().map(|r| r.points_per_s).sum();
    let errors: f64 = rows.iter().map(|r| r.errors).sum();
    let skipped: f64 = rows.iter().map(|r| r.skipped).sum();
    let worst = |f: fn(&DeviceRow) -> f64| rows.iter().map(f).fold(0.0, f64::max);
    let (w50, w99, wmax) = (
        worst(|r| r.late_ms.0),
        worst(|r| r.late_ms.1),
        worst(|r| r.late_ms.2),
    );
    let gw_cpu = (g1 - g0) / secs * 100.0;
    let sim_cpu = (s1 - s0) / secs * 100.0;
    let broker_cpu = (b1 - b0) / secs * 100.0;
    let due = o.devices as f64 * o.points as f64 * o.hz;

    // files
    let out = &o.common.out;
    let csv_path = out.join("fieldbus.csv");
    let mut csv = String::from("kind,name,metric,value\n");
    let mut put = |kind: &str, name: &str, metric: &str, v: f64| {
        csv.push_str(&format!("{kind},{name},{metric},{v}\n"));
    };
    put("run", "config", "devices", o.devices as f64);
    put("run", "config", "points", o.points as f64);
    put("run", "config", "hz", o.hz);
    put("run", "config", "seconds", secs);
    put("run", "gateway", "cpu_pct", gw_cpu);
    put("run", "simulators", "cpu_pct", sim_cpu);
    put("run", "broker", "cpu_pct", broker_cpu);
    put("run", "all", "points_per_s_due", due);
    put("run", "all", "points_per_s", pts_s);
    put("run", "all", "requests_per_s", req_s);
    put("run", "all", "errors", errors);
    put("run", "all", "skipped", skipped);
    put("run", "all", "lateness_p99_ms_worst", w99);
    for r in &rows {
        put("device", &r.name, "requests_per_s", r.requests_per_s);
        put("device", &r.name, "points_per_s", r.points_per_s);
        put("device", &r.name, "errors", r.errors);
        put("device", &r.name, "skipped", r.skipped);
        put("device", &r.name, "lateness_p50_ms", r.late_ms.0);
        put("device", &r.name, "lateness_p99_ms", r.late_ms.1);
        put("device", &r.name, "lateness_max_ms", r.late_ms.2);
    }
    for (i, c) in changes.iter().enumerate() {
        let n = i.to_string();
        let ms = |at: Option<u64>| at.map_or(f64::NAN, |a| (a as f64 - c.set as f64) / 1e6);
        put("sample", &n, "value", f64::from(c.value));
        put("sample", &n, "poll_read_ms", ms(c.read));
        put("sample", &n, "observe_ms", ms(c.observe));
        put("sample", &n, "mqtt_ms", ms(c.mqtt));
        put("sample", &n, "coil_ms", ms(c.coil));
    }
    let mut summary_rows = Vec::new();
    for e in &ends {
        let (p50, p99, max) = stats(&mut e.from_change.clone());
        let (r50, r99, rmax) = stats(&mut e.from_read.clone());
        put("latency", e.name, "samples", e.from_change.len() as f64);
        put("latency", e.name, "missed", e.missed as f64);
        put("latency", e.name, "p50_ms", p50);
        put("latency", e.name, "p99_ms", p99);
        put("latency", e.name, "max_ms", max);
        if e.name != "poll_read" {
            put("latency", e.name, "after_read_p50_ms", r50);
            put("latency", e.name, "after_read_p99_ms", r99);
            put("latency", e.name, "after_read_max_ms", rmax);
        }
        if let Some(t) = e.target_ms {
            put("latency", e.name, "target_p99_ms", t);
        }
        summary_rows.push((e, (p50, p99, max), (r50, r99, rmax)));
    }
    crate::write_file(&csv_path, &csv)?;
    let svg_path = out.join("fieldbus.svg");
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    crate::plot::fieldbus_svg(
        &svg_path,
        &format!(
            "Register change to each end: {} devices x {} points at {} Hz ({build})",
            o.devices, o.points, o.hz
        ),
        &ends
            .iter()
            .map(|e| (e.name.to_owned(), e.from_change.clone()))
            .collect::<Vec<_>>(),
        &[
            (
                format!("Observe, MQTT target: period + {SLACK_NOTIFY_MS} ms"),
                period_ms + SLACK_NOTIFY_MS,
            ),
            (
                format!("coil target: period + {SLACK_COIL_MS} ms"),
                period_ms + SLACK_COIL_MS,
            ),
        ],
    )?;

    // table
    let mut t = String::new();
    let mut met = true;
    line(
        &mut t,
        format_args!(
            "lab fieldbus ({build}): {} Modbus TCP devices x {} points at {} Hz (pymodbus {pymodbus}, one Python process), {secs:.1} s measured, seed {}",
            o.devices, o.points, o.hz, o.seed
        ),
    );
    line(
        &mut t,
        format_args!("machine load (1, 5, 15 min) before {load_before}, after {load_after}"),
    );
    line(
        &mut t,
        format_args!(
            "polled: {pts_s:.0} points/s (due {due:.0}), {req_s:.0} requests/s, {errors} errors, {skipped} polls skipped"
        ),
    );
    line(
        &mut t,
        format_args!(
            "CPU, % of one core: mintgate {gw_cpu:.1}, simulators {sim_cpu:.1}, broker {broker_cpu:.1} ({broker_name})"
        ),
    );
    line(
        &mut t,
        format_args!(
            "poll lateness since the gateway's start, worst device: p50 {w50:.2} ms, p99 {w99:.2} ms, most {wmax:.2} ms"
        ),
    );
    line(
        &mut t,
        format_args!(
            "{} changes of d0.p0 (poll period {period_ms:.1} ms); ms from the register change, and from the poll read that picked it up:",
            changes.len()
        ),
    );
    line(
        &mut t,
        format_args!(
            "  {:<10} {:>6} {:>7} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8}",
            "end", "seen", "missed", "p50", "p99", "most", "read p50", "read p99", "most"
        ),
    );
    for (e, (p50, p99, max), (r50, r99, rmax)) in &summary_rows {
        let after = if e.name == "poll_read" {
            format!("{:>8} {:>8} {:>8}", "-", "-", "-")
        } else {
            format!("{r50:>8.2} {r99:>8.2} {rmax:>8.2}")
        };
        line(
            &mut t,
            format_args!(
                "  {:<10} {:>6} {:>7} {p50:>8.2} {p99:>8.2} {max:>8.2} | {after}",
                e.name,
                e.from_change.len(),
                e.missed
            ),
        );
    }
    line(
        &mut t,
        format_args!(
            "anchor: ThingsBoard IoT gateway users report 100 % CPU and an unresponsive gateway at 50-200 Hz of Modbus polling; here {req_s:.0} requests/s ({pts_s:.0} points/s) took {gw_cpu:.1} % of one core"
        ),
    );
    let enough = !changes.is_empty();
    target_line(
        &mut t,
        &mut met,
        gw_cpu < CPU_TARGET,
        &format!("mintgate CPU under {CPU_TARGET} % of one core ({gw_cpu:.1} %)"),
    );
    target_line(
        &mut t,
        &mut met,
        w99 < LATENESS_TARGET_MS && pts_s >= 0.95 * due,
        &format!(
            "every poll on time: lateness p99 under {LATENESS_TARGET_MS} ms ({w99:.2} ms), points/s at least 95 % of due ({:.1} %)",
            pts_s / due * 100.0
        ),
    );
    for (e, (_, p99, _), _) in &summary_rows {
        if let Some(target) = e.target_ms {
            target_line(
                &mut t,
                &mut met,
                enough && e.missed == 0 && *p99 <= target,
                &format!(
                    "{} p99 within {target:.1} ms of the change ({p99:.2} ms, {} missed)",
                    e.name, e.missed
                ),
            );
        }
    }
    progress(&format!("lab fieldbus: wrote {}", csv_path.display()));
    Ok(Summary {
        lab: "fieldbus",
        table: t,
        files: vec![csv_path, svg_path],
        target_met: Some(met),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulator_lines_parse_and_others_are_ignored() {
        assert_eq!(
            parse_sim_line("set 0 0 6001 123"),
            Some(SimEvent::Set(0, 0, 6001, 123))
        );
        assert_eq!(
            parse_sim_line("read 3 7 99"),
            Some(SimEvent::Read(3, 7, 99))
        );
        assert_eq!(
            parse_sim_line("coil 0 1 5"),
            Some(SimEvent::Coil(0, true, 5))
        );
        assert_eq!(
            parse_sim_line("coil 0 0 5"),
            Some(SimEvent::Coil(0, false, 5))
        );
        assert_eq!(parse_sim_line("ready"), None);
        assert_eq!(parse_sim_line("set 0 0 70000 1"), None);
        assert_eq!(parse_sim_line("set x 0 1 1"), None);
    }

    #[test]
    fn each_change_takes_the_first_matching_arrival_after_it() {
        let ms = 1_000_000;
        let sim = [
            SimEvent::Set(0, 0, 6000, 10 * ms),
            SimEvent::Read(0, 0, 40 * ms),
            SimEvent::Coil(0, true, 42 * ms),
            SimEvent::Set(0, 0, 1001, 300 * ms),
            SimEvent::Read(0, 0, 350 * ms),
            // a coil written to the wrong state is not this change's
            SimEvent::Coil(0, true, 351 * ms),
            SimEvent::Coil(0, false, 352 * ms),
            // another device's read is not the probe's
            SimEvent::Set(0, 0, 6002, 600 * ms),
            SimEvent::Read(1, 0, 610 * ms),
        ];
        // an old value arriving after the change does not count
        let observe = [(5 * ms, 6000.0), (45 * ms, 6000.0), (355 * ms, 1001.0)];
        let mqtt = [(9 * ms, 6000.0), (44 * ms, 6000.0), (320 * ms, 6000.0)];
        let c = match_changes(&sim, &observe, &mqtt);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].read, Some(40 * ms));
        assert_eq!(c[0].observe, Some(45 * ms));
        assert_eq!(c[0].mqtt, Some(44 * ms));
        assert_eq!(c[0].coil, Some(42 * ms));
        assert_eq!(c[1].observe, Some(355 * ms));
        assert_eq!(c[1].mqtt, None);
        assert_eq!(c[1].coil, Some(352 * ms));
        assert_eq!(c[2].read, None);
        let e = end_stats(&c, "coil", |c| c.coil, Some(101.0));
        assert_eq!(e.missed, 1);
        assert_eq!(e.from_change, vec![32.0, 52.0]);
        assert_eq!(e.from_read, vec![2.0, 2.0]);
    }

    #[test]
    fn percentiles_take_the_sample_at_or_above_the_rank() {
        let mut v: Vec<f64> = (1..=200).map(f64::from).rev().collect();
        assert_eq!(stats(&mut v), (101.0, 199.0, 200.0));
        assert_eq!(stats(&mut []), (0.0, 0.0, 0.0));
        let mut one = [3.5];
        assert_eq!(stats(&mut one), (3.5, 3.5, 3.5));
    }

    proptest::proptest! {
        #[test]
        fn simulator_lines_round_trip(d in 0usize..200, a: u16, v: u16, t: u64, on: bool) {
            let set = SimEvent::Set(d, a, v, t);
            proptest::prop_assert_eq!(parse_sim_line(&format!("set {d} {a} {v} {t}")), Some(set));
            proptest::prop_assert_eq!(
                parse_sim_line(&format!("read {d} {a} {t}")),
                Some(SimEvent::Read(d, a, t))
            );
            proptest::prop_assert_eq!(
                parse_sim_line(&format!("coil {a} {} {t}", u8::from(on))),
                Some(SimEvent::Coil(a, on, t))
            );
        }

        #[test]
        fn any_text_parses_or_is_ignored(l in ".{0,80}") {
            let _ = parse_sim_line(&l);
            let _ = by_connection(&l, "mintgate_field_polls_total", Some("0.99"));
        }
    }

    #[test]
    fn metrics_are_read_per_connection() {
        let text = "mintgate_field_polls_total{connection=\"d0\"} 12\n\
                    mintgate_field_polls_total{connection=\"d1\"} 7\n\
                    mintgate_field_polls_totally{connection=\"d2\"} 1\n\
                    mintgate_field_poll_lateness_seconds{connection=\"d0\",quantile=\"0.5\"} 0.001\n\
                    mintgate_field_poll_lateness_seconds{connection=\"d0\",quantile=\"0.99\"} 0.004\n";
        let p = by_connection(text, "mintgate_field_polls_total", None);
        assert_eq!(p.len(), 2);
        assert_eq!(p["d1"], 7.0);
        let q = by_connection(text, "mintgate_field_poll_lateness_seconds", Some("0.99"));
        assert_eq!(q["d0"], 0.004);
    }
}
