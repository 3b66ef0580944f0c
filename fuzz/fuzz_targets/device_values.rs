//! Device value parsing: what a PUT to an actuator carries
//! (`mintgate_gateway::devices::parse_put`), what an attribute file holds
//! (`attr::parse_value`), numbers and durations of the device and link
//! syntax (`parse::number`, `parse::duration`, `split_call`, `split_top`).
//! History files have a target of their own (`history_file`).
//!
//! Checked: accepted values are finite; a number and a duration written
//! back (`fmt_number`, `fmt_duration`) read back identical; durations stay
//! within a day; a call's arguments joined again split the same way.
#![no_main]

use std::path::Path;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mintgate_devices::{attr, parse};
use mintgate_gateway::devices::parse_put;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = parse_put(data) {
        assert!(v.is_finite());
    }
    if let Ok(v) = attr::parse_value(data, Path::new("/x")) {
        assert!(v.is_finite());
        let mut buf = [0u8; 40];
        let n = attr::format_value(v, &mut buf);
        assert_eq!(attr::parse_value(&buf[..n], Path::new("/x")).ok(), Some(v));
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(v) = parse::number(s) {
        assert!(v.is_finite());
        assert_eq!(
            parse::number(&parse::fmt_number(v)).map(f64::to_bits),
            Ok(v.to_bits())
        );
    }
    if let Ok(d) = parse::duration(s) {
        assert!(d <= Duration::from_secs(86_400), "{d:?}");
        assert_eq!(parse::duration(&parse::fmt_duration(d)), Ok(d));
    }
    if let Ok(parts) = parse::split_top(s, ',') {
        assert!(!parts.is_empty());
        assert_eq!(parse::split_top(&parts.join(","), ','), Ok(parts));
    }
    if let Ok((name, args)) = parse::split_call(s) {
        assert!(!name.is_empty());
        assert_eq!(name, name.to_ascii_lowercase());
        let again = if args.is_empty() {
            name.clone()
        } else {
            format!("{name}({})", args.join(", "))
        };
        assert_eq!(parse::split_call(&again), Ok((name, args)), "{again:?}");
    }
});
