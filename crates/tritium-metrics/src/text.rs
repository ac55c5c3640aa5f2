//! The Prometheus text exposition format (0.0.4): name checks, escaping, number formatting, and
//! the one renderer every family on `/metrics` goes through, server and custom alike.
//!
//! A [`Family`] is a name, a HELP text, a kind and its series; [`Family::render`] writes the HELP
//! line (when the text is not empty), the TYPE line and one line per sample, series sorted by
//! their labels. A histogram series becomes cumulative `_bucket{le=...}` lines ending with
//! `le="+Inf"`, then `_sum` and `_count`. A family without series writes nothing.

use std::fmt::Write;

use crate::types::MetricKind;

/// The `Content-Type` of the page: Prometheus' text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A sample value: an exact integer (the server's counters, bucket counts) or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    /// Written as an integer, exactly, whatever its size.
    Int(u64),
    /// Written by [`push_value`].
    Float(f64),
}

/// The value of one series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum SeriesValue<'a> {
    /// A counter's or a gauge's value.
    Scalar(Number),
    /// A histogram: finite upper bounds (strictly increasing), observations per bucket (not
    /// cumulative; one more than the bounds, the last one for `+Inf`), their sum and count.
    Histogram { bounds: &'a [f64], counts: &'a [u64], sum: f64, count: u64 },
    /// A summary: `(quantile, value)` pairs, the sum and the count of its observations.
    Summary { quantiles: &'a [(f64, f64)], sum: f64, count: f64 },
}

/// One series of a family: its labels (name, value) and its value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Series<'a> {
    labels: Vec<(&'a str, &'a str)>,
    value: SeriesValue<'a>,
}

/// One metric family, ready to be written.
#[derive(Clone, Debug)]
pub(crate) struct Family<'a> {
    name: &'a str,
    help: &'a str,
    /// The TYPE line's type: `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    kind: &'static str,
    series: Vec<Series<'a>>,
}

impl<'a> Family<'a> {
    /// An empty family.
    pub(crate) fn new(name: &'a str, help: &'a str, kind: MetricKind) -> Self {
        Self::typed(name, help, kind.prometheus_type())
    }

    /// An empty family of the text format's type `kind` (`summary` and `untyped` included).
    pub(crate) fn typed(name: &'a str, help: &'a str, kind: &'static str) -> Self {
        Self { name, help, kind, series: Vec::new() }
    }

    /// The family's name.
    pub(crate) fn name(&self) -> &'a str {
        self.name
    }

    /// Adds a series; its labels are put in name order. The caller keeps histograms in
    /// histogram families and scalars in the others.
    pub(crate) fn push(&mut self, mut labels: Vec<(&'a str, &'a str)>, value: SeriesValue<'a>) {
        labels.sort_by(|a, b| a.0.cmp(b.0));
        self.series.push(Series { labels, value });
    }

    /// Writes the family to `out`: HELP (unless empty), TYPE, then the samples with the series
    /// sorted by labels. A label set given twice keeps its last value; no series, no output.
    pub(crate) fn render(mut self, out: &mut String) {
        if self.series.is_empty() {
            return;
        }
        // Stable, so among equal label sets the last pushed comes last and is the one kept.
        self.series.sort_by(|a, b| a.labels.cmp(&b.labels));
        let mut series: Vec<Series<'_>> = Vec::with_capacity(self.series.len());
        for one in self.series {
            match series.last_mut() {
                Some(last) if last.labels == one.labels => *last = one,
                _ => series.push(one),
            }
        }
        if !self.help.is_empty() {
            out.push_str("# HELP ");
            out.push_str(self.name);
            out.push(' ');
            push_help(out, self.help);
            out.push('\n');
        }
        out.push_str("# TYPE ");
        out.push_str(self.name);
        out.push(' ');
        out.push_str(self.kind);
        out.push('\n');
        for one in &series {
            match one.value {
                SeriesValue::Scalar(value) => push_sample(out, self.name, "", &one.labels, None, value),
                SeriesValue::Histogram { bounds, counts, sum, count } => {
                    let mut cumulative = 0u64;
                    for (bound, n) in bounds.iter().zip(counts) {
                        cumulative = cumulative.saturating_add(*n);
                        let le = Some(("le", *bound));
                        push_sample(out, self.name, "_bucket", &one.labels, le, Number::Int(cumulative));
                    }
                    let le = Some(("le", f64::INFINITY));
                    push_sample(out, self.name, "_bucket", &one.labels, le, Number::Int(count));
                    push_sample(out, self.name, "_sum", &one.labels, None, Number::Float(sum));
                    push_sample(out, self.name, "_count", &one.labels, None, Number::Int(count));
                }
                SeriesValue::Summary { quantiles, sum, count } => {
                    for (q, value) in quantiles {
                        push_sample(out, self.name, "", &one.labels, Some(("quantile", *q)), Number::Float(*value));
                    }
                    push_sample(out, self.name, "_sum", &one.labels, None, Number::Float(sum));
                    push_sample(out, self.name, "_count", &one.labels, None, Number::Float(count));
                }
            }
        }
    }
}

