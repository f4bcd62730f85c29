"""The dump's backward capture in C++ (``torch_grads.cpp``): gradients read without the GIL.

The Python capture of :mod:`probe.engine_adapter.torch_adapter` runs a Python hook for each module
output's gradient, each module input's and each parameter's (~75 a step of the bundled mini
model): each call takes the GIL, which the dump's writer thread holds while it writes the last
step, and costs ~20 us. :class:`NativeGrads` puts C++ hooks on the same autograd nodes: a CPU
float32/float64 gradient's statistics are read in the hook (the kernel of ``stats_kernel.c``)
and an event is queued; :meth:`NativeGrads.drain` replays the events, in order, into the
handlers the Python hooks would have called, with a :class:`PreparedGrad` in place of the tensor
(the dump's row builder takes it as it takes a tensor). A gradient the kernel does not read
(another device or dtype, not dense) is replayed at once with the tensor itself, under the GIL:
what the Python path does.

:class:`CallingHooks` are the API level's (and the module level's where nothing is replayed):
the same hooks, added by one C++ call per recorded call, calling Python as they fire with the
one gradient each watches; for the statistics task the gradient is handed over read, as a
:class:`PreparedGrad` that carries its identity key, so nothing holds the tensor and autograd
gives ``.grad`` a parameter's gradient without copying it.

The extension module is built once per machine against the running torch (``ground.native``,
~15 s with the system C++ compiler, cached under ``~/.cache/probe``) and imported from there;
without a compiler or torch's headers, or with ``PROBE_NATIVE=0``, :func:`load` returns
None and the Python hooks are used.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Callable

import torch

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_grads.cpp")

_lib: Any = None          # the loaded library, False when it cannot be
#: the next hook id; ids are unique in the process: a hook left on an old graph never reaches
#: a new handler
_next_id = 1


def _reserve(n: int) -> int:
    """The first of ``n`` new hook ids (consecutive)."""
    global _next_id
    first = _next_id
    _next_id += n
    return first


class PreparedGrad(tuple):
    """A gradient already read: ``(dtype, shape, numel, requires_grad, statistics, group)``;
    ``statistics`` is the kernel's ``[max, min, sum, sum of squares, nan count, inf count]`` and
    ``group`` names the data within the step (equal groups: the same bytes). Handed over as it
    comes (:class:`CallingHooks`) it has two more items, ``key`` and ``owner``: the tensor's
    identity key as ``dumper/rows.py`` makes it and its storage's Python object (the key
    is valid while it lives), and ``group`` is not used."""

    __slots__ = ()


def _build() -> Any:
    global _lib
    if _lib is not None:
        return _lib
    _lib = False
    try:
        import importlib.machinery
        import importlib.util
        import sysconfig

        from probe.ground.native import build_cached
        from torch.utils.cpp_extension import include_paths, library_paths

        includes = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
        libdir = library_paths()[0]
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        common = [*includes, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w", f"-L{libdir}", "-lc10",
                  "-ltorch_cpu", "-ltorch_python", "-lstdc++", f"-Wl,-rpath,{libdir}"]
        path = build_cached(_SOURCE, "torch-grads", [["-std=c++20", *common], ["-std=c++17", *common]],
                            key_extra=f"{torch.__version__}:{libdir}", what="the C++ backward capture")
        if path is None:
            return _lib
        loader = importlib.machinery.ExtensionFileLoader("_torch_grads", path)
        spec = importlib.util.spec_from_loader("_torch_grads", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        _lib = module
    except Exception:  # noqa: BLE001 - no compiler, no headers: the Python hooks work everywhere
        _lib = False
    return _lib


def available() -> bool:
    """Whether the C++ capture can be used here (built, or buildable, and the kernel loaded)."""
    from probe.engine_adapter.torch_stats import native_kernel

    return bool(native_kernel()) and bool(_build())


class CallingHooks:
    """The library's hooks that call Python as they fire: the API level's capture, and the
    module level's where the gradients are not replayed (:class:`NativeGrads` has the same
    two methods, queuing instead).

    - ``capture(tensors, fn)``: ``t.view_as(t)`` for each tensor, the ``j``-th view's node
      hooked to call ``fn(j, grad)`` with the gradient it hands back to ``t``;
    - ``capture_edges(inputs, outputs, start, fn)``: the nodes a call made (sequence number
      ``start`` or more, reached from ``outputs``) hooked where they take one of ``inputs``:
      ``fn(j, grad)`` with input ``j``'s gradient, its contributions inside the call added up,
      once all are in (:func:`probe.engine_adapter.torch_api.capture_edges`' work in C++, no
      node added); returns the ``j`` that such a node takes;
    - ``watch(outputs, fn)``: ``fn(i, grad)`` with the gradient of each output ``i`` that is a
      tensor requiring grad, from a pre-hook on its node; returns ``(how many, leaves)``, the
      indices of outputs without a node, which the caller hooks itself;
    - ``prepare``: with ``kernel`` (the statistics kernel; the recorder takes gradients already
      read), ``prepare(grad)`` gives a readable gradient (a CPU floating one) as a
      :class:`PreparedGrad` read now and the other ones as they are, and the two hooks above
      hand over what it gives. No reference to such a gradient is kept: autograd then hands a
      parameter's gradient to ``.grad`` as it is instead of copying it (the copy of every
      parameter gradient a step, ~1.5 ms and the gradients' memory again on the mini preset
      at mix level, came from the recorder holding the gradient until its call's entry was
      made). The PreparedGrad carries the tensor's identity key (``dumper/rows.py``'s),
      so the optimizer's later reads of ``.grad`` are the same tensor id. None without.
    """

    __slots__ = ("capture", "capture_edges", "watch", "prepare", "_lib")

    def __init__(self, lib: Any, kernel: Any = None) -> None:
        prepared = bool(kernel)
        self._lib = lib if prepared else None
        self.capture = functools.partial(lib.capture_calling, prepared)
        self.capture_edges = functools.partial(lib.capture_edges_calling, prepared)
        self.watch = functools.partial(lib.watch_calling, prepared)
        self.prepare = lib.prepare if prepared else None
        if prepared:
            f32 = ctypes.cast(kernel[0], ctypes.c_void_p).value
            f64 = ctypes.cast(kernel[1], ctypes.c_void_p).value
            lib.init(f32, f64, PreparedGrad, None, None)

    def new_step(self) -> None:
        """A step starts: the gradients read are forgotten."""
        if self._lib is not None:
            self._lib.new_step()

    def forget(self) -> None:
        """The dump is detached: a hook left on a graph hands tensors over again."""
        if self._lib is not None:
            self._lib.init(0, 0, None, None, None)
            self._lib = None


def hooks(prepared: bool = False) -> CallingHooks | None:
    """The library's :class:`CallingHooks` (``prepared``: handing gradients over read, when
    the statistics kernel is here too), or None (not built here, ``PROBE_NATIVE=0``):
    then the Python hooks of :mod:`probe.engine_adapter.torch_api`."""
    lib = _build()
    if not lib:
        return None
    kernel = None
    if prepared:
        from probe.engine_adapter.torch_stats import native_kernel
        kernel = native_kernel() or None
    return CallingHooks(lib, kernel)


def load(on_first: Callable[[], None]) -> "NativeGrads | None":
    """The C++ capture, or None (no kernel, no compiler, ``PROBE_NATIVE=0``).
    ``on_first()`` is called, under the GIL, at the first gradient of each recorded step."""
    from probe.engine_adapter.torch_stats import native_kernel

    kernel = native_kernel()
    lib = _build() if kernel else False
    if not lib:
        return None
    return NativeGrads(lib, kernel, on_first)


class NativeGrads:
    """The C++ hooks of one process (the library's state is global: one dump at a time)."""

    def __init__(self, lib: Any, kernel: Any, on_first: Callable[[], None]) -> None:
        self._lib = lib
        #: events queued, not replayed yet
        self.pending: Callable[[], int] = lib.pending
        #: a gradient a Python hook got, read as a queued one is (its group shared with them)
        self.grouped: Callable[[Any], Any] = lib.grouped
        #: id -> (fn, index) of the calls of this step, replayed as fn(index, grad) (forgotten at
        #: :meth:`end_step`)
        self._calls: dict[int, tuple[Callable[[int, Any], Any], int]] = {}
        #: id -> handler(grad) of the parameters (until their hook is removed)
        self._params: dict[int, Callable[[Any], Any]] = {}
        self._draining = False
        f32 = ctypes.cast(kernel[0], ctypes.c_void_p).value
        f64 = ctypes.cast(kernel[1], ctypes.c_void_p).value
        lib.init(f32, f64, PreparedGrad, self.drain, on_first)

    # ----------------------------------------------------------------- hooks
    def capture(self, tensors: list[torch.Tensor], fn: Callable[[int, Any], Any]) -> tuple:
        """``t.view_as(t)`` for each tensor; ``fn(j, grad)`` replayed with the gradient the
        ``j``-th view's node hands back to ``t`` (:class:`CallingHooks`' ``capture``)."""
        n = len(tensors)
        first = _reserve(n)
        views = self._lib.capture(tensors, first)
        calls = self._calls
        for j in range(n):
            calls[first + j] = (fn, j)
        return views

    def capture_edges(self, inputs: list, outputs: list, start: int | None, call: Any) -> bool:
        """The gradients of a call's ``inputs`` where the nodes it made (sequence number
        ``start`` or more, reached from its ``outputs``) take them, added up per input in
        C++ and replayed as ``call.input_grad(0, grad)`` (one input) or ``call.finish(grads)``
        (:func:`probe.engine_adapter.torch_api.capture_edges`' work, queued); whether any was."""
        from probe.engine_adapter.torch_api import _Gather

        first = _reserve(len(inputs))
        taken = self._lib.capture_edges(inputs, outputs, start or 0, first)
        if not taken:
            return False
        calls = self._calls
        if len(taken) == 1:
            calls[first + taken[0]] = (call.input_grad, 0)
        else:
            gather = _Gather(call, len(taken))
            for k, j in enumerate(taken):
                calls[first + j] = (gather.on_grad, k)
        return True

    def watch(self, outputs: Any, fn: Callable[[int, Any], Any]) -> tuple[int, list[int]]:
        """``fn(i, grad)`` replayed with the gradient of each output ``i`` that is a tensor
        requiring grad; an output without a node (a leaf) gets a Python tensor hook that
        replays the queue first. ``(how many, [])``, as :class:`CallingHooks`' ``watch``."""
        n = len(outputs)
        first = _reserve(n)
        watched, leaves = self._lib.watch(outputs, first)
        calls = self._calls
        for i in range(n):
            calls[first + i] = (fn, i)
        from probe.engine_adapter.torch_api import hook_leaf

        for i in leaves:
            hook_leaf(outputs[i], self.first_grad(functools.partial(fn, i)))
        return watched, []

    def watch_param(self, param: torch.Tensor, handler: Callable[[Any], Any]) -> "_ParamHandle":
        """``handler(grad)`` with each gradient of ``param``; remove with the handle."""
        key = _reserve(1)
        self._lib.watch_param(param, key)
        self._params[key] = handler
        return _ParamHandle(self, key)

    def first(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` for a Python hook beside the C++ ones: what they queued is replayed first."""
        def drained(*args: Any) -> Any:
            self.drain()
            return fn(*args)
        return drained

    def first_grad(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn(grad)`` for a Python hook on a gradient beside the C++ ones: what they queued
        is replayed first, and the gradient is handed over read as a queued one is
        (:attr:`grouped`). A queued gradient of the same bytes in the step is then the same
        group, so one tensor id, as the Python hooks' tensors are one: a module returning its
        own parameter (a leaf) has the output's gradient and the parameter's, which the
        parameter's AccumulateGrad post-hook queues after this hook ran (its ``.grad``, the
        same tensor when the gradient was the first of the step), as one tensor."""
        grouped = self.grouped

        def drained(grad: Any) -> Any:
            self.drain()
            return fn(grouped(grad) if isinstance(grad, torch.Tensor) else grad)
        return drained

    # ----------------------------------------------------------------- steps
    def begin_step(self, active: bool) -> None:
        """A step starts (``active``: it is recorded)."""
        self._lib.recording(active)

    def end_step(self) -> None:
        """Replay what is queued, stop recording, forget the step's calls."""
        self.drain()
        self._lib.recording(False)
        self._calls.clear()

    def forget(self) -> None:
        """The dump is detached: stop recording, drop what is queued, let the hooks' handlers
        and the callbacks go (a hook left on a graph node queues nothing more)."""
        self._lib.recording(False)
        self._lib.take([])
        self._calls.clear()
        self._params.clear()
        self._lib.init(0, 0, None, None, None)

    def drain(self) -> None:
        """Replay the queued events, in order, into their handlers."""
        if self._draining:          # a handler's work queued more: the running drain takes them
            return
        self._draining = True
        try:
            pending, take = self._lib.pending, self._lib.take
            while pending():
                events: list = []
                take(events)
                calls, params = self._calls, self._params
                for kind, key, grad in events:
                    if kind:
                        handler = params.get(key)
                        if handler is not None:
                            handler(grad)
                    else:
                        call = calls.get(key)
                        if call is not None:
                            call[0](call[1], grad)
        finally:
            self._draining = False


class _ParamHandle:
    __slots__ = ("owner", "key")

    def __init__(self, owner: NativeGrads, key: int) -> None:
        self.owner, self.key = owner, key

    def remove(self) -> None:
        owner, self.owner = self.owner, None
        if owner is None:
            return
        owner._params.pop(self.key, None)
        owner._lib.remove_param(self.key)
