//! A model version's request queue, feeding its instances, with Triton's dynamic batching.
//!
//! Instance workers are OS threads that block in [`Queue::next_batch_unless`]; the async frontends push
//! into the queue and await a oneshot answer. Without `dynamic_batching` each `execute` gets one
//! request. With it, a worker gathers queued requests while their batch sizes fit
//! `max_batch_size`, and waits up to `max_queue_delay_microseconds` (counted from the oldest
//! request) for more unless it already has `max_batch_size` or a preferred batch size.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::types::{InferError, InferRequest, InferResponse, RequestedOutput};

/// A request waiting for an instance.
pub(crate) struct Pending {
    /// The request.
    pub req: InferRequest,
    /// Its batch size (0 for non-batching models).
    pub batch_size: u64,
    /// Outputs to return.
    pub outputs: Vec<RequestedOutput>,
    /// When it was queued.
    pub enqueued: Instant,
    /// Where the answer goes.
    pub tx: oneshot::Sender<Result<InferResponse, InferError>>,
}

/// What a worker gets from the queue.
pub(crate) enum Next {
    /// Requests to execute together.
    Batch(Vec<Pending>),
    /// The queue is closed and empty.
    Closed,
    /// The worker's interruption condition holds.
    Interrupted,
    /// Nothing came within the idle period.
    Idle,
}

/// Dynamic batching settings.
#[derive(Debug, Clone)]
pub(crate) struct Batching {
    pub max_batch_size: u64,
    pub preferred: Vec<u64>,
    pub max_delay: Duration,
}

struct State {
    items: VecDeque<Pending>,
    closed: bool,
    /// A worker is forming a batch; the others wait, so that idle instances do not split
    /// requests that arrive together into batches of one.
    gathering: bool,
}

/// The queue of one model version.
pub(crate) struct Queue {
    state: Mutex<State>,
    cv: Condvar,
    /// Signalled when the queue closes (for workers backing off, which take no work).
    closing: Condvar,
    batching: Option<Batching>,
}

