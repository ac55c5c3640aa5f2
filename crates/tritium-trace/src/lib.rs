//! Request tracing with Triton's semantics, free of HTTP servers and gRPC: the core asks a
//! [`Tracer`] whether to trace a request ([`Tracer::start`]), stamps the [`ActiveTrace`] it
//! gets with Triton's activities as the request moves, and the trace is recorded when it is
//! dropped. What recording means is the mode's:
//!
//! - `opentelemetry`: Triton's spans (`InferRequest`, then a span named after the model with
//!   Triton's attributes and the request's events, then `compute` with the compute events)
//!   are queued, without waiting, for a background task that POSTs them in batches as OTLP
//!   protobuf to the collector (`otlp.rs`). A full queue drops spans and counts them; a slow or
//!   dead collector never slows a request.
//! - `triton`: Triton's JSON trace objects are appended to the trace file (`file.rs`).
//!
//! Settings (`settings.rs`) are global with per-model overrides, updated at run time through
//! the trace extension with Triton's fallback rules; the caller's W3C trace context
//! (`context.rs`) makes a request part of the caller's trace.

mod context;
mod file;
mod otlp;
mod settings;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tritium_sync::Locked;

pub use context::{SpanContext, TraceParent};
pub use settings::{
    parse_flags, parse_update, Change, FlagError, LegacyFlags, Level, Mode, OtelOptions, SettingError, Settings,
    TraceFlags, Update, UpdateValue,
};

/// Triton's trace activities, in the order a request passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// The server took the request.
    RequestStart,
    /// It entered its model's queue.
    QueueStart,
    /// Its batch was taken by an instance.
    ComputeStart,
    /// Its inputs were in the stub's shared memory.
    ComputeInputEnd,
    /// The model's outputs came back.
    ComputeOutputStart,
    /// Its outputs were read.
    ComputeEnd,
    /// Its answer was sent.
    RequestEnd,
}

impl Activity {
    /// Triton's name (`TRITONSERVER_InferenceTraceActivityString`).
    pub fn name(self) -> &'static str {
        match self {
            Activity::RequestStart => "REQUEST_START",
            Activity::QueueStart => "QUEUE_START",
            Activity::ComputeStart => "COMPUTE_START",
            Activity::ComputeInputEnd => "COMPUTE_INPUT_END",
            Activity::ComputeOutputStart => "COMPUTE_OUTPUT_START",
            Activity::ComputeEnd => "COMPUTE_END",
            Activity::RequestEnd => "REQUEST_END",
        }
    }

    fn is_compute(self) -> bool {
        matches!(
            self,
            Activity::ComputeStart | Activity::ComputeInputEnd | Activity::ComputeOutputStart | Activity::ComputeEnd
        )
    }
}

