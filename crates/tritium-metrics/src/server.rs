//! The server's metrics: Triton's per-model `nv_inference_*` families and tritium's per-instance
//! `tritium_stub_*` families, set from a [`Snapshot`] taken at scrape time and rendered through a
//! `metrics-exporter-prometheus` recorder.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::custom::CustomMetrics;

/// What the server knows about one model version when `/metrics` is scraped.
///
/// Counts and durations are cumulative since the version was loaded; durations are in
/// nanoseconds (Triton's statistics unit) and are exported in microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSnapshot {
    /// The model's name (label `model`).
    pub name: String,
    /// The version (label `version`), e.g. `"1"`.
    pub version: String,
    /// Successful requests, all batch sizes.
    pub success: u64,
    /// Failed requests by reason.
    pub failure: FailureCounts,
    /// Inferences performed (a request of batch size n counts n).
    pub inference_count: u64,
    /// Model executions performed (one per batch).
    pub exec_count: u64,
    /// Cumulative request duration (arrival to response), in nanoseconds.
    pub request_duration_ns: u64,
    /// Cumulative time requests spent queued, in nanoseconds.
    pub queue_duration_ns: u64,
    /// Cumulative time spent preparing inputs, in nanoseconds.
    pub compute_input_duration_ns: u64,
    /// Cumulative time spent executing the model, in nanoseconds.
    pub compute_infer_duration_ns: u64,
    /// Cumulative time spent extracting outputs, in nanoseconds.
    pub compute_output_duration_ns: u64,
    /// Requests waiting for execution now.
    pub pending_requests: u64,
    /// How long loading the version took, in seconds (`nv_model_load_duration_secs`); `None`
    /// leaves the series out.
    pub load_duration_secs: Option<f64>,
}

/// Failed requests by the reasons Triton distinguishes (the `reason` label of
/// `nv_inference_request_failure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// `REJECTED`: refused before execution (queue full, timeout in the queue).
    pub rejected: u64,
    /// `CANCELED`: cancelled by the client or the server.
    pub canceled: u64,
    /// `BACKEND`: the model (stub) failed the request.
    pub backend: u64,
    /// `OTHER`: any other failure.
    pub other: u64,
}

/// What the supervisor knows about one model instance (one stub) when `/metrics` is scraped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstanceSnapshot {
    /// The model's name (label `model`).
    pub model: String,
    /// The version (label `version`).
    pub version: String,
    /// The instance's name (label `instance`), e.g. `"mymodel_0_0"`.
    pub instance: String,
    /// The stub's current state (label `state` of `tritium_stub_state`), e.g. `"ready"`.
    pub state: String,
    /// How many times the stub was restarted.
    pub restarts: u64,
    /// The stub's resident memory in bytes; `None` (no live process) leaves the series out.
    pub rss_bytes: Option<u64>,
    /// Shared memory mapped for the stub (control and arena segments), in bytes.
    pub shm_bytes: u64,
    /// Requests the stub is executing now.
    pub inflight: u64,
}

/// Everything `/metrics` reports about the server, taken at scrape time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// One entry per loaded model version.
    pub models: Vec<ModelSnapshot>,
    /// One entry per model instance.
    pub instances: Vec<InstanceSnapshot>,
}

/// Options matching Triton's `--metrics-config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsOptions {
    /// Export the cumulative `nv_inference_*_duration_us` counters (Triton's
    /// `counter_latencies`, default true).
    pub counter_latencies: bool,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        Self { counter_latencies: true }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Type {
    Counter,
    Gauge,
}

/// One server metric family: name, HELP text and type.
#[derive(Debug)]
struct FamilyDef {
    name: &'static str,
    help: &'static str,
    ty: Type,
}

macro_rules! family {
    ($ident:ident, $name:literal, $ty:ident, $help:literal) => {
        const $ident: FamilyDef = FamilyDef { name: $name, help: $help, ty: Type::$ty };
    };
}

