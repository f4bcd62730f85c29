"""Monitor: the gRPC service, metric storage, detectors and the command channel to ranks.

- :mod:`monitor.proto`           the wire protocol (``monitor.proto``; stubs by grpcio-tools)
- :mod:`monitor.limits`          what one message may hold, agreed by both sides
- :mod:`monitor.service`         the gRPC servicer: checks each call, hands it on; serving
- :mod:`monitor.ingest`          decoding pushed batches, the writer thread's group commit
- :mod:`monitor.ranks`           the ranks registered and the commands waiting for each
- :mod:`monitor.detection`       the detector thread: alerts, and traces on alert
- :mod:`monitor.watchers`        live events to every ``Watch`` stream
- :mod:`monitor.trace_transfer`  trace files sent as chunks, uploads received
- :mod:`monitor.status`          the status document and each rank's health
- :mod:`monitor.storage`         the DuckDB store (one writer: the service process)
- :mod:`monitor.detectors`       slow steps, stragglers, NaN/Inf: pure functions over step tables
- :mod:`monitor.client`          the public client (``probe monitor``, the web UI)
- :mod:`monitor.auth`            token and TLS

The per-rank side: :mod:`monitor.agent` (the queue and the sender), :mod:`monitor.batch_packer`
(steps into columnar batches), :mod:`monitor.spool` (batches kept while the service is away),
:mod:`monitor.agent_connection` (registering, again after a loss), :mod:`monitor.command_listener`
(the command stream's thread), :mod:`monitor.host_sampler` (host CPU and memory),
:mod:`monitor.agent_callback` (the agent as a training callback). Quick start::

    probe monitor serve --port 50051 &
    PROBE_MONITOR=127.0.0.1:50051 probe train --nproc 4 --fault slow:2:3 --max-steps 50
    probe monitor status
    probe monitor trace --job train --ranks 0,2 --next 3 --wait --out traces/
"""
