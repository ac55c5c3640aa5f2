//! Unit tests of the version queue: priorities and queue policies, dynamic batching, the
//! one-gatherer rule, lanes, ready batches for pipelining, requeue and close.

use super::*;
use crate::pending::Reply;
use crate::types::{InferRequest, InferResponse, Streamed};
use tokio::sync::oneshot;

type Rx = oneshot::Receiver<Result<InferResponse, InferError>>;

fn stats() -> Arc<Stats> {
    Arc::new(Stats::new("m", 1))
}

fn queue(batching: Option<Batching>) -> Queue {
    Queue::new(batching, Priorities::single(Policy::unbounded()), stats())
}

fn request(id: &str, priority: u64, timeout_us: u64, batch_size: u64) -> (Pending, Rx) {
    let (tx, rx) = oneshot::channel();
    let req = InferRequest { id: id.into(), priority, timeout_us, ..Default::default() };
    (Pending { req, batch_size, outputs: vec![], enqueued: Instant::now(), tx: Reply::Unary(tx), trace: None }, rx)
}

#[test]
fn a_stream_reply_ends_with_its_final_answer_and_a_unary_one_ignores_stream_messages() {
    let (tx, mut rx) = crate::types::response_stream();
    let reply = Reply::Stream(tx);
    reply.stream(Streamed::Response { result: Err(InferError::internal("partial")), last: false });
    assert!(!reply.is_closed());
    reply.send(Err(InferError::internal("gone")));
    let first = rx.try_recv().expect("first");
    assert!(!first.is_last());
    let last = rx.try_recv().expect("last");
    assert_eq!(last, Streamed::Response { result: Err(InferError::internal("gone")), last: true });
    assert!(last.is_last() && Streamed::Final.is_last());
    assert!(rx.try_recv().is_err());

    let (tx, mut rx) = oneshot::channel();
    let reply = Reply::Unary(tx);
    reply.stream(Streamed::Final);
    assert!(!reply.is_closed());
    reply.send(Err(InferError::internal("once")));
    assert_eq!(rx.try_recv().expect("answer"), Err(InferError::internal("once")));
}

/// The request of a client that keeps waiting (a dropped receiver would cancel it).
fn live((p, rx): (Pending, Rx)) -> Pending {
    std::mem::forget(rx);
    p
}

fn pending(batch_size: u64) -> (Pending, Rx) {
    request("", 0, 0, batch_size)
}

fn sizes(batch: &[Pending]) -> Vec<u64> {
    batch.iter().map(|p| p.batch_size).collect()
}

fn ids(batch: &[Pending]) -> Vec<&str> {
    batch.iter().map(|p| p.req.id.as_str()).collect()
}

fn config(dynamic_batching: &str) -> ModelConfig {
    let text = format!("name: \"m\" backend: \"python\" max_batch_size: 8 dynamic_batching {{ {dynamic_batching} }}");
    tritium_config::parse_config(&text, std::path::Path::new("config.pbtxt")).expect("config parses")
}

fn refused_text(r: Result<Option<Instant>, Refused>) -> String {
    match r {
        Err(Refused::Full(e)) => {
            assert_eq!(e.kind, ErrorKind::Unavailable);
            e.message
        }
        Err(Refused::Closed) => panic!("closed, not full"),
        Err(Refused::Invalid(e)) => panic!("invalid, not full: {e}"),
        Ok(_) => panic!("queued"),
    }
}

/// Takes every queued request, one per batch, in order.
fn drain_ids(q: &Queue) -> Vec<String> {
    let mut out = Vec::new();
    while q.len() > 0 {
        for p in q.next_batch().expect("batch") {
            out.push(p.req.id);
        }
    }
    out
}

#[test]
fn requests_whose_client_went_away_never_join_a_batch_and_count_as_cancelled() {
    let stats = stats();
    let batching = Batching { max_batch_size: 3, preferred: vec![], max_delay: Duration::from_secs(60) };
    let q = Queue::new(Some(batching), Priorities::single(Policy::unbounded()), stats.clone());
    let mut kept = Vec::new();
    for id in ["gone0", "a", "gone1", "b", "c", "d"] {
        let (p, rx) = request(id, 0, 0, 1);
        assert!(q.push(p).is_ok());
        if id.starts_with("gone") {
            drop(rx);
        } else {
            kept.push(rx);
        }
    }
    assert_eq!(ids(&q.next_batch().expect("batch")), vec!["a", "b", "c"]);
    assert_eq!(stats.snapshot().fail_reasons.canceled, 2);
    assert_eq!(q.len(), 1);

    // Without batching too, and a stream's receiver counts the same way.
    let q = Queue::new(None, Priorities::single(Policy::unbounded()), stats.clone());
    let (tx, rx) = crate::types::response_stream();
    let req = InferRequest { id: "stream".into(), ..Default::default() };
    let p =
        Pending { req, batch_size: 0, outputs: vec![], enqueued: Instant::now(), tx: Reply::Stream(tx), trace: None };
    assert!(q.push(p).is_ok());
    drop(rx);
    let (p, _rx) = request("live", 0, 0, 0);
    assert!(q.push(p).is_ok());
    assert_eq!(ids(&q.next_batch().expect("batch")), vec!["live"]);
    assert_eq!(stats.snapshot().fail_reasons.canceled, 3);
}

