"""Memory an op takes inside its kernel, beyond its outputs: what a dispatcher-level trace misses.

Rules, each from how ATen (or the library it calls) runs the op:

- a reduction (``sum``, ``prod``, ``nansum``, ``mean``) whose accumulation dtype differs from
  its input's first converts the whole input (``make_reduction``: ``self.to(in_dtype)``), e.g.
  an int64 copy of a boolean mask being counted; CUDA skips the copy for a half or bfloat16
  input reduced in float32 (it converts on the fly);
- flash-attention backward on CUDA accumulates ``dq`` in float32, one float per element of
  ``q`` (FlashAttention-2's ``dq_accum``);
- the matmul library keeps a workspace once it has run (cuBLAS: a device's ``blas_workspace``),
  which :mod:`probe.simulator.allocator` adds at the first op with FLOPs.

>>> import torch
>>> mask = torch.ones(1000, dtype=torch.bool)
>>> op_workspace(torch.ops.aten.sum.default, [mask], [mask.sum()])
(8000, 8000)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

_REDUCTIONS = {"sum", "prod", "nansum", "mean"}
_FLASH_BACKWARD = {"_scaled_dot_product_flash_attention_backward",
                   "_scaled_dot_product_flash_attention_for_cpu_backward"}
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def op_workspace(func: Any, inputs: Sequence[torch.Tensor],
                 outputs: Sequence[torch.Tensor]) -> tuple[int, int]:
    """``(cpu, cuda)`` bytes ``func`` allocates inside its kernel (see the module docstring)."""
    name = getattr(getattr(func, "_overloadpacket", func), "__name__", "")
    if name in _REDUCTIONS and inputs and outputs:
        x, out = inputs[0], outputs[0]
        if x.dtype != out.dtype:
            cast = x.numel() * out.element_size()
            gpu = 0 if x.dtype in _LOW_PRECISION and out.dtype == torch.float32 else cast
            return cast, gpu
    if name in _FLASH_BACKWARD and len(inputs) > 1:
        return 0, inputs[1].numel() * 4
    return 0, 0
