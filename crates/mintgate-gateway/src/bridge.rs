//! The MQTT bridges (paper 004's publish queue; configured in `[mqtt]`,
//! `docs/mqtt.md`):
//!
//! - devices -> topics: every new value of a device (a sensor's sample or
//!   edge, an actuator write from CoAP, MQTT or the direct path) is
//!   published to `{topic_prefix}sensors/NAME` or
//!   `{topic_prefix}actuators/NAME` (`publish_devices`), and to the topics
//!   of `[[mqtt.publish]]` entries (optionally at most one value per
//!   `min_interval`);
//! - direct path -> topics: the `mqtt(TOPIC)` output kind, so that a link
//!   such as `temp0 | threshold(23, 21) -> mqtt(alerts/temp)` publishes
//!   when its filters pass;
//! - Observe -> topics: each `[[mqtt.observe]]` entry observes a CoAP
//!   resource (any server) and publishes every notification;
//! - topics -> actuators: each `[[mqtt.command]]` entry subscribes to a
//!   topic and writes what arrives (a number, `on`/`off`, or JSON with a
//!   `value`) to an actuator. A payload that is none of these, or a write
//!   that fails, is counted and logged, never fatal.
//!
//! Everything published goes through one persistent publish queue
//! ([`mintgate_mqtt::Publisher`]): durable before it is sent, QoS 1 with one
//! message in flight by default, resent in order after a broker outage or a
//! restart, each message in the queue's JSON envelope (`pub`, `seq`, `ts`,
//! `msg`). The body (`msg`) is JSON: `{"device":"temp0","value":22.513,
//! "unit":"Cel","ts":1732550400123}` for a device value or a link output,
//! `{"uri":"coap://…","observe":7,"ct":0,"payload":"22.5","value":22.5,
//! "ts":…}` for a notification (`value` when the payload is a number).
//!
//! Watch callbacks and the `mqtt` output run on driver threads and on the
//! direct path's high-priority worker: they only stamp the value and offer
//! it to a bounded channel (`backlog`), never block, and count what a full
//! channel drops. One publishing thread takes the values off in order and
//! enqueues them (a durable write); the command listener and each observed
//! resource have a thread of their own. These threads are Application
//! Services of the gateway's Thread Pool Manager when one is given.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_coap::uri::CoapUri;
use mintgate_coap::wire::ContentFormat;
use mintgate_devices::directpath::{Event, OutputSink};
use mintgate_devices::{Device, DeviceManager, Direction};
use mintgate_mqtt::broker::EmbeddedBroker;
use mintgate_mqtt::conn::check_topic;
use mintgate_mqtt::publisher::{Flags, Status, GATEWAY_PLACEHOLDER};
use mintgate_mqtt::{
    BrokerUrl, Listener, ListenerConfig, ListenerControl, Publisher, PublisherConfig, Qos,
};
use mintgate_sched::ThreadPoolManager;

use crate::bridge_format::{self as fmt, expand, Format, TemplateVars};
use crate::config::MqttSection;
use crate::devices::{parse_put, resource_path};
use crate::observe_client::{resolve, Observation, ObserveEvent};
use crate::pipeline::MetricsSource;

