//! Unit tests of the sequence batcher: slots, backlog, the control inputs, idle timeouts and
//! Triton's errors for sequence requests.

use super::*;
use tokio::sync::oneshot;

type Rx = oneshot::Receiver<Result<crate::types::InferResponse, InferError>>;

fn control(name: &str) -> Option<Control> {
    Some(Control {
        name: name.into(),
        dtype: DataType::Int32,
        off: Bytes::from(0i32.to_le_bytes().to_vec()),
        on: Bytes::from(1i32.to_le_bytes().to_vec()),
    })
}

fn sequences(strategy: Strategy, instances: usize, slots: usize, idle: Duration) -> Sequences {
    let names = (0..instances).map(|i| format!("m_{i}")).collect();
    Sequences::new(
        "m",
        names,
        Layout { strategy, slots, max_batch_size: slots, idle, batching: true, max_backlog: 1000 },
        [control("START"), control("END"), control("READY")],
        Some(("CORRID".into(), DataType::Uint64)),
        Arc::new(Stats::new("m", 1)),
    )
}

fn direct(instances: usize, slots: usize) -> Sequences {
    sequences(
        Strategy::Direct { delay: Duration::ZERO, min_utilization: 0.0 },
        instances,
        slots,
        Duration::from_secs(60),
    )
}

fn request(id: u64, flags: u32, value: f32) -> (Pending, Rx) {
    let (tx, rx) = oneshot::channel();
    let req = InferRequest {
        model: "m".into(),
        id: format!("{id}-{value}"),
        correlation_id: if id == 0 { CorrelationId::None } else { CorrelationId::U64(id) },
        flags,
        inputs: vec![InputTensor {
            name: "INPUT".into(),
            datatype: DataType::Fp32,
            shape: vec![1, 1],
            data: Bytes::copy_from_slice(&value.to_le_bytes()),
        }],
        ..Default::default()
    };
    (Pending { req, batch_size: 1, outputs: vec![], enqueued: Instant::now(), tx: Reply::Unary(tx), trace: None }, rx)
}

/// Pushes a request whose client keeps waiting.
fn push(s: &Sequences, id: u64, flags: u32, value: f32) -> Result<(), Refused> {
    let (p, rx) = request(id, flags, value);
    std::mem::forget(rx);
    s.push(p)
}

fn refused(r: Result<(), Refused>) -> String {
    match r {
        Err(Refused::Invalid(e)) => {
            assert_eq!(e.kind, ErrorKind::InvalidArg);
            e.message
        }
        Err(Refused::Full(e)) => panic!("full: {e}"),
        Err(Refused::Closed) => panic!("closed"),
        Ok(()) => panic!("queued"),
    }
}

fn batch(s: &Sequences, instance: &str) -> Vec<Pending> {
    match s.next_batch(instance, &|| false, Duration::from_millis(1)) {
        Next::Batch(b) => b,
        Next::Idle => vec![],
        Next::Closed => panic!("closed"),
        Next::Interrupted => panic!("interrupted"),
    }
}

fn input<'a>(p: &'a Pending, name: &str) -> &'a InputTensor {
    p.req.inputs.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no input {name}"))
}

fn i32_of(p: &Pending, name: &str) -> i32 {
    let data = &input(p, name).data;
    i32::from_le_bytes([data[0], data[1], data[2], data[3]])
}

fn corrid(p: &Pending) -> u64 {
    let data = &input(p, "CORRID").data;
    u64::from_le_bytes(data[..8].try_into().expect("8 bytes"))
}

fn value(p: &Pending) -> f32 {
    let data = &input(p, "INPUT").data;
    f32::from_le_bytes(data[..4].try_into().expect("4 bytes"))
}

const S: u32 = FLAG_SEQUENCE_START;
const E: u32 = FLAG_SEQUENCE_END;

