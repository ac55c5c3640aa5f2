"""The stub process: `python -m tritium.stub` imports one model and serves it over the shared-memory channel.

`Stub.run` says hello, then receives the server's messages from the native channel
(`tritium._native.Channel.recv`), each an immutable object of its own class with named attributes
(`ExecuteMsg`, `InitializeMsg`, `AutoCompleteMsg`, `PingMsg`, `CancelMsg`, `FinalizeMsg`), and
dispatches on that class: it calls the model's `auto_complete_config`, `initialize`, `execute`
and `finalize`, and answers through the channel's `send_*` methods. Between messages it checks
that the server that started it is still its parent, and exits when it is not.

Before any model code runs, `pylogging.install()` sends Python `logging` records to the server's log,
`promclient.serve()` starts the thread that answers the server's requests for `prometheus_client` metrics,
and `sys.argv` becomes `['']`, what Triton's embedded interpreter gives model code.

A `KIND_GPU` instance (`args['model_instance_kind'] == 'GPU'`) of a model whose config asks for
KIND_GPU itself (the server sets `TRITIUM_CUDA_BIND=1` for its stubs) has the primary CUDA context
of its device (`args['model_instance_device_id']`) made current on the threads that run model code
(the main thread and the event loop's), so torch and cupy default to that device; where CUDA is
not usable in the stub, it says so once on stderr and model code runs without a device bound.

Coroutines (`async def` model methods) run on one asyncio event loop per stub, in a background
thread (Triton's `GetAsyncEventLoop`). A decoupled model's `execute` coroutine is scheduled there and
the batch is reported done at once (Triton's `RunCoroutine(..., in_background=true)`), so the next
batch may start while earlier coroutines still run; every other coroutine is awaited.
"""

import argparse
import asyncio
import concurrent.futures
import gc
import importlib
import json
import os
import sys
import threading
import traceback
from typing import Any

import numpy as np

from . import _native, _runtime, promclient, pylogging, stacks
from .backends import BUILTIN_BACKENDS, BackendError
from .config import ModelConfig, using_decoupled_model_transaction_policy
from .errors import (
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    ErrorCode,
    LogLevel,
)
from .tensor import InferenceResponse, requests_from_wire, send_response

# How long one wait for a message lasts before the stub checks that its server is still there,
# while a batch waits for its answers.
_WAIT_MS = 200
# The same for an idle stub between messages. The stub dies with its server anyway (the server sets
# PR_SET_PDEATHSIG, after the reparenting for a forked stub): this check is the fallback, and an idle
# stub wakes once a second for it instead of five times (the native heartbeat thread beats on its own).
_IDLE_WAIT_MS = 1000

# Triton core's error for a request released with RESCHEDULE by a model not configured for it
# (tritium has no iterative sequence batching).
_RESCHEDULE_REFUSED = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
    "configured to handle such a flag."
)


# The tritium package: its frames (the stub calling model code, the pb_utils layer) are left out
# of an exception's rendering, where Triton's C++ stub and pb_utils have none.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IMPORTLIB = importlib.__file__
# The Future through which the stub waits for a coroutine's result re-raises its exception.
_FUTURES_DIR = os.path.dirname(os.path.abspath(concurrent.futures.__file__)) + os.sep


def _not_the_models(filename):
    """Frames of tritium's own code, of the import machinery that loads model.py, and of the
    Future that carries an `async def execute`'s exception back to the stub."""
    return (
        filename.startswith(_PACKAGE_DIR)
        or filename.startswith("<frozen importlib")
        or filename == _IMPORTLIB
        or filename.startswith(_FUTURES_DIR)
    )


