"""What was traced, for whom: a traced rank that stands for a set of ranks.

A simulation traces as few ranks as give every rank's figures: data-parallel peers hold the
same (ZeRO's sharding is applied to the figures, :mod:`probe.simulator.ranks`), tensor-parallel peers
too; pipeline stages differ (what they hold, how many microbatches they keep in flight), so
there is one :class:`RankTrace` per stage, sharing the :class:`~probe.simulator.trace.Trace` of
stages that hold the same layers.

>>> from probe.simulator.trace import Trace
>>> rt = RankTrace(label="stage 1 of 4", ranks=[2, 3], trace=Trace(), in_flight=3)
>>> rt.ranks, rt.in_flight, rt.timed_step
([2, 3], 3, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.simulator.trace import Trace


@dataclass
class RankTrace:
    """A traced rank and the ranks whose figures it gives.

    ``timed_step``: the optimizer step whose ops are timed (the second: optimizer state exists);
    ``in_flight``: microbatches whose activations the rank holds at once (1F1B: ``pp - stage``);
    ``windows``: per traced step, (forward start, forward end, backward end) op counts of its one
    traced microbatch (used to hold the other in-flight microbatches' activations);
    ``holds``: what part of the model it holds, in words; ``stage``/``first``/``last``: its
    pipeline position; ``dp_sync``: ``after_backward`` (the
    bundled engine syncs gradients once backward is done) or ``overlapped`` (a script's DDP).
    """

    label: str
    ranks: list[int]
    trace: Trace
    timed_step: int = 1
    in_flight: int = 1
    windows: list[tuple[int, int, int]] = field(default_factory=list)
    holds: str = "the whole model"
    stage: int = 0
    first: bool = True
    last: bool = True
    dp_sync: str = "after_backward"


@dataclass
class Traced:
    """Everything a workload's tracing produced."""

    ranks: list[RankTrace]
    params: int                         # exact parameter count of the whole model
    dtype: str                          # the model's compute dtype
    describe: dict                      # what was simulated, for simulation.json
    notes: list[str] = field(default_factory=list)
