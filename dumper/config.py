"""What a dump records: its level, task and filters, checked once when it is made.

>>> DumpConfig(out="runs/d", level="mix").task
'statistics'
>>> DumpConfig(level="L9")
Traceback (most recent call last):
...
probe.ground.errors.ProbeError: --level 'L9': use one of module, api, mix
>>> DumpConfig(task="check")
Traceback (most recent call last):
...
probe.ground.errors.ProbeError: --task check replays API calls: use --level api or mix
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from probe.ground.errors import ProbeError

LEVELS = ("module", "api", "mix")
TASKS = ("statistics", "tensor", "md5", "check", "overflow")
#: tasks with a recorder of their own (probe.dumper.check, probe.dumper.overflow)
WATCH_TASKS = ("check", "overflow")
GOLDENS = ("cpu-fp64", "cpu-fp32", "cuda-fp64")
#: the tensor task's file formats: ``msprobe`` writes what msprobe's own dump writes and its
#: compare reads (``.pt`` through ``torch.save`` for PyTorch, ``.npy`` for MindSpore);
#: ``safetensors`` writes one ``.safetensors`` file per tensor (no pickle in the file)
TENSOR_FORMATS = ("msprobe", "safetensors")


@dataclass
class DumpConfig:
    """What to dump: level, task and filters (``None`` selects everything)."""

    out: str = "dump"
    level: str = "module"
    task: str = "statistics"
    steps: Sequence[int] | None = None
    ranks: Sequence[int] | None = None
    scope: str | None = None          # regex searched in each entry's name
    names: Sequence[str] | None = None  # module paths, class names or API names to keep
    stack: bool = True
    run: str | None = None
    #: the store's records are made durable at the end of a step at most this often (seconds;
    #: 0 = every step). The msprobe files are always written every step; a crash loses at most
    #: this long of store records. Fast steps otherwise pay a Parquet segment per step.
    store_flush_s: float = 1.0
    #: ``step``: each finished step's msprobe files (and tensor files) are forced to disk by the
    #: writer thread; ``never``: left to the operating system (``--fsync``)
    fsync: str = "step"
    #: ``overflow``: stop watching after this many calls overflowed (each one's tensors written)
    max_hits: int = 1
    #: ``check``: where and in what precision the golden runs
    golden: str = "cpu-fp64"
    #: ``tensor``: the file format of the tensors (:data:`TENSOR_FORMATS`)
    tensor_format: str = "msprobe"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ProbeError(f"--level {self.level!r}: use one of {', '.join(LEVELS)}")
        if self.task not in TASKS:
            raise ProbeError(f"--task {self.task!r}: use one of {', '.join(TASKS)}")
        if self.task == "check" and self.level == "module":
            raise ProbeError("--task check replays API calls: use --level api or mix")
        if self.golden not in GOLDENS:
            raise ProbeError(f"--golden {self.golden!r}: use one of {', '.join(GOLDENS)}")
        if self.tensor_format not in TENSOR_FORMATS:
            raise ProbeError(f"--tensor-format {self.tensor_format!r}: use one of {', '.join(TENSOR_FORMATS)}")
        if isinstance(self.max_hits, bool) or not isinstance(self.max_hits, int) or self.max_hits < 1:
            raise ProbeError(f"--max-hits {self.max_hits!r}: give a whole number of at least 1")
        from probe.collectors.store import FSYNC_MODES
        if self.fsync not in FSYNC_MODES:
            raise ProbeError(f"--fsync {self.fsync!r}: use one of {', '.join(FSYNC_MODES)}")
        if self.scope:
            try:
                re.compile(self.scope)
            except re.error as e:
                raise ProbeError(f"--scope {self.scope!r}: not a regular expression ({e})") from None
