//! Modbus field devices: a `[[devices.list]]` entry of `kind = "modbus"`
//! is one Modbus TCP server (a meter, a PLC, a gateway to an RS-485 bus)
//! or one unit on a serial (RTU) bus, with its points; each point becomes a device of its own (`DEV.POINT`),
//! a sensor or, when `writable`, an actuator, with its CoAP resource,
//! history, direct-path input and bridge topics like any other device.
//!
//! - [`value`]: types, byte and word orders, scale and offset.
//! - [`plan`]: which points are read in one request.
//! - [`client`]: the device's own thread (polls, writes, reconnects)
//!   and the point drivers.
//! - [`bus`]: an RTU serial bus shared by the devices on it.
//!
//! The protocol is the Modbus Application Protocol Specification V1.1b3
//! and, for TCP, the Modbus Messaging on TCP/IP Implementation Guide
//! V1.0b, for RTU the Modbus over Serial Line Specification V1.02; the
//! framing is `tokio-modbus`'s, the serial port `tokio-serial`'s.

pub mod bus;
pub mod client;
pub mod value;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use value::{Layout, Order, ValueType};

/// The four tables of a Modbus device's data model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Table {
    /// Read-write bits (function codes 1, 5, 15).
    Coil,
    /// Read-only bits (function code 2).
    DiscreteInput,
    /// Read-write registers (function codes 3, 6, 16, 22).
    Holding,
    /// Read-only registers (function code 4).
    Input,
}

impl Table {
    /// Whether its items are bits.
    pub fn is_bits(self) -> bool {
        matches!(self, Table::Coil | Table::DiscreteInput)
    }

    /// The most items one read request may ask for (the specification's
    /// 2000 bits or 125 registers).
    pub fn max_read(self) -> u16 {
        if self.is_bits() {
            2000
        } else {
            125
        }
    }
}

fn one() -> f64 {
    1.0
}

/// One point of a Modbus device (`[[devices.list.points]]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PointSpec {
    /// The point's name; its device is `DEVICE.POINT` (32 characters at most
    /// in all, of `A-Z a-z 0-9 _ - .`).
    pub name: String,
    /// Its table.
    pub table: Table,
    /// Its address, 0-based as sent on the wire (the "40001" convention
    /// minus the table's prefix and one).
    pub address: u16,
    /// Its type (default: `bool` in the bit tables, `u16` in registers).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub ty: Option<ValueType>,
    /// For `type = "bool"` in a register: the bit, 0 (least significant) to 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bit: Option<u8>,
    /// Byte order within each register (default `big`).
    #[serde(default)]
    pub byte_order: Order,
    /// Register order within a 32- or 64-bit value (default `big`: the
    /// most significant register first).
    #[serde(default)]
    pub word_order: Order,
    // scale to writable as in opcua's NodeSpec: serde's flatten does not work
    // with deny_unknown_fields, so each spec lists the fields itself.
    /// value = raw * scale + offset (default 1).
    #[serde(default = "one")]
    pub scale: f64,
    /// See `scale` (default 0).
    #[serde(default)]
    pub offset: f64,
    /// Its unit (default: the device's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// How often it is read (default: the device's `period`, else 1 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// An actuator: a coil or holding register written through PUT, the
    /// direct path or an MQTT command. Still polled, so its resource shows
    /// what the device holds.
    #[serde(default)]
    pub writable: bool,
}

impl PointSpec {
    /// The type, defaulted by table.
    pub fn value_type(&self) -> ValueType {
        self.ty.unwrap_or(if self.table.is_bits() {
            ValueType::Bool
        } else {
            ValueType::U16
        })
    }

    /// Items it takes in its table.
    pub fn span(&self) -> u16 {
        if self.table.is_bits() {
            1
        } else {
            self.value_type().words()
        }
    }

    /// How its registers become its value.
    pub fn layout(&self) -> Layout {
        Layout {
            ty: self.value_type(),
            bit: self.bit,
            byte_order: self.byte_order,
            word_order: self.word_order,
            scale: self.scale,
            offset: self.offset,
        }
    }
}

