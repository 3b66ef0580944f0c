//! Which values go to which topics: the device routes (`publish_devices`
//! and `[[mqtt.publish]]`) and the direct path's `mqtt(TOPIC)` output.
//!
//! A route's topic is expanded once, at start (`{device}`, `{kind}`, then
//! `{gateway}` when the queue has its id) and checked as an MQTT topic; no
//! `mqtt(TOPIC)` output may name a command topic, so that an actuator is
//! never fed its own output.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use mintgate_devices::directpath::{Event, OutputSink};
use mintgate_devices::{Device, DeviceManager};
use mintgate_mqtt::conn::check_topic;

use super::publish::{Hub, Item};
use super::{unix_ms, BridgeError};
use crate::bridge_format::{expand, Format, TemplateVars};
use crate::config::MqttSection;
use crate::devices::resource_path;

/// A device route: the device's values to one topic.
pub(super) struct Route {
    pub(super) device: String,
    pub(super) topic: String,
    pub(super) unit: Option<String>,
    /// Published with the retain flag.
    pub(super) retain: bool,
    /// Payload format.
    pub(super) format: Format,
    /// 0: every value.
    pub(super) min_interval_ns: u64,
    /// When the last value passed, ns since the hub's start (`NEVER`: none).
    pub(super) last_ns: AtomicU64,
}

pub(super) const NEVER: u64 = u64::MAX;

/// The `mqtt(TOPIC)` output of a direct-path link.
struct MqttOut {
    topic: Arc<str>,
    format: Format,
    hub: Arc<Hub>,
}

impl OutputSink for MqttOut {
    fn describe(&self) -> String {
        format!("mqtt({})", self.topic)
    }

    fn fire(&self, value: f64, ev: &Event) -> Result<(), String> {
        if self.hub.closed.load(Relaxed) {
            return Err("the MQTT bridge has stopped".into());
        }
        if self.hub.offer(Item::Link {
            topic: self.topic.clone(),
            format: self.format,
            input: ev.input,
            value,
            unix_ms: unix_ms(),
        }) {
            Ok(())
        } else {
            Err("the MQTT bridge's backlog is full".into())
        }
    }
}

/// The device routes `cfg` describes (`publish_devices` first, then each
/// `[[mqtt.publish]]` entry) and their devices, in the same order; topics
/// expanded but for `{gateway}` and checked.
pub(super) fn device_routes(
    cfg: &MqttSection,
    manager: &DeviceManager,
) -> Result<(Vec<Route>, Vec<Arc<Device>>), BridgeError> {
    let bad = |key, why: String| BridgeError::Config { key, why };
    // {device} and {kind} now, {gateway} once the queue says its id
    let dev_topic = |template: &str, dev: &Device, key: &'static str| {
        let kind = serde_json::to_value(dev.spec().kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let vars = TemplateVars {
            device: Some((dev.name(), &kind)),
            gateway: None,
        };
        expand(template, vars).map_err(|e| bad(key, e))
    };
    let mut routes: Vec<Route> = Vec::new();
    let mut route_devs: Vec<Arc<Device>> = Vec::new();
    if cfg.publish_devices {
        for dev in manager.list() {
            routes.push(Route {
                device: dev.name().to_string(),
                topic: format!(
                    "{}{}",
                    dev_topic(&cfg.topic_prefix, &dev, "mqtt.topic_prefix")?,
                    resource_path(&dev)
                ),
                unit: dev.spec().unit.clone(),
                retain: cfg.retain,
                format: cfg.format_of(None),
                min_interval_ns: 0,
                last_ns: AtomicU64::new(NEVER),
            });
            route_devs.push(dev);
        }
    }
    for p in &cfg.publish {
        let dev = manager
            .get(&p.device)
            .ok_or_else(|| bad("mqtt.publish", format!("no device `{}`", p.device)))?;
        let min = p
            .min_interval
            .as_deref()
            .map(crate::config::parse_duration)
            .transpose()
            .map_err(|e| bad("mqtt.publish", e))?
            .unwrap_or_default();
        routes.push(Route {
            device: p.device.clone(),
            topic: dev_topic(&p.topic, &dev, "mqtt.publish")?,
            unit: dev.spec().unit.clone(),
            retain: p.retain.unwrap_or(cfg.retain),
            format: cfg.format_of(p.format.as_deref()),
            min_interval_ns: min.as_nanos() as u64,
            last_ns: AtomicU64::new(NEVER),
        });
        route_devs.push(dev);
    }
    for r in &routes {
        check_topic(&r.topic).map_err(|e| bad("mqtt.topic_prefix", e))?;
    }
    Ok((routes, route_devs))
}

/// Registers the direct path's `mqtt(TOPIC)` output kind: a link's output
/// goes to `hub` in `format`, never to a command topic.
pub(super) fn register_mqtt_output(
    manager: &DeviceManager,
    hub: &Arc<Hub>,
    command_topics: Vec<String>,
    gateway: Arc<str>,
    format: Format,
) {
    let hub = hub.clone();
    manager.directpath().register_output_kind(
        "mqtt",
        Arc::new(move |arg: &str| -> Result<Arc<dyn OutputSink>, String> {
            let vars = TemplateVars {
                device: None,
                gateway: Some(&gateway),
            };
            let topic = expand(arg.trim(), vars).map_err(|e| format!("mqtt({arg}): {e}"))?;
            let topic = topic.as_str();
            check_topic(topic).map_err(|e| format!("mqtt({arg}): {e}"))?;
            if command_topics.iter().any(|c| c == topic) {
                return Err(format!(
                    "mqtt({arg}): also an [[mqtt.command]] topic (the actuator would \
                             be fed this output)"
                ));
            }
            Ok(Arc::new(MqttOut {
                topic: topic.into(),
                format,
                hub: hub.clone(),
            }))
        }),
    );
}

/// Offers every value recorded from now on by each route's device to
/// `hub`; the watches, to be removed when the bridges stop.
pub(super) fn watch_devices(
    routes: &[Arc<Route>],
    route_devs: &[Arc<Device>],
    hub: &Arc<Hub>,
) -> Vec<(Arc<Device>, u64)> {
    let mut watches = Vec::new();
    for (route, dev) in routes.iter().zip(route_devs) {
        let (h, r) = (hub.clone(), route.clone());
        let id = dev.watch(Arc::new(move |_: &str, v: f64, t: u64| h.value(&r, v, t)));
        watches.push((dev.clone(), id));
    }
    watches
}
