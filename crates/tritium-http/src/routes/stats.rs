//! `/v2/models/stats`: the statistics extension's JSON.

use super::*;

// ---- statistics ----

#[derive(Serialize)]
struct DurationJson {
    count: u64,
    ns: u64,
}

impl From<StatDuration> for DurationJson {
    fn from(d: StatDuration) -> Self {
        Self { count: d.count, ns: d.ns }
    }
}

#[derive(Serialize)]
struct InferenceStatsJson {
    success: DurationJson,
    fail: DurationJson,
    queue: DurationJson,
    compute_input: DurationJson,
    compute_infer: DurationJson,
    compute_output: DurationJson,
    cache_hit: DurationJson,
    cache_miss: DurationJson,
}

#[derive(Serialize)]
struct BatchStatsJson {
    batch_size: u64,
    compute_input: DurationJson,
    compute_infer: DurationJson,
    compute_output: DurationJson,
}

#[derive(Serialize)]
struct ModelStatJson {
    name: String,
    version: String,
    last_inference: u64,
    inference_count: u64,
    execution_count: u64,
    inference_stats: InferenceStatsJson,
    response_stats: serde_json::Map<String, Value>,
    batch_stats: Vec<BatchStatsJson>,
    memory_usage: Vec<Value>,
}

#[derive(Serialize)]
struct StatsJson {
    model_stats: Vec<ModelStatJson>,
}

fn stats_json(stats: Vec<ModelStats>) -> StatsJson {
    StatsJson {
        model_stats: stats
            .into_iter()
            .map(|m| ModelStatJson {
                name: m.name,
                version: m.version,
                last_inference: m.last_inference,
                inference_count: m.inference_count,
                execution_count: m.execution_count,
                inference_stats: InferenceStatsJson {
                    success: m.success.into(),
                    fail: m.fail.into(),
                    queue: m.queue.into(),
                    compute_input: m.compute_input.into(),
                    compute_infer: m.compute_infer.into(),
                    compute_output: m.compute_output.into(),
                    cache_hit: m.cache_hit.into(),
                    cache_miss: m.cache_miss.into(),
                },
                response_stats: serde_json::Map::new(),
                batch_stats: m
                    .batch_stats
                    .into_iter()
                    .map(|b| BatchStatsJson {
                        batch_size: b.batch_size,
                        compute_input: b.compute_input.into(),
                        compute_infer: b.compute_infer.into(),
                        compute_output: b.compute_output.into(),
                    })
                    .collect(),
                memory_usage: Vec::new(),
            })
            .collect(),
    }
}

pub(super) async fn all_stats<B: Backend>(State(s): St<B>) -> HttpResult {
    json_ok(&stats_json(s.backend.statistics(None, None)?))
}

pub(super) async fn model_stats<B: Backend>(State(s): St<B>, m: ModelRef) -> HttpResult {
    json_ok(&stats_json(s.backend.statistics(Some(&m.name), m.version)?))
}
