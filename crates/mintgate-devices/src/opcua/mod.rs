//! OPC UA field devices: a `[[devices.list]]` entry of `kind = "opcua"` is
//! one OPC UA server (a PLC, a SCADA gateway) with the nodes the gateway
//! reads; each node becomes a device of its own (`DEV.NODE`), a sensor or,
//! when `writable`, an actuator, with its CoAP resource, history,
//! direct-path input and bridge topics like any other device.
//!
//! - this module: the node declarations, the node's type, and the
//!   conversion between the server's values (OPC UA Variants) and the
//!   gateway's numbers, with scale and offset;
//! - [`client`]: the server's connection on a thread of its own (session,
//!   subscription, writes, reconnects) and the node drivers.
//!
//! The protocol is OPC UA (IEC 62541): the client, its secure channel and
//! its session are `async-opcua`'s; nodes are read through one
//! subscription per server with a monitored item per node (Part 4,
//! 5.12-5.13), and written with the Write service (Part 4, 5.10.4).

pub mod client;

use std::str::FromStr;
use std::time::Duration;

pub use opcua_types::NodeId;
use opcua_types::Variant;
use serde::{Deserialize, Serialize};

/// The type of a node's value, as the server holds it (OPC UA built-in
/// types, Part 6 5.1.2): what a write sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    /// Boolean.
    Bool,
    /// SByte.
    I8,
    /// Byte.
    U8,
    /// Int16.
    I16,
    /// UInt16.
    U16,
    /// Int32.
    I32,
    /// UInt32.
    U32,
    /// Int64.
    I64,
    /// UInt64.
    U64,
    /// Float.
    F32,
    /// Double.
    F64,
}

impl NodeType {
    /// Every type.
    pub const ALL: [NodeType; 11] = [
        NodeType::Bool,
        NodeType::I8,
        NodeType::U8,
        NodeType::I16,
        NodeType::U16,
        NodeType::I32,
        NodeType::U32,
        NodeType::I64,
        NodeType::U64,
        NodeType::F32,
        NodeType::F64,
    ];
}

fn one() -> f64 {
    1.0
}

/// One node of an OPC UA server (`[[devices.list.nodes]]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// The point's name; its device is `DEVICE.NAME` (32 characters at most
    /// in all, of `A-Z a-z 0-9 _ - .`).
    pub name: String,
    /// The node's id in the OPC UA string form: `ns=2;s=Temperature`,
    /// `ns=2;i=1001`, `i=2258`, `ns=3;g=<GUID>`, `ns=3;b=<base64>`.
    pub node: String,
    /// Its type: what a write sends (needed when `writable`). A read takes
    /// any number or boolean the server sends.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub ty: Option<NodeType>,
    // As in modbus's PointSpec: see the note there.
    /// value = raw * scale + offset (default 1).
    #[serde(default = "one")]
    pub scale: f64,
    /// See `scale` (default 0).
    #[serde(default)]
    pub offset: f64,
    /// Its unit (default: the device's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The monitored item's sampling interval (default: the device's
    /// `period`, else 1 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// An actuator: written through PUT, the direct path or an MQTT
    /// command. Still monitored, so its resource shows what the server
    /// holds.
    #[serde(default)]
    pub writable: bool,
}

/// A security policy (Part 7, 6.6): the ones offered here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum Policy {
    /// No security: nothing signed or encrypted.
    #[default]
    None,
    /// Basic256Sha256: RSA 2048-4096 keys, SHA-256 signatures, AES-256.
    Basic256Sha256,
}

/// A message security mode (Part 4, 7.20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum Mode {
    /// Neither signed nor encrypted (policy `None` only).
    None,
    /// Signed.
    Sign,
    /// Signed and encrypted.
    SignAndEncrypt,
}

/// Default sampling interval of a node.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);
/// Default time one request (or a connect) may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most nodes one server may declare.
pub const MAX_NODES: usize = 10_000;
/// Shortest sampling or publishing interval asked for.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);
/// Longest node id text taken from the config.
pub const MAX_NODE_ID: usize = 512;
/// First wait before reconnecting to a server that failed, doubled after
/// every failed attempt up to [`RECONNECT_MAX`].
pub const RECONNECT_FIRST: Duration = Duration::from_millis(250);
/// Longest wait between reconnect attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// A node id from its string form (Part 6, 5.3.1.10, as `async-opcua`
/// reads it), with the length bounded.
pub fn parse_node(text: &str) -> Result<NodeId, String> {
    if text.len() > MAX_NODE_ID {
        return Err(format!(
            "a node id is at most {MAX_NODE_ID} bytes, this one has {}",
            text.len()
        ));
    }
    NodeId::from_str(text).map_err(|_| {
        format!("`{text}` is not a node id such as \"ns=2;s=Temperature\" or \"ns=2;i=1001\"")
    })
}

