//! `[mqtt]` and its tables: the bridges to an MQTT broker.

use super::*;

/// `[mqtt]`: the bridges between devices, direct-path links, observed CoAP
/// resources and MQTT topics ([`crate::bridge`]). Off unless `enabled`
/// (`mintgate serve --mqtt`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttSection {
    /// Run the bridges.
    pub enabled: bool,
    /// `"embedded"` (start the embedded broker on `embedded_listen` and
    /// `embedded_listen5` and use it over MQTT 3.1.1), or the URL of any
    /// broker: `mqtt://HOST[:PORT]` (3.1.1) or `mqtt5://HOST[:PORT]` (5).
    pub broker: String,
    /// MQTT 3.1.1 listener of the embedded broker (port 0: any free port).
    pub embedded_listen: SocketAddr,
    /// MQTT 5 listener of the embedded broker (port 0: any free port).
    pub embedded_listen5: SocketAddr,
    /// Folder of the persistent publish queue (created if missing).
    pub state: std::path::PathBuf,
    /// Keep the publish queue in `state` (true), or in memory only (lost on
    /// a restart).
    pub persist: bool,
    /// QoS of the queue's publishes: 1 (the paper's Pub Queue) or 2.
    pub qos: u8,
    /// Messages in flight at once (1: the next only after the previous
    /// acknowledgement; more needs a reordering receiver).
    pub window: usize,
    /// Prefix of the automatic device topics (`{prefix}sensors/temp0`).
    pub topic_prefix: String,
    /// Publish every device's new values to `{topic_prefix}{resource path}`.
    pub publish_devices: bool,
    /// Publish device values with the retain flag: the broker keeps each
    /// device topic's latest value for late subscribers.
    pub retain: bool,
    /// Values waiting for the bridge's publishing thread at most; a value
    /// arriving when it is full is dropped and counted.
    pub backlog: usize,
    /// Explicit device -> topic entries (`[[mqtt.publish]]`).
    pub publish: Vec<MqttPublish>,
    /// Topic -> actuator entries (`[[mqtt.command]]`).
    pub command: Vec<MqttCommand>,
    /// Observed CoAP resources -> topic entries (`[[mqtt.observe]]`).
    pub observe: Vec<MqttObserve>,
    /// PEM file of the CA the broker's certificate must chain to
    /// (`mqtts://`; empty: the system's roots).
    pub ca_file: std::path::PathBuf,
    /// PEM file of the gateway's client certificate (mutual TLS; with
    /// `key_file`).
    pub cert_file: std::path::PathBuf,
    /// PEM file of the client certificate's private key.
    pub key_file: std::path::PathBuf,
    /// User name of the CONNECT (empty: none).
    pub username: String,
    /// File whose first line is the password (the password itself is never
    /// a config key, so never printed).
    pub password_file: std::path::PathBuf,
    /// Environment variable holding the password (if no `password_file`).
    pub password_env: String,
    /// Status topic: a retained `status_online` on every connection, a
    /// retained `status_offline` as the last will and on an orderly stop
    /// (empty: none).
    pub status_topic: String,
    /// Payload of the status topic while connected.
    pub status_online: String,
    /// Payload of the status topic once gone.
    pub status_offline: String,
    /// `[mqtt.queue]`: the publish queue's bounds.
    pub queue: MqttQueue,
    /// Payload format of the bridges: `"envelope"`, `"senml"` or `"bare"`
    /// (an entry's `format` overrides it).
    pub format: String,
    /// MQTT 5: message expiry interval of each publish, counted from when
    /// the value was queued (`"10m"`; empty: none).
    pub message_expiry: String,
    /// MQTT 5: how long the broker keeps the command subscription's session
    /// while the gateway is away, so that commands sent meanwhile are
    /// applied, in order, when it returns (`"10m"`; empty: a clean session,
    /// commands sent while away are not applied).
    pub command_session_expiry: String,
}

/// `[mqtt.queue]`: how much the publish queue holds while the broker is
/// away, and what happens when it is full.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MqttQueue {
    /// Most unacknowledged messages.
    pub max_messages: u64,
    /// Most bytes (topics and payloads) of unacknowledged messages.
    pub max_bytes: u64,
    /// `"drop-oldest"` (the newest values matter most) or `"refuse-new"`.
    pub when_full: String,
}

impl Default for MqttQueue {
    fn default() -> Self {
        MqttQueue {
            max_messages: 100_000,
            max_bytes: 64 << 20,
            when_full: "drop-oldest".into(),
        }
    }
}

