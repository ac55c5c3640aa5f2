//! Metrics that model code registers with `prometheus_client`, gathered from each stub at scrape
//! time, checked, labelled and merged into one family per name.
//!
//! Stubs are untrusted, so what one sends is checked before it reaches the page: at most
//! [`MAX_SAMPLES`] samples and [`MAX_TEXT_BYTES`] bytes of names, labels and HELP text per stub
//! (beyond that the stub's metrics are ignored), valid metric and label names, sample names that
//! fit the family's type, and histogram buckets and summary quantiles that parse. A family that
//! breaks a rule is left out; so is one whose name belongs to the server (`nv_*`, `tritium_*`),
//! to a `pb_utils.MetricFamily`, or to another model's family of a different type. Each problem
//! is handed to the caller, which logs it.
//!
//! Every series gets the labels `model`, `version` and `instance` of its stub; a label of the
//! model's own with one of those names is renamed `exported_<name>`, as Prometheus does with
//! clashing target labels. Families from several stubs with one name are written once (one HELP,
//! one TYPE: the first stub's), after the custom metrics, in name order.

use std::collections::{BTreeMap, BTreeSet};

use crate::text::{is_valid_label_name, is_valid_metric_name, Family, Number, SeriesValue};

/// Most samples taken from one stub per scrape.
pub const MAX_SAMPLES: usize = 10_000;
/// Most bytes of family names, HELP texts, sample names and labels taken from one stub per scrape.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// Name prefixes that belong to the server's own families.
const RESERVED_PREFIXES: [&str; 2] = ["nv_", "tritium_"];
/// The labels the server adds to every series.
const STUB_LABELS: [&str; 3] = ["instance", "model", "version"];

/// A `prometheus_client` family's type, in the text format's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ClientKind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl ClientKind {
    fn type_name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::Summary => "summary",
            Self::Untyped => "untyped",
        }
    }
}

/// One sample as the stub sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientSample {
    /// The sample's full name (`x_total`, `x_bucket`, `x_sum`).
    pub name: String,
    /// Its labels (`le` and `quantile` included).
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

/// One family as the stub sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientFamily {
    /// The family's name (a counter's ends in `_total`).
    pub name: String,
    /// HELP text.
    pub help: String,
    /// Type.
    pub kind: ClientKind,
    /// Samples.
    pub samples: Vec<ClientSample>,
}

/// What one stub answered at this scrape, with the labels of its series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StubFamilies {
    /// The model (label `model`).
    pub model: String,
    /// The version (label `version`).
    pub version: String,
    /// The instance (label `instance`).
    pub instance: String,
    /// Its families.
    pub families: Vec<ClientFamily>,
}

#[derive(Debug)]
enum Value {
    Scalar(f64),
    Histogram { bounds: Vec<f64>, counts: Vec<u64>, sum: f64, count: u64 },
    Summary { quantiles: Vec<(f64, f64)>, sum: f64, count: f64 },
}

type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Merged {
    help: String,
    kind: ClientKind,
    series: Vec<(Labels, Value)>,
}

/// Checks every stub's families and merges them by name; `ignored` gets the index of the stub
/// in `stubs` and why something of it was left out. `taken` holds names already on the page
/// (the custom metrics').
fn merge(
    stubs: &[StubFamilies],
    taken: &BTreeSet<String>,
    ignored: &mut dyn FnMut(usize, String),
) -> BTreeMap<String, Merged> {
    let mut merged: BTreeMap<String, Merged> = BTreeMap::new();
    for (index, stub) in stubs.iter().enumerate() {
        if let Err(why) = check_size(stub) {
            ignored(index, why);
            continue;
        }
        let mut seen = BTreeSet::new();
        for family in &stub.families {
            let name = &family.name;
            if !seen.insert(name.as_str()) {
                ignored(index, format!("metric family {name:?} was sent twice; the first is kept"));
                continue;
            }
            if !is_valid_metric_name(name) {
                ignored(index, format!("{name:?} is not a valid metric name"));
                continue;
            }
            if RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)) || taken.contains(name) {
                ignored(index, format!("metric family {name:?} has a name the server's metrics use"));
                continue;
            }
            if let Some(m) = merged.get(name) {
                if m.kind != family.kind {
                    ignored(
                        index,
                        format!(
                            "metric family {name:?} is a {} here and a {} in another model instance; the first one seen is kept",
                            family.kind.type_name(),
                            m.kind.type_name()
                        ),
                    );
                    continue;
                }
            }
            match series_of(stub, family) {
                Ok(series) => {
                    let m = merged.entry(name.clone()).or_insert_with(|| Merged {
                        help: family.help.clone(),
                        kind: family.kind,
                        series: Vec::new(),
                    });
                    m.series.extend(series);
                }
                Err(why) => ignored(index, format!("metric family {name:?}: {why}")),
            }
        }
    }
    merged
}

