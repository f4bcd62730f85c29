"""Values a simulated script reads from fake tensors: placeholders, and where it asked for them.

A fake tensor has a shape and no values. When a script reads one (``loss.item()``,
``print(float(loss))``, ``if (x > 0).any():``, ``t.tolist()``), :class:`ValueReader` answers
with a placeholder so the script goes on, and notes the script line that asked:

- a value folded to a constant by ``FakeTensorMode`` (small tensors made from Python numbers,
  an optimizer's step count) is read exactly;
- otherwise integers read as 0, floating point as 1.0 and booleans (a branch taken on a tensor)
  as False;
- an op whose output *shape* depends on values: ``nonzero``, ``masked_select`` and indexing by
  one boolean mask get their upper bound, every element selected; any other (``torch.equal``, ``unique``) raises
  :class:`NeedsRealData` naming the line, and the simulation stops there.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> from probe.simulator.trace import OpTracer
>>> reader = ValueReader()
>>> with FakeTensorMode(), OpTracer(reader=reader):
...     x = torch.randn(4)
...     values = (float(x.sum()), int(x.argmax()), bool(x.sum() > 0), x[x > 0].shape)
>>> values
(1.0, 0, False, torch.Size([4]))
>>> [(note.kind, note.count) for note in reader.notes()]
[('value', 2), ('branch', 1), ('shape', 1)]
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

aten = torch.ops.aten

_OWN_FOLDERS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))


class NeedsRealData(Exception):
    """A script asked for something fake tensors cannot give (one line: where and what)."""


@dataclass
class ReadNote:
    """Reads of one kind from one line: ``value`` (numbers), ``branch`` (bool), ``shape``."""

    where: str
    kind: str
    count: int
    placeholder: str

    def __str__(self) -> str:
        what = {"value": "read tensor values (.item(), float(), .tolist(), print)",
                "branch": "took a branch on a tensor value",
                "shape": "made a tensor whose shape depends on values"}[self.kind]
        times = f" {self.count} times" if self.count > 1 else ""
        return f"{self.where}: {what}{times}; gave {self.placeholder}"


class ValueReader:
    """Placeholders for value reads of fake tensors (see the module docstring).

    ``script``: the user's script path; notes then name its lines (else the first line outside
    torch and the simulator). ``quiet``: read without noting (the bundled engine's own reads).
    """

    reads = frozenset({aten._local_scalar_dense.default})

    def __init__(self, script: str | None = None, quiet: bool = False) -> None:
        self.script = os.path.abspath(script) if script else None
        self.quiet = quiet
        self._notes: dict[tuple[str, str], ReadNote] = {}

    def notes(self) -> list[ReadNote]:
        """The reads noted so far, in the order first seen."""
        return list(self._notes.values())

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        constant = getattr(t, "constant", None)
        if constant is not None:
            return constant.item()
        if t.dtype == torch.bool:
            return self._note("branch", "False", False)
        if t.dtype.is_floating_point or t.dtype.is_complex:
            return self._note("value", "1.0 for floating point, 0 for integers", 1.0)
        return self._note("value", "1.0 for floating point, 0 for integers", 0)

    @staticmethod
    def handles(error: BaseException) -> bool:
        """Whether ``error`` is a fake tensor's "needs the values" exception."""
        return isinstance(error, (DataDependentOutputException, DynamicOutputShapeException))

    def dynamic(self, func: Any, args: tuple, kwargs: dict, error: BaseException) -> Any:
        """The upper bound for ``nonzero``; :class:`NeedsRealData` for anything else."""
        shape = _upper_bound_shape(func, args)
        if shape is not None:
            self._note("shape", "its upper bound (every element selected)", None)
            x = args[0]
            dtype = torch.long if func is aten.nonzero.default else x.dtype
            return torch.empty(shape, dtype=dtype, device=x.device)
        raise NeedsRealData(f"{self._where()}: {func} needs the tensor's values, which a "
                            f"simulation does not have; the simulation stops here") from None

    def _note(self, kind: str, placeholder: str, value: Any) -> Any:
        if not self.quiet:
            where = self._where()
            note = self._notes.get((where, kind))
            if note is None:
                self._notes[(where, kind)] = ReadNote(where, kind, 1, placeholder)
            else:
                note.count += 1
        return value

    def _where(self) -> str:
        """``file:line: source`` of the script's (or else the first outside) frame asking."""
        frame = sys._getframe(1)
        fallback = None
        while frame is not None:
            name = os.path.abspath(frame.f_code.co_filename)
            if self.script is not None and name == self.script:
                return _describe(frame)
            if fallback is None and not name.startswith(_OWN_FOLDERS):
                fallback = frame
            frame = frame.f_back
        return _describe(fallback) if fallback is not None else "<unknown>"


def _upper_bound_shape(func: Any, args: tuple) -> tuple[int, ...] | None:
    """The largest output shape of a value-dependent selection, or None for other ops."""
    x = args[0]
    if func is aten.nonzero.default:
        return (x.numel(), x.dim())
    if func is aten.masked_select.default:
        return (torch.broadcast_shapes(x.shape, args[1].shape).numel(),)
    if func is aten.index.Tensor:
        indices = args[1]
        if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
            mask = indices[0]
            return (mask.numel(), *x.shape[mask.dim():])
    return None


def _describe(frame: Any) -> str:
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    place = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return f"{place} ({line})" if line else place