#[test]
fn sequences_take_the_lowest_free_slot_instances_in_turn_and_stay_there() {
    let s = direct(2, 2);
    for id in 1..=4 {
        assert!(push(&s, id, S, id as f32).is_ok());
    }
    // Slot 0 of each instance, then slot 1 of each: sequences 1 and 3 on m_0, 2 and 4 on m_1.
    let b0 = batch(&s, "m_0");
    assert_eq!(b0.iter().map(corrid).collect::<Vec<_>>(), [1, 3]);
    let b1 = batch(&s, "m_1");
    assert_eq!(b1.iter().map(corrid).collect::<Vec<_>>(), [2, 4]);
    assert!(b0.iter().chain(&b1).all(|p| i32_of(p, "START") == 1 && i32_of(p, "READY") == 1));
    assert!(b0.iter().all(|p| input(p, "START").shape == [1, 1]));
    // Later requests follow their sequence; the END frees the slot.
    assert!(push(&s, 3, 0, 30.0).is_ok());
    assert!(push(&s, 2, E, 20.0).is_ok());
    let b = batch(&s, "m_0");
    assert_eq!(b.len(), 2, "slot 1 has a request, so slot 0 gets a null request");
    assert_eq!(i32_of(&b[0], "READY"), 0);
    assert_eq!((corrid(&b[0]), value(&b[0])), (0, 0.0));
    assert!(matches!(b[0].tx, Reply::Discard));
    assert_eq!((corrid(&b[1]), i32_of(&b[1], "START"), i32_of(&b[1], "READY")), (3, 0, 1));
    let b = batch(&s, "m_1");
    assert_eq!(b.len(), 1);
    assert_eq!((corrid(&b[0]), i32_of(&b[0], "END")), (2, 1));
    assert!(batch(&s, "m_0").is_empty() && batch(&s, "m_1").is_empty());
    // Sequence 2's slot (m_1, slot 0) is the lowest free one now.
    assert!(push(&s, 9, S, 9.0).is_ok());
    assert_eq!(batch(&s, "m_1").iter().map(corrid).collect::<Vec<_>>(), [9]);
    assert_eq!(s.len(), 0);
}

#[test]
fn tritons_errors_for_missing_ids_missing_starts_and_batches() {
    let s = direct(1, 1);
    assert_eq!(
        refused(push(&s, 0, S, 0.0)),
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
    );
    assert_eq!(
        refused(push(&s, 7, 0, 0.0)),
        "inference request for sequence 7 to model 'm' must specify the START flag on the first request of the sequence"
    );
    let (mut p, _rx) = request(7, S, 0.0);
    p.batch_size = 2;
    assert_eq!(
        refused(s.push(p)),
        "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher"
    );
    let (mut p, _rx) = request(7, S, 0.0);
    p.req.correlation_id = CorrelationId::Str("abc".into());
    assert_eq!(
        refused(s.push(p)),
        "[request id: 7-0] sequence batching control 'CORRID' data-type is 'BYTES', but model 'm' expects 'UINT64'"
    );
    // An END for a sequence that already ended is as unknown as one never started.
    assert!(push(&s, 7, S | E, 1.0).is_ok());
    assert!(refused(push(&s, 7, E, 1.0)).contains("must specify the START flag"));
}

#[test]
fn sequences_without_a_free_slot_wait_in_the_backlog_until_one_ends() {
    let s = direct(1, 1);
    assert!(push(&s, 1, S, 1.0).is_ok());
    assert!(push(&s, 2, S, 2.0).is_ok());
    assert!(push(&s, 2, E, 2.5).is_ok());
    assert!(push(&s, 1, 0, 1.5).is_ok());
    assert_eq!(s.len(), 4);
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [1.0]);
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [1.5]);
    assert!(push(&s, 1, E, 1.75).is_ok());
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [1.75]);
    // Sequence 1 ended: sequence 2 takes the slot with everything it queued.
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [2.0]);
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [2.5]);
    assert_eq!(s.len(), 0);
    assert_eq!(s.lock().free.len(), 1);
}

