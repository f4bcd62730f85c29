"""Monitor: the gRPC service, metric storage, detectors and the command channel to ranks.

Three programs, each a subpackage, and what they share at this level:

- :mod:`probe.monitor.service`    the gRPC service and its DuckDB store: ingest, ranks, detection
  thread, commands to ranks, status, trace uploads, exports (one process: ``probe monitor serve``)
- :mod:`probe.monitor.agent`      what runs inside every training rank: the agent that streams
  metrics, spools and takes commands, and the training callbacks (may import torch)
- :mod:`probe.monitor.detectors`  pure functions over step and module tables: slow steps,
  stragglers, NaN/Inf, memory growth, hangs, numerics anomalies, and their rolling windows

Shared by both sides (none of them imports a subpackage; the agent never imports the service,
the service never imports the agent, and the detectors import neither):

- :mod:`probe.monitor.proto`           the wire protocol (``monitor.proto``; stubs by grpcio-tools)
- :mod:`probe.monitor.limits`          what one message may hold, agreed by both sides
- :mod:`probe.monitor.auth`            token and TLS
- :mod:`probe.monitor.address`         where the service is (env ``PROBE_MONITOR``)
- :mod:`probe.monitor.alert_kinds`     the one table of alert kinds (service, CLI help, web banner)
- :mod:`probe.monitor.trace_transfer`  trace files as chunks; a wire name made a safe path
- :mod:`probe.monitor.targeted_dump`   a targeted dump's order and schedule
- :mod:`probe.monitor.numerics_names`  the names of per-module numerics points
- :mod:`probe.monitor.client`          the public client (``probe monitor``, the web UI)

Quick start::

    probe monitor serve --port 50051 &
    PROBE_MONITOR=127.0.0.1:50051 probe train --nproc 4 --fault slow:2:3 --max-steps 50
    probe monitor status
    probe monitor trace --job train --ranks 0,2 --next 3 --wait --out traces/
"""
