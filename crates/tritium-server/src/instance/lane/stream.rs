//! Decoupled models on the runtime: the lane's task takes a batch, makes its requests open
//! ([`OpenRequests`], the worker thread's table), sends the `Execute`, and forwards each
//! response to its request's stream as it arrives, during `execute` and after it, waiting on the
//! stub's doorbell in between.
//!
//! On a worker thread a streamed response crossed two threads: the runtime woke the worker to
//! take the batch, and the worker, which read the stub's ring, woke the runtime for every
//! response it forwarded. Here the frontend task, the queue, the forwarding and the client's
//! stream share one runtime thread. The task yields after a request's first response (so its
//! frontend sends it before the task reads on) and after every [`CHUNK`] messages (so a model
//! that streams without pause does not hold the thread). Cancellation and credit go to the stub
//! as on the worker, every [`WATCH_SLICE`] during `execute` and every [`STREAM_POLL`] while
//! streams are open after it, and never wait for room in the stub's ring (one that does not go
//! is sent at the next watch).

use super::*;
use crate::instance::{
    died_idle, end_batch, kill_failed, open_batch, try_sent, OpenRequests, DRAIN_LIMIT, STREAM_POLL,
};
use tritium_host::WATCH_SLICE;
use tritium_ipc::ToServer;

/// At most this many messages are taken from the stub before the task lets the runtime's other
/// tasks run (the frontends sending what was forwarded).
const CHUNK: usize = 16;

/// Serves a decoupled model's `stub` from the lane's task, as [`serve_lane`] does the others.
pub(super) async fn serve_lane(
    ctx: &VersionContext,
    instance: &Instance,
    stub: &Stub,
    bell: &Bell,
    timer: &Timer,
    lane: &Lane,
) -> Served {
    let mut open = OpenRequests::default();
    let served = serve_open(ctx, instance, stub, bell, timer, lane, &mut open).await;
    open.end(ctx, stub, &served);
    served
}

async fn serve_open(
    ctx: &VersionContext,
    instance: &Instance,
    stub: &Stub,
    bell: &Bell,
    timer: &Timer,
    lane: &Lane,
    open: &mut OpenRequests,
) -> Served {
    let window = ctx.settings.max_inflight_responses;
    loop {
        if instance.died.load(Ordering::Acquire) {
            return off_runtime(|| died_idle(stub));
        }
        if instance.restart.load(Ordering::Acquire) {
            // A recycled stub's open streams end on it: nothing of theirs fails.
            if instance.recycling.load(Ordering::Acquire) {
                if let Err(e) = drain(ctx, instance, stub, bell, open).await {
                    let exit = off_runtime(|| stub.kill());
                    return Served::Died(e.to_string(), exit);
                }
            }
            return Served::Restart;
        }
        match ctx.queue.try_next_batch(lane) {
            TryNext::Closed => return Served::Closed,
            TryNext::Batch(batch) => {
                // Under `--rate-limit execution_count` the batch waits for the instance's resources.
                let _permit = match ctx.rate_limits.get(&instance.spec.name) {
                    Some(member) => Some(member.acquire().await.logged(&ctx.model, ctx.version, &instance.spec.name)),
                    None => None,
                };
                instance.inflight.store(batch.len() as u64, Ordering::Relaxed);
                instance.took(batch.len());
                let result = run_batch(ctx, stub, bell, batch, open).await;
                instance.inflight.store(0, Ordering::Relaxed);
                if let Err(e) = result {
                    error!("{e}");
                    let exit = off_runtime(|| kill_failed(stub, &e));
                    return Served::Died(e.to_string(), exit);
                }
            }
            TryNext::Wait(until) => {
                // With streams open, the wait ends every STREAM_POLL for their cancellations
                // and credit; their responses ring the doorbell.
                let limit = if open.0.is_empty() { IDLE_CHECK } else { STREAM_POLL };
                let rung = tokio::select! {
                    _ = lane.notify.notified() => None,
                    rung = bell.wait(stub, limit) => Some(rung),
                    () = timer.sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => None,
                };
                match rung.map(|rung| streamed(ctx, stub, open, rung)) {
                    Some(Err(e)) => {
                        let exit = off_runtime(|| stub.kill());
                        return Served::Died(e.to_string(), exit);
                    }
                    // As during `execute`: the frontends take, then the credit goes.
                    Some(Ok(true)) => tokio::task::yield_now().await,
                    _ => {}
                }
                open.watch_by(window, &mut |m| try_sent(stub, &m));
            }
        }
    }
}

