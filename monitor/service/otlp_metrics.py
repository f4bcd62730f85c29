"""The monitor's per-step metrics as OpenTelemetry metrics, exported over OTLP as they arrive.

Every batch the service stores (``Push``, once per batch: a resent one is not counted twice)
is recorded here; a ``PeriodicExportingMetricReader`` sends what was recorded every
``OTEL_METRIC_EXPORT_INTERVAL`` ms (5000 here unless set) to the collector the
``OTEL_EXPORTER_OTLP_*`` variables name (:mod:`probe.collectors.otlp`). Instruments, each point with
the attributes ``probe.job`` and ``probe.rank``:

- ``probe.<name>``: a gauge per metric name the ranks send (``probe.loss``,
  ``probe.step_time_ms``, ``probe.grad_norm``, ``probe.mem_allocated_bytes``, ...; characters
  OpenTelemetry does not allow in a name become ``_``): the value at the batch's last step;
- ``probe.step_time``: a histogram (ms) of every ``step_time_ms`` point, so no step time is
  lost between two exports;
- ``probe.step``: a gauge, the last step each rank reported;
- ``probe.monitor.points``: a counter of the points stored.

Resource: ``service.name`` (``OTEL_SERVICE_NAME``, else ``probe-monitor``; with
``OTEL_RESOURCE_ATTRIBUTES``) and ``probe.monitor.address``.

>>> import pyarrow as pa
>>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
>>> reader = InMemoryMetricReader()
>>> m = OtlpMetrics(reader=reader)
>>> m.record(pa.table({"job": ["j", "j"], "rank": [3, 3], "step": [0, 1], "name": ["loss", "loss"],
...                    "value": [2.0, 1.5]}))
>>> data = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
>>> point = next(x for x in data if x.name == "probe.loss").data.data_points[0]
>>> point.value, dict(point.attributes)
(1.5, {'probe.job': 'j', 'probe.rank': 3})
>>> m.close()
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

#: Export interval when ``OTEL_METRIC_EXPORT_INTERVAL`` is not set (the SDK's own is 60 s).
DEFAULT_INTERVAL_MS = 5000
#: Seconds exports fail at once after one failed (the collector is down or refuses).
PAUSE_AFTER_FAILURE_S = 30.0
_BAD = re.compile(r"[^A-Za-z0-9_.\-/]")
_UNITS = (("_ms", "ms"), ("_s", "s"), ("_bytes", "By"), ("_pct", "%"))


def instrument_name(name: str) -> str:
    """The OpenTelemetry instrument name of metric ``name``.

    >>> instrument_name("loss"), instrument_name("grad_norm[layer 0]")
    ('probe.loss', 'probe.grad_norm_layer_0_')
    """
    return ("probe." + _BAD.sub("_", name))[:255]


def _unit(name: str) -> str:
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), "")


def _pausing(inner: Any) -> Any:
    """``inner`` (a metric exporter) wrapped: after a failed export the next ones fail at once
    for :data:`PAUSE_AFTER_FAILURE_S`, and :attr:`failing` says so (the service's stop then
    does not wait for a collector that is away)."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class Pausing(MetricExporter):
        def __init__(self) -> None:
            super().__init__(preferred_temporality=inner._preferred_temporality,
                             preferred_aggregation=inner._preferred_aggregation)
            self.inner = inner
            self.exported = self.failed = 0
            self.paused_until = 0.0
            self.busy_since: float | None = None

        @property
        def failing(self) -> bool:
            """The last export failed, or the one under way has taken over 0.5 s (retrying)."""
            now, busy = time.monotonic(), self.busy_since
            return now < self.paused_until or (busy is not None and now - busy > 0.5)

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            if time.monotonic() < self.paused_until:
                self.failed += 1
                return MetricExportResult.FAILURE
            self.busy_since = time.monotonic()
            try:
                result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception:  # noqa: BLE001 - counted; the store has the points
                result = MetricExportResult.FAILURE
            finally:
                self.busy_since = None
            if result == MetricExportResult.SUCCESS:
                self.exported += 1
            else:
                self.failed += 1
                self.paused_until = time.monotonic() + PAUSE_AFTER_FAILURE_S
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return self.inner.force_flush(timeout_millis=timeout_millis)

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return Pausing()


