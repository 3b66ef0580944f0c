//! Devices as CoAP resources (Device Management meets the Interaction
//! layer), and the `/links` resource that manages the direct path.
//!
//! | path | methods | what |
//! |---|---|---|
//! | `/sensors/NAME` | GET (observable) | the value now, `text/plain` (`22.513`), or JSON with `Accept: 50` |
//! | `/actuators/NAME` | GET (observable), PUT | the last value written; PUT a number (or `on`/`off`), or JSON `{"v": 2}` / `{"value": 2}`, to set it |
//! | `/sensors/NAME/history`, `/actuators/NAME/history` | GET | the bounded history as CSV `unix_ms,value`, block-wise (Block2) when large |
//! | `/links` | GET, POST, DELETE | the direct path's links, one `ID: LINK` per line; POST a link (`temp0 \| threshold(25, 23) -> actuator(led0)`) to add it (2.01, payload the id; 4.03 when `directpath.max_links` are held); DELETE `?id=N` to remove one |
//!
//! A value carries Max-Age: a sampled sensor's period (rounded up to whole
//! seconds), 0 for what can change at any moment
//! ([`mintgate_devices::DeviceSpec::max_age_s`]).
//!
//! Observers of a device's resource are notified whenever the device
//! records a value different from the last one notified (a sensor's
//! sample, an edge, an actuator write from CoAP or from the direct path),
//! with `notify_every` also when a new value comes that long after the last
//! notification although it did not change (periodic notification), and
//! when a link's `notify(NAME)` output fires.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mintgate_coap::server::block::respond_block2;
use mintgate_coap::server::{PathTaken, Request, Resource, ResponseBuilder};
use mintgate_coap::wire::{Code, ContentFormat, OptionNumber};
use mintgate_devices::{Device, DeviceError, DeviceManager, DeviceSpec, Direction};

use crate::bridge::MqttBridge;
use crate::bridge_format::json_str;
use crate::exposition::{Exposition, Num};
use crate::observe::Notifier;
use crate::pipeline::Gateway;

/// Why devices could not be served.
#[derive(Debug, thiserror::Error)]
pub enum DeviceHostError {
    /// A device or link could not be set up.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A device's resource path is taken.
    #[error(transparent)]
    Path(#[from] PathTaken),
    /// The MQTT bridges could not start.
    #[error(transparent)]
    Bridge(#[from] crate::bridge::BridgeError),
}

/// The CoAP path of a device: `sensors/NAME` or `actuators/NAME`.
pub fn resource_path(dev: &Device) -> String {
    match dev.direction() {
        Direction::Sensor => format!("sensors/{}", dev.name()),
        Direction::Actuator => format!("actuators/{}", dev.name()),
    }
}

/// A value as text: integers without a fraction, others with at most 3
/// decimals (`22.513`, `1`, `-0.5`).
pub fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    let s = format!("{v:.3}");
    match s.trim_end_matches('0').trim_end_matches('.') {
        "-0" => "0".to_string(),
        t => t.to_string(),
    }
}

/// Parses what a PUT to an actuator carries.
pub fn parse_put(payload: &[u8]) -> Result<f64, String> {
    let s = std::str::from_utf8(payload)
        .map_err(|_| "the payload is not UTF-8 text".to_string())?
        .trim();
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" => return Ok(1.0),
        "off" | "false" => return Ok(0.0),
        _ => {}
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!(
            "expected a number, on or off, got `{}`",
            s.chars().take(20).collect::<String>()
        )),
    }
}

/// What a PUT to an actuator carries, by its Content-Format: text (see
/// [`parse_put`]), or JSON (50): the device's own representation
/// `{"v": 2}` (other members ignored) or `{"value": 2}`, a number, a
/// boolean or text as [`parse_put`] takes it.
pub fn parse_put_as(cf: Option<ContentFormat>, payload: &[u8]) -> Result<f64, String> {
    if cf != Some(ContentFormat::JSON) {
        return parse_put(payload);
    }
    let v: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
    json_value(&v, &["v", "value"])
}