impl MqttQueue {
    /// The bounds for the publish queue (after [`MqttSection::validate`]).
    pub fn limits(&self) -> mintgate_mqtt::queue::Limits {
        mintgate_mqtt::queue::Limits {
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
            when_full: self.when_full.parse().unwrap_or_default(),
        }
    }
}

impl Default for MqttSection {
    fn default() -> Self {
        MqttSection {
            enabled: false,
            broker: "embedded".into(),
            embedded_listen: ([127, 0, 0, 1], 1883).into(),
            embedded_listen5: ([127, 0, 0, 1], 1884).into(),
            state: "mintgate-mqtt".into(),
            persist: true,
            qos: 1,
            window: 1,
            topic_prefix: "mintgate/".into(),
            publish_devices: true,
            retain: false,
            backlog: 4096,
            publish: Vec::new(),
            command: Vec::new(),
            observe: Vec::new(),
            ca_file: Default::default(),
            cert_file: Default::default(),
            key_file: Default::default(),
            username: String::new(),
            password_file: Default::default(),
            password_env: String::new(),
            status_topic: String::new(),
            status_online: "online".into(),
            status_offline: "offline".into(),
            queue: MqttQueue::default(),
            format: "envelope".into(),
            message_expiry: String::new(),
            command_session_expiry: String::new(),
        }
    }
}

/// One `[[mqtt.publish]]` entry: a device's values to a topic.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqttPublish {
    /// The device.
    pub device: String,
    /// The topic (as written: no prefix is added).
    pub topic: String,
    /// Publish at most one value per this interval (`500ms`, `10s`); the
    /// values in between are skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_interval: Option<String>,
    /// Publish with the retain flag (default: `[mqtt] retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<bool>,
    /// Payload format (default: `[mqtt] format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// One `[[mqtt.command]]` entry: messages on a topic written to an actuator.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqttCommand {
    /// The topic (no wildcards; as written: no prefix is added).
    pub topic: String,
    /// The actuator.
    pub device: String,
}

/// One `[[mqtt.observe]]` entry: a CoAP resource observed, each
/// notification published to a topic.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqttObserve {
    /// `coap://HOST[:PORT]/PATH?QUERY` of an observable resource.
    pub uri: String,
    /// The topic (as written: no prefix is added).
    pub topic: String,
    /// Accept option of the registration (`text`, `json`, `50`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept: Option<String>,
    /// Payload format (default: `[mqtt] format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

impl MqttSection {
    /// The broker URL to connect to (`None` for `"embedded"`).
    ///
    /// The URL carries the TLS and credential keys; the password file or
    /// variable is read here.
    pub fn broker_url(&self) -> Result<Option<mintgate_mqtt::BrokerUrl>, String> {
        if self.broker == "embedded" {
            return Ok(None);
        }
        let url: mintgate_mqtt::BrokerUrl = self.broker.parse()?;
        let path = |p: &std::path::PathBuf| (!p.as_os_str().is_empty()).then(|| p.clone());
        let password = if let Some(f) = path(&self.password_file) {
            Some(mintgate_mqtt::Secret::from_file(&f)?)
        } else if !self.password_env.is_empty() {
            Some(mintgate_mqtt::Secret::from_env(&self.password_env)?)
        } else {
            None
        };
        Ok(Some(url.with_security(mintgate_mqtt::Security {
            ca_file: path(&self.ca_file),
            cert_file: path(&self.cert_file),
            key_file: path(&self.key_file),
            username: (!self.username.is_empty()).then(|| self.username.clone()),
            password,
        })))
    }

    /// The message expiry interval (after [`MqttSection::validate`]).
    pub fn message_expiry(&self) -> Option<std::time::Duration> {
        mqtt5_interval(&self.message_expiry).ok().flatten()
    }

    /// The command session's expiry (after [`MqttSection::validate`]);
    /// `None`: a clean session.
    pub fn command_session_expiry(&self) -> Option<std::time::Duration> {
        mqtt5_interval(&self.command_session_expiry).ok().flatten()
    }

    /// The format of an entry whose own `format` is `own` (after
    /// [`MqttSection::validate`]).
    pub fn format_of(&self, own: Option<&str>) -> crate::bridge_format::Format {
        own.unwrap_or(&self.format).parse().unwrap_or_default()
    }

    /// The status topic's settings (`None` without `status_topic`).
    pub fn status_topic(&self) -> Option<mintgate_mqtt::StatusTopic> {
        (!self.status_topic.is_empty()).then(|| mintgate_mqtt::StatusTopic {
            topic: self.status_topic.clone(),
            online: self.status_online.clone().into_bytes(),
            offline: self.status_offline.clone().into_bytes(),
        })
    }

