"""PyTorch behind the engine adapter interface: module hooks, API interception, step detection.

- Modules: a forward pre-hook (inputs and kwargs, recorded as they are at the call, before
  the module can change them in place), a forward hook (outputs and the module's own
  parameters), the module's backward (gradients of its outputs and of its inputs, through one
  identity autograd node and pre-hooks on the outputs' autograd nodes: the same numbers as
  ``register_full_backward_hook`` at a fraction of its cost) and a hook on each parameter (its
  gradient), on every sub-module of the model, named by its path as msprobe names it:
  ``Module.layers.0.attn.q_proj.Linear``.
  When the recorder takes gradients already read (the module level's statistics), the same
  backward hooks are C++ (:mod:`probe.engine_adapter.torch_grads`, built once per machine): the
  backward pass runs without the GIL and the gradients are replayed into the same handlers as
  the step ends (or before the next forward call: gradient accumulation).
- APIs (``api``/``mix`` levels): thin wrappers of the public ``torch``,
  ``torch.nn.functional`` and ``Tensor`` functions (see :mod:`probe.engine_adapter.torch_api`).
- Steps: ``torch.optim`` global optimizer step post-hook.
- Compiled models (``torch.compile``): every hook starts with a check that Dynamo folds to a
  constant, so the hooks are not traced and the compiled graphs stay whole (a graph break per
  module boundary made the compiled kernels round differently): calls inside compiled code are
  not recorded, parameter gradients and eager calls are; :meth:`TorchAdapter.notes` says so.
- Activation checkpointing: a forward run inside the backward pass (the recomputation) is not a
  new call: it is not recorded, and its backward is the original call's (``backward.<n>`` of
  ``forward.<n>`` under reentrant and non-reentrant checkpointing alike).

>>> import torch
>>> from probe.engine_adapter.torch_adapter import TorchAdapter
>>> a = TorchAdapter()
>>> a.framework, a.module_prefix
('pytorch', 'Module')
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any, Callable, Iterator

import torch

from probe.engine_adapter.base import EngineAdapter, HookSink, StatsBackend
from probe.engine_adapter.guard import ReentryGuard
from probe.engine_adapter.torch_api import capture_edges, flat_tensors, start_mark, watch_gradient
from probe.engine_adapter.torch_sharding import ModelLayout
from probe.engine_adapter.torch_stats import TorchStats
from probe.ground.frameworks import framework as framework_spec


#: inside dump code, tensor subclasses (``nn.Parameter``) skip their Python ``__torch_function__``:
#: reading a parameter's dtype or shape costs nanoseconds instead of microseconds
_plain_tensors = torch._C.DisableTorchFunctionSubclass


#: the id of the backward pass this thread runs in, -1 outside one
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
#: how many dispatch modes are active (a fake or tracing mode: torch.compile's AOT tracing)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)


def _in_backward() -> bool:
    """Whether this code runs inside a backward pass (a forward there is activation
    checkpointing's recomputation)."""
    return _graph_task_id() != -1


def _tracing() -> bool:
    """Whether this call is being traced, not run: Dynamo (``torch.compile``; the check is
    folded to a constant in its graph, so a hook that starts with it adds nothing there) or a
    dispatch mode such as AOT autograd's fake tensors (nothing real to record)."""
    return torch.compiler.is_compiling() or _dispatch_modes() > 0


def _is_compiled(module: torch.nn.Module) -> bool:
    """A ``torch.compile(module)`` wrapper (``OptimizedModule``)."""
    return hasattr(module, "_orig_mod") and type(module).__name__ == "OptimizedModule"


def _compiled_in_place(module: torch.nn.Module) -> bool:
    """A module compiled with ``module.compile()`` (its call goes through a compiled function)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def _accumulated(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A parameter's post-accumulate hook handing ``hook`` its ``.grad`` as the optimizer will
    read it (msprobe's ``parameters_grad``: under gradient accumulation the N-th micro-batch's
    entry is the sum of the first N+1 contributions, not the N-th alone); the C++ capture's
    ``watch_param`` reads the same."""
    def after(param: Any) -> None:
        hook(param.grad)
    return after


class TorchAdapter(EngineAdapter):
    """The PyTorch engine adapter."""

    framework = framework_spec("torch").msprobe_name
    module_prefix = framework_spec("torch").module_prefix
    #: record the module calls inside compiled code, each hooked module boundary a graph break
    #: (the compiled kernels then round differently: the training's last bits move); False:
    #: the compiled graphs stay whole and their inner calls are not recorded
    keep_compiled_boundaries = False

    def __init__(self) -> None:
        super().__init__()
        self.guard = ReentryGuard()
        self._handles: list[Any] = []
        # optimizer-step hooks: a detach() from inside one (the last selected step written)
        # only silences them, since torch is iterating them; the next detach() removes them
        self._step_handles: list[Any] = []
        self._in_step_hook = 0
        self._steps_off = False
        self._api_mode: Any = None
        self._known: set[int] = set()
        self._roots = 0
        self._notes: list[str] = []
        self._compiled_seen = False
        self._native: Any = None        # the C++ backward capture; False: not used
        self._hooks: Any = None         # the library's hooks that call Python; False: none
        self._recording = False         # the last recording() state (a capture made later starts so)
        self._step_token = object()     # new at each step (the recomputation's names are the step's)

    def make_stats(self) -> StatsBackend:
        return TorchStats()

    # ----------------------------------------------------------------- modules
    def attach_modules(self, model: Any, sink: HookSink, *, backward: bool = True,
                       include: Callable[[str], bool] | None = None, prefix: str = "") -> list[str]:
        compiled = any(_is_compiled(m) or _compiled_in_place(m) for m in model.modules())
        native = self._native_capture(sink, model) if backward else None
        hooked: list[str] = []
        seen: set[int] = set()
        layout = ModelLayout(model)     # wrappers' names and sharded parameters
        for raw_path, module in model.named_modules(remove_duplicate=False):
            self._known.add(id(module))
            path = layout.path(raw_path)
            if not path or _is_compiled(module) or layout.is_wrapper(module) or id(module) in seen:
                continue
            seen.add(id(module))
            base = f"{self.module_prefix}.{prefix}{path}.{layout.class_name(module)}"
            if include is not None and not include(base):
                continue
            self._hook_module(module, base, sink, backward, compiled, native, layout)
            hooked.append(path)
        if compiled and not self._compiled_seen:
            self._compiled_seen = True
            self._notes.append(
                f"compiled model (torch.compile): {len(hooked)} module boundaries kept through "
                "compilation; every hooked module boundary is a graph break, the code between "
                "boundaries stays compiled (torch._dynamo.disable on the dump hooks)"
                if self.keep_compiled_boundaries else
                "compiled model (torch.compile): the calls inside compiled code are not recorded "
                "(the hooks are left out of the compiled graphs, which stay whole: the training's "
                "numbers are the same as without the dump); modules run eagerly and every "
                "parameter's gradient are")
        return hooked

    def _py_hooks(self, sink: HookSink) -> Any:
        """The library's hooks that call Python as they fire, handing gradients over read when
        ``sink`` takes them so, or None (asked once)."""
        if self._hooks is None:
            from probe.engine_adapter.torch_grads import PreparedGrad, hooks
            accept = getattr(sink, "accept_prepared_grads", None)
            self._hooks = hooks(prepared=accept is not None and accept(PreparedGrad)) or False
        return self._hooks or None

    def _native_capture(self, sink: HookSink, model: Any) -> Any:
        """The C++ backward capture when ``sink`` takes gradients already read (asked once) and
        ``model`` trains on the CPU (on a device every gradient would go back to Python one by
        one: the Python hooks do that already)."""
        if any(not p.is_cpu for p in model.parameters()):
            return None
        if self._native is None:
            self._native = False
            accept = getattr(sink, "accept_prepared_grads", None)
            if accept is not None:
                from probe.engine_adapter.torch_grads import PreparedGrad, load
                if accept(PreparedGrad, replayed=True):
                    self._native = load(sink.backward_started) or False
                    if self._native:
                        # a model attached as its first call starts (a script's, found by
                        # watch_models) comes after the step began: record this step too
                        self._native.begin_step(self._recording)
        return self._native or None

    def _hook_module(self, module: torch.nn.Module, base: str, sink: HookSink, backward: bool,
                     compiled: bool, native: Any = None, layout: ModelLayout | None = None) -> None:
        key = id(module)
        guard = self.guard
        hooks = self._py_hooks(sink) if backward and native is None else None
        open_calls: list[tuple[str | None, _ModuleBackward | None]] = []
        layout = layout if layout is not None else ModelLayout(module)
        own_params = layout.params(module)
        watch_live = None               # set below: hooks the gradients of parameters as run
        #: this step's recorded calls, for a recomputation (activation checkpointing) to
        #: take its original call's name: [step token, name, ...]
        done: list[Any] = [None]
        adapter = self

        def pre(mod, args, kwargs):
            if _tracing() or not sink.active:
                open_calls.append((None, None))
                return None
            if native is not None and native.pending():
                native.drain()          # the last backward's gradients first (accumulation)
            with guard, _plain_tensors():
                if _in_backward():
                    # a forward run by the backward pass: activation checkpointing's
                    # recomputation. Not a new call: not recorded; its backward (reentrant
                    # checkpointing backpropagates through this graph) is the original's
                    name = done.pop() if done[0] is adapter._step_token and len(done) > 1 else None
                    recomputed = True
                else:
                    name = sink.module_forward_pre(base, key, args, kwargs)
                    recomputed = False
                    if name is not None:
                        if done[0] is not adapter._step_token:
                            done[:] = [adapter._step_token]
                        done.append(name)
                if name is None or not backward or not torch.is_grad_enabled():
                    open_calls.append((None if recomputed else name, None))
                    return None
                call = _ModuleBackward(sink, guard, name, key, native, hooks)
                call.recomputed = recomputed
                call.start = start_mark()
                call.inputs = flat_tensors((args, kwargs))
                open_calls.append((name, call))
                return None

        def post(mod, args, kwargs, output):
            name, call = open_calls.pop() if open_calls else (None, None)
            if name is None or not sink.active:
                return None
            with guard, _plain_tensors():
                params = layout.live(mod, own_params)
                if call is None or not call.recomputed:
                    sink.module_forward(name, key, output, params)
                if call is not None and watch_live is not None:
                    watch_live(params)
                if call is not None:
                    try:
                        call.watch(output)
                    except Exception as e:  # noqa: BLE001 - never break the user's call
                        sink.report_error(f"the backward capture of {name}", e)
            return None

        # (no torch._dynamo.disable for a compiled model by default: each hooked boundary would
        # be a graph break, and the kernels compiled around the breaks round differently; the
        # hooks start with _tracing(), a constant while Dynamo traces, and are not in the
        # compiled graph. keep_compiled_boundaries: the breaks, and the calls recorded)
        if compiled and self.keep_compiled_boundaries:
            disable = torch._dynamo.disable
            pre, post = disable(pre), disable(post)
        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        # in a sharded model, before the wrapper's own forward hook frees the parameters
        self._handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True,
                                                          prepend=layout.sharded))
        if not backward:
            return
        trainable = [(n, p) for n, p in own_params if p.requires_grad]
        later: dict[str, Callable[[Any], Any]] = {}
        for pname, param in trainable:
            hook = self._param_hook(sink, base, key, pname, len(trainable),
                                    hooks.prepare if hooks is not None else None)
            if not layout.hook_at_attach(param):
                later[pname] = native.first_grad(hook) if native is not None else hook
                continue
            self._handles.append(native.watch_param(param, hook) if native is not None
                                 else param.register_post_accumulate_grad_hook(_accumulated(hook)))
        if later:
            watch_live = self._live_grads(later)

    def _live_grads(self, hooks: dict[str, Callable[[Any], Any]]) -> Callable[[list], None]:
        """``watch(params)``: hook the gradients of a module's parameters as it runs (name ->
        hook in ``hooks``), in a sharded model: FSDP2's unsharded parameter (one tensor kept
        across steps: hooked once, the hook removed with the dump's) or FSDP1's views of the
        flat parameter (new each forward: hooked each time, gone with the graph)."""
        watched: dict[str, Any] = {}

        def watch(params: list) -> None:
            for pname, t in params:
                hook = hooks.get(pname)
                try:
                    if hook is None or not t.requires_grad:
                        continue
                    if t.is_leaf:
                        ref = watched.get(pname)
                        if ref is not None and ref() is t:
                            continue
                        watched[pname] = weakref.ref(t)
                        self._handles.append(t.register_hook(hook))
                    else:
                        t.register_hook(hook)
                except RuntimeError:    # a tensor autograd takes no hook on: no gradient entry
                    continue
        return watch

    def _param_hook(self, sink: HookSink, base: str, key: int, pname: str, expected: int,
                    prepare: Callable[[Any], Any] | None = None):
        """The hook of a parameter's gradient (``prepare``: the library's, see
        :class:`probe.engine_adapter.torch_grads.CallingHooks`; the gradient is kept read, not as
        the tensor, until the module's other parameters' come)."""
        guard = self.guard

        def hook(grad):
            if sink.active:
                with guard, _plain_tensors():
                    sink.parameter_grad(base, key, pname, grad if prepare is None else prepare(grad),
                                        expected)
            return None
        return hook

    # ----------------------------------------------------------------- APIs
    def attach_api(self, sink: HookSink, *, backward: bool = True,
                   include: Callable[[str], bool] | None = None) -> None:
        from probe.engine_adapter.torch_api import ApiMode
        if self._api_mode is None:
            self._api_mode = ApiMode(sink, self.guard, backward=backward,
                                     hooks=self._py_hooks(sink) if backward else None)
            self._api_mode.__enter__()
            self._handles.append(_Closer(self._close_api))
        self._notes.extend(self._api_mode.attach_comm())

    def _close_api(self) -> None:
        if self._api_mode is not None:
            mode, self._api_mode = self._api_mode, None
            mode.detach_comm()
            try:
                mode.__exit__(None, None, None)
            except (RuntimeError, AssertionError, IndexError):
                pass

    # ----------------------------------------------------------------- steps and models
    def watch_steps(self, on_step: Callable[[], None]) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        guard = self.guard

        def hook(optimizer, args, kwargs):
            if self._steps_off:
                return
            self._in_step_hook += 1
            try:
                with guard, _plain_tensors():
                    on_step()
            finally:
                self._in_step_hook -= 1
        self._step_handles.append(register_optimizer_step_post_hook(hook))

    def watch_models(self, on_model: Callable[[Any], None]) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook
        known = self._known

        def hook(module, args):
            # (first: under torch.compile this global hook is traced into every compiled
            # module's graph; the check is a constant there and the hook adds nothing)
            if _tracing():
                return None
            if id(module) not in known:
                known.update(id(m) for m in module.modules())
                on_model(module)
            return None
        self._handles.append(register_module_forward_pre_hook(hook))

    def recording(self, active: bool) -> None:
        self._recording = active
        self._step_token = object()
        if self._native:
            self._native.begin_step(active)
        if self._hooks:
            self._hooks.new_step()

    def finish_pending(self) -> None:
        from probe.engine_adapter.torch_api import drop_leaf_hooks, finish_partial_backward
        if self._native:
            self._native.end_step()
        finish_partial_backward()
        drop_leaf_hooks()

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        with self.guard, _plain_tensors():
            yield

    def root_prefix(self) -> str:
        """The name prefix of the next root model in script mode ('' for the first)."""
        self._roots += 1
        return "" if self._roots == 1 else f"model{self._roots - 1}."

    def detach(self) -> None:
        from probe.engine_adapter.torch_api import drop_leaf_hooks, forget_partial_backward
        drop_leaf_hooks()
        if self._native:
            self._native.forget()
        self._native = None
        if self._hooks:
            self._hooks.forget()
        self._hooks = None
        forget_partial_backward()
        handles, self._handles = self._handles, []
        if self._in_step_hook:
            self._steps_off = True
        else:
            handles = self._step_handles + handles
            self._step_handles = []
        for h in reversed(handles):
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - removing twice or after teardown is fine
                pass
        self._known.clear()

    # ----------------------------------------------------------------- distributed
    def rank(self) -> int:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0") or 0)

    def world_size(self) -> int:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1") or 1)

    def notes(self) -> list[str]:
        return list(self._notes)


