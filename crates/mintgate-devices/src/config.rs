//! Device declarations (the finder's input), as read from the gateway's
//! TOML (`[devices]`, `[[devices.list]]`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::gpio::LineRef;

/// The driver a device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// A simulated sensor (`signal`, `period`).
    SimSensor,
    /// A simulated actuator.
    SimActuator,
    /// An attribute file read as a sensor (`path`, `keep_open`, `period` to poll).
    AttrSensor,
    /// An attribute file written as an actuator (`path`, `keep_open`).
    AttrActuator,
    /// A GPIO input line with edge events (`chip`, `line`, `debounce`).
    GpioIn,
    /// A GPIO output line (`chip`, `line`).
    GpioOut,
    /// A Modbus device, over TCP (`host`) or RTU (`serial`, `baud`,
    /// `parity`, `stop_bits`), with `unit_id`, `timeout`, `retries` and
    /// `points`: each point is a device `NAME.POINT`.
    Modbus,
    /// An OPC UA server (`endpoint`, `security_policy`, `security_mode`,
    /// certificates, `user`) with `nodes`: each node is a device
    /// `NAME.NODE`.
    Opcua,
}

impl DeviceKind {
    /// Whether it is an actuator.
    pub fn is_actuator(self) -> bool {
        matches!(
            self,
            DeviceKind::SimActuator | DeviceKind::AttrActuator | DeviceKind::GpioOut
        )
    }
}

/// A `sim-sensor`'s sampling period when it sets none.
pub const SIM_DEFAULT_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

fn default_history() -> usize {
    256
}

/// One device.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Unique name: 1-32 of `A-Z a-z 0-9 _ - .`; the CoAP resource is
    /// `/sensors/NAME` or `/actuators/NAME`.
    pub name: String,
    /// The driver.
    pub kind: DeviceKind,
    /// `sim-sensor`: the signal, e.g. `"sine(22, 3, 60s)"` (see `sim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// `sim-sensor`: sampling period; `attr-sensor`: polling period (no
    /// polling when absent). E.g. `"1s"`, `"100ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// `attr-*`: the attribute file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `attr-*`: keep the file open and use pread/pwrite (else open/close per access).
    #[serde(default)]
    pub keep_open: bool,
    /// `gpio-*`: the chip: `/dev/gpiochip0`, `gpiochip0` or its label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip: Option<String>,
    /// `gpio-*`: the line's offset or name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<LineRef>,
    /// `gpio-in`: debounce period, e.g. `"5ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<String>,
    /// Unit shown beside values (`"Cel"`, `"%RH"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Resource type (`rt`) of its CoAP resource; a default per kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rt: Option<String>,
    /// Values kept in its history.
    #[serde(default = "default_history")]
    pub history: usize,
    /// Seed of a `walk` signal (default: from the name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Observe: notify an unchanged value too once this long has passed
    /// since the last notification (checked at each new value, e.g. each
    /// sample of a sensor), e.g. `"10s"`; absent: notify on change only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_every: Option<String>,
    /// `modbus`: the device's `host:port` (port 502 when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// `modbus` over RTU: the serial port (`/dev/ttyUSB0`), instead of `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// `modbus` over RTU: bits per second (default 9600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baud: Option<u32>,
    /// `modbus` over RTU: `none`, `even` or `odd` (default `even`, the
    /// specification's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parity: Option<crate::modbus::bus::Parity>,
    /// `modbus` over RTU: 1 or 2 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_bits: Option<u8>,
    /// `modbus`: the unit identifier (slave id) of its requests (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_id: Option<u8>,
    /// `modbus`: most time a request (or a connect) may take (default `1s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// `modbus`: further attempts of a request that timed out or whose
    /// connection failed, 0-10 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// `modbus`: its points (`[[devices.list.points]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<crate::modbus::PointSpec>,
    /// `opcua`: the server's endpoint URL, `opc.tcp://host:port/path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `opcua`: `None` (the default) or `Basic256Sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_policy: Option<crate::opcua::Policy>,
    /// `opcua`: `None`, `Sign` or `SignAndEncrypt` (default: `None` with
    /// the policy `None`, else `SignAndEncrypt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_mode: Option<crate::opcua::Mode>,
    /// `opcua`: the client's certificate (`.der` or `.pem`), needed by
    /// `Basic256Sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<PathBuf>,
    /// `opcua`: the client's private key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PathBuf>,
    /// `opcua`: the client's application URI, the first subjectAltName of
    /// its certificate (default `urn:mintgate:gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_uri: Option<String>,
    /// `opcua`: the server's certificate, trusted (`.der` or `.pem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<PathBuf>,
    /// `opcua`: a directory whose `.der` and `.pem` certificates are trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_certificates: Option<PathBuf>,
    /// `opcua`: trust any server certificate (default false; for a test
    /// bench, never for a plant).
    #[serde(default)]
    pub trust_any_server_certificate: bool,
    /// `opcua`: the user name (anonymous when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `opcua`: a file holding the user's password (one line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// `opcua`: an environment variable holding the user's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// `opcua`: the subscription's publishing interval (default: the
    /// shortest sampling interval of its nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publishing_interval: Option<String>,
    /// `opcua`: its nodes (`[[devices.list.nodes]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<crate::opcua::NodeSpec>,
}