#[test]
fn the_backlog_is_bounded_and_indexed_by_correlation_id() {
    let s = Sequences { max_backlog: 3, ..direct(1, 1) };
    assert!(push(&s, 1, S, 1.0).is_ok(), "takes the only slot");
    assert!(push(&s, 2, S, 2.0).is_ok());
    assert!(push(&s, 3, S, 3.0).is_ok());
    assert!(push(&s, 3, 0, 3.5).is_ok());
    {
        let st = s.lock();
        assert_eq!((st.backlog.len(), st.backlog.requests), (2, 3));
        assert_eq!(st.backlog.open_of(&Key::U64(3)), Some(1));
        // Backlogged sequences are not watched for idleness until they have a slot.
        assert!(!st.last_seen.contains_key(&Key::U64(2)) && !st.last_seen.contains_key(&Key::U64(3)));
    }
    let full = |r: Result<(), Refused>| match r {
        Err(Refused::Full(e)) => (e.kind, e.message),
        Err(Refused::Invalid(e)) => panic!("invalid: {e}"),
        Err(Refused::Closed) => panic!("closed"),
        Ok(()) => panic!("queued"),
    };
    let (kind, message) = full(push(&s, 4, S, 4.0));
    assert_eq!(kind, ErrorKind::Unavailable);
    assert_eq!(
        message,
        "the sequence backlog of model 'm' is full: 3 requests of sequences wait for a free sequence slot, the \
         limit (server flag --max-sequence-backlog); try again later"
    );
    assert!(full(push(&s, 3, E, 3.75)).1.contains("--max-sequence-backlog"), "joining counts too");
    // The sequence with the slot is not held back by a full backlog.
    assert!(push(&s, 1, E, 1.5).is_ok());
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [1.0]);
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [1.5]);
    // Sequence 1 ended; sequence 2 left the backlog for its slot, so there is room again.
    assert_eq!(s.lock().backlog.requests, 2);
    assert!(s.lock().last_seen.contains_key(&Key::U64(2)), "its idle time starts with the slot");
    assert!(push(&s, 4, S, 4.0).is_ok());
    assert_eq!(s.len(), 4);
}

#[test]
fn backlogged_sequences_expire_by_their_requests_timeouts() {
    let s = direct(1, 1);
    assert!(push(&s, 1, S, 1.0).is_ok());
    let (mut p, mut rx) = request(2, S, 2.0);
    p.req.timeout_us = 1_000;
    assert!(s.push(p).is_ok());
    let (p, mut later) = request(3, S, 3.0);
    assert!(s.push(p).is_ok());
    std::thread::sleep(Duration::from_millis(5));
    assert!(push(&s, 1, 0, 1.5).is_ok(), "a push reaps the expired sequence");
    let e = rx.try_recv().expect("answered").expect_err("expired");
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Unavailable, BACKLOG_TIMEOUT));
    assert!(later.try_recv().is_err(), "sequence 3 has no timeout and still waits");
    let st = s.lock();
    assert_eq!((st.backlog.len(), st.backlog.requests, st.backlog.expiries.len()), (1, 1, 0));
    assert_eq!(st.backlog.open_of(&Key::U64(2)), None);
}

#[test]
fn an_idle_sequence_is_released_and_its_next_request_needs_a_start() {
    let s =
        sequences(Strategy::Direct { delay: Duration::ZERO, min_utilization: 0.0 }, 1, 1, Duration::from_millis(30));
    assert!(push(&s, 1, S, 1.0).is_ok());
    assert!(push(&s, 2, S, 2.0).is_ok(), "backlogged behind sequence 1");
    assert_eq!(batch(&s, "m_0").len(), 1);
    std::thread::sleep(Duration::from_millis(60));
    // The reaper releases sequence 1; sequence 2 (backlogged, so never reaped) gets its slot.
    assert_eq!(batch(&s, "m_0").iter().map(corrid).collect::<Vec<_>>(), [2]);
    assert!(refused(push(&s, 1, 0, 1.5)).contains("sequence 1 to model 'm' must specify the START flag"));
    // Still within its idle time, sequence 2 goes on.
    assert!(push(&s, 2, 0, 2.5).is_ok());
    std::thread::sleep(Duration::from_millis(60));
    // Idle again: released once its queued request ran.
    assert!(refused(push(&s, 2, 0, 3.0)).contains("sequence 2"));
    assert_eq!(batch(&s, "m_0").iter().map(value).collect::<Vec<_>>(), [2.5]);
    assert_eq!(batch(&s, "m_0").len(), 0);
    assert_eq!(s.lock().free.len(), 1);
}

