"""The monitor's detectors: pure functions over step and module tables that return alerts.

- :mod:`probe.monitor.detectors.step_detectors`: every step detector at once (``detect``), and the
  rules
- :mod:`probe.monitor.detectors.timing`: stragglers and slow steps
- :mod:`probe.monitor.detectors.health`: NaN/Inf and memory growth
- :mod:`probe.monitor.detectors.hang`: a collective some rank never entered
- :mod:`probe.monitor.detectors.noise_model`: the job's measured noise and the persistence test
- :mod:`probe.monitor.detectors.step_matrix`: the (step, rank) table the step detectors read
- :mod:`probe.monitor.detectors.step_series`: the series derived from it
- :mod:`probe.monitor.detectors.job_window`: a job's rolling window of steps
- :mod:`probe.monitor.detectors.numerics`: numerics anomalies per module
- :mod:`probe.monitor.detectors.numerics_evidence`: what a numerics alert says
- :mod:`probe.monitor.detectors.module_matrix`: the (step, rank, module) arrays they read
- :mod:`probe.monitor.detectors.numerics_window`: a job's rolling window of module numerics

They import neither :mod:`probe.monitor.service` nor :mod:`probe.monitor.agent`: each is testable on
a hand-made table.
"""
