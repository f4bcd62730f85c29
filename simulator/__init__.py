"""Simulated training: will a model, a batch and a parallel layout fit, and how fast is a step.

A training step runs on fake tensors (``FakeTensorMode``: shapes, no storage), traced op by op
(:mod:`probe.simulator.trace`); memory, allocator effects and time are derived from that trace for
every rank of a layout without running the ranks (:mod:`probe.simulator.ranks`), at MindSpore's
simulation levels 0-3 (:mod:`probe.simulator.simulation`). ``probe simulate`` is the command;
``docs/simulate.md`` the guide.
"""