fn check_size(stub: &StubFamilies) -> Result<(), String> {
    let samples: usize = stub.families.iter().map(|f| f.samples.len()).sum();
    if samples > MAX_SAMPLES {
        return Err(format!("sent {samples} prometheus_client samples; at most {MAX_SAMPLES} are taken"));
    }
    let labels = |l: &Labels| l.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let bytes: usize = stub
        .families
        .iter()
        .map(|f| {
            f.name.len() + f.help.len() + f.samples.iter().map(|s| s.name.len() + labels(&s.labels)).sum::<usize>()
        })
        .sum();
    if bytes > MAX_TEXT_BYTES {
        return Err(format!("sent {bytes} bytes of prometheus_client metric text; at most {MAX_TEXT_BYTES} are taken"));
    }
    Ok(())
}

/// The stub's labels plus the sample's own (renamed where they clash), without `special`
/// (`le` or `quantile`), whose value is returned apart.
fn labels_of(
    stub: &StubFamilies,
    sample: &ClientSample,
    special: Option<&str>,
) -> Result<(Labels, Option<String>), String> {
    let mut labels: Labels = vec![
        ("instance".to_string(), stub.instance.clone()),
        ("model".to_string(), stub.model.clone()),
        ("version".to_string(), stub.version.clone()),
    ];
    let mut special_value = None;
    for (key, value) in &sample.labels {
        if !is_valid_label_name(key) {
            return Err(format!("{key:?} is not a valid label name"));
        }
        if Some(key.as_str()) == special {
            special_value = Some(value.clone());
            continue;
        }
        if key == "le" || key == "quantile" {
            return Err(format!("sample {:?} has the label {key:?}, which its type reserves", sample.name));
        }
        let key = if STUB_LABELS.contains(&key.as_str()) { format!("exported_{key}") } else { key.clone() };
        if labels.iter().any(|(k, _)| *k == key) {
            return Err(format!("sample {:?} has the label {key:?} twice", sample.name));
        }
        labels.push((key, value.clone()));
    }
    labels.sort();
    Ok((labels, special_value))
}

fn parse_bound(what: &str, text: Option<String>) -> Result<f64, String> {
    let text = text.ok_or_else(|| format!("a sample has no {what} label"))?;
    match text.as_str() {
        "+Inf" | "Inf" | "inf" => Ok(f64::INFINITY),
        "-Inf" | "-inf" => Ok(f64::NEG_INFINITY),
        t => t.parse::<f64>().ok().filter(|v| !v.is_nan()).ok_or_else(|| format!("{what}={t:?} is not a number")),
    }
}

/// A bucket count: a finite, non-negative whole number.
fn whole(value: f64) -> Result<u64, String> {
    if value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value < 9_007_199_254_740_992.0 {
        Ok(value as u64)
    } else {
        Err(format!("bucket count {value} is not a whole number"))
    }
}

#[derive(Default)]
struct Parts {
    buckets: Vec<(f64, f64)>,
    quantiles: Vec<(f64, f64)>,
    sum: Option<f64>,
    count: Option<f64>,
}

fn series_of(stub: &StubFamilies, family: &ClientFamily) -> Result<Vec<(Labels, Value)>, String> {
    let name = family.name.as_str();
    let suffix_of = |sample: &str| sample.strip_prefix(name).map(str::to_string);
    match family.kind {
        ClientKind::Counter | ClientKind::Gauge | ClientKind::Untyped => family
            .samples
            .iter()
            .map(|s| {
                if s.name != name {
                    return Err(format!("sample {:?} does not belong to it", s.name));
                }
                let (labels, _) = labels_of(stub, s, None)?;
                Ok((labels, Value::Scalar(s.value)))
            })
            .collect(),
        ClientKind::Histogram | ClientKind::Summary => {
            let histogram = family.kind == ClientKind::Histogram;
            let mut parts: BTreeMap<Labels, Parts> = BTreeMap::new();
            for s in &family.samples {
                let suffix = suffix_of(&s.name).unwrap_or_else(|| "?".to_string());
                let special = match (histogram, suffix.as_str()) {
                    (true, "_bucket") => Some("le"),
                    (false, "") => Some("quantile"),
                    (_, "_sum" | "_count") => None,
                    _ => return Err(format!("sample {:?} does not belong to it", s.name)),
                };
                let (labels, special_value) = labels_of(stub, s, special)?;
                let part = parts.entry(labels).or_default();
                match (special, suffix.as_str()) {
                    (Some("le"), _) => part.buckets.push((parse_bound("le", special_value)?, s.value)),
                    (Some(_), _) => part.quantiles.push((parse_bound("quantile", special_value)?, s.value)),
                    (None, "_sum") => part.sum = Some(s.value),
                    _ => part.count = Some(s.value),
                }
            }
            parts
                .into_iter()
                .map(|(labels, p)| {
                    let sum = p.sum.ok_or("a series has no _sum sample")?;
                    let value = if histogram { histogram_of(p.buckets, sum)? } else { summary_of(p, sum)? };
                    Ok((labels, value))
                })
                .collect()
        }
    }
}

