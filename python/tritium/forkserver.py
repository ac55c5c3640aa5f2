"""The fork server: `python -m tritium.forkserver` imports what every stub imports (numpy and
numpy.random, tritium's native module, the stub's own modules and pb_utils), starts no thread, and forks stubs on the server's request.

The server starts one per interpreter and environment, exactly as it starts a stub (same
environment, allocator settings, process group of its own, `PR_SET_PDEATHSIG`), with a
`SOCK_SEQPACKET` unix socket at `--socket-fd`. It says `ready <threads>` once its imports are done.
Each request is one message, `spawn <spin-us>`, carrying five fds (`SCM_RIGHTS`): the channel's
control segment, its segment socket, the stacks socket, and the write ends of the stub's stdout and
stderr pipes. The answer is `ok <pid>`, or `refused <why>` when forking is not safe (this process
has more than one thread: a thread does not survive `fork`, and what it held stays held).

A stub is forked twice: the first child forks the stub and exits at once, so that the stub is
reparented to the server (which is a child subreaper, `PR_SET_CHILD_SUBREAPER`), waits for it
like a stub it started itself and reads its exit status. Only then does the stub set
`PR_SET_PDEATHSIG` (a parent-death signal set earlier would fire when the first child exits) and
check that its parent is the server. It places its fds at 0-5 as a freshly started stub has them,
closes every other fd, takes a process group of its own, reseeds numpy's global random state, gives
OpenBLAS back its default thread count when the server capped it at one for the fork server
(`--reset-blas-threads`), and runs `tritium.stub.main`.
"""

import argparse
import ctypes
import fcntl
import os
import signal
import socket
import sys
import time
import traceback

import numpy as np
import numpy.random
import triton_python_backend_utils  # noqa: F401

from . import _native, stub  # noqa: F401 - imported here so that every forked stub has them

# What every stub does first at its start or for its model (pb_utils above, numpy's global random
# state seeded here, which each stub seeds again).
np.random.seed()

_PR_SET_PDEATHSIG = 1
_FDS = 5
_MAX_MESSAGE = 4096


def _threads():
    return len(os.listdir("/proc/self/task"))


def _reset_blas_threads():
    """Gives OpenBLAS (numpy's, capped at one thread in the fork server through
    OPENBLAS_NUM_THREADS=1) the thread count it takes by default: one per CPU this process may run on.
    Its threads start when it next needs them."""
    os.environ.pop("OPENBLAS_NUM_THREADS", None)
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line and line.rstrip().endswith(".so")}
    except OSError:
        return
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(len(os.sched_getaffinity(0)))
                break


def _become_stub(fds, spin, server_pid, reset_blas):
    """In the forked stub: places its fds, waits to be the server's child, and runs the stub.
    Never returns."""
    code = 1
    try:
        # Copies above 5 first, so that placing one cannot clobber another; then into place
        # (control 3, socket 4, stacks 5, stdout 1, stderr 2, stdin /dev/null), the rest closed.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        for fd, target in zip(moved, (3, 4, 5, 1, 2)):
            os.dup2(fd, target)
        os.closerange(6, os.sysconf("SC_OPEN_MAX"))
        os.setpgid(0, 0)
        deadline = time.monotonic() + 5
        while os.getppid() != server_pid:
            if time.monotonic() > deadline:
                os.write(2, b"tritium fork server: the stub was not reparented to the server\n")
                os._exit(1)
            time.sleep(0.0002)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != server_pid:
            os._exit(1)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        np.random.seed()
        if reset_blas:
            _reset_blas_threads()
        stub.main(["--control-fd", "3", "--socket-fd", "4", "--stacks-fd", "5", "--spin-us", str(spin)])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what a fresh interpreter would print, then exit 1
        traceback.print_exc()
        code = 1
    # What a fresh interpreter does at exit: wait for non-daemon threads, run atexit handlers.
    try:
        import atexit
        import threading

        threading._shutdown()  # type: ignore[attr-defined]  # noqa: SLF001
        atexit._run_exitfuncs()  # noqa: SLF001
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    os._exit(code)


def _spawn(conn, fds, spin, server_pid, reset_blas):
    """Forks one stub; returns the answer to send."""
    threads = _threads()
    if threads != 1:
        return f"refused the fork server has {threads} threads".encode()
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.close(r)
            conn.close()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _become_stub(fds, spin, server_pid, reset_blas)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        child = os.read(r, 64)
    finally:
        os.close(r)
        os.waitpid(first, 0)
    if not child:
        return b"refused the fork failed"
    return b"ok " + child


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tritium.forkserver", description=__doc__)
    parser.add_argument("--socket-fd", type=int, required=True, help="inherited SOCK_SEQPACKET socket to the server")
    parser.add_argument("--server-pid", type=int, required=True, help="the server's pid")
    parser.add_argument("--reset-blas-threads", action="store_true", help="undo OPENBLAS_NUM_THREADS=1 in stubs")
    opts = parser.parse_args(argv)
    conn = socket.socket(fileno=opts.socket_fd)
    conn.send(f"ready {_threads()}".encode())
    while True:
        try:
            msg, ancdata, _flags, _addr = conn.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(_FDS * 4))
        except InterruptedError:
            continue
        if not msg:
            return
        fds: list[int] = []
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4))
        words = msg.split()
        try:
            if len(words) != 2 or words[0] != b"spawn" or len(fds) != _FDS:
                answer = b"refused bad request"
            else:
                answer = _spawn(conn, fds, int(words[1]), opts.server_pid, opts.reset_blas_threads)
        finally:
            for fd in fds:
                os.close(fd)
        conn.send(answer)


if __name__ == "__main__":
    main()
