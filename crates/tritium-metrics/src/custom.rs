//! Custom metrics that model code creates with `pb_utils.MetricFamily`, with Triton's rules.
//!
//! Triton's Python backend forwards each `MetricFamily`/`Metric` call of a stub to the
//! `TRITONSERVER_MetricFamily*`/`TRITONSERVER_Metric*` API of Triton's core, which keeps them in
//! its prometheus-cpp registry (v1.0.1). The rules below are that API's, and the error texts that
//! begin with Triton's words are Triton's (core `src/metric_family.cc`, `src/tritonserver.cc`,
//! prometheus-cpp `core/src/registry.cc`, `core/src/family.cc`):
//!
//! - A family is identified by its name. Creating one with a name that exists and the same kind
//!   shares it (same id, one more reference); the first description is kept, as in Triton. The
//!   same name with another kind is refused.
//! - A metric is identified by its family and its label set. Creating one with labels that exist
//!   shares it (same id, one more reference); for a histogram the first buckets are kept.
//! - A family or metric disappears when its last reference is dropped; a family with no metrics
//!   is not rendered. A family's last reference cannot be dropped while it still has metrics.
//!
//! Beyond Triton, names that would corrupt the exposition are refused: the server's own metric
//! names, the `le` label on histograms, and unsorted or NaN bucket bounds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tritium_sync::Locked;

use crate::text::{self, is_valid_label_name, is_valid_metric_name, Number, SeriesValue};
use crate::types::{MetricError, MetricKind, MetricOp};

/// Label pairs sorted by name, the identity of a metric within its family.
type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Family {
    name: String,
    kind: MetricKind,
    description: String,
    refs: u64,
    /// The family's metrics by label set; sorted, so rendering is deterministic.
    members: BTreeMap<Labels, u64>,
}

#[derive(Debug)]
struct Series {
    family: u64,
    labels: Labels,
    kind: MetricKind,
    refs: u64,
    value: Value,
}

#[derive(Debug)]
enum Value {
    Scalar(f64),
    Histogram(Histogram),
}

#[derive(Debug)]
struct Histogram {
    /// Finite bucket upper bounds, strictly increasing; `+Inf` is implied.
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); one more than `bounds`, the last is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, value: f64) {
        // Prometheus buckets are `le` (less or equal); NaN lands in +Inf only.
        let index = self.bounds.iter().position(|bound| value <= *bound).unwrap_or(self.bounds.len());
        if let Some(slot) = self.counts.get_mut(index) {
            *slot += 1;
        }
        self.sum += value;
        self.count += 1;
    }
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    by_name: HashMap<String, u64>,
    families: HashMap<u64, Family>,
    series: HashMap<u64, Series>,
}

impl Registry {
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn series_mut(&mut self, metric: u64) -> Result<&mut Series, MetricError> {
        self.series.get_mut(&metric).ok_or(MetricError::UnknownMetric(metric))
    }
}

