"""Process-wide state of a running stub that pb_utils objects need: the channel, cancellations, logging."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._native import Channel

channel: Channel | None = None
# Whether the model is decoupled (model_transaction_policy.decoupled), set at initialize.
decoupled = False
# The instance this stub serves (`args["model_instance_name"]`), set at initialize.
instance_name = ""
# The model's version directory (`pb_utils.get_model_dir()`), set at auto-complete and initialize.
model_dir: str | None = None
# A built-in backend's model file (`model.onnx`, `model.pt`), set at auto-complete and initialize.
model_file: str | None = None
# The thread of the stub's asyncio event loop (`async def` methods), once started.
loop_thread: threading.Thread | None = None
# The stub's asyncio event loop, once started (read by `stacks.extra` for the tasks' stacks).
loop: asyncio.AbstractEventLoop | None = None
# The trace context of the batch `execute` runs now (its first traced request's), for BLS
# requests made without `trace=`: they join the executing request's trace.
current_trace: str | None = None


class _Cancelled:
    """The ids of requests the server cancelled. Inside a stub they are recorded natively as the
    server's `Cancel` messages arrive (even while `execute` runs: the native heartbeat thread
    takes them off the ring), and this reads them through the channel; outside one, a plain set."""

    __slots__ = ("_local",)

    def __init__(self):
        self._local = set()

    def __contains__(self, request):
        if channel is not None:
            return channel.is_cancelled(request)
        return request in self._local

    def __bool__(self):
        return channel is not None or bool(self._local)

    def add(self, request):
        """Records a cancellation (outside a stub; the channel records its own)."""
        self._local.add(request)

    def discard(self, request):
        """Forgets a finished request."""
        self._local.discard(request)
        if channel is not None:
            channel.forget_cancelled([request])

    def difference_update(self, requests):
        """Forgets finished requests."""
        requests = list(requests)
        self._local.difference_update(requests)
        if channel is not None:
            channel.forget_cancelled(requests)


cancelled = _Cancelled()


def log(level, file, line, message, logger=""):
    """Sends a log record (`level` is an `errors.LogLevel`, `logger` a `logging` logger's name or empty) to
    the server, or writes it to stderr outside a stub."""
    if channel is not None:
        channel.send_log(int(level), file, line, message, logger)
    else:
        name = f"{logger}: " if logger else ""
        sys.stderr.write(f"{level.name[0]} {file}:{line}] {name}{message}\n")
