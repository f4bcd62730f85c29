"""PyTorch tensor statistics: one stacked reduction per tensor, on its device, one gather per step.

For a floating tensor the statistics are ``[max, min, sum, sumsq, nan_count, inf_count]``,
computed where the tensor lives:

- on an accelerator, one stacked reduction per tensor (``aminmax``, ``sum``, a dot product for
  the sum of squares, NaN and Inf counts) left on the device as a handle; nothing reaches the
  host until :meth:`TorchStats.gather` stacks every handle of the step and reads it with one
  ``tolist()`` per device: no host-device synchronisation per tensor;
- on the CPU the tensor already is on the host: the same numbers are read through a zero-copy
  NumPy view (SIMD ``max``/``min``, BLAS dot) plus one ``torch.sum``, and the NaN/Inf counts
  are only computed when the sum is not finite (counting is the slowest pass). The handle is
  then the finished list.

>>> import torch
>>> s = TorchStats()
>>> t = torch.tensor([1.0, -2.0, float("inf")])
>>> s.gather([s.reduce(t, s.describe(t).kind)])[0]
[inf, -2.0, inf, inf, 0.0, 1.0]
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Sequence

import numpy as np
import torch

from engine_adapter.base import FLOAT, INTEGER, OPAQUE, StatsBackend, TensorMeta

_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_INTS = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _FLOATS.add(getattr(torch, _name))
_NATIVE = {torch.float32, torch.float64}
_DTYPE_STR: dict[torch.dtype, str] = {}


def _dtype_str(dtype: torch.dtype) -> str:
    s = _DTYPE_STR.get(dtype)
    if s is None:
        s = _DTYPE_STR[dtype] = str(dtype)
    return s


class TorchStats(StatsBackend):
    """:class:`~engine_adapter.base.StatsBackend` for ``torch.Tensor``."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def describe(self, t: torch.Tensor) -> TensorMeta:
        dtype = t.dtype
        numel = t.numel()
        if numel == 0 or t.is_quantized or t.is_sparse or t.layout != torch.strided:
            kind = OPAQUE
        elif dtype in _FLOATS:
            kind = FLOAT
        elif dtype in _INTS:
            kind = INTEGER
        else:
            kind = OPAQUE
        return TensorMeta("torch.Tensor", _dtype_str(dtype), tuple(t.shape), numel,
                          bool(t.requires_grad), kind)

    def identity(self, t: torch.Tensor) -> tuple[int, int]:
        return id(t), t._version

    def reduce(self, t: torch.Tensor, kind: str) -> torch.Tensor | list[float] | None:
        if kind == OPAQUE:
            return None
        x = t.detach()
        if x.is_cpu:
            return _reduce_host(x, kind)
        with torch.no_grad():
            x = x.reshape(-1)
            if kind == INTEGER:
                mn, mx = torch.aminmax(x)
                return torch.stack([mx, mn]).to(torch.float64)
            if x.dtype not in _NATIVE:
                x = x.float()
            mn, mx = torch.aminmax(x)
            return torch.stack([mx, mn, x.sum(), torch.dot(x, x), torch.isnan(x).sum().to(x.dtype),
                                torch.isinf(x).sum().to(x.dtype)])

    def gather(self, handles: Sequence[Any]) -> list[list[float] | None]:
        by_device: dict[torch.device, list[int]] = {}
        out: list[list[float] | None] = [None] * len(handles)
        for i, h in enumerate(handles):
            if isinstance(h, list):
                out[i] = h
            elif h is not None:
                by_device.setdefault(h.device, []).append(i)
        for idx in by_device.values():
            floats = [i for i in idx if handles[i].numel() == 6]
            ints = [i for i in idx if handles[i].numel() != 6]
            for group in (floats, ints):
                if not group:
                    continue
                values = torch.stack([handles[i].to(torch.float64) for i in group]).tolist()
                for i, v in zip(group, values):
                    out[i] = v
        return out

    def digest(self, t: torch.Tensor) -> str:
        x = t.detach()
        if not x.is_cpu:
            x = x.cpu()
        x = x.contiguous()
        if x.dtype in (torch.bfloat16,) or not _numpy_ok(x.dtype):
            x = x.view(torch.int16) if x.element_size() == 2 else x.view(torch.uint8)
        arr = x.numpy()
        return f"{zlib.crc32(memoryview(arr).cast('B')) & 0xFFFFFFFF:08x}"

    def save(self, tensors: dict[str, Any], path: str) -> None:
        from safetensors.torch import save_file
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, path)

    def scalar_type(self, x: Any) -> str | None:
        if isinstance(x, torch.dtype):
            return "torch.dtype"
        if isinstance(x, torch.device):
            return "torch.device"
        if isinstance(x, torch.Size):
            return "torch.Size"
        return None


def _reduce_host(x: torch.Tensor, kind: str) -> list[float]:
    """Statistics of a CPU tensor, read through a zero-copy NumPy view."""
    if kind == FLOAT and x.dtype not in _NATIVE:
        x = x.float()
    if not x.is_contiguous():
        x = x.contiguous()
    a = x.numpy().reshape(-1)
    if kind == INTEGER:
        return [float(a.max()), float(a.min())]
    s = float(x.sum())
    if math.isfinite(s):
        return [float(a.max()), float(a.min()), s, float(np.dot(a, a)), 0.0, 0.0]
    return [float(a.max()), float(a.min()), s, float(np.dot(a, a)),
            float(np.count_nonzero(np.isnan(a))), float(np.count_nonzero(np.isinf(a)))]


def _numpy_ok(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.float32, torch.float64, torch.bool, *_INTS)
