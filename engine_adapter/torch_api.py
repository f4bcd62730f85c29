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
_is_compiling = torch.compiler.is_compiling
#: how many dispatch modes are active; the id of the backward pass this thread runs, -1 outside
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)

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


def flat_tensors(x: Any, out: list | None = None, depth: int = 0) -> list:
    """The tensors of ``x``, in order, through lists, tuples (namedtuples too), dicts
    (``transformers``' ``ModelOutput`` is one) and dataclasses; other objects (a ``Cache``) are
    not looked into.

    >>> import collections, dataclasses
    >>> @dataclasses.dataclass
    ... class Out:
    ...     a: Any
    ...     b: Any = None
    >>> t = torch.ones(1)
    >>> len(flat_tensors([t, {"x": t, "y": (t, 1)}, Out(t, collections.OrderedDict(z=t))]))
    5
    """
    if out is None:
        out = []
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif depth > 8 or x is None or isinstance(x, (str, bytes, int, float)):
        pass
    elif isinstance(x, (list, tuple)):
        for v in x:
            flat_tensors(v, out, depth + 1)
    elif isinstance(x, dict):
        for v in x.values():
            flat_tensors(v, out, depth + 1)
    elif hasattr(type(x), "__dataclass_fields__") and not isinstance(x, type):
        for f in type(x).__dataclass_fields__:
            flat_tensors(getattr(x, f, None), out, depth + 1)
    return out


#: the current autograd sequence number of this thread (nodes made from now on have it or more)
_sequence_nr = getattr(torch._C._autograd, "_get_sequence_nr", None)


def start_mark() -> int | None:
    """The autograd sequence number now: :func:`capture_edges` finds the nodes a call made
    (None where torch has no such counter: every reachable node counts)."""
    return _sequence_nr() if _sequence_nr is not None else None


class _EdgeGather(_Gather):
    """The gradients of a call's inputs read where they leave the call: a post-hook on each
    node the call made that takes an input (its *consumer*), with no node added to the graph.

    An identity node in front of the inputs (:func:`_alias`, ``register_full_backward_hook``'s)
    adds up the call's gradient contributions to an input before autograd adds them to the
    ones from outside the call: ``a + (b + c)`` instead of autograd's ``(a + b) + c``, which
    moves the gradients (and the training) in the last bits. Here autograd's own sums are not
    touched; an input with several contributions inside the call gets their sum (in the order
    they came) made apart, for the dump alone."""

    __slots__ = ("expected", "parts", "prepare")

    def __init__(self, call: Any, count: int, expected: int,
                 prepare: Callable[[Any], Any] | None = None) -> None:
        super().__init__(call, count)
        self.expected = expected
        self.prepare = prepare
        self.waiting = expected
        self.parts: list[list] = [[] for _ in range(count)]

    def edge_hook(self, edges: list[tuple[int, int]], prepare: Callable[[Any], Any] | None,
                  single: set[int]):
        """The post-hook of one consumer node: ``edges`` are ``(index of the node's next
        edge, input)``; ``single``: the inputs with one contribution (handed over prepared)."""
        def on_grads(grad_inputs, grad_outputs):  # noqa: ANN001 - autograd's node hook
            for i, j in edges:
                g = grad_inputs[i] if i < len(grad_inputs) else None
                if prepare is not None and j in single and g is not None:
                    g = prepare(g)
                self.on_part(j, g)
        return on_grads

    def on_part(self, j: int, grad: Any) -> None:
        if self.waiting == self.expected:
            _PARTIAL[self] = None
        if grad is not None:
            self.parts[j].append(grad)
        self.waiting -= 1
        if self.waiting == 0:
            self.finish()

    def finish(self) -> None:
        _PARTIAL.pop(self, None)
        grads = []
        for parts in self.parts:
            if not parts:
                grads.append(None)
            elif len(parts) == 1:
                grads.append(parts[0])
            else:
                with torch.no_grad(), _plain_tensors():
                    total = parts[0]
                    for p in parts[1:]:
                        total = total + p
                grads.append(total if self.prepare is None else self.prepare(total))
        self.parts = [[] for _ in self.parts]
        self.waiting = self.expected
        self.call.finish(tuple(grads))


