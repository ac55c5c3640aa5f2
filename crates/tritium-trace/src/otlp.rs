//! OpenTelemetry mode: Triton's spans for a finished trace, the OTLP protobuf messages they
//! travel in (the few of `opentelemetry/proto/{trace,common,resource}/v1` and
//! `collector/trace/v1` that export needs, declared here with prost's derive, field numbers
//! as in the published protos), and the exporter: a bounded queue that request threads push
//! to without waiting, drained by a background task that POSTs batches over HTTP/1.1.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tritium_sync::Locked;

use crate::{ActiveTrace, Activity, Clock, OtelOptions, TraceError, TraceParent};

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_spans: Vec<ResourceSpans>,
}

/// `ResourceSpans`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_spans: Vec<ScopeSpans>,
}

/// `Resource`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub(crate) attributes: Vec<KeyValue>,
}

/// `ScopeSpans`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) spans: Vec<Span>,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
}

/// `Span`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub(crate) name: String,
    /// `SpanKind`: 2 is `SPAN_KIND_SERVER`, as Triton's spans.
    #[prost(int32, tag = "6")]
    pub(crate) kind: i32,
    #[prost(fixed64, tag = "7")]
    pub(crate) start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub(crate) end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "11")]
    pub(crate) events: Vec<Event>,
    /// W3C trace flags (bit 0: sampled).
    #[prost(fixed32, tag = "16")]
    pub(crate) flags: u32,
}

/// `Span.Event`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Event {
    #[prost(fixed64, tag = "1")]
    pub(crate) time_unix_nano: u64,
    #[prost(string, tag = "2")]
    pub(crate) name: String,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct KeyValue {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
}

/// `AnyValue` (the string and int cases).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 3")]
    pub(crate) value: Option<any_value::Value>,
}

/// `AnyValue`'s oneof.
pub(crate) mod any_value {
    /// The value.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Value {
        /// `string_value`.
        #[prost(string, tag = "1")]
        StringValue(String),
        /// `int_value`.
        #[prost(int64, tag = "3")]
        IntValue(i64),
    }
}

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }) }
}

fn int_kv(key: &str, value: i64) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }) }
}

const SERVER: i32 = 2;

/// Triton's spans for one trace: `InferRequest` (unless it is a BLS call, whose spans hang off
/// the caller's compute span), a span named after the model with Triton's attributes and the
/// request's events, and `compute` with the compute events, when the request got that far.
pub(crate) fn spans(t: &ActiveTrace, clock: &Clock) -> Vec<Span> {
    let at = |a: Activity| t.events.iter().find(|(x, _)| *x == a).map(|(_, i)| clock.unix(*i));
    let end = at(Activity::RequestEnd).unwrap_or(0);
    let start = at(Activity::RequestStart).unwrap_or(end);
    let mut events: Vec<(Activity, u64)> = t.events.iter().map(|(a, i)| (*a, clock.unix(*i))).collect();
    events.sort_by_key(|(_, ns)| *ns);
    let event = |(a, ns): &(Activity, u64)| Event { time_unix_nano: *ns, name: a.name().into() };
    let span = |span_id: [u8; 8], parent: Vec<u8>, name: &str| Span {
        trace_id: t.trace_id.to_vec(),
        span_id: span_id.to_vec(),
        parent_span_id: parent,
        name: name.into(),
        kind: SERVER,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: Vec::new(),
        events: Vec::new(),
        flags: 1,
    };
    let mut out = Vec::with_capacity(3);
    let request_parent = match (t.parent, t.root_span) {
        (Some(TraceParent::Caller(ctx)), _) => ctx.span_id.to_vec(),
        (parent, Some(root)) => {
            let remote = match parent {
                Some(TraceParent::Remote(ctx)) => ctx.span_id.to_vec(),
                _ => Vec::new(),
            };
            out.push(span(root, remote, "InferRequest"));
            root.to_vec()
        }
        (_, None) => Vec::new(),
    };
    let mut request = span(t.request_span, request_parent, &t.model);
    request.attributes = vec![
        string_kv("triton.model_name", &t.model),
        int_kv("triton.model_version", t.version),
        int_kv("triton.trace_id", t.id as i64),
        int_kv("triton.trace_parent_id", 0),
    ];
    if !t.request_id.is_empty() {
        request.attributes.push(string_kv("triton.request_id", &t.request_id));
    }
    request.events = events.iter().filter(|(a, _)| !a.is_compute()).map(event).collect();
    out.push(request);
    if let Some(compute_start) = at(Activity::ComputeStart) {
        let mut compute = span(t.compute_span, t.request_span.to_vec(), "compute");
        compute.start_time_unix_nano = compute_start;
        compute.end_time_unix_nano = at(Activity::ComputeEnd).unwrap_or(end);
        compute.events = events.iter().filter(|(a, _)| a.is_compute()).map(event).collect();
        out.push(compute);
    }
    out
}

