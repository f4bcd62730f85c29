"""How long a collective takes, from its size, its group and the links between the ranks.

A group of ``n`` ranks runs on the slowest link it needs: inside a node (NVLink, HCCS) when all
its ranks share one (:meth:`~probe.simulator.layout.Layout.group_span` within ``ranks_per_node``),
else one rank's network link. Bandwidth terms are those of ring algorithms (NCCL's and HCCL's
for large messages), the latency term that of a tree (``2 * ceil(log2 n)`` link latencies):

- all-reduce: ``2 (n-1)/n * bytes``;
- reduce-scatter (``bytes``: the whole input): ``(n-1)/n * bytes``;
- all-gather (``bytes``: this rank's part): ``(n-1) * bytes``;
- broadcast, reduce, send, recv: ``bytes``.

>>> from probe.simulator.devices import get_device
>>> h100 = get_device("H100")
>>> round(comm_seconds("all_reduce", 10**9, 8, h100, crosses_nodes=False) * 1e3, 2)
3.95
>>> round(comm_seconds("all_reduce", 10**9, 64, h100, crosses_nodes=True) * 1e3, 2)
39.5
"""

from __future__ import annotations

import math

from probe.simulator.devices import Device
from probe.simulator.layout import Layout

_RING_ALL = {"all_reduce", "all_reduce_coalesced"}
_SCATTER = {"reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
            "all_to_all_single"}
_GATHER = {"all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced"}
_P2P = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}


def comm_seconds(op: str, nbytes: int, group_size: int, device: Device, *, crosses_nodes: bool) -> float:
    """Seconds of collective ``op`` moving ``nbytes`` in a group of ``group_size`` ranks."""
    n = group_size
    if n <= 1:
        return 0.0
    bandwidth = device.link_inter_bw if crosses_nodes else device.link_intra_bw
    latency = device.link_latency_s * 2 * math.ceil(math.log2(n))
    if op in _RING_ALL:
        volume = 2 * (n - 1) / n * nbytes
    elif op in _SCATTER:
        volume = (n - 1) / n * nbytes
    elif op in _GATHER:
        volume = (n - 1) * nbytes
    elif op in _P2P:
        volume, latency = nbytes, device.link_latency_s
    elif op in ("barrier", "monitored_barrier"):
        volume = 0
    else:
        volume = nbytes
    return volume / bandwidth + latency


def group_crosses_nodes(group: str, layout: Layout, device: Device) -> bool:
    """Whether one ``group`` (``tp``, ``dp``, ``pp``) of ``layout`` needs more than one node."""
    return layout.group_span(group) > device.ranks_per_node
