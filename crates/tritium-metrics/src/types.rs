//! The vocabulary the custom metrics and the text format share: metric kinds (Triton's values),
//! operations, and why a custom-metric call is refused.

use std::fmt;
use std::str::FromStr;

/// The kind of a custom metric family; the discriminants are Triton's (`MetricKind` in
/// python_backend `src/pb_utils.h`, exposed to Python as `MetricFamily.COUNTER` etc.).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetricKind {
    /// A cumulative value that only goes up.
    Counter = 0,
    /// A value that goes up and down.
    Gauge = 1,
    /// Observations counted in buckets, with their sum and count.
    Histogram = 2,
}

impl MetricKind {
    /// The kind for Triton's integer value (0 counter, 1 gauge, 2 histogram).
    pub fn from_triton(value: i64) -> Result<Self, MetricError> {
        match value {
            0 => Ok(Self::Counter),
            1 => Ok(Self::Gauge),
            2 => Ok(Self::Histogram),
            other => Err(MetricError::UnknownKind(other)),
        }
    }

    /// Triton's name for the kind in its error messages, e.g. `TRITONSERVER_METRIC_KIND_COUNTER`.
    pub fn triton_name(self) -> &'static str {
        match self {
            Self::Counter => "TRITONSERVER_METRIC_KIND_COUNTER",
            Self::Gauge => "TRITONSERVER_METRIC_KIND_GAUGE",
            Self::Histogram => "TRITONSERVER_METRIC_KIND_HISTOGRAM",
        }
    }

    /// The word the text format uses on the `# TYPE` line.
    pub const fn prometheus_type(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

impl TryFrom<i64> for MetricKind {
    type Error = MetricError;

    fn try_from(value: i64) -> Result<Self, MetricError> {
        Self::from_triton(value)
    }
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prometheus_type())
    }
}

/// An operation on a custom metric, as the stub names it (`metric_op(id, op, value)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricOp {
    /// `Metric.increment(value)`: counters (by a non-negative value) and gauges.
    Increment,
    /// `Metric.set(value)`: gauges only.
    Set,
    /// `Metric.observe(value)`: histograms only.
    Observe,
}

impl FromStr for MetricOp {
    type Err = MetricError;

    fn from_str(op: &str) -> Result<Self, MetricError> {
        match op {
            "increment" => Ok(Self::Increment),
            "set" => Ok(Self::Set),
            "observe" => Ok(Self::Observe),
            other => Err(MetricError::UnknownOp(other.to_owned())),
        }
    }
}

/// Why a custom-metric call was refused. Messages that start with Triton's text keep it
/// verbatim (model code may match on it); the rest say what was wrong and what to do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MetricError {
    /// The family name is not a valid Prometheus metric name (Triton: "Invalid metric name").
    #[error(
        "Invalid metric name '{0}': a metric family name must match [a-zA-Z_:][a-zA-Z0-9_:]* \
         and must not start with '__'"
    )]
    InvalidName(String),
    /// The family name belongs to one of the server's own metrics.
    #[error(
        "Invalid metric name '{0}': the name is used by one of the server's own metrics; \
         choose another name for the custom metric family"
    )]
    ReservedName(String),
    /// A family with this name exists with another kind (prometheus-cpp's text).
    #[error(
        "Family name already exists with different type: '{name}' is a {existing} metric \
         family, so it cannot also be a {requested}; use another name or the same kind"
    )]
    KindMismatch {
        /// The family name.
        name: String,
        /// The kind it was created with.
        existing: MetricKind,
        /// The kind that was asked for.
        requested: MetricKind,
    },
    /// The kind is not 0, 1 or 2 (python_backend's text: "Unknown metric kind").
    #[error(
        "Unknown metric kind {0}: use MetricFamily.COUNTER (0), MetricFamily.GAUGE (1) or \
         MetricFamily.HISTOGRAM (2)"
    )]
    UnknownKind(i64),
    /// The operation is not `increment`, `set` or `observe` (python_backend's text).
    #[error("Unknown metric operation '{0}': expected 'increment', 'set' or 'observe'")]
    UnknownOp(String),
    /// A label name is not a valid Prometheus label name (prometheus-cpp: "Invalid label name").
    #[error(
        "Invalid label name '{0}': a label name must match [a-zA-Z_][a-zA-Z0-9_]* and must not \
         start with '__'"
    )]
    InvalidLabelName(String),
    /// `le` is the bucket label of histograms and cannot be one of their labels.
    #[error("Invalid label name 'le': a histogram uses 'le' for its bucket bounds; rename the label")]
    ReservedLabel,
    /// The same label name appears twice (prometheus-cpp: "Duplicate label name").
    #[error("Duplicate label name '{0}': give each label once")]
    DuplicateLabel(String),
    /// Buckets were given for a counter or a gauge (Triton's text).
    #[error("Unexpected args found in {} Metric constructor.", .0.prometheus_type())]
    UnexpectedBuckets(MetricKind),
    /// A histogram metric was created without buckets (Triton's text).
    #[error(
        "Bucket boundaries not found in Metric args. A histogram metric needs buckets, e.g. \
         Metric(labels, buckets=[0.1, 1.0, 10.0])"
    )]
    MissingBuckets,
    /// The bucket bounds are not usable (prometheus-cpp's text first).
    #[error(
        "Bucket Boundaries must be strictly sorted: {buckets:?}: {reason}; give bucket upper \
         bounds in strictly increasing order"
    )]
    InvalidBuckets {
        /// The bounds that were given.
        buckets: Vec<f64>,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// A counter was incremented by a negative value (Triton's text).
    #[error(
        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by \
         non-negative values."
    )]
    NegativeIncrement,
    /// A counter was incremented by NaN, which would make it NaN forever.
    #[error("A counter cannot be incremented by NaN: increment it by a non-negative number")]
    NanIncrement,
    /// The metric's kind does not support the operation (Triton's text, e.g.
    /// "TRITONSERVER_METRIC_KIND_COUNTER does not support Set").
    #[error("{} does not support {op}", .kind.triton_name())]
    Unsupported {
        /// The metric's kind.
        kind: MetricKind,
        /// Triton's name of the operation: `Increment`, `Set`, `Observe` or `Value`.
        op: &'static str,
    },
    /// The family's last reference was dropped while it still had metrics (Triton's text).
    #[error("Must call MetricDelete on all dependent metrics before calling MetricFamilyDelete.")]
    FamilyInUse,
    /// No such family: it was never created or all its references were dropped.
    #[error(
        "Unknown metric family id {0}: it was never created or has already been deleted; \
         create the MetricFamily again"
    )]
    UnknownFamily(u64),
    /// No such metric: it was never created or all its references were dropped.
    #[error(
        "Unknown metric id {0}: it was never created or has already been deleted; create \
         the Metric again from its MetricFamily"
    )]
    UnknownMetric(u64),
}