def _format_exception(exc):
    """Triton's (pybind's) rendering of a Python exception: "Type: message" then "At:" and the
    frames of the code it came through, innermost first, without tritium's own or the import
    machinery's; with no frame left (model.py does not parse), "Type: message" alone."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _not_the_models(f.filename)]
    if not frames:
        return f"{type(exc).__name__}: {exc}"
    lines = [f"{type(exc).__name__}: {exc}", "", "At:"]
    lines += [f"  {f.filename}({f.lineno}): {f.name}" for f in reversed(frames)]
    return "\n".join(lines) + "\n"


class _BackendError(Exception):
    """An error of the backend's own (Triton's `PythonBackendException`): its text goes to the
    client as it is, without the Python rendering of the exception."""


def _error(exc, prefix=""):
    """(message, code, traceback) for the channel. A built-in backend's BackendError says what is
    wrong and what to do in its text alone: it goes without a traceback."""
    if isinstance(exc, BackendError):
        return (prefix + str(exc), int(ErrorCode.INTERNAL), None)
    text = str(exc) if isinstance(exc, _BackendError) else _format_exception(exc)
    return (prefix + text, int(ErrorCode.INTERNAL), traceback.format_exc())


def _is_decoupled(args):
    """Whether `initialize`'s args describe a decoupled model."""
    try:
        return bool(using_decoupled_model_transaction_policy(json.loads(args.get("model_config", "{}"))))
    except (ValueError, TypeError, AttributeError):
        return False


def _backend_of(config_json):
    """The `backend` of a model config in Triton's JSON form ("python" when it cannot be read)."""
    try:
        return json.loads(config_json).get("backend") or "python"
    except (ValueError, TypeError, AttributeError):
        return "python"


def _model_class(model_file, backend):
    """The TritonPythonModel class that serves a model of `backend`: a built-in backend's
    (`tritium.backends.<name>`, which reads its model from `model_file`), else the model file's."""
    if backend in BUILTIN_BACKENDS:
        _runtime.model_file = model_file
        return importlib.import_module(f"tritium.backends.{backend}").TritonPythonModel
    return _import_model(model_file, backend != "python")


def _import_model(model_file, python_based_backend=False):
    """Imports the model file as Triton does (`ModelContext::StubSetup`): a model's own file as
    `<version>.<module>` with its version and model directories on sys.path; a Python-based
    backend's `<backend-directory>/<name>/model.py` as `model`, with its directory on sys.path."""
    if not model_file.endswith(".py"):
        raise ValueError(f"Model name must end with '.py'. Model name is \"{os.path.basename(model_file)}\".")
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"Python model file not found in '{model_file}'")
    module_dir = os.path.dirname(os.path.abspath(model_file))
    trimmed = os.path.basename(model_file)[:-3]
    if python_based_backend:
        if module_dir not in sys.path:
            sys.path.append(module_dir)
        module_name = trimmed
    else:
        model_dir = os.path.dirname(module_dir)
        for d in (module_dir, model_dir):
            if d not in sys.path:
                sys.path.append(d)
        module_name = f"{os.path.basename(module_dir)}.{trimmed}"
    module = importlib.import_module(module_name)
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"{model_file} does not define class TritonPythonModel")
    return module.TritonPythonModel


# Whether the stub said that a KIND_GPU instance runs without CUDA (said once per process).
_said_no_cuda = False


def _instance_device(args):
    """The CUDA device a KIND_GPU instance's model code is bound to, or None: for another kind,
    without `TRITIUM_CUDA_BIND`, or when CUDA is not usable in this stub (said once on stderr,
    with the reason)."""
    global _said_no_cuda
    # Set by the server for a model whose config asks for KIND_GPU itself (not KIND_AUTO placed
    # on a GPU): binding creates a CUDA context, which a model that never uses CUDA should not pay.
    if args.get("model_instance_kind") != "GPU" or os.environ.get("TRITIUM_CUDA_BIND") != "1":
        return None
    raw = args.get("model_instance_device_id", "0") or "0"
    try:
        device = int(raw)
    except ValueError:
        raise ValueError(f"model_instance_device_id must be an integer, got {raw!r}") from None
    reason = _native.cuda_unavailable_reason()
    if reason is None:
        return device
    if not _said_no_cuda:
        _said_no_cuda = True
        name = args.get("model_instance_name", "")
        sys.stderr.write(
            f"tritium stub: instance '{name}' is KIND_GPU (device {device}) but CUDA is not usable in the stub: "
            f"{reason}; its model code runs without a CUDA device bound\n"
        )
    return None