class OtlpMetrics:
    """Records stored metric batches as OpenTelemetry instruments and exports them periodically.

    ``exporter``: a metric exporter (default: OTLP, :func:`probe.collectors.otlp.metric_exporter`);
    ``reader``: a metric reader instead of the periodic one (tests); ``interval_ms``: export
    period (default ``OTEL_METRIC_EXPORT_INTERVAL`` or :data:`DEFAULT_INTERVAL_MS`).
    """

    def __init__(self, exporter: Any = None, *, reader: Any = None, interval_ms: float | None = None,
                 address: str = "") -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self.describe = ""
        self.exporter: Any = None
        if reader is None:
            if exporter is None:
                from probe.collectors import otlp

                exporter = otlp.metric_exporter()
                self.describe = f"{otlp.endpoint('metrics')} ({otlp.protocol('metrics')})"
            if interval_ms is None:
                interval_ms = float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL") or DEFAULT_INTERVAL_MS)
            self.exporter = _pausing(exporter)
            reader = PeriodicExportingMetricReader(self.exporter, export_interval_millis=interval_ms)
        self.interval_ms = interval_ms
        attrs: dict[str, Any] = {}
        if address:
            attrs["probe.monitor.address"] = address
        name = os.environ.get("OTEL_SERVICE_NAME")
        if name or "service.name" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
            attrs["service.name"] = name or "probe-monitor"
        self.reader = reader
        self.provider = MeterProvider(resource=Resource.create(attrs), metric_readers=[reader],
                                      shutdown_on_exit=False)
        self.meter = self.provider.get_meter("probe.monitor")
        self.step_time = self.meter.create_histogram(
            "probe.step_time", unit="ms", description="Time of each training step, per rank")
        self.last_step = self.meter.create_gauge("probe.step", description="Last step a rank reported")
        self.points = self.meter.create_counter("probe.monitor.points", unit="{point}",
                                                description="Metric points stored by the monitor")
        self.recorded = 0
        self._gauges: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _gauge(self, name: str) -> Any:
        gauge = self._gauges.get(name)
        if gauge is None:
            with self._lock:
                gauge = self._gauges.get(name)
                if gauge is None:
                    gauge = self.meter.create_gauge(instrument_name(name), unit=_unit(name),
                                                    description=f"the ranks' {name}, at their last step")
                    self._gauges[name] = gauge
        return gauge

    def record(self, table: pa.Table) -> None:
        """Record one stored batch (a ``metric`` table: one job and rank, ``step``, ``name``,
        ``value`` columns)."""
        n = table.num_rows
        if not n or self._closed:
            return
        job = str(table.column("job")[0].as_py())
        rank = int(table.column("rank")[0].as_py())
        attrs = {"probe.job": job, "probe.rank": rank}
        names = table.column("name").combine_chunks()
        if isinstance(names, pa.DictionaryArray):
            codes = names.indices.to_numpy(zero_copy_only=False)
            labels = names.dictionary.to_pylist()
        else:
            labels, codes = np.unique(np.asarray(names.to_pylist(), dtype=object), return_inverse=True)
            labels = list(labels)
        steps = table.column("step").to_numpy()
        values = table.column("value").to_numpy()
        for code in np.unique(codes).tolist():
            at = np.flatnonzero(codes == code)
            name = labels[code]
            last = at[int(np.argmax(steps[at]))]            # the first of the highest step
            last = at[np.flatnonzero(steps[at] == steps[last])[-1]]
            self._gauge(name).set(float(values[last]), attrs)
            if name == "step_time_ms":
                for v in values[at].tolist():
                    if math.isfinite(v):
                        self.step_time.record(v, attrs)
        self.last_step.set(int(steps.max()), attrs)
        self.points.add(n, attrs)
        self.recorded += n

    def flush(self, timeout_ms: float = 10_000) -> bool:
        """Export what is recorded now."""
        return self.provider.force_flush(timeout_ms)

    def close(self) -> None:
        """Export what is left and stop the reader (at once when the collector is away: the
        exporter is shut first, which ends its retries)."""
        if not self._closed:
            self._closed = True
            if self.exporter is not None and self.exporter.failing:
                self.exporter.inner.shutdown(timeout_millis=1000)
            self.provider.shutdown()
