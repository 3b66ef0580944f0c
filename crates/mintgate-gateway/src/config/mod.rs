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

mod coap;
mod metrics;
mod mqtt;
mod pipeline;
mod proxy;

pub use coap::*;
pub use metrics::*;
pub use mqtt::*;
pub use pipeline::*;
pub use proxy::*;

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
        self.coap.validate()?;
        self.coaps.settings()?;
        self.pipeline.validate()?;
        self.vta.validate()?;
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
