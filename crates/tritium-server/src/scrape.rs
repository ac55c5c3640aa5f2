//! Gathering the metrics model code registers with `prometheus_client` when `/metrics` is
//! scraped: every ready instance's stub is asked at once, and the answers that come within
//! [`STUB_METRICS_TIMEOUT`] are on the page (a busy or hung stub is left out of that scrape, never
//! waited for). Nothing happens on the request path. What a stub sent that had to be left out is
//! logged once per stub process and reason.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;
use tritium_host::{ClientMetrics, MetricsProbe};
use tritium_metrics::{ClientFamily, ClientKind, ClientSample, StubFamilies};
use tritium_sync::Locked;

/// How long a scrape waits for the stubs' answers, all together.
pub const STUB_METRICS_TIMEOUT: Duration = Duration::from_secs(1);

/// Most distinct problems logged per stub process (the rest are not logged).
const MAX_WARNINGS: usize = 32;

/// One stub's metrics probe, and the problems already logged about what it sent.
pub(crate) struct StubProbe {
    probe: MetricsProbe,
    warned: Mutex<HashSet<String>>,
}

impl StubProbe {
    pub(crate) fn new(probe: MetricsProbe) -> Self {
        Self { probe, warned: Mutex::default() }
    }

    /// Logs `why` about this stub, the first time only.
    pub(crate) fn warn_once(&self, labels: &StubFamilies, why: &str) {
        let mut warned = self.warned.locked();
        if warned.len() < MAX_WARNINGS && warned.insert(why.to_string()) {
            warn!(
                model = %labels.model,
                version = %labels.version,
                instance = %labels.instance,
                "prometheus_client metrics of this stub left out of /metrics: {why}"
            );
        }
    }
}

fn kind(k: tritium_ipc::ClientMetricKind) -> ClientKind {
    match k {
        tritium_ipc::ClientMetricKind::Counter => ClientKind::Counter,
        tritium_ipc::ClientMetricKind::Gauge => ClientKind::Gauge,
        tritium_ipc::ClientMetricKind::Histogram => ClientKind::Histogram,
        tritium_ipc::ClientMetricKind::Summary => ClientKind::Summary,
        tritium_ipc::ClientMetricKind::Untyped => ClientKind::Untyped,
    }
}

fn family(f: tritium_ipc::ClientFamily) -> ClientFamily {
    ClientFamily {
        name: f.name,
        help: f.help,
        kind: kind(f.kind),
        samples: f
            .samples
            .into_iter()
            .map(|s| ClientSample { name: s.name, labels: s.labels, value: s.value })
            .collect(),
    }
}

/// Asks every stub in `probes` (with the labels of its series) and waits for the answers until
/// [`STUB_METRICS_TIMEOUT`]; returns the answers, each with its probe (for reporting problems).
pub(crate) fn gather(probes: Vec<(StubFamilies, Arc<StubProbe>)>) -> Vec<(StubFamilies, Arc<StubProbe>)> {
    let asked: Vec<_> = probes.into_iter().map(|(labels, p)| (p.probe.ask(), labels, p)).collect();
    let deadline = Instant::now() + STUB_METRICS_TIMEOUT;
    let mut out = Vec::with_capacity(asked.len());
    for (answer, mut labels, probe) in asked {
        // Not asked: its previous request is still unanswered, or its ring is full.
        let Some(answer) = answer else { continue };
        let got: Result<ClientMetrics, _> = answer.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        match got {
            Ok(Ok(families)) => {
                if families.is_empty() {
                    continue;
                }
                labels.families = families.into_iter().map(family).collect();
                out.push((labels, probe));
            }
            Ok(Err(why)) => probe.warn_once(&labels, &why),
            Err(_) => probe.warn_once(
                &labels,
                &format!(
                    "the stub did not answer within {STUB_METRICS_TIMEOUT:?} (it is not asked again until it answers, or for 30 s)"
                ),
            ),
        }
    }
    out
}