/// The value under the first of `keys` that `obj` has: a finite number, a
/// boolean (1 or 0) or text as [`parse_put`] takes it.
pub(crate) fn json_value(obj: &serde_json::Value, keys: &[&str]) -> Result<f64, String> {
    match keys.iter().find_map(|k| obj.get(*k)) {
        Some(serde_json::Value::Number(n)) => n
            .as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| format!("`{}` is not a finite number", keys[0])),
        Some(serde_json::Value::Bool(b)) => Ok(if *b { 1.0 } else { 0.0 }),
        Some(serde_json::Value::String(s)) => parse_put(s.as_bytes()),
        _ => Err(format!(
            "a JSON object with a numeric `{}` is needed",
            keys.join("` or `")
        )),
    }
}

fn write_value(dev: &Device, req: &Request<'_>, rb: &mut ResponseBuilder, v: f64) {
    let accept = req
        .option(OptionNumber::ACCEPT)
        .and_then(|o| o.uint())
        .map(|v| ContentFormat(v as u16));
    match accept {
        None | Some(ContentFormat::TEXT_PLAIN) => {
            rb.content_format(ContentFormat::TEXT_PLAIN)
                .max_age(dev.spec().max_age_s())
                .write(fmt_value(v).as_bytes());
        }
        Some(ContentFormat::JSON) => {
            let unit = dev
                .spec()
                .unit
                .as_deref()
                .map(|u| format!(",\"u\":{}", json_str(u)))
                .unwrap_or_default();
            let body = format!(
                "{{\"n\":{},\"v\":{}{unit},\"t\":{}}}",
                json_str(dev.name()),
                fmt_value(v),
                dev.history().records(1).first().map_or(0, |r| r.unix_ms)
            );
            rb.content_format(ContentFormat::JSON)
                .max_age(dev.spec().max_age_s())
                .write(body.as_bytes());
        }
        Some(_) => {
            rb.set_code(Code::NOT_ACCEPTABLE);
        }
    }
}

fn device_error(rb: &mut ResponseBuilder, e: &DeviceError) {
    rb.set_code(Code::SERVICE_UNAVAILABLE)
        .content_format(ContentFormat::TEXT_PLAIN)
        .write(e.to_string().as_bytes());
}

/// The resource of one device.
pub fn device_resource(dev: &Arc<Device>) -> Resource {
    let path = resource_path(dev);
    let d = dev.clone();
    let rt = dev.spec().rt.clone().unwrap_or_else(|| {
        match dev.direction() {
            Direction::Sensor => "mintgate.sensor",
            Direction::Actuator => "mintgate.actuator",
        }
        .to_string()
    });
    let mut r = Resource::new(&path)
        .get(move |req, rb| match d.read() {
            Ok(v) => write_value(&d, req, rb, v),
            Err(e) => device_error(rb, &e),
        })
        .attr("rt", &rt)
        .attr(
            "if",
            match dev.direction() {
                Direction::Sensor => "core.s",
                Direction::Actuator => "core.a",
            },
        )
        .attr("ct", "0 50")
        .flag("obs");
    if let Some(u) = &dev.spec().unit {
        r = r.attr("title", &format!("{} ({u})", dev.name()));
    }
    if dev.direction() == Direction::Actuator {
        let d = dev.clone();
        r = r
            .put(
                move |req, rb| match parse_put_as(req.content_format(), req.payload()) {
                    Ok(v) => match d.write(v) {
                        Ok(()) => {
                            rb.set_code(Code::CHANGED);
                        }
                        Err(e) => device_error(rb, &e),
                    },
                    Err(why) => {
                        rb.set_code(Code::BAD_REQUEST)
                            .content_format(ContentFormat::TEXT_PLAIN)
                            .write(why.as_bytes());
                    }
                },
            )
            .accepts(&[ContentFormat::TEXT_PLAIN, ContentFormat::JSON]);
    }
    r
}

/// The history resource of one device: CSV, block-wise when large.
pub fn history_resource(dev: &Arc<Device>, max_block: usize) -> Resource {
    let d = dev.clone();
    Resource::new(&format!("{}/history", resource_path(dev)))
        .get(move |req, rb| {
            let mut body = String::from("unix_ms,value\n");
            for r in d.history().records(usize::MAX) {
                body.push_str(&format!("{},{}\n", r.unix_ms, fmt_value(r.value)));
            }
            rb.content_format(ContentFormat::TEXT_PLAIN);
            respond_block2(req, rb, body.as_bytes(), max_block);
        })
        .attr("rt", "mintgate.history")
        .attr("ct", "0")
        .attr("sz", &(dev.history().capacity() * 24).to_string())
}

