"""Hand-made msprobe-format dumps for compare tests (small, explicit, no framework needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def stat(mx: float, mn: float, mean: float, norm: float, shape: list[int] | None = None,
         dtype: str = "torch.float32") -> dict[str, Any]:
    """One tensor's statistics as msprobe writes them."""
    return {"type": "torch.Tensor", "dtype": dtype, "shape": shape or [2, 4], "Max": mx, "Min": mn,
            "Mean": mean, "Norm": norm, "requires_grad": True}


def chain(n: int = 4, scale: dict[int, float] | None = None, nan_at: int | None = None,
          prefix: str = "Module", cls: str = "Linear", names: list[str] | None = None,
          backward: bool = True) -> tuple[dict, dict]:
    """A chain of n modules where module i's output is module i+1's input.

    ``scale``: module index → factor applied to its weight and everything downstream;
    ``nan_at``: module index whose output (and everything downstream) holds NaN.
    Returns (data, construct).
    """
    scale = scale or {}
    names = names or [f"layers.{i}.fc" for i in range(n)]
    data: dict[str, Any] = {}
    construct: dict[str, Any] = {}
    f = 1.0
    x = stat(1.0, -1.0, 0.01, 3.0)
    nan = False
    for i, name in enumerate(names):
        w_f = scale.get(i, 1.0)
        f *= w_f
        nan = nan or nan_at == i
        out = stat(1.5 * f, -1.4 * f, 0.02 * f, 4.0 * f) if not nan else \
            stat(float("nan"), float("nan"), float("nan"), float("nan"))
        key = f"{prefix}.{name}.{cls}.forward.0"
        data[key] = {"input_args": [x], "input_kwargs": {}, "output": [out],
                     "parameters": {"weight": stat(0.5 * w_f, -0.5 * w_f, 0.001 * w_f, 2.0 * w_f, [4, 4]),
                                    "bias": stat(0.1, -0.1, 0.0, 0.2, [4])}}
        construct[key] = None
        x = out
    if backward:
        g = stat(0.01, -0.01, 1e-9, 0.05)
        for i, name in reversed(list(enumerate(names))):
            base = f"{prefix}.{name}.{cls}"
            data[f"{base}.backward.0"] = {"input": [g], "output": [stat(0.02, -0.02, 2e-9, 0.06)]}
            data[f"{base}.parameters_grad.0"] = {"weight": [stat(0.03, -0.03, 1e-9, 0.1, [4, 4])],
                                                 "bias": [stat(1e-9, -1e-9, 1e-12, 2e-9, [4])]}
            construct[f"{base}.backward.0"] = None
    return data, construct


def write_dump(folder: Path, data: dict, construct: dict | None = None,
               framework: str = "pytorch", task: str = "statistics") -> Path:
    """Write dump.json (+ construct.json, stack.json) into folder; returns the dump.json path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(json.dumps({"task": task, "level": "L0", "framework": framework,
                                "dump_data_dir": None, "data": data}, indent=1))
    (folder / "construct.json").write_text(json.dumps(construct or {}, indent=1))
    (folder / "stack.json").write_text("{}")
    return path
