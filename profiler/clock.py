"""Rank clock alignment: measure each rank's host-clock offset to rank 0 at session start.

After a barrier, rank 0 exchanges timestamps with every other rank in turn, NTP style: the
rank sends its clock ``t1``, rank 0 answers with its clock ``t2``, the rank reads ``t3`` on
receipt. ``offset = t2 - (t1 + t3) / 2`` maps this rank's ``time.perf_counter_ns`` onto rank 0's,
with an error of at most half the round trip; of several rounds the one with the shortest
round trip is kept (a round where a process was descheduled is thrown away). All ranks must
call :func:`measure_offset` together (it is a collective); with no process group, or one rank,
the offset is 0.

>>> measure_offset()
0
"""

from __future__ import annotations

import sys
import time

ROUNDS = 8


def measure_offset(rounds: int = ROUNDS) -> int:
    """This rank's clock offset to rank 0 of the default group in ns (add it to local times)."""
    if not group_is_up():
        return 0
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    world, rank = dist.get_world_size(), dist.get_rank()
    if world <= 1:
        return 0
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    # the unwrapped functions: alignment is not user communication
    barrier = getattr(c10d.barrier, "__wrapped__", c10d.barrier)
    send = getattr(c10d.send, "__wrapped__", c10d.send)
    recv = getattr(c10d.recv, "__wrapped__", c10d.recv)
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    barrier()
    best = (None, 0)                                   # (round trip, offset)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                recv(buf, src=peer)
                buf.fill_(time.perf_counter_ns())
                send(buf, dst=peer)
    else:
        for _ in range(rounds):
            t1 = time.perf_counter_ns()
            buf.fill_(t1)
            send(buf, dst=0)
            recv(buf, src=0)
            t3 = time.perf_counter_ns()
            t2 = int(buf.item())
            rtt = t3 - t1
            if best[0] is None or rtt < best[0]:
                best = (rtt, t2 - (t1 + t3) // 2)
    barrier()
    return best[1]


def group_is_up() -> bool:
    """True when ``torch.distributed``'s default process group exists (torch is not imported).

    >>> group_is_up()
    False
    """
    if "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def epoch_offset_ns() -> int:
    """Add to a ``perf_counter_ns`` reading to get Unix-epoch ns (for OpenTelemetry)."""
    a = time.perf_counter_ns()
    e = time.time_ns()
    b = time.perf_counter_ns()
    return e - (a + b) // 2
