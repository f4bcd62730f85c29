"""The monitor service: one gRPC server that ingests metric batches, detects, and commands ranks.

- :mod:`probe.monitor.service.server`: the gRPC servicer: checks each call, hands it on; serving
- :mod:`probe.monitor.service.ingest`: decoding pushed batches, the writer thread's group commit
- :mod:`probe.monitor.service.storage`: the DuckDB store (one writer: the service process)
- :mod:`probe.monitor.service.ranks`: the ranks registered and the commands waiting for each
- :mod:`probe.monitor.service.detection`: the detector thread: alerts, and traces on alert
- :mod:`probe.monitor.service.watchers`: live events to every ``Watch`` stream
- :mod:`probe.monitor.service.remote_control`: commands to ranks: traces, dumps, stacks, settings
- :mod:`probe.monitor.service.trace_upload`: a rank's trace files received and recorded
- :mod:`probe.monitor.service.status`: the status document and each rank's health
- :mod:`probe.monitor.service.otlp_metrics`: stored points as OpenTelemetry metrics (``--otlp``)
- :mod:`probe.monitor.service.tensorboard_export`: stored points as TensorBoard scalars

It imports the detectors (:mod:`probe.monitor.detectors`) and the shared modules of
:mod:`probe.monitor`, never the agent.
"""
