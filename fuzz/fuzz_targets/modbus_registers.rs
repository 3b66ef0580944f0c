//! Modbus point values from the registers a device sends
//! (`mintgate_devices::modbus::Layout`): any type, bit, byte and word order,
//! scale and offset, over any registers.
//!
//! Checked: decoding never panics and gives `None` only for too few
//! registers; a bit is 0 or 1; with scale 1 and offset 0, a finite value
//! encoded again gives back the registers it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_devices::modbus::{Layout, Order, ValueType};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let order = |b: bool| if b { Order::Little } else { Order::Big };
    let ty = ValueType::ALL[usize::from(sel % 7)];
    let layout = Layout {
        ty,
        bit: (ty == ValueType::Bool).then_some(sel >> 4),
        byte_order: order(sel & 0x08 != 0),
        word_order: order(sel & 0x80 != 0),
        ..Layout::plain(ty)
    };
    let words: Vec<u16> = rest
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    let n = usize::from(ty.words());
    let Some(v) = layout.decode(&words) else {
        assert!(words.len() < n);
        return;
    };
    if ty == ValueType::Bool {
        assert!(v == 0.0 || v == 1.0, "{v}");
        return;
    }
    // -0.0 plus the offset 0 is 0.0: both zeros are one value here
    if v.is_finite() && v != 0.0 {
        assert_eq!(
            layout.encode(v).as_deref(),
            Ok(&words[..n]),
            "{layout:?} {v}"
        );
    }
    // a scaled value never panics either way
    let scaled = Layout {
        scale: 0.1,
        offset: -40.0,
        ..layout
    };
    if let Some(v) = scaled.decode(&words) {
        let _ = scaled.encode(v);
    }
});