impl DeviceSpec {
    /// `notify_every` as a duration (`None` when absent); an error names
    /// the device and the key.
    pub fn notify_period(&self) -> Result<Option<std::time::Duration>, crate::DeviceError> {
        self.notify_every
            .as_deref()
            .map(crate::parse::duration)
            .transpose()
            .map_err(|e| crate::DeviceError::Config {
                name: self.name.clone(),
                why: format!("notify_every: {e}"),
            })
    }

    /// How long a value read now stays fresh, in whole seconds: what CoAP
    /// answers carry as Max-Age (RFC 7252 5.10.5), so that a cache or proxy
    /// does not serve it for the default 60 s. A sampled or polled sensor:
    /// its period, rounded up; anything whose value can change at any
    /// moment (a sensor read on demand, a GPIO input, an actuator, which
    /// the direct path may write): 0. A period that does not parse counts
    /// as none (the start refuses it anyway).
    pub fn max_age_s(&self) -> u32 {
        let period = match (self.kind, self.period.as_deref()) {
            (DeviceKind::SimSensor, None) => Some(Ok(SIM_DEFAULT_PERIOD)),
            (DeviceKind::SimSensor | DeviceKind::AttrSensor, p) => p.map(crate::parse::duration),
            (DeviceKind::Modbus, p) => {
                Some(p.map_or(Ok(crate::modbus::DEFAULT_PERIOD), crate::parse::duration))
            }
            (DeviceKind::Opcua, p) => {
                Some(p.map_or(Ok(crate::opcua::DEFAULT_PERIOD), crate::parse::duration))
            }
            _ => None,
        };
        match period {
            Some(Ok(p)) => {
                let s = p.as_secs() + u64::from(p.subsec_nanos() > 0);
                u32::try_from(s.max(1)).unwrap_or(u32::MAX)
            }
            _ => 0,
        }
    }

    /// A declaration with only name and kind set.
    pub fn new(name: &str, kind: DeviceKind) -> DeviceSpec {
        DeviceSpec {
            name: name.into(),
            kind,
            signal: None,
            period: None,
            path: None,
            keep_open: false,
            chip: None,
            line: None,
            debounce: None,
            notify_every: None,
            unit: None,
            rt: None,
            history: default_history(),
            seed: None,
            host: None,
            serial: None,
            baud: None,
            parity: None,
            stop_bits: None,
            unit_id: None,
            timeout: None,
            retries: None,
            points: Vec::new(),
            endpoint: None,
            security_policy: None,
            security_mode: None,
            certificate: None,
            private_key: None,
            application_uri: None,
            server_certificate: None,
            trusted_certificates: None,
            trust_any_server_certificate: false,
            user: None,
            password_file: None,
            password_env: None,
            publishing_interval: None,
            nodes: Vec::new(),
        }
    }

    /// Whether it is an actuator: by its kind, and for a Modbus point or
    /// an OPC UA node (a declaration [`DeviceSpec::expand`] made) by its
    /// `writable`.
    pub fn is_actuator(&self) -> bool {
        match self.kind {
            DeviceKind::Modbus => self.points.len() == 1 && self.points[0].writable,
            DeviceKind::Opcua => self.nodes.len() == 1 && self.nodes[0].writable,
            k => k.is_actuator(),
        }
    }

    /// The devices the declaration makes: itself, or for a Modbus device
    /// one per point, named `NAME.POINT`, with the point's period (else
    /// the device's, else 1 s) and unit (else the device's), and only that
    /// point in `points`; for an OPC UA server likewise one per node.
    pub fn expand(&self) -> Vec<DeviceSpec> {
        let one = |name: &str, period: &Option<String>, unit: &Option<String>| {
            let mut d = self.clone();
            d.name = format!("{}.{name}", self.name);
            d.period = period.clone().or_else(|| self.period.clone());
            d.unit = unit.clone().or_else(|| self.unit.clone());
            d
        };
        match self.kind {
            DeviceKind::Modbus => self
                .points
                .iter()
                .map(|p| DeviceSpec {
                    points: vec![p.clone()],
                    ..one(&p.name, &p.period, &p.unit)
                })
                .collect(),
            DeviceKind::Opcua => self
                .nodes
                .iter()
                .map(|n| DeviceSpec {
                    nodes: vec![n.clone()],
                    ..one(&n.name, &n.period, &n.unit)
                })
                .collect(),
            _ => vec![self.clone()],
        }
    }
}