#[test]
fn oldest_batches_one_request_per_sequence_oldest_first_and_waits_for_a_preferred_size() {
    let s = sequences(
        Strategy::Oldest { preferred: vec![3], delay: Duration::from_secs(60) },
        1,
        4,
        Duration::from_secs(60),
    );
    assert!(push(&s, 5, S, 5.0).is_ok());
    assert!(push(&s, 5, 0, 5.5).is_ok());
    assert!(push(&s, 6, S, 6.0).is_ok());
    // Two sequences ready, preferred 3: it waits (the delay is long).
    assert!(batch(&s, "m_0").is_empty());
    assert!(push(&s, 7, S, 7.0).is_ok());
    let b = batch(&s, "m_0");
    assert_eq!(b.iter().map(value).collect::<Vec<_>>(), [5.0, 6.0, 7.0]);
    assert!(b.iter().all(|p| input(p, "START").shape == [1, 1] && i32_of(p, "START") == 1));
    // Only sequence 5 has a next request: one, after the delay; a short delay runs it at once.
    let s2 = sequences(Strategy::Oldest { preferred: vec![3], delay: Duration::ZERO }, 1, 4, Duration::from_secs(60));
    assert!(push(&s2, 1, S, 1.0).is_ok());
    assert!(push(&s2, 1, E, 1.5).is_ok());
    assert_eq!(batch(&s2, "m_0").iter().map(value).collect::<Vec<_>>(), [1.0]);
    assert_eq!(batch(&s2, "m_0").iter().map(value).collect::<Vec<_>>(), [1.5]);
}

#[test]
fn a_cancelled_request_ends_its_sequence_and_a_gone_instance_answers_its_own() {
    let s = direct(2, 1);
    let (p, rx) = request(1, S, 1.0);
    assert!(s.push(p).is_ok());
    assert!(push(&s, 1, 0, 1.5).is_ok());
    drop(rx);
    assert!(batch(&s, "m_0").is_empty(), "the whole sequence is cancelled");
    assert_eq!(s.len(), 0);
    assert!(refused(push(&s, 1, 0, 2.0)).contains("START"));
    assert_eq!(s.stats.snapshot().fail_reasons.canceled, 2);

    let (p, mut rx) = request(2, S, 2.0);
    assert!(s.push(p).is_ok());
    let lane = s.lock().assigned.get(&Key::U64(2)).map(|at| at.lane).expect("assigned");
    s.instance_gone(&format!("m_{lane}"));
    let e = rx.try_recv().expect("answered").expect_err("an error");
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(e.message.contains("stopped"), "{}", e.message);
    // Only the other instance's slot is left.
    assert!(push(&s, 3, S, 3.0).is_ok());
    assert!(push(&s, 4, S, 4.0).is_ok());
    assert_eq!(s.lock().backlog.len(), 1);
}

#[test]
fn string_ids_and_corrid_bytes() {
    assert_eq!(&corrid_bytes(&CorrelationId::Str("ab".into()), DataType::Bytes)[..], [2, 0, 0, 0, b'a', b'b']);
    assert_eq!(&corrid_bytes(&CorrelationId::U64(258), DataType::Int32)[..], [2, 1, 0, 0]);
    assert_eq!(corrid_bytes(&CorrelationId::None, DataType::Uint64).len(), 8);
    let s = direct(1, 1);
    let (mut p, _rx) = request(1, S, 1.0);
    p.req.correlation_id = CorrelationId::Str("abc".into());
    let s = Sequences { corrid: None, ..s };
    assert!(s.push(p).is_ok());
    let (mut p, _rx) = request(1, E, 1.0);
    p.req.correlation_id = CorrelationId::Str("abc".into());
    assert!(s.push(p).is_ok());
    assert_eq!(batch(&s, "m_0").len(), 1);
    assert_eq!(batch(&s, "m_0").len(), 1);
    assert_eq!(s.lock().free.len(), 1);
}