def capture_edges(call: Any, inputs: list, outputs: list, start: int | None,
                  prepare: Callable[[Any], Any] | None = None,
                  wrap: Callable[[Callable], Callable] | None = None) -> bool:
    """Hook the nodes a call made (sequence number ``start`` or more, reached from its
    ``outputs``' nodes) where they take one of its ``inputs`` (tensors requiring grad):
    ``call.finish(grads)``, one gradient (or None) per input, once all have run, or with those
    that came at the end of the step (:func:`finish_partial_backward`). Nothing is added to
    the graph and no gradient is changed (see :class:`_EdgeGather`). ``wrap``: applied to
    each hook (the C++ capture's ``first``: its queue replayed before). Whether any was hooked."""
    if not inputs or not outputs:
        return False
    targets: dict[tuple[int, int], int] = {}
    leaves: dict[int, int] = {}     # a leaf's node (AccumulateGrad) is found by its variable
    for j, t in enumerate(inputs):
        node = t.grad_fn
        if node is None:
            leaves.setdefault(id(t), j)
        else:
            targets.setdefault((id(node), t.output_nr), j)
    if not targets and not leaves:
        return False
    floor = -1 if start is None else start
    stack = []
    for o in outputs:
        node = o.grad_fn
        if node is not None and node._sequence_nr() >= floor:
            stack.append(node)
    seen: set[int] = set()
    found: list[tuple[Any, list[tuple[int, int]]]] = []
    counts = [0] * len(inputs)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        hits = None
        for i, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            j = targets.get((id(nxt), nr))
            if j is None and leaves and not nxt.next_functions:
                j = leaves.get(id(getattr(nxt, "variable", None)))
            if j is not None:
                if hits is None:
                    hits = []
                hits.append((i, j))
                counts[j] += 1
            elif id(nxt) not in seen and nxt._sequence_nr() >= floor and nxt.next_functions:
                stack.append(nxt)
        if hits is not None:
            found.append((node, hits))
    if not found:
        return False
    gather = _EdgeGather(call, len(inputs), sum(counts), prepare)
    single = {j for j, c in enumerate(counts) if c == 1}
    for node, hits in found:
        hook = gather.edge_hook(hits, prepare, single)
        node.register_hook(wrap(hook) if wrap is not None else hook)
    return True


def _capture_call(call: Any, inputs: list, outputs: list, start: int | None, hooks: Any) -> bool:
    """:func:`capture_edges` for an API call; with the library's ``hooks`` the same walk and
    hooks in C++ (one call, no Python hook per node: at mix level the Python walk and its
    hooks were half the dump's cost on the training thread), each input's contributions added
    up there and handed to ``call`` as they complete."""
    if hooks is None:
        return capture_edges(call, inputs, outputs, start)
    if not inputs or not outputs:
        return False
    if len(inputs) == 1:
        return bool(hooks.capture_edges(inputs, outputs, start or 0, call.input_grad))
    gather = _EdgeGather(call, len(inputs), 0)
    taken = hooks.capture_edges(inputs, outputs, start or 0, gather.on_part)
    gather.expected = gather.waiting = len(taken)
    return bool(taken)


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


