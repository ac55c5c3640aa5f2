//! Per-model-version statistics, recorded as Triton records them.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::types::{BatchStats, ModelStats, StatDuration};

fn add(s: &mut StatDuration, d: Duration) {
    s.count += 1;
    s.ns += d.as_nanos() as u64;
}

/// The timings of one execution, shared by every request in its batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExecTimes {
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

/// Statistics of one model version.
#[derive(Debug)]
pub(crate) struct Stats(Mutex<ModelStats>);

impl Stats {
    pub(crate) fn new(name: &str, version: i64) -> Self {
        Self(Mutex::new(ModelStats { name: name.to_string(), version: version.to_string(), ..Default::default() }))
    }

    pub(crate) fn snapshot(&self) -> ModelStats {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records one execution of `batch_size` (the sum of the requests' batch sizes).
    pub(crate) fn execution(&self, batch_size: u64, t: ExecTimes) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.execution_count += 1;
        // Kept sorted by batch size, as Triton reports them.
        let pos = match s.batch_stats.binary_search_by_key(&batch_size, |b| b.batch_size) {
            Ok(p) => p,
            Err(p) => {
                s.batch_stats.insert(p, BatchStats { batch_size, ..Default::default() });
                p
            }
        };
        let b = &mut s.batch_stats[pos];
        add(&mut b.compute_input, t.compute_input);
        add(&mut b.compute_infer, t.compute_infer);
        add(&mut b.compute_output, t.compute_output);
    }

    /// Records a request that succeeded after `total` (queue and compute included).
    pub(crate) fn success(&self, batch_size: u64, total: Duration, queue: Duration, t: ExecTimes) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.inference_count += batch_size.max(1);
        s.last_inference = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        add(&mut s.success, total);
        add(&mut s.queue, queue);
        add(&mut s.compute_input, t.compute_input);
        add(&mut s.compute_infer, t.compute_infer);
        add(&mut s.compute_output, t.compute_output);
    }

    /// Records a request answered from the response cache (Triton's `UpdateSuccessCacheHit`): a
    /// success of `total`, queued for `queue`, whose lookup took `lookup`; no inference,
    /// execution or compute is counted.
    pub(crate) fn cache_hit(&self, total: Duration, queue: Duration, lookup: Duration) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.last_inference = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        add(&mut s.success, total);
        add(&mut s.queue, queue);
        add(&mut s.cache_hit, lookup);
    }

    /// Records a cache miss of a request that succeeded: `lookup_and_insert` is the time spent
    /// looking it up and inserting its answer (Triton's `UpdateSuccessCacheMiss`).
    pub(crate) fn cache_miss(&self, lookup_and_insert: Duration) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        add(&mut s.cache_miss, lookup_and_insert);
    }

    /// Records a request that failed after `total` with an error of `kind`; `reached_model`
    /// tells a model failure from a rejection.
    pub(crate) fn failure(&self, total: Duration, kind: crate::types::ErrorKind, reached_model: bool) {
        use crate::types::ErrorKind;
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        add(&mut s.fail, total);
        let r = &mut s.fail_reasons;
        match (kind, reached_model) {
            (ErrorKind::Cancelled, _) => r.canceled += 1,
            (_, true) => r.backend += 1,
            (ErrorKind::InvalidArg | ErrorKind::Unavailable | ErrorKind::NotFound, false) => r.rejected += 1,
            _ => r.other += 1,
        }
    }
}
