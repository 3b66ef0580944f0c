//! Simulated sensors and actuators.
//!
//! A [`SimSensor`] follows a [`Signal`] written as a call:
//!
//! | signal | meaning |
//! |---|---|
//! | `constant(V)` | always V |
//! | `sine(OFFSET, AMPLITUDE, PERIOD)` | OFFSET + AMPLITUDE·sin(2πt/PERIOD) |
//! | `walk(START, STEP, MIN, MAX)` | a random walk: each sample moves by up to ±STEP, kept in MIN..=MAX |
//! | `step(BEFORE, AFTER, AT)` | BEFORE until AT after the start, AFTER from then on |
//! | `square(LOW, HIGH, PERIOD)` | LOW for the first half of each period, HIGH for the second |
//! | `replay(FILE)` | the numbers of a CSV file (the last field of each line), one per sample, looped |
//!
//! Time-based signals are a function of the time since the sensor was
//! created, so a read between samples gives the current value; the walk and
//! the replay move one step per sample.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::now_ns;
use crate::driver::{DeviceError, Direction, Driver, EventFn, Running};
use crate::parse::{arg_count, duration, fmt_duration, fmt_number, number, split_call};

/// A simulated signal.
#[derive(Clone, Debug, PartialEq)]
pub enum Signal {
    /// Always this value.
    Constant(f64),
    /// `offset + amplitude * sin(2πt / period)`.
    Sine {
        /// Mean value.
        offset: f64,
        /// Peak deviation.
        amplitude: f64,
        /// Period (positive).
        period: Duration,
    },
    /// A bounded random walk, one step per sample.
    Walk {
        /// First value.
        start: f64,
        /// Largest move per sample.
        step: f64,
        /// Lower bound.
        min: f64,
        /// Upper bound (>= min).
        max: f64,
    },
    /// A single step.
    Step {
        /// Value before `at`.
        before: f64,
        /// Value from `at` on.
        after: f64,
        /// When the step happens, after the start.
        at: Duration,
    },
    /// A square wave.
    Square {
        /// First half-period's value.
        low: f64,
        /// Second half-period's value.
        high: f64,
        /// Period (positive).
        period: Duration,
    },
    /// Values replayed from a CSV file.
    Replay {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |v: &f64| fmt_number(*v);
        match self {
            Signal::Constant(v) => write!(f, "constant({})", n(v)),
            Signal::Sine {
                offset,
                amplitude,
                period,
            } => write!(
                f,
                "sine({}, {}, {})",
                n(offset),
                n(amplitude),
                fmt_duration(*period)
            ),
            Signal::Walk {
                start,
                step,
                min,
                max,
            } => write!(f, "walk({}, {}, {}, {})", n(start), n(step), n(min), n(max)),
            Signal::Step { before, after, at } => {
                write!(
                    f,
                    "step({}, {}, {})",
                    n(before),
                    n(after),
                    fmt_duration(*at)
                )
            }
            Signal::Square { low, high, period } => {
                write!(
                    f,
                    "square({}, {}, {})",
                    n(low),
                    n(high),
                    fmt_duration(*period)
                )
            }
            Signal::Replay { path } => write!(f, "replay({})", path.display()),
        }
    }
}

impl std::str::FromStr for Signal {
    type Err = String;