def _first_trace(requests):
    """The first traced request's context, or None (BLS calls made without `trace=` join its
    trace). A function of its own: a loop variable left in `Stub.execute` would keep the last
    request, and so its input blocks, alive after the requests are dropped."""
    for r in requests:
        context = r.trace().get_context()
        if context:
            return context
    return None


def _close_senders(states):
    """Closes every request's sender (the batch failed: the server ends its requests)."""
    for st in states:
        st.close()


def _log(level, message):
    """A log record of the stub itself, through the server's log."""
    frame = sys._getframe(1)
    _runtime.log(level, os.path.basename(frame.f_code.co_filename), frame.f_lineno, message)


def _exit_if_orphaned(parent):
    """Ends the stub when the server (`parent`) is gone."""
    if os.getppid() != parent:
        sys.stderr.write(f"tritium stub: the server (pid {parent}) is gone; exiting\n")
        os._exit(1)


class _Unanswered:
    """The requests of a non-decoupled batch that `execute` returned without a response: each
    is counted until its sender sends one (or closes, or is dropped unanswered)."""

    def __init__(self):
        # One for `wait` itself, so that answers arriving while requests are still being
        # watched cannot end the wait early.
        self.left = 1
        self.lock = threading.Lock()
        self.done = threading.Event()

    def watch(self, states):
        """Watches the request of each of `states` still unanswered (no reference to them is
        kept: a request the model drops unanswered ends its count from its state's `__del__`)."""
        for state in states:
            with self.lock:
                self.left += 1
            with state.lock:
                if not state.answered():
                    state.on_answer = self._one_answered
                    continue
            self._one_answered()

    def _one_answered(self):
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def wait(self, server_pid):
        """Waits until every watched request is answered, checking meanwhile that the server
        (`server_pid()`) lives."""
        self._one_answered()
        collected = False
        while not self.done.wait(_WAIT_MS / 1000):
            if not collected:
                # A request the model dropped inside a reference cycle ends its count only when
                # the cycle is collected.
                gc.collect()
                collected = True
            _exit_if_orphaned(server_pid())


