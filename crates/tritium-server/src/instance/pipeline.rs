//! The pipelining rules of one instance, as a pure state machine: events in, actions out, no
//! I/O. Both the worker thread ([`run_batches`](super::ring::run_batches)) and the async lane
//! (`lane.rs`) drive it; they do what an [`Action`] says and report how it went as the next
//! [`Event`].
//!
//! The rules:
//! - At most two batches are in the stub's ring: the head, which the stub executes, and one sent
//!   behind it, so the stub starts that one the moment it ends the head.
//! - A batch is sent behind the head twice at most per head: right after the head is sent, and
//!   when the stub has ended the head, before its answers are read (for requests that came while
//!   it ran).
//! - Nothing is sent ahead once the instance is interrupted (a restart, a dead stub), nor under
//!   the rate limiter: each batch waits for its own resources, and the permit is held while it
//!   executes.
//! - If the stub fails before ending the head, the head fails and the batch behind goes back to
//!   the queue: the stub runs batches in order, so it never started that one, and one crashing
//!   request takes no other down with it. If the stub fails after ending the head (its answers
//!   broke the protocol), the batch behind fails too: the stub may have started it.
//! - If sending a batch behind an ended head fails, the head's answers are read all the same,
//!   then the stub's error is handed back.
//!
//! The driver holds the head (its form changes as the stub runs it); the machine holds the batch
//! behind and hands it back in the action that decides its fate.

/// Whether the instance may send a batch ahead, read by the driver when it reports an event
/// after which the machine decides that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Gate {
    /// A restart was asked for, or the stub died: the driver is to get back to its loop.
    pub(super) interrupted: bool,
    /// The rate limiter is on for the model.
    pub(super) rate_limited: bool,
}

impl Gate {
    fn open(self) -> bool {
        !self.interrupted && !self.rate_limited
    }
}

/// What the driver reports: the answer to the last [`Action`] (or the start).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Event<B> {
    /// The batch the driver holds heads the ring now: sent, its end not yet waited for. The
    /// first event, and the answer to [`Action::Promote`].
    HeadSent(Gate),
    /// The answer to [`Action::SendAhead`]: the batch sent behind the head, or `None` when
    /// nothing was sent (no batch was ready, or each of its requests was answered already).
    Sent(Option<B>),
    /// The answer to [`Action::SendAhead`]: sending found the stub unusable (the batch's own
    /// requests were answered with the error).
    SendFailed,
    /// The answer to [`Action::Wait`]: the stub ended the head.
    Ended(Gate),
    /// The answer to [`Action::Wait`]: the stub failed before ending the head.
    WaitFailed,
    /// The answer to [`Action::Answer`]: the head's requests are answered.
    Answered,
    /// The answer to [`Action::Answer`]: reading the head's answers found the stub unusable.
    AnswerFailed,
    /// The answer to [`Action::FailHead`], [`Action::Fail`] and [`Action::Requeue`]: done.
    Applied,
}

/// What the driver does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action<B> {
    /// Take the queue's ready batch, if there is one, and send it behind the head.
    SendAhead,
    /// Wait for the stub to end the head.
    Wait,
    /// Read the ended head's responses and answer its requests.
    Answer,
    /// This batch, sent behind the head that was just answered, heads the ring now.
    Promote(B),
    /// Answer the head's requests with the stub's error.
    FailHead,
    /// Answer this batch's requests with the stub's error: the stub may have started it.
    Fail(B),
    /// Put this batch back at the front of the queue: the stub never started it.
    Requeue(B),
    /// Every batch taken is answered.
    Done,
    /// Hand back the stub's error: it is unusable.
    Stop,
}

/// Where the machine is: which event it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// [`Event::HeadSent`].
    Heading,
    /// The answer to a send ahead of a head not yet waited for.
    SendingEarly,
    /// The answer to [`Action::Wait`].
    Waiting,
    /// The answer to a send behind an ended head.
    SendingLate,
    /// The answer to [`Action::Answer`]; `then_stop` when sending behind the head failed.
    Answering { then_stop: bool },
    /// The head is failed; next, the batch behind goes back to the queue.
    FailingHead,
    /// The batch behind is failed or requeued; next, the stop.
    Settling,
    /// [`Action::Done`] or [`Action::Stop`] was given.
    Over,
}

