// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! The one-line link syntax, used by the config (`directpath.links`), the
//! `/links` CoAP resource and the Rust API:
//!
//! ```text
//! INPUT [| FILTER]... -> OUTPUT[, OUTPUT]...
//! temp0 | threshold(25, 23) -> actuator(fan0), notify(temp0), log
//! button0 | compare(==, 1) | rate(200ms) -> actuator(led0)
//! temp0 | cov(0.5) -> mqtt(sensors/temp0)
//! ```
//!
//! INPUT is a device name. Outputs: `actuator(NAME)` writes the value to
//! an actuator; `notify(NAME)` sends the value to the Observe notification
//! hook (CoAP observers of NAME); `log` logs it; any other `KIND(ARG)` is an
//! output kind registered by another part of the gateway (the MQTT bridge
//! registers `mqtt`).

use std::fmt;

use super::filter::FilterSpec;
use crate::parse::{split_call, split_top};

/// An output as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputSpec {
    /// `actuator(NAME)`
    Actuator(String),
    /// `notify(NAME)`
    Notify(String),
    /// `log`
    Log,
    /// `KIND(ARG)`, resolved by a registered output kind.
    Custom {
        /// The kind (`mqtt`, ...).
        kind: String,
        /// Its argument.
        arg: String,
    },
}

impl fmt::Display for OutputSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputSpec::Actuator(n) => write!(f, "actuator({n})"),
            OutputSpec::Notify(n) => write!(f, "notify({n})"),
            OutputSpec::Log => write!(f, "log"),
            OutputSpec::Custom { kind, arg } => write!(f, "{kind}({arg})"),
        }
    }
}

/// Whether `s` is a valid device name: 1-32 of `A-Z a-z 0-9 _ - .`.
pub fn valid_name(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

impl std::str::FromStr for OutputSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<OutputSpec, String> {
        let (kind, args) = split_call(s)?;
        let one = |what: &str| -> Result<String, String> {
            match args.as_slice() {
                [a] if valid_name(a) => Ok(a.clone()),
                [a] => Err(format!("{what}: `{a}` is not a device name")),
                _ => Err(format!("{what} takes one device name")),
            }
        };
        match kind.as_str() {
            "actuator" => Ok(OutputSpec::Actuator(one("actuator")?)),
            "notify" | "observe" => Ok(OutputSpec::Notify(one("notify")?)),
            "log" if args.is_empty() => Ok(OutputSpec::Log),
            "log" => Err("log takes no argument".into()),
            _ => match args.as_slice() {
                [a] if !a.is_empty() => Ok(OutputSpec::Custom {
                    kind,
                    arg: a.clone(),
                }),
                _ => Err(format!(
                    "output `{kind}` takes one argument, e.g. {kind}(target)"
                )),
            },
        }
    }
}

/// A link as written.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpec {
    /// The input device.
    pub input: String,
    /// Filters, in order.
    pub filters: Vec<FilterSpec>,
    /// Outputs (at least one).
    pub outputs: Vec<OutputSpec>,
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.input)?;
        for fl in &self.filters {
            write!(f, " | {fl}")?;
        }
        write!(f, " ->")?;
        for (i, o) in self.outputs.iter().enumerate() {
            write!(f, "{}{o}", if i == 0 { " " } else { ", " })?;
        }
        Ok(())
    }
}

/// Splits at the first top-level `->`.
fn split_arrow(s: &str) -> Result<(&str, &str), String> {
    let mut depth = 0i32;
    let b = s.as_bytes();
    for (i, c) in b.iter().enumerate() {
        match c {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b'-' if depth == 0 && b.get(i + 1) == Some(&b'>') => {
                // `->` is ASCII: both ends are character boundaries
                if let (Some(l), Some(r)) = (s.get(..i), s.get(i + 2..)) {
                    return Ok((l, r));
                }
            }
            _ => {}
        }
    }
    Err(format!(
        "`{s}`: expected INPUT [| FILTER]... -> OUTPUT[, OUTPUT]..."
    ))
}