/// `/links`: list, add and remove the direct path's links.
pub fn links_resource(m: &DeviceManager, max_block: usize) -> Resource {
    let (g, p, d) = (m.clone(), m.clone(), m.clone());
    Resource::new("links")
        .get(move |req, rb| {
            let mut body = String::new();
            for (id, text) in g.links() {
                body.push_str(&format!("{id}: {text}\n"));
            }
            rb.content_format(ContentFormat::TEXT_PLAIN);
            respond_block2(req, rb, body.as_bytes(), max_block);
        })
        .post(move |req, rb| {
            let text = match std::str::from_utf8(req.payload()) {
                Ok(t) => t.trim(),
                Err(_) => {
                    rb.set_code(Code::BAD_REQUEST)
                        .write(b"the payload is not UTF-8 text");
                    return;
                }
            };
            match p.add_link(text) {
                Ok(id) => {
                    rb.set_code(Code::CREATED)
                        .content_format(ContentFormat::TEXT_PLAIN)
                        .write(id.to_string().as_bytes());
                }
                Err(why) => {
                    // at the limit: 4.03 (the request was fine, the gateway
                    // takes no more); otherwise the link was wrong
                    let code = if p.links_full() {
                        Code::FORBIDDEN
                    } else {
                        Code::BAD_REQUEST
                    };
                    rb.set_code(code)
                        .content_format(ContentFormat::TEXT_PLAIN)
                        .write(why.as_bytes());
                }
            }
        })
        .delete(move |req, rb| {
            // one link: ?id=N (several ids in one request are refused rather
            // than half done)
            let ids: Vec<Option<u64>> = req
                .query()
                .filter_map(|q| q.strip_prefix("id="))
                .map(|v| v.parse::<u64>().ok())
                .collect();
            match ids[..] {
                [Some(id)] if d.remove_link(id) => {
                    rb.set_code(Code::DELETED);
                }
                [Some(_)] => {
                    rb.set_code(Code::NOT_FOUND);
                }
                _ => {
                    rb.set_code(Code::BAD_REQUEST)
                        .write(b"give one link as ?id=N");
                }
            }
        })
        .accepts(&[ContentFormat::TEXT_PLAIN])
        .attr("rt", "mintgate.links")
        .attr("ct", "0")
}

/// The direct path's counters and latency histograms, and the device count.
pub fn collect(m: &mut Exposition, dm: &DeviceManager) {
    let dp = dm.directpath();
    let s = dp.snapshot();
    let st = dp.stats();
    m.gauge("mintgate_devices", "Devices managed now.", dm.list().len());
    collect_links(m, dm);
    m.gauge(
        "mintgate_directpath_links",
        "Direct path links now.",
        dm.links().len(),
    );
    for (name, help, v) in [
        (
            "mintgate_directpath_pushed_total",
            "Events offered to the direct path's ring.",
            s.pushed,
        ),
        (
            "mintgate_directpath_overflow_total",
            "Events dropped because the ring was full.",
            s.overflow,
        ),
        (
            "mintgate_directpath_processed_total",
            "Events the worker took from the ring.",
            s.processed,
        ),
        (
            "mintgate_directpath_unlinked_total",
            "Events whose input has no link (most stop before the ring).",
            s.unlinked,
        ),
        (
            "mintgate_directpath_passed_total",
            "(event, link) pairs that passed every filter.",
            s.passed,
        ),
        (
            "mintgate_directpath_filtered_total",
            "(event, link) pairs a filter stopped.",
            s.filtered,
        ),
        ("mintgate_directpath_fired_total", "Outputs fired.", s.fired),
        (
            "mintgate_directpath_output_errors_total",
            "Outputs that failed.",
            s.output_errors,
        ),
        (
            "mintgate_directpath_parks_total",
            "Times the worker went to sleep.",
            s.parks,
        ),
    ] {
        m.counter(name, help, v);
    }
    for (name, help, h) in [
        (
            "mintgate_directpath_worker_latency_seconds",
            "Event in hand to outputs done, inside the worker.",
            &st.worker_ns,
        ),
        (
            "mintgate_directpath_e2e_latency_seconds",
            "Event entering the ring to outputs done.",
            &st.e2e_ns,
        ),
        (
            "mintgate_directpath_source_latency_seconds",
            "Event sensed (e.g. GPIO edge timestamp) to outputs done.",
            &st.source_ns,
        ),
    ] {
        let counts = h.counts_at(&LATENCY_BOUNDS_NS);
        let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_NS
            .iter()
            .zip(counts)
            .map(|(b, n)| (*b as f64 * 1e-9, n))
            .collect();
        m.histogram(name, help, h.sum() as f64 * 1e-9, h.count(), &buckets);
    }
}