fn live_id(id: &str) -> Pending {
    live(request(id, 0, 0, 1))
}

#[test]
fn a_busy_worker_takes_the_next_request_ahead_unless_another_worker_idles() {
    let q = queue(None);
    assert!(q.ready_batch().is_none(), "nothing queued");
    q.push(live_id("a")).expect("queued");
    q.push(live_id("b")).expect("queued");
    assert_eq!(q.ready_batch().as_deref().map(ids), Some(vec!["a"]));
    // While a worker waits for work, the next request is its: nobody takes it ahead.
    q.lock().idle_workers = 1;
    assert!(q.ready_batch().is_none(), "an idle worker runs it sooner");
    q.lock().idle_workers = 0;
    assert_eq!(q.ready_batch().as_deref().map(ids), Some(vec!["b"]));
}

#[test]
fn a_worker_counts_as_idle_only_while_it_waits_for_work() {
    let q = Arc::new(queue(None));
    let worker = {
        let q = q.clone();
        std::thread::spawn(move || matches!(q.next_batch_unless(&|| false, Duration::from_millis(300)), Next::Idle))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while q.lock().idle_workers == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(q.lock().idle_workers, 1);
    assert!(worker.join().expect("worker"), "no work came");
    assert_eq!(q.lock().idle_workers, 0);
}

#[test]
fn a_thread_worker_asleep_on_the_queue_is_counted_and_woken_by_a_push() {
    let q =
        Arc::new(queue(Some(Batching { max_batch_size: 2, preferred: vec![], max_delay: Duration::from_secs(30) })));
    // Without sleepers a push notifies no condvar (the runtime's lanes never sleep on it).
    q.push(live_id("a")).expect("queued");
    assert_eq!(q.lock().sleepers, 0);
    let worker = {
        let q = q.clone();
        std::thread::spawn(move || q.next_batch().map(|b| ids(&b).into_iter().map(str::to_owned).collect::<Vec<_>>()))
    };
    // The worker takes "a" and gathers, asleep until the batch fills.
    let deadline = Instant::now() + Duration::from_secs(5);
    while q.lock().sleepers == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(q.lock().sleepers, 1);
    q.push(live_id("b")).expect("queued");
    let taken = worker.join().expect("worker");
    assert_eq!(taken.as_deref(), Some(&["a".to_owned(), "b".to_owned()][..]), "the push woke the gathering worker");
    assert_eq!(q.lock().sleepers, 0);
}

fn batch_of(next: TryNext) -> Option<Vec<u64>> {
    match next {
        TryNext::Batch(b) => Some(sizes(&b)),
        TryNext::Wait(_) | TryNext::Closed => None,
    }
}

#[test]
fn a_runtime_worker_takes_a_batch_only_once_it_is_complete_and_is_told_when_to_look_again() {
    let b = Batching { max_batch_size: 4, preferred: vec![3], max_delay: Duration::from_millis(60_000) };
    let q = queue(Some(b));
    let lane = q.lane();
    assert!(matches!(q.try_next_batch(&lane), TryNext::Wait(None)), "nothing queued: wait for a push");
    let first = live(pending(1));
    let oldest = first.enqueued;
    q.push(first).expect("queued");
    q.push(live(pending(1))).expect("queued");
    // Partial: nothing is taken, and the worker looks again when the oldest's delay ends.
    match q.try_next_batch(&lane) {
        TryNext::Wait(Some(at)) => assert_eq!(at, oldest + Duration::from_millis(60_000)),
        _ => panic!("a partial batch must wait for its delay"),
    }
    assert_eq!(q.len(), 2, "nothing was taken");
    // A preferred size ends the wait; the request behind it stays queued.
    q.push(live(pending(1))).expect("queued");
    assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![1, 1, 1]));
    assert_eq!(q.len(), 0);
    // Full at once.
    for bs in [2, 2, 1] {
        q.push(live(pending(bs))).expect("queued");
    }
    assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![2, 2]));
    // Closing hands out what is left without waiting, then says closed.
    q.close_gracefully();
    assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![1]));
    assert!(matches!(q.try_next_batch(&lane), TryNext::Closed));
}

