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
use crate::instance::{end_batch, open_batch, try_sent, OpenRequests, DRAIN_LIMIT, STREAM_POLL};
use tritium_host::WATCH_SLICE;
use tritium_ipc::ToServer;

/// At most this many messages are taken from the stub before the task lets the runtime's other
/// tasks run (the frontends sending what was forwarded).
const CHUNK: usize = 16;

/// The lane of a decoupled model: its open requests, kept across batches.
#[derive(Default)]
pub(super) struct Streams(OpenRequests);

impl Streams {
    /// Ends the requests still open when serving ended with `served` ([`OpenRequests::end`]).
    pub(super) fn end(&mut self, ctx: &VersionContext, stub: &Stub, served: &Served) {
        self.0.end(ctx, stub, served);
    }
}

impl Serving for Streams {
    async fn run(&mut self, on: &On<'_>, batch: Vec<crate::pending::Pending>) -> Result<(), HostError> {
        run_batch(on.ctx, on.stub, on.bell, batch, &mut self.0).await
    }

    /// With streams open, the wait ends every STREAM_POLL for their cancellations and credit;
    /// their responses ring the doorbell.
    fn idle_wait(&self) -> Duration {
        if self.0 .0.is_empty() {
            IDLE_CHECK
        } else {
            STREAM_POLL
        }
    }

    async fn idle(&mut self, on: &On<'_>, rung: Option<bool>) -> Result<(), HostError> {
        let open = &mut self.0;
        if let Some(rung) = rung {
            if streamed(on.ctx, on.stub, open, rung)? {
                // As during `execute`: the frontends take, then the credit goes.
                tokio::task::yield_now().await;
            }
        }
        open.watch_by(on.ctx.settings.max_inflight_responses, &mut |m| try_sent(on.stub, &m));
        Ok(())
    }

    /// A recycled stub's open streams end on it: nothing of theirs fails.
    async fn before_restart(&mut self, on: &On<'_>, recycling: bool) -> Result<(), HostError> {
        if recycling {
            drain(on.ctx, on.instance, on.stub, on.bell, &mut self.0).await?;
        }
        Ok(())
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
        let limit = execute_wait(stub, timeout, start)?;
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
