//! The TOML configuration. Every key has a default, so no file is needed;
//! `docs/config.md` documents each key and `mintgate serve --print-config`
//! prints the effective values.

use std::net::SocketAddr;
use std::path::Path;

use mintgate_buf::PartitionConfig;
use serde::{Deserialize, Serialize};

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {cause}")]
    Read {
        /// The file.
        path: String,
        /// The cause (in the message, not a separate source, so that a
        /// chain of errors does not say it twice).
        cause: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys or wrong types.
    #[error("invalid config file {path}: {cause}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, with line and column.
        cause: toml::de::Error,
    },
    /// A value is out of range.
    #[error("invalid config value {key}: {why}")]
    Value {
        /// The key, dotted.
        key: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// The whole configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[coap]`: the CoAP endpoint.
    pub coap: CoapConfig,
    /// `[pipeline]`: the Interaction pipeline.
    pub pipeline: PipelineConfig,
    /// `[buffers]`: the block pool.
    pub buffers: BufferConfig,
    /// `[vta]`: the self-sizing handler pool's controller.
    pub vta: VtaSection,
    /// `[resources]`: the built-in resources.
    pub resources: ResourcesConfig,
    /// `[metrics]`: the metrics endpoint.
    pub metrics: MetricsConfig,
    /// `[dashboard]`: the live dashboard on the HTTP and metrics listeners.
    pub dashboard: DashboardConfig,
    /// `[devices]`: sensors and actuators (`[[devices.list]]`); by default
    /// a simulated temperature sensor `temp0` and a simulated actuator `led0`.
    pub devices: mintgate_devices::DevicesConfig,
    /// `[directpath]`: the direct path's ring, worker and links.
    pub directpath: mintgate_devices::directpath::DirectPathConfig,
    /// `[proxy]`: the HTTP/1.1, HTTP/2 and HTTP/3 proxy to CoAP (off unless
    /// `http` or `h3` is set); read by the CLI into `mintgate_proxy`.
    pub proxy: ProxySection,
    /// `[mqtt]`: the MQTT bridges (off unless `enabled`); see
    /// [`crate::bridge`].
    pub mqtt: MqttSection,
    /// `[nats]`: the JetStream output of the bridges (used when `enabled`,
    /// instead of an MQTT broker); see `mintgate_nats`.
    pub nats: mintgate_nats::NatsSection,
    /// `[coaps]`: CoAP over DTLS listeners (off while `bind` is empty); see
    /// [`crate::dtls`].
    pub coaps: crate::dtls::CoapsSection,
    /// `[access]`: who may write (PUT, POST, DELETE) to resources and
    /// links; see [`crate::access`].
    pub access: crate::access::AccessSection,
    /// `[oscore]`: OSCORE security contexts (off while `contexts` is
    /// empty); see [`crate::oscore`].
    pub oscore: crate::oscore::OscoreSection,
}

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

/// `[proxy]`: the HTTP -> CoAP proxy (RFC 8075). Plain data: the CLI checks
/// it and turns it into `mintgate_proxy::ProxyConfig` (whose defaults these
/// mirror; a CLI test keeps the two in step).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySection {
    /// TCP address for HTTP/1.1 and HTTP/2 (cleartext); off when absent.
    pub http: Option<SocketAddr>,
    /// UDP address for HTTP/3 over QUIC; off when absent.
    pub h3: Option<SocketAddr>,
    /// Runtime worker threads of the proxy.
    pub threads: usize,
    /// Upstream CoAP servers allowed, `host:port`; empty = the gateway's
    /// own CoAP endpoint only. Anything else gets 403.
    pub allow: Vec<String>,
    /// Reverse mappings: `{ prefix = "/sensors", target = "coap://127.0.0.1:5683/sensors" }`.
    pub reverse: Vec<ProxyReverse>,
    /// Bearer tokens accepted (`Authorization: Bearer ...`); empty = none needed.
    pub bearer_tokens: Vec<String>,
    /// Requests per second per client IP address (0 = unlimited).
    pub rate_per_client: f64,
    /// Burst above that rate.
    pub rate_burst: u32,
    /// Largest request body, bytes (413 above).
    pub max_body: usize,
    /// Longest request target, bytes (414 above).
    pub max_uri: usize,
    /// Time a proxied request may take in all, ms (504 after).
    pub request_timeout_ms: u64,
    /// Upstream requests in flight or queued over all upstreams (503 above).
    pub max_inflight: usize,
    /// Upstream requests in flight or queued per upstream (503 above).
    pub max_queue_per_upstream: usize,
    /// Exchanges in flight per upstream (NSTART).
    pub nstart: usize,
    /// Congestion control of the upstream CoAP client: basic, cocoa or adaptive.
    pub congestion: String,
    /// Responses cached at most (0 = no cache).
    pub cache_entries: usize,
    /// Largest payload cached, bytes.
    pub cache_max_payload: usize,
    /// Add `Server-Timing: coap;dur=MS` to proxied responses.
    pub server_timing: bool,
    /// Connections served at once, per listener.
    pub max_connections: usize,
    /// Connections served at once per source (IPv4 address, IPv6 /64), per
    /// listener.
    pub max_connections_per_source: usize,
    /// Time a new connection has to deliver its first request head (after
    /// the HTTP/2 preface), and any request head or body once begun, ms.
    pub header_timeout_ms: u64,
    /// A connection with no request in flight is closed after this, ms
    /// (HTTP/1.1 keep-alive, HTTP/2, QUIC idle timeout).
    pub idle_timeout_ms: u64,
    /// Local address of the upstream CoAP socket (absent: `[::]:0`, any
    /// port). A fixed one lets a gateway in another process list it in
    /// `access.proxy_sources`.
    pub upstream_bind: Option<SocketAddr>,
    /// Host names (besides IP literals and `localhost`) that requests to
    /// the dashboard, on this and the metrics listener, and writes through
    /// the proxy may carry in `Host`; others get 403 (DNS rebinding). `"*"`:
    /// any.
    pub allowed_hosts: Vec<String>,
    /// HTTP/3 certificate chain (PEM); with `tls_key`. Absent: self-signed.
    pub tls_cert: Option<std::path::PathBuf>,
    /// HTTP/3 private key (PEM).
    pub tls_key: Option<std::path::PathBuf>,
    /// Where a generated self-signed certificate is kept.
    pub tls_dir: std::path::PathBuf,
    /// CA certificates (PEM) that HTTP/3 client certificates must chain to
    /// (mutual TLS); absent = no client certificates.
    pub client_ca: Option<std::path::PathBuf>,
    /// TLS session tickets remembered (each accepted once).
    pub session_cache: usize,
    /// Accept 0-RTT early data (safe methods only; others 425).
    pub early_data: bool,
}