/// The export request for a batch of spans.
pub(crate) fn encode(resource: &[KeyValue], spans: Vec<Span>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: resource.to_vec() }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "triton-server".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    }
    .encode_to_vec()
}

/// An `http://host[:port]/path` url, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) path: String,
}

impl Target {
    /// Parses the url; a url without a scheme is taken as `http://` (Triton's examples give
    /// `localhost:4318/v1/traces`).
    pub(crate) fn parse(url: &str) -> Result<Target, TraceError> {
        let bad = |why: &str| TraceError::Url { url: url.to_string(), why: why.to_string() };
        let rest = if let Some(rest) = url.strip_prefix("http://") {
            rest
        } else if url.starts_with("https://") {
            return Err(bad("tritium exports over plain http only; put a collector or proxy with TLS in between"));
        } else if url.contains("://") {
            return Err(bad("the url must start with http://"));
        } else {
            url
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/v1/traces"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                (h, p.parse::<u16>().map_err(|_| bad("the port is not a number from 1 to 65535"))?)
            }
            _ => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad("the url names no host"));
        }
        Ok(Target { host: host.trim_matches(['[', ']']).to_string(), port, path: path.to_string() })
    }
}

/// The exporter: a bounded queue of spans and the task that sends them.
pub(crate) struct Exporter {
    tx: Mutex<Option<mpsc::Sender<Span>>>,
    dropped: Arc<AtomicU64>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Exporter {
    /// Starts the export task (inside a tokio runtime).
    pub(crate) fn start(opts: &OtelOptions) -> Result<Exporter, TraceError> {
        let target = Target::parse(&opts.url)?;
        let (tx, rx) = mpsc::channel(opts.max_queue_size.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let mut resource = vec![];
        if !opts.resource.iter().any(|(k, _)| k == "service.name") {
            resource.push(string_kv("service.name", "triton-inference-server"));
        }
        resource.extend(opts.resource.iter().map(|(k, v)| string_kv(k, v)));
        let task = tokio::spawn(run(
            rx,
            target,
            resource,
            Duration::from_millis(opts.schedule_delay_ms),
            opts.max_export_batch_size.max(1),
            dropped.clone(),
        ));
        Ok(Exporter { tx: Mutex::new(Some(tx)), dropped, task: Mutex::new(Some(task)) })
    }

    /// Queues a span without waiting; a full queue drops it and counts it.
    pub(crate) fn push(&self, span: Span) {
        let tx = self.tx.locked();
        let queued = tx.as_ref().is_some_and(|tx| tx.try_send(span).is_ok());
        if !queued {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Closes the queue and waits (at most `timeout`) for the task to send what is in it.
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        self.tx.locked().take();
        let task = self.task.locked().take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(timeout, task).await;
        }
    }
}

/// How long one export may take before its batch is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

async fn run(
    mut rx: mpsc::Receiver<Span>,
    target: Target,
    resource: Vec<KeyValue>,
    delay: Duration,
    max_batch: usize,
    dropped: Arc<AtomicU64>,
) {
    let mut failures = 0u64;
    loop {
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + delay;
        // A closed queue still yields what was queued before it closed, then `None`.
        while batch.len() < max_batch {
            tokio::select! {
                span = rx.recv() => match span {
                    Some(s) => batch.push(s),
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let n = batch.len() as u64;
        let body = encode(&resource, batch);
        let sent = tokio::time::timeout(EXPORT_TIMEOUT, post(&target, &body)).await;
        let failure = match sent {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("no answer within {}s", EXPORT_TIMEOUT.as_secs())),
        };
        if let Some(why) = failure {
            dropped.fetch_add(n, Ordering::Relaxed);
            if failures.is_multiple_of(100) {
                tracing::warn!(
                    "cannot export {n} trace spans to http://{}:{}{}: {why} ({} failed exports so far)",
                    target.host,
                    target.port,
                    target.path,
                    failures + 1
                );
            }
            failures += 1;
        }
    }
}

/// POSTs one export request; a 2xx answer is success.
async fn post(target: &Target, body: &[u8]) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: tritium/{}\r\n\r\n",
        target.path,
        target.host,
        target.port,
        body.len(),
        env!("CARGO_PKG_VERSION"),
    );
    stream.write_all(head.as_bytes()).await.map_err(|e| format!("cannot send: {e}"))?;
    stream.write_all(body).await.map_err(|e| format!("cannot send: {e}"))?;
    // The status line is all that matters; read until it is complete (bounded).
    let mut answer = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") && answer.len() < 8192 {
        let n = stream.read(&mut buf).await.map_err(|e| format!("cannot read the answer: {e}"))?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&answer);
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(s) if (200..300).contains(&s) => Ok(()),
        Some(s) => Err(format!("the collector answered HTTP {s}")),
        None => Err("the collector's answer is not HTTP".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Level, Mode, Settings, SpanContext, TraceFlags, Tracer};
    use std::time::Instant;
    use tokio::net::TcpListener;

    #[test]
    fn urls_parse() {
        let t = Target::parse("http://127.0.0.1:4318/v1/traces").expect("valid");
        assert_eq!(t, Target { host: "127.0.0.1".into(), port: 4318, path: "/v1/traces".into() });
        let t = Target::parse("localhost:4318/v1/traces").expect("no scheme");
        assert_eq!((t.host.as_str(), t.port), ("localhost", 4318));
        assert_eq!(Target::parse("http://collector").expect("default port").port, 80);
        assert!(Target::parse("https://collector/v1/traces").is_err());
        assert!(Target::parse("http://host:port/x").is_err());
    }

    /// One HTTP request read off a socket: its head and body.
    async fn read_request(stream: &mut tokio::net::TcpStream) -> (String, Vec<u8>) {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.expect("read");
            data.extend_from_slice(&buf[..n]);
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&data[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("content length");
                while data.len() < end + 4 + len {
                    let n = stream.read(&mut buf).await.expect("read body");
                    assert!(n > 0, "body cut short");
                    data.extend_from_slice(&buf[..n]);
                }
                return (head, data[end + 4..end + 4 + len].to_vec());
            }
            assert!(n > 0, "head cut short");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_reach_the_collector_in_the_callers_trace() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let flags = TraceFlags {
            settings: Settings { level: Level::TIMESTAMPS, rate: 1, mode: Mode::OpenTelemetry, ..Settings::default() },
            otel: OtelOptions {
                url: format!("http://127.0.0.1:{port}/v1/traces"),
                schedule_delay_ms: 10,
                ..OtelOptions::default()
            },
            warnings: vec![],
        };
        let tracer = Tracer::new(&flags).expect("tracer");
        let caller =
            SpanContext::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("valid");
        let mut t = tracer.start("add_sub", Some(TraceParent::Remote(caller)), Instant::now()).expect("forced");
        t.identify(1, "r1");
        t.stamp(Activity::QueueStart, Instant::now());
        t.stamp(Activity::ComputeStart, Instant::now());
        t.stamp(Activity::ComputeEnd, Instant::now());
        let child = SpanContext::from_triton_context(&t.model_context().expect("otel context")).expect("ctx");
        drop(t);
        let (mut stream, _) = listener.accept().await.expect("export arrives");
        let (head, body) = read_request(&mut stream).await;
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.expect("answer");
        assert!(head.starts_with("POST /v1/traces HTTP/1.1"), "{head}");
        assert!(head.contains("Content-Type: application/x-protobuf"));
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("protobuf");
        let spans = &req.resource_spans[0].scope_spans[0].spans;
        let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["InferRequest", "add_sub", "compute"]);
        assert!(spans.iter().all(|s| s.trace_id == caller.trace_id));
        assert_eq!(spans[0].parent_span_id, caller.span_id);
        assert_eq!(spans[1].parent_span_id, spans[0].span_id);
        assert_eq!(spans[2].parent_span_id, spans[1].span_id);
        assert_eq!(spans[2].span_id, child.span_id, "BLS calls hang off the compute span");
        let events: Vec<_> = spans[1].events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(events, ["REQUEST_START", "QUEUE_START", "REQUEST_END"]);
        let compute: Vec<_> = spans[2].events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(compute, ["COMPUTE_START", "COMPUTE_END"]);
        assert!(spans[1].attributes.contains(&string_kv("triton.request_id", "r1")));
        tracer.shutdown(Duration::from_secs(1)).await;
        assert_eq!(tracer.dropped_spans(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_collector_drops_and_counts_without_blocking() {
        // A port nobody listens on: bind, then close.
        let port = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr").port();
        let flags = TraceFlags {
            settings: Settings { level: Level::TIMESTAMPS, rate: 1, mode: Mode::OpenTelemetry, ..Settings::default() },
            otel: OtelOptions {
                url: format!("http://127.0.0.1:{port}/v1/traces"),
                schedule_delay_ms: 1,
                max_queue_size: 4,
                max_export_batch_size: 4,
                ..OtelOptions::default()
            },
            warnings: vec![],
        };
        let tracer = Tracer::new(&flags).expect("tracer");
        let started = Instant::now();
        for _ in 0..100 {
            drop(tracer.start("m", None, Instant::now()).expect("sampled"));
        }
        assert!(started.elapsed() < Duration::from_secs(1), "pushing never waits");
        tracer.shutdown(Duration::from_secs(5)).await;
        assert_eq!(tracer.dropped_spans(), 200, "every span (2 a trace) is dropped and counted");
    }
}
