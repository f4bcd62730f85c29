"""API-level interception for PyTorch: ``Torch.*``, ``Functional.*``, ``Tensor.*``, ``Distributed.*``.

Each public function of ``torch``, ``torch.nn.functional`` and each public ``Tensor`` method
(operators such as ``__mul__`` included) is replaced by a thin wrapper for as long as the
dump is attached, and put back on detach. The wrapper reports the call with the names
msprobe uses (``Tensor.__mul__``, ``Functional.linear``, ``Torch.matmul``), so ``x * y`` and
``x.mul(y)`` stay apart. Calls made inside a recorded call are not recorded again (as msprobe).

Inputs are described *before* the call runs, so an in-place op (``add_``, ``__iadd__``,
``__setitem__``) records its input as it was at the call and its output as it is after.
Backward: each differentiable tensor input passes through an identity autograd node whose
backward sees its gradient (a C++ view node with a hook; a Python autograd Function for
inputs that are not strided, whose views autograd does not make), and a pre-hook on each
output's autograd node sees the gradient of that output; together they make the ``...backward``
entry, once every input's gradient is in (or at the end of the step, with those that came, when
a backward computed only some of them: ``torch.autograd.grad`` for some inputs). In-place
calls and ``out=`` calls have no backward entry (an identity node in front of an in-place op is
not allowed by autograd).

``torch.distributed`` collectives are not wrapped here: the dump registers a listener with
:mod:`probe.engine_adapter.torch_comm`, the one wrapper of collectives, and records
``Distributed.all_reduce.<n>.forward`` from it.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch

#: inside dump code, tensor subclasses (``nn.Parameter``) skip their Python ``__torch_function__``
_plain_tensors = torch._C.DisableTorchFunctionSubclass

_OPERATOR_DUNDERS = {
    f"__{n}__" for n in (
        "add radd iadd sub rsub isub mul rmul imul truediv rtruediv itruediv div rdiv idiv "
        "floordiv rfloordiv ifloordiv mod rmod imod pow rpow ipow matmul rmatmul neg pos abs "
        "invert and rand iand or ror ior xor rxor ixor lshift rlshift ilshift rshift rrshift "
        "irshift eq ne lt le gt ge getitem setitem").split()
}

_TENSOR_SKIP = {
    "backward", "register_hook", "register_post_accumulate_grad_hook", "retain_grad",
    "requires_grad_", "item", "tolist", "numpy", "size", "dim", "numel", "nelement", "ndimension",
    "stride", "storage_offset", "data_ptr", "element_size", "get_device", "storage",
    "untyped_storage", "has_names", "dim_order", "as_subclass", "share_memory_", "pin_memory",
    "type", "nbytes", "itemsize", "refine_names", "rename", "rename_",
    "align_to", "unflatten_names", "module_load", "apply_", "map_", "map2_", "record_stream",
    "detach", "detach_", "cpu", "cuda", "__torch_function__",
}

_TORCH_SKIP_PREFIX = ("is_", "set_", "get_", "use_", "are_", "_", "compile", "manual_seed",
                      "initial_seed", "seed", "load", "save", "typename", "can_cast",
                      "promote_types", "result_type", "from_numpy", "frombuffer", "asarray",
                      "sym_", "vmap", "cond", "export", "jit", "autocast", "enable_", "inference_mode",
                      "no_grad", "wait", "fork", "align_tensors", "broadcast_shapes")

_F_SKIP = {"has_torch_function", "has_torch_function_unary", "has_torch_function_variadic",
           "handle_torch_function", "boolean_dispatch", "assert_int_or_pair"}


def _is_plain_callable(obj: Any) -> bool:
    return isinstance(obj, (types.BuiltinFunctionType, types.FunctionType,
                            types.MethodDescriptorType, types.WrapperDescriptorType))


def api_table() -> list[tuple[Any, str, str, Any]]:
    """Every wrapped API: ``(owner, attribute, dump name, original)``.

    >>> any(name == "Functional.linear" for _, _, name, _ in api_table())
    True
    """
    table: list[tuple[Any, str, str, Any]] = []
    for attr in dir(torch.Tensor):
        if attr in _TENSOR_SKIP or attr.startswith("is_"):
            continue
        if attr.startswith("_") and attr not in _OPERATOR_DUNDERS:
            continue
        orig = getattr(torch.Tensor, attr, None)
        if _is_plain_callable(orig):
            table.append((torch.Tensor, attr, f"Tensor.{attr}", orig))
    for attr in dir(torch):
        if attr.startswith(_TORCH_SKIP_PREFIX) or attr[0].isupper():
            continue
        orig = getattr(torch, attr, None)
        if _is_plain_callable(orig) and not isinstance(orig, type):
            module = getattr(orig, "__module__", None) or "torch"
            if module.startswith("torch") and not module.startswith(("torch.nn", "torch.autograd",
                                                                     "torch.utils", "torch._")):
                table.append((torch, attr, f"Torch.{attr}", orig))
    functional = torch.nn.functional
    for attr in dir(functional):
        if attr.startswith("_") or attr in _F_SKIP or attr[0].isupper():
            continue
        orig = getattr(functional, attr, None)
        if _is_plain_callable(orig):
            module = getattr(orig, "__module__", None) or "torch.nn.functional"
            if module.startswith(("torch.nn.functional", "torch._C", "torch")) and "typing" not in module:
                table.append((functional, attr, f"Functional.{attr}", orig))
    return table


def _is_inplace(attr: str) -> bool:
    if attr.startswith("__i") and attr.endswith("__"):
        return True
    return attr == "__setitem__" or (attr.endswith("_") and not attr.endswith("__"))


class _Capture(torch.autograd.Function):
    """Identity on the differentiable inputs of a call; its backward hands their gradients to
    ``call.finish(grads)`` (an API call here, a module call in the adapter). Used for calls
    with several differentiable inputs; one input goes through :func:`_alias` instead."""

    @staticmethod
    def forward(ctx, call, *tensors):  # noqa: ANN001 - autograd signature
        ctx.call = call
        return tensors

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001 - autograd signature
        ctx.call.finish(grads)
        return (None, *grads)


def _alias(call: Any, t: torch.Tensor) -> torch.Tensor:
    """``t`` through one C++ view node whose post-hook hands the gradient of ``t`` along this
    path to ``call.finish``: the same gradient as :class:`_Capture`, without a Python autograd
    Function (its forward and backward cost several times more)."""
    alias = t.view_as(t)
    alias.grad_fn.register_hook(lambda grad_inputs, grad_outputs: call.finish(grad_inputs[:1]))
    return alias


class _Gather:
    """The gradients of a call's several inputs, each through its own view node (:func:`_alias`
    per input): ``call.finish(grads)`` once all have arrived. A Python autograd Function over
    them all (:class:`_Capture`) gives the same gradients at several times the cost (its forward
    and backward run in Python: a mix-level step of the bundled engine has ~43 such calls).
    One whose backward computed only some inputs' gradients is finished with those by
    :func:`finish_partial_backward` at the end of the step."""

    __slots__ = ("call", "grads", "waiting")

    def __init__(self, call: Any, count: int) -> None:
        self.call = call
        self.grads: list[Any] = [None] * count
        self.waiting = count

    def hook(self, j: int):
        """Input ``j``'s view node's hook."""
        def on_grad(grad_inputs, grad_outputs):  # noqa: ANN001 - autograd's node hook
            self.on_grad(j, grad_inputs[0])
        return on_grad

    def on_grad(self, j: int, grad: Any) -> None:
        """The gradient of input ``j`` arrived."""
        grads = self.grads
        if self.waiting == len(grads):
            _PARTIAL[self] = None
        grads[j] = grad
        self.waiting -= 1
        if self.waiting == 0:
            self.finish()

    def finish(self) -> None:
        _PARTIAL.pop(self, None)
        grads = tuple(self.grads)
        self.grads = [None] * len(grads)     # ready for another backward (a retained graph)
        self.waiting = len(grads)
        self.call.finish(grads)


#: gathers with some of their gradients in (see :class:`_Gather`), held strongly: a backward
#: that computed only some inputs' gradients may free its graph (the gathers' other holders)
#: before the step ends; in the order their first gradient came (a set's order, by address,
#: made the entries' order differ between two runs of the same script)
_PARTIAL: dict[_Gather, None] = {}


def finish_partial_backward() -> None:
    """Finish every call whose backward computed only some of its inputs' gradients."""
    while _PARTIAL:
        next(iter(_PARTIAL)).finish()