/// The direct path's latency buckets: 1, 2 and 5 times each power of ten
/// from 1 us to 1 s (the path's own latencies are microseconds; a slow
/// output takes milliseconds). The recorder keeps 12.5 % buckets; a value
/// is counted under a bound only when its whole recorder bucket is.
const LATENCY_BOUNDS_NS: [u64; 19] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
];

/// The connections of field devices (Modbus, OPC UA), one per connection however
/// many points it serves, by name.
fn links(m: &DeviceManager) -> std::collections::BTreeMap<String, mintgate_devices::LinkState> {
    m.list()
        .iter()
        .filter_map(|d| d.driver().link())
        .map(|l| (l.connection.clone(), l))
        .collect()
}

/// Field-device connections' counters, one series per connection
/// (`connection` label).
fn collect_links(m: &mut Exposition, dm: &DeviceManager) {
    let links = links(dm);
    if links.is_empty() {
        return;
    }
    type Get = fn(&mintgate_devices::LinkState) -> u64;
    let series: [(&str, &str, Get); 6] = [
        (
            "mintgate_field_connected",
            "1 when the field device's connection is up.",
            |l| u64::from(l.connected),
        ),
        (
            "mintgate_field_polls_total",
            "Read requests made to the field device (Modbus), or data change notifications received from it (OPC UA).",
            |l| l.polls,
        ),
        (
            "mintgate_field_writes_total",
            "Write requests made to the field device.",
            |l| l.writes,
        ),
        (
            "mintgate_field_errors_total",
            "Field device requests that failed after their retries.",
            |l| l.errors,
        ),
        (
            "mintgate_field_connects_total",
            "Connection attempts to the field device.",
            |l| l.connects,
        ),
        (
            "mintgate_field_skipped_polls_total",
            "Polls skipped because the one before took longer than a period.",
            |l| l.skipped,
        ),
    ];
    for (name, help, get) in series {
        let rows = links.iter().map(|(c, l)| (c.as_str(), get(l)));
        if name.ends_with("_total") {
            m.counters(name, help, "connection", rows);
        } else {
            m.gauges(name, help, "connection", rows);
        }
    }
    let mut rows = Vec::new();
    for (c, l) in &links {
        for (q, v) in [
            ("0.5", l.late_p50_ns),
            ("0.99", l.late_p99_ns),
            ("1", l.late_max_ns),
        ] {
            rows.push((
                vec![("connection", c.as_str()), ("quantile", q)],
                Num::Float(v as f64 * 1e-9),
            ));
        }
    }
    m.gauges_by(
        "mintgate_field_poll_lateness_seconds",
        "How late polls started after they were due (log-linear histogram, 12.5 % buckets).",
        &rows,
    );
}

