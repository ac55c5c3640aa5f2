"""tritium's built-in backends: ONNX Runtime (`onnxruntime.py`) and PyTorch (`pytorch.py`) models,
served inside a stub like a Python model.

Each module defines a `TritonPythonModel` (auto_complete_config, initialize, execute, finalize) that
the stub uses instead of a model.py when the config's backend is `onnxruntime` or `pytorch` (the
server fills the backend in from `platform: "onnxruntime_onnx"` / `"pytorch_libtorch"`). The model
file (`model.onnx`, `model.pt`, `model.pt2`) is `tritium._runtime.model_file`.

`FrameworkModel` holds what both share: reading the config, the thread counts, and batching: the
requests of a batch whose inputs agree in everything but the first dimension are joined along it,
run once, and each request gets its rows of every output back as a view, not a copy. When a joined
run fails, each of its requests is run alone, so a request that the runtime rejects fails alone.
"""

import json
import os
import sys

import numpy as np

from .. import _native, _runtime
from ..dtypes import TRITON_STRING_TO_NUMPY
from ..errors import LogLevel, TritonError
from ..tensor import InferenceResponse, Tensor, _wire_dtype

__all__ = ["BUILTIN_BACKENDS", "BackendError", "FrameworkModel", "require", "backend_setting", "model_file"]

# The backend names the stub serves with a module of this package.
BUILTIN_BACKENDS = frozenset({"onnxruntime", "pytorch"})

# Input dtypes `execute_wire` leaves to `execute`: BYTES (decoded for the runtime) and BF16 (no
# numpy dtype).
_GENERAL_PATH_DTYPES = frozenset({"BYTES", "BF16"})

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class BackendError(Exception):
    """A model of a built-in backend cannot be loaded or run; the text says why and what to do."""


def log(level, message):
    """A log record of a built-in backend, through the server's log."""
    frame = sys._getframe(1)
    _runtime.log(level, os.path.basename(frame.f_code.co_filename), frame.f_lineno, message)


def require(package, model_name):
    """Imports `package` or raises a BackendError naming it and this stub's Python environment."""
    try:
        return __import__(package)
    except ImportError as exc:
        raise BackendError(
            f"model '{model_name}' needs the Python package '{package}', which the model's Python environment "
            f"cannot import (interpreter {sys.executable}, prefix {sys.prefix}): {exc}. Install it there "
            f"({sys.executable} -m pip install {package}), or give the model an environment that has it "
            "(the EXECUTION_ENV_PATH parameter, or a requirements.txt in the model directory)"
        ) from exc


def model_file():
    """The model file the server gave this stub."""
    if not _runtime.model_file:
        raise BackendError("the server gave this stub no model file")
    return _runtime.model_file


def backend_setting(backend, key):
    """A `--backend-config` setting for `backend` (`<backend>,<key>=<value>`, or `<key>=<value>` for
    every backend), which the server passes in TRITIUM_BACKEND_CONFIG, one per line; None if unset."""
    found = None
    for line in os.environ.get("TRITIUM_BACKEND_CONFIG", "").splitlines():
        name, _, key_value = line.rpartition(",")
        k, sep, value = key_value.partition("=")
        if sep and k.strip() == key and name.strip() in ("", backend):
            found = value.strip()
    return found


def config_dims(tensor):
    """A config tensor's dims as ints (the JSON form may print 64-bit integers as strings)."""
    return [int(d) for d in tensor.get("dims", [])]


def parameter(config, key):
    """A config `parameters` entry's string_value, or None."""
    value = config.get("parameters", {}).get(key)
    if value is None:
        return None
    return str(value.get("string_value", "") if isinstance(value, dict) else value).strip()


def parameter_bool(config, key, default):
    """A boolean `parameters` entry (true/false, 1/0, yes/no, on/off), or `default`."""
    value = parameter(config, key)
    if value is None or value == "":
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise BackendError(f"parameter '{key}' of model '{config.get('name', '')}' must be true or false, got {value!r}")