// Names, HELP texts and types exactly as Triton registers them (core `src/metrics.cc`).
family!(SUCCESS, "nv_inference_request_success", Counter, "Number of successful inference requests, all batch sizes");
family!(FAILURE, "nv_inference_request_failure", Counter, "Number of failed inference requests, all batch sizes");
family!(COUNT, "nv_inference_count", Counter, "Number of inferences performed (does not include cached requests)");
family!(
    EXEC_COUNT,
    "nv_inference_exec_count",
    Counter,
    "Number of model executions performed (does not include cached requests)"
);
family!(
    REQUEST_DURATION,
    "nv_inference_request_duration_us",
    Counter,
    "Cumulative inference request duration in microseconds (includes cached requests)"
);
family!(
    QUEUE_DURATION,
    "nv_inference_queue_duration_us",
    Counter,
    "Cumulative inference queuing duration in microseconds (includes cached requests)"
);
family!(
    COMPUTE_INPUT_DURATION,
    "nv_inference_compute_input_duration_us",
    Counter,
    "Cumulative compute input duration in microseconds (does not include cached requests)"
);
family!(
    COMPUTE_INFER_DURATION,
    "nv_inference_compute_infer_duration_us",
    Counter,
    "Cumulative compute inference duration in microseconds (does not include cached requests)"
);
family!(
    COMPUTE_OUTPUT_DURATION,
    "nv_inference_compute_output_duration_us",
    Counter,
    "Cumulative inference compute output duration in microseconds (does not include cached requests)"
);
family!(
    PENDING,
    "nv_inference_pending_request_count",
    Gauge,
    "Instantaneous number of pending requests awaiting execution per-model."
);
family!(LOAD_DURATION, "nv_model_load_duration_secs", Gauge, "Model load time in seconds");
// tritium's own, per model instance.
family!(
    STUB_STATE,
    "tritium_stub_state",
    Gauge,
    "State of the stub process of a model instance: 1 for the state it is in (label state)"
);
family!(
    STUB_RESTARTS,
    "tritium_stub_restarts_total",
    Counter,
    "Number of times the supervisor restarted the stub of a model instance"
);
family!(STUB_RSS, "tritium_stub_rss_bytes", Gauge, "Resident memory of the stub process of a model instance, in bytes");
family!(
    STUB_SHM,
    "tritium_stub_shm_bytes",
    Gauge,
    "Shared memory mapped for the stub of a model instance (control and arena segments), in bytes"
);
family!(
    STUB_INFLIGHT,
    "tritium_stub_inflight_requests",
    Gauge,
    "Number of requests the stub of a model instance is executing now"
);

/// The server's families in output order (Triton's registration order, then tritium's).
const FAMILIES: [&FamilyDef; 16] = [
    &SUCCESS,
    &FAILURE,
    &COUNT,
    &EXEC_COUNT,
    &REQUEST_DURATION,
    &QUEUE_DURATION,
    &COMPUTE_INPUT_DURATION,
    &COMPUTE_INFER_DURATION,
    &COMPUTE_OUTPUT_DURATION,
    &PENDING,
    &LOAD_DURATION,
    &STUB_STATE,
    &STUB_RESTARTS,
    &STUB_RSS,
    &STUB_SHM,
    &STUB_INFLIGHT,
];

/// The names of the server's metric families; custom metrics may not use them.
pub const SERVER_METRIC_NAMES: [&str; 16] = [
    SUCCESS.name,
    FAILURE.name,
    COUNT.name,
    EXEC_COUNT.name,
    REQUEST_DURATION.name,
    QUEUE_DURATION.name,
    COMPUTE_INPUT_DURATION.name,
    COMPUTE_INFER_DURATION.name,
    COMPUTE_OUTPUT_DURATION.name,
    PENDING.name,
    LOAD_DURATION.name,
    STUB_STATE.name,
    STUB_RESTARTS.name,
    STUB_RSS.name,
    STUB_SHM.name,
    STUB_INFLIGHT.name,
];

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

#[derive(Clone, Copy, Debug, PartialEq)]
enum SampleValue {
    Counter(u64),
    Gauge(f64),
}

/// The recorder that holds the server's series, and what was last set on it.
struct ServerRecorder {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Every series set by the last render; counters with their value.
    last: HashMap<Key, Option<u64>>,
}

impl ServerRecorder {
    fn new() -> Self {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        for family in FAMILIES {
            let name = KeyName::from_const_str(family.name);
            let help = SharedString::const_str(family.help);
            match family.ty {
                Type::Counter => recorder.describe_counter(name, None, help),
                Type::Gauge => recorder.describe_gauge(name, None, help),
            }
        }
        Self { recorder, handle, last: HashMap::new() }
    }

    /// Whether the new samples can be set on this recorder: a metrics counter can only grow
    /// (`Counter::absolute` keeps the maximum) and a series cannot be removed, so a counter
    /// that went down (a model reloaded) or a series that is gone (a model unloaded) needs a
    /// fresh recorder.
    fn accepts(&self, samples: &HashMap<Key, SampleValue>) -> bool {
        self.last.iter().all(|(key, last)| match (samples.get(key), last) {
            (None, _) => false,
            (Some(SampleValue::Counter(value)), Some(last)) => value >= last,
            (Some(_), _) => true,
        })
    }