/// The custom metrics of all models: a thread-safe, cheaply cloneable registry (clones share it).
///
/// Ids are never reused: an id that was fully released stays unknown even if a family or metric
/// with the same name or labels is created again.
#[derive(Clone, Debug, Default)]
pub struct CustomMetrics {
    inner: Arc<Mutex<Registry>>,
    reserved: Arc<[&'static str]>,
}

impl CustomMetrics {
    /// An empty registry that refuses no family name beyond the invalid ones.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry that also refuses the given family names (the server's own metrics).
    pub fn with_reserved_names(reserved: &[&'static str]) -> Self {
        Self { inner: Arc::default(), reserved: reserved.into() }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.inner.locked()
    }

    /// Creates the family `name`, or takes one more reference to it if it exists with the same
    /// kind; returns its id. Triton keeps the first description when they differ.
    pub fn family(&self, name: &str, description: &str, kind: MetricKind) -> Result<u64, MetricError> {
        if !is_valid_metric_name(name) {
            return Err(MetricError::InvalidName(name.to_owned()));
        }
        if self.reserved.contains(&name) {
            return Err(MetricError::ReservedName(name.to_owned()));
        }
        let mut registry = self.lock();
        if let Some(&id) = registry.by_name.get(name) {
            if let Some(family) = registry.families.get_mut(&id) {
                if family.kind != kind {
                    return Err(MetricError::KindMismatch {
                        name: name.to_owned(),
                        existing: family.kind,
                        requested: kind,
                    });
                }
                if family.description != description {
                    tracing::warn!(
                        family = name,
                        kept = %family.description,
                        ignored = description,
                        "metric family created again with another description; keeping the first, as Triton does"
                    );
                }
                family.refs += 1;
                return Ok(id);
            }
        }
        let id = registry.new_id();
        registry.by_name.insert(name.to_owned(), id);
        registry.families.insert(
            id,
            Family {
                name: name.to_owned(),
                kind,
                description: description.to_owned(),
                refs: 1,
                members: BTreeMap::new(),
            },
        );
        Ok(id)
    }

    /// Drops one reference to a family; the family goes away with its last reference, which
    /// is refused while the family still has metrics.
    pub fn drop_family(&self, family: u64) -> Result<(), MetricError> {
        let mut registry = self.lock();
        let entry = registry.families.get_mut(&family).ok_or(MetricError::UnknownFamily(family))?;
        if entry.refs <= 1 {
            if !entry.members.is_empty() {
                return Err(MetricError::FamilyInUse);
            }
            let name = entry.name.clone();
            registry.families.remove(&family);
            registry.by_name.remove(&name);
        } else {
            entry.refs -= 1;
        }
        Ok(())
    }

    /// Creates the metric with these labels in a family, or takes one more reference to it if
    /// it exists; returns its id. Histograms need `buckets` (finite upper bounds, strictly
    /// increasing; a last `+Inf` is implied and may be given); counters and gauges refuse them.
    pub fn metric(
        &self,
        family: u64,
        labels: Vec<(String, String)>,
        buckets: Option<Vec<f64>>,
    ) -> Result<u64, MetricError> {
        let mut registry = self.lock();
        let entry = registry.families.get(&family).ok_or(MetricError::UnknownFamily(family))?;
        let kind = entry.kind;
        // Triton's order: the buckets' presence, then the label names, then (tritium only)
        // the bucket bounds themselves.
        let buckets = match (kind, buckets) {
            (MetricKind::Histogram, Some(buckets)) => Some(buckets),
            (MetricKind::Histogram, None) => return Err(MetricError::MissingBuckets),
            (kind, Some(_)) => return Err(MetricError::UnexpectedBuckets(kind)),
            (_, None) => None,
        };
        let labels = check_labels(labels, kind)?;
        let bounds = buckets.map(check_buckets).transpose()?;
        if let Some(&id) = entry.members.get(&labels) {
            let family_name = entry.name.clone();
            let series = registry.series_mut(id)?;
            if let (Value::Histogram(histogram), Some(bounds)) = (&series.value, &bounds) {
                if &histogram.bounds != bounds {
                    tracing::warn!(
                        family = %family_name,
                        kept = ?histogram.bounds,
                        ignored = ?bounds,
                        "histogram metric created again with other buckets; keeping the first, as Triton does"
                    );
                }
            }
            series.refs += 1;
            return Ok(id);
        }
        let value = match bounds {
            Some(bounds) => {
                Value::Histogram(Histogram { counts: vec![0; bounds.len() + 1], bounds, sum: 0.0, count: 0 })
            }
            None => Value::Scalar(0.0),
        };
        let id = registry.new_id();
        if let Some(entry) = registry.families.get_mut(&family) {
            entry.members.insert(labels.clone(), id);
        }
        registry.series.insert(id, Series { family, labels, kind, refs: 1, value });
        Ok(id)
    }

    /// Drops one reference to a metric; it leaves the output with its last reference.
    pub fn drop_metric(&self, metric: u64) -> Result<(), MetricError> {
        let mut registry = self.lock();
        let series = registry.series_mut(metric)?;
        if series.refs > 1 {
            series.refs -= 1;
            return Ok(());
        }
        if let Some(series) = registry.series.remove(&metric) {
            if let Some(family) = registry.families.get_mut(&series.family) {
                family.members.remove(&series.labels);
            }
        }
        Ok(())
    }

    /// Adds `value` to a counter (non-negative values only) or a gauge (any value).
    pub fn increment(&self, metric: u64, value: f64) -> Result<(), MetricError> {
        let mut registry = self.lock();
        let series = registry.series_mut(metric)?;
        match (series.kind, &mut series.value) {
            (MetricKind::Counter, Value::Scalar(current)) => {
                if value.is_nan() {
                    return Err(MetricError::NanIncrement);
                }
                if value < 0.0 {
                    return Err(MetricError::NegativeIncrement);
                }
                *current += value;
                Ok(())
            }
            (MetricKind::Gauge, Value::Scalar(current)) => {
                *current += value;
                Ok(())
            }
            (kind, _) => Err(MetricError::Unsupported { kind, op: "Increment" }),
        }
    }

    /// Sets a gauge.
    pub fn set(&self, metric: u64, value: f64) -> Result<(), MetricError> {
        let mut registry = self.lock();
        let series = registry.series_mut(metric)?;
        match (series.kind, &mut series.value) {
            (MetricKind::Gauge, Value::Scalar(current)) => {
                *current = value;
                Ok(())
            }
            (kind, _) => Err(MetricError::Unsupported { kind, op: "Set" }),
        }
    }

    /// Records one observation in a histogram.
    pub fn observe(&self, metric: u64, value: f64) -> Result<(), MetricError> {
        let mut registry = self.lock();
        let series = registry.series_mut(metric)?;
        match (series.kind, &mut series.value) {
            (MetricKind::Histogram, Value::Histogram(histogram)) => {
                histogram.observe(value);
                Ok(())
            }
            (kind, _) => Err(MetricError::Unsupported { kind, op: "Observe" }),
        }
    }

    /// Applies an operation by its stub-side name.
    pub fn apply(&self, metric: u64, op: MetricOp, value: f64) -> Result<(), MetricError> {
        match op {
            MetricOp::Increment => self.increment(metric, value),
            MetricOp::Set => self.set(metric, value),
            MetricOp::Observe => self.observe(metric, value),
        }
    }

    /// The value of a counter or gauge; histograms have none (as in Triton).
    pub fn value(&self, metric: u64) -> Result<f64, MetricError> {
        let registry = self.lock();
        let series = registry.series.get(&metric).ok_or(MetricError::UnknownMetric(metric))?;
        match &series.value {
            Value::Scalar(value) => Ok(*value),
            Value::Histogram(_) => Err(MetricError::Unsupported { kind: series.kind, op: "Value" }),
        }
    }

    /// The kind of a family.
    pub fn family_kind(&self, family: u64) -> Result<MetricKind, MetricError> {
        let registry = self.lock();
        registry.families.get(&family).map(|f| f.kind).ok_or(MetricError::UnknownFamily(family))
    }

    /// Prometheus text for every family that has metrics: HELP (when the description is not
    /// empty), TYPE, then one line per metric (histograms: cumulative `_bucket{le=...}` lines,
    /// `_sum`, `_count`). Families are in name order, metrics in label order.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_to(&mut out);
        out
    }