/// Writes one sample line: `name{labels,le="bound"} value` (the last label, `le` or `quantile`,
/// given as a number), without braces when there are no labels.
fn push_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    last: Option<(&str, f64)>,
    value: Number,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || last.is_some() {
        out.push('{');
        for (i, (key, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(key);
            out.push_str("=\"");
            push_label_value(out, value);
            out.push('"');
        }
        if let Some((key, le)) = last {
            if !labels.is_empty() {
                out.push(',');
            }
            out.push_str(key);
            out.push_str("=\"");
            push_value(out, le);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    match value {
        Number::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Number::Float(x) => push_value(out, x),
    }
    out.push('\n');
}

/// Whether `name` is a valid Prometheus metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`, not starting
/// with `__` (reserved for Prometheus' internal use). The same rule as prometheus-cpp's
/// `CheckMetricName`, which Triton uses.
pub(crate) fn is_valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':' => {}
        _ => return false,
    }
    !name.starts_with("__") && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with
/// `__` (prometheus-cpp's `CheckLabelName`).
pub(crate) fn is_valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    !name.starts_with("__") && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Appends a label value escaped for the text format: `\` as `\\`, `"` as `\"`, newline as `\n`.
pub(crate) fn push_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends a HELP text escaped for the text format: `\` as `\\`, newline as `\n`.
pub(crate) fn push_help(out: &mut String, help: &str) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends a sample value the way Prometheus parses it back exactly: integers without a
/// fraction (`3`, as Triton prints them), other finite values in Rust's shortest round-trip
/// form (`0.1`, `1e-7`), and `NaN`, `+Inf`, `-Inf`.
pub(crate) fn push_value(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.fract() == 0.0 && value.abs() < 9_007_199_254_740_992.0 {
        // Exactly representable integer (|v| < 2^53): print it without ".0".
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value:?}");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn value(v: f64) -> String {
        let mut s = String::new();
        push_value(&mut s, v);
        s
    }

    #[test]
    fn metric_names() {
        for ok in ["a", "_a", ":a", "a:b_c9", "requests_process_latency_ns", "A"] {
            assert!(is_valid_metric_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a b", "__a", "é", "a.b"] {
            assert!(!is_valid_metric_name(bad), "{bad}");
        }
    }

    #[test]
    fn label_names() {
        for ok in ["a", "_a", "model", "a9_b"] {
            assert!(is_valid_label_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a:b", "a-b", "__name__", "é"] {
            assert!(!is_valid_label_name(bad), "{bad}");
        }
    }

    #[test]
    fn values() {
        assert_eq!(value(0.0), "0");
        assert_eq!(value(-0.0), "0");
        assert_eq!(value(3.0), "3");
        assert_eq!(value(-7.0), "-7");
        assert_eq!(value(7.5), "7.5");
        assert_eq!(value(0.1), "0.1");
        assert_eq!(value(1e-7), "1e-7");
        assert_eq!(value(1e300), "1e300");
        assert_eq!(value(f64::NAN), "NaN");
        assert_eq!(value(f64::INFINITY), "+Inf");
        assert_eq!(value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(value(1e20).parse::<f64>().ok(), Some(1e20));
    }

    #[test]
    fn escaping() {
        let mut s = String::new();
        push_label_value(&mut s, "a\\b\"c\nd");
        assert_eq!(s, r#"a\\b\"c\nd"#);
        let mut h = String::new();
        push_help(&mut h, "a\\b\"c\nd");
        assert_eq!(h, r#"a\\b"c\nd"#);
    }

    fn render(family: Family<'_>) -> String {
        let mut out = String::new();
        family.render(&mut out);
        out
    }

    #[test]
    fn an_empty_family_writes_nothing() {
        assert_eq!(render(Family::new("nothing", "Help", MetricKind::Counter)), "");
    }

    #[test]
    fn scalars_with_help_type_escaping_and_sorted_series() {
        let mut family = Family::new("requests", "Requests\nseen \\ \"so far\"", MetricKind::Counter);
        family.push(vec![("version", "1"), ("model", "b")], SeriesValue::Scalar(Number::Int(u64::MAX)));
        family.push(vec![("model", "a \"q\"\n\\")], SeriesValue::Scalar(Number::Float(0.5)));
        family.push(vec![("model", "a")], SeriesValue::Scalar(Number::Float(1.0)));
        family.push(vec![], SeriesValue::Scalar(Number::Float(f64::NAN)));
        family.push(vec![("model", "a")], SeriesValue::Scalar(Number::Float(2.0)));
        assert_eq!(
            render(family),
            "# HELP requests Requests\\nseen \\\\ \"so far\"\n\
             # TYPE requests counter\n\
             requests NaN\n\
             requests{model=\"a\"} 2\n\
             requests{model=\"a \\\"q\\\"\\n\\\\\"} 0.5\n\
             requests{model=\"b\",version=\"1\"} 18446744073709551615\n"
        );
    }

    #[test]
    fn a_gauge_without_help_has_only_a_type_line() {
        let mut family = Family::new("temperature", "", MetricKind::Gauge);
        family.push(vec![("at", "x")], SeriesValue::Scalar(Number::Float(f64::NEG_INFINITY)));
        family.push(vec![("at", "y")], SeriesValue::Scalar(Number::Float(f64::INFINITY)));
        family.push(vec![("at", "z")], SeriesValue::Scalar(Number::Float(-1.25e-9)));
        assert_eq!(
            render(family),
            "# TYPE temperature gauge\n\
             temperature{at=\"x\"} -Inf\n\
             temperature{at=\"y\"} +Inf\n\
             temperature{at=\"z\"} -1.25e-9\n"
        );
    }

    #[test]
    fn histograms_have_cumulative_buckets_inf_sum_and_count() {
        let mut family = Family::new("latency", "Latency", MetricKind::Histogram);
        let bounds = [0.5, 1.0, 2.5];
        let counts = [1, 0, 2, 3];
        family.push(
            vec![("model", "m")],
            SeriesValue::Histogram { bounds: &bounds, counts: &counts, sum: 12.5, count: 6 },
        );
        family.push(vec![], SeriesValue::Histogram { bounds: &[], counts: &[0], sum: 0.0, count: 0 });
        assert_eq!(
            render(family),
            "# HELP latency Latency\n\
             # TYPE latency histogram\n\
             latency_bucket{le=\"+Inf\"} 0\n\
             latency_sum 0\n\
             latency_count 0\n\
             latency_bucket{model=\"m\",le=\"0.5\"} 1\n\
             latency_bucket{model=\"m\",le=\"1\"} 1\n\
             latency_bucket{model=\"m\",le=\"2.5\"} 3\n\
             latency_bucket{model=\"m\",le=\"+Inf\"} 6\n\
             latency_sum{model=\"m\"} 12.5\n\
             latency_count{model=\"m\"} 6\n"
        );
    }
}
