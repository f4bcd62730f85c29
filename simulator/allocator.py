"""Level 2: the traced storages as an allocator serves them, with each op's workspace.

Storages are requested and released in trace order from the first training op on (those alive
then first, in the order made): at op ``k`` first those that died before it, then those it made, then its kernel's workspace (:mod:`probe.simulator.workspace`), taken and
given back inside the op; the first op with FLOPs also takes the matmul library's persistent
workspace. Two allocators:

- ``plain`` (a CPU's c10 allocator): a request is its own size; nothing is cached;
- ``caching`` (PyTorch's CUDA caching allocator, which Ascend's copies): requests round up to
  512 bytes; up to 1 MiB they come from the small pool, cut from 2 MiB segments; larger ones
  from the large pool, whose segments are 20 MiB for requests under 10 MiB and otherwise the
  request rounded up to 2 MiB; a free block is reused best-fit and split when the rest is at
  least 512 bytes (small) or more than 1 MiB (large); freed blocks merge with free neighbours
  and stay reserved (the cache). *Allocated* counts the blocks handed out (what
  ``torch.cuda.max_memory_allocated`` reports), *reserved* the segments (what the device gives).

Per-category factors shrink sharded storages (ZeRO), as :mod:`probe.simulator.ranks` asks.

>>> import numpy as np
>>> a = CachingAllocator()
>>> blocks = [a.malloc(1000) for _ in range(3)]
>>> a.allocated, a.reserved
(3072, 2097152)
>>> big = a.malloc(30 * 2**20); a.free(big); again = a.malloc(25 * 2**20)
>>> a.reserved // 2**20, a.allocated // 2**20
(32, 25)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from probe.simulator.memory import storage_arrays
from probe.simulator.trace import CATEGORIES, Trace

KB, MB = 1024, 1024 * 1024
ROUND, SMALL, SMALL_SEGMENT, LARGE_SEGMENT, MIN_LARGE_ALLOC, ROUND_LARGE = (
    512, 1 * MB, 2 * MB, 20 * MB, 10 * MB, 2 * MB)


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "free", "small")

    def __init__(self, addr: int, size: int, small: bool) -> None:
        self.addr, self.size, self.small = addr, size, small
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.free = True


class CachingAllocator:
    """The CUDA caching allocator's block and segment rules (see the module docstring)."""

    def __init__(self) -> None:
        self.allocated = self.reserved = 0
        self._pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._blocks: dict[int, _Block] = {}
        self._next_addr = 0

    def malloc(self, nbytes: int) -> _Block:
        size = ROUND if nbytes < ROUND else -(-nbytes // ROUND) * ROUND
        small = size <= SMALL
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = self._blocks[pool.pop(i)[1]]
        else:
            segment = SMALL_SEGMENT if small else (
                LARGE_SEGMENT if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE)
            block = _Block(self._next_addr, segment, small)
            self._next_addr += segment
            self.reserved += segment
            self._blocks[block.addr] = block
        rest = block.size - size
        if (rest >= ROUND) if small else (rest > SMALL):
            tail = _Block(block.addr + size, rest, small)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._blocks[tail.addr] = tail
            bisect.insort(pool, (tail.size, tail.addr))
        block.free = False
        self.allocated += block.size
        return block

    def free(self, block: _Block) -> None:
        self.allocated -= block.size
        block.free = True
        pool = self._pools[block.small]
        for other in (block.prev, block.next):
            if other is not None and other.free:
                pool.remove((other.size, other.addr))
                first, second = (other, block) if other is block.prev else (block, other)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                del self._blocks[second.addr]
                block = first
        bisect.insort(pool, (block.size, block.addr))


@dataclass
class AllocatorSeries:
    """Bytes allocated (most during each op) and reserved (after it), per op."""

    allocated: np.ndarray
    reserved: np.ndarray

    @property
    def peak_allocated(self) -> int:
        return int(self.allocated.max()) if len(self.allocated) else 0

    @property
    def peak_reserved(self) -> int:
        return int(self.reserved.max()) if len(self.reserved) else 0


def serve(trace: Trace, *, caching: bool, cuda_rules: bool, blas_workspace: int = 0,
          factors: dict[str, float] | None = None, start: int = 0) -> AllocatorSeries:
    """Replay ``trace``'s storages through an allocator (see the module docstring), from op
    ``start`` on: what lives then arrives first, in the order it was made (a model moved to its
    device), what came and went before it never reaches the device."""
    n = trace.n_ops
    nbytes, alloc, free, category = storage_arrays(trace)
    weights = np.array([(factors or {}).get(name, 1.0) for name in CATEGORIES])
    nbytes = np.ceil(nbytes * weights[category]).astype(np.int64)
    births = np.argsort(alloc, kind="stable")
    deaths = np.argsort(free, kind="stable")
    allocated = np.zeros(n, dtype=np.int64)
    reserved = np.zeros(n, dtype=np.int64)
    held: dict[int, object] = {}
    waiting: dict[int, None] = {}
    ws_index = 1 if cuda_rules else 0
    flops = trace.op_flops
    allocator = CachingAllocator() if caching else _Plain()
    b = d = 0
    blas_taken = blas_workspace == 0
    for k in range(n):
        while d < len(deaths) and free[deaths[d]] <= k:
            key = int(deaths[d])
            if key in held:
                allocator.free(held.pop(key))
            waiting.pop(key, None)
            d += 1
        while b < len(births) and alloc[births[b]] <= k:
            key = int(births[b])
            if nbytes[key] > 0 and free[key] > k:
                if k < start:
                    waiting[key] = None
                else:
                    held[key] = allocator.malloc(int(nbytes[key]))
            b += 1
        if k < start:
            continue
        for key in waiting:
            held[key] = allocator.malloc(int(nbytes[key]))
        waiting.clear()
        if not blas_taken and flops[k] > 0:
            allocator.malloc(blas_workspace)
            blas_taken = True
        top = allocator.allocated
        extra = trace.workspace.get(k)
        if extra is not None and extra[ws_index] > 0:
            block = allocator.malloc(extra[ws_index])
            top = allocator.allocated
            allocator.free(block)
        allocated[k] = top
        reserved[k] = allocator.reserved if caching else top
    return AllocatorSeries(allocated, reserved)


class _Plain:
    """An allocator that hands out exactly what is asked and keeps nothing."""

    def __init__(self) -> None:
        self.allocated = self.reserved = 0

    def malloc(self, nbytes: int) -> int:
        self.allocated += nbytes
        self.reserved = self.allocated
        return nbytes

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes
        self.reserved = self.allocated