def parameter_int(config, key):
    """An integer `parameters` entry, or None."""
    value = parameter(config, key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise BackendError(
            f"parameter '{key}' of model '{config.get('name', '')}' must be an integer, got {value!r}"
        ) from None


def instance_count(config):
    """How many instances of this model run at once (every group's count, per GPU for KIND_GPU)."""
    total = 0
    for group in config.get("instance_group", []):
        count = max(int(group.get("count", 1) or 1), 1)
        gpus = group.get("gpus", []) if group.get("kind") == "KIND_GPU" else []
        total += count * max(len(gpus), 1)
    return max(total, 1)


def usable_cpus():
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(config):
    """Intra-op threads for one instance when the config sets none: the usable CPUs shared out
    among the model's instances, so that they do not oversubscribe the CPUs, and the reason."""
    cpus, instances = usable_cpus(), instance_count(config)
    threads = max(cpus // instances, 1)
    return threads, f"{cpus} usable CPUs shared by {instances} instance(s) of the model"


class FrameworkModel:
    """What the ONNX Runtime and PyTorch backends share; a subclass loads its model in `_load` and
    runs one joined batch in `_run` (a dict of input name to array in, of output name to array out)."""

    backend = ""

    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", self.config.get("name", ""))
        self.instance_name = args.get("model_instance_name", "")
        self.kind = args.get("model_instance_kind", "CPU")
        self.device_id = int(args.get("model_instance_device_id", "0") or 0)
        self.max_batch_size = int(self.config.get("max_batch_size", 0))
        self.inputs = {t["name"]: t for t in self.config.get("input", [])}
        self.outputs = [t["name"] for t in self.config.get("output", [])]
        self.output_dtypes = {
            t["name"]: np.dtype(TRITON_STRING_TO_NUMPY[t["data_type"]])
            for t in self.config.get("output", [])
            if t.get("data_type") in TRITON_STRING_TO_NUMPY
        }
        # Joined batches whose inputs were viewed where the server placed them (no copy), and
        # those that had to be copied (`execute`); logged at the first of each and at finalize.
        self.joined_views = 0
        self.joined_copies = 0
        self._load(model_file())

    def _load(self, path):
        raise NotImplementedError

    def _run(self, feed):
        raise NotImplementedError

    def execute(self, requests):
        if len(requests) == 1:
            # The common case at low load: nothing to group or join.
            request = requests[0]
            try:
                return [self._respond(request, self._run(self._feed(request)), 0, None)]
            except Exception as exc:  # noqa: BLE001 - the request fails, not the stub
                return [_error_response(exc)]
        responses = [None] * len(requests)
        feeds = []
        for i, request in enumerate(requests):
            try:
                feeds.append((i, self._feed(request)))
            except Exception as exc:  # noqa: BLE001 - the request fails, not the batch
                responses[i] = _error_response(exc)
        for group in self._groups(feeds):
            self._run_group(requests, group, responses)
        return responses

    def _feed(self, request):
        """The request's inputs by name, as numpy arrays over the request's memory."""
        feed = {}
        for tensor in request.inputs():
            array = tensor.as_numpy()
            if array.dtype == np.object_:
                array = self._bytes_input(array)
            feed[tensor.name()] = array
        return feed

    def _bytes_input(self, array):
        """A BYTES input as the runtime wants it (ONNX Runtime: str)."""
        return array

    def _groups(self, feeds):
        """Lists of (index, feed) that can run as one: for a batching model, those whose inputs
        agree in names, dtypes and every dimension after the first; otherwise one per request."""
        if self.max_batch_size == 0:
            return [[item] for item in feeds]
        groups: dict[tuple, list] = {}
        for item in feeds:
            key = tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in item[1].items()))
            groups.setdefault(key, []).append(item)
        return list(groups.values())

    def _run_group(self, requests, group, responses):
        if len(group) == 1:
            index, feed = group[0]
            try:
                responses[index] = self._respond(requests[index], self._run(feed), 0, None)
            except Exception as exc:  # noqa: BLE001 - the runtime refused this request
                responses[index] = _error_response(exc)
            return
        joined = self._join([feed for _, feed in group])
        try:
            outputs = self._run(joined)
        except Exception:  # noqa: BLE001 - run each request alone, so that only the bad ones fail
            for item in group:
                self._run_group(requests, [item], responses)
            return
        start = 0
        for index, feed in group:
            rows = _batch_rows(feed)
            try:
                responses[index] = self._respond(requests[index], outputs, start, start + rows)
            except Exception as exc:  # noqa: BLE001
                responses[index] = _error_response(exc)
            start += rows

    def _join(self, feeds):
        """The inputs of a group of requests joined along the first dimension ([`_join_columns`])."""
        return self._join_columns({name: [feed[name] for feed in feeds] for name in feeds[0]})

    def _join_columns(self, columns):
        """Each input's arrays (one per request, in order) joined along the first dimension: one
        array over the requests' shared memory when the server placed them back to back
        (`_native.join_inputs`), else a copy (`numpy.concatenate`)."""
        joined, copied = {}, []
        for name, arrays in columns.items():
            array = _native.join_inputs(arrays)
            if array is None:
                array = np.concatenate(arrays)
                copied.append(name)
            joined[name] = array
        if copied:
            self.joined_copies += 1
            if self.joined_copies == 1:
                log(
                    LogLevel.INFO,
                    f"model '{self.model_name}': a batch of {len(arrays)} requests was joined by copying inputs "
                    f"{copied}, which were not adjacent in shared memory (logged once)",
                )
        else:
            self.joined_views += 1
            if self.joined_views == 1:
                log(
                    LogLevel.INFO,
                    f"model '{self.model_name}': a batch of {len(arrays)} requests was joined without a copy, as "
                    "one array over the shared memory its inputs arrived in (logged once)",
                )
        return joined

    def execute_wire(self, wire_requests):
        """The batch served straight from the stub's wire messages (`RequestMsg`s), without the
        pb_utils request, tensor and response objects `execute` goes through: the inputs joined,
        one run, and the answers ([`WireAnswers`]): each request's rows of every output it asked
        for, or the error it fails with. When the joined run fails, each request runs alone, so
        that only the ones the runtime rejects fail (as in `execute`).

        None, having sent nothing and kept nothing, when the batch needs `execute`: requests
        whose inputs differ in names, order, dtypes or trailing dimensions, BYTES or BF16 inputs,
        or inputs in GPU memory."""
        first = wire_requests[0].inputs
        if not first or (len(wire_requests) > 1 and self.max_batch_size == 0):
            return None
        layout = []
        for tensor in first:
            if tensor.dtype in _GENERAL_PATH_DTYPES or type(tensor.array) is not np.ndarray:
                return None
            layout.append((tensor.name, tensor.dtype, tensor.shape[1:]))
        if len(wire_requests) == 1:
            return self._run_wire(wire_requests, {tensor.name: tensor.array for tensor in first}, None)
        columns = [[tensor.array] for tensor in first]
        for request in wire_requests[1:]:
            inputs = request.inputs
            if len(inputs) != len(layout):
                return None
            for (name, dtype, tail), tensor, column in zip(layout, inputs, columns):
                if tensor.name != name or tensor.dtype != dtype or tensor.shape[1:] != tail:
                    return None
                column.append(tensor.array)
        rows = [request.inputs[0].shape[0] for request in wire_requests]
        feed = self._join_columns({name: column for (name, _, _), column in zip(layout, columns)})
        del columns
        answers = self._run_wire(wire_requests, feed, rows)
        if answers is None:
            answers = WireAnswers()
            for request in wire_requests:
                feed = {tensor.name: tensor.array for tensor in request.inputs}
                alone = self._run_wire([request], feed, None)
                if alone is not None:
                    answers.each += alone.one_by_one()
        return answers

    def _run_wire(self, wire_requests, feed, rows):
        """`execute_wire`'s answers from one run over `feed`; on a failed run, the error for a
        lone request, and None for a joined batch (whose requests then run alone)."""
        answers = WireAnswers()
        try:
            outputs = self._run(feed)
        except Exception as exc:  # noqa: BLE001 - the request fails, not the stub
            if rows is not None:
                return None
            answers.each.append((wire_requests[0].id, [], _error_text(exc)))
            return answers
        del feed
        requests = [(request.id, request.requested_outputs) for request in wire_requests]
        ready, failed = [], {}
        for name in self.outputs:
            array = outputs.get(name)
            problem = self._output_problem(name, array)
            if problem is not None:
                failed[name] = problem
                continue
            wire = None if array.dtype == np.object_ else _wire_dtype(array)
            ready.append((name, wire, np.ascontiguousarray(array) if wire else array))
        # Numeric outputs with one row per request row go out from the channel in one call
        # (`Channel.send_rows`); anything else (BYTES outputs, an output without the batch's
        # rows, an output that failed its check) request by request from here.
        total = None if rows is None else sum(rows)
        native = not failed and all(wire for _, wire, _ in ready)
        if native and total is not None:
            native = total > 0 and all(array.ndim and array.shape[0] == total for _, _, array in ready)
        if native:
            answers.requests, answers.outputs, answers.rows = requests, ready, rows
        else:
            answers.each = _one_by_one(requests, ready, failed, rows)
        return answers

    def finalize(self):
        log(
            LogLevel.INFO,
            f"instance '{self.instance_name}' of model '{self.model_name}': {self.joined_views} batches joined "
            f"without a copy, {self.joined_copies} by copying",
        )

    def _respond(self, request, outputs, start, end):
        """The response of one request: its rows [start, end) of each output (all rows when end is
        None), as views of the outputs, for the outputs it asked for (every output when it asked
        for none)."""
        wanted = request.requested_output_names() or self.outputs
        tensors = []
        for name in wanted:
            array = outputs.get(name)
            problem = self._output_problem(name, array)
            if problem is not None:
                raise BackendError(problem)
            if end is not None:
                array = array[start:end]
            tensors.append(Tensor(name, array))
        return InferenceResponse(output_tensors=tensors)

    def _output_problem(self, name, array):
        """Why output `name` of a run (`array`, None when the run produced none) cannot be
        sent, or None: it is missing, or its dtype is not the one the configuration says."""
        if array is None:
            return f"model '{self.model_name}' produced no output '{name}'"
        expected = self.output_dtypes.get(name)
        if expected is not None and array.dtype != expected and expected != np.object_:
            return (
                f"model '{self.model_name}': output '{name}' is {array.dtype}, but the model configuration "
                f"says {_config_type(expected)}"
            )
        return None