/// One `[[proxy.reverse]]` mapping.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyReverse {
    /// Path prefix, e.g. `/sensors`.
    pub prefix: String,
    /// CoAP base URI, e.g. `coap://127.0.0.1:5683/sensors`.
    pub target: String,
}

impl Default for ProxySection {
    fn default() -> Self {
        ProxySection {
            http: None,
            h3: None,
            threads: 1,
            allow: Vec::new(),
            reverse: Vec::new(),
            bearer_tokens: Vec::new(),
            rate_per_client: 0.0,
            rate_burst: 100,
            max_body: 64 * 1024,
            max_uri: 2048,
            request_timeout_ms: 60_000,
            max_inflight: 1024,
            max_queue_per_upstream: 256,
            nstart: 1,
            congestion: "basic".into(),
            cache_entries: 1024,
            cache_max_payload: 16 * 1024,
            server_timing: true,
            max_connections: 1024,
            max_connections_per_source: 64,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            upstream_bind: None,
            allowed_hosts: Vec::new(),
            tls_cert: None,
            tls_key: None,
            tls_dir: "mintgate-tls".into(),
            client_ca: None,
            session_cache: 4096,
            early_data: true,
        }
    }
}

/// `[metrics]`
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// TCP address of the metrics endpoint (Prometheus text at `/metrics`,
    /// Observer samples as JSON at `/api/observer`); off when absent. Keep it
    /// on loopback unless something else guards it.
    pub bind: Option<SocketAddr>,
}

/// `[dashboard]`: the live dashboard (`/`) and its JSON state
/// (`/api/state`), served on the HTTP proxy's listener (`proxy.http`) and
/// on the metrics endpoint (`metrics.bind`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// Serve the dashboard at all.
    pub enabled: bool,
    /// Answer clients that are not on loopback too (otherwise 403): the
    /// dashboard shows the gateway's internals, and the proxy's listener
    /// may face the network.
    pub allow_remote: bool,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            enabled: true,
            allow_remote: false,
        }
    }
}

/// `[vta]`: tuning of the Variable Thread Adjustment controller (used when
/// `pipeline.pool = "vta"`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VtaSection {
    /// Samples averaged for HT_t and e_t (the paper's n).
    pub n: usize,
    /// W, the minimum retransmission wait in seconds (CoAP ACK_TIMEOUT).
    pub w_s: f64,
    /// Most handler threads the controller may use.
    pub max_threads: usize,
    /// Relative throughput gain that justifies one more thread.
    pub improve: f64,
    /// Saturated seconds at a new cap before it is judged; also the length
    /// of a trial below saturation.
    pub hold_s: u32,
    /// Saturated seconds at a settled cap before one more thread is tried;
    /// also the wait between trials below saturation.
    pub reprobe_after_s: u32,
    /// Relative change of the per-thread rate that restarts the climb.
    pub workload_change: f64,
    /// Queueing delay, second after second, that marks the pool as the
    /// bottleneck even when arrivals do not exceed it (closed-loop clients).
    pub queue_delay_ms: f64,
    /// Highest share of the handler threads' time the arrivals may take
    /// before the pool grows (it shrinks below half of it); 1.0 sizes the
    /// pool exactly as the paper's equation 6.
    pub util_high: f64,
    /// Busy share from which a pool below the core count tries one thread
    /// more and keeps it only if throughput rises; 1.0 or more: never.
    pub trial_util: f64,
}

impl Default for VtaSection {
    fn default() -> Self {
        let d = mintgate_sched::VtaConfig::default();
        VtaSection {
            n: d.n,
            w_s: d.w,
            max_threads: d.max_threads,
            improve: d.improve,
            hold_s: d.hold,
            reprobe_after_s: d.reprobe_after,
            workload_change: d.workload_change,
            queue_delay_ms: d.queue_delay * 1e3,
            util_high: d.util_high,
            trial_util: d.trial_util,
        }
    }
}

/// `[resources]`
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourcesConfig {
    /// What answering `GET /request` costs, for experiments: `"none"`,
    /// `"block:200us"` (waits, like a sensor read) or `"spin:20us"` (burns CPU).
    pub request_cost: HandlerCost,
}

/// A simulated cost of a handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HandlerCost {
    /// Answer at once.
    #[default]
    None,
    /// Sleep this long (a blocking sensor read).
    Block(std::time::Duration),
    /// Burn CPU this long.
    Spin(std::time::Duration),
}

impl std::str::FromStr for HandlerCost {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(HandlerCost::None);
        }
        let (kind, d) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: expected none, block:DURATION or spin:DURATION"))?;
        let d = parse_duration(d)?;
        match kind {
            "block" => Ok(HandlerCost::Block(d)),
            "spin" => Ok(HandlerCost::Spin(d)),
            _ => Err(format!("`{kind}`: expected block or spin")),
        }
    }
}

impl std::fmt::Display for HandlerCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerCost::None => write!(f, "none"),
            HandlerCost::Block(d) => write!(f, "block:{}us", d.as_micros()),
            HandlerCost::Spin(d) => write!(f, "spin:{}us", d.as_micros()),
        }
    }
}

impl Serialize for HandlerCost {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for HandlerCost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How the handler pool is sized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolMode {
    /// By the VTA controller, every second.
    #[default]
    Vta,
    /// A fixed number of threads (0 = the number of cores).
    Fixed(usize),
}

impl std::str::FromStr for PoolMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vta" => Ok(PoolMode::Vta),
            "fixed" => Ok(PoolMode::Fixed(0)),
            _ => match s.strip_prefix("fixed:") {
                Some(n) => n
                    .parse()
                    .map(PoolMode::Fixed)
                    .map_err(|_| format!("`{n}`: not a thread count")),
                None => Err(format!("`{s}`: expected vta, fixed or fixed:N")),
            },
        }
    }
}

impl std::fmt::Display for PoolMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolMode::Vta => write!(f, "vta"),
            PoolMode::Fixed(n) => write!(f, "fixed:{n}"),
        }
    }
}

impl Serialize for PoolMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for PoolMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses a duration in the program's one grammar
/// ([`mintgate_devices::parse::duration`]): a number with `ns`, `us`,
/// `ms`, `s`, `m`, `h` or `d`, or no unit for seconds; 0 up to one day.
/// Callers add tighter bounds where they need them.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    mintgate_devices::parse::duration(s)
}