#[test]
fn a_runtime_worker_leaves_out_cancelled_requests_and_takes_one_at_a_time_without_batching() {
    let q = queue(Some(Batching { max_batch_size: 4, preferred: vec![], max_delay: Duration::ZERO }));
    let lane = q.lane();
    q.push(live(pending(1))).expect("queued");
    let (gone, rx) = pending(1);
    q.push(gone).expect("queued");
    drop(rx);
    q.push(live(pending(1))).expect("queued");
    assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![1, 1]), "the cancelled request is answered, not run");
    let q = queue(None);
    let lane = q.lane();
    q.push(live_id("a")).expect("queued");
    q.push(live_id("b")).expect("queued");
    match q.try_next_batch(&lane) {
        TryNext::Batch(b) => assert_eq!(ids(&b), vec!["a"]),
        _ => panic!("a request without batching runs at once"),
    }
}

#[tokio::test]
async fn idle_runtime_workers_are_notified_in_turn_and_none_is_missed() {
    let q = Arc::new(queue(None));
    let (a, b) = (q.lane(), q.lane());
    let notified = |lane: &Lane| {
        let n = lane.notify.clone();
        async move { tokio::time::timeout(Duration::from_millis(200), n.notified()).await.is_ok() }
    };
    assert!(matches!(q.try_next_batch(&a), TryNext::Wait(None)));
    assert!(matches!(q.try_next_batch(&b), TryNext::Wait(None)));
    assert!(q.ready_batch().is_none(), "an idle worker runs it sooner: nobody takes it ahead");
    // The push comes before either waits: the longest idle one keeps its wake-up, the other
    // gets none.
    q.push(live_id("1")).expect("queued");
    assert!(notified(&a).await, "the longest idle worker is notified");
    assert!(!notified(&b).await, "only one worker is woken for one request");
    assert!(matches!(q.try_next_batch(&a), TryNext::Batch(_)));
    assert!(matches!(q.try_next_batch(&a), TryNext::Wait(None)), "a is idle again, behind b");
    q.push(live_id("2")).expect("queued");
    assert!(notified(&b).await, "now it is b's turn");
    assert!(!notified(&a).await);
    assert!(matches!(q.try_next_batch(&b), TryNext::Batch(_)));
    // wake_all (a restart, a dead stub) and closing notify every idle worker.
    assert!(matches!(q.try_next_batch(&b), TryNext::Wait(None)));
    q.wake_all();
    assert!(notified(&a).await && notified(&b).await);
    q.forget_lane(&a);
    q.close_gracefully();
    assert!(notified(&b).await && !notified(&a).await, "a forgotten worker is not notified");
    assert!(matches!(q.try_next_batch(&b), TryNext::Closed));
}

#[test]
fn a_dynamic_batch_is_taken_ahead_only_when_it_would_not_wait() {
    let b = |preferred: Vec<u64>, delay_ms: u64| Batching {
        max_batch_size: 4,
        preferred,
        max_delay: Duration::from_millis(delay_ms),
    };
    // Partial, no preferred size, delay not over: it waits for the normal path.
    let q = queue(Some(b(vec![], 60_000)));
    q.push(live(pending(1))).expect("queued");
    q.push(live(pending(1))).expect("queued");
    assert!(q.ready_batch().is_none());
    assert_eq!(q.len(), 2, "nothing was taken");
    // Full: taken at once, up to the largest batch.
    for bs in [1, 1, 3] {
        q.push(live(pending(bs))).expect("queued");
    }
    assert_eq!(q.ready_batch().as_deref().map(sizes), Some(vec![1, 1, 1, 1]));
    assert_eq!(q.len(), 1);
    // A preferred size.
    let q = queue(Some(b(vec![2], 60_000)));
    q.push(live(pending(1))).expect("queued");
    q.push(live(pending(1))).expect("queued");
    assert_eq!(q.ready_batch().as_deref().map(sizes), Some(vec![1, 1]));
    // The delay of the oldest is over.
    let q = queue(Some(b(vec![], 0)));
    q.push(live(pending(1))).expect("queued");
    assert_eq!(q.ready_batch().as_deref().map(sizes), Some(vec![1]));
}