    /// Checks every key; `devices` are the configured devices (a publish or
    /// command entry must name one of them).
    pub fn validate(&self, devices: &[mintgate_devices::DeviceSpec]) -> Result<(), ConfigError> {
        let v = |key, why: String| Err(ConfigError::Value { key, why });
        let security_set = [
            &self.ca_file,
            &self.cert_file,
            &self.key_file,
            &self.password_file,
        ]
        .iter()
        .any(|p| !p.as_os_str().is_empty())
            || !self.username.is_empty()
            || !self.password_env.is_empty();
        match self.broker_url() {
            Err(e) if self.broker.parse::<mintgate_mqtt::BrokerUrl>().is_err() => {
                return v("mqtt.broker", format!("{e} (or \"embedded\")"));
            }
            Err(e) => {
                let key = if !self.password_file.as_os_str().is_empty() {
                    "mqtt.password_file"
                } else {
                    "mqtt.password_env"
                };
                return v(key, e);
            }
            Ok(None) if security_set => {
                return v(
                    "mqtt.broker",
                    "the embedded broker takes no TLS or credential keys (ca_file, cert_file, \
                     key_file, username, password_file, password_env)"
                        .into(),
                );
            }
            Ok(None) => {}
            Ok(Some(url)) => {
                if !self.password_file.as_os_str().is_empty() && !self.password_env.is_empty() {
                    return v(
                        "mqtt.password_env",
                        "give password_file or password_env, not both".into(),
                    );
                }
                if let Err(e) = url.check() {
                    return v("mqtt.broker", format!("{}: {e}", self.broker));
                }
            }
        }
        use crate::bridge_format::{expand, Format, TemplateVars};
        // topics with {gateway} are checked with a stand-in id
        let gw = TemplateVars {
            device: None,
            gateway: Some("gw"),
        };
        let dev_gw = TemplateVars {
            device: Some(("d", "k")),
            gateway: Some("gw"),
        };
        if !self.status_topic.is_empty() {
            if let Err(e) =
                expand(&self.status_topic, gw).and_then(|t| mintgate_mqtt::conn::check_topic(&t))
            {
                return v("mqtt.status_topic", e);
            }
        }
        if let Err(e) = self.format.parse::<Format>() {
            return v("mqtt.format", e);
        }
        if let Err(e) = mqtt5_interval(&self.message_expiry) {
            return v("mqtt.message_expiry", e);
        }
        match mqtt5_interval(&self.command_session_expiry) {
            Err(e) => return v("mqtt.command_session_expiry", e),
            Ok(Some(_)) => {
                let v5 = self
                    .broker
                    .parse::<mintgate_mqtt::BrokerUrl>()
                    .is_ok_and(|u| u.version == mintgate_mqtt::Version::V5);
                if !v5 {
                    return v(
                        "mqtt.command_session_expiry",
                        "needs an MQTT 5 broker URL (mqtt5://, mqtts5://, ws5://, wss5://): \
                         over 3.1.1 (and with the embedded broker) how long a session lasts is \
                         the broker's own setting"
                            .to_string(),
                    );
                }
            }
            Ok(None) => {}
        }
        if let Err(e) = expand(&self.topic_prefix, dev_gw) {
            return v("mqtt.topic_prefix", e);
        }
        if !(1..=2).contains(&self.qos) {
            return v("mqtt.qos", format!("{} is not 1 or 2", self.qos));
        }
        if !(1..=1024).contains(&self.window) {
            return v(
                "mqtt.window",
                format!("{} is outside 1..=1024", self.window),
            );
        }
        if !(1..=10_000_000).contains(&self.queue.max_messages)
            || self.queue.max_messages <= self.window as u64
        {
            return v(
                "mqtt.queue.max_messages",
                format!(
                    "{} is outside {}..=10000000 (more than mqtt.window)",
                    self.queue.max_messages,
                    self.window + 1
                ),
            );
        }
        if !(4096..=1 << 40).contains(&self.queue.max_bytes) {
            return v(
                "mqtt.queue.max_bytes",
                format!("{} is outside 4096..=2^40", self.queue.max_bytes),
            );
        }
        if let Err(e) = self
            .queue
            .when_full
            .parse::<mintgate_mqtt::queue::WhenFull>()
        {
            return v("mqtt.queue.when_full", e);
        }
        if !(1..=1 << 20).contains(&self.backlog) {
            return v(
                "mqtt.backlog",
                format!("{} is outside 1..=1048576", self.backlog),
            );
        }
        if self.topic_prefix.contains(['+', '#', '\0']) {
            return v(
                "mqtt.topic_prefix",
                format!("{:?} may not contain '+', '#' or NUL", self.topic_prefix),
            );
        }
        if self.persist && self.state.as_os_str().is_empty() {
            return v(
                "mqtt.state",
                "a folder is needed (or persist = false)".into(),
            );
        }
        let device = |name: &str| devices.iter().find(|d| d.name == name);
        for (i, p) in self.publish.iter().enumerate() {
            let why = |w: String| format!("entry {} (device `{}`): {w}", i + 1, p.device);
            if device(&p.device).is_none() {
                return v("mqtt.publish", why("no such device in [devices]".into()));
            }
            if let Err(e) =
                expand(&p.topic, dev_gw).and_then(|t| mintgate_mqtt::conn::check_topic(&t))
            {
                return v("mqtt.publish", why(e));
            }
            if let Some(Err(e)) = p.format.as_deref().map(str::parse::<Format>) {
                return v("mqtt.publish", why(format!("format: {e}")));
            }
            if let Some(d) = &p.min_interval {
                if let Err(e) = parse_duration(d) {
                    return v("mqtt.publish", why(format!("min_interval: {e}")));
                }
            }
        }
        for (i, c) in self.command.iter().enumerate() {
            let why = |w: String| format!("entry {} (topic {:?}): {w}", i + 1, c.topic);
            if let Err(e) = expand(&c.topic, gw).and_then(|t| mintgate_mqtt::conn::check_topic(&t))
            {
                return v("mqtt.command", why(e));
            }
            match device(&c.device) {
                None => {
                    return v(
                        "mqtt.command",
                        why(format!("no device `{}` in [devices]", c.device)),
                    )
                }
                Some(d) if !d.is_actuator() => {
                    return v(
                        "mqtt.command",
                        why(format!("`{}` is a sensor, not an actuator", c.device)),
                    )
                }
                Some(_) => {}
            }
            if self.command[..i].iter().any(|o| o.topic == c.topic) {
                return v("mqtt.command", why("the topic is given twice".into()));
            }
            // a topic the bridges publish to would feed the actuator its
            // own echo (the start checks the same, for devices added in code)
            let echoed = self
                .publish_devices
                .then(|| {
                    devices.iter().find(|d| {
                        let dir = if d.is_actuator() {
                            "actuators"
                        } else {
                            "sensors"
                        };
                        c.topic == format!("{}{dir}/{}", self.topic_prefix, d.name)
                    })
                })
                .flatten()
                .map(|d| d.name.as_str())
                .or_else(|| {
                    self.publish
                        .iter()
                        .find(|p| p.topic == c.topic)
                        .map(|p| p.device.as_str())
                });
            if let Some(d) = echoed {
                return v(
                    "mqtt.command",
                    why(format!("the topic is also where device `{d}` is published")),
                );
            }
            if self.observe.iter().any(|o| o.topic == c.topic) {
                return v(
                    "mqtt.command",
                    why("the topic is also an [[mqtt.observe]] topic".into()),
                );
            }
        }
        for (i, o) in self.observe.iter().enumerate() {
            let why = |w: String| format!("entry {} (uri {:?}): {w}", i + 1, o.uri);
            if let Err(e) = mintgate_coap::uri::parse(&o.uri) {
                return v("mqtt.observe", why(e.to_string()));
            }
            if let Err(e) = expand(&o.topic, gw).and_then(|t| mintgate_mqtt::conn::check_topic(&t))
            {
                return v("mqtt.observe", why(e));
            }
            if let Some(Err(e)) = o.format.as_deref().map(str::parse::<Format>) {
                return v("mqtt.observe", why(format!("format: {e}")));
            }
            if let Some(a) = &o.accept {
                if mintgate_coap::wire::ContentFormat::parse(a).is_none() {
                    return v(
                        "mqtt.observe",
                        why(format!("accept: unknown Content-Format {a:?}")),
                    );
                }
            }
        }
        Ok(())
    }
}

/// An MQTT 5 interval key (`mqtt.message_expiry`,
/// `mqtt.command_session_expiry`): empty for none, else 1 s up to
/// 2^32-1 s, the widest the protocol carries.
fn mqtt5_interval(s: &str) -> Result<Option<std::time::Duration>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let d = parse_duration_upto(s, u64::from(u32::MAX))?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("{s:?} is outside 1s..=2^32-1 s"));
    }
    Ok(Some(d))
}