/// The dashboard's `devices` section: each device with its latest value.
pub fn devices_state(m: &DeviceManager) -> serde_json::Value {
    let list: Vec<serde_json::Value> = m
        .list()
        .iter()
        .map(|d| {
            let h = d.history();
            serde_json::json!({
                "name": d.name(),
                "kind": serde_json::to_value(d.spec().kind).unwrap_or_default(),
                "direction": match d.direction() {
                    Direction::Sensor => "sensor",
                    Direction::Actuator => "actuator",
                },
                "resource": format!("/{}", resource_path(d)),
                "value": h.latest().map(|v| fmt_value(v).parse::<f64>().unwrap_or(v)),
                "unit": d.spec().unit,
                "updates": h.updates(),
                "link": d.driver().link().map(|l| serde_json::json!({
                    "connection": l.connection,
                    "endpoint": l.endpoint,
                    "connected": l.connected,
                    "polls": l.polls,
                    "writes": l.writes,
                    "errors": l.errors,
                    "connects": l.connects,
                    "skipped": l.skipped,
                    "late_p99_us": l.late_p99_ns as f64 / 1e3,
                    "last_error": l.last_error,
                })),
            })
        })
        .collect();
    serde_json::json!({ "list": list })
}

/// The dashboard's `directpath` section: links, counters and latency
/// quantiles (from the same recorders as `/metrics`' histograms).
pub fn directpath_state(m: &DeviceManager) -> serde_json::Value {
    let dp = m.directpath();
    let s = dp.snapshot();
    let us = |ns: u64| (s.processed > 0).then_some(ns as f64 / 1e3);
    let links: Vec<serde_json::Value> = m
        .links()
        .into_iter()
        .map(|(id, text)| serde_json::json!({ "id": id, "text": text }))
        .collect();
    serde_json::json!({
        "links": links,
        "wait": dp.wait_mode().to_string(),
        "ring_capacity": dp.capacity(),
        "queued": dp.queued(),
        "pushed": s.pushed,
        "processed": s.processed,
        "fired": s.fired,
        "filtered": s.filtered,
        "overflow": s.overflow,
        "output_errors": s.output_errors,
        "worker_p50_us": us(s.worker_p50_ns),
        "worker_p99_us": us(s.worker_p99_ns),
        "e2e_p50_us": us(s.e2e_p50_ns),
        "e2e_p99_us": us(s.e2e_p99_ns),
    })
}

/// The devices of a running gateway, served as resources, and the MQTT
/// bridges when `[mqtt]` is enabled.
pub struct DeviceHost {
    // dropped first: the bridges stop before anything they watch
    bridge: Option<MqttBridge>,
    manager: DeviceManager,
    notifier: Notifier,
    max_block: usize,
}

impl DeviceHost {
    /// Creates the configured devices, starts the MQTT bridges when
    /// `mqtt.enabled` (they register the `mqtt(TOPIC)` output kind), adds
    /// the configured links and serves it all on `gw`.
    pub fn start(cfg: &crate::Config, gw: &Gateway) -> Result<DeviceHost, DeviceHostError> {
        let no_links = mintgate_devices::directpath::DirectPathConfig {
            links: Vec::new(),
            ..cfg.directpath.clone()
        };
        let manager = DeviceManager::start(&cfg.devices, &no_links)?;
        let bridge = if cfg.mqtt.enabled {
            let output: Option<Arc<dyn mintgate_mqtt::Uplink>> = if cfg.nats.enabled {
                let t = cfg
                    .nats
                    .target()
                    .map_err(|why| crate::bridge::BridgeError::Config { key: "nats", why })?;
                Some(Arc::new(mintgate_nats::JetStream::new(t)))
            } else {
                None
            };
            Some(MqttBridge::start_with(
                &cfg.mqtt,
                output,
                &manager,
                Some(gw.manager()),
            )?)
        } else {
            None
        };
        manager.add_links(&cfg.directpath.links)?;
        let mut host = DeviceHost::attach(manager, gw, cfg.coap.max_payload)?;
        if let Some(b) = bridge {
            gw.add_metrics_source(b.metrics_source());
            gw.add_state_source("mqtt", b.state_source());
            let (name, check) = b.ready_check();
            gw.add_ready_check(name, check);
            host.bridge = Some(b);
        }
        Ok(host)
    }

    /// The MQTT bridges, when running.
    pub fn bridge(&self) -> Option<&MqttBridge> {
        self.bridge.as_ref()
    }