/// A histogram from cumulative buckets: bounds strictly increasing, counts not decreasing,
/// ending with `+Inf` (whose count is the histogram's count).
fn histogram_of(mut buckets: Vec<(f64, f64)>, sum: f64) -> Result<Value, String> {
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some((last, total)) = buckets.pop() else { return Err("a series has no buckets".into()) };
    if last != f64::INFINITY {
        return Err("a series has no le=\"+Inf\" bucket".into());
    }
    let count = whole(total)?;
    let (mut bounds, mut counts, mut before, mut prev) = (Vec::new(), Vec::new(), 0u64, f64::NEG_INFINITY);
    for (bound, cumulative) in buckets {
        let cumulative = whole(cumulative)?;
        if bound <= prev || cumulative < before || cumulative > count {
            return Err("its buckets are not cumulative over increasing bounds".into());
        }
        bounds.push(bound);
        counts.push(cumulative - before);
        before = cumulative;
        prev = bound;
    }
    counts.push(count - before);
    Ok(Value::Histogram { bounds, counts, sum, count })
}

fn summary_of(mut p: Parts, sum: f64) -> Result<Value, String> {
    let count = p.count.ok_or("a series has no _count sample")?;
    p.quantiles.sort_by(|a, b| a.0.total_cmp(&b.0));
    if p.quantiles.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err("a series has a quantile twice".into());
    }
    Ok(Value::Summary { quantiles: p.quantiles, sum, count })
}