/// [`parse_duration`]'s grammar with another upper bound, in seconds, for
/// the few settings that are counted in days (an MQTT session's expiry).
pub fn parse_duration_upto(s: &str, max_secs: u64) -> Result<std::time::Duration, String> {
    mintgate_devices::parse::duration_upto(s, max_secs)
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

/// `[coap]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoapConfig {
    /// UDP addresses to serve CoAP on. `[::]` also accepts IPv4.
    pub bind: Vec<SocketAddr>,
    /// Largest datagram accepted; larger ones are dropped and counted.
    pub max_datagram: usize,
    /// A CON request whose handler runs longer than this many milliseconds
    /// gets an empty ACK and, later, a separate CON response.
    pub separate_response_after_ms: u64,
    /// (peer, message ID) pairs remembered for de-duplication, at most.
    pub dedup_capacity: usize,
    /// EXCHANGE_LIFETIME in seconds (how long a CON is remembered).
    pub exchange_lifetime_s: u64,
    /// NON_LIFETIME in seconds (how long a NON is remembered).
    pub non_lifetime_s: u64,
    /// Max-Age, in seconds, of the 5.03 sent when the HTP queue is full.
    pub overload_max_age_s: u32,
    /// Largest response payload a handler may produce.
    pub max_payload: usize,
    /// Socket receive buffer in bytes (capped by net.core.rmem_max).
    pub socket_recv_buffer: usize,
    /// Socket send buffer in bytes (capped by net.core.wmem_max).
    pub socket_send_buffer: usize,
    /// Most Observe registrations in all (RFC 7641); beyond, a GET with
    /// Observe is answered as a plain GET.
    pub observe_max: usize,
    /// A confirmable notification after this many non-confirmable ones
    /// (1: every notification is CON). An unacknowledged CON notification
    /// ends the observation.
    pub observe_con_every: u32,
    /// A confirmable notification at least every this many seconds per
    /// observer.
    pub observe_con_interval_s: u64,
    /// Most Observe registrations per source (an IPv4 address or an IPv6
    /// /64); beyond, a GET with Observe is answered as a plain GET.
    pub observe_max_per_source: usize,
    /// To a source not yet verified (RFC 9175 2.4), nothing larger than
    /// this many times its request; 0 turns the check off.
    pub amplification_factor: u32,
    /// How long, in seconds, an address verified by an Echo round trip is
    /// trusted.
    pub verified_lifetime_s: u64,
    /// Addresses remembered as verified, at most.
    pub verified_max: usize,
    /// ACK_TIMEOUT of the CONs the gateway sends (separate responses,
    /// notifications), in milliseconds (RFC 7252 4.8: 2000).
    pub ack_timeout_ms: u64,
    /// MAX_RETRANSMIT of those CONs (RFC 7252 4.8: 4).
    pub max_retransmit: u32,
    /// Largest request body a PUT or POST may send in blocks (Block1,
    /// RFC 7959); beyond it, 4.13 with Size1.
    pub block1_max_body: usize,
    /// Bytes all Block1 transfers in progress (and completed bodies kept for
    /// Block2 continuations) may hold together; beyond it, 5.03.
    pub block1_max_bytes: usize,
    /// Block1 transfers in progress at once, all clients together.
    pub block1_max_transfers: usize,
    /// Block1 transfers in progress at once per source (an IPv4 address or
    /// an IPv6 /64, whatever the ports); a further one drops that source's
    /// oldest.
    pub block1_per_peer: usize,
    /// Bytes one source's Block1 transfers may hold together; beyond it the
    /// source's own other transfers are dropped.
    pub block1_per_source_bytes: usize,
    /// A Block1 transfer with no block for this many seconds is dropped
    /// (its next block gets 4.08).
    pub block1_timeout_s: u64,
    /// TCP addresses to serve CoAP over TCP on (RFC 8323, `coap+tcp`);
    /// empty (the default) serves none. The usual port is 5683/tcp.
    pub tcp_bind: Vec<SocketAddr>,
    /// TCP addresses to serve CoAP over WebSockets on (RFC 8323 section 4,
    /// `coap+ws`, path `/.well-known/coap`, subprotocol `coap`); empty (the
    /// default) serves none. The `tcp_*` limits below apply to it too.
    pub ws_bind: Vec<SocketAddr>,
    /// CoAP-over-TCP connections open at once, all clients together;
    /// beyond, a new connection is closed at once.
    pub tcp_max_connections: usize,
    /// CoAP-over-TCP connections open at once per source (an IPv4 address
    /// or an IPv6 /64).
    pub tcp_max_per_source: usize,
    /// The Max-Message-Size our CSM announces: a larger frame aborts the
    /// connection before it is read.
    pub tcp_max_message_size: u32,
    /// A frame begun and not finished within this many milliseconds aborts
    /// the connection; a peer that takes no output for as long is
    /// disconnected.
    pub tcp_frame_timeout_ms: u64,
    /// A connection with nothing received for this many seconds gets a
    /// Release and is closed.
    pub tcp_idle_timeout_s: u64,
}

impl Default for CoapConfig {
    fn default() -> Self {
        CoapConfig {
            bind: vec![std::net::SocketAddr::from((
                std::net::Ipv6Addr::UNSPECIFIED,
                5683,
            ))],
            max_datagram: 1280,
            separate_response_after_ms: 1000,
            dedup_capacity: 16384,
            exchange_lifetime_s: 247,
            non_lifetime_s: 145,
            overload_max_age_s: 2,
            max_payload: 1024,
            socket_recv_buffer: 4 << 20,
            socket_send_buffer: 4 << 20,
            observe_max: 1024,
            observe_con_every: 5,
            observe_con_interval_s: 60,
            observe_max_per_source: 64,
            amplification_factor: 3,
            verified_lifetime_s: 600,
            verified_max: 4096,
            ack_timeout_ms: 2000,
            max_retransmit: 4,
            block1_max_body: 64_000,
            block1_max_bytes: 1 << 20,
            block1_max_transfers: 256,
            block1_per_peer: 4,
            block1_per_source_bytes: 256 << 10,
            block1_timeout_s: 60,
            tcp_bind: Vec::new(),
            ws_bind: Vec::new(),
            tcp_max_connections: 256,
            tcp_max_per_source: 16,
            tcp_max_message_size: 8192,
            tcp_frame_timeout_ms: 5000,
            tcp_idle_timeout_s: 300,
        }
    }
}

