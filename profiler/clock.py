"""Rank clock alignment: measure each rank's host-clock offset to rank 0 by a barrier exchange.

Every rank leaves a barrier at nearly the same instant; each reads its clock right after it,
and the readings are all-gathered. ``offset = t_rank0 - t_this_rank`` maps this rank's
``time.perf_counter_ns`` onto rank 0's. Several rounds are taken and the median kept, which
rejects a round where one rank was descheduled. All ranks must call :func:`measure_offset`
together (it is a collective); with no process group, or one rank, the offset is 0.

>>> measure_offset()
0
"""

from __future__ import annotations

import statistics
import time
from typing import Any

ROUNDS = 7


def measure_offset(group: Any = None, rounds: int = ROUNDS) -> int:
    """This rank's clock offset to rank 0 of ``group`` in ns (add it to local timestamps)."""
    import sys

    if "torch" not in sys.modules:
        return 0
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not (dist.is_available() and dist.is_initialized()):
        return 0
    world = dist.get_world_size(group)
    if world <= 1:
        return 0
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    # the unwrapped functions: alignment is not user communication
    barrier = getattr(c10d.barrier, "__wrapped__", c10d.barrier)
    all_gather = getattr(c10d.all_gather, "__wrapped__", c10d.all_gather)
    offsets = []
    for _ in range(rounds):
        barrier(group=group)
        t = time.perf_counter_ns()
        mine = torch.tensor([t], dtype=torch.int64, device=device)
        out = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world)]
        all_gather(out, mine, group=group)
        offsets.append(int(out[0].item()) - t)
    return int(statistics.median(offsets))


def epoch_offset_ns() -> int:
    """Add to a ``perf_counter_ns`` reading to get Unix-epoch ns (for OpenTelemetry)."""
    a = time.perf_counter_ns()
    e = time.time_ns()
    b = time.perf_counter_ns()
    return e - (a + b) // 2