/// Why the bridges could not start.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// A configuration entry cannot be served (unknown device, ...).
    #[error("invalid config value {key}: {why}")]
    Config {
        /// The key, dotted.
        key: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The embedded broker did not start.
    #[error("starting the embedded MQTT broker: {0}")]
    Broker(std::io::Error),
    /// The publish queue did not start (its store, most often).
    #[error("starting the MQTT publish queue: {0}")]
    Publisher(#[from] mintgate_mqtt::publisher::PublishError),
    /// A thread could not be started.
    #[error("starting an MQTT bridge thread: {0}")]
    Thread(std::io::Error),
}

/// The bridges' counters (also served as Prometheus metrics).
#[derive(Debug, Default)]
pub struct BridgeCounters {
    /// Messages put in the publish queue (durable).
    pub enqueued: AtomicU64,
    /// Values dropped because the backlog was full.
    pub dropped_backlog: AtomicU64,
    /// Values lost because the queue refused them (its store failed).
    pub dropped_error: AtomicU64,
    /// Values skipped by a `min_interval`.
    pub skipped: AtomicU64,
    /// Commands written to their actuator.
    pub commands_applied: AtomicU64,
    /// Commands refused: a payload that is not a value, or a failed write.
    pub commands_rejected: AtomicU64,
    /// Notifications received from observed resources.
    pub observe_notifications: AtomicU64,
    /// Registrations sent to observed resources (first ones and renewals).
    pub observe_registrations: AtomicU64,
}

/// A device route: the device's values to one topic.
struct Route {
    device: String,
    topic: String,
    unit: Option<String>,
    /// Published with the retain flag.
    retain: bool,
    /// Payload format.
    format: Format,
    /// 0: every value.
    min_interval_ns: u64,
    /// When the last value passed, ns since the hub's start (`NEVER`: none).
    last_ns: AtomicU64,
}

const NEVER: u64 = u64::MAX;

/// One value on its way to the publishing thread.
enum Item {
    /// A device's new value.
    Value {
        route: Arc<Route>,
        value: f64,
        unix_ms: u64,
    },
    /// A link's `mqtt(TOPIC)` output.
    Link {
        topic: Arc<str>,
        format: Format,
        input: u32,
        value: f64,
        unix_ms: u64,
    },
    /// A notification of an observed resource.
    Observed {
        topic: Arc<str>,
        format: Format,
        /// The resource's path (a SenML record's name).
        path: Arc<str>,
        uri: Arc<str>,
        observe: Option<u32>,
        content_format: Option<u16>,
        payload: Vec<u8>,
        unix_ms: u64,
    },
}

/// One `[[mqtt.observe]]` entry, ready.
struct Observed {
    text: Arc<str>,
    uri: CoapUri,
    accept: Option<ContentFormat>,
    topic: String,
    format: Format,
    /// The resource's path, `sensors/temp0`.
    path: Arc<str>,
}

/// What the producers share: the channel's sending side and the counters.
struct Hub {
    tx: SyncSender<Item>,
    counters: Arc<BridgeCounters>,
    closed: AtomicBool,
    t0: Instant,
}

impl Hub {
    /// Offers an item without blocking; false when it was dropped.
    fn offer(&self, item: Item) -> bool {
        if self.closed.load(Relaxed) {
            return false;
        }
        match self.tx.try_send(item) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.counters.dropped_backlog.fetch_add(1, Relaxed);
                false
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// A device's new value, recorded at `unix_ms` (runs on the thread that
    /// recorded it).
    fn value(&self, route: &Arc<Route>, value: f64, unix_ms: u64) {
        if route.min_interval_ns > 0 {
            let now = self.t0.elapsed().as_nanos() as u64;
            let last = route.last_ns.load(Relaxed);
            if last != NEVER && now.saturating_sub(last) < route.min_interval_ns {
                self.counters.skipped.fetch_add(1, Relaxed);
                return;
            }
            route.last_ns.store(now, Relaxed);
        }
        self.offer(Item::Value {
            route: route.clone(),
            value,
            unix_ms,
        });
    }
}

fn unix_ms() -> u64 {
    mintgate_mqtt::payload::now_ms()
}

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

/// At most one warning a second; the ones in between are counted and
/// mentioned in the next.
struct LogLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    fn new() -> LogLimit {
        LogLimit {
            last: None,
            suppressed: 0,
        }
    }

    fn warn(&mut self, msg: std::fmt::Arguments<'_>) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return;
        }
        if self.suppressed > 0 {
            tracing::warn!("{msg} ({} similar warnings suppressed)", self.suppressed);
        } else {
            tracing::warn!("{msg}");
        }
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

/// Parses a command payload: a number, `on`/`off`/`true`/`false`, a JSON
/// object with a numeric or boolean `value`, or any of these as the `msg`
/// of a publish-queue envelope. Total: never panics, whatever the bytes.
pub fn parse_command(payload: &[u8]) -> Result<f64, String> {
    if let Ok(env) = mintgate_mqtt::decode(payload) {
        return parse_value_text(env.msg.as_bytes());
    }
    parse_value_text(payload)
}

fn parse_value_text(payload: &[u8]) -> Result<f64, String> {
    let text = std::str::from_utf8(payload).map(str::trim).unwrap_or("");
    if text.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("the payload is not valid JSON: {e}"))?;
        return crate::devices::json_value(&v, &["value"]);
    }
    parse_put(payload)
}