/// Why the tracer could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The OTLP url is not one tritium can post to.
    #[error("--trace-config opentelemetry,url={url}: {why}")]
    Url {
        /// The url.
        url: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Which of a setting's fields were given (the rest follow the fallback).
#[derive(Debug, Clone, Copy, Default)]
struct Specified {
    level: bool,
    rate: bool,
    count: bool,
    log_frequency: bool,
}

/// A setting in force and its sampling state (replaced, not changed, by an update, so that
/// traces already taken keep the setting they were sampled under).
#[derive(Debug)]
struct Slot {
    settings: Settings,
    specified: Specified,
    counters: Mutex<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    /// Requests seen.
    sample: u64,
    /// Traces still to take (-1: no limit).
    count: i32,
    /// Traces taken and recorded (for writing the file when the count runs out).
    created: u64,
    collected: u64,
}

impl Slot {
    fn new(settings: Settings, specified: Specified) -> Arc<Slot> {
        let counters = Mutex::new(Counters { count: settings.count, ..Default::default() });
        Arc::new(Slot { settings, specified, counters })
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        self.counters.locked()
    }

    /// Triton's `TraceSetting::SampleTrace`: whether this request is traced.
    fn sample(&self, force: bool) -> bool {
        let s = &self.settings;
        let mut c = self.counters();
        let mut hit = false;
        if s.rate != 0 {
            let valid = s.invalid_reason().is_none() && c.count != 0;
            if !valid && !force {
                return false;
            }
            c.sample += 1;
            hit = c.sample.is_multiple_of(u64::from(s.rate));
            if hit && c.count > 0 {
                c.count -= 1;
                c.created += 1;
            } else if hit && c.count == 0 {
                hit = false;
            }
        }
        hit || force
    }

    /// The setting as it stands now (its count is what is left).
    fn current(&self) -> Settings {
        let mut s = self.settings.clone();
        s.count = self.counters().count;
        s
    }
}

struct State {
    global: Arc<Slot>,
    models: HashMap<String, Arc<Slot>>,
    /// Models whose setting follows the global one in some field.
    fallback_used: BTreeSet<String>,
}

/// Wall-clock and monotonic readings at one instant, to place `Instant`s on either clock.
struct Clock {
    at: Instant,
    unix_ns: u64,
    monotonic_ns: u64,
}

impl Clock {
    fn now() -> Clock {
        let at = Instant::now();
        let unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let monotonic_ns = if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } == 0 {
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        } else {
            0
        };
        Clock { at, unix_ns, monotonic_ns }
    }

    fn offset(&self, t: Instant) -> i128 {
        if t >= self.at {
            (t - self.at).as_nanos() as i128
        } else {
            -((self.at - t).as_nanos() as i128)
        }
    }

    /// Nanoseconds since the Unix epoch (OpenTelemetry's timestamps).
    fn unix(&self, t: Instant) -> u64 {
        (self.unix_ns as i128 + self.offset(t)).max(0) as u64
    }

    /// Nanoseconds of the monotonic clock (Triton's trace file timestamps, `steady_clock`).
    fn monotonic(&self, t: Instant) -> u64 {
        (self.monotonic_ns as i128 + self.offset(t)).max(0) as u64
    }
}

enum Sink {
    Otel(otlp::Exporter),
    File(file::TraceFile),
}

struct Shared {
    default: Settings,
    /// Whether any setting (the global one or a model's) can sample a request by its rate: when
    /// none can, a request without a trace context is not traced, without taking a lock.
    any_on: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    sink: Sink,
    next_id: AtomicU64,
    clock: Clock,
}

/// The server's tracer: settings, sampling, and where traces go. Cheap to clone.
#[derive(Clone)]
pub struct Tracer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("mode", &self.shared.default.mode).finish()
    }
}

