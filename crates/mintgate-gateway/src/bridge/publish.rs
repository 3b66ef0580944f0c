//! The publishing side: the broker and the publish queue the bridges start,
//! the bounded channel (`backlog`) every producer offers values to, and the
//! one thread that takes them off in order and enqueues them.
//!
//! Producers (watch callbacks, the `mqtt` output, observations) only offer:
//! they never block, and what a full channel drops is counted. The
//! publishing thread keeps the order it received, groups consecutive
//! messages to one topic into one durable write, and drains the channel
//! before it stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_devices::DeviceManager;
use mintgate_mqtt::broker::EmbeddedBroker;
use mintgate_mqtt::publisher::Flags;
use mintgate_mqtt::{BrokerUrl, Publisher, PublisherConfig, Qos};

use super::routes::{Route, NEVER};
use super::{BridgeCounters, BridgeError, LogLimit};
use crate::bridge_format::{self as fmt, Format};
use crate::config::MqttSection;

/// One value on its way to the publishing thread.
pub(super) enum Item {
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

/// What the producers share: the channel's sending side and the counters.
pub(super) struct Hub {
    pub(super) tx: SyncSender<Item>,
    pub(super) counters: Arc<BridgeCounters>,
    pub(super) closed: AtomicBool,
    pub(super) t0: Instant,
}

impl Hub {
    /// Offers an item without blocking; false when it was dropped.
    pub(super) fn offer(&self, item: Item) -> bool {
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
    pub(super) fn value(&self, route: &Arc<Route>, value: f64, unix_ms: u64) {
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

/// Most items the publishing thread takes off the channel at once.
const BATCH: usize = 256;

/// The broker the queue publishes to: `cfg.broker`'s URL, or the embedded
/// broker started on `embedded_listen`/`embedded_listen5` (its ports
/// checked first: rumqttd would only log a taken one); a placeholder when
/// `other_output` (the queue publishes elsewhere).
pub(super) fn start_broker(
    cfg: &MqttSection,
    other_output: bool,
) -> Result<(BrokerUrl, Option<EmbeddedBroker>), BridgeError> {
    let bad = |key, why: String| BridgeError::Config { key, why };
    Ok(match cfg.broker_url().map_err(|e| bad("mqtt.broker", e))? {
        // with another output the MQTT broker is not used
        _ if other_output => (BrokerUrl::from_addr(([127, 0, 0, 1], 0).into()), None),
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
    })
}

/// Starts the publish queue to `broker`, or to `output` when given; the
/// queue, where it publishes, and the uplink's name (`mqtt` or `nats`).
pub(super) fn start_queue(
    cfg: &MqttSection,
    broker: &BrokerUrl,
    output: Option<Arc<dyn mintgate_mqtt::Uplink>>,
) -> Result<(Arc<Publisher>, String, &'static str), BridgeError> {
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
    Ok((publisher, target, uplink_kind))
}

pub(super) fn publish_loop(
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

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
                _ => panic!("not a value"),
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
