"""MindSpore (PyNative mode) behind the engine adapter interface; an optional install.

- Cells: ``register_forward_pre_hook`` / ``register_forward_hook`` (with kwargs),
  ``register_backward_hook`` (its call: the cell's last recorded call whose backward has not
  run) and a ``register_hook`` on each trainable parameter. A Cell does not know its own path,
  so the adapter keeps an id -> name map built from ``cells_and_names()``; entries are named as
  msprobe names them:
  ``Cell.block.attn.q.Dense.forward.0``, dtypes as MindSpore prints them (``Float32``).
- APIs (``api``/``mix``): ``mindspore.ops`` (``Functional.*``), ``mindspore.mint``
  (``Mint.*``) and ``Tensor`` methods, see :mod:`probe.engine_adapter.mindspore_api`.
- Steps: every call of an ``nn.Optimizer``; models in script mode: the first call of a Cell
  that is not part of a known model.

Statistics: on the CPU through ``asnumpy()`` (the host is where the tensor lives); on a device
one stacked reduction per tensor left on the device and read once per step.

>>> from probe.engine_adapter.base import get_adapter     # doctest: +SKIP
>>> get_adapter("mindspore").module_prefix          # doctest: +SKIP
'Cell'
"""

from __future__ import annotations

import contextlib
import os
import warnings
import zlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import mindspore as ms
from mindspore import nn, ops

from probe.engine_adapter.base import FLOAT, INTEGER, OPAQUE, EngineAdapter, HookSink, StatsBackend, TensorMeta
from probe.engine_adapter.guard import ReentryGuard
from probe.engine_adapter.host_stats import array_stats
from probe.ground.frameworks import framework as framework_spec

_FLOATS = {ms.float16, ms.float32, ms.float64, getattr(ms, "bfloat16", ms.float16)}
_INTS = {ms.int8, ms.int16, ms.int32, ms.int64, ms.uint8, ms.uint16, ms.uint32, ms.uint64}


def _host(t: Any) -> np.ndarray:
    if t.dtype == getattr(ms, "bfloat16", None):
        t = t.astype(ms.float32)
    return t.asnumpy()


def _on_host() -> bool:
    return ms.get_context("device_target") == "CPU"


class MindSporeStats(StatsBackend):
    """:class:`~probe.engine_adapter.base.StatsBackend` for ``mindspore.Tensor``."""

    tensor_type = ms.Tensor
    tensor_suffix = ".npy"

    def describe(self, t: Any) -> TensorMeta:
        dtype = t.dtype
        shape = tuple(int(d) for d in t.shape)
        numel = int(np.prod(shape)) if shape else 1
        if numel == 0:
            kind = OPAQUE
        elif dtype in _FLOATS:
            kind = FLOAT
        elif dtype in _INTS:
            kind = INTEGER
        else:
            kind = OPAQUE
        return TensorMeta("mindspore.Tensor", str(dtype), shape, numel, None, kind)

    def reduce(self, t: Any, kind: str) -> Any:
        if kind == OPAQUE:
            return None
        if not _on_host():
            x = t.reshape(-1)
            if kind == INTEGER:
                return ops.stack([x.max(), x.min()]).astype(ms.float64)
            x = x.astype(ms.float32)
            return ops.stack([x.max(), x.min(), x.sum(), (x * x).sum(),
                              ops.isnan(x).astype(ms.float32).sum(), ops.isinf(x).astype(ms.float32).sum()])
        a = _host(t).reshape(-1)
        if kind == INTEGER:
            return [float(a.max()), float(a.min())]
        if a.dtype == np.float16:
            a = a.astype(np.float32)
        return array_stats(a)

    def gather(self, handles: Sequence[Any]) -> list[list[float] | None]:
        out: list[list[float] | None] = [None] * len(handles)
        groups: dict[int, list[int]] = {}
        for i, h in enumerate(handles):
            if isinstance(h, list):
                out[i] = h
            elif h is not None:
                groups.setdefault(int(h.shape[0]), []).append(i)
        for idx in groups.values():
            values = ops.stack([handles[i].astype(ms.float64) for i in idx]).asnumpy().tolist()
            for i, v in zip(idx, values):
                out[i] = v
        return out

    def digest(self, t: Any) -> str:
        a = np.ascontiguousarray(_host(t))
        return f"{zlib.crc32(memoryview(a).cast('B')) & 0xFFFFFFFF:08x}"

    def save(self, tensors: dict[str, Any], path: str) -> None:
        if path.endswith(".npy"):                 # msprobe's MindSpore files: one tensor each
            from probe.engine_adapter.tensor_files import write_npy
            (t,) = tensors.values()
            write_npy(_host(t), path)
            return
        if not path.endswith(".safetensors"):
            raise ValueError(f"{path}: MindSpore tensors are written as .npy or .safetensors")
        if os.path.islink(path):
            raise OSError(f"{path}: a symbolic link, not followed")
        from safetensors.numpy import save_file
        save_file({k: np.ascontiguousarray(_host(v)) for k, v in tensors.items()}, path)

    def scalar_type(self, x: Any) -> str | None:
        if isinstance(x, ms.dtype.Type):
            return "mindspore.dtype"
        return None


