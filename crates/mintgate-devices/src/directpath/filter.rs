//! Filters between a link's input and its outputs.
//!
//! | syntax | passes |
//! |---|---|
//! | `compare(OP, V)` | when `value OP V` (OP one of `< <= > >= == !=`); the value unchanged |
//! | `threshold(HIGH, LOW)` | 1 when the value rises to HIGH or above, 0 when it falls to LOW or below; nothing in between (hysteresis); LOW <= HIGH |
//! | `cov(DELTA)` | the first value, then a value that differs by DELTA or more from the last one passed |
//! | `rate(INTERVAL)` | at most one value per INTERVAL (by the time the value was sensed) |
//! | `expr(E)` | the value of the expression E over `x` (see [`super::expr`]); a result that is not finite (NaN, ±inf) is dropped |
//!
//! A Rust callback ([`Filter::callback`]) can stand anywhere in the chain.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::expr::{self, BinOp, Expr, Program};
use super::Event;
use crate::parse::{arg_count, duration, fmt_duration, fmt_number, number, split_call};

/// A filter as written (everything but callbacks).
#[derive(Clone, Debug, PartialEq)]
pub enum FilterSpec {
    /// `compare(OP, V)`
    Compare(BinOp, f64),
    /// `threshold(HIGH, LOW)`
    Threshold {
        /// Switch on at or above.
        high: f64,
        /// Switch off at or below.
        low: f64,
    },
    /// `cov(DELTA)`
    ChangeOfValue(f64),
    /// `rate(INTERVAL)`
    Rate(Duration),
    /// `expr(E)`
    Expr(Expr),
}

const COMPARE_OPS: [BinOp; 6] = [
    BinOp::Lt,
    BinOp::Le,
    BinOp::Gt,
    BinOp::Ge,
    BinOp::Eq,
    BinOp::Ne,
];

fn op_symbol(op: BinOp) -> &'static str {
    match op {
        BinOp::Lt => "<",
        BinOp::Le => "<=",
        BinOp::Gt => ">",
        BinOp::Ge => ">=",
        BinOp::Eq => "==",
        _ => "!=",
    }
}

impl fmt::Display for FilterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilterSpec::Compare(op, v) => {
                write!(f, "compare({}, {})", op_symbol(*op), fmt_number(*v))
            }
            FilterSpec::Threshold { high, low } => {
                write!(f, "threshold({}, {})", fmt_number(*high), fmt_number(*low))
            }
            FilterSpec::ChangeOfValue(d) => write!(f, "cov({})", fmt_number(*d)),
            FilterSpec::Rate(d) => write!(f, "rate({})", fmt_duration(*d)),
            FilterSpec::Expr(e) => write!(f, "expr({e})"),
        }
    }
}

impl std::str::FromStr for FilterSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<FilterSpec, String> {
        let (name, args) = split_call(s)?;
        let want = |k: usize| arg_count(&name, &args, k);
        match name.as_str() {
            "compare" => {
                want(2)?;
                let op = COMPARE_OPS
                    .iter()
                    .find(|o| op_symbol(**o) == args[0])
                    .ok_or_else(|| {
                        format!("compare: `{}` is not one of < <= > >= == !=", args[0])
                    })?;
                Ok(FilterSpec::Compare(*op, number(&args[1])?))
            }
            "threshold" => {
                want(2)?;
                let (high, low) = (number(&args[0])?, number(&args[1])?);
                if low > high {
                    return Err(format!("threshold: low {low} is above high {high}"));
                }
                Ok(FilterSpec::Threshold { high, low })
            }
            "cov" => {
                want(1)?;
                let d = number(&args[0])?;
                if d < 0.0 {
                    return Err(format!("cov: delta {d} is negative"));
                }
                Ok(FilterSpec::ChangeOfValue(d))
            }
            "rate" => {
                want(1)?;
                Ok(FilterSpec::Rate(duration(&args[0])?))
            }
            "expr" => {
                want(1)?;
                let e = expr::parse(&args[0])?;
                e.compile()?;
                Ok(FilterSpec::Expr(e))
            }
            other => Err(format!(
                "unknown filter `{other}` (compare, threshold, cov, rate, expr)"
            )),
        }
    }
}

/// A Rust callback filter: returns the value to pass on, or `None` to stop
/// the event here. Runs on the direct path's worker: it must not block.
pub type CallbackFn = Arc<dyn Fn(f64, &Event) -> Option<f64> + Send + Sync>;

/// A filter ready to run.
#[derive(Clone)]
pub enum Filter {
    /// A written filter (expressions compiled).
    Spec(FilterSpec, Option<Program>),
    /// A callback, with a name for listings.
    Callback(String, CallbackFn),
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::Spec(s, _) => write!(f, "{s}"),
            Filter::Callback(name, _) => write!(f, "callback({name})"),
        }
    }
}

impl Filter {
    /// A written filter.
    pub fn spec(s: FilterSpec) -> Result<Filter, String> {
        let prog = match &s {
            FilterSpec::Expr(e) => Some(e.compile()?),
            _ => None,
        };
        Ok(Filter::Spec(s, prog))
    }

    /// A callback filter.
    pub fn callback(
        name: &str,
        f: impl Fn(f64, &Event) -> Option<f64> + Send + Sync + 'static,
    ) -> Filter {
        Filter::Callback(name.to_string(), Arc::new(f))
    }

