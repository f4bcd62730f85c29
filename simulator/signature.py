"""An op's call signature, kept so the op can be run again for real (:mod:`probe.simulator.replay`).

Tensors become :class:`TensorSpec` (shape, strides, storage offset, dtype); generators are
dropped (a replay draws from the default one); every other argument is kept as it is.

>>> import torch
>>> sig = signature(torch.ops.aten.mm.default, (torch.ones(2, 3), torch.ones(3, 4).t()), {})
>>> sig[1][1]
TensorSpec(shape=(4, 3), stride=(1, 4), offset=0, dtype=torch.float32)
>>> signature_key(sig).startswith("aten.mm.default")
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorSpec:
    """What a replay needs to make a real tensor like a traced one."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


def _spec(value: Any) -> Any:
    """``value`` with tensors as :class:`TensorSpec` and generators dropped (replays draw from
    the default one)."""
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_spec(v) for v in value)
    if isinstance(value, torch.Generator):
        return None
    return value


def signature(func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """``(func, args, kwargs)`` with tensors as :class:`TensorSpec` (see the module docstring)."""
    return func, _spec(args), {k: _spec(v) for k, v in kwargs.items()}


def signature_key(sig: tuple[Any, tuple, dict]) -> str:
    """A string equal for equal signatures (the replay cache's key)."""
    func, args, kwargs = sig
    return f"{func}{args}{sorted(kwargs.items())}"
