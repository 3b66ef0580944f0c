//! The finder/linker: devices declared in the config or added through the
//! API, each with its driver, its latest value and bounded history, and
//! watchers (the gateway's Observe notifier); and the direct path's links,
//! resolved from device names.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::attr::{AttrFile, AttrMode};
use crate::config::{DeviceKind, DeviceSpec, DevicesConfig};
use crate::directpath::output::{ActuatorOut, LogOut, NotifyOut};
use crate::directpath::{
    DirectPath, DirectPathConfig, Filter, LinkId, LinkSpec, OutputSink, OutputSpec,
};
use crate::driver::{DeviceError, Direction, Driver, Running};
use crate::history::History;
use crate::sim::{Signal, SimActuator, SimSensor};
use crate::store::Store;

/// Told of every new value of a device: (device name, value, the time its
/// history recorded it in ms since the Unix epoch). Runs on the thread that
/// produced the value (a driver's event thread, a CoAP handler writing an
/// actuator, the direct path's worker); it must not block.
pub type WatchFn = Arc<dyn Fn(&str, f64, u64) + Send + Sync>;

/// One device.
pub struct Device {
    spec: DeviceSpec,
    input: u32,
    driver: Arc<dyn Driver>,
    history: History,
    watchers: RwLock<Vec<(u64, WatchFn)>>,
    next_watch: AtomicU64,
    running: Mutex<Option<Running>>,
    /// The history's update count already written to the store.
    flushed: AtomicU64,
}

impl Device {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Its declaration.
    pub fn spec(&self) -> &DeviceSpec {
        &self.spec
    }

    /// Sensor or actuator.
    pub fn direction(&self) -> Direction {
        self.driver.direction()
    }

    /// The input id its events carry on the direct path.
    pub fn input_id(&self) -> u32 {
        self.input
    }

    /// Its driver.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// Reads the device now (an actuator: the last value written).
    pub fn read(&self) -> Result<f64, DeviceError> {
        self.driver.read()
    }

    /// Writes an actuator and records the value; a value that is not finite
    /// is refused (no driver, history or representation can carry it).
    pub fn write(&self, value: f64) -> Result<(), DeviceError> {
        if !value.is_finite() {
            return Err(DeviceError::Config {
                name: self.spec.name.clone(),
                why: format!("{value} is not a finite value"),
            });
        }
        self.driver.write(value)?;
        self.record(value);
        Ok(())
    }

    /// Records a new value: history, then watchers.
    pub fn record(&self, value: f64) {
        let t = crate::clock::unix_ms();
        self.history.push_at(t, value);
        for (_, w) in self.watchers.read().iter() {
            w(&self.spec.name, value, t);
        }
    }

    /// The latest value and the bounded history.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Calls `f` with every new value; returns an id for [`Device::unwatch`].
    pub fn watch(&self, f: WatchFn) -> u64 {
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        self.watchers.write().push((id, f));
        id
    }

    /// Stops a watcher.
    pub fn unwatch(&self, id: u64) {
        self.watchers.write().retain(|(i, _)| *i != id);
    }

    fn stop(&self) {
        let r = self.running.lock().take();
        drop(r);
    }
}

/// Names a link refers to, so that removing a device removes its links.
struct LinkRefs {
    names: Vec<String>,
}

type DeviceMap = Arc<RwLock<BTreeMap<String, Arc<Device>>>>;

struct Inner {
    devices: DeviceMap,
    next_input: AtomicU32,
    dp: DirectPath,
    links: Mutex<HashMap<LinkId, LinkRefs>>,
    /// `directpath.max_links`.
    max_links: usize,
    store: Option<Store>,
    /// The store's flusher (dropped, so stopped and joined, with the last
    /// handle on the manager; it flushes once more as it stops).
    _flusher: Option<Running>,
}

/// Writes every device's new history records to the store.
fn flush(devices: &DeviceMap, store: &Store) {
    for d in devices.read().values() {
        let (new, now) = d.history.since(d.flushed.load(Ordering::Relaxed));
        match store.append(d.name(), &new, d.history.capacity()) {
            Ok(()) => d.flushed.store(now, Ordering::Relaxed),
            Err(e) => tracing::warn!(device = d.name(), error = %e, "cannot persist the history"),
        }
    }
}

/// Forces what was flushed to disk.
fn sync(store: &Store) {
    if let Err(e) = store.sync() {
        tracing::warn!(error = %e, "cannot sync the history store");
    }
}

/// The device manager. Cloning shares it.
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn cfg_err(spec: &DeviceSpec, why: impl Into<String>) -> DeviceError {
    DeviceError::Config {
        name: spec.name.clone(),
        why: why.into(),
    }
}

/// Most values a device's history keeps (about 24 MB of CSV when read).
pub const MAX_HISTORY: usize = 1_000_000;

/// Why an actuator cannot be a link's input: its writes are no events on
/// the direct path (and a link from one actuator to another could loop).
fn not_an_input(name: &str) -> String {
    format!("`{name}` is an actuator: a link's input must be a sensor")
}

fn period(spec: &DeviceSpec) -> Result<Option<Duration>, DeviceError> {
    spec.period
        .as_deref()
        .map(|p| {
            crate::parse::duration(p)
                .map_err(|e| cfg_err(spec, format!("period: {e}")))
                .and_then(|d| {
                    if d < Duration::from_micros(100) {
                        Err(cfg_err(spec, "period must be at least 100us"))
                    } else {
                        Ok(d)
                    }
                })
        })
        .transpose()
}

/// Checks a declaration without touching any device: its name, that it
/// sets what its kind needs and nothing that only other kinds use, and that
/// its signal, period, debounce and notify_every parse. What only the
/// device can tell (a missing file or GPIO chip) is left to
/// [`build_driver`].
pub fn check_spec(spec: &DeviceSpec) -> Result<(), DeviceError> {
    if !crate::directpath::link::valid_name(&spec.name) {
        return Err(cfg_err(spec, "a name is 1-32 of A-Z a-z 0-9 _ - ."));
    }
    if !(1..=MAX_HISTORY).contains(&spec.history) {
        return Err(cfg_err(
            spec,
            format!("history {} is outside 1..={MAX_HISTORY}", spec.history),
        ));
    }
    let k = spec.kind;
    for (set, field, kinds) in [
        (
            spec.signal.is_some(),
            "signal",
            &[DeviceKind::SimSensor][..],
        ),
        (
            spec.path.is_some(),
            "path",
            &[DeviceKind::AttrSensor, DeviceKind::AttrActuator][..],
        ),
        (
            spec.keep_open,
            "keep_open",
            &[DeviceKind::AttrSensor, DeviceKind::AttrActuator][..],
        ),
        (
            spec.chip.is_some(),
            "chip",
            &[DeviceKind::GpioIn, DeviceKind::GpioOut][..],
        ),
        (
            spec.line.is_some(),
            "line",
            &[DeviceKind::GpioIn, DeviceKind::GpioOut][..],
        ),
        (
            spec.debounce.is_some(),
            "debounce",
            &[DeviceKind::GpioIn][..],
        ),
        (
            spec.period.is_some(),
            "period",
            &[
                DeviceKind::SimSensor,
                DeviceKind::AttrSensor,
                DeviceKind::Modbus,
                DeviceKind::Opcua,
            ][..],
        ),
        (spec.host.is_some(), "host", &[DeviceKind::Modbus][..]),
        (spec.serial.is_some(), "serial", &[DeviceKind::Modbus][..]),
        (spec.baud.is_some(), "baud", &[DeviceKind::Modbus][..]),
        (spec.parity.is_some(), "parity", &[DeviceKind::Modbus][..]),
        (
            spec.stop_bits.is_some(),
            "stop_bits",
            &[DeviceKind::Modbus][..],
        ),
        (spec.unit_id.is_some(), "unit_id", &[DeviceKind::Modbus][..]),
        (
            spec.timeout.is_some(),
            "timeout",
            &[DeviceKind::Modbus, DeviceKind::Opcua][..],
        ),
        (spec.retries.is_some(), "retries", &[DeviceKind::Modbus][..]),
        (!spec.points.is_empty(), "points", &[DeviceKind::Modbus][..]),
        (spec.endpoint.is_some(), "endpoint", UA),
        (spec.security_policy.is_some(), "security_policy", UA),
        (spec.security_mode.is_some(), "security_mode", UA),
        (spec.certificate.is_some(), "certificate", UA),
        (spec.private_key.is_some(), "private_key", UA),
        (spec.application_uri.is_some(), "application_uri", UA),
        (spec.server_certificate.is_some(), "server_certificate", UA),
        (
            spec.trusted_certificates.is_some(),
            "trusted_certificates",
            UA,
        ),
        (
            spec.trust_any_server_certificate,
            "trust_any_server_certificate",
            UA,
        ),
        (spec.user.is_some(), "user", UA),
        (spec.password_file.is_some(), "password_file", UA),
        (spec.password_env.is_some(), "password_env", UA),
        (
            spec.publishing_interval.is_some(),
            "publishing_interval",
            UA,
        ),
        (!spec.nodes.is_empty(), "nodes", UA),
    ] {
        if set && !kinds.contains(&k) {
            return Err(cfg_err(
                spec,
                format!("`{field}` does not apply to a {k:?} device"),
            ));
        }
    }
    spec.notify_period()?;
    period(spec)?;
    match spec.kind {
        DeviceKind::SimSensor => {
            spec.signal
                .as_deref()
                .ok_or_else(|| cfg_err(spec, "needs `signal`, e.g. \"sine(22, 3, 60s)\""))?
                .parse::<Signal>()
                .map_err(|e: String| cfg_err(spec, format!("signal: {e}")))?;
        }
        DeviceKind::AttrSensor | DeviceKind::AttrActuator if spec.path.is_none() => {
            return Err(cfg_err(spec, "needs `path`"));
        }
        DeviceKind::GpioIn | DeviceKind::GpioOut if spec.line.is_none() => {
            return Err(cfg_err(spec, "needs `line` (an offset or a line name)"));
        }
        DeviceKind::Modbus => {
            modbus_endpoint(spec)?;
            modbus_points(spec)?;
        }
        DeviceKind::Opcua => {
            opcua_endpoint(spec, &opcua_nodes(spec)?, false)?;
        }
        _ => {}
    }
    if let Some(d) = &spec.debounce {
        crate::parse::duration(d).map_err(|e| cfg_err(spec, format!("debounce: {e}")))?;
    }
    Ok(())
}