impl Queue {
    pub(crate) fn new(batching: Option<Batching>) -> Self {
        Self {
            state: Mutex::new(State { items: VecDeque::new(), closed: false, gathering: false }),
            cv: Condvar::new(),
            closing: Condvar::new(),
            batching,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request; hands it back if the queue is closed.
    #[allow(clippy::result_large_err)] // the request is handed back, not copied
    pub(crate) fn push(&self, p: Pending) -> Result<(), Pending> {
        let mut st = self.lock();
        if st.closed {
            return Err(p);
        }
        st.items.push_back(p);
        drop(st);
        self.cv.notify_one();
        Ok(())
    }

    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Stops taking requests; what is queued is still handed out by `next_batch`.
    pub(crate) fn close_gracefully(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
        self.closing.notify_all();
    }

    /// Closes the queue and returns what was still waiting.
    pub(crate) fn close(&self) -> Vec<Pending> {
        let mut st = self.lock();
        st.closed = true;
        let rest = st.items.drain(..).collect();
        drop(st);
        self.cv.notify_all();
        self.closing.notify_all();
        rest
    }

    /// Waits up to `timeout` for the queue to close; true if it is closed.
    pub(crate) fn wait_closed(&self, timeout: Duration) -> bool {
        let st = self.lock();
        let (st, _) = self.closing.wait_timeout_while(st, timeout, |st| !st.closed).unwrap_or_else(|p| p.into_inner());
        st.closed
    }

    /// Wakes every waiting worker, so that each re-checks its own interruption condition.
    pub(crate) fn wake_all(&self) {
        let _st = self.lock();
        self.cv.notify_all();
    }

    /// Blocks until there is work and returns the next batch; `None` once the queue is closed.
    #[cfg(test)]
    pub(crate) fn next_batch(&self) -> Option<Vec<Pending>> {
        loop {
            match self.next_batch_unless(&|| false, Duration::from_secs(3600)) {
                Next::Batch(b) => return Some(b),
                Next::Closed | Next::Interrupted => return None,
                Next::Idle => {}
            }
        }
    }

    /// Blocks until there is work, the queue is closed, `interrupted()` holds (checked whenever
    /// the worker wakes; wake it with [`Queue::wake_all`]), or `idle` passes without work.
    pub(crate) fn next_batch_unless(&self, interrupted: &dyn Fn() -> bool, idle: Duration) -> Next {
        let idle_until = Instant::now() + idle;
        let mut st = self.lock();
        // Without batching nobody ever gathers, so this takes the next request at once.
        let first = loop {
            if interrupted() {
                return Next::Interrupted;
            }
            if !st.gathering {
                if let Some(p) = st.items.pop_front() {
                    break p;
                }
                if st.closed {
                    return Next::Closed;
                }
            }
            let now = Instant::now();
            if now >= idle_until {
                return Next::Idle;
            }
            st = self.cv.wait_timeout(st, idle_until - now).unwrap_or_else(|p| p.into_inner()).0;
        };
        let Some(b) = &self.batching else { return Next::Batch(vec![first]) };
        st.gathering = true;
        let deadline = first.enqueued + b.max_delay;
        let mut size = first.batch_size.max(1);
        let mut batch = vec![first];
        loop {
            while let Some(next) = st.items.front() {
                let n = next.batch_size.max(1);
                if size + n > b.max_batch_size {
                    break;
                }
                size += n;
                batch.extend(st.items.pop_front());
            }
            let full = size >= b.max_batch_size || st.items.front().is_some();
            let preferred = b.preferred.contains(&size);
            let now = Instant::now();
            if full || preferred || st.closed || now >= deadline {
                break;
            }
            st = self.cv.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        st.gathering = false;
        drop(st);
        // Another worker may start the next batch with what this one left behind.
        self.cv.notify_all();
        Next::Batch(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(batch_size: u64) -> (Pending, oneshot::Receiver<Result<InferResponse, InferError>>) {
        let (tx, rx) = oneshot::channel();
        (Pending { req: InferRequest::default(), batch_size, outputs: vec![], enqueued: Instant::now(), tx }, rx)
    }

    fn sizes(batch: &[Pending]) -> Vec<u64> {
        batch.iter().map(|p| p.batch_size).collect()
    }

    #[test]
    fn without_batching_each_request_goes_alone() {
        let q = Queue::new(None);
        for _ in 0..3 {
            assert!(q.push(pending(1).0).is_ok());
        }
        assert_eq!(q.next_batch().map(|b| b.len()), Some(1));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn batches_fill_up_to_max_batch_size_without_waiting() {
        let q = Queue::new(Some(Batching { max_batch_size: 4, preferred: vec![], max_delay: Duration::from_secs(60) }));
        for bs in [2, 1, 1, 3] {
            assert!(q.push(pending(bs).0).is_ok());
        }
        let t = Instant::now();
        assert_eq!(sizes(&q.next_batch().expect("batch")), vec![2, 1, 1]);
        assert!(t.elapsed() < Duration::from_secs(30), "a full batch does not wait for the delay");
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_partial_batch_waits_for_the_delay_and_collects_late_arrivals() {
        let q = std::sync::Arc::new(Queue::new(Some(Batching {
            max_batch_size: 8,
            preferred: vec![],
            max_delay: Duration::from_millis(300),
        })));
        assert!(q.push(pending(1).0).is_ok());
        let q2 = q.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            assert!(q2.push(pending(2).0).is_ok());
        });
        let batch = q.next_batch().expect("batch");
        late.join().expect("thread");
        assert_eq!(sizes(&batch), vec![1, 2]);
    }

    #[test]
    fn a_preferred_size_ends_the_wait() {
        let q =
            Queue::new(Some(Batching { max_batch_size: 8, preferred: vec![2], max_delay: Duration::from_secs(60) }));
        assert!(q.push(pending(1).0).is_ok());
        assert!(q.push(pending(1).0).is_ok());
        assert_eq!(sizes(&q.next_batch().expect("batch")), vec![1, 1]);
    }

    #[test]
    fn idle_workers_do_not_split_a_forming_batch() {
        let q = std::sync::Arc::new(Queue::new(Some(Batching {
            max_batch_size: 8,
            preferred: vec![],
            max_delay: Duration::from_millis(200),
        })));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || q.next_batch().map(|b| b.len()))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..4 {
            assert!(q.push(pending(1).0).is_ok());
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(300));
        q.close();
        let mut sizes: Vec<_> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
        sizes.sort();
        assert_eq!(sizes, vec![None, None, Some(4)]);
    }

    #[test]
    fn wait_closed_returns_at_once_when_the_queue_closes() {
        let q = std::sync::Arc::new(Queue::new(None));
        assert!(!q.wait_closed(Duration::from_millis(1)));
        let closer = {
            let q = q.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                q.close_gracefully();
            })
        };
        let t = Instant::now();
        assert!(q.wait_closed(Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(10));
        let _ = closer.join();
    }

    #[test]
    fn close_wakes_workers_and_returns_the_rest() {
        let q = std::sync::Arc::new(Queue::new(None));
        let q2 = q.clone();
        let worker = std::thread::spawn(move || q2.next_batch().is_none());
        std::thread::sleep(Duration::from_millis(20));
        assert!(q.close().is_empty());
        assert!(worker.join().expect("worker"));
        assert!(q.push(pending(1).0).is_err());
    }
}