#[test]
fn requeued_requests_go_back_to_the_front_in_their_order() {
    let q = queue(None);
    for id in ["a", "b", "c"] {
        q.push(live_id(id)).expect("queued");
    }
    let first = q.ready_batch().expect("a");
    let second = q.ready_batch().expect("b");
    q.requeue(first.into_iter().chain(second).collect());
    assert_eq!(drain_ids(&q), vec!["a", "b", "c"]);
}

#[test]
fn without_batching_each_request_goes_alone() {
    let q = queue(None);
    for _ in 0..3 {
        assert!(q.push(live(pending(1))).is_ok());
    }
    assert_eq!(q.next_batch().map(|b| b.len()), Some(1));
    assert_eq!(q.len(), 2);
}

#[test]
fn batches_fill_up_to_max_batch_size_without_waiting() {
    let q = queue(Some(Batching { max_batch_size: 4, preferred: vec![], max_delay: Duration::from_secs(60) }));
    for bs in [2, 1, 1, 3] {
        assert!(q.push(live(pending(bs))).is_ok());
    }
    let t = Instant::now();
    assert_eq!(sizes(&q.next_batch().expect("batch")), vec![2, 1, 1]);
    assert!(t.elapsed() < Duration::from_secs(30), "a full batch does not wait for the delay");
    assert_eq!(q.len(), 1);
}

#[test]
fn a_partial_batch_waits_for_the_delay_and_collects_late_arrivals() {
    let q =
        Arc::new(queue(Some(Batching { max_batch_size: 8, preferred: vec![], max_delay: Duration::from_millis(300) })));
    assert!(q.push(live(pending(1))).is_ok());
    let q2 = q.clone();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        assert!(q2.push(live(pending(2))).is_ok());
    });
    let batch = q.next_batch().expect("batch");
    late.join().expect("thread");
    assert_eq!(sizes(&batch), vec![1, 2]);
}

#[test]
fn a_preferred_size_ends_the_wait() {
    let q = queue(Some(Batching { max_batch_size: 8, preferred: vec![2], max_delay: Duration::from_secs(60) }));
    assert!(q.push(live(pending(1))).is_ok());
    assert!(q.push(live(pending(1))).is_ok());
    assert_eq!(sizes(&q.next_batch().expect("batch")), vec![1, 1]);
}

