//! The response cache (`--cache-config local,size=N`, and `response_cache { enable: true }` per
//! model): successful answers kept by a key of the request, least recently used evicted first
//! within the byte size, as Triton's local cache does.
//!
//! The key is a 128-bit hash (two independently seeded SipHash-1-3 hashes) of the model name,
//! the version that serves the request, every input (sorted by name: name, data type, shape and
//! bytes), the requested outputs (sorted by name, with their classification) and the request
//! parameters (sorted by name). Triton hashes only the model, version, input names and bytes, so
//! two requests that differ in shape, data type, requested outputs or parameters can share an
//! entry there; here they never do.
//!
//! Only versions whose model enables the cache while the server has one pay anything: the others
//! have no [`ModelCache`] and never take the lock.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;
use tritium_sync::Locked;

use crate::stats::Stats;
use crate::types::{InferError, InferRequest, InferResponse, ParamValue, RequestedOutput};

/// Bytes each entry costs beyond its tensors' bytes, names and shapes (its bookkeeping).
pub(crate) const ENTRY_OVERHEAD: u64 = 64;

/// A request's cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key(u128);

/// What the cache holds for one key.
#[derive(Debug)]
struct Slot {
    response: Arc<InferResponse>,
    bytes: u64,
    tick: u64,
}

/// The least-recently-used map behind the lock.
#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<Key, Slot>,
    /// Use order: tick -> key, oldest first.
    order: BTreeMap<u64, Key>,
    tick: u64,
    used: u64,
    evictions: u64,
    /// Lookups, and how many found their key (Triton's `nv_cache_num_*`).
    lookups: u64,
    hits: u64,
    /// Time spent looking up and inserting, in nanoseconds.
    lookup_ns: u64,
    insertion_ns: u64,
}

/// What the cache holds now, for statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Entries held.
    pub entries: u64,
    /// Bytes held (entries' sizes).
    pub used_bytes: u64,
    /// The byte size.
    pub capacity_bytes: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Lookups made.
    pub lookups: u64,
    /// Lookups that found their key.
    pub hits: u64,
    /// Time spent in lookups, hit or miss, in nanoseconds.
    pub lookup_ns: u64,
    /// Time spent inserting, in nanoseconds.
    pub insertion_ns: u64,
}

/// The server's one response cache, shared by every model that enables it.
#[derive(Debug)]
pub(crate) struct ResponseCache {
    capacity: u64,
    seeds: (RandomState, RandomState),
    lru: Mutex<Lru>,
}

impl ResponseCache {
    /// A cache of at most `capacity` bytes.
    pub(crate) fn new(capacity: u64) -> Self {
        Self { capacity, seeds: (RandomState::new(), RandomState::new()), lru: Mutex::new(Lru::default()) }
    }

    /// The request's key for the version `version` that serves it.
    pub(crate) fn key(&self, req: &InferRequest, version: i64) -> Key {
        let mut a = self.seeds.0.build_hasher();
        let mut b = self.seeds.1.build_hasher();
        hash_request(req, version, &mut a);
        hash_request(req, version, &mut b);
        Key(((a.finish() as u128) << 64) | b.finish() as u128)
    }

    /// The cached answer for `key`, which becomes the most recently used.
    pub(crate) fn lookup(&self, key: Key) -> Option<Arc<InferResponse>> {
        let start = Instant::now();
        let mut lru = self.lru.locked();
        let lru = &mut *lru;
        lru.tick += 1;
        lru.lookups += 1;
        let tick = lru.tick;
        let found = lru.entries.get_mut(&key).map(|slot| {
            lru.order.remove(&slot.tick);
            slot.tick = tick;
            lru.order.insert(tick, key);
            slot.response.clone()
        });
        lru.hits += u64::from(found.is_some());
        lru.lookup_ns += nanos(start.elapsed());
        found
    }