    /// The names of the families that have metrics (those [`render`](Self::render) writes).
    pub(crate) fn family_names(&self) -> std::collections::BTreeSet<String> {
        let registry = self.lock();
        registry.families.values().filter(|f| !f.members.is_empty()).map(|f| f.name.clone()).collect()
    }

    /// [`render`](Self::render), appending to `out`.
    pub fn render_to(&self, out: &mut String) {
        let registry = self.lock();
        let mut families: Vec<&Family> = registry.families.values().collect();
        families.sort_by(|a, b| a.name.cmp(&b.name));
        for family in families {
            let mut rendered = text::Family::new(&family.name, &family.description, family.kind);
            for id in family.members.values() {
                let Some(series) = registry.series.get(id) else {
                    continue;
                };
                let labels = series.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let value = match &series.value {
                    Value::Scalar(value) => SeriesValue::Scalar(Number::Float(*value)),
                    Value::Histogram(h) => {
                        SeriesValue::Histogram { bounds: &h.bounds, counts: &h.counts, sum: h.sum, count: h.count }
                    }
                };
                rendered.push(labels, value);
            }
            rendered.render(out);
        }
    }

    /// A session for one stub: the references it takes are tracked and released when it is
    /// dropped, so a stub that dies leaves nothing behind.
    pub fn session(&self) -> MetricsSession {
        MetricsSession { registry: self.clone(), held: Mutex::default() }
    }
}

fn check_labels(mut labels: Labels, kind: MetricKind) -> Result<Labels, MetricError> {
    for (name, _) in &labels {
        if !is_valid_label_name(name) {
            return Err(MetricError::InvalidLabelName(name.clone()));
        }
        if kind == MetricKind::Histogram && name == "le" {
            return Err(MetricError::ReservedLabel);
        }
    }
    labels.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = labels.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(MetricError::DuplicateLabel(pair[0].0.clone()));
    }
    Ok(labels)
}

fn check_buckets(buckets: Vec<f64>) -> Result<Vec<f64>, MetricError> {
    let invalid = |reason| MetricError::InvalidBuckets { buckets: buckets.clone(), reason };
    let mut bounds = buckets.clone();
    if bounds.last() == Some(&f64::INFINITY) {
        bounds.pop();
    }
    if bounds.iter().any(|bound| bound.is_nan()) {
        return Err(invalid("a bound is NaN"));
    }
    if bounds.iter().any(|bound| bound.is_infinite()) {
        return Err(invalid("only the last bound may be infinite, and only +Inf"));
    }
    if bounds.windows(2).any(|pair| pair[0] >= pair[1]) {
        return Err(invalid("the bounds are not strictly increasing"));
    }
    Ok(bounds)
}

#[derive(Debug, Default)]
struct Held {
    /// Family id -> references this session holds.
    families: HashMap<u64, u64>,
    /// Metric id -> (family id, references this session holds).
    metrics: HashMap<u64, (u64, u64)>,
}

/// The custom metrics one stub holds (from [`CustomMetrics::session`]). Every call is checked
/// against what this session created, so a stub can only touch its own ids; dropping the
/// session releases every reference it still holds (metrics first, then families), as Triton's
/// stub does when its `MetricFamily` objects go away.
#[derive(Debug)]
pub struct MetricsSession {
    registry: CustomMetrics,
    held: Mutex<Held>,
}

