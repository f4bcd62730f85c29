"""Monitor: the gRPC service, metric storage, detectors and the command channel to ranks.

- :mod:`probe.monitor.proto`           the wire protocol (``monitor.proto``; stubs by grpcio-tools)
- :mod:`probe.monitor.limits`          what one message may hold, agreed by both sides
- :mod:`probe.monitor.service`         the gRPC servicer: checks each call, hands it on; serving
- :mod:`probe.monitor.ingest`          decoding pushed batches, the writer thread's group commit
- :mod:`probe.monitor.ranks`           the ranks registered and the commands waiting for each
- :mod:`probe.monitor.detection`       the detector thread: alerts, and traces on alert
- :mod:`probe.monitor.watchers`        live events to every ``Watch`` stream
- :mod:`probe.monitor.trace_transfer`  trace files sent as chunks, uploads received
- :mod:`probe.monitor.status`          the status document and each rank's health
- :mod:`probe.monitor.storage`         the DuckDB store (one writer: the service process)
- :mod:`probe.monitor.detectors`       slow steps, stragglers, NaN/Inf: pure functions over step tables
- :mod:`probe.monitor.client`          the public client (``probe monitor``, the web UI)
- :mod:`probe.monitor.auth`            token and TLS

The per-rank side: :mod:`probe.monitor.agent` (the queue and the sender), :mod:`probe.monitor.batch_packer`
(steps into columnar batches), :mod:`probe.monitor.spool` (batches kept while the service is away),
:mod:`probe.monitor.agent_connection` (registering, again after a loss), :mod:`probe.monitor.command_listener`
(the command stream's thread), :mod:`probe.monitor.host_sampler` (host CPU and memory),
:mod:`probe.monitor.agent_callback` (the agent as a training callback). Quick start::

    probe monitor serve --port 50051 &
    PROBE_MONITOR=127.0.0.1:50051 probe train --nproc 4 --fault slow:2:3 --max-steps 50
    probe monitor status
    probe monitor trace --job train --ranks 0,2 --next 3 --wait --out traces/
"""
