//! The frontend's own Prometheus families, per model: requests by endpoint and outcome, time
//! to first token and inter-token latency histograms. Rendered as text appended to the
//! server's `/metrics` page (family names `tritium_openai_*`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tritium_sync::Locked;

/// Bucket bounds (seconds) of both latency histograms.
const BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.counts[i] += 1;
        }
        self.sum += secs;
        self.count += 1;
    }
}

#[derive(Debug, Default)]
struct PerModel {
    requests: BTreeMap<(&'static str, &'static str), u64>,
    ttft: Histogram,
    itl: Histogram,
}

/// The frontend's metrics store; cheap to share.
#[derive(Debug, Default)]
pub struct Metrics {
    models: Mutex<BTreeMap<String, PerModel>>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    fn with(&self, model: &str, f: impl FnOnce(&mut PerModel)) {
        let mut models = self.models.locked();
        f(models.entry(model.to_owned()).or_default());
    }

    /// The Prometheus text of the families (empty before the first request).
    pub fn render(&self) -> String {
        let models = self.models.locked();
        if models.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        out.push_str("# HELP tritium_openai_requests_total Requests to the OpenAI frontend, by model, endpoint and outcome (success, error, cancelled)\n");
        out.push_str("# TYPE tritium_openai_requests_total counter\n");
        for (model, m) in models.iter() {
            for ((endpoint, outcome), n) in &m.requests {
                let _ = writeln!(
                    out,
                    "tritium_openai_requests_total{{endpoint=\"{endpoint}\",model=\"{}\",outcome=\"{outcome}\"}} {n}",
                    escape(model)
                );
            }
        }
        for (name, help, pick) in [
            (
                "tritium_openai_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first response from the model",
                (|m: &PerModel| &m.ttft) as fn(&PerModel) -> &Histogram,
            ),
            (
                "tritium_openai_inter_token_latency_seconds",
                "Seconds between consecutive responses of one streamed request",
                |m: &PerModel| &m.itl,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (model, m) in models.iter() {
                let h = pick(m);
                let model = escape(model);
                let mut cumulative = 0;
                for (i, b) in BUCKETS.iter().enumerate() {
                    cumulative += h.counts.get(i).copied().unwrap_or(0);
                    let _ = writeln!(out, "{name}_bucket{{model=\"{model}\",le=\"{b}\"}} {cumulative}");
                }
                let _ = writeln!(out, "{name}_bucket{{model=\"{model}\",le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "{name}_sum{{model=\"{model}\"}} {}", h.sum);
                let _ = writeln!(out, "{name}_count{{model=\"{model}\"}} {}", h.count);
            }
        }
        out
    }
}

/// One request's timings; records its outcome when dropped (`cancelled` unless it finished).
pub struct Tracker {
    metrics: Arc<Metrics>,
    model: String,
    endpoint: &'static str,
    start: Instant,
    last: Option<Instant>,
    outcome: &'static str,
}

impl Tracker {
    /// Starts tracking a request for `model` on `endpoint` (`chat` or `completions`).
    pub fn new(metrics: Arc<Metrics>, model: &str, endpoint: &'static str, start: Instant) -> Self {
        Self { metrics, model: model.to_owned(), endpoint, start, last: None, outcome: "cancelled" }
    }

    /// A response from the model arrived.
    pub fn response(&mut self) {
        let now = Instant::now();
        let since = now.duration_since(self.last.unwrap_or(self.start)).as_secs_f64();
        let first = self.last.is_none();
        self.metrics.with(&self.model, |m| if first { m.ttft.observe(since) } else { m.itl.observe(since) });
        self.last = Some(now);
    }

    /// The request ended with `outcome` (`success` or `error`).
    pub fn finish(&mut self, outcome: &'static str) {
        self.outcome = outcome;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let key = (self.endpoint, self.outcome);
        self.metrics.with(&self.model, |m| *m.requests.entry(key).or_default() += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_with_cumulative_buckets() {
        let metrics = Arc::new(Metrics::default());
        assert_eq!(metrics.render(), "");
        {
            let mut t = Tracker::new(metrics.clone(), "m\"x", "chat", Instant::now());
            t.response();
            t.response();
            t.finish("success");
        }
        drop(Tracker::new(metrics.clone(), "m\"x", "completions", Instant::now()));
        let text = metrics.render();
        assert!(
            text.contains("tritium_openai_requests_total{endpoint=\"chat\",model=\"m\\\"x\",outcome=\"success\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("outcome=\"cancelled\"} 1\n"), "{text}");
        assert!(text.contains("tritium_openai_time_to_first_token_seconds_count{model=\"m\\\"x\"} 1\n"), "{text}");
        assert!(
            text.contains("tritium_openai_inter_token_latency_seconds_bucket{model=\"m\\\"x\",le=\"+Inf\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE tritium_openai_inter_token_latency_seconds histogram\n"), "{text}");
    }
}
