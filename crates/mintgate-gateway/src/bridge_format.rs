//! What the MQTT bridges publish: the payload format of each bridge and
//! the topic templates (`docs/mqtt.md`, "Formats and topic templates").
//!
//! Formats ([`Format`], `format` in `[mqtt]` and per entry):
//! - `envelope` (default): the publish queue's JSON envelope (`pub`, `seq`,
//!   `ts`, `msg`), the body a JSON object in `msg`: `{"device":"temp0",
//!   "value":22.513,"unit":"Cel","ts":1732550400123}` for a device value or
//!   a link output, `{"uri":…,"observe":7,"ct":0,"payload":"22.5",
//!   "value":22.5,"ts":…}` for a notification. A receiver orders and
//!   de-duplicates by `pub` and `seq`.
//! - `senml`: SenML JSON (RFC 8428), a pack of records `[{"bn":"GW/",
//!   "n":"temp0","u":"Cel","v":22.513,"t":1732550400.123}, …]`; the values
//!   of one topic that reach the publishing thread together go in one
//!   pack (at most [`SENML_MAX_RECORDS`]), the first record carrying the
//!   base name (the gateway id and `/`). A notification is a record named
//!   after the resource's path, `v` when its payload is a number, else
//!   `vs`.
//! - `bare`: the value alone (`22.513`), or a notification's payload as it
//!   came (UTF-8 only).
//!
//! `senml` and `bare` payloads carry no sequence: over MQTT 5 every
//! publish carries the publisher id and seq as user properties (`pub`,
//! `seq`), which `mintgate subscribe` orders and de-duplicates by; over
//! 3.1.1 a receiver gets them at least once, in order with window 1.
//!
//! Topic templates: `{device}` (the device's name), `{kind}` (its driver:
//! `sim-sensor`, `gpio-in`, …) and `{gateway}` (the gateway id: the
//! publish queue's publisher id, stable across restarts) in
//! `topic_prefix`, `[[mqtt.publish]] topic`; `{gateway}` alone in
//! `[[mqtt.observe]] topic`, `[[mqtt.command]] topic`, `status_topic` and
//! the direct path's `mqtt(TOPIC)`. Any other `{…}` is an error.

use crate::devices::fmt_value;

/// Most records in one SenML pack.
pub const SENML_MAX_RECORDS: usize = 64;

/// The payload format of a bridge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// The publish queue's JSON envelope, the body an object in `msg`.
    #[default]
    Envelope,
    /// SenML JSON (RFC 8428).
    Senml,
    /// The value or payload alone.
    Bare,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "envelope" => Ok(Format::Envelope),
            "senml" => Ok(Format::Senml),
            "bare" => Ok(Format::Bare),
            _ => Err(format!("{s:?} is not \"envelope\", \"senml\" or \"bare\"")),
        }
    }
}

impl Format {
    /// Whether the queue sends the body without its envelope.
    pub fn bare(self) -> bool {
        self != Format::Envelope
    }
}

/// What a topic template may name.
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateVars<'a> {
    /// `{device}` and `{kind}`, where the topic belongs to a device.
    pub device: Option<(&'a str, &'a str)>,
    /// `{gateway}`; `None` leaves it as it is (expanded later).
    pub gateway: Option<&'a str>,
}

