//! The running bridges as one [`MqttBridge`]: started from `[mqtt]` in an
//! order that leaves nothing running when the configuration is refused
//! (routes, commands and observations are checked before the broker and the
//! queue start), stopped in one place (watches removed, the channel closed
//! and drained, the queue given [`CLOSE_DRAIN`], the threads joined), and
//! seen through its counters, metrics, readiness and dashboard section,
//! none of which keeps the bridges alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_devices::{Device, DeviceManager};
use mintgate_mqtt::broker::EmbeddedBroker;
use mintgate_mqtt::conn::check_topic;
use mintgate_mqtt::publisher::{Status, GATEWAY_PLACEHOLDER};
use mintgate_mqtt::{BrokerUrl, ListenerControl, Publisher};
use mintgate_sched::ThreadPoolManager;

use super::publish::{publish_loop, start_broker, start_queue, Hub};
use super::routes::{device_routes, register_mqtt_output, watch_devices, Route};
use super::{commands, observe, spawn, BridgeCounters, BridgeError};
use crate::config::MqttSection;
use crate::exposition::Exposition;
use crate::pipeline::MetricsSource;

/// How long the queue may take to get its last messages acknowledged when
/// the bridges stop (what is left stays in the store for the next start).
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

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
        let (routes, route_devs) = device_routes(cfg, manager)?;
        let commands = commands::command_table(cfg, manager, &routes)?;
        let mut observes = observe::observed_entries(cfg)?;

        let (broker, embedded) = start_broker(cfg, output.is_some())?;
        let (publisher, target, uplink_kind) = start_queue(cfg, &broker, output)?;

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
        register_mqtt_output(
            manager,
            &hub,
            commands.keys().cloned().collect(),
            gateway.clone(),
            cfg.format_of(None),
        );
        // device values: every one recorded from now on
        bridge.watches = watch_devices(&routes, &route_devs, &hub);
        // commands
        if let Some((control, thread)) = commands::start_listener(
            cfg,
            &broker,
            publisher.publisher_id(),
            commands,
            counters.clone(),
            services,
        )? {
            bridge.listener = Some(control);
            bridge.threads.push(thread);
        }
        // observed resources
        for (i, o) in observes.into_iter().enumerate() {
            let (hub, stop) = (hub.clone(), stop.clone());
            bridge
                .threads
                .push(spawn(services, &format!("mqtt-observe-{i}"), move || {
                    observe::observe_loop(&hub, &stop, &o)
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
        Arc::new(move |m: &mut Exposition| collect(&c, p.upgrade().map(|p| p.status()), m))
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

/// The bridges' counters and the queue's state.
fn collect(c: &BridgeCounters, st: Option<Status>, m: &mut Exposition) {
    let g = |a: &AtomicU64| a.load(Relaxed);
    // One call per family, as in metrics.rs: rows of one shape (name, help,
    // value), written out so that each exported name stands as it is sent.
    m.counter(
        "mintgate_mqtt_bridge_enqueued_total",
        "Messages the bridges put in the publish queue (durable).",
        g(&c.enqueued),
    );
    m.counters(
        "mintgate_mqtt_bridge_dropped_total",
        "Values the bridges dropped, by reason (backlog full, queue error).",
        "reason",
        [
            ("backlog", g(&c.dropped_backlog)),
            ("error", g(&c.dropped_error)),
        ],
    );
    m.counter(
        "mintgate_mqtt_bridge_skipped_total",
        "Device values skipped by a min_interval.",
        g(&c.skipped),
    );
    m.counters(
        "mintgate_mqtt_bridge_commands_total",
        "MQTT commands, by result (applied to the actuator, rejected).",
        "result",
        [
            ("applied", g(&c.commands_applied)),
            ("rejected", g(&c.commands_rejected)),
        ],
    );
    m.counter(
        "mintgate_mqtt_bridge_observe_notifications_total",
        "Notifications received from observed CoAP resources.",
        g(&c.observe_notifications),
    );
    m.counter(
        "mintgate_mqtt_bridge_observe_registrations_total",
        "Observe registrations sent (first ones and renewals).",
        g(&c.observe_registrations),
    );
    let Some(st) = st else {
        return;
    };
    m.counter(
        "mintgate_mqtt_published_total",
        "Queued messages the broker acknowledged.",
        st.queue.acked,
    );
    m.counter(
        "mintgate_mqtt_retransmitted_total",
        "Queued messages sent again after a lost connection.",
        st.queue.retransmitted,
    );
    m.gauge(
        "mintgate_mqtt_unacked",
        "Queued messages not yet acknowledged.",
        st.unacked,
    );
    m.counters(
        "mintgate_mqtt_queue_dropped_total",
        "Queued messages dropped unsent, by reason (full: the oldest, to make room under \
         mqtt.queue; broker: its PUBACK refused the message).",
        "reason",
        [
            ("full", st.queue.dropped_full),
            ("broker", st.queue.refused_by_broker),
        ],
    );
    m.counters(
        "mintgate_mqtt_queue_refused_total",
        "New messages the publish queue refused, by reason (full: mqtt.queue.when_full = \
         refuse-new; disk: its store could not write).",
        "reason",
        [
            ("full", st.queue.refused_full),
            ("disk", st.queue.refused_disk),
        ],
    );
    m.gauge(
        "mintgate_mqtt_connected",
        "1 while the publish queue is connected to the broker.",
        st.connected,
    );
    m.gauge(
        "mintgate_mqtt_queue_bytes",
        "Bytes (topics and payloads) of the queued messages not yet acknowledged.",
        st.bytes,
    );
    m.gauge(
        "mintgate_mqtt_store_full",
        "1 while the publish queue's store cannot write (disk full).",
        st.store_full,
    );
}
