"""The stub process: `python -m tritium.stub` imports one model and serves it over the shared-memory channel.

`Stub.run` says hello, then receives the server's messages from the native channel
(`tritium._native.Channel.recv`), each an immutable object of its own class with named attributes
(`ExecuteMsg`, `InitializeMsg`, `AutoCompleteMsg`, `PingMsg`, `CancelMsg`, `FinalizeMsg`), and
dispatches on that class: it calls the model's `auto_complete_config`, `initialize`, `execute`
and `finalize`, and answers through the channel's `send_*` methods. Between messages it checks
that the server that started it is still its parent, and exits when it is not.

Before any model code runs, `pylogging.install()` sends Python `logging` records to the server's log.
"""

import argparse
import asyncio
import importlib
import json
import os
import sys
import traceback

import numpy as np

from . import _native, _runtime, pylogging
from .config import ModelConfig, using_decoupled_model_transaction_policy
from .errors import TRITONSERVER_RESPONSE_COMPLETE_FINAL, ErrorCode
from .sender import send_response
from .tensor import InferenceRequest, InferenceResponse

# How long one wait for a message lasts before the stub checks that its server is still there.
_WAIT_MS = 200


def _format_exception(exc):
    """Triton's (pybind's) rendering of a Python exception: "Type: message" then "At:" and the frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    lines = [f"{type(exc).__name__}: {exc}", "", "At:"]
    lines += [f"  {f.filename}({f.lineno}): {f.name}" for f in reversed(frames)]
    return "\n".join(lines)


class _BackendError(Exception):
    """An error of the backend's own (Triton's `PythonBackendException`): its text goes to the
    client as it is, without the Python rendering of the exception."""


def _error(exc, prefix=""):
    """(message, code, traceback) for the channel."""
    text = str(exc) if isinstance(exc, _BackendError) else _format_exception(exc)
    return (prefix + text, int(ErrorCode.INTERNAL), traceback.format_exc())


def _is_decoupled(args):
    """Whether `initialize`'s args describe a decoupled model."""
    try:
        return bool(using_decoupled_model_transaction_policy(json.loads(args.get("model_config", "{}"))))
    except (ValueError, TypeError, AttributeError):
        return False


def _import_model(model_file):
    """Imports the model file as Triton does: `<version>.<module>` with the version and model dirs on sys.path."""
    if not model_file.endswith(".py"):
        raise ValueError(f"Model name must end with '.py'. Model name is \"{os.path.basename(model_file)}\".")
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"Python model file not found in '{model_file}'")
    version_dir = os.path.dirname(os.path.abspath(model_file))
    model_dir = os.path.dirname(version_dir)
    for d in (version_dir, model_dir):
        if d not in sys.path:
            sys.path.append(d)
    module_name = f"{os.path.basename(version_dir)}.{os.path.basename(model_file)[:-3]}"
    module = importlib.import_module(module_name)
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"{model_file} does not define class TritonPythonModel")
    return module.TritonPythonModel


