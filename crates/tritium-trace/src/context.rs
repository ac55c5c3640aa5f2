//! W3C trace context (`traceparent`), the form in which a caller's trace reaches the server
//! (an HTTP header, gRPC metadata) and a model's trace reaches its BLS calls (Triton's trace
//! context JSON, `{"traceparent": "..."}`), and the random ids of new traces and spans.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// A span in a trace: what a new span names as its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanContext {
    /// The trace's id (16 bytes, never all zero).
    pub trace_id: [u8; 16],
    /// The span's id (8 bytes, never all zero).
    pub span_id: [u8; 8],
    /// The `sampled` trace flag.
    pub sampled: bool,
}

/// Where a request's trace comes from, as the frontends and the BLS path hand it to the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceParent {
    /// The client's trace (a `traceparent` header or gRPC metadata entry): the request is
    /// traced as part of it, whatever the sampling rate (Triton's propagated context).
    Remote(SpanContext),
    /// A model's own traced request, calling another model (BLS): the call is traced as a
    /// child of the caller's compute span.
    Caller(SpanContext),
}

impl SpanContext {
    /// Parses a W3C `traceparent` value: `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`
    /// (lowercase; all-zero ids and version `ff` are invalid; a later version may append
    /// fields). `None` for anything else, which the caller ignores, as W3C asks.
    pub fn from_traceparent(value: &str) -> Option<SpanContext> {
        let value = value.trim();
        let mut parts = value.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || version == "ff" || !is_lower_hex(version) {
            return None;
        }
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id: [u8; 16] = hex_bytes(trace)?;
        let span_id: [u8; 8] = hex_bytes(span)?;
        let [flags]: [u8; 1] = hex_bytes(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanContext { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The `traceparent` value naming this span.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.span_id), u8::from(self.sampled))
    }

    /// Triton's trace context text (`request.trace().get_context()` in a model):
    /// `{"traceparent":"00-...-...-01"}`.
    pub fn triton_context(&self) -> String {
        serde_json::json!({ "traceparent": self.traceparent() }).to_string()
    }

    /// The span named by a Triton trace context text, or `None` when it holds no valid
    /// `traceparent`.
    pub fn from_triton_context(text: &str) -> Option<SpanContext> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        SpanContext::from_traceparent(value.get("traceparent")?.as_str()?)
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// 64 random bits: SipHash with the process's random keys over a counter (no RNG dependency;
/// ids need to be unique and unpredictable enough to not collide, not secret).
fn random_u64() -> u64 {
    thread_local! {
        static STATE: std::collections::hash_map::RandomState = std::collections::hash_map::RandomState::new();
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    STATE.with(|s| {
        let mut h = s.build_hasher();
        h.write_u64(n);
        h.finish()
    })
}

/// A new, non-zero trace id.
pub(crate) fn new_trace_id() -> [u8; 16] {
    loop {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&random_u64().to_be_bytes());
        id[8..].copy_from_slice(&random_u64().to_be_bytes());
        if id != [0; 16] {
            return id;
        }
    }
}

/// A new, non-zero span id.
pub(crate) fn new_span_id() -> [u8; 8] {
    loop {
        let id = random_u64().to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_round_trips() {
        let ctx = SpanContext::from_traceparent(SAMPLE).expect("valid");
        assert_eq!(hex(&ctx.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&ctx.span_id), "00f067aa0ba902b7");
        assert!(ctx.sampled);
        assert_eq!(ctx.traceparent(), SAMPLE);
        let triton = ctx.triton_context();
        assert_eq!(triton, format!("{{\"traceparent\":\"{SAMPLE}\"}}"));
        assert_eq!(SpanContext::from_triton_context(&triton), Some(ctx));
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::from_traceparent(bad), None, "{bad:?}");
        }
        // A later version may carry more fields.
        assert!(SpanContext::from_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more")
            .is_some_and(|c| !c.sampled));
        assert_eq!(SpanContext::from_triton_context("not json"), None);
        assert_eq!(SpanContext::from_triton_context("{}"), None);
    }

    #[test]
    fn new_ids_are_distinct_and_non_zero() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&[0; 8]));
        assert_ne!(new_trace_id(), new_trace_id());
    }
}