/// A field device's `timeout`, `1ms..=60s` (`default` when absent).
fn field_timeout(spec: &DeviceSpec, default: Duration) -> Result<Duration, DeviceError> {
    let Some(t) = spec.timeout.as_deref() else {
        return Ok(default);
    };
    let d = crate::parse::duration(t).map_err(|e| cfg_err(spec, format!("timeout: {e}")))?;
    if (Duration::from_millis(1)..=Duration::from_secs(60)).contains(&d) {
        Ok(d)
    } else {
        Err(cfg_err(spec, format!("timeout `{t}` is outside 1ms..=60s")))
    }
}

/// The keys only an OPC UA device takes.
const UA: &[DeviceKind] = &[DeviceKind::Opcua];

/// An OPC UA device's connection settings, checked; the password is read
/// (from its file or environment variable) only when `secrets` is set, so
/// that a config check needs neither.
fn opcua_endpoint(
    spec: &DeviceSpec,
    nodes: &[(crate::opcua::NodeSpec, crate::opcua::NodeId, Duration)],
    secrets: bool,
) -> Result<crate::opcua::client::Endpoint, DeviceError> {
    use crate::opcua::{Mode, Policy};
    let url = spec.endpoint.as_deref().ok_or_else(|| {
        cfg_err(
            spec,
            "needs `endpoint`, e.g. \"opc.tcp://192.0.2.20:4840/\"",
        )
    })?;
    let host = url.strip_prefix("opc.tcp://").unwrap_or_default();
    if host.is_empty()
        || host.starts_with(['/', ':'])
        || url.len() > 1024
        || url.contains(char::is_whitespace)
    {
        return Err(cfg_err(
            spec,
            format!("endpoint: `{url}` is not an opc.tcp://host:port/path URL"),
        ));
    }
    let policy = spec.security_policy.unwrap_or_default();
    let mode = spec.security_mode.unwrap_or(match policy {
        Policy::None => Mode::None,
        Policy::Basic256Sha256 => Mode::SignAndEncrypt,
    });
    match (policy, mode) {
        (Policy::None, Mode::None)
        | (Policy::Basic256Sha256, Mode::Sign | Mode::SignAndEncrypt) => {}
        (Policy::None, m) => {
            return Err(cfg_err(
                spec,
                format!("security_mode {m:?} needs security_policy \"Basic256Sha256\""),
            ))
        }
        (p, Mode::None) => {
            return Err(cfg_err(
                spec,
                format!("security_policy {p:?} needs security_mode \"Sign\" or \"SignAndEncrypt\""),
            ))
        }
    }
    if spec.certificate.is_some() != spec.private_key.is_some() {
        return Err(cfg_err(spec, "`certificate` and `private_key` go together"));
    }
    let mut trust: Vec<std::path::PathBuf> = Vec::new();
    trust.extend(spec.server_certificate.clone());
    trust.extend(spec.trusted_certificates.clone());
    if policy != Policy::None {
        if spec.certificate.is_none() {
            return Err(cfg_err(
                spec,
                format!("security_policy {policy:?} needs `certificate` and `private_key` (the client's)"),
            ));
        }
        if trust.is_empty() && !spec.trust_any_server_certificate {
            return Err(cfg_err(
                spec,
                format!(
                    "security_policy {policy:?} needs the server's certificate trusted: \
                     `server_certificate` or `trusted_certificates` \
                     (or, on a test bench only, trust_any_server_certificate = true)"
                ),
            ));
        }
    }
    let password = match (&spec.user, &spec.password_file, &spec.password_env) {
        (None, None, None) => None,
        (None, _, _) => {
            return Err(cfg_err(spec, "a password without `user`"));
        }
        (Some(_), Some(_), Some(_)) => {
            return Err(cfg_err(spec, "`password_file` or `password_env`, not both"));
        }
        (Some(u), None, None) => {
            return Err(cfg_err(
                spec,
                format!("user `{u}` needs `password_file` or `password_env` (a password is never written in the config)"),
            ));
        }
        (Some(_), file, env) if secrets => {
            Some(read_password(spec, file.as_deref(), env.as_deref())?)
        }
        (Some(_), _, _) => Some(crate::opcua::client::Secret(String::new())),
    };
    let timeout = field_timeout(spec, crate::opcua::DEFAULT_TIMEOUT)?;
    let publishing = match spec.publishing_interval.as_deref() {
        None => nodes
            .iter()
            .map(|n| n.2)
            .min()
            .unwrap_or(crate::opcua::DEFAULT_PERIOD),
        Some(t) => crate::parse::duration(t)
            .map_err(|e| cfg_err(spec, format!("publishing_interval: {e}")))?,
    };
    if publishing < crate::opcua::MIN_PERIOD {
        return Err(cfg_err(
            spec,
            format!(
                "publishing_interval is at least {:?}",
                crate::opcua::MIN_PERIOD
            ),
        ));
    }
    Ok(crate::opcua::client::Endpoint {
        name: spec.name.clone(),
        url: url.to_string(),
        policy,
        mode,
        certificate: spec.certificate.clone(),
        private_key: spec.private_key.clone(),
        application_uri: spec
            .application_uri
            .clone()
            .unwrap_or_else(|| "urn:mintgate:gateway".into()),
        trust,
        trust_any: spec.trust_any_server_certificate,
        user: spec.user.clone().zip(password),
        timeout,
        publishing,
    })
}

/// The password from its file (its first line, at most 1 KiB) or its
/// environment variable; an error names the source, never the password.
fn read_password(
    spec: &DeviceSpec,
    file: Option<&std::path::Path>,
    env: Option<&str>,
) -> Result<crate::opcua::client::Secret, DeviceError> {
    use std::io::Read as _;
    let text = match (file, env) {
        (Some(f), _) => {
            let mut buf = Vec::new();
            std::fs::File::open(f)
                .and_then(|h| h.take(1025).read_to_end(&mut buf))
                .map_err(|e| cfg_err(spec, format!("password_file {}: {e}", f.display())))?;
            if buf.len() > 1024 {
                return Err(cfg_err(
                    spec,
                    format!("password_file {}: longer than 1 KiB", f.display()),
                ));
            }
            let t = String::from_utf8(buf)
                .map_err(|_| cfg_err(spec, format!("password_file {}: not UTF-8", f.display())))?;
            t.lines().next().unwrap_or_default().to_string()
        }
        (None, Some(v)) => {
            std::env::var(v).map_err(|_| cfg_err(spec, format!("password_env: ${v} is not set")))?
        }
        (None, None) => String::new(),
    };
    if text.is_empty() {
        return Err(cfg_err(spec, "the password is empty"));
    }
    Ok(crate::opcua::client::Secret(text))
}

/// An OPC UA device's nodes, checked, each with its parsed id and
/// sampling interval.
fn opcua_nodes(
    spec: &DeviceSpec,
) -> Result<Vec<(crate::opcua::NodeSpec, crate::opcua::NodeId, Duration)>, DeviceError> {
    use crate::opcua::{check_node, DEFAULT_PERIOD, MAX_NODES, MIN_PERIOD};
    item_count(spec, "nodes", spec.nodes.len(), MAX_NODES)?;
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(spec.nodes.len());
    for n in &spec.nodes {
        let id = check_node(n).map_err(|e| cfg_err(spec, e))?;
        point_name(spec, &n.name, &mut names)?;
        let period = point_period(
            spec,
            &n.name,
            n.period.as_deref(),
            DEFAULT_PERIOD,
            MIN_PERIOD,
        )?;
        out.push((n.clone(), id, period));
    }
    Ok(out)
}