/// Forwards what the stub sent while no `execute` runs: the responses of open requests (anything
/// else but logs and calls is a protocol error): whether it forwarded any. `rung` is false when
/// the wait timed out: then the process is checked.
fn streamed(ctx: &VersionContext, stub: &Stub, open: &mut OpenRequests, rung: bool) -> Result<bool, HostError> {
    let mut forwarded = false;
    for _ in 0..CHUNK {
        match try_message(stub)? {
            None => break,
            Some(ToServer::Response(r)) => {
                forwarded = true;
                let first = open.first_response(&r);
                open.route(ctx, stub, r).map_err(|why| stub.protocol_error(why))?;
                if first {
                    break;
                }
            }
            Some(other) => return Err(stub.protocol_error(format!("sent {other:?} while idle"))),
        }
    }
    if !rung {
        check_alive(stub)?;
    }
    Ok(forwarded)
}

/// Forwards the responses of the open requests until every one has ended ([`DRAIN_LIMIT`]
/// at most, or until the stub dies), taking no new batch: a recycled stub finishes what it has.
async fn drain(
    ctx: &VersionContext,
    instance: &Instance,
    stub: &Stub,
    bell: &Bell,
    open: &mut OpenRequests,
) -> Result<(), HostError> {
    let until = Instant::now() + DRAIN_LIMIT;
    let window = ctx.settings.max_inflight_responses;
    while !open.0.is_empty() && Instant::now() < until && !instance.died.load(Ordering::Acquire) {
        let rung = bell.wait(stub, STREAM_POLL).await;
        if streamed(ctx, stub, open, rung)? {
            tokio::task::yield_now().await;
        }
        open.watch_by(window, &mut |m| try_sent(stub, &m));
    }
    Ok(())
}

/// Runs one batch: its requests become open, its `execute` runs, and the batch is settled
/// ([`end_batch`]) once the stub says it is done.
async fn run_batch(
    ctx: &VersionContext,
    stub: &Stub,
    bell: &Bell,
    batch: Vec<crate::pending::Pending>,
    open: &mut OpenRequests,
) -> Result<(), HostError> {
    let Some((opened, requests)) = open_batch(ctx, stub, batch, open) else { return Ok(()) };
    let executed = execute(ctx, stub, bell, requests, open).await;
    end_batch(ctx, stub, opened, executed, open)
}

/// Sends the batch's `Execute` and forwards its responses until its `ExecuteDone`, up to the
/// execute timeout: the error `execute` raised, if it did. Every [`LIVENESS_SLICE`] without a
/// message the process is checked.
async fn execute(
    ctx: &VersionContext,
    stub: &Stub,
    bell: &Bell,
    requests: Vec<tritium_ipc::Request>,
    open: &mut OpenRequests,
) -> Result<Option<tritium_ipc::StubError>, HostError> {
    let (batch, msg) = stub.prepare_decoupled_execute(requests);
    send(stub, &msg).await?;
    let start = Instant::now();
    let timeout = ctx.settings.execute_timeout;
    let window = ctx.settings.max_inflight_responses;
    let (mut watched, mut checked) = (start, start);
    loop {
        let mut forwarded = false;
        for _ in 0..CHUNK {
            let Some(msg) = try_message(stub)? else { break };
            match msg {
                ToServer::Response(r) => {
                    forwarded = true;
                    let first = open.first_response(&r);
                    open.route(ctx, stub, r).map_err(|why| stub.protocol_error(why))?;
                    if first {
                        break;
                    }
                }
                ToServer::ExecuteDone { batch: done, error } if done == batch => return Ok(error),
                other => return Err(stub.protocol_error(format!("sent {other:?} during execute"))),
            }
        }
        if forwarded {
            // The frontends take what was just forwarded, and the credit that frees goes to the
            // stub before this task waits: a model that used up its window waits for it.
            tokio::task::yield_now().await;
            open.watch_by(window, &mut |m| try_sent(stub, &m));
            watched = Instant::now();
        } else if watched.elapsed() >= WATCH_SLICE {
            open.watch_by(window, &mut |m| try_sent(stub, &m));
            watched = Instant::now();
        }
        let mut limit = WATCH_SLICE;
        if let Some(t) = timeout {
            let left = t.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(HostError::Timeout {
                    instance: stub.instance().to_string(),
                    what: "finish execute",
                    after: t,
                });
            }
            limit = limit.min(left);
        }
        if bell.wait(stub, limit).await {
            continue;
        }
        open.watch_by(window, &mut |m| try_sent(stub, &m));
        watched = Instant::now();
        if checked.elapsed() >= LIVENESS_SLICE {
            checked = Instant::now();
            if let Err(e) = check_alive(stub) {
                // Forward whatever it managed to send before dying.
                while let Ok(Some(msg)) = stub.try_message() {
                    match msg {
                        ToServer::Response(r) => {
                            let _ = open.route(ctx, stub, r);
                        }
                        ToServer::ExecuteDone { batch: done, error } if done == batch => return Ok(error),
                        _ => {}
                    }
                }
                return Err(e);
            }
        }
    }
}