impl std::str::FromStr for LinkSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<LinkSpec, String> {
        let (left, right) = split_arrow(s.trim())?;
        let mut parts = split_top(left, '|')?.into_iter();
        let input = parts.next().unwrap_or_default();
        if !valid_name(&input) {
            return Err(format!(
                "`{input}` is not a device name (1-32 of A-Z a-z 0-9 _ - .)"
            ));
        }
        let filters = parts
            .map(|p| p.parse::<FilterSpec>())
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = split_top(right, ',')?
            .iter()
            .map(|o| o.parse::<OutputSpec>())
            .collect::<Result<Vec<_>, _>>()?;
        if outputs.is_empty() {
            return Err("a link needs at least one output".into());
        }
        Ok(LinkSpec {
            input,
            filters,
            outputs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directpath::expr;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn parses_the_documented_examples() {
        let l: LinkSpec = "temp0 | threshold(25, 23) -> actuator(fan0), notify(temp0), log"
            .parse()
            .unwrap();
        assert_eq!(l.input, "temp0");
        assert_eq!(
            l.filters,
            vec![FilterSpec::Threshold {
                high: 25.0,
                low: 23.0
            }]
        );
        assert_eq!(
            l.outputs,
            vec![
                OutputSpec::Actuator("fan0".into()),
                OutputSpec::Notify("temp0".into()),
                OutputSpec::Log
            ]
        );
        let l: LinkSpec = "temp0|cov(0.5)->mqtt(sensors/temp0)".parse().unwrap();
        assert_eq!(
            l.outputs,
            vec![OutputSpec::Custom {
                kind: "mqtt".into(),
                arg: "sensors/temp0".into()
            }]
        );
        let l: LinkSpec = "a | expr(x > 1 || x < -1) | compare(>=, 1) -> log"
            .parse()
            .unwrap();
        assert_eq!(l.filters.len(), 2);
    }

    #[test]
    fn errors_are_explained() {
        for (s, why) in [
            ("temp0 actuator(x)", "expected INPUT"),
            ("-> log", "not a device name"),
            ("t0 | warp(9) -> log", "unknown filter"),
            ("t0 -> actuator(a b)", "not a device name"),
            ("t0 -> log(x)", "no argument"),
            ("t0 -> mqtt()", "takes one argument"),
            ("t0 -> ", "expected name"),
        ] {
            let e = s.parse::<LinkSpec>().unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_.-]{1,12}"
    }

    fn filter() -> impl Strategy<Value = FilterSpec> {
        let n = || proptest::num::f64::NORMAL | proptest::num::f64::ZERO;
        prop_oneof![
            (0usize..6, n()).prop_map(|(i, v)| FilterSpec::Compare(
                [
                    expr::BinOp::Lt,
                    expr::BinOp::Le,
                    expr::BinOp::Gt,
                    expr::BinOp::Ge,
                    expr::BinOp::Eq,
                    expr::BinOp::Ne
                ][i],
                v
            )),
            (n(), n()).prop_map(|(a, b)| FilterSpec::Threshold {
                high: a.max(b),
                low: a.min(b)
            }),
            (0.0..1e9f64).prop_map(FilterSpec::ChangeOfValue),
            (0u64..86_400_000).prop_map(|ms| FilterSpec::Rate(Duration::from_millis(ms))),
            "(x|[0-9]{1,3})( [-+*/%^<>] (x|[0-9]{1,3})){0,3}"
                .prop_map(|s| FilterSpec::Expr(expr::parse(&s).unwrap())),
        ]
    }

    fn output() -> impl Strategy<Value = OutputSpec> {
        prop_oneof![
            name().prop_map(OutputSpec::Actuator),
            name().prop_map(OutputSpec::Notify),
            Just(OutputSpec::Log),
            ("mqtt|http|udp", "[a-z0-9/_.#+-]{1,20}").prop_map(|(kind, arg)| OutputSpec::Custom {
                kind: kind.to_string(),
                arg
            }),
        ]
    }

    proptest! {
        #[test]
        fn link_syntax_round_trips(
            input in name(),
            filters in proptest::collection::vec(filter(), 0..4),
            outputs in proptest::collection::vec(output(), 1..4),
        ) {
            let l = LinkSpec { input, filters, outputs };
            let text = l.to_string();
            prop_assert_eq!(text.parse::<LinkSpec>(), Ok(l), "{}", text);
        }

        #[test]
        fn link_parser_never_panics(s in "[a-z0-9 |,()<>=!.*+-]{0,60}") {
            let _ = s.parse::<LinkSpec>();
        }
    }
}