    /// Serves the devices of `manager` on `gw` (responses of at most
    /// `max_payload` bytes: larger ones go block-wise).
    pub fn attach(
        manager: DeviceManager,
        gw: &Gateway,
        max_payload: usize,
    ) -> Result<DeviceHost, DeviceHostError> {
        let notifier = gw.notifier();
        let n = notifier.clone();
        manager
            .directpath()
            .set_notify_hook(Arc::new(move |name: &str, _| {
                n.notify(&format!("sensors/{name}"));
                n.notify(&format!("actuators/{name}"));
            }));
        let host = DeviceHost {
            bridge: None,
            manager,
            notifier,
            max_block: max_payload.clamp(16, 1024),
        };
        for dev in host.manager.list() {
            host.serve(gw, &dev)?;
        }
        gw.add_resource(links_resource(&host.manager, host.max_block))?;
        let m = host.manager.clone();
        gw.add_metrics_source(Arc::new(move |e: &mut Exposition| collect(e, &m)));
        let m = host.manager.clone();
        gw.add_state_source("devices", Arc::new(move || devices_state(&m)));
        let m = host.manager.clone();
        gw.add_state_source("directpath", Arc::new(move || directpath_state(&m)));
        Ok(host)
    }

    fn serve(&self, gw: &Gateway, dev: &Arc<Device>) -> Result<(), DeviceHostError> {
        gw.add_resource(device_resource(dev))?;
        if let Err(e) = gw.add_resource(history_resource(dev, self.max_block)) {
            gw.remove_resource(&resource_path(dev));
            return Err(e.into());
        }
        let n = self.notifier.clone();
        let path = resource_path(dev);
        let last = AtomicU64::new(f64::NAN.to_bits());
        // validated when the device was added
        let every = dev.spec().notify_period().ok().flatten();
        let last_ms = AtomicU64::new(0);
        dev.watch(Arc::new(move |_, v, unix_ms| {
            let changed = last.swap(v.to_bits(), Ordering::Relaxed) != v.to_bits();
            let due = every.is_some_and(|e| {
                unix_ms.saturating_sub(last_ms.load(Ordering::Relaxed)) >= e.as_millis() as u64
            });
            if changed || due {
                last_ms.store(unix_ms, Ordering::Relaxed);
                n.notify(&path);
            }
        }));
        Ok(())
    }

    /// Adds a device while running and serves it.
    pub fn add_device(
        &self,
        gw: &Gateway,
        spec: DeviceSpec,
    ) -> Result<Arc<Device>, DeviceHostError> {
        let dev = self.manager.add(spec)?;
        if let Err(e) = self.serve(gw, &dev) {
            let _ = self.manager.remove(dev.name());
            return Err(e);
        }
        Ok(dev)
    }

    /// Removes a device, its resources (observers get 4.04) and its links.
    pub fn remove_device(&self, gw: &Gateway, name: &str) -> Result<(), DeviceHostError> {
        let dev = self.manager.remove(name)?;
        let path = resource_path(&dev);
        gw.remove_resource(&format!("{path}/history"));
        gw.remove_resource(&path);
        Ok(())
    }

    /// The device manager (devices, links, direct path).
    pub fn manager(&self) -> &DeviceManager {
        &self.manager
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_puts() {
        assert_eq!(fmt_value(22.51349), "22.513");
        assert_eq!(fmt_value(1.0), "1");
        assert_eq!(fmt_value(-0.5), "-0.5");
        assert_eq!(fmt_value(0.0001), "0");
        assert_eq!(parse_put(b" 2.5\n"), Ok(2.5));
        assert_eq!(parse_put(b"ON"), Ok(1.0));
        assert_eq!(parse_put(b"off"), Ok(0.0));
        let json = Some(ContentFormat::JSON);
        assert_eq!(parse_put_as(json, br#"{"n":"led0","v":2,"t":0}"#), Ok(2.0));
        assert_eq!(parse_put_as(json, br#"{"value":true}"#), Ok(1.0));
        assert!(parse_put_as(json, b"2").is_err());
        assert!(parse_put_as(json, br#"{"v":"x"}"#).is_err());
        assert_eq!(parse_put_as(None, b"on"), Ok(1.0));
        assert!(parse_put(b"nan").unwrap_err().contains("expected a number"));
        assert!(parse_put(&[0xff]).is_err());
    }
}