/// The pipelining state of one run of batches (see the module's doc).
#[derive(Debug)]
pub(super) struct Pipeline<B> {
    phase: Phase,
    /// The batch sent behind the head.
    behind: Option<B>,
}

impl<B> Pipeline<B> {
    /// A pipeline whose first batch the driver has sent; its first event is [`Event::HeadSent`].
    pub(super) fn new() -> Self {
        Self { phase: Phase::Heading, behind: None }
    }

    /// The batch sent behind the head, if one is.
    pub(super) fn behind(&self) -> Option<&B> {
        self.behind.as_ref()
    }

    /// The next action after `event`: every transition is in this one `match`. An event the
    /// machine does not wait for (a driver out of step) stops it, failing the batch behind.
    pub(super) fn on(&mut self, event: Event<B>) -> Action<B> {
        let (phase, action) = match (self.phase, event) {
            (Phase::Heading, Event::HeadSent(gate)) if self.behind.is_none() && gate.open() => {
                (Phase::SendingEarly, Action::SendAhead)
            }
            (Phase::Heading, Event::HeadSent(_)) => (Phase::Waiting, Action::Wait),
            (Phase::SendingEarly, Event::Sent(batch)) => {
                self.behind = batch;
                (Phase::Waiting, Action::Wait)
            }
            (Phase::SendingEarly, Event::SendFailed) | (Phase::Waiting, Event::WaitFailed) => {
                (Phase::FailingHead, Action::FailHead)
            }
            (Phase::Waiting, Event::Ended(gate)) if self.behind.is_none() && gate.open() => {
                (Phase::SendingLate, Action::SendAhead)
            }
            (Phase::Waiting, Event::Ended(_)) => (Phase::Answering { then_stop: false }, Action::Answer),
            (Phase::SendingLate, Event::Sent(batch)) => {
                self.behind = batch;
                (Phase::Answering { then_stop: false }, Action::Answer)
            }
            (Phase::SendingLate, Event::SendFailed) => (Phase::Answering { then_stop: true }, Action::Answer),
            (Phase::Answering { then_stop: true }, Event::Answered) => (Phase::Over, Action::Stop),
            (Phase::Answering { then_stop: false }, Event::Answered) => match self.behind.take() {
                Some(next) => (Phase::Heading, Action::Promote(next)),
                None => (Phase::Over, Action::Done),
            },
            (Phase::Answering { .. }, Event::AnswerFailed) => match self.behind.take() {
                Some(next) => (Phase::Settling, Action::Fail(next)),
                None => (Phase::Over, Action::Stop),
            },
            (Phase::FailingHead, Event::Applied) => match self.behind.take() {
                Some(next) => (Phase::Settling, Action::Requeue(next)),
                None => (Phase::Over, Action::Stop),
            },
            (Phase::Settling, Event::Applied) => (Phase::Over, Action::Stop),
            // Out of step: the batch behind, if any, fails with the stub's error first.
            _ => match self.behind.take() {
                Some(next) => (Phase::Settling, Action::Fail(next)),
                None => (Phase::Over, Action::Stop),
            },
        };
        self.phase = phase;
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: Gate = Gate { interrupted: false, rate_limited: false };
    const INTERRUPTED: Gate = Gate { interrupted: true, rate_limited: false };
    const RATE_LIMITED: Gate = Gate { interrupted: false, rate_limited: true };

    /// Feeds `events` to a fresh machine; the actions it answered with.
    fn run(events: Vec<Event<&'static str>>) -> Vec<Action<&'static str>> {
        let mut pipeline = Pipeline::new();
        events.into_iter().map(|e| pipeline.on(e)).collect()
    }

    use Action::*;
    use Event::*;

    #[test]
    fn a_lone_batch_is_waited_for_and_answered_when_nothing_is_ready() {
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(OPEN), Sent(None), Answered]),
            [SendAhead, Wait, SendAhead, Answer, Done]
        );
    }

    #[test]
    fn a_batch_sent_behind_the_head_heads_the_ring_once_the_head_is_answered() {
        assert_eq!(
            run(vec![
                HeadSent(OPEN),
                Sent(Some("b")),
                // The ring holds two: nothing more is sent when the head ends.
                Ended(OPEN),
                Answered,
                HeadSent(OPEN),
                Sent(None),
                Ended(OPEN),
                Sent(None),
                Answered,
            ]),
            [SendAhead, Wait, Answer, Promote("b"), SendAhead, Wait, SendAhead, Answer, Done]
        );
    }

    #[test]
    fn a_batch_that_came_while_the_head_ran_is_sent_before_the_head_is_answered() {
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(OPEN), Sent(Some("late")), Answered, HeadSent(OPEN)]),
            [SendAhead, Wait, SendAhead, Answer, Promote("late"), SendAhead]
        );
    }

    #[test]
    fn nothing_is_sent_ahead_of_an_interrupted_instance() {
        assert_eq!(run(vec![HeadSent(INTERRUPTED), Ended(INTERRUPTED), Answered]), [Wait, Answer, Done]);
        // Interrupted only once the head ran: the early send happened, the late one does not.
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(INTERRUPTED), Answered]),
            [SendAhead, Wait, Answer, Done]
        );
    }

    #[test]
    fn nothing_is_sent_ahead_under_the_rate_limiter() {
        assert_eq!(run(vec![HeadSent(RATE_LIMITED), Ended(RATE_LIMITED), Answered]), [Wait, Answer, Done]);
        let both = Gate { interrupted: true, rate_limited: true };
        assert_eq!(run(vec![HeadSent(both), Ended(both), Answered]), [Wait, Answer, Done]);
    }

    #[test]
    fn a_crash_with_one_batch_in_the_ring_fails_it() {
        assert_eq!(run(vec![HeadSent(OPEN), Sent(None), WaitFailed, Applied]), [SendAhead, Wait, FailHead, Stop]);
        assert_eq!(run(vec![HeadSent(INTERRUPTED), WaitFailed, Applied]), [Wait, FailHead, Stop]);
    }

    #[test]
    fn a_crash_before_the_head_ended_fails_it_and_requeues_the_batch_behind() {
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(Some("b")), WaitFailed, Applied, Applied]),
            [SendAhead, Wait, FailHead, Requeue("b"), Stop]
        );
    }

    #[test]
    fn a_crash_after_the_head_ended_fails_the_batch_behind_too() {
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(Some("b")), Ended(OPEN), AnswerFailed, Applied]),
            [SendAhead, Wait, Answer, Fail("b"), Stop]
        );
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(OPEN), Sent(None), AnswerFailed]),
            [SendAhead, Wait, SendAhead, Answer, Stop]
        );
    }

    #[test]
    fn a_failed_send_ahead_of_the_head_fails_the_head() {
        assert_eq!(run(vec![HeadSent(OPEN), SendFailed, Applied]), [SendAhead, FailHead, Stop]);
    }

    #[test]
    fn a_failed_send_behind_an_ended_head_answers_the_head_then_stops() {
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(OPEN), SendFailed, Answered]),
            [SendAhead, Wait, SendAhead, Answer, Stop]
        );
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(OPEN), SendFailed, AnswerFailed]),
            [SendAhead, Wait, SendAhead, Answer, Stop]
        );
    }

    #[test]
    fn the_ring_never_holds_more_than_two_batches() {
        // Whatever the driver reports, a batch is sent ahead only while none is behind the head.
        let mut pipeline = Pipeline::new();
        assert_eq!(pipeline.on(HeadSent(OPEN)), SendAhead);
        assert_eq!(pipeline.on(Sent(Some("b"))), Wait);
        assert_eq!(pipeline.behind(), Some(&"b"));
        assert_eq!(pipeline.on(Ended(OPEN)), Answer, "a batch is behind: no second one is sent");
    }

    #[test]
    fn an_event_out_of_step_stops_the_machine() {
        assert_eq!(run(vec![Ended(OPEN)]), [Stop]);
        assert_eq!(run(vec![HeadSent(OPEN), Answered]), [SendAhead, Stop]);
        assert_eq!(
            run(vec![HeadSent(OPEN), Sent(None), Ended(OPEN), Sent(None), Answered, Answered]),
            [SendAhead, Wait, SendAhead, Answer, Done, Stop]
        );
        assert_eq!(run(vec![HeadSent(OPEN), Sent(Some("b")), Answered, Applied]), [SendAhead, Wait, Fail("b"), Stop]);
    }
}
