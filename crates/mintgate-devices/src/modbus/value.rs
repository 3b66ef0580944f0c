//! A point's value in Modbus registers: the types a point can have, the
//! byte order within each 16-bit register and the order of the registers
//! of a 32- or 64-bit value, and the scale and offset that turn the raw
//! number into the value the gateway shows. The Modbus Application
//! Protocol Specification V1.1b3 sends each register big-endian; devices
//! disagree on everything wider than one register, hence the two orders.

use serde::{Deserialize, Serialize};

/// The type of a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// A coil, a discrete input, or one bit of a register (`bit`).
    Bool,
    /// One register, unsigned.
    U16,
    /// One register, two's complement.
    I16,
    /// Two registers, unsigned.
    U32,
    /// Two registers, two's complement.
    I32,
    /// Two registers, IEEE 754 single precision.
    F32,
    /// Four registers, IEEE 754 double precision.
    F64,
}

impl ValueType {
    /// Every type.
    pub const ALL: [ValueType; 7] = [
        ValueType::Bool,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::F64,
    ];

    /// Registers the type takes (a bool: one, the register holding its bit).
    pub fn words(self) -> u16 {
        match self {
            ValueType::Bool | ValueType::U16 | ValueType::I16 => 1,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 2,
            ValueType::F64 => 4,
        }
    }
}

/// Byte order within a register, or register order within a value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Most significant first (the protocol's own order; the default).
    #[default]
    Big,
    /// Least significant first.
    Little,
}

/// How a point's registers become a value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Layout {
    /// The type.
    pub ty: ValueType,
    /// For a bool in a register: its bit, 0 the least significant.
    pub bit: Option<u8>,
    /// Byte order within each register.
    pub byte_order: Order,
    /// Register order within the value.
    pub word_order: Order,
    /// value = raw * scale + offset.
    pub scale: f64,
    /// See `scale`.
    pub offset: f64,
}

impl Layout {
    /// A layout of `ty` with both orders big, scale 1 and offset 0.
    pub fn plain(ty: ValueType) -> Layout {
        Layout {
            ty,
            bit: None,
            byte_order: Order::Big,
            word_order: Order::Big,
            scale: 1.0,
            offset: 0.0,
        }
    }

    /// The bytes of the value, most significant first, from its registers
    /// as received (`words` holds exactly [`ValueType::words`] of them).
    fn bytes_of(&self, words: &[u16]) -> [u8; 8] {
        let mut b = [0u8; 8];
        let n = words.len().min(4);
        for i in 0..n {
            let w = match self.word_order {
                Order::Big => words[i],
                Order::Little => words[n - 1 - i],
            };
            let w = match self.byte_order {
                Order::Big => w,
                Order::Little => w.swap_bytes(),
            };
            b[2 * i..2 * i + 2].copy_from_slice(&w.to_be_bytes());
        }
        b
    }

    /// The registers to send for the value whose bytes (most significant
    /// first) are the first `2 * words` of `b`: the inverse of `to_bytes`.
    fn words_of(&self, b: &[u8; 8]) -> Vec<u16> {
        let n = usize::from(self.ty.words());
        let mut out = vec![0u16; n];
        for i in 0..n {
            let w = u16::from_be_bytes([b[2 * i], b[2 * i + 1]]);
            let w = match self.byte_order {
                Order::Big => w,
                Order::Little => w.swap_bytes(),
            };
            match self.word_order {
                Order::Big => out[i] = w,
                Order::Little => out[n - 1 - i] = w,
            }
        }
        out
    }

