"""Custom metrics for model code: pb_utils.MetricFamily and Metric, as in Triton's Python backend.

    family = pb_utils.MetricFamily(
        name="requests_process_latency_ns",
        description="Cumulative time spent processing requests",
        kind=pb_utils.MetricFamily.COUNTER,
    )
    metric = family.Metric(labels={"model": "custom_metrics", "version": "1"})
    metric.increment(elapsed_ns)

The metrics live in the server and appear on its /metrics page. Every call goes to the server
through the stub's channel (`tritium._runtime.channel`), and the rules are Triton's:

- Families with the same name and kind are shared (the first description is kept); the same name
  with another kind is refused. Metrics of a family with the same labels are shared.
- Counters only go up; gauges can be set and incremented by any value; histograms need buckets
  and are observed. A histogram has no value().
- A MetricFamily keeps every Metric it created alive, and deleting it deletes them: a Metric used
  after its MetricFamily is gone raises TritonModelException. Keep the MetricFamily (for example
  on `self`) as long as its metrics are used.

Errors raise TritonModelException with Triton's messages: the server's text behind the prefix
Triton's stub adds ("Error when creating MetricFamily: ", "Failed to increment metric value: ",
...). Arguments of the wrong type raise TypeError, like Triton's pybind11 bindings.
"""

from __future__ import annotations

import enum
import json
import sys
from typing import TYPE_CHECKING

from . import _runtime
from .args import as_double_opt as _as_double
from .args import as_str_opt as _as_str
from .errors import MetricKind, TritonModelException

if TYPE_CHECKING:
    from ._native import Channel

__all__ = ["MetricFamily", "Metric", "MetricKind"]

_NOT_IN_STUB = (
    "custom metrics work only inside a model served by tritium: create MetricFamily objects "
    "in initialize(), execute() or finalize() of a TritonPythonModel"
)

# Triton's text (python_backend src/metric.cc, Metric::CheckIfCleared).
_CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
    "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' "
    "objects have been deleted."
)

# Prefixes Triton's stub puts before the server's message (python_backend src/metric.cc and
# src/metric_family.cc).
_CREATE_FAMILY = "Error when creating MetricFamily: "
_CREATE_METRIC = "Error when creating Metric: "


class MetricOp(enum.IntEnum):
    """What a Metric method does; the native channel sends the number as the protocol's metric op."""

    INCREMENT = 0
    SET = 1
    OBSERVE = 2


_OPERATIONS = {
    MetricOp.INCREMENT: "Failed to increment metric value: ",
    MetricOp.SET: "Failed to set metric value: ",
    MetricOp.OBSERVE: "Failed to observe metric value: ",
}
_GET_VALUE = "Failed to get metric value: "


def _message(error):
    """The text of an exception raised by the channel (the server's message)."""
    text = str(error)
    return text if text else type(error).__name__


def _server_message(error):
    """The server's message as Triton's stub reports a failed metric call: behind the instance
    it came from ("Failed to process the request for model 'm_0', message: ...")."""
    instance = _runtime.instance_name
    if not instance:
        return _message(error)
    return f"Failed to process the request for model '{instance}', message: {_message(error)}"


def _incompatible(what, signature, args):
    """The TypeError pybind11 raises for arguments a binding does not accept."""
    return TypeError(
        "{}: incompatible {} arguments. The following argument types are supported:\n"
        "    1. {}\n\nInvoked with: {}".format(
            what[0],
            what[1],
            signature,
            ", ".join(repr(arg) for arg in args),
        )
    )


def _active(channel):
    """Whether `channel` is still the stub's live channel (not None, not replaced, not shut down)."""
    return channel is not None and _runtime.channel is channel


def _finalizing():
    try:
        return sys.is_finalizing()
    except Exception:  # sys half torn down
        return True


