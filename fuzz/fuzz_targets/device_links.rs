//! The direct-path link syntax a `/links` POST carries and the config
//! holds (`LinkSpec`, its filters `FilterSpec` and expressions
//! `expr::parse`), and the simulated-signal syntax of device configs
//! (`sim::Signal`), on arbitrary text.
//!
//! Checked: everything accepted prints (`Display`) to text that parses
//! back to the same value; an expression compiles and evaluates to a
//! number or NaN without panicking, and its compiled form agrees with the
//! tree; a filter spec builds a filter or is refused with a reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_devices::directpath::expr;
use mintgate_devices::directpath::filter::{Filter, FilterSpec};
use mintgate_devices::directpath::link::LinkSpec;
use mintgate_devices::sim::Signal;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(l) = s.parse::<LinkSpec>() {
        assert!(!l.outputs.is_empty());
        let back = l.to_string();
        assert_eq!(
            back.parse::<LinkSpec>().as_ref(),
            Ok(&l),
            "{s:?} -> {back:?}"
        );
        for f in &l.filters {
            if let Err(e) = Filter::spec(f.clone()) {
                assert!(!e.is_empty());
            }
        }
    }
    if let Ok(f) = s.parse::<FilterSpec>() {
        let back = f.to_string();
        assert_eq!(
            back.parse::<FilterSpec>().as_ref(),
            Ok(&f),
            "{s:?} -> {back:?}"
        );
    }
    if let Ok(e) = expr::parse(s) {
        let back = e.to_string();
        assert_eq!(expr::parse(&back).as_ref(), Ok(&e), "{s:?} -> {back:?}");
        if let Ok(p) = e.compile() {
            for x in [0.0, 1.0, -2.5, 1e300] {
                let (a, b) = (e.eval(x), p.eval(x));
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{s:?} at {x}: {a} vs {b}"
                );
            }
        }
    }
    if let Ok(sig) = s.parse::<Signal>() {
        let back = sig.to_string();
        assert_eq!(
            back.parse::<Signal>().as_ref(),
            Ok(&sig),
            "{s:?} -> {back:?}"
        );
    }
});