fn spawn(
    services: Option<&ThreadPoolManager>,
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, BridgeError> {
    match services {
        Some(m) => m.spawn_service(name, f),
        None => std::thread::Builder::new().name(name.into()).spawn(f),
    }
    .map_err(BridgeError::Thread)
}

/// Sleeps `d` in short steps; false when asked to stop meanwhile.
fn sleep_running(stop: &AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if stop.load(Relaxed) {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
    !stop.load(Relaxed)
}

/// How long the queue may take to get its last messages acknowledged when
/// the bridges stop (what is left stays in the store for the next start).
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

/// Most items the publishing thread takes off the channel at once.
const BATCH: usize = 256;

/// The running bridges; dropping them stops them.
pub struct MqttBridge {
    broker: BrokerUrl,
    /// Where the queue publishes: the broker, or the JetStream output.
    target: String,
    /// `mqtt` or `nats`: the uplink's name in `/readyz`.
    uplink_kind: &'static str,
    hub: Arc<Hub>,
    publisher: Option<Arc<Publisher>>,
    listener: Option<ListenerControl>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    watches: Vec<(Arc<Device>, u64)>,
    routes: Vec<(String, String)>,
    /// The publish queue's bounds.
    limits: mintgate_mqtt::queue::Limits,
    /// Kept so that the broker's addresses stay documented; rumqttd itself
    /// cannot be stopped and lives until the process exits.
    _embedded: Option<EmbeddedBroker>,
}

impl MqttBridge {
    /// Starts the bridges `cfg` describes for the devices of `manager`
    /// (whether or not `cfg.enabled` is set) and registers the `mqtt` output
    /// kind on its direct path; configured links naming `mqtt(...)` must be
    /// added after this. Threads join `services`' Application Service
    /// group when given.
    pub fn start(
        cfg: &MqttSection,
        manager: &DeviceManager,
        services: Option<&ThreadPoolManager>,
    ) -> Result<MqttBridge, BridgeError> {
        MqttBridge::start_with(cfg, None, manager, services)
    }

    /// [`MqttBridge::start`], publishing through `output` (the JetStream
    /// output of `[nats]`) instead of an MQTT broker when given: the same
    /// queue (`[mqtt]`'s state, window and `[mqtt.queue]`), topics and
    /// envelopes; no embedded broker, no status topic, and no
    /// `[[mqtt.command]]` (nothing to subscribe to).
    pub fn start_with(
        cfg: &MqttSection,
        output: Option<Arc<dyn mintgate_mqtt::Uplink>>,
        manager: &DeviceManager,
        services: Option<&ThreadPoolManager>,
    ) -> Result<MqttBridge, BridgeError> {
        let bad = |key, why: String| BridgeError::Config { key, why };
        if output.is_some() {
            if !cfg.command.is_empty() {
                return Err(bad(
                    "mqtt.command",
                    "commands need an MQTT broker; with nats.enabled the bridges only publish"
                        .into(),
                ));
            }
            if !cfg.status_topic.is_empty() {
                return Err(bad(
                    "mqtt.status_topic",
                    "a status topic needs an MQTT broker (a last will); not with nats.enabled"
                        .into(),
                ));
            }
        }
        cfg.validate(
            &manager
                .list()
                .iter()
                .map(|d| d.spec().clone())
                .collect::<Vec<_>>(),
        )
        .map_err(|e| match e {
            crate::config::ConfigError::Value { key, why } => bad(key, why),
            other => bad("mqtt", other.to_string()),
        })?;

        // Routes first: a configuration error should not leave a broker
        // started for nothing.
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
        let mut commands: HashMap<String, Arc<Device>> = HashMap::new();
        for c in &cfg.command {
            let dev = manager
                .get(&c.device)
                .ok_or_else(|| bad("mqtt.command", format!("no device `{}`", c.device)))?;
            if dev.direction() != Direction::Actuator {
                return Err(bad(
                    "mqtt.command",
                    format!("`{}` is a sensor, not an actuator", c.device),
                ));
            }
            // A command topic the bridge also publishes to would feed the
            // actuator its own echo.
            if let Some(r) = routes.iter().find(|r| r.topic == c.topic) {
                return Err(bad(
                    "mqtt.command",
                    format!(
                        "topic {:?} is also where device `{}` is published",
                        c.topic, r.device
                    ),
                ));
            }
            if cfg.observe.iter().any(|o| o.topic == c.topic) {
                return Err(bad(
                    "mqtt.command",
                    format!("topic {:?} is also an [[mqtt.observe]] topic", c.topic),
                ));
            }
            commands.insert(c.topic.clone(), dev);
        }
        let mut observes = Vec::new();
        for o in &cfg.observe {
            let uri: CoapUri = mintgate_coap::uri::parse(&o.uri)
                .map_err(|e| bad("mqtt.observe", e.to_string()))?;
            let accept = o
                .accept
                .as_deref()
                .map(|a| {
                    ContentFormat::parse(a)
                        .ok_or_else(|| bad("mqtt.observe", format!("accept: unknown {a:?}")))
                })
                .transpose()?;
            let path = uri
                .options
                .iter()
                .filter(|(n, _)| *n == mintgate_coap::wire::OptionNumber::URI_PATH)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .collect::<Vec<_>>()
                .join("/");
            observes.push(Observed {
                text: o.uri.as_str().into(),
                uri,
                accept,
                topic: o.topic.clone(),
                format: cfg.format_of(o.format.as_deref()),
                path: path.into(),
            });
        }

        let (broker, embedded) = match cfg.broker_url().map_err(|e| bad("mqtt.broker", e))? {
            // with another output the MQTT broker is not used
            _ if output.is_some() => (BrokerUrl::from_addr(([127, 0, 0, 1], 0).into()), None),
            Some(url) => (url, None),
            None => {
                for a in [cfg.embedded_listen, cfg.embedded_listen5] {
                    // rumqttd reports a taken port only in its log, and a
                    // connection would then reach whatever holds it.
                    if a.port() != 0 {
                        std::net::TcpListener::bind(a).map_err(|e| {
                            BridgeError::Broker(std::io::Error::new(
                                e.kind(),
                                format!(
                                    "cannot listen on {a} ({e}); another broker there? set \
                                     mqtt.broker to its URL, or mqtt.embedded_listen/\
                                     embedded_listen5 to free ports"
                                ),
                            ))
                        })?;
                    }
                }
                let b = EmbeddedBroker::start(cfg.embedded_listen, cfg.embedded_listen5)
                    .map_err(BridgeError::Broker)?;
                tracing::info!(
                    "embedded MQTT broker on mqtt://{} (3.1.1) and mqtt5://{} (5)",
                    b.addr(),
                    b.addr_v5()
                );
                (b.url(), Some(b))
            }
        };
        let qos = Qos::from_level(cfg.qos).unwrap_or(Qos::AtLeastOnce);
        let mut pc = PublisherConfig::new(broker.clone());
        pc.message_expiry = cfg.message_expiry();
        pc.qos = qos;
        pc.window = cfg.window;
        pc.state = cfg.persist.then(|| cfg.state.clone());
        pc.status_topic = cfg.status_topic();
        pc.limits = cfg.queue.limits();
        let (target, uplink_kind) = match &output {
            Some(o) => (o.describe(), "nats"),
            None => (broker.to_string(), "mqtt"),
        };
        pc.uplink = output;
        let publisher = Arc::new(Publisher::start(pc)?);
        let status = publisher.status();
        if status.resumed > 0 {
            tracing::info!(
                unacked = status.resumed,
                "MQTT publish queue: resending what the last run left unacknowledged"
            );
        }

        // {gateway} in the topics: the queue's publisher id
        let gateway: Arc<str> = publisher.publisher_id().into();
        let with_gw = |t: &str| t.replace(GATEWAY_PLACEHOLDER, &gateway);
        let routes: Vec<Arc<Route>> = routes
            .into_iter()
            .map(|mut r| {
                r.topic = with_gw(&r.topic);
                Arc::new(r)
            })
            .collect();
        let commands: HashMap<String, Arc<Device>> = commands
            .into_iter()
            .map(|(t, d)| (with_gw(&t), d))
            .collect();
        for o in &mut observes {
            o.topic = with_gw(&o.topic);
        }
        for t in routes
            .iter()
            .map(|r| &r.topic)
            .chain(commands.keys())
            .chain(observes.iter().map(|o| &o.topic))
        {
            check_topic(t).map_err(|e| bad("mqtt", format!("topic {t:?}: {e}")))?;
        }

        let counters = Arc::new(BridgeCounters::default());
        let (tx, rx) = mpsc::sync_channel(cfg.backlog);
        let hub = Arc::new(Hub {
            tx,
            counters: counters.clone(),
            closed: AtomicBool::new(false),
            t0: Instant::now(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut bridge = MqttBridge {
            broker: broker.clone(),
            target: target.clone(),
            uplink_kind,
            hub: hub.clone(),
            publisher: Some(publisher.clone()),
            listener: None,
            stop: stop.clone(),
            threads: Vec::new(),
            watches: Vec::new(),
            routes: routes
                .iter()
                .map(|r| (r.device.clone(), r.topic.clone()))
                .collect(),
            limits: cfg.queue.limits(),
            _embedded: embedded,
        };

        // the publishing thread
        {
            let (stop, m, p) = (stop.clone(), manager.clone(), publisher.clone());
            let c = counters.clone();
            bridge.threads.push(spawn(services, "mqtt-bridge", move || {
                publish_loop(&rx, &stop, &m, &p, &c)
            })?);
        }
        // the direct path's mqtt(TOPIC) output; not to a command topic (the
        // actuator would be fed this output), for links added at run time
        // too (the config check covers the file's)
        {
            let hub = hub.clone();
            let command_topics: Vec<String> = commands.keys().cloned().collect();
            let (gateway, format) = (gateway.clone(), cfg.format_of(None));
            manager.directpath().register_output_kind(
                "mqtt",
                Arc::new(move |arg: &str| -> Result<Arc<dyn OutputSink>, String> {
                    let vars = TemplateVars {
                        device: None,
                        gateway: Some(&gateway),
                    };
                    let topic =
                        expand(arg.trim(), vars).map_err(|e| format!("mqtt({arg}): {e}"))?;
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
        // device values: every one recorded from now on
        for (route, dev) in routes.iter().zip(&route_devs) {
            let (h, r) = (hub.clone(), route.clone());
            let id = dev.watch(Arc::new(move |_: &str, v: f64, t: u64| h.value(&r, v, t)));
            bridge.watches.push((dev.clone(), id));
        }
        // commands
        if !commands.is_empty() {
            let (listener, control) = Listener::new(ListenerConfig {
                broker: broker.clone(),
                filters: commands.keys().cloned().collect(),
                qos: Qos::AtLeastOnce,
                client_id: format!("{}-cmd", publisher.publisher_id()),
                persistent_session: cfg.command_session_expiry().is_some(),
                session_expiry: cfg
                    .command_session_expiry()
                    .unwrap_or(mintgate_mqtt::conn::DEFAULT_SESSION_EXPIRY),
            });
            bridge.listener = Some(control);
            let c = counters.clone();
            bridge
                .threads
                .push(spawn(services, "mqtt-commands", move || {
                    let mut log = LogLimit::new();
                    listener.run(|topic, payload| {
                        apply_command(&commands, topic, payload, &c, &mut log)
                    });
                })?);
        }
        // observed resources
        for (i, o) in observes.into_iter().enumerate() {
            let (hub, stop) = (hub.clone(), stop.clone());
            bridge
                .threads
                .push(spawn(services, &format!("mqtt-observe-{i}"), move || {
                    observe_loop(&hub, &stop, &o)
                })?);
        }
        tracing::info!(
            broker = %target,
            publisher = publisher.publisher_id(),
            device_topics = bridge.routes.len(),
            commands = cfg.command.len(),
            observed = cfg.observe.len(),
            "MQTT bridges running"
        );
        Ok(bridge)
    }

    /// The broker the bridges use (the embedded one's address when
    /// `broker = "embedded"`; port 0 with a JetStream output).
    pub fn broker_url(&self) -> &BrokerUrl {
        &self.broker
    }

    /// The counters.
    pub fn counters(&self) -> &BridgeCounters {
        &self.hub.counters
    }

    /// (device, topic) of every device route.
    pub fn routes(&self) -> &[(String, String)] {
        &self.routes
    }

    /// The publish queue's state.
    pub fn publisher_status(&self) -> Option<Status> {
        self.publisher.as_ref().map(|p| p.status())
    }

    /// The publisher id the envelopes carry.
    pub fn publisher_id(&self) -> Option<String> {
        self.publisher
            .as_ref()
            .map(|p| p.publisher_id().to_string())
    }

    /// Waits (at most `timeout`) until the command topics are subscribed;
    /// true at once when there are none.
    pub fn wait_commands_subscribed(&self, timeout: Duration) -> bool {
        self.listener
            .as_ref()
            .is_none_or(|l| l.wait_subscribed(timeout))
    }

    /// The bridges' metrics, for [`crate::Gateway::add_metrics_source`]. It
    /// holds no strong reference: after the bridges stop it renders the
    /// last counters and no queue state.
    pub fn metrics_source(&self) -> MetricsSource {
        let c = self.hub.counters.clone();
        let p: Weak<Publisher> = self
            .publisher
            .as_ref()
            .map(Arc::downgrade)
            .unwrap_or_default();
        Arc::new(move |out: &mut String| render_metrics(&c, p.upgrade().map(|p| p.status()), out))
    }

    /// The uplink's readiness check and its name (`mqtt` or `nats`), for
    /// [`crate::Gateway::add_ready_check`]: ready while the publish queue
    /// is connected. Like [`MqttBridge::metrics_source`] it holds no strong
    /// reference.
    pub fn ready_check(&self) -> (&'static str, crate::health::ReadyCheck) {
        let p: Weak<Publisher> = self
            .publisher
            .as_ref()
            .map(Arc::downgrade)
            .unwrap_or_default();
        let kind = self.uplink_kind;
        let f = move || match p.upgrade().map(|p| p.status()) {
            Some(s) if s.connected && !s.stopped => Ok(()),
            Some(s) if !s.stopped => Err(format!(
                "the publish queue is not connected to the {} ({} connections so far; \
                 the log and the dashboard say why)",
                if kind == "nats" {
                    "NATS servers"
                } else {
                    "MQTT broker"
                },
                s.connects
            )),
            _ => Err("the publish queue has stopped".to_owned()),
        };
        (kind, Arc::new(f))
    }

    /// The dashboard's `mqtt` section, for
    /// [`crate::Gateway::add_state_source`]: broker state, publish-queue
    /// depth and the counters. Like [`MqttBridge::metrics_source`] it holds
    /// no strong reference.
    pub fn state_source(&self) -> crate::pipeline::StateSource {
        let c = self.hub.counters.clone();
        let p: Weak<Publisher> = self
            .publisher
            .as_ref()
            .map(Arc::downgrade)
            .unwrap_or_default();
        let broker = self.target.clone();
        let limits = self.limits;
        Arc::new(move || {
            let st = p.upgrade().map(|p| p.status());
            serde_json::json!({
                "state": match &st {
                    None => "stopped",
                    Some(s) if s.stopped => "stopped",
                    Some(s) if s.connected => "connected",
                    Some(_) => "connecting",
                },
                "broker": broker,
                "queue_depth": st.as_ref().map(|s| s.unacked),
                "queue_bytes": st.as_ref().map(|s| s.bytes),
                "queue_max_messages": limits.max_messages,
                "queue_dropped_full": st.as_ref().map(|s| s.queue.dropped_full),
                "queue_refused_full": st.as_ref().map(|s| s.queue.refused_full),
                "queue_refused_disk_full": st.as_ref().map(|s| s.queue.refused_disk),
                "queue_refused_by_broker": st.as_ref().map(|s| s.queue.refused_by_broker),
                "store_full": st.as_ref().map(|s| s.store_full),
                "connects": st.as_ref().map(|s| s.connects),
                "last_error": st.as_ref().and_then(|s| s.last_error.clone()),
                "enqueued": c.enqueued.load(Relaxed),
                "dropped": c.dropped_backlog.load(Relaxed) + c.dropped_error.load(Relaxed),
                "commands_applied": c.commands_applied.load(Relaxed),
                "commands_rejected": c.commands_rejected.load(Relaxed),
                "observe_notifications": c.observe_notifications.load(Relaxed),
            })
        })
    }

    /// Stops the bridges: no new values are taken, what the backlog holds
    /// is enqueued, the queue gets [`CLOSE_DRAIN`] to have it acknowledged
    /// (the rest stays in its store), the command subscription and the
    /// observations end (with a deregistration).
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for (dev, id) in self.watches.drain(..) {
            dev.unwatch(id);
        }
        self.hub.closed.store(true, Relaxed);
        self.stop.store(true, Relaxed);
        if let Some(l) = &self.listener {
            l.stop();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(p) = self.publisher.take() {
            let st = match Arc::try_unwrap(p) {
                Ok(p) => p.close(CLOSE_DRAIN),
                Err(p) => p.status(), // a metrics render holds it: dropped later
            };
            let c = &self.hub.counters;
            tracing::info!(
                enqueued = c.enqueued.load(Relaxed),
                acked = st.queue.acked,
                unacked = st.unacked,
                dropped = c.dropped_backlog.load(Relaxed) + c.dropped_error.load(Relaxed),
                commands_applied = c.commands_applied.load(Relaxed),
                commands_rejected = c.commands_rejected.load(Relaxed),
                "MQTT bridges stopped"
            );
        }
    }
}

impl Drop for MqttBridge {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn publish_loop(
    rx: &Receiver<Item>,
    stop: &AtomicBool,
    m: &DeviceManager,
    p: &Publisher,
    c: &BridgeCounters,
) {
    let mut batch: Vec<Item> = Vec::with_capacity(BATCH);
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut log = LogLimit::new();
    loop {
        let stopping = stop.load(Relaxed);
        let wait = if stopping {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        match rx.recv_timeout(wait) {
            Ok(it) => batch.push(it),
            Err(mpsc::RecvTimeoutError::Timeout) if !stopping => continue,
            Err(_) => break, // stopping and drained, or every sender gone
        }
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(it) => batch.push(it),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        // consecutive messages to one topic go in one enqueue (and SenML
        // records in one pack); every enqueue of the batch is submitted
        // before any is waited for, so the whole batch is one durable write
        // (one commit for many sensors' topics, not one each)
        let mut run: Option<Run> = None;
        let mut submitted = Vec::new();
        for it in batch.drain(..) {
            let Some((topic, retain, format, body)) = body_of(it, m, &mut names, c, &mut log)
            else {
                continue;
            };
            match &mut run {
                Some(r) if *r.topic == *topic && r.retain == retain && r.format == format => {
                    r.bodies.push(body)
                }
                _ => {
                    if let Some(r) = run.take() {
                        submitted.push(r.submit(p));
                    }
                    run = Some(Run {
                        topic,
                        retain,
                        format,
                        bodies: vec![body],
                    });
                }
            }
        }
        if let Some(r) = run.take() {
            submitted.push(r.submit(p));
        }
        for (topic, n, r) in submitted {
            enqueued(&topic, n, r.and_then(|s| s.wait()), c, &mut log);
        }
    }
}

/// Consecutive messages to one topic, published alike.
struct Run {
    topic: Arc<str>,
    retain: bool,
    format: Format,
    /// Bodies; SenML records for [`Format::Senml`].
    bodies: Vec<String>,
}

impl Run {
    /// Hands the run to the queue: its topic, its message count, and the
    /// submission to wait on.
    fn submit(
        self,
        p: &Publisher,
    ) -> (
        Arc<str>,
        u64,
        Result<mintgate_mqtt::publisher::Submitted, mintgate_mqtt::publisher::PublishError>,
    ) {
        let flags = Flags {
            retain: self.retain,
            bare: self.format.bare(),
        };
        let bodies: Vec<String> = if self.format == Format::Senml {
            self.bodies
                .chunks(fmt::SENML_MAX_RECORDS)
                .map(|recs| fmt::senml_pack(p.publisher_id(), recs))
                .collect()
        } else {
            self.bodies
        };
        let n = bodies.len() as u64;
        let r = p.submit_many_with(&self.topic, flags, bodies);
        (self.topic, n, r)
    }
}

/// An item's topic, retain flag, format and body (a SenML record for
/// [`Format::Senml`]); `None` when it cannot be published (counted).
fn body_of(
    it: Item,
    m: &DeviceManager,
    names: &mut HashMap<u32, String>,
    c: &BridgeCounters,
    log: &mut LogLimit,
) -> Option<(Arc<str>, bool, Format, String)> {
    Some(match it {
        Item::Value {
            route,
            value,
            unix_ms,
        } => {
            let (name, unit) = (&route.device, route.unit.as_deref());
            let body = match route.format {
                Format::Envelope => fmt::value_body(name, unit, value, unix_ms),
                Format::Senml => fmt::senml_value(name, unit, value, unix_ms),
                Format::Bare => fmt::bare_value(value),
            };
            (
                route.topic.as_str().into(),
                route.retain,
                route.format,
                body,
            )
        }
        Item::Link {
            topic,
            format,
            input,
            value,
            unix_ms,
        } => {
            let name = names.get(&input).cloned().or_else(|| {
                let d = m.list().into_iter().find(|d| d.input_id() == input)?;
                names.insert(input, d.name().to_string());
                Some(d.name().to_string())
            });
            let name = name.as_deref().unwrap_or("?");
            let unit = m.get(name).and_then(|d| d.spec().unit.clone());
            let body = match format {
                Format::Envelope => fmt::value_body(name, unit.as_deref(), value, unix_ms),
                Format::Senml => fmt::senml_value(name, unit.as_deref(), value, unix_ms),
                Format::Bare => fmt::bare_value(value),
            };
            (topic, false, format, body)
        }
        Item::Observed {
            topic,
            format,
            path,
            uri,
            observe,
            content_format,
            payload,
            unix_ms,
        } => {
            let body = match format {
                Format::Envelope => {
                    fmt::observed_body(&uri, observe, content_format, &payload, unix_ms)
                }
                Format::Senml => fmt::senml_observed(&path, &payload, unix_ms),
                Format::Bare => match fmt::bare_observed(&payload) {
                    Ok(b) => b,
                    Err(e) => {
                        c.dropped_error.fetch_add(1, Relaxed);
                        log.warn(format_args!(
                            "MQTT bridge: a notification of {uri} lost: {e}"
                        ));
                        return None;
                    }
                },
            };
            (topic, false, format, body)
        }
    })
}

/// Counts (and says, when it must) how the enqueue of `n` messages to
/// `topic` ended.
fn enqueued(
    topic: &str,
    n: u64,
    r: Result<std::ops::RangeInclusive<u64>, mintgate_mqtt::publisher::PublishError>,
    c: &BridgeCounters,
    log: &mut LogLimit,
) {
    match r {
        Ok(_) => {
            c.enqueued.fetch_add(n, Relaxed);
        }
        // Counted by the queue itself (mintgate_mqtt_queue_refused_total)
        // and said by it when the disk fills; a full queue is said here.
        Err(mintgate_mqtt::publisher::PublishError::Refused {
            accepted,
            refused,
            why,
        }) => {
            c.enqueued.fetch_add(accepted, Relaxed);
            if why == mintgate_mqtt::publisher::Refusal::QueueFull {
                log.warn(format_args!(
                    "MQTT bridge: {refused} message(s) to {topic:?} refused: {why}"
                ));
            }
        }
        Err(e) => {
            c.dropped_error.fetch_add(n, Relaxed);
            log.warn(format_args!(
                "MQTT bridge: {n} message(s) to {topic:?} lost: {e}"
            ));
        }
    }
}

fn apply_command(
    commands: &HashMap<String, Arc<Device>>,
    topic: &str,
    payload: &[u8],
    c: &BridgeCounters,
    log: &mut LogLimit,
) {
    let Some(dev) = commands.get(topic) else {
        return; // not ours (a broker may deliver overlapping subscriptions)
    };
    let outcome = parse_command(payload).and_then(|v| {
        dev.write(v)
            .map(|()| v)
            .map_err(|e| format!("writing {}: {e}", dev.name()))
    });
    match outcome {
        Ok(v) => {
            c.commands_applied.fetch_add(1, Relaxed);
            tracing::debug!(topic, device = dev.name(), value = v, "command applied");
        }
        Err(why) => {
            c.commands_rejected.fetch_add(1, Relaxed);
            log.warn(format_args!(
                "MQTT command on {topic:?} for `{}` rejected ({} bytes): {why}",
                dev.name(),
                payload.len()
            ));
        }
    }
}

/// How long past a notification's Max-Age the observation may stay silent
/// before it is registered again (the server may have forgotten us).
const SILENCE_MARGIN: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

fn observe_loop(hub: &Hub, stop: &AtomicBool, o: &Observed) {
    let (text, uri, accept) = (&o.text, &o.uri, o.accept);
    let topic: Arc<str> = o.topic.as_str().into();
    let c = &hub.counters;
    let mut backoff = BACKOFF_MIN;
    while !stop.load(Relaxed) {
        let registered =
            resolve(uri).and_then(|dest| Observation::register(dest, uri.options.clone(), accept));
        let mut obs = match registered {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(uri = %text, "observing: {e}; trying again in {backoff:?}");
                if !sleep_running(stop, backoff) {
                    break;
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        c.observe_registrations.fetch_add(1, Relaxed);
        let mut heard = Instant::now();
        let mut max_age = Duration::from_secs(60);
        let mut count = 0u64;
        // Some(wait): register again after it; None: stop
        let again: Option<Duration> = loop {
            if stop.load(Relaxed) {
                break None;
            }
            let ev = match obs.next_event(Instant::now() + Duration::from_millis(200)) {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(uri = %text, "observing: {e}");
                    break Some(backoff);
                }
            };
            match ev {
                None => {
                    if obs.answered() && heard.elapsed() > max_age + SILENCE_MARGIN {
                        tracing::debug!(uri = %text, "no notification for {max_age:?}: registering again");
                        break Some(Duration::ZERO);
                    }
                }
                Some(ObserveEvent::Notification(n)) => {
                    count += 1;
                    heard = n.at;
                    max_age = Duration::from_secs(n.max_age.unwrap_or(60).into());
                    backoff = BACKOFF_MIN;
                    c.observe_notifications.fetch_add(1, Relaxed);
                    hub.offer(Item::Observed {
                        topic: topic.clone(),
                        format: o.format,
                        path: o.path.clone(),
                        uri: text.clone(),
                        observe: n.observe,
                        content_format: n.content_format,
                        payload: n.payload,
                        unix_ms: unix_ms(),
                    });
                    if n.observe.is_none() {
                        if count == 1 {
                            tracing::warn!(uri = %text, "answered without Observe: not observable; reading it again in {BACKOFF_MAX:?}");
                            break Some(BACKOFF_MAX);
                        }
                        tracing::info!(uri = %text, "the server ended the observation; registering again");
                        break Some(BACKOFF_MIN);
                    }
                }
                Some(ObserveEvent::Failed(n)) => {
                    tracing::warn!(uri = %text, code = %n.code, "observing: error answer; trying again in {backoff:?}");
                    break Some(backoff);
                }
                Some(ObserveEvent::NoAnswer) => {
                    tracing::warn!(uri = %text, "observing: no answer; trying again in {backoff:?}");
                    break Some(backoff);
                }
                Some(ObserveEvent::Reset) => {
                    tracing::warn!(uri = %text, "observing: registration reset; trying again in {backoff:?}");
                    break Some(backoff);
                }
                Some(ObserveEvent::Unreachable) => {
                    tracing::warn!(uri = %text, "observing: port unreachable (nothing listens); trying again in {backoff:?}");
                    break Some(backoff);
                }
            }
        };
        if obs.answered() {
            obs.deregister(Duration::from_millis(200));
        }
        match again {
            None => break,
            Some(d) => {
                if !sleep_running(stop, d) {
                    break;
                }
                if !d.is_zero() {
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}

/// The bridges' counters and the queue's state in the Prometheus text
/// format.
fn render_metrics(c: &BridgeCounters, st: Option<Status>, out: &mut String) {
    use std::fmt::Write as _;
    let mut one = |name: &str, kind: &str, help: &str, labels: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (l, v) in labels {
            let _ = writeln!(out, "{name}{l} {v}");
        }
    };
    let g = |a: &AtomicU64| a.load(Relaxed);
    one(
        "mintgate_mqtt_bridge_enqueued_total",
        "counter",
        "Messages the bridges put in the publish queue (durable).",
        &[("", g(&c.enqueued))],
    );
    one(
        "mintgate_mqtt_bridge_dropped_total",
        "counter",
        "Values the bridges dropped, by reason (backlog full, queue error).",
        &[
            ("{reason=\"backlog\"}", g(&c.dropped_backlog)),
            ("{reason=\"error\"}", g(&c.dropped_error)),
        ],
    );
    one(
        "mintgate_mqtt_bridge_skipped_total",
        "counter",
        "Device values skipped by a min_interval.",
        &[("", g(&c.skipped))],
    );
    one(
        "mintgate_mqtt_bridge_commands_total",
        "counter",
        "MQTT commands, by result (applied to the actuator, rejected).",
        &[
            ("{result=\"applied\"}", g(&c.commands_applied)),
            ("{result=\"rejected\"}", g(&c.commands_rejected)),
        ],
    );
    one(
        "mintgate_mqtt_bridge_observe_notifications_total",
        "counter",
        "Notifications received from observed CoAP resources.",
        &[("", g(&c.observe_notifications))],
    );
    one(
        "mintgate_mqtt_bridge_observe_registrations_total",
        "counter",
        "Observe registrations sent (first ones and renewals).",
        &[("", g(&c.observe_registrations))],
    );
    let gauges = st.as_ref().map(|st| (st.bytes, st.store_full));
    if let Some(st) = st {
        one(
            "mintgate_mqtt_published_total",
            "counter",
            "Queued messages the broker acknowledged.",
            &[("", st.queue.acked)],
        );
        one(
            "mintgate_mqtt_retransmitted_total",
            "counter",
            "Queued messages sent again after a lost connection.",
            &[("", st.queue.retransmitted)],
        );
        one(
            "mintgate_mqtt_unacked",
            "gauge",
            "Queued messages not yet acknowledged.",
            &[("", st.unacked as u64)],
        );
        one(
            "mintgate_mqtt_queue_dropped_total",
            "counter",
            "Queued messages dropped unsent, by reason (full: the oldest, to make room under \
             mqtt.queue; broker: its PUBACK refused the message).",
            &[
                ("{reason=\"full\"}", st.queue.dropped_full),
                ("{reason=\"broker\"}", st.queue.refused_by_broker),
            ],
        );
        one(
            "mintgate_mqtt_queue_refused_total",
            "counter",
            "New messages the publish queue refused, by reason (full: mqtt.queue.when_full = \
             refuse-new; disk: its store could not write).",
            &[
                ("{reason=\"full\"}", st.queue.refused_full),
                ("{reason=\"disk\"}", st.queue.refused_disk),
            ],
        );
        one(
            "mintgate_mqtt_connected",
            "gauge",
            "1 while the publish queue is connected to the broker.",
            &[("", u64::from(st.connected))],
        );
    }
    if let Some((bytes, store_full)) = gauges {
        crate::metrics::write_families(
            out,
            &[
                (
                    "mintgate_mqtt_queue_bytes",
                    "Bytes (topics and payloads) of the queued messages not yet acknowledged.",
                    bytes,
                ),
                (
                    "mintgate_mqtt_store_full",
                    "1 while the publish queue's store cannot write (disk full).",
                    u64::from(store_full),
                ),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_or_are_refused() {
        assert_eq!(parse_command(b"1"), Ok(1.0));
        assert_eq!(parse_command(b" 21.5\n"), Ok(21.5));
        assert_eq!(parse_command(b"ON"), Ok(1.0));
        assert_eq!(parse_command(b"off"), Ok(0.0));
        assert_eq!(parse_command(br#"{"value": 3}"#), Ok(3.0));
        assert_eq!(parse_command(br#"{"value": true}"#), Ok(1.0));
        assert_eq!(parse_command(br#"{"value": "off"}"#), Ok(0.0));
        assert_eq!(
            parse_command(br#"{"pub":"mg-1","seq":4,"ts":1,"msg":"on"}"#),
            Ok(1.0)
        );
        assert_eq!(
            parse_command(
                br#"{"pub":"mg-1","seq":4,"ts":1,"msg":"{\"device\":\"t\",\"value\":7}"}"#
            ),
            Ok(7.0)
        );
        for bad in [
            &b"banana"[..],
            b"",
            b"nan",
            b"inf",
            b"1e999",
            b"\xff\xfe",
            b"{",
            br#"{"value": null}"#,
            br#"{"v": 1}"#,
            br#"[1]"#,
        ] {
            assert!(parse_command(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_full_backlog_drops_and_counts() {
        let (tx, rx) = mpsc::sync_channel(2);
        let hub = Hub {
            tx,
            counters: Arc::default(),
            closed: AtomicBool::new(false),
            t0: Instant::now(),
        };
        let route = Arc::new(Route {
            device: "d".into(),
            topic: "t".into(),
            unit: None,
            retain: false,
            format: Format::Envelope,
            min_interval_ns: 0,
            last_ns: AtomicU64::new(NEVER),
        });
        for v in 0..5 {
            hub.value(&route, f64::from(v), 0);
        }
        assert_eq!(hub.counters.dropped_backlog.load(Relaxed), 3);
        let got: Vec<f64> = rx
            .try_iter()
            .map(|it| match it {
                Item::Value { value, .. } => value,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got, vec![0.0, 1.0], "the first ones, in order");
        // a min_interval lets the first through and skips the rest
        let slow = Arc::new(Route {
            min_interval_ns: 3_600_000_000_000,
            ..Route {
                device: "d".into(),
                topic: "t".into(),
                unit: None,
                retain: false,
                format: Format::Envelope,
                min_interval_ns: 0,
                last_ns: AtomicU64::new(NEVER),
            }
        });
        for v in 0..4 {
            hub.value(&slow, f64::from(v), 0);
        }
        assert_eq!(rx.try_iter().count(), 1);
        assert_eq!(hub.counters.skipped.load(Relaxed), 3);
        hub.closed.store(true, Relaxed);
        assert!(!hub.offer(Item::Value {
            route,
            value: 1.0,
            unix_ms: 0
        }));
    }
}