class Stub:
    """The message loop of one stub."""

    def __init__(self, channel):
        self.channel = channel
        self.model = None
        self.model_name = ""
        self.model_version = -1
        self.instance_name = ""
        self.loop = None

    def run(self):
        """Serves messages until `finalize` or until the server goes away."""
        self.channel.send_hello(sys.version, np.__version__)
        parent = self.channel.server_pid
        while True:
            msg = self.channel.recv(_WAIT_MS)
            if msg is None:
                if os.getppid() != parent:
                    sys.stderr.write(f"tritium stub: the server (pid {parent}) is gone; exiting\n")
                    os._exit(1)
                continue
            kind = type(msg)
            if kind is _native.ExecuteMsg:
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
            cls = _import_model(model_file)
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
            self.channel.send_auto_complete_done(json.dumps(config._model_config))
        except Exception as exc:  # noqa: BLE001 - any model error is reported, not fatal
            self.channel.send_auto_complete_done(None, _error(exc))

    def initialize(self, model_file, args):
        try:
            self.model_name = args.get("model_name", "")
            self.model_version = int(args.get("model_version", "-1") or -1)
            self.instance_name = args.get("model_instance_name", "")
            _runtime.decoupled = _is_decoupled(args)
            cls = _import_model(model_file)
            self.model = cls()
            if hasattr(self.model, "initialize"):
                self._await(self.model.initialize(args))
            self.channel.send_initialize_done()
        except Exception as exc:  # noqa: BLE001
            self.channel.send_initialize_done(_error(exc))

    def _await(self, result):
        """Runs a coroutine returned by an `async def` model method to completion."""
        if asyncio.iscoroutine(result):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            return self.loop.run_until_complete(result)
        return result

    def execute(self, batch, wire_requests):
        """Runs `execute` on one batch: `wire_requests` is the `ExecuteMsg`'s list of `RequestMsg`."""
        requests = [InferenceRequest._from_wire(w, self.model_name, self.model_version) for w in wire_requests]
        # The message is still referenced by the caller: empty its list so that each input block
        # lives exactly as long as model code holds on to its tensor.
        wire_requests.clear()
        try:
            if not hasattr(self.model, "execute"):
                raise AttributeError("Python model does not implement `execute` method.")
            responses = self._await(self.model.execute(requests))
            if _runtime.decoupled:
                if responses is not None:
                    raise _BackendError(
                        f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                        "function must return None."
                    )
            else:
                self._check_responses(requests, responses)
        except Exception as exc:  # noqa: BLE001
            # As in Triton, the server ends every request of the batch with this error, so their
            # senders close: a later send raises instead of answering a finished request.
            for r in requests:
                r._state.close()
            del requests
            prefix = f"Failed to process the request(s) for model '{self.instance_name}', message: "
            self.channel.send_execute_done(batch, _error(exc, prefix))
            return
        if _runtime.decoupled:
            # The requests stay open until their final responses, sent from any thread; a request
            # dropped here without one is ended with an error by its state.
            del requests
            self.channel.send_execute_done(batch)
            return
        if _runtime.cancelled:
            _runtime.cancelled.difference_update(r._id for r in requests)
        if responses is not None:
            self._send_all(requests, responses)
        del requests, responses
        self.channel.send_execute_done(batch)

    def _send_all(self, requests, responses):
        for request, response in zip(requests, responses):
            if response is not None:
                self._send(request, response)

    @staticmethod
    def _check_responses(requests, responses):
        """Triton's checks of what a non-decoupled `execute` returned: None (every response went
        through the senders), or one InferenceResponse or None per request, each counted against
        the request's sender (which may not have sent one already)."""
        if responses is None:
            return
        if not isinstance(responses, list):
            raise TypeError(f"Expected a list in the execute return, found type '{type(responses)}'.")
        if len(responses) != len(requests):
            raise ValueError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(responses)}\n"
            )
        for r in responses:
            if r is not None and not isinstance(r, InferenceResponse):
                raise TypeError(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(r)}'."
                )
        for request, r in zip(requests, responses):
            if r is not None:
                with request._state.lock:
                    try:
                        request._state.account(r, TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    except Exception as exc:  # noqa: BLE001 - Triton's text, without a Python rendering
                        raise _BackendError(str(exc)) from None

    def _send(self, request, response):
        try:
            send_response(self.channel, request._id, request._requested, response, True)
        except _native.ChannelError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad output fails this request only
            self.channel.send_response(request._id, [], _error(exc, "Failed to send the response: "), [], True)

    def finalize(self):
        error = None
        try:
            if self.model is not None and hasattr(self.model, "finalize"):
                self._await(self.model.finalize())
        except Exception as exc:  # noqa: BLE001
            error = _error(exc)
        self.channel.send_finalize_done(error)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tritium.stub", description=__doc__)
    parser.add_argument("--control-fd", type=int, required=True, help="inherited memfd of the control segment")
    parser.add_argument("--socket-fd", type=int, required=True, help="inherited unix socket for segment fds")
    parser.add_argument("--spin-us", type=int, default=500, help="longest busy-poll before sleeping (adaptive)")
    parser.add_argument("--arena-segment-mb", type=int, default=256, help="size of the stub's arena segments")
    opts = parser.parse_args(argv)
    channel = _native.Channel(opts.control_fd, opts.socket_fd, opts.spin_us, opts.arena_segment_mb << 20)
    _runtime.channel = channel
    pylogging.install()
    Stub(channel).run()
    _runtime.channel = None


if __name__ == "__main__":
    main()