/// `[pipeline]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// HTP queue bound in bytes (datagram blocks held); 0 = 1 % of RAM,
    /// clamped to 256 KiB..8 MiB.
    pub queue_bytes: usize,
    /// Share of the HTP queue one source may hold (an IPv4 address or an
    /// IPv6 /64), 0 < share <= 1; beyond it its requests are shed like on a
    /// full queue and counted as `peer_limit`. 1 = no per-source limit.
    pub peer_queue_share: f64,
    /// How the Handler Thread Pool is sized: `"vta"` (the controller resizes
    /// it every second from the Observer's samples), `"fixed:N"` or
    /// `"fixed"` (= `threads`).
    pub pool: PoolMode,
    /// HTP threads at start (and for `pool = "fixed"`); 0 = the number of cores.
    pub threads: usize,
    /// Datagrams per recvmmsg call.
    pub receive_batch: usize,
    /// Datagrams per sendmmsg call.
    pub send_batch: usize,
    /// Send the datagrams of one flush that go to the same peer with the
    /// same length as one `UDP_SEGMENT` message (generic segmentation
    /// offload, Linux 4.18+): the same datagrams on the wire, one walk
    /// through the kernel's stack. Turned off by itself where the kernel
    /// refuses it.
    pub send_gso: bool,
    /// Requests a handler thread takes from the queue at once.
    pub handler_batch: usize,
    /// Samples the Performance Observer keeps (one per second, at least 10).
    pub observer_samples: usize,
    /// Microseconds an idle handler thread polls the queue before sleeping.
    pub spin_us: u64,
    /// An idle handler thread first reads what waits in the socket (the
    /// Network Receiver stage, run without blocking) before it sleeps.
    pub handler_receives: bool,
    /// Datagrams per second (over 100 ms) from which the Network Receiver
    /// and handler threads run as `SCHED_BATCH` (no wake-up preemption, so
    /// senders finish their batches and the receiver reads them whole);
    /// back to the normal policy below three quarters of it. 0 = never.
    pub batch_sched_above: u64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            queue_bytes: 0,
            peer_queue_share: 0.5,
            pool: PoolMode::Vta,
            threads: 0,
            receive_batch: 32,
            send_batch: 32,
            send_gso: true,
            handler_batch: 32,
            observer_samples: 120,
            spin_us: 0,
            handler_receives: true,
            batch_sched_above: 50_000,
        }
    }
}

/// `[buffers]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BufferConfig {
    /// Partitions of the pool: `{ block_size = BYTES, blocks = COUNT }`.
    /// Received datagrams take blocks of at least `coap.max_datagram` bytes;
    /// responses take the smallest block that fits.
    pub partitions: Vec<Partition>,
}

/// One pool partition.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    /// Bytes per block.
    pub block_size: usize,
    /// Number of blocks.
    pub blocks: u32,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            partitions: vec![
                Partition {
                    block_size: 192,
                    blocks: 32768,
                },
                Partition {
                    block_size: 1280,
                    blocks: 8192,
                },
            ],
        }
    }
}