class _ModuleBackward:
    """The backward of one module call, without ``register_full_backward_hook``'s machinery.

    Each output's autograd node gets a pre-hook (the gradients of the outputs, msprobe's
    backward ``input``; the outputs are found through tuples, lists, dicts, ``ModelOutput``
    and dataclasses) and each node the call made that takes one of its differentiable inputs a
    post-hook (the gradients of the inputs, msprobe's backward ``output``:
    :func:`~probe.engine_adapter.torch_api.capture_edges`). No node is added to the graph: an
    identity node in front of the inputs (``register_full_backward_hook``'s) changes the order
    autograd adds an input's gradients up in, and the training in the last bits. The entry is
    emitted when the input gradients arrive, or, for a module whose inputs need no gradient
    (an embedding), when the last output gradient arrives.
    """

    __slots__ = ("sink", "guard", "name", "key", "native", "hooks", "captured", "grad_outputs",
                 "watched", "waiting", "recomputed", "start", "inputs")

    def __init__(self, sink: HookSink, guard: ReentryGuard, name: str, key: int,
                 native: Any = None, hooks: Any = None) -> None:
        self.sink, self.guard, self.name, self.key = sink, guard, name, key
        self.native = native
        self.hooks = hooks
        self.captured = False
        self.grad_outputs: list[Any] = []
        self.watched = 0
        self.waiting = 0
        self.recomputed = False
        self.start: int | None = None
        self.inputs: list[Any] = []

    def watch(self, output: Any) -> None:
        """The call returned ``output``: hook its outputs' and its inputs' gradients."""
        outs = flat_tensors(output)
        self.watch_outputs(outs)
        inputs, self.inputs = [t for t in self.inputs if t.requires_grad], []
        if inputs:
            outs = [o for o in outs if o.requires_grad]
            if self.native is not None:     # the same hooks in C++, their gradients queued
                self.captured = self.native.capture_edges(inputs, outs, self.start, self)
            else:
                self.captured = capture_edges(self, inputs, outs, self.start,
                                              prepare=getattr(self.hooks, "prepare", None))

    def watch_outputs(self, outs: list) -> None:
        self.grad_outputs = [None] * len(outs)
        in_cpp = self.native if self.native is not None else self.hooks
        if in_cpp is not None:
            watched, leaves = in_cpp.watch(outs, self._on_output)
            for i in leaves:
                watch_gradient(outs[i], self._output_hook(i, getattr(in_cpp, "prepare", None)))
            self.watched += watched
        else:
            for i, o in enumerate(outs):
                if isinstance(o, torch.Tensor) and o.requires_grad:
                    self.watched += 1
                    watch_gradient(o, self._output_hook(i))
        self.waiting = self.watched

    def _output_hook(self, i: int, prepare: Callable[[Any], Any] | None = None):
        def hook(grad):
            self._on_output(i, grad if prepare is None else prepare(grad))
        return hook

    def _on_output(self, i: int, grad: Any) -> None:
        """The gradient of output ``i`` arrived."""
        if not self.sink.active:
            return
        self.grad_outputs[i] = grad
        self.waiting -= 1
        if not self.captured and self.waiting == 0:
            self.finish(())

    def input_grad(self, j: int, grad: Any) -> None:
        """The gradient of the one input (a hook of the library's ``capture``)."""
        self.finish((grad,))

    def finish(self, grads: tuple) -> None:
        if not self.sink.active:
            return
        try:
            with self.guard, _plain_tensors():
                self.sink.module_backward(self.name, self.key, self.grad_outputs, grads)
        finally:
            # recorded: let the output gradients go now (the hooks, and this object, live as long
            # as the graph: holding them made backward allocate fresh memory instead of reusing
            # theirs), and be ready for another backward through a retained graph
            self.grad_outputs = [None] * len(self.grad_outputs)
            self.waiting = self.watched


class _Closer:
    """A handle whose ``remove()`` calls a function (for uniform teardown)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def remove(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()


ADAPTER = TorchAdapter