/// Checks that `spec` lists 1 to `max` of its `key` (`points`, `nodes`).
fn item_count(spec: &DeviceSpec, key: &str, n: usize, max: usize) -> Result<(), DeviceError> {
    if (1..=max).contains(&n) {
        return Ok(());
    }
    Err(cfg_err(
        spec,
        format!("needs 1 to {max} `{key}` ([[devices.list.{key}]]), has {n}"),
    ))
}

/// Checks the name of a point (or node) of `spec`: valid as part of its
/// device's name, and not taken by another point of it.
fn point_name<'a>(
    spec: &DeviceSpec,
    name: &'a str,
    names: &mut std::collections::HashSet<&'a str>,
) -> Result<(), DeviceError> {
    if !crate::directpath::link::valid_name(name)
        || !crate::directpath::link::valid_name(&format!("{}.{name}", spec.name))
    {
        return Err(cfg_err(
            spec,
            format!(
                "point `{name}`: the device `{}.{name}` needs a name of 1-32 of A-Z a-z 0-9 _ - .",
                spec.name
            ),
        ));
    }
    if !names.insert(name) {
        return Err(cfg_err(spec, format!("point `{name}` is declared twice")));
    }
    Ok(())
}

/// A point's period: its own, else the device's, else `default`; at least
/// `min`.
fn point_period(
    spec: &DeviceSpec,
    name: &str,
    own: Option<&str>,
    default: Duration,
    min: Duration,
) -> Result<Duration, DeviceError> {
    let period = match own.or(spec.period.as_deref()) {
        None => default,
        Some(t) => crate::parse::duration(t)
            .map_err(|e| cfg_err(spec, format!("point `{name}`: period: {e}")))?,
    };
    if period < min {
        return Err(cfg_err(
            spec,
            format!("point `{name}`: a period is at least {min:?}"),
        ));
    }
    Ok(period)
}

/// A Modbus device's connection settings, checked.
fn modbus_endpoint(spec: &DeviceSpec) -> Result<crate::modbus::client::Endpoint, DeviceError> {
    let (host, serial) = match (spec.host.as_deref(), spec.serial.as_deref()) {
        (Some(h), None) => (modbus_host(spec, h)?, None),
        (None, Some(path)) => (path.to_string(), Some(serial_line(spec)?)),
        (Some(_), Some(_)) => {
            return Err(cfg_err(spec, "`host` (TCP) or `serial` (RTU), not both"))
        }
        (None, None) => {
            return Err(cfg_err(
                spec,
                "needs `host`, e.g. \"192.0.2.10:502\", or `serial`, e.g. \"/dev/ttyUSB0\"",
            ))
        }
    };
    if serial.is_none() {
        for (set, key) in [
            (spec.baud.is_some(), "baud"),
            (spec.parity.is_some(), "parity"),
            (spec.stop_bits.is_some(), "stop_bits"),
        ] {
            if set {
                return Err(cfg_err(
                    spec,
                    format!("`{key}` is for a serial (RTU) device"),
                ));
            }
        }
    }
    let timeout = field_timeout(spec, crate::modbus::DEFAULT_TIMEOUT)?;
    let retries = spec.retries.unwrap_or(crate::modbus::DEFAULT_RETRIES);
    if retries > 10 {
        return Err(cfg_err(
            spec,
            format!("retries {retries} is outside 0..=10"),
        ));
    }
    Ok(crate::modbus::client::Endpoint {
        name: spec.name.clone(),
        host,
        serial,
        unit_id: spec.unit_id.unwrap_or(1),
        timeout,
        retries,
    })
}

/// `host` as `host:port` (port 502 when left out), checked.
fn modbus_host(spec: &DeviceSpec, host: &str) -> Result<String, DeviceError> {
    // host:port, [v6]:port, or a host alone
    Ok(match host.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) => {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| cfg_err(spec, format!("host: `{p}` is not a port (1-65535)")))?;
            host.to_string()
        }
        _ if host.is_empty() || host.contains(char::is_whitespace) => {
            return Err(cfg_err(
                spec,
                format!("host: `{host}` is not a host[:port]"),
            ))
        }
        _ if host.contains(':') => format!("[{host}]:502"),
        _ => format!("{host}:502"),
    })
}

/// An RTU device's serial line settings, checked.
fn serial_line(spec: &DeviceSpec) -> Result<crate::modbus::bus::SerialLine, DeviceError> {
    let baud = spec.baud.unwrap_or(9600);
    if !(300..=4_000_000).contains(&baud) {
        return Err(cfg_err(
            spec,
            format!("baud {baud} is outside 300..=4000000"),
        ));
    }
    let stop_bits = spec.stop_bits.unwrap_or(1);
    if !(1..=2).contains(&stop_bits) {
        return Err(cfg_err(
            spec,
            format!("stop_bits {stop_bits} is not 1 or 2"),
        ));
    }
    Ok(crate::modbus::bus::SerialLine {
        baud,
        parity: spec.parity.unwrap_or(crate::modbus::bus::Parity::Even),
        stop_bits,
    })
}

/// A Modbus device's points, checked, each with its poll period.
fn modbus_points(
    spec: &DeviceSpec,
) -> Result<Vec<(crate::modbus::PointSpec, Duration)>, DeviceError> {
    use crate::modbus::{check_point, DEFAULT_PERIOD, MAX_POINTS, MIN_PERIOD};
    item_count(spec, "points", spec.points.len(), MAX_POINTS)?;
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(spec.points.len());
    for p in &spec.points {
        check_point(p).map_err(|e| cfg_err(spec, e))?;
        point_name(spec, &p.name, &mut names)?;
        let period = point_period(
            spec,
            &p.name,
            p.period.as_deref(),
            DEFAULT_PERIOD,
            MIN_PERIOD,
        )?;
        out.push((p.clone(), period));
    }
    Ok(out)
}

/// Checks a whole `[devices]` and `[directpath]` configuration without
/// starting anything: every declaration ([`check_spec`]), names unique, the
/// worker's priority, and every link's syntax and filters. Whether a link's
/// devices and outputs exist is [`check_links`]'s question: a program may
/// add devices and register output kinds before it adds the links.
pub fn check_config(devices: &DevicesConfig, dp: &DirectPathConfig) -> Result<(), DeviceError> {
    devices.store_sync_period()?;
    let mut names = std::collections::HashSet::new();
    let mut buses = HashMap::new();
    for spec in &devices.list {
        check_spec(spec)?;
        if let (Some(path), DeviceKind::Modbus) = (&spec.serial, spec.kind) {
            let line = serial_line(spec)?;
            if *buses.entry(path.as_str()).or_insert(line) != line {
                return Err(cfg_err(
                    spec,
                    format!("every device on serial port {path} needs the same baud, parity and stop_bits"),
                ));
            }
        }
    }
    for spec in devices.devices() {
        if !names.insert(spec.name.clone()) {
            return Err(DeviceError::Exists(spec.name));
        }
    }
    if dp.priority > 99 {
        return Err(DeviceError::Config {
            name: "directpath.priority".into(),
            why: format!("{} is outside 0..=99", dp.priority),
        });
    }
    if !(1..=crate::directpath::MAX_LINKS_LIMIT).contains(&dp.max_links) {
        return Err(DeviceError::Config {
            name: "directpath.max_links".into(),
            why: format!(
                "{} is outside 1..={}",
                dp.max_links,
                crate::directpath::MAX_LINKS_LIMIT
            ),
        });
    }
    if dp.links.len() > dp.max_links {
        return Err(DeviceError::Config {
            name: "directpath.links".into(),
            why: format!(
                "{} links, above directpath.max_links ({})",
                dp.links.len(),
                dp.max_links
            ),
        });
    }
    for l in &dp.links {
        parse_link(l)?;
    }
    Ok(())
}

/// Parses a configured link and builds its filters' specs.
fn parse_link(l: &str) -> Result<LinkSpec, DeviceError> {
    let spec: LinkSpec = l.parse().map_err(|why| link_err(l, why))?;
    for f in &spec.filters {
        Filter::spec(f.clone()).map_err(|why| link_err(l, why))?;
    }
    if spec.outputs.is_empty() {
        return Err(link_err(l, "a link needs at least one output".into()));
    }
    Ok(spec)
}

fn link_err(l: &str, why: String) -> DeviceError {
    DeviceError::Config {
        name: "directpath.links".into(),
        why: format!("`{l}`: {why}"),
    }
}

