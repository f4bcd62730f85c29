"""The parallel layout of a simulated job: how many ranks, how they split the work, what each holds.

Ranks are numbered as Megatron-LM numbers them: tensor-parallel peers adjacent, then data
parallel, then pipeline stages (``rank = (stage * dp + d) * tp + t``), so a tensor-parallel group
stays inside a node while there is room. ZeRO stages shard, over the data-parallel group: 1 the
optimizer state, 2 also the gradients, 3 also the parameters.

>>> lay = make_layout(nproc=16, tp=2, pp=2, zero=1, global_batch=8, micro_batch=1)
>>> lay.dp, lay.microbatches, lay.coords(5)
(4, 2, (0, 2, 1))
>>> lay.group_span("tp"), lay.group_span("dp")
(2, 7)
>>> make_layout(nproc=6, dp=4, tp=1, pp=1, zero=0, global_batch=8, micro_batch=2)
Traceback (most recent call last):
probe.ground.errors.ProbeError: --nproc 6 is not --dp 4 x --tp 1 x --pp 1 = 4; give --nproc equal to their product (or leave one out)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from probe.ground.errors import ProbeError


@dataclass(frozen=True)
class Layout:
    """A checked parallel layout (see the module docstring)."""

    nproc: int
    dp: int
    tp: int
    pp: int
    zero: int
    global_batch: int       # sequences per optimizer step over all ranks
    micro_batch: int        # sequences per forward/backward of one rank

    @property
    def microbatches(self) -> int:
        """Forward/backward passes of one rank per step (gradient accumulation, pipeline fill)."""
        return self.global_batch // (self.dp * self.micro_batch)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(pipeline stage, data-parallel index, tensor-parallel index)`` of ``rank``."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def stage_ranks(self, stage: int) -> list[int]:
        """Every rank of pipeline ``stage``."""
        per = self.dp * self.tp
        return list(range(stage * per, (stage + 1) * per))

    def group_span(self, group: str) -> int:
        """How many consecutive ranks one ``group`` (``tp``, ``dp``, ``pp``) reaches across."""
        size, stride = {"tp": (self.tp, 1), "dp": (self.dp, self.tp),
                        "pp": (self.pp, self.tp * self.dp)}[group]
        return (size - 1) * stride + 1

    def group_size(self, group: str) -> int:
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp}[group]

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "microbatches": self.microbatches}


def global_batch_for(preset_batch: int, dp: int, micro_batch: int | None) -> tuple[int, str | None]:
    """The preset's global batch, raised to the next multiple of ``dp * micro_batch`` when it
    does not split into whole sequences per rank; and a note saying so.

    >>> batch, note = global_batch_for(4, 1024, None)
    >>> batch, note.split(":")[0]
    (1024, "global batch raised from 4 (the preset's) to 1024")
    """
    unit = dp * (micro_batch or 1)
    if preset_batch % unit == 0:
        return preset_batch, None
    raised = -(-preset_batch // unit) * unit
    return raised, (f"global batch raised from {preset_batch} (the preset's) to {raised}: whole micro "
                    f"batches of {micro_batch or 1} sequence(s) on each of {dp} data-parallel ranks; "
                    "set --global-batch to choose")


def make_layout(*, nproc: int | None = None, dp: int | None = None, tp: int = 1, pp: int = 1,
                zero: int = 0, global_batch: int, micro_batch: int | None = None) -> Layout:
    """A checked :class:`Layout`; a one-line ProbeError for an impossible one.

    ``dp`` defaults to ``nproc / (tp * pp)``, ``nproc`` to ``dp * tp * pp``; ``micro_batch``
    to one sequence with a pipeline, else the whole per-rank batch.
    """
    for name, value in (("--nproc", nproc), ("--dp", dp), ("--tp", tp), ("--pp", pp)):
        if value is not None and value < 1:
            raise ProbeError(f"{name} {value}: give a positive number of ranks")
    if zero not in (0, 1, 2, 3):
        raise ProbeError(f"--zero {zero}: ZeRO stages are 0, 1, 2 and 3")
    if dp is None:
        nproc = nproc or tp * pp
        if nproc % (tp * pp):
            raise ProbeError(f"--nproc {nproc} does not split into --tp {tp} x --pp {pp} "
                             f"({tp * pp} ranks per data-parallel replica)")
        dp = nproc // (tp * pp)
    elif nproc is None:
        nproc = dp * tp * pp
    if nproc != dp * tp * pp:
        raise ProbeError(f"--nproc {nproc} is not --dp {dp} x --tp {tp} x --pp {pp} = {dp * tp * pp}; "
                         "give --nproc equal to their product (or leave one out)")
    if micro_batch is None:
        micro_batch = 1 if pp > 1 else max(1, global_batch // dp)
    if micro_batch < 1 or global_batch % (dp * micro_batch):
        raise ProbeError(f"global batch {global_batch} does not split into --dp {dp} x micro batch "
                         f"{micro_batch}; give --global-batch a multiple of {dp * micro_batch}")
    return Layout(nproc=nproc, dp=dp, tp=tp, pp=pp, zero=zero, global_batch=global_batch,
                  micro_batch=micro_batch)