impl Config {
    /// Reads and checks a TOML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let cfg = Config::read(path)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a TOML file (unknown keys and wrong types are errors) without
    /// checking values: for a caller that completes it first (command-line
    /// flags, a key from the environment) and then calls
    /// [`Config::validate`].
    pub fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.display().to_string(),
            cause,
        })?;
        toml::from_str(&text).map_err(|cause| ConfigError::Parse {
            path: path.display().to_string(),
            cause,
        })
    }

    /// Parses TOML text (for tests and embedded configs).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|cause| ConfigError::Parse {
            path: "<text>".into(),
            cause,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The effective configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// The same TOML with every secret (pre-shared keys, access and bearer
    /// tokens) replaced by `"<redacted>"`, for showing the effective
    /// configuration (`--print-config`) without leaking credentials into a
    /// terminal or a log. Not meant to be read back.
    pub fn to_toml_redacted(&self) -> String {
        const R: &str = "<redacted>";
        let mut c = self.clone();
        if c.coaps.psk_key.is_some() {
            c.coaps.psk_key = Some(R.into());
        }
        for v in c.coaps.psk_keys.values_mut() {
            *v = R.into();
        }
        for t in c
            .access
            .tokens
            .iter_mut()
            .chain(c.proxy.bearer_tokens.iter_mut())
        {
            *t = R.into();
        }
        c.to_toml()
    }

    /// Checks ranges and cross-key rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let v = |key, why: String| Err(ConfigError::Value { key, why });
        if self.coap.bind.is_empty() {
            return v("coap.bind", "at least one address is needed".into());
        }
        self.coaps.settings()?;
        if !(64..=65507).contains(&self.coap.max_datagram) {
            return v(
                "coap.max_datagram",
                format!("{} is outside 64..=65507", self.coap.max_datagram),
            );
        }
        let tcp = &self.coap;
        if tcp.tcp_max_connections == 0 || tcp.tcp_max_per_source == 0 {
            return v(
                "coap.tcp_max_connections",
                "tcp_max_connections and tcp_max_per_source must be at least 1".into(),
            );
        }
        if !(1152..=65000).contains(&tcp.tcp_max_message_size) {
            return v(
                "coap.tcp_max_message_size",
                format!(
                    "{} is outside 1152..=65000 (RFC 8323: at least the default 1152)",
                    tcp.tcp_max_message_size
                ),
            );
        }
        if !(100..=600_000).contains(&tcp.tcp_frame_timeout_ms) {
            return v(
                "coap.tcp_frame_timeout_ms",
                format!("{} is outside 100..=600000", tcp.tcp_frame_timeout_ms),
            );
        }
        if tcp.tcp_idle_timeout_s == 0 {
            return v("coap.tcp_idle_timeout_s", "must be at least 1".into());
        }
        if self.buffers.partitions.is_empty() {
            return v(
                "buffers.partitions",
                "at least one partition is needed".into(),
            );
        }
        if let Some(p) = self
            .buffers
            .partitions
            .iter()
            .find(|p| p.block_size == 0 || p.blocks == 0)
        {
            return v(
                "buffers.partitions",
                format!("block_size and blocks must be positive (got {p:?})"),
            );
        }
        // the count, and sizes the pool can address
        if let Err(e) = mintgate_buf::Pool::check(&self.partitions()) {
            return v("buffers.partitions", e.to_string());
        }
        let largest = self
            .buffers
            .partitions
            .iter()
            .map(|p| p.block_size)
            .max()
            .unwrap_or(0);
        if largest < self.coap.max_datagram {
            return v(
                "buffers.partitions",
                format!(
                    "the largest block ({largest}) is smaller than coap.max_datagram ({})",
                    self.coap.max_datagram
                ),
            );
        }
        if largest < self.coap.max_payload + mintgate_coap::server::RESPONSE_HEADROOM {
            return v(
                "coap.max_payload",
                format!(
                    "{} plus the {}-byte headroom exceeds the largest block ({largest})",
                    self.coap.max_payload,
                    mintgate_coap::server::RESPONSE_HEADROOM
                ),
            );
        }
        for (key, val) in [
            ("pipeline.receive_batch", self.pipeline.receive_batch),
            ("pipeline.send_batch", self.pipeline.send_batch),
            ("pipeline.handler_batch", self.pipeline.handler_batch),
            ("coap.dedup_capacity", self.coap.dedup_capacity),
        ] {
            if !(1..=1 << 20).contains(&val) {
                return v(key, format!("{val} is outside 1..=1048576"));
            }
        }
        // a reassembled request is one message: body plus the final block's head
        if self.coap.block1_max_body + self.coap.max_datagram > u16::MAX as usize {
            return v(
                "coap.block1_max_body",
                format!(
                    "{} plus coap.max_datagram ({}) exceeds 65535",
                    self.coap.block1_max_body, self.coap.max_datagram
                ),
            );
        }
        if self.coap.block1_per_source_bytes < self.coap.block1_max_body {
            return v(
                "coap.block1_per_source_bytes",
                format!(
                    "{} is below coap.block1_max_body ({}): a source could not send the largest body",
                    self.coap.block1_per_source_bytes, self.coap.block1_max_body
                ),
            );
        }
        if self.coap.block1_timeout_s == 0 || self.coap.block1_per_peer == 0 {
            return v(
                "coap.block1_timeout_s",
                "block1_timeout_s and block1_per_peer must be positive".into(),
            );
        }
        if self.coap.observe_max_per_source == 0 {
            return v(
                "coap.observe_max_per_source",
                "must be positive (it bounds one source's share of observe_max)".into(),
            );
        }
        if self.coap.amplification_factor > 100 {
            return v(
                "coap.amplification_factor",
                format!(
                    "{} is above 100; 3 is the usual bound, 0 turns the check off",
                    self.coap.amplification_factor
                ),
            );
        }
        if !(100..=60_000).contains(&self.coap.ack_timeout_ms) || self.coap.max_retransmit > 20 {
            return v(
                "coap.ack_timeout_ms",
                format!(
                    "ack_timeout_ms {} must be 100..=60000 and max_retransmit {} at most 20",
                    self.coap.ack_timeout_ms, self.coap.max_retransmit
                ),
            );
        }
        if self.coap.verified_lifetime_s == 0 || self.coap.verified_max == 0 {
            return v(
                "coap.verified_lifetime_s",
                "verified_lifetime_s and verified_max must be positive".into(),
            );
        }
        let share = self.pipeline.peer_queue_share;
        if !(share > 0.0 && share <= 1.0) {
            return v(
                "pipeline.peer_queue_share",
                format!("{share} is outside (0, 1]"),
            );
        }
        if self.vta.n == 0
            || self.vta.max_threads == 0
            || self.vta.w_s.is_nan()
            || self.vta.w_s <= 0.0
        {
            return v("vta", "n, max_threads and w_s must be positive".into());
        }
        let most = crate::pipeline::MAX_HTP_THREADS;
        if self.vta.max_threads > most {
            return v(
                "vta.max_threads",
                format!("{} is over {most}", self.vta.max_threads),
            );
        }
        if self.pipeline.threads > most {
            return v(
                "pipeline.threads",
                format!("{} is over {most}", self.pipeline.threads),
            );
        }
        if self.pipeline.observer_samples < 10 {
            return v(
                "pipeline.observer_samples",
                format!("{} is under 10", self.pipeline.observer_samples),
            );
        }
        let t = self.vta.trial_util;
        if t.is_nan() || t < 0.0 {
            return v("vta.trial_util", format!("{t} is not a share >= 0"));
        }
        self.mqtt.validate(&self.devices.devices())?;
        if self.nats.enabled {
            // files and variables are read at the start, as for [mqtt]
            self.nats
                .target()
                .map_err(|why| ConfigError::Value { key: "nats", why })?;
        }
        self.access.validate()?;
        self.oscore.validate()?;
        // devices and links, as the start would check them, short of
        // opening a device (a missing file or GPIO chip shows at start);
        // whether an mqtt output has its bridges running can depend on a
        // flag given after the file was read: see `validate_to_start`
        mintgate_devices::manager::check_config(&self.devices, &self.directpath)
            .map_err(|e| self.device_error(e))?;
        Ok(())
    }

    /// [`Config::validate`] for a configuration that is all a start will
    /// have (`mintgate serve`, flags applied): also that every link's
    /// devices exist and its outputs will (an `mqtt(TOPIC)` output needs
    /// `mqtt.enabled` and a topic a publish may use). A program that adds
    /// devices or output kinds of its own checks with `validate` alone.
    pub fn validate_to_start(&self) -> Result<(), ConfigError> {
        self.validate()?;
        if self.access.write == crate::access::WriteMode::Dtls
            && !self.coaps.enabled()
            && self.coaps.tcp_bind.is_empty()
            && self.coaps.ws_bind.is_empty()
        {
            return Err(ConfigError::Value {
                key: "access.write",
                why: "\"dtls\" needs a coaps listener (coaps.bind, or coaps.tcp_bind with \
                      client certificates): without one no write could ever be allowed"
                    .into(),
            });
        }
        if self.access.write == crate::access::WriteMode::Oscore && !self.oscore.enabled() {
            return Err(ConfigError::Value {
                key: "access.write",
                why: "\"oscore\" needs at least one [[oscore.contexts]]: without one no write \
                      could ever be allowed"
                    .into(),
            });
        }
        let kinds: &[&str] = if self.mqtt.enabled { &["mqtt"] } else { &[] };
        let custom = mintgate_devices::manager::check_links(&self.devices, &self.directpath, kinds)
            .map_err(|e| self.device_error(e))?;
        for (_, topic) in custom.iter().filter(|(k, _)| k == "mqtt") {
            mintgate_mqtt::conn::check_topic(topic.trim()).map_err(|e| ConfigError::Value {
                key: "directpath.links",
                why: format!("mqtt({topic}): {e}"),
            })?;
            if self.mqtt.command.iter().any(|c| c.topic == topic.trim()) {
                return Err(ConfigError::Value {
                    key: "directpath.links",
                    why: format!(
                        "mqtt({topic}): also an [[mqtt.command]] topic (the actuator would be \
                         fed this output)"
                    ),
                });
            }
        }
        Ok(())
    }

    /// A device check's error under the key it is about.
    fn device_error(&self, e: mintgate_devices::DeviceError) -> ConfigError {
        match e {
            mintgate_devices::DeviceError::Config { name, why }
                if name == "directpath.priority" =>
            {
                ConfigError::Value {
                    key: "directpath.priority",
                    why,
                }
            }
            mintgate_devices::DeviceError::Config { name, why } if name == "directpath.links" => {
                let hint = if !self.mqtt.enabled && why.contains("output `mqtt`") {
                    " (the mqtt output needs the MQTT bridges: mqtt.enabled = true or --mqtt)"
                } else {
                    ""
                };
                ConfigError::Value {
                    key: "directpath.links",
                    why: format!("{why}{hint}"),
                }
            }
            e => ConfigError::Value {
                key: "devices.list",
                why: e.to_string(),
            },
        }
    }

    /// The Observe registry's settings.
    pub fn observe_config(&self) -> mintgate_coap::server::observe::ObserveConfig {
        mintgate_coap::server::observe::ObserveConfig {
            max_observers: self.coap.observe_max,
            con_every: self.coap.observe_con_every.max(1),
            con_interval: std::time::Duration::from_secs(self.coap.observe_con_interval_s.max(1)),
            max_per_source: self.coap.observe_max_per_source.max(1),
        }
    }

    /// The CoAP server endpoint's settings.
    pub fn endpoint_config(&self) -> mintgate_coap::server::EndpointConfig {
        use std::time::Duration;
        let transmission = mintgate_coap::rto::TransmissionParams {
            ack_timeout: Duration::from_millis(self.coap.ack_timeout_ms.max(1)),
            max_retransmit: self.coap.max_retransmit,
            ..Default::default()
        };
        mintgate_coap::server::EndpointConfig {
            dedup_capacity: self.coap.dedup_capacity,
            exchange_lifetime: Duration::from_secs(self.coap.exchange_lifetime_s),
            non_lifetime: Duration::from_secs(self.coap.non_lifetime_s),
            transmission,
            separate_after: Duration::from_millis(self.coap.separate_response_after_ms),
            observe: self.observe_config(),
            block1: self.block1_config(),
            amplification_factor: self.coap.amplification_factor,
            verified_lifetime: Duration::from_secs(self.coap.verified_lifetime_s),
            verified_capacity: self.coap.verified_max.max(1),
            max_pending: 4096,
            max_payload: self.coap.max_payload,
            handler_slots: crate::pipeline::MAX_HTP_THREADS,
            seed: rand_seed(),
            echo_secret: None,
        }
    }

    /// The limits of Block1 reassembly. The block size asked for in 2.31 is
    /// the largest that fits a datagram with room for the head.
    pub fn block1_config(&self) -> mintgate_coap::server::Block1Config {
        mintgate_coap::server::Block1Config {
            max_body: self.coap.block1_max_body,
            max_bytes: self.coap.block1_max_bytes,
            max_transfers: self.coap.block1_max_transfers,
            per_peer: self.coap.block1_per_peer,
            per_source_bytes: self.coap.block1_per_source_bytes,
            timeout: std::time::Duration::from_secs(self.coap.block1_timeout_s),
            block_size: self.coap.max_datagram.saturating_sub(128).clamp(16, 1024),
        }
    }

    /// The VTA controller's configuration.
    pub fn vta_config(&self) -> mintgate_sched::VtaConfig {
        mintgate_sched::VtaConfig {
            n: self.vta.n,
            w: self.vta.w_s,
            max_threads: self.vta.max_threads.min(crate::pipeline::MAX_HTP_THREADS),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            improve: self.vta.improve,
            hold: self.vta.hold_s,
            reprobe_after: self.vta.reprobe_after_s,
            workload_change: self.vta.workload_change,
            queue_delay: self.vta.queue_delay_ms / 1e3,
            util_high: self.vta.util_high.clamp(0.1, 1.0),
            trial_util: self.vta.trial_util,
        }
    }

    /// Pool partitions in the buffers crate's form.
    pub fn partitions(&self) -> Vec<PartitionConfig> {
        self.buffers
            .partitions
            .iter()
            .map(|p| PartitionConfig {
                block_size: p.block_size,
                blocks: p.blocks,
            })
            .collect()
    }

    /// The HTP queue bound in bytes, resolving 0 to 1 % of RAM (clamped).
    pub fn queue_bytes(&self) -> usize {
        if self.pipeline.queue_bytes > 0 {
            return self.pipeline.queue_bytes;
        }
        (physical_memory() / 100).clamp(256 << 10, 8 << 20)
    }

    /// HTP threads, resolving 0 to the number of cores.
    pub fn threads(&self) -> usize {
        if let PoolMode::Fixed(n) = self.pipeline.pool {
            if n > 0 {
                return n;
            }
        }
        if self.pipeline.threads > 0 {
            self.pipeline.threads
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }
    }
}