    /// Parses the call syntax of the module documentation.
    fn from_str(s: &str) -> Result<Signal, String> {
        let (name, args) = split_call(s)?;
        let want = |k: usize| arg_count(&name, &args, k);
        let positive = |d: Duration, what: &str| -> Result<Duration, String> {
            if d.is_zero() {
                Err(format!("the {what} of `{name}` must be positive"))
            } else {
                Ok(d)
            }
        };
        match name.as_str() {
            "constant" => {
                want(1)?;
                Ok(Signal::Constant(number(&args[0])?))
            }
            "sine" => {
                want(3)?;
                Ok(Signal::Sine {
                    offset: number(&args[0])?,
                    amplitude: number(&args[1])?,
                    period: positive(duration(&args[2])?, "period")?,
                })
            }
            "walk" => {
                want(4)?;
                let (start, step, min, max) = (
                    number(&args[0])?,
                    number(&args[1])?,
                    number(&args[2])?,
                    number(&args[3])?,
                );
                if min > max {
                    return Err(format!("walk: min {min} is above max {max}"));
                }
                if step < 0.0 {
                    return Err(format!("walk: step {step} is negative"));
                }
                Ok(Signal::Walk {
                    start,
                    step,
                    min,
                    max,
                })
            }
            "step" => {
                want(3)?;
                Ok(Signal::Step {
                    before: number(&args[0])?,
                    after: number(&args[1])?,
                    at: duration(&args[2])?,
                })
            }
            "square" => {
                want(3)?;
                Ok(Signal::Square {
                    low: number(&args[0])?,
                    high: number(&args[1])?,
                    period: positive(duration(&args[2])?, "period")?,
                })
            }
            "replay" => {
                want(1)?;
                if args[0].is_empty() {
                    return Err("replay needs a file name".into());
                }
                Ok(Signal::Replay {
                    path: PathBuf::from(&args[0]),
                })
            }
            other => Err(format!(
                "unknown signal `{other}` (constant, sine, walk, step, square, replay)"
            )),
        }
    }
}

/// Reads the numbers of a CSV file: the last comma-separated field of each
/// line that has a number there (a header and blank lines are skipped).
pub fn read_replay(path: &std::path::Path) -> Result<Vec<f64>, DeviceError> {
    let text = std::fs::read_to_string(path).map_err(|source| DeviceError::Io {
        what: format!("reading {}", path.display()),
        cause: source,
    })?;
    let values: Vec<f64> = text
        .lines()
        .filter_map(|l| l.rsplit(',').next().and_then(|v| number(v).ok()))
        .collect();
    if values.is_empty() {
        return Err(DeviceError::NotANumber {
            path: path.display().to_string(),
            text: "no line ends in a number".into(),
        });
    }
    Ok(values)
}

/// The moving part of a signal.
struct State {
    last: f64,
    rng: u64,
    replay: Vec<f64>,
    index: usize,
}

struct SimInner {
    signal: Signal,
    period: Duration,
    t0: u64,
    state: Mutex<State>,
}

impl SimInner {
    fn at(&self, t_ns: u64) -> Option<f64> {
        let t = t_ns.saturating_sub(self.t0) as f64 * 1e-9;
        match &self.signal {
            Signal::Constant(v) => Some(*v),
            Signal::Sine {
                offset,
                amplitude,
                period,
            } => {
                Some(offset + amplitude * (std::f64::consts::TAU * t / period.as_secs_f64()).sin())
            }
            Signal::Step { before, after, at } => Some(if t < at.as_secs_f64() {
                *before
            } else {
                *after
            }),
            Signal::Square { low, high, period } => {
                let p = period.as_secs_f64();
                Some(if (t % p) < p / 2.0 { *low } else { *high })
            }
            Signal::Walk { .. } | Signal::Replay { .. } => None,
        }
    }

    /// Takes one sample: time-based signals at `t_ns`, the walk and the
    /// replay one step further.
    fn sample(&self, t_ns: u64) -> f64 {
        let mut st = self.state.lock();
        let v = match (&self.signal, self.at(t_ns)) {
            (_, Some(v)) => v,
            (Signal::Walk { step, min, max, .. }, None) => {
                // xorshift64*: a uniform move in [-step, step]
                st.rng ^= st.rng >> 12;
                st.rng ^= st.rng << 25;
                st.rng ^= st.rng >> 27;
                let r = st.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
                let u = r as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                (st.last + u * step).clamp(*min, *max)
            }
            _ => {
                let v = st.replay[st.index % st.replay.len()];
                st.index = st.index.wrapping_add(1);
                v
            }
        };
        st.last = v;
        v
    }
}

/// A simulated sensor sampling its [`Signal`] every `period`.
#[derive(Clone)]
pub struct SimSensor {
    inner: Arc<SimInner>,
}

