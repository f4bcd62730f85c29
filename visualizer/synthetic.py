"""A synthetic msprobe-format dump pair of any size, with one planted fault, for tests and
benchmarks of the graph views (a real model of 10k nodes takes minutes to dump on a CPU).

The network is ``blocks`` blocks of ``width`` API calls plus one ``mlp`` submodule of three
calls each, between an ``embed`` and a ``head`` module; side B equals side A to rounding, except
that ``layers.<fault_block>.mlp`` multiplies its output by ``fault_scale`` (and, with ``nan``,
emits NaN), so everything after it differs but only that module makes the error grow.

>>> import tempfile
>>> a, b = write_dump_pair(tempfile.mkdtemp(), blocks=2, width=3, fault_block=1)
>>> sorted(p.name for p in a.iterdir())
['construct.json', 'dump.json', 'stack.json']
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def _stat(norm: float, shape: list[int]) -> dict:
    if math.isnan(norm):
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": float("nan"),
                "Min": float("nan"), "Mean": float("nan"), "Norm": float("nan"), "requires_grad": True}
    scale = norm / math.sqrt(shape[0] * shape[1])
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": 3.0 * scale,
            "Min": -3.0 * scale, "Mean": 0.01 * scale, "Norm": norm, "requires_grad": True}


def _write(folder: Path, data: dict, construct: dict, stacks: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
           "data": data}
    (folder / "dump.json").write_text(json.dumps(doc))
    (folder / "construct.json").write_text(json.dumps(construct))
    (folder / "stack.json").write_text(json.dumps(stacks))


def write_dump_pair(out_dir: str | os.PathLike, blocks: int = 96, width: int = 99,
                    fault_block: int | None = None, fault_scale: float = 3.0,
                    nan: bool = False) -> tuple[Path, Path]:
    """Write ``A/step0/rank0`` and ``B/step0/rank0`` under ``out_dir``; return the two rank
    folders. Node count: ``blocks * (width + 5) + 2``."""
    out = Path(out_dir)
    fault_block = blocks // 2 if fault_block is None else fault_block
    sides = {}
    for side in ("A", "B"):
        data: dict = {}
        construct: dict = {}
        stacks: dict = {}
        counters: dict[str, int] = {}
        norm = 10.0
        shape = [4, 64]

        def call(name: str, parent: str | None, factor: float, params: bool = False) -> None:
            nonlocal norm
            inp = _stat(norm, shape)
            norm = norm * factor
            entry = {"input_args": [inp], "input_kwargs": {}, "output": [_stat(norm, shape)]}
            if params:
                entry["parameters"] = {"weight": _stat(8.0, [64, 64])}
            data[name] = entry
            construct[name] = parent
            stacks[str(len(stacks))] = [[name], [f"File model.py, line {len(stacks) + 10}, in forward, "
                                                 f"\n y = self.op_{len(stacks)}(x)"]]

        def api(kind: str, parent: str) -> str:
            n = counters.get(kind, 0)
            counters[kind] = n + 1
            return f"Functional.{kind}.{n}.forward"

        def module(path: str, cls: str, parent: str | None, body) -> None:
            nonlocal norm
            name = f"Module.{path}.{cls}.forward.0"
            construct[name] = parent
            before = norm
            body(name)
            entry = {"input_args": [_stat(before, shape)], "input_kwargs": {},
                     "output": [_stat(norm, shape)]}
            data[name] = entry
            stacks[str(len(stacks))] = [[name], [f"File model.py, line 5, in forward, \n x = self.{path}(x)"]]

        module("embed", "Embedding", None, lambda p: call(api("embedding", p), p, 1.0, True))
        for i in range(blocks):
            def block_body(p: str, i: int = i) -> None:
                nonlocal norm
                for j in range(width):
                    call(api("linear" if j % 3 else "gelu", p), p, 1.0 + 1e-3 * ((j % 7) - 3), j % 3 == 1)

                def mlp_body(q: str) -> None:
                    call(api("linear", q), q, 1.01, True)
                    call(api("silu", q), q, 0.99)
                    faulty = side == "B" and i == fault_block
                    factor = float("nan") if faulty and nan else (fault_scale if faulty else 1.0)
                    call(api("linear", q), q, factor * (1 + 1e-7), True)
                module(f"layers.{i}.mlp", "MLP", p, mlp_body)
            module(f"layers.{i}", "Block", None, block_body)
        module("head", "Linear", None, lambda p: call(api("linear", p), p, 1.0, True))
        folder = out / side / "step0" / "rank0"
        _write(folder, data, construct, stacks)
        sides[side] = folder
    return sides["A"], sides["B"]
