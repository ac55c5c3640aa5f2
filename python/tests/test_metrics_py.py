"""Tests for tritium.metrics (pb_utils.MetricFamily / Metric) against a fake stub channel.

The fake channel forwards to an in-process model of the server's custom-metrics registry with
the rules and texts of crates/tritium-metrics (Triton's), and records every call.
"""

import gc
import re
import subprocess
import sys
import textwrap
import threading

import pytest
from tritium import _runtime
from tritium import metrics as metrics_module
from tritium.errors import MetricKind, TritonModelException
from tritium.metrics import Metric, MetricFamily, MetricOp

_KIND_NAMES = {0: "COUNTER", 1: "GAUGE", 2: "HISTOGRAM"}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class ServerError(Exception):
    """What the native channel raises: an exception carrying the server's message."""


class FakeRegistry:
    """The server's registry, reduced to what the Python side can observe."""

    def __init__(self):
        self.next_id = 0
        self.by_name = {}
        self.families = {}  # id -> dict(name, kind, description, refs, members)
        self.series = {}  # id -> dict(family, labels, kind, refs, value, ...)

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    def family_new(self, name, description, kind):
        if not _NAME.match(name) or name.startswith("__"):
            raise ServerError(f"Invalid metric name '{name}': ...")
        if kind not in _KIND_NAMES:
            raise ServerError(f"Unknown metric kind {kind}")
        if name in self.by_name:
            family = self.families[self.by_name[name]]
            if family["kind"] != kind:
                raise ServerError("Family name already exists with different type: ...")
            family["refs"] += 1
            return self.by_name[name]
        family_id = self._new_id()
        self.by_name[name] = family_id
        self.families[family_id] = dict(name=name, kind=kind, description=description, refs=1, members={})
        return family_id

    def family_drop(self, family_id):
        family = self.families[family_id]
        if family["refs"] <= 1:
            if family["members"]:
                raise ServerError("Must call MetricDelete on all dependent metrics before calling MetricFamilyDelete.")
            del self.families[family_id]
            del self.by_name[family["name"]]
        else:
            family["refs"] -= 1

    def metric_new(self, family_id, labels, buckets):
        family = self.families.get(family_id)
        if family is None:
            raise ServerError(f"Unknown metric family id {family_id}")
        kind = family["kind"]
        if kind == 2 and buckets is None:
            raise ServerError("Bucket boundaries not found in Metric args.")
        if kind != 2 and buckets is not None:
            raise ServerError(f"Unexpected args found in {_KIND_NAMES[kind].lower()} Metric constructor.")
        for name, value in labels:
            assert isinstance(name, str) and isinstance(value, str)
            if not _LABEL.match(name) or name.startswith("__"):
                raise ServerError(f"Invalid label name '{name}': ...")
        key = tuple(sorted(labels))
        if key in family["members"]:
            metric_id = family["members"][key]
            self.series[metric_id]["refs"] += 1
            return metric_id
        metric_id = self._new_id()
        family["members"][key] = metric_id
        self.series[metric_id] = dict(
            family=family_id,
            labels=key,
            kind=kind,
            refs=1,
            value=0.0,
            buckets=list(buckets) if buckets is not None else None,
            observed=[],
        )
        return metric_id

    def metric_drop(self, metric_id):
        series = self.series[metric_id]
        series["refs"] -= 1
        if series["refs"] == 0:
            del self.series[metric_id]
            del self.families[series["family"]]["members"][series["labels"]]

    def _unsupported(self, kind, op):
        return ServerError(f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind]} does not support {op}")

    def metric_op(self, metric_id, op, value):
        series = self.series.get(metric_id)
        if series is None:
            raise ServerError(f"Unknown metric id {metric_id}")
        kind = series["kind"]
        if op == MetricOp.INCREMENT:
            if kind == 0:
                if value < 0:
                    raise ServerError(
                        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
                    )
                series["value"] += value
            elif kind == 1:
                series["value"] += value
            else:
                raise self._unsupported(kind, "Increment")
        elif op == MetricOp.SET:
            if kind != 1:
                raise self._unsupported(kind, "Set")
            series["value"] = value
        elif op == MetricOp.OBSERVE:
            if kind != 2:
                raise self._unsupported(kind, "Observe")
            series["observed"].append(value)
        else:
            raise ServerError(f"Unknown metric operation '{op}'")

    def metric_value(self, metric_id):
        series = self.series.get(metric_id)
        if series is None:
            raise ServerError(f"Unknown metric id {metric_id}")
        if series["kind"] == 2:
            raise self._unsupported(2, "Value")
        return series["value"]