class WireAnswers:
    """What `FrameworkModel.execute_wire` answers a batch with: `requests` (`(id, requested
    output names)`) get their rows of `outputs` (`(name, wire dtype, array)`) from
    `Channel.send_rows`, by `rows` (one count per request; None for a lone request, which gets
    every row); `each` holds the other requests' `(id, outputs, error)`, each output a
    `(name, wire dtype, shape, data)` for `Channel.send_response`."""

    __slots__ = ("requests", "outputs", "rows", "each")

    def __init__(self):
        self.requests = []
        self.outputs = []
        self.rows = None
        self.each = []

    def one_by_one(self):
        """Every answer as `(id, outputs, error)`."""
        return _one_by_one(self.requests, self.outputs, {}, self.rows) + self.each


def _one_by_one(requests, ready, failed, rows):
    """Each of `requests` (`(id, requested output names)`) answered as `(id, outputs, error)`:
    its rows of each `ready` output it asked for (request i's rows by `rows`, every row when
    `rows` is None), or the first of `failed`'s errors (by output name) among those it asked for
    (every output when it named none)."""
    answers: list[tuple] = []
    start = 0
    for i, (request, requested) in enumerate(requests):
        end = start + rows[i] if rows is not None else 0
        refused = [failed[name] for name in (requested or failed) if name in failed]
        if refused:
            answers.append((request, [], refused[0]))
        else:
            answers.append((request, _rows_of(ready, requested, start, end if rows is not None else None), None))
        start = end
    return answers


def _rows_of(ready, requested, start, end):
    """A request's outputs as `(name, wire dtype, shape, data)`: rows [start, end) of each ready
    `(name, wire dtype or None for BYTES, array)` it asked for (all rows when `end` is None)."""
    sent = []
    for name, wire, array in ready:
        if requested and name not in requested:
            continue
        part = array if end is None else array[start:end]
        if wire is None:
            sent.append((name, *Tensor(name, part)._wire_payload()))  # noqa: SLF001 - BYTES outputs
        else:
            part = np.ascontiguousarray(part)
            sent.append((name, wire, list(part.shape), part))
    return sent


def _batch_rows(feed):
    """How many rows (the first dimension) a request's inputs have."""
    for array in feed.values():
        return array.shape[0] if array.ndim else 1
    return 0


def _config_type(dtype):
    for name, np_type in TRITON_STRING_TO_NUMPY.items():
        if np.dtype(np_type) == dtype:
            return name
    return str(dtype)


def _error_text(exc):
    return f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)


def _error_response(exc):
    return InferenceResponse(error=TritonError(_error_text(exc)))
