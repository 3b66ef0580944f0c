//! The one way mintgate writes metrics: prometheus-client's encoders, fed on
//! each scrape by collectors that read the counters where they already live
//! (atomics beside the code that counts, no second copy to keep in step).
//!
//! Every module that has something to expose writes it through an
//! [`Exposition`]: a family is a name, a help text, a type and its samples.
//! The format (Prometheus text 0.0.4 or OpenMetrics 1.0, chosen by the
//! scraper's `Accept`) is prometheus-client's, and so is the escaping of
//! help texts and label values (backslash, double quote and newline).
//!
//! Names are written in full in the code, counters with their `_total`, so
//! that a name found on `/metrics` can be found by `grep` in the source; the
//! suffix is taken off before prometheus-client puts it back.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// A numeric sample: counters and gauges keep integers exact, and fractions
/// (seconds, ratios) are written as floats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    /// A whole number.
    Int(u64),
    /// A fraction.
    Float(f64),
}

impl From<u64> for Num {
    fn from(v: u64) -> Num {
        Num::Int(v)
    }
}

impl From<usize> for Num {
    fn from(v: usize) -> Num {
        Num::Int(v as u64)
    }
}

impl From<u32> for Num {
    fn from(v: u32) -> Num {
        Num::Int(u64::from(v))
    }
}

impl From<bool> for Num {
    fn from(v: bool) -> Num {
        Num::Int(u64::from(v))
    }
}

impl From<f64> for Num {
    fn from(v: f64) -> Num {
        Num::Float(v)
    }
}

/// The families of one scrape, written into prometheus-client's encoder.
///
/// Writing goes to a `String`, so it cannot fail in practice; the first
/// error is kept and returned by [`Exposition::finish`] all the same, and
/// what follows it is skipped.
pub struct Exposition<'a> {
    enc: DescriptorEncoder<'a>,
    err: fmt::Result,
}

/// A counter's descriptor name: the family name without `_total`.
fn counter_base(name: &str) -> &str {
    debug_assert!(name.ends_with("_total"), "a counter ends in _total: {name}");
    name.strip_suffix("_total").unwrap_or(name)
}

impl<'a> Exposition<'a> {
    /// Wraps the encoder a [`prometheus_client::collector::Collector`] is given.
    pub fn new(enc: DescriptorEncoder<'a>) -> Exposition<'a> {
        Exposition { enc, err: Ok(()) }
    }

    /// The first error met, if any.
    pub fn finish(self) -> fmt::Result {
        self.err
    }

    fn family(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        body: impl FnOnce(&mut MetricEncoder) -> fmt::Result,
    ) {
        if self.err.is_err() {
            return;
        }
        let base = match kind {
            MetricType::Counter => counter_base(name),
            _ => name,
        };
        self.err = self
            .enc
            .encode_descriptor(base, help, None, kind)
            .and_then(|mut m| body(&mut m));
    }

    /// One unlabelled counter; `name` ends in `_total`.
    pub fn counter(&mut self, name: &str, help: &str, v: impl Into<Num>) {
        let v = v.into();
        self.family(name, help, MetricType::Counter, |m| sample(m, true, v));
    }

    /// One unlabelled gauge.
    pub fn gauge(&mut self, name: &str, help: &str, v: impl Into<Num>) {
        let v = v.into();
        self.family(name, help, MetricType::Gauge, |m| sample(m, false, v));
    }

    /// Unlabelled families of integers: a name ending in `_total` is a
    /// counter, any other a gauge.
    pub fn families(&mut self, families: &[(&str, &str, u64)]) {
        for (name, help, v) in families {
            if name.ends_with("_total") {
                self.counter(name, help, *v);
            } else {
                self.gauge(name, help, *v);
            }
        }
    }

    /// A counter family with one label: one sample per `(label value, count)`.
    pub fn counters<L: AsRef<str>>(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        rows: impl IntoIterator<Item = (L, u64)>,
    ) {
        self.labelled(name, help, MetricType::Counter, label, rows);
    }

    /// A gauge family with one label: one sample per `(label value, value)`.
    pub fn gauges<L: AsRef<str>, V: Into<Num>>(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        rows: impl IntoIterator<Item = (L, V)>,
    ) {
        self.labelled(name, help, MetricType::Gauge, label, rows);
    }

    fn labelled<L: AsRef<str>, V: Into<Num>>(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        label: &str,
        rows: impl IntoIterator<Item = (L, V)>,
    ) {
        let counter = matches!(kind, MetricType::Counter);
        self.family(name, help, kind, |m| {
            for (l, v) in rows {
                let labels = [(label, l.as_ref())];
                sample(&mut m.encode_family(&labels)?, counter, v.into())?;
            }
            Ok(())
        });
    }

    /// A gauge family whose samples carry several labels each.
    pub fn gauges_by(&mut self, name: &str, help: &str, rows: &[(Vec<(&str, &str)>, Num)]) {
        self.family(name, help, MetricType::Gauge, |m| {
            for (labels, v) in rows {
                sample(&mut m.encode_family(labels)?, false, *v)?;
            }
            Ok(())
        });
    }

    /// A histogram: `buckets` are `(upper bound, count in that bucket
    /// alone)`, in increasing order; the `+Inf` bucket is added from
    /// `count` (prometheus-client's OpenMetrics encoder writes only the
    /// buckets it is given, and OpenMetrics requires `+Inf`).
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        sum: f64,
        count: u64,
        buckets: &[(f64, u64)],
    ) {
        let mut all = buckets.to_vec();
        if all.last().is_none_or(|(b, _)| *b != f64::INFINITY) {
            let below: u64 = buckets.iter().map(|(_, n)| n).sum();
            all.push((f64::INFINITY, count.saturating_sub(below)));
        }
        self.family(name, help, MetricType::Histogram, |m| {
            m.encode_histogram::<NoLabelSet>(sum, count, &all, None)
        });
    }