    /// Keeps `response` under `key`, evicting the least recently used entries until it fits.
    /// An entry larger than the whole cache is not kept (returns false).
    pub(crate) fn insert(&self, key: Key, response: Arc<InferResponse>) -> bool {
        let start = Instant::now();
        let bytes = entry_bytes(&response);
        if bytes > self.capacity {
            return false;
        }
        let mut lru = self.lru.locked();
        let lru = &mut *lru;
        if let Some(old) = lru.entries.remove(&key) {
            lru.order.remove(&old.tick);
            lru.used -= old.bytes;
        }
        while lru.used + bytes > self.capacity {
            let Some((_, oldest)) = lru.order.pop_first() else { break };
            if let Some(old) = lru.entries.remove(&oldest) {
                lru.used -= old.bytes;
                lru.evictions += 1;
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.order.insert(tick, key);
        lru.entries.insert(key, Slot { response, bytes, tick });
        lru.used += bytes;
        lru.insertion_ns += nanos(start.elapsed());
        true
    }

    /// What the cache holds now.
    pub(crate) fn usage(&self) -> CacheUsage {
        let lru = self.lru.locked();
        CacheUsage {
            entries: lru.entries.len() as u64,
            used_bytes: lru.used,
            capacity_bytes: self.capacity,
            evictions: lru.evictions,
            lookups: lru.lookups,
            hits: lru.hits,
            lookup_ns: lru.lookup_ns,
            insertion_ns: lru.insertion_ns,
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The bytes an entry costs: its outputs' bytes, names and shapes, its parameters, and
/// [`ENTRY_OVERHEAD`].
pub(crate) fn entry_bytes(response: &InferResponse) -> u64 {
    let outputs: usize = response.outputs.iter().map(|o| o.data.len() + o.name.len() + 8 * o.shape.len() + 16).sum();
    let params: usize =
        response.parameters.iter().map(|(k, v)| k.len() + if let ParamValue::Str(s) = v { s.len() } else { 8 }).sum();
    (outputs + params + response.model.len()) as u64 + ENTRY_OVERHEAD
}

fn hash_request<H: Hasher>(req: &InferRequest, version: i64, h: &mut H) {
    req.model.hash(h);
    version.hash(h);
    let mut inputs: Vec<_> = req.inputs.iter().collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    inputs.len().hash(h);
    for input in inputs {
        input.name.hash(h);
        input.datatype.hash(h);
        input.shape.hash(h);
        input.data.as_ref().hash(h);
    }
    let mut outputs: Vec<&RequestedOutput> = req.outputs.iter().collect();
    outputs.sort_by(|a, b| a.name.cmp(&b.name));
    outputs.len().hash(h);
    for output in outputs {
        output.name.hash(h);
        output.classification.hash(h);
    }
    let mut params: Vec<_> = req.parameters.iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    params.len().hash(h);
    for (name, value) in params {
        name.hash(h);
        match value {
            ParamValue::Bool(v) => (0u8, *v).hash(h),
            ParamValue::Int(v) => (1u8, *v).hash(h),
            ParamValue::Double(v) => (2u8, v.to_bits()).hash(h),
            ParamValue::Str(v) => (3u8, v).hash(h),
        }
    }
}

/// A cache-enabled version's handle on the server's cache.
#[derive(Debug, Clone)]
pub(crate) struct ModelCache {
    pub cache: Arc<ResponseCache>,
}

/// The answer's sender of a unary request.
type Answer = oneshot::Sender<Result<InferResponse, InferError>>;

/// What a lookup did with a request's answer.
pub(crate) enum Lookup {
    /// The request was answered from the cache (and counted as a success and a hit).
    Hit,
    /// Not in the cache: queue the request with this sender; its successful answer is inserted
    /// on the way back to the client, and counted as a miss.
    Miss(Answer),
}

impl ModelCache {
    /// Looks `req` (validated, for `version`, whose statistics are `stats`, queued at `start`)
    /// up; see [`Lookup`].
    pub(crate) fn lookup(
        &self,
        req: &InferRequest,
        version: i64,
        stats: &Arc<Stats>,
        start: Instant,
        tx: Answer,
    ) -> Lookup {
        let lookup_start = Instant::now();
        let key = self.cache.key(req, version);
        if let Some(hit) = self.cache.lookup(key) {
            let lookup = lookup_start.elapsed();
            let mut response = InferResponse::clone(&hit);
            response.id.clone_from(&req.id);
            stats.cache_hit(start.elapsed(), lookup_start.saturating_duration_since(start), lookup);
            let _ = tx.send(Ok(response));
            return Lookup::Hit;
        }
        let lookup = lookup_start.elapsed();
        // The answer passes through a task that fills the cache; without a runtime (never on the
        // server's paths) the request is served without caching.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return Lookup::Miss(tx) };
        let (inner_tx, mut inner_rx) = oneshot::channel::<Result<InferResponse, InferError>>();
        let cache = self.cache.clone();
        let stats = stats.clone();
        let mut tx = tx;
        runtime.spawn(async move {
            tokio::select! {
                answer = &mut inner_rx => {
                    // A dropped sender drops the client's too, which reads it as a lost request.
                    let Ok(answer) = answer else { return };
                    if let Ok(response) = &answer {
                        let insert_start = Instant::now();
                        if !cache.insert(key, Arc::new(response.clone())) {
                            tracing::debug!(model = %response.model, "response larger than the cache; not cached");
                        }
                        stats.cache_miss(lookup + insert_start.elapsed());
                    }
                    let _ = tx.send(answer);
                }
                // The client went away: dropping the inner receiver cancels the queued request.
                () = tx.closed() => {}
            }
        });
        Lookup::Miss(inner_tx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::types::{DataType, InputTensor, OutputTensor};
    use bytes::Bytes;

    fn request(data: &[u8]) -> InferRequest {
        InferRequest {
            model: "m".into(),
            inputs: vec![InputTensor {
                name: "INPUT0".into(),
                datatype: DataType::Uint8,
                shape: vec![data.len() as i64],
                data: Bytes::copy_from_slice(data),
            }],
            ..Default::default()
        }
    }

    fn response(len: usize) -> Arc<InferResponse> {
        Arc::new(InferResponse {
            model: String::new(),
            version: 1,
            id: String::new(),
            outputs: vec![OutputTensor {
                name: String::new(),
                datatype: DataType::Uint8,
                shape: vec![],
                data: vec![7; len],
            }],
            parameters: vec![],
        })
    }

    #[test]
    fn the_key_covers_model_version_inputs_outputs_and_parameters() {
        let cache = ResponseCache::new(1 << 20);
        let base = request(b"abcd");
        let k = cache.key(&base, 1);
        assert_eq!(k, cache.key(&base.clone(), 1), "identical requests share a key");
        let mut with_id = base.clone();
        with_id.id = "other id".into();
        assert_eq!(k, cache.key(&with_id, 1), "the request id is not part of the key");
        assert_ne!(k, cache.key(&base, 2), "version");
        let mut other = base.clone();
        other.model = "n".into();
        assert_ne!(k, cache.key(&other, 1), "model");
        assert_ne!(k, cache.key(&request(b"abce"), 1), "bytes");
        let mut shape = base.clone();
        shape.inputs[0].shape = vec![2, 2];
        assert_ne!(k, cache.key(&shape, 1), "shape");
        let mut dtype = base.clone();
        dtype.inputs[0].datatype = DataType::Int8;
        assert_ne!(k, cache.key(&dtype, 1), "data type");
        let mut outputs = base.clone();
        outputs.outputs = vec![RequestedOutput::named("OUTPUT0")];
        assert_ne!(k, cache.key(&outputs, 1), "requested outputs");
        let mut classified = outputs.clone();
        classified.outputs[0].classification = Some(2);
        assert_ne!(cache.key(&outputs, 1), cache.key(&classified, 1), "classification");
        let mut params = base.clone();
        params.parameters = vec![("p".into(), ParamValue::Int(1))];
        assert_ne!(k, cache.key(&params, 1), "parameters");
        let mut params2 = base.clone();
        params2.parameters = vec![("p".into(), ParamValue::Int(2))];
        assert_ne!(cache.key(&params, 1), cache.key(&params2, 1), "parameter values");
    }

    #[test]
    fn input_and_output_order_do_not_matter() {
        let cache = ResponseCache::new(1 << 20);
        let mut a = request(b"x");
        a.inputs.push(InputTensor {
            name: "B".into(),
            datatype: DataType::Uint8,
            shape: vec![1],
            data: Bytes::from_static(b"y"),
        });
        a.outputs = vec![RequestedOutput::named("O1"), RequestedOutput::named("O2")];
        let mut b = a.clone();
        b.inputs.reverse();
        b.outputs.reverse();
        assert_eq!(cache.key(&a, 1), cache.key(&b, 1));
    }

    #[test]
    fn least_recently_used_entries_are_evicted_first() {
        let size = entry_bytes(&response(1000));
        let cache = ResponseCache::new(size * 2 + size / 2);
        let (k1, k2, k3) = (cache.key(&request(b"1"), 1), cache.key(&request(b"2"), 1), cache.key(&request(b"3"), 1));
        assert!(cache.insert(k1, response(1000)));
        assert!(cache.insert(k2, response(1000)));
        // Using k1 makes k2 the least recently used.
        assert!(cache.lookup(k1).is_some());
        assert!(cache.insert(k3, response(1000)));
        assert!(cache.lookup(k2).is_none(), "the least recently used entry was evicted");
        assert!(cache.lookup(k1).is_some());
        assert!(cache.lookup(k3).is_some());
        let usage = cache.usage();
        assert_eq!((usage.entries, usage.used_bytes, usage.evictions), (2, 2 * size, 1));
    }

    #[test]
    fn an_entry_larger_than_the_cache_is_not_kept() {
        let cache = ResponseCache::new(500);
        let k = cache.key(&request(b"1"), 1);
        assert!(!cache.insert(k, response(1000)));
        assert!(cache.lookup(k).is_none());
        assert_eq!(cache.usage().entries, 0);
    }

    #[test]
    fn inserting_a_key_again_replaces_its_entry() {
        let cache = ResponseCache::new(1 << 20);
        let k = cache.key(&request(b"1"), 1);
        assert!(cache.insert(k, response(10)));
        assert!(cache.insert(k, response(20)));
        let usage = cache.usage();
        assert_eq!((usage.entries, usage.used_bytes), (1, entry_bytes(&response(20))));
        assert_eq!(cache.lookup(k).unwrap().outputs[0].data.len(), 20);
    }

    #[test]
    fn lookups_hits_and_their_time_are_counted_for_tritons_cache_metrics() {
        let cache = ResponseCache::new(1 << 20);
        let (a, b) = (cache.key(&request(b"a"), 1), cache.key(&request(b"b"), 1));
        assert!(cache.lookup(a).is_none());
        assert!(cache.insert(a, response(10)));
        assert!(cache.lookup(a).is_some());
        assert!(cache.lookup(b).is_none());
        let usage = cache.usage();
        assert_eq!((usage.lookups, usage.hits), (3, 1));
        assert!(usage.lookup_ns > 0 && usage.insertion_ns > 0, "{usage:?}");
    }
}
