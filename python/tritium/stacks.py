"""Live Python stacks of a stub, for `tritium stack` and for the log before a hung stub is killed.

`serve(fd)` registers `faulthandler` on a real-time signal (`_native.stack_signal()`), writing into
a memfd, and starts the native thread that answers the server's requests on `fd`: it raises that
signal on itself, so every thread's stack is read without the GIL (a model stuck in C code that
holds it still shows where), then calls `extra()` with the GIL if it can have it within a second.
"""

import asyncio
import faulthandler
import io
import os
import sys
import threading

from . import _native, _runtime


def serve(fd):
    """Answers the server's stack requests on the inherited socket `fd` from a native thread."""
    os.set_inheritable(fd, False)
    dump = os.memfd_create("tritium-stacks", os.MFD_CLOEXEC)
    faulthandler.register(_native.stack_signal(), file=dump, all_threads=True, chain=False)
    _native.serve_stacks(fd, dump, extra)


def extra():
    """What needs the GIL: the threads' names (faulthandler prints their idents) and the stacks of
    the stub's asyncio tasks. Called from a native thread with the GIL."""
    out = io.StringIO()
    out.write("\nPython threads:\n")
    for t in threading.enumerate():
        kind = " (daemon)" if t.daemon else ""
        out.write(f"  0x{t.ident or 0:016x} {t.name}{kind}\n")
    loop = _runtime.loop
    if loop is None or loop.is_closed():
        out.write("\nasyncio tasks: none (the stub's event loop has not started)\n")
        return out.getvalue()
    tasks = None
    # The loop runs in its own thread; its task set can change while it is copied.
    for _ in range(3):
        try:
            tasks = list(asyncio.all_tasks(loop))
            break
        except RuntimeError:
            continue
    if tasks is None:
        out.write("\nasyncio tasks: the task set kept changing while it was read\n")
        return out.getvalue()
    out.write(f"\nasyncio tasks ({len(tasks)}):\n")
    for task in tasks:
        try:
            task.print_stack(file=out)
        except Exception as exc:  # noqa: BLE001 - one task's broken frames must not hide the rest
            out.write(f"  {task!r}: cannot print its stack: {exc}\n")
    return out.getvalue()


if sys.platform != "linux":  # pragma: no cover - stubs run on Linux only
    raise ImportError("tritium.stacks needs Linux (memfd_create, real-time signals)")