/// Checks that the configured links resolve when the configured devices
/// are all there is: each link's devices exist, actuator outputs are
/// actuators, and custom outputs are among `output_kinds` (the kinds that
/// will be registered, e.g. `mqtt` when the bridges run). Returns the
/// custom outputs as (kind, argument) for the caller to check further.
pub fn check_links(
    devices: &DevicesConfig,
    dp: &DirectPathConfig,
    output_kinds: &[&str],
) -> Result<Vec<(String, String)>, DeviceError> {
    let all = devices.devices();
    let kinds: HashMap<&str, bool> = all
        .iter()
        .map(|s| (s.name.as_str(), s.is_actuator()))
        .collect();
    let mut custom = Vec::new();
    for l in &dp.links {
        let spec = parse_link(l)?;
        let err = |why: String| link_err(l, why);
        match kinds.get(spec.input.as_str()) {
            None => return Err(err(format!("no device named `{}`", spec.input))),
            Some(true) => return Err(err(not_an_input(&spec.input))),
            Some(_) => {}
        }
        for o in &spec.outputs {
            match o {
                OutputSpec::Actuator(n) => match kinds.get(n.as_str()) {
                    None => return Err(err(format!("no device named `{n}`"))),
                    Some(false) => return Err(err(format!("`{n}` is a sensor, not an actuator"))),
                    Some(_) => {}
                },
                OutputSpec::Notify(n) if !kinds.contains_key(n.as_str()) => {
                    return Err(err(format!("no device named `{n}`")))
                }
                OutputSpec::Custom { kind, arg } => {
                    if !output_kinds.contains(&kind.as_str()) {
                        return Err(err(format!(
                            "unknown output `{kind}` (known here: actuator, notify, log{}{})",
                            if output_kinds.is_empty() { "" } else { ", " },
                            output_kinds.join(", ")
                        )));
                    }
                    custom.push((kind.clone(), arg.clone()));
                }
                _ => {}
            }
        }
    }
    Ok(custom)
}

/// The finder: builds the driver a declaration asks for, checking it first
/// with [`check_spec`].
pub fn build_driver(spec: &DeviceSpec) -> Result<Arc<dyn Driver>, DeviceError> {
    check_spec(spec)?;
    let need_path = || {
        spec.path
            .clone()
            .ok_or_else(|| cfg_err(spec, "needs `path`"))
    };
    let mode = if spec.keep_open {
        AttrMode::KeepOpen
    } else {
        AttrMode::Reopen
    };
    let gpio = || -> Result<(std::path::PathBuf, u32), DeviceError> {
        let line = spec
            .line
            .as_ref()
            .ok_or_else(|| cfg_err(spec, "needs `line` (an offset or a line name)"))?;
        crate::gpio::resolve(spec.chip.as_deref(), line)
    };
    Ok(match spec.kind {
        DeviceKind::SimSensor => {
            let signal: Signal = spec
                .signal
                .as_deref()
                .ok_or_else(|| cfg_err(spec, "needs `signal`, e.g. \"sine(22, 3, 60s)\""))?
                .parse()
                .map_err(|e: String| cfg_err(spec, format!("signal: {e}")))?;
            let p = period(spec)?.unwrap_or(crate::config::SIM_DEFAULT_PERIOD);
            Arc::new(SimSensor::new(
                signal,
                p,
                spec.seed.unwrap_or_else(|| fnv(&spec.name)),
            )?)
        }
        DeviceKind::SimActuator => Arc::new(SimActuator::new()),
        DeviceKind::AttrSensor => Arc::new(AttrFile::open(
            need_path()?,
            Direction::Sensor,
            mode,
            period(spec)?,
        )?),
        DeviceKind::AttrActuator => Arc::new(AttrFile::open(
            need_path()?,
            Direction::Actuator,
            mode,
            None,
        )?),
        DeviceKind::GpioIn => {
            let (chip, off) = gpio()?;
            let debounce = spec
                .debounce
                .as_deref()
                .map(crate::parse::duration)
                .transpose()
                .map_err(|e| cfg_err(spec, format!("debounce: {e}")))?;
            Arc::new(crate::gpio::GpioIn::open(&chip, off, debounce)?)
        }
        DeviceKind::GpioOut => {
            let (chip, off) = gpio()?;
            Arc::new(crate::gpio::GpioOut::open(&chip, off)?)
        }
        DeviceKind::Modbus | DeviceKind::Opcua => {
            return Err(cfg_err(
                spec,
                "a field device's points share its connection: add it with DeviceManager::add_all",
            ))
        }
    })
}

impl DeviceManager {
    /// A manager with no devices, its direct path started with `dp`.
    pub fn new(dp: &DirectPathConfig) -> Result<DeviceManager, DeviceError> {
        DeviceManager::with_store(dp, None)
    }

    /// A manager whose device histories are loaded from and kept in
    /// `store`: flushed every second by a thread of its own, synced every
    /// [`Store::sync_every`], and flushed and synced once more when the
    /// last handle on the manager is dropped (a clean shutdown).
    pub fn with_store(
        dp: &DirectPathConfig,
        store: Option<Store>,
    ) -> Result<DeviceManager, DeviceError> {
        let max_links = dp.max_links;
        let dp = DirectPath::start(dp).map_err(|source| DeviceError::Io {
            what: "starting the direct path worker".into(),
            cause: source,
        })?;
        let devices: DeviceMap = Arc::default();
        let flusher = match &store {
            None => None,
            Some(st) => {
                let (devs, st) = (devices.clone(), st.clone());
                Some(Running::spawn("history-store", move |stop| {
                    let sync_ns = st.sync_every().as_nanos().min(u64::MAX as u128) as u64;
                    let mut next = crate::clock::now_ns();
                    let mut next_sync = next.saturating_add(sync_ns);
                    loop {
                        next += 1_000_000_000;
                        let more = crate::driver::sleep_until(next, &stop);
                        flush(&devs, &st);
                        if !more {
                            sync(&st);
                            break;
                        }
                        let now = crate::clock::now_ns();
                        if now >= next_sync {
                            sync(&st);
                            next_sync = now.saturating_add(sync_ns);
                        }
                    }
                })?)
            }
        };
        Ok(DeviceManager {
            inner: Arc::new(Inner {
                devices,
                next_input: AtomicU32::new(0),
                dp,
                links: Mutex::new(HashMap::new()),
                max_links: max_links.max(1),
                store,
                _flusher: flusher,
            }),
        })
    }

    /// A manager with the configured devices and links (and their
    /// histories restored when `devices.store` is set).
    pub fn start(
        devices: &DevicesConfig,
        dp: &DirectPathConfig,
    ) -> Result<DeviceManager, DeviceError> {
        let every = devices.store_sync_period()?;
        let store = devices
            .store
            .as_ref()
            .map(|d| Store::open(d).map(|s| s.with_sync_every(every)))
            .transpose()?;
        let m = DeviceManager::with_store(dp, store)?;
        for spec in &devices.list {
            m.add_all(spec.clone())?;
        }
        m.add_links(&dp.links)?;
        Ok(m)
    }

    /// Adds links written in the link syntax (the config's
    /// `directpath.links`); the first that fails stops with an error naming
    /// it. A caller that registers output kinds (`mqtt`) starts the manager
    /// with no links, registers them, then adds the configured links here.
    pub fn add_links(&self, links: &[String]) -> Result<(), DeviceError> {
        for l in links {
            self.add_link(l).map_err(|why| DeviceError::Config {
                name: "directpath.links".into(),
                why: format!("`{l}`: {why}"),
            })?;
        }
        Ok(())
    }

    /// The direct path.
    pub fn directpath(&self) -> &DirectPath {
        &self.inner.dp
    }

    /// Adds and starts the devices a declaration makes: itself, or a
    /// field device's points (Modbus) or nodes (OPC UA) (all or none: the first that cannot be added
    /// removes those added before it).
    pub fn add_all(&self, spec: DeviceSpec) -> Result<Vec<Arc<Device>>, DeviceError> {
        if !matches!(spec.kind, DeviceKind::Modbus | DeviceKind::Opcua) {
            return self.add(spec).map(|d| vec![d]);
        }
        check_spec(&spec)?;
        spec.notify_period()?;
        let specs = spec.expand();
        for s in &specs {
            if self.inner.devices.read().contains_key(&s.name) {
                return Err(DeviceError::Exists(s.name.clone()));
            }
        }
        let drivers: Vec<Arc<dyn Driver>> = if spec.kind == DeviceKind::Opcua {
            let nodes = opcua_nodes(&spec)?;
            let ep = opcua_endpoint(&spec, &nodes, true)?;
            crate::opcua::client::Connection::start(ep, nodes)?
                .into_iter()
                .map(|d| Arc::new(d) as Arc<dyn Driver>)
                .collect()
        } else {
            crate::modbus::client::Connection::start(
                modbus_endpoint(&spec)?,
                modbus_points(&spec)?,
            )?
            .into_iter()
            .map(|d| Arc::new(d) as Arc<dyn Driver>)
            .collect()
        };
        let mut added = Vec::with_capacity(specs.len());
        for (s, d) in specs.into_iter().zip(drivers) {
            match self.insert(s, d) {
                Ok(dev) => added.push(dev),
                Err(e) => {
                    for dev in &added {
                        let _ = self.remove(dev.name());
                    }
                    return Err(e);
                }
            }
        }
        Ok(added)
    }