class Metric:
    """One metric of a MetricFamily (one label set). Create it with MetricFamily.Metric()."""

    _channel: Channel
    _id: int
    _cleared: bool

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "triton_python_backend_utils.Metric: No constructor defined! "
            "Create metrics with MetricFamily.Metric(labels=..., buckets=...)."
        )

    @classmethod
    def _new(cls, channel: Channel, metric_id: int) -> Metric:
        metric = object.__new__(cls)
        metric._channel = channel
        metric._id = metric_id
        metric._cleared = False
        return metric

    def increment(self, value):
        """Adds `value` to a counter (non-negative values only) or a gauge."""
        self._operate(MetricOp.INCREMENT, value)

    def set(self, value):
        """Sets a gauge to `value`."""
        self._operate(MetricOp.SET, value)

    def observe(self, value):
        """Records `value` in a histogram."""
        self._operate(MetricOp.OBSERVE, value)

    def value(self):
        """The current value of a counter or gauge (histograms have none)."""
        if self._cleared:
            raise TritonModelException(_GET_VALUE + _CLEARED)
        try:
            return float(self._channel.metric_value(self._id))
        except Exception as error:
            raise TritonModelException(_GET_VALUE + _server_message(error)) from None

    def _operate(self, op, value):
        number = _as_double(value)
        if number is None:
            raise _incompatible(
                (op.name.lower() + "()", "function"),
                "(self: triton_python_backend_utils.Metric, arg0: float) -> None",
                [self, value],
            )
        prefix = _OPERATIONS[op]
        if self._cleared:
            raise TritonModelException(prefix + _CLEARED)
        try:
            self._channel.metric_op(self._id, op, number)
        except Exception as error:
            raise TritonModelException(prefix + _server_message(error)) from None

    def _clear(self):
        """Releases the metric on the server, once; later operations raise."""
        if self._cleared:
            return
        self._cleared = True
        channel = self._channel
        if _active(channel):
            try:
                channel.metric_drop(self._id)
            except Exception as error:
                sys.stderr.write(f"Error when deleting Metric: {_message(error)}\n")

    def __del__(self):
        try:
            if not _finalizing():
                self._clear()
        except Exception:
            pass

    def __repr__(self):
        state = "deleted" if self._cleared else f"id={self._id}"
        return f"<triton_python_backend_utils.Metric {state}>"


class MetricFamily:
    """A family of metrics with one name, description and kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name, description, kind):
        self._id = None
        self._channel = None
        self._metrics = []
        name_str = _as_str(name)
        description_str = _as_str(description)
        if name_str is None or description_str is None or not isinstance(kind, MetricKind):
            raise _incompatible(
                ("__init__()", "constructor"),
                "triton_python_backend_utils.MetricFamily(name: str, description: str, "
                "kind: triton_python_backend_utils.MetricKind)",
                [name, description, kind],
            )
        self._name = name_str
        self._description = description_str
        self._kind = MetricKind(kind)
        channel = _runtime.channel
        if channel is None:
            raise TritonModelException(_CREATE_FAMILY + _NOT_IN_STUB)
        try:
            family_id = channel.metric_family_new(name_str, description_str, int(kind))
        except Exception as error:
            raise TritonModelException(_CREATE_FAMILY + _server_message(error)) from None
        self._channel = channel
        self._id = family_id

    def Metric(self, labels=None, buckets=None):  # noqa: N802 (Triton's name)
        """Creates (or shares) the metric with these labels.

        labels: a dict of str label names to str values, or None for no labels.
        buckets: for a HISTOGRAM only, a list of bucket upper bounds in increasing order.
        """
        # The stub's own checks, in Triton's order (python_backend MetricFamily::CreateMetric).
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        # Triton sends the labels as JSON: keys become strings, unserializable ones raise here.
        decoded = json.loads(json.dumps(labels))
        bucket_list = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind in (MetricKind.COUNTER, MetricKind.GAUGE):
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            bucket_list = []
            for bound in buckets:
                number = _as_double(bound)
                if number is None:
                    # pybind11's cast_error, a RuntimeError in Python.
                    raise RuntimeError(
                        f"Unable to cast Python instance of type {type(buckets)} to C++ type "
                        f"'std::vector<double>': bucket bounds must be numbers, found {bound!r}"
                    )
                bucket_list.append(number)
        elif self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")

        # The server's check on the JSON labels (Triton: TritonJson MemberAsString).
        pairs = []
        if isinstance(decoded, dict):
            for key, value in decoded.items():
                if not isinstance(value, str):
                    raise TritonModelException(_CREATE_METRIC + "attempt to access JSON non-string as string")
                pairs.append((key, value))

        channel = self._channel
        if self._id is None or channel is None or not _active(channel):
            raise TritonModelException(_CREATE_METRIC + _NOT_IN_STUB)
        try:
            metric_id = channel.metric_new(self._id, pairs, bucket_list)
        except Exception as error:
            raise TritonModelException(_CREATE_METRIC + _server_message(error)) from None
        metric = Metric._new(channel, metric_id)  # noqa: SLF001 - Metric belongs to this module
        self._metrics.append(metric)
        return metric

    def _release(self):
        """Deletes the family's metrics, then the family, on the server (Triton's order)."""
        metrics, self._metrics = self._metrics, []
        for metric in metrics:
            metric._clear()  # noqa: SLF001 - Metric belongs to this module
        family_id, self._id = self._id, None
        channel = self._channel
        if family_id is not None and channel is not None and _active(channel):
            try:
                channel.metric_family_drop(family_id)
            except Exception as error:
                sys.stderr.write(f"Error when deleting MetricFamily: {_message(error)}\n")

    def __del__(self):
        try:
            if not _finalizing():
                self._release()
        except Exception:
            pass

    def __repr__(self):
        return "<triton_python_backend_utils.MetricFamily {!r} {}>".format(
            getattr(self, "_name", "?"), getattr(getattr(self, "_kind", None), "name", "?")
        )