class FakeChannel:
    """The six methods the lead implements on the native channel, forwarding to FakeRegistry."""

    def __init__(self, registry=None):
        self.registry = registry or FakeRegistry()
        self.calls = []
        self.lock = threading.Lock()
        self.fail_drops = False

    def _call(self, name, *args):
        with self.lock:
            self.calls.append((name,) + args)
            return getattr(self.registry, name)(*args)

    def metric_family_new(self, name, description, kind):
        assert type(name) is str and type(description) is str and type(kind) is int
        return self._call("family_new", name, description, kind)

    def metric_family_drop(self, family_id):
        if self.fail_drops:
            raise ServerError("channel closed")
        self._call("family_drop", family_id)

    def metric_new(self, family_id, labels, buckets):
        assert isinstance(labels, list) and all(isinstance(p, tuple) and len(p) == 2 for p in labels)
        assert buckets is None or (isinstance(buckets, list) and all(type(b) is float for b in buckets))
        return self._call("metric_new", family_id, labels, buckets)

    def metric_drop(self, metric_id):
        if self.fail_drops:
            raise ServerError("channel closed")
        self._call("metric_drop", metric_id)

    def metric_op(self, metric_id, op, value):
        assert type(op) is MetricOp and type(value) is float
        self._call("metric_op", metric_id, op, value)

    def metric_value(self, metric_id):
        return self._call("metric_value", metric_id)

    def names(self):
        return [call[0] for call in self.calls]


@pytest.fixture
def channel(monkeypatch):
    fake = FakeChannel()
    monkeypatch.setattr(_runtime, "channel", fake)
    # Outside a served instance (another test's stub may have set one).
    monkeypatch.setattr(_runtime, "instance_name", "")
    yield fake
    gc.collect()


