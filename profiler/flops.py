"""FLOPs of what a step runs, and model/hardware FLOPs utilisation (MFU/HFU).

:class:`FlopCounter` is a ``TorchDispatchMode``: every aten op that reaches the dispatcher is
counted by the formula table of ``torch.utils.flop_counter`` (matmuls, convolutions, every
scaled-dot-product-attention kernel), extended with the CPU flash-attention kernels. So fused
code and code that a compiler lowered to aten kernels are counted by what they run, not by
what the model's Python says.

Two totals are kept:

- **hardware FLOPs**: everything executed, recomputation included (activation checkpointing
  re-running forward ops during backward; attention backward kernels re-computing scores);
- **model FLOPs**: the same without recomputation, i.e. what the model needs (forward +
  backward = 3x forward for matmuls), the numerator of MFU.

An op runs as recomputation when it runs inside the autograd engine's backward pass with grad
mode on (as checkpointing does); attention backward kernels count their score recomputation
as hardware FLOPs only.

``MFU = model_flops / (step_time_s * peak_flops)``, ``HFU = hardware_flops / (...)``, with the
peak given by the user or looked up in :data:`PEAK_TFLOPS` (GPUs by name and dtype; a CPU has
no table entry: pass ``peak_tflops``).

>>> import torch
>>> lin = torch.nn.Linear(64, 32, bias=False)
>>> with FlopCounter() as fc:
...     lin(torch.randn(8, 64, requires_grad=True)).sum().backward()
>>> fc.model_flops == 3 * 2 * 8 * 64 * 32, fc.hardware_flops == fc.model_flops
(True, True)
>>> round(utilisation(fc.model_flops, step_time_s=1e-3, peak_flops=1e9), 3)
0.098
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import bmm_flop, flop_registry

aten = torch.ops.aten

#: Dense peak TFLOP/s per device (the first key found in ``torch.cuda.get_device_name``) and dtype.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0, "tf32": 378.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0, "tf32": 494.5},
    "H100": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0, "tf32": 494.5},
    "H800": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0, "tf32": 494.5},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5, "tf32": 156.0},
    "A800": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5, "tf32": 156.0},
    "L40S": {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6, "tf32": 183.0},
    "V100": {"float16": 125.0, "float32": 15.7},
}

_SDPA_BACKWARD = {
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
}


def _formulas() -> dict[Any, Any]:
    table = dict(flop_registry)
    cpu_fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    cpu_bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if cpu_fwd is not None:
        table[cpu_fwd] = flop_registry[aten._scaled_dot_product_flash_attention]
    if cpu_bwd is not None:
        table[cpu_bwd] = flop_registry[aten._scaled_dot_product_flash_attention_backward]
        _SDPA_BACKWARD.add(cpu_bwd)
    return table


FORMULAS = _formulas()


def _score_recompute(args: tuple) -> int:
    """FLOPs an attention backward kernel spends re-computing ``q @ k^T`` (args: grad_out, q, k)."""
    q, k = args[1], args[2]
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    return bmm_flop((b * h, s_q, d), (b * h, d, s_k))


class FlopCounter(TorchDispatchMode):
    """Counts model and hardware FLOPs of the ops run while it is active (see module doc)."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.model_flops = 0
        self.hardware_flops = 0
        self.by_op: Counter[str] = Counter()
        self.by_dtype: Counter[torch.dtype] = Counter()

    def reset(self) -> None:
        self.model_flops = self.hardware_flops = 0
        self.by_op.clear()
        self.by_dtype.clear()

    @property
    def main_dtype(self) -> torch.dtype | None:
        """The dtype most FLOPs ran in (under autocast: the compute dtype, not the weights')."""
        return self.by_dtype.most_common(1)[0][0] if self.by_dtype else None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = getattr(func, "_overloadpacket", func)
        formula = FORMULAS.get(packet)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.hardware_flops += flops
            self.by_op[str(packet)] += flops
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                self.by_dtype[first.dtype] += flops
            in_backward = torch._C._current_graph_task_id() != -1
            if in_backward and torch.is_grad_enabled():
                pass                                  # recomputation (checkpointing)
            elif packet in _SDPA_BACKWARD:
                self.model_flops += flops - _score_recompute(args)
            else:
                self.model_flops += flops
        return out


def utilisation(flops: float, step_time_s: float, peak_flops: float | None) -> float | None:
    """``flops / (step_time_s * peak_flops)``; None when the peak or the time is unknown."""
    if not peak_flops or not step_time_s or step_time_s <= 0:
        return None
    return flops / (step_time_s * peak_flops)


def peak_flops(device: Any = None, dtype: Any = torch.float32, peak_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of ``device`` for ``dtype``: the user's ``peak_tflops`` or the device table.

    A CPU (or an unknown GPU) has no entry: returns None unless ``peak_tflops`` is given.

    >>> peak_flops("cpu", peak_tflops=0.5)
    500000000000.0
    >>> peak_flops("cpu") is None
    True
    """
    if peak_tflops:
        return float(peak_tflops) * 1e12
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    key = str(dtype).replace("torch.", "")
    if key == "float32" and torch.backends.cuda.matmul.allow_tf32:
        key = "tf32"
    for model, table in PEAK_TFLOPS.items():
        if model in name and key in table:
            return table[key] * 1e12
    return None