def _grad_inputs(args: tuple, kwargs: dict) -> list:
    """The tensors requiring grad of an API call's arguments (in lists and tuples too)."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(b for b in a if isinstance(b, torch.Tensor) and b.requires_grad)
    for v in kwargs.values():
        if isinstance(v, torch.Tensor) and v.requires_grad:
            found.append(v)
    return found


#: the hooks put on leaf tensors (a call's output that is a parameter or an input: no node to
#: hook) this step: removed as the step ends (:func:`drop_leaf_hooks`). A leaf lives across
#: steps, so its hooks would pile up, one more each step for every call that returns it
#: (``weight.to(weight.dtype)`` is the weight): every later backward running them all.
_LEAF_HANDLES: list[Any] = []


def hook_leaf(t: torch.Tensor, hook: Any) -> None:
    """``t.register_hook(hook)`` for this step only (see :data:`_LEAF_HANDLES`)."""
    _LEAF_HANDLES.append(t.register_hook(hook))


def drop_leaf_hooks() -> None:
    """Remove the hooks :func:`hook_leaf` put on leaves (a step ended, or the dump detached)."""
    handles = _LEAF_HANDLES[:]
    _LEAF_HANDLES.clear()
    for h in handles:
        h.remove()


def watch_gradient(t: torch.Tensor, hook: Any) -> None:
    """Call ``hook(grad)`` with the gradient of ``t`` when backward computes it.

    A pre-hook on ``t``'s autograd node (C++, about half the cost of ``Tensor.register_hook``);
    a tensor hook for a leaf, which has no node (for this step: :func:`hook_leaf`).
    """
    node = t.grad_fn
    if node is None:
        hook_leaf(t, hook)
        return
    k = t.output_nr
    node.register_prehook(lambda grad_outputs: hook(grad_outputs[k]))


def _hook_outputs(call: _Call, output: Any, hooks: Any = None) -> None:
    outs = output if isinstance(output, (tuple, list)) else (output,)
    call.grad_outputs = [None] * len(outs)
    if hooks is not None:
        for i in hooks.watch(outs, call.output_grad)[1]:      # leaves: a tensor hook
            hook_leaf(outs[i], call.output_hook(i, hooks.prepare))
        return
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and o.requires_grad:
            watch_gradient(o, call.output_hook(i))


#: APIs that return uninitialised memory (their outputs are tracked by :class:`UninitialisedMemory`).
UNINITIALISED_APIS = frozenset(f"{owner}.{name}" for owner in ("Torch", "Tensor")
                               for name in ("empty", "empty_like", "new_empty", "empty_strided"))
#: Calls on a tracked tensor (as ``self``) that neither read its values nor write it whole: an
#: in-place partial write, or a view of it. Any other call that takes it reads it (or writes
#: it whole): from then on it counts as initialised.
KEEPS_UNINITIALISED = frozenset(f"Tensor.{name}" for name in (
    "__setitem__", "index_put_", "index_copy_", "index_fill_", "masked_fill_", "masked_scatter_",
    "scatter_", "put_", "__getitem__", "view", "narrow", "select", "unbind", "split", "chunk"))


class UninitialisedTensor(torch.Tensor):
    """A stand-in with the shape and dtype of a tensor whose memory is not to be read (no
    storage: the dump describes it and reads no statistics, hash or file from it)."""

    @staticmethod
    def __new__(cls, t: torch.Tensor) -> "UninitialisedTensor":
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, dtype=t.dtype, device=t.device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise RuntimeError("probe: uninitialised memory is not read")


class UninitialisedMemory:
    """The tensors returned by ``torch.empty`` and its kind whose values no call has read yet,
    held weakly by identity, and the dump's view of them: an entry recorded while a tensor is
    uninitialised describes it with its shape and dtype but no statistics, hash or file, and
    the sink's ``api_uninitialised(token, inputs, outputs)`` (when it has one) marks those
    entries. A tensor stays uninitialised through in-place partial writes and views of it
    (:data:`KEEPS_UNINITIALISED`: ``seq[:, i] = ...``, ``seq[:, i - 1]``); the first other call
    that takes it reads it, is recorded as reading uninitialised memory, and ends the tracking.

    >>> u = UninitialisedMemory()
    >>> t = torch.empty(3)
    >>> u.update("Torch.empty", (), {}, t); t in u
    True
    >>> u.update("Tensor.__setitem__", (t, 0, 1.0), {}, None); t in u
    True
    >>> u.update("Tensor.sum", (t,), {}, t.sum()); t in u, u.live
    (False, False)
    """

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self._tensors = WeakIdKeyDictionary()
        self.live = False               # whether any tensor is tracked (the wrapper's fast test)

    def __contains__(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t in self._tensors

    def clear(self) -> None:
        self._tensors.clear()
        self.live = False

    def update(self, api: str, args: tuple, kwargs: dict, output: Any) -> None:
        """After a call: track what an empty-like API returned, forget what the call read."""
        tensors = self._tensors
        if tensors:
            keep = args[0] if args and api in KEEPS_UNINITIALISED else None
            for x in (*args, *kwargs.values()):
                if x is not keep and isinstance(x, torch.Tensor) and x in tensors:
                    del tensors[x]
        if api in UNINITIALISED_APIS and isinstance(output, torch.Tensor) and output.numel():
            tensors[output] = True
        self.live = bool(tensors)

    def api_call(self, sink: Any, api: str, args: tuple, kwargs: dict) -> Any:
        """``sink.api_call`` with the tracked inputs described as :class:`UninitialisedTensor`, then marked."""
        inputs = [i for i, x in enumerate(args) if x in self] + [k for k, x in kwargs.items() if x in self]
        if not inputs:
            return sink.api_call(api, args, kwargs)
        token = sink.api_call(api, tuple(UninitialisedTensor(x) if x in self else x for x in args),
                              {k: UninitialisedTensor(x) if x in self else x for k, x in kwargs.items()})
        _mark(sink, token, inputs, [])
        return token

    def api_return(self, sink: Any, token: Any, api: str, args: tuple, kwargs: dict, output: Any) -> None:
        """``sink.api_return`` after :meth:`update`, the outputs still uninitialised marked."""
        self.update(api, args, kwargs, output)
        outs = output if isinstance(output, (tuple, list)) else (output,)
        unread = [i for i, x in enumerate(outs) if x in self]
        if not unread:
            sink.api_return(token, output)
            return
        shown = [UninitialisedTensor(x) if i in unread else x for i, x in enumerate(outs)]
        sink.api_return(token, shown if isinstance(output, (tuple, list)) else shown[0])
        _mark(sink, token, [], unread)


def _mark(sink: Any, token: Any, inputs: list, outputs: list) -> None:
    mark = getattr(sink, "api_uninitialised", None)
    if token is not None and mark is not None:
        mark(token, inputs, outputs)


#: The uninitialised memory of the API calls recorded in this process.
UNINITIALISED = UninitialisedMemory()


def make_wrapper(orig: Any, api: str, inplace: bool, sink: Any, guard: Any, backward: bool,
                 hooks: Any = None) -> Any:
    """The wrapper that records one API (see the module docstring); ``hooks``: the library's
    hooks (:func:`probe.engine_adapter.torch_grads.hooks`), None for the Python ones."""

    empty = api in UNINITIALISED_APIS

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        # (torch.compile: Dynamo folds is_compiling() to True and traces the original alone;
        # a dispatch mode (AOT autograd's fake tensors) or a backward pass (activation
        # checkpointing's recomputation, not a new call) is not recorded either)
        if (_is_compiling() or guard.depth or not sink.active or _dispatch_modes()
                or _graph_task_id() != -1):
            return orig(*args, **kwargs)
        with guard:
            with _plain_tensors():
                token = (sink.api_call(api, args, kwargs) if not UNINITIALISED.live
                         else UNINITIALISED.api_call(sink, api, args, kwargs))
            if token is None:
                return orig(*args, **kwargs)
            inputs = None
            if backward and not inplace and "out" not in kwargs and torch.is_grad_enabled():
                inputs = _grad_inputs(args, kwargs)
                start = start_mark()
            output = orig(*args, **kwargs)
            with _plain_tensors():
                if UNINITIALISED.live or empty:
                    UNINITIALISED.api_return(sink, token, api, args, kwargs, output)
                else:
                    sink.api_return(token, output)
                if inputs:
                    # the inputs' gradients where the call's nodes take them (no node added:
                    # capture_edges), the outputs' from pre-hooks on their nodes
                    call = _Call(sink, guard, token)
                    try:
                        outs = output if isinstance(output, (tuple, list)) else (output,)
                        if _capture_call(call, inputs, [o for o in outs if isinstance(o, torch.Tensor)
                                                        and o.requires_grad], start, hooks):
                            _hook_outputs(call, output, hooks)
                    except Exception as e:  # noqa: BLE001 - never break the user's call
                        sink.report_error(f"the backward capture of {api}", e)
            return output

    # Each wrapper gets a code object of its own. Dynamo keeps its compiled code per code
    # object, and it compiles a wrapper as a frame of its own when the wrapper is called from a
    # frame it runs eagerly (a hook whose graph break it could not handle: "Skipping the
    # function and falling back to eager", a HF Llama's decoder layers). Its guards then check
    # the arguments but not the closure's ``orig`` (a builtin it bakes into the graph as a
    # constant), so with one code object for all wrappers ``Tensor.max``'s call could run the
    # code compiled for ``Tensor.float``'s wrapper and return ``f.float()`` instead of
    # ``f.max()``: the dump changed what the user's call returned.
    wrapper.__code__ = wrapper.__code__.replace()
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
        UNINITIALISED.clear()
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