    /// Adds and starts a device (a field device: [`DeviceManager::add_all`]).
    pub fn add(&self, spec: DeviceSpec) -> Result<Arc<Device>, DeviceError> {
        if self.inner.devices.read().contains_key(&spec.name) {
            return Err(DeviceError::Exists(spec.name));
        }
        spec.notify_period()?;
        let driver = build_driver(&spec)?;
        self.insert(spec, driver)
    }

    /// Adds a device with its driver built, and starts it.
    fn insert(
        &self,
        spec: DeviceSpec,
        driver: Arc<dyn Driver>,
    ) -> Result<Arc<Device>, DeviceError> {
        let dev = Arc::new(Device {
            input: self.inner.next_input.fetch_add(1, Ordering::Relaxed),
            history: History::new(spec.history),
            spec,
            driver,
            watchers: RwLock::new(Vec::new()),
            next_watch: AtomicU64::new(1),
            running: Mutex::new(None),
            flushed: AtomicU64::new(0),
        });
        if let Some(st) = &self.inner.store {
            for r in st.load(dev.name(), dev.history.capacity())? {
                dev.history.push_at(r.unix_ms, r.value);
            }
            dev.flushed.store(dev.history.updates(), Ordering::Relaxed);
        }
        if dev.direction() == Direction::Sensor {
            // the first value, so that a read-out and an observer have one
            if let Ok(v) = dev.read() {
                dev.history.push(v);
            }
        }
        {
            let mut devs = self.inner.devices.write();
            if devs.contains_key(dev.name()) {
                return Err(DeviceError::Exists(dev.name().to_string()));
            }
            devs.insert(dev.name().to_string(), dev.clone());
        }
        let inj = self.inner.dp.injector();
        let weak: Weak<Device> = Arc::downgrade(&dev);
        let input = dev.input;
        let started = dev.driver.start(Arc::new(move |v, t| {
            inj.push(input, v, t);
            if let Some(d) = weak.upgrade() {
                d.record(v);
            }
        }));
        match started {
            Ok(r) => *dev.running.lock() = r,
            Err(e) => {
                self.inner.devices.write().remove(dev.name());
                return Err(e);
            }
        }
        tracing::info!(device = dev.name(), kind = ?dev.spec.kind, "device added");
        Ok(dev)
    }

    /// Stops and removes a device, and every link that names it.
    pub fn remove(&self, name: &str) -> Result<Arc<Device>, DeviceError> {
        let dev = self
            .inner
            .devices
            .write()
            .remove(name)
            .ok_or_else(|| DeviceError::NotFound(name.to_string()))?;
        let ids: Vec<LinkId> = {
            let mut links = self.inner.links.lock();
            let ids: Vec<LinkId> = links
                .iter()
                .filter(|(_, r)| r.names.iter().any(|n| n == name))
                .map(|(id, _)| *id)
                .collect();
            for id in &ids {
                links.remove(id);
            }
            ids
        };
        self.inner.dp.remove_links_where(|l| ids.contains(&l.id));
        dev.stop();
        tracing::info!(device = name, links_removed = ids.len(), "device removed");
        Ok(dev)
    }