/// Writes the stubs' `prometheus_client` families to `out`, by name; `taken` holds the names
/// already on the page, and `ignored` gets what was left out (stub index, why).
pub(crate) fn render_to(
    out: &mut String,
    stubs: &[StubFamilies],
    taken: &BTreeSet<String>,
    ignored: &mut dyn FnMut(usize, String),
) {
    for (name, m) in merge(stubs, taken, ignored) {
        let mut family = Family::typed(&name, &m.help, m.kind.type_name());
        for (labels, value) in &m.series {
            let labels = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let value = match value {
                Value::Scalar(v) => SeriesValue::Scalar(Number::Float(*v)),
                Value::Histogram { bounds, counts, sum, count } => {
                    SeriesValue::Histogram { bounds, counts, sum: *sum, count: *count }
                }
                Value::Summary { quantiles, sum, count } => {
                    SeriesValue::Summary { quantiles, sum: *sum, count: *count }
                }
            };
            family.push(labels, value);
        }
        family.render(out);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> ClientSample {
        ClientSample {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            value,
        }
    }

    fn family(name: &str, kind: ClientKind, samples: Vec<ClientSample>) -> ClientFamily {
        ClientFamily { name: name.into(), help: format!("{name} help"), kind, samples }
    }

    fn stub(instance: &str, families: Vec<ClientFamily>) -> StubFamilies {
        StubFamilies { model: "m".into(), version: "1".into(), instance: instance.into(), families }
    }

    fn render(stubs: &[StubFamilies], taken: &[&str]) -> (String, Vec<(usize, String)>) {
        let mut out = String::new();
        let mut problems = Vec::new();
        let taken = taken.iter().map(|s| s.to_string()).collect();
        render_to(&mut out, stubs, &taken, &mut |i, why| problems.push((i, why)));
        (out, problems)
    }

    fn histogram(instance: &str) -> StubFamilies {
        stub(
            instance,
            vec![family(
                "lat",
                ClientKind::Histogram,
                vec![
                    sample("lat_bucket", &[("le", "0.5")], 1.0),
                    sample("lat_bucket", &[("le", "1.0")], 3.0),
                    sample("lat_bucket", &[("le", "+Inf")], 4.0),
                    sample("lat_count", &[], 4.0),
                    sample("lat_sum", &[], 2.5),
                ],
            )],
        )
    }

    #[test]
    fn families_of_several_instances_are_written_once_with_stub_labels() {
        let counter = |i: &str, v: f64| {
            stub(
                i,
                vec![family(
                    "request_count_total",
                    ClientKind::Counter,
                    vec![sample("request_count_total", &[("path", "a"), ("model", "x")], v)],
                )],
            )
        };
        let (out, problems) = render(&[counter("m_0", 2.0), counter("m_1", 3.0), histogram("m_0")], &[]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            out,
            "# HELP lat lat help\n\
             # TYPE lat histogram\n\
             lat_bucket{instance=\"m_0\",model=\"m\",version=\"1\",le=\"0.5\"} 1\n\
             lat_bucket{instance=\"m_0\",model=\"m\",version=\"1\",le=\"1\"} 3\n\
             lat_bucket{instance=\"m_0\",model=\"m\",version=\"1\",le=\"+Inf\"} 4\n\
             lat_sum{instance=\"m_0\",model=\"m\",version=\"1\"} 2.5\n\
             lat_count{instance=\"m_0\",model=\"m\",version=\"1\"} 4\n\
             # HELP request_count_total request_count_total help\n\
             # TYPE request_count_total counter\n\
             request_count_total{exported_model=\"x\",instance=\"m_0\",model=\"m\",path=\"a\",version=\"1\"} 2\n\
             request_count_total{exported_model=\"x\",instance=\"m_1\",model=\"m\",path=\"a\",version=\"1\"} 3\n"
        );
    }

    #[test]
    fn summaries_and_untyped_keep_their_type() {
        let s = stub(
            "i",
            vec![
                family(
                    "sz",
                    ClientKind::Summary,
                    vec![
                        sample("sz", &[("quantile", "0.5")], 7.0),
                        sample("sz_count", &[], 2.0),
                        sample("sz_sum", &[], 9.0),
                    ],
                ),
                family("u", ClientKind::Untyped, vec![sample("u", &[], -1.5)]),
            ],
        );
        let (out, problems) = render(&[s], &[]);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(
            out.contains("# TYPE sz summary\nsz{instance=\"i\",model=\"m\",version=\"1\",quantile=\"0.5\"} 7\n"),
            "{out}"
        );
        assert!(out.contains("sz_count{instance=\"i\",model=\"m\",version=\"1\"} 2\n"), "{out}");
        assert!(out.contains("# TYPE u untyped\nu{instance=\"i\",model=\"m\",version=\"1\"} -1.5\n"), "{out}");
    }

    #[test]
    fn bad_families_are_left_out_and_reported() {
        let bad = stub(
            "i",
            vec![
                family("nv_inference_count", ClientKind::Counter, vec![sample("nv_inference_count", &[], 1.0)]),
                family("custom", ClientKind::Gauge, vec![sample("custom", &[], 1.0)]),
                family("bad name", ClientKind::Gauge, vec![sample("bad name", &[], 1.0)]),
                family("g", ClientKind::Gauge, vec![sample("other", &[], 1.0)]),
                family("l", ClientKind::Gauge, vec![sample("l", &[("__x", "1")], 1.0)]),
                family("c", ClientKind::Counter, vec![sample("c", &[("le", "1")], 1.0)]),
                family(
                    "h",
                    ClientKind::Histogram,
                    vec![
                        sample("h_bucket", &[("le", "1")], 2.0),
                        sample("h_bucket", &[("le", "+Inf")], 1.0),
                        sample("h_sum", &[], 0.0),
                    ],
                ),
                family("ok", ClientKind::Gauge, vec![sample("ok", &[], 1.0)]),
            ],
        );
        let other = stub("j", vec![family("ok", ClientKind::Counter, vec![sample("ok", &[], 1.0)])]);
        let (out, problems) = render(&[bad, other], &["custom"]);
        assert_eq!(out, "# HELP ok ok help\n# TYPE ok gauge\nok{instance=\"i\",model=\"m\",version=\"1\"} 1\n");
        let stubs: Vec<usize> = problems.iter().map(|(i, _)| *i).collect();
        assert_eq!(stubs, [0, 0, 0, 0, 0, 0, 0, 1], "{problems:?}");
        assert!(problems[6].1.contains("not cumulative"), "{problems:?}");
        assert!(problems[7].1.contains("is a counter here and a gauge"), "{problems:?}");
    }

    #[test]
    fn too_much_from_one_stub_is_ignored_whole() {
        let samples = (0..=MAX_SAMPLES).map(|i| sample("g", &[("i", &i.to_string())], 1.0)).collect();
        let (out, problems) = render(&[stub("i", vec![family("g", ClientKind::Gauge, samples)]), histogram("j")], &[]);
        assert!(out.starts_with("# HELP lat"), "{out}");
        assert!(!out.contains("\ng{"), "{out}");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].1.contains("at most 10000"), "{problems:?}");
    }
}