/// Default poll period of a point.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);
/// Default time one request may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default retries of a request that timed out or whose connection broke.
pub const DEFAULT_RETRIES: u32 = 1;
/// Most points one device may declare.
pub const MAX_POINTS: usize = 10_000;
/// Shortest poll period.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

/// One read request of a poll group: `count` items of `table` from
/// `start`, polled every `period`, holding `points` (indices into the
/// device's points).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadGroup {
    /// The table.
    pub table: Table,
    /// First item.
    pub start: u16,
    /// Items read.
    pub count: u16,
    /// Poll period.
    pub period: Duration,
    /// The points it carries, by index.
    pub points: Vec<usize>,
}

/// Groups points into read requests: points of one table and one period
/// whose items are contiguous (or overlap) are read in one request, up to
/// the protocol's limit per request ([`Table::max_read`]); a gap between
/// points starts a new request (addresses in a gap may not exist on the
/// device and would fail the whole read). `periods[i]` is point i's.
pub fn plan(points: &[PointSpec], periods: &[Duration]) -> Vec<ReadGroup> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| (points[i].table, periods[i], points[i].address));
    let mut groups: Vec<ReadGroup> = Vec::new();
    for i in order {
        let p = &points[i];
        let end = u32::from(p.address) + u32::from(p.span());
        if let Some(g) = groups.last_mut() {
            let g_end = u32::from(g.start) + u32::from(g.count);
            let new_end = g_end.max(end);
            if g.table == p.table
                && g.period == periods[i]
                && u32::from(p.address) <= g_end
                && new_end - u32::from(g.start) <= u32::from(p.table.max_read())
            {
                g.count = (new_end - u32::from(g.start)) as u16;
                g.points.push(i);
                continue;
            }
        }
        groups.push(ReadGroup {
            table: p.table,
            start: p.address,
            count: p.span(),
            period: periods[i],
            points: vec![i],
        });
    }
    groups
}