    /// The device called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Device>> {
        self.inner.devices.read().get(name).cloned()
    }

    /// Every device, by name.
    pub fn list(&self) -> Vec<Arc<Device>> {
        self.inner.devices.read().values().cloned().collect()
    }

    /// Adds a link written in the link syntax; returns its id.
    pub fn add_link(&self, text: &str) -> Result<LinkId, String> {
        let spec: LinkSpec = text.parse()?;
        let filters = spec
            .filters
            .iter()
            .cloned()
            .map(Filter::spec)
            .collect::<Result<Vec<_>, _>>()?;
        self.add_link_with(&spec.input, filters, &spec.outputs)
    }

    /// Adds a link with filters built in Rust (callbacks among them).
    pub fn add_link_with(
        &self,
        input: &str,
        filters: Vec<Filter>,
        outputs: &[OutputSpec],
    ) -> Result<LinkId, String> {
        let dev = self
            .get(input)
            .ok_or_else(|| format!("no device named `{input}`"))?;
        if dev.direction() == Direction::Actuator {
            return Err(not_an_input(input));
        }
        if outputs.is_empty() {
            return Err("a link needs at least one output".into());
        }
        let mut names = vec![input.to_string()];
        let mut sinks: Vec<Arc<dyn OutputSink>> = Vec::new();
        for o in outputs {
            sinks.push(match o {
                OutputSpec::Actuator(n) => {
                    let a = self
                        .get(n)
                        .ok_or_else(|| format!("no device named `{n}`"))?;
                    if a.direction() != Direction::Actuator {
                        return Err(format!("`{n}` is a sensor, not an actuator"));
                    }
                    names.push(n.clone());
                    let weak = Arc::downgrade(&a);
                    Arc::new(ActuatorOut {
                        name: n.clone(),
                        driver: a.driver.clone(),
                        after: Some(Arc::new(move |v| {
                            if let Some(d) = weak.upgrade() {
                                d.record(v);
                            }
                        })),
                    })
                }
                OutputSpec::Notify(n) => {
                    if self.get(n).is_none() {
                        return Err(format!("no device named `{n}`"));
                    }
                    names.push(n.clone());
                    Arc::new(NotifyOut {
                        name: n.clone(),
                        hook: self.inner.dp.notify_slot(),
                    })
                }
                OutputSpec::Log => Arc::new(LogOut {
                    input: input.to_string(),
                }),
                OutputSpec::Custom { kind, arg } => self.inner.dp.custom_output(kind, arg)?,
            });
        }
        let text = LinkSpec {
            input: input.to_string(),
            filters: Vec::new(),
            outputs: outputs.to_vec(),
        }
        .to_string();
        // the listing shows every filter, callbacks included
        let text = match text.split_once(" ->") {
            Some((i, o)) => {
                let f: String = filters.iter().map(|f| format!(" | {f}")).collect();
                format!("{i}{f} ->{o}")
            }
            None => text,
        };
        // hold the link registry while adding, so a concurrent remove of
        // one of the names either sees this link or runs before the check
        let mut links = self.inner.links.lock();
        if links.len() >= self.inner.max_links {
            return Err(format!(
                "the direct path holds {} links, its limit (directpath.max_links); remove one first",
                links.len()
            ));
        }
        if names.iter().any(|n| self.get(n).is_none()) {
            return Err("a device of the link was removed meanwhile".into());
        }
        let id = self.inner.dp.add_link(dev.input, text, filters, sinks);
        links.insert(id, LinkRefs { names });
        Ok(id)
    }

    /// Whether the direct path holds `directpath.max_links` links.
    pub fn links_full(&self) -> bool {
        self.inner.links.lock().len() >= self.inner.max_links
    }

    /// Removes a link; returns whether it existed.
    pub fn remove_link(&self, id: LinkId) -> bool {
        self.inner.links.lock().remove(&id);
        self.inner.dp.remove_link(id)
    }

    /// Every link: (id, text).
    pub fn links(&self) -> Vec<(LinkId, String)> {
        self.inner
            .dp
            .links()
            .iter()
            .map(|l| (l.id, l.text.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn manager() -> DeviceManager {
        DeviceManager::new(&DirectPathConfig {
            priority: 0,
            ..DirectPathConfig::default()
        })
        .unwrap()
    }

    fn wait_for(mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    #[test]
    fn default_config_gives_a_sensor_and_an_actuator() {
        let m =
            DeviceManager::start(&DevicesConfig::default(), &DirectPathConfig::default()).unwrap();
        let t = m.get("temp0").unwrap();
        assert_eq!(t.direction(), Direction::Sensor);
        let v = t.read().unwrap();
        assert!((19.0..=25.0).contains(&v), "{v}");
        assert!(t.history().latest().is_some());
        let l = m.get("led0").unwrap();
        l.write(1.0).unwrap();
        assert_eq!(l.read().unwrap(), 1.0);
        assert_eq!(l.history().latest(), Some(1.0));
        assert!(t.write(1.0).is_err());
    }

    #[test]
    fn a_link_drives_an_actuator_from_a_ticking_sensor() {
        let m = manager();
        let mut s = DeviceSpec::new("sq", DeviceKind::SimSensor);
        s.signal = Some("square(0, 30, 40ms)".into());
        s.period = Some("2ms".into());
        m.add(s).unwrap();
        m.add(DeviceSpec::new("fan", DeviceKind::SimActuator))
            .unwrap();
        let heard = Arc::new(AtomicU32::new(0));
        let h = heard.clone();
        m.get("fan").unwrap().watch(Arc::new(move |n, _, _| {
            assert_eq!(n, "fan");
            h.fetch_add(1, Ordering::Relaxed);
        }));
        let id = m
            .add_link("sq | threshold(25, 5) -> actuator(fan), log")
            .unwrap();
        assert_eq!(
            m.links(),
            vec![(
                id,
                "sq | threshold(25.0, 5.0) -> actuator(fan), log".to_string()
            )]
        );
        let fan = m.get("fan").unwrap();
        assert!(
            wait_for(|| fan.history().updates() >= 4),
            "the fan switched on and off"
        );
        let recs = fan.history().records(100);
        assert!(
            recs.windows(2).all(|w| w[0].value != w[1].value),
            "threshold emits transitions only: {recs:?}"
        );
        assert!(heard.load(Ordering::Relaxed) >= 4);
        // removing the sensor removes the link
        m.remove("sq").unwrap();
        assert!(m.links().is_empty());
        assert!(m.get("sq").is_none());
        let n = fan.history().updates();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(fan.history().updates(), n, "nothing fires after removal");
    }

    #[test]
    fn callbacks_and_errors() {
        let m = manager();
        let mut s = DeviceSpec::new("t", DeviceKind::SimSensor);
        s.signal = Some("constant(4)".into());
        s.period = Some("1ms".into());
        m.add(s.clone()).unwrap();
        m.add(DeviceSpec::new("a", DeviceKind::SimActuator))
            .unwrap();
        let f = Filter::callback("half", |v, _| Some(v / 2.0));
        m.add_link_with("t", vec![f], &[OutputSpec::Actuator("a".into())])
            .unwrap();
        let a = m.get("a").unwrap();
        assert!(wait_for(|| a.history().latest() == Some(2.0)));
        assert!(m.links()[0].1.contains("callback(half)"));
        for (link, why) in [
            ("nope -> log", "no device named `nope`"),
            ("t -> actuator(t)", "is a sensor"),
            ("t -> actuator(zz)", "no device named `zz`"),
            ("t -> notify(zz)", "no device named `zz`"),
            ("t -> mqtt(x)", "no output kind `mqtt`"),
            ("t | bogus(1) -> log", "unknown filter"),
        ] {
            let e = m.add_link(link).unwrap_err();
            assert!(e.contains(why), "{link}: {e}");
        }
        assert!(matches!(m.add(s), Err(DeviceError::Exists(_))));
        assert!(matches!(m.remove("zz"), Err(DeviceError::NotFound(_))));
        let mut bad = DeviceSpec::new("b", DeviceKind::SimSensor);
        for (mutate, why) in [
            (
                Box::new(|_: &mut DeviceSpec| {}) as Box<dyn Fn(&mut DeviceSpec)>,
                "needs `signal`",
            ),
            (
                Box::new(|s: &mut DeviceSpec| s.signal = Some("sine(1)".into())),
                "signal: `sine` takes 3",
            ),
            (
                Box::new(|s: &mut DeviceSpec| {
                    s.signal = Some("constant(1)".into());
                    s.chip = Some("x".into())
                }),
                "`chip` does not apply",
            ),
            (
                Box::new(|s: &mut DeviceSpec| {
                    s.chip = None;
                    s.period = Some("1us".into())
                }),
                "at least 100us",
            ),
            (
                Box::new(|s: &mut DeviceSpec| {
                    s.period = None;
                    s.name = "a b".into()
                }),
                "a name is",
            ),
            (
                Box::new(|s: &mut DeviceSpec| {
                    s.name = "g".into();
                    s.signal = None;
                    s.kind = DeviceKind::GpioIn
                }),
                "needs `line`",
            ),
            (
                Box::new(|s: &mut DeviceSpec| s.kind = DeviceKind::AttrSensor),
                "needs `path`",
            ),
        ] {
            mutate(&mut bad);
            let e = m.add(bad.clone()).err().unwrap().to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn histories_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("mintgate-mgr-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = |d: &std::path::Path, period: &str| {
            let mut s = DeviceSpec::new("w", DeviceKind::SimSensor);
            s.signal = Some("walk(0, 1, -50, 50)".into());
            s.period = Some(period.into());
            s.history = 50;
            DevicesConfig {
                list: vec![s],
                store: Some(d.to_path_buf()),
                store_sync: None,
            }
        };
        let dp = DirectPathConfig {
            priority: 0,
            ..DirectPathConfig::default()
        };
        let m = DeviceManager::start(&cfg(&dir, "2ms"), &dp).unwrap();
        let w = m.get("w").unwrap();
        assert!(wait_for(|| w.history().updates() >= 80));
        drop(w);
        drop(m); // the flusher writes what is left as it stops
        let on_disk = crate::store::Store::open(&dir)
            .unwrap()
            .load("w", 50)
            .unwrap();
        assert_eq!(on_disk.len(), 50);
        // slow sampling now: only the first reading joins the restored ones
        let m = DeviceManager::start(&cfg(&dir, "10s"), &dp).unwrap();
        let w = m.get("w").unwrap();
        m.remove("w").unwrap(); // stop sampling, to compare what was loaded
        let back = w.history().records(usize::MAX);
        // the restored records, then the few fresh samples taken since,
        // which pushed as many of the oldest out
        let fresh = (w.history().updates() as usize - 50).min(back.len());
        let restored = &back[..back.len() - fresh];
        assert_eq!(fresh, 1, "the first reading at start");
        assert_eq!(restored.len(), 49);
        assert_eq!(restored, &on_disk[on_disk.len() - restored.len()..]);
        assert!(back.windows(2).all(|p| p[0].unix_ms <= p[1].unix_ms));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn attribute_files_as_devices() {
        let d = std::env::temp_dir().join(format!("mintgate-mgr-attr-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("in"), "0\n").unwrap();
        std::fs::write(d.join("out"), "0\n").unwrap();
        let m = manager();
        let mut i = DeviceSpec::new("button", DeviceKind::AttrSensor);
        i.path = Some(d.join("in"));
        i.period = Some("1ms".into());
        m.add(i).unwrap();
        let mut o = DeviceSpec::new("lamp", DeviceKind::AttrActuator);
        o.path = Some(d.join("out"));
        o.keep_open = true;
        m.add(o).unwrap();
        m.add_link("button | expr(1 - x) -> actuator(lamp)")
            .unwrap();
        std::fs::write(d.join("in"), "1\n").unwrap();
        let lamp = m.get("lamp").unwrap();
        assert!(wait_for(|| lamp.history().latest() == Some(0.0)));
        assert_eq!(std::fs::read_to_string(d.join("out")).unwrap(), "0\n");
        std::fs::write(d.join("in"), "0\n").unwrap();
        assert!(wait_for(|| lamp.history().latest() == Some(1.0)));
        assert_eq!(std::fs::read_to_string(d.join("out")).unwrap(), "1\n");
        drop(m);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// `check_config` says no exactly when starting says no, for
    /// configurations that need no file or chip; and names what is wrong.
    /// A Modbus device from TOML: its points become devices, sensors and
    /// actuators by `writable`, links and checks see them, and each
    /// mistake is refused with an error that names it.
    #[test]
    fn modbus_declarations_become_point_devices_or_clear_errors() {
        let base = r#"
            [[list]]
            name = "meter"
            kind = "modbus"
            host = "127.0.0.1:1"
            timeout = "100ms"
            retries = 0
            period = "10s"
            [[list.points]]
            name = "volts"
            table = "input"
            address = 0
            type = "f32"
            unit = "V"
            [[list.points]]
            name = "relay"
            table = "coil"
            address = 3
            writable = true
            "#;
        let cfg: DevicesConfig = toml::from_str(base).unwrap();
        let dp = DirectPathConfig {
            links: vec!["meter.volts | threshold(250, 240) -> actuator(meter.relay)".into()],
            priority: 0,
            ..DirectPathConfig::default()
        };
        check_config(&cfg, &dp).unwrap();
        check_links(&cfg, &dp, &[]).unwrap();
        let m = DeviceManager::start(&cfg, &dp).unwrap();
        let names: Vec<String> = m.list().iter().map(|d| d.name().to_string()).collect();
        assert_eq!(names, ["meter.relay", "meter.volts"]);
        let v = m.get("meter.volts").unwrap();
        assert_eq!(v.direction(), Direction::Sensor);
        assert_eq!(v.spec().unit.as_deref(), Some("V"));
        assert_eq!(v.spec().max_age_s(), 10);
        assert_eq!(
            m.get("meter.relay").unwrap().direction(),
            Direction::Actuator
        );
        assert_eq!(m.links().len(), 1);
        // nothing listens: reads say why, the link state counts it
        assert!(wait_for(|| v.driver().link().is_some_and(|l| l.errors > 0)));
        let e = v.read().unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:1"), "{e}");
        assert!(m.add(cfg.list[0].clone()).is_err());
        drop(m);

        let bad = |edit: &str, word: &str| {
            let key = edit.split(' ').next().unwrap_or_default();
            let text = match base.find(&format!("            {key} = ")) {
                Some(at) => {
                    let end = at + base[at..].find('\n').unwrap_or(0);
                    format!("{}            {edit}{}", &base[..at], &base[end..])
                }
                None => base.replacen("retries = 0", &format!("retries = 0\n{edit}"), 1),
            };
            let e = match toml::from_str::<DevicesConfig>(&text) {
                Err(e) => e.to_string(),
                Ok(c) => check_config(&c, &DirectPathConfig::default())
                    .unwrap_err()
                    .to_string(),
            };
            assert!(e.contains(word), "{edit}: {e}");
        };
        bad("retries = 11", "retries 11 is outside 0..=10");
        bad("timeout = \"2m\"", "outside 1ms..=60s");
        bad("host = \"h:0\"", "not a port");
        bad("unit_id = 300", "unit_id");
        bad("signal = \"constant(1)\"", "`signal` does not apply");
        bad("period = \"0.1ms\"", "at least 1ms");
        bad("serial = \"/dev/ttyS0\"", "not both");
        bad("baud = 9600", "`baud` is for a serial (RTU) device");
        // RTU: settings checked, one bus's devices agree on them
        let rtu = |name: &str, line: &str| {
            format!(
                "[[list]]\nname = \"{name}\"\nkind = \"modbus\"\nserial = \"/dev/ttyS9\"\n{line}\n\
                 [[list.points]]\nname = \"p\"\ntable = \"input\"\naddress = 0\n"
            )
        };
        let check = |text: &str| {
            let c: DevicesConfig = toml::from_str(text).unwrap();
            check_config(&c, &DirectPathConfig::default()).map_err(|e| e.to_string())
        };
        assert!(check(&rtu("a", "baud = 19200")).is_ok());
        let e = check(&rtu("a", "baud = 100")).unwrap_err();
        assert!(e.contains("baud 100 is outside"), "{e}");
        let e = check(&rtu("a", "stop_bits = 3")).unwrap_err();
        assert!(e.contains("stop_bits 3"), "{e}");
        let two = rtu("a", "baud = 19200") + &rtu("b", "baud = 9600");
        let e = check(&two).unwrap_err();
        assert!(e.contains("same baud, parity and stop_bits"), "{e}");
        assert!(check(&(rtu("a", "parity = \"none\"") + &rtu("b", "parity = \"none\""))).is_ok());
        let e = check_spec(&DeviceSpec::new("m", DeviceKind::Modbus)).unwrap_err();
        assert!(e.to_string().contains("needs `host`"), "{e}");
        let mut no_points = DeviceSpec::new("m", DeviceKind::Modbus);
        no_points.host = Some("plc".into());
        let e = check_spec(&no_points).unwrap_err().to_string();
        assert!(e.contains("needs 1 to"), "{e}");
        let twice = base.replace("name = \"relay\"", "name = \"volts\"");
        let c: DevicesConfig = toml::from_str(&twice).unwrap();
        let e = check_config(&c, &DirectPathConfig::default()).unwrap_err();
        assert!(e.to_string().contains("declared twice"), "{e}");
        let long = base.replace(
            "name = \"relay\"",
            "name = \"a_very_long_point_name_indeed\"",
        );
        let c: DevicesConfig = toml::from_str(&long).unwrap();
        let e = check_config(&c, &DirectPathConfig::default()).unwrap_err();
        assert!(e.to_string().contains("1-32"), "{e}");
        let ro = base.replace("table = \"coil\"", "table = \"discrete-input\"");
        let c: DevicesConfig = toml::from_str(&ro).unwrap();
        let e = check_config(&c, &DirectPathConfig::default()).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        // a point device collides with a plain device of the same name
        let mut c: DevicesConfig = toml::from_str(base).unwrap();
        c.list
            .push(DeviceSpec::new("meter.relay", DeviceKind::SimActuator));
        let e = check_config(&c, &DirectPathConfig::default()).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
    }

    /// An OPC UA server from TOML: its nodes become devices, sensors and
    /// actuators; a dead server is reported; every config error is clear.
    #[test]
    fn opcua_declarations_become_node_devices_or_clear_errors() {
        let dir = std::env::temp_dir().join(format!("mintgate-ua-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "hunter2\nignored\n").unwrap();
        let base = format!(
            r#"
            [[list]]
            name = "plc"
            kind = "opcua"
            endpoint = "opc.tcp://127.0.0.1:1/"
            timeout = "200ms"
            period = "10s"
            user = "op"
            password_file = "{}/pw"
            [[list.nodes]]
            name = "temp"
            node = "ns=2;s=Temperature"
            unit = "Cel"
            [[list.nodes]]
            name = "valve"
            node = "ns=2;i=1001"
            type = "u16"
            writable = true
            "#,
            dir.display()
        );
        let cfg: DevicesConfig = toml::from_str(&base).unwrap();
        let dp = DirectPathConfig {
            links: vec!["plc.temp | threshold(30, 25) -> actuator(plc.valve)".into()],
            priority: 0,
            ..DirectPathConfig::default()
        };
        check_config(&cfg, &dp).unwrap();
        check_links(&cfg, &dp, &[]).unwrap();
        let nodes = opcua_nodes(&cfg.list[0]).unwrap();
        let ep = opcua_endpoint(&cfg.list[0], &nodes, true).unwrap();
        // the password's first line, never printed
        let (user, pw) = ep.user.clone().unwrap();
        assert_eq!((user.as_str(), pw.0.as_str()), ("op", "hunter2"));
        assert!(!format!("{ep:?}").contains("hunter2"));
        // the publishing interval defaults to the shortest sampling interval
        assert_eq!(ep.publishing, Duration::from_secs(10));
        let m = DeviceManager::start(&cfg, &dp).unwrap();
        let names: Vec<String> = m.list().iter().map(|d| d.name().to_string()).collect();
        assert_eq!(names, ["plc.temp", "plc.valve"]);
        let t = m.get("plc.temp").unwrap();
        assert_eq!(t.direction(), Direction::Sensor);
        assert_eq!(t.spec().unit.as_deref(), Some("Cel"));
        assert_eq!(t.spec().max_age_s(), 10);
        let v = m.get("plc.valve").unwrap();
        assert_eq!(v.direction(), Direction::Actuator);
        assert!(v.spec().is_actuator());
        // nothing listens: reads and writes say why, within their bounds
        assert!(wait_for(|| t.driver().link().is_some_and(|l| l.errors > 0)));
        let e = t.read().unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:1"), "{e}");
        let at = std::time::Instant::now();
        let e = v.write(3.0).unwrap_err().to_string();
        assert!(e.contains("not connected"), "{e}");
        assert!(at.elapsed() < Duration::from_secs(1));
        assert!(v
            .write(70_000.0)
            .unwrap_err()
            .to_string()
            .contains("range of a u16"));
        let st = t.driver().link().unwrap();
        assert_eq!((st.connection.as_str(), st.connected), ("plc", false));
        assert!(st.connects >= 1 && st.writes >= 1, "{st:?}");
        drop(m);

        let bad = |edit: &str, word: &str| {
            let text = base.replacen("period = \"10s\"", &format!("period = \"10s\"\n{edit}"), 1);
            let e = match toml::from_str::<DevicesConfig>(&text) {
                Err(e) => e.to_string(),
                Ok(c) => check_config(&c, &DirectPathConfig::default())
                    .unwrap_err()
                    .to_string(),
            };
            assert!(e.contains(word), "{edit}: {e}");
        };
        let without = |key: &str| {
            base.lines()
                .filter(|l| !l.trim_start().starts_with(key))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let check = |text: &str| {
            let c: DevicesConfig = toml::from_str(text).unwrap();
            check_config(&c, &DirectPathConfig::default())
                .map_err(|e| e.to_string())
                .err()
                .unwrap_or_default()
        };
        bad("host = \"x:502\"", "`host` does not apply to a Opcua");
        bad(
            "security_mode = \"Sign\"",
            "needs security_policy \"Basic256Sha256\"",
        );
        bad(
            "security_policy = \"Basic256Sha256\"",
            "needs `certificate` and `private_key`",
        );
        bad("security_policy = \"Aes128\"", "unknown variant");
        bad(
            "security_policy = \"Basic256Sha256\"\ncertificate = \"c.der\"\nprivate_key = \"k.pem\"",
            "needs the server's certificate trusted",
        );
        bad(
            "security_policy = \"Basic256Sha256\"\nsecurity_mode = \"None\"\ncertificate = \"c\"\nprivate_key = \"k\"",
            "needs security_mode",
        );
        bad("certificate = \"c.der\"", "go together");
        bad("password_env = \"X\"", "not both");
        bad("publishing_interval = \"0us\"", "at least 1ms");
        bad("table = \"coil\"", "`table`");
        let e = check(&base.replace("timeout = \"200ms\"", "timeout = \"2m\""));
        assert!(e.contains("outside 1ms..=60s"), "{e}");
        let e = check(&base.replace("opc.tcp://127.0.0.1:1/", "http://127.0.0.1/"));
        assert!(e.contains("not an opc.tcp://"), "{e}");
        let e = check(&without("password_file"));
        assert!(e.contains("needs `password_file` or `password_env`"), "{e}");
        let e = check(&without("user"));
        assert!(e.contains("a password without `user`"), "{e}");
        let e = check(&without("endpoint"));
        assert!(e.contains("needs `endpoint`"), "{e}");
        let e = check(&base.replace("ns=2;i=1001", "ns=2;x=1"));
        assert!(
            e.contains("node `valve`") && e.contains("not a node id"),
            "{e}"
        );
        let e = check(&base.replace("type = \"u16\"\n", ""));
        assert!(e.contains("needs `type`"), "{e}");
        let e = check(&base.replace("name = \"valve\"", "name = \"temp\""));
        assert!(e.contains("declared twice"), "{e}");
        // a Modbus point's keys are not a node's, nor the other way round
        let e = toml::from_str::<DevicesConfig>(&base.replace("[[list.nodes]]", "[[list.points]]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `node`"), "{e}");
        // what only the start can tell: the password's source, the files
        let start = |text: &str| {
            let c: DevicesConfig = toml::from_str(text).unwrap();
            DeviceManager::start(&c, &DirectPathConfig::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let env = base.replace(
            &format!("password_file = \"{}/pw\"", dir.display()),
            "password_env = \"MINTGATE_TEST_UNSET_PASSWORD_VAR\"",
        );
        assert!(start(&env).contains("$MINTGATE_TEST_UNSET_PASSWORD_VAR is not set"));
        let gone = base.replace("/pw\"", "/missing\"");
        assert!(start(&gone).contains("password_file"), "{}", start(&gone));
        let secure = base.replacen(
            "period = \"10s\"",
            &format!(
                "period = \"10s\"\nsecurity_policy = \"Basic256Sha256\"\n\
                 certificate = \"{0}/none.der\"\nprivate_key = \"{0}/none.pem\"\n\
                 trust_any_server_certificate = true",
                dir.display()
            ),
            1,
        );
        assert_eq!(check(&secure), "");
        let e = start(&secure);
        assert!(e.contains("certificate") && e.contains("none.der"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_config_check_agrees_with_the_start() {
        let sensor = |name: &str| {
            let mut s = DeviceSpec::new(name, DeviceKind::SimSensor);
            s.signal = Some("constant(1)".into());
            s
        };
        let actuator = |name: &str| DeviceSpec::new(name, DeviceKind::SimActuator);
        let with = |f: &dyn Fn(&mut DeviceSpec)| {
            let mut s = sensor("s");
            f(&mut s);
            vec![s, actuator("a")]
        };
        let ok_devices = vec![sensor("s"), actuator("a")];
        /// (what, devices, links, a word of the error or None for valid)
        type Case<'a> = (&'a str, Vec<DeviceSpec>, Vec<&'a str>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "valid",
                ok_devices.clone(),
                vec!["s | threshold(2, 1) -> actuator(a), log"],
                None,
            ),
            ("no links", ok_devices.clone(), vec![], None),
            ("bad name", vec![sensor("a b")], vec![], Some("a name is")),
            (
                "duplicate",
                vec![sensor("s"), sensor("s")],
                vec![],
                Some("already exists"),
            ),
            (
                "no signal",
                with(&|s| s.signal = None),
                vec![],
                Some("needs `signal`"),
            ),
            (
                "bad signal",
                with(&|s| s.signal = Some("saw(".into())),
                vec![],
                Some("signal"),
            ),
            (
                "short period",
                with(&|s| s.period = Some("10us".into())),
                vec![],
                Some("100us"),
            ),
            (
                "bad period",
                with(&|s| s.period = Some("soon".into())),
                vec![],
                Some("period"),
            ),
            (
                "bad notify",
                with(&|s| s.notify_every = Some("x".into())),
                vec![],
                Some("notify_every"),
            ),
            (
                "stray field",
                vec![sensor("s"), {
                    let mut a = actuator("a");
                    a.signal = Some("constant(1)".into());
                    a
                }],
                vec![],
                Some("`signal` does not apply"),
            ),
            (
                "stray debounce",
                with(&|s| s.debounce = Some("5ms".into())),
                vec![],
                Some("`debounce` does not apply"),
            ),
            (
                "no input",
                ok_devices.clone(),
                vec!["x -> log"],
                Some("no device named `x`"),
            ),
            (
                "no actuator",
                ok_devices.clone(),
                vec!["s -> actuator(b)"],
                Some("no device named `b`"),
            ),
            (
                "history too long",
                with(&|s| s.history = 100_000_000),
                vec![],
                Some("outside 1..=1000000"),
            ),
            (
                "an actuator as input",
                ok_devices.clone(),
                vec!["a -> log"],
                Some("input must be a sensor"),
            ),
            (
                "to a sensor",
                vec![sensor("s"), sensor("t")],
                vec!["s -> actuator(t)"],
                Some("not an actuator"),
            ),
            (
                "bad filter",
                ok_devices.clone(),
                vec!["s | nosuch(1) -> log"],
                Some("nosuch"),
            ),
            (
                "bad syntax",
                ok_devices.clone(),
                vec!["s log"],
                Some("`s log`"),
            ),
            (
                "unregistered output",
                ok_devices.clone(),
                vec!["s -> mqtt(t/1)"],
                Some("unknown output `mqtt`"),
            ),
        ];
        for (what, list, links, want) in cases {
            let devices = DevicesConfig {
                list,
                store: None,
                store_sync: None,
            };
            let dp = DirectPathConfig {
                priority: 0,
                links: links.iter().map(|l| l.to_string()).collect(),
                ..DirectPathConfig::default()
            };
            let checked = check_config(&devices, &dp)
                .and_then(|_| check_links(&devices, &dp, &[]).map(|_| ()));
            let started = DeviceManager::start(&devices, &dp);
            assert_eq!(
                checked.is_ok(),
                started.is_ok(),
                "{what}: check {checked:?}, start {:?}",
                started.as_ref().err()
            );
            match (want, checked) {
                (None, Ok(())) => {}
                (Some(w), Err(e)) => assert!(e.to_string().contains(w), "{what}: {e}"),
                (w, c) => panic!("{what}: wanted {w:?}, got {c:?}"),
            }
        }
        // a registered kind passes; the worker's priority is 0..=99
        let devices = DevicesConfig {
            list: ok_devices,
            store: None,
            store_sync: None,
        };
        let mut dp = DirectPathConfig {
            priority: 0,
            links: vec!["s -> mqtt(t/1)".into()],
            ..DirectPathConfig::default()
        };
        assert_eq!(
            check_links(&devices, &dp, &["mqtt"]).unwrap(),
            [("mqtt".to_string(), "t/1".to_string())]
        );
        // links are checked for syntax alone when devices may come later
        dp.links = vec!["later -> actuator(too), plugin(x)".into()];
        assert!(check_config(&devices, &dp).is_ok());
        assert!(check_links(&devices, &dp, &[]).is_err());
        dp.links.clear();
        dp.priority = 99;
        assert!(check_config(&devices, &dp).is_ok());
        assert!(DeviceManager::start(&devices, &dp).is_ok());
        dp.priority = 100;
        let e = check_config(&devices, &dp).unwrap_err().to_string();
        assert!(
            e.contains("directpath.priority") && e.contains("0..=99"),
            "{e}"
        );
        assert!(
            DeviceManager::start(&devices, &dp).is_err(),
            "the start agrees"
        );
        // links are bounded: in the file, and when added at run time
        dp.priority = 0;
        dp.max_links = 0;
        let e = check_config(&devices, &dp).unwrap_err().to_string();
        assert!(e.contains("directpath.max_links"), "{e}");
        dp.max_links = 2;
        dp.links = vec!["s -> log".into(); 3];
        let e = check_config(&devices, &dp).unwrap_err().to_string();
        assert!(e.contains("above directpath.max_links (2)"), "{e}");
        assert!(
            DeviceManager::start(&devices, &dp).is_err(),
            "the start agrees"
        );
        dp.links.truncate(1);
        let m = DeviceManager::start(&devices, &dp).unwrap();
        assert!(!m.links_full());
        let id = m.add_link("s -> log").unwrap();
        assert!(m.links_full());
        let e = m.add_link("s -> log").unwrap_err();
        assert!(e.contains("directpath.max_links"), "{e}");
        assert_eq!(m.links().len(), 2);
        assert!(m.remove_link(id));
        m.add_link("s -> log").unwrap();
    }
}
