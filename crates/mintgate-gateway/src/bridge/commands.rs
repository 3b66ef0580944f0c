//! Command topics -> actuators: each `[[mqtt.command]]` entry names a topic
//! and an actuator; one listener thread subscribes to them all and writes
//! what arrives.
//!
//! A command topic is never one the bridges publish to (a device route or
//! an observed resource), so that an actuator is not fed its own echo. A
//! payload that is not a value, or a write that fails, is counted and
//! logged (at most one warning a second), never fatal.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;

use mintgate_devices::{Device, DeviceManager, Direction};
use mintgate_mqtt::{BrokerUrl, Listener, ListenerConfig, ListenerControl, Qos};
use mintgate_sched::ThreadPoolManager;

use super::routes::Route;
use super::{spawn, BridgeCounters, BridgeError, LogLimit};
use crate::config::MqttSection;
use crate::devices::parse_put;

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

/// The `[[mqtt.command]]` entries of `cfg`: topic -> actuator (topics still
/// holding `{gateway}`). Refuses a sensor, and a topic that is also a
/// route's or an observed resource's.
pub(super) fn command_table(
    cfg: &MqttSection,
    manager: &DeviceManager,
    routes: &[Route],
) -> Result<HashMap<String, Arc<Device>>, BridgeError> {
    let bad = |key, why: String| BridgeError::Config { key, why };
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
    Ok(commands)
}

/// Subscribes to the command topics (none: nothing started) on a thread of
/// its own, `{publisher_id}-cmd` as the client id; its control and thread.
pub(super) fn start_listener(
    cfg: &MqttSection,
    broker: &BrokerUrl,
    publisher_id: &str,
    commands: HashMap<String, Arc<Device>>,
    counters: Arc<BridgeCounters>,
    services: Option<&ThreadPoolManager>,
) -> Result<Option<(ListenerControl, JoinHandle<()>)>, BridgeError> {
    if commands.is_empty() {
        return Ok(None);
    }
    let (listener, control) = Listener::new(ListenerConfig {
        broker: broker.clone(),
        filters: commands.keys().cloned().collect(),
        qos: Qos::AtLeastOnce,
        client_id: format!("{publisher_id}-cmd"),
        persistent_session: cfg.command_session_expiry().is_some(),
        session_expiry: cfg
            .command_session_expiry()
            .unwrap_or(mintgate_mqtt::conn::DEFAULT_SESSION_EXPIRY),
    });
    let c = counters;
    let thread = spawn(services, "mqtt-commands", move || {
        let mut log = LogLimit::new();
        listener.run(|topic, payload| apply_command(&commands, topic, payload, &c, &mut log));
    })?;
    Ok(Some((control, thread)))
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
}
