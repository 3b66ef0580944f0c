//! What the OPC UA driver takes from outside: node id strings from the
//! config (`mintgate_devices::opcua::parse_node`), and values the server
//! sends, as OPC UA binary Variants (decoded by `async-opcua`'s own
//! decoder) turned into point values (`Conversion::decode`) and back
//! (`Conversion::encode`).
//!
//! The first byte picks which; the rest is the input. Checked: nothing
//! panics; a node id that parses prints a form that parses to the same id;
//! a value read is finite; a number read written back in the node's own
//! type gives the same value again (but for 64-bit integers at the very
//! top of their range, which f64 rounds past it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_devices::opcua::{parse_node, Conversion, NodeType};
use opcua_types::{BinaryDecodable, ContextOwned, Variant};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    if sel & 1 == 0 {
        let text = String::from_utf8_lossy(rest);
        if let Ok(id) = parse_node(&text) {
            assert_eq!(parse_node(&id.to_string()).as_ref(), Ok(&id), "{text:?}");
        }
        return;
    }
    let ctx = ContextOwned::default();
    let Ok(v) = Variant::decode(&mut &rest[..], &ctx.context()) else {
        return;
    };
    let ty = match &v {
        Variant::Boolean(_) => NodeType::Bool,
        Variant::SByte(_) => NodeType::I8,
        Variant::Byte(_) => NodeType::U8,
        Variant::Int16(_) => NodeType::I16,
        Variant::UInt16(_) => NodeType::U16,
        Variant::Int32(_) => NodeType::I32,
        Variant::UInt32(_) => NodeType::U32,
        Variant::Int64(_) => NodeType::I64,
        Variant::UInt64(_) => NodeType::U64,
        Variant::Float(_) => NodeType::F32,
        _ => NodeType::F64,
    };
    let plain = Conversion {
        ty: Some(ty),
        scale: 1.0,
        offset: 0.0,
    };
    if let Ok(x) = plain.decode(&v) {
        assert!(x.is_finite());
        match plain.encode(x) {
            // 64-bit integers past 2^53 are rounded by f64: compared as read
            Ok(back) => assert_eq!(plain.decode(&back), Ok(x), "{v:?}"),
            // the largest ones round up to 2^63 or 2^64, just past the type
            Err(_) => assert!(
                matches!(ty, NodeType::I64 | NodeType::U64) && x.abs() >= 9.2e18,
                "{v:?} read as {x} cannot be written back"
            ),
        }
    }
    // scaled, with odd factors: never a panic, never a value not finite
    for (scale, offset) in [(0.1, -40.0), (1e300, 0.0), (-1e-300, 1e300)] {
        let c = Conversion {
            ty: Some(ty),
            scale,
            offset,
        };
        if let Ok(x) = c.decode(&v) {
            assert!(x.is_finite());
            let _ = c.encode(x);
        }
    }
});