/// Physical memory in bytes (0 if unknown).
pub fn physical_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || size <= 0 {
        0
    } else {
        pages as usize * size as usize
    }
}

/// A seed for the endpoint's retransmission jitter: differs between runs.
fn rand_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_toml_hides_every_secret_and_nothing_else() {
        let text = r#"
[coaps]
bind = ["127.0.0.1:5684"]
psk_identity = "gw"
psk_key = "s3cret-psk"
[coaps.psk_keys]
other = "s3cret-other"
[access]
write = "token"
tokens = ["s3cret-token"]
[proxy]
bearer_tokens = ["s3cret-bearer"]
"#;
        let c = Config::from_toml(text).unwrap();
        let shown = c.to_toml_redacted();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(shown.matches("<redacted>").count(), 4, "{shown}");
        // what is not secret stays, and the lossless form keeps the keys
        assert!(
            shown.contains("\"gw\"") && shown.contains("other"),
            "{shown}"
        );
        assert_eq!(c.to_toml().matches("s3cret").count(), 4);
    }

    #[test]
    fn coaps_keys_and_dtls_writes_are_checked() {
        let coaps = "[coaps]\nbind = [\"127.0.0.1:5684\"]\n";
        let err = |toml: &str| {
            let c = Config::from_toml(toml).and_then(|c| {
                c.validate_to_start()?;
                c.coaps.settings()
            });
            c.err().map(|e| e.to_string()).unwrap_or_default()
        };
        // one identity given twice: which key would win is not clear
        let e = err(&format!(
            "{coaps}psk_identity = \"x\"\npsk_key = \"k1\"\n[coaps.psk_keys]\nx = \"k2\""
        ));
        assert!(
            e.contains("coaps.psk_keys") && e.contains("give its key once"),
            "{e}"
        );
        // a key of the wrong length is named as the key
        let long = "k".repeat(65);
        let e = err(&format!(
            "{coaps}psk_identity = \"x\"\npsk_key = \"{long}\""
        ));
        assert!(e.contains("coaps.psk_key:"), "{e}");
        // the per-source handshake cap: at least 1, at most the table
        for n in ["0", "2000"] {
            let e = err(&format!(
                "{coaps}psk_identity = \"x\"\npsk_key = \"k\"\nmax_handshakes_per_source = {n}"
            ));
            assert!(
                e.contains("coaps.max_handshakes_per_source") && e.contains("1..=max_sessions"),
                "{e}"
            );
        }
        // writes by DTLS identity with no coaps listener: none could pass
        let e = err("[access]\nwrite = \"dtls\"\n");
        assert!(
            e.contains("access.write") && e.contains("coaps listener"),
            "{e}"
        );
        assert_eq!(
            err(&format!(
                "{coaps}psk_identity = \"x\"\npsk_key = \"k\"\n[access]\nwrite = \"dtls\"\n"
            )),
            ""
        );
    }

    #[test]
    fn defaults_are_valid_and_round_trip() {
        let c = Config::default();
        c.validate().unwrap();
        let back = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(back.coap.bind, c.coap.bind);
        assert!(c.queue_bytes() >= 256 << 10 && c.queue_bytes() <= 8 << 20);
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::from_toml("[coap]\nmax_datagram = 10\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("coap.max_datagram"), "{e}");
        let e = Config::from_toml("[coap]\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = Config::from_toml("[buffers]\npartitions = [{ block_size = 100, blocks = 4 }]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("largest block"), "{e}");
        let many = "{ block_size = 1500, blocks = 1 },".repeat(mintgate_buf::MAX_PARTITIONS + 1);
        let e = Config::from_toml(&format!("[buffers]\npartitions = [{many}]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("buffers.partitions") && e.contains("at most 256"),
            "{e}"
        );
        let e = Config::from_toml("[vta]\ntrial_util = -0.5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("vta.trial_util"), "{e}");
        // the documented bounds
        for (toml, key) in [
            ("[vta]\nmax_threads = 1000\n", "vta.max_threads"),
            (
                "[coap]\nblock1_per_source_bytes = 1000\n",
                "coap.block1_per_source_bytes",
            ),
            ("[pipeline]\nthreads = 100000\n", "pipeline.threads"),
            (
                "[pipeline]\nobserver_samples = 3\n",
                "pipeline.observer_samples",
            ),
            (
                "[coap]\ntcp_max_message_size = 1000\n",
                "coap.tcp_max_message_size",
            ),
            (
                "[coap]\ntcp_max_per_source = 0\n",
                "coap.tcp_max_connections",
            ),
            (
                "[coap]\ntcp_frame_timeout_ms = 10\n",
                "coap.tcp_frame_timeout_ms",
            ),
            (
                "[coap]\ntcp_idle_timeout_s = 0\n",
                "coap.tcp_idle_timeout_s",
            ),
            // coaps+ws without a certificate: TLS here has no PSK
            ("[coaps]\nws_bind = [\"127.0.0.1:1\"]\n", "coaps.ws_bind"),
        ] {
            let e = Config::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
        let c = Config::from_toml("[coap]\nbind = [\"127.0.0.1:7000\"]\n[pipeline]\nthreads = 3\n")
            .unwrap();
        assert_eq!(c.threads(), 3);
    }

    #[test]
    fn mqtt_is_off_by_default_and_round_trips() {
        let c = Config::default();
        assert!(!c.mqtt.enabled);
        assert_eq!(c.mqtt.broker, "embedded");
        assert_eq!(c.mqtt.broker_url(), Ok(None));
        assert_eq!(c.mqtt.topic_prefix, "mintgate/");
        assert!(c.mqtt.publish_devices && c.mqtt.persist);
        assert_eq!((c.mqtt.qos, c.mqtt.window), (1, 1));
        let text = r#"
[mqtt]
enabled = true
broker = "mqtt5://broker.lan:1884"
state = "/var/lib/mintgate/mqtt"
qos = 2
window = 4
topic_prefix = "site1/"
publish_devices = false
backlog = 100
message_expiry = "2d"
command_session_expiry = "7d"

[[mqtt.publish]]
device = "temp0"
topic = "site1/temperature"
min_interval = "5s"

[[mqtt.command]]
topic = "site1/led/set"
device = "led0"

[[mqtt.observe]]
uri = "coap://[::1]:5684/sensors/temp0"
topic = "site1/remote/temp0"
accept = "json"
"#;
        let c = Config::from_toml(text).unwrap();
        let m = &c.mqtt;
        assert!(m.enabled && !m.publish_devices);
        let url = m.broker_url().unwrap().unwrap();
        assert_eq!(url.to_string(), "mqtt5://broker.lan:1884");
        assert_eq!((m.qos, m.window, m.backlog), (2, 4, 100));
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(m.message_expiry(), Some(2 * day));
        assert_eq!(m.command_session_expiry(), Some(7 * day));
        assert_eq!(Config::default().mqtt.command_session_expiry(), None);
        assert_eq!(m.publish[0].min_interval.as_deref(), Some("5s"));
        assert_eq!(m.command[0].device, "led0");
        assert_eq!(m.observe[0].accept.as_deref(), Some("json"));
        // the lossless TOML reads back the same
        let back = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(back.mqtt.publish, m.publish);
        assert_eq!(back.mqtt.command, m.command);
        assert_eq!(back.mqtt.observe, m.observe);
        assert_eq!(back.mqtt.broker, m.broker);
    }

    #[test]
    fn mqtt_errors_name_the_key() {
        for (toml, key, why) in [
            ("[mqtt]\nbroker = \"http://x\"", "mqtt.broker", "bad broker URL"),
            ("[mqtt]\nbroker = \"wss://x/a#b\"", "mqtt.broker", "path"),
            ("[mqtt]\nca_file = \"ca.pem\"", "mqtt.broker", "embedded broker takes no TLS"),
            (
                "[mqtt]\nbroker = \"mqtt://h\"\nca_file = \"/nonexistent/ca.pem\"",
                "mqtt.broker",
                "needs TLS (mqtts://",
            ),
            (
                "[mqtt]\nbroker = \"mqtts://h\"\nca_file = \"/nonexistent/ca.pem\"",
                "mqtt.broker",
                "CA file /nonexistent/ca.pem",
            ),
            (
                "[mqtt]\nbroker = \"mqtts://h\"\nusername = \"u\"\npassword_file = \"/nonexistent/pw\"",
                "mqtt.password_file",
                "password file /nonexistent/pw",
            ),
            (
                "[mqtt]\nbroker = \"mqtt://h\"\nusername = \"u\"\npassword_env = \"MG_UNSET_PASSWORD_VAR\"",
                "mqtt.password_env",
                "MG_UNSET_PASSWORD_VAR",
            ),
            (
                "[mqtt]\nbroker = \"mqtt://h\"\npassword_env = \"PATH\"",
                "mqtt.broker",
                "a password needs a user name",
            ),
            ("[mqtt]\nstatus_topic = \"gw/#\"", "mqtt.status_topic", "may not contain"),
            ("[mqtt]\nqos = 0", "mqtt.qos", "not 1 or 2"),
            ("[mqtt]\nwindow = 0", "mqtt.window", "1..=1024"),
            ("[mqtt]\nbacklog = 0", "mqtt.backlog", "outside"),
            ("[mqtt]\nmessage_expiry = \"500ms\"", "mqtt.message_expiry", "outside"),
            (
                "[mqtt]\nbroker = \"mqtt://h\"\ncommand_session_expiry = \"1h\"",
                "mqtt.command_session_expiry",
                "needs an MQTT 5 broker URL",
            ),
            (
                "[mqtt]\ncommand_session_expiry = \"1h\"",
                "mqtt.command_session_expiry",
                "embedded broker",
            ),
            (
                "[mqtt]\nbroker = \"mqtt5://h\"\ncommand_session_expiry = \"200000d\"",
                "mqtt.command_session_expiry",
                "out of range",
            ),
            ("[mqtt.queue]\nmax_messages = 1", "mqtt.queue.max_messages", "more than mqtt.window"),
            ("[mqtt.queue]\nmax_bytes = 100", "mqtt.queue.max_bytes", "outside"),
            ("[mqtt.queue]\nwhen_full = \"drop\"", "mqtt.queue.when_full", "\"drop-oldest\" or"),
            ("[mqtt]\ntopic_prefix = \"a/#/\"", "mqtt.topic_prefix", "may not contain"),
            ("[mqtt]\nstate = \"\"", "mqtt.state", "folder"),
            (
                "[[mqtt.publish]]\ndevice = \"nope\"\ntopic = \"t\"",
                "mqtt.publish",
                "entry 1 (device `nope`): no such device",
            ),
            (
                "[[mqtt.publish]]\ndevice = \"temp0\"\ntopic = \"t/+\"",
                "mqtt.publish",
                "may not contain",
            ),
            (
                "[[mqtt.publish]]\ndevice = \"temp0\"\ntopic = \"t\"\nmin_interval = \"soon\"",
                "mqtt.publish",
                "min_interval",
            ),
            (
                "[[mqtt.command]]\ntopic = \"c\"\ndevice = \"zz\"",
                "mqtt.command",
                "no device `zz`",
            ),
            (
                "[[mqtt.command]]\ntopic = \"c\"\ndevice = \"temp0\"",
                "mqtt.command",
                "is a sensor",
            ),
            (
                "[[mqtt.command]]\ntopic = \"c/#\"\ndevice = \"led0\"",
                "mqtt.command",
                "may not contain",
            ),
            (
                "[[mqtt.command]]\ntopic = \"c\"\ndevice = \"led0\"\n[[mqtt.command]]\ntopic = \"c\"\ndevice = \"led0\"",
                "mqtt.command",
                "entry 2 (topic \"c\"): the topic is given twice",
            ),
            (
                "[[mqtt.command]]\ntopic = \"mintgate/actuators/led0\"\ndevice = \"led0\"",
                "mqtt.command",
                "also where device `led0` is published",
            ),
            (
                "[[mqtt.publish]]\ndevice = \"temp0\"\ntopic = \"t\"\n[[mqtt.command]]\ntopic = \"t\"\ndevice = \"led0\"",
                "mqtt.command",
                "also where device `temp0` is published",
            ),
            (
                "[[mqtt.observe]]\nuri = \"coap://h/x\"\ntopic = \"o\"\n[[mqtt.command]]\ntopic = \"o\"\ndevice = \"led0\"",
                "mqtt.command",
                "also an [[mqtt.observe]] topic",
            ),
            (
                "[[mqtt.observe]]\nuri = \"http://h/x\"\ntopic = \"t\"",
                "mqtt.observe",
                "unsupported scheme",
            ),
            (
                "[[mqtt.observe]]\nuri = \"coap://h/x\"\ntopic = \"\"",
                "mqtt.observe",
                "1..=65535 bytes",
            ),
            (
                "[[mqtt.observe]]\nuri = \"coap://h/x\"\ntopic = \"t\"\naccept = \"text/html\"",
                "mqtt.observe",
                "unknown Content-Format",
            ),
        ] {
            let e = Config::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(why), "{toml}: {e}");
        }
        // a direct-path mqtt(TOPIC) output that is also a command topic:
        // known once the links resolve (what serve checks)
        let c = Config::from_toml(
            "[mqtt]\nenabled = true\n[[mqtt.command]]\ntopic = \"x/y\"\ndevice = \"led0\"\n\
             [directpath]\nlinks = [\"temp0 | threshold(25, 23) -> mqtt(x/y)\"]",
        )
        .unwrap();
        let e = c.validate_to_start().unwrap_err().to_string();
        assert!(e.contains("also an [[mqtt.command]] topic"), "{e}");
        // unknown keys are refused by name, in the section and its entries
        for (toml, word) in [
            ("[mqtt]\nbrokr = \"x\"", "brokr"),
            (
                "[[mqtt.command]]\ntopic = \"c\"\nactuator = \"led0\"",
                "actuator",
            ),
        ] {
            let e = Config::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(word), "{toml}: {e}");
        }
    }
}