    fn set(&mut self, samples: HashMap<Key, SampleValue>) {
        self.last.clear();
        for (key, value) in samples {
            match value {
                SampleValue::Counter(value) => {
                    self.recorder.register_counter(&key, &METADATA).absolute(value);
                    self.last.insert(key, Some(value));
                }
                SampleValue::Gauge(value) => {
                    self.recorder.register_gauge(&key, &METADATA).set(value);
                    self.last.insert(key, None);
                }
            }
        }
    }
}

struct Inner {
    options: MetricsOptions,
    custom: CustomMetrics,
    server: Mutex<ServerRecorder>,
}

/// The `/metrics` registry of one server: its own series (from snapshots) and the custom
/// metrics of its models. Cheap to clone; clones share everything.
///
/// The server's series live in a `metrics-exporter-prometheus` recorder built with
/// `PrometheusBuilder::build_recorder` and never installed globally, so several can coexist.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("options", &self.inner.options).finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with Triton's default options.
    pub fn new() -> Self {
        Self::with_options(MetricsOptions::default())
    }

    /// A registry with the given options.
    pub fn with_options(options: MetricsOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                custom: CustomMetrics::with_reserved_names(&SERVER_METRIC_NAMES),
                server: Mutex::new(ServerRecorder::new()),
            }),
        }
    }

    /// The custom metrics registry (shared with this `Metrics`); it refuses the server's names.
    pub fn custom(&self) -> &CustomMetrics {
        &self.inner.custom
    }

    /// Sets the server's series from `snapshot` and returns the whole `/metrics` text: the
    /// server's families (Triton's order, samples sorted), then the custom metrics.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        let samples = samples(snapshot, self.inner.options);
        let server_text = {
            let mut server = self.inner.server.lock().unwrap_or_else(PoisonError::into_inner);
            if !server.accepts(&samples) {
                *server = ServerRecorder::new();
            }
            server.set(samples);
            server.handle.render()
        };
        let mut out = String::with_capacity(server_text.len() + 1024);
        normalize(&server_text, &mut out);
        self.inner.custom.render_to(&mut out);
        out
    }
}

