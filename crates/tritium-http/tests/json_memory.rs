//! The JSON inference decoder's memory: a `"data"` array is converted element by element into
//! the tensor's bytes, never held as a tree of JSON values (which costs ~16x the wire size), so
//! the peak allocation while decoding stays a small multiple of the body. Measured with a
//! counting global allocator; this file holds one test so nothing else allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tritium_http::codec::decode_infer_request;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        // SAFETY: the caller's layout is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn json_data_costs_about_its_size() {
    let n = 1 << 20;
    let mut body = format!(r#"{{"inputs":[{{"name":"I","datatype":"INT32","shape":[{n}],"data":["#).into_bytes();
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'7');
    }
    body.extend_from_slice(b"]}]}");
    let body = Bytes::from(body);
    let wire = body.len();
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let decoded = decode_infer_request("m", None, body, None).expect("decodes");
    let peak = PEAK.load(Ordering::SeqCst) - before;
    let tensor = decoded.request.inputs[0].data.len();
    assert_eq!(tensor, 4 * n);
    // The tensor (4 bytes per element) plus a copy of the data's text: far from the ~32 bytes
    // per element a tree of values would take.
    assert!(peak < tensor + 2 * wire, "peak {peak} bytes for a {wire}-byte body and a {tensor}-byte tensor");
}