impl MetricsSession {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.locked()
    }

    fn check_metric(&self, metric: u64) -> Result<(), MetricError> {
        if self.held().metrics.contains_key(&metric) {
            Ok(())
        } else {
            Err(MetricError::UnknownMetric(metric))
        }
    }

    /// [`CustomMetrics::family`], held by this session.
    pub fn family(&self, name: &str, description: &str, kind: MetricKind) -> Result<u64, MetricError> {
        let mut held = self.held();
        let id = self.registry.family(name, description, kind)?;
        *held.families.entry(id).or_insert(0) += 1;
        Ok(id)
    }

    /// [`CustomMetrics::drop_family`] for a family this session holds; its last reference here
    /// is refused while this session still holds metrics of the family (Triton's rule).
    pub fn drop_family(&self, family: u64) -> Result<(), MetricError> {
        let mut held = self.held();
        let count = *held.families.get(&family).ok_or(MetricError::UnknownFamily(family))?;
        if count == 1 && held.metrics.values().any(|(owner, _)| *owner == family) {
            return Err(MetricError::FamilyInUse);
        }
        self.registry.drop_family(family)?;
        if count == 1 {
            held.families.remove(&family);
        } else if let Some(count) = held.families.get_mut(&family) {
            *count -= 1;
        }
        Ok(())
    }

    /// [`CustomMetrics::metric`] in a family this session holds.
    pub fn metric(
        &self,
        family: u64,
        labels: Vec<(String, String)>,
        buckets: Option<Vec<f64>>,
    ) -> Result<u64, MetricError> {
        let mut held = self.held();
        if !held.families.contains_key(&family) {
            return Err(MetricError::UnknownFamily(family));
        }
        let id = self.registry.metric(family, labels, buckets)?;
        held.metrics.entry(id).or_insert((family, 0)).1 += 1;
        Ok(id)
    }

    /// [`CustomMetrics::drop_metric`] for a metric this session holds.
    pub fn drop_metric(&self, metric: u64) -> Result<(), MetricError> {
        let mut held = self.held();
        let (_, count) = *held.metrics.get(&metric).ok_or(MetricError::UnknownMetric(metric))?;
        self.registry.drop_metric(metric)?;
        if count == 1 {
            held.metrics.remove(&metric);
        } else if let Some((_, count)) = held.metrics.get_mut(&metric) {
            *count -= 1;
        }
        Ok(())
    }

    /// [`CustomMetrics::increment`] on a metric this session holds.
    pub fn increment(&self, metric: u64, value: f64) -> Result<(), MetricError> {
        self.check_metric(metric)?;
        self.registry.increment(metric, value)
    }

    /// [`CustomMetrics::set`] on a metric this session holds.
    pub fn set(&self, metric: u64, value: f64) -> Result<(), MetricError> {
        self.check_metric(metric)?;
        self.registry.set(metric, value)
    }

    /// [`CustomMetrics::observe`] on a metric this session holds.
    pub fn observe(&self, metric: u64, value: f64) -> Result<(), MetricError> {
        self.check_metric(metric)?;
        self.registry.observe(metric, value)
    }

    /// [`CustomMetrics::apply`] on a metric this session holds.
    pub fn apply(&self, metric: u64, op: MetricOp, value: f64) -> Result<(), MetricError> {
        self.check_metric(metric)?;
        self.registry.apply(metric, op, value)
    }

    /// [`CustomMetrics::value`] of a metric this session holds.
    pub fn value(&self, metric: u64) -> Result<f64, MetricError> {
        self.check_metric(metric)?;
        self.registry.value(metric)
    }

    /// Releases every reference this session holds (also done on drop).
    pub fn release_all(&self) {
        let mut held = self.held();
        for (metric, (_, count)) in held.metrics.drain() {
            for _ in 0..count {
                let _ = self.registry.drop_metric(metric);
            }
        }
        for (family, count) in held.families.drain() {
            for _ in 0..count {
                if let Err(error) = self.registry.drop_family(family) {
                    // Only possible when metrics created outside any session still live in a
                    // family whose last reference was ours: the family stays registered.
                    tracing::debug!(family, %error, "custom metric family kept past its session");
                    break;
                }
            }
        }
    }
}