    /// An info family: `name` without `_info`, which is added, and one
    /// sample of value 1 with `labels`.
    pub fn info(&mut self, name: &str, help: &str, labels: &[(&str, &str)]) {
        self.family(name, help, MetricType::Info, |m| m.encode_info(&labels));
    }
}

fn sample(m: &mut MetricEncoder, counter: bool, v: Num) -> fmt::Result {
    match (counter, v) {
        (true, Num::Int(v)) => m.encode_counter::<NoLabelSet, _, u64>(&v, None),
        (true, Num::Float(v)) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
        (false, Num::Int(v)) => m.encode_gauge(&v),
        (false, Num::Float(v)) => m.encode_gauge(&v),
    }
}

/// A [`prometheus_client::collector::Collector`] over a closure that writes
/// families: how a scrape reaches every module's counters.
pub struct FnCollector<F>(pub F);

impl<F> fmt::Debug for FnCollector<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnCollector")
    }
}

impl<F> prometheus_client::collector::Collector for FnCollector<F>
where
    F: Fn(&mut Exposition) + Send + Sync + 'static,
{
    fn encode(&self, enc: DescriptorEncoder) -> fmt::Result {
        let mut m = Exposition::new(enc);
        (self.0)(&mut m);
        m.finish()
    }
}

/// The exposition formats a scraper may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (the default).
    Prometheus,
    /// OpenMetrics 1.0 text, for a scraper whose `Accept` names it.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text`, the Prometheus text format otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Writes everything `collect` writes in `format`.
pub fn render<F>(format: Format, collect: F) -> String
where
    F: Fn(&mut Exposition) + Send + Sync + 'static,
{
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(FnCollector(collect)));
    let mut out = String::with_capacity(16 * 1024);
    let written = match format {
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        }
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
    };
    if let Err(e) = written {
        tracing::warn!(error = %e, "metrics exposition cut short");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(format: Format, f: impl Fn(&mut Exposition) + Send + Sync + 'static) -> String {
        render(format, f)
    }

    #[test]
    fn counters_keep_their_total_and_gauges_their_name() {
        let t = text(Format::Prometheus, |m| {
            m.counter("a_things_total", "Things.", 3u64);
            m.gauge("a_level", "Level.", 2.5);
            m.families(&[("b_total", "B.", 7), ("c", "C.", 1)]);
        });
        assert!(
            t.contains("# TYPE a_things_total counter\na_things_total 3\n"),
            "{t}"
        );
        assert!(t.contains("# HELP a_things_total Things.\n"), "{t}");
        assert!(t.contains("# TYPE a_level gauge\na_level 2.5\n"), "{t}");
        assert!(
            t.contains("b_total 7\n") && t.contains("# TYPE c gauge\nc 1\n"),
            "{t}"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let t = text(Format::Prometheus, |m| {
            m.counters(
                "x_total",
                "Help with \\ and\nnewline.",
                "name",
                [("a\"b\\c\nd", 1)],
            );
        });
        assert!(t.contains("x_total{name=\"a\\\"b\\\\c\\nd\"} 1\n"), "{t}");
        assert!(
            t.contains("# HELP x_total Help with \\\\ and\\nnewline.\n"),
            "{t}"
        );
        // nothing but the family's lines
        assert_eq!(t.lines().count(), 3, "{t}");
    }

    #[test]
    fn openmetrics_names_the_counter_family_without_total_and_ends_with_eof() {
        let t = text(Format::OpenMetrics, |m| {
            m.counter("a_things_total", "Things.", 3u64);
            m.info("build", "The build.", &[("version", "1.2.3")]);
        });
        assert!(
            t.contains("# TYPE a_things counter\na_things_total 3\n"),
            "{t}"
        );
        assert!(t.contains("build_info{version=\"1.2.3\"} 1\n"), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn histograms_are_cumulative_with_inf() {
        let t = text(Format::Prometheus, |m| {
            m.histogram("h_seconds", "H.", 0.5, 4, &[(0.1, 1), (1.0, 2)]);
        });
        for line in [
            "h_seconds_bucket{le=\"0.1\"} 1\n",
            "h_seconds_bucket{le=\"1\"} 3\n",
            "h_seconds_bucket{le=\"+Inf\"} 4\n",
            "h_seconds_sum 0.5\n",
            "h_seconds_count 4\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
    }

    #[test]
    fn openmetrics_histograms_have_inf_too() {
        let t = text(Format::OpenMetrics, |m| {
            m.histogram("h_seconds", "H.", 0.5, 4, &[(0.1, 1), (1.0, 2)]);
        });
        assert!(t.contains("h_seconds_bucket{le=\"+Inf\"} 4\n"), "{t}");
        assert_eq!(t.matches("+Inf").count(), 1, "{t}");
    }

    #[test]
    fn the_accept_header_chooses_the_format() {
        assert_eq!(Format::from_accept(None), Format::Prometheus);
        assert_eq!(Format::from_accept(Some("text/plain")), Format::Prometheus);
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Format::OpenMetrics
        );
    }
}