    /// The raw number in `words` (exactly [`ValueType::words`] registers),
    /// before scale and offset; `None` when too few registers are given.
    pub fn decode_raw(&self, words: &[u16]) -> Option<f64> {
        let n = usize::from(self.ty.words());
        let words = words.get(..n)?;
        if self.ty == ValueType::Bool {
            let w = match self.byte_order {
                Order::Big => words[0],
                Order::Little => words[0].swap_bytes(),
            };
            let bit = self.bit.unwrap_or(0).min(15);
            return Some(f64::from((w >> bit) & 1));
        }
        let b = self.bytes_of(words);
        Some(match self.ty {
            ValueType::U16 => f64::from(u16::from_be_bytes([b[0], b[1]])),
            ValueType::I16 => f64::from(i16::from_be_bytes([b[0], b[1]])),
            ValueType::U32 => f64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            ValueType::I32 => f64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            ValueType::F32 => f64::from(f32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            ValueType::F64 => f64::from_be_bytes(b),
            ValueType::Bool => 0.0,
        })
    }

    /// The point's value from its registers: raw * scale + offset.
    pub fn decode(&self, words: &[u16]) -> Option<f64> {
        self.decode_raw(words).map(|r| r * self.scale + self.offset)
    }

    /// A coil's or discrete input's value.
    pub fn decode_bit(&self, bit: bool) -> f64 {
        f64::from(u8::from(bit)) * self.scale + self.offset
    }

    /// The raw number for `value`: (value - offset) / scale, rounded to the
    /// nearest integer for integer types and bools; an error when it does
    /// not fit the type.
    pub fn raw_for(&self, value: f64) -> Result<f64, String> {
        let raw = (value - self.offset) / self.scale;
        if !raw.is_finite() {
            return Err(format!("{value} gives no finite raw value"));
        }
        let range = |lo: f64, hi: f64| {
            let r = raw.round();
            if (lo..=hi).contains(&r) {
                Ok(r)
            } else {
                Err(format!(
                    "{value} is raw {r}, outside {lo}..={hi} of a {:?}",
                    self.ty
                ))
            }
        };
        match self.ty {
            ValueType::Bool => range(0.0, 1.0),
            ValueType::U16 => range(0.0, f64::from(u16::MAX)),
            ValueType::I16 => range(f64::from(i16::MIN), f64::from(i16::MAX)),
            ValueType::U32 => range(0.0, f64::from(u32::MAX)),
            ValueType::I32 => range(f64::from(i32::MIN), f64::from(i32::MAX)),
            ValueType::F32 if raw.abs() > f64::from(f32::MAX) => {
                Err(format!("{value} is outside the range of an f32"))
            }
            ValueType::F32 | ValueType::F64 => Ok(raw),
        }
    }

    /// The registers that carry `value` (not for a bool: a bit is written
    /// as a coil or through a register mask).
    pub fn encode(&self, value: f64) -> Result<Vec<u16>, String> {
        let raw = self.raw_for(value)?;
        let mut b = [0u8; 8];
        // raw_for checked the range, so the casts below are exact
        match self.ty {
            ValueType::Bool => return Err("a bool is not written as registers".into()),
            ValueType::U16 => b[..2].copy_from_slice(&(raw as u16).to_be_bytes()),
            ValueType::I16 => b[..2].copy_from_slice(&(raw as i16).to_be_bytes()),
            ValueType::U32 => b[..4].copy_from_slice(&(raw as u32).to_be_bytes()),
            ValueType::I32 => b[..4].copy_from_slice(&(raw as i32).to_be_bytes()),
            ValueType::F32 => b[..4].copy_from_slice(&(raw as f32).to_be_bytes()),
            ValueType::F64 => b = raw.to_be_bytes(),
        }
        Ok(self.words_of(&b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lay(ty: ValueType, byte_order: Order, word_order: Order) -> Layout {
        Layout {
            byte_order,
            word_order,
            ..Layout::plain(ty)
        }
    }

    const ORDERS: [(Order, Order); 4] = [
        (Order::Big, Order::Big),
        (Order::Little, Order::Big),
        (Order::Big, Order::Little),
        (Order::Little, Order::Little),
    ];

    /// Each type in each of the four orders, against registers worked out
    /// by hand: the value's big-endian bytes A B C D (E F G H) are sent as
    /// AB CD (big/big), BA DC (byte little), CD AB (word little), DC BA
    /// (both little).
    #[test]
    fn every_type_in_every_order_decodes() {
        use Order::*;
        use ValueType::*;
        // u16 0x1234 = 4660, i16 0xFF38 = -200
        assert_eq!(lay(U16, Big, Big).decode(&[0x1234]), Some(4660.0));
        assert_eq!(lay(U16, Little, Big).decode(&[0x3412]), Some(4660.0));
        assert_eq!(lay(U16, Big, Little).decode(&[0x1234]), Some(4660.0));
        assert_eq!(lay(I16, Big, Big).decode(&[0xFF38]), Some(-200.0));
        assert_eq!(lay(I16, Little, Little).decode(&[0x38FF]), Some(-200.0));
        // u32 0x12345678 = 305419896
        let u = 305_419_896.0;
        assert_eq!(lay(U32, Big, Big).decode(&[0x1234, 0x5678]), Some(u));
        assert_eq!(lay(U32, Little, Big).decode(&[0x3412, 0x7856]), Some(u));
        assert_eq!(lay(U32, Big, Little).decode(&[0x5678, 0x1234]), Some(u));
        assert_eq!(lay(U32, Little, Little).decode(&[0x7856, 0x3412]), Some(u));
        // i32 -100000 = 0xFFFE7960
        let i = -100_000.0;
        assert_eq!(lay(I32, Big, Big).decode(&[0xFFFE, 0x7960]), Some(i));
        assert_eq!(lay(I32, Little, Big).decode(&[0xFEFF, 0x6079]), Some(i));
        assert_eq!(lay(I32, Big, Little).decode(&[0x7960, 0xFFFE]), Some(i));
        assert_eq!(lay(I32, Little, Little).decode(&[0x6079, 0xFEFF]), Some(i));
        // f32 230.5 = 0x43668000
        let f = 230.5;
        assert_eq!(lay(F32, Big, Big).decode(&[0x4366, 0x8000]), Some(f));
        assert_eq!(lay(F32, Little, Big).decode(&[0x6643, 0x0080]), Some(f));
        assert_eq!(lay(F32, Big, Little).decode(&[0x8000, 0x4366]), Some(f));
        assert_eq!(lay(F32, Little, Little).decode(&[0x0080, 0x6643]), Some(f));
        // f64 -1.5 = 0xBFF8000000000000; 1234.5678 = 0x40934A456D5CFAAD
        assert_eq!(lay(F64, Big, Big).decode(&[0xBFF8, 0, 0, 0]), Some(-1.5));
        let d = [0x4093, 0x4A45, 0x6D5C, 0xFAAD];
        assert_eq!(lay(F64, Big, Big).decode(&d), Some(1234.5678));
        let rev = [0xFAAD, 0x6D5C, 0x4A45, 0x4093];
        assert_eq!(lay(F64, Big, Little).decode(&rev), Some(1234.5678));
        let sw = [0x9340, 0x454A, 0x5C6D, 0xADFA];
        assert_eq!(lay(F64, Little, Big).decode(&sw), Some(1234.5678));
        let both = [0xADFA, 0x5C6D, 0x454A, 0x9340];
        assert_eq!(lay(F64, Little, Little).decode(&both), Some(1234.5678));
        // bits of a register; the byte order applies before the bit is taken
        let mut b = Layout::plain(Bool);
        for (bit, want) in [(0, 1.0), (1, 0.0), (2, 1.0), (15, 1.0), (14, 0.0)] {
            b.bit = Some(bit);
            assert_eq!(b.decode(&[0x8005]), Some(want), "bit {bit}");
        }
        b.byte_order = Little;
        b.bit = Some(0);
        assert_eq!(b.decode(&[0x0100]), Some(1.0));
        // scale and offset; too few registers
        let s = Layout {
            scale: 0.1,
            offset: -40.0,
            ..Layout::plain(U16)
        };
        assert!((s.decode(&[650]).unwrap() - 25.0).abs() < 1e-9);
        assert_eq!(s.decode_bit(true), -39.9);
        assert_eq!(lay(U32, Big, Big).decode(&[1]), None);
        // encoding is the inverse, in every order
        for (bo, wo) in ORDERS {
            assert_eq!(
                lay(F32, bo, wo).decode(&lay(F32, bo, wo).encode(f).unwrap()),
                Some(f)
            );
        }
    }

    #[test]
    fn encoding_refuses_what_the_type_cannot_hold() {
        use ValueType::*;
        let e = Layout::plain(U16).encode(70_000.0).unwrap_err();
        assert!(e.contains("outside 0..=65535"), "{e}");
        assert!(Layout::plain(I16).encode(-40_000.0).is_err());
        assert!(Layout::plain(U32).encode(-1.0).is_err());
        assert!(Layout::plain(F32).encode(1e300).is_err());
        assert!(Layout::plain(Bool).encode(1.0).is_err());
        assert_eq!(Layout::plain(U16).encode(2.6), Ok(vec![3]));
        let s = Layout {
            scale: 0.1,
            offset: -40.0,
            ..Layout::plain(I16)
        };
        assert_eq!(s.encode(25.0), Ok(vec![650]));
        assert_eq!(s.raw_for(-41.0), Ok(-10.0));
    }

    fn any_type() -> impl Strategy<Value = ValueType> {
        prop::sample::select(ValueType::ALL[1..].to_vec())
    }

    proptest! {
        /// Registers decoded and encoded again are the same registers (for
        /// floats, whenever they decode to a finite number), in every order.
        #[test]
        fn registers_round_trip(
            ty in any_type(),
            order in 0usize..4,
            words in prop::collection::vec(any::<u16>(), 4),
        ) {
            let (bo, wo) = ORDERS[order];
            let l = lay(ty, bo, wo);
            let n = usize::from(ty.words());
            let v = l.decode(&words).unwrap();
            prop_assume!(v.is_finite());
            // -0.0 plus the offset 0 is 0.0: both zeros are one value here
            prop_assume!(v != 0.0);
            prop_assert_eq!(l.encode(v).unwrap(), words[..n].to_vec());
        }

        /// A value encoded with a scale and offset decodes to itself within
        /// half a step of the type's resolution.
        #[test]
        fn values_round_trip_with_scale_and_offset(
            ty in any_type(),
            order in 0usize..4,
            raw in -30_000i32..30_000,
            scale in prop::sample::select(vec![1.0, 0.1, 0.01, 2.0, -0.5]),
            offset in -100.0f64..100.0,
        ) {
            let (bo, wo) = ORDERS[order];
            let raw = if matches!(ty, ValueType::U16 | ValueType::U32) { raw.abs() } else { raw };
            let l = Layout { scale, offset, ..lay(ty, bo, wo) };
            let v = f64::from(raw) * scale + offset;
            let back = l.decode(&l.encode(v).unwrap()).unwrap();
            prop_assert!((back - v).abs() <= scale.abs() * 1e-3 + 1e-9, "{} != {}", back, v);
        }
    }
}