class MindSporeAdapter(EngineAdapter):
    """The MindSpore engine adapter (PyNative mode)."""

    framework = framework_spec("mindspore").msprobe_name
    module_prefix = framework_spec("mindspore").module_prefix

    def __init__(self) -> None:
        super().__init__()
        self.guard = ReentryGuard()
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any, bool]] = []
        self._known: set[int] = set()
        self._roots = 0
        self._notes: list[str] = []
        self._api: Any = None
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            self._notes.append("MindSpore is not in PyNative mode: Cell hooks only run in PyNative "
                               "mode; call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)")

    def make_stats(self) -> StatsBackend:
        return MindSporeStats()

    def attach_modules(self, model: Any, sink: HookSink, *, backward: bool = True,
                       include: Callable[[str], bool] | None = None, prefix: str = "") -> list[str]:
        hooked: list[str] = []
        for name, cell in model.cells_and_names():
            self._known.add(id(cell))
            if not name:
                continue
            base = f"{self.module_prefix}.{prefix}{name}.{type(cell).__name__}"
            if include is not None and not include(base):
                continue
            self._hook_cell(cell, base, sink, backward)
            hooked.append(name)
        if backward:
            warnings.filterwarnings("ignore", message=".*backward hook.*")
        return hooked

    def _hook_cell(self, cell: Any, base: str, sink: HookSink, backward: bool) -> None:
        key = id(cell)
        guard = self.guard
        open_names: list[str | None] = []
        waiting: list[str] = []       # this step's recorded calls whose backward has not run (LIFO)
        last: str | None = None       # the call of the last backward (run again: a retained graph)
        own_params = [(n, p) for n, p in cell.parameters_and_names(expand=False)]

        def pre(c, args, kwargs):
            if not sink.active:
                open_names.append(None)
                return None
            with guard:
                open_names.append(sink.module_forward_pre(base, key, tuple(args), dict(kwargs)))
            return None

        def post(c, args, kwargs, output):
            nonlocal last
            name = open_names.pop() if open_names else None
            if name is None or not sink.active:
                return None
            with guard:
                sink.module_forward(name, key, output, own_params)
            if backward:
                if name.endswith(".forward.0"):    # the cell's first call of a step: the last step's are over
                    waiting.clear()
                    last = None
                waiting.append(name)
            return None

        def bhook(c, grad_input, grad_output):
            nonlocal last
            if not sink.active:
                return None
            if waiting:
                last = waiting.pop()
            if last is None:
                return None
            with guard:
                sink.module_backward(last, key, tuple(grad_output), tuple(grad_input))
            return None

        self._handles.append(cell.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(cell.register_forward_hook(post, with_kwargs=True))
        if not backward:
            return
        self._handles.append(cell.register_backward_hook(bhook))
        trainable = [(n, p) for n, p in own_params if p.requires_grad]
        for pname, param in trainable:
            self._handles.append(param.register_hook(
                self._param_hook(sink, base, key, pname, len(trainable))))

    def _param_hook(self, sink: HookSink, base: str, key: int, pname: str, expected: int):
        guard = self.guard

        def hook(grad):
            if sink.active:
                with guard:
                    sink.parameter_grad(base, key, pname, grad, expected)
            return None
        return hook

    def attach_api(self, sink: HookSink, *, backward: bool = True,
                   include: Callable[[str], bool] | None = None) -> None:
        from probe.engine_adapter.mindspore_api import MindSporeApi
        if self._api is None:
            self._api = MindSporeApi(sink, self.guard)
            self._api.install()
            self._notes.append("MindSpore API level records forward calls of ops/mint/Tensor; "
                               "API backward entries are recorded for PyTorch only")

    def _patch_call(self, cls: Any, wrapper_factory: Callable[[Any], Any]) -> None:
        had_own = "__call__" in cls.__dict__
        original = cls.__dict__.get("__call__", None)
        inherited = cls.__call__
        cls.__call__ = wrapper_factory(inherited)
        self._patches.append((cls, "__call__", original, had_own))

    def watch_steps(self, on_step: Callable[[], None]) -> None:
        guard = self.guard

        def factory(inner):
            def __call__(opt, *args, **kwargs):
                result = inner(opt, *args, **kwargs)
                with guard:
                    on_step()
                return result
            return __call__
        self._patch_call(nn.Optimizer, factory)

    def watch_models(self, on_model: Callable[[Any], None]) -> None:
        known = self._known

        def factory(inner):
            def __call__(cell, *args, **kwargs):
                if id(cell) not in known and not isinstance(cell, nn.Optimizer):
                    known.update(id(c) for _, c in cell.cells_and_names())
                    on_model(cell)
                return inner(cell, *args, **kwargs)
            return __call__
        self._patch_call(nn.Cell, factory)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        with self.guard:
            yield

    def root_prefix(self) -> str:
        self._roots += 1
        return "" if self._roots == 1 else f"model{self._roots - 1}."

    def detach(self) -> None:
        handles, self._handles = self._handles, []
        for h in reversed(handles):
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - removing twice is fine
                pass
        patches, self._patches = self._patches, []
        for cls, attr, original, had_own in reversed(patches):
            if had_own:
                setattr(cls, attr, original)
            else:
                delattr(cls, attr)
        if self._api is not None:
            self._api.uninstall()
            self._api = None
        self._known.clear()

    def rank(self) -> int:
        try:
            from mindspore.communication import get_rank
            return int(get_rank())
        except Exception:  # noqa: BLE001 - no communication group initialised
            return int(os.environ.get("RANK_ID", os.environ.get("RANK", "0")) or 0)

    def notes(self) -> list[str]:
        return list(self._notes)


ADAPTER = MindSporeAdapter
