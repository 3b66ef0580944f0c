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
//!
//! The parts: [`routes`] decides which values go to which topics (device
//! routes, the `mqtt(TOPIC)` output); [`publish`] is the channel and the
//! publishing thread in front of the queue; [`observe`] turns observed
//! resources into messages; [`commands`] turns command topics into actuator
//! writes; [`running`] starts them together as one [`MqttBridge`] and stops
//! them.

use std::sync::atomic::AtomicU64;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_sched::ThreadPoolManager;

mod commands;
mod observe;
mod publish;
mod routes;
mod running;

pub use commands::parse_command;
pub use running::MqttBridge;

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

fn unix_ms() -> u64 {
    mintgate_mqtt::payload::now_ms()
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