#[test]
fn idle_workers_do_not_split_a_forming_batch() {
    let q =
        Arc::new(queue(Some(Batching { max_batch_size: 8, preferred: vec![], max_delay: Duration::from_millis(200) })));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            std::thread::spawn(move || q.next_batch().map(|b| b.len()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..4 {
        assert!(q.push(live(pending(1))).is_ok());
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
    let q = Arc::new(queue(None));
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
    let q = Arc::new(queue(None));
    let q2 = q.clone();
    let worker = std::thread::spawn(move || q2.next_batch().is_none());
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.close().is_empty());
    assert!(worker.join().expect("worker"));
    assert!(matches!(q.push(live(pending(1))), Err(Refused::Closed)));
}

#[test]
fn a_full_queue_refuses_with_tritons_text_naming_the_field() {
    let p = Priorities::for_config(&config("default_queue_policy { max_queue_size: 2 }"), 0);
    let q = Queue::new(None, p, stats());
    assert!(q.push(live(request("a", 0, 0, 1))).is_ok());
    assert!(q.push(live(request("b", 0, 0, 1))).is_ok());
    let text = refused_text(q.push(live(request("c", 0, 0, 1))));
    assert!(text.starts_with("[request id: c] Exceeds maximum queue size"), "{text}");
    assert!(text.contains("2 requests"), "{text}");
    assert!(text.contains("dynamic_batching.default_queue_policy.max_queue_size"), "{text}");
    let text = refused_text(q.push(live(request("", 0, 0, 1))));
    assert!(text.starts_with("[request id: <id_unknown>] Exceeds maximum queue size"), "{text}");
    // Taking one makes room for one.
    assert_eq!(q.next_batch().map(|b| b.len()), Some(1));
    assert!(q.push(live(request("d", 0, 0, 1))).is_ok());
    assert_eq!(q.len(), 2);
}

#[test]
fn the_server_flag_bounds_models_without_a_bound_of_their_own() {
    let mut plain = config("");
    plain.scheduling_choice = None;
    let p = Priorities::for_config(&plain, 1);
    assert_eq!(p, Priorities::single(Policy::bounded_by_flag(1)));
    let q = Queue::new(None, p, stats());
    assert!(q.push(live(pending(1))).is_ok());
    let text = refused_text(q.push(live(pending(1))));
    assert!(text.contains("Exceeds maximum queue size: 1 requests"), "{text}");
    assert!(text.contains("--max-queue-size"), "{text}");
    // The model's own bound wins over the flag.
    let own = Priorities::for_config(&config("default_queue_policy { max_queue_size: 3 }"), 1);
    assert_eq!(own.default_policy.max_queue_size, 3);
    let unbounded = Priorities::for_config(&plain, 0);
    assert_eq!(unbounded.default_policy.max_queue_size, 0);
}

#[test]
fn higher_priorities_go_first_and_out_of_range_ones_take_the_default_level() {
    let p = Priorities::for_config(&config("priority_levels: 3 default_priority_level: 2"), 0);
    let q = Queue::new(None, p, stats());
    for (id, priority) in [("low", 3), ("zero", 0), ("high", 1), ("seven", 7), ("mid", 2)] {
        assert!(q.push(live(request(id, priority, 0, 1))).is_ok());
    }
    assert_eq!(drain_ids(&q), ["high", "zero", "seven", "mid", "low"]);
}

#[test]
fn without_priority_levels_the_priority_is_ignored() {
    let q = queue(None);
    for (id, priority) in [("a", 5), ("b", 1), ("c", 0)] {
        assert!(q.push(live(request(id, priority, 0, 1))).is_ok());
    }
    assert_eq!(drain_ids(&q), ["a", "b", "c"]);
}

#[test]
fn a_batch_is_gathered_in_priority_order() {
    let p = Priorities::for_config(&config("priority_levels: 2 default_priority_level: 2"), 0);
    let batching = Batching { max_batch_size: 2, preferred: vec![], max_delay: Duration::from_secs(60) };
    let q = Queue::new(Some(batching), p, stats());
    for (id, priority) in [("l1", 2), ("l2", 2), ("h1", 1)] {
        assert!(q.push(live(request(id, priority, 0, 1))).is_ok());
    }
    assert_eq!(ids(&q.next_batch().expect("batch")), ["h1", "l1"]);
}

#[test]
fn each_level_has_its_own_policy() {
    let p = Priorities::for_config(
        &config(
            "priority_levels: 2 default_priority_level: 2 \
             priority_queue_policy { key: 1 value: { max_queue_size: 1 } }",
        ),
        0,
    );
    let q = Queue::new(None, p, stats());
    assert!(q.push(live(request("h1", 1, 0, 1))).is_ok());
    let text = refused_text(q.push(live(request("h2", 1, 0, 1))));
    assert!(text.contains("at priority level 1"), "{text}");
    assert!(text.contains("dynamic_batching.priority_queue_policy[1].max_queue_size"), "{text}");
    for _ in 0..3 {
        assert!(q.push(live(request("l", 2, 0, 1))).is_ok());
    }
}

#[test]
fn a_timed_out_request_is_rejected_and_counted() {
    let p = Priorities::for_config(&config("default_queue_policy { default_timeout_microseconds: 1000 }"), 0);
    let s = stats();
    let q = Queue::new(None, p, s.clone());
    let (a, mut rx) = request("a", 0, 0, 1);
    assert!(matches!(q.push(a), Ok(Some(_))), "the request is queued with a deadline");
    std::thread::sleep(Duration::from_millis(20));
    q.expire();
    assert_eq!(q.len(), 0);
    let e = rx.try_recv().expect("answered").expect_err("an error");
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Unavailable, TIMEOUT_EXPIRED));
    let snap = s.snapshot();
    assert_eq!((snap.fail.count, snap.fail_reasons.rejected), (1, 1));
}

#[test]
fn a_delayed_request_goes_behind_the_others_and_still_runs() {
    let p = Priorities::for_config(
        &config(
            "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000 \
             allow_timeout_override: true }",
        ),
        0,
    );
    let q = Queue::new(None, p, stats());
    assert!(q.push(live(request("late", 0, 1000, 1))).is_ok());
    assert!(q.push(live(request("on_time", 0, 0, 1))).is_ok());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(drain_ids(&q), ["on_time", "late"]);
}

#[test]
fn a_request_timeout_only_shortens_an_allowed_default() {
    let policy = |default_us: u64, allow: bool| Policy {
        default_timeout: (default_us > 0).then(|| Duration::from_micros(default_us)),
        allow_timeout_override: allow,
        ..Policy::unbounded()
    };
    let us = Duration::from_micros;
    assert_eq!(policy(0, true).timeout_for(500), None);
    assert_eq!(policy(1000, false).timeout_for(500), Some(us(1000)));
    assert_eq!(policy(1000, true).timeout_for(500), Some(us(500)));
    assert_eq!(policy(1000, true).timeout_for(5000), Some(us(1000)));
    assert_eq!(policy(1000, true).timeout_for(0), Some(us(1000)));
}