impl Tracer {
    /// A tracer for the parsed flags. In opentelemetry mode this starts the exporter task, so
    /// it must be called inside a tokio runtime.
    pub fn new(flags: &TraceFlags) -> Result<Tracer, TraceError> {
        let settings = flags.settings.clone();
        let sink = match settings.mode {
            Mode::OpenTelemetry => Sink::Otel(otlp::Exporter::start(&flags.otel)?),
            Mode::Triton => Sink::File(file::TraceFile::new(settings.file.clone())),
        };
        let state = State {
            global: Slot::new(settings.clone(), Specified::default()),
            models: HashMap::new(),
            fallback_used: BTreeSet::new(),
        };
        Ok(Tracer {
            shared: Arc::new(Shared {
                any_on: std::sync::atomic::AtomicBool::new(samples(&settings)),
                default: settings,
                state: Mutex::new(state),
                sink,
                next_id: AtomicU64::new(1),
                clock: Clock::now(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.locked()
    }

    /// The mode (fixed at start).
    pub fn mode(&self) -> Mode {
        self.shared.default.mode
    }

    /// Decides whether a request to `model` is traced and, if so, starts its trace at
    /// `started` (its `REQUEST_START`). A caller's context makes it traced whatever the rate
    /// (in opentelemetry mode, while tracing is on), and a model's BLS call whose caller is
    /// traced is always traced.
    pub fn start(&self, model: &str, parent: Option<TraceParent>, started: Instant) -> Option<ActiveTrace> {
        if parent.is_none() && !self.shared.any_on.load(Ordering::Relaxed) {
            return None;
        }
        let slot = {
            let state = self.state();
            state.models.get(model).unwrap_or(&state.global).clone()
        };
        let otel = self.mode() == Mode::OpenTelemetry;
        let force = match parent {
            Some(TraceParent::Remote(_)) => otel && !slot.settings.level.is_off(),
            Some(TraceParent::Caller(_)) => otel,
            None => false,
        };
        if !slot.sample(force) {
            return None;
        }
        let (trace_id, root) = match parent {
            Some(TraceParent::Remote(ctx)) => (ctx.trace_id, Some(context::new_span_id())),
            Some(TraceParent::Caller(ctx)) => (ctx.trace_id, None),
            None => (context::new_trace_id(), Some(context::new_span_id())),
        };
        let level = if slot.settings.level.is_off() { Level::TIMESTAMPS } else { slot.settings.level };
        let mut trace = ActiveTrace {
            shared: self.shared.clone(),
            slot,
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            model: model.to_string(),
            version: -1,
            request_id: String::new(),
            parent,
            trace_id,
            root_span: root,
            request_span: context::new_span_id(),
            compute_span: context::new_span_id(),
            level,
            events: Vec::with_capacity(7),
        };
        trace.stamp(Activity::RequestStart, started);
        Some(trace)
    }

    /// The settings in force for `model` (the global ones for `None`, or for a model without
    /// its own).
    pub fn settings(&self, model: Option<&str>) -> Settings {
        let state = self.state();
        match model.and_then(|m| state.models.get(m)) {
            Some(slot) => slot.current(),
            None => state.global.current(),
        }
    }

    /// Applies an update of the trace extension with Triton's rules (`UpdateTraceSetting`): a
    /// model's setting takes each field it does not give from the global setting, and follows
    /// later global updates in those fields; clearing every field of a model drops its setting.
    pub fn update(&self, model: Option<&str>, update: &Update) -> Result<Settings, SettingError> {
        let mut state = self.state();
        let updated = self.update_one(&mut state, model, update).and_then(|()| {
            if model.is_none() {
                for name in state.fallback_used.clone() {
                    self.update_one(&mut state, Some(&name), &Update::default())?;
                }
            }
            Ok(())
        });
        let any_on = samples(&state.global.settings) || state.models.values().any(|m| samples(&m.settings));
        self.shared.any_on.store(any_on, Ordering::Relaxed);
        drop(state);
        updated?;
        Ok(self.settings(model))
    }

    fn update_one(&self, state: &mut State, model: Option<&str>, update: &Update) -> Result<(), SettingError> {
        let (current, fallback) = match model {
            Some(m) => (state.models.get(m).cloned(), state.global.current()),
            None => (Some(state.global.clone()), self.shared.default.clone()),
        };
        let was = |f: fn(&Specified) -> bool| current.as_ref().is_some_and(|c| f(&c.specified));
        let specified = Specified {
            level: resolve(update.level, was(|s| s.level)),
            rate: resolve(update.rate, was(|s| s.rate)),
            count: resolve(update.count, was(|s| s.count)),
            log_frequency: resolve(update.log_frequency, was(|s| s.log_frequency)),
        };
        let cur = current.as_ref().map(|c| c.current());
        let mut s = fallback;
        if specified.level {
            s.level = pick(update.level, cur.as_ref().map(|c| c.level), s.level);
        }
        if specified.rate {
            s.rate = pick(update.rate, cur.as_ref().map(|c| c.rate), s.rate);
        }
        if specified.count {
            s.count = pick(update.count, cur.as_ref().map(|c| c.count), s.count);
        }
        if specified.log_frequency {
            s.log_frequency = pick(update.log_frequency, cur.as_ref().map(|c| c.log_frequency), s.log_frequency);
        }
        if let Some(m) = model {
            // The file cannot be set per model, so a model's setting always falls back in it.
            let none = !(specified.level || specified.rate || specified.count || specified.log_frequency);
            if none {
                state.models.remove(m);
                state.fallback_used.remove(m);
                return Ok(());
            }
            state.fallback_used.insert(m.to_string());
        }
        let slot = Slot::new(s, specified);
        if !slot.settings.valid() && !slot.settings.level.is_off() {
            return Err(SettingError::Invalid(format!(
                "Attempting to set invalid trace setting :{}",
                slot.settings.invalid_reason().unwrap_or("")
            )));
        }
        match model {
            Some(m) => {
                state.models.insert(m.to_string(), slot);
            }
            None => state.global = slot,
        }
        Ok(())
    }

    /// Spans dropped because the export queue was full or the collector failed.
    pub fn dropped_spans(&self) -> u64 {
        match &self.shared.sink {
            Sink::Otel(e) => e.dropped(),
            Sink::File(_) => 0,
        }
    }

    /// Flushes what is queued (the exporter's last batch, the trace file) and stops the
    /// exporter, waiting for it at most `timeout`.
    pub async fn shutdown(&self, timeout: std::time::Duration) {
        match &self.shared.sink {
            Sink::Otel(e) => e.shutdown(timeout).await,
            Sink::File(f) => {
                let log_frequency = self.state().global.settings.log_frequency;
                f.flush(log_frequency);
            }
        }
    }
}

/// Whether a setting may sample requests by its rate (its count aside, which runs out).
fn samples(s: &Settings) -> bool {
    s.invalid_reason().is_none()
}

/// Whether a field is specified after an update (Triton's `*_specified` rule).
fn resolve<T>(change: Change<T>, was: bool) -> bool {
    match change {
        Change::Clear => false,
        Change::Set(_) => true,
        Change::Keep => was,
    }
}

/// A specified field's value: the update's, else the current one, else the fallback's.
fn pick<T: Copy>(change: Change<T>, current: Option<T>, fallback: T) -> T {
    match (change, current) {
        (Change::Set(v), _) | (_, Some(v)) => v,
        _ => fallback,
    }
}

/// One request's trace while it runs. Stamp it as the request moves; dropping it records it
/// (stamping `REQUEST_END` if nobody did).
pub struct ActiveTrace {
    shared: Arc<Shared>,
    slot: Arc<Slot>,
    id: u64,
    model: String,
    version: i64,
    request_id: String,
    parent: Option<TraceParent>,
    trace_id: [u8; 16],
    root_span: Option<[u8; 8]>,
    request_span: [u8; 8],
    compute_span: [u8; 8],
    level: Level,
    events: Vec<(Activity, Instant)>,
}

impl std::fmt::Debug for ActiveTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveTrace").field("id", &self.id).field("model", &self.model).finish()
    }
}

impl ActiveTrace {
    /// Records `activity` at `at` (a repeated activity keeps its first time).
    pub fn stamp(&mut self, activity: Activity, at: Instant) {
        if !self.events.iter().any(|(a, _)| *a == activity) {
            self.events.push((activity, at));
        }
    }

    /// Names the version and the client's request id (once the request is routed).
    pub fn identify(&mut self, version: i64, request_id: &str) {
        self.version = version;
        self.request_id = request_id.to_string();
    }

    /// Triton's trace context text for the model (`request.trace().get_context()`), naming
    /// the compute span so that the model's BLS calls become its children; `None` in triton
    /// mode, as in Triton.
    pub fn model_context(&self) -> Option<String> {
        (self.shared.default.mode == Mode::OpenTelemetry).then(|| {
            SpanContext { trace_id: self.trace_id, span_id: self.compute_span, sampled: true }.triton_context()
        })
    }

    /// Triton's trace id of this trace.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for ActiveTrace {
    fn drop(&mut self) {
        self.stamp(Activity::RequestEnd, Instant::now());
        if !self.level.timestamps() {
            self.events.clear();
        }
        match &self.shared.sink {
            Sink::Otel(exporter) => {
                for span in otlp::spans(self, &self.shared.clock) {
                    exporter.push(span);
                }
            }
            Sink::File(file) => {
                let text = file::trace_json(self, &self.shared.clock);
                let done = {
                    let mut c = self.slot.counters();
                    c.collected += 1;
                    c.count == 0 && c.created == c.collected
                };
                file.append(&text, self.slot.settings.log_frequency, done);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(settings: Settings) -> Tracer {
        Tracer::new(&TraceFlags { settings, ..Default::default() }).expect("tracer")
    }

    fn on(rate: u32, count: i32) -> Settings {
        Settings {
            level: Level::TIMESTAMPS,
            rate,
            count,
            file: "/nonexistent-dir/trace.json".into(),
            ..Settings::default()
        }
    }

    fn sampled(t: &Tracer, model: &str, n: usize) -> usize {
        (0..n).filter(|_| t.start(model, None, Instant::now()).map(std::mem::forget).is_some()).count()
    }

    #[test]
    fn rate_and_count_are_honoured() {
        assert_eq!(sampled(&tracer(on(3, -1)), "m", 9), 3);
        let t = tracer(on(1, 2));
        assert_eq!(sampled(&t, "m", 5), 2);
        assert_eq!(t.settings(None).count, 0);
        assert_eq!(sampled(&tracer(Settings::default()), "m", 5), 0);
    }

    #[test]
    fn model_settings_fall_back_to_the_global_ones() {
        let t = tracer(on(1000, -1));
        let rate = |r| Update { rate: Change::Set(r), ..Default::default() };
        let m = t.update(Some("m"), &rate(1)).expect("model update");
        assert_eq!((m.rate, m.level), (1, Level::TIMESTAMPS));
        assert_eq!(sampled(&t, "m", 3), 3);
        assert_eq!(sampled(&t, "other", 3), 0);
        // A global change reaches the fields the model did not set.
        let off = Update { level: Change::Set(Level::OFF), ..Default::default() };
        assert_eq!(t.update(None, &off).expect("global").level, Level::OFF);
        assert_eq!(t.settings(Some("m")).level, Level::OFF);
        assert_eq!(t.settings(Some("m")).rate, 1);
        // Clearing the model's only field drops its setting.
        let clear = Update { rate: Change::Clear, ..Default::default() };
        assert_eq!(t.update(Some("m"), &clear).expect("clear").rate, 1000);
    }

    #[test]
    fn an_invalid_setting_that_traces_is_refused() {
        let t = tracer(Settings::default());
        let on = Update { level: Change::Set(Level::TIMESTAMPS), ..Default::default() };
        let e = t.update(None, &on).expect_err("no file");
        assert_eq!(e.to_string(), "Attempting to set invalid trace setting :trace file name is not given");
    }

    #[test]
    fn triton_file_gets_tritons_json() {
        let dir = std::env::temp_dir().join(format!("tritium-trace-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("trace.json");
        let settings = Settings { log_frequency: 1, file: path.display().to_string(), ..on(1, -1) };
        let t = tracer(settings);
        let mut trace = t.start("add_sub", None, Instant::now()).expect("sampled");
        trace.identify(1, "req-1");
        trace.stamp(Activity::QueueStart, Instant::now());
        drop(trace);
        let text = std::fs::read_to_string(dir.join("trace.json.0")).expect("indexed file");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        let items = v.as_array().expect("array");
        assert_eq!(items[0]["model_name"], "add_sub");
        assert_eq!(items[0]["model_version"], 1);
        assert_eq!(items[0]["request_id"], "req-1");
        let names: Vec<_> = items[1..].iter().map(|i| i["timestamps"][0]["name"].as_str().unwrap_or("")).collect();
        assert_eq!(names, ["REQUEST_START", "QUEUE_START", "REQUEST_END"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