@pytest.fixture
def unraisable(monkeypatch):
    """Exceptions raised (and swallowed) in __del__ methods."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(info))
    return seen


# ---------------------------------------------------------------- API shape


def test_kind_constants_are_tritons():
    assert MetricFamily.COUNTER == 0 and MetricFamily.COUNTER is MetricKind.COUNTER
    assert MetricFamily.GAUGE == 1 and MetricFamily.GAUGE is MetricKind.GAUGE
    assert MetricFamily.HISTOGRAM == 2 and MetricFamily.HISTOGRAM is MetricKind.HISTOGRAM
    assert set(metrics_module.__all__) == {"MetricFamily", "Metric", "MetricKind"}


def test_metric_has_no_public_constructor():
    with pytest.raises(TypeError, match="No constructor defined"):
        Metric()


def test_outside_a_stub_creating_a_family_raises():
    assert _runtime.channel is None
    with pytest.raises(TritonModelException) as info:
        MetricFamily("requests", "Requests", MetricFamily.COUNTER)
    assert str(info.value).startswith(
        "Error when creating MetricFamily: custom metrics work only inside a model served by tritium"
    )


# ---------------------------------------------------------------- Triton's example


def test_readme_counter_example(channel):
    family = MetricFamily(
        name="requests_process_latency_ns",
        description="Cumulative time spent processing requests",
        kind=MetricFamily.COUNTER,
    )
    metric = family.Metric(labels={"model": "custom_metrics", "version": "1"})
    metric.increment(1500)  # an int, as time.time_ns() differences are
    metric.increment(0.5)
    assert metric.value() == 1500.5
    assert isinstance(metric.value(), float)
    assert channel.calls[0] == (
        "family_new",
        "requests_process_latency_ns",
        "Cumulative time spent processing requests",
        0,
    )
    assert channel.calls[1] == ("metric_new", family._id, [("model", "custom_metrics"), ("version", "1")], None)
    assert channel.calls[2] == ("metric_op", metric._id, MetricOp.INCREMENT, 1500.0)


def test_gauge(channel):
    family = MetricFamily("queue_depth", "Depth", MetricFamily.GAUGE)
    metric = family.Metric()
    metric.set(10)
    metric.increment(-12.5)
    assert metric.value() == -2.5


def test_histogram(channel):
    family = MetricFamily("latency_seconds", "Latency", MetricFamily.HISTOGRAM)
    metric = family.Metric(labels={"model": "m"}, buckets=[0.1, 1, 2.5])
    metric.observe(0.3)
    metric.observe(2)
    series = channel.registry.series[metric._id]
    assert series["buckets"] == [0.1, 1.0, 2.5]
    assert series["observed"] == [0.3, 2.0]
    with pytest.raises(TritonModelException) as info:
        metric.value()
    assert str(info.value) == "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"


def test_numbers_convert_like_pybind(channel):
    class Seconds:
        def __float__(self):
            return 2.0

    family = MetricFamily("g", "d", MetricFamily.GAUGE)
    gauge = family.Metric()
    gauge.set(True)
    assert gauge.value() == 1.0
    gauge.set(Seconds())
    assert gauge.value() == 2.0
    for bad in ["1.5", b"1", None, [1], object()]:
        with pytest.raises(TypeError, match=r"set\(\): incompatible function arguments"):
            gauge.set(bad)
    with pytest.raises(TypeError, match=r"increment\(\): incompatible function arguments"):
        gauge.increment("1")
    with pytest.raises(TypeError, match=r"observe\(\): incompatible function arguments"):
        gauge.observe(None)


# ---------------------------------------------------------------- client-side checks (Triton's)


def test_constructor_argument_types(channel):
    for args in [
        (None, "d", MetricFamily.COUNTER),
        (1, "d", MetricFamily.COUNTER),
        ("n", None, MetricFamily.COUNTER),
        ("n", "d", 0),  # a plain int is not a MetricKind, as in pybind11
        ("n", "d", None),
        ("n", "d", "COUNTER"),
    ]:
        with pytest.raises(TypeError, match=r"__init__\(\): incompatible constructor arguments"):
            MetricFamily(*args)
    assert channel.calls == []
    family = MetricFamily(b"bytes_name", b"bytes description", MetricFamily.GAUGE)
    assert channel.calls[0] == ("family_new", "bytes_name", "bytes description", 1)
    assert family._id is not None


def test_metric_argument_checks_in_tritons_order(channel):
    counter = MetricFamily("c", "d", MetricFamily.COUNTER)
    gauge = MetricFamily("g", "d", MetricFamily.GAUGE)
    histogram = MetricFamily("h", "d", MetricFamily.HISTOGRAM)
    before = len(channel.calls)

    def raises(cls, text, family, *args, **kwargs):
        with pytest.raises(cls) as info:
            family.Metric(*args, **kwargs)
        assert str(info.value) == text

    raises(TritonModelException, "Failed to create metric. Labels must be a dictionary.", counter, labels=[("a", "b")])
    raises(TritonModelException, "Failed to create metric. Labels must be a dictionary.", counter, labels="a=b")
    # Labels are checked before buckets.
    raises(
        TritonModelException, "Failed to create metric. Labels must be a dictionary.", counter, labels=1, buckets=[1.0]
    )
    raises(TritonModelException, "Failed to create metric. Buckets must be a list.", histogram, buckets=(1.0, 2.0))
    raises(TritonModelException, "Failed to create metric. Unexpected buckets found.", counter, buckets=[1.0])
    raises(TritonModelException, "Failed to create metric. Unexpected buckets found.", gauge, buckets=[])
    raises(TritonModelException, "Failed to create metric. Missing required buckets.", histogram)
    raises(TritonModelException, "Failed to create metric. Missing required buckets.", histogram, labels={"a": "b"})
    raises(
        TritonModelException,
        "Error when creating Metric: attempt to access JSON non-string as string",
        counter,
        labels={"a": 1},
    )
    raises(
        TritonModelException,
        "Error when creating Metric: attempt to access JSON non-string as string",
        counter,
        labels={"a": None},
    )
    with pytest.raises(RuntimeError, match="Unable to cast"):
        histogram.Metric(buckets=[1.0, "2"])
    # json.dumps refuses what Triton's json.dumps refuses.
    with pytest.raises(TypeError):
        counter.Metric(labels={("a", "b"): "c"})
    with pytest.raises(TypeError):
        counter.Metric(labels={"a": {1, 2}})
    assert len(channel.calls) == before, "nothing reached the server"

    # Keys go through JSON as in Triton: non-str keys become strings.
    metric = counter.Metric(labels={True: "yes"})
    assert channel.calls[-1] == ("metric_new", counter._id, [("true", "yes")], None)
    assert metric._id is not None


# ---------------------------------------------------------------- server errors


def test_in_a_stub_server_errors_name_the_instance_as_tritons_do(channel, monkeypatch):
    """Triton 2.51's text, side by side: the operation's prefix, then the instance the call came
    from, then the server's message; the stub's own checks name no instance."""
    monkeypatch.setattr(_runtime, "instance_name", "custmetric_0")
    with pytest.raises(TritonModelException) as info:
        MetricFamily("bad-name", "d", MetricFamily.COUNTER)
    assert str(info.value) == (
        "Error when creating MetricFamily: Failed to process the request for model 'custmetric_0', "
        "message: Invalid metric name 'bad-name': ..."
    )
    family = MetricFamily("c", "d", MetricFamily.COUNTER)
    with pytest.raises(TritonModelException) as info:
        family.Metric().set(1)
    assert str(info.value) == (
        "Failed to set metric value: Failed to process the request for model 'custmetric_0', "
        "message: TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    )
    with pytest.raises(TritonModelException) as info:
        MetricFamily("h", "d", MetricFamily.HISTOGRAM).Metric()
    assert str(info.value) == "Failed to create metric. Missing required buckets."


def test_server_errors_come_back_as_triton_model_exception_with_tritons_prefixes(channel):
    MetricFamily("shared", "d", MetricFamily.COUNTER)
    with pytest.raises(TritonModelException) as info:
        MetricFamily("bad-name", "d", MetricFamily.COUNTER)
    assert str(info.value) == "Error when creating MetricFamily: Invalid metric name 'bad-name': ..."

    counter = MetricFamily("c", "d", MetricFamily.COUNTER)
    with pytest.raises(TritonModelException) as info:
        MetricFamily("c", "d", MetricFamily.GAUGE)
    assert str(info.value).startswith(
        "Error when creating MetricFamily: Family name already exists with different type"
    )

    with pytest.raises(TritonModelException) as info:
        counter.Metric(labels={"bad-label": "v"})
    assert str(info.value) == "Error when creating Metric: Invalid label name 'bad-label': ..."

    metric = counter.Metric()
    with pytest.raises(TritonModelException) as info:
        metric.increment(-1)
    assert str(info.value) == (
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
        "incremented monotonically by non-negative values."
    )
    with pytest.raises(TritonModelException) as info:
        metric.set(1)
    assert str(info.value) == "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    with pytest.raises(TritonModelException) as info:
        metric.observe(1)
    assert (
        str(info.value) == "Failed to observe metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"
    )
    assert metric.value() == 0.0
    # The chained native exception is not shown: the message is the server's.
    assert info.value.__cause__ is None and info.value.__suppress_context__


# ---------------------------------------------------------------- sharing and lifetimes


def test_same_name_and_labels_share_on_the_server(channel):
    first = MetricFamily("shared", "first", MetricFamily.GAUGE)
    second = MetricFamily("shared", "second", MetricFamily.GAUGE)
    assert first._id == second._id
    a = first.Metric(labels={"x": "1", "y": "2"})
    b = second.Metric(labels={"y": "2", "x": "1"})
    assert a._id == b._id
    a.set(5)
    assert b.value() == 5.0
    del first  # releases a (one reference) and one family reference
    gc.collect()
    assert b.value() == 5.0
    with pytest.raises(TritonModelException, match="has been deleted"):
        a.value()


def test_a_family_keeps_its_metrics_and_deletes_them_first(channel):
    family = MetricFamily("f", "d", MetricFamily.COUNTER)
    metric = family.Metric(labels={"k": "v"})
    metric_id, family_id = metric._id, family._id
    del metric
    gc.collect()
    assert "metric_drop" not in channel.names(), "as in Triton, the family holds its metrics"
    del family
    gc.collect()
    assert channel.calls[-2:] == [("metric_drop", metric_id), ("family_drop", family_id)]
    assert channel.registry.families == {} and channel.registry.series == {}


def test_metrics_of_a_deleted_family_raise_tritons_error(channel):
    family = MetricFamily("f", "d", MetricFamily.GAUGE)
    metric = family.Metric()
    del family
    gc.collect()
    cleared = (
        "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. "
        "The 'MetricFamily' object should be deleted AFTER its corresponding 'Metric' "
        "objects have been deleted."
    )
    for method, arg, prefix in [
        (metric.increment, (1,), "Failed to increment metric value: "),
        (metric.set, (1,), "Failed to set metric value: "),
        (metric.observe, (1,), "Failed to observe metric value: "),
        (metric.value, (), "Failed to get metric value: "),
    ]:
        with pytest.raises(TritonModelException) as info:
            method(*arg)
        assert str(info.value) == prefix + cleared
    # A temporary family deletes its metric at once, as in Triton.
    orphan = MetricFamily("tmp", "d", MetricFamily.GAUGE).Metric()
    gc.collect()
    with pytest.raises(TritonModelException, match="has been deleted"):
        orphan.set(1)
    drops = channel.names().count("metric_drop")
    del method, metric, orphan
    gc.collect()
    assert channel.names().count("metric_drop") == drops, "released once only"


def test_del_never_raises_and_does_nothing_once_the_stub_is_gone(channel, unraisable, monkeypatch, capsys):
    family = MetricFamily("f", "d", MetricFamily.COUNTER)
    family.Metric()
    channel.fail_drops = True
    del family
    gc.collect()
    assert unraisable == []
    assert "Error when deleting Metric: channel closed" in capsys.readouterr().err

    channel.fail_drops = False
    family = MetricFamily("g", "d", MetricFamily.COUNTER)
    family.Metric()
    calls = len(channel.calls)
    monkeypatch.setattr(_runtime, "channel", None)  # the stub shut its channel down
    del family
    gc.collect()
    assert len(channel.calls) == calls
    assert unraisable == []


def test_creating_a_metric_after_the_channel_closed_raises(channel, monkeypatch):
    family = MetricFamily("f", "d", MetricFamily.COUNTER)
    monkeypatch.setattr(_runtime, "channel", None)
    with pytest.raises(TritonModelException, match="^Error when creating Metric: custom metrics work only inside"):
        family.Metric()


def test_nothing_happens_at_interpreter_shutdown():
    code = textwrap.dedent(
        """
        import sys
        from tritium import _runtime
        from tritium.metrics import MetricFamily

        class Loud:
            def metric_family_new(self, *a): return 1
            def metric_new(self, *a): return 2
            def metric_drop(self, *a): raise RuntimeError("metric_drop at shutdown")
            def metric_family_drop(self, *a): raise RuntimeError("family_drop at shutdown")

        _runtime.channel = Loud()
        family = MetricFamily("f", "d", MetricFamily.COUNTER)
        metric = family.Metric()
        print("ok")
        """
    )
    python_dir = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-c", code], cwd=python_dir, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    assert "Exception ignored" not in result.stderr, result.stderr
    assert "at shutdown" not in result.stderr, result.stderr


def test_concurrent_increments(channel):
    family = MetricFamily("hits", "Hits", MetricFamily.COUNTER)
    metric = family.Metric(labels={"k": "v"})

    def work():
        for _ in range(500):
            metric.increment(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert metric.value() == 4000.0