impl Drop for MetricsSession {
    fn drop(&mut self) {
        self.release_all();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn registry() -> CustomMetrics {
        CustomMetrics::with_reserved_names(&["nv_inference_count"])
    }

    #[test]
    fn kinds_have_tritons_values() {
        assert_eq!(MetricKind::from_triton(0), Ok(MetricKind::Counter));
        assert_eq!(MetricKind::from_triton(1), Ok(MetricKind::Gauge));
        assert_eq!(MetricKind::try_from(2), Ok(MetricKind::Histogram));
        let error = MetricKind::from_triton(3).unwrap_err();
        assert_eq!(error, MetricError::UnknownKind(3));
        assert!(error.to_string().starts_with("Unknown metric kind 3"), "{error}");
        assert_eq!(MetricKind::Counter as i64, 0);
        assert_eq!(MetricKind::Histogram.triton_name(), "TRITONSERVER_METRIC_KIND_HISTOGRAM");
    }

    #[test]
    fn ops_parse_from_stub_names() {
        assert_eq!("increment".parse(), Ok(MetricOp::Increment));
        assert_eq!("set".parse(), Ok(MetricOp::Set));
        assert_eq!("observe".parse(), Ok(MetricOp::Observe));
        let error = "value".parse::<MetricOp>().unwrap_err();
        assert_eq!(error.to_string(), "Unknown metric operation 'value': expected 'increment', 'set' or 'observe'");
    }

    #[test]
    fn same_name_and_kind_share_a_family() {
        let r = registry();
        let a = r.family("requests_total", "Requests", MetricKind::Counter).unwrap();
        let b = r.family("requests_total", "Requests", MetricKind::Counter).unwrap();
        assert_eq!(a, b);
        // Two references: one drop leaves the family, the second removes it.
        r.drop_family(a).unwrap();
        assert_eq!(r.family_kind(a), Ok(MetricKind::Counter));
        r.drop_family(a).unwrap();
        assert_eq!(r.family_kind(a), Err(MetricError::UnknownFamily(a)));
        assert_eq!(r.drop_family(a), Err(MetricError::UnknownFamily(a)));
    }

    #[test]
    fn same_name_other_kind_is_refused_with_tritons_text() {
        let r = registry();
        r.family("diff_kind_test", "diff kind description", MetricKind::Counter).unwrap();
        let error = r.family("diff_kind_test", "diff kind description", MetricKind::Gauge).unwrap_err();
        assert_eq!(
            error,
            MetricError::KindMismatch {
                name: "diff_kind_test".into(),
                existing: MetricKind::Counter,
                requested: MetricKind::Gauge
            }
        );
        assert_eq!(
            error.to_string(),
            "Family name already exists with different type: 'diff_kind_test' is a counter metric \
             family, so it cannot also be a gauge; use another name or the same kind"
        );
    }

    #[test]
    fn same_name_other_description_keeps_the_first_as_triton_does() {
        let r = registry();
        let a = r.family("diff_description_test", "first description", MetricKind::Counter).unwrap();
        let b = r.family("diff_description_test", "second description", MetricKind::Counter).unwrap();
        assert_eq!(a, b);
        r.metric(b, vec![], None).unwrap();
        let text = r.render();
        assert!(text.contains("# HELP diff_description_test first description\n"), "{text}");
        assert!(!text.contains("second description"), "{text}");
    }

    #[test]
    fn invalid_and_reserved_names_are_refused() {
        let r = registry();
        for bad in ["", "9lives", "has-dash", "has space", "__reserved", "dotted.name", "ünïcode"] {
            let error = r.family(bad, "d", MetricKind::Gauge).unwrap_err();
            assert_eq!(error, MetricError::InvalidName(bad.into()));
            assert!(error.to_string().starts_with(&format!("Invalid metric name '{bad}'")), "{error}");
        }
        let error = r.family("nv_inference_count", "d", MetricKind::Counter).unwrap_err();
        assert_eq!(error, MetricError::ReservedName("nv_inference_count".into()));
        assert!(error.to_string().contains("server's own metrics"), "{error}");
        for ok in ["a", "_a", ":a", "ns:sub_metric1"] {
            r.family(ok, "d", MetricKind::Gauge).unwrap();
        }
    }

    #[test]
    fn same_labels_share_a_metric_in_any_order() {
        let r = registry();
        let f = r.family("dupe_metric_test", "dupe metric description", MetricKind::Counter).unwrap();
        let m1 = r.metric(f, labels(&[("example1", "label1"), ("example2", "label2")]), None).unwrap();
        let m2 = r.metric(f, labels(&[("example2", "label2"), ("example1", "label1")]), None).unwrap();
        assert_eq!(m1, m2);
        r.increment(m1, 7.5).unwrap();
        assert_eq!(r.value(m2), Ok(7.5));
        let other = r.metric(f, labels(&[("example1", "other")]), None).unwrap();
        assert_ne!(other, m1);
        assert_eq!(r.value(other), Ok(0.0));
        // Empty label sets are shared too.
        let e1 = r.metric(f, vec![], None).unwrap();
        let e2 = r.metric(f, vec![], None).unwrap();
        assert_eq!(e1, e2);
    }

    #[test]
    fn buckets_follow_the_kind_with_tritons_texts() {
        let r = registry();
        let counter = r.family("c", "d", MetricKind::Counter).unwrap();
        let gauge = r.family("g", "d", MetricKind::Gauge).unwrap();
        let histogram = r.family("h", "d", MetricKind::Histogram).unwrap();
        let error = r.metric(counter, vec![], Some(vec![1.0])).unwrap_err();
        assert_eq!(error.to_string(), "Unexpected args found in counter Metric constructor.");
        let error = r.metric(gauge, vec![], Some(vec![])).unwrap_err();
        assert_eq!(error.to_string(), "Unexpected args found in gauge Metric constructor.");
        let error = r.metric(histogram, vec![], None).unwrap_err();
        assert_eq!(error, MetricError::MissingBuckets);
        assert!(error.to_string().starts_with("Bucket boundaries not found in Metric args."), "{error}");
        // Buckets are checked before labels, as in Triton.
        let error = r.metric(counter, labels(&[("bad-label", "v")]), Some(vec![1.0])).unwrap_err();
        assert_eq!(error, MetricError::UnexpectedBuckets(MetricKind::Counter));
        // Empty buckets are allowed (only +Inf), as in Triton.
        r.metric(histogram, vec![], Some(vec![])).unwrap();
    }

    #[test]
    fn invalid_buckets_are_refused() {
        let r = registry();
        let h = r.family("h", "d", MetricKind::Histogram).unwrap();
        for (buckets, reason) in [
            (vec![1.0, 0.5], "the bounds are not strictly increasing"),
            (vec![1.0, 1.0], "the bounds are not strictly increasing"),
            (vec![f64::NAN], "a bound is NaN"),
            (vec![f64::NEG_INFINITY, 1.0], "only the last bound may be infinite, and only +Inf"),
            (vec![f64::INFINITY, 1.0], "only the last bound may be infinite, and only +Inf"),
        ] {
            let error = r.metric(h, vec![], Some(buckets.clone())).unwrap_err();
            assert!(matches!(&error, MetricError::InvalidBuckets { reason: r, .. } if *r == reason), "{error}");
            assert!(error.to_string().starts_with("Bucket Boundaries must be strictly sorted"), "{error}");
        }
        // A last +Inf is implied and accepted.
        let m = r.metric(h, vec![], Some(vec![1.0, f64::INFINITY])).unwrap();
        r.observe(m, 5.0).unwrap();
        let text = r.render();
        assert_eq!(text.matches("le=\"+Inf\"").count(), 1, "{text}");
    }

    #[test]
    fn label_names_are_checked() {
        let r = registry();
        let c = r.family("c", "d", MetricKind::Counter).unwrap();
        let h = r.family("h", "d", MetricKind::Histogram).unwrap();
        for bad in ["", "1a", "a-b", "a:b", "__name__"] {
            let error = r.metric(c, labels(&[(bad, "v")]), None).unwrap_err();
            assert_eq!(error, MetricError::InvalidLabelName(bad.into()));
            assert!(error.to_string().starts_with(&format!("Invalid label name '{bad}'")), "{error}");
        }
        let error = r.metric(c, labels(&[("a", "1"), ("a", "2")]), None).unwrap_err();
        assert_eq!(error, MetricError::DuplicateLabel("a".into()));
        assert!(error.to_string().starts_with("Duplicate label name 'a'"), "{error}");
        assert_eq!(r.metric(h, labels(&[("le", "1")]), Some(vec![1.0])), Err(MetricError::ReservedLabel));
        // `le` is an ordinary label on counters; any label value is fine.
        r.metric(c, labels(&[("le", "1"), ("v", "any \"value\"\n\\ ünïcode")]), None).unwrap();
    }

    #[test]
    fn operations_follow_the_kind_with_tritons_texts() {
        let r = registry();
        let c = r.metric(r.family("c", "d", MetricKind::Counter).unwrap(), vec![], None).unwrap();
        let g = r.metric(r.family("g", "d", MetricKind::Gauge).unwrap(), vec![], None).unwrap();
        let h = r.metric(r.family("h", "d", MetricKind::Histogram).unwrap(), vec![], Some(vec![1.0])).unwrap();

        r.increment(c, 2.5).unwrap();
        r.increment(c, 0.0).unwrap();
        assert_eq!(r.value(c), Ok(2.5));
        let error = r.increment(c, -1.0).unwrap_err();
        assert_eq!(
            error.to_string(),
            "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
        );
        assert_eq!(r.increment(c, f64::NAN), Err(MetricError::NanIncrement));
        assert_eq!(r.value(c), Ok(2.5));
        assert_eq!(r.set(c, 1.0).unwrap_err().to_string(), "TRITONSERVER_METRIC_KIND_COUNTER does not support Set");
        assert_eq!(
            r.observe(c, 1.0).unwrap_err().to_string(),
            "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"
        );

        r.set(g, 10.0).unwrap();
        r.increment(g, -12.5).unwrap();
        assert_eq!(r.value(g), Ok(-2.5));
        assert_eq!(
            r.observe(g, 1.0).unwrap_err().to_string(),
            "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"
        );

        r.observe(h, 0.5).unwrap();
        assert_eq!(
            r.increment(h, 1.0).unwrap_err().to_string(),
            "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"
        );
        assert_eq!(r.set(h, 1.0).unwrap_err().to_string(), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set");
        assert_eq!(r.value(h).unwrap_err().to_string(), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value");

        r.apply(c, MetricOp::Increment, 1.0).unwrap();
        r.apply(g, MetricOp::Set, 4.0).unwrap();
        r.apply(h, MetricOp::Observe, 2.0).unwrap();
        assert_eq!(r.value(c), Ok(3.5));
        assert_eq!(r.value(g), Ok(4.0));
    }

    #[test]
    fn drops_are_refcounted_and_ids_never_reused() {
        let r = registry();
        let f = r.family("requests", "Requests", MetricKind::Counter).unwrap();
        let m = r.metric(f, labels(&[("k", "v")]), None).unwrap();
        assert_eq!(r.metric(f, labels(&[("k", "v")]), None), Ok(m));
        r.increment(m, 1.0).unwrap();

        // The family cannot go while it has metrics (Triton's text).
        let error = r.drop_family(f).unwrap_err();
        assert_eq!(
            error.to_string(),
            "Must call MetricDelete on all dependent metrics before calling MetricFamilyDelete."
        );

        r.drop_metric(m).unwrap();
        assert_eq!(r.value(m), Ok(1.0), "one reference is left");
        assert!(r.render().contains("requests{k=\"v\"} 1\n"));
        r.drop_metric(m).unwrap();
        assert_eq!(r.value(m), Err(MetricError::UnknownMetric(m)));
        assert_eq!(r.drop_metric(m), Err(MetricError::UnknownMetric(m)));
        assert_eq!(r.increment(m, 1.0), Err(MetricError::UnknownMetric(m)));
        // A family without metrics is not rendered.
        assert_eq!(r.render(), "");
        r.drop_family(f).unwrap();
        assert_eq!(r.metric(f, vec![], None), Err(MetricError::UnknownFamily(f)));

        // Created again: new ids, fresh values, and the name is free for another kind.
        let g = r.family("requests", "Requests", MetricKind::Gauge).unwrap();
        assert_ne!(g, f);
        let m2 = r.metric(g, labels(&[("k", "v")]), None).unwrap();
        assert_ne!(m2, m);
        assert_eq!(r.value(m2), Ok(0.0));
        let error = r.value(12345).unwrap_err();
        assert!(error.to_string().starts_with("Unknown metric id 12345"), "{error}");
    }

    #[test]
    fn render_is_exact() {
        let r = registry();
        let c = r
            .family("requests_process_latency_ns", "Cumulative time spent\nprocessing \\ requests", MetricKind::Counter)
            .unwrap();
        let g = r.family("queue_depth", "", MetricKind::Gauge).unwrap();
        let h = r.family("latency_seconds", "Latency", MetricKind::Histogram).unwrap();
        let c1 = r.metric(c, labels(&[("version", "1"), ("model", "custom_metrics")]), None).unwrap();
        let c2 = r.metric(c, labels(&[("model", "a \"quoted\"\nname\\")]), None).unwrap();
        let g1 = r.metric(g, vec![], None).unwrap();
        let h1 = r.metric(h, labels(&[("model", "m")]), Some(vec![0.1, 1.0, 2.5, 5.0, 10.0])).unwrap();
        r.increment(c1, 1500.0).unwrap();
        r.increment(c2, 0.25).unwrap();
        r.set(g1, -3.0).unwrap();
        for value in [0.05, 0.1, 0.5, 3.0, 100.0] {
            r.observe(h1, value).unwrap();
        }
        let expected = [
            "# HELP latency_seconds Latency",
            "# TYPE latency_seconds histogram",
            "latency_seconds_bucket{model=\"m\",le=\"0.1\"} 2",
            "latency_seconds_bucket{model=\"m\",le=\"1\"} 3",
            "latency_seconds_bucket{model=\"m\",le=\"2.5\"} 3",
            "latency_seconds_bucket{model=\"m\",le=\"5\"} 4",
            "latency_seconds_bucket{model=\"m\",le=\"10\"} 4",
            "latency_seconds_bucket{model=\"m\",le=\"+Inf\"} 5",
            "latency_seconds_sum{model=\"m\"} 103.65",
            "latency_seconds_count{model=\"m\"} 5",
            "# TYPE queue_depth gauge",
            "queue_depth -3",
            "# HELP requests_process_latency_ns Cumulative time spent\\nprocessing \\\\ requests",
            "# TYPE requests_process_latency_ns counter",
            "requests_process_latency_ns{model=\"a \\\"quoted\\\"\\nname\\\\\"} 0.25",
            "requests_process_latency_ns{model=\"custom_metrics\",version=\"1\"} 1500",
        ];
        let text = r.render();
        let lines: Vec<&str> = text.lines().collect();
        for (i, (got, want)) in lines.iter().zip(expected.iter()).enumerate() {
            assert_eq!(got, want, "line {i}");
        }
        assert_eq!(lines.len(), expected.len(), "{text}");
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let r = registry();
        let h = r.family("h", "d", MetricKind::Histogram).unwrap();
        let m = r.metric(h, vec![], Some(vec![1.0, 2.0, 3.0])).unwrap();
        for value in [0.0, 1.0, 1.5, 2.0, 2.5, 2.9, 3.0, 3.1, -1.0, f64::NAN] {
            r.observe(m, value).unwrap();
        }
        let text = r.render();
        let bucket = |le: &str| -> u64 {
            let prefix = format!("h_bucket{{le=\"{le}\"}} ");
            let line = text.lines().find(|line| line.starts_with(&prefix)).unwrap_or_default();
            line[prefix.len().min(line.len())..].parse().unwrap_or(u64::MAX)
        };
        // le is inclusive; NaN only counts in +Inf.
        assert_eq!(bucket("1"), 3);
        assert_eq!(bucket("2"), 5);
        assert_eq!(bucket("3"), 8);
        assert_eq!(bucket("+Inf"), 10);
        assert!(text.contains("h_count 10\n"), "{text}");
        assert!(text.contains("h_sum NaN\n"), "{text}");
        let counts: Vec<u64> = ["1", "2", "3", "+Inf"].iter().map(|le| bucket(le)).collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    }

    #[test]
    fn concurrent_use_is_consistent() {
        let r = registry();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let f = r.family("hits", "Hits", MetricKind::Counter).unwrap();
                    let m = r.metric(f, labels(&[("k", "v")]), None).unwrap();
                    for _ in 0..1000 {
                        r.increment(m, 1.0).unwrap();
                    }
                    (f, m)
                })
            })
            .collect();
        let ids: Vec<(u64, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
        let (f, m) = ids[0];
        assert_eq!(r.value(m), Ok(8000.0));
        for _ in 0..8 {
            r.drop_metric(m).unwrap();
        }
        for _ in 0..8 {
            r.drop_family(f).unwrap();
        }
        assert_eq!(r.family_kind(f), Err(MetricError::UnknownFamily(f)));
    }