/// Why a node is wrong, or its parsed id (checks that need only the node).
pub fn check_node(n: &NodeSpec) -> Result<NodeId, String> {
    let what = |why: String| Err(format!("node `{}`: {why}", n.name));
    let id = match parse_node(&n.node) {
        Ok(id) => id,
        Err(e) => return what(e),
    };
    if n.writable && n.ty.is_none() {
        return what("a writable node needs `type` (what a write sends)".into());
    }
    if !n.scale.is_finite() || n.scale == 0.0 {
        return what(format!("scale {} must be finite and not 0", n.scale));
    }
    if !n.offset.is_finite() {
        return what(format!("offset {} must be finite", n.offset));
    }
    Ok(id)
}

/// How a node's raw value becomes the point's value and back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conversion {
    /// The type written (`None`: read-only, any number read).
    pub ty: Option<NodeType>,
    /// value = raw * scale + offset.
    pub scale: f64,
    /// See `scale`.
    pub offset: f64,
}

impl Conversion {
    /// A node's conversion.
    pub fn of(n: &NodeSpec) -> Conversion {
        Conversion {
            ty: n.ty,
            scale: n.scale,
            offset: n.offset,
        }
    }

    /// The point's value from what the server sent: a number or a
    /// boolean (1 or 0), times scale plus offset; an error names what else
    /// came (a string, an array, nothing) and a value that is not finite.
    pub fn decode(&self, v: &Variant) -> Result<f64, String> {
        let raw = match v {
            Variant::Boolean(b) => f64::from(u8::from(*b)),
            Variant::SByte(x) => f64::from(*x),
            Variant::Byte(x) => f64::from(*x),
            Variant::Int16(x) => f64::from(*x),
            Variant::UInt16(x) => f64::from(*x),
            Variant::Int32(x) => f64::from(*x),
            Variant::UInt32(x) => f64::from(*x),
            // 64-bit integers beyond 2^53 lose their last digits, as any
            // f64 would
            Variant::Int64(x) => *x as f64,
            Variant::UInt64(x) => *x as f64,
            Variant::Float(x) => f64::from(*x),
            Variant::Double(x) => *x,
            Variant::Empty => return Err("the node has no value".into()),
            other => {
                return Err(format!(
                    "the node holds a {:?}, not a number",
                    other.type_id()
                ))
            }
        };
        let v = raw * self.scale + self.offset;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(format!("the node's value {raw} is not a finite number"))
        }
    }

    /// The value to write for `value`: (value - offset) / scale in the
    /// node's type, rounded to the nearest integer for integer types and
    /// bools; an error when it does not fit the type.
    pub fn encode(&self, value: f64) -> Result<Variant, String> {
        let Some(ty) = self.ty else {
            return Err("the node has no `type`: it cannot be written".into());
        };
        let raw = (value - self.offset) / self.scale;
        if !raw.is_finite() {
            return Err(format!("{value} gives no finite raw value"));
        }
        let r = raw.round();
        // the bounds are exact in f64 (powers of two and small numbers);
        // 2^63 and 2^64 are the first values past i64 and u64
        let range = |lo: f64, hi_exclusive: f64| {
            if r >= lo && r < hi_exclusive {
                Ok(r)
            } else {
                Err(format!(
                    "{value} is raw {r}, outside the range of a {}",
                    format!("{ty:?}").to_lowercase()
                ))
            }
        };
        const TWO_63: f64 = 9_223_372_036_854_775_808.0;
        Ok(match ty {
            NodeType::Bool => Variant::Boolean(range(0.0, 2.0)? != 0.0),
            NodeType::I8 => Variant::SByte(range(-128.0, 128.0)? as i8),
            NodeType::U8 => Variant::Byte(range(0.0, 256.0)? as u8),
            NodeType::I16 => Variant::Int16(range(-32768.0, 32768.0)? as i16),
            NodeType::U16 => Variant::UInt16(range(0.0, 65536.0)? as u16),
            NodeType::I32 => Variant::Int32(range(-2_147_483_648.0, 2_147_483_648.0)? as i32),
            NodeType::U32 => Variant::UInt32(range(0.0, 4_294_967_296.0)? as u32),
            NodeType::I64 => Variant::Int64(range(-TWO_63, TWO_63)? as i64),
            NodeType::U64 => Variant::UInt64(range(0.0, 2.0 * TWO_63)? as u64),
            NodeType::F32 if raw.abs() > f64::from(f32::MAX) => {
                return Err(format!("{value} is outside the range of an f32"))
            }
            NodeType::F32 => Variant::Float(raw as f32),
            NodeType::F64 => Variant::Double(raw),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn conv(ty: NodeType) -> Conversion {
        Conversion {
            ty: Some(ty),
            scale: 1.0,
            offset: 0.0,
        }
    }

    #[test]
    fn node_ids_parse_in_their_string_forms() {
        assert_eq!(
            parse_node("ns=2;s=Temperature").unwrap(),
            NodeId::new(2, "Temperature")
        );
        assert_eq!(parse_node("ns=2;i=1001").unwrap(), NodeId::new(2, 1001u32));
        assert_eq!(parse_node("i=2258").unwrap(), NodeId::new(0, 2258u32));
        // a string id may hold ; and =
        assert_eq!(parse_node("ns=3;s=a;b=c").unwrap(), NodeId::new(3, "a;b=c"));
        for bad in [
            "",
            "Temperature",
            "ns=x;s=a",
            "ns=2;q=1",
            "ns=70000;i=1",
            "i=-1",
        ] {
            let e = parse_node(bad).unwrap_err();
            assert!(e.contains("not a node id"), "{bad}: {e}");
        }
        let long = format!("ns=2;s={}", "x".repeat(MAX_NODE_ID));
        assert!(parse_node(&long).unwrap_err().contains("at most"));
    }

    #[test]
    fn values_decode_from_every_numeric_variant() {
        let c = Conversion {
            ty: None,
            scale: 0.1,
            offset: -40.0,
        };
        assert!((c.decode(&Variant::UInt16(650)).unwrap() - 25.0).abs() < 1e-9);
        let p = conv(NodeType::F64);
        for (v, want) in [
            (Variant::Boolean(true), 1.0),
            (Variant::SByte(-5), -5.0),
            (Variant::Byte(200), 200.0),
            (Variant::Int16(-200), -200.0),
            (Variant::Int32(-100_000), -100_000.0),
            (Variant::UInt32(4_000_000_000), 4e9),
            (Variant::Int64(-1 << 40), -(2f64.powi(40))),
            (Variant::UInt64(1 << 50), 2f64.powi(50)),
            (Variant::Float(0.25), 0.25),
            (Variant::Double(21.5), 21.5),
        ] {
            assert_eq!(p.decode(&v), Ok(want), "{v:?}");
        }
        assert!(p
            .decode(&Variant::from("pump"))
            .unwrap_err()
            .contains("not a number"));
        assert!(p.decode(&Variant::Empty).unwrap_err().contains("no value"));
        assert!(p
            .decode(&Variant::Double(f64::NAN))
            .unwrap_err()
            .contains("not a finite"));
    }

    #[test]
    fn writes_refuse_what_the_type_cannot_hold() {
        use NodeType::*;
        assert_eq!(conv(I16).encode(-2.4), Ok(Variant::Int16(-2)));
        assert_eq!(conv(Bool).encode(1.0), Ok(Variant::Boolean(true)));
        assert!(conv(Bool).encode(2.0).is_err());
        assert!(conv(U8)
            .encode(256.0)
            .unwrap_err()
            .contains("range of a u8"));
        assert!(conv(U16).encode(-1.0).is_err());
        assert!(conv(I64).encode(9.3e18).is_err());
        assert_eq!(
            conv(U64).encode(1e19),
            Ok(Variant::UInt64(10_000_000_000_000_000_000))
        );
        assert!(conv(F32).encode(1e300).is_err());
        let c = Conversion {
            ty: Some(I16),
            scale: 0.1,
            offset: -40.0,
        };
        assert_eq!(c.encode(25.0), Ok(Variant::Int16(650)));
        let ro = Conversion { ty: None, ..c };
        assert!(ro.encode(1.0).unwrap_err().contains("no `type`"));
    }

    fn any_type() -> impl Strategy<Value = NodeType> {
        prop::sample::select(NodeType::ALL.to_vec())
    }

    proptest! {
        /// A node id printed in its string form parses back to itself.
        #[test]
        fn node_ids_round_trip(
            ns in 0u16..=u16::MAX,
            num in any::<u32>(),
            s in "[ -~]{1,64}",
            numeric in any::<bool>(),
        ) {
            let id = if numeric { NodeId::new(ns, num) } else { NodeId::new(ns, s) };
            prop_assert_eq!(parse_node(&id.to_string()).unwrap(), id);
        }

        /// Any text is parsed or refused, never a panic, within its bound.
        #[test]
        fn any_text_is_a_node_id_or_an_error(t in ".{0,600}") {
            if let Ok(id) = parse_node(&t) {
                prop_assert!(t.len() <= MAX_NODE_ID);
                prop_assert_eq!(parse_node(&id.to_string()).unwrap(), id);
            }
        }

        /// A value written with a scale and offset reads back as itself
        /// within half a step of the type's resolution.
        #[test]
        fn values_round_trip_with_scale_and_offset(
            ty in any_type(),
            raw in -100i32..100,
            scale in prop::sample::select(vec![1.0, 0.1, 0.01, 2.0, -0.5]),
            offset in -100.0f64..100.0,
        ) {
            let raw = match ty {
                NodeType::Bool => raw.rem_euclid(2),
                NodeType::U8 | NodeType::U16 | NodeType::U32 | NodeType::U64 => raw.abs(),
                _ => raw,
            };
            let c = Conversion { ty: Some(ty), scale, offset };
            let v = f64::from(raw) * scale + offset;
            let back = c.decode(&c.encode(v).unwrap()).unwrap();
            prop_assert!((back - v).abs() <= scale.abs() * 1e-3 + 1e-9, "{} != {}", back, v);
        }
    }
}