/// `template` with its placeholders replaced; an error names a placeholder
/// that is unknown or has no value here.
pub fn expand(template: &str, vars: TemplateVars<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("{template:?}: '{{' without '}}'"))?;
        let name = &after[1..close];
        match (name, vars.device, vars.gateway) {
            ("device", Some((d, _)), _) => out.push_str(d),
            ("kind", Some((_, k)), _) => out.push_str(k),
            ("gateway", _, Some(g)) => out.push_str(g),
            ("gateway", _, None) => out.push_str("{gateway}"),
            ("device" | "kind", None, _) => {
                return Err(format!(
                    "{template:?}: {{{name}}} is only for device topics (topic_prefix, \
                     [[mqtt.publish]])"
                ))
            }
            _ => {
                return Err(format!(
                    "{template:?}: unknown placeholder {{{name}}} (known: {{device}}, {{kind}}, \
                     {{gateway}})"
                ))
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `s` as a JSON string literal (serde_json's escaping; one for the crate).
pub(crate) fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        fmt_value(v)
    } else {
        "null".into()
    }
}

/// The envelope body of a device value or a link output.
pub fn value_body(device: &str, unit: Option<&str>, value: f64, unix_ms: u64) -> String {
    let unit = unit
        .map(|u| format!(",\"unit\":{}", json_str(u)))
        .unwrap_or_default();
    format!(
        "{{\"device\":{},\"value\":{}{unit},\"ts\":{unix_ms}}}",
        json_str(device),
        json_num(value)
    )
}

/// The envelope body of a notification.
pub fn observed_body(
    uri: &str,
    observe: Option<u32>,
    cf: Option<u16>,
    payload: &[u8],
    unix_ms: u64,
) -> String {
    let text = String::from_utf8_lossy(payload);
    let value = number(&text)
        .map(|v| format!(",\"value\":{}", json_num(v)))
        .unwrap_or_default();
    let opt = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
    format!(
        "{{\"uri\":{},\"observe\":{},\"ct\":{},\"payload\":{}{value},\"ts\":{unix_ms}}}",
        json_str(uri),
        opt(observe.map(u64::from)),
        opt(cf.map(u64::from)),
        json_str(&text)
    )
}

fn number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The bare body of a value.
pub fn bare_value(value: f64) -> String {
    json_num(value)
}

/// The bare body of a notification: its payload, if it is UTF-8.
pub fn bare_observed(payload: &[u8]) -> Result<String, String> {
    String::from_utf8(payload.to_vec()).map_err(|_| {
        "the payload is not UTF-8: the bare format cannot carry it (use envelope or senml)".into()
    })
}

/// A SenML name: `name` with every character RFC 8428 4.5.1 does not allow
/// in a name replaced by `_`, and a first character that is not a letter
/// or digit dropped.
pub fn senml_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-:./_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// One SenML record of a value (without the base name).
pub fn senml_value(name: &str, unit: Option<&str>, value: f64, unix_ms: u64) -> String {
    let unit = unit
        .map(|u| format!(",\"u\":{}", json_str(u)))
        .unwrap_or_default();
    let v = if value.is_finite() {
        format!("\"v\":{}", fmt_value(value))
    } else {
        // a record needs a value; a non-finite one has no JSON number
        format!("\"vs\":{}", json_str(&value.to_string()))
    };
    format!(
        "{{\"n\":{}{unit},{v},\"t\":{}}}",
        json_str(&senml_name(name)),
        senml_time(unix_ms)
    )
}

/// One SenML record of a notification: named after the resource's path,
/// `v` when the payload is a number, else `vs` (lossy UTF-8).
pub fn senml_observed(path: &str, payload: &[u8], unix_ms: u64) -> String {
    let text = String::from_utf8_lossy(payload);
    let v = match number(&text) {
        Some(v) => format!("\"v\":{}", fmt_value(v)),
        None => format!("\"vs\":{}", json_str(&text)),
    };
    format!(
        "{{\"n\":{},{v},\"t\":{}}}",
        json_str(&senml_name(path)),
        senml_time(unix_ms)
    )
}

/// Seconds since the Unix epoch with milliseconds (an absolute SenML time:
/// above 2^28).
fn senml_time(unix_ms: u64) -> String {
    format!("{}.{:03}", unix_ms / 1000, unix_ms % 1000)
}

/// A SenML pack of `records`, the first one given the base name
/// `{gateway}/`.
pub fn senml_pack(gateway: &str, records: &[String]) -> String {
    let mut out = String::with_capacity(16 + records.iter().map(|r| r.len() + 1).sum::<usize>());
    out.push('[');
    for (i, r) in records.iter().enumerate() {
        if i == 0 {
            let bn = format!("{}/", senml_name(gateway));
            out.push_str(&format!("{{\"bn\":{},", json_str(&bn)));
            out.push_str(r.strip_prefix('{').unwrap_or(r));
        } else {
            out.push(',');
            out.push_str(r);
        }
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bodies_are_json() {
        let b = value_body("temp0", Some("Cel"), 22.51349, 17);
        assert_eq!(
            b,
            r#"{"device":"temp0","value":22.513,"unit":"Cel","ts":17}"#
        );
        let v: serde_json::Value =
            serde_json::from_str(&value_body("a\"b", None, f64::NAN, 1)).unwrap();
        assert!(v["value"].is_null());
        assert_eq!(v["device"], "a\"b");
        let o = observed_body("coap://h/x", Some(7), Some(0), b" 21.5 ", 3);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        assert_eq!(v["observe"], 7);
        assert_eq!(v["value"], 21.5);
        assert_eq!(v["payload"], " 21.5 ");
        let o = observed_body("coap://h/x", None, None, b"\xffhi\"", 3);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        assert!(v["observe"].is_null() && v.get("value").is_none());
    }

    #[test]
    fn templates_expand_what_they_may_name() {
        let dev = TemplateVars {
            device: Some(("temp0", "sim-sensor")),
            gateway: Some("gw-1"),
        };
        assert_eq!(
            expand("site/{gateway}/{kind}/{device}", dev).unwrap(),
            "site/gw-1/sim-sensor/temp0"
        );
        assert_eq!(expand("plain/topic", dev).unwrap(), "plain/topic");
        // {gateway} kept for later when not known yet
        let later = TemplateVars {
            device: Some(("t", "k")),
            gateway: None,
        };
        assert_eq!(
            expand("a/{gateway}/{device}", later).unwrap(),
            "a/{gateway}/t"
        );
        let no_dev = TemplateVars {
            device: None,
            gateway: Some("g"),
        };
        assert!(expand("a/{device}", no_dev)
            .unwrap_err()
            .contains("only for device topics"));
        assert!(expand("a/{site}", dev).unwrap_err().contains("unknown"));
        assert!(expand("a/{gateway", dev).unwrap_err().contains("without"));
        assert_eq!(expand("a/}b", dev).unwrap(), "a/}b");
    }

    #[test]
    fn senml_pack_is_rfc_8428_json() {
        let recs = vec![
            senml_value("temp0", Some("Cel"), 22.513, 1_732_550_400_123),
            senml_value("temp0", Some("Cel"), 22.5, 1_732_550_401_005),
        ];
        let pack = senml_pack("gw-1", &recs);
        let v: serde_json::Value = serde_json::from_str(&pack).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0]["bn"], "gw-1/");
        assert_eq!(a[0]["n"], "temp0");
        assert_eq!(a[0]["u"], "Cel");
        assert_eq!(a[0]["v"], 22.513);
        assert_eq!(a[0]["t"], 1_732_550_400.123);
        assert_eq!(a[1]["t"], 1_732_550_401.005);
        assert!(a[1].get("bn").is_none());
        let o = senml_pack("g", &[senml_observed("/sensors/temp0", b"hello", 5)]);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        assert_eq!(v[0]["n"], "sensors/temp0");
        assert_eq!(v[0]["vs"], "hello");
        let o = senml_pack("g", &[senml_observed("x y?", b" 7.5\n", 5)]);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        assert_eq!(
            (v[0]["n"].as_str(), v[0]["v"].as_f64()),
            (Some("x_y_"), Some(7.5))
        );
    }

    #[test]
    fn bare_bodies() {
        assert_eq!(bare_value(22.5131), "22.513");
        assert_eq!(bare_value(f64::NAN), "null");
        assert_eq!(bare_observed(b"on").unwrap(), "on");
        assert!(bare_observed(&[0xff, 0xfe]).is_err());
        assert_eq!("senml".parse::<Format>(), Ok(Format::Senml));
        assert!("json".parse::<Format>().is_err());
    }

    proptest! {
        #[test]
        fn any_pack_is_json_and_names_are_senml_names(
            names in proptest::collection::vec(".{0,12}", 1..5),
            values in proptest::collection::vec(any::<f64>(), 1..5),
            payload in proptest::collection::vec(any::<u8>(), 0..24),
            ms in any::<u64>(),
        ) {
            let mut recs: Vec<String> = names
                .iter()
                .zip(&values)
                .map(|(n, v)| senml_value(n, Some(n), *v, ms))
                .collect();
            recs.push(senml_observed(&names[0], &payload, ms));
            let pack = senml_pack(&names[0], &recs);
            let v: serde_json::Value = serde_json::from_str(&pack).unwrap();
            prop_assert_eq!(v.as_array().map(Vec::len), Some(recs.len()));
            for r in v.as_array().unwrap() {
                let n = r["n"].as_str().unwrap();
                prop_assert!(n.is_empty() || n.starts_with(|c: char| c.is_ascii_alphanumeric()));
                prop_assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || "-:./_".contains(c)));
            }
        }

        #[test]
        fn expand_never_panics(t in ".{0,40}") {
            let _ = expand(&t, TemplateVars { device: Some(("d", "k")), gateway: Some("g") });
            let _ = expand(&t, TemplateVars::default());
        }
    }
}
