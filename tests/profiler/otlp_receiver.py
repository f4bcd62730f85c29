"""A real OTLP receiver for tests: the official collector services over gRPC, and /v1/* over HTTP.

:class:`GrpcReceiver` serves ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` and
``opentelemetry.proto.collector.metrics.v1.MetricsService/Export`` (the ``opentelemetry-proto``
package's generated ``*_pb2_grpc`` modules) on 127.0.0.1, a free port; :class:`HttpReceiver`
takes ``POST /v1/traces`` and ``/v1/metrics`` (``application/x-protobuf``) with ``http.server``.
Both keep what arrives, with the time it arrived, decoded to plain Python:

- :attr:`spans`: dicts ``name``, ``trace_id``, ``span_id``, ``parent_span_id`` (hex; ``""``
  for a root), ``start``, ``end`` (Unix ns), ``attributes``, ``resource``, ``received``
  (``time.time_ns()``);
- :attr:`points`: dicts ``metric``, ``kind`` (gauge, sum, histogram), ``value`` (a histogram's
  count and sum as a tuple), ``attributes``, ``resource``, ``received``.

``on_export`` (optional) is called after each request is kept (the tests use it to touch a file
a running script waits for).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> dict."""
    return {kv.key: _value(kv.value) for kv in kvs}


class _Store:
    def __init__(self, on_export: Callable[[], None] | None = None) -> None:
        self.spans: list[dict] = []
        self.points: list[dict] = []
        self.requests = {"traces": 0, "metrics": 0}
        self.on_export = on_export
        self._cond = threading.Condition()

    def add_traces(self, request: Any) -> None:
        now = time.time_ns()
        got = []
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append({"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                "attributes": attributes(s.attributes), "resource": resource,
                                "scope": ss.scope.name, "received": now})
        with self._cond:
            self.spans.extend(got)
            self.requests["traces"] += 1
            self._cond.notify_all()
        if self.on_export is not None:
            self.on_export()

    def add_metrics(self, request: Any) -> None:
        now = time.time_ns()
        got = []
        for rm in request.resource_metrics:
            resource = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        if kind == "histogram":
                            value: Any = (p.count, p.sum)
                        else:
                            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                        got.append({"metric": m.name, "kind": kind, "unit": m.unit, "value": value,
                                    "attributes": attributes(p.attributes), "resource": resource,
                                    "received": now})
        with self._cond:
            self.points.extend(got)
            self.requests["metrics"] += 1
            self._cond.notify_all()
        if self.on_export is not None:
            self.on_export()

    def wait(self, predicate: Callable[["_Store"], Any], timeout: float = 20.0,
             what: str = "OTLP data") -> Any:
        """Wait (on the arrivals, no sleep) until ``predicate(self)`` is truthy; return it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}; got "
                                         f"{len(self.spans)} spans, {len(self.points)} points")
                self._cond.wait(min(left, 0.2))


class GrpcReceiver(_Store):
    """The official OTLP collector services on a gRPC server bound to 127.0.0.1 (free port)."""

    def __init__(self, on_export: Callable[[], None] | None = None) -> None:
        super().__init__(on_export)
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

        store = self

        class Traces(tgrpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the service's method name
                store.add_traces(request)
                return tpb.ExportTraceServiceResponse()

        class Metrics(mgrpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                store.add_metrics(request)
                return mpb.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        tgrpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        mgrpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard variables that point an OTLP exporter here."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}

    def stop(self) -> None:
        self.server.stop(0).wait()


class HttpReceiver(_Store):
    """``POST /v1/traces`` and ``/v1/metrics`` (protobuf bodies) on 127.0.0.1 (free port)."""

    def __init__(self, on_export: Callable[[], None] | None = None) -> None:
        super().__init__(on_export)
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb

        store = self
        self.paths: list[tuple[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                store.paths.append((self.path, self.headers.get("Content-Type", "")))
                if self.path == "/v1/traces":
                    store.add_traces(tpb.ExportTraceServiceRequest.FromString(body))
                    reply = tpb.ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    store.add_metrics(mpb.ExportMetricsServiceRequest.FromString(body))
                    reply = mpb.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