    /// Runs the filter on `value` with its per-link `state`.
    #[inline]
    pub fn apply(&self, state: &mut FilterState, value: f64, ev: &Event) -> Option<f64> {
        match self {
            Filter::Callback(_, f) => f(value, ev),
            Filter::Spec(FilterSpec::Compare(op, rhs), _) => {
                (op.apply(value, *rhs) != 0.0).then_some(value)
            }
            Filter::Spec(FilterSpec::Threshold { high, low }, _) => {
                let on = match state.on {
                    Some(true) if value <= *low => false,
                    Some(false) if value >= *high => true,
                    None if value >= *high => true,
                    None if value <= *low => false,
                    _ => return None,
                };
                if state.on == Some(on) {
                    return None;
                }
                state.on = Some(on);
                Some(if on { 1.0 } else { 0.0 })
            }
            Filter::Spec(FilterSpec::ChangeOfValue(delta), _) => {
                if state.last.is_some_and(|l| (value - l).abs() < *delta) {
                    return None;
                }
                state.last = Some(value);
                Some(value)
            }
            Filter::Spec(FilterSpec::Rate(interval), _) => {
                let t = ev.src_ns;
                if state
                    .last_ns
                    .is_some_and(|l| t.saturating_sub(l) < interval.as_nanos() as u64)
                {
                    return None;
                }
                state.last_ns = Some(t);
                Some(value)
            }
            Filter::Spec(FilterSpec::Expr(e), prog) => {
                let v = match prog {
                    Some(p) => p.eval(value),
                    None => e.eval(value),
                };
                v.is_finite().then_some(v)
            }
        }
    }
}

/// The memory of one filter on one link (owned by the worker).
#[derive(Clone, Copy, Debug, Default)]
pub struct FilterState {
    on: Option<bool>,
    last: Option<f64>,
    last_ns: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: &str, vals: &[(f64, u64)]) -> Vec<Option<f64>> {
        let f = Filter::spec(f.parse().unwrap()).unwrap();
        let mut st = FilterState::default();
        vals.iter()
            .map(|(v, t)| {
                let ev = Event {
                    input: 0,
                    value: *v,
                    src_ns: *t,
                    enq_ns: *t,
                };
                f.apply(&mut st, *v, &ev)
            })
            .collect()
    }

    fn at(vals: &[f64]) -> Vec<(f64, u64)> {
        vals.iter()
            .enumerate()
            .map(|(i, v)| (*v, i as u64 * 1_000_000))
            .collect()
    }

    #[test]
    fn threshold_has_hysteresis() {
        let got = run(
            "threshold(25, 23)",
            &at(&[20.0, 24.0, 25.0, 26.0, 24.0, 23.5, 23.0, 22.0, 25.5]),
        );
        assert_eq!(
            got,
            vec![
                Some(0.0),
                None,
                Some(1.0),
                None,
                None,
                None,
                Some(0.0),
                None,
                Some(1.0)
            ]
        );
    }

    #[test]
    fn compare_cov_rate_expr() {
        assert_eq!(
            run("compare(==, 0)", &at(&[0.0, 1.0, 0.0])),
            vec![Some(0.0), None, Some(0.0)]
        );
        assert_eq!(
            run("compare(>, 2.5)", &at(&[3.0, 2.5])),
            vec![Some(3.0), None]
        );
        assert_eq!(
            run("cov(0.5)", &at(&[1.0, 1.2, 1.5, 1.6, 0.9])),
            vec![Some(1.0), None, Some(1.5), None, Some(0.9)]
        );
        assert_eq!(
            run("rate(2ms)", &at(&[1.0, 2.0, 3.0, 4.0, 5.0])),
            vec![Some(1.0), None, Some(3.0), None, Some(5.0)]
        );
        assert_eq!(run("expr(x * 2 + 1)", &at(&[1.0])), vec![Some(3.0)]);
        assert_eq!(run("expr(sqrt(x))", &at(&[-1.0])), vec![None]);
        // no infinity reaches an output either (a PUT refuses it too)
        assert_eq!(run("expr(x / 0)", &at(&[1.0, -1.0])), vec![None, None]);
        assert_eq!(
            run("expr(1e308 * x)", &at(&[10.0, 0.5])),
            vec![None, Some(5e307)]
        );
    }

    #[test]
    fn bad_filters_are_explained() {
        for (s, why) in [
            ("threshold(1, 2)", "above high"),
            ("compare(=, 1)", "not one of"),
            ("cov(-1)", "negative"),
            ("rate(fast)", "unknown unit"),
            ("expr(y)", "unknown name"),
            ("median(3)", "unknown filter"),
            ("cov()", "takes 1 argument"),
        ] {
            let e = s.parse::<FilterSpec>().unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn callbacks_filter_and_map() {
        let f = Filter::callback("even", |v, _| (v as i64 % 2 == 0).then_some(v / 2.0));
        let mut st = FilterState::default();
        let ev = Event {
            input: 0,
            value: 0.0,
            src_ns: 0,
            enq_ns: 0,
        };
        assert_eq!(f.apply(&mut st, 4.0, &ev), Some(2.0));
        assert_eq!(f.apply(&mut st, 3.0, &ev), None);
        assert_eq!(f.to_string(), "callback(even)");
    }
}
