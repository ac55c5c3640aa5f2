"""Metrics that model code registers in `prometheus_client`'s default registry, for the server's `/metrics`.

When `/metrics` is scraped the server asks each stub for them; a daemon thread of the stub
(`tritium-metrics`, started by `serve`) waits for those requests in the native channel without
holding the GIL and answers with `collect()`, so a long `execute` on the main thread does not
delay the answer. Nothing is imported: a model that never imported `prometheus_client` (or an
interpreter without it) answers with no families.

Families are sent in the Prometheus text format's terms, as `prometheus_client.generate_latest`
writes them: a counter's name ends in `_total`, an info metric is a gauge named `<name>_info`, a
state set (`Enum`) is a gauge, `unknown` is `untyped`. Left out: the default collectors (process,
platform, garbage collector: the server has its own per-stub series), gauge histograms, and the
`_created` samples (per-process timestamps).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

from . import _runtime

if TYPE_CHECKING:
    from ._native import Channel

# How long one wait for a request lasts before the thread checks that the channel is still there.
_WAIT_MS = 1000

_TYPES = {
    "counter": "counter",
    "gauge": "gauge",
    "histogram": "histogram",
    "summary": "summary",
    "info": "gauge",
    "stateset": "gauge",
    "unknown": "untyped",
    "untyped": "untyped",
}


def _collectors(pc):
    """The collectors of the default registry, without the ones prometheus_client registers itself."""
    registry = pc.REGISTRY
    defaults = {getattr(pc, n, None) for n in ("PROCESS_COLLECTOR", "PLATFORM_COLLECTOR", "GC_COLLECTOR")}
    lock = getattr(registry, "_lock", None)
    table = getattr(registry, "_collector_to_names", None)
    if lock is None or not isinstance(table, dict):
        # An unknown registry layout: everything it collects.
        return [registry]
    with lock:
        collectors = list(table)
    return [c for c in collectors if c not in defaults]


def collect():
    """The default registry's families as `(name, help, type, [(sample, labels, value)])`."""
    pc = sys.modules.get("prometheus_client")
    if pc is None or not hasattr(pc, "REGISTRY"):
        return []
    families = []
    for collector in _collectors(pc):
        for metric in collector.collect():
            kind = _TYPES.get(metric.type)
            if kind is None:
                continue
            name = metric.name
            if metric.type == "counter":
                name += "_total"
            elif metric.type == "info":
                name += "_info"
            skipped = {metric.name + s for s in ("_created", "_gsum", "_gcount")}
            samples = [
                (s.name, [(str(k), str(v)) for k, v in s.labels.items()], float(s.value))
                for s in metric.samples
                if s.name not in skipped
            ]
            families.append((name, metric.documentation, kind, samples))
    return families


def _serve(channel: Channel) -> None:
    while _runtime.channel is channel:
        seq = channel.next_metrics_request(_WAIT_MS)
        if seq is None:
            continue
        try:
            families, error = collect(), None
        except Exception as exc:  # noqa: BLE001 - a collector's failure is reported, not fatal
            families, error = [], f"collecting the prometheus_client registry failed: {type(exc).__name__}: {exc}"
        try:
            channel.send_client_metrics(seq, families, error)
        except Exception as exc:  # noqa: BLE001 - bad values (a label that is not a str): reported
            try:
                channel.send_client_metrics(seq, [], f"the prometheus_client metrics cannot be sent: {exc}")
            except Exception:  # noqa: BLE001 - the channel is gone: so is the server
                return


def serve(channel: Channel) -> None:
    """Starts the daemon thread that answers the server's metrics requests on `channel`."""
    threading.Thread(target=_serve, args=(channel,), name="tritium-metrics", daemon=True).start()
