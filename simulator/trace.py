"""The record of one simulated run: every aten op and every storage, as one rank would see them.

:class:`OpTracer` is a ``TorchDispatchMode`` that sits on top of a
:class:`probe.profiler.flops.FlopCounter` (which gives each op its FLOPs); below both, normally, a
``FakeTensorMode`` (:mod:`probe.simulator.fake_run`), so no storage is ever allocated. For each op it
keeps, in columns of a :class:`Trace`:

1. the op's name, the innermost module running it (``torch.utils.module_tracker``; forward and
   backward), its phase (``forward``, ``backward``, ``optimizer``, ``other``), the optimizer
   steps finished before it, its hardware and model FLOPs and the bytes it reads and writes
   (views move nothing);
2. every storage an op's output has that was not seen before: its bytes and the op that made
   it; a weak reference tells when it dies, as the count of ops finished by then. Live bytes
   after op ``k`` are then the storages made at or before ``k`` and not dead by ``k``, the
   figure an allocator sees while op ``k`` runs;
3. the memory the op's kernel takes beyond its outputs (:mod:`probe.simulator.workspace`);
4. each storage's roles, the strongest one naming its category: ``params`` (a parameter seen as
   an op input, or in an optimizer's groups), ``grads`` (a parameter's ``.grad`` when the
   optimizer steps), ``optimizer`` (a tensor in ``optimizer.state``), ``activations`` (saved for
   backward: an autograd saved-tensor hook), else ``temporary``;
5. collectives as :class:`CommRecord` rows, reported by :mod:`probe.engine_adapter.torch_comm` or by
   a workload that models its own (:meth:`OpTracer.comm`).

Ops that read values (``.item()``, ``bool``, ``.tolist()``) go to a reader (see
:mod:`probe.simulator.placeholders`) instead of running.

>>> import torch
>>> with OpTracer() as tracer:
...     x = torch.randn(256, 256, requires_grad=True)
...     (x @ x).sum().backward()
>>> trace = tracer.trace
>>> trace.op_name[:2], trace.storage_bytes[0]
(['aten.randn.default', 'aten.mm.default'], 262144)
>>> sum(trace.op_flops) == 3 * 2 * 256 ** 3
True
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.nn import Parameter
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from probe.profiler.flops import FlopCounter
from probe.simulator.signature import signature, signature_key
from probe.simulator.workspace import op_workspace

PHASES = ("other", "forward", "backward", "optimizer")
OTHER, FORWARD, BACKWARD, OPTIMIZER = range(4)

#: storage roles, strongest first; the strongest role a storage ever had is its category
CATEGORIES = ("params", "grads", "optimizer", "activations", "temporary")
PARAM, GRAD, OPT, ACT = 1, 2, 4, 8

_PRIM_DEVICE = torch.ops.prim.device.default


@dataclass
class CommRecord:
    """One collective: after which op it ran, what, over how many ranks, how many bytes."""

    op_index: int
    op: str
    group: str            # "dp", "tp", "pp" or "world"
    group_size: int
    nbytes: int
    phase: int


@dataclass
class Trace:
    """Columns of ops and storages of a traced run (see the module docstring)."""

    op_name: list[str] = field(default_factory=list)
    op_module: list[int] = field(default_factory=list)
    op_phase: list[int] = field(default_factory=list)
    op_step: list[int] = field(default_factory=list)
    op_flops: list[int] = field(default_factory=list)
    op_model_flops: list[int] = field(default_factory=list)
    op_bytes: list[int] = field(default_factory=list)
    op_dtype: list[str] = field(default_factory=list)
    op_calls: list[int] = field(default_factory=list)         # module calls entered just before
    storage_bytes: list[int] = field(default_factory=list)
    storage_alloc: list[int] = field(default_factory=list)
    storage_free: list[int] = field(default_factory=list)      # -1: alive at the end
    storage_role: list[int] = field(default_factory=list)
    storage_module: list[int] = field(default_factory=list)
    modules: list[str] = field(default_factory=lambda: ["Global"])
    module_class: dict[str, str] = field(default_factory=dict)
    comms: list[CommRecord] = field(default_factory=list)
    step_ends: list[int] = field(default_factory=list)        # op count when each step ended
    workspace: dict[int, tuple[int, int]] = field(default_factory=dict)  # op -> (cpu, cuda) bytes
    params: int = 0                                            # distinct parameters seen
    op_signature: list[int] = field(default_factory=list)     # index into signatures (if kept)
    signatures: list[tuple[Any, tuple, dict]] = field(default_factory=list)

    @property
    def n_ops(self) -> int:
        return len(self.op_name)

    def category(self, key: int) -> int:
        """Index into :data:`CATEGORIES` of storage ``key``."""
        role = self.storage_role[key]
        for i, bit in enumerate((PARAM, GRAD, OPT, ACT)):
            if role & bit:
                return i
        return 4


class OpTracer(TorchDispatchMode):
    """Records ops and storages into :attr:`trace` while active (see the module docstring).

    ``reader``: called as ``reader(func, args, kwargs)`` for value reads and data-dependent
    shapes (``func`` raising a fake-tensor data exception); without one they run as they are.
    ``signatures``: also keep each op's call signature (op, argument shapes, strides, dtypes and
    plain values), once per distinct one, so :mod:`probe.simulator.replay` can run it for real.
    """

    def __init__(self, reader: Callable[..., Any] | None = None, signatures: bool = False) -> None:
        super().__init__()
        self.trace = Trace()
        self.reader = reader
        self.keep_signatures = signatures
        self._signature_index: dict[str, int] = {}
        self.in_optimizer = False
        self._flops = FlopCounter()
        self._modules = ModuleTracker()
        self._module_index = {"Global": 0}
        self._live: dict[int, int] = {}          # id(storage) -> storage key
        self._refs: dict[int, weakref.ref] = {}  # storage key -> weak reference
        self._handles: list[Any] = []
        self._roots: weakref.WeakSet = weakref.WeakSet()
        self._owned: list[tuple[int, int]] = []   # (storage, the storage whose module it takes)
        self._calls = 0
        self._grad_of: dict[int, int] = {}        # gradient storage -> its parameter's storage
        self._shared: set[int] = set()            # gradient storages holding many parameters' grads
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    # -- context --------------------------------------------------------------------------
    def __enter__(self) -> "OpTracer":
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self._modules.__enter__()
        self._handles = [register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step),
                         register_module_forward_pre_hook(self._entered)]
        self._saved_hooks.__enter__()
        self._flops.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.count_params()
        modules = self.trace.storage_module
        for key, owner in self._owned:          # in the order made
            if modules[owner]:
                modules[key] = modules[owner]
        for key in self._shared:
            modules[key] = self._module("(one buffer of many gradients)")
        super().__exit__(*exc)
        self._flops.__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
        self._modules.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- what workloads tell the tracer ------------------------------------------------------
    def comm(self, op: str, group: str, group_size: int, nbytes: int) -> None:
        """Record a collective of ``nbytes`` over ``group_size`` ranks of ``group`` here."""
        self.trace.comms.append(CommRecord(self.trace.n_ops, op, group, int(group_size),
                                           int(nbytes), self._phase(())))

    def count_params(self) -> int:
        """Count the distinct parameters of the models run so far and of the optimizers stepped
        (kept as :attr:`Trace.params`, the most seen)."""
        seen: dict[int, int] = {}
        for root in list(self._roots):
            seen.update((id(p), p.numel()) for p in root.parameters())
        for optimizer in list(self._optimizers):
            for group in optimizer.param_groups:
                seen.update((id(p), p.numel()) for p in group["params"])
        self.trace.params = max(self.trace.params, sum(seen.values()))
        return self.trace.params

    def end_step(self) -> None:
        """Mark the end of a training step the workload drives itself."""
        self.trace.step_ends.append(self.trace.n_ops)

    # -- the dispatch --------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _PRIM_DEVICE:
            return func(*args, **kwargs)
        if self.reader is not None and func in self.reader.reads:
            return self.reader(func, args, kwargs)
        flops, model_flops = self._flops.hardware_flops, self._flops.model_flops
        try:
            out = func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - only fake-tensor data exceptions are handled
            if self.reader is None or not self.reader.handles(e):
                raise
            out = self.reader.dynamic(func, args, kwargs, e)
        self._record(func, args, kwargs, out, self._flops.hardware_flops - flops,
                     self._flops.model_flops - model_flops)
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any, flops: int, model_flops: int) -> None:
        trace = self.trace
        index = trace.n_ops
        module = self._current_module()
        inputs = list(_tensors(args)) + list(_tensors(kwargs.values()))
        outputs = list(_tensors((out,)))
        moved = 0
        view = getattr(func, "is_view", False)
        for t in inputs:
            key = self._storage_key(t)
            if isinstance(t, Parameter):
                trace.storage_role[key] |= PARAM
                if trace.storage_module[key] == 0:
                    trace.storage_module[key] = module
            if not view:
                moved += t.numel() * t.element_size()
        for t in outputs:
            self._storage_key(t, module=module)
            if not view:
                moved += t.numel() * t.element_size()
        trace.op_name.append(str(func))
        trace.op_module.append(module)
        trace.op_phase.append(self._phase(outputs))
        trace.op_step.append(len(trace.step_ends))
        trace.op_flops.append(flops)
        trace.op_model_flops.append(model_flops)
        trace.op_bytes.append(moved)
        trace.op_calls.append(self._calls)
        self._calls = 0
        first = outputs[0] if outputs else (inputs[0] if inputs else None)
        trace.op_dtype.append(str(first.dtype).replace("torch.", "") if first is not None else "")
        extra = op_workspace(func, inputs, outputs)
        if extra != (0, 0):
            trace.workspace[index] = extra
        if self.keep_signatures:
            trace.op_signature.append(self._signature(func, args, kwargs))

    def _signature(self, func: Any, args: tuple, kwargs: dict) -> int:
        sig = signature(func, args, kwargs)
        key = signature_key(sig)
        index = self._signature_index.get(key)
        if index is None:
            index = self._signature_index[key] = len(self.trace.signatures)
            self.trace.signatures.append(sig)
        return index

    # -- storages ----------------------------------------------------------------------------
    def _storage_key(self, t: torch.Tensor, module: int | None = None) -> int:
        st = t.untyped_storage()
        sid = id(st)
        key = self._live.get(sid)
        trace = self.trace
        if key is not None:
            grown = st.nbytes() - trace.storage_bytes[key]
            if grown == 0:
                return key
            self._died(sid, key)           # resized in place: the old block goes, a new one comes
        key = len(trace.storage_bytes)
        trace.storage_bytes.append(st.nbytes())
        trace.storage_alloc.append(trace.n_ops)
        trace.storage_free.append(-1)
        trace.storage_role.append(0)
        trace.storage_module.append(module if module is not None else self._current_module())
        self._live[sid] = key
        self._refs[key] = weakref.ref(st, lambda _r, sid=sid, key=key: self._died(sid, key))
        return key

    def _died(self, sid: int, key: int) -> None:
        if self._live.get(sid) == key:
            del self._live[sid]
        self._refs.pop(key, None)
        if self.trace.storage_free[key] < 0:
            self.trace.storage_free[key] = self.trace.n_ops

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = self._storage_key(t)
        self.trace.storage_role[key] |= ACT
        return t

    # -- where and when ----------------------------------------------------------------------
    def _module(self, name: str) -> int:
        index = self._module_index.get(name)
        if index is None:
            index = self._module_index[name] = len(self.trace.modules)
            self.trace.modules.append(name)
        return index

    def _current_module(self) -> int:
        parents = self._modules.parents
        return self._module(max(parents, key=len) if len(parents) > 1 else "Global")

    def _entered(self, module: torch.nn.Module, args: Any) -> None:
        """Note the class of the module the tracker has just entered (its innermost name)."""
        self._calls += 1
        name = max(self._modules.parents, key=len)
        self.trace.module_class.setdefault(name, type(module).__name__)
        if "." not in name:
            self._roots.add(module)

    def _phase(self, outputs: list[torch.Tensor]) -> int:
        if self.in_optimizer:
            return OPTIMIZER
        if torch._C._current_graph_task_id() != -1:
            return BACKWARD
        if len(self._modules.parents) > 1 or (torch.is_grad_enabled()
                                              and any(t.requires_grad for t in outputs)):
            return FORWARD
        return OTHER

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.in_optimizer = True
        self._optimizers.add(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                pkey = self._storage_key(p)
                self.trace.storage_role[pkey] |= PARAM
                if p.grad is not None:
                    gkey = self._storage_key(p.grad)
                    self.trace.storage_role[gkey] |= GRAD
                    if self._grad_of.setdefault(gkey, pkey) == pkey:
                        self._owned.append((gkey, pkey))
                    else:
                        self._shared.add(gkey)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.in_optimizer = False
        for p, state in optimizer.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    key = self._storage_key(value)
                    self.trace.storage_role[key] |= OPT
                    if isinstance(p, torch.Tensor):
                        self._owned.append((key, self._storage_key(p)))
        self.count_params()
        self.end_step()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    """The tensors among ``values``, one level of lists and tuples deep (as aten ops take them)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for w in v:
                if isinstance(w, torch.Tensor):
                    yield w