impl SimSensor {
    /// A sensor following `signal`, sampled every `period` once started.
    /// `seed` makes a random walk repeatable. Reads the replay file now.
    pub fn new(signal: Signal, period: Duration, seed: u64) -> Result<SimSensor, DeviceError> {
        let (first, replay) = match &signal {
            Signal::Replay { path } => {
                let v = read_replay(path)?;
                (v[0], v)
            }
            Signal::Walk {
                start, min, max, ..
            } => (start.clamp(*min, *max), Vec::new()),
            _ => (0.0, Vec::new()),
        };
        let inner = Arc::new(SimInner {
            signal,
            period: period.max(Duration::from_micros(100)),
            t0: now_ns(),
            state: Mutex::new(State {
                last: first,
                rng: seed | 1,
                replay,
                index: 0,
            }),
        });
        if let Some(v) = inner.at(inner.t0) {
            inner.state.lock().last = v;
        }
        Ok(SimSensor { inner })
    }

    /// The signal.
    pub fn signal(&self) -> &Signal {
        &self.inner.signal
    }

    /// Takes a sample now (what the event thread does every period).
    pub fn sample(&self) -> f64 {
        self.inner.sample(now_ns())
    }
}

impl Driver for SimSensor {
    fn kind(&self) -> &'static str {
        "sim-sensor"
    }

    fn direction(&self) -> Direction {
        Direction::Sensor
    }

    fn read(&self) -> Result<f64, DeviceError> {
        Ok(self
            .inner
            .at(now_ns())
            .unwrap_or_else(|| self.inner.state.lock().last))
    }

    fn start(&self, events: EventFn) -> Result<Option<Running>, DeviceError> {
        let inner = self.inner.clone();
        // One shared thread samples every simulated sensor, at multiples
        // of the period (see `ticker`).
        crate::ticker::every("sim-sensor", inner.period, move |t| {
            let v = inner.sample(t);
            events(v, t);
        })
        .map(Some)
    }
}

/// A simulated actuator: remembers what was written and how often.
#[derive(Default)]
pub struct SimActuator {
    value: AtomicU64,
    writes: AtomicU64,
}

impl SimActuator {
    /// An actuator at 0.
    pub fn new() -> SimActuator {
        SimActuator::default()
    }

    /// Writes so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// The last value, without the `Result`.
    pub fn value(&self) -> f64 {
        f64::from_bits(self.value.load(Ordering::Relaxed))
    }
}

