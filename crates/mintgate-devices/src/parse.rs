// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! Small parsing helpers shared by the signal, filter and link syntaxes:
//! `name(arg, arg, ...)` calls, durations and numbers. Every function
//! returns an error message naming what it could not read; none panics.

use std::time::Duration;

/// Splits `name(a, b, ...)` (or a bare `name`) into the lower-case name and
/// the trimmed top-level arguments (commas inside nested parentheses stay
/// in their argument). A bare name has no arguments.
pub fn split_call(s: &str) -> Result<(String, Vec<String>), String> {
    let s = s.trim();
    let Some(open) = s.find('(') else {
        if s.is_empty() || !s.chars().all(is_name_char) {
            return Err(format!("`{s}`: expected name(arguments)"));
        }
        return Ok((s.to_ascii_lowercase(), Vec::new()));
    };
    let name = s[..open].trim();
    if name.is_empty() || !name.chars().all(is_name_char) {
        return Err(format!("`{s}`: expected name(arguments)"));
    }
    let Some(inner) = s[open + 1..].strip_suffix(')') else {
        return Err(format!("`{s}`: missing `)` at the end"));
    };
    let args = split_top(inner, ',')?;
    let args = if matches!(args.as_slice(), [a] if a.is_empty()) {
        Vec::new()
    } else {
        args
    };
    Ok((name.to_ascii_lowercase(), args))
}

/// `Ok` when the call `name` has `k` arguments, else the message that says
/// how many it takes and how many it got.
pub fn arg_count(name: &str, args: &[String], k: usize) -> Result<(), String> {
    if args.len() == k {
        Ok(())
    } else {
        Err(format!(
            "`{name}` takes {k} argument{}, got {}",
            if k == 1 { "" } else { "s" },
            args.len()
        ))
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'
}

/// Splits `s` at `sep` where it is not nested in parentheses; each part is
/// trimmed. Unbalanced parentheses are an error.
pub fn split_top(s: &str, sep: char) -> Result<Vec<String>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("`{s}`: unbalanced `)`"))?
            }
            c if c == sep && depth == 0 => {
                parts.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if depth != 0 {
        return Err(format!("`{s}`: unbalanced `(`"));
    }
    parts.push(cur.trim().to_string());
    Ok(parts)
}

/// A finite number.
pub fn number(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("`{}` is not a finite number", s.trim())),
    }
}

/// A duration: a number with `ns`, `us` (or `µs`), `ms`, `s`, `m` (or
/// `min`), `h` or `d`, or no unit for seconds (`100ms`, `1.5s`, `2m`, `3`);
/// 0 up to one day. The one duration grammar of the program: the config,
/// the command line and the device and link specs all read it.
pub fn duration(s: &str) -> Result<Duration, String> {
    duration_upto(s, 86_400)
}

/// [`duration`]'s grammar up to `max_secs` (for the few settings counted
/// in more than a day, such as an MQTT session's expiry).
pub fn duration_upto(s: &str, max_secs: u64) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit_ns: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "" | "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}` (use ns, us, ms, s, m, h or d)"
            ))
        }
    };
    let max_ns = u128::from(max_secs) * 1_000_000_000;
    let range = || {
        if max_secs == 86_400 {
            format!("`{s}` is out of range (0 to 1 day)")
        } else {
            format!("`{s}` is out of range (0 to {max_secs} s)")
        }
    };
    let bad = || format!("`{s}` is not a duration (e.g. 200us, 500ms, 10s, 2m)");
    let ns: u128 = if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| bad())?;
        let ns = v * unit_ns as f64;
        if !(0.0..=max_ns as f64).contains(&ns) {
            return Err(range());
        }
        ns.round() as u128
    } else {
        num.parse::<u128>()
            .map_err(|_| bad())?
            .checked_mul(u128::from(unit_ns))
            .ok_or_else(range)?
    };
    if ns > max_ns {
        return Err(range());
    }
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| range())
}

/// A duration written back in the shortest exact unit `duration` reads.
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0s".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// A number written so that [`number`] reads back the same `f64`.
pub fn fmt_number(v: f64) -> String {
    format!("{v:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn calls_and_durations() {
        assert_eq!(
            split_call("sine(22, 3, 60s)").unwrap(),
            ("sine".into(), vec!["22".into(), "3".into(), "60s".into()])
        );
        assert_eq!(
            split_call("expr(max(x, 1) * 2)").unwrap().1,
            vec!["max(x, 1) * 2".to_string()]
        );
        assert_eq!(split_call("log").unwrap(), ("log".into(), vec![]));
        assert_eq!(split_call("f()").unwrap(), ("f".into(), vec![]));
        assert!(split_call("f(1").is_err());
        assert!(split_call("f(1))").is_err());
        assert!(split_call("(1)").is_err());
        assert!(split_call("").is_err());
        assert_eq!(duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(duration("5us").unwrap(), Duration::from_micros(5));
        assert!(duration("5 parsecs").is_err());
        assert!(duration("2d").is_err());
        assert!(number("nan").is_err());
        assert!(number("1e999").is_err());
    }

    proptest! {
        #[test]
        fn helpers_never_panic(s in "\\PC{0,40}") {
            let _ = split_call(&s);
            let _ = split_top(&s, ',');
            let _ = duration(&s);
            let _ = number(&s);
        }

        #[test]
        fn durations_round_trip(ns in 0u64..86_400_000_000_000) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(duration(&fmt_duration(d)).unwrap(), d);
        }

        #[test]
        fn numbers_round_trip(v in proptest::num::f64::NORMAL | proptest::num::f64::ZERO) {
            prop_assert_eq!(number(&fmt_number(v)).unwrap(), v);
        }
    }
}