fn key(family: &FamilyDef, labels: Vec<(&'static str, &str)>) -> Key {
    // Labels in name order, as Triton's (std::map) labels come out.
    let labels: Vec<Label> = labels.into_iter().map(|(k, v)| Label::new(k, v.to_owned())).collect();
    Key::from_parts(KeyName::from_const_str(family.name), labels)
}

/// The series a snapshot sets; a series given twice (a snapshot listing a model twice) keeps
/// its last value.
fn samples(snapshot: &Snapshot, options: MetricsOptions) -> HashMap<Key, SampleValue> {
    use SampleValue::{Counter, Gauge};
    let mut out = Vec::with_capacity(snapshot.models.len() * 16 + snapshot.instances.len() * 5);
    for model in &snapshot.models {
        let labels = || vec![("model", model.name.as_str()), ("version", model.version.as_str())];
        out.push((key(&SUCCESS, labels()), Counter(model.success)));
        let failures = [
            ("REJECTED", model.failure.rejected),
            ("CANCELED", model.failure.canceled),
            ("BACKEND", model.failure.backend),
            ("OTHER", model.failure.other),
        ];
        for (reason, count) in failures {
            let labels = vec![("model", model.name.as_str()), ("reason", reason), ("version", model.version.as_str())];
            out.push((key(&FAILURE, labels), Counter(count)));
        }
        out.push((key(&COUNT, labels()), Counter(model.inference_count)));
        out.push((key(&EXEC_COUNT, labels()), Counter(model.exec_count)));
        if options.counter_latencies {
            let durations = [
                (&REQUEST_DURATION, model.request_duration_ns),
                (&QUEUE_DURATION, model.queue_duration_ns),
                (&COMPUTE_INPUT_DURATION, model.compute_input_duration_ns),
                (&COMPUTE_INFER_DURATION, model.compute_infer_duration_ns),
                (&COMPUTE_OUTPUT_DURATION, model.compute_output_duration_ns),
            ];
            for (family, ns) in durations {
                out.push((key(family, labels()), Counter(ns / 1000)));
            }
        }
        out.push((key(&PENDING, labels()), Gauge(model.pending_requests as f64)));
        if let Some(secs) = model.load_duration_secs {
            out.push((key(&LOAD_DURATION, labels()), Gauge(secs)));
        }
    }
    for instance in &snapshot.instances {
        let labels = || {
            vec![
                ("instance", instance.instance.as_str()),
                ("model", instance.model.as_str()),
                ("version", instance.version.as_str()),
            ]
        };
        let state = vec![
            ("instance", instance.instance.as_str()),
            ("model", instance.model.as_str()),
            ("state", instance.state.as_str()),
            ("version", instance.version.as_str()),
        ];
        out.push((key(&STUB_STATE, state), Gauge(1.0)));
        out.push((key(&STUB_RESTARTS, labels()), Counter(instance.restarts)));
        if let Some(rss) = instance.rss_bytes {
            out.push((key(&STUB_RSS, labels()), Gauge(rss as f64)));
        }
        out.push((key(&STUB_SHM, labels()), Gauge(instance.shm_bytes as f64)));
        out.push((key(&STUB_INFLIGHT, labels()), Gauge(instance.inflight as f64)));
    }
    out.into_iter().collect()
}

/// Rewrites the exporter's text (families in hash order, separated by blank lines) in a stable
/// order: server families as in [`FAMILIES`], then any other by name; HELP and TYPE first, then
/// the samples sorted; no blank lines, like Triton's output.
fn normalize(text: &str, out: &mut String) {
    struct Block<'a> {
        rank: usize,
        name: &'a str,
        comments: Vec<&'a str>,
        samples: Vec<&'a str>,
    }
    let mut blocks: Vec<Block<'_>> = Vec::new();
    for chunk in text.split("\n\n") {
        let mut comments = Vec::new();
        let mut samples = Vec::new();
        for line in chunk.lines().filter(|line| !line.trim().is_empty()) {
            if line.starts_with('#') {
                comments.push(line);
            } else {
                samples.push(line);
            }
        }
        let Some(first) = comments.first().or(samples.first()) else {
            continue;
        };
        let name = if first.starts_with('#') {
            first.split_whitespace().nth(2).unwrap_or_default()
        } else {
            first.split(['{', ' ']).next().unwrap_or_default()
        };
        let rank = FAMILIES.iter().position(|family| family.name == name).unwrap_or(FAMILIES.len());
        // HELP before TYPE, whatever the exporter did.
        comments.sort_by_key(|line| !line.starts_with("# HELP"));
        samples.sort_unstable();
        blocks.push(Block { rank, name, comments, samples });
    }
    blocks.sort_by(|a, b| (a.rank, a.name).cmp(&(b.rank, b.name)));
    for block in blocks {
        for line in block.comments.iter().chain(&block.samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::custom::{MetricError, MetricKind};

    fn simple() -> ModelSnapshot {
        ModelSnapshot {
            name: "simple".into(),
            version: "1".into(),
            success: 10,
            failure: FailureCounts { rejected: 1, canceled: 2, backend: 3, other: 4 },
            inference_count: 40,
            exec_count: 5,
            request_duration_ns: 1_234_567,
            queue_duration_ns: 2_000_999,
            compute_input_duration_ns: 3_000,
            compute_infer_duration_ns: 4_000_000,
            compute_output_duration_ns: 999,
            pending_requests: 2,
            load_duration_secs: Some(1.5),
        }
    }

    fn instance() -> InstanceSnapshot {
        InstanceSnapshot {
            model: "simple".into(),
            version: "1".into(),
            instance: "simple_0_0".into(),
            state: "ready".into(),
            restarts: 1,
            rss_bytes: Some(1_048_576),
            shm_bytes: 268_443_648,
            inflight: 1,
        }
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn renders_tritons_names_labels_and_help_exactly() {
        let metrics = Metrics::new();
        let snapshot = Snapshot {
            models: vec![simple(), ModelSnapshot { name: "a_model".into(), version: "2".into(), ..Default::default() }],
            instances: vec![instance()],
        };
        let text = metrics.render(&snapshot);
        let expected = [
            "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
            "# TYPE nv_inference_request_success counter",
            "nv_inference_request_success{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_request_success{model=\"simple\",version=\"1\"} 10",
            "# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes",
            "# TYPE nv_inference_request_failure counter",
            "nv_inference_request_failure{model=\"a_model\",reason=\"BACKEND\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"a_model\",reason=\"CANCELED\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"a_model\",reason=\"OTHER\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"a_model\",reason=\"REJECTED\",version=\"2\"} 0",
            "nv_inference_request_failure{model=\"simple\",reason=\"BACKEND\",version=\"1\"} 3",
            "nv_inference_request_failure{model=\"simple\",reason=\"CANCELED\",version=\"1\"} 2",
            "nv_inference_request_failure{model=\"simple\",reason=\"OTHER\",version=\"1\"} 4",
            "nv_inference_request_failure{model=\"simple\",reason=\"REJECTED\",version=\"1\"} 1",
            "# HELP nv_inference_count Number of inferences performed (does not include cached requests)",
            "# TYPE nv_inference_count counter",
            "nv_inference_count{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_count{model=\"simple\",version=\"1\"} 40",
            "# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)",
            "# TYPE nv_inference_exec_count counter",
            "nv_inference_exec_count{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_exec_count{model=\"simple\",version=\"1\"} 5",
            "# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds (includes cached requests)",
            "# TYPE nv_inference_request_duration_us counter",
            "nv_inference_request_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_request_duration_us{model=\"simple\",version=\"1\"} 1234",
            "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds (includes cached requests)",
            "# TYPE nv_inference_queue_duration_us counter",
            "nv_inference_queue_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_queue_duration_us{model=\"simple\",version=\"1\"} 2000",
            "# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds (does not include cached requests)",
            "# TYPE nv_inference_compute_input_duration_us counter",
            "nv_inference_compute_input_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_compute_input_duration_us{model=\"simple\",version=\"1\"} 3",
            "# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds (does not include cached requests)",
            "# TYPE nv_inference_compute_infer_duration_us counter",
            "nv_inference_compute_infer_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_compute_infer_duration_us{model=\"simple\",version=\"1\"} 4000",
            "# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds (does not include cached requests)",
            "# TYPE nv_inference_compute_output_duration_us counter",
            "nv_inference_compute_output_duration_us{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_compute_output_duration_us{model=\"simple\",version=\"1\"} 0",
            "# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.",
            "# TYPE nv_inference_pending_request_count gauge",
            "nv_inference_pending_request_count{model=\"a_model\",version=\"2\"} 0",
            "nv_inference_pending_request_count{model=\"simple\",version=\"1\"} 2",
            "# HELP nv_model_load_duration_secs Model load time in seconds",
            "# TYPE nv_model_load_duration_secs gauge",
            "nv_model_load_duration_secs{model=\"simple\",version=\"1\"} 1.5",
            "# HELP tritium_stub_state State of the stub process of a model instance: 1 for the state it is in (label state)",
            "# TYPE tritium_stub_state gauge",
            "tritium_stub_state{instance=\"simple_0_0\",model=\"simple\",state=\"ready\",version=\"1\"} 1",
            "# HELP tritium_stub_restarts_total Number of times the supervisor restarted the stub of a model instance",
            "# TYPE tritium_stub_restarts_total counter",
            "tritium_stub_restarts_total{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 1",
            "# HELP tritium_stub_rss_bytes Resident memory of the stub process of a model instance, in bytes",
            "# TYPE tritium_stub_rss_bytes gauge",
            "tritium_stub_rss_bytes{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 1048576",
            "# HELP tritium_stub_shm_bytes Shared memory mapped for the stub of a model instance (control and arena segments), in bytes",
            "# TYPE tritium_stub_shm_bytes gauge",
            "tritium_stub_shm_bytes{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 268443648",
            "# HELP tritium_stub_inflight_requests Number of requests the stub of a model instance is executing now",
            "# TYPE tritium_stub_inflight_requests gauge",
            "tritium_stub_inflight_requests{instance=\"simple_0_0\",model=\"simple\",version=\"1\"} 1",
        ];
        let got = lines(&text);
        for (i, (got, want)) in got.iter().zip(expected.iter()).enumerate() {
            assert_eq!(got, want, "line {i}");
        }
        assert_eq!(got.len(), expected.len(), "{text}");
        // Rendering again with the same snapshot gives the same page.
        assert_eq!(metrics.render(&snapshot), text);
    }

    #[test]
    fn an_empty_server_renders_nothing() {
        assert_eq!(Metrics::new().render(&Snapshot::default()), "");
    }

    #[test]
    fn counters_follow_the_snapshot_down_and_unloaded_series_go() {
        let metrics = Metrics::new();
        let mut snapshot = Snapshot { models: vec![simple()], instances: vec![instance()] };
        assert!(metrics
            .render(&snapshot)
            .contains("nv_inference_request_success{model=\"simple\",version=\"1\"} 10\n"));

        snapshot.models[0].success = 12;
        assert!(metrics
            .render(&snapshot)
            .contains("nv_inference_request_success{model=\"simple\",version=\"1\"} 12\n"));

        // The model was reloaded: its statistics start again from zero.
        snapshot.models[0].success = 3;
        let text = metrics.render(&snapshot);
        assert!(text.contains("nv_inference_request_success{model=\"simple\",version=\"1\"} 3\n"), "{text}");

        // The stub restarted and changed state; the dead process has no RSS.
        snapshot.instances[0].state = "restarting".into();
        snapshot.instances[0].rss_bytes = None;
        let text = metrics.render(&snapshot);
        assert!(text.contains("state=\"restarting\""), "{text}");
        assert!(!text.contains("state=\"ready\""), "{text}");
        assert!(!text.contains("tritium_stub_rss_bytes"), "{text}");

        // Unloaded.
        let text = metrics.render(&Snapshot::default());
        assert_eq!(text, "");
    }

    #[test]
    fn counter_latencies_can_be_turned_off() {
        let metrics = Metrics::with_options(MetricsOptions { counter_latencies: false });
        let text = metrics.render(&Snapshot { models: vec![simple()], instances: vec![] });
        assert!(!text.contains("_duration_us"), "{text}");
        assert!(text.contains("nv_inference_count{model=\"simple\",version=\"1\"} 40\n"), "{text}");
    }

    #[test]
    fn custom_metrics_follow_the_server_metrics() {
        let metrics = Metrics::new();
        let custom = metrics.custom().clone();
        let family = custom
            .family("requests_process_latency_ns", "Cumulative time spent processing requests", MetricKind::Counter)
            .unwrap();
        let metric = custom
            .metric(family, vec![("model".into(), "custom_metrics".into()), ("version".into(), "1".into())], None)
            .unwrap();
        custom.increment(metric, 42.0).unwrap();
        let text = metrics.render(&Snapshot { models: vec![simple()], instances: vec![] });
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        assert_eq!(
            tail,
            [
                "requests_process_latency_ns{model=\"custom_metrics\",version=\"1\"} 42",
                "# TYPE requests_process_latency_ns counter",
                "# HELP requests_process_latency_ns Cumulative time spent processing requests",
            ]
        );
        // The server's names are not available to models.
        for name in SERVER_METRIC_NAMES {
            assert_eq!(custom.family(name, "d", MetricKind::Counter), Err(MetricError::ReservedName(name.to_owned())));
        }
    }

    #[test]
    fn metrics_instances_are_independent() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.render(&Snapshot { models: vec![simple()], instances: vec![] });
        assert_eq!(b.render(&Snapshot::default()), "");
        a.custom().family("only_in_a", "d", MetricKind::Gauge).unwrap();
        assert!(b.custom().family("only_in_a", "d", MetricKind::Counter).is_ok());
    }

    #[test]
    fn concurrent_renders_are_consistent() {
        let metrics = Metrics::new();
        let threads: Vec<_> = (0..4u64)
            .map(|i| {
                let metrics = metrics.clone();
                std::thread::spawn(move || {
                    for n in 0..50u64 {
                        let mut model = simple();
                        model.success = i * 1000 + n;
                        let text = metrics.render(&Snapshot { models: vec![model], instances: vec![] });
                        let want = format!(
                            "nv_inference_request_success{{model=\"simple\",version=\"1\"}} {}\n",
                            i * 1000 + n
                        );
                        assert!(text.contains(&want), "{text}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn normalize_orders_families_and_samples() {
        let text = "# TYPE zzz gauge\nzzz 1\n\n# HELP nv_inference_count h\n# TYPE nv_inference_count counter\n\
                    nv_inference_count{model=\"b\"} 2\nnv_inference_count{model=\"a\"} 1\n\n\
                    # TYPE nv_inference_request_success counter\n# HELP nv_inference_request_success h\nnv_inference_request_success 0\n\n";
        let mut out = String::new();
        normalize(text, &mut out);
        assert_eq!(
            lines(&out),
            [
                "# HELP nv_inference_request_success h",
                "# TYPE nv_inference_request_success counter",
                "nv_inference_request_success 0",
                "# HELP nv_inference_count h",
                "# TYPE nv_inference_count counter",
                "nv_inference_count{model=\"a\"} 1",
                "nv_inference_count{model=\"b\"} 2",
                "# TYPE zzz gauge",
                "zzz 1",
            ]
        );
    }
}