impl Driver for SimActuator {
    fn kind(&self) -> &'static str {
        "sim-actuator"
    }

    fn direction(&self) -> Direction {
        Direction::Actuator
    }

    fn read(&self) -> Result<f64, DeviceError> {
        Ok(self.value())
    }

    fn write(&self, value: f64) -> Result<(), DeviceError> {
        self.value.store(value.to_bits(), Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn signals_parse_with_reasons() {
        assert_eq!(
            "sine(22, 3, 60s)".parse::<Signal>(),
            Ok(Signal::Sine {
                offset: 22.0,
                amplitude: 3.0,
                period: Duration::from_secs(60)
            })
        );
        for (s, why) in [
            ("sine(1, 2)", "takes 3 arguments"),
            ("sine(1, 2, 0s)", "must be positive"),
            ("walk(0, 1, 5, 4)", "above max"),
            ("walk(0, -1, 0, 4)", "negative"),
            ("noise(1)", "unknown signal"),
            ("constant(x)", "not a finite number"),
            ("replay()", "takes 1 argument"),
        ] {
            let e = s.parse::<Signal>().unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn walk_stays_in_bounds_and_moves() {
        let s = SimSensor::new(
            Signal::Walk {
                start: 20.0,
                step: 0.5,
                min: 19.0,
                max: 21.0,
            },
            Duration::from_millis(1),
            7,
        )
        .unwrap();
        let vals: Vec<f64> = (0..2000).map(|_| s.sample()).collect();
        assert!(vals.iter().all(|v| (19.0..=21.0).contains(v)));
        assert!(vals.windows(2).all(|w| (w[1] - w[0]).abs() <= 0.5 + 1e-12));
        let distinct = vals
            .iter()
            .map(|v| v.to_bits())
            .collect::<std::collections::HashSet<_>>();
        assert!(distinct.len() > 100, "the walk moves");
        assert_eq!(s.read().unwrap(), *vals.last().unwrap());
    }

    #[test]
    fn time_signals_follow_their_formula() {
        let s = SimSensor::new(
            Signal::Step {
                before: 1.0,
                after: 2.0,
                at: Duration::from_millis(30),
            },
            Duration::from_millis(1),
            0,
        )
        .unwrap();
        assert_eq!(s.read().unwrap(), 1.0);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(s.read().unwrap(), 2.0);
        let sine = SimInner {
            signal: Signal::Sine {
                offset: 10.0,
                amplitude: 2.0,
                period: Duration::from_secs(4),
            },
            period: Duration::from_secs(1),
            t0: 0,
            state: Mutex::new(State {
                last: 0.0,
                rng: 1,
                replay: vec![],
                index: 0,
            }),
        };
        assert!((sine.at(1_000_000_000).unwrap() - 12.0).abs() < 1e-9);
        assert!((sine.at(3_000_000_000).unwrap() - 8.0).abs() < 1e-9);
    }

    #[test]
    fn replay_loops_over_the_file_and_ticks_deliver_events() {
        let dir = std::env::temp_dir().join(format!("mintgate-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("r.csv");
        std::fs::write(&f, "t,value\n0,1.5\n1,2.5\n\n2,3.5\n").unwrap();
        let s = SimSensor::new(
            Signal::Replay { path: f.clone() },
            Duration::from_millis(2),
            0,
        )
        .unwrap();
        let got: Vec<f64> = (0..4).map(|_| s.sample()).collect();
        assert_eq!(got, vec![1.5, 2.5, 3.5, 1.5]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let run = s
            .start(Arc::new(move |v, t| s2.lock().push((v, t))))
            .unwrap()
            .expect("a sim sensor ticks");
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while seen.lock().len() < 5 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(run);
        let seen = seen.lock().clone();
        assert!(seen.len() >= 5, "{seen:?}");
        assert!(
            seen.windows(2).all(|w| w[1].1 > w[0].1),
            "timestamps increase"
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(SimSensor::new(
            Signal::Replay {
                path: dir.join("none")
            },
            Duration::from_secs(1),
            0
        )
        .is_err());
    }

    #[test]
    fn actuator_remembers_and_counts() {
        let a = SimActuator::new();
        a.write(1.0).unwrap();
        a.write(-3.25).unwrap();
        assert_eq!(a.read().unwrap(), -3.25);
        assert_eq!(a.writes(), 2);
        assert!(matches!(
            SimSensor::new(Signal::Constant(1.0), Duration::from_secs(1), 0)
                .unwrap()
                .write(1.0),
            Err(DeviceError::NotWritable)
        ));
    }

    fn finite() -> impl Strategy<Value = f64> {
        proptest::num::f64::NORMAL | proptest::num::f64::ZERO
    }

    fn dur() -> impl Strategy<Value = Duration> {
        (1u64..86_400_000).prop_map(Duration::from_millis)
    }

    fn signal() -> impl Strategy<Value = Signal> {
        prop_oneof![
            finite().prop_map(Signal::Constant),
            (finite(), finite(), dur()).prop_map(|(offset, amplitude, period)| Signal::Sine {
                offset,
                amplitude,
                period
            }),
            (finite(), 0.0..1e6f64, finite(), finite()).prop_map(|(start, step, a, b)| {
                Signal::Walk {
                    start,
                    step,
                    min: a.min(b),
                    max: a.max(b),
                }
            }),
            (finite(), finite(), dur()).prop_map(|(before, after, at)| Signal::Step {
                before,
                after,
                at
            }),
            (finite(), finite(), dur()).prop_map(|(low, high, period)| Signal::Square {
                low,
                high,
                period
            }),
            "[a-z0-9_./-]{1,20}".prop_map(|p| Signal::Replay { path: p.into() }),
        ]
    }

    proptest! {
        #[test]
        fn signal_syntax_round_trips(s in signal()) {
            let text = s.to_string();
            prop_assert_eq!(text.parse::<Signal>(), Ok(s), "{}", text);
        }

        #[test]
        fn signal_parser_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Signal>();
        }
    }
}
