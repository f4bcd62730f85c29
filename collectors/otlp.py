"""OTLP exporters, configured the standard way: the ``OTEL_EXPORTER_OTLP_*`` environment variables.

The official exporters (``opentelemetry-exporter-otlp``: ``-proto-grpc`` and ``-proto-http``)
are an optional extra, ``pip install 'probe-toolchain[otlp]'``; they are imported only when
OTLP is asked for. Each exporter reads its own settings from the environment:

- ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` or ``http/protobuf``, the default as the
  specification says) or per signal ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
  ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL``: which exporter is built (read here);
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4317`` for gRPC,
  ``http://localhost:4318`` for HTTP, where ``/v1/traces`` or ``/v1/metrics`` is appended) or
  per signal ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``..._METRICS_ENDPOINT`` (used as is);
- ``OTEL_EXPORTER_OTLP_HEADERS`` (``key=value,key2=value2``), ``..._TIMEOUT``,
  ``..._COMPRESSION``, ``..._CERTIFICATE``, ``..._INSECURE`` and their per-signal forms.

>>> import os
>>> os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)
>>> protocol("traces", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
'grpc'
>>> protocol("metrics", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
...                      "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"})
'http/protobuf'
>>> protocol("traces", {})
'http/protobuf'
>>> endpoint("traces", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
'http://collector:4318/v1/traces'
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

from probe.ground.errors import ProbeError

#: The protocols the official Python exporters speak.
PROTOCOLS = ("grpc", "http/protobuf")
#: What to install for OTLP export.
PIP_HINT = "pip install 'probe-toolchain[otlp]' (or: pip install opentelemetry-exporter-otlp)"

_MODULES = {
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
}
_DEFAULT_ENDPOINT = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}


def protocol(signal: str, env: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol for ``signal`` (``traces`` or ``metrics``) the environment asks for."""
    env = os.environ if env is None else env
    value = (env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
             or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if value not in PROTOCOLS:
        raise ProbeError(f"OTEL_EXPORTER_OTLP_PROTOCOL {value!r}: use grpc or http/protobuf "
                         "(the Python exporters have no http/json)")
    return value


def endpoint(signal: str, env: Mapping[str, str] | None = None) -> str:
    """Where ``signal`` goes, as the exporter works it out (for messages)."""
    env = os.environ if env is None else env
    own = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    if own:
        return own
    proto = protocol(signal, env)
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _DEFAULT_ENDPOINT[proto]
    return base if proto == "grpc" else base.rstrip("/") + f"/v1/{signal}"


def exporter_class(signal: str) -> Any:
    """The official exporter class for ``signal`` and the configured protocol; a
    :class:`ProbeError` that says what to install when it is missing."""
    proto = protocol(signal)
    module, name = _MODULES[(signal, proto)]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ProbeError(f"OTLP export ({proto}) needs the OpenTelemetry OTLP exporter, which is "
                         f"not installed ({e.name or e}): {PIP_HINT}") from None


def require(*signals: str) -> None:
    """Fail early, with one line, when OTLP export of ``signals`` could not work."""
    for signal in signals or ("traces",):
        exporter_class(signal)


def span_exporter() -> Any:
    """An OTLP span exporter configured by the environment."""
    return exporter_class("traces")()


def metric_exporter() -> Any:
    """An OTLP metric exporter configured by the environment."""
    return exporter_class("metrics")()
