"""The per-rank side of the monitor: what runs inside every training rank (and may import torch).

- :mod:`probe.monitor.agent.monitor_agent`: the agent: a bounded queue and the sender thread
- :mod:`probe.monitor.agent.batch_packer`: steps into columnar batches
- :mod:`probe.monitor.agent.spool`: batches kept on disk while the service is away
- :mod:`probe.monitor.agent.connection`: registering, again after a loss
- :mod:`probe.monitor.agent.command_listener`: the command stream's thread
- :mod:`probe.monitor.agent.requests`: what the service asks of a rank and what it sends back
- :mod:`probe.monitor.agent.host_sampler`: host CPU and memory
- :mod:`probe.monitor.agent.callback`: the agent as a training callback
- :mod:`probe.monitor.agent.numerics_callback`: per-module numerics each step, sent through the
  agent
- :mod:`probe.monitor.agent.dump_runner`: targeted dumps run on the training thread

It speaks to the service only over the wire (the shared modules of :mod:`probe.monitor`); it
never imports :mod:`probe.monitor.service`. Messages go to ``logging`` (loggers under
``probe.monitor.agent``), never to the user's stderr directly.
"""