/// Why a point is wrong, or `Ok` (checks that need only the point).
pub fn check_point(p: &PointSpec) -> Result<(), String> {
    let ty = p.value_type();
    let what = |why: String| Err(format!("point `{}`: {why}", p.name));
    if p.table.is_bits() && ty != ValueType::Bool {
        return what(format!("a {:?} is a bit: its type is bool", p.table));
    }
    if p.table.is_bits() && p.bit.is_some() {
        return what("`bit` is for a bool in a register".into());
    }
    if !p.table.is_bits() && ty == ValueType::Bool && p.bit.is_none_or(|b| b > 15) {
        return what("a bool in a register needs `bit`, 0 to 15".into());
    }
    if ty != ValueType::Bool && p.bit.is_some() {
        return what("`bit` is only for type bool".into());
    }
    if u32::from(p.address) + u32::from(p.span()) > 0x1_0000 {
        return what(format!(
            "address {} + {} items runs past 65535",
            p.address,
            p.span()
        ));
    }
    if p.writable && !matches!(p.table, Table::Coil | Table::Holding) {
        return what(format!(
            "a {:?} is read-only: only coils and holding registers are writable",
            p.table
        ));
    }
    if !p.scale.is_finite() || p.scale == 0.0 {
        return what(format!("scale {} must be finite and not 0", p.scale));
    }
    if !p.offset.is_finite() {
        return what(format!("offset {} must be finite", p.offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(name: &str, table: Table, address: u16, ty: Option<ValueType>) -> PointSpec {
        PointSpec {
            name: name.into(),
            table,
            address,
            ty,
            bit: None,
            byte_order: Order::Big,
            word_order: Order::Big,
            scale: 1.0,
            offset: 0.0,
            unit: None,
            period: None,
            writable: false,
        }
    }

    #[test]
    fn contiguous_points_of_a_table_and_period_share_a_request() {
        use Table::*;
        use ValueType::*;
        let s = Duration::from_secs(1);
        let fast = Duration::from_millis(100);
        let points = vec![
            pt("v", Input, 2, Some(F32)),  // 2..4
            pt("a", Input, 0, Some(F32)),  // 0..2
            pt("w", Input, 4, Some(U16)),  // 4
            pt("gap", Input, 10, None),    // a gap: new request
            pt("hz", Input, 5, Some(I16)), // fast: its own request
            pt("k", Holding, 5, Some(F64)),
            pt("c0", Coil, 0, None),
            pt("c1", Coil, 1, None),
            pt("d1", DiscreteInput, 1, None),
        ];
        let mut periods = vec![s; points.len()];
        periods[4] = fast;
        let g = plan(&points, &periods);
        let want = [
            (Coil, 0, 2, s, vec![6, 7]),
            (DiscreteInput, 1, 1, s, vec![8]),
            (Holding, 5, 4, s, vec![5]),
            (Input, 5, 1, fast, vec![4]),
            (Input, 0, 5, s, vec![1, 0, 2]),
            (Input, 10, 1, s, vec![3]),
        ];
        assert_eq!(g.len(), want.len(), "{g:#?}");
        for (g, (table, start, count, period, pts)) in g.iter().zip(want) {
            assert_eq!(
                (g.table, g.start, g.count, g.period, &g.points),
                (table, start, count, period, &pts)
            );
        }
        // overlapping points (two views of one register) share it
        let mut bit = pt("b", Holding, 7, Some(Bool));
        bit.bit = Some(3);
        let pts = vec![pt("r", Holding, 7, None), bit];
        let g = plan(&pts, &[s, s]);
        assert_eq!((g.len(), g[0].count), (1, 1));
    }

    #[test]
    fn requests_stop_at_the_protocols_limits() {
        let s = Duration::from_secs(1);
        // 300 contiguous registers: 125 + 125 + 50
        let regs: Vec<PointSpec> = (0..300)
            .map(|i| pt(&format!("r{i}"), Table::Holding, i, None))
            .collect();
        let g = plan(&regs, &vec![s; regs.len()]);
        let counts: Vec<u16> = g.iter().map(|g| g.count).collect();
        assert_eq!(counts, vec![125, 125, 50]);
        assert_eq!(g[1].start, 125);
        // f32s never straddle the limit: 62 fit (124 registers), the 63rd
        // starts the next request
        let floats: Vec<PointSpec> = (0..70)
            .map(|i| pt(&format!("f{i}"), Table::Input, 2 * i, Some(ValueType::F32)))
            .collect();
        let g = plan(&floats, &vec![s; floats.len()]);
        assert_eq!(g[0].count, 124);
        assert_eq!(g[1].start, 124);
        // 4500 coils: 2000 + 2000 + 500
        let coils: Vec<PointSpec> = (0..4500)
            .map(|i| pt(&format!("c{i}"), Table::Coil, i, None))
            .collect();
        let g = plan(&coils, &vec![s; coils.len()]);
        let counts: Vec<u16> = g.iter().map(|g| g.count).collect();
        assert_eq!(counts, vec![2000, 2000, 500]);
        // every point is in exactly one request, inside it
        for g in &g {
            for &i in &g.points {
                assert!(coils[i].address >= g.start && coils[i].address < g.start + g.count);
            }
        }
        assert_eq!(g.iter().map(|g| g.points.len()).sum::<usize>(), 4500);
    }

    #[test]
    fn points_are_checked() {
        use Table::*;
        use ValueType::*;
        let e = |p: PointSpec| check_point(&p).unwrap_err();
        assert!(e(pt("x", Coil, 0, Some(U16))).contains("its type is bool"));
        assert!(e(pt("x", Holding, 0, Some(Bool))).contains("needs `bit`"));
        assert!(e(pt("x", Holding, 65535, Some(F32))).contains("past 65535"));
        assert!(check_point(&pt("x", Holding, 65534, Some(F32))).is_ok());
        let mut w = pt("x", Input, 0, None);
        w.writable = true;
        assert!(e(w).contains("read-only"));
        let mut s = pt("x", Input, 0, None);
        s.scale = 0.0;
        assert!(e(s).contains("scale"));
        let mut b = pt("x", Input, 0, Some(U16));
        b.bit = Some(2);
        assert!(e(b).contains("only for type bool"));
        assert!(check_point(&pt("x", Holding, 65532, Some(F64))).is_ok());
        let mut b = pt("x", Holding, 3, Some(Bool));
        b.bit = Some(15);
        assert!(check_point(&b).is_ok());
    }
}