/// `[devices]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    /// Devices to create at start. The default (used when no file sets
    /// `[[devices.list]]`) is a simulated temperature sensor `temp0`
    /// (a 60 s sine around 22 °C, sampled every second) and a simulated
    /// actuator `led0`.
    pub list: Vec<DeviceSpec>,
    /// Directory where device histories are kept across restarts (one
    /// `NAME.hist` file per device, flushed every second); absent: the
    /// histories live in memory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<PathBuf>,
    /// How often what was flushed to `store` is forced to disk (fsync), a
    /// duration in `1s..=1h` (absent: `1s`); a clean shutdown always syncs.
    /// See [`crate::store`] for the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_sync: Option<String>,
}

impl DevicesConfig {
    /// Every device the list makes: each declaration, a Modbus device's
    /// points in its place ([`DeviceSpec::expand`]).
    pub fn devices(&self) -> Vec<DeviceSpec> {
        self.list.iter().flat_map(DeviceSpec::expand).collect()
    }

    /// `store_sync` as a duration (the default when absent); an error
    /// names the key.
    pub fn store_sync_period(&self) -> Result<std::time::Duration, crate::DeviceError> {
        match self.store_sync.as_deref() {
            None => Ok(crate::store::DEFAULT_SYNC),
            Some(s) => crate::store::parse_sync(s).map_err(|why| crate::DeviceError::Config {
                name: "devices.store_sync".into(),
                why,
            }),
        }
    }
}

impl Default for DevicesConfig {
    fn default() -> Self {
        let mut temp = DeviceSpec::new("temp0", DeviceKind::SimSensor);
        temp.signal = Some("sine(22, 3, 60s)".into());
        temp.period = Some("1s".into());
        temp.unit = Some("Cel".into());
        temp.rt = Some("mintgate.temperature".into());
        let mut led = DeviceSpec::new("led0", DeviceKind::SimActuator);
        led.rt = Some("mintgate.light".into());
        DevicesConfig {
            list: vec![temp, led],
            store: None,
            store_sync: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_a_sampled_sensors_period_rounded_up_else_0() {
        let with = |kind, period: Option<&str>| {
            let mut d = DeviceSpec::new("d", kind);
            d.period = period.map(str::to_owned);
            d.max_age_s()
        };
        assert_eq!(with(DeviceKind::SimSensor, Some("1s")), 1);
        assert_eq!(with(DeviceKind::SimSensor, None), 1);
        assert_eq!(with(DeviceKind::SimSensor, Some("100ms")), 1);
        assert_eq!(with(DeviceKind::SimSensor, Some("2500ms")), 3);
        assert_eq!(with(DeviceKind::AttrSensor, Some("5m")), 300);
        // read on demand, event-driven, written at any moment
        assert_eq!(with(DeviceKind::AttrSensor, None), 0);
        assert_eq!(with(DeviceKind::GpioIn, None), 0);
        assert_eq!(with(DeviceKind::SimActuator, None), 0);
        assert_eq!(with(DeviceKind::SimSensor, Some("soon")), 0);
    }

    #[test]
    fn reads_toml_and_rejects_unknown_keys() {
        let c: DevicesConfig = toml::from_str(
            r#"
            [[list]]
            name = "button0"
            kind = "gpio-in"
            chip = "gpio-sim"
            line = 3
            debounce = "5ms"
            [[list]]
            name = "door"
            kind = "gpio-out"
            chip = "/dev/gpiochip1"
            line = "DOOR"
            [[list]]
            name = "fan"
            kind = "attr-actuator"
            path = "/sys/class/gpio/gpio5/value"
            keep_open = true
            "#,
        )
        .unwrap();
        assert_eq!(c.list.len(), 3);
        assert_eq!(c.list[0].line, Some(LineRef::Offset(3)));
        assert_eq!(c.list[1].line, Some(LineRef::Name("DOOR".into())));
        assert!(c.list[2].kind.is_actuator());
        let e = toml::from_str::<DevicesConfig>(
            "[[list]]\nname = \"a\"\nkind = \"sim-sensor\"\nsignall = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("signall"), "{e}");
        let e = toml::from_str::<DevicesConfig>("[[list]]\nname = \"a\"\nkind = \"laser\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("laser"), "{e}");
        let d = DevicesConfig::default();
        let back: DevicesConfig = toml::from_str(&toml::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }
}