def forget_partial_backward() -> None:
    """Drop the calls still waiting for some gradients (the dump is detached)."""
    _PARTIAL.clear()


def _alias_each(call: Any, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Each of ``tensors`` through its own view node; ``call.finish(grads)`` once all are in."""
    gather = _Gather(call, len(tensors))
    out = []
    for j, t in enumerate(tensors):
        alias = t.view_as(t)
        alias.grad_fn.register_hook(gather.hook(j))
        out.append(alias)
    return tuple(out)


class _Finisher:
    """A call for :class:`_Capture` whose ``finish`` is ``fn``."""

    __slots__ = ("finish",)

    def __init__(self, fn: Callable[[tuple], Any]) -> None:
        self.finish = fn


class _Call:
    """One recorded call waiting for its gradients."""

    __slots__ = ("sink", "guard", "token", "grad_outputs")

    def __init__(self, sink: Any, guard: Any, token: Any) -> None:
        self.sink = sink
        self.guard = guard
        self.token = token
        self.grad_outputs: list[Any] = []

    def output_hook(self, i: int, prepare: Callable[[Any], Any] | None = None):
        def hook(grad):
            self.grad_outputs[i] = grad if prepare is None else prepare(grad)
        return hook

    def output_grad(self, i: int, grad: Any) -> None:
        """The gradient of output ``i`` (a hook of the library's ``watch``)."""
        self.grad_outputs[i] = grad

    def input_grad(self, j: int, grad: Any) -> None:
        """The gradient of the one input (a hook of the library's ``capture``)."""
        self.finish((grad,))

    def finish(self, grads: tuple) -> None:
        try:
            with self.guard, _plain_tensors():
                self.sink.api_backward(self.token, self.grad_outputs, grads)
        finally:
            self.grad_outputs = [None] * len(self.grad_outputs)   # recorded: let them go


def wrap_inputs(call: Any, args: tuple, kwargs: dict, native: Any = None,
                hooks: Any = None) -> tuple[tuple, dict, bool]:
    """Route the differentiable tensors of ``args``/``kwargs`` through capture nodes
    (:func:`_alias` for one tensor, :func:`_alias_each` for several strided ones,
    :class:`_Capture` otherwise). With ``native`` (:class:`probe.engine_adapter.torch_grads.NativeGrads`,
    replaying as the step ends) or ``hooks`` (:func:`probe.engine_adapter.torch_grads.hooks`, calling
    as they fire), strided ones go through its ``capture``: the same view nodes hooked in C++,
    reaching ``call.input_grad`` (one input) or a :class:`_Gather`'s ``on_grad``."""
    slots: list[tuple] = []
    tensors: list[torch.Tensor] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                slots.append(("a", i, None))
                tensors.append(a)
        elif isinstance(a, (list, tuple)):
            for j, b in enumerate(a):
                if isinstance(b, torch.Tensor) and b.requires_grad:
                    slots.append(("a", i, j))
                    tensors.append(b)
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.requires_grad:
            slots.append(("k", k, None))
            tensors.append(v)
    if not tensors:
        return args, kwargs, False
    strided = torch.strided
    in_cpp = native if native is not None else hooks
    if in_cpp is not None and all(t.layout is strided for t in tensors):
        wrapped = in_cpp.capture(tensors, call.input_grad if len(tensors) == 1
                                 else _Gather(call, len(tensors)).on_grad)
    elif native is not None:        # a Python autograd Function: what the C++ hooks queued first
        wrapped = _Capture.apply(_Finisher(native.first(call.finish)), *tensors)
    elif len(tensors) == 1 and tensors[0].layout is strided:
        wrapped = (_alias(call, tensors[0]),)
    elif all(t.layout is strided for t in tensors):
        wrapped = _alias_each(call, tensors)
    else:
        wrapped = _Capture.apply(call, *tensors)
    new_args = list(args)
    new_kwargs = dict(kwargs)
    for (where, key, inner), t in zip(slots, wrapped):
        if where == "k":
            new_kwargs[key] = t
        elif inner is None:
            new_args[key] = t
        else:
            seq = list(new_args[key])
            seq[inner] = t
            new_args[key] = type(new_args[key])(seq) if isinstance(new_args[key], tuple) else seq
    return tuple(new_args), new_kwargs, True


def watch_gradient(t: torch.Tensor, hook: Any) -> None:
    """Call ``hook(grad)`` with the gradient of ``t`` when backward computes it.

    A pre-hook on ``t``'s autograd node (C++, about half the cost of ``Tensor.register_hook``);
    a tensor hook for a leaf, which has no node.
    """
    node = t.grad_fn
    if node is None:
        t.register_hook(hook)
        return
    k = t.output_nr
    node.register_prehook(lambda grad_outputs: hook(grad_outputs[k]))


def _hook_outputs(call: _Call, output: Any, hooks: Any = None) -> None:
    outs = output if isinstance(output, (tuple, list)) else (output,)
    call.grad_outputs = [None] * len(outs)
    if hooks is not None:
        for i in hooks.watch(outs, call.output_grad)[1]:      # leaves: a tensor hook
            outs[i].register_hook(call.output_hook(i, hooks.prepare))
        return
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and o.requires_grad:
            watch_gradient(o, call.output_hook(i))


def make_wrapper(orig: Any, api: str, inplace: bool, sink: Any, guard: Any, backward: bool,
                 hooks: Any = None) -> Any:
    """The wrapper that records one API (see the module docstring); ``hooks``: the library's
    hooks (:func:`probe.engine_adapter.torch_grads.hooks`), None for the Python ones."""

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if guard.depth or not sink.active:
            return orig(*args, **kwargs)
        with guard:
            with _plain_tensors():
                token = sink.api_call(api, args, kwargs)
            if token is None:
                return orig(*args, **kwargs)
            call = None
            if backward and not inplace and "out" not in kwargs and torch.is_grad_enabled():
                call = _Call(sink, guard, token)
                try:
                    args, kwargs, captured = wrap_inputs(call, args, kwargs, None, hooks)
                except Exception as e:  # noqa: BLE001 - never break the user's call
                    sink.report_error(f"the backward capture of {api}", e)
                    captured = False
                if not captured:
                    call = None
            output = orig(*args, **kwargs)
            with _plain_tensors():
                sink.api_return(token, output)
                if call is not None:
                    _hook_outputs(call, output, hooks)
            return output

    wrapper.__probe_original__ = orig
    return wrapper


class _CommListener:
    """Records ``Distributed.<op>`` entries from :mod:`probe.engine_adapter.torch_comm` calls."""

    def __init__(self, sink: Any, guard: Any) -> None:
        self.sink = sink
        self.guard = guard

    def on_comm_start(self, call: Any) -> None:
        if self.guard.depth or not self.sink.active:
            return
        with self.guard:
            call.state["probe_token"] = self.sink.api_call(f"Distributed.{call.op}", call.args, call.kwargs)

    def on_comm_end(self, call: Any) -> None:
        token = call.state.pop("probe_token", None)
        if token is None:
            return
        with self.guard:
            result = call.result
            if result is None or not isinstance(result, torch.Tensor):
                first = call.args[0] if call.args else next(iter(call.kwargs.values()), None)
                result = first if isinstance(first, (torch.Tensor, list)) else result
            self.sink.api_return(token, result)


class ApiMode:
    """Installs the API wrappers (and the collective listener) for one sink; undone by ``__exit__``."""

    def __init__(self, sink: Any, guard: Any, *, backward: bool = True, hooks: Any = None) -> None:
        self.sink = sink
        self.guard = guard
        self.backward = backward
        self.hooks = hooks
        self._patched: list[tuple[Any, str, Any]] = []
        self._listener: Any = None

    def __enter__(self) -> "ApiMode":
        for owner, attr, name, orig in api_table():
            if getattr(orig, "__probe_original__", None) is not None:
                continue
            wrapper = make_wrapper(orig, name, _is_inplace(attr), self.sink, self.guard, self.backward,
                                   self.hooks)
            try:
                setattr(owner, attr, wrapper)
            except (TypeError, AttributeError):
                continue
            self._patched.append((owner, attr, orig))
        return self

    def __exit__(self, *exc: object) -> None:
        patched, self._patched = self._patched, []
        for owner, attr, orig in reversed(patched):
            setattr(owner, attr, orig)

    def attach_comm(self) -> list[str]:
        """Record ``torch.distributed`` collectives through the shared wrapper."""
        if self._listener is not None:
            return []
        try:
            from probe.engine_adapter import torch_comm
        except ImportError:
            return ["torch.distributed collectives are not recorded: engine_adapter.torch_comm "
                    "is not available"]
        self._listener = torch_comm.add_listener(_CommListener(self.sink, self.guard))
        return []

    def detach_comm(self) -> None:
        if self._listener is not None:
            from probe.engine_adapter import torch_comm
            torch_comm.remove_listener(self._listener)
            self._listener = None
