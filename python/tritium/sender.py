"""pb_utils.InferenceResponseSender: a request's responses sent one at a time, from any thread.

Each request handed to `execute` has one `ResponseState`, shared by the request, its sender
(`request.get_response_sender()`) and the stub, which ends the request through it. It applies Triton's rules (python_backend's
`src/response_sender.cc`, with its error texts) and sends each response at once as its own
`Response` frame through the native channel, whose sends are thread-safe. A decoupled model's send
waits while the request's window (`--max-inflight-responses`) is full of responses its client has
not taken yet. For a decoupled model a
state dropped without the final flag (the model let go of the request and its sender) sends an
error as the final response, so the client is never left waiting.
"""

import threading

from . import _runtime
from .args import as_int
from .errors import (
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    ErrorCode,
    TritonModelException,
)

__all__ = ["InferenceResponseSender"]

_FINAL = TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _on_event_loop():
    """Whether this is the stub's asyncio event loop thread (where `async def execute` runs)."""
    loop_thread = _runtime.loop_thread
    return loop_thread is not None and threading.current_thread() is loop_thread


class ResponseState:
    """One request's response bookkeeping: its wire id, the outputs asked for, whether the model
    is decoupled, the release flags model code set (`request.set_release_flags`), and (under
    `lock`) how many responses went out and whether the final did."""

    __slots__ = ("id", "requested", "decoupled", "release_flags", "lock", "closed", "sent", "on_answer")

    def __init__(self, request_id, requested, decoupled):
        self.id = request_id
        self.requested = requested
        self.decoupled = decoupled
        self.release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self.lock = threading.Lock()
        self.closed = False
        self.sent = 0
        # Called once (without `lock`) when a non-decoupled request that `execute` returned
        # unanswered gets its response, or is dropped without one: the stub ends its batch then.
        self.on_answer = None

    def answered(self):
        """Whether the server has this request's response (or will get none from the model)."""
        return self.sent > 0 or self.closed

    def take_on_answer(self):
        """The pending `on_answer` callback once the request is answered, else None (the caller
        holds `lock`)."""
        callback = self.on_answer
        if callback is None or not self.answered():
            return None
        self.on_answer = None
        return callback

    def account(self, response, flags):
        """Triton's `UpdateStateAndCounters`: raises its errors, else counts the response (the
        caller holds `lock`)."""
        if not self.decoupled:
            if response is not None and self.sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and flags == _FINAL and self.sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
                )
        if self.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags == _FINAL:
            self.closed = True
        self.sent += 1

    def close(self):
        """Closes the sender without sending anything (execute failed: the server ends the request)."""
        with self.lock:
            self.closed = True
            callback = self.take_on_answer()
        if callback is not None:
            callback()

    def __del__(self):
        callback = self.on_answer
        if callback is not None:
            # A non-decoupled request dropped unanswered: its batch ends, and the server answers
            # it with "the model sent no response for this request".
            self.on_answer = None
            callback()
        if not self.decoupled or self.closed:
            return
        channel = _runtime.channel
        if channel is None:
            return
        message = (
            "the model released the request without sending its final response "
            "(send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL) on its response sender)"
        )
        try:
            channel.send_response(self.id, [], (message, int(ErrorCode.INTERNAL), None), [], True)
        except Exception:  # noqa: BLE001 - the stub is shutting down; nobody is left to tell
            pass


class InferenceResponseSender:
    """`request.get_response_sender()`: sends the request's responses, from any thread, during or
    after `execute`, until the one sent with `TRITONSERVER_RESPONSE_COMPLETE_FINAL`. A model that
    is not decoupled sends exactly one response this way (Triton 24.06 and later), and may send
    it after `execute` returned None: its batch ends once every request is answered."""

    __slots__ = ("_state",)

    def __init__(self, state):
        self._state = state

    def send(self, response=None, flags=0):
        """Sends `response` (may be None with `flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`: the
        final flag alone); `flags` is 0 or `TRITONSERVER_RESPONSE_COMPLETE_FINAL`."""
        flags = as_int(flags, "send flags")
        if flags != _FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        from .tensor import InferenceResponse, send_response  # tensor imports this module

        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"Expected an 'InferenceResponse' object, found type '{type(response)}'.")
        st = self._state
        with st.lock:
            channel = _runtime.channel
            if st.decoupled and not st.closed and channel is not None and not _on_event_loop():
                # Back-pressure: at most the server's --max-inflight-responses responses sent and
                # not yet taken by the client; this waits (without the GIL) for the client. A
                # cancelled request does not wait: as in Triton the send goes through and the
                # server drops the response, since nobody reads it. A coroutine's send (on the
                # stub's event loop) never waits: it would stall every other coroutine with it.
                channel.wait_for_room(st.id, st.sent)
            st.account(response, flags)
            if channel is None:
                raise TritonModelException("Unable to send response. The stub has no channel to the server.")
            if response is None:
                # A non-decoupled model's one response already carried the final flag.
                if st.decoupled:
                    channel.send_final_flag(st.id)
            else:
                send_response(channel, st, response, flags == _FINAL or not st.decoupled)
            callback = st.take_on_answer()
        if callback is not None:
            callback()
        if st.closed:
            _runtime.cancelled.discard(st.id)

    def is_cancelled(self):
        """Whether the client cancelled the request."""
        return self._state.id in _runtime.cancelled