    #[test]
    fn sessions_touch_only_their_ids_and_release_on_drop() {
        let r = registry();
        let a = r.session();
        let b = r.session();
        let fa = a.family("shared", "Shared", MetricKind::Gauge).unwrap();
        let fb = b.family("shared", "Shared", MetricKind::Gauge).unwrap();
        assert_eq!(fa, fb);
        let ma = a.metric(fa, labels(&[("instance", "0")]), None).unwrap();
        let mb = b.metric(fb, labels(&[("instance", "1")]), None).unwrap();
        a.set(ma, 1.0).unwrap();
        // b cannot reach a's metric, nor a family it does not hold.
        assert_eq!(b.set(ma, 2.0), Err(MetricError::UnknownMetric(ma)));
        assert_eq!(b.value(ma), Err(MetricError::UnknownMetric(ma)));
        assert_eq!(b.drop_metric(ma), Err(MetricError::UnknownMetric(ma)));
        let other = a.family("only_a", "A", MetricKind::Counter).unwrap();
        assert_eq!(b.metric(other, vec![], None), Err(MetricError::UnknownFamily(other)));
        assert_eq!(b.drop_family(other), Err(MetricError::UnknownFamily(other)));
        // Triton's rule, per session: a's family cannot go while a holds metrics of it.
        assert_eq!(a.drop_family(fa), Err(MetricError::FamilyInUse));

        b.apply(mb, MetricOp::Increment, 5.0).unwrap();
        assert_eq!(b.value(mb), Ok(5.0));
        let text = r.render();
        assert!(text.contains("shared{instance=\"0\"} 1\n") && text.contains("shared{instance=\"1\"} 5\n"), "{text}");

        drop(a); // the stub died: its metric and its references go
        let text = r.render();
        assert!(!text.contains("instance=\"0\""), "{text}");
        assert!(!text.contains("only_a"), "{text}");
        assert_eq!(r.family_kind(other), Err(MetricError::UnknownFamily(other)));
        assert_eq!(b.value(mb), Ok(5.0));

        b.drop_metric(mb).unwrap();
        b.drop_family(fb).unwrap();
        assert_eq!(r.family_kind(fb), Err(MetricError::UnknownFamily(fb)));
        assert_eq!(r.render(), "");
    }

    #[test]
    fn a_session_holding_a_reference_twice_releases_both() {
        let r = registry();
        let s = r.session();
        let f = s.family("twice", "d", MetricKind::Counter).unwrap();
        assert_eq!(s.family("twice", "d", MetricKind::Counter), Ok(f));
        let m = s.metric(f, vec![], None).unwrap();
        assert_eq!(s.metric(f, vec![], None), Ok(m));
        s.drop_metric(m).unwrap();
        s.increment(m, 1.0).unwrap();
        // One metric reference is left, but the family is held twice: one family drop is fine.
        s.drop_family(f).unwrap();
        assert_eq!(s.drop_family(f), Err(MetricError::FamilyInUse));
        s.release_all();
        assert_eq!(r.family_kind(f), Err(MetricError::UnknownFamily(f)));
        assert_eq!(r.value(m), Err(MetricError::UnknownMetric(m)));
    }
}