class Stub:
    """The message loop of one stub."""

    def __init__(self, channel):
        self.channel = channel
        self.model: Any = None
        self.model_name = ""
        self.model_version = -1
        self.instance_name = ""
        # The CUDA device model code runs on (a KIND_GPU instance, CUDA usable), else None.
        self.cuda_device = None
        # The asyncio event loop (created at the first coroutine) and its thread.
        self.loop = None
        self.loop_thread = None
        # Futures of a decoupled model's `execute` coroutines still running.
        self.background = set()
        # A built-in backend's `execute_wire` (its batches skip the pb_utils objects), else None.
        self.execute_wire: Any = None

    def run(self):
        """Serves messages until `finalize` or until the server goes away."""
        self.channel.send_hello(sys.version, np.__version__)
        parent = self.channel.server_pid
        while True:
            msg = self.channel.recv(_IDLE_WAIT_MS)
            if msg is None:
                _exit_if_orphaned(parent)
                continue
            kind = type(msg)
            if kind is _native.ExecuteMsg:
                if msg.input_error is not None:
                    # An input in client CUDA memory this stub cannot open: the batch fails, and
                    # the server ends each of its requests with this error.
                    text = self._failure_prefix() + msg.input_error
                    self.channel.send_execute_done(msg.batch, (text, int(ErrorCode.INTERNAL), ""))
                    continue
                self.execute(msg.batch, msg.requests)
            elif kind is _native.InitializeMsg:
                self.initialize(msg.model_file, msg.args)
            elif kind is _native.AutoCompleteMsg:
                self.auto_complete(msg.model_file, msg.config_json)
            elif kind is _native.PingMsg:
                self.channel.send_pong(msg.seq)
            elif kind is _native.CancelMsg:
                _runtime.cancelled.add(msg.request)
            elif kind is _native.FinalizeMsg:
                self.finalize()
                return

    def auto_complete(self, model_file, config_json):
        try:
            backend = _backend_of(config_json)
            if backend == "python" or backend in BUILTIN_BACKENDS:
                _runtime.model_dir = os.path.dirname(os.path.abspath(model_file))
            cls = _model_class(model_file, backend)
            config = ModelConfig(config_json)
            if hasattr(cls, "auto_complete_config"):
                result = cls.auto_complete_config(config)
                if not isinstance(result, ModelConfig):
                    raise TypeError(
                        "auto_complete_config function in model '{}' must return a valid pb.ModelConfig object.".format(
                            json.loads(config_json).get("name", "")
                        )
                    )
                config = result
            self.channel.send_auto_complete_done(json.dumps(config.as_dict()))
        except Exception as exc:  # noqa: BLE001 - any model error is reported, not fatal
            self.channel.send_auto_complete_done(None, _error(exc))

    def initialize(self, model_file, args):
        try:
            self.model_name = args.get("model_name", "")
            self.model_version = int(args.get("model_version", "-1") or -1)
            self.instance_name = args.get("model_instance_name", "")
            _runtime.instance_name = self.instance_name
            _runtime.decoupled = _is_decoupled(args)
            # Triton's model directory: the version directory inside the model repository.
            repository = args.get("model_repository", "")
            if repository:
                _runtime.model_dir = os.path.join(repository, args.get("model_version", ""))
            else:
                _runtime.model_dir = os.path.dirname(os.path.abspath(model_file))
            # Before the model is imported: a module that touches CUDA at import sees its device.
            self.cuda_device = _instance_device(args)
            if self.cuda_device is not None:
                _native.cuda_bind(self.cuda_device)
            backend = _backend_of(args.get("model_config", "{}"))
            cls = _model_class(model_file, backend)
            self.model = cls()
            if hasattr(self.model, "initialize"):
                self._await(self.model.initialize(args))
            if backend in BUILTIN_BACKENDS and not _runtime.decoupled:
                self.execute_wire = getattr(self.model, "execute_wire", None)
            self.channel.send_initialize_done()
        except Exception as exc:  # noqa: BLE001
            self.channel.send_initialize_done(_error(exc))

    def _event_loop(self):
        """The stub's event loop, running in a daemon thread (created at the first coroutine)."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            self.loop_thread = threading.Thread(
                target=self._run_loop, args=(self.loop,), name="tritium-asyncio", daemon=True
            )
            self.loop_thread.start()
            _runtime.loop_thread = self.loop_thread
            _runtime.loop = self.loop
        return self.loop

    def _failure_prefix(self):
        """Triton's words before the error of a batch that failed as a whole."""
        return f"Failed to process the request(s) for model '{self.instance_name}', message: "

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop thread: bound to the instance's CUDA device (if any), then the loop."""
        if self.cuda_device is not None:
            try:
                _native.cuda_bind(self.cuda_device)
            except _native.CudaError as e:
                sys.stderr.write(f"tritium stub: cannot bind the event loop to CUDA device {self.cuda_device}: {e}\n")
        loop.run_forever()

    def _await(self, result):
        """Runs a coroutine returned by an `async def` model method to completion on the event loop."""
        if asyncio.iscoroutine(result):
            return asyncio.run_coroutine_threadsafe(result, self._event_loop()).result()
        return result

    def _run_in_background(self, coroutine, states):
        """Schedules a decoupled model's `execute` coroutine on the event loop and returns at once.

        If it raises, the error is logged (as Triton does) and sent as the final response of each
        request of `states` whose sender is still open, so no client waits for ever."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._event_loop())
        self.background.add(future)
        prefix = self._failure_prefix()

        def done(fut):
            self.background.discard(fut)
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is None:
                return
            _log(LogLevel.ERROR, "".join(traceback.TracebackException.from_exception(exc).format()))
            error = (prefix + _format_exception(exc), int(ErrorCode.INTERNAL), None)
            for st in states:
                with st.lock:
                    if st.closed:
                        continue
                    st.closed = True
                    try:
                        self.channel.send_response(st.id, [], error, [], True)
                    except Exception:  # noqa: BLE001 - the channel is gone; the server ends the request
                        pass
                _runtime.cancelled.discard(st.id)

        future.add_done_callback(done)

    def execute(self, batch, wire_requests):
        """Runs `execute` on one batch: `wire_requests` is the `ExecuteMsg`'s list of `RequestMsg`."""
        if self.execute_wire is not None and self._execute_wire(batch, wire_requests):
            return
        requests, states = requests_from_wire(wire_requests, self.model_name, self.model_version, _runtime.decoupled)
        # The message is still referenced by the caller: empty its list so that each input block
        # lives exactly as long as model code holds on to its tensor.
        wire_requests.clear()
        _runtime.current_trace = _first_trace(requests)
        try:
            if not hasattr(self.model, "execute"):
                raise AttributeError("Python model does not implement `execute` method.")
            responses = self.model.execute(requests)
            # A list (the usual answer) is no coroutine: the check is skipped for it.
            if type(responses) is not list and asyncio.iscoroutine(responses):
                if _runtime.decoupled:
                    # As Triton: not awaited; ExecuteDone goes now and the next batch may start.
                    self._run_in_background(responses, states)
                    del requests, states, responses
                    self.channel.send_execute_done(batch)
                    return
                responses = self._await(responses)
            if _runtime.decoupled:
                if responses is not None:
                    raise _BackendError(
                        f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                        "function must return None."
                    )
                self._end_rescheduled(states)
            else:
                self._check_responses(states, responses)
        except Exception as exc:  # noqa: BLE001
            # As in Triton, the server ends every request of the batch with this error, so their
            # senders close: a later send raises instead of answering a finished request.
            _close_senders(states)
            _runtime.cancelled.difference_update([st.id for st in states])
            error = _error(exc, self._failure_prefix())
            if not _runtime.decoupled and any(st.sent for st in states):
                # A response already went out through a sender and stands, as in Triton (its
                # response_sender tests): the error reaches no client, so the log says it.
                _log(LogLevel.ERROR, error[0])
            # The requests (and their input blocks) go before the batch ends, as a good batch's
            # do: the exception's frames (model code's locals, `requests` among them) and what
            # execute returned let go of them too.
            traceback.clear_frames(exc.__traceback__)
            requests, states, responses = [], [], None
            self.channel.send_execute_done(batch, error)
            return
        if _runtime.decoupled:
            # The requests stay open until their final responses, sent from any thread; a request
            # dropped here without one is ended with an error by its state.
            del requests, states
            self.channel.send_execute_done(batch)
            return
        if responses is not None:
            self._send_all(states, responses)
        self._end_rescheduled(states)
        ids = [st.id for st in states]
        # Requests execute left unanswered get their response from the model's own thread
        # (request.get_response_sender(), Triton 24.06 and later): the batch lasts until then,
        # as a batch that is still executing, so the server gets the responses before its end.
        # A request once answered stays answered, so when every one is (the usual case) there
        # is nothing to wait for and no waiter is made.
        unanswered = [st for st in states if not st.answered()]
        del requests, states, responses
        if unanswered:
            waiter = _Unanswered()
            waiter.watch(unanswered)
            del unanswered
            waiter.wait(lambda: self.channel.server_pid)
        # The requests end here, after their responses (which need what the channel keeps per
        # request, such as the client regions their outputs go to): their cancellations are
        # forgotten.
        _runtime.cancelled.difference_update(ids)
        self.channel.send_execute_done(batch)

    def _execute_wire(self, batch, wire_requests):
        """A built-in backend's batch through its `execute_wire`, which answers from the wire
        messages themselves; False (nothing sent) when the batch needs `execute` instead."""
        try:
            answers = self.execute_wire(wire_requests)
        except Exception:  # noqa: BLE001 - `execute` serves the batch, and reports what went wrong
            answers = None
        if answers is None:
            return False
        wire_requests.clear()
        if answers.requests:
            try:
                self.channel.send_rows(answers.requests, answers.outputs, answers.rows)
            except _native.ChannelError:
                raise
            except Exception as exc:  # noqa: BLE001 - the server ends the batch's requests with it
                answers = None
                self.channel.send_execute_done(batch, _error(exc, self._failure_prefix()))
                return True
        send = self.channel.send_response
        for request, outputs, error in answers.each:
            failure = None if error is None else (error, int(ErrorCode.INTERNAL), None)
            try:
                send(request, outputs, failure, [], True, False)
            except _native.ChannelError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bad output fails this request only
                send(request, [], _error(exc, "Failed to send the response: "), [], True, False)
        answers = outputs = None
        self.channel.send_execute_done(batch)
        return True

    def _end_rescheduled(self, states):
        """Requests released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: tritium has no
        iterative sequence batching, so, as Triton's core does for a model not configured for
        the flag, the release fails; the request ends with that error unless it already ended."""
        for st in states:
            if st.release_flags != TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                continue
            with st.lock:
                if st.closed:
                    continue
                st.closed = True
                self.channel.send_response(st.id, [], (_RESCHEDULE_REFUSED, int(ErrorCode.INVALID_ARG), None), [], True)

    def _send_all(self, states, responses):
        for state, response in zip(states, responses):
            if response is not None:
                self._send(state, response)

    @staticmethod
    def _check_responses(states, responses):
        """Triton's checks of what a non-decoupled `execute` returned: None (every response went
        through the senders), or one InferenceResponse or None per request, each counted against
        the request's sender (which may not have sent one already)."""
        if responses is None:
            return
        # Triton raises these as its own errors: their text goes to the client without a Python
        # rendering.
        if not isinstance(responses, list):
            raise _BackendError(f"Expected a list in the execute return, found type '{type(responses)}'.")
        if len(responses) != len(states):
            raise _BackendError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(states)}, and InferenceResponse(s) size is:{len(responses)}\n"
            )
        for r in responses:
            if r is not None and not isinstance(r, InferenceResponse):
                raise _BackendError(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(r)}'."
                )
        for state, r in zip(states, responses):
            if r is not None and state.release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                raise _BackendError(
                    "Expected a None object in the execute function return list for reschduled request, "
                    f"found type '{type(r)}'."
                )
            if r is not None:
                with state.lock:
                    try:
                        state.account(r, TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    except Exception as exc:  # noqa: BLE001 - Triton's text, without a Python rendering
                        raise _BackendError(str(exc)) from None

    def _send(self, state, response):
        """Sends one of the responses a non-decoupled `execute` returned. The server reads them
        only once the batch's `ExecuteDone` has come, which wakes it; so they do not."""
        try:
            send_response(self.channel, state, response, True, wake=False)
        except _native.ChannelError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad output fails this request only
            self.channel.send_response(state.id, [], _error(exc, "Failed to send the response: "), [], True)

    def finalize(self):
        """Calls the model's `finalize` (awaited if it is a coroutine), then stops the event loop.
        An exception is logged with its traceback, as Triton does (`LOG_INFO << e.what()`), and the
        stub still exits cleanly."""
        try:
            if self.model is not None and hasattr(self.model, "finalize"):
                self._await(self.model.finalize())
        except Exception as exc:  # noqa: BLE001
            _log(LogLevel.INFO, _format_exception(exc))
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.channel.send_finalize_done(None)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tritium.stub", description=__doc__)
    parser.add_argument("--control-fd", type=int, required=True, help="inherited memfd of the control segment")
    parser.add_argument("--socket-fd", type=int, required=True, help="inherited unix socket for segment fds")
    parser.add_argument("--spin-us", type=int, default=500, help="longest busy-poll before sleeping (adaptive)")
    parser.add_argument("--stacks-fd", type=int, help="inherited socket on which the server asks for stacks")
    parser.add_argument("--arena-segment-mb", type=int, default=256, help="size of the stub's arena segments")
    opts = parser.parse_args(argv)
    # Model code sees what Triton's embedded interpreter gives it, not the stub's own flags.
    sys.argv = [""]
    channel = _native.Channel(opts.control_fd, opts.socket_fd, opts.spin_us, opts.arena_segment_mb << 20)
    _runtime.channel = channel
    if opts.stacks_fd is not None:
        stacks.serve(opts.stacks_fd)
    pylogging.install()
    promclient.serve(channel)
    stub = Stub(channel)
    stub.run()
    # The channel is done before the model is released: objects that would tell the server they
    # are gone (a MetricFamily) must not call it after FinalizeDone, when nobody answers (the
    # stub would wait for a reply while the server waits for it to exit).
    _runtime.channel = None
    del stub


if __name__ == "__main__":
    main()
