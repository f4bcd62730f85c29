"""One wrapper around every ``torch.distributed`` collective and point-to-point call.

Listeners registered with :func:`add_listener` see each call twice: ``on_comm_start(call)``
before it runs and ``on_comm_end(call)`` after it returns or raises. A :class:`CommCall` carries
the op name, the arguments, the group size, the payload bytes this rank contributes, host
timestamps and the result or error. The profiler turns calls into ``communication``-domain
ranges; the dump turns them into ``Distributed.*`` API records; both use this one wrapper.

The wrapper is installed when the first listener is added and removed when the last one is,
on both ``torch.distributed.<op>`` and ``torch.distributed.distributed_c10d.<op>`` (so
``dist.all_reduce`` and code that imported the function after installation both see it).
Calls made inside a wrapped call (``all_gather_object`` runs ``all_gather``) are not reported
twice. A listener that raises is reported once on stderr and removed; the call itself goes on.
Communication issued from C++ without a Python call (DDP's gradient reducer, functional
collectives traced into a compiled graph) is not seen here. With ``async_op=True`` the call's
times cover issuing the operation, not its completion.

:class:`CollectiveTracker` is a listener that keeps which collective this process is in now
and how many it has entered per group, for the monitor agent's hang diagnosis.

>>> class Printer:
...     def on_comm_end(self, call):
...         print(call.op, call.group_size, call.nbytes)
>>> listener = add_listener(Printer())
>>> remove_listener(listener)
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from typing import Any

from probe.engine_adapter.guard import ReentryGuard

log = logging.getLogger(__name__)

__all__ = ["CommCall", "CollectiveTracker", "add_listener", "remove_listener", "listeners",
           "WRAPPED_OPS", "P2P_OPS"]

#: op name -> the parameter holding what this rank sends (None: nothing tensor-shaped).
WRAPPED_OPS: dict[str, str | None] = {
    "all_reduce": "tensor",
    "all_reduce_coalesced": "tensors",
    "reduce": "tensor",
    "broadcast": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_coalesced": "input_tensor_list",
    "_all_gather_base": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "_reduce_scatter_base": "input",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    "gather": "tensor",
    "scatter": "tensor",
    "barrier": None,
    "monitored_barrier": None,
    "send": "tensor",
    "recv": "tensor",
    "isend": "tensor",
    "irecv": "tensor",
    "batch_isend_irecv": "p2p_op_list",
    "all_gather_object": None,
    "gather_object": None,
    "broadcast_object_list": None,
    "scatter_object_list": None,
    "send_object_list": None,
    "recv_object_list": None,
}

_PEER_PARAMS = ("dst", "src", "group_dst", "group_src")
#: Point-to-point calls: between two ranks, so not counted in a group's sequence.
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                     "recv_object_list"})


class CommCall:
    """One call of a wrapped ``torch.distributed`` function, as listeners see it."""

    __slots__ = ("op", "args", "kwargs", "group", "group_size", "nbytes", "peer", "async_op",
                 "start_ns", "end_ns", "result", "error", "state")

    def __init__(self, op: str, args: tuple, kwargs: dict, bound: dict[str, Any]) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.group = bound.get("group")
        self.group_size = _group_size(self.group)
        self.nbytes = _payload_bytes(op, bound.get(WRAPPED_OPS.get(op) or "", None))
        self.peer = next((bound[p] for p in _PEER_PARAMS if bound.get(p) is not None), None)
        self.async_op = bool(bound.get("async_op", False))
        self.start_ns = 0
        self.end_ns = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.state: dict[str, Any] = {}     # per-listener scratch space

    def payload(self) -> dict[str, Any]:
        """The attributes a trace shows: op, group size, bytes (and peer, async when set)."""
        out: dict[str, Any] = {"op": self.op, "group_size": self.group_size, "bytes": self.nbytes}
        if self.peer is not None:
            out["peer"] = self.peer
        if self.async_op:
            out["async_op"] = True
        if self.error is not None:
            out["error"] = type(self.error).__name__
        return out


class CollectiveTracker:
    """Which collective this process has entered and not left, and how many it has entered
    per group: what a rank tells the monitor so that a hang can be diagnosed.

    A listener (:func:`add_listener`). ``on_comm_start`` numbers the call within its group
    (point-to-point calls get 0: they are between two ranks, not the group) and keeps it as
    ``pending``; ``on_comm_end`` clears it. Each is a few attribute stores on the calling
    thread; another thread (the agent's sender) reads :meth:`snapshot`. Ranks of a group call
    its collectives in the same order, so their sequence numbers agree: the rank that has not
    reached a number the others wait in is the one holding them.

    >>> t = CollectiveTracker()
    >>> class Call: op, group, group_size, nbytes, peer = "all_reduce", None, 4, 4096, None
    >>> t.on_comm_start(Call()); t.snapshot()[0][:3]
    ('all_reduce', 1, 'world')
    >>> t.on_comm_end(Call()); t.snapshot()
    (None, {'world': 1})
    """

    def __init__(self) -> None:
        self.pending: tuple | None = None      # (op, seq, group, bytes, group_size, peer, t0)
        self.entered: dict[str, int] = {}

    def on_comm_start(self, call: "CommCall") -> None:
        group = _group_name(call.group)
        seq = 0
        if call.op not in P2P_OPS:
            seq = self.entered.get(group, 0) + 1
            if group in self.entered:
                self.entered[group] = seq
            else:                               # a new key: a new dict, so a reader never
                self.entered = {**self.entered, group: seq}   # copies one that grows
        self.pending = (call.op, seq, group, call.nbytes or 0, call.group_size or 0,
                        -1 if call.peer is None else int(call.peer), time.monotonic())

    def on_comm_end(self, call: "CommCall") -> None:
        self.pending = None

    def snapshot(self) -> tuple[tuple | None, dict[str, int]]:
        """``(pending, entered)`` now: the collective in flight (op, seq, group, bytes,
        group size, peer, seconds in it) or None, and the last sequence number per group."""
        pending = self.pending
        if pending is not None:
            pending = pending[:6] + (time.monotonic() - pending[6],)
        return pending, dict(self.entered)


_group_names: dict[int, str] = {}


def _group_name(group: Any) -> str:
    """``"world"`` for the default group (or one of every rank), else its ranks ``"0,2,4"``."""
    if group is None:
        return "world"
    key = id(group)
    name = _group_names.get(key)
    if name is None:
        try:
            import torch.distributed as dist

            ranks = sorted(dist.get_process_group_ranks(group))
            name = "world" if ranks == list(range(dist.get_world_size())) else ",".join(map(str, ranks))
        except Exception:  # noqa: BLE001 - not initialised, or an unknown group object
            name = f"group-{key:x}"
        _group_names[key] = name
    return name


_listeners: tuple = ()
_lock = threading.Lock()
_originals: dict[str, Any] = {}
#: set on a thread while a wrapped collective runs: collectives it calls are not reported again
_inside = ReentryGuard()


def add_listener(listener: Any) -> Any:
    """Register ``listener`` (methods ``on_comm_start(call)`` and/or ``on_comm_end(call)``).

    Installs the wrapper on first use. Returns ``listener`` for :func:`remove_listener`.
    """
    global _listeners
    with _lock:
        if listener not in _listeners:
            _listeners = _listeners + (listener,)
        if not _originals:
            _install()
    return listener


def remove_listener(listener: Any) -> None:
    """Unregister ``listener``; the wrapper is removed with the last listener."""
    global _listeners
    with _lock:
        _listeners = tuple(x for x in _listeners if x is not listener)
        if not _listeners and _originals:
            _uninstall()


def listeners() -> tuple:
    """The listeners registered now."""
    return _listeners


def _install() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    for op in WRAPPED_OPS:
        orig = getattr(c10d, op, None)
        if orig is None or not callable(orig):
            continue
        wrapped = _wrap(op, orig)
        _originals[op] = orig
        setattr(c10d, op, wrapped)
        if getattr(dist, op, None) is orig:
            setattr(dist, op, wrapped)


def _uninstall() -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for op, orig in _originals.items():
        wrapped = getattr(c10d, op, None)
        if getattr(wrapped, "__wrapped__", None) is orig:
            setattr(c10d, op, orig)
        if getattr(getattr(dist, op, None), "__wrapped__", None) is orig:
            setattr(dist, op, orig)
    _originals.clear()


def _wrap(op: str, fn: Any) -> Any:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    # the parameters in order, when arguments map to them one by one (no *args, **kwargs):
    # binding is then a zip, not Signature.bind_partial (a tenth of the time)
    plain = sig is not None and all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                                    for p in sig.parameters.values())
    order = tuple(n for n, p in sig.parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD) \
        if plain else None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        active = _listeners
        if not active or _inside.depth:
            return fn(*args, **kwargs)
        if order is not None and len(args) <= len(order):
            bound = dict(zip(order, args))
            bound.update(kwargs)
        else:
            bound = _bind(sig, args, kwargs)
        call = CommCall(op, args, kwargs, bound)
        for listener in active:
            _notify(listener, "on_comm_start", call)
        call.start_ns = time.perf_counter_ns()
        try:
            with _inside:
                call.result = fn(*args, **kwargs)
            return call.result
        except BaseException as e:
            call.error = e
            raise
        finally:
            call.end_ns = time.perf_counter_ns()
            for listener in active:
                _notify(listener, "on_comm_end", call)

    return wrapper


def _bind(sig: inspect.Signature | None, args: tuple, kwargs: dict) -> dict[str, Any]:
    if sig is None:
        return dict(kwargs)
    try:
        return dict(sig.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


def _notify(listener: Any, method: str, call: CommCall) -> None:
    fn = getattr(listener, method, None)
    if fn is None:
        return
    try:
        fn(call)
    except Exception as e:  # noqa: BLE001 - a listener must never break communication
        log.warning(f"probe: communication listener {type(listener).__name__} failed "
                    f"({type(e).__name__}: {e}); removed")
        remove_listener(listener)


_group_sizes: dict[int, int] = {}


def _group_size(group: Any) -> int | None:
    key = id(group)
    size = _group_sizes.get(key)
    if size is None:
        try:
            import torch.distributed as dist

            size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        except Exception:  # noqa: BLE001 - not initialised or not a member
            return None
        if group is not None:
            _group_sizes[key] = size
    return size


def _payload_bytes(op: str, value: Any) -> int | None:
    if value is None:
        return None if WRAPPED_OPS.get(op) is None else 0
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if hasattr(v, "element_size") and hasattr(v, "numel"):
            total += v.element_size() * v.numel()
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif hasattr(v, "tensor"):           # a P2POp in batch_isend_irecv
            stack.append(v.tensor)
    return total
